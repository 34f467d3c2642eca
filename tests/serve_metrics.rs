//! `GET /metrics` of `rate-ctl serve` against a real SQLite file and (with
//! RATE_CTL_TEST_MYSQL_URL / RATE_CTL_TEST_POSTGRES_URL) a real MariaDB and
//! PostgreSQL (`latest_samples`' join): agents' reports become per
//! strategy and host counters, hosts their applied version, lag and report
//! age; the read token is needed; and every series the Grafana dashboard
//! (docs/grafana-dashboard.json) queries exists.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::collections::{BTreeSet, HashMap};

use cli::{repo_root, stores};
use serde_json::{json, Value};
use serve::{http, http_raw, Serve};

/// `name{labels}` → value, and the metric families with a TYPE line.
fn parse(text: &str) -> (HashMap<String, f64>, BTreeSet<String>) {
    let mut series = HashMap::new();
    let mut families = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let name = it.next().unwrap();
            let kind = it.next().unwrap();
            assert!(["counter", "gauge"].contains(&kind), "{l}");
            families.insert(name.to_string());
            continue;
        }
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        let (key, v) = l
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {l:?}"));
        let name = key.split('{').next().unwrap();
        assert!(
            families.contains(name),
            "{name}: a series before its TYPE line"
        );
        series.insert(key.to_string(), v.parse::<f64>().unwrap());
    }
    (series, families)
}

fn metrics(s: &Serve, token: &str) -> (HashMap<String, f64>, BTreeSet<String>) {
    let (c, body) = http_raw(&s.addr, "GET", "/metrics", Some(token), None);
    let text = String::from_utf8(body).unwrap();
    assert_eq!(c, 200, "{text}");
    parse(&text)
}

fn report(s: &Serve, host: &str, body: Value) {
    let path = format!("/api/v1/hosts/{host}/report");
    let (c, v) = http(
        &s.addr,
        "POST",
        &path,
        Some("agent-secret"),
        Some(&body.to_string()),
    );
    assert_eq!(c, 200, "{v}");
}

/// The `rate_ctl_*` metric names in the dashboard's queries.
fn dashboard_metrics() -> BTreeSet<String> {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("docs/grafana-dashboard.json")).unwrap(),
    )
    .expect("docs/grafana-dashboard.json is JSON");
    let mut names = BTreeSet::new();
    let mut exprs = 0;
    for p in doc["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            exprs += 1;
            let b = e.as_bytes();
            let mut i = 0;
            while let Some(at) = e[i..].find("rate_ctl_") {
                let start = i + at;
                let mut end = start;
                while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                    end += 1;
                }
                names.insert(e[start..end].to_string());
                i = end;
            }
        }
    }
    assert!(exprs >= 10, "the dashboard has {exprs} queries");
    names
}

#[test]
fn metrics_from_reports_and_the_dashboard_names_real_series() {
    for st in stores("serve_metrics") {
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_with_tokens(&st.url, dir.path(), &["read", "agent"]);
        let (c, a) = s.req(
            "POST",
            "/api/v1/strategies",
            Some(
                &json!({"name": "pay \"eu\"", "match": {"api": "/pay"},
                         "algorithm": "token_bucket", "rate": 100, "burst": 20})
                .to_string(),
            ),
        );
        assert_eq!(c, 201, "{a}");
        let id = a["id"].as_u64().unwrap();
        let version = s.get("/api/v1/version")["version"].as_u64().unwrap();

        // Tokens: none → 401, the agent's → 403, read and admin → 200.
        assert_eq!(http_raw(&s.addr, "GET", "/metrics", None, None).0, 401);
        assert_eq!(
            http_raw(&s.addr, "GET", "/metrics", Some("agent-secret"), None).0,
            403
        );
        metrics(&s, &s.token);

        // web-1 applied the current version; web-2 applied none yet.
        let c1 = |p: u64, l: u64| json!([{"id": id, "passed": p, "limited": l, "delayed": 0}]);
        report(
            &s,
            "web-1",
            json!({"applied_version": version, "counters": c1(10, 2)}),
        );
        report(
            &s,
            "web-2",
            json!({"weight": 3, "counters": [{"id": id, "passed": 5, "limited": 1, "delayed": 4}]}),
        );
        // A newer report replaces web-1's counters (the newest sample counts).
        std::thread::sleep(std::time::Duration::from_millis(5));
        report(
            &s,
            "web-1",
            json!({"applied_version": version, "counters": c1(25, 7)}),
        );
        // A change after web-1 applied `version`: web-1 now lags by one, so
        // the lag gauge is checked against a real difference, not 0 = 0.
        let (c, b) = s.req(
            "POST",
            "/api/v1/strategies",
            Some(
                &json!({"name": "later", "match": {"api": "/later"},
                         "algorithm": "token_bucket", "rate": 10})
                .to_string(),
            ),
        );
        assert_eq!(c, 201, "{b}");

        let (m, families) = metrics(&s, "read-secret");
        let get = |k: &str| {
            *m.get(k)
                .unwrap_or_else(|| panic!("[{}] no series {k}; have {m:?}", st.label))
        };
        let lab = |h: &str| format!("{{strategy=\"{id}\",name=\"pay \\\"eu\\\"\",host=\"{h}\"}}");
        for (counter, h, want) in [
            ("passed", "web-1", 25.0),
            ("limited", "web-1", 7.0),
            ("passed", "web-2", 5.0),
            ("delayed", "web-2", 4.0),
        ] {
            let series = format!("rate_ctl_fleet_{counter}_total{}", lab(h));
            assert_eq!(get(&series), want, "{series}");
        }
        let now_version = s.get("/api/v1/version")["version"].as_u64().unwrap();
        assert!(now_version > version, "{now_version} after {version}");
        assert_eq!(get("rate_ctl_store_config_version"), now_version as f64);
        assert_eq!(get("rate_ctl_host_weight{host=\"web-2\"}"), 3.0);
        assert_eq!(get("rate_ctl_host_fresh{host=\"web-1\"}"), 1.0);
        assert_eq!(
            get("rate_ctl_host_applied_version{host=\"web-1\"}"),
            version as f64
        );
        assert_eq!(
            get("rate_ctl_host_lag_versions{host=\"web-1\"}"),
            (now_version - version) as f64
        );
        assert!(!m.contains_key("rate_ctl_host_lag_versions{host=\"web-2\"}"));
        let age = get("rate_ctl_host_report_age_seconds{host=\"web-1\"}");
        assert!((0.0..5.0).contains(&age), "report age {age}");

        // A deleted strategy's counters leave /metrics.
        assert_eq!(
            s.req("DELETE", &format!("/api/v1/strategies/{id}"), None).0,
            204
        );
        let (m2, _) = metrics(&s, "read-secret");
        assert!(
            !m2.keys().any(|k| k.contains(&format!("strategy=\"{id}\""))),
            "{m2:?}"
        );

        // The dashboard queries serve's series and the module's (rendered by
        // core::stats for the module's endpoint).
        let module_src = std::fs::read_to_string(repo_root().join("src/core/stats.rs")).unwrap();
        for name in dashboard_metrics() {
            let served = families.contains(&name);
            let module = module_src.contains(&format!("\"{name}\""));
            assert!(
                served || module,
                "the dashboard queries {name}: neither /metrics nor the module's stats has it"
            );
        }
    }
}
