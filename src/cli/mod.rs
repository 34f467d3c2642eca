//! The `rate-ctl` command line: agent, store client commands, shm inspection.

pub mod flags;
pub mod shm;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::json;

use crate::agent::{self, publish};
use crate::client::wire::parse_strategy_lines;
use crate::client::{Backend, Target};
use crate::serve;
use crate::store::record::{ActionKind, BlacklistRecord, Scope, StrategyRecord};
use crate::store::{self, now_ms, StoreError, DEFAULT_STORE};
use flags::{conditions_from_args, flag_for_field, parse_duration_ms};
use rate_ctl::core::model::{Algorithm, Unit};

#[derive(Parser, Debug)]
#[command(
    name = "rate-ctl",
    version,
    args_override_self = true,
    about = "Dynamic rate control for nginx: agent, config store and shared-memory tools"
)]
pub struct Cli {
    /// Config store: sqlite:PATH (created on first use) or
    /// mysql://USER:PASS@HOST:PORT/DB [default: sqlite:/var/lib/rate-ctl/rate-ctl.db].
    #[arg(long, global = true, value_name = "URL")]
    store: Option<String>,
    /// Manage strategies, blacklist and hosts through a running
    /// `rate-ctl serve` (http://HOST:PORT) instead of --store.
    #[arg(long, global = true, env = "RATE_CTL_API", value_name = "URL")]
    api: Option<String>,
    /// Token of `rate-ctl serve` for --api (the admin token; a read token
    /// can list) and for `agent --store http://…` (the agent token).
    #[arg(
        long,
        global = true,
        env = "RATE_CTL_TOKEN",
        hide_env_values = true,
        value_name = "T"
    )]
    token: Option<String>,
    /// Machine-readable output (one JSON document, or JSON lines for lists).
    #[arg(long, global = true)]
    json: bool,
    /// Log level for diagnostics on stderr: error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "info", value_name = "LEVEL")]
    log_level: tracing::Level,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9090", value_name = "ADDR")]
    listen: String,
    /// File holding the admin token; created (mode 0600) with a random token
    /// if missing. Default: admin.token next to an SQLite store, else
    /// /var/lib/rate-ctl/admin.token. Env RATE_CTL_ADMIN_TOKEN overrides.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding a read-only token (GET endpoints). Env RATE_CTL_READ_TOKEN.
    #[arg(long, value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// File holding the agents' token (snapshot and report only).
    /// Env RATE_CTL_AGENT_TOKEN.
    #[arg(long, value_name = "FILE")]
    agent_token_file: Option<PathBuf>,
    /// A host counts as fresh while its heartbeat is at most this old.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration_ms)]
    freshness: u64,
    /// Print the API routes (METHOD PATH per line) and exit.
    #[arg(long, hide = true)]
    list_routes: bool,
}

#[derive(Args, Debug)]
struct AgentArgs {
    /// Shared-memory file to create or adopt.
    #[arg(long, default_value = "/dev/shm/rate_ctl", value_name = "PATH")]
    shm: PathBuf,
    /// This host's id in the hosts table (default: the hostname).
    #[arg(long, value_name = "ID")]
    host_id: Option<String>,
    /// This host's weight for cluster rates; set in the store at start
    /// (default: keep the stored weight, 1 for a new host).
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    weight: Option<u32>,
    /// How often to poll the config version, in ms.
    #[arg(long, default_value_t = 200, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    poll_ms: u64,
    /// How often to record the heartbeat and re-read hosts, in ms.
    #[arg(long, default_value_t = 1_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_ms: u64,
    /// A host counts for cluster rates while its heartbeat is at most this old.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration_ms)]
    freshness: u64,
    /// Longest wait between retries while the store is unreachable, in ms.
    #[arg(long, default_value_t = 2_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=600_000))]
    max_backoff_ms: u64,
    /// Capacity of a new file: strategies (and stat slots).
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    max_strategies: u32,
    /// Capacity of a new file: bytes of each config segment.
    #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
    segment_bytes: u64,
    /// Capacity of a new file: blacklist entries.
    #[arg(long, default_value_t = 65_536, value_name = "N")]
    blacklist_entries: u32,
    /// Permission bits of a new file (octal); nginx workers must be able to
    /// read and write it. To keep other local users out, use 0660 with
    /// --group set to the workers' group.
    #[arg(long, default_value = "0666", value_name = "MODE", value_parser = parse_mode)]
    mode: u32,
    /// Give the file to this group (name or number), e.g. www-data.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    group: Option<u32>,
}

