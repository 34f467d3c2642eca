//! `/api/v1/snapshot?after=V`: the agents' long-poll for the full config.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::routing::get;
use serde_json::json;

use super::auth::SnapshotToken;
use super::body::{ok, query_param};
use super::error::ApiResult;
use super::hosts::hosts_json;
use super::{Routes, Shared};
use crate::client::wire::{blacklist_api_json, strategy_api_json};

pub fn router() -> Routes {
    Routes::default().add("/api/v1/snapshot", &["GET"], get(snapshot))
}

pub async fn snapshot(
    State(st): State<Shared>,
    _: SnapshotToken,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let after = query_param(
        &q,
        "after",
        |_: &u64| true,
        "after: must be a config version",
    )?
    .unwrap_or(0);
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
        "strategies": snap.strategies.iter().map(|r| strategy_api_json(r)).collect::<Vec<_>>(),
        "blacklist": snap.blacklist.iter().map(|b| blacklist_api_json(b)).collect::<Vec<_>>(),
        "hosts": hosts,
    }))
}
