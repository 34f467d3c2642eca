//! `/api/v1/audit`: the audit log, newest first.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::routing::get;
use serde_json::{json, Value};

use super::auth::ReadToken;
use super::body::ok;
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};

pub fn router() -> Routes {
    Routes::default().add("/api/v1/audit", &["GET"], get(audit))
}

pub async fn audit(
    State(st): State<Shared>,
    _: ReadToken,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
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
