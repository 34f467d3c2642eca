//! The config store: SQLite (default, no server), MySQL/MariaDB or
//! PostgreSQL (fleets), one schema and one code path through sqlx's Any
//! driver (every query written with `?` and passed through [`Dialect::sql`]).
//!
//! Every change runs in one transaction that first bumps the single
//! `config_version` row, so agents detect any change by polling that row,
//! and (on SQLite) the write lock is taken before anything is read.

mod audit;
pub use audit::actor;
pub mod bans;
mod blacklist;
mod calendar;
mod changelog;
mod changes;
pub use changelog::Change;
pub use changes::Changes;
pub mod error;
mod hosts;
pub mod json;
pub mod keys;
mod leases;
pub mod record;
mod samples;
pub mod schema;
mod strategies;
pub mod tokens;
pub mod valid;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use rate_ctl::core::clock::unix_ms;

use sqlx::any::AnyPoolOptions;
use sqlx::{Any, AnyPool, Row, Transaction};

// The audit log records entries in the API's JSON.
pub use error::{Field, Invalid, Result, StoreError};
pub use hosts::validate_host;
pub use leases::LeaseRow;
use record::{BlacklistRecord, StrategyRecord};
use schema::{Dialect, CREATE_MIGRATIONS_TABLE, MIGRATIONS};
use strategies::{split_rows, STRATEGY_COLUMNS};
use valid::Valid;

/// The PostgreSQL channel every change notifies at commit; agents on a
/// PostgreSQL store LISTEN to it instead of waiting for their poll.
pub const NOTIFY_CHANNEL: &str = "rate_ctl_config";

/// Default store when `--store` is not given.
pub const DEFAULT_STORE: &str = "sqlite:/var/lib/rate-ctl/rate-ctl.db";

/// A stored strategy row that could not be read as a valid strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    pub id: i64,
    pub reason: Invalid,
}

/// One audit log entry.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub id: u64,
    pub at_ms: u64,
    /// The token's name (`cli` for the CLI on the store).
    pub token: String,
    /// The token's role (`admin`, `read`, `agent`); `None` for the CLI and
    /// for entries written before migration 134.
    pub role: Option<String>,
    /// The client's address (`IP:PORT`) of an API change.
    pub client: Option<String>,
    pub action: String,
    pub target: String,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
}

/// Slot counters of one strategy on one host, as an agent reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSample {
    pub id: u32,
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
}

/// A stored counter sample (for the stats series).
#[derive(Debug, Clone)]
pub struct StoredSample {
    pub host_id: String,
    pub at_ms: u64,
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
}

/// How long counter samples are kept.
pub const SAMPLE_RETENTION_MS: u64 = 300_000;

/// Everything an agent publishes, read in one transaction.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub version: u64,
    /// Valid strategies (validated by the core model, ids canonical).
    pub strategies: Vec<Valid<StrategyRecord>>,
    /// Rows that failed validation: skipped, with the reason.
    pub bad_rows: Vec<BadRow>,
    /// Valid entries; invalid ones (edited in the database) are skipped.
    pub blacklist: Vec<Valid<BlacklistRecord>>,
}

pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    /// The SQLite file (`None` for a server or `:memory:`).
    file: Option<std::path::PathBuf>,
    /// SQLite connections use `synchronous = NORMAL` ([`Store::relax_durability`]).
    relaxed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Store {
    /// Connects to `url` (`sqlite:PATH`, `mysql://…` or `postgres://…`), creating an SQLite
    /// file and its directory if missing, and applies pending migrations.
    pub async fn open(url: &str) -> Result<Store> {
        Store::open_with_timeout(url, Duration::from_secs(10)).await
    }

    pub async fn open_with_timeout(url: &str, acquire_timeout: Duration) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (dialect, conn_url) = normalise_url(url)?;
        let relaxed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relaxed_conn = relaxed.clone();
        let file = (dialect == Dialect::Sqlite)
            .then(|| conn_url.strip_prefix("sqlite://"))
            .flatten()
            .map(|p| p.split('?').next().unwrap_or(p))
            .filter(|p| *p != ":memory:")
            .map(std::path::PathBuf::from);
        let opts = AnyPoolOptions::new()
            .acquire_timeout(acquire_timeout)
            // One writer at a time is all SQLite allows; a second pooled
            // connection would only wait on the first one's lock.
            .max_connections(if dialect == Dialect::Sqlite { 1 } else { 4 })
            .min_connections(0)
            .after_connect(move |conn, _| {
                let relaxed = relaxed_conn.clone();
                Box::pin(async move {
                    if Dialect::of(conn) == Dialect::Sqlite
                        && relaxed.load(std::sync::atomic::Ordering::Relaxed)
                    {
                        sqlx::Executor::execute(&mut *conn, "PRAGMA synchronous = NORMAL").await?;
                    }
                    if Dialect::of(conn) == Dialect::Postgres {
                        // Not "relation … already exists, skipping" on every
                        // start (sqlx logs notices at info).
                        sqlx::Executor::execute(&mut *conn, "SET client_min_messages = warning")
                            .await?;
                    }
                    Ok(())
                })
            });
        let pool = opts.connect(&conn_url).await?;
        let store = Store {
            pool,
            dialect,
            file,
            relaxed,
        };
        store.migrate().await?;
        Ok(store)
    }

    #[cfg(test)]
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// `q` for this store's dialect ([`Dialect::sql`]): every query goes
    /// through here (or `Dialect::of(tx).sql` inside a transaction).
    fn sql<'q>(&self, q: &'q str) -> std::borrow::Cow<'q, str> {
        self.dialect.sql(q)
    }

    /// The SQLite file, to watch for commits (`None` on a server).
    pub fn sqlite_file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The dialect of this store.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// For the agent, whose own writes (heartbeats, counter samples) are
    /// reports made again within a second: on SQLite its commits do not wait
    /// for the disk (`synchronous = NORMAL`, still atomic in WAL mode), so
    /// that a heartbeat does not hold the one connection for the 10–20 ms
    /// of an fsync while a change waits to be read. Changes made by the CLI
    /// or `serve` keep full durability.
    pub async fn relax_durability(&self) -> Result<()> {
        if self.dialect == Dialect::Sqlite {
            self.relaxed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            sqlx::query("PRAGMA synchronous = NORMAL")
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    pub async fn close(self) {
        self.pool.close().await;
    }

    async fn migrate(&self) -> Result<()> {
        let d = self.dialect;
        // One connection for the whole migration (a session lock is per
        // connection).
        let mut conn = self.pool.acquire().await?;
        if d == Dialect::Sqlite {
            // WAL lets the agent read while the CLI writes; it persists in the file.
            sqlx::query("PRAGMA journal_mode = WAL")
                .fetch_optional(&mut *conn)
                .await?;
        }
        if d == Dialect::Postgres {
            // Two sessions running CREATE TABLE IF NOT EXISTS on one fresh
            // database at once can both try to create it (a unique violation
            // in pg_type): migrations take turns. MariaDB and SQLite need
            // no lock. Released below, or when the connection closes.
            sqlx::query("SELECT pg_advisory_lock(7261746563)")
                .execute(&mut *conn)
                .await?;
        }
        let r = self.migrate_on(&mut conn).await;
        if d == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_unlock(7261746563)")
                .execute(&mut *conn)
                .await?;
        }
        r
    }

    async fn migrate_on(&self, conn: &mut sqlx::AnyConnection) -> Result<()> {
        let d = self.dialect;
        sqlx::query(CREATE_MIGRATIONS_TABLE)
            .execute(&mut *conn)
            .await?;
        let done: HashSet<i64> = sqlx::query(&self.sql("SELECT version FROM schema_migrations"))
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()?;
        for m in MIGRATIONS {
            if done.contains(&m.version) {
                continue;
            }
            // Every statement is idempotent (IF NOT EXISTS / insert-ignore), so
            // two processes migrating one fresh MariaDB at once both succeed.
            for stmt in m.statements(d) {
                if let Err(e) = sqlx::query(&stmt).execute(&mut *conn).await {
                    if !schema::is_duplicate_column(&e.to_string()) {
                        return Err(e.into());
                    }
                }
            }
            let r = sqlx::query(&d.sql(
                "INSERT INTO schema_migrations (version, description, applied_ms) VALUES (?, ?, ?)",
            ))
            .bind(m.version)
            .bind(m.description)
            .bind(unix_ms() as i64)
            .execute(&mut *conn)
            .await;
            if let Err(e) = r {
                // Another process recorded it first.
                let raced = matches!(&e, sqlx::Error::Database(d) if d.is_unique_violation());
                if !raced {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// The current config version (the one row agents poll).
    pub async fn version(&self) -> Result<u64> {
        read_version(self.dialect, &self.pool).await
    }

    /// Starts a change: bumps the version first (taking the write lock) and
    /// returns the transaction and the new version.
    async fn begin_change(&self) -> Result<(Transaction<'static, Any>, u64)> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            &self.sql(
                "UPDATE config_version SET version = version + 1, changed_ms = ? WHERE id = 1",
            ),
        )
        .bind(unix_ms() as i64)
        .execute(&mut *tx)
        .await?;
        if self.dialect == Dialect::Postgres {
            // Delivered at commit to every agent listening (issue 29).
            sqlx::query(&format!("NOTIFY {NOTIFY_CHANNEL}"))
                .execute(&mut *tx)
                .await?;
        }
        let v = read_version(self.dialect, &mut *tx).await?;
        Ok((tx, v))
    }

    // ---- agent ---------------------------------------------------------

    /// A read transaction whose statements all see one version of the
    /// store, and that version: PostgreSQL's default (read committed)
    /// gives each statement its own view, so it is asked for repeatable
    /// read (InnoDB's default does that; SQLite has one writer).
    pub(super) async fn read_view(&self) -> Result<(Transaction<'static, Any>, u64)> {
        let mut tx = self.pool.begin().await?;
        if self.dialect == Dialect::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        let version = read_version(self.dialect, &mut *tx).await?;
        Ok((tx, version))
    }

    /// The full published set, read in one transaction so that the version
    /// matches the rows.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let (mut tx, version) = self.read_view().await?;
        let rows = sqlx::query(&self.sql(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies ORDER BY id"
        )))
        .fetch_all(&mut *tx)
        .await?;
        // Skips what a direct database edit made invalid, like strategies.
        let blacklist = changes::read_blacklist(self.dialect, &mut tx).await?;
        tx.commit().await?;
        let (strategies, bad_rows) = split_rows(&rows);
        Ok(Snapshot {
            version,
            strategies,
            bad_rows,
            blacklist,
        })
    }
}

