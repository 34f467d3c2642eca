//! The strategies table: add, update, delete, read and import (all or
//! nothing), and decoding a row into a validated record.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::audit::audit;
use super::json::strategy_api_json;
use super::record::{Split, StrategyRecord};
use super::schema::{placeholders, value_rows, Dialect};
use super::valid::{Valid, ValidImport};
use super::{BadRow, Field, Invalid, Result, Store, StoreError};
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::model::ModelError;

pub(super) const STRATEGY_COLUMNS: &str =
    "id, name, conditions, algorithm, rate, per, burst, action, \
     status, max_delay_ms, enabled, scope, warm_up_ms, cold_factor, priority, each_dims, ipv4_prefix, \
     ipv6_prefix, on_full, split, created_ms, updated_ms, version, count_if, cost_from, cost_after, max_keys, tz, \
     ban_after, ban_within, ban_for";

impl Store {
    /// Stores a new strategy (validated by whoever received it); returns
    /// its id and the new version.
    pub async fn add_strategy(&self, rec: &Valid<StrategyRecord>, who: &str) -> Result<(u32, u64)> {
        self.add_strategy_full(rec, who)
            .await
            .map(|r| (r.id, r.version))
    }

    /// [`Store::add_strategy`], returning the stored record.
    pub async fn add_strategy_full(
        &self,
        rec: &Valid<StrategyRecord>,
        who: &str,
    ) -> Result<StrategyRecord> {
        // The store sets its own fields (id, times, version); none bears on
        // validity.
        let mut rec = rec.clone().into_inner();
        rec.id = 0;
        let (mut tx, version) = self.begin_change().await?;
        ensure_name_free(&mut tx, &rec.name, None).await?;
        let now = unix_ms();
        rec.created_ms = now;
        rec.updated_ms = now;
        rec.version = version;
        let sql = format!(
            "INSERT INTO strategies ({INSERT_COLUMNS}) VALUES ({})",
            placeholders(INSERT_COUNT)
        );
        bind_strategy(sqlx::query(&self.sql(&sql)), &rec)
            .execute(&mut *tx)
            .await?;
        // Any's SQLite backend reports no last insert id; the name is unique.
        let id: i64 = sqlx::query(&self.sql("SELECT id FROM strategies WHERE name = ?"))
            .bind(&rec.name)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        let id = u32::try_from(id)
            .map_err(|_| Invalid::new(Field::Id, "id", format!("{id} exceeds {}", u32::MAX)))?;
        rec.id = id;
        self.finish_write(tx, who, "strategy.create", None, rec)
            .await
    }

