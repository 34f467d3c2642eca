//! `/api/v1/audit`: the audit log, newest first.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::routing::get;
use serde_json::{json, Value};

use super::auth::ReadToken;
use super::body::{ok, query_in, query_param};
use super::error::ApiResult;
use super::{Routes, Shared};

pub fn router() -> Routes {
    Routes::default().add("/api/v1/audit", &["GET"], get(audit))
}

pub async fn audit(
    State(st): State<Shared>,
    _: ReadToken,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let limit = query_in(&q, "limit", 1..=1000, 100)?;
    let before = query_param(
        &q,
        "before_id",
        |_: &u64| true,
        "before_id: must be an entry id",
    )?;
    let entries: Vec<Value> = st
        .store
        .audit_list(limit, before)
        .await?
        .into_iter()
        .map(|e| {
            json!({"id": e.id, "at": e.at_ms, "token": e.token, "role": e.role, "client": e.client, "action": e.action,
                   "target": e.target, "before": e.before, "after": e.after})
        })
        .collect();
    ok(json!({"entries": entries}))
}
