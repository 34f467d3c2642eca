//! The writers' half of the change log (migration 129, issue 29): what
//! each config version changed, one `config_changes` row per thing, written
//! in the change's transaction. Read by `changes.rs`.

use rate_ctl::core::clock::unix_ms;
use sqlx::{Any, Transaction};

use super::schema::Dialect;
use super::Result;

/// What one version changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// One strategy added, replaced or deleted.
    Strategy(u32),
    /// The blacklist (read again whole).
    Blacklist,
    /// A host's weight: nothing to read (the shares come from the hosts).
    Hosts,
    /// Anything, e.g. an import: read everything.
    All,
}

impl Change {
    fn row(self) -> (&'static str, i64) {
        match self {
            Change::Strategy(id) => ("strategy", id as i64),
            Change::Blacklist => ("blacklist", 0),
            Change::Hosts => ("hosts", 0),
            Change::All => ("all", 0),
        }
    }
}

/// Versions of log kept; an agent further behind reads everything.
pub const KEEP_VERSIONS: u64 = 10_000;

/// Records what version `version` changed (in its transaction); every
/// hundredth version prunes the log's old rows.
pub(super) async fn log_change(
    tx: &mut Transaction<'static, Any>,
    version: u64,
    change: Change,
) -> Result<()> {
    let d = Dialect::of(tx);
    let (kind, target) = change.row();
    sqlx::query(
        &d.sql("INSERT INTO config_changes (version, kind, target, at_ms) VALUES (?, ?, ?, ?)"),
    )
    .bind(version as i64)
    .bind(kind)
    .bind(target)
    .bind(unix_ms() as i64)
    .execute(&mut **tx)
    .await?;
    if version % 100 == 0 && version > KEEP_VERSIONS {
        sqlx::query(&d.sql("DELETE FROM config_changes WHERE version < ?"))
            .bind((version - KEEP_VERSIONS) as i64)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}
