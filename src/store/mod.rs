//! The config store: SQLite (default, no server) or MySQL/MariaDB (fleets),
//! one schema and one code path through sqlx's Any driver.
//!
//! Every change runs in one transaction that first bumps the single
//! `config_version` row, so agents detect any change by polling that row,
//! and (on SQLite) the write lock is taken before anything is read.

pub mod record;
pub mod schema;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Row, Transaction};

// The audit log records entries in the API's JSON.
use crate::client::wire::{blacklist_api_json, strategy_api_json};
use record::{BlacklistRecord, HostRecord, StrategyRecord};
use schema::{Dialect, CREATE_MIGRATIONS_TABLE, MIGRATIONS};

/// Default store when `--store` is not given.
pub const DEFAULT_STORE: &str = "sqlite:/var/lib/rate-ctl/rate-ctl.db";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{0}")]
    NotFound(String),
    /// A field is invalid or conflicts with stored data; the text names it.
    #[error("{0}")]
    Invalid(String),
    #[error("store: {0}")]
    Url(String),
    /// An update based on a version that is no longer current.
    #[error("{0}")]
    Conflict(String),
    /// The HTTP store (`--store http://…`) failed or refused.
    #[error("{0}")]
    Http(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A stored strategy row that could not be read as a valid strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    pub id: i64,
    pub reason: String,
}

/// One audit log entry.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub id: u64,
    pub at_ms: u64,
    pub token: String,
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

/// Longest before/after JSON kept in an audit entry (column width).
const AUDIT_JSON_MAX: usize = 7_000;

/// Everything an agent publishes, read in one transaction.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub version: u64,
    /// Valid strategies (validated by the core model, ids canonical).
    pub strategies: Vec<StrategyRecord>,
    /// Rows that failed validation: skipped, with the reason.
    pub bad_rows: Vec<BadRow>,
    pub blacklist: Vec<BlacklistRecord>,
}

pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
}

const STRATEGY_COLUMNS: &str = "id, name, conditions, algorithm, rate, per, burst, action, \
     status, max_delay_ms, enabled, scope, created_ms, updated_ms, version";

impl Store {
    /// Connects to `url` (`sqlite:PATH` or `mysql://…`), creating an SQLite
    /// file and its directory if missing, and applies pending migrations.
    pub async fn open(url: &str) -> Result<Store> {
        Store::open_with_timeout(url, Duration::from_secs(10)).await
    }

