//! Condition operators (issue 30) through the command line, the store
//! (SQLite, and MariaDB/PostgreSQL when their URLs are set), export and
//! import, and the REST API: written, listed, exported and read back as
//! given; bad patterns refused naming `--match` (API: `match.<key>`) with
//! nothing written.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{add_strategy, export_strategies, ok, refused, stores, strategy_rows as listed, version};
use serde_json::{json, Value};
use serve::Serve;

#[test]
fn operators_round_trip_through_cli_store_and_export() {
    for st in stores("conditions_cli") {
        let s = st.url.as_str();
        let fw = ["--per", "day", "--scope", "host"];
        add_strategy(
            s,
            "v1",
            "fixed_window",
            "3",
            &[&["--match", "api^=/api/v1/"][..], &fw].concat(),
        );
        add_strategy(
            s,
            "orders",
            "fixed_window",
            "2",
            &[&["--match", r"api~=/users/*/orders/\*/**"][..], &fw].concat(),
        );
        add_strategy(
            s,
            "not-admin",
            "fixed_window",
            "2",
            &[&["--match", "userid!=admin", "--match", "api=/n"][..], &fw].concat(),
        );
        add_strategy(
            s,
            "only-not",
            "fixed_window",
            "2",
            &[&["--match", "method!=GET"][..], &fw].concat(),
        );
        let rows = listed(s);
        let m = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap()["match"].clone();
        assert_eq!(m("v1"), json!({"api^": "/api/v1/"}), "{}", st.label);
        assert_eq!(m("orders"), json!({"api~": r"/users/*/orders/\*/**"}));
        assert_eq!(m("not-admin"), json!({"userid!": "admin", "api": "/n"}));
        assert_eq!(m("only-not"), json!({"method!": "GET"}));
        // The plain listing writes them as they were given.
        let text = ok(&["strategy", "list", "--store", s]);
        for c in [
            "api^=/api/v1/",
            "userid!=admin",
            "method!=GET",
            "api~=/users/*/orders",
        ] {
            assert!(text.contains(c), "{}: {c} in {text}", st.label);
        }
        // Export, then import into a fresh store: the same conditions.
        let (_dir, file, exported) = export_strategies(s);
        assert!(exported.contains(r#""api^":"/api/v1/""#), "{exported}");
        let other = cli::sqlite_store();
        ok(&["strategy", "import", "--store", &other.url, &file]);
        let again = listed(&other.url);
        let conds = |rows: &[Value]| {
            let mut v: Vec<String> = rows.iter().map(|r| r["match"].to_string()).collect();
            v.sort();
            v
        };
        assert_eq!(conds(&again), conds(&rows), "{}", st.label);

        // Bad patterns: refused naming --match, nothing written.
        let v = version(s);
        let base = [
            "strategy",
            "add",
            "--store",
            s,
            "--name",
            "bad",
            "--algorithm",
            "fixed_window",
            "--rate",
            "2",
            "--per",
            "day",
        ];
        for bad in [
            "api^=",
            "api~=***",
            "api~=/a*b",
            r"api~=/a\b",
            "api~=/**/x",
            "ip!=10.0.0.1",
            "ip^=10.",
        ] {
            refused(&[&base[..], &["--match", bad]].concat(), "--match");
        }
        // Two operators on one dimension: one condition per dimension.
        refused(
            &[&base[..], &["--match", "api^=/a", "--match", "api!=/a/b"]].concat(),
            "--match",
        );
        assert_eq!(version(s), v, "{}: nothing written", st.label);
    }
}

#[test]
fn operators_through_the_api() {
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let body = json!({
        "name": "users",
        "match": {"api~": "/users/*/orders", "userid!": "admin"},
        "algorithm": "fixed_window",
        "rate": 2,
        "per": "day",
    });
    let a = s.post_strategy(&body);
    assert_eq!(a["match"], body["match"]);
    let id = a["id"].as_u64().unwrap();
    let got = s.get(&format!("/api/v1/strategies/{id}"));
    assert_eq!(got["match"], body["match"]);
    // A bad template names its field.
    let mut bad = body.clone();
    bad["name"] = json!("bad");
    bad["match"] = json!({"api~": "***"});
    s.strategy_refused(&bad, "match.api~");
    bad["match"] = json!({"api^": ""});
    s.strategy_refused(&bad, "match.api^");
    // The OpenAPI document describes the operators.
    let doc = s.get("/api/v1/openapi.json");
    let text = doc.to_string();
    assert!(text.contains("api^") && text.contains("userid!"), "{text}");
}
