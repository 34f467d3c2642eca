//! `/api/v1/tokens`: named API tokens (admin only): list, create (the
//! secret is in the answer, once), revoke.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use serde_json::json;

use super::auth::{AdminToken, Token};
use super::body::{json_response, object, ok, Fields};
use super::error::ApiResult;
use super::{Routes, Shared};
use crate::store::tokens::{token_json, Role};

pub fn router() -> Routes {
    Routes::default()
        .add(
            "/api/v1/tokens",
            &["GET", "POST"],
            get(list_tokens).post(create_token),
        )
        .add("/api/v1/tokens/{name}", &["DELETE"], delete(revoke_token))
}

pub async fn list_tokens(State(st): State<Shared>, _: AdminToken) -> ApiResult {
    let tokens: Vec<_> = st
        .store
        .list_tokens()
        .await?
        .iter()
        .map(token_json)
        .collect();
    ok(json!({"tokens": tokens}))
}

pub async fn create_token(
    State(st): State<Shared>,
    Token(who): AdminToken,
    body: Bytes,
) -> ApiResult {
    let o = object(&body, &["name", "role", "host"])?;
    let f = Fields(&o);
    let name = f.required("name", f.str("name")?)?;
    let role: Role = f.required("role", f.parsed("role")?)?;
    let host = f.str("host")?;
    let (rec, secret) = st
        .store
        .create_token(&name, role, host.as_deref(), who.name())
        .await?;
    let mut v = token_json(&rec);
    v["secret"] = json!(secret);
    Ok(json_response(StatusCode::CREATED, v))
}

pub async fn revoke_token(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(name): Path<String>,
) -> ApiResult {
    st.store.revoke_token(&name, who.name()).await?;
    ok(json!({"revoked": name}))
}
