//! The numbers behind the module's `rate_ctl_stats;` endpoint — the table
//! state and per-strategy counters of a worker's reader — and their JSON
//! and Prometheus renderings. nginx-free, so `cargo test` runs its tests;
//! the handler is in `src/module/stats.rs`.

use std::fmt::Write as _;

use super::reader::Reader;
use super::slot::Slot;

/// One strategy's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyStats {
    pub id: u32,
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
}

/// What the endpoint reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub enforcing: bool,
    pub sequence: u64,
    pub active_segment: u64,
    pub config_version: u64,
    pub heartbeat_unix_ms: u64,
    pub strategies: Vec<StrategyStats>,
    /// Dimensions this nginx does not define, with the strategies using
    /// them (which never match here).
    pub undefined_dimensions: Vec<(String, Vec<u32>)>,
}

/// Reads the reader's mapping and the current table's slots.
pub fn snapshot(reader: &Reader) -> Stats {
    let Some(map) = reader.mapping() else {
        return Stats::default();
    };
    let sequence = map.seq();
    let mut s = Stats {
        enforcing: reader.table().is_some(),
        sequence,
        active_segment: sequence & 1,
        config_version: 0,
        heartbeat_unix_ms: map.heartbeat_unix_ms(),
        strategies: Vec::new(),
        undefined_dimensions: Vec::new(),
    };
    if let Some(t) = reader.table() {
        s.config_version = t.config_version();
        let slots = map.slots();
        s.strategies = t
            .strategies()
            .iter()
            .filter_map(|c| {
                let k = Slot::counters_at(&slots, c.slot, c.generation)?;
                Some(StrategyStats {
                    id: c.strategy.id,
                    passed: k.passed,
                    limited: k.limited,
                    delayed: k.delayed,
                })
            })
            .collect();
    }
    s
}

/// Renders the JSON document.
pub fn render_json(s: &Stats, now_unix_ms: u64) -> String {
    let mut o = String::with_capacity(128 + s.strategies.len() * 64);
    let _ = write!(
        o,
        "{{\"enforcing\":{},\"sequence\":{},\"active_segment\":{},\"config_version\":{},\"heartbeat_age_ms\":",
        s.enforcing, s.sequence, s.active_segment, s.config_version
    );
    match heartbeat_age_ms(s, now_unix_ms) {
        Some(age) => {
            let _ = write!(o, "{age}");
        }
        None => o.push_str("null"),
    }
    o.push_str(",\"strategies\":[");
    for (i, st) in s.strategies.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"id\":{},\"passed\":{},\"limited\":{},\"delayed\":{}}}",
            st.id, st.passed, st.limited, st.delayed
        );
    }
    o.push_str("],\"undefined_dimensions\":{");
    for (i, (name, ids)) in s.undefined_dimensions.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        // Dimension names are [a-z][a-z0-9_]*: nothing to escape.
        let _ = write!(o, "\"{name}\":{ids:?}");
    }
    o.push_str("}}\n");
    o
}

/// Renders the Prometheus text exposition format.
pub fn render_prometheus(s: &Stats, now_unix_ms: u64) -> String {
    let mut o = String::with_capacity(512 + s.strategies.len() * 160);
    let gauge = |o: &mut String, name: &str, help: &str, v: &dyn std::fmt::Display| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    };
    gauge(
        &mut o,
        "rate_ctl_enforcing",
        "1 if a table is enforced, 0 if failing open.",
        &u8::from(s.enforcing),
    );
    gauge(
        &mut o,
        "rate_ctl_config_sequence",
        "Publish sequence of the shared-memory table.",
        &s.sequence,
    );
    gauge(
        &mut o,
        "rate_ctl_active_segment",
        "Config segment in use (0 = A, 1 = B).",
        &s.active_segment,
    );
    gauge(
        &mut o,
        "rate_ctl_config_version",
        "Store config version of the enforced table.",
        &s.config_version,
    );
    if let Some(age) = heartbeat_age_ms(s, now_unix_ms) {
        gauge(
            &mut o,
            "rate_ctl_agent_heartbeat_age_seconds",
            "Seconds since the agent's last heartbeat.",
            &format_args!("{:.3}", age as f64 / 1000.0),
        );
    }
    for (name, help, get) in [
        (
            "rate_ctl_passed_total",
            "Requests admitted, per strategy.",
            (|x| x.passed) as fn(&StrategyStats) -> u64,
        ),
        (
            "rate_ctl_limited_total",
            "Requests rejected (or that a dry run would reject), per strategy.",
            |x| x.limited,
        ),
        (
            "rate_ctl_delayed_total",
            "Requests admitted after a delay, per strategy.",
            |x| x.delayed,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for st in &s.strategies {
            let _ = writeln!(o, "{name}{{strategy=\"{}\"}} {}", st.id, get(st));
        }
    }
    o
}

fn heartbeat_age_ms(s: &Stats, now_unix_ms: u64) -> Option<u64> {
    (s.heartbeat_unix_ms != 0).then(|| now_unix_ms.saturating_sub(s.heartbeat_unix_ms))
}

/// Whether the query string asks for `format=prometheus`.
pub fn wants_prometheus(args: &[u8]) -> bool {
    args.split(|&b| b == b'&')
        .any(|kv| kv == b"format=prometheus")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stats {
        Stats {
            enforcing: true,
            sequence: 7,
            active_segment: 1,
            config_version: 3,
            heartbeat_unix_ms: 1_000,
            strategies: vec![StrategyStats {
                id: 12,
                passed: 5,
                limited: 15,
                delayed: 0,
            }],
            undefined_dimensions: vec![("usrid".into(), vec![3, 7])],
        }
    }

    #[test]
    fn json_shape() {
        let j = render_json(&sample(), 1_500);
        assert_eq!(
            j,
            "{\"enforcing\":true,\"sequence\":7,\"active_segment\":1,\"config_version\":3,\"heartbeat_age_ms\":500,\"strategies\":[{\"id\":12,\"passed\":5,\"limited\":15,\"delayed\":0}],\"undefined_dimensions\":{\"usrid\":[3, 7]}}\n"
        );
    }

    #[test]
    fn prometheus_lines() {
        let p = render_prometheus(&sample(), 1_500);
        assert!(
            p.contains("rate_ctl_limited_total{strategy=\"12\"} 15\n"),
            "{p}"
        );
        assert!(
            p.contains("rate_ctl_agent_heartbeat_age_seconds 0.500\n"),
            "{p}"
        );
        for line in p.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').expect(line);
            v.parse::<f64>().expect(line);
        }
    }

    #[test]
    fn format_arg() {
        assert!(wants_prometheus(b"format=prometheus"));
        assert!(wants_prometheus(b"a=1&format=prometheus"));
        assert!(!wants_prometheus(b"format=prometheusx"));
        assert!(!wants_prometheus(b""));
    }
}
