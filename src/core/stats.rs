//! The numbers behind the module's `rate_ctl_stats;` endpoint — the table
//! state and per-strategy counters of a worker's reader — and their JSON
//! and Prometheus renderings. nginx-free, so `cargo test` runs its tests;
//! the handler is in `src/module/stats.rs`.

use std::fmt::Write as _;

use super::shm::reader::Reader;
use super::shm::slot::Slot;

/// One strategy's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategyStats {
    pub id: u32,
    /// The store's name (from the file: any text of at most
    /// [`MAX_NAME_LEN`](super::model::MAX_NAME_LEN) bytes).
    pub name: String,
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
    /// Per-key strategies: their key table figures.
    pub keys: Option<super::keys::KeyCounters>,
    /// Strategies with count_if, cost_from or cost_after (issue 31).
    pub response: Option<super::model::response::Settled>,
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
    /// The key table (per-key strategies), table-wide.
    pub key_table: super::keys::TableStats,
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
        key_table: map.keys().stats(),
    };
    let keys = map.keys();
    if let Some(t) = reader.table() {
        s.config_version = t.config_version();
        let slots = map.slots();
        s.strategies = t
            .all_strategies()
            .filter_map(|c| {
                let k = Slot::counters_at(&slots, c.slot, c.generation)?;
                Some(StrategyStats {
                    id: c.strategy.id,
                    name: c.strategy.name.clone(),
                    passed: k.passed,
                    limited: k.limited,
                    delayed: k.delayed,
                    keys: c.key.as_ref().map(|_| keys.counters(c.slot)),
                    response: c.response.as_ref().map(|_| keys.settled(c.slot)),
                })
            })
            .collect();
        // By id, as a whole table lists them (a patched one lists its
        // base's first: issue 29).
        s.strategies.sort_by_key(|x| x.id);
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
            "{{\"id\":{},\"passed\":{},\"limited\":{},\"delayed\":{}",
            st.id, st.passed, st.limited, st.delayed
        );
        if let Some(k) = st.keys {
            let _ = write!(
                o,
                ",\"keys\":{{\"in_use\":{},\"reclaims\":{},\"full\":{},\"overflow_admits\":{},\"capped\":{}}}",
                k.in_use, k.reclaims, k.full, k.overflow_admits, k.capped
            );
        }
        if let Some(r) = st.response {
            let _ = write!(
                o,
                ",\"response\":{{\"charged_after\":{},\"given_back\":{},\"not_counted\":{}}}",
                r.charged_after, r.given_back, r.not_counted
            );
        }
        o.push('}');
    }
    let kt = &s.key_table;
    let _ = write!(
        o,
        "],\"key_table\":{{\"capacity\":{},\"occupied\":{},\"max_probe\":{}}}",
        kt.capacity, kt.occupied, kt.max_probe
    );
    o.push_str(",\"undefined_dimensions\":{");
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
        family(&mut o, s, name, "counter", help, |st| Some(get(st)));
    }
    render_keys_prometheus(&mut o, s);
    render_response_prometheus(&mut o, s);
    o
}

/// The response counters (issue 31), per strategy with count_if,
/// cost_from or cost_after.
fn render_response_prometheus(o: &mut String, s: &Stats) {
    type Get = fn(&super::model::response::Settled) -> u64;
    for (name, help, get) in [
        (
            "rate_ctl_charged_after_response_units_total",
            "Units charged when requests ended (cost_after above what was charged up front).",
            (|r| r.charged_after) as Get,
        ),
        (
            "rate_ctl_given_back_units_total",
            "Units given back when requests ended (count_if status not in the list, cost_after below what was charged).",
            |r| r.given_back,
        ),
        (
            "rate_ctl_not_counted_total",
            "Requests not counted because their final status was not in count_if.",
            |r| r.not_counted,
        ),
    ] {
        family(o, s, name, "counter", help, |st| st.response.as_ref().map(get));
    }
}