/// A group name or number → gid.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(s).map_err(|_| format!("{s:?}: not a group name"))?;
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
        return Err(format!("{s:?}: no such group"));
    }
    Ok(grp.gr_gid)
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode like 0660"))
}

#[derive(Subcommand, Debug)]
enum StrategyCmd {
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
    },
}

#[derive(Args, Debug)]
struct StrategyAdd {
    /// Unique name.
    #[arg(long)]
    name: String,
    /// A condition dimension=value; repeat for AND (none = every request).
    #[arg(long = "match", value_name = "DIM=VALUE")]
    matches: Vec<String>,
    #[arg(long, value_parser = parse_algorithm)]
    algorithm: Algorithm,
    /// Requests per --per (for concurrency: requests in flight).
    #[arg(long)]
    rate: u64,
    #[arg(long, default_value = "second", value_parser = parse_unit)]
    per: Unit,
    /// Bucket size for token_bucket.
    #[arg(long, default_value_t = 1)]
    burst: u32,
    /// reject, delay or dry_run.
    #[arg(long, default_value = "reject", value_parser = parse_action)]
    action: ActionKind,
    /// Status for reject (default: the location's rate_ctl_status, 503).
    #[arg(long)]
    status: Option<u16>,
    /// Longest wait for delay, in ms.
    #[arg(long)]
    max_delay_ms: Option<u32>,
    /// cluster: the rate is for the whole fleet; each host enforces
    /// ceil(rate × its weight / Σ weights of hosts with a fresh heartbeat),
    /// at least 1 (token-bucket burst split alike). host: per host as written.
    #[arg(long, default_value = "cluster", value_parser = parse_scope)]
    scope: Scope,
    /// Store it disabled.
    #[arg(long)]
    disabled: bool,
}

#[derive(Args, Debug)]
struct StrategyUpdate {
    #[arg(value_name = "ID")]
    id: u32,
    #[arg(long)]
    name: Option<String>,
    /// Replaces all conditions when given.
    #[arg(long = "match", value_name = "DIM=VALUE")]
    matches: Vec<String>,
    /// Remove all conditions (the strategy then matches every request).
    #[arg(long, conflicts_with = "matches")]
    no_match: bool,
    #[arg(long, value_parser = parse_algorithm)]
    algorithm: Option<Algorithm>,
    #[arg(long)]
    rate: Option<u64>,
    #[arg(long, value_parser = parse_unit)]
    per: Option<Unit>,
    #[arg(long)]
    burst: Option<u32>,
    #[arg(long, value_parser = parse_action)]
    action: Option<ActionKind>,
    #[arg(long)]
    status: Option<u16>,
    #[arg(long)]
    max_delay_ms: Option<u32>,
    #[arg(long, value_parser = parse_scope)]
    scope: Option<Scope>,
    #[arg(long, conflicts_with = "disable")]
    enable: bool,
    #[arg(long)]
    disable: bool,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: rate_ctl::core::model::ModelError| e.to_string())
}
fn parse_unit(s: &str) -> Result<Unit, String> {
    s.parse()
        .map_err(|e: rate_ctl::core::model::ModelError| e.to_string())
}
fn parse_action(s: &str) -> Result<ActionKind, String> {
    s.parse()
}
fn parse_scope(s: &str) -> Result<Scope, String> {
    s.parse()
}

