//! Named API tokens (issue 34) through real `rate-ctl serve` processes on
//! SQLite, MariaDB and PostgreSQL: created by the CLI (secret printed once,
//! the last field of the last line) and by the API; a viewer reads and is
//! refused writes; an agent token bound to web-1 may report as web-1 only,
//! sets no weight and reads nothing else; a revoke takes effect at the next
//! request, without a restart; the audit log names the token and its role.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use serde_json::{json, Value};
use serve::{http, Serve};

fn create(store: &str, args: &[&str]) -> String {
    let mut a = vec!["token", "create", "--store", store];
    a.extend_from_slice(args);
    let out = cli::ok(&a);
    out.lines()
        .last()
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string()
}

fn strategy(name: &str) -> String {
    json!({"name": name, "match": {"api": format!("/{name}")}, "algorithm": "token_bucket", "rate": 5})
        .to_string()
}

#[test]
fn named_tokens_roles_hosts_and_revoke() {
    for st in cli::stores("tokens") {
        let url = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let viewer = create(url, &["--role", "viewer", "--name", "ops-viewer"]);
        let agent = create(
            url,
            &[
                "--role",
                "agent",
                "--host",
                "web-1",
                "--name",
                "web-1-agent",
            ],
        );
        assert!(viewer.starts_with("rct_") && viewer.len() == 68, "{viewer}");
        let s = Serve::start_in(url, dir.path(), &[]);
        let a = s.addr.as_str();

        // viewer: reads, writes nothing.
        assert_eq!(
            http(a, "GET", "/api/v1/strategies", Some(&viewer), None).0,
            200
        );
        assert_eq!(http(a, "GET", "/api/v1/hosts", Some(&viewer), None).0, 200);
        let (c, v) = http(
            a,
            "POST",
            "/api/v1/strategies",
            Some(&viewer),
            Some(&strategy("v")),
        );
        assert_eq!(c, 403, "{}: {v}", st.label);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("ops-viewer"),
            "{v}"
        );
        assert_eq!(http(a, "GET", "/api/v1/tokens", Some(&viewer), None).0, 403);

        // agent bound to web-1: reports as web-1 only, no weight, no reads.
        let report = json!({"applied_version": 0}).to_string();
        // `POST /api/v1/hosts/HOST/report` with the agent's token.
        let report_as = |host: &str, body: &str| {
            let path = format!("/api/v1/hosts/{host}/report");
            http(a, "POST", &path, Some(&agent), Some(body))
        };
        let (c, v) = report_as("web-2", &report);
        assert_eq!(c, 403, "{}: {v}", st.label);
        let (c, v) = report_as("web-1", &report);
        assert_eq!(c, 200, "{}: {v}", st.label);
        let (c, v) = report_as("web-1", &json!({"weight": 1000000}).to_string());
        assert_eq!((c, &v["error"]["field"]), (403, &json!("weight")), "{v}");
        assert_eq!(
            http(a, "GET", "/api/v1/snapshot?after=0", Some(&agent), None).0,
            200
        );
        assert_eq!(
            http(a, "GET", "/api/v1/strategies", Some(&agent), None).0,
            403
        );
        assert_eq!(
            http(
                a,
                "PUT",
                "/api/v1/hosts/web-1",
                Some(&agent),
                Some(r#"{"weight": 5}"#)
            )
            .0,
            403
        );

        // token list: names, roles, hosts, last used.
        let list = cli::json_lines(&cli::ok(&["token", "list", "--store", url, "--json"]));
        let v = serve::find(&Value::from(list.clone()), "name", "ops-viewer");
        assert_eq!(v["role"], "viewer");
        assert!(v["last_used_at"].is_u64(), "{v}");
        let g = serve::find(&Value::from(list), "name", "web-1-agent");
        assert_eq!((&g["role"], &g["host"]), (&json!("agent"), &json!("web-1")));

        // Revoked by the CLI: refused at the next request, no restart.
        cli::ok(&["token", "revoke", "--store", url, "ops-viewer"]);
        assert_eq!(
            http(a, "GET", "/api/v1/strategies", Some(&viewer), None).0,
            401
        );

        // The API: an admin creates a named admin token, which writes and is
        // audited under its name and role; revoked through the API.
        let (c, t) = s.req(
            "POST",
            "/api/v1/tokens",
            Some(r#"{"name": "alice", "role": "admin"}"#),
        );
        assert_eq!(c, 201, "{t}");
        let alice = t["secret"].as_str().unwrap().to_string();
        let (c, v) = http(
            a,
            "POST",
            "/api/v1/strategies",
            Some(&alice),
            Some(&strategy("by-alice")),
        );
        assert_eq!(c, 201, "{v}");
        let entries = s.get("/api/v1/audit?limit=10")["entries"].clone();
        let e = serve::find(&entries, "action", "strategy.create");
        assert_eq!(
            (&e["token"], &e["role"]),
            (&json!("alice"), &json!("admin")),
            "{e}"
        );
        let e = serve::find(&entries, "action", "token.create");
        assert_eq!(e["after"]["name"], "alice", "{e}");
        let (c, _) = s.req("DELETE", "/api/v1/tokens/alice", None);
        assert_eq!(c, 200);
        assert_eq!(
            http(a, "GET", "/api/v1/strategies", Some(&alice), None).0,
            401
        );
        let (c, _) = s.req("DELETE", "/api/v1/tokens/alice", None);
        assert_eq!(c, 404);
        // Bad input names the field.
        let (c, v) = s.req(
            "POST",
            "/api/v1/tokens",
            Some(r#"{"name": "x y", "role": "admin"}"#),
        );
        assert_eq!((c, &v["error"]["field"]), (422, &json!("name")), "{v}");
        let (c, v) = s.req(
            "POST",
            "/api/v1/tokens",
            Some(r#"{"name": "x", "role": "root"}"#),
        );
        assert_eq!((c, &v["error"]["field"]), (422, &json!("role")), "{v}");
        eprintln!("tokens {}: ok", st.label);
    }
}
