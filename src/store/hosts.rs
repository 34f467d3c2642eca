//! The hosts table: weights, heartbeats, applied versions, and the
//! agents' reports through `rate-ctl serve`.

use sqlx::Row;

use super::audit::audit;
use super::record::HostRecord;
use super::{CounterSample, Field, Invalid, Result, Store};
use rate_ctl::core::clock::unix_ms;

/// The longest publish error kept (the column is VARCHAR(1000)).
pub const MAX_PUBLISH_ERROR: usize = 1000;

impl Store {
    pub async fn hosts(&self) -> Result<Vec<HostRecord>> {
        let rows = sqlx::query(&self.sql(
            "SELECT host_id, weight, last_heartbeat_ms, applied_version, applied_ms, \
             publish_error, publish_error_ms FROM hosts ORDER BY host_id",
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(HostRecord {
                    host_id: r.try_get(0)?,
                    weight: r.try_get::<i64, _>(1)?.clamp(0, u32::MAX as i64) as u32,
                    last_heartbeat_ms: r.try_get::<Option<i64>, _>(2)?.map(|v| v as u64),
                    applied_version: r.try_get::<Option<i64>, _>(3)?.map(|v| v as u64),
                    applied_ms: r.try_get::<Option<i64>, _>(4)?.map(|v| v as u64),
                    publish_error: r.try_get(5)?,
                    publish_error_ms: r.try_get::<Option<i64>, _>(6)?.map(|v| v as u64),
                })
            })
            .collect()
    }

    /// Records the agent's last publish error and its time, or clears it
    /// (`None`: its last publish succeeded). The message is cut to 1,000
    /// bytes (at a character boundary). An unknown host is left alone (its
    /// heartbeat registers it).
    pub async fn set_publish_error(&self, host_id: &str, error: Option<(&str, u64)>) -> Result<()> {
        let (message, at) = match error {
            Some((m, at)) => {
                let mut end = m.len().min(MAX_PUBLISH_ERROR);
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                (Some(&m[..end]), Some(at as i64))
            }
            None => (None, None),
        };
        sqlx::query(
            &self.sql("UPDATE hosts SET publish_error = ?, publish_error_ms = ? WHERE host_id = ?"),
        )
        .bind(message)
        .bind(at)
        .bind(host_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Sets a host's weight (registering it if unknown). A weight change
    /// re-splits cluster rates, so it bumps the config version.
    pub async fn set_weight(&self, host_id: &str, weight: u32, who: &str) -> Result<u64> {
        validate_host(host_id, weight)?;
        let (mut tx, version) = self.begin_change().await?;
        let before = sqlx::query(&self.sql("SELECT weight FROM hosts WHERE host_id = ?"))
            .bind(host_id)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?;
        let res = sqlx::query(&self.sql("UPDATE hosts SET weight = ? WHERE host_id = ?"))
            .bind(weight as i64)
            .bind(host_id)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0 {
            sqlx::query(
                &self.sql("INSERT INTO hosts (host_id, weight, registered_ms) VALUES (?, ?, ?)"),
            )
            .bind(host_id)
            .bind(weight as i64)
            .bind(unix_ms() as i64)
            .execute(&mut *tx)
            .await?;
        }
        audit(
            &mut tx,
            who,
            "host.set_weight",
            &format!("host/{host_id}"),
            before.map(|w| serde_json::json!({"host_id": host_id, "weight": w})),
            Some(serde_json::json!({"host_id": host_id, "weight": weight})),
        )
        .await?;
        super::changelog::log_change(&mut tx, version, super::Change::Hosts).await?;
        tx.commit().await?;
        Ok(version)
    }

    /// Records an agent's heartbeat (and, if given, the version it has
    /// applied); registers the host with `weight_if_new` if unknown. Does
    /// not bump the config version.
    pub async fn heartbeat(
        &self,
        host_id: &str,
        weight_if_new: u32,
        now: u64,
        applied: Option<(u64, u64)>,
    ) -> Result<()> {
        // Outlives the query (PostgreSQL's form is a new string).
        let sql = self.sql(match applied {
            Some(_) => {
                "UPDATE hosts SET last_heartbeat_ms = ?, applied_version = ?, applied_ms = ? \
                 WHERE host_id = ?"
            }
            None => "UPDATE hosts SET last_heartbeat_ms = ? WHERE host_id = ?",
        });
        let res = match applied {
            Some((v, at)) => sqlx::query(&sql)
                .bind(now as i64)
                .bind(v as i64)
                .bind(at as i64)
                .bind(host_id),
            None => sqlx::query(&sql).bind(now as i64).bind(host_id),
        }
        .execute(&self.pool)
        .await?;
        if res.rows_affected() == 0 {
            validate_host(host_id, weight_if_new)?;
            let (v, at) = match applied {
                Some((v, at)) => (Some(v as i64), Some(at as i64)),
                None => (None, None),
            };
            let r = sqlx::query(&self.sql(
                "INSERT INTO hosts (host_id, weight, last_heartbeat_ms, applied_version, \
                 applied_ms, registered_ms) VALUES (?, ?, ?, ?, ?, ?)",
            ))
            .bind(host_id)
            .bind(weight_if_new as i64)
            .bind(now as i64)
            .bind(v)
            .bind(at)
            .bind(now as i64)
            .execute(&self.pool)
            .await;
            match r {
                Ok(_) => {}
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// An agent's report over HTTP: registers the host (with `weight`, or 1),
    /// sets its weight if `weight` is given and differs (a change: version
    /// bump, audited), records heartbeat and applied version (the applied
    /// time moves only when the version does) and stores counter samples.
    pub async fn report(
        &self,
        host_id: &str,
        weight: Option<u32>,
        applied_version: Option<u64>,
        counters: &[CounterSample],
        who: &str,
    ) -> Result<()> {
        let now = unix_ms();
        validate_host(host_id, weight.unwrap_or(1))?;
        let known = sqlx::query(&self.sql("SELECT weight FROM hosts WHERE host_id = ?"))
            .bind(host_id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?;
        match (known, weight) {
            (Some(w), Some(new)) if w != new as i64 => {
                self.set_weight(host_id, new, who).await?;
            }
            _ => {}
        }
        match applied_version {
            Some(v) if known.is_some() => {
                // applied_ms first: MySQL evaluates SET left to right.
                sqlx::query(&self.sql(
                    "UPDATE hosts SET applied_ms = CASE WHEN applied_version = ? THEN applied_ms ELSE ? END, applied_version = ?, last_heartbeat_ms = ? WHERE host_id = ?",
                ))
                .bind(v as i64)
                .bind(now as i64)
                .bind(v as i64)
                .bind(now as i64)
                .bind(host_id)
                .execute(&self.pool)
                .await?;
            }
            _ => {
                self.heartbeat(
                    host_id,
                    weight.unwrap_or(1),
                    now,
                    applied_version.map(|v| (v, now)),
                )
                .await?
            }
        }
        self.add_samples(host_id, now, counters).await
    }
}

pub fn validate_host(host_id: &str, weight: u32) -> Result<()> {
    if host_id.is_empty() || host_id.len() > 255 || host_id.chars().any(char::is_control) {
        return Err(Invalid::new(
            Field::HostId,
            "host-id",
            "must be 1 to 255 bytes without control characters",
        )
        .into());
    }
    if weight == 0 || weight > 1_000_000 {
        return Err(Invalid::new(
            Field::Weight,
            "weight",
            format!("must be between 1 and 1000000, got {weight}"),
        )
        .into());
    }
    Ok(())
}
