//! The `tz` column of strategies (migration 135, issue 33), written by
//! its own statement after a row's insert or update, as the response
//! columns are.

use sqlx::{Any, Transaction};

use super::record::StrategyRecord;
use super::{Result, Store};

impl Store {
    /// Writes `r.tz` to the row whose `key` (`id` or, on import, the unique
    /// `name`) is `r`'s; NULL for UTC.
    pub(super) async fn write_tz_row(
        &self,
        tx: &mut Transaction<'static, Any>,
        r: &StrategyRecord,
        key: &'static str,
    ) -> Result<()> {
        let sql = format!("UPDATE strategies SET tz = ? WHERE {key} = ?");
        let sql = self.sql(&sql).into_owned();
        let q = sqlx::query(&sql).bind(r.tz.clone());
        let q = if key == "id" {
            q.bind(r.id as i64)
        } else {
            q.bind(r.name.clone())
        };
        q.execute(&mut **tx).await?;
        Ok(())
    }
}

/// [`Store::write_tz_row`]; a record without `tz` on import writes
/// nothing (its new row's column is NULL already; a replaced row is
/// inserted anew).
pub(super) async fn write_tz(
    store: &Store,
    tx: &mut Transaction<'static, Any>,
    r: &StrategyRecord,
    key: &'static str,
) -> Result<()> {
    if key == "name" && r.tz.is_none() {
        return Ok(());
    }
    store.write_tz_row(tx, r, key).await
}
