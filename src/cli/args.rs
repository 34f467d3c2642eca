//! The command line's arguments (clap): global options, subcommands and
//! their value parsers. The commands themselves are in the parent module.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::flags::{parse_duration_ms, BadValue};
use crate::store::record::{ActionKind, Scope, Split};
use crate::store::Invalid;
use rate_ctl::core::model::each::OnFull;
use rate_ctl::core::model::{Algorithm, ModelError, Unit};

#[derive(Parser, Debug)]
#[command(
    name = "rate-ctl",
    version,
    args_override_self = true,
    about = "Dynamic rate control for nginx: agent, config store and shared-memory tools"
)]
pub struct Cli {
    /// Config store: sqlite:PATH (created on first use),
    /// mysql://USER:PASS@HOST:PORT/DB or postgres://USER:PASS@HOST:PORT/DB
    /// [default: sqlite:/var/lib/rate-ctl/rate-ctl.db]. Env RATE_CTL_STORE
    /// when absent (keeps a password off the command line; ignored with
    /// --api).
    #[arg(long, global = true, value_name = "URL")]
    pub store: Option<String>,
    /// Manage strategies, blacklist and hosts through a running
    /// `rate-ctl serve` (http://HOST:PORT) instead of --store.
    #[arg(long, global = true, env = "RATE_CTL_API", value_name = "URL")]
    pub api: Option<String>,
    /// Token of `rate-ctl serve` for --api (the admin token; a read token
    /// can list) and for `agent --store http://…` (the agent token).
    #[arg(
        long,
        global = true,
        env = "RATE_CTL_TOKEN",
        hide_env_values = true,
        value_name = "T"
    )]
    pub token: Option<String>,
    /// CA certificates (PEM) that an https:// --api or --store must be
    /// signed by, instead of the system's (/etc/ssl/certs).
    #[arg(long, global = true, env = "RATE_CTL_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Machine-readable output (one JSON document, or JSON lines for lists).
    #[arg(long, global = true)]
    pub json: bool,
    /// Log level for diagnostics on stderr: error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "info", value_name = "LEVEL")]
    pub log_level: tracing::Level,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Keep a shared-memory file in step with the store (or with
    /// `rate-ctl serve`: --store http://HOST:PORT --token T).
    Agent(AgentArgs),
    /// REST API, admin page and agent long-poll over the store.
    Serve(ServeArgs),
    /// Manage strategies.
    #[command(subcommand)]
    Strategy(StrategyCmd),
    /// Manage the blacklist.
    #[command(subcommand)]
    Blacklist(BlacklistCmd),
    /// Hosts running agents: weights, heartbeats, applied versions.
    #[command(subcommand)]
    Host(HostCmd),
    /// Look into a shared-memory file.
    #[command(subcommand)]
    Shm(ShmCmd),
    /// Named API tokens of `rate-ctl serve` (in the store).
    #[command(subcommand)]
    Token(TokenCmd),
    /// One key of a per-key strategy across the fleet: show, reset.
    #[command(subcommand)]
    Key(KeyCmd),
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a token; its secret is printed once (the last field of the
    /// last line), the store keeps only its hash.
    Create {
        /// admin (everything), viewer (reads everything, writes nothing)
        /// or agent (snapshot long-poll and reports, as --host only).
        #[arg(long, value_name = "ROLE")]
        role: String,
        /// The one host an agent token may report as.
        #[arg(long, value_name = "ID")]
        host: Option<String>,
        /// 1 to 32 of A-Z a-z 0-9 . _ -
        #[arg(long, value_name = "NAME")]
        name: String,
    },
    /// Names, roles, hosts, created and last used.
    List,
    /// Delete a token; serve refuses it from its next request.
    Revoke {
        #[arg(value_name = "NAME")]
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9090", value_name = "ADDR")]
    pub listen: String,
    /// File holding the admin token; created (mode 0600) with a random token
    /// if missing. Default: admin.token next to an SQLite store, else
    /// /var/lib/rate-ctl/admin.token. Env RATE_CTL_ADMIN_TOKEN overrides.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File holding a read-only token (GET endpoints). Env RATE_CTL_READ_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub read_token_file: Option<PathBuf>,
    /// File holding the agents' token (snapshot and report only).
    /// Env RATE_CTL_AGENT_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// A host counts as fresh while its heartbeat is at most this old.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration_ms)]
    pub freshness: u64,
    /// Most connections served at once (lowered to fit the descriptor
    /// limit); past it a connection is answered 503 and closed.
    #[arg(long, default_value_t = crate::serve::conn::DEFAULT_MAX_CONNECTIONS, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections: usize,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Print the API routes (METHOD PATH per line) and exit.
    #[arg(long, hide = true)]
    pub list_routes: bool,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Shared-memory file to create or adopt (and PATH.state beside it).
    /// Its directory must exist and be writable by the agent's user only
    /// (the package's unit makes /run/rate-ctl: RuntimeDirectory=).
    #[arg(long, default_value = "/run/rate-ctl/rate_ctl", value_name = "PATH")]
    pub shm: PathBuf,
    /// This host's id in the hosts table (default: the hostname).
    #[arg(long, value_name = "ID")]
    pub host_id: Option<String>,
    /// This host's weight for cluster rates; set in the store at start
    /// (default: keep the stored weight, 1 for a new host).
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub weight: Option<u32>,
    /// How often to poll the config version, in ms [default: 50; 20 on MariaDB/MySQL, which cannot tell the agent of a commit]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub poll_ms: Option<u64>,
    /// How often to record the heartbeat and re-read hosts, in ms.
    #[arg(long, default_value_t = 1_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub heartbeat_ms: u64,
    /// A host counts for cluster rates while its heartbeat is at most this old.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration_ms)]
    pub freshness: u64,
    /// Longest wait between retries while the store is unreachable, in ms.
    #[arg(long, default_value_t = 2_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub max_backoff_ms: u64,
    /// Capacity of a new file: strategies (and stat slots).
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub max_strategies: u32,
    /// Capacity of a new file: bytes of each config segment.
    #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
    pub segment_bytes: u64,
    /// Capacity of a new file: blacklist entries.
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    pub blacklist_entries: u32,
    /// Capacity of a new file: entries of the per-key table (16 bytes
    /// each; one per client address, user or value tuple of the
    /// strategies with `each`).
    #[arg(long, default_value_t = rate_ctl::core::keys::DEFAULT_KEYS, value_name = "N", value_parser = clap::value_parser!(u32).range(8..))]
    pub keys: u32,
    /// Permission bits of the state file (octal; the configuration file
    /// gets them without group write). nginx workers must be able to read
    /// the configuration and write the state file: use 0660 with --group
    /// set to the workers' group. Modes giving other users any access
    /// (0666, 0644, ...) are refused.
    #[arg(long, default_value = "0660", value_name = "MODE", value_parser = parse_agent_mode)]
    pub mode: u32,
    /// Give the file to this group (name or number), e.g. www-data.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub group: Option<u32>,
}

/// A group name or number → gid.
pub fn parse_group(s: &str) -> Result<u32, BadValue> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(s).map_err(|_| BadValue::NotAGroup(s.into()))?;
    // SAFETY: libc::group is plain data (integers and pointers); all-zero is
    // a valid value that getgrnam_r overwrites.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer refers to live, writable memory of the length
    // passed; getgrnam_r writes only into grp and buf and sets out.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        return Err(BadValue::NoSuchGroup(s.into()));
    }
    Ok(grp.gr_gid)
}

