//! Key resets (issue 33): `rate-ctl key reset`, `DELETE
//! /api/v1/strategies/{id}/keys/{key}`. A reset is a row of `key_resets`
//! (migration 133), written with its audit entry in one transaction; every
//! agent reads the rows after the last one it applied
//! ([`Store::key_resets_after`]) and resets that key in its own file
//! (`src/agent/keys.rs`). Rows older than [`KEEP_MS`] are deleted by the
//! next reset.

use sqlx::Row;

use super::audit::audit;
use super::error::Field;
use super::{Invalid, Result, Store, StoreError};
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::keys::read::{key_text, parse_key};
use rate_ctl::core::model::each::{DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX};

/// How long a reset row is kept (an agent away longer does not apply it:
/// its table has moved on anyway).
pub const KEEP_MS: u64 = 24 * 3600 * 1000;
/// Most rows one read returns.
pub const READ_LIMIT: u32 = 500;

/// One requested reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReset {
    pub id: u64,
    pub strategy_id: u32,
    /// The key as `$rate_ctl_key` prints it.
    pub key: String,
    pub at_ms: u64,
}

impl Store {
    /// The key text `key` of strategy `id` checked against the strategy's
    /// `each` and given back as `$rate_ctl_key` prints it:
    /// `Err(NotFound)` without the strategy, `Err(Invalid)` (field `key`)
    /// for a key it has not.
    pub async fn canonical_key(&self, id: u32, key: &str) -> Result<String> {
        let rec = self.get_strategy(id).await?;
        let v4 = rec.ipv4_prefix.unwrap_or(DEFAULT_IPV4_PREFIX);
        let v6 = rec.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
        let parts = parse_key(key, &rec.each, v4, v6).map_err(|e| {
            StoreError::Invalid(Invalid::new(
                Field::Column("key"),
                "key",
                e.0.trim_start_matches("key: "),
            ))
        })?;
        Ok(key_text(&parts, &rec.each))
    }

    /// Records a reset of `key` of strategy `id` (audited as `key.reset`);
    /// the row as stored.
    pub async fn key_reset(&self, id: u32, key: &str, who: &str) -> Result<KeyReset> {
        let key = self.canonical_key(id, key).await?;
        let now = unix_ms();
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql("DELETE FROM key_resets WHERE at_ms < ?"))
            .bind(now.saturating_sub(KEEP_MS) as i64)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            &self.sql("INSERT INTO key_resets (strategy_id, key_text, at_ms) VALUES (?, ?, ?)"),
        )
        .bind(id as i64)
        .bind(&key)
        .bind(now as i64)
        .execute(&mut *tx)
        .await?;
        let row_id: i64 = sqlx::query(&self.sql(
            "SELECT MAX(id) FROM key_resets WHERE strategy_id = ? AND key_text = ? AND at_ms = ?",
        ))
        .bind(id as i64)
        .bind(&key)
        .bind(now as i64)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
        let row = KeyReset {
            id: row_id.max(0) as u64,
            strategy_id: id,
            key,
            at_ms: now,
        };
        audit(
            &mut tx,
            who,
            "key.reset",
            &format!("strategies/{id}/keys/{}", row.key),
            None,
            Some(serde_json::json!({"id": row.id, "strategy": id, "key": row.key})),
        )
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Resets recorded after `after` (by id, oldest first, at most
    /// [`READ_LIMIT`]).
    pub async fn key_resets_after(&self, after: u64) -> Result<Vec<KeyReset>> {
        let rows = sqlx::query(&self.sql(
            "SELECT id, strategy_id, key_text, at_ms FROM key_resets WHERE id > ? ORDER BY id LIMIT ?",
        ))
        .bind(after.min(i64::MAX as u64) as i64)
        .bind(READ_LIMIT as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(KeyReset {
                    id: r.try_get::<i64, _>(0)?.max(0) as u64,
                    strategy_id: u32::try_from(r.try_get::<i64, _>(1)?).unwrap_or(0),
                    key: r.try_get(2)?,
                    at_ms: r.try_get::<i64, _>(3)?.max(0) as u64,
                })
            })
            .collect()
    }

    /// The newest reset's id (0: none): where a starting agent begins.
    pub async fn key_resets_last(&self) -> Result<u64> {
        let v: Option<i64> = sqlx::query(&self.sql("SELECT MAX(id) FROM key_resets"))
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(v.unwrap_or(0).max(0) as u64)
    }
}

