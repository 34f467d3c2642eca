//! The `/api/v1` handlers (docs/API.md). Every change is one store
//! transaction (version bump, rows, audit entry); an error leaves the
//! store untouched.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::auth::Kind;
use super::Shared;
use crate::cli::record::{
    blacklist_api_json, parse_strategy_lines, strategy_api_json, ActionKind, BlacklistRecord,
    HostRecord, StrategyRecord,
};
use crate::cli::store::{now_ms, CounterSample, StoreError};
use rate_ctl::core::model::{canonical_ip, Algorithm, Unit};

const READ: &[Kind] = &[Kind::Admin, Kind::Read];
const ADMIN: &[Kind] = &[Kind::Admin];
const AGENT: &[Kind] = &[Kind::Admin, Kind::Agent];
const SNAPSHOT: &[Kind] = &[Kind::Admin, Kind::Read, Kind::Agent];

/// An error answer: `{"error": {"field": …, "message": …}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub field: Option<String>,
    pub message: String,
    /// The 1-based line (or array item) of an import the error is about.
    pub line: Option<usize>,
}

impl ApiError {
    fn new(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            field: field.map(str::to_string),
            message: message.into(),
            line: None,
        }
    }
    pub fn bad_request(field: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, field, message)
    }
    /// 422 for `field`; the message starts with the field name.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(field),
            format!("{field}: {message}"),
        )
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, None, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, None, message)
    }
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, None, message)
    }

    /// A store error; `rec` lets `conditions[i]` be named `match.<dimension>`.
    fn from_store(e: StoreError, rec: Option<&StrategyRecord>) -> ApiError {
        match e {
            StoreError::Invalid(m) => validation(&m, rec),
            StoreError::NotFound(m) => ApiError::not_found(m),
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, Some("version"), m),
            e => {
                tracing::error!(error = %e, "store error");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, None, e.to_string())
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::from_store(e, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"field": self.field, "message": self.message}});
        if let Some(line) = self.line {
            body["error"]["line"] = json!(line);
        }
        (self.status, Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// A validation message "field: text" from the model or the record → 422
/// naming the API field (`conditions[i]…` → `match.<dimension>`,
/// `action.status` → `status`, `host-id` → `host_id`).
fn validation(message: &str, rec: Option<&StrategyRecord>) -> ApiError {
    let (prefix, rest) = message.split_once(':').unwrap_or(("", message));
    let field = if let Some(tail) = prefix.strip_prefix("conditions[") {
        let index: Option<usize> = tail.split(']').next().and_then(|i| i.parse().ok());
        match (index, rec) {
            (Some(i), Some(r)) => r
                .conditions
                .keys()
                .nth(i)
                .map(|d| format!("match.{d}"))
                .unwrap_or_else(|| "match".into()),
            _ => "match".into(),
        }
    } else {
        match prefix {
            "conditions" => "match".into(),
            "action.status" => "status".into(),
            "action.max_delay_ms" => "max_delay_ms".into(),
            "host-id" => "host_id".into(),
            p if !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c == '_') => {
                p.to_string()
            }
            _ => return ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, None, message.to_string()),
        }
    };
    ApiError::invalid(&field, rest.trim_start())
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (status, Json(v)).into_response()
}

fn ok(v: Value) -> ApiResult {
    Ok(json_response(StatusCode::OK, v))
}

// ---- request bodies -------------------------------------------------------

/// The body as a JSON object whose keys are all in `allowed` (400 otherwise).
fn object(body: &[u8], allowed: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(None, format!("malformed JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request(
            None,
            "the body must be a JSON object",
        ));
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            Some(k),
            format!(
                "{k}: unknown field (expected one of {})",
                allowed.join(", ")
            ),
        ));
    }
    Ok(o)
}