pub fn parse_mode(s: &str) -> Result<u32, BadValue> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| BadValue::NotAMode(s.into()))
}

/// An agent's `--mode`: a mode, and not one that lets other users in
/// (see `crate::agent::publish::mode_refusal`).
pub fn parse_agent_mode(s: &str) -> Result<u32, BadValue> {
    let mode = parse_mode(s)?;
    match crate::agent::publish::mode_refusal(mode) {
        Some(why) => Err(BadValue::RefusedMode(why)),
        None => Ok(mode),
    }
}

#[derive(Subcommand, Debug)]
pub enum StrategyCmd {
    /// Add a strategy; prints its id.
    Add(StrategyAdd),
    /// Change fields of a strategy; fields not given stay.
    Update(StrategyUpdate),
    /// Delete strategies.
    Rm {
        #[arg(required = true, value_name = "ID")]
        ids: Vec<u32>,
    },
    /// List strategies.
    List {
        /// Only names containing this text.
        #[arg(long, value_name = "TEXT")]
        name: Option<String>,
        /// Only strategies with this condition (dimension=value).
        #[arg(long = "match", value_name = "DIM=VALUE")]
        matches: Vec<String>,
    },
    /// Write all strategies as JSON lines (to FILE, or stdout for -).
    Export {
        #[arg(default_value = "-", value_name = "FILE")]
        file: PathBuf,
    },
    /// Load strategies from JSON lines, all or nothing. A line with an id
    /// replaces that strategy; one without gets a new id.
    Import {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Also delete every strategy not in the file.
        #[arg(long)]
        replace: bool,
        /// With --replace and a file holding no strategy: really delete
        /// every strategy (refused without it).
        #[arg(long)]
        allow_empty: bool,
    },
}

