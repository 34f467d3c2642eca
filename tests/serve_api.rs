//! `rate-ctl serve` against a real SQLite file and (with
//! RATE_CTL_TEST_MYSQL_URL) a real MariaDB: CRUD and filters, every error
//! class naming its field with nothing written, 409 on a stale version, the
//! token matrix, audit entries with before/after, and the OpenAPI document
//! against the router (routes both ways, examples valid and accepted).
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{query_i64, rt, stores};
use serde_json::{json, Value};
use serve::{http, Serve};

fn sqlx_url(url: &str) -> String {
    match url.strip_prefix("sqlite:") {
        Some(p) => format!("sqlite://{p}"),
        None => url.to_string(),
    }
}

/// (config version, strategies, blacklist, hosts, audit entries) read directly.
fn census(store: &str) -> [i64; 5] {
    let u = sqlx_url(store);
    let q = |sql: &str| rt().block_on(query_i64(&u, sql)).unwrap();
    [
        q("SELECT version FROM config_version WHERE id = 1"),
        q("SELECT COUNT(*) FROM strategies"),
        q("SELECT COUNT(*) FROM blacklist"),
        q("SELECT COUNT(*) FROM hosts"),
        q("SELECT COUNT(*) FROM audit_log"),
    ]
}

/// Sends a request that must fail with `status` naming `field`, and checks
/// that nothing was written.
fn refused(
    s: &Serve,
    store: &str,
    method: &str,
    path: &str,
    body: &str,
    status: u16,
    field: Option<&str>,
) {
    let before = census(store);
    let (got, v) = s.req(method, path, Some(body));
    assert_eq!(got, status, "{method} {path} {body}: {v}");
    assert_eq!(
        v["error"]["field"].as_str(),
        field,
        "{method} {path} {body}: {v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    if let Some(f) = field {
        assert!(msg.starts_with(f), "message names the field: {msg}");
    }
    assert_eq!(
        census(store),
        before,
        "{method} {path} {body}: nothing written"
    );
}

fn strategy(name: &str) -> Value {
    json!({"name": name, "match": {"ip": "::ffff:1.2.3.4", "api": "/pay"},
           "algorithm": "token_bucket", "rate": 100, "burst": 20, "status": 429})
}

