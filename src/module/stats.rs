//! `rate_ctl_stats;` — a content handler answering with the table state and
//! per-strategy counters, as JSON or (`?format=prometheus`) in the
//! Prometheus text exposition format.

use std::fmt::Write as _;

use ngx::core::{Buffer, Status};
use ngx::ffi::{
    ngx_chain_t, ngx_http_request_t, ngx_int_t, ngx_str_t, NGX_HTTP_GET, NGX_HTTP_HEAD,
    NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_ALLOWED,
};
use ngx::http::{HTTPStatus, HttpModuleMainConf, Request};

use super::worker::with_worker;
use super::RateCtlModule;
use crate::core::engine::Engine;
use crate::core::slot::Slot;

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

/// Reads the engine's mapping and the current table's slots.
pub fn snapshot(engine: &Engine) -> Stats {
    let Some(map) = engine.mapping() else {
        return Stats::default();
    };
    let sequence = map.seq();
    let mut s = Stats {
        enforcing: engine.table().is_some(),
        sequence,
        active_segment: sequence & 1,
        config_version: 0,
        heartbeat_unix_ms: map.heartbeat_unix_ms(),
        strategies: Vec::new(),
        undefined_dimensions: Vec::new(),
    };
    if let Some(t) = engine.table() {
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

pub extern "C" fn stats_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls content handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    serve(r).0
}

fn bytes(s: &ngx_str_t) -> &[u8] {
    if s.len == 0 || s.data.is_null() {
        &[]
    } else {
        // SAFETY: request strings point to `len` readable bytes.
        unsafe { std::slice::from_raw_parts(s.data, s.len) }
    }
}

fn serve(r: &mut Request) -> Status {
    let raw: &ngx_http_request_t = r.as_ref();
    if raw.method & (NGX_HTTP_GET | NGX_HTTP_HEAD) as usize == 0 {
        return HTTPStatus(NGX_HTTP_NOT_ALLOWED as usize).into();
    }
    let prometheus = wants_prometheus(bytes(&raw.args));
    let Some(mc) = RateCtlModule::main_conf(r) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let now_ns = super::handler::monotonic_ns();
    let now_ms = super::handler::unix_ms();
    let log = r.log();
    let Some(stats) = with_worker(mc, |w| {
        w.refresh(mc, now_ns, log);
        let mut s = snapshot(&w.engine);
        s.undefined_dimensions = w.undefined.clone();
        s
    }) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let (body, ctype) = if prometheus {
        (
            render_prometheus(&stats, now_ms),
            "text/plain; version=0.0.4",
        )
    } else {
        (render_json(&stats, now_ms), "application/json")
    };
    let rc = r.discard_request_body();
    if !rc.is_ok() {
        return rc;
    }
    r.set_status(HTTPStatus::OK);
    r.set_content_length_n(body.len());
    {
        let raw: &mut ngx_http_request_t = r.as_mut();
        raw.headers_out.content_type.len = ctype.len();
        raw.headers_out.content_type.data = ctype.as_ptr().cast_mut();
        raw.headers_out.content_type_len = ctype.len();
        raw.headers_out.content_type_lowcase = std::ptr::null_mut();
    }
    let rc = r.send_header();
    if rc == Status::NGX_ERROR || rc.0 > Status::NGX_OK.0 || r.header_only() {
        return rc;
    }
    let Some(mut buf) = r.pool().create_buffer_from_str(&body) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let b = buf.as_ngx_buf_mut();
    // SAFETY: b is a valid buffer just created in the request pool.
    unsafe {
        (*b).set_last_buf(1);
        (*b).set_last_in_chain(1);
    }
    let mut out = ngx_chain_t {
        buf: b,
        next: std::ptr::null_mut(),
    };
    r.output_filter(&mut out)
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