    /// The end of a strategy's insert or update: its response columns, the
    /// audit entry (`before`, and the API's JSON of `rec` after) and the
    /// commit.
    async fn finish_write(
        &self,
        mut tx: Transaction<'static, Any>,
        who: &str,
        action: &str,
        before: Option<serde_json::Value>,
        rec: StrategyRecord,
    ) -> Result<StrategyRecord> {
        bind_response(sqlx::query(&self.sql(RESPONSE_UPDATE)), &rec)
            .execute(&mut *tx)
            .await?;
        super::calendar::write_tz(self, &mut tx, &rec, "id").await?;
        super::bans::write_ban_columns(self, &mut tx, &rec, false).await?;
        super::changelog::log_change(&mut tx, rec.version, super::Change::Strategy(rec.id)).await?;
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

    /// Replaces strategy `rec.id` with `rec` (validated); returns the new version.
    pub async fn update_strategy(&self, rec: &Valid<StrategyRecord>, who: &str) -> Result<u64> {
        self.update_strategy_full(rec, None, who, "strategy.update")
            .await
            .map(|r| r.version)
    }

    /// Replaces strategy `rec.id` with `rec` (validated) if its stored
    /// version is still `expected` (when given, else `Conflict`); returns
    /// the stored record. `action` names the change in the audit log.
    pub async fn update_strategy_full(
        &self,
        rec: &Valid<StrategyRecord>,
        expected: Option<u64>,
        who: &str,
        action: &str,
    ) -> Result<StrategyRecord> {
        let mut rec = rec.clone().into_inner();
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
        rec.updated_ms = unix_ms();
        rec.version = version;
        let res = bind_content(
            sqlx::query(&self.sql(
                "UPDATE strategies SET name = ?, conditions = ?, algorithm = ?, rate = ?, per = ?, \
                 burst = ?, action = ?, status = ?, max_delay_ms = ?, enabled = ?, scope = ?, \
                 warm_up_ms = ?, cold_factor = ?, priority = ?, each_dims = ?, ipv4_prefix = ?, \
                 ipv6_prefix = ?, on_full = ?, split = ?, updated_ms = ?, version = ?, \
                 max_keys = ? WHERE id = ?",
            )),
            &rec,
        )
        .bind(rec.updated_ms as i64)
        .bind(rec.version as i64)
        .bind(rec.max_keys.map(i64::from))
        .bind(rec.id as i64)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!(
                "no strategy with id {}",
                rec.id
            )));
        }
        self.finish_write(tx, who, action, before, rec).await
    }

    /// Deletes a strategy; returns the new version.
    pub async fn delete_strategy(&self, id: u32, who: &str) -> Result<u64> {
        self.delete_strategy_at(id, None, who).await
    }

    /// Deletes a strategy if its stored version is still `expected` (when
    /// given, else `Conflict`: someone changed it since the caller read
    /// it); returns the new version.
    pub async fn delete_strategy_at(
        &self,
        id: u32,
        expected: Option<u64>,
        who: &str,
    ) -> Result<u64> {
        let (mut tx, version) = self.begin_change().await?;
        let before = strategy_in_tx(&mut tx, id).await?;
        if let (Some(exp), Some(b)) = (expected, &before) {
            let cur = b["version"].as_u64().unwrap_or(0);
            if cur != exp {
                return Err(StoreError::Conflict(format!(
                    "version: strategy {id} was changed at version {cur}; you deleted version {exp}"
                )));
            }
        }
        let res = sqlx::query(&self.sql("DELETE FROM strategies WHERE id = ?"))
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
        super::changelog::log_change(&mut tx, version, super::Change::Strategy(id)).await?;
        tx.commit().await?;
        Ok(version)
    }

    /// One strategy; `Err(NotFound)` if absent, `Err(Invalid)` if its row
    /// is not a valid strategy.
    pub async fn get_strategy(&self, id: u32) -> Result<StrategyRecord> {
        let row = sqlx::query(&self.sql(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id = ?"
        )))
        .bind(id as i64)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("no strategy with id {id}")))?;
        decode_strategy(&row)
            .map(Valid::into_inner)
            .map_err(|b| StoreError::Invalid(b.reason))
    }

    /// All strategies by id; rows that are not valid strategies come back
    /// as [`BadRow`]s.
    pub async fn list_strategies(&self) -> Result<(Vec<StrategyRecord>, Vec<BadRow>)> {
        let rows = sqlx::query(&self.sql(&format!(
            "SELECT {STRATEGY_COLUMNS} FROM strategies ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await?;
        let (good, bad) = split_rows(&rows);
        Ok((good.into_iter().map(Valid::into_inner).collect(), bad))
    }

    /// Loads strategies from validated JSON-lines records (see
    /// [`valid_import`](super::valid::valid_import)) in one transaction: all
    /// or nothing. A record with an id replaces that strategy (or is stored
    /// under that id); one without gets a new id. With `replace_all`, every
    /// strategy not in the file is deleted. Errors name the line (1-based).
    ///
    /// An import that changes nothing (no record, and nothing to delete)
    /// leaves the version alone. One with `replace_all` and no record that
    /// would delete every strategy is refused ([`StoreError::EmptyReplace`])
    /// unless `allow_empty`. Every strategy it deletes or replaces is
    /// audited with its before-image (`strategy.import.delete` /
    /// `strategy.import.replace`, one entry each, besides the
    /// `strategy.import` summary), so that it can be restored.
    pub async fn import(
        &self,
        batch: ValidImport,
        replace_all: bool,
        allow_empty: bool,
        who: &str,
    ) -> Result<(usize, u64)> {
        let ValidImport {
            records,
            names,
            ids,
        } = batch;
        let mut records: Vec<(usize, StrategyRecord)> = records
            .into_iter()
            .map(|(line, r)| (line, r.into_inner()))
            .collect();
        if records.is_empty() {
            let existing: i64 = sqlx::query(&self.sql("SELECT COUNT(*) FROM strategies"))
                .fetch_one(&self.pool)
                .await?
                .try_get(0)?;
            if !replace_all || existing == 0 {
                return Ok((0, self.version().await?));
            }
            if !allow_empty {
                return Err(StoreError::EmptyReplace(existing.max(0) as u64));
            }
        }
        let (mut tx, version) = self.begin_change().await?;
        // Before-images of what this import deletes or replaces.
        let images = if replace_all {
            images_in_tx(&mut tx, None).await?
        } else {
            let wanted: Vec<i64> = ids.keys().map(|&i| i as i64).collect();
            images_in_tx(&mut tx, Some(&wanted)).await?
        };
        if replace_all {
            sqlx::query(&self.sql("DELETE FROM strategies"))
                .execute(&mut *tx)
                .await?;
        } else {
            // Names must not collide with strategies the file does not replace.
            let existing = sqlx::query(&self.sql("SELECT id, name FROM strategies"))
                .fetch_all(&mut *tx)
                .await?;
            for row in &existing {
                let id: i64 = row.try_get(0)?;
                let name: String = row.try_get(1)?;
                if let Some(line) = names.get(&name) {
                    let rec = &records.iter().find(|(l, _)| l == line).expect("indexed").1;
                    if rec.id as i64 != id && !ids.contains_key(&(id as u32)) {
                        return Err(StoreError::Import {
                            line: *line,
                            cause: Invalid::new(
                                Field::Name,
                                "name",
                                format!("{name:?} already exists (id {id})"),
                            ),
                        });
                    }
                }
            }
            let replaced: Vec<i64> = ids.keys().map(|&i| i as i64).collect();
            for chunk in replaced.chunks(500) {
                let sql = format!(
                    "DELETE FROM strategies WHERE id IN ({})",
                    placeholders(chunk.len())
                );
                let sql = self.sql(&sql).into_owned();
                let mut q = sqlx::query(&sql);
                for id in chunk {
                    q = q.bind(*id);
                }
                q.execute(&mut *tx).await?;
            }
        }
        let now = unix_ms();
        for r in records.iter_mut() {
            r.1.created_ms = now;
            r.1.updated_ms = now;
            r.1.version = version;
        }
        let (with_id, without_id): (Vec<_>, Vec<_>) =
            records.iter().map(|(_, r)| r).partition(|r| r.id != 0);
        const ROWS: usize = 300;
        // Rows that keep their id bind it first; the others get a new one.
        for (keep_id, rows) in [(true, &with_id), (false, &without_id)] {
            let id_column = if keep_id { "id, " } else { "" };
            for chunk in rows.chunks(ROWS) {
                let sql = format!(
                    "INSERT INTO strategies ({id_column}{}) VALUES {}",
                    INSERT_COLUMNS,
                    value_rows(INSERT_COUNT + usize::from(keep_id), chunk.len())
                );
                let sql = self.sql(&sql).into_owned();
                let mut q = sqlx::query(&sql);
                for r in chunk {
                    q = bind_strategy(if keep_id { q.bind(r.id as i64) } else { q }, r);
                }
                q.execute(&mut *tx).await?;
            }
        }
        // Issue 31: the response columns of the rows that have them, by
        // their (unique) name: rows without an id got theirs just now.
        for (_, r) in &records {
            if r.count_if.is_none() && r.cost_from.is_none() && r.cost_after.is_none() {
                continue;
            }
            sqlx::query(&self.sql(
                "UPDATE strategies SET count_if = ?, cost_from = ?, cost_after = ? WHERE name = ?",
            ))
            .bind(r.count_if.clone())
            .bind(r.cost_from.clone())
            .bind(r.cost_after.clone())
            .bind(r.name.clone())
            .execute(&mut *tx)
            .await?;
        }
        // Issue 33: the calendar zone, likewise.
        for (_, r) in &records {
            super::calendar::write_tz(self, &mut tx, r, "name").await?;
            super::bans::write_ban_columns(self, &mut tx, r, true).await?;
        }
        let mut deleted = 0;
        let by_id: std::collections::HashMap<u32, &StrategyRecord> = records
            .iter()
            .filter(|(_, r)| r.id != 0)
            .map(|(_, r)| (r.id, r))
            .collect();
        let entries: Vec<super::audit::Entry> = images
            .into_iter()
            .map(|(id, before)| {
                let after = by_id.get(&id).map(|r| strategy_api_json(r));
                let action = if after.is_some() {
                    "strategy.import.replace"
                } else {
                    deleted += 1;
                    "strategy.import.delete"
                };
                (action, format!("strategy/{id}"), Some(before), after)
            })
            .collect();
        super::audit::audit_many(&mut tx, who, entries).await?;
        audit(
            &mut tx,
            who,
            "strategy.import",
            "strategies",
            None,
            Some(serde_json::json!({"count": records.len(), "replace": replace_all, "deleted": deleted})),
        )
        .await?;
        super::changelog::log_change(&mut tx, version, super::Change::All).await?;
        tx.commit().await?;
        Ok((records.len(), version))
    }
}

/// The strategies `ids` (all with `None`) as `(id, API JSON)`, by id; a
/// row that is not a valid strategy is shown by its raw columns.
async fn images_in_tx(
    tx: &mut Transaction<'static, Any>,
    ids: Option<&[i64]>,
) -> Result<Vec<(u32, serde_json::Value)>> {
    let mut out = Vec::new();
    let d = Dialect::of(tx);
    let rows = match ids {
        None => {
            sqlx::query(&d.sql(&format!(
                "SELECT {STRATEGY_COLUMNS} FROM strategies ORDER BY id"
            )))
            .fetch_all(&mut **tx)
            .await?
        }
        Some(ids) => {
            let mut rows = Vec::new();
            for chunk in ids.chunks(500) {
                let sql = d
                    .sql(&format!(
                        "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id IN ({})",
                        placeholders(chunk.len())
                    ))
                    .into_owned();
                let mut q = sqlx::query(&sql);
                for id in chunk {
                    q = q.bind(*id);
                }
                rows.extend(q.fetch_all(&mut **tx).await?);
            }
            rows
        }
    };
    for row in &rows {
        let id = row.try_get::<i64, _>("id")? as u32;
        out.push((id, image_of(id, row)));
    }
    Ok(out)
}

/// A strategy row's audit image: its API JSON, or, for a row that is not a
/// valid strategy, its id, the reason, version and creation time.
fn image_of(id: u32, row: &AnyRow) -> serde_json::Value {
    match decode_strategy(row) {
        Ok(r) => strategy_api_json(&r),
        Err(b) => serde_json::json!({
            "id": id,
            "invalid": b.reason.to_string(),
            "version": row.try_get::<i64, _>("version").unwrap_or(0),
            "created_at": row.try_get::<i64, _>("created_ms").unwrap_or(0),
        }),
    }
}

/// The strategy row `id` as API JSON (`None` if absent; a row that is not a
/// valid strategy is shown by its raw columns).
pub(super) async fn strategy_in_tx(
    tx: &mut Transaction<'static, Any>,
    id: u32,
) -> Result<Option<serde_json::Value>> {
    let row = sqlx::query(&Dialect::of(tx).sql(&format!(
        "SELECT {STRATEGY_COLUMNS} FROM strategies WHERE id = ?"
    )))
    .bind(id as i64)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.map(|row| image_of(id, &row)))
}

async fn ensure_name_free(
    tx: &mut Transaction<'static, Any>,
    name: &str,
    own_id: Option<u32>,
) -> Result<()> {
    let row = sqlx::query(&Dialect::of(tx).sql("SELECT id FROM strategies WHERE name = ?"))
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    if let Some(row) = row {
        let id: i64 = row.try_get(0)?;
        if Some(id) != own_id.map(|i| i as i64) {
            return Err(Invalid::new(
                Field::Name,
                "name",
                format!("{name:?} already exists (id {id})"),
            )
            .into());
        }
    }
    Ok(())
}

pub(super) const INSERT_COLUMNS: &str =
    "name, conditions, algorithm, rate, per, burst, action, status, \
     max_delay_ms, enabled, scope, warm_up_ms, cold_factor, priority, each_dims, ipv4_prefix, \
     ipv6_prefix, on_full, split, created_ms, updated_ms, version, max_keys";

/// Columns in [`INSERT_COLUMNS`].
const INSERT_COUNT: usize = 23;

pub(super) type AnyQuery<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>;

/// Binds the 23 columns of [`INSERT_COLUMNS`] in order.
pub(super) fn bind_strategy<'q>(q: AnyQuery<'q>, r: &StrategyRecord) -> AnyQuery<'q> {
    bind_content(q, r)
        .bind(r.created_ms as i64)
        .bind(r.updated_ms as i64)
        .bind(r.version as i64)
        .bind(r.max_keys.map(i64::from))
}