    pub async fn open_with_timeout(url: &str, acquire_timeout: Duration) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (dialect, conn_url) = normalise_url(url)?;
        let opts = AnyPoolOptions::new()
            .acquire_timeout(acquire_timeout)
            // One writer at a time is all SQLite allows; a second pooled
            // connection would only wait on the first one's lock.
            .max_connections(if dialect == Dialect::Sqlite { 1 } else { 4 })
            .min_connections(0);
        let pool = opts.connect(&conn_url).await?;
        let store = Store { pool, dialect };
        store.migrate().await?;
        Ok(store)
    }

    #[cfg(test)]
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn close(self) {
        self.pool.close().await;
    }

    async fn migrate(&self) -> Result<()> {
        if self.dialect == Dialect::Sqlite {
            // WAL lets the agent read while the CLI writes; it persists in the file.
            sqlx::query("PRAGMA journal_mode = WAL")
                .fetch_optional(&self.pool)
                .await?;
        }
        sqlx::query(CREATE_MIGRATIONS_TABLE)
            .execute(&self.pool)
            .await?;
        let done: HashSet<i64> = sqlx::query("SELECT version FROM schema_migrations")
            .fetch_all(&self.pool)
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
            for stmt in m.statements(self.dialect) {
                sqlx::query(&stmt).execute(&self.pool).await?;
            }
            let r = sqlx::query(
                "INSERT INTO schema_migrations (version, description, applied_ms) VALUES (?, ?, ?)",
            )
            .bind(m.version)
            .bind(m.description)
            .bind(now_ms() as i64)
            .execute(&self.pool)
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
        let v: i64 = sqlx::query("SELECT version FROM config_version WHERE id = 1")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(v as u64)
    }

    /// Starts a change: bumps the version first (taking the write lock) and
    /// returns the transaction and the new version.
    async fn begin_change(&self) -> Result<(Transaction<'static, Any>, u64)> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE config_version SET version = version + 1, changed_ms = ? WHERE id = 1")
            .bind(now_ms() as i64)
            .execute(&mut *tx)
            .await?;
        let v: i64 = sqlx::query("SELECT version FROM config_version WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        Ok((tx, v as u64))
    }

    // ---- strategies ----------------------------------------------------

    /// Validates and stores a new strategy; returns its id and the new version.
    pub async fn add_strategy(&self, rec: &StrategyRecord, who: &str) -> Result<(u32, u64)> {
        self.add_strategy_full(rec, who)
            .await
            .map(|r| (r.id, r.version))
    }

    /// [`Store::add_strategy`], returning the stored record.
    pub async fn add_strategy_full(
        &self,
        rec: &StrategyRecord,
        who: &str,
    ) -> Result<StrategyRecord> {
        let mut rec = rec.clone();
        rec.id = 0;
        rec.validate().map_err(StoreError::Invalid)?;
        let (mut tx, version) = self.begin_change().await?;
        ensure_name_free(&mut tx, &rec.name, None).await?;
        let now = now_ms();
        rec.created_ms = now;
        rec.updated_ms = now;
        rec.version = version;
        let sql = format!(
            "INSERT INTO strategies ({INSERT_COLUMNS}) VALUES ({})",
            placeholders(14)
        );
        bind_strategy(sqlx::query(&sql), &rec)
            .execute(&mut *tx)
            .await?;
        // Any's SQLite backend reports no last insert id; the name is unique.
        let id: i64 = sqlx::query("SELECT id FROM strategies WHERE name = ?")
            .bind(&rec.name)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let id = u32::try_from(id)
            .map_err(|_| StoreError::Invalid(format!("id: {id} exceeds {}", u32::MAX)))?;
        rec.id = id;
        audit(
            &mut tx,
            who,
            "strategy.create",
            &format!("strategy/{id}"),
            None,
            Some(strategy_api_json(&rec)),
        )
        .await?;
        tx.commit().await?;
        Ok(rec)
    }

    /// Replaces strategy `rec.id` with `rec` (validated); returns the new version.
    pub async fn update_strategy(&self, rec: &StrategyRecord, who: &str) -> Result<u64> {
        self.update_strategy_full(rec, None, who, "strategy.update")
            .await
            .map(|r| r.version)
    }

    /// Replaces strategy `rec.id` with `rec` (validated) if its stored
    /// version is still `expected` (when given, else `Conflict`); returns
    /// the stored record. `action` names the change in the audit log.
    pub async fn update_strategy_full(
        &self,
        rec: &StrategyRecord,
        expected: Option<u64>,
        who: &str,
        action: &str,
    ) -> Result<StrategyRecord> {
        let mut rec = rec.clone();
        rec.validate().map_err(StoreError::Invalid)?;
        let (mut tx, version) = self.begin_change().await?;
        let before = strategy_in_tx(&mut tx, rec.id).await?;
        if before.is_none() {
            return Err(StoreError::NotFound(format!(
                "no strategy with id {}",
                rec.id
            )));
        }
        if let Some(exp) = expected {
            let cur = before.as_ref().map(|b| b["version"].as_u64().unwrap_or(0));
            if cur.is_some_and(|c| c != exp) {
                return Err(StoreError::Conflict(format!(
                    "version: strategy {} was changed at version {}; you edited version {exp}",
                    rec.id,
                    cur.unwrap_or(0)
                )));
            }
        }
        ensure_name_free(&mut tx, &rec.name, Some(rec.id)).await?;
        if let Some(b) = &before {
            rec.created_ms = b["created_at"].as_u64().unwrap_or(0);
        }
        rec.updated_ms = now_ms();
        rec.version = version;
        let res = bind_content(
            sqlx::query(
                "UPDATE strategies SET name = ?, conditions = ?, algorithm = ?, rate = ?, per = ?, \
                 burst = ?, action = ?, status = ?, max_delay_ms = ?, enabled = ?, scope = ?, \
                 updated_ms = ?, version = ? WHERE id = ?",
            ),
            &rec,
        )
        .bind(rec.updated_ms as i64)
        .bind(rec.version as i64)
        .bind(rec.id as i64)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no strategy with id {}",
                rec.id
            )));
        }
        audit(
            &mut tx,
            who,
            action,
            &format!("strategy/{}", rec.id),
            before,
            Some(strategy_api_json(&rec)),
        )
        .await?;
        tx.commit().await?;
        Ok(rec)
    }

    /// Deletes a strategy; returns the new version.
    pub async fn delete_strategy(&self, id: u32, who: &str) -> Result<u64> {
        let (mut tx, version) = self.begin_change().await?;
        let before = strategy_in_tx(&mut tx, id).await?;
        let res = sqlx::query("DELETE FROM strategies WHERE id = ?")
            .bind(id as i64)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("no strategy with id {id}")));
        }
        audit(
            &mut tx,
            who,
            "strategy.delete",
            &format!("strategy/{id}"),
            before,
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    /// One strategy; `Err(NotFound)` if absent, `Err(Invalid)` if its row
    /// is not a valid strategy.
    pub async fn get_strategy(&self, id: u32) -> Result<StrategyRecord> {
        let row = sqlx::query(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id = ?"
        ))
        .bind(id as i64)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("no strategy with id {id}")))?;
        decode_strategy(&row).map_err(|b| StoreError::Invalid(b.reason))
    }

    /// All strategies by id; rows that are not valid strategies come back
    /// as [`BadRow`]s.
    pub async fn list_strategies(&self) -> Result<(Vec<StrategyRecord>, Vec<BadRow>)> {
        let rows = sqlx::query(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(split_rows(&rows))
    }

    /// Loads strategies from JSON-lines records in one transaction: all or
    /// nothing. A record with an id replaces that strategy (or is stored
    /// under that id); one without gets a new id. With `replace_all`, every
    /// strategy not in the file is deleted. Errors name the line (1-based).
    pub async fn import(
        &self,
        records: Vec<(usize, StrategyRecord)>,
        replace_all: bool,
        who: &str,
    ) -> Result<(usize, u64)> {
        let mut records = records;
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut ids: HashMap<u32, usize> = HashMap::new();
        for (line, rec) in records.iter_mut() {
            rec.validate()
                .map_err(|e| StoreError::Invalid(format!("line {line}: {e}")))?;
            if let Some(first) = names.insert(rec.name.clone(), *line) {
                return Err(StoreError::Invalid(format!(
                    "line {line}: name: {:?} already used on line {first}",
                    rec.name
                )));
            }
            if rec.id != 0 {
                if let Some(first) = ids.insert(rec.id, *line) {
                    return Err(StoreError::Invalid(format!(
                        "line {line}: id: {} already used on line {first}",
                        rec.id
                    )));
                }
            }
        }
        let (mut tx, version) = self.begin_change().await?;
        if replace_all {
            sqlx::query("DELETE FROM strategies")
                .execute(&mut *tx)
                .await?;
        } else {
            // Names must not collide with strategies the file does not replace.
            let existing = sqlx::query("SELECT id, name FROM strategies")
                .fetch_all(&mut *tx)
                .await?;
            for row in &existing {
                let id: i64 = row.try_get(0)?;
                let name: String = row.try_get(1)?;
                if let Some(line) = names.get(&name) {
                    let rec = &records.iter().find(|(l, _)| l == line).expect("indexed").1;
                    if rec.id as i64 != id && !ids.contains_key(&(id as u32)) {
                        return Err(StoreError::Invalid(format!(
                            "line {line}: name: {name:?} already exists (id {id})"
                        )));
                    }
                }
            }
            let replaced: Vec<i64> = ids.keys().map(|&i| i as i64).collect();
            for chunk in replaced.chunks(500) {
                let sql = format!(
                    "DELETE FROM strategies WHERE id IN ({})",
                    placeholders(chunk.len())
                );
                let mut q = sqlx::query(&sql);
                for id in chunk {
                    q = q.bind(*id);
                }
                q.execute(&mut *tx).await?;
            }
        }
        let now = now_ms();
        for r in records.iter_mut() {
            r.1.created_ms = now;
            r.1.updated_ms = now;
            r.1.version = version;
        }
        let (with_id, without_id): (Vec<_>, Vec<_>) =
            records.iter().map(|(_, r)| r).partition(|r| r.id != 0);
        const ROWS: usize = 300;
        for chunk in with_id.chunks(ROWS) {
            let sql = format!(
                "INSERT INTO strategies (id, {}) VALUES {}",
                INSERT_COLUMNS,
                vec![format!("(?, {})", placeholders(14)); chunk.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for r in chunk {
                q = bind_strategy(q.bind(r.id as i64), r);
            }
            q.execute(&mut *tx).await?;
        }
        for chunk in without_id.chunks(ROWS) {
            let sql = format!(
                "INSERT INTO strategies ({}) VALUES {}",
                INSERT_COLUMNS,
                vec![format!("({})", placeholders(14)); chunk.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for r in chunk {
                q = bind_strategy(q, r);
            }
            q.execute(&mut *tx).await?;
        }
        audit(
            &mut tx,
            who,
            "strategy.import",
            "strategies",
            None,
            Some(serde_json::json!({"count": records.len(), "replace": replace_all})),
        )
        .await?;
        tx.commit().await?;
        Ok((records.len(), version))
    }

    // ---- blacklist -----------------------------------------------------

    /// Adds (or replaces, for the same dimension and value) an entry;
    /// returns its id and the new version.
    pub async fn blacklist_add(&self, rec: &BlacklistRecord, who: &str) -> Result<(u64, u64)> {
        self.blacklist_add_full(rec, who)
            .await
            .map(|(r, v)| (r.id, v))
    }

    /// [`Store::blacklist_add`], returning the stored entry.
    pub async fn blacklist_add_full(
        &self,
        rec: &BlacklistRecord,
        who: &str,
    ) -> Result<(BlacklistRecord, u64)> {
        let mut rec = rec.clone();
        rec.validate().map_err(StoreError::Invalid)?;
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query(
            "SELECT id, dimension, value, expires_ms, reason, created_ms FROM blacklist WHERE dimension = ? AND value = ?",
        )
        .bind(&rec.dimension)
        .bind(&rec.value)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| decode_blacklist(&r))
        .transpose()?;
        rec.created_ms = now_ms();
        sqlx::query("DELETE FROM blacklist WHERE dimension = ? AND value = ?")
            .bind(&rec.dimension)
            .bind(&rec.value)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO blacklist (dimension, value, expires_ms, reason, created_ms) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&rec.dimension)
        .bind(&rec.value)
        .bind(rec.expires_ms.map(|e| e as i64))
        .bind(&rec.reason)
        .bind(rec.created_ms as i64)
        .execute(&mut *tx)
        .await?;
        let id: i64 = sqlx::query("SELECT id FROM blacklist WHERE dimension = ? AND value = ?")
            .bind(&rec.dimension)
            .bind(&rec.value)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        rec.id = id as u64;
        audit(
            &mut tx,
            who,
            "blacklist.add",
            &format!("blacklist/{id}"),
            before.as_ref().map(blacklist_api_json),
            Some(blacklist_api_json(&rec)),
        )
        .await?;
        tx.commit().await?;
        Ok((rec, version))
    }

    /// Removes entries by id; returns the new version.
    pub async fn blacklist_rm(&self, id: u64, who: &str) -> Result<u64> {
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query(
            "SELECT id, dimension, value, expires_ms, reason, created_ms FROM blacklist WHERE id = ?",
        )
        .bind(id as i64)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| decode_blacklist(&r))
        .transpose()?;
        let res = sqlx::query("DELETE FROM blacklist WHERE id = ?")
            .bind(id as i64)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no blacklist entry with id {id}"
            )));
        }
        audit(
            &mut tx,
            who,
            "blacklist.delete",
            &format!("blacklist/{id}"),
            before.as_ref().map(blacklist_api_json),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    pub async fn blacklist_list(&self) -> Result<Vec<BlacklistRecord>> {
        let rows = sqlx::query(
            "SELECT id, dimension, value, expires_ms, reason, created_ms FROM blacklist ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| decode_blacklist(r).map_err(StoreError::from))
            .collect()
    }

    // ---- hosts ---------------------------------------------------------

    pub async fn hosts(&self) -> Result<Vec<HostRecord>> {
        let rows = sqlx::query(
            "SELECT host_id, weight, last_heartbeat_ms, applied_version, applied_ms \
             FROM hosts ORDER BY host_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(HostRecord {
                    host_id: r.try_get(0)?,
                    weight: r.try_get::<i64, _>(1)?.clamp(0, u32::MAX as i64) as u32,
                    last_heartbeat_ms: r.try_get::<Option<i64>, _>(2)?.map(|v| v as u64),
                    applied_version: r.try_get::<Option<i64>, _>(3)?.map(|v| v as u64),
                    applied_ms: r.try_get::<Option<i64>, _>(4)?.map(|v| v as u64),
                })
            })
            .collect()
    }

    /// Sets a host's weight (registering it if unknown). A weight change
    /// re-splits cluster rates, so it bumps the config version.
    pub async fn set_weight(&self, host_id: &str, weight: u32, who: &str) -> Result<u64> {
        validate_host(host_id, weight)?;
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query("SELECT weight FROM hosts WHERE host_id = ?")
            .bind(host_id)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?;
        let res = sqlx::query("UPDATE hosts SET weight = ? WHERE host_id = ?")
            .bind(weight as i64)
            .bind(host_id)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0 {
            sqlx::query("INSERT INTO hosts (host_id, weight, registered_ms) VALUES (?, ?, ?)")
                .bind(host_id)
                .bind(weight as i64)
                .bind(now_ms() as i64)
                .execute(&mut *tx)
                .await?;
        }
        audit(
            &mut tx,
            who,
            "host.set_weight",
            &format!("host/{host_id}"),
            before.map(|w| serde_json::json!({"host_id": host_id, "weight": w})),
            Some(serde_json::json!({"host_id": host_id, "weight": weight})),
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    /// Records an agent's heartbeat (and, if given, the version it has
    /// applied); registers the host with `weight_if_new` if unknown. Does
    /// not bump the config version.
    pub async fn heartbeat(
        &self,
        host_id: &str,
        weight_if_new: u32,
        now: u64,
        applied: Option<(u64, u64)>,
    ) -> Result<()> {
        let res = match applied {
            Some((v, at)) => sqlx::query(
                "UPDATE hosts SET last_heartbeat_ms = ?, applied_version = ?, applied_ms = ? \
                 WHERE host_id = ?",
            )
            .bind(now as i64)
            .bind(v as i64)
            .bind(at as i64)
            .bind(host_id),
            None => sqlx::query("UPDATE hosts SET last_heartbeat_ms = ? WHERE host_id = ?")
                .bind(now as i64)
                .bind(host_id),
        }
        .execute(&self.pool)
        .await?;
        if res.rows_affected() == 0 {
            validate_host(host_id, weight_if_new)?;
            let (v, at) = match applied {
                Some((v, at)) => (Some(v as i64), Some(at as i64)),
                None => (None, None),
            };
            let r = sqlx::query(
                "INSERT INTO hosts (host_id, weight, last_heartbeat_ms, applied_version, \
                 applied_ms, registered_ms) VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(host_id)
            .bind(weight_if_new as i64)
            .bind(now as i64)
            .bind(v)
            .bind(at)
            .bind(now as i64)
            .execute(&self.pool)
            .await;
            match r {
                Ok(_) => {}
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    // ---- audit, reports, stats -------------------------------------------

    /// Audit entries, newest first: at most `limit`, with ids below `before_id`.
    pub async fn audit_list(&self, limit: u32, before_id: Option<u64>) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(
            "SELECT id, at_ms, token, action, target, before_json, after_json FROM audit_log WHERE id < ? ORDER BY id DESC LIMIT ?",
        )
        .bind(before_id.map(|b| b.min(i64::MAX as u64) as i64).unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get::<i64, _>(0)? as u64,
                    at_ms: r.try_get::<i64, _>(1)?.max(0) as u64,
                    token: r.try_get(2)?,
                    action: r.try_get(3)?,
                    target: r.try_get(4)?,
                    before: json(r.try_get(5)?),
                    after: json(r.try_get(6)?),
                })
            })
            .collect()
    }

    /// An agent's report over HTTP: registers the host (with `weight`, or 1),
    /// sets its weight if `weight` is given and differs (a change: version
    /// bump, audited), records heartbeat and applied version (the applied
    /// time moves only when the version does) and stores counter samples.
    pub async fn report(
        &self,
        host_id: &str,
        weight: Option<u32>,
        applied_version: Option<u64>,
        counters: &[CounterSample],
        who: &str,
    ) -> Result<()> {
        let now = now_ms();
        validate_host(host_id, weight.unwrap_or(1))?;
        let known = sqlx::query("SELECT weight FROM hosts WHERE host_id = ?")
            .bind(host_id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?;
        match (known, weight) {
            (Some(w), Some(new)) if w != new as i64 => {
                self.set_weight(host_id, new, who).await?;
            }
            _ => {}
        }
        match applied_version {
            Some(v) if known.is_some() => {
                // applied_ms first: MySQL evaluates SET left to right.
                sqlx::query(
                    "UPDATE hosts SET applied_ms = CASE WHEN applied_version = ? THEN applied_ms ELSE ? END, applied_version = ?, last_heartbeat_ms = ? WHERE host_id = ?",
                )
                .bind(v as i64)
                .bind(now as i64)
                .bind(v as i64)
                .bind(now as i64)
                .bind(host_id)
                .execute(&self.pool)
                .await?;
            }
            _ => {
                self.heartbeat(
                    host_id,
                    weight.unwrap_or(1),
                    now,
                    applied_version.map(|v| (v, now)),
                )
                .await?
            }
        }
        self.add_samples(host_id, now, counters).await
    }

    /// Stores counter samples taken at `at_ms` and drops samples older than
    /// [`SAMPLE_RETENTION_MS`].
    pub async fn add_samples(&self, host_id: &str, at_ms: u64, c: &[CounterSample]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for chunk in c.chunks(200) {
            let sql = format!(
                "INSERT INTO counter_samples (host_id, strategy_id, at_ms, passed_count, limited_count, delayed_count) VALUES {}",
                vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for s in chunk {
                q = q
                    .bind(host_id.to_string())
                    .bind(s.id as i64)
                    .bind(at_ms as i64)
                    .bind(s.passed.min(i64::MAX as u64) as i64)
                    .bind(s.limited.min(i64::MAX as u64) as i64)
                    .bind(s.delayed.min(i64::MAX as u64) as i64);
            }
            q.execute(&mut *tx).await?;
        }
        sqlx::query("DELETE FROM counter_samples WHERE at_ms < ?")
            .bind(at_ms.saturating_sub(SAMPLE_RETENTION_MS) as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Counter samples of one strategy taken at or after `since_ms`, by host and time.
    pub async fn samples(&self, strategy: u32, since_ms: u64) -> Result<Vec<StoredSample>> {
        let rows = sqlx::query(
            "SELECT host_id, at_ms, passed_count, limited_count, delayed_count FROM counter_samples WHERE strategy_id = ? AND at_ms >= ? ORDER BY host_id, at_ms",
        )
        .bind(strategy as i64)
        .bind(since_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredSample {
                    host_id: r.try_get(0)?,
                    at_ms: r.try_get::<i64, _>(1)?.max(0) as u64,
                    passed: r.try_get::<i64, _>(2)?.max(0) as u64,
                    limited: r.try_get::<i64, _>(3)?.max(0) as u64,
                    delayed: r.try_get::<i64, _>(4)?.max(0) as u64,
                })
            })
            .collect()
    }

    /// The newest counter sample of every (strategy, host) still kept (see
    /// [`SAMPLE_RETENTION_MS`]): each host's cumulative slot counters, for
    /// `GET /metrics`. Sorted by strategy, then host.
    pub async fn latest_samples(&self) -> Result<Vec<(u32, StoredSample)>> {
        let rows = sqlx::query(
            "SELECT s.strategy_id, s.host_id, s.at_ms, s.passed_count, s.limited_count, s.delayed_count \
             FROM counter_samples s JOIN (SELECT strategy_id, host_id, MAX(at_ms) AS at_ms \
             FROM counter_samples GROUP BY strategy_id, host_id) m \
             ON s.strategy_id = m.strategy_id AND s.host_id = m.host_id AND s.at_ms = m.at_ms \
             ORDER BY s.strategy_id, s.host_id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<(u32, StoredSample)> = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = r.try_get::<i64, _>(0)?.clamp(0, u32::MAX as i64) as u32;
            let s = StoredSample {
                host_id: r.try_get(1)?,
                at_ms: r.try_get::<i64, _>(2)?.max(0) as u64,
                passed: r.try_get::<i64, _>(3)?.max(0) as u64,
                limited: r.try_get::<i64, _>(4)?.max(0) as u64,
                delayed: r.try_get::<i64, _>(5)?.max(0) as u64,
            };
            // Two samples of one host at the same millisecond: keep the larger
            // counters (they only grow between resets).
            match out.last_mut() {
                Some((lid, l)) if *lid == id && l.host_id == s.host_id => {
                    l.passed = l.passed.max(s.passed);
                    l.limited = l.limited.max(s.limited);
                    l.delayed = l.delayed.max(s.delayed);
                }
                _ => out.push((id, s)),
            }
        }
        Ok(out)
    }

    // ---- agent ---------------------------------------------------------

    /// The full published set, read in one transaction so that the version
    /// matches the rows.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let mut tx = self.pool.begin().await?;
        let version: i64 = sqlx::query("SELECT version FROM config_version WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let rows = sqlx::query(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies ORDER BY id"
        ))
        .fetch_all(&mut *tx)
        .await?;
        let bl = sqlx::query(
            "SELECT id, dimension, value, expires_ms, reason, created_ms FROM blacklist ORDER BY id",
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let (strategies, bad_rows) = split_rows(&rows);
        let mut blacklist = Vec::with_capacity(bl.len());
        for r in &bl {
            let mut rec = decode_blacklist(r)?;
            // Skip what a direct database edit made invalid, like strategies.
            if rec.validate().is_ok() {
                blacklist.push(rec);
            }
        }
        Ok(Snapshot {
            version: version as u64,
            strategies,
            bad_rows,
            blacklist,
        })
    }
}

/// The strategy row `id` as API JSON (`None` if absent; a row that is not a
/// valid strategy is shown by its raw columns).
async fn strategy_in_tx(
    tx: &mut Transaction<'static, Any>,
    id: u32,
) -> Result<Option<serde_json::Value>> {
    let row = sqlx::query(&format!(
        "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id = ?"
    ))
    .bind(id as i64)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.map(|row| match decode_strategy(&row) {
        Ok(r) => strategy_api_json(&r),
        Err(b) => serde_json::json!({
            "id": id,
            "invalid": b.reason,
            "version": row.try_get::<i64, _>("version").unwrap_or(0),
            "created_at": row.try_get::<i64, _>("created_ms").unwrap_or(0),
        }),
    }))
}

/// Writes one audit entry inside the change's transaction.
async fn audit(
    tx: &mut Transaction<'static, Any>,
    who: &str,
    action: &str,
    target: &str,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> Result<()> {
    let enc = |v: Option<serde_json::Value>| {
        v.map(|v| {
            let s = v.to_string();
            if s.len() <= AUDIT_JSON_MAX {
                s
            } else {
                serde_json::json!({"truncated": true, "bytes": s.len()}).to_string()
            }
        })
    };
    sqlx::query(
        "INSERT INTO audit_log (at_ms, token, action, target, before_json, after_json)          VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(now_ms() as i64)
    .bind(who.to_string())
    .bind(action.to_string())
    .bind(target.to_string())
    .bind(enc(before))
    .bind(enc(after))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub fn validate_host(host_id: &str, weight: u32) -> Result<()> {
    if host_id.is_empty() || host_id.len() > 255 || host_id.chars().any(char::is_control) {
        return Err(StoreError::Invalid(
            "host-id: must be 1 to 255 bytes without control characters".into(),
        ));
    }
    if weight == 0 || weight > 1_000_000 {
        return Err(StoreError::Invalid(format!(
            "weight: must be between 1 and 1000000, got {weight}"
        )));
    }
    Ok(())
}

async fn ensure_name_free(
    tx: &mut Transaction<'static, Any>,
    name: &str,
    own_id: Option<u32>,
) -> Result<()> {
    let row = sqlx::query("SELECT id FROM strategies WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    if let Some(row) = row {
        let id: i64 = row.try_get(0)?;
        if Some(id) != own_id.map(|i| i as i64) {
            return Err(StoreError::Invalid(format!(
                "name: {name:?} already exists (id {id})"
            )));
        }
    }
    Ok(())
}

const INSERT_COLUMNS: &str = "name, conditions, algorithm, rate, per, burst, action, status, \
     max_delay_ms, enabled, scope, created_ms, updated_ms, version";

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

type AnyQuery<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// Binds the 14 columns of [`INSERT_COLUMNS`] in order.
fn bind_strategy<'q>(q: AnyQuery<'q>, r: &StrategyRecord) -> AnyQuery<'q> {
    bind_content(q, r)
        .bind(r.created_ms as i64)
        .bind(r.updated_ms as i64)
        .bind(r.version as i64)
}

/// Binds the 11 columns `name` to `scope` of [`INSERT_COLUMNS`] in order.
fn bind_content<'q>(q: AnyQuery<'q>, r: &StrategyRecord) -> AnyQuery<'q> {
    let conditions: Vec<[&str; 2]> = r
        .conditions
        .iter()
        .map(|(d, v)| [d.as_str(), v.as_str()])
        .collect();
    q.bind(r.name.clone())
        .bind(serde_json::to_string(&conditions).expect("strings serialise"))
        .bind(r.algorithm.as_str())
        .bind(r.rate as i64)
        .bind(r.per.as_str())
        .bind(r.burst as i64)
        .bind(r.action.as_str())
        .bind(r.status.map(|s| s as i64))
        .bind(r.max_delay_ms.map(|m| m as i64))
        .bind(r.enabled as i64)
        .bind(r.scope.as_str())
}

