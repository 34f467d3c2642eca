//! The audit log: one entry per change, written in the change's
//! transaction.

use sqlx::{Any, Row, Transaction};

use super::schema::{insert_rows, Dialect};
use super::{AuditEntry, Result, Store};
use rate_ctl::core::clock::unix_ms;

/// Longest before/after JSON kept in an audit entry (column width).
const AUDIT_JSON_MAX: usize = 7_000;

impl Store {
    /// Audit entries, newest first: at most `limit`, with ids below `before_id`.
    pub async fn audit_list(&self, limit: u32, before_id: Option<u64>) -> Result<Vec<AuditEntry>> {
        let rows = sqlx::query(&self.sql(
            "SELECT id, at_ms, token, action, target, before_json, after_json, role, client FROM audit_log WHERE id < ? ORDER BY id DESC LIMIT ?",
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
                    role: r.try_get(7)?,
                    client: r.try_get(8)?,
                })
            })
            .collect()
    }
}

/// Who made a change, as the store's functions take it (`who: &str`):
/// the token's name alone (`cli`), or [`actor`]'s `NAME\x1fROLE\x1fCLIENT`
/// for a change through the API, split here into the `token`, `role` and
/// `client` columns. (One string keeps every store function's signature.)
pub const ACTOR_SEP: char = '\x1f';

/// The `who` of a change by the token `name` of `role` from `client`.
pub fn actor(name: &str, role: &str, client: Option<&str>) -> String {
    format!("{name}{ACTOR_SEP}{role}{ACTOR_SEP}{}", client.unwrap_or(""))
}

/// `who` as (token name, role, client).
fn split_actor(who: &str) -> (String, Option<String>, Option<String>) {
    let mut it = who.splitn(3, ACTOR_SEP);
    let name = it.next().unwrap_or("").to_string();
    let role = it.next().filter(|r| !r.is_empty()).map(str::to_string);
    let client = it.next().filter(|c| !c.is_empty()).map(str::to_string);
    (name, role, client)
}

/// One audit entry to write: action, target, before, after.
pub(super) type Entry = (
    &'static str,
    String,
    Option<serde_json::Value>,
    Option<serde_json::Value>,
);

/// Writes many audit entries (an import's before-images) inside the
/// change's transaction, a few hundred rows a statement.
pub(super) async fn audit_many(
    tx: &mut Transaction<'static, Any>,
    who: &str,
    entries: Vec<Entry>,
) -> Result<()> {
    let now = unix_ms() as i64;
    let (name, role, client) = split_actor(who);
    insert_rows(
        tx,
        "audit_log (at_ms, token, action, target, before_json, after_json, role, client)",
        8,
        &entries,
        |q, (action, target, before, after)| {
            q.bind(now)
                .bind(name.clone())
                .bind(action.to_string())
                .bind(target.clone())
                .bind(encode(before.clone()))
                .bind(encode(after.clone()))
                .bind(role.clone())
                .bind(client.clone())
        },
    )
    .await?;
    Ok(())
}

/// An entry's JSON as stored: whole, or a note of its size when longer
/// than the column.
fn encode(v: Option<serde_json::Value>) -> Option<String> {
    v.map(|v| {
        let s = v.to_string();
        if s.len() <= AUDIT_JSON_MAX {
            s
        } else {
            serde_json::json!({"truncated": true, "bytes": s.len()}).to_string()
        }
    })
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
    let (name, role, client) = split_actor(who);
    sqlx::query(&Dialect::of(tx).sql(
        "INSERT INTO audit_log (at_ms, token, action, target, before_json, after_json, role, client) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    ))
    .bind(unix_ms() as i64)
    .bind(name)
    .bind(action.to_string())
    .bind(target.to_string())
    .bind(encode(before))
    .bind(encode(after))
    .bind(role)
    .bind(client)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_split_into_name_role_client() {
        assert_eq!(split_actor("cli"), ("cli".into(), None, None));
        assert_eq!(
            split_actor(&actor("ops", "admin", Some("10.0.0.7:51234"))),
            (
                "ops".into(),
                Some("admin".into()),
                Some("10.0.0.7:51234".into())
            )
        );
        assert_eq!(
            split_actor(&actor("admin", "admin", None)),
            ("admin".into(), Some("admin".into()), None)
        );
    }
}