/// Binds the 19 columns `name` to `split` of [`INSERT_COLUMNS`] in order.
pub(super) fn bind_content<'q>(q: AnyQuery<'q>, r: &StrategyRecord) -> AnyQuery<'q> {
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
        .bind(r.warm_up_ms.map(|m| m as i64))
        .bind(r.cold_factor.map(|c| c as i64))
        .bind(i64::from(r.priority))
        .bind((!r.each.is_empty()).then(|| r.each.join(",")))
        .bind(r.ipv4_prefix.map(|p| p as i64))
        .bind(r.ipv6_prefix.map(|p| p as i64))
        .bind(r.on_full.map(|o| o.as_str()))
        .bind(r.split().as_str())
}

/// The response and cost columns (migration 131), written by their own
/// statement after the row's insert or update.
pub(super) const RESPONSE_UPDATE: &str =
    "UPDATE strategies SET count_if = ?, cost_from = ?, cost_after = ? WHERE id = ?";

/// Binds [`RESPONSE_UPDATE`]'s parameters (NULL: not set).
pub(super) fn bind_response<'q>(q: AnyQuery<'q>, r: &StrategyRecord) -> AnyQuery<'q> {
    q.bind(r.count_if.clone())
        .bind(r.cost_from.clone())
        .bind(r.cost_after.clone())
        .bind(r.id as i64)
}