/// The config version row, read on the pool or inside a transaction
/// (`version`, `begin_change` and `snapshot` all need the same query).
async fn read_version<'c, E>(dialect: Dialect, ex: E) -> Result<u64>
where
    E: sqlx::Executor<'c, Database = Any>,
{
    let v: i64 = sqlx::query(&dialect.sql("SELECT version FROM config_version WHERE id = 1"))
        .fetch_one(ex)
        .await?
        .try_get(0)?;
    Ok(v as u64)
}

/// The URL with its password replaced by `***`, for logs and messages.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((cred, host)) = rest.rsplit_once('@') {
            if let Some((user, _password)) = cred.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url.to_string()
}

/// `sqlite:PATH` → a URL that creates the file (and its directory);
/// `mysql://…` / `mariadb://…` as given.
fn normalise_url(url: &str) -> Result<(Dialect, String)> {
    if let Some(rest) = url.strip_prefix("mariadb://") {
        return Ok((Dialect::MySql, format!("mysql://{rest}")));
    }
    if url.starts_with("mysql://") {
        return Ok((Dialect::MySql, url.to_string()));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((Dialect::Postgres, url.to_string()));
    }
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(StoreError::Url(
                "--store: sqlite: needs a file path, e.g. sqlite:/var/lib/rate-ctl/rate-ctl.db"
                    .into(),
            ));
        }
        if path != ":memory:" {
            if let Some(dir) = Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Url(format!("--store: cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
        }
        let query = query.unwrap_or("mode=rwc");
        return Ok((Dialect::Sqlite, format!("sqlite://{path}?{query}")));
    }
    Err(StoreError::Url(format!(
        "--store: {url:?} is neither sqlite:PATH, mysql://USER:PASSWORD@HOST:PORT/DB nor postgres://USER:PASSWORD@HOST:PORT/DB"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/x.db");
        let (k, u) = normalise_url(&format!("sqlite:{}", p.display())).unwrap();
        assert_eq!(k, Dialect::Sqlite);
        assert!(u.ends_with("x.db?mode=rwc"), "{u}");
        assert!(p.parent().unwrap().is_dir());
        assert_eq!(
            normalise_url("mariadb://u:p@127.0.0.1:1/db").unwrap().1,
            "mysql://u:p@127.0.0.1:1/db"
        );
        assert_eq!(
            normalise_url("postgres://u@h/db").unwrap().0,
            Dialect::Postgres
        );
        assert!(normalise_url("redis://x").is_err());
        assert_eq!(
            redact_url("mysql://u:s3cr@t@h:1/db"),
            "mysql://u:***@h:1/db"
        );
        assert_eq!(redact_url("sqlite:/a/b.db"), "sqlite:/a/b.db");
    }
}
