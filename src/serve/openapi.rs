//! The OpenAPI 3.1 document of `/api/v1` (served at
//! `/api/v1/openapi.json`). tests/serve_api.rs checks that its paths are
//! exactly the router's and that its examples validate and are accepted.

use serde_json::{json, Value};

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn nullable(t: &str) -> Value {
    json!({"type": [t, "null"]})
}

/// A JSON response with a schema (and an example when given).
fn answer(desc: &str, schema: Value) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": schema}}})
}

fn error(desc: &str) -> Value {
    answer(desc, schema_ref("Error"))
}

fn body(schema: Value, example: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema, "example": example}}})
}

fn id_param(name: &str, t: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": t}})
}

fn query(name: &str, t: &str, desc: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": {"type": t}, "description": desc})
}

/// Operation: summary, parameters, request body, responses; `auth` false
/// for the two open endpoints.
fn op(
    summary: &str,
    params: Vec<Value>,
    req: Option<Value>,
    mut responses: Value,
    auth: bool,
) -> Value {
    let r = responses.as_object_mut().expect("object");
    if auth {
        r.insert("401".into(), error("missing, empty or unknown token"));
        r.insert(
            "403".into(),
            error("this token kind may not use this endpoint"),
        );
    }
    let mut o = json!({"summary": summary, "parameters": params, "responses": responses});
    if let Some(b) = req {
        o["requestBody"] = b;
    }
    if !auth {
        o["security"] = json!([]);
    }
    o
}

pub fn strategy_example() -> Value {
    json!({"name": "pay-u1024", "match": {"ip": "1.2.3.4", "userid": "u1024", "api": "/pay"},
           "algorithm": "token_bucket", "rate": 100, "per": "second", "burst": 20,
           "action": "reject", "status": 429, "max_delay_ms": null, "enabled": true,
           "scope": "cluster"})
}

fn import_example() -> Value {
    json!({"name": "search-default", "match": {"api": "/search"}, "algorithm": "sliding_window",
           "rate": 600, "per": "minute", "scope": "host"})
}