#[derive(Subcommand, Debug)]
enum BlacklistCmd {
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
enum HostCmd {
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
enum ShmCmd {
    /// Header, sequence, active segment, heartbeat age, strategies with
    /// local rates and counters, blacklist size.
    Inspect {
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
}

/// A failed command: message and exit code (2 = bad arguments, 1 = other).
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
    fn other(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
    /// A validation message ("rate: must be …") with the CLI flag named.
    fn invalid(message: String) -> Failure {
        Failure::usage(format!("invalid {}: {message}", flag_for_field(&message)))
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        match e {
            StoreError::Invalid(m) => Failure::invalid(m),
            // Every id the store finds absent is the ID argument.
            StoreError::NotFound(m) => Failure::other(format!("ID: {m}")),
            other => Failure::other(other.to_string()),
        }
    }
}

type CmdResult = Result<(), Failure>;

pub fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    // RATE_CTL_API in the environment is for the config commands; only an
    // explicit --api is an error where it makes no sense.
    let api_flag = matches.value_source("api") == Some(ValueSource::CommandLine);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(cli.log_level)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rate-ctl: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli, api_flag)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("rate-ctl: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli, api_flag: bool) -> CmdResult {
    let api = cli.api.filter(|a| !a.is_empty());
    match cli.command {
        Command::Agent(a) => {
            // The agent reads `rate-ctl serve` with --store http://…; --api
            // says the same, under the same rules as the config commands.
            let (Target::Store(url) | Target::Api { url, .. }) = target(cli.store, api, None)?;
            run_agent(&url, cli.token, a).await
        }
        Command::Serve(a) => {
            if api_flag {
                return Err(Failure::usage(
                    "serve reads the store itself: give --store, not --api",
                ));
            }
            let url = cli.store.unwrap_or_else(|| DEFAULT_STORE.to_string());
            if a.list_routes {
                for (m, p) in serve::api_routes() {
                    println!("{m} {p}");
                }
                return Ok(());
            }
            let opts = serve::ServeOptions {
                listen: a.listen,
                admin_token_file: a.admin_token_file,
                read_token_file: a.read_token_file,
                agent_token_file: a.agent_token_file,
                freshness_ms: a.freshness,
            };
            serve::run(&url, opts).await.map_err(Failure::other)
        }
        Command::Strategy(c) => strategy(&target(cli.store, api, cli.token)?, cli.json, c).await,
        Command::Blacklist(c) => blacklist(&target(cli.store, api, cli.token)?, cli.json, c).await,
        Command::Host(c) => host(&target(cli.store, api, cli.token)?, cli.json, c).await,
        Command::Shm(ShmCmd::Inspect { path }) => {
            shm::inspect(&path, cli.json).map_err(Failure::other)
        }
    }
}

/// The config backend from `--store` / `--api` (one or the other): of the
/// strategy, blacklist and host commands, and the agent's source.
fn target(
    store: Option<String>,
    api: Option<String>,
    token: Option<String>,
) -> Result<Target, Failure> {
    match (store, api) {
        (Some(_), Some(_)) => Err(Failure::usage(
            "--store and --api (or RATE_CTL_API) cannot be used together: give one config backend",
        )),
        (None, Some(url)) => Ok(Target::Api { url, token }),
        (store, None) => Ok(Target::Store(
            store.unwrap_or_else(|| DEFAULT_STORE.to_string()),
        )),
    }
}

async fn open(target: &Target) -> Result<Backend, Failure> {
    Backend::open(target).await.map_err(|e| match (e, target) {
        (StoreError::Url(m), Target::Api { .. }) => Failure::usage(format!("--api: {m}")),
        (StoreError::Url(m), Target::Store(_)) => Failure::usage(m),
        (e, Target::Store(url)) => {
            Failure::other(format!("{e} (--store {})", store::redact_url(url)))
        }
        (e, Target::Api { .. }) => Failure::other(e.to_string()),
    })
}

fn out(line: impl AsRef<str>) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{}", line.as_ref());
}

async fn strategy(target: &Target, json: bool, cmd: StrategyCmd) -> CmdResult {
    match cmd {
        StrategyCmd::Add(a) => {
            let conditions = conditions_from_args(&a.matches).map_err(Failure::invalid)?;
            let mut rec = StrategyRecord {
                id: 0,
                name: a.name,
                conditions,
                algorithm: a.algorithm,
                rate: a.rate,
                per: a.per,
                burst: a.burst,
                action: a.action,
                status: a.status,
                max_delay_ms: a.max_delay_ms,
                enabled: !a.disabled,
                scope: a.scope,
                created_ms: 0,
                updated_ms: 0,
                version: 0,
            };
            // Refuse bad arguments before touching the store.
            rec.validate().map_err(Failure::invalid)?;
            let store = open(target).await?;
            let (id, version) = store.add_strategy(&rec).await?;
            if json {
                out(json!({"id": id, "version": version}).to_string());
            } else {
                out(id.to_string());
            }
        }
        StrategyCmd::Update(u) => {
            let store = open(target).await?;
            let mut rec = store.get_strategy(u.id).await.map_err(|e| match e {
                StoreError::Invalid(_) => Failure::other(format!(
                    "strategy {}: stored row is invalid ({e}); use `strategy rm` and add it again",
                    u.id
                )),
                e => e.into(),
            })?;
            if let Some(n) = u.name {
                rec.name = n;
            }
            if !u.matches.is_empty() {
                rec.conditions = conditions_from_args(&u.matches).map_err(Failure::invalid)?;
            }
            if u.no_match {
                rec.conditions.clear();
            }
            if let Some(a) = u.algorithm {
                rec.algorithm = a;
            }
            if let Some(r) = u.rate {
                rec.rate = r;
            }
            if let Some(p) = u.per {
                rec.per = p;
            }
            if let Some(b) = u.burst {
                rec.burst = b;
            }
            if let Some(a) = u.action {
                // Each action drops the other's parameter. Into dry run both
                // stay: the status or delay cap of the action the strategy
                // enforces, so that `--action reject|delay` later (or PATCH
                // dry_run:false in serve) restores it.
                match a {
                    ActionKind::Reject => rec.max_delay_ms = None,
                    ActionKind::Delay => rec.status = None,
                    ActionKind::DryRun => {}
                }
                rec.action = a;
            }
            if let Some(s) = u.status {
                rec.status = Some(s);
            }
            if let Some(m) = u.max_delay_ms {
                rec.max_delay_ms = Some(m);
            }
            if let Some(s) = u.scope {
                rec.scope = s;
            }
            if u.enable {
                rec.enabled = true;
            }
            if u.disable {
                rec.enabled = false;
            }
            // Same messages as for `add`, whichever backend would refuse it.
            rec.validate().map_err(Failure::invalid)?;
            let version = store.update_strategy(&rec).await?;
            if json {
                out(json!({"id": rec.id, "version": version}).to_string());
            } else {
                out(format!(
                    "updated strategy {} (config version {version})",
                    rec.id
                ));
            }
        }
        StrategyCmd::Rm { ids } => {
            let store = open(target).await?;
            for id in ids {
                let version = store.delete_strategy(id).await?;
                if json {
                    out(json!({"id": id, "version": version}).to_string());
                } else {
                    out(format!("removed strategy {id} (config version {version})"));
                }
            }
        }
        StrategyCmd::List { name, matches } => {
            let filter = conditions_from_args(&matches).map_err(Failure::invalid)?;
            let store = open(target).await?;
            let (recs, bad) = store.list_strategies().await?;
            for b in &bad {
                eprintln!(
                    "rate-ctl: warning: strategy row {} is invalid and not published: {}",
                    b.id, b.reason
                );
            }
            let recs: Vec<_> = recs
                .into_iter()
                .filter(|r| name.as_ref().is_none_or(|n| r.name.contains(n.as_str())))
                .filter(|r| filter.iter().all(|(d, v)| r.conditions.get(d) == Some(v)))
                .collect();
            if json {
                for r in &recs {
                    out(serde_json::to_string(r).expect("serialisable"));
                }
            } else {
                print_strategies(&recs);
            }
        }
        StrategyCmd::Export { file } => {
            let store = open(target).await?;
            let (recs, bad) = store.list_strategies().await?;
            for b in &bad {
                eprintln!(
                    "rate-ctl: warning: strategy row {} is invalid and not exported: {}",
                    b.id, b.reason
                );
            }
            let mut text = String::with_capacity(recs.len() * 200);
            for r in &recs {
                text.push_str(&serde_json::to_string(r).expect("serialisable"));
                text.push('\n');
            }
            if file.as_os_str() == "-" {
                std::io::stdout()
                    .lock()
                    .write_all(text.as_bytes())
                    .map_err(|e| Failure::other(format!("stdout: {e}")))?;
            } else {
                std::fs::write(&file, text)
                    .map_err(|e| Failure::other(format!("{}: {e}", file.display())))?;
                eprintln!("exported {} strategies to {}", recs.len(), file.display());
            }
        }
        StrategyCmd::Import { file, replace } => {
            let (text, records) = read_jsonl(&file)?;
            let store = open(target).await?;
            let (n, version) =
                store
                    .import(&text, records, replace)
                    .await
                    .map_err(|e| match e {
                        StoreError::Invalid(m) => {
                            Failure::usage(format!("{}: {m}", file.display()))
                        }
                        e => e.into(),
                    })?;
            if json {
                out(json!({"imported": n, "version": version}).to_string());
            } else {
                out(format!(
                    "imported {n} strategies (config version {version})"
                ));
            }
        }
    }
    Ok(())
}

/// Reads and parses JSON lines (see [`parse_strategy_lines`]); the first
/// bad line is reported by number. Returns the text too (the API is sent it
/// as is).
#[allow(clippy::type_complexity)]
fn read_jsonl(file: &PathBuf) -> Result<(String, Vec<(usize, StrategyRecord)>), Failure> {
    let at = |line: usize, e: &dyn std::fmt::Display| {
        Failure::usage(format!("{}: line {line}: {e}", file.display()))
    };
    let f = std::fs::File::open(file)
        .map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
    let mut text = String::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        text.push_str(&line.map_err(|e| at(i + 1, &e))?);
        text.push('\n');
    }
    let records = parse_strategy_lines(&text).map_err(|(line, e)| at(line, &e))?;
    Ok((text, records))
}