#[derive(Args, Debug)]
pub struct StrategyAdd {
    /// Unique name.
    #[arg(long)]
    pub name: String,
    /// A condition dimension=value; repeat for AND (none = every request).
    #[arg(long = "match", value_name = "DIM=VALUE")]
    pub matches: Vec<String>,
    /// Required, except with --action allow (which takes no rate).
    #[arg(long, value_parser = parse_algorithm)]
    pub algorithm: Option<Algorithm>,
    /// Requests per --per (for concurrency: requests in flight). Required,
    /// except with --action allow.
    #[arg(long, allow_negative_numbers = true)]
    pub rate: Option<u64>,
    /// second (default), minute, hour, day, week (from Monday 00:00) or
    /// month (from the 1st 00:00); week and month: fixed_window only.
    #[arg(long, value_parser = parse_unit)]
    pub per: Option<Unit>,
    /// Calendar windows: the IANA time zone (AREA/CITY, e.g.
    /// Pacific/Auckland) whose local days, weeks and months a
    /// fixed_window counts in, DST included (default UTC).
    #[arg(long, value_name = "AREA/CITY")]
    pub tz: Option<String>,
    /// Bucket size for token_bucket (default 1).
    #[arg(long)]
    pub burst: Option<u32>,
    /// reject, delay, dry_run or allow (pass unlimited).
    #[arg(long, default_value = "reject", value_parser = parse_action)]
    pub action: ActionKind,
    /// -1000 … 1000 (default 0): among the strategies a request matches,
    /// only those at the highest priority present apply.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Status for reject (default: the location's rate_ctl_status, 503).
    #[arg(long)]
    pub status: Option<u16>,
    /// Longest wait for delay, in ms.
    #[arg(long)]
    pub max_delay_ms: Option<u32>,
    /// warm_up: time from cold to the full rate (1s … 1h), e.g. 30s.
    #[arg(long = "warm-up", value_name = "DURATION", value_parser = parse_warm_up)]
    pub warm_up: Option<u32>,
    /// warm_up: the cold interval is this × 1/rate (2 … 10, default 3).
    #[arg(long)]
    pub cold_factor: Option<u8>,
    /// cluster: the rate is for the whole fleet, divided as --split says
    /// (static: each host enforces ceil(rate × its weight / Σ weights of
    /// hosts with a fresh heartbeat), at least 1, token-bucket burst split
    /// alike). host: per host as written.
    #[arg(long, default_value = "cluster", value_parser = parse_scope)]
    pub scope: Scope,
    #[command(flatten)]
    pub per_key: PerKeyArgs,
    /// cluster only: static (the weighted split above) or demand (leases
    /// by each host's demand from the fleet leader, README "Fleet leases");
    /// default demand for cluster scope (static for host scope and allow).
    #[arg(long, value_parser = parse_split)]
    pub split: Option<Split>,
    /// Store it disabled.
    #[arg(long)]
    pub disabled: bool,
    #[command(flatten)]
    pub response: ResponseArgs,
    #[command(flatten)]
    pub ban: super::ban_args::BanArgs,
}