fn schemas() -> Value {
    let strategy_fields = json!({
        "name": {"type": "string", "description": "unique, 1 to 200 bytes"},
        "match": {"type": "object", "additionalProperties": {"type": "string"},
                  "description": "conditions, all must hold; {} matches every request. The key is the dimension, followed by an operator character: none exact bytes ({\"api\": \"/login\"}); ^ a non-empty prefix ({\"api^\": \"/api/v1/\"}); ~ a path template ({\"api~\": \"/users/*/orders\"}: * one non-empty segment, a last /** any rest including none, \\* a literal *, \\\\ a literal \\); ! negation ({\"userid!\": \"admin\"}: every request whose value differs, an absent value included; a strategy of only negations matches every other request). One condition per dimension. ip: an address or a network (10.0.0.0/8, 2001:db8::/32; host bits set are refused), = only",
                  "example": {"api^": "/api/v1/", "userid!": "admin"}},
        "algorithm": {"type": "string", "enum": ["fixed_window", "sliding_window", "token_bucket", "leaky_bucket", "concurrency", "warm_up"]},
        "rate": {"type": "integer", "minimum": 1},
        "per": {"type": "string", "enum": ["second", "minute", "hour", "day"], "default": "second"},
        "burst": {"type": "integer", "minimum": 1, "default": 1},
        "action": {"type": "string", "enum": ["reject", "delay", "dry_run", "allow"], "default": "reject",
                   "description": "allow: pass unlimited (no algorithm, rate, per, burst, status, max_delay_ms, warm_up_ms, cold_factor with it)"},
        "status": {"type": ["integer", "null"], "minimum": 400, "maximum": 599,
                   "description": "reject: its status, null = the location's rate_ctl_status (503); dry_run: the status it rejects with again when dry run ends"},
        "max_delay_ms": {"type": ["integer", "null"], "minimum": 1,
                         "description": "required for delay; dry_run: set = it delays again with this cap when dry run ends (not together with status)"},
        "enabled": {"type": "boolean", "default": true},
        "scope": {"type": "string", "enum": ["cluster", "host"], "default": "cluster"},
        "warm_up_ms": {"type": ["integer", "null"], "minimum": 1000, "maximum": 3600000,
                       "description": "warm_up only (required there): time a saturated strategy takes from cold to the full rate"},
        "cold_factor": {"type": ["integer", "null"], "minimum": 2, "maximum": 10,
                        "description": "warm_up only: the interval between admissions when cold is cold_factor × 1/rate (default 3)"},
        "priority": {"type": "integer", "minimum": -1000, "maximum": 1000, "default": 0,
                     "description": "only the matched strategies at the highest priority present apply; there an allow wins"},
        "each": {"type": "array", "items": {"type": "string"}, "maxItems": 4, "default": [],
                 "description": "per-key: one limiter state per distinct value tuple of these dimensions (e.g. [\"ip\"]: per client address); a request with an empty value is not counted; not for warm_up"},
        "ipv4_prefix": {"type": ["integer", "null"], "minimum": 1, "maximum": 32,
                        "description": "per-key only: IPv4 client addresses are aggregated to this prefix (default 32)"},
        "ipv6_prefix": {"type": ["integer", "null"], "minimum": 1, "maximum": 128,
                        "description": "per-key only: IPv6 client addresses are aggregated to this prefix (default 64; IPv4-mapped IPv6 counts as IPv4)"},
        "on_full": {"type": ["string", "null"], "enum": ["overflow", "reject", "allow", null],
                    "description": "per-key only: a new key when its part of the key table is full: overflow (default; charged against one shared limiter at the strategy's rate), reject or allow"},
        "split": {"type": "string", "enum": ["static", "demand"],
                  "description": "cluster only: static = rate × weight / Σ weights of fresh hosts; demand = leases from the fleet leader by each host's demand (README, Fleet leases). Default: demand for cluster scope, static for host scope and allow (a strategy stored before the split existed stays static)"},
        "max_keys": {"type": ["integer", "null"], "minimum": 1, "maximum": 2147483648u64,
                     "description": "per-key only: most key-table entries this strategy's keys may hold; past it a new key of this strategy gets its on_full while other strategies' new keys still get entries (null: half of the agent's key table)"},
        "ban_after": {"type": ["integer", "null"], "minimum": 1, "maximum": 1000000,
                      "description": "penalty box (issue 32): after this many rejections of one key within ban_within seconds the key is banned for ban_for seconds on every host (a blacklist entry with source ban); each ip or each userid only; all three or none"},
        "ban_within": {"type": ["integer", "null"], "minimum": 1, "maximum": 2592000,
                       "description": "penalty box: the window the rejections are counted in, seconds (1 s … 30 days)"},
        "ban_for": {"type": ["integer", "null"], "minimum": 1, "maximum": 2592000,
                    "description": "penalty box: how long a key is banned, seconds (1 s … 30 days)"},
    });
    // algorithm and rate are required unless the action is allow.
    let rate_required = json!({
        "if": {"properties": {"action": {"const": "allow"}}, "required": ["action"]},
        "else": {"required": ["algorithm", "rate"]}});
    // Issue 31: limits that look at the response and at cost.
    let mut strategy_fields = strategy_fields;
    for (k, v) in [
        (
            "count_if",
            json!({"type": ["string", "null"], "maxLength": 200,
            "description": "charge the request only if its final status is in this list of codes and classes (\"401,403\", \"4xx\", \"429,5xx\"; a leading \"status=\" is dropped): checked and counted at admission, given back when it ends with another status. Not for concurrency and warm_up"}),
        ),
        (
            "cost_from",
            json!({"type": ["string", "null"], "maxLength": 32,
            "description": "dimension whose integer value (1 … 1,000,000) is the request's cost; absent or invalid: 1. A request whose cost exceeds what is left is refused whole"}),
        ),
        (
            "cost_after",
            json!({"type": ["string", "null"], "maxLength": 32,
            "description": "dimension read when the request ends (e.g. $upstream_http_x_cost): its integer value is the final cost; the difference with what was charged up front is charged then (a bucket may go into debt) or given back"}),
        ),
        // Issue 33: calendar windows.
        (
            "per",
            json!({"type": "string", "enum": ["second", "minute", "hour", "day", "week", "month"], "default": "second",
            "description": "week (from Monday 00:00) and month (from the 1st 00:00): fixed_window only, in the zone of tz"}),
        ),
        (
            "tz",
            json!({"type": ["string", "null"], "maxLength": 64, "example": "Pacific/Auckland",
            "description": "IANA time zone (AREA/CITY) whose local days, weeks and months a fixed_window with per day, week or month counts in, DST included (a local day may last 23 or 25 hours); null: UTC. An unknown zone is refused (400 naming tz)"}),
        ),
    ] {
        strategy_fields
            .as_object_mut()
            .expect("object")
            .insert(k.into(), v);
    }
    let mut strategy = strategy_fields.clone();
    let o = strategy.as_object_mut().expect("object");
    o.insert("id".into(), json!({"type": "integer"}));
    o.insert(
        "version".into(),
        json!({"type": "integer", "description": "config version of the last change"}),
    );
    o.insert(
        "created_at".into(),
        json!({"type": "integer", "description": "Unix ms"}),
    );
    o.insert(
        "updated_at".into(),
        json!({"type": "integer", "description": "Unix ms"}),
    );
    // An import line: the export format (`rate-ctl strategy export`, with
    // created_ms/updated_ms) or the API's Strategy (created_at/updated_at).
    let mut import_item = strategy.clone();
    for k in ["created_ms", "updated_ms"] {
        import_item.as_object_mut().expect("object").insert(
            k.into(),
            json!({"type": "integer", "description": "Unix ms; ignored"}),
        );
    }
    import_item["id"]["description"] =
        json!("replaces (or is stored under) this id; without it a new id is assigned");
    let mut put = strategy.clone();
    put["version"]["description"] = json!("the version this edit is based on (409 if stale)");
    let mut example = strategy_example();
    for (k, v) in [
        ("id", json!(7)),
        ("version", json!(41)),
        ("created_at", json!(1763800000000u64)),
        ("updated_at", json!(1763800000000u64)),
        ("warm_up_ms", json!(null)),
        ("cold_factor", json!(null)),
        ("priority", json!(0)),
        ("each", json!([])),
        ("ipv4_prefix", json!(null)),
        ("ipv6_prefix", json!(null)),
        ("on_full", json!(null)),
        ("split", json!("demand")),
        ("count_if", json!(null)),
        ("cost_from", json!(null)),
        ("cost_after", json!(null)),
        ("max_keys", json!(null)),
        ("tz", json!(null)),
        ("ban_after", json!(null)),
        ("ban_within", json!(null)),
        ("ban_for", json!(null)),
    ] {
        example[k] = v;
    }
    let host = json!({"type": "object", "additionalProperties": false,
        "required": ["host_id", "weight", "last_heartbeat", "applied_version", "applied_at", "lag", "fresh",
                     "publish_error", "publish_error_at"],
        "properties": {"host_id": {"type": "string"}, "weight": {"type": "integer"},
            "last_heartbeat": nullable("integer"), "applied_version": nullable("integer"),
            "applied_at": nullable("integer"), "lag": nullable("integer"), "fresh": {"type": "boolean"},
            "publish_error": {"type": ["string", "null"], "maxLength": 1000,
                "description": "The agent's last publish refusal (the table it was sent does not fit its file, ...); null once a publish succeeded."},
            "publish_error_at": nullable("integer"),
            "leases": {"type": "array", "description": "Leases of split: demand strategies (none for other hosts' answers of a report)",
                "items": {"type": "object", "additionalProperties": false,
                    "required": ["strategy", "rate", "demand", "age_ms", "expires", "epoch", "applied_rate", "applied_epoch"],
                    "properties": {"strategy": {"type": "integer"},
                        "rate": {"type": "integer", "description": "leased local rate (windows: count for the current window)"},
                        "demand": {"type": "number", "description": "smoothed demand, requests per second"},
                        "age_ms": {"type": "integer", "description": "since the leader granted or renewed it"},
                        "expires": {"type": "integer", "description": "Unix ms; the host falls back to the static split after it"},
                        "epoch": {"type": "integer"}, "applied_rate": nullable("integer"), "applied_epoch": nullable("integer")}}}},
        "example": {"host_id": "web-1", "weight": 2, "last_heartbeat": 1763800000000u64, "applied_version": 40,
                    "applied_at": 1763800000000u64, "lag": 1, "fresh": true,
                    "publish_error": null, "publish_error_at": null}});
    let entry = json!({"type": "object", "additionalProperties": false,
        "required": ["id", "dimension", "value", "expires_at", "reason", "created_at", "source"],
        "properties": {"id": {"type": "integer"}, "dimension": {"type": "string"}, "value": {"type": "string"},
            "expires_at": nullable("integer"), "reason": {"type": "string"}, "created_at": {"type": "integer"},
            "source": {"enum": ["manual", "ban"],
                       "description": "manual: an operator's entry; ban: raised by a strategy's penalty box (issue 32), written by the agent of the host that banned"}},
        "example": {"id": 3, "dimension": "ip", "value": "10.0.0.9", "expires_at": 1763900000000u64,
                    "reason": "abuse", "created_at": 1763800000000u64, "source": "manual"}});
    let all: Vec<&str> = strategy
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    json!({
        "Error": {"type": "object", "additionalProperties": false, "required": ["error"],
            "properties": {"error": {"type": "object", "additionalProperties": false, "required": ["field", "message"],
                "properties": {"field": nullable("string"), "message": {"type": "string"},
                    "line": {"type": "integer", "description": "import only: the 1-based line (or array item) at fault"}}}},
            "example": {"error": {"field": "rate", "message": "rate: must be greater than 0"}}},
        "StrategyInput": {"type": "object", "additionalProperties": false,
            "required": ["name"], "properties": strategy_fields,
            "if": rate_required["if"], "else": rate_required["else"],
            "example": strategy_example()},
        "StrategyPut": {"type": "object", "additionalProperties": false,
            "required": ["name", "version"], "properties": put,
            "if": rate_required["if"], "else": rate_required["else"],
            "example": example.clone()},
        "Strategy": {"type": "object", "additionalProperties": false, "required": all,
            "properties": strategy, "example": example},
        "StrategyImport": {"type": "object", "additionalProperties": false,
            "required": ["name", "algorithm", "rate"], "properties": import_item,
            "example": import_example()},
        "ImportAnswer": {"type": "object", "additionalProperties": false, "required": ["imported", "version"],
            "properties": {"imported": {"type": "integer"}, "version": {"type": "integer"}},
            "example": {"imported": 1, "version": 42}},
        "StrategyPatch": {"type": "object", "additionalProperties": false, "required": ["version"],
            "properties": {"version": {"type": "integer"}, "enabled": {"type": "boolean"},
                "dry_run": {"type": "boolean", "description": "true: action dry_run, keeping status / max_delay_ms; false: back to the action it had before dry run (delay if max_delay_ms is kept, else reject with the kept status); the state it is already in changes nothing"}},
            "example": {"version": 41, "enabled": false}},
        "BlacklistEntry": entry,
        "BlacklistInput": {"type": "object", "additionalProperties": false, "required": ["dimension", "value"],
            "properties": {"dimension": {"type": "string"}, "value": {"type": "string"},
                "expires_in_s": {"type": "integer", "minimum": 1}, "expires_at": {"type": "integer", "description": "Unix ms, in the future"},
                "reason": {"type": "string"}},
            "example": {"dimension": "ip", "value": "10.0.0.9", "expires_in_s": 3600, "reason": "abuse"}},
        "Host": host,
        "HostWeight": {"type": "object", "additionalProperties": false, "required": ["weight"],
            "properties": {"weight": {"type": "integer", "minimum": 1, "maximum": 1000000}},
            "example": {"weight": 2}},
        "Token": {"type": "object", "additionalProperties": false,
            "required": ["name", "role", "host", "created_at", "last_used_at"],
            "properties": {"name": {"type": "string"}, "role": {"enum": ["admin", "viewer", "agent"]},
                "host": {"type": ["string", "null"], "description": "the one host an agent token may report as"},
                "created_at": {"type": "integer"}, "last_used_at": {"type": ["integer", "null"], "description": "unix ms, written at most once a minute"}}},
        "TokenInput": {"type": "object", "additionalProperties": false, "required": ["name", "role"],
            "properties": {"name": {"type": "string", "description": "1 to 32 of A-Z a-z 0-9 . _ -"},
                "role": {"enum": ["admin", "viewer", "agent"], "description": "admin: everything; viewer: reads everything, writes nothing; agent: the snapshot long-poll and reports (as `host` only, no weight)"},
                "host": {"type": ["string", "null"], "description": "agent only: the one host it may report as"}},
            "example": {"name": "web-1-agent", "role": "agent", "host": "web-1"}},
        "TokenCreated": {"type": "object", "additionalProperties": false,
            "required": ["name", "role", "host", "created_at", "last_used_at", "secret"],
            "properties": {"name": {"type": "string"}, "role": {"enum": ["admin", "viewer", "agent"]},
                "host": {"type": ["string", "null"]}, "created_at": {"type": "integer"},
                "last_used_at": {"type": ["integer", "null"]}, "secret": {"type": "string", "description": "the bearer token; shown this once"}}},
        "Audit": {"type": "object", "additionalProperties": false,
            "required": ["id", "at", "token", "action", "target", "before", "after"],
            "properties": {"id": {"type": "integer"}, "at": {"type": "integer"}, "token": {"type": "string", "description": "the token's name (`cli` for the CLI on the store)"}, "role": {"type": ["string", "null"], "description": "the token's role (admin, read, agent); null for the CLI and entries before issue 34"}, "client": {"type": ["string", "null"], "description": "the client's IP:PORT of an API change"},
                "action": {"type": "string"}, "target": {"type": "string"},
                "before": {"type": ["object", "null"]}, "after": {"type": ["object", "null"]}}},
        "Report": {"type": "object", "additionalProperties": false,
            "properties": {"weight": {"type": "integer", "minimum": 1}, "applied_version": nullable("integer"),
                "publish_error": {"type": ["string", "null"],
                    "description": "The agent's last publish refusal; null clears it; absent leaves it as it is."},
                "publish_error_at": nullable("integer"),
                "leases": {"type": "array", "description": "What the host enforces for each split: demand strategy (epoch 0: the static split)",
                    "items": {"type": "object", "additionalProperties": false, "required": ["strategy", "epoch", "value"],
                        "properties": {"strategy": {"type": "integer"}, "epoch": {"type": "integer"}, "value": {"type": "integer"}}}},
                "counters": {"type": "array", "items": {"type": "object", "additionalProperties": false,
                    "required": ["id"], "properties": {"id": {"type": "integer"}, "passed": {"type": "integer"},
                    "limited": {"type": "integer"}, "delayed": {"type": "integer"}}}}},
            "example": {"applied_version": 41, "counters": [{"id": 7, "passed": 1200, "limited": 30, "delayed": 0}]}},
        "ReportAnswer": {"type": "object", "additionalProperties": false, "required": ["ok", "version", "hosts"],
            "properties": {"ok": {"type": "boolean"}, "version": {"type": "integer"},
                "hosts": {"type": "array", "items": schema_ref("Host")},
                "leases": {"type": "array", "description": "This host's leases",
                    "items": {"type": "object", "additionalProperties": false,
                        "required": ["strategy", "value", "epoch", "expires", "granted"],
                        "properties": {"strategy": {"type": "integer"}, "value": {"type": "integer"},
                            "epoch": {"type": "integer"}, "expires": {"type": "integer"}, "granted": {"type": "integer"}}}}}},
        "Snapshot": {"type": "object", "additionalProperties": false,
            "required": ["version", "changed", "strategies", "blacklist", "hosts"],
            "properties": {"version": {"type": "integer"}, "changed": {"type": "boolean"},
                "strategies": {"type": "array", "items": schema_ref("Strategy")},
                "blacklist": {"type": "array", "items": schema_ref("BlacklistEntry")},
                "hosts": {"type": "array", "items": schema_ref("Host")}}},
        "Stats": {"type": "object", "additionalProperties": false, "required": ["strategy", "points"],
            "properties": {"strategy": {"type": "integer"}, "points": {"type": "array", "items": {
                "type": "object", "additionalProperties": false, "required": ["at", "passed_per_s", "limited_per_s", "delayed_per_s"],
                "properties": {"at": {"type": "integer"}, "passed_per_s": {"type": "number"}, "limited_per_s": {"type": "number"}, "delayed_per_s": {"type": "number"}}}}}},
    })
}

