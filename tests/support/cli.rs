//! Helpers shared by the store and agent integration tests: the `rate-ctl`
//! binary, the stores to run against (a fresh SQLite file always, a fresh
//! MariaDB database when `RATE_CTL_TEST_MYSQL_URL` is set, a fresh
//! PostgreSQL database when `RATE_CTL_TEST_POSTGRES_URL` is set) and raw SQL.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;
use sqlx::Row;

pub const MYSQL_ENV: &str = "RATE_CTL_TEST_MYSQL_URL";
pub const POSTGRES_ENV: &str = "RATE_CTL_TEST_POSTGRES_URL";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rate-ctl")
}

/// The `rate-ctl` binary without the configuration a developer may have
/// exported: `RATE_CTL_API` would turn `--store` into a usage error and
/// `RATE_CTL_TOKEN` would be sent to servers the tests start, `RATE_CTL_STORE`
/// would stand in for a missing `--store`.
pub fn command() -> Command {
    let mut c = Command::new(bin());
    c.env_remove("RATE_CTL_API")
        .env_remove("RATE_CTL_TOKEN")
        .env_remove("RATE_CTL_STORE");
    c
}

pub fn rate_ctl(args: &[&str]) -> Output {
    rate_ctl_env(args, &[])
}

/// [`rate_ctl`] with `env` set.
pub fn rate_ctl_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command()
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run rate-ctl")
}

