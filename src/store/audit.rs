//! The audit log: one entry per change, written in the change's
//! transaction.

use sqlx::{Any, Row, Transaction};

use super::schema::Dialect;
use super::{AuditEntry, Result, Store};
use rate_ctl::core::shm::unix_ms;

/// Longest before/after JSON kept in an audit entry (column width).
const AUDIT_JSON_MAX: usize = 7_000;

impl Store {
    /// Audit entries, newest first: at most `limit`, with ids below `before_id`.
    pub async fn audit_list(&self, limit: u32, before_id: Option<u64>) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(&self.sql(
            "SELECT id, at_ms, token, action, target, before_json, after_json FROM audit_log WHERE id < ? ORDER BY id DESC LIMIT ?",
        ))
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
}

/// Writes one audit entry inside the change's transaction.
pub(super) async fn audit(
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
    sqlx::query(&Dialect::of(tx).sql(
        "INSERT INTO audit_log (at_ms, token, action, target, before_json, after_json)          VALUES (?, ?, ?, ?, ?, ?)",
    ))
    .bind(unix_ms() as i64)
    .bind(who.to_string())
    .bind(action.to_string())
    .bind(target.to_string())
    .bind(enc(before))
    .bind(enc(after))
    .execute(&mut **tx)
    .await?;
    Ok(())
}