/// Typed access to body fields; wrong types are 422 naming the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn present(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn required<T>(&self, k: &str, v: Option<T>) -> Result<T, ApiError> {
        v.ok_or_else(|| ApiError::invalid(k, "required"))
    }
    fn str(&self, k: &str) -> Result<Option<String>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid(k, "must be a string")),
        }
    }
    fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ => Err(ApiError::invalid(
                    k,
                    format!("must be a whole number from 0 to {max}, got {v}"),
                )),
            },
        }
    }
    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(k, "must be true or false")),
        }
    }
    fn parsed<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>, ApiError>
    where
        T::Err: std::fmt::Display,
    {
        match self.str(k)? {
            None => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|e: T::Err| {
                let m = e.to_string();
                // Model errors already start with the field name.
                let m = m
                    .strip_prefix(&format!("{k}: "))
                    .map(str::to_string)
                    .unwrap_or(m);
                ApiError::invalid(k, m)
            }),
        }
    }
    fn conditions(&self) -> Result<BTreeMap<String, String>, ApiError> {
        match self.present("match") {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(d, v)| match v {
                    Value::String(s) => Ok((d.clone(), s.clone())),
                    _ => Err(ApiError::invalid(&format!("match.{d}"), "must be a string")),
                })
                .collect(),
            Some(_) => Err(ApiError::invalid(
                "match",
                "must be an object of dimension: value",
            )),
        }
    }
}

const STRATEGY_FIELDS: &[&str] = &[
    "name",
    "match",
    "algorithm",
    "rate",
    "per",
    "burst",
    "action",
    "status",
    "max_delay_ms",
    "enabled",
    "scope",
];
const PUT_EXTRA: &[&str] = &["id", "version", "created_at", "updated_at"];

/// A strategy from a POST/PUT body, validated by the record (and so by the
/// core model).
fn strategy_from_body(o: &Map<String, Value>) -> Result<StrategyRecord, ApiError> {
    let f = Fields(o);
    let mut rec = StrategyRecord {
        id: 0,
        name: f.required("name", f.str("name")?)?,
        conditions: f.conditions()?,
        algorithm: f.required("algorithm", f.parsed::<Algorithm>("algorithm")?)?,
        rate: f.required("rate", f.uint("rate", u64::MAX)?)?,
        per: f.parsed::<Unit>("per")?.unwrap_or(Unit::Second),
        burst: f.uint("burst", u32::MAX as u64)?.unwrap_or(1) as u32,
        action: f
            .parsed::<ActionKind>("action")?
            .unwrap_or(ActionKind::Reject),
        status: f.uint("status", u16::MAX as u64)?.map(|s| s as u16),
        max_delay_ms: f.uint("max_delay_ms", u32::MAX as u64)?.map(|m| m as u32),
        enabled: f.bool("enabled")?.unwrap_or(true),
        scope: f
            .parsed("scope")?
            .unwrap_or(crate::cli::record::Scope::Cluster),
        created_ms: 0,
        updated_ms: 0,
        version: 0,
    };
    rec.validate().map_err(|m| validation(&m, Some(&rec)))?;
    Ok(rec)
}

fn parse_id(s: &str, what: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| ApiError::not_found(format!("no {what} with id {s:?}")))
}

fn strategy_id(s: &str) -> Result<u32, ApiError> {
    let id = parse_id(s, "strategy")?;
    u32::try_from(id).map_err(|_| ApiError::not_found(format!("no strategy with id {id}")))
}

// ---- handlers ------------------------------------------------------------

pub async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

pub async fn health(State(st): State<Shared>) -> Response {
    match st.store.version().await {
        Ok(v) => json_response(StatusCode::OK, json!({"ok": true, "version": v})),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"ok": false, "error": {"field": null, "message": e.to_string()}}),
        ),
    }
}

pub async fn openapi_doc() -> Response {
    json_response(StatusCode::OK, super::openapi::document())
}

pub async fn version(State(st): State<Shared>, h: HeaderMap) -> ApiResult {
    st.tokens.check(&h, READ)?;
    ok(json!({"version": st.store.version().await?}))
}

pub async fn list_strategies(
    State(st): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let dimension = q.get("dimension").filter(|s| !s.is_empty());
    let mut value = q.get("value").filter(|s| !s.is_empty()).cloned();
    if dimension.is_some_and(|d| d == "ip") {
        if let Some(c) = value.as_ref().and_then(|v| canonical_ip(v.as_bytes())) {
            value = Some(c);
        }
    }
    let name = q.get("name").filter(|s| !s.is_empty());
    let snap = st.store.snapshot().await?;
    let list: Vec<Value> = snap
        .strategies
        .iter()
        .filter(|r| name.is_none_or(|n| r.name.contains(n.as_str())))
        .filter(|r| match (dimension, &value) {
            (Some(d), Some(v)) => r.conditions.get(d) == Some(v),
            (Some(d), None) => r.conditions.contains_key(d),
            (None, Some(v)) => r.conditions.values().any(|x| x == v),
            (None, None) => true,
        })
        .map(strategy_api_json)
        .collect();
    ok(json!({"version": snap.version, "strategies": list}))
}

