//! What each config version changed (migration 129, issue 29), so that an
//! agent reads only that: every change writes one `config_changes` row per
//! thing it touched, in the transaction that bumps the version.
//!
//! [`Store::changes_since`] answers `None` (read everything) unless the log
//! has a row for every version after the agent's: a version without one
//! (written by an older binary, pruned, or a bulk import that logs `all`)
//! is a gap, and the full read is the fallback. Rows older than
//! [`super::changelog::KEEP_VERSIONS`] versions are pruned now and then by
//! the writers (`changelog.rs`).

use sqlx::{Any, Row, Transaction};

use super::blacklist::decode_blacklist;
use super::record::{BlacklistRecord, StrategyRecord};
use super::schema::{placeholders, Dialect};
use super::strategies::{split_rows, STRATEGY_COLUMNS};
use super::valid::Valid;
use super::{BadRow, Result, Store};

/// Most strategies a delta reads; more changed, and the full read is as cheap.
pub const MAX_DELTA_STRATEGIES: usize = 1_000;

/// The changes since a version, read in one transaction.
#[derive(Debug, Clone, Default)]
pub struct Changes {
    pub version: u64,
    /// Strategies added or replaced, valid.
    pub strategies: Vec<Valid<StrategyRecord>>,
    /// Changed rows that are invalid (skipped, like in a snapshot).
    pub bad_rows: Vec<BadRow>,
    /// Strategies changed that are no longer stored (deleted).
    pub removed: Vec<u32>,
    /// The whole blacklist when it changed.
    pub blacklist: Option<Vec<Valid<BlacklistRecord>>>,
}

impl Store {
    /// What changed after version `after`: `Ok(None)` when only a full
    /// read ([`Store::snapshot`]) can tell (a gap in the log, an import,
    /// too many strategies, a version older than the log or newer than
    /// the store's).
    pub async fn changes_since(&self, after: u64) -> Result<Option<Changes>> {
        let (mut tx, version) = self.read_view().await?;
        if version < after {
            return Ok(None);
        }
        let mut out = Changes {
            version,
            ..Changes::default()
        };
        if version == after {
            return Ok(Some(out));
        }
        let rows = sqlx::query(&self.sql(
            "SELECT version, kind, target FROM config_changes WHERE version > ? AND version <= ? ORDER BY version",
        ))
        .bind(after as i64)
        .bind(version as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut seen = 0u64;
        let mut last = after as i64;
        let mut ids: Vec<i64> = Vec::new();
        let mut blacklist = false;
        for r in &rows {
            let v: i64 = r.try_get(0)?;
            let kind: String = r.try_get(1)?;
            let target: i64 = r.try_get(2)?;
            if v != last {
                seen += 1;
                last = v;
            }
            match kind.as_str() {
                "strategy" => ids.push(target),
                "blacklist" => blacklist = true,
                "hosts" => {}
                _ => return Ok(None),
            }
        }
        ids.sort_unstable();
        ids.dedup();
        if seen != version - after || ids.len() > MAX_DELTA_STRATEGIES {
            return Ok(None);
        }
        if !ids.is_empty() {
            let sql = format!(
                "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id IN ({}) ORDER BY id",
                placeholders(ids.len())
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql);
            for id in &ids {
                q = q.bind(*id);
            }
            let found = q.fetch_all(&mut *tx).await?;
            let (strategies, bad_rows) = split_rows(&found);
            let present: std::collections::HashSet<i64> = strategies
                .iter()
                .map(|s| s.id as i64)
                .chain(bad_rows.iter().map(|b| b.id))
                .collect();
            out.removed = ids
                .iter()
                .filter(|id| !present.contains(id))
                .filter_map(|&id| u32::try_from(id).ok())
                .collect();
            out.strategies = strategies;
            out.bad_rows = bad_rows;
        }
        if blacklist {
            out.blacklist = Some(read_blacklist(self.dialect, &mut tx).await?);
        }
        tx.commit().await?;
        Ok(Some(out))
    }
}

/// The valid blacklist entries (invalid ones, edited in the database,
/// are skipped), read in `tx`.
pub(super) async fn read_blacklist(
    d: Dialect,
    tx: &mut Transaction<'static, Any>,
) -> Result<Vec<Valid<BlacklistRecord>>> {
    let bl = sqlx::query(&d.sql(
        "SELECT id, dimension, value, expires_ms, reason, created_ms, source FROM blacklist ORDER BY id",
    ))
    .fetch_all(&mut **tx)
    .await?;
    let mut out = Vec::with_capacity(bl.len());
    for r in &bl {
        if let Ok(rec) = decode_blacklist(r)?.into_valid() {
            out.push(rec);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::StrategyRecord;

    fn rec(name: &str) -> Valid<StrategyRecord> {
        serde_json::from_str::<StrategyRecord>(&format!(
            r#"{{"name":"{name}","algorithm":"token_bucket","rate":5,"burst":4,"scope":"host"}}"#
        ))
        .unwrap()
        .into_valid()
        .unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn changes_since_reads_only_what_changed_and_a_gap_asks_for_everything() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite:{}", dir.path().join("s.db").display()))
            .await
            .unwrap();
        let (a, _) = store.add_strategy(&rec("a"), "test").await.unwrap();
        let (b, v1) = store.add_strategy(&rec("b"), "test").await.unwrap();
        let (c, _) = store.add_strategy(&rec("c"), "test").await.unwrap();
        store.delete_strategy(a, "test").await.unwrap();
        let v = store.version().await.unwrap();

        let ch = store.changes_since(v1).await.unwrap().expect("a delta");
        assert_eq!(ch.version, v);
        let ids: Vec<u32> = ch.strategies.iter().map(|s| s.id).collect();
        assert_eq!(ids, [c], "only c was added after b");
        assert_eq!(ch.removed, [a]);
        assert!(ch.blacklist.is_none());
        assert!(!ids.contains(&b));
        // Nothing new: an empty delta at the same version.
        let none = store.changes_since(v).await.unwrap().unwrap();
        assert!(none.strategies.is_empty() && none.removed.is_empty());

        // A version bumped without a log row (an older binary): a gap.
        sqlx::query("UPDATE config_version SET version = version + 1 WHERE id = 1")
            .execute(store.pool())
            .await
            .unwrap();
        assert!(store.changes_since(v).await.unwrap().is_none());
        assert!(store.changes_since(v1).await.unwrap().is_none());
    }
}
