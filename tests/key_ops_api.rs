//! Per-key operations (issue 33) through the API and the CLI, without
//! nginx: the key resource's errors name the field, resets are stored,
//! audited and handed to the agents' poll after the one they last saw, an
//! agent's answers are checked, and `key reset --store` works like the
//! API. (t-nginx/41-key-ops.t runs the whole loop through nginx.)

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use serde_json::{json, Value};

fn setup(srv: &serve::Serve) -> (u64, u64) {
    let keyed = srv.post_strategy(&json!({"name": "per-client", "match": {"api": "/k"},
        "algorithm": "fixed_window", "rate": 5, "per": "day", "each": ["ip", "userid"],
        "ipv4_prefix": 24}));
    let shared = srv.post_strategy(&json!({"name": "shared", "match": {"api": "/s"},
        "algorithm": "token_bucket", "rate": 5}));
    (
        keyed["id"].as_u64().unwrap(),
        shared["id"].as_u64().unwrap(),
    )
}

#[test]
fn the_key_resource_names_the_field_it_refuses() {
    let st = cli::sqlite_store();
    let srv = serve::Serve::start_temp(&st.url, &[]);
    let (id, shared) = setup(&srv);
    let good = "ip=10.1.2.3,userid=u1";
    for method in ["GET", "DELETE"] {
        for (path, code, field) in [
            (format!("/api/v1/strategies/{id}/keys/10.1.2.3"), 422, "key"),
            (
                format!("/api/v1/strategies/{id}/keys/ip=10.1.2.3"),
                422,
                "key",
            ),
            (
                format!("/api/v1/strategies/{id}/keys/ip=10.1.2.3,userid="),
                422,
                "key",
            ),
            (
                format!("/api/v1/strategies/{id}/keys/ip=1.2.3.4%2F99,userid=u"),
                422,
                "key",
            ),
            (
                format!("/api/v1/strategies/{shared}/keys/{good}"),
                422,
                "strategy",
            ),
            (
                format!("/api/v1/strategies/999/keys/{good}"),
                404,
                "strategy",
            ),
            (
                format!("/api/v1/strategies/abc/keys/{good}"),
                404,
                "strategy",
            ),
        ] {
            let (c, v) = srv.req(method, &path, None);
            assert_eq!(c, code, "{method} {path}: {v}");
            assert_eq!(v["error"]["field"], field, "{method} {path}: {v}");
        }
    }
    // No agent: the fleet view answers at once with no hosts.
    let v = srv.get(&format!("/api/v1/strategies/{id}/keys/{good}"));
    assert_eq!(
        v["key"], "ip=10.1.2.0/24,userid=u1",
        "aggregated as $rate_ctl_key: {v}"
    );
    assert_eq!(v["fleet"]["used"], 0);
    assert_eq!(v["hosts"], json!([]));
}

#[test]
fn resets_are_stored_audited_and_polled_in_order() {
    // SQLite, and MariaDB / PostgreSQL when their test servers are given.
    for st in cli::stores("key_resets") {
        resets_on(&st);
    }
}