/// Stores a changed strategy if it is still at version `based_on` (else 409),
/// wakes this instance's long-polls, answers with the stored strategy.
async fn save_strategy(
    st: &Shared,
    rec: &StrategyRecord,
    based_on: u64,
    who: &'static str,
    action: &str,
) -> ApiResult {
    let stored = st
        .store
        .update_strategy_full(rec, Some(based_on), who, action)
        .await
        .map_err(|e| ApiError::from_store(e, Some(rec)))?;
    st.announce(stored.version);
    ok(strategy_api_json(&stored))
}

pub async fn create_strategy(State(st): State<Shared>, h: HeaderMap, body: Bytes) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let o = object(&body, STRATEGY_FIELDS)?;
    let rec = strategy_from_body(&o)?;
    let stored = st
        .store
        .add_strategy_full(&rec, who.name())
        .await
        .map_err(|e| ApiError::from_store(e, Some(&rec)))?;
    st.announce(stored.version);
    Ok(json_response(
        StatusCode::CREATED,
        strategy_api_json(&stored),
    ))
}

pub async fn get_strategy(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let id = strategy_id(&id)?;
    ok(strategy_api_json(&st.store.get_strategy(id).await?))
}

pub async fn put_strategy(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let allowed: Vec<&str> = STRATEGY_FIELDS.iter().chain(PUT_EXTRA).copied().collect();
    let o = object(&body, &allowed)?;
    let id = strategy_id(&id)?;
    let f = Fields(&o);
    if let Some(given) = f.uint("id", u64::MAX)? {
        if given != id as u64 {
            return Err(ApiError::invalid(
                "id",
                format!("{given} differs from the id {id} in the path"),
            ));
        }
    }
    let based_on = f.required("version", f.uint("version", u64::MAX)?)?;
    let mut rec = strategy_from_body(&o)?;
    rec.id = id;
    save_strategy(&st, &rec, based_on, who.name(), "strategy.update").await
}

pub async fn patch_strategy(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let o = object(&body, &["version", "enabled", "dry_run"])?;
    let id = strategy_id(&id)?;
    let f = Fields(&o);
    let based_on = f.required("version", f.uint("version", u64::MAX)?)?;
    let enabled = f.bool("enabled")?;
    let dry_run = f.bool("dry_run")?;
    let mut rec = st.store.get_strategy(id).await?;
    if let Some(e) = enabled {
        rec.enabled = e;
    }
    // Dry run round-trips: `status` / `max_delay_ms` stay in the record
    // while the action is dry_run, and ending dry run derives the action
    // from them (delay with its cap, or reject with its status). Asking for
    // the state the strategy is already in changes nothing.
    match dry_run {
        Some(true) => rec.action = ActionKind::DryRun,
        Some(false) => rec.action = rec.enforcing_action(),
        None => {}
    }
    save_strategy(&st, &rec, based_on, who.name(), "strategy.patch").await
}

pub async fn delete_strategy(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let id = strategy_id(&id)?;
    let v = st.store.delete_strategy(id, who.name()).await?;
    st.announce(v);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// An import error about line (or array item) `line`: the message is the
/// store's ("line 3: rate: must be greater than 0", as `rate-ctl strategy
/// import` prints it), `field` the API name of the field when one is named.
fn import_error(status: StatusCode, line: usize, message: String) -> ApiError {
    let rest = message
        .strip_prefix(&format!("line {line}: "))
        .unwrap_or(&message);
    let field = match status {
        StatusCode::UNPROCESSABLE_ENTITY => validation(rest, None).field,
        _ => None,
    };
    ApiError {
        status,
        field,
        message,
        line: Some(line),
    }
}

/// The strategies of an import body with their 1-based line numbers: a JSON
/// array (numbered by item) or JSON lines (blank lines skipped). Each is in
/// the export format or the API's strategy JSON; a line that is not a
/// strategy → 400 naming it.
fn import_records(body: &[u8]) -> Result<Vec<(usize, StrategyRecord)>, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request(None, "the body must be UTF-8"))?;
    let records = if text.trim_start().starts_with('[') {
        let items: Vec<Value> = serde_json::from_str(text)
            .map_err(|e| ApiError::bad_request(None, format!("malformed JSON: {e}")))?;
        // One item a line: numbered like JSON lines, by the same rule.
        let lines: Vec<String> = items.iter().map(Value::to_string).collect();
        parse_strategy_lines(&lines.join("\n"))
    } else {
        parse_strategy_lines(text)
    };
    records.map_err(|(line, e)| {
        import_error(StatusCode::BAD_REQUEST, line, format!("line {line}: {e}"))
    })
}

