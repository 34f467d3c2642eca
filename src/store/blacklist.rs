//! The blacklist table.

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::audit::audit;
use super::json::blacklist_api_json;
use super::record::BlacklistRecord;
use super::valid::Valid;
use super::{Result, Store, StoreError};
use rate_ctl::core::clock::unix_ms;

impl Store {
    /// Adds (or replaces, for the same dimension and value) an entry;
    /// returns its id and the new version.
    pub async fn blacklist_add(
        &self,
        rec: &Valid<BlacklistRecord>,
        who: &str,
    ) -> Result<(u64, u64)> {
        self.blacklist_add_full(rec, who)
            .await
            .map(|(r, v)| (r.id, v))
    }

    /// The id of the entry for `(dimension, value)` (the blacklist's
    /// unique key), read in `tx`.
    pub(super) async fn blacklist_id(
        &self,
        tx: &mut Transaction<'static, Any>,
        dimension: &str,
        value: &str,
    ) -> Result<u64> {
        let id: i64 =
            sqlx::query(&self.sql("SELECT id FROM blacklist WHERE dimension = ? AND value = ?"))
                .bind(dimension)
                .bind(value)
                .fetch_one(&mut **tx)
                .await?
                .try_get(0)?;
        Ok(id as u64)
    }

    /// [`Store::blacklist_add`], returning the stored entry.
    pub async fn blacklist_add_full(
        &self,
        rec: &Valid<BlacklistRecord>,
        who: &str,
    ) -> Result<(BlacklistRecord, u64)> {
        // The store sets its own fields (id, created_ms).
        let mut rec = rec.clone().into_inner();
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query(&self.sql(
            "SELECT id, dimension, value, expires_ms, reason, created_ms, source FROM blacklist WHERE dimension = ? AND value = ?",
        ))
        .bind(&rec.dimension)
        .bind(&rec.value)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| decode_blacklist(&r))
        .transpose()?;
        rec.created_ms = unix_ms();
        sqlx::query(&self.sql("DELETE FROM blacklist WHERE dimension = ? AND value = ?"))
            .bind(&rec.dimension)
            .bind(&rec.value)
            .execute(&mut *tx)
            .await?;
        sqlx::query(&self.sql(
            "INSERT INTO blacklist (dimension, value, expires_ms, reason, created_ms, source) \
             VALUES (?, ?, ?, ?, ?, ?)",
        ))
        .bind(&rec.dimension)
        .bind(&rec.value)
        .bind(rec.expires_ms.map(|e| e as i64))
        .bind(&rec.reason)
        .bind(rec.created_ms as i64)
        .bind(rec.source.clone())
        .execute(&mut *tx)
        .await?;
        let id = self
            .blacklist_id(&mut tx, &rec.dimension, &rec.value)
            .await?;
        rec.id = id;
        audit(
            &mut tx,
            who,
            "blacklist.add",
            &format!("blacklist/{id}"),
            before.as_ref().map(blacklist_api_json),
            Some(blacklist_api_json(&rec)),
        )
        .await?;
        super::changelog::log_change(&mut tx, version, super::Change::Blacklist).await?;
        tx.commit().await?;
        Ok((rec, version))
    }

    /// Removes entries by id; returns the new version.
    pub async fn blacklist_rm(&self, id: u64, who: &str) -> Result<u64> {
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query(&self.sql(
            "SELECT id, dimension, value, expires_ms, reason, created_ms, source FROM blacklist WHERE id = ?",
        ))
        .bind(id as i64)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| decode_blacklist(&r))
        .transpose()?;
        let res = sqlx::query(&self.sql("DELETE FROM blacklist WHERE id = ?"))
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
        super::changelog::log_change(&mut tx, version, super::Change::Blacklist).await?;
        tx.commit().await?;
        Ok(version)
    }

    pub async fn blacklist_list(&self) -> Result<Vec<BlacklistRecord>> {
        let rows = sqlx::query(&self.sql(
            "SELECT id, dimension, value, expires_ms, reason, created_ms, source FROM blacklist ORDER BY id",
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| decode_blacklist(r).map_err(StoreError::from))
            .collect()
    }
}

pub(super) fn decode_blacklist(r: &AnyRow) -> Result<BlacklistRecord, sqlx::Error> {
    Ok(BlacklistRecord {
        id: r.try_get::<i64, _>(0)? as u64,
        dimension: r.try_get(1)?,
        value: r.try_get(2)?,
        expires_ms: r.try_get::<Option<i64>, _>(3)?.map(|v| v.max(0) as u64),
        reason: r.try_get(4)?,
        created_ms: r.try_get::<i64, _>(5)?.max(0) as u64,
        source: r.try_get::<Option<String>, _>(6)?,
    })
}