/// Runs rate-ctl, asserts success and returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = rate_ctl(args);
    assert!(
        o.status.success(),
        "rate-ctl {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// JSON lines (as `--json` lists print them), blank lines skipped.
pub fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `rate-ctl KIND list --store STORE --json`, one value per row.
pub fn listed(kind: &str, store: &str) -> Vec<serde_json::Value> {
    json_lines(&ok(&[kind, "list", "--store", store, "--json"]))
}

/// The strategies of `store` as `strategy list --json` shows them.
pub fn strategy_rows(store: &str) -> Vec<serde_json::Value> {
    listed("strategy", store)
}

/// `rate-ctl ARGS` fails with a message naming `flag`.
pub fn refused(args: &[&str], flag: &str) {
    let o = rate_ctl(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} accepted");
    assert!(err.contains(flag), "{args:?}: {err}");
}

/// `rate-ctl strategy add --store STORE --name x --rate 5` with `extra`
/// fails with a message naming `flag`.
pub fn add_refused(store: &str, extra: &[&str], flag: &str) {
    let mut args = vec![
        "strategy", "add", "--store", store, "--name", "x", "--rate", "5",
    ];
    args.extend_from_slice(extra);
    refused(&args, flag);
}

/// One store to run a test against; a MariaDB database is dropped on drop.
pub struct TestStore {
    pub label: &'static str,
    pub url: String,
    admin: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some((admin, db)) = self.admin.take() {
            let rt = rt();
            // PostgreSQL: FORCE ends the connections a killed process left.
            let force = if admin.starts_with("postgres") {
                " WITH (FORCE)"
            } else {
                ""
            };
            let _ = rt.block_on(exec(
                &admin,
                &format!("DROP DATABASE IF EXISTS {db}{force}"),
            ));
        }
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A one-connection pool on `url`; close it when done.
async fn pool(url: &str) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new().max_connections(1).connect(url).await
}

pub async fn exec(url: &str, sql: &str) -> Result<u64, sqlx::Error> {
    let pool = pool(url).await?;
    let r = sqlx::query(sql)
        .execute(&pool)
        .await
        .map(|r| r.rows_affected());
    pool.close().await;
    r
}

pub async fn query_i64(url: &str, sql: &str) -> Result<i64, sqlx::Error> {
    let pool = pool(url).await?;
    let r = sqlx::query(sql)
        .fetch_one(&pool)
        .await
        .and_then(|r| r.try_get(0));
    pool.close().await;
    r
}

/// The config version of a store (read directly).
pub fn version(url: &str) -> i64 {
    rt().block_on(query_i64(
        &sqlx_url(url),
        "SELECT version FROM config_version WHERE id = 1",
    ))
    .unwrap()
}

/// Raw SQL against a store, bypassing the CLI (to plant bad rows).
pub fn sql(url: &str, stmt: &str) -> u64 {
    rt().block_on(exec(&sqlx_url(url), stmt)).unwrap()
}

fn sqlx_url(url: &str) -> String {
    match url.strip_prefix("sqlite:") {
        Some(p) => format!("sqlite://{p}"),
        None => url.to_string(),
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn sqlite_store() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    TestStore {
        label: "sqlite",
        url: format!("sqlite:{}", dir.path().join("rate-ctl.db").display()),
        admin: None,
        _dir: Some(dir),
    }
}

/// A fresh SQLite store and a scratch directory for the test's other files.
pub fn sqlite_and_dir() -> (TestStore, tempfile::TempDir) {
    (sqlite_store(), tempfile::tempdir().unwrap())
}

/// A fresh database on the MariaDB server named by `RATE_CTL_TEST_MYSQL_URL`,
/// or `None` with a loud message when it is unset.
pub fn mariadb_store(test: &str) -> Option<TestStore> {
    server_store(test, "mariadb", MYSQL_ENV, ("MariaDB", "mysql", "CREATE"))
}

/// A fresh database on the PostgreSQL server named by
/// `RATE_CTL_TEST_POSTGRES_URL`, or `None` with a loud message when it is unset.
pub fn postgres_store(test: &str) -> Option<TestStore> {
    server_store(
        test,
        "postgres",
        POSTGRES_ENV,
        ("PostgreSQL", "postgres", "CREATEDB"),
    )
}

/// A fresh database `rate_ctl_t<pid>_<n>` on the server whose URL is in
/// `env`; `(name, script and URL scheme, the privilege it needs)`.
fn server_store(
    test: &str,
    label: &'static str,
    env: &str,
    (name, scheme, privilege): (&str, &str, &str),
) -> Option<TestStore> {
    let Ok(base) = std::env::var(env) else {
        eprintln!(
            "\n!!!!!! {test}: SKIPPING the {name} half: {env} is not set.\n\
             !!!!!! Start a server with `scripts/{label}-test-server.sh start` and export its URL.\n"
        );
        return None;
    };
    let (server, _db) = base
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("{scheme}://user:pass@host:port/db"));
    let db = format!(
        "rate_ctl_t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    rt().block_on(exec(&base, &format!("CREATE DATABASE {db}")))
        .unwrap_or_else(|e| {
            panic!("create a test database (the test user needs {privilege}): {e:?}")
        });
    Some(TestStore {
        label,
        url: format!("{server}/{db}"),
        admin: Some((base.clone(), db)),
        _dir: None,
    })
}

/// SQLite always, MariaDB and PostgreSQL when configured.
pub fn stores(test: &str) -> Vec<TestStore> {
    let mut v = vec![sqlite_store()];
    v.extend(mariadb_store(test));
    v.extend(postgres_store(test));
    v
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `q`-quantile of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

/// The only element of `list` (asserting that there is exactly one).
pub fn the_one(list: &[serde_json::Value]) -> &serde_json::Value {
    assert_eq!(list.len(), 1, "{list:?}");
    &list[0]
}

/// The conditions of the `pay-u1024` strategy the CLI tests add (an
/// IPv4-mapped address, a user, an api), as `--match` arguments.
pub const PAY_MATCHES: [&str; 6] = [
    "--match",
    "ip=::ffff:1.2.3.4",
    "--match",
    "userid=u1024",
    "--match",
    "api=/pay",
];

/// `rate-ctl strategy export --store STORE FILE` into a new temporary
/// directory: the directory (keep it), the file's path and its text.
pub fn export_strategies(store: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir
        .path()
        .join("export.jsonl")
        .to_str()
        .unwrap()
        .to_string();
    ok(&["strategy", "export", "--store", store, &file]);
    let text = std::fs::read_to_string(&file).unwrap();
    (dir, file, text)
}

/// `rate-ctl strategy add --store STORE --name NAME --algorithm ALGORITHM
/// --rate RATE` and the `extra` arguments; must succeed; its stdout.
pub fn add_strategy(
    store: &str,
    name: &str,
    algorithm: &str,
    rate: &str,
    extra: &[&str],
) -> String {
    let mut args = vec![
        "strategy",
        "add",
        "--store",
        store,
        "--name",
        name,
        "--algorithm",
        algorithm,
        "--rate",
        rate,
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

/// `rate-ctl strategy update ID --store STORE` with `extra`; must succeed.
pub fn update_strategy(store: &str, id: &str, extra: &[&str]) -> String {
    let mut args = vec!["strategy", "update", id, "--store", store];
    args.extend_from_slice(extra);
    ok(&args)
}

/// `rate-ctl strategy export` (its text must contain `has`), then
/// `strategy rm ID` and `strategy import` of that file: the strategy comes
/// back from its export.
pub fn reimport(store: &str, id: &str, has: &str) {
    let (_dir, file, exported) = export_strategies(store);
    assert!(exported.contains(has), "{exported}");
    ok(&["strategy", "rm", id, "--store", store]);
    ok(&["strategy", "import", "--store", store, &file]);
}