/// `POST /strategies/import[?replace=true]`: all or nothing in one
/// transaction, like `rate-ctl strategy import`.
pub async fn import_strategies(
    State(st): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let replace = match q.get("replace").map(String::as_str) {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                Some("replace"),
                format!("replace: {other:?} is not true or false"),
            ))
        }
    };
    let records = import_records(&body)?;
    let (n, v) = st
        .store
        .import(records, replace, who.name())
        .await
        .map_err(|e| match e {
            StoreError::Invalid(m) => {
                let line = m
                    .strip_prefix("line ")
                    .and_then(|r| r.split(':').next())
                    .and_then(|n| n.parse().ok());
                match line {
                    Some(line) => import_error(StatusCode::UNPROCESSABLE_ENTITY, line, m),
                    None => validation(&m, None),
                }
            }
            e => ApiError::from(e),
        })?;
    st.announce(v);
    ok(json!({"imported": n, "version": v}))
}

pub async fn list_blacklist(State(st): State<Shared>, h: HeaderMap) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let snap = st.store.snapshot().await?;
    let list: Vec<Value> = snap.blacklist.iter().map(blacklist_api_json).collect();
    ok(json!({"version": snap.version, "entries": list}))
}

pub async fn add_blacklist(State(st): State<Shared>, h: HeaderMap, body: Bytes) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let o = object(
        &body,
        &["dimension", "value", "expires_in_s", "expires_at", "reason"],
    )?;
    let f = Fields(&o);
    let now = now_ms();
    let expires_ms = match (
        f.uint("expires_in_s", u32::MAX as u64)?,
        f.uint("expires_at", i64::MAX as u64)?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "expires_in_s",
                "give expires_in_s or expires_at, not both",
            ))
        }
        (Some(0), None) => return Err(ApiError::invalid("expires_in_s", "must be at least 1")),
        (Some(s), None) => Some(now + s * 1000),
        (None, Some(at)) if at <= now => {
            return Err(ApiError::invalid(
                "expires_at",
                format!("{at} is not in the future (now {now}; Unix ms)"),
            ))
        }
        (None, at) => at,
    };
    let mut rec = BlacklistRecord {
        id: 0,
        dimension: f.required("dimension", f.str("dimension")?)?,
        value: f.required("value", f.str("value")?)?,
        expires_ms,
        reason: f.str("reason")?.unwrap_or_default(),
        created_ms: 0,
    };
    rec.validate().map_err(|m| validation(&m, None))?;
    let (stored, v) = st.store.blacklist_add_full(&rec, who.name()).await?;
    st.announce(v);
    Ok(json_response(
        StatusCode::CREATED,
        blacklist_api_json(&stored),
    ))
}

pub async fn rm_blacklist(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let id = parse_id(&id, "blacklist entry")?;
    let v = st.store.blacklist_rm(id, who.name()).await?;
    st.announce(v);
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn host_json(h: &HostRecord, version: u64, now: u64, freshness_ms: u64) -> Value {
    json!({
        "host_id": h.host_id,
        "weight": h.weight,
        "last_heartbeat": h.last_heartbeat_ms,
        "applied_version": h.applied_version,
        "applied_at": h.applied_ms,
        "lag": h.applied_version.map(|a| version.saturating_sub(a)),
        "fresh": h.last_heartbeat_ms.is_some_and(|hb| hb.saturating_add(freshness_ms) >= now),
    })
}

async fn hosts_json(st: &Shared) -> Result<(u64, Vec<Value>), ApiError> {
    let version = st.store.version().await?;
    let now = now_ms();
    let hosts = st
        .store
        .hosts()
        .await?
        .iter()
        .map(|h| host_json(h, version, now, st.freshness_ms))
        .collect();
    Ok((version, hosts))
}

pub async fn list_hosts(State(st): State<Shared>, h: HeaderMap) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let (version, hosts) = hosts_json(&st).await?;
    ok(json!({"version": version, "hosts": hosts}))
}