/// `GET /api/v1/hosts`: the hosts and the fleet leader (null: none).
fn hosts_list() -> Value {
    let mut v = list_of("hosts", "Host", true);
    v["properties"]["leader"] = json!({"type": ["object", "null"], "additionalProperties": false,
        "required": ["holder", "term", "expires", "valid"],
        "properties": {"holder": {"type": "string"}, "term": {"type": "integer"},
            "expires": {"type": "integer"}, "valid": {"type": "boolean"}}});
    v
}

fn list_of(key: &str, item: &str, with_version: bool) -> Value {
    let mut props = json!({key: {"type": "array", "items": schema_ref(item)}});
    let mut req = vec![key];
    if with_version {
        props["version"] = json!({"type": "integer"});
        req.push("version");
    }
    json!({"type": "object", "additionalProperties": false, "required": req, "properties": props})
}

pub fn document() -> Value {
    let sid = || id_param("id", "integer");
    let e400 = || error("malformed JSON or unknown field (named in error.field)");
    let e404 = || error("no such id");
    let e409 = || error("stale version: the strategy changed since the given version");
    let e422 = || error("validation failed (error.field names the field)");
    json!({
        "openapi": "3.1.0",
        "info": {"title": "rate-ctl serve", "version": "1",
                 "description": "Strategies, blacklist, hosts, audit and agent long-poll of rate_ctl. See docs/API.md."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(),
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/health": {"get": op("Liveness (no token needed): `{\"ok\": true}` or 503 `unavailable`; with any valid token also the config version or the store's error", vec![], None,
                json!({"200": answer("store reachable", json!({"type": "object", "additionalProperties": false, "required": ["ok"], "properties": {"ok": {"type": "boolean"}, "version": {"type": "integer", "description": "only with a valid token"}}})),
                       "503": answer("store unreachable (the store's error text only with a valid token)", json!({"type": "object", "required": ["ok", "error"], "properties": {"ok": {"type": "boolean"}, "error": {"type": "object"}}}))}), false)},
            "/api/v1/version": {"get": op("Current config version", vec![], None,
                json!({"200": answer("version", json!({"type": "object", "additionalProperties": false, "required": ["version"], "properties": {"version": {"type": "integer"}}}))}), true)},
            "/api/v1/strategies": {
                "get": op("List strategies", vec![
                        query("dimension", "string", "only strategies with a condition on this dimension"),
                        query("value", "string", "only strategies with a condition of this value (on `dimension` if given)"),
                        query("name", "string", "only names containing this text")], None,
                    json!({"200": answer("strategies by id", list_of("strategies", "Strategy", true))}), true),
                "post": op("Create a strategy", vec![], Some(body(schema_ref("StrategyInput"), strategy_example())),
                    json!({"201": answer("created", schema_ref("Strategy")), "400": e400(), "422": e422()}), true),
            },
            "/api/v1/strategies/import": {
                "post": op("Load strategies all or nothing in one transaction (as `rate-ctl strategy import`); \
                            the first bad line (or array item) is reported by number in error.line",
                    vec![query("replace", "boolean", "also delete every strategy not in the body (default false)"),
                         query("allow_empty", "boolean", "with replace and a body holding no strategy: really delete every strategy (else 422, field allow_empty)")],
                    Some(json!({"required": true, "content": {
                        "application/json": {"schema": {"type": "array", "items": schema_ref("StrategyImport")},
                                             "example": [import_example()]},
                        "application/x-ndjson": {"schema": {"type": "string", "description": "JSON lines, one StrategyImport a line; blank lines skipped"}}}})),
                    json!({"200": answer("imported; the new config version", schema_ref("ImportAnswer")),
                           "400": error("malformed JSON or a line that is not a strategy (error.line)"),
                           "422": error("a line fails validation or its name is taken (error.line, error.field)")}), true),
            },
            "/api/v1/strategies/{id}": {
                "get": op("One strategy", vec![sid()], None,
                    json!({"200": answer("the strategy", schema_ref("Strategy")), "404": e404()}), true),
                "put": op("Replace a strategy (optimistic: give the version it was based on)", vec![sid()],
                    Some(body(schema_ref("StrategyPut"), json!({"name": "pay-u1024-v2", "match": {"api": "/pay"}, "algorithm": "token_bucket", "rate": 200, "burst": 20, "version": 41}))),
                    json!({"200": answer("stored", schema_ref("Strategy")), "400": e400(), "404": e404(), "409": e409(), "422": e422()}), true),
                "patch": op("Enable, disable or toggle dry-run", vec![sid()],
                    Some(body(schema_ref("StrategyPatch"), json!({"version": 41, "enabled": false}))),
                    json!({"200": answer("stored", schema_ref("Strategy")), "400": e400(), "404": e404(), "409": e409(), "422": e422()}), true),
                "delete": op("Delete a strategy (optimistic: give the version shown)",
                    vec![sid(), query("version", "integer", "delete only if the strategy is still at this version (409 otherwise)")], None,
                    json!({"204": {"description": "deleted"}, "400": e400(), "404": e404(), "409": e409()}), true),
            },
            "/api/v1/blacklist": {
                "get": op("List blacklist entries", vec![], None,
                    json!({"200": answer("entries by id", list_of("entries", "BlacklistEntry", true))}), true),
                "post": op("Block a dimension value (replaces an entry for the same value)", vec![],
                    Some(body(schema_ref("BlacklistInput"), json!({"dimension": "ip", "value": "10.0.0.9", "expires_in_s": 3600, "reason": "abuse"}))),
                    json!({"201": answer("created", schema_ref("BlacklistEntry")), "400": e400(), "422": e422()}), true),
            },
            "/api/v1/blacklist/{id}": {"delete": op("Remove a blacklist entry", vec![sid()], None,
                json!({"204": {"description": "removed"}, "404": e404()}), true)},
            "/api/v1/hosts": {"get": op("Hosts with weight, heartbeat, applied version, lag", vec![], None,
                json!({"200": answer("hosts", hosts_list())}), true)},
            "/api/v1/hosts/{host_id}": {"put": op("Set a host's weight (registers an unknown host)", vec![id_param("host_id", "string")],
                Some(body(schema_ref("HostWeight"), json!({"weight": 2}))),
                json!({"200": answer("the host", schema_ref("Host")), "400": e400(), "422": e422()}), true)},
            "/api/v1/hosts/{host_id}/report": {"post": op("Agent heartbeat: applied version and slot counters (admin or agent token)",
                vec![id_param("host_id", "string")],
                Some(body(schema_ref("Report"), json!({"applied_version": 1, "counters": [{"id": 1, "passed": 1200, "limited": 30, "delayed": 0}]}))),
                json!({"200": answer("recorded; the hosts for the rate split", schema_ref("ReportAnswer")), "400": e400(), "422": e422()}), true)},
            "/api/v1/tokens": {
                "get": op("Named API tokens: names, roles, hosts, created, last used (admin only; never a secret)", vec![], None,
                    json!({"200": answer("tokens by name", list_of("tokens", "Token", false))}), true),
                "post": op("Create a named token (admin only); the answer holds its secret, once: only its hash is stored",
                    vec![], Some(body(schema_ref("TokenInput"), json!({"name": "viewer-1", "role": "viewer"}))),
                    json!({"201": answer("created", schema_ref("TokenCreated")), "400": e400(), "422": e422()}), true),
            },
            "/api/v1/tokens/{name}": {"delete": op("Revoke a named token (admin only): refused from its next request", vec![id_param("name", "string")], None,
                json!({"200": answer("revoked", json!({"type": "object", "additionalProperties": false, "required": ["revoked"], "properties": {"revoked": {"type": "string"}}})), "404": e404()}), true)},
            "/api/v1/audit": {"get": op("Audit log, newest first", vec![
                    query("limit", "integer", "1 to 1000, default 100"),
                    query("before_id", "integer", "only entries with a smaller id (paging)")], None,
                json!({"200": answer("entries", list_of("entries", "Audit", false)), "400": e400()}), true)},
            "/api/v1/snapshot": {"get": op("Everything an agent publishes; long-poll: holds up to 30 s while the version is not above `after`",
                vec![query("after", "integer", "the version the caller has")], None,
                json!({"200": answer("snapshot (changed: false when the hold ran out)", schema_ref("Snapshot")), "400": e400()}), true)},
            "/api/v1/stats": {"get": op("Passed and limited requests per second of one strategy, summed over hosts",
                vec![json!({"name": "strategy", "in": "query", "required": true, "schema": {"type": "integer"}}),
                     query("seconds", "integer", "1 to 300, default 120")], None,
                json!({"200": answer("one point per second", schema_ref("Stats")), "400": e400()}), true)},
            // Issue 33: one key of a per-key strategy (docs/API.md, "Per-key operations").
            "/api/v1/strategies/{id}/keys/{key}": {
                "get": op("Every fresh host's reading of one key and the fleet's sum (waits at most 1 s for the agents)",
                    vec![sid(), id_param("key", "string")], None,
                    json!({"200": answer("per host and the fleet", json!({"type": "object"})), "404": e404(), "422": e422()}), true),
                "delete": op("Reset one key on every host (recorded and audited; the agents apply it within 200 ms)",
                    vec![sid(), id_param("key", "string")], None,
                    json!({"202": answer("recorded", json!({"type": "object"})), "404": e404(), "422": e422()}), true),
            },
            "/api/v1/strategies/{id}/top": {"get": op("The fleet's top keys of a per-key strategy in the last minute, by rejections then requests (waits at most 1 s for the agents)",
                vec![sid()], None,
                json!({"200": answer("merged entries", json!({"type": "object"})), "404": e404(), "422": e422()}), true)},
            "/api/v1/hosts/{host_id}/keys": {"post": op("Agent poll: key resets after `after`, the fleet view's questions; the agent's answers (admin or agent token)",
                vec![id_param("host_id", "string")], Some(body(json!({"type": "object"}), json!({"after": 3, "answers": []}))),
                json!({"200": answer("resets and questions", json!({"type": "object"})), "400": e400(), "422": e422()}), true)},
            "/api/v1/hosts/{host_id}/bans": {"post": op("An agent's penalty-box ban of its host (issue 32): the store's `source: ban` blacklist entry, one per key (admin or agent token bound to the host)",
                vec![id_param("host_id", "string")], Some(body(json!({"type": "object"}), json!({"dimension": "ip", "value": "192.0.2.10", "expires_ms": 1_900_000_000_000u64, "reason": "penalty box: strategy 1", "strategy": 1}))),
                json!({"200": answer("the entry's id and whether it is new", json!({"type": "object"})), "400": e400(), "422": e422()}), true)},
            "/api/v1/openapi.json": {"get": op("This document (no token)", vec![], None,
                json!({"200": answer("OpenAPI 3.1", json!({"type": "object"}))}), false)},
        }
    })
}