/// The key table's series: per per-key strategy, and table-wide.
fn render_keys_prometheus(o: &mut String, s: &Stats) {
    type Get = fn(&super::keys::KeyCounters) -> u64;
    for (name, kind, help, get) in [
        (
            "rate_ctl_keys_in_use",
            "gauge",
            "Key table entries held by a per-key strategy's keys.",
            (|k| k.in_use) as Get,
        ),
        (
            "rate_ctl_key_reclaims_total",
            "counter",
            "Entries a per-key strategy took over from a key whose state was as new.",
            |k| k.reclaims,
        ),
        (
            "rate_ctl_key_table_full_total",
            "counter",
            "Requests of new keys that found their part of the key table full (on_full applied).",
            |k| k.full,
        ),
        (
            "rate_ctl_key_overflow_admits_total",
            "counter",
            "Of those, requests the strategy's overflow limiter admitted (on_full overflow).",
            |k| k.overflow_admits,
        ),
        (
            "rate_ctl_key_capped_total",
            "counter",
            "Requests of new keys refused an entry because the strategy's keys held its max_keys cap (on_full applied; also in rate_ctl_key_table_full_total).",
            |k| k.capped,
        ),
    ] {
        family(o, s, name, kind, help, |st| st.keys.as_ref().map(get));
    }
    let kt = &s.key_table;
    for (name, help, v) in [
        (
            "rate_ctl_key_table_capacity",
            "Entries of the key table.",
            kt.capacity,
        ),
        (
            "rate_ctl_key_table_occupied",
            "Key table entries ever claimed (reused in place, never freed).",
            kt.occupied,
        ),
        (
            "rate_ctl_key_table_max_probe",
            "Longest probe (entries, at most 8) a new key needed.",
            kt.max_probe,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
}

/// One metric family: its HELP and TYPE lines, then a series for each
/// strategy `get` has a value for.
fn family(
    o: &mut String,
    s: &Stats,
    name: &str,
    kind: &str,
    help: &str,
    get: impl Fn(&StrategyStats) -> Option<u64>,
) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for st in &s.strategies {
        if let Some(v) = get(st) {
            series(o, name, st);
            let _ = writeln!(o, " {v}");
        }
    }
}

/// A strategy's series name and labels: `NAME{strategy="ID",name="..."}`.
fn series(o: &mut String, name: &str, st: &StrategyStats) {
    let _ = write!(o, "{name}{{strategy=\"{}\",name=\"", st.id);
    push_label(o, &st.name);
    o.push_str("\"}");
}

/// Appends `v` as a Prometheus label value: `\`, `"` and newlines escaped.
pub fn push_label(o: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
}

/// `v` as a Prometheus label value (see [`push_label`]).
pub fn label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    push_label(&mut o, v);
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
                name: "login \"per\" ip \\ x\ny".into(),
                passed: 5,
                limited: 15,
                delayed: 0,
                keys: Some(crate::core::keys::KeyCounters {
                    in_use: 4,
                    reclaims: 2,
                    full: 1,
                    overflow_admits: 1,
                    capped: 1,
                }),
                response: None,
            }],
            undefined_dimensions: vec![("usrid".into(), vec![3, 7])],
            key_table: crate::core::keys::TableStats {
                capacity: 64,
                occupied: 4,
                max_probe: 2,
                claims: 6,
            },
        }
    }

    #[test]
    fn json_shape() {
        let j = render_json(&sample(), 1_500);
        assert_eq!(
            j,
            "{\"enforcing\":true,\"sequence\":7,\"active_segment\":1,\"config_version\":3,\"heartbeat_age_ms\":500,\"strategies\":[{\"id\":12,\"passed\":5,\"limited\":15,\"delayed\":0,\"keys\":{\"in_use\":4,\"reclaims\":2,\"full\":1,\"overflow_admits\":1,\"capped\":1}}],\"key_table\":{\"capacity\":64,\"occupied\":4,\"max_probe\":2},\"undefined_dimensions\":{\"usrid\":[3, 7]}}\n"
        );
    }

    #[test]
    fn prometheus_lines() {
        let p = render_prometheus(&sample(), 1_500);
        // The name escaped: `"` and `\` and a newline (a hostile file may
        // hold any text; the store refuses control characters).
        let labels = r#"{strategy="12",name="login \"per\" ip \\ x\ny"}"#;
        assert!(
            p.contains(&format!("rate_ctl_limited_total{labels} 15\n")),
            "{p}"
        );
        assert!(
            p.contains("rate_ctl_agent_heartbeat_age_seconds 0.500\n"),
            "{p}"
        );
        for series in [
            "rate_ctl_keys_in_use",
            "rate_ctl_key_reclaims_total",
            "rate_ctl_key_table_full_total",
            "rate_ctl_key_overflow_admits_total",
            "rate_ctl_key_capped_total",
        ] {
            assert!(p.contains(&format!("{series}{labels} ")), "{series}: {p}");
        }
        assert!(
            p.contains(&format!("rate_ctl_keys_in_use{labels} 4\n")),
            "{p}"
        );
        assert!(
            p.contains(&format!("rate_ctl_key_reclaims_total{labels} 2\n")),
            "{p}"
        );
        assert!(p.contains("rate_ctl_key_table_max_probe 2\n"), "{p}");
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