fn split_rows(rows: &[AnyRow]) -> (Vec<StrategyRecord>, Vec<BadRow>) {
    let mut good = Vec::with_capacity(rows.len());
    let mut bad = Vec::new();
    for row in rows {
        match decode_strategy(row) {
            Ok(r) => good.push(r),
            Err(b) => bad.push(b),
        }
    }
    (good, bad)
}

/// Reads and validates one strategy row. Rows written by this binary are
/// always valid; rows edited directly in the database may not be.
fn decode_strategy(row: &AnyRow) -> Result<StrategyRecord, BadRow> {
    let id: i64 = row.try_get("id").unwrap_or(-1);
    let bad = |reason: String| BadRow { id, reason };
    let get_i = |col: &str| -> Result<i64, BadRow> {
        row.try_get::<i64, _>(col)
            .map_err(|e| bad(format!("{col}: unreadable ({e})")))
    };
    let get_oi = |col: &str| -> Result<Option<i64>, BadRow> {
        row.try_get::<Option<i64>, _>(col)
            .map_err(|e| bad(format!("{col}: unreadable ({e})")))
    };
    let get_s = |col: &str| -> Result<String, BadRow> {
        row.try_get::<String, _>(col)
            .map_err(|e| bad(format!("{col}: unreadable ({e})")))
    };
    let in_range = |col: &str, v: i64, max: u64| -> Result<u64, BadRow> {
        if v < 0 || v as u64 > max {
            Err(bad(format!("{col}: {v} is out of range 0..={max}")))
        } else {
            Ok(v as u64)
        }
    };
    let id_u32 = u32::try_from(id)
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| bad(format!("id: {id} is not between 1 and {}", u32::MAX)))?;
    let pairs: Vec<(String, String)> =
        serde_json::from_str(&get_s("conditions")?).map_err(|e| {
            bad(format!(
                "conditions: not a JSON list of [dimension, value] ({e})"
            ))
        })?;
    let mut conditions = BTreeMap::new();
    for (i, (d, v)) in pairs.into_iter().enumerate() {
        if conditions.insert(d.clone(), v).is_some() {
            return Err(bad(format!(
                "conditions[{i}].dimension: {d:?} appears twice in one strategy"
            )));
        }
    }
    let mut rec = StrategyRecord {
        id: id_u32,
        name: get_s("name")?,
        conditions,
        algorithm: get_s("algorithm")?
            .parse()
            .map_err(|e: rate_ctl::core::model::ModelError| bad(e.to_string()))?,
        rate: in_range("rate", get_i("rate")?, u64::MAX)?,
        per: get_s("per")?
            .parse()
            .map_err(|e: rate_ctl::core::model::ModelError| bad(e.to_string()))?,
        burst: in_range("burst", get_i("burst")?, u32::MAX as u64)? as u32,
        action: get_s("action")?.parse().map_err(bad)?,
        status: match get_oi("status")? {
            Some(s) => Some(in_range("status", s, u16::MAX as u64)? as u16),
            None => None,
        },
        max_delay_ms: match get_oi("max_delay_ms")? {
            Some(s) => Some(in_range("max_delay_ms", s, u32::MAX as u64)? as u32),
            None => None,
        },
        enabled: match get_i("enabled")? {
            0 => false,
            1 => true,
            v => return Err(bad(format!("enabled: {v} is neither 0 nor 1"))),
        },
        scope: get_s("scope")?.parse().map_err(bad)?,
        created_ms: get_i("created_ms")?.max(0) as u64,
        updated_ms: get_i("updated_ms")?.max(0) as u64,
        version: get_i("version")?.max(0) as u64,
    };
    rec.validate().map_err(bad)?;
    Ok(rec)
}

fn decode_blacklist(r: &AnyRow) -> Result<BlacklistRecord, sqlx::Error> {
    Ok(BlacklistRecord {
        id: r.try_get::<i64, _>(0)? as u64,
        dimension: r.try_get(1)?,
        value: r.try_get(2)?,
        expires_ms: r.try_get::<Option<i64>, _>(3)?.map(|v| v.max(0) as u64),
        reason: r.try_get(4)?,
        created_ms: r.try_get::<i64, _>(5)?.max(0) as u64,
    })
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
        "--store: {url:?} is neither sqlite:PATH nor mysql://USER:PASSWORD@HOST:PORT/DB"
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
        assert!(normalise_url("postgres://x").is_err());
        assert_eq!(
            redact_url("mysql://u:s3cr@t@h:1/db"),
            "mysql://u:***@h:1/db"
        );
        assert_eq!(redact_url("sqlite:/a/b.db"), "sqlite:/a/b.db");
    }
}