pub async fn set_host_weight(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let who = st.tokens.check(&h, ADMIN)?;
    let o = object(&body, &["weight"])?;
    let f = Fields(&o);
    let weight = f.required("weight", f.uint("weight", u32::MAX as u64)?)? as u32;
    let v = st.store.set_weight(&host_id, weight, who.name()).await?;
    st.announce(v);
    let (_, hosts) = hosts_json(&st).await?;
    let me = hosts
        .into_iter()
        .find(|x| x["host_id"] == host_id.as_str())
        .ok_or_else(|| ApiError::not_found(format!("no host {host_id:?}")))?;
    ok(me)
}

pub async fn report(
    State(st): State<Shared>,
    h: HeaderMap,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let who = st.tokens.check(&h, AGENT)?;
    let o = object(&body, &["weight", "applied_version", "counters"])?;
    let f = Fields(&o);
    let weight = f.uint("weight", u32::MAX as u64)?.map(|w| w as u32);
    let applied = f.uint("applied_version", i64::MAX as u64)?;
    let mut counters = Vec::new();
    match f.present("counters") {
        None => {}
        Some(Value::Array(a)) => {
            for (i, c) in a.iter().enumerate() {
                let field = |k: &str| format!("counters[{i}].{k}");
                let n = |k: &str| -> Result<u64, ApiError> {
                    match &c[k] {
                        Value::Null if k != "id" => Ok(0),
                        v => v
                            .as_u64()
                            .ok_or_else(|| ApiError::invalid(&field(k), "must be a whole number")),
                    }
                };
                let id = u32::try_from(n("id")?)
                    .ok()
                    .filter(|i| *i > 0)
                    .ok_or_else(|| ApiError::invalid(&field("id"), "must be a strategy id"))?;
                counters.push(CounterSample {
                    id,
                    passed: n("passed")?,
                    limited: n("limited")?,
                    delayed: n("delayed")?,
                });
            }
        }
        Some(_) => return Err(ApiError::invalid("counters", "must be a list")),
    }
    st.store
        .report(&host_id, weight, applied, &counters, who.name())
        .await?;
    let (version, hosts) = hosts_json(&st).await?;
    ok(json!({"ok": true, "version": version, "hosts": hosts}))
}

pub async fn audit(
    State(st): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let limit = match q.get("limit") {
        None => 100,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=1000).contains(l))
            .ok_or_else(|| ApiError::bad_request(Some("limit"), "limit: must be 1 to 1000"))?,
    };
    let before = match q.get("before_id") {
        None => None,
        Some(b) => Some(b.parse::<u64>().map_err(|_| {
            ApiError::bad_request(Some("before_id"), "before_id: must be an entry id")
        })?),
    };
    let entries: Vec<Value> = st
        .store
        .audit_list(limit, before)
        .await?
        .into_iter()
        .map(|e| {
            json!({"id": e.id, "at": e.at_ms, "token": e.token, "action": e.action,
                   "target": e.target, "before": e.before, "after": e.after})
        })
        .collect();
    ok(json!({"entries": entries}))
}

pub async fn snapshot(
    State(st): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    st.tokens.check(&h, SNAPSHOT)?;
    let after = match q.get("after") {
        None => 0,
        Some(a) => a
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(Some("after"), "after: must be a config version"))?,
    };
    let mut rx = st.version.clone();
    let deadline = tokio::time::Instant::now() + super::LONG_POLL;
    while *rx.borrow_and_update() <= after {
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => break,
        }
    }
    let snap = st.store.snapshot().await?;
    let (_, hosts) = hosts_json(&st).await?;
    ok(json!({
        "version": snap.version,
        "changed": snap.version > after,
        "strategies": snap.strategies.iter().map(strategy_api_json).collect::<Vec<_>>(),
        "blacklist": snap.blacklist.iter().map(blacklist_api_json).collect::<Vec<_>>(),
        "hosts": hosts,
    }))
}