fn print_strategies(recs: &[StrategyRecord]) {
    out(format!(
        "{:>6}  {:<24} {:<14} {:>10} {:<7} {:>6} {:<8} {:<8} {:<4} MATCH",
        "ID", "NAME", "ALGORITHM", "RATE", "PER", "BURST", "ACTION", "SCOPE", "ON"
    ));
    for r in recs {
        let action = match r.action {
            ActionKind::Reject => match r.status {
                Some(s) => format!("reject:{s}"),
                None => "reject".into(),
            },
            ActionKind::Delay => format!("delay:{}ms", r.max_delay_ms.unwrap_or(0)),
            ActionKind::DryRun => "dry_run".into(),
        };
        let cond: Vec<String> = r
            .conditions
            .iter()
            .map(|(d, v)| format!("{d}={v}"))
            .collect();
        out(format!(
            "{:>6}  {:<24} {:<14} {:>10} {:<7} {:>6} {:<8} {:<8} {:<4} {}",
            r.id,
            r.name,
            r.algorithm.as_str(),
            r.rate,
            r.per.as_str(),
            r.burst,
            action,
            r.scope.as_str(),
            if r.enabled { "yes" } else { "no" },
            if cond.is_empty() {
                "(all requests)".into()
            } else {
                cond.join(" ")
            }
        ));
    }
}

