//! The counter samples the agents report (for `GET /api/v1/stats`).

use sqlx::Row;

use super::schema::insert_rows;
use super::{CounterSample, Result, Store, StoredSample, SAMPLE_RETENTION_MS};

impl Store {
    /// Stores counter samples taken at `at_ms` and drops samples older than
    /// [`SAMPLE_RETENTION_MS`].
    pub async fn add_samples(&self, host_id: &str, at_ms: u64, c: &[CounterSample]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        insert_rows(
            &mut tx,
            "counter_samples (host_id, strategy_id, at_ms, passed_count, limited_count, delayed_count)",
            6,
            c,
            |q, s| {
                q.bind(host_id.to_string())
                    .bind(s.id as i64)
                    .bind(at_ms as i64)
                    .bind(s.passed.min(i64::MAX as u64) as i64)
                    .bind(s.limited.min(i64::MAX as u64) as i64)
                    .bind(s.delayed.min(i64::MAX as u64) as i64)
            },
        )
        .await?;
        sqlx::query(&self.sql("DELETE FROM counter_samples WHERE at_ms < ?"))
            .bind(at_ms.saturating_sub(SAMPLE_RETENTION_MS) as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The newest counter sample of every (strategy, host) still kept (see
    /// [`SAMPLE_RETENTION_MS`]): each host's cumulative slot counters, for
    /// `GET /metrics`. Sorted by strategy, then host.
    pub async fn latest_samples(&self) -> Result<Vec<(u32, StoredSample)>> {
        let rows = sqlx::query(&self.sql(
            "SELECT s.strategy_id, s.host_id, s.at_ms, s.passed_count, s.limited_count, s.delayed_count \
             FROM counter_samples s JOIN (SELECT strategy_id, host_id, MAX(at_ms) AS at_ms \
             FROM counter_samples GROUP BY strategy_id, host_id) m \
             ON s.strategy_id = m.strategy_id AND s.host_id = m.host_id AND s.at_ms = m.at_ms \
             ORDER BY s.strategy_id, s.host_id",
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<(u32, StoredSample)> = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = r.try_get::<i64, _>(0)?.clamp(0, u32::MAX as i64) as u32;
            let s = StoredSample {
                host_id: r.try_get(1)?,
                at_ms: r.try_get::<i64, _>(2)?.max(0) as u64,
                passed: r.try_get::<i64, _>(3)?.max(0) as u64,
                limited: r.try_get::<i64, _>(4)?.max(0) as u64,
                delayed: r.try_get::<i64, _>(5)?.max(0) as u64,
            };
            // Two samples of one host at the same millisecond: keep the larger
            // counters (they only grow between resets).
            match out.last_mut() {
                Some((lid, l)) if *lid == id && l.host_id == s.host_id => {
                    l.passed = l.passed.max(s.passed);
                    l.limited = l.limited.max(s.limited);
                    l.delayed = l.delayed.max(s.delayed);
                }
                _ => out.push((id, s)),
            }
        }
        Ok(out)
    }

    /// Counter samples of one strategy taken at or after `since_ms`, by host and time.
    pub async fn samples(&self, strategy: u32, since_ms: u64) -> Result<Vec<StoredSample>> {
        let rows = sqlx::query(&self.sql(
            "SELECT host_id, at_ms, passed_count, limited_count, delayed_count FROM counter_samples WHERE strategy_id = ? AND at_ms >= ? ORDER BY host_id, at_ms",
        ))
        .bind(strategy as i64)
        .bind(since_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredSample {
                    host_id: r.try_get(0)?,
                    at_ms: r.try_get::<i64, _>(1)?.max(0) as u64,
                    passed: r.try_get::<i64, _>(2)?.max(0) as u64,
                    limited: r.try_get::<i64, _>(3)?.max(0) as u64,
                    delayed: r.try_get::<i64, _>(4)?.max(0) as u64,
                })
            })
            .collect()
    }
}
