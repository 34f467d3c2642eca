//! Per-key strategies through the interfaces: the CLI (`--each`,
//! `--ipv4-prefix`, `--ipv6-prefix`, `--on-full` on add and update), the
//! store (migration 6) with export/import, and the REST API (JSON fields,
//! validation naming the field).

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{
    add_refused, add_strategy, ok, rate_ctl, refused, reimport, stores, strategy_rows as rows,
    update_strategy as update,
};
use serde_json::{json, Value};

#[test]
fn per_key_fields_round_trip_through_the_cli_and_the_store() {
    for st in stores("per_key_cli") {
        let s = st.url.as_str();
        add_strategy(
            s,
            "login",
            "token_bucket",
            "5",
            &[
                "--per",
                "minute",
                "--burst",
                "5",
                "--match",
                "api=/login",
                "--each",
                "ip",
                "--ipv6-prefix",
                "56",
            ],
        );
        let r = &rows(s)[0];
        assert_eq!(r["each"], json!(["ip"]), "{r}");
        assert_eq!(r["ipv4_prefix"], 32, "defaults filled in: {r}");
        assert_eq!(r["ipv6_prefix"], 56);
        assert_eq!(r["on_full"], "overflow");
        let list = ok(&["strategy", "list", "--store", s]);
        assert!(list.contains("api=/login each=ip ipv6_prefix=56"), "{list}");
        let id = r["id"].to_string();
        update(
            s,
            &id,
            &["--each", "userid", "--each", "api", "--on-full", "reject"],
        );
        let r = &rows(s)[0];
        assert_eq!(r["each"], json!(["userid", "api"]));
        assert_eq!(r["on_full"], "reject");
        // Export, remove, import: the fields come back.
        reimport(s, &id, r#""each":["userid","api"]"#);
        let r = &rows(s)[0];
        assert_eq!(
            (&r["each"], &r["ipv6_prefix"], &r["on_full"]),
            (&json!(["userid", "api"]), &json!(56), &json!("reject"))
        );
        // Back to one shared limit.
        let id = r["id"].to_string();
        update(s, &id, &["--no-each"]);
        let r = &rows(s)[0];
        assert!(r.get("each").is_none() && r.get("on_full").is_none(), "{r}");
    }
}

#[test]
fn bad_per_key_arguments_name_the_flag_and_store_nothing() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    for (extra, flag) in [
        (
            &["--each", "ip", "--algorithm", "warm_up", "--warm-up", "30s"][..],
            "--each",
        ),
        (&["--each", "Bad"][..], "--each"),
        (
            &[
                "--each", "a", "--each", "b", "--each", "c", "--each", "d", "--each", "e",
            ][..],
            "--each",
        ),
        (
            &["--each", "ip", "--ipv4-prefix", "33"][..],
            "--ipv4-prefix",
        ),
        (&["--each", "ip", "--ipv6-prefix", "0"][..], "--ipv6-prefix"),
        (&["--ipv6-prefix", "48"][..], "--ipv6-prefix"),
        (&["--on-full", "reject"][..], "--on-full"),
        (&["--each", "ip", "--on-full", "drop"][..], "--on-full"),
    ] {
        let tb: &[&str] = if extra.contains(&"--algorithm") {
            &[]
        } else {
            &["--algorithm", "token_bucket"]
        };
        add_refused(s, &[tb, extra].concat(), flag);
    }
    assert!(rows(s).is_empty());
}