async fn blacklist(target: &Target, json: bool, cmd: BlacklistCmd) -> CmdResult {
    match cmd {
        BlacklistCmd::Add {
            dimension,
            value,
            expires,
            reason,
        } => {
            let mut rec = BlacklistRecord {
                id: 0,
                dimension,
                value,
                expires_ms: expires.map(|e| now_ms() + e),
                reason,
                created_ms: 0,
            };
            rec.validate().map_err(Failure::invalid)?;
            let store = open(target).await?;
            let (id, version) = store.blacklist_add(&rec).await?;
            if json {
                out(json!({"id": id, "version": version}).to_string());
            } else {
                out(id.to_string());
            }
        }
        BlacklistCmd::Rm { ids } => {
            let store = open(target).await?;
            for id in ids {
                let version = store.blacklist_rm(id).await?;
                if json {
                    out(json!({"id": id, "version": version}).to_string());
                } else {
                    out(format!(
                        "removed blacklist entry {id} (config version {version})"
                    ));
                }
            }
        }
        BlacklistCmd::List => {
            let store = open(target).await?;
            let now = now_ms();
            let list = store.blacklist_list().await?;
            if json {
                for b in &list {
                    out(serde_json::to_string(b).expect("serialisable"));
                }
            } else {
                out(format!(
                    "{:>6}  {:<12} {:<40} {:<14} REASON",
                    "ID", "DIMENSION", "VALUE", "EXPIRES IN"
                ));
                for b in &list {
                    let exp = match b.expires_ms {
                        None => "never".to_string(),
                        Some(e) if e <= now => "expired".to_string(),
                        Some(e) => format!("{}s", (e - now) / 1000),
                    };
                    out(format!(
                        "{:>6}  {:<12} {:<40} {:<14} {}",
                        b.id, b.dimension, b.value, exp, b.reason
                    ));
                }
            }
        }
    }
    Ok(())
}