#[derive(Args, Debug)]
pub struct StrategyUpdate {
    #[arg(value_name = "ID")]
    pub id: u32,
    #[arg(long)]
    pub name: Option<String>,
    /// Replaces all conditions when given.
    #[arg(long = "match", value_name = "DIM=VALUE")]
    pub matches: Vec<String>,
    /// Remove all conditions (the strategy then matches every request).
    #[arg(long, conflicts_with = "matches")]
    pub no_match: bool,
    #[arg(long, value_parser = parse_algorithm)]
    pub algorithm: Option<Algorithm>,
    #[arg(long)]
    pub rate: Option<u64>,
    #[arg(long, value_parser = parse_unit)]
    pub per: Option<Unit>,
    /// Calendar windows' IANA zone (AREA/CITY; '' for UTC).
    #[arg(long, value_name = "AREA/CITY")]
    pub tz: Option<String>,
    #[arg(long)]
    pub burst: Option<u32>,
    #[arg(long, value_parser = parse_action)]
    pub action: Option<ActionKind>,
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    #[arg(long)]
    pub status: Option<u16>,
    #[arg(long)]
    pub max_delay_ms: Option<u32>,
    /// warm_up: time from cold to the full rate (1s … 1h).
    #[arg(long = "warm-up", value_name = "DURATION", value_parser = parse_warm_up)]
    pub warm_up: Option<u32>,
    /// warm_up: cold factor (2 … 10).
    #[arg(long)]
    pub cold_factor: Option<u8>,
    #[arg(long, value_parser = parse_scope)]
    pub scope: Option<Scope>,
    #[command(flatten)]
    pub per_key: PerKeyArgs,
    /// Make it a shared limit again (no per-key state).
    #[arg(long, conflicts_with = "each")]
    pub no_each: bool,
    /// static | demand (cluster strategies).
    #[arg(long, value_parser = parse_split)]
    pub split: Option<Split>,
    #[arg(long, conflicts_with = "disable")]
    pub enable: bool,
    #[arg(long)]
    pub disable: bool,
    #[command(flatten)]
    pub response: ResponseArgs,
    #[command(flatten)]
    pub ban: super::ban_args::BanArgs,
}

/// The response and cost flags of `strategy add` and `update` (issue 31;
/// on update, an empty value removes the option: `--count-if ''`).
#[derive(Args, Debug)]
pub struct ResponseArgs {
    /// Charge a request only if its final status is in LIST (codes and
    /// classes): --count-if status=401,403, --count-if status=4xx.
    #[arg(long = "count-if", value_name = "status=LIST")]
    pub count_if: Option<String>,
    /// The request's cost is the integer value of this dimension (1 …
    /// 1,000,000; absent or invalid: 1), e.g. --cost-from cost with
    /// `rate_ctl_dimension cost $http_x_cost;`.
    #[arg(long = "cost-from", value_name = "DIMENSION")]
    pub cost_from: Option<String>,
    /// The request's final cost is this dimension's value when it ends,
    /// e.g. --cost-after upcost with `rate_ctl_dimension upcost
    /// $upstream_http_x_cost;` (charged the difference after the response).
    #[arg(long = "cost-after", value_name = "DIMENSION")]
    pub cost_after: Option<String>,
}

/// The per-key flags of `strategy add` and `update` (on update, `--each`
/// replaces the strategy's list when given).
#[derive(Args, Debug)]
pub struct PerKeyArgs {
    /// Per-key: one limit per value of this dimension (repeat for a tuple,
    /// at most 4), e.g. --each ip or --each userid --each api.
    #[arg(long = "each", value_name = "DIMENSION")]
    pub each: Vec<String>,
    /// Per-key: aggregate IPv4 client addresses to this prefix (default 32).
    #[arg(long)]
    pub ipv4_prefix: Option<u8>,
    /// Per-key: aggregate IPv6 client addresses to this prefix (default 64).
    #[arg(long)]
    pub ipv6_prefix: Option<u8>,
    /// Per-key: a new key when the key table is full: overflow (a shared
    /// limiter at the strategy's rate, default), reject or allow (WARNING:
    /// allow lifts the limit for every new key while the table is full).
    #[arg(long, value_parser = parse_on_full)]
    pub on_full: Option<OnFull>,
    /// Per-key: most key-table entries this strategy's keys may hold (1 …
    /// 2147483648; default half of the agent's --keys); past it a new key
    /// of this strategy gets its on_full while other strategies' new keys
    /// still get entries.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=rate_ctl::core::model::each::MAX_MAX_KEYS as i64))]
    pub max_keys: Option<u32>,
}

