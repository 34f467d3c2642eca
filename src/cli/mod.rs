//! The `rate-ctl` command line: agent, store client commands, shm inspection.

pub mod args;
pub mod ban_args;
pub mod flags;
pub mod keys;
pub mod shm;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use serde_json::json;

use crate::agent::{self, publish};
use crate::client::{Backend, Target};
use crate::serve;
use crate::store::json::parse_strategy_lines;
use crate::store::record::{ActionKind, BlacklistRecord, StrategyRecord};
use crate::store::{self, Invalid, StoreError, DEFAULT_STORE};
use args::{
    AgentArgs, BlacklistCmd, Cli, Command, HostCmd, ShmCmd, StrategyAdd, StrategyCmd, TokenCmd,
};
use flags::{conditions_from_args, flag};
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::model::Algorithm;

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
    /// An invalid field, with the argument that carries it named.
    fn invalid(e: Invalid) -> Failure {
        Failure::usage(format!("invalid {}: {e}", flag(e.field)))
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        match e {
            StoreError::Invalid(e) => Failure::invalid(e),
            e @ StoreError::Import { .. } => Failure::usage(format!("invalid arguments: {e}")),
            // Every id the store finds absent is the ID argument.
            StoreError::NotFound(m) => Failure::other(format!("ID: {m}")),
            e @ StoreError::EmptyReplace(_) => Failure::usage(e.to_string()),
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
    crate::client::http::set_ca(cli.ca);
    // --store, else env RATE_CTL_STORE (a URL with a password stays off
    // the command line); the environment yields to an --api.
    let store = cli.store.or_else(|| {
        api.is_none()
            .then(|| std::env::var("RATE_CTL_STORE").ok())
            .flatten()
            .filter(|s| !s.trim().is_empty())
    });
    match cli.command {
        Command::Agent(a) => {
            // The agent reads `rate-ctl serve` with --store http://…; --api
            // says the same, under the same rules as the config commands.
            let (Target::Store(url) | Target::Api { url, .. }) = target(store, api, None)?;
            run_agent(&url, cli.token, a).await
        }
        Command::Serve(a) => {
            if api_flag {
                return Err(Failure::usage(
                    "serve reads the store itself: give --store, not --api",
                ));
            }
            let url = store.unwrap_or_else(|| DEFAULT_STORE.to_string());
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
                max_connections: a.max_connections,
                tls: a.tls_cert.zip(a.tls_key),
            };
            serve::run(&url, opts)
                .await
                .map_err(|e| Failure::other(e.to_string()))
        }
        Command::Strategy(c) => strategy(&target(store, api, cli.token)?, cli.json, c).await,
        Command::Blacklist(c) => blacklist(&target(store, api, cli.token)?, cli.json, c).await,
        Command::Host(c) => host(&target(store, api, cli.token)?, cli.json, c).await,
        Command::Token(c) => {
            if api.is_some() {
                return Err(Failure::usage(
                    "token commands work on the store (--store or RATE_CTL_STORE); through serve use /api/v1/tokens",
                ));
            }
            token(
                &store.unwrap_or_else(|| DEFAULT_STORE.to_string()),
                cli.json,
                c,
            )
            .await
        }
        Command::Shm(ShmCmd::Inspect { path }) => shm::inspect(&path, cli.json),
        Command::Shm(ShmCmd::Top { path, strategy }) => keys::shm_top(&path, strategy, cli.json),
        Command::Key(c) => keys::key_cmd(&target(store, api, cli.token)?, cli.json, c).await,
        Command::Shm(ShmCmd::Key {
            path,
            strategy,
            key,
        }) => keys::shm_key(&path, strategy, &key, cli.json),
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

pub(crate) async fn open(target: &Target) -> Result<Backend, Failure> {
    Backend::open(target).await.map_err(|e| match (e, target) {
        (StoreError::Url(m), Target::Api { .. }) => Failure::usage(format!("--api: {m}")),
        (StoreError::Url(m), Target::Store(_)) => Failure::usage(m),
        (e, Target::Store(url)) => {
            Failure::other(format!("{e} (--store {})", store::redact_url(url)))
        }
        (e, Target::Api { .. }) => Failure::other(e.to_string()),
    })
}

/// What `add` prints: the new id, or with --json the id and version.
fn out_added(json: bool, id: impl Into<u64>, version: u64) {
    let id = id.into();
    if json {
        out(json!({"id": id, "version": version}).to_string());
    } else {
        out(id.to_string());
    }
}

/// What `rm` prints for each id removed.
fn out_removed(json: bool, what: &str, id: impl Into<u64>, version: u64) {
    let id = id.into();
    if json {
        out(json!({"id": id, "version": version}).to_string());
    } else {
        out(format!("removed {what} {id} (config version {version})"));
    }
}

pub(crate) fn out(line: impl AsRef<str>) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{}", line.as_ref());
}

/// `add`'s algorithm and rate: required, except for `--action allow`,
/// which limits nothing and refuses every rate flag.
fn add_rate_fields(a: &StrategyAdd) -> Result<(Algorithm, u64), Failure> {
    if a.action == ActionKind::Allow {
        let given = [
            ("--algorithm", a.algorithm.is_some()),
            ("--rate", a.rate.is_some()),
            ("--per", a.per.is_some()),
            ("--burst", a.burst.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            return Err(Failure::usage(format!(
                "invalid {flag}: makes no sense for action allow (an allowed request is not limited)"
            )));
        }
        return Ok((Algorithm::FixedWindow, 1));
    }
    match (a.algorithm, a.rate) {
        (Some(algorithm), Some(rate)) => Ok((algorithm, rate)),
        (None, _) => Err(Failure::usage(
            "--algorithm is required (except with --action allow)",
        )),
        (_, None) => Err(Failure::usage(
            "--rate is required (except with --action allow)",
        )),
    }
}

async fn strategy(target: &Target, json: bool, cmd: StrategyCmd) -> CmdResult {
    match cmd {
        StrategyCmd::Add(a) => {
            let conditions = conditions_from_args(&a.matches).map_err(Failure::invalid)?;
            let (algorithm, rate) = add_rate_fields(&a)?;
            let rec = StrategyRecord {
                id: 0,
                name: a.name,
                conditions,
                algorithm,
                rate,
                per: a.per.unwrap_or(rate_ctl::core::model::Unit::Second),
                burst: a.burst.unwrap_or(1),
                action: a.action,
                priority: a.priority.unwrap_or(0),
                status: a.status,
                max_delay_ms: a.max_delay_ms,
                enabled: !a.disabled,
                scope: a.scope,
                warm_up_ms: a.warm_up,
                cold_factor: a.cold_factor,
                each: a.per_key.each,
                ipv4_prefix: a.per_key.ipv4_prefix,
                ipv6_prefix: a.per_key.ipv6_prefix,
                on_full: a.per_key.on_full,
                split: a.split,
                created_ms: 0,
                updated_ms: 0,
                version: 0,
                count_if: a.response.count_if,
                cost_from: a.response.cost_from,
                cost_after: a.response.cost_after,
                max_keys: a.per_key.max_keys,
                tz: a.tz,
                ban_after: None,
                ban_within: None,
                ban_for: None,
            };
            let mut rec = rec;
            a.ban.apply(&mut rec);
            // Refuse bad arguments before touching the store (the one check).
            let rec = rec.into_valid().map_err(Failure::invalid)?;
            let store = open(target).await?;
            let (id, version) = store.add_strategy(&rec).await?;
            warn_on_full_allow(&rec.each, rec.on_full);
            out_added(json, id, version);
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
                if a != rate_ctl::core::model::Algorithm::WarmUp {
                    rec.warm_up_ms = None;
                    rec.cold_factor = None;
                }
                rec.algorithm = a;
            }
            if let Some(w) = u.warm_up {
                rec.warm_up_ms = Some(w);
            }
            if let Some(c) = u.cold_factor {
                rec.cold_factor = Some(c);
            }
            let k = u.per_key;
            if u.no_each {
                rec.each.clear();
                (rec.ipv4_prefix, rec.ipv6_prefix, rec.on_full) = (None, None, None);
            } else if !k.each.is_empty() {
                rec.each = k.each;
            }
            rec.ipv4_prefix = k.ipv4_prefix.or(rec.ipv4_prefix);
            rec.ipv6_prefix = k.ipv6_prefix.or(rec.ipv6_prefix);
            rec.on_full = k.on_full.or(rec.on_full);
            if u.no_each {
                rec.max_keys = None;
            }
            rec.max_keys = k.max_keys.or(rec.max_keys);
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
                    // Nothing to lease either: an allow takes the static
                    // split (its default) rather than refusing the demand
                    // split the strategy had (`--split` below may still
                    // name one).
                    ActionKind::Allow => {
                        (rec.status, rec.max_delay_ms) = (None, None);
                        rec.split = Some(crate::store::record::Split::Static);
                    }
                }
                rec.action = a;
            }
            if let Some(p) = u.priority {
                rec.priority = p;
            }
            u.ban.apply(&mut rec);
            if let Some(s) = u.status {
                rec.status = Some(s);
            }
            if let Some(m) = u.max_delay_ms {
                rec.max_delay_ms = Some(m);
            }
            if let Some(s) = u.scope {
                rec.scope = s;
            }
            if let Some(s) = u.split {
                rec.split = Some(s);
            }
            if u.enable {
                rec.enabled = true;
            }
            if u.disable {
                rec.enabled = false;
            }
            let resp = u.response;
            rec.count_if = resp.count_if.or(rec.count_if);
            rec.cost_from = resp.cost_from.or(rec.cost_from);
            rec.cost_after = resp.cost_after.or(rec.cost_after);
            // Issue 33: `--tz ''` goes back to UTC.
            if let Some(z) = u.tz {
                rec.tz = Some(z).filter(|z| !z.is_empty());
            }
            // Same messages as for `add`, whichever backend would refuse it.
            let rec = rec.into_valid().map_err(Failure::invalid)?;
            let version = store.update_strategy(&rec).await?;
            warn_on_full_allow(&rec.each, rec.on_full);
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
                out_removed(json, "strategy", id, version);
            }
        }
        StrategyCmd::List { name, matches } => {
            let filter = conditions_from_args(&matches).map_err(Failure::invalid)?;
            let recs = valid_strategies(target, "published").await?;
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
            let recs = valid_strategies(target, "exported").await?;
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
        StrategyCmd::Import {
            file,
            replace,
            allow_empty,
        } => {
            let (text, records) = read_jsonl(&file)?;
            let store = open(target).await?;
            let (n, version) = store
                .import(&text, records, replace, allow_empty)
                .await
                .map_err(|e| match e {
                    StoreError::Invalid(_) | StoreError::Import { .. } => {
                        Failure::usage(format!("{}: {e}", file.display()))
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

/// Every valid strategy; each invalid row is warned about on stderr as
/// `--on-full allow` lifts the limit for every new key once the key table
/// is full (a flood of minted keys fills it): said once, on stderr, when a
/// per-key strategy is stored with it.
fn warn_on_full_allow(each: &[String], on_full: Option<rate_ctl::core::model::each::OnFull>) {
    if !each.is_empty() && on_full == Some(rate_ctl::core::model::each::OnFull::Allow) {
        eprintln!(
            "rate-ctl: warning: --on-full allow: once the key table is full, every new key of \
             this strategy passes unlimited (a client minting keys fills it); overflow (the \
             default) or reject keep a limit"
        );
    }
}

/// "invalid and not {what}".
async fn valid_strategies(target: &Target, what: &str) -> Result<Vec<StrategyRecord>, Failure> {
    let (recs, bad) = open(target).await?.list_strategies().await?;
    for b in &bad {
        eprintln!(
            "rate-ctl: warning: strategy row {} is invalid and not {what}: {}",
            b.id, b.reason
        );
    }
    Ok(recs)
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
        "{:>6}  {:<24} {:<14} {:>10} {:<7} {:>6} {:<8} {:<8} {:<4} {:>5} MATCH",
        "ID", "NAME", "ALGORITHM", "RATE", "PER", "BURST", "ACTION", "SCOPE", "ON", "PRIO"
    ));
    for r in recs {
        let action = match r.action {
            ActionKind::Reject => match r.status {
                Some(s) => format!("reject:{s}"),
                None => "reject".into(),
            },
            ActionKind::Delay => format!("delay:{}ms", r.max_delay_ms.unwrap_or(0)),
            ActionKind::DryRun => "dry_run".into(),
            ActionKind::Allow => "allow".into(),
        };
        let mut cond: Vec<String> = r
            .conditions
            .iter()
            .map(|(d, v)| format!("{d}={v}"))
            .collect();
        if cond.is_empty() {
            cond.push("(all requests)".into());
        }
        if !r.each.is_empty() {
            // Per-key: the key, and the options that differ from the defaults.
            cond.push(format!("each={}", r.each.join(",")));
            let d = rate_ctl::core::model::each::Each::default();
            if let Some(p) = r.ipv4_prefix.filter(|p| *p != d.ipv4_prefix) {
                cond.push(format!("ipv4_prefix={p}"));
            }
            if let Some(p) = r.ipv6_prefix.filter(|p| *p != d.ipv6_prefix) {
                cond.push(format!("ipv6_prefix={p}"));
            }
            if let Some(o) = r.on_full.filter(|o| *o != d.on_full) {
                cond.push(format!("on_full={o}"));
            }
            if let Some(m) = r.max_keys {
                cond.push(format!("max_keys={m}"));
            }
        }
        // Issue 31: the response and cost options.
        for (k, v) in [
            ("count_if=status", &r.count_if),
            ("cost_from", &r.cost_from),
            ("cost_after", &r.cost_after),
        ] {
            if let Some(v) = v {
                cond.push(format!("{k}={v}"));
            }
        }
        // Issue 33: the calendar windows' zone.
        if let Some(z) = &r.tz {
            cond.push(format!("tz={z}"));
        }
        out(format!(
            "{:>6}  {:<24} {:<14} {:>10} {:<7} {:>6} {:<8} {:<8} {:<4} {:>5} {}",
            r.id,
            r.name,
            r.algorithm.as_str(),
            r.rate,
            r.per.as_str(),
            r.burst,
            action,
            r.scope.as_str(),
            if r.enabled { "yes" } else { "no" },
            r.priority,
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
            let rec = BlacklistRecord {
                id: 0,
                dimension,
                value,
                expires_ms: expires.map(|e| unix_ms() + e),
                reason,
                created_ms: 0,
                source: None,
            };
            let rec = rec.into_valid().map_err(Failure::invalid)?;
            let store = open(target).await?;
            let (id, version) = store.blacklist_add(&rec).await?;
            out_added(json, id, version);
        }
        BlacklistCmd::Rm { ids } => {
            let store = open(target).await?;
            for id in ids {
                let version = store.blacklist_rm(id).await?;
                out_removed(json, "blacklist entry", id, version);
            }
        }
        BlacklistCmd::List => {
            let store = open(target).await?;
            let now = unix_ms();
            let list = store.blacklist_list().await?;
            if json {
                for b in &list {
                    out(serde_json::to_string(b).expect("serialisable"));
                }
            } else {
                out(format!(
                    "{:>6}  {:<12} {:<40} {:<14} {:<7} REASON",
                    "ID", "DIMENSION", "VALUE", "EXPIRES IN", "SOURCE"
                ));
                for b in &list {
                    let exp = match b.expires_ms {
                        None => "never".to_string(),
                        Some(e) if e <= now => "expired".to_string(),
                        Some(e) => format!("{}s", (e - now) / 1000),
                    };
                    // Bans the penalty box raised (issue 32) apart from an
                    // operator's entries.
                    let source = b.source.as_deref().unwrap_or("manual");
                    out(format!(
                        "{:>6}  {:<12} {:<40} {:<14} {:<7} {}",
                        b.id, b.dimension, b.value, exp, source, b.reason
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `rate-ctl token create|list|revoke` on the store.
async fn token(url: &str, json: bool, cmd: TokenCmd) -> CmdResult {
    use crate::store::tokens::{token_json, Role};
    let store = store::Store::open(url)
        .await
        .map_err(|e| Failure::other(format!("{e} (--store {})", store::redact_url(url))))?;
    match cmd {
        TokenCmd::Create { role, host, name } => {
            let role: Role = role.parse().map_err(|e: Invalid| {
                Failure::usage(format!(
                    "--role: {}",
                    e.to_string().trim_start_matches("role: ")
                ))
            })?;
            let (rec, secret) = store
                .create_token(&name, role, host.as_deref(), CLI_WHO)
                .await?;
            if json {
                let mut v = token_json(&rec);
                v["secret"] = json!(secret);
                out(v.to_string());
            } else {
                out(format!(
                    "token {:?}: role {}{}; shown once, only its hash is stored:",
                    rec.name,
                    rec.role.as_str(),
                    rec.host_id
                        .as_deref()
                        .map(|h| format!(", host {h}"))
                        .unwrap_or_default()
                ));
                out(format!("secret: {secret}"));
            }
        }
        TokenCmd::List => {
            let list = store.list_tokens().await?;
            if json {
                for t in &list {
                    out(token_json(t).to_string());
                }
            } else {
                out(format!(
                    "{:<32} {:<7} {:<24} {:<20} LAST USED",
                    "NAME", "ROLE", "HOST", "CREATED"
                ));
                let when = |ms: u64| {
                    let ago = unix_ms().saturating_sub(ms) / 1000;
                    format!("{ago} s ago")
                };
                for t in &list {
                    out(format!(
                        "{:<32} {:<7} {:<24} {:<20} {}",
                        t.name,
                        t.role.as_str(),
                        t.host_id.as_deref().unwrap_or("-"),
                        when(t.created_ms),
                        t.last_used_ms.map(when).unwrap_or_else(|| "never".into())
                    ));
                }
            }
        }
        TokenCmd::Revoke { name } => {
            store.revoke_token(&name, CLI_WHO).await?;
            if json {
                out(json!({"revoked": name}).to_string());
            } else {
                out(format!("revoked token {name:?}"));
            }
        }
    }
    Ok(())
}

/// The audit log's name for the CLI working on the store.
const CLI_WHO: &str = "cli";

async fn host(target: &Target, json: bool, cmd: HostCmd) -> CmdResult {
    match cmd {
        HostCmd::List { freshness } => {
            let store = open(target).await?;
            let (version, hosts) = store.hosts().await?;
            let leases = store.leases().await?;
            let now = unix_ms();
            if !json {
                out(format!(
                    "{:<32} {:>7} {:>14} {:<6} {:>8} {:>5}  PUBLISH ERROR",
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
                        "publish_error": h.publish_error,
                        "publish_error_ms": h.publish_error_ms,
                        "config_version": version,
                        "leases": leases.iter().filter(|l| l.host_id == h.host_id).map(|l| json!({
                            "strategy": l.strategy_id,
                            "rate": l.value,
                            "demand": l.demand_milli as f64 / 1000.0,
                            "age_ms": now.saturating_sub(l.granted_ms),
                            "expires_ms": l.expires_ms,
                        })).collect::<Vec<_>>(),
                    })
                    .to_string());
                } else {
                    let error = match (&h.publish_error, h.publish_error_ms) {
                        (Some(m), Some(at)) => {
                            format!("{:.0}s ago: {m}", now.saturating_sub(at) as f64 / 1000.0)
                        }
                        (Some(m), None) => m.clone(),
                        (None, _) => "-".into(),
                    };
                    out(format!(
                        "{:<32} {:>7} {:>14} {:<6} {:>8} {:>5}  {error}",
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
                    // Leases of split: demand strategies, one line each.
                    for l in leases.iter().filter(|l| l.host_id == h.host_id) {
                        out(format!(
                            "  lease: strategy {} rate {} demand {:.1}/s age {:.1}s{}",
                            l.strategy_id,
                            l.value,
                            l.demand_milli as f64 / 1000.0,
                            now.saturating_sub(l.granted_ms) as f64 / 1000.0,
                            if l.expires_ms <= now {
                                " (expired)"
                            } else {
                                ""
                            }
                        ));
                    }
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
    let shutdown = crate::signal::shutdown_signal()
        .map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    let host_id = a.host_id.unwrap_or_else(hostname);
    if host_id.is_empty() || host_id.len() > 255 || host_id.chars().any(char::is_control) {
        return Err(Failure::usage(format!(
            "invalid --host-id: {host_id:?} must be 1 to 255 bytes without control characters"
        )));
    }
    let caps = rate_ctl::core::shm::Capacities {
        max_strategies: a.max_strategies,
        segment_bytes: a.segment_bytes,
        blacklist_entries: a.blacklist_entries,
        keys: a.keys,
    };
    // Mode and group are applied on the open file, never through the path.
    let sink = publish::open(&a.shm, caps, a.mode, a.group)
        .map_err(|e| Failure::other(format!("--shm {}: {e}", a.shm.display())))?;
    // PostgreSQL, SQLite and serve wake the agent at a commit (the poll is
    // their backstop); MariaDB is polled, more often (issue 29).
    let poll_ms = a.poll_ms.unwrap_or(
        if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            20
        } else {
            50
        },
    );
    let opts = agent::AgentOptions {
        store_url: url.to_string(),
        host_id,
        weight: a.weight,
        poll: std::time::Duration::from_millis(poll_ms),
        heartbeat_every: std::time::Duration::from_millis(a.heartbeat_ms),
        freshness_ms: a.freshness,
        max_backoff: std::time::Duration::from_millis(a.max_backoff_ms),
    };
    tracing::info!(
        shm = %a.shm.display(), host = %opts.host_id, store = %store::redact_url(url),
        poll_ms, freshness_ms = a.freshness, "agent starting"
    );
    let target = if url.starts_with("http://") || url.starts_with("https://") {
        Target::Api {
            url: url.to_string(),
            token,
        }
    } else {
        Target::Store(url.to_string())
    };
    let timeout = opts.max_backoff.max(std::time::Duration::from_secs(1));
    let source = agent::ConfigSource::new(target.clone(), timeout).map_err(|e| match e {
        StoreError::Url(m) => Failure::usage(format!("--store: {m}")),
        e => Failure::other(e.to_string()),
    })?;
    // Key resets and the fleet view's questions (issue 33), beside the loop.
    let keys = agent::keys::spawn(target, opts.host_id.clone(), a.shm.clone());
    let r = agent::Agent::new(opts, sink, source).run(shutdown).await;
    keys.abort();
    r.map_err(|e| Failure::other(e.to_string()))
}
