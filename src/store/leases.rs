//! Fleet leases (migration 7): the one leader row and the leases the
//! leader publishes per (strategy, host), with what each host acknowledged
//! applying. The allocation itself is src/fleet/lease.rs; the loop that
//! drives it is src/fleet/leader.rs.
//!
//! Leadership is a row with a holder and an expiry: a candidate takes it
//! when it is free or expired, the holder renews it; every write of leases
//! renews it in the same transaction and is refused (nothing written) when
//! the caller no longer holds it, so two leaders never interleave writes.

use sqlx::Row;

use super::{Result, Store};

/// One lease row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub strategy_id: u32,
    pub host_id: String,
    /// Rate per second, or count for the window starting at
    /// `window_start_ms`.
    pub value: u64,
    pub epoch: u64,
    pub expires_ms: u64,
    pub granted_ms: u64,
    /// Smoothed demand per second × 1000.
    pub demand_milli: u64,
    pub window_start_ms: u64,
    pub window_admitted: u64,
    pub applied_epoch: Option<u64>,
    pub applied_value: Option<u64>,
    pub applied_ms: Option<u64>,
}

/// The leader row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub holder: String,
    pub term: u64,
    pub expires_ms: u64,
}

const LEASE_COLUMNS: &str = "strategy_id, host_id, lease_value, epoch, expires_ms, granted_ms, \
     demand_milli, window_start_ms, window_admitted, applied_epoch, applied_value, applied_ms";

fn u(v: i64) -> u64 {
    v.max(0) as u64
}

fn i(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl Store {
    /// Takes or renews the leadership for `ttl_ms`; `Ok(true)` when `me`
    /// holds it afterwards.
    pub async fn try_lead(&self, me: &str, now: u64, ttl_ms: u64) -> Result<bool> {
        let renewed = sqlx::query(
            &self.sql("UPDATE fleet_leader SET expires_ms = ? WHERE id = 1 AND holder = ?"),
        )
        .bind(i(now + ttl_ms))
        .bind(me)
        .execute(&self.pool)
        .await?;
        if renewed.rows_affected() == 1 {
            return Ok(true);
        }
        let taken = sqlx::query(&self.sql(
            "UPDATE fleet_leader SET holder = ?, term = term + 1, expires_ms = ? \
             WHERE id = 1 AND expires_ms < ?",
        ))
        .bind(me)
        .bind(i(now + ttl_ms))
        .bind(i(now))
        .execute(&self.pool)
        .await?;
        Ok(taken.rows_affected() == 1)
    }

    /// Gives the leadership up (a clean stop), so another candidate takes it
    /// at once.
    pub async fn resign(&self, me: &str) -> Result<()> {
        sqlx::query(
            &self.sql("UPDATE fleet_leader SET expires_ms = 0 WHERE id = 1 AND holder = ?"),
        )
        .bind(me)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The leader row (`None` before migration 7 ran).
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let row = sqlx::query(
            &self.sql("SELECT holder, term, expires_ms FROM fleet_leader WHERE id = 1"),
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(Leader {
                holder: r.try_get(0)?,
                term: u(r.try_get(1)?),
                expires_ms: u(r.try_get(2)?),
            })
        })
        .transpose()
    }

    /// Every lease row, or one host's, by strategy then host.
    pub async fn leases(&self, host: Option<&str>) -> Result<Vec<LeaseRow>> {
        let sql = match host {
            Some(_) => format!(
                "SELECT {LEASE_COLUMNS} FROM leases WHERE host_id = ? ORDER BY strategy_id, host_id"
            ),
            None => format!("SELECT {LEASE_COLUMNS} FROM leases ORDER BY strategy_id, host_id"),
        };
        let sql = self.sql(&sql).into_owned();
        let mut q = sqlx::query(&sql);
        if let Some(h) = host {
            q = q.bind(h.to_string());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(LeaseRow {
                    strategy_id: u(r.try_get(0)?).min(u32::MAX as u64) as u32,
                    host_id: r.try_get(1)?,
                    value: u(r.try_get(2)?),
                    epoch: u(r.try_get(3)?),
                    expires_ms: u(r.try_get(4)?),
                    granted_ms: u(r.try_get(5)?),
                    demand_milli: u(r.try_get(6)?),
                    window_start_ms: u(r.try_get(7)?),
                    window_admitted: u(r.try_get(8)?),
                    applied_epoch: r.try_get::<Option<i64>, _>(9)?.map(u),
                    applied_value: r.try_get::<Option<i64>, _>(10)?.map(u),
                    applied_ms: r.try_get::<Option<i64>, _>(11)?.map(u),
                })
            })
            .collect()
    }

    /// Publishes leases as leader `me` (renewing its leadership for
    /// `ttl_ms`) and drops rows of strategies not in `strategies` or
    /// expired more than a minute ago. `Ok(false)`, nothing written, when
    /// `me` is not the leader any more.
    pub async fn put_leases(
        &self,
        me: &str,
        now: u64,
        ttl_ms: u64,
        rows: &[LeaseRow],
        strategies: &[u32],
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let still = sqlx::query(&self.sql(
            "UPDATE fleet_leader SET expires_ms = ? WHERE id = 1 AND holder = ? AND expires_ms >= ?",
        ))
        .bind(i(now + ttl_ms))
        .bind(me)
        .bind(i(now))
        .execute(&mut *tx)
        .await?;
        if still.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let update = self.sql(
            "UPDATE leases SET lease_value = ?, epoch = ?, expires_ms = ?, granted_ms = ?, \
             demand_milli = ?, window_start_ms = ?, window_admitted = ? \
             WHERE strategy_id = ? AND host_id = ?",
        );
        let insert = self.sql(
            "INSERT INTO leases (lease_value, epoch, expires_ms, granted_ms, demand_milli, \
             window_start_ms, window_admitted, strategy_id, host_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        );
        for r in rows {
            for sql in [&update, &insert] {
                let done = sqlx::query(sql)
                    .bind(i(r.value))
                    .bind(i(r.epoch))
                    .bind(i(r.expires_ms))
                    .bind(i(r.granted_ms))
                    .bind(i(r.demand_milli))
                    .bind(i(r.window_start_ms))
                    .bind(i(r.window_admitted))
                    .bind(r.strategy_id as i64)
                    .bind(r.host_id.clone())
                    .execute(&mut *tx)
                    .await?;
                if done.rows_affected() > 0 {
                    break;
                }
            }
        }
        let keep = if strategies.is_empty() {
            "0".to_string()
        } else {
            strategies
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        sqlx::query(&self.sql(&format!(
            "DELETE FROM leases WHERE strategy_id NOT IN ({keep}) OR expires_ms < ?"
        )))
        .bind(i(now.saturating_sub(60_000)))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records what `host` applied: (strategy, epoch, value) per lease.
    /// A lease the leader has not written (yet) is left alone.
    pub async fn ack_leases(&self, host: &str, now: u64, acks: &[(u32, u64, u64)]) -> Result<()> {
        if acks.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let sql = self.sql(
            "UPDATE leases SET applied_epoch = ?, applied_value = ?, applied_ms = ? \
             WHERE strategy_id = ? AND host_id = ?",
        );
        for &(strategy, epoch, value) in acks {
            sqlx::query(&sql)
                .bind(i(epoch))
                .bind(i(value))
                .bind(i(now))
                .bind(strategy as i64)
                .bind(host)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
