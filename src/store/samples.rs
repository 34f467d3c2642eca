//! The counter samples the agents report (for `GET /api/v1/stats`).

use sqlx::Row;

use super::{CounterSample, Result, Store, StoredSample, SAMPLE_RETENTION_MS};

impl Store {
    /// Stores counter samples taken at `at_ms` and drops samples older than
    /// [`SAMPLE_RETENTION_MS`].
    pub async fn add_samples(&self, host_id: &str, at_ms: u64, c: &[CounterSample]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for chunk in c.chunks(200) {
            let sql = format!(
                "INSERT INTO counter_samples (host_id, strategy_id, at_ms, passed_count, limited_count, delayed_count) VALUES {}",
                vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for s in chunk {
                q = q
                    .bind(host_id.to_string())
                    .bind(s.id as i64)
                    .bind(at_ms as i64)
                    .bind(s.passed.min(i64::MAX as u64) as i64)
                    .bind(s.limited.min(i64::MAX as u64) as i64)
                    .bind(s.delayed.min(i64::MAX as u64) as i64);
            }
            q.execute(&mut *tx).await?;
        }
        sqlx::query("DELETE FROM counter_samples WHERE at_ms < ?")
            .bind(at_ms.saturating_sub(SAMPLE_RETENTION_MS) as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Counter samples of one strategy taken at or after `since_ms`, by host and time.
    pub async fn samples(&self, strategy: u32, since_ms: u64) -> Result<Vec<StoredSample>> {
        let rows = sqlx::query(
            "SELECT host_id, at_ms, passed_count, limited_count, delayed_count FROM counter_samples WHERE strategy_id = ? AND at_ms >= ? ORDER BY host_id, at_ms",
        )
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
