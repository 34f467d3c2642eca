//! `/api/v1/strategies`: list, create, get, replace, patch, delete and
//! import. Every change is one store transaction (version bump, rows,
//! audit entry); an error leaves the store untouched.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{json, Map, Value};

use super::auth::{AdminToken, ReadToken, Token};
use super::body::{duplicate_key, json_response, object, ok, parse_id, Fields};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared, IMPORT_BODY_LIMIT};
use crate::store::json::{parse_strategy_lines, strategy_api_json};
use crate::store::record::{ActionKind, Scope, StrategyRecord};
use crate::store::valid::{valid_import, Valid};
use rate_ctl::core::model::{parse_ip_net, Algorithm, Unit};

pub fn router() -> Routes {
    Routes::default()
        .add(
            "/api/v1/strategies",
            &["GET", "POST"],
            get(list_strategies).post(create_strategy),
        )
        .add(
            "/api/v1/strategies/import",
            &["POST"],
            // 10,000 strategies of JSON lines are about 2.5 MB, more than
            // axum's default limit.
            post(import_strategies).layer(axum::extract::DefaultBodyLimit::max(IMPORT_BODY_LIMIT)),
        )
        .add(
            "/api/v1/strategies/{id}",
            &["GET", "PUT", "PATCH", "DELETE"],
            get(get_strategy)
                .put(put_strategy)
                .patch(patch_strategy)
                .delete(delete_strategy),
        )
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
    "warm_up_ms",
    "cold_factor",
    "priority",
    "each",
    "ipv4_prefix",
    "ipv6_prefix",
    "on_full",
    "split",
    "count_if",
    "cost_from",
    "cost_after",
    "max_keys",
    "tz",
    "ban_after",
    "ban_within",
    "ban_for",
];
const PUT_EXTRA: &[&str] = &["id", "version", "created_at", "updated_at"];

/// Strategy `id` (0 for a new one) from a POST/PUT body, validated by the
/// record (and so by the core model): the one check of API input.
fn strategy_from_body(o: &Map<String, Value>, id: u32) -> Result<Valid<StrategyRecord>, ApiError> {
    let f = Fields(o);
    let allow = f.parsed::<ActionKind>("action")? == Some(ActionKind::Allow);
    if allow {
        for k in ["algorithm", "rate", "per", "burst"] {
            if f.present(k).is_some() {
                return Err(ApiError::invalid(
                    k,
                    "makes no sense for action allow (an allowed request is not limited)",
                ));
            }
        }
    }
    let rec = StrategyRecord {
        id,
        name: f.required("name", f.str("name")?)?,
        conditions: f.conditions()?,
        // `allow` limits nothing: no rate fields (placeholders, see
        // StrategyRecord::validate).
        algorithm: match allow {
            true => Algorithm::FixedWindow,
            false => f.required("algorithm", f.parsed::<Algorithm>("algorithm")?)?,
        },
        rate: match allow {
            true => 1,
            false => f.required("rate", f.uint("rate", u64::MAX)?)?,
        },
        per: f.parsed::<Unit>("per")?.unwrap_or(Unit::Second),
        burst: f.uint("burst", u32::MAX as u64)?.unwrap_or(1) as u32,
        action: f
            .parsed::<ActionKind>("action")?
            .unwrap_or(ActionKind::Reject),
        status: f.uint("status", u16::MAX as u64)?.map(|s| s as u16),
        max_delay_ms: f.uint("max_delay_ms", u32::MAX as u64)?.map(|m| m as u32),
        enabled: f.bool("enabled")?.unwrap_or(true),
        scope: f.parsed("scope")?.unwrap_or(Scope::Cluster),
        warm_up_ms: f.uint("warm_up_ms", u32::MAX as u64)?.map(|m| m as u32),
        cold_factor: f.uint("cold_factor", u8::MAX as u64)?.map(|c| c as u8),
        priority: f.int("priority")?.unwrap_or(0),
        each: f.strings("each")?,
        ipv4_prefix: f.uint("ipv4_prefix", u8::MAX as u64)?.map(|p| p as u8),
        ipv6_prefix: f.uint("ipv6_prefix", u8::MAX as u64)?.map(|p| p as u8),
        on_full: f.parsed("on_full")?,
        split: f.parsed("split")?,
        created_ms: 0,
        updated_ms: 0,
        version: 0,
        count_if: f.str("count_if")?,
        cost_from: f.str("cost_from")?,
        cost_after: f.str("cost_after")?,
        max_keys: f.uint("max_keys", u32::MAX as u64)?.map(|m| m as u32),
        tz: f.str("tz")?.filter(|z| !z.is_empty()),
        ban_after: f.uint("ban_after", u32::MAX as u64)?.map(|m| m as u32),
        ban_within: f.uint("ban_within", u32::MAX as u64)?.map(|m| m as u32),
        ban_for: f.uint("ban_for", u32::MAX as u64)?.map(|m| m as u32),
    };
    rec.clone()
        .into_valid()
        .map_err(|e| ApiError::from_invalid(&e, Some(&rec)))
}