/// `--warm-up`: a duration in ms (the range is the model's check).
pub fn parse_warm_up(s: &str) -> Result<u32, BadValue> {
    let ms = parse_duration_ms(s)?;
    u32::try_from(ms).map_err(|_| BadValue::WarmUpTooLong(ms))
}

pub fn parse_algorithm(s: &str) -> Result<Algorithm, ModelError> {
    s.parse()
}
pub fn parse_unit(s: &str) -> Result<Unit, ModelError> {
    s.parse()
}
pub fn parse_action(s: &str) -> Result<ActionKind, Invalid> {
    s.parse()
}
pub fn parse_on_full(s: &str) -> Result<OnFull, Invalid> {
    s.parse()
        .map_err(|e: rate_ctl::core::model::each::EachError| Invalid::from(ModelError::from(e)))
}

pub fn parse_scope(s: &str) -> Result<Scope, Invalid> {
    s.parse()
}
pub fn parse_split(s: &str) -> Result<Split, Invalid> {
    s.parse()
}

#[derive(Subcommand, Debug)]
pub enum BlacklistCmd {
    /// Block every request whose DIMENSION equals VALUE; prints the entry id.
    Add {
        #[arg(long)]
        dimension: String,
        #[arg(long)]
        value: String,
        /// Lifetime such as 30m, 2h, 1d (default: until removed).
        #[arg(long, value_parser = parse_duration_ms, value_name = "DURATION")]
        expires: Option<u64>,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Remove entries by id.
    Rm {
        #[arg(required = true, value_name = "ID")]
        ids: Vec<u64>,
    },
    /// List entries.
    List,
}

#[derive(Subcommand, Debug)]
pub enum HostCmd {
    /// Hosts with weight, heartbeat age, applied version and lag.
    List {
        /// Heartbeats older than this count as stale.
        #[arg(long, default_value = "10s", value_parser = parse_duration_ms, value_name = "DURATION")]
        freshness: u64,
    },
    /// Set a host's weight (registers the host if unknown).
    SetWeight {
        #[arg(value_name = "HOST_ID")]
        host_id: String,
        #[arg(value_name = "WEIGHT", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        weight: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum ShmCmd {
    /// Header, sequence, active segment, heartbeat age, strategies with
    /// local rates and counters, blacklist size.
    Inspect {
        #[arg(value_name = "PATH", default_value = "/run/rate-ctl/rate_ctl")]
        path: PathBuf,
    },
    /// One key of a per-key strategy on this host: used, remaining, reset
    /// (ms), in flight (`concurrency`).
    Key {
        #[arg(value_name = "PATH", default_value = "/run/rate-ctl/rate_ctl")]
        path: PathBuf,
        /// The strategy's id.
        #[arg(long, value_name = "ID")]
        strategy: u32,
        /// The key as `$rate_ctl_key` prints it (`ip=203.0.113.7`,
        /// `ip=10.0.0.1,userid=u1`), or the bare value of a one-dimension key.
        #[arg(long, value_name = "K")]
        key: String,
    },
    /// The keys of a per-key strategy counted most in the last minute on
    /// this host, by rejections then requests (admissions sampled).
    Top {
        #[arg(value_name = "PATH", default_value = "/run/rate-ctl/rate_ctl")]
        path: PathBuf,
        #[arg(long, value_name = "ID")]
        strategy: u32,
    },
}

/// One key of a per-key strategy across the fleet (issue 33).
#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Every host's reading of the key and the fleet's sum (through
    /// `rate-ctl serve`: --api).
    Show {
        #[arg(long, value_name = "ID")]
        strategy: u32,
        #[arg(long, value_name = "K")]
        key: String,
    },
    /// Reset the key's state on every host (recorded in the store and
    /// audited; the agents apply it within their poll).
    Reset {
        #[arg(long, value_name = "ID")]
        strategy: u32,
        #[arg(long, value_name = "K")]
        key: String,
    },
}
