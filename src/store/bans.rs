//! The penalty box in the store (issue 32): a strategy's `ban_after`,
//! `ban_within`, `ban_for` columns, and the blacklist entries the agents
//! write for the bans their hosts raised (`source` = `ban`, migration 132).

use sqlx::{Any, Row, Transaction};

use super::audit::audit;
use super::json::blacklist_api_json;
use super::record::{BlacklistRecord, StrategyRecord};
use super::valid::Valid;
use super::{Result, Store};
use rate_ctl::core::clock::unix_ms;

/// The `source` of an entry the penalty box made.
pub const SOURCE_BAN: &str = "ban";

/// Writes `rec`'s penalty box columns (NULL: none), by id or (an import,
/// where new rows got their id just now) by its unique name.
pub(super) async fn write_ban_columns(
    store: &Store,
    tx: &mut Transaction<'static, Any>,
    rec: &StrategyRecord,
    by_name: bool,
) -> Result<()> {
    if by_name && rec.ban_after.is_none() {
        return Ok(());
    }
    let sql = if by_name {
        "UPDATE strategies SET ban_after = ?, ban_within = ?, ban_for = ? WHERE name = ?"
    } else {
        "UPDATE strategies SET ban_after = ?, ban_within = ?, ban_for = ? WHERE id = ?"
    };
    let sql = store.sql(sql);
    let q = sqlx::query(&sql)
        .bind(rec.ban_after.map(i64::from))
        .bind(rec.ban_within.map(i64::from))
        .bind(rec.ban_for.map(i64::from));
    let q = if by_name {
        q.bind(rec.name.clone())
    } else {
        q.bind(rec.id as i64)
    };
    q.execute(&mut **tx).await?;
    Ok(())
}

/// What [`Store::blacklist_ban`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanWritten {
    /// The entry that bans the key (new, extended, or one that was there).
    pub id: u64,
    /// The config version after the change (unchanged when nothing was).
    pub version: Option<u64>,
    /// A new entry (else: an entry for the key was there already).
    pub created: bool,
}

impl Store {
    /// `INSERT … ` that does nothing for a row whose key exists: the
    /// statement's head and tail in this store's dialect.
    fn insert_ignore(&self) -> (&'static str, &'static str) {
        match self.dialect {
            super::schema::Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            super::schema::Dialect::MySql => ("INSERT IGNORE INTO", ""),
            super::schema::Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        }
    }