/// A question of the fleet view for the agents that read the store
/// itself: a key, or (`key` `None`) the strategy's top keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuestion {
    pub id: u64,
    pub strategy_id: u32,
    pub key: Option<String>,
}

/// Longest answer kept (bytes of JSON).
pub const ANSWER_MAX: usize = 8000;

impl Store {
    /// Records a question (questions older than a minute are deleted
    /// with their answers); its id.
    pub async fn key_ask(&self, id: u32, key: Option<&str>, now: u64) -> Result<u64> {
        let old = now.saturating_sub(60_000) as i64;
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql(
            "DELETE FROM key_answers WHERE question_id IN (SELECT id FROM key_questions WHERE asked_ms < ?)",
        ))
        .bind(old)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&self.sql("DELETE FROM key_questions WHERE asked_ms < ?"))
            .bind(old)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            &self.sql(
                "INSERT INTO key_questions (strategy_id, key_text, asked_ms) VALUES (?, ?, ?)",
            ),
        )
        .bind(id as i64)
        .bind(key)
        .bind(now as i64)
        .execute(&mut *tx)
        .await?;
        let qid: i64 = sqlx::query(
            &self.sql("SELECT MAX(id) FROM key_questions WHERE strategy_id = ? AND asked_ms = ?"),
        )
        .bind(id as i64)
        .bind(now as i64)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
        tx.commit().await?;
        Ok(qid.max(0) as u64)
    }

    /// Questions asked since `since_ms` that `host` has not answered.
    pub async fn key_questions_for(&self, host: &str, since_ms: u64) -> Result<Vec<KeyQuestion>> {
        let rows = sqlx::query(&self.sql(
            "SELECT id, strategy_id, key_text FROM key_questions q WHERE asked_ms >= ? \
             AND NOT EXISTS (SELECT 1 FROM key_answers a WHERE a.question_id = q.id AND a.host_id = ?) \
             ORDER BY id LIMIT 256",
        ))
        .bind(since_ms.min(i64::MAX as u64) as i64)
        .bind(host)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(KeyQuestion {
                    id: r.try_get::<i64, _>(0)?.max(0) as u64,
                    strategy_id: u32::try_from(r.try_get::<i64, _>(1)?).unwrap_or(0),
                    key: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// `host`'s answer to question `id` (JSON, at most [`ANSWER_MAX`]
    /// bytes; a longer one is not stored).
    pub async fn key_answer(&self, id: u64, host: &str, answer: &serde_json::Value) -> Result<()> {
        let text = answer.to_string();
        if text.len() > ANSWER_MAX {
            return Ok(());
        }
        sqlx::query(
            &self.sql(
                "INSERT INTO key_answers (question_id, host_id, answer_json) VALUES (?, ?, ?)",
            ),
        )
        .bind(id.min(i64::MAX as u64) as i64)
        .bind(host)
        .bind(text)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The answers to question `id` by host (rows that are not JSON are
    /// skipped).
    pub async fn key_answers(&self, id: u64) -> Result<Vec<(String, serde_json::Value)>> {
        let rows = sqlx::query(
            &self.sql("SELECT host_id, answer_json FROM key_answers WHERE question_id = ?"),
        )
        .bind(id.min(i64::MAX as u64) as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let h: String = r.try_get(0).ok()?;
                let a: String = r.try_get(1).ok()?;
                Some((h, serde_json::from_str(&a).ok()?))
            })
            .collect())
    }
}