#[test]
fn the_api_takes_and_shows_the_per_key_fields() {
    let st = cli::sqlite_store();
    let srv = serve::Serve::start_temp(&st.url, &[]);
    let body = json!({"name": "per-user", "match": {"api": "/pay"}, "algorithm": "fixed_window",
                      "rate": 10, "per": "minute", "each": ["userid"], "on_full": "allow"});
    srv.post_strategy(&body);
    let list = srv.get("/api/v1/strategies");
    let s = &list["strategies"][0];
    assert_eq!(s["each"], json!(["userid"]), "{s}");
    assert_eq!(s["ipv4_prefix"], 32);
    assert_eq!(s["ipv6_prefix"], 64);
    assert_eq!(s["on_full"], "allow");
    for (bad, field) in [
        (json!({"each": ["ip", "ip"]}), "each"),
        (json!({"each": "ip"}), "each"),
        (json!({"each": ["ip"], "ipv6_prefix": 129}), "ipv6_prefix"),
        (json!({"on_full": "allow"}), "on_full"),
        (
            json!({"each": ["ip"], "algorithm": "sliding_window", "rate": 2000000}),
            "rate",
        ),
    ] {
        srv.strategy_refused(&bad, field);
    }
    assert_eq!(
        srv.get("/api/v1/strategies")["strategies"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// `allow` limits nothing, so it has no key (`each`) and no rate to lease
/// (`split: demand`): refused by the CLI, the API and an import line, each
/// naming the field, and nothing is stored.
#[test]
fn allow_refuses_each_and_demand_split_naming_the_field() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    // `strategy add --action allow` with `extra` fails naming `flag`.
    let add_allow = |extra: &[&str], flag: &str| {
        let mut args = vec!["strategy", "add", "--store", s];
        args.extend_from_slice(&["--name", "ok", "--action", "allow"]);
        args.extend_from_slice(extra);
        refused(&args, flag);
    };
    add_allow(&["--each", "ip"], "--each");
    add_allow(&["--each", "ip", "--ipv4-prefix", "24"], "--each");
    add_allow(&["--each", "ip", "--on-full", "reject"], "--each");
    add_allow(&["--ipv6-prefix", "48"], "--ipv6-prefix");
    add_allow(&["--split", "demand"], "--split");
    // An existing per-key limit cannot become an allow while it keeps `each`.
    ok(&[
        "strategy",
        "add",
        "--store",
        s,
        "--name",
        "per-ip",
        "--algorithm",
        "fixed_window",
        "--rate",
        "5",
        "--each",
        "ip",
    ]);
    refused(
        &["strategy", "update", "1", "--store", s, "--action", "allow"],
        "--each",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.jsonl");
    std::fs::write(
        &file,
        // As POST takes an allow (no rate fields), then as `strategy
        // export` writes one (the placeholder rate).
        "{\"name\":\"a\",\"action\":\"allow\"}\n\
         {\"name\":\"b\",\"action\":\"allow\",\"algorithm\":\"fixed_window\",\"rate\":1,\"each\":[\"ip\"]}\n",
    )
    .unwrap();
    let o = rate_ctl(&["strategy", "import", "--store", s, file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("line 2") && err.contains("each"),
        "{err}"
    );
    assert_eq!(rows(s).len(), 1, "only the per-ip limit");

    let srv = serve::Serve::start_in(&st.url, dir.path(), &[]);
    for (bad, field) in [
        (json!({"each": ["ip"]}), "each"),
        (json!({"each": ["ip", "api"], "ipv4_prefix": 16}), "each"),
        (json!({"split": "demand"}), "split"),
    ] {
        let mut b = json!({"name": "bad", "action": "allow", "match": {"ip": "10.0.0.0/8"}});
        for (k, v) in bad.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (code, v) = srv.req("POST", "/api/v1/strategies", Some(&b.to_string()));
        assert_eq!(code, 422, "{b}: {v}");
        assert_eq!(v["error"]["field"], field, "{b}: {v}");
        let fine = json!({"name": "fine", "action": "allow"});
        let line = format!("{fine}\n{b}\n");
        let (code, v) = srv.req("POST", "/api/v1/strategies/import", Some(&line));
        assert!((400..500).contains(&code), "{b}: {v}");
        assert_eq!(
            (v["error"]["line"].clone(), v["error"]["field"].clone()),
            (json!(2), json!(field)),
            "{v}"
        );
    }
    // The same allow line alone imports (no rate fields, as POST takes it).
    let fine = json!({"name": "fine", "action": "allow", "match": {"ip": "10.0.0.0/8"}});
    let (code, v) = srv.req(
        "POST",
        "/api/v1/strategies/import",
        Some(&format!("{fine}\n")),
    );
    assert_eq!(code, 200, "{v}");
    let list = srv.get("/api/v1/strategies");
    let f = serve::find(&list["strategies"], "name", "fine");
    assert_eq!(
        (&f["action"], &f["each"]),
        (&json!("allow"), &json!([])),
        "{f}"
    );
    assert_eq!(
        srv.get("/api/v1/strategies")["strategies"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "the per-ip limit and the allow imported alone"
    );
}

#[test]
fn on_full_allow_is_warned_about_when_stored() {
    let st = &stores("on_full_allow")[0];
    let s = st.url.as_str();
    let warning = "--on-full allow: once the key table is full, every new key";
    let base = [
        "strategy",
        "add",
        "--store",
        s,
        "--name",
        "a",
        "--algorithm",
        "token_bucket",
        "--rate",
        "5",
        "--match",
        "api=/a",
        "--each",
        "ip",
    ];
    let o = rate_ctl(&base);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains(warning), "no warning without allow: {err}");
    let mut args = base.to_vec();
    args.extend(["--on-full", "allow"]);
    args[5] = "b";
    let o = rate_ctl(&args);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(warning), "{err}");
    let id = rows(s)[0]["id"].to_string();
    let o = rate_ctl(&[
        "strategy",
        "update",
        &id,
        "--store",
        s,
        "--on-full",
        "allow",
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(warning));
    let help = ok(&["strategy", "add", "--help"]);
    assert!(help.contains("allow lifts the limit"), "{help}");
}

/// `--max-keys` / `max_keys` (issue 28, migration 128): through the CLI
/// (add, update, list, export and import), the store and the API; 0,
/// above 2^31 and without `each` are refused naming the field.
#[test]
fn max_keys_round_trips_through_the_cli_the_store_and_the_api() {
    for st in stores("max_keys_cli") {
        let s = st.url.as_str();
        add_strategy(
            s,
            "flooded",
            "fixed_window",
            "5",
            &["--match", "api=/q", "--each", "ip", "--max-keys", "100"],
        );
        let r = &rows(s)[0];
        assert_eq!(r["max_keys"], 100, "{r}");
        let list = ok(&["strategy", "list", "--store", s]);
        assert!(list.contains("each=ip max_keys=100"), "{list}");
        let id = r["id"].to_string();
        update(s, &id, &["--max-keys", "3"]);
        assert_eq!(rows(s)[0]["max_keys"], 3);
        update(s, &id, &["--on-full", "reject"]);
        assert_eq!(rows(s)[0]["max_keys"], 3, "kept by an update without it");
        reimport(s, &id, r#""max_keys":3"#);
        let r = &rows(s)[0];
        assert_eq!(r["max_keys"], 3, "{r}");
        let id = r["id"].to_string();
        update(s, &id, &["--no-each"]);
        assert!(rows(s)[0].get("max_keys").is_none(), "cleared with each");
    }
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    for extra in [
        &["--each", "ip", "--max-keys", "0"][..],
        &["--each", "ip", "--max-keys", "2147483649"][..],
        &["--max-keys", "10"][..],
    ] {
        add_refused(
            s,
            &[&["--algorithm", "token_bucket"], extra].concat(),
            "--max-keys",
        );
    }
    assert!(rows(s).is_empty());

    let srv = serve::Serve::start_temp(&st.url, &[]);
    let body = json!({"name": "capped", "match": {"api": "/q"}, "algorithm": "fixed_window",
                      "rate": 10, "per": "minute", "each": ["ip"], "max_keys": 3});
    srv.post_strategy(&body);
    let body = json!({"name": "uncapped", "match": {"api": "/r"}, "algorithm": "fixed_window",
                      "rate": 10, "per": "minute", "each": ["ip"]});
    srv.post_strategy(&body);
    let list = srv.get("/api/v1/strategies");
    let by_name = |n: &str| {
        list["strategies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("capped")["max_keys"], 3, "{list}");
    assert_eq!(by_name("uncapped")["max_keys"], Value::Null, "{list}");
    for bad in [
        json!({"each": ["ip"], "max_keys": 0}),
        json!({"each": ["ip"], "max_keys": 3_000_000_000u64}),
        json!({"max_keys": 5}),
    ] {
        srv.strategy_refused(&bad, "max_keys");
    }
}
