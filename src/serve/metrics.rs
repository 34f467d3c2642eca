//! `GET /metrics`: the fleet in the Prometheus text format (version 0.0.4),
//! for the read or the admin token (Prometheus: `authorization:
//! credentials_file:`), like every other read.
//!
//! - `rate_ctl_fleet_{passed,limited,delayed}_total{strategy,name,host}`:
//!   each host's cumulative slot counters as its agent last reported them
//!   (kept [`crate::store::SAMPLE_RETENTION_MS`]); fleet-wide is `sum by (strategy, name)`
//!   of their `rate()`. Summing here instead would turn one host's counter
//!   reset or silence into a fleet-wide reset.
//! - `rate_ctl_host_{weight,fresh,applied_version,lag_versions,report_age_seconds}{host}`.
//! - `rate_ctl_host_publish_error{host}`: 1 while the host's agent reports
//!   that its last publish was refused (the message is in the hosts API).
//! - `rate_ctl_store_config_version`.
//!
//! The module's own series (`rate_ctl_passed_total{strategy,name}`, …) come from
//! each nginx's `rate_ctl_stats` location; docs/grafana-dashboard.json uses both.

use std::collections::HashMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::auth::ReadToken;
use super::error::ApiError;
use super::Shared;
use crate::store::record::HostRecord;
use crate::store::StoredSample;
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::stats::label;

/// The content type Prometheus expects for the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn metrics(State(st): State<Shared>, _: ReadToken) -> Result<Response, ApiError> {
    let version = st.store.version().await?;
    let (strategies, _) = st.store.list_strategies().await?;
    let names: HashMap<u32, String> = strategies.into_iter().map(|s| (s.id, s.name)).collect();
    let samples = st.store.latest_samples().await?;
    let hosts = st.store.hosts().await?;
    let mut body = render(
        version,
        &names,
        &samples,
        &hosts,
        unix_ms(),
        st.freshness_ms,
    );
    render_leases(&mut body, &names, &st.store.leases(None).await?, unix_ms());
    render_bans(&mut body, &names, &st.store.ban_metrics(unix_ms()).await?);
    render_instance(&mut body, &st);
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response())
}

/// The fleet leases (`split: demand` strategies): leased local rate and
/// seconds since the leader last granted or renewed it, per strategy and
/// host.
pub fn render_leases(
    o: &mut String,
    names: &HashMap<u32, String>,
    leases: &[crate::store::LeaseRow],
    now: u64,
) {
    type Get = fn(&crate::store::LeaseRow, u64) -> String;
    let series: [(&str, &str, Get); 2] = [
        (
            "rate_ctl_lease_rate",
            "Leased local rate (or window count) of a split: demand strategy, per host.",
            |l, _| l.value.to_string(),
        ),
        (
            "rate_ctl_lease_age_seconds",
            "Seconds since the fleet leader last granted or renewed the host's lease.",
            |l, now| format!("{:.3}", now.saturating_sub(l.granted_ms) as f64 / 1000.0),
        ),
    ];
    for (name, help, get) in series {
        head(o, name, "gauge", help);
        for l in leases {
            let Some(n) = names.get(&l.strategy_id) else {
                continue;
            };
            let _ = writeln!(
                o,
                "{name}{{strategy=\"{}\",name=\"{}\",host=\"{}\"}} {}",
                l.strategy_id,
                label(n),
                label(&l.host_id),
                get(l, now)
            );
        }
    }
}