pub(super) fn split_rows(rows: &[AnyRow]) -> (Vec<Valid<StrategyRecord>>, Vec<BadRow>) {
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

/// Reads and validates one strategy row (the store-read boundary). Rows
/// written by this binary are always valid; rows edited directly in the
/// database may not be.
pub(super) fn decode_strategy(row: &AnyRow) -> Result<Valid<StrategyRecord>, BadRow> {
    let id: i64 = row.try_get("id").unwrap_or(-1);
    let bad = |reason: Invalid| BadRow { id, reason };
    let unreadable = |col: &'static str, e: sqlx::Error| {
        bad(Invalid::new(column(col), col, format!("unreadable ({e})")))
    };
    let get_i = |col: &'static str| -> Result<i64, BadRow> {
        row.try_get::<i64, _>(col).map_err(|e| unreadable(col, e))
    };
    let get_oi = |col: &'static str| -> Result<Option<i64>, BadRow> {
        row.try_get::<Option<i64>, _>(col)
            .map_err(|e| unreadable(col, e))
    };
    let get_os = |col: &'static str| -> Result<Option<String>, BadRow> {
        row.try_get::<Option<String>, _>(col)
            .map_err(|e| unreadable(col, e))
    };
    let get_s = |col: &'static str| -> Result<String, BadRow> {
        row.try_get::<String, _>(col)
            .map_err(|e| unreadable(col, e))
    };
    let in_range = |col: &'static str, v: i64, max: u64| -> Result<u64, BadRow> {
        if v < 0 || v as u64 > max {
            Err(bad(Invalid::new(
                column(col),
                col,
                format!("{v} is out of range 0..={max}"),
            )))
        } else {
            Ok(v as u64)
        }
    };
    let on_full_of = |s: String| -> Result<rate_ctl::core::model::each::OnFull, BadRow> {
        s.parse()
            .map_err(|e: rate_ctl::core::model::each::EachError| bad(ModelError::from(e).into()))
    };
    // An optional (NULL-able) number column, at most `max`.
    let opt_in = |col: &'static str, max: u64| -> Result<Option<u64>, BadRow> {
        get_oi(col)?.map(|v| in_range(col, v, max)).transpose()
    };
    let id_u32 = u32::try_from(id).ok().filter(|i| *i > 0).ok_or_else(|| {
        bad(Invalid::new(
            Field::Id,
            "id",
            format!("{id} is not between 1 and {}", u32::MAX),
        ))
    })?;
    let pairs: Vec<(String, String)> =
        serde_json::from_str(&get_s("conditions")?).map_err(|e| {
            bad(Invalid::new(
                Field::Conditions,
                "conditions",
                format!("not a JSON list of [dimension, value] ({e})"),
            ))
        })?;
    let mut conditions = BTreeMap::new();
    for (i, (d, v)) in pairs.into_iter().enumerate() {
        if conditions.insert(d.clone(), v).is_some() {
            return Err(bad(Invalid::from(ModelError::DuplicateDimension {
                index: i,
                name: d,
            })));
        }
    }
    let rec = StrategyRecord {
        id: id_u32,
        name: get_s("name")?,
        conditions,
        algorithm: get_s("algorithm")?
            .parse()
            .map_err(|e: ModelError| bad(e.into()))?,
        rate: in_range("rate", get_i("rate")?, u64::MAX)?,
        per: get_s("per")?
            .parse()
            .map_err(|e: ModelError| bad(e.into()))?,
        burst: in_range("burst", get_i("burst")?, u32::MAX as u64)? as u32,
        action: get_s("action")?.parse().map_err(bad)?,
        status: opt_in("status", u16::MAX as u64)?.map(|v| v as u16),
        max_delay_ms: opt_in("max_delay_ms", u32::MAX as u64)?.map(|v| v as u32),
        enabled: match get_i("enabled")? {
            0 => false,
            1 => true,
            v => {
                return Err(bad(Invalid::new(
                    Field::Enabled,
                    "enabled",
                    format!("{v} is neither 0 nor 1"),
                )))
            }
        },
        scope: get_s("scope")?.parse().map_err(bad)?,
        warm_up_ms: opt_in("warm_up_ms", u32::MAX as u64)?.map(|v| v as u32),
        cold_factor: opt_in("cold_factor", u8::MAX as u64)?.map(|v| v as u8),
        priority: {
            let p = get_i("priority")?;
            i32::try_from(p).map_err(|_| {
                bad(Invalid::from(ModelError::BadPriority(if p < 0 {
                    i32::MIN
                } else {
                    i32::MAX
                })))
            })?
        },
        each: match get_os("each_dims")? {
            Some(s) if !s.is_empty() => s.split(',').map(str::to_string).collect(),
            _ => Vec::new(),
        },
        ipv4_prefix: opt_in("ipv4_prefix", u8::MAX as u64)?.map(|v| v as u8),
        ipv6_prefix: opt_in("ipv6_prefix", u8::MAX as u64)?.map(|v| v as u8),
        on_full: get_os("on_full")?.map(on_full_of).transpose()?,
        // NULL: a row from before migration 7, written with the static
        // split (the only one then): it keeps it.
        split: Some(
            match row
                .try_get::<Option<String>, _>("split")
                .map_err(|e| unreadable("split", e))?
            {
                Some(s) => s.parse().map_err(bad)?,
                None => Split::Static,
            },
        ),
        created_ms: get_i("created_ms")?.max(0) as u64,
        updated_ms: get_i("updated_ms")?.max(0) as u64,
        version: get_i("version")?.max(0) as u64,
        count_if: get_os("count_if")?.filter(|s| !s.is_empty()),
        cost_from: get_os("cost_from")?.filter(|s| !s.is_empty()),
        cost_after: get_os("cost_after")?.filter(|s| !s.is_empty()),
        // NULL: no cap given (or a row from before migration 128).
        max_keys: opt_in("max_keys", rate_ctl::core::model::each::MAX_MAX_KEYS as u64)?
            .map(|v| v as u32),
        // NULL: UTC (or a row from before migration 135).
        tz: get_os("tz")?.filter(|s| !s.is_empty()),
        // NULL: no penalty box (or a row from before migration 132).
        ban_after: opt_in("ban_after", u32::MAX as u64)?.map(|v| v as u32),
        ban_within: opt_in("ban_within", u32::MAX as u64)?.map(|v| v as u32),
        ban_for: opt_in("ban_for", u32::MAX as u64)?.map(|v| v as u32),
    };
    rec.into_valid().map_err(bad)
}

/// The record field a strategies column holds.
fn column(col: &'static str) -> Field {
    match col {
        "id" => Field::Id,
        "name" => Field::Name,
        "conditions" => Field::Conditions,
        "rate" => Field::Rate,
        "burst" => Field::Burst,
        "status" => Field::Status,
        "max_delay_ms" => Field::MaxDelayMs,
        "warm_up_ms" => Field::WarmUpMs,
        "cold_factor" => Field::ColdFactor,
        "each" => Field::Each,
        "ipv4_prefix" => Field::Ipv4Prefix,
        "ipv6_prefix" => Field::Ipv6Prefix,
        "on_full" => Field::OnFull,
        "enabled" => Field::Enabled,
        "priority" => Field::Priority,
        "count_if" => Field::CountIf,
        "cost_from" => Field::CostFrom,
        "cost_after" => Field::CostAfter,
        "tz" => Field::Tz,
        other => Field::Column(other),
    }
}
