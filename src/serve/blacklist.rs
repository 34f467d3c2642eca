//! `/api/v1/blacklist`: list, add, remove.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get};
use serde_json::{json, Value};

use super::auth::{AdminToken, ReadToken, Token};
use super::body::{json_response, object, ok, parse_id, Fields};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};
use crate::store::json::blacklist_api_json;
use crate::store::record::BlacklistRecord;
use rate_ctl::core::clock::unix_ms;

pub fn router() -> Routes {
    Routes::default()
        .add(
            "/api/v1/blacklist",
            &["GET", "POST"],
            get(list_blacklist).post(add_blacklist),
        )
        .add("/api/v1/blacklist/{id}", &["DELETE"], delete(rm_blacklist))
}

pub async fn list_blacklist(State(st): State<Shared>, _: ReadToken) -> ApiResult {
    let snap = st.store.snapshot().await?;
    let list: Vec<Value> = snap
        .blacklist
        .iter()
        .map(|b| blacklist_api_json(b))
        .collect();
    ok(json!({"version": snap.version, "entries": list}))
}

pub async fn add_blacklist(
    State(st): State<Shared>,
    Token(who): AdminToken,
    body: Bytes,
) -> ApiResult {
    let o = object(
        &body,
        &["dimension", "value", "expires_in_s", "expires_at", "reason"],
    )?;
    let f = Fields(&o);
    let now = unix_ms();
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
    let rec = BlacklistRecord {
        id: 0,
        dimension: f.required("dimension", f.str("dimension")?)?,
        value: f.required("value", f.str("value")?)?,
        expires_ms,
        reason: f.str("reason")?.unwrap_or_default(),
        created_ms: 0,
        source: None,
    };
    let rec = rec
        .into_valid()
        .map_err(|e| ApiError::from_invalid(&e, None))?;
    let (stored, v) = st.store.blacklist_add_full(&rec, who.name()).await?;
    st.announce(v);
    Ok(json_response(
        StatusCode::CREATED,
        blacklist_api_json(&stored),
    ))
}

pub async fn rm_blacklist(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(id): Path<String>,
) -> ApiResult {
    let id = parse_id(&id, "blacklist entry")?;
    let v = st.store.blacklist_rm(id, who.name()).await?;
    st.announce(v);
    Ok(StatusCode::NO_CONTENT.into_response())
}
