//! `/api/v1/stats?strategy=ID`: per-second rates from the agents' counter
//! samples, summed over hosts.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::routing::get;
use serde_json::{json, Value};

use super::auth::ReadToken;
use super::body::{ok, query_in, query_param};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};
use crate::store::StoredSample;
use rate_ctl::core::clock::unix_ms;

pub fn router() -> Routes {
    Routes::default().add("/api/v1/stats", &["GET"], get(stats))
}

/// Spreads each host's counter increase between two samples evenly over
/// the time between them (at most the last 2 s before the later sample:
/// agents report only counters that moved, so a long gap was idle) and
/// sums over hosts, per second.
pub fn stats_points(samples: &[StoredSample], from_ms: u64, to_ms: u64) -> Vec<Value> {
    let first = from_ms / 1000;
    let last = to_ms / 1000;
    let n = (last - first + 1) as usize;
    let mut passed = vec![0f64; n];
    let mut limited = vec![0f64; n];
    let mut delayed = vec![0f64; n];
    for w in samples.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.host_id != b.host_id || b.at_ms <= a.at_ms {
            continue;
        }
        // A counter that went down was reset (slot reassigned): skip.
        let (Some(dp), Some(dl), Some(dd)) = (
            b.passed.checked_sub(a.passed),
            b.limited.checked_sub(a.limited),
            b.delayed.checked_sub(a.delayed),
        ) else {
            continue;
        };
        let start = a.at_ms.max(b.at_ms.saturating_sub(2_000));
        let span = (b.at_ms - start) as f64;
        let mut t = start;
        while t < b.at_ms {
            let sec_end = (t / 1000 + 1) * 1000;
            let piece_end = sec_end.min(b.at_ms);
            let frac = (piece_end - t) as f64 / span;
            let sec = t / 1000;
            if sec >= first && sec <= last {
                passed[(sec - first) as usize] += dp as f64 * frac;
                limited[(sec - first) as usize] += dl as f64 * frac;
                delayed[(sec - first) as usize] += dd as f64 * frac;
            }
            t = piece_end;
        }
    }
    (0..n)
        .map(|i| {
            json!({"at": (first + i as u64) * 1000, "passed_per_s": passed[i],
                   "limited_per_s": limited[i], "delayed_per_s": delayed[i]})
        })
        .collect()
}

pub async fn stats(
    State(st): State<Shared>,
    _: ReadToken,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    const NO_ID: &str = "strategy: required, a strategy id";
    let id = query_param(&q, "strategy", |i: &u32| *i > 0, NO_ID)?
        .ok_or_else(|| ApiError::bad_request(Some("strategy"), NO_ID))?;
    let seconds = query_in(&q, "seconds", 1..=300, 120)?;
    let now = unix_ms();
    // The last complete second is the newest point.
    let to = now.saturating_sub(1000);
    let from = to.saturating_sub((seconds - 1) * 1000);
    let samples = st.store.samples(id, from.saturating_sub(5_000)).await?;
    ok(json!({"strategy": id, "points": stats_points(&samples, from, to)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(host: &str, at: u64, passed: u64, limited: u64) -> StoredSample {
        StoredSample {
            host_id: host.into(),
            at_ms: at,
            passed,
            limited,
            delayed: 0,
        }
    }

    #[test]
    fn stats_spread_and_sum_over_hosts() {
        // Host a: 100/s passed over 10..12 s; host b: 50/s limited over 10.5..11.5.
        let v = vec![
            s("a", 10_000, 0, 0),
            s("a", 11_000, 100, 0),
            s("a", 12_000, 200, 0),
            s("b", 10_500, 0, 0),
            s("b", 11_500, 0, 50),
        ];
        let p = stats_points(&v, 10_000, 11_999);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0]["passed_per_s"], 100.0);
        assert_eq!(p[0]["limited_per_s"], 25.0);
        assert_eq!(p[1]["passed_per_s"], 100.0);
        assert_eq!(p[1]["limited_per_s"], 25.0);
        // A long idle gap: the increase lands in the last 2 s, not smeared.
        let v = vec![s("a", 0, 0, 0), s("a", 60_000, 100, 0)];
        let p = stats_points(&v, 0, 59_999);
        assert_eq!(p[57]["passed_per_s"], 0.0);
        assert_eq!(p[58]["passed_per_s"], 50.0);
        assert_eq!(p[59]["passed_per_s"], 50.0);
        // A reset counter is skipped.
        let v = vec![s("a", 0, 500, 0), s("a", 1_000, 3, 0)];
        assert_eq!(stats_points(&v, 0, 999)[0]["passed_per_s"], 0.0);
    }
}