async fn host(target: &Target, json: bool, cmd: HostCmd) -> CmdResult {
    match cmd {
        HostCmd::List { freshness } => {
            let store = open(target).await?;
            let (version, hosts) = store.hosts().await?;
            let now = now_ms();
            if !json {
                out(format!(
                    "{:<32} {:>7} {:>14} {:<6} {:>8} {:>5}",
                    "HOST", "WEIGHT", "HEARTBEAT AGE", "FRESH", "APPLIED", "LAG"
                ));
            }
            for h in &hosts {
                let age = h.last_heartbeat_ms.map(|hb| now.saturating_sub(hb));
                let fresh = age.is_some_and(|a| a <= freshness);
                let lag = h.applied_version.map(|a| version.saturating_sub(a));
                if json {
                    out(json!({
                        "host_id": h.host_id,
                        "weight": h.weight,
                        "last_heartbeat_ms": h.last_heartbeat_ms,
                        "heartbeat_age_ms": age,
                        "fresh": fresh,
                        "applied_version": h.applied_version,
                        "applied_ms": h.applied_ms,
                        "lag": lag,
                        "config_version": version,
                    })
                    .to_string());
                } else {
                    out(format!(
                        "{:<32} {:>7} {:>14} {:<6} {:>8} {:>5}",
                        h.host_id,
                        h.weight,
                        age.map(|a| format!("{:.1}s", a as f64 / 1000.0))
                            .unwrap_or_else(|| "never".into()),
                        if fresh { "yes" } else { "no" },
                        h.applied_version
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "-".into()),
                        lag.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                    ));
                }
            }
        }
        HostCmd::SetWeight { host_id, weight } => {
            store::validate_host(&host_id, weight).map_err(Failure::from)?;
            let store = open(target).await?;
            let version = store.set_weight(&host_id, weight).await?;
            if json {
                out(json!({"host_id": host_id, "weight": weight, "version": version}).to_string());
            } else {
                out(format!(
                    "host {host_id}: weight {weight} (config version {version})"
                ));
            }
        }
    }
    Ok(())
}

/// This machine's hostname, the default host id.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its full length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

async fn run_agent(url: &str, token: Option<String>, a: AgentArgs) -> CmdResult {
    // Before anything slow, so that SIGTERM during start-up exits cleanly too.
    let shutdown = agent::shutdown_signal()
        .map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    let host_id = a.host_id.unwrap_or_else(hostname);
    if host_id.is_empty() || host_id.len() > 255 || host_id.chars().any(char::is_control) {
        return Err(Failure::usage(format!(
            "invalid --host-id: {host_id:?} must be 1 to 255 bytes without control characters"
        )));
    }
    let caps = publish::Caps {
        max_strategies: a.max_strategies,
        segment_bytes: a.segment_bytes,
        blacklist_entries: a.blacklist_entries,
    };
    let sink = publish::open(&a.shm, caps, a.mode)
        .map_err(|e| Failure::other(format!("--shm {}: {e}", a.shm.display())))?;
    if let Some(gid) = a.group {
        std::os::unix::fs::chown(&a.shm, None, Some(gid))
            .map_err(|e| Failure::other(format!("--group: chown {}: {e}", a.shm.display())))?;
    }
    let opts = agent::AgentOptions {
        store_url: url.to_string(),
        host_id,
        weight: a.weight,
        poll: std::time::Duration::from_millis(a.poll_ms),
        heartbeat_every: std::time::Duration::from_millis(a.heartbeat_ms),
        freshness_ms: a.freshness,
        max_backoff: std::time::Duration::from_millis(a.max_backoff_ms),
    };
    tracing::info!(
        shm = %a.shm.display(), host = %opts.host_id, store = %store::redact_url(url),
        poll_ms = a.poll_ms, freshness_ms = a.freshness, "agent starting"
    );
    let target = if url.starts_with("http://") {
        Target::Api {
            url: url.to_string(),
            token,
        }
    } else {
        Target::Store(url.to_string())
    };
    let timeout = opts.max_backoff.max(std::time::Duration::from_secs(1));
    let source = agent::Source::new(target, timeout).map_err(|e| match e {
        StoreError::Url(m) => Failure::usage(format!("--store: {m}")),
        e => Failure::other(e.to_string()),
    })?;
    agent::Agent::new(opts, sink, source).run(shutdown).await;
    Ok(())
}