/// Spreads each host's counter increase between two samples evenly over
/// the time between them (at most the last 2 s before the later sample:
/// agents report only counters that moved, so a long gap was idle) and
/// sums over hosts, per second.
pub fn stats_points(
    samples: &[crate::cli::store::StoredSample],
    from_ms: u64,
    to_ms: u64,
) -> Vec<Value> {
    let first = from_ms / 1000;
    let last = to_ms / 1000;
    let n = (last - first + 1) as usize;
    let mut passed = vec![0f64; n];
    let mut limited = vec![0f64; n];
    let mut delayed = vec![0f64; n];
    for w in samples.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.host_id != b.host_id || b.at_ms <= a.at_ms {
            continue;
        }
        // A counter that went down was reset (slot reassigned): skip.
        let (Some(dp), Some(dl), Some(dd)) = (
            b.passed.checked_sub(a.passed),
            b.limited.checked_sub(a.limited),
            b.delayed.checked_sub(a.delayed),
        ) else {
            continue;
        };
        let start = a.at_ms.max(b.at_ms.saturating_sub(2_000));
        let span = (b.at_ms - start) as f64;
        let mut t = start;
        while t < b.at_ms {
            let sec_end = (t / 1000 + 1) * 1000;
            let piece_end = sec_end.min(b.at_ms);
            let frac = (piece_end - t) as f64 / span;
            let sec = t / 1000;
            if sec >= first && sec <= last {
                passed[(sec - first) as usize] += dp as f64 * frac;
                limited[(sec - first) as usize] += dl as f64 * frac;
                delayed[(sec - first) as usize] += dd as f64 * frac;
            }
            t = piece_end;
        }
    }
    (0..n)
        .map(|i| {
            json!({"at": (first + i as u64) * 1000, "passed_per_s": passed[i],
                   "limited_per_s": limited[i], "delayed_per_s": delayed[i]})
        })
        .collect()
}

pub async fn stats(
    State(st): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    st.tokens.check(&h, READ)?;
    let id = q
        .get("strategy")
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|i| *i > 0)
        .ok_or_else(|| {
            ApiError::bad_request(Some("strategy"), "strategy: required, a strategy id")
        })?;
    let seconds = match q.get("seconds") {
        None => 120,
        Some(s) => s
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=300).contains(s))
            .ok_or_else(|| ApiError::bad_request(Some("seconds"), "seconds: must be 1 to 300"))?,
    };
    let now = now_ms();
    // The last complete second is the newest point.
    let to = now.saturating_sub(1000);
    let from = to.saturating_sub((seconds - 1) * 1000);
    let samples = st.store.samples(id, from.saturating_sub(5_000)).await?;
    ok(json!({"strategy": id, "points": stats_points(&samples, from, to)}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::store::StoredSample;

    fn s(host: &str, at: u64, passed: u64, limited: u64) -> StoredSample {
        StoredSample {
            host_id: host.into(),
            at_ms: at,
            passed,
            limited,
            delayed: 0,
        }
    }

    #[test]
    fn stats_spread_and_sum_over_hosts() {
        // Host a: 100/s passed over 10..12 s; host b: 50/s limited over 10.5..11.5.
        let v = vec![
            s("a", 10_000, 0, 0),
            s("a", 11_000, 100, 0),
            s("a", 12_000, 200, 0),
            s("b", 10_500, 0, 0),
            s("b", 11_500, 0, 50),
        ];
        let p = stats_points(&v, 10_000, 11_999);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0]["passed_per_s"], 100.0);
        assert_eq!(p[0]["limited_per_s"], 25.0);
        assert_eq!(p[1]["passed_per_s"], 100.0);
        assert_eq!(p[1]["limited_per_s"], 25.0);
        // A long idle gap: the increase lands in the last 2 s, not smeared.
        let v = vec![s("a", 0, 0, 0), s("a", 60_000, 100, 0)];
        let p = stats_points(&v, 0, 59_999);
        assert_eq!(p[57]["passed_per_s"], 0.0);
        assert_eq!(p[58]["passed_per_s"], 50.0);
        assert_eq!(p[59]["passed_per_s"], 50.0);
        // A reset counter is skipped.
        let v = vec![s("a", 0, 500, 0), s("a", 1_000, 3, 0)];
        assert_eq!(stats_points(&v, 0, 999)[0]["passed_per_s"], 0.0);
    }

    #[test]
    fn validation_fields() {
        let rec: StrategyRecord = serde_json::from_str(
            r#"{"name":"x","match":{"api":"/a","ip":"nope"},"algorithm":"token_bucket","rate":1}"#,
        )
        .unwrap();
        let e = validation(
            "conditions[1].value: \"nope\" is not an IPv4 or IPv6 address",
            Some(&rec),
        );
        assert_eq!(e.field.as_deref(), Some("match.ip"));
        assert!(e.message.starts_with("match.ip: "), "{}", e.message);
        let e = validation("action.status: must be between 400 and 599, got 200", None);
        assert_eq!(e.field.as_deref(), Some("status"));
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
}