/// This serve instance's own counters (not the fleet's): snapshot builds
/// and connections.
fn render_instance(o: &mut String, st: &Shared) {
    use std::sync::atomic::Ordering::Relaxed;
    let series: [(&str, &str, &str, u64); 3] = [
        (
            "rate_ctl_serve_snapshot_builds_total",
            "counter",
            "Snapshots this instance read from the store and serialised (one per config version, shared by the long-polls).",
            st.snapshots.builds.load(Relaxed),
        ),
        (
            "rate_ctl_serve_connections",
            "gauge",
            "Connections this instance serves now.",
            st.conns.open.load(Relaxed),
        ),
        (
            "rate_ctl_serve_connections_refused_total",
            "counter",
            "Connections this instance answered 503 because its --max-connections cap was reached.",
            st.conns.refused.load(Relaxed),
        ),
    ];
    for (name, kind, help, v) in series {
        head(o, name, kind, help);
        let _ = writeln!(o, "{name} {v}");
    }
}

/// The penalty box (issue 32), per strategy: bans the agents raised (or
/// extended) and ban entries in force now.
pub fn render_bans(o: &mut String, names: &HashMap<u32, String>, bans: &[(u32, u64, u64)]) {
    if bans.is_empty() {
        return;
    }
    for (i, (name, kind, help)) in [
        ("rate_ctl_bans_raised_total", "counter", "Bans the penalty box of the strategy raised (or extended), as the agents wrote them to the store."),
        ("rate_ctl_bans_active", "gauge", "Blacklist entries of the strategy's penalty box in force now."),
    ]
    .into_iter()
    .enumerate()
    {
        head(o, name, kind, help);
        for &(id, raised, active) in bans {
            let n = names.get(&id).map_or(String::new(), |n| label(n));
            let v = if i == 0 { raised } else { active };
            let _ = writeln!(o, "{name}{{strategy=\"{id}\",name=\"{n}\"}} {v}");
        }
    }
}

fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The exposition. Samples of strategies no longer in the store are left
/// out; a host without an applied version has no version or lag series.
pub fn render(
    version: u64,
    names: &HashMap<u32, String>,
    samples: &[(u32, StoredSample)],
    hosts: &[HostRecord],
    now: u64,
    freshness_ms: u64,
) -> String {
    let mut o = String::with_capacity(1024 + samples.len() * 240 + hosts.len() * 400);
    head(
        &mut o,
        "rate_ctl_store_config_version",
        "gauge",
        "Config version of the store (every change bumps it).",
    );
    let _ = writeln!(o, "rate_ctl_store_config_version {version}");

    type Get = fn(&StoredSample) -> u64;
    let counters: [(&str, &str, Get); 3] = [
        (
            "rate_ctl_fleet_passed_total",
            "Requests admitted, per strategy and host (agent reports; sum by strategy for the fleet).",
            |s| s.passed,
        ),
        (
            "rate_ctl_fleet_limited_total",
            "Requests rejected (or that a dry run would reject), per strategy and host.",
            |s| s.limited,
        ),
        (
            "rate_ctl_fleet_delayed_total",
            "Requests admitted after a delay, per strategy and host.",
            |s| s.delayed,
        ),
    ];
    for (name, help, get) in counters {
        head(&mut o, name, "counter", help);
        for (id, s) in samples {
            let Some(n) = names.get(id) else { continue };
            let _ = writeln!(
                o,
                "{name}{{strategy=\"{id}\",name=\"{}\",host=\"{}\"}} {}",
                label(n),
                label(&s.host_id),
                get(s)
            );
        }
    }

    // Per-host gauges: name, help, the value (none: no line for the host).
    type Gauge<'h> = (
        &'static str,
        &'static str,
        &'h dyn Fn(&HostRecord) -> Option<String>,
    );
    let gauges: [Gauge; 6] = [
        (
            "rate_ctl_host_weight",
            "Weight of the host for cluster-scope rates.",
            &|h| Some(h.weight.to_string()),
        ),
        (
            "rate_ctl_host_fresh",
            "1 while the host's heartbeat is fresh (it counts for cluster-scope rates).",
            &|h| {
                let fresh = h
                    .last_heartbeat_ms
                    .is_some_and(|hb| hb.saturating_add(freshness_ms) >= now);
                Some(u8::from(fresh).to_string())
            },
        ),
        (
            "rate_ctl_host_applied_version",
            "Config version the host's agent last published into its table.",
            &|h| h.applied_version.map(|a| a.to_string()),
        ),
        (
            "rate_ctl_host_lag_versions",
            "Store config version minus the host's applied version.",
            &|h| {
                h.applied_version
                    .map(|a| version.saturating_sub(a).to_string())
            },
        ),
        (
            "rate_ctl_host_report_age_seconds",
            "Seconds since the host's agent last reported (heartbeat).",
            &|h| {
                h.last_heartbeat_ms
                    .map(|hb| format!("{:.3}", now.saturating_sub(hb) as f64 / 1000.0))
            },
        ),
        (
            "rate_ctl_host_publish_error",
            "1 while the host's agent reports its last publish refused (see GET /api/v1/hosts).",
            &|h| Some(u8::from(h.publish_error.is_some()).to_string()),
        ),
    ];
    for (name, help, value) in gauges {
        head(&mut o, name, "gauge", help);
        for h in hosts {
            if let Some(v) = value(h) {
                let _ = writeln!(o, "{name}{{host=\"{}\"}} {v}", label(&h.host_id));
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(host: &str, passed: u64, limited: u64) -> StoredSample {
        StoredSample {
            host_id: host.into(),
            at_ms: 0,
            passed,
            limited,
            delayed: 0,
        }
    }

    #[test]
    fn renders_counters_per_host_and_host_state() {
        let names = HashMap::from([(1, "pay \"eu\"\\x".to_string())]);
        let samples = vec![
            (1, sample("web-1", 10, 2)),
            (1, sample("web-2", 5, 0)),
            (9, sample("web-1", 7, 7)), // strategy 9 was deleted
        ];
        let hosts = vec![
            HostRecord {
                host_id: "web-1".into(),
                weight: 2,
                last_heartbeat_ms: Some(99_500),
                applied_version: Some(7),
                applied_ms: Some(99_000),
                publish_error: None,
                publish_error_ms: None,
            },
            HostRecord {
                host_id: "web-2".into(),
                weight: 1,
                last_heartbeat_ms: Some(50_000),
                applied_version: None,
                applied_ms: None,
                publish_error: Some(
                    "blacklist: 5 distinct entries, the table capacity is 4".into(),
                ),
                publish_error_ms: Some(99_000),
            },
        ];
        let t = render(9, &names, &samples, &hosts, 100_000, 10_000);
        let has = |line: &str| t.lines().any(|l| l == line);
        assert!(has("rate_ctl_store_config_version 9"), "{t}");
        assert!(has(
            r#"rate_ctl_fleet_passed_total{strategy="1",name="pay \"eu\"\\x",host="web-1"} 10"#
        ));
        assert!(has(
            r#"rate_ctl_fleet_limited_total{strategy="1",name="pay \"eu\"\\x",host="web-2"} 0"#
        ));
        assert!(!t.contains("strategy=\"9\""));
        assert!(has(r#"rate_ctl_host_weight{host="web-1"} 2"#));
        assert!(has(r#"rate_ctl_host_fresh{host="web-1"} 1"#));
        assert!(has(r#"rate_ctl_host_fresh{host="web-2"} 0"#));
        assert!(has(r#"rate_ctl_host_applied_version{host="web-1"} 7"#));
        assert!(has(r#"rate_ctl_host_lag_versions{host="web-1"} 2"#));
        assert!(has(r#"rate_ctl_host_publish_error{host="web-1"} 0"#), "{t}");
        assert!(has(r#"rate_ctl_host_publish_error{host="web-2"} 1"#), "{t}");
        assert!(!t.contains(r#"rate_ctl_host_lag_versions{host="web-2"}"#));
        assert!(has(
            r#"rate_ctl_host_report_age_seconds{host="web-1"} 0.500"#
        ));
        assert!(has(
            r#"rate_ctl_host_report_age_seconds{host="web-2"} 50.000"#
        ));
        // Every series has its TYPE line before it.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            assert!(t.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