    /// One more ban raised (or extended) by `strategy_id`.
    async fn count_raised(
        &self,
        tx: &mut Transaction<'static, Any>,
        strategy_id: u32,
    ) -> Result<()> {
        let (head, tail) = self.insert_ignore();
        sqlx::query(&self.sql(&format!(
            "{head} ban_counts (strategy_id, raised) VALUES (?, 0){tail}"
        )))
        .bind(strategy_id as i64)
        .execute(&mut **tx)
        .await?;
        sqlx::query(&self.sql("UPDATE ban_counts SET raised = raised + 1 WHERE strategy_id = ?"))
            .bind(strategy_id as i64)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Per strategy: bans raised (or extended) by the agents so far, and
    /// ban entries in force at `now_ms` (for `/metrics`).
    pub async fn ban_metrics(&self, now_ms: u64) -> Result<Vec<(u32, u64, u64)>> {
        let mut out: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        for r in sqlx::query(&self.sql("SELECT strategy_id, raised FROM ban_counts"))
            .fetch_all(&self.pool)
            .await?
        {
            let id = r.try_get::<i64, _>(0)?.clamp(0, u32::MAX as i64) as u32;
            out.entry(id).or_default().0 = r.try_get::<i64, _>(1)?.max(0) as u64;
        }
        for r in sqlx::query(&self.sql(
            "SELECT ban_strategy, COUNT(*) FROM blacklist WHERE source = ? AND ban_strategy IS NOT NULL \
             AND expires_ms > ? GROUP BY ban_strategy",
        ))
        .bind(SOURCE_BAN)
        .bind(now_ms as i64)
        .fetch_all(&self.pool)
        .await?
        {
            let id = r.try_get::<i64, _>(0)?.clamp(0, u32::MAX as i64) as u32;
            out.entry(id).or_default().1 = r.try_get::<i64, _>(1)?.max(0) as u64;
        }
        Ok(out.into_iter().map(|(id, (r, a))| (id, r, a)).collect())
    }

    /// Writes a ban raised by a host's penalty box (`rec.source` is
    /// `ban`): one entry per key, whichever hosts raise it (the
    /// `(dimension, value)` key is unique): a key with no entry gets one; a
    /// ban entry already there is extended to the later expiry; an entry an
    /// operator made is left as it is. Audited as `blacklist.ban` by `who`.
    pub async fn blacklist_ban(
        &self,
        rec: &Valid<BlacklistRecord>,
        strategy_id: u32,
        who: &str,
    ) -> Result<BanWritten> {
        let rec = rec.clone().into_inner();
        let existing =
            sqlx::query(&self.sql(
                "SELECT id, expires_ms, source FROM blacklist WHERE dimension = ? AND value = ?",
            ))
            .bind(&rec.dimension)
            .bind(&rec.value)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = existing {
            let id = row.try_get::<i64, _>(0)? as u64;
            let expires = row.try_get::<Option<i64>, _>(1)?;
            let source = row.try_get::<Option<String>, _>(2)?;
            let later = match (expires, rec.expires_ms) {
                (Some(e), Some(n)) => (n as i64) > e,
                _ => false,
            };
            if source.as_deref() != Some(SOURCE_BAN) || !later {
                return Ok(BanWritten {
                    id,
                    version: None,
                    created: false,
                });
            }
            let (mut tx, version) = self.begin_change().await?;
            sqlx::query(&self.sql(
                "UPDATE blacklist SET expires_ms = ?, reason = ? WHERE id = ? AND source = ?",
            ))
            .bind(rec.expires_ms.map(|e| e as i64))
            .bind(&rec.reason)
            .bind(id as i64)
            .bind(SOURCE_BAN)
            .execute(&mut *tx)
            .await?;
            let mut after = rec;
            after.id = id;
            return self
                .ban_written(tx, version, strategy_id, who, after, false)
                .await;
        }
        let (mut tx, version) = self.begin_change().await?;
        let created_ms = unix_ms();
        // Another host may have written the same key since the read above:
        // the unique key keeps one entry, and this insert does nothing.
        let (head, tail) = self.insert_ignore();
        let inserted = sqlx::query(&self.sql(&format!(
            "{head} blacklist (dimension, value, expires_ms, reason, created_ms, source, ban_strategy) \
             VALUES (?, ?, ?, ?, ?, ?, ?){tail}"
        )))
        .bind(&rec.dimension)
        .bind(&rec.value)
        .bind(rec.expires_ms.map(|e| e as i64))
        .bind(&rec.reason)
        .bind(created_ms as i64)
        .bind(SOURCE_BAN)
        .bind(strategy_id as i64)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let id = self
            .blacklist_id(&mut tx, &rec.dimension, &rec.value)
            .await?;
        if inserted == 0 {
            tx.rollback().await?;
            return Ok(BanWritten {
                id,
                version: None,
                created: false,
            });
        }
        let mut after = rec;
        after.id = id;
        after.created_ms = created_ms;
        after.source = Some(SOURCE_BAN.into());
        self.ban_written(tx, version, strategy_id, who, after, true)
            .await
    }

    /// The end of a ban's write (a new entry or one extended) in `tx`:
    /// counted for `strategy_id`, logged as a blacklist change, audited as
    /// `blacklist.ban` with the entry `after`, committed.
    async fn ban_written(
        &self,
        mut tx: Transaction<'static, Any>,
        version: u64,
        strategy_id: u32,
        who: &str,
        after: BlacklistRecord,
        created: bool,
    ) -> Result<BanWritten> {
        self.count_raised(&mut tx, strategy_id).await?;
        super::changelog::log_change(&mut tx, version, super::Change::Blacklist).await?;
        let id = after.id;
        audit(
            &mut tx,
            who,
            "blacklist.ban",
            &format!("blacklist/{id}"),
            None,
            Some(blacklist_api_json(&after)),
        )
        .await?;
        tx.commit().await?;
        Ok(BanWritten {
            id,
            version: Some(version),
            created,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(value: &str, expires_ms: u64, host: &str) -> Valid<BlacklistRecord> {
        BlacklistRecord {
            id: 0,
            dimension: "ip".into(),
            value: value.into(),
            expires_ms: Some(expires_ms),
            reason: format!(
                "penalty box: strategy 1 \"box\": 3 rejections within 10s on host {host}"
            ),
            created_ms: 0,
            source: Some(SOURCE_BAN.into()),
        }
        .into_valid()
        .unwrap()
    }

    /// The stores to run on: SQLite, and the MariaDB / PostgreSQL test
    /// servers when named (scripts/mariadb-test-server.sh, postgres-…).
    fn urls(dir: &std::path::Path) -> Vec<String> {
        let mut v = vec![format!("sqlite:{}", dir.join("s.db").display())];
        for env in ["RATE_CTL_TEST_MYSQL_URL", "RATE_CTL_TEST_POSTGRES_URL"] {
            v.extend(std::env::var(env).ok());
        }
        v
    }

    #[test]
    fn a_ban_from_two_hosts_is_one_entry_and_an_operators_entry_stays() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for url in urls(dir.path()) {
            rt.block_on(async {
                let st = Store::open(&url).await.unwrap();
                // A value of its own per run (a shared server keeps rows).
                let x = format!("192.0.2.{}", unix_ms() % 200 + 1);
                let now = unix_ms();
                let a = st
                    .blacklist_ban(&ban(&x, now + 30_000, "a"), 1, "ban:a")
                    .await
                    .unwrap();
                assert!(a.created && a.version.is_some(), "{url}: {a:?}");
                // Host b at once, an earlier end: the same entry, unchanged.
                let b = st
                    .blacklist_ban(&ban(&x, now + 20_000, "b"), 1, "ban:b")
                    .await
                    .unwrap();
                assert_eq!((b.id, b.created, b.version), (a.id, false, None), "{url}");
                // A later end extends it.
                let c = st
                    .blacklist_ban(&ban(&x, now + 60_000, "b"), 1, "ban:b")
                    .await
                    .unwrap();
                assert_eq!((c.id, c.created), (a.id, false));
                assert!(c.version.is_some());
                let list = st.blacklist_list().await.unwrap();
                let mine: Vec<_> = list.iter().filter(|e| e.value == x).collect();
                assert_eq!(mine.len(), 1, "{url}: {list:?}");
                assert_eq!(mine[0].source.as_deref(), Some(SOURCE_BAN));
                assert_eq!(mine[0].expires_ms, Some(now + 60_000));
                assert!(mine[0].reason.contains("on host b"), "{:?}", mine[0]);
                // An operator's entry for a key is left alone.
                let y = format!("198.51.100.{}", unix_ms() % 200 + 1);
                let manual = BlacklistRecord {
                    source: None,
                    expires_ms: None,
                    reason: "by hand".into(),
                    ..ban(&y, 0, "a").into_inner()
                }
                .into_valid()
                .unwrap();
                let (mid, _) = st.blacklist_add(&manual, "cli").await.unwrap();
                let d = st
                    .blacklist_ban(&ban(&y, now + 30_000, "a"), 1, "ban:a")
                    .await
                    .unwrap();
                assert_eq!((d.id, d.created, d.version), (mid, false, None));
                let e = st.blacklist_list().await.unwrap();
                let e = e.iter().find(|e| e.value == y).unwrap();
                assert_eq!((e.source.as_deref(), e.expires_ms), (None, None));
                // The audit log says who banned whom.
                let audit: i64 = sqlx::query(&st.sql(
                    "SELECT COUNT(*) FROM audit_log WHERE action = 'blacklist.ban' AND target = ?",
                ))
                .bind(format!("blacklist/{}", a.id))
                .fetch_one(&st.pool)
                .await
                .unwrap()
                .try_get(0)
                .unwrap();
                assert_eq!(audit, 2, "{url}: created and extended");
                let m = st.ban_metrics(now).await.unwrap();
                let one = m.iter().find(|m| m.0 == 1).unwrap();
                assert!(one.1 >= 2 && one.2 >= 1, "{url}: raised, active: {m:?}");
                st.blacklist_rm(a.id, "cli").await.unwrap();
                st.blacklist_rm(mid, "cli").await.unwrap();
            });
        }
    }
}