fn resets_on(st: &cli::TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve::Serve::start_in(&st.url, dir.path(), &[]);
    let (id, _) = setup(&srv);
    // The fleet view records its question in the store (no host here).
    let v = srv.get(&format!(
        "/api/v1/strategies/{id}/keys/ip=10.1.2.3,userid=u1"
    ));
    assert_eq!(v["hosts"], json!([]), "{v}");
    // A starting agent begins after the newest reset.
    let (c, v) = srv.req("POST", "/api/v1/hosts/h0/keys", Some("{}"));
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["resets"], json!([]));
    let start = v["after"].as_u64().unwrap();
    let (c, v) = srv.req(
        "DELETE",
        &format!("/api/v1/strategies/{id}/keys/ip=10.1.2.3,userid=a%2Cb"),
        None,
    );
    assert_eq!(c, 202, "{v}");
    assert_eq!(v["key"], "ip=10.1.2.0/24,userid=a,b");
    // The CLI on the store records the next one.
    let out = cli::ok(&[
        "key",
        "reset",
        "--store",
        &st.url,
        "--strategy",
        &id.to_string(),
        "--key",
        "ip=10.9.9.9,userid=u2",
        "--json",
    ]);
    let row: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(row["key"], "ip=10.9.9.0/24,userid=u2");
    let body = json!({"after": start}).to_string();
    let (_, v) = srv.req("POST", "/api/v1/hosts/h0/keys", Some(&body));
    let keys: Vec<&str> = v["resets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["ip=10.1.2.0/24,userid=a,b", "ip=10.9.9.0/24,userid=u2"]
    );
    let last = v["after"].as_u64().unwrap();
    let (_, v) = srv.req(
        "POST",
        "/api/v1/hosts/h0/keys",
        Some(&json!({"after": last}).to_string()),
    );
    assert_eq!(v["resets"], json!([]), "nothing twice");
    // Audited, by token and by the CLI.
    let audit = srv.get("/api/v1/audit?limit=10").to_string();
    assert_eq!(
        audit.matches("\"action\":\"key.reset\"").count(),
        2,
        "{audit}"
    );
    // An agent's answers are checked, naming the field.
    for (bad, field) in [
        (json!({"answers": "x"}), "answers"),
        (json!({"answers": [{"query": 1}]}), "answers.limit"),
        (json!({"after": -1}), "after"),
    ] {
        let (c, v) = srv.req("POST", "/api/v1/hosts/h0/keys", Some(&bad.to_string()));
        assert_eq!(c, 422, "{bad}: {v}");
        assert_eq!(v["error"]["field"], field, "{bad}: {v}");
    }
    // The CLI names a bad key and the fleet view needs serve.
    let out = cli::rate_ctl(&[
        "key",
        "reset",
        "--store",
        &st.url,
        "--strategy",
        &id.to_string(),
        "--key",
        "10.0.0.1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid --key: give every part as name=value"),
        "{err}"
    );
    let out = cli::rate_ctl(&[
        "key",
        "show",
        "--store",
        &st.url,
        "--strategy",
        &id.to_string(),
        "--key",
        "ip=1.2.3.4,userid=u",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --api"));
}

/// An agent on the store itself (`--store sqlite:…`, no serve between):
/// the fleet view's question reaches it through the store's
/// `key_questions`, its answer comes back through `key_answers`, and a
/// reset recorded by the CLI is applied from `key_resets`.
#[test]
fn an_agent_on_the_store_answers_the_fleet_view_and_applies_resets() {
    let (st, dir) = cli::sqlite_and_dir();
    let srv = serve::Serve::start_in(&st.url, dir.path(), &[]);
    let (id, _) = setup(&srv);
    let shm = dir.path().join("h1.shm");
    let mut a = agent::AgentProc::start(&st.url, &shm, "h1", &dir.path().join("h1.log"), &[]);
    // Published and heartbeating (fresh for serve).
    agent::wait_for(std::time::Duration::from_secs(10), || {
        let v = srv.get("/api/v1/hosts");
        (v["hosts"][0]["fresh"] == json!(true) && shm.exists()).then_some(())
    })
    .expect("agent h1 up");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    let v = srv.get(&format!(
        "/api/v1/strategies/{id}/keys/ip=10.1.2.3,userid=u1"
    ));
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(v["hosts"][0]["host"], "h1", "{v}");
    assert_eq!(v["hosts"][0]["answered"], true, "{v}");
    assert_eq!(
        (&v["hosts"][0]["used"], &v["hosts"][0]["limit"]),
        (&json!(0), &json!(5)),
        "{v}"
    );
    let v = srv.get(&format!("/api/v1/strategies/{id}/top"));
    assert_eq!(v["hosts_answered"], 1, "{v}");
    let reset = |key: &str| {
        let id = id.to_string();
        cli::ok(&[
            "key",
            "reset",
            "--store",
            &st.url,
            "--strategy",
            &id,
            "--key",
            key,
        ]);
    };
    let applied = |a: &agent::AgentProc, secs: u64| {
        let log = agent::wait_for(std::time::Duration::from_secs(secs), || {
            let l = a.log_text();
            l.contains("key reset applied").then_some(l)
        });
        assert!(log.is_some(), "{}", a.log_text());
    };
    reset("ip=10.1.2.3,userid=u1");
    applied(&a, 3);
    a.stop_with(15, std::time::Duration::from_secs(5));
    // A reset recorded while no agent runs is applied by the next one
    // (the file remembers the last reset applied).
    reset("ip=10.1.2.4,userid=u2");
    let mut b = agent::AgentProc::start(&st.url, &shm, "h1", &dir.path().join("h1b.log"), &[]);
    applied(&b, 5);
    b.stop_with(15, std::time::Duration::from_secs(5));
}