#[test]
fn crud_errors_tokens_audit() {
    for st in stores("serve_api") {
        let store = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_with_tokens(store, dir.path(), &["read", "agent"]);
        let tf = dir.path().join("admin.token");
        // The admin token was generated, mode 0600.
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&tf).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(s.token.len() >= 32);

        // ---- CRUD and filters
        let (c, a) = s.req(
            "POST",
            "/api/v1/strategies",
            Some(&strategy("pay-a").to_string()),
        );
        assert_eq!(c, 201, "{a}");
        assert_eq!(a["match"]["ip"], "1.2.3.4", "canonical ip");
        let id_a = a["id"].as_u64().unwrap();
        let mut b = strategy("login-b");
        b["match"] = json!({"userid": "u7"});
        let (c, bb) = s.req("POST", "/api/v1/strategies", Some(&b.to_string()));
        assert_eq!(c, 201, "{bb}");
        let id_b = bb["id"].as_u64().unwrap();
        let names = |q: &str| -> Vec<String> {
            s.get(&format!("/api/v1/strategies{q}"))["strategies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(""), ["pay-a", "login-b"]);
        assert_eq!(names("?dimension=ip&value=::ffff:1.2.3.4"), ["pay-a"]);
        assert_eq!(names("?dimension=userid"), ["login-b"]);
        assert_eq!(names("?value=u7"), ["login-b"]);
        assert_eq!(names("?name=pay"), ["pay-a"]);
        assert!(names("?dimension=ip&value=9.9.9.9").is_empty());
        let got = s.get(&format!("/api/v1/strategies/{id_a}"));
        assert_eq!(got, a);

        let mut put = a.clone();
        put["rate"] = json!(250);
        let (c, p) = s.put_strategy(id_a, &put);
        assert_eq!(c, 200, "{p}");
        assert_eq!(p["rate"], 250);
        assert!(p["version"].as_u64() > a["version"].as_u64());
        assert_eq!(p["created_at"], a["created_at"]);

        // 409: the first edit's version is stale now; nothing written.
        put["rate"] = json!(300);
        refused(
            &s,
            store,
            "PUT",
            &format!("/api/v1/strategies/{id_a}"),
            &put.to_string(),
            409,
            Some("version"),
        );
        refused(
            &s,
            store,
            "PATCH",
            &format!("/api/v1/strategies/{id_a}"),
            &json!({"version": a["version"], "enabled": false}).to_string(),
            409,
            Some("version"),
        );

        let (c, pt) = s.req(
            "PATCH",
            &format!("/api/v1/strategies/{id_a}"),
            Some(&json!({"version": p["version"], "enabled": false, "dry_run": true}).to_string()),
        );
        assert_eq!(c, 200, "{pt}");
        // The status stays: it is what the strategy rejects with again.
        assert_eq!(
            (
                pt["enabled"].clone(),
                pt["action"].clone(),
                pt["status"].clone()
            ),
            (json!(false), json!("dry_run"), json!(429))
        );
        let (c, pt2) = s.req(
            "PATCH",
            &format!("/api/v1/strategies/{id_a}"),
            Some(&json!({"version": pt["version"], "dry_run": false}).to_string()),
        );
        assert_eq!(
            (c, pt2["action"].as_str(), pt2["status"].as_u64()),
            (200, Some("reject"), Some(429))
        );

        // ---- every error class names its field and writes nothing
        let sp = "/api/v1/strategies";
        refused(&s, store, "POST", sp, "{not json", 400, None);
        refused(&s, store, "POST", sp, "[1]", 400, None);
        let with = |k: &str, v: Value| {
            let mut x = strategy("new-one");
            x[k] = v;
            x.to_string()
        };
        // (field set, value, status, field the error names)
        for (k, v, status, field) in [
            ("bogus", json!(1), 400, "bogus"),
            ("id", json!(5), 400, "id"),
            ("rate", json!(0), 422, "rate"),
            ("rate", json!("abc"), 422, "rate"),
            ("algorithm", json!("bogus"), 422, "algorithm"),
            ("per", json!("week"), 422, "per"),
            ("match", json!({"ip": "1.2.3"}), 422, "match.ip"),
            ("match", json!({"Bad-Dim": "x"}), 422, "match.Bad-Dim"),
            ("match", json!({"api": 5}), 422, "match.api"),
            ("status", json!(200), 422, "status"),
            ("action", json!("delay"), 422, "status"),
            ("enabled", json!("yes"), 422, "enabled"),
            ("scope", json!("planet"), 422, "scope"),
            ("name", json!("pay-a"), 422, "name"),
        ] {
            refused(&s, store, "POST", sp, &with(k, v), status, Some(field));
        }
        refused(
            &s,
            store,
            "POST",
            sp,
            &json!({"algorithm": "token_bucket", "rate": 1}).to_string(),
            422,
            Some("name"),
        );
        let mut delay = strategy("d");
        delay["action"] = json!("delay");
        delay["status"] = Value::Null;
        refused(
            &s,
            store,
            "POST",
            sp,
            &delay.to_string(),
            422,
            Some("max_delay_ms"),
        );
        let mut noversion = p.clone();
        noversion.as_object_mut().unwrap().remove("version");
        refused(
            &s,
            store,
            "PUT",
            &format!("{sp}/{id_a}"),
            &noversion.to_string(),
            422,
            Some("version"),
        );
        refused(
            &s,
            store,
            "PUT",
            &format!("{sp}/{id_b}"),
            &p.to_string(),
            422,
            Some("id"),
        );
        let mut x = strategy("x");
        x["version"] = json!(1);
        refused(
            &s,
            store,
            "PUT",
            &format!("{sp}/999"),
            &x.to_string(),
            404,
            None,
        );
        refused(
            &s,
            store,
            "PATCH",
            &format!("{sp}/{id_a}"),
            r#"{"enabled":false}"#,
            422,
            Some("version"),
        );
        refused(
            &s,
            store,
            "PATCH",
            &format!("{sp}/999"),
            r#"{"version":1,"enabled":false}"#,
            404,
            None,
        );
        refused(&s, store, "DELETE", &format!("{sp}/999"), "", 404, None);
        refused(&s, store, "GET", &format!("{sp}/abc"), "", 404, None);
        let bl = "/api/v1/blacklist";
        // (body, status, field the error names)
        for (body, status, field) in [
            (r#"{"dimension":"ip","value":"300.1.1.1"}"#, 422, "value"),
            (r#"{"dimension":"IP","value":"1.1.1.1"}"#, 422, "dimension"),
            (
                r#"{"dimension":"ip","value":"1.1.1.1","expires_at":1000}"#,
                422,
                "expires_at",
            ),
            (
                r#"{"dimension":"ip","value":"1.1.1.1","expires_in_s":5,"expires_at":99999999999999}"#,
                422,
                "expires_in_s",
            ),
            (r#"{"dimension":"ip"}"#, 422, "value"),
            (
                r#"{"dimension":"ip","value":"1.1.1.1","ttl":5}"#,
                400,
                "ttl",
            ),
        ] {
            refused(&s, store, "POST", bl, body, status, Some(field));
        }
        refused(&s, store, "DELETE", &format!("{bl}/999"), "", 404, None);
        refused(
            &s,
            store,
            "PUT",
            "/api/v1/hosts/web-1",
            r#"{"weight":0}"#,
            422,
            Some("weight"),
        );
        refused(
            &s,
            store,
            "PUT",
            "/api/v1/hosts/web-1",
            r#"{}"#,
            422,
            Some("weight"),
        );
        refused(
            &s,
            store,
            "POST",
            "/api/v1/hosts/web-1/report",
            r#"{"counters":[{"id":"x"}]}"#,
            422,
            Some("counters[0].id"),
        );

        // ---- blacklist and hosts
        let (c, e) = s.req("POST", bl, Some(r#"{"dimension":"ip","value":"::ffff:10.0.0.9","expires_in_s":3600,"reason":"abuse"}"#));
        assert_eq!(c, 201, "{e}");
        assert_eq!(e["value"], "10.0.0.9");
        assert!(e["expires_at"].as_u64().unwrap() > e["created_at"].as_u64().unwrap() + 3_590_000);
        assert_eq!(s.get(bl)["entries"].as_array().unwrap().len(), 1);
        let (c, h) = s.req("PUT", "/api/v1/hosts/web-1", Some(r#"{"weight":3}"#));
        assert_eq!(
            (c, h["weight"].as_u64(), h["fresh"].as_bool()),
            (200, Some(3), Some(false)),
            "{h}"
        );

        // ---- tokens: 401 missing/empty/wrong, 403 wrong kind
        let addr = s.addr.as_str();
        let code = |m: &str, p: &str, t: Option<&str>, b: Option<&str>| http(addr, m, p, t, b).0;
        for t in [None, Some(""), Some("wrong"), Some(&s.token[1..])] {
            assert_eq!(code("GET", "/api/v1/version", t, None), 401, "{t:?}");
            assert_eq!(
                code("GET", "/api/v1/snapshot?after=0", t, None),
                401,
                "{t:?}"
            );
        }
        let before = census(store);
        let body = strategy("by-read").to_string();
        assert_eq!(code("POST", sp, Some("read-secret"), Some(&body)), 403);
        assert_eq!(code("POST", sp, Some("agent-secret"), Some(&body)), 403);
        assert_eq!(code("POST", sp, None, Some(&body)), 401);
        assert_eq!(
            code("DELETE", &format!("{sp}/{id_b}"), Some("read-secret"), None),
            403
        );
        assert_eq!(
            code(
                "PUT",
                "/api/v1/hosts/web-1",
                Some("agent-secret"),
                Some(r#"{"weight":5}"#)
            ),
            403
        );
        assert_eq!(
            code(
                "POST",
                "/api/v1/hosts/web-9/report",
                Some("read-secret"),
                Some("{}")
            ),
            403
        );
        assert_eq!(census(store), before, "refused tokens wrote nothing");
        for p in [
            "/api/v1/version",
            "/api/v1/strategies",
            "/api/v1/hosts",
            "/api/v1/audit",
            "/api/v1/blacklist",
        ] {
            assert_eq!(code("GET", p, Some("read-secret"), None), 200, "{p}");
            assert_eq!(code("GET", p, Some("agent-secret"), None), 403, "{p}");
        }
        assert_eq!(
            code(
                "GET",
                "/api/v1/snapshot?after=0",
                Some("agent-secret"),
                None
            ),
            200
        );
        assert_eq!(code("GET", "/api/v1/health", None, None), 200);
        assert_eq!(code("GET", "/api/v1/openapi.json", None, None), 200);
        // The agent token reports; a weight change is audited as "agent".
        let (c, r) = http(
            addr,
            "POST",
            "/api/v1/hosts/web-1/report",
            Some("agent-secret"),
            Some(
                r#"{"weight":2,"applied_version":1,"counters":[{"id":1,"passed":5,"limited":1,"delayed":0}]}"#,
            ),
        );
        assert_eq!(c, 200, "{r}");
        let me = serve::find(&r["hosts"], "host_id", "web-1");
        assert_eq!(
            (
                me["weight"].as_u64(),
                me["fresh"].as_bool(),
                me["applied_version"].as_u64()
            ),
            (Some(2), Some(true), Some(1))
        );

        // ---- delete, then the audit log tells the whole story
        let (c, _) = s.req("DELETE", &format!("{sp}/{id_b}"), None);
        assert_eq!(c, 204);
        assert_eq!(s.req("GET", &format!("{sp}/{id_b}"), None).0, 404);
        let audit = s.get("/api/v1/audit?limit=1000")["entries"]
            .as_array()
            .unwrap()
            .clone();
        let actions: Vec<(String, String, String)> = audit
            .iter()
            .rev()
            .map(|e| {
                (
                    e["token"].as_str().unwrap().into(),
                    e["action"].as_str().unwrap().into(),
                    e["target"].as_str().unwrap().into(),
                )
            })
            .collect();
        let t = |tok: &str, a: &str, tg: String| (tok.to_string(), a.to_string(), tg);
        assert_eq!(
            actions,
            vec![
                t("admin", "strategy.create", format!("strategy/{id_a}")),
                t("admin", "strategy.create", format!("strategy/{id_b}")),
                t("admin", "strategy.update", format!("strategy/{id_a}")),
                t("admin", "strategy.patch", format!("strategy/{id_a}")),
                t("admin", "strategy.patch", format!("strategy/{id_a}")),
                t("admin", "blacklist.add", "blacklist/1".into()),
                t("admin", "host.set_weight", "host/web-1".into()),
                t("agent", "host.set_weight", "host/web-1".into()),
                t("admin", "strategy.delete", format!("strategy/{id_b}")),
            ]
        );
        let upd = &audit[audit.len() - 3];
        assert_eq!(
            (
                upd["before"]["rate"].as_u64(),
                upd["after"]["rate"].as_u64()
            ),
            (Some(100), Some(250))
        );
        assert_eq!(audit[0]["before"]["name"], "login-b");
        assert_eq!(audit[0]["after"], Value::Null);
        assert_eq!(
            (
                audit[1]["before"]["weight"].as_u64(),
                audit[1]["after"]["weight"].as_u64()
            ),
            (Some(3), Some(2))
        );
        let page = s.get(&format!(
            "/api/v1/audit?limit=2&before_id={}",
            audit[0]["id"]
        ))["entries"]
            .clone();
        assert_eq!(page.as_array().unwrap().len(), 2);
        assert_eq!(page[0]["id"], audit[1]["id"]);

        // ---- stats: the reported counters become a series
        let (c, _) = http(
            addr,
            "POST",
            "/api/v1/hosts/web-1/report",
            Some("agent-secret"),
            Some(
                r#"{"applied_version":1,"counters":[{"id":1,"passed":105,"limited":11,"delayed":0}]}"#,
            ),
        );
        assert_eq!(c, 200);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let pts = s.get("/api/v1/stats?strategy=1&seconds=10")["points"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(pts.len(), 10);
        let total: f64 = pts
            .iter()
            .map(|p| p["passed_per_s"].as_f64().unwrap())
            .sum();
        let lim: f64 = pts
            .iter()
            .map(|p| p["limited_per_s"].as_f64().unwrap())
            .sum();
        assert!(
            (total - 100.0).abs() < 1e-6 && (lim - 10.0).abs() < 1e-6,
            "{total} {lim}: {pts:?}"
        );

        // ---- Import of a JSON array: items are numbered like lines; a bad
        // one is named and nothing is written.
        let before = census(store);
        let bad = json!([strategy("arr-1"), {"name": "arr-2", "rate": "fast"}]);
        let (c, e) = s.req("POST", "/api/v1/strategies/import", Some(&bad.to_string()));
        assert_eq!((c, e["error"]["line"].as_u64()), (400, Some(2)), "{e}");
        assert_eq!(census(store), before, "a refused import writes nothing");
        let good = json!([strategy("arr-1"), strategy("arr-2")]);
        let (c, v) = s.req("POST", "/api/v1/strategies/import", Some(&good.to_string()));
        assert_eq!((c, v["imported"].as_u64()), (200, Some(2)), "{v}");
        eprintln!("serve_api {}: ok", st.label);
    }
}

/// (action, status, max_delay_ms) of a strategy as the API shows it.
fn enforcement(v: &Value) -> (String, Value, Value) {
    (
        v["action"].as_str().unwrap_or("?").to_string(),
        v["status"].clone(),
        v["max_delay_ms"].clone(),
    )
}

/// PATCH /strategies/{id} based on the strategy's current version; the
/// answer must be 200.
fn patch(s: &Serve, id: u64, change: Value) -> Value {
    let path = format!("/api/v1/strategies/{id}");
    let mut body = change;
    body["version"] = s.get(&path)["version"].clone();
    let (c, v) = s.req("PATCH", &path, Some(&body.to_string()));
    assert_eq!(c, 200, "PATCH {path} {body}: {v}");
    v
}

/// Dry run round-trips: turning it off gives back exactly the action the
/// strategy enforced before (delay with its cap, reject with its status),
/// also when `serve` restarts in between; asking for the state a strategy
/// is already in changes nothing (and a stale version is still 409).
#[test]
fn dry_run_round_trips_the_enforcing_action() {
    for st in stores("serve_dry_run") {
        let store = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_in(store, dir.path(), &[]);
        let create = |body: Value| -> u64 {
            let (c, v) = s.req("POST", "/api/v1/strategies", Some(&body.to_string()));
            assert_eq!(c, 201, "{v}");
            v["id"].as_u64().unwrap()
        };
        let delay = create(json!({"name": "slow-lane", "match": {"api": "/slow"},
            "algorithm": "leaky_bucket", "rate": 10, "action": "delay", "max_delay_ms": 500}));
        let reject = create(json!({"name": "pay-429", "match": {"api": "/pay"},
            "algorithm": "token_bucket", "rate": 100, "burst": 20, "status": 429}));
        let plain = create(json!({"name": "plain", "match": {"api": "/plain"},
            "algorithm": "fixed_window", "rate": 5, "per": "minute"}));
        let delay_500 = ("delay".to_string(), Value::Null, json!(500));
        let reject_429 = ("reject".to_string(), json!(429), Value::Null);
        let reject_default = ("reject".to_string(), Value::Null, Value::Null);
        let get = |s: &Serve, id: u64| s.get(&format!("/api/v1/strategies/{id}"));

        // A dry_run:false on a strategy that already enforces changes
        // nothing (it used to turn a delay into a plain reject).
        for (id, want) in [(delay, &delay_500), (reject, &reject_429)] {
            let v = patch(&s, id, json!({"dry_run": false}));
            assert_eq!(&enforcement(&v), want, "{v}");
            assert_eq!(&enforcement(&get(&s, id)), want);
        }

        for id in [delay, reject, plain] {
            let v = patch(&s, id, json!({"dry_run": true}));
            assert_eq!(v["action"], "dry_run", "{v}");
            assert_eq!(get(&s, id)["action"], "dry_run");
        }
        // Dry run on a strategy already in dry run keeps what it restores.
        let v = patch(&s, delay, json!({"dry_run": true}));
        let kept = ("dry_run".to_string(), Value::Null, json!(500));
        assert_eq!(enforcement(&v), kept, "{v}");
        // A stale version is refused even when the change is a no-op.
        let stale = json!({"version": v["version"].as_u64().unwrap() - 1, "dry_run": true});
        let before = census(store);
        let (c, e) = s.req(
            "PATCH",
            &format!("/api/v1/strategies/{delay}"),
            Some(&stale.to_string()),
        );
        assert_eq!(
            (c, e["error"]["field"].as_str()),
            (409, Some("version")),
            "{e}"
        );
        assert_eq!(census(store), before, "a refused PATCH writes nothing");

        // Agents get the dry-run strategies as dry_run.
        let snap = s.get("/api/v1/snapshot");
        let published = snap["strategies"].as_array().unwrap();
        assert_eq!(published.len(), 3, "{snap}");
        for x in published {
            assert_eq!(x["action"], "dry_run", "{x}");
        }

        // The enforcing action is in the store, not in serve's memory.
        drop(s);
        let s = Serve::start_in(store, dir.path(), &[]);
        for id in [delay, reject, plain] {
            assert_eq!(get(&s, id)["action"], "dry_run");
        }
        for (id, want) in [
            (delay, &delay_500),
            (reject, &reject_429),
            (plain, &reject_default),
        ] {
            let v = patch(&s, id, json!({"dry_run": false}));
            assert_eq!(&enforcement(&v), want, "PATCH answer: {v}");
            assert_eq!(&enforcement(&get(&s, id)), want, "GET after PATCH");
        }
        // The CLI reading the store directly agrees.
        let shown = cli::json_lines(&cli::ok(&["strategy", "list", "--store", store, "--json"]));
        let by_id = |id: u64| shown.iter().find(|x| x["id"] == id).unwrap();
        assert_eq!(
            (
                by_id(delay)["action"].as_str(),
                by_id(delay)["max_delay_ms"].as_u64()
            ),
            (Some("delay"), Some(500))
        );
        assert_eq!(
            (
                by_id(reject)["action"].as_str(),
                by_id(reject)["status"].as_u64()
            ),
            (Some("reject"), Some(429))
        );

        // A reject strategy toggled through dry run twice still comes back
        // with its status.
        patch(&s, reject, json!({"dry_run": true}));
        patch(&s, reject, json!({"dry_run": true, "enabled": false}));
        let v = patch(&s, reject, json!({"dry_run": false}));
        assert_eq!(enforcement(&v), reject_429, "{v}");
        assert_eq!(v["enabled"], false, "{v}");
    }
}

/// A small JSON Schema check (type, properties, required,
/// additionalProperties, items, enum, minimum/maximum, $ref) — enough for
/// the document's own schemas.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.strip_prefix("#/components/schemas/").unwrap();
        return validate(doc, &doc["components"]["schemas"][name], v, at);
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().map(|x| x.as_str().unwrap()).collect(),
            _ => panic!("bad type at {at}"),
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_u64() || v.is_i64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        });
        if !ok {
            return Err(format!("{at}: {v} is not {types:?}"));
        }
    }
    if let Some(e) = schema["enum"].as_array() {
        if !e.contains(v) {
            return Err(format!("{at}: {v} not in {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_f64(), v.as_f64()) {
        if n < min {
            return Err(format!("{at}: {n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (schema["maximum"].as_f64(), v.as_f64()) {
        if n > max {
            return Err(format!("{at}: {n} > {max}"));
        }
    }
    if let Some(o) = v.as_object() {
        for r in schema["required"].as_array().into_iter().flatten() {
            if !o.contains_key(r.as_str().unwrap()) {
                return Err(format!("{at}: required {r} missing"));
            }
        }
        let props = schema["properties"].as_object();
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(doc, ps, x, &format!("{at}.{k}"))?,
                None => match &schema["additionalProperties"] {
                    Value::Bool(false) => return Err(format!("{at}: unexpected property {k}")),
                    s @ Value::Object(_) => validate(doc, s, x, &format!("{at}.{k}"))?,
                    _ => {}
                },
            }
        }
    }
    // JSON Schema's if/then/else (a field required unless another has a
    // value: `algorithm` and `rate` unless the action is `allow`).
    if let Some(cond) = schema.get("if") {
        let branch = match validate(doc, cond, v, at) {
            Ok(()) => schema.get("then"),
            Err(_) => schema.get("else"),
        };
        if let Some(b) = branch {
            validate(doc, b, v, at)?;
        }
    }
    if let (Some(a), Some(items)) = (v.as_array(), schema.get("items")) {
        for (i, x) in a.iter().enumerate() {
            validate(doc, items, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[test]
fn openapi_matches_the_router() {
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let (c, doc) = http(&s.addr, "GET", "/api/v1/openapi.json", None, None);
    assert_eq!(c, 200);
    assert_eq!(doc["openapi"], "3.1.0");

    // Routes the router serves (as it lists them) == routes the document has.
    let listed = cli::ok(&["serve", "--list-routes"]);
    let mut served: Vec<String> = listed.lines().map(str::to_string).collect();
    let mut documented: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| format!("{} {p}", m.to_uppercase()))
        })
        .collect();
    served.sort();
    documented.sort();
    assert_eq!(served, documented, "router vs openapi.json");
    assert!(served.len() >= 17, "{served:?}");

    // Seed a strategy so that {id} routes find one.
    let (c, created) = s.req(
        "POST",
        "/api/v1/strategies",
        Some(&strategy("seed").to_string()),
    );
    assert_eq!(c, 201, "{created}");

    // Every documented operation is really routed (no 405, no "no route"),
    // example bodies validate against their schemas and are accepted, and
    // the documented success answers match their schemas.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for (name, sc) in schemas {
        if let Some(ex) = sc.get("example") {
            validate(&doc, sc, ex, name).unwrap_or_else(|e| panic!("example of {name}: {e}"));
        }
    }
    let (c, keyed) = s.req(
        "POST",
        "/api/v1/strategies",
        Some(r#"{"name":"seed-keyed","algorithm":"fixed_window","rate":5,"per":"day","each":["ip"]}"#),
    );
    assert_eq!(c, 201, "{keyed}");
    let mut order: Vec<(String, String, Value)> = Vec::new();
    for (p, ops) in doc["paths"].as_object().unwrap() {
        for (m, o) in ops.as_object().unwrap() {
            order.push((m.to_uppercase(), p.clone(), o.clone()));
        }
    }
    // Deletions last, so that the other calls find their objects.
    order.sort_by_key(|(m, _, _)| m == "DELETE");
    for (m, p, o) in order {
        let path = p
            .replace("{id}", &created["id"].to_string())
            .replace("{host_id}", "web-1")
            .replace("{name}", "viewer-1");
        let path = if p.contains("{key}") || p.ends_with("/top") {
            // Issue 33: the key resource needs a per-key strategy.
            p.replace("{id}", &keyed["id"].to_string())
                .replace("{key}", "192.0.2.1")
        } else if p == "/api/v1/stats" {
            format!("{path}?strategy=1&seconds=5")
        } else if p == "/api/v1/snapshot" {
            format!("{path}?after=0")
        } else if p == "/api/v1/blacklist/{id}" {
            path.replace(&format!("/{}", created["id"]), "/1")
        } else {
            path
        };
        let body = o["requestBody"]["content"]["application/json"].clone();
        let mut req_body = None;
        if !body.is_null() {
            let ex = body["example"].clone();
            validate(&doc, &body["schema"], &ex, &format!("{m} {p} example"))
                .unwrap_or_else(|e| panic!("{e}"));
            let mut ex = ex;
            if m == "PUT" || m == "PATCH" {
                // Edits must be based on the current version.
                let cur = s.get(&format!("/api/v1/strategies/{}", created["id"]));
                if ex.get("version").is_some() {
                    ex["version"] = cur["version"].clone();
                }
            }
            req_body = Some(ex.to_string());
        }
        let (c, v) = s.req(&m, &path, req_body.as_deref());
        assert!(c < 300, "{m} {path} with the documented example: {c} {v}");
        let resp = &o["responses"][c.to_string()];
        assert!(resp.is_object(), "{m} {p}: status {c} is documented");
        if let Some(sc) = resp["content"]["application/json"]["schema"].as_object() {
            validate(
                &doc,
                &Value::Object(sc.clone()),
                &v,
                &format!("{m} {p} answer"),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    // An undocumented route answers 404 "no route", a wrong method 405.
    let (c, v) = s.req("GET", "/api/v1/nothing", None);
    assert_eq!(c, 404);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("no route"));
    assert_eq!(s.req("DELETE", "/api/v1/version", None).0, 405);
    // The page and its assets are served from the binary.
    let (c, page) = serve::http_raw(&s.addr, "GET", "/", None, None);
    assert_eq!(c, 200);
    assert!(String::from_utf8_lossy(&page).contains("<html"));
    assert_eq!(
        serve::http_raw(&s.addr, "GET", "/index.html", None, None).0,
        200
    );
    assert_eq!(
        serve::http_raw(&s.addr, "GET", "/missing.js", None, None).0,
        404
    );
}

/// `warm_up`: the period and the cold factor are validated (each message
/// naming its field, nothing written), stored, served and exported.
#[test]
fn warm_up_fields_validate_and_round_trip() {
    for st in stores("serve_api_warm_up") {
        let store = st.url.as_str();
        let s = Serve::start_temp(store, &[]);
        let sp = "/api/v1/strategies";
        let body = |extra: Value| {
            let mut v = json!({"name": "search", "match": {"api": "/search"},
                               "algorithm": "warm_up", "rate": 100});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v.to_string()
        };
        for (extra, field) in [
            (json!({}), "warm_up_ms"),
            (json!({"warm_up_ms": 999}), "warm_up_ms"),
            (json!({"warm_up_ms": 3_600_001}), "warm_up_ms"),
            (
                json!({"warm_up_ms": 30_000, "cold_factor": 1}),
                "cold_factor",
            ),
            (
                json!({"warm_up_ms": 30_000, "cold_factor": 11}),
                "cold_factor",
            ),
            (
                json!({"warm_up_ms": 30_000, "cold_factor": 300}),
                "cold_factor",
            ),
            (
                json!({"algorithm": "token_bucket", "warm_up_ms": 30_000}),
                "warm_up_ms",
            ),
            (
                json!({"algorithm": "token_bucket", "cold_factor": 3}),
                "cold_factor",
            ),
        ] {
            refused(&s, store, "POST", sp, &body(extra), 422, Some(field));
        }
        let (c, v) = s.req("POST", sp, Some(&body(json!({"warm_up_ms": 30_000}))));
        assert_eq!(c, 201, "{v}");
        let id = v["id"].as_u64().unwrap();
        let (c, v) = s.req("GET", &format!("{sp}/{id}"), None);
        assert_eq!(c, 200, "{v}");
        assert_eq!(v["algorithm"], "warm_up");
        assert_eq!(v["warm_up_ms"], 30_000);
        assert_eq!(v["cold_factor"], 3, "the default is stored: {v}");
        assert_eq!(v["burst"], 1);
        // A delay action is accepted on warm_up.
        let (c, v) = s.req(
            "POST",
            sp,
            Some(
                &json!({"name": "cold-delay", "algorithm": "warm_up", "rate": 10,
                         "warm_up_ms": 2_000, "cold_factor": 10, "action": "delay",
                         "max_delay_ms": 500})
                .to_string(),
            ),
        );
        assert_eq!(c, 201, "{v}");
        let (c, v) = s.req("GET", sp, None);
        assert_eq!(c, 200, "{v}");
        let listed = v["strategies"].as_array().unwrap();
        assert!(listed
            .iter()
            .any(|x| x["name"] == "cold-delay" && x["cold_factor"] == 10));
        // Non-warm-up strategies show the fields as null.
        let (_, v) = s.req("POST", sp, Some(&strategy("pay").to_string()));
        let (_, v) = s.req("GET", &format!("{sp}/{}", v["id"]), None);
        assert!(
            v["warm_up_ms"].is_null() && v["cold_factor"].is_null(),
            "{v}"
        );
    }
}

/// Issue 14 over the API: networks are stored canonical, `allow` takes no
/// rate fields, `priority` has a range; every refusal names its field and
/// writes nothing.
#[test]
fn ranges_allow_and_priority_over_the_api() {
    let st = &stores("serve_ranges")[0];
    let s = Serve::start_temp(&st.url, &[]);
    let post = |body: Value| s.req("POST", "/api/v1/strategies", Some(&body.to_string()));
    let (c, v) = post(
        json!({"name": "clients", "match": {"ip": "::ffff:10.0.0.0/104"},
        "algorithm": "token_bucket", "rate": 10}),
    );
    assert_eq!(c, 201, "{v}");
    assert_eq!(
        (v["match"]["ip"].clone(), v["priority"].clone()),
        (json!("10.0.0.0/8"), json!(0))
    );
    let (c, v) =
        post(json!({"name": "office", "match": {"ip": "198.51.100.0/24"}, "action": "allow"}));
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["action"], "allow");
    let office = v["id"].as_u64().unwrap();
    let (c, v) = post(
        json!({"name": "vip", "match": {"userid": "vip"}, "algorithm": "token_bucket",
        "rate": 1000, "priority": 10}),
    );
    assert_eq!((c, v["priority"].clone()), (201, json!(10)), "{v}");
    let version = s.get("/api/v1/version");
    for (body, field, says) in [
        (
            json!({"name": "x", "match": {"ip": "10.0.0.1/8"}, "algorithm": "token_bucket", "rate": 1}),
            "match.ip",
            "the network is 10.0.0.0/8",
        ),
        (
            json!({"name": "x", "match": {"ip": "10.0.0.0/40"}, "algorithm": "token_bucket", "rate": 1}),
            "match.ip",
            "prefix length \"40\"",
        ),
        (
            json!({"name": "x", "algorithm": "token_bucket", "rate": 1, "priority": 1001}),
            "priority",
            "between -1000 and 1000",
        ),
        (
            json!({"name": "x", "algorithm": "token_bucket", "rate": 1, "priority": "high"}),
            "priority",
            "whole number",
        ),
        (
            json!({"name": "x", "action": "allow", "rate": 5}),
            "rate",
            "allow",
        ),
        (
            json!({"name": "x", "action": "allow", "status": 429}),
            "status",
            "allow",
        ),
        (
            json!({"name": "x", "action": "allow", "max_delay_ms": 5}),
            "max_delay_ms",
            "allow",
        ),
        (
            json!({"name": "x", "algorithm": "token_bucket"}),
            "rate",
            "required",
        ),
    ] {
        let (c, v) = post(body.clone());
        assert_eq!(c, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.starts_with(field) && m.contains(says), "{body}: {m}");
    }
    // Dry run of an allow: nothing to rehearse.
    let path = format!("/api/v1/strategies/{office}");
    let body = json!({"version": s.get(&path)["version"], "dry_run": true});
    let (c, v) = s.req("PATCH", &path, Some(&body.to_string()));
    assert_eq!(
        (c, v["error"]["field"].clone()),
        (422, json!("dry_run")),
        "{v}"
    );
    assert_eq!(s.get("/api/v1/version"), version, "nothing written");
    // Blacklist networks.
    let (c, v) = s.req(
        "POST",
        "/api/v1/blacklist",
        Some(&json!({"dimension": "ip", "value": "203.0.113.0/24"}).to_string()),
    );
    assert_eq!(
        (c, v["value"].clone()),
        (201, json!("203.0.113.0/24")),
        "{v}"
    );
    let (c, v) = s.req(
        "POST",
        "/api/v1/blacklist",
        Some(&json!({"dimension": "ip", "value": "203.0.113.1/24"}).to_string()),
    );
    assert_eq!(
        (c, v["error"]["field"].clone()),
        (422, json!("value")),
        "{v}"
    );
}
