//! Agent-side refusals are visible to operators (issue 11 #8): a blacklist
//! entry beyond the agents' capacity is accepted by the API (capacities are
//! per agent), every agent refuses the publish, and each agent's last
//! publish error (and when) reaches the store with its heartbeat: shown by
//! `GET /api/v1/hosts` and `rate-ctl host list`, cleared by the next
//! successful publish. Real `rate-ctl serve` and `rate-ctl agent` processes,
//! one agent over HTTP and one on the database directly; SQLite and, with
//! RATE_CTL_TEST_MYSQL_URL, MariaDB.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::time::Duration;

use serde_json::{json, Value};

use agent::{wait_for, AgentProc};
use cli::{json_lines, ok, stores};
use serve::Serve;

/// `rate_ctl_host_publish_error{host="id"}` of `GET /metrics`.
fn metric(s: &Serve, id: &str) -> String {
    let (code, body) = serve::http_raw(&s.addr, "GET", "/metrics", Some(&s.token), None);
    let text = String::from_utf8(body).unwrap();
    assert_eq!(code, 200, "{text}");
    let key = format!("rate_ctl_host_publish_error{{host=\"{id}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key}in {text}"))
        .to_string()
}

/// The hosts of `GET /api/v1/hosts` by id.
fn host(s: &Serve, id: &str) -> Value {
    let (code, body) = s.req("GET", "/api/v1/hosts", None);
    assert_eq!(code, 200, "{body}");
    body["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host_id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn a_blacklist_beyond_the_agents_capacity_is_shown_as_an_error_then_cleared() {
    for st in stores("publish_errors") {
        let label = st.label;
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_with_tokens(&st.url, dir.path(), &["agent"]);
        // Two entries fit each agent's file; the API cannot know that.
        let caps = ["--blacklist-entries", "2"];
        let mut via_api = [&["--token", "agent-secret"][..], &caps].concat();
        via_api.push("--poll-ms");
        via_api.push("200");
        let api_agent = AgentProc::start(
            &s.url(),
            &dir.path().join("a.shm"),
            "via-api",
            &dir.path().join("a.log"),
            &via_api,
        );
        let db_agent = AgentProc::start(
            &st.url,
            &dir.path().join("b.shm"),
            "via-db",
            &dir.path().join("b.log"),
            &caps,
        );
        let ids = ["via-api", "via-db"];
        // Waits until every host's row passes `pred`.
        let every_host = |pred: fn(&Value) -> bool| {
            wait_for(Duration::from_secs(10), || {
                ids.iter().all(|id| pred(&host(&s, id))).then_some(())
            })
        };
        let registered = every_host(|h| h["applied_version"].is_u64());
        assert!(
            registered.is_some(),
            "{label}: both agents publish first:\n{}\n{}",
            api_agent.log_text(),
            db_agent.log_text()
        );
        for id in ids {
            let h = host(&s, id);
            assert_eq!(h["publish_error"], Value::Null, "{label}: {h}");
            assert_eq!(h["publish_error_at"], Value::Null, "{label}: {h}");
        }

        let mut entries = Vec::new();
        for n in 1..=3 {
            let body = json!({"dimension": "ip", "value": format!("10.0.0.{n}")}).to_string();
            let (code, e) = s.req("POST", "/api/v1/blacklist", Some(&body));
            assert_eq!(code, 201, "{label}: the API accepts entry {n}: {e}");
            entries.push(e["id"].as_u64().unwrap());
        }
        let before = rate_ctl::core::clock::unix_ms();
        let shown = wait_for(Duration::from_secs(10), || {
            let hs: Vec<Value> = ids.iter().map(|id| host(&s, id)).collect();
            hs.iter()
                .all(|h| h["publish_error"].is_string())
                .then_some(hs)
        });
        let hs = shown.unwrap_or_else(|| {
            panic!(
                "{label}: the refusal never reached the hosts API: {} {}\n{}\n{}",
                host(&s, "via-api"),
                host(&s, "via-db"),
                api_agent.log_text(),
                db_agent.log_text()
            )
        });
        for h in &hs {
            let m = h["publish_error"].as_str().unwrap();
            assert!(
                m.contains("blacklist") && m.contains('2') && m.contains('3'),
                "{label}: the message names the capacity: {h}"
            );
            let at = h["publish_error_at"].as_u64().expect("publish_error_at");
            assert!(
                at + 2_000 >= before && at <= rate_ctl::core::clock::unix_ms(),
                "{label}: {h}"
            );
        }
        for id in ids {
            assert_eq!(metric(&s, id), "1", "{label}: /metrics for {id}");
        }
        // `host list`, text and JSON, on the store.
        let text = ok(&["host", "list", "--store", &st.url]);
        assert!(text.contains("PUBLISH ERROR"), "{label}: {text}");
        for id in ids {
            let line = text.lines().find(|l| l.starts_with(id)).unwrap();
            assert!(line.contains("blacklist"), "{label}: {text}");
        }
        let listed = json_lines(&ok(&["host", "list", "--store", &st.url, "--json"]));
        assert_eq!(listed.len(), 2);
        for h in &listed {
            assert!(h["publish_error"].is_string(), "{label}: {h}");
            assert!(h["publish_error_ms"].is_u64(), "{label}: {h}");
        }

        // Back within capacity: both publish again, and the error clears.
        let (code, e) = s.req("DELETE", &format!("/api/v1/blacklist/{}", entries[2]), None);
        assert!(code == 200 || code == 204, "{label}: {code} {e}");
        let cleared = every_host(|h| h["publish_error"].is_null());
        assert!(
            cleared.is_some(),
            "{label}: cleared after a successful publish: {} {}",
            host(&s, "via-api"),
            host(&s, "via-db")
        );
        for id in ids {
            let h = host(&s, id);
            assert_eq!(h["publish_error_at"], Value::Null, "{label}: {h}");
            assert_eq!(h["lag"], 0, "{label}: {h}");
            assert_eq!(metric(&s, id), "0", "{label}: /metrics for {id}");
        }
        let listed = json_lines(&ok(&["host", "list", "--store", &st.url, "--json"]));
        assert!(
            listed.iter().all(|h| h["publish_error"].is_null()),
            "{label}: {listed:?}"
        );
    }
}

/// Migration 4 adds the two columns to a store made before it (hosts kept),
/// and a run interrupted after its columns (not yet recorded) completes on
/// the next start instead of failing on "duplicate column".
#[test]
fn the_publish_error_columns_migrate_an_older_store_and_a_rerun() {
    for st in stores("publish_errors_migration") {
        let (label, s) = (st.label, st.url.as_str());
        ok(&["host", "set-weight", "edge-1", "3", "--store", s]);
        // Back to schema version 3, as a store written before this change.
        cli::sql(s, "ALTER TABLE hosts DROP COLUMN publish_error");
        cli::sql(s, "ALTER TABLE hosts DROP COLUMN publish_error_ms");
        cli::sql(s, "DELETE FROM schema_migrations WHERE version = 4");
        let listed = json_lines(&ok(&["host", "list", "--store", s, "--json"]));
        assert_eq!(listed.len(), 1, "{label}");
        assert_eq!(listed[0]["weight"], 3, "{label}: the host is kept");
        assert!(listed[0]["publish_error"].is_null(), "{label}");
        // Columns there, migration not recorded: completed, not refused.
        cli::sql(s, "DELETE FROM schema_migrations WHERE version = 4");
        let listed = json_lines(&ok(&["host", "list", "--store", s, "--json"]));
        assert_eq!(listed.len(), 1, "{label}");
        assert_eq!(
            cli::sql(
                s,
                "UPDATE schema_migrations SET applied_ms = applied_ms WHERE version = 4"
            ),
            1,
            "{label}: recorded again"
        );
    }
}
