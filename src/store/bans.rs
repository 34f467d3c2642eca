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
    /// Writes a ban raised by a host's penalty box (`rec.source` is
    /// `ban`): one entry per key, whichever hosts raise it (the
    /// `(dimension, value)` key is unique): a key with no entry gets one; a
    /// ban entry already there is extended to the later expiry; an entry an
    /// operator made is left as it is. Audited as `blacklist.ban` by `who`.
    pub async fn blacklist_ban(
        &self,
        rec: &Valid<BlacklistRecord>,
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
            let mut after = rec.clone();
            after.id = id;
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
            return Ok(BanWritten {
                id,
                version: Some(version),
                created: false,
            });
        }
        let (mut tx, version) = self.begin_change().await?;
        let created_ms = unix_ms();
        // Another host may have written the same key since the read above:
        // the unique key keeps one entry, and this insert does nothing.
        let (head, tail) = match self.dialect {
            super::schema::Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            super::schema::Dialect::MySql => ("INSERT IGNORE INTO", ""),
            super::schema::Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        };
        let inserted = sqlx::query(&self.sql(&format!(
            "{head} blacklist (dimension, value, expires_ms, reason, created_ms, source) \
             VALUES (?, ?, ?, ?, ?, ?){tail}"
        )))
        .bind(&rec.dimension)
        .bind(&rec.value)
        .bind(rec.expires_ms.map(|e| e as i64))
        .bind(&rec.reason)
        .bind(created_ms as i64)
        .bind(SOURCE_BAN)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let id: i64 =
            sqlx::query(&self.sql("SELECT id FROM blacklist WHERE dimension = ? AND value = ?"))
                .bind(&rec.dimension)
                .bind(&rec.value)
                .fetch_one(&mut *tx)
                .await?
                .try_get(0)?;
        if inserted == 0 {
            tx.rollback().await?;
            return Ok(BanWritten {
                id: id as u64,
                version: None,
                created: false,
            });
        }
        let mut after = rec;
        after.id = id as u64;
        after.created_ms = created_ms;
        after.source = Some(SOURCE_BAN.into());
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
            id: id as u64,
            version: Some(version),
            created: true,
        })
    }
}