fn strategy_id(s: &str) -> Result<u32, ApiError> {
    let id = parse_id(s, "strategy")?;
    u32::try_from(id).map_err(|_| ApiError::not_found(format!("no strategy with id {id}")))
}

pub async fn list_strategies(
    State(st): State<Shared>,
    _: ReadToken,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let dimension = q.get("dimension").filter(|s| !s.is_empty());
    let mut value = q.get("value").filter(|s| !s.is_empty()).cloned();
    if dimension.is_some_and(|d| d == "ip") {
        if let Some(c) = value.as_ref().and_then(|v| parse_ip_net(v.as_bytes()).ok()) {
            value = Some(c.to_string());
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
        .map(|r| strategy_api_json(r))
        .collect();
    ok(json!({"version": snap.version, "strategies": list}))
}

/// Stores a changed strategy if it is still at version `based_on` (else 409),
/// wakes this instance's long-polls, answers with the stored strategy.
async fn save_strategy(
    st: &Shared,
    rec: &Valid<StrategyRecord>,
    based_on: u64,
    who: &str,
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

pub async fn create_strategy(
    State(st): State<Shared>,
    Token(who): AdminToken,
    body: Bytes,
) -> ApiResult {
    let o = object(&body, STRATEGY_FIELDS)?;
    let rec = strategy_from_body(&o, 0)?;
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
    _: ReadToken,
    Path(id): Path<String>,
) -> ApiResult {
    let id = strategy_id(&id)?;
    ok(strategy_api_json(&st.store.get_strategy(id).await?))
}

pub async fn put_strategy(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
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
    let rec = strategy_from_body(&o, id)?;
    save_strategy(&st, &rec, based_on, who.name(), "strategy.update").await
}

pub async fn patch_strategy(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
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
    if dry_run.is_some() && rec.action == ActionKind::Allow {
        // An allow limits nothing: there is nothing to rehearse.
        return Err(ApiError::invalid(
            "dry_run",
            "makes no sense for action allow (an allowed request is not limited)",
        ));
    }
    match dry_run {
        Some(true) => rec.action = ActionKind::DryRun,
        Some(false) => rec.action = rec.enforcing_action(),
        None => {}
    }
    let rec = rec
        .clone()
        .into_valid()
        .map_err(|e| ApiError::from_invalid(&e, Some(&rec)))?;
    save_strategy(&st, &rec, based_on, who.name(), "strategy.patch").await
}

pub async fn delete_strategy(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let id = strategy_id(&id)?;
    // `?version=V`: the version the client saw; 409 if it changed since.
    let expected = match q.get("version") {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                Some("version"),
                format!("version: {v:?} is not a whole number"),
            )
        })?),
    };
    let v = st
        .store
        .delete_strategy_at(id, expected, who.name())
        .await?;
    st.announce(v);
    Ok(StatusCode::NO_CONTENT.into_response())
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
        if let Some(k) = duplicate_key(text.as_bytes()) {
            // "[2].match.ip": item 3, numbered like a line.
            let (item, key) = k
                .strip_prefix('[')
                .and_then(|r| r.split_once("]."))
                .and_then(|(i, key)| Some((i.parse::<usize>().ok()? + 1, key.to_string())))
                .unwrap_or((1, k));
            return Err(duplicate_in_line(item, key));
        }
        // One item a line: numbered like JSON lines, by the same rule.
        let lines: Vec<String> = items.iter().map(Value::to_string).collect();
        parse_strategy_lines(&lines.join("\n"))
    } else {
        for (i, l) in text.lines().enumerate() {
            if let Some(k) = duplicate_key(l.as_bytes()) {
                return Err(duplicate_in_line(i + 1, k));
            }
        }
        parse_strategy_lines(text)
    };
    records.map_err(|(line, e)| ApiError {
        status: StatusCode::BAD_REQUEST,
        field: None,
        message: format!("line {line}: {e}"),
        line: Some(line),
    })
}

fn duplicate_in_line(line: usize, key: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!("line {line}: {key}: the key appears twice"),
        field: Some(key),
        line: Some(line),
    }
}

/// `POST /strategies/import[?replace=true]`: all or nothing in one
/// transaction, like `rate-ctl strategy import`.
pub async fn import_strategies(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    let flag = |name: &str| match q.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::bad_request(
            Some(name),
            format!("{name}: {other:?} is not true or false"),
        )),
    };
    let replace = flag("replace")?;
    let allow_empty = flag("allow_empty")?;
    let records = import_records(&body)?;
    let (n, v) = st
        .store
        .import(valid_import(records)?, replace, allow_empty, who.name())
        .await
        .map_err(ApiError::from)?;
    st.announce(v);
    ok(json!({"imported": n, "version": v}))
}
