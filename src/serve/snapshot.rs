//! `/api/v1/snapshot?after=V`: the agents' long-poll for the full config.
//! With `delta=1` (issue 29) and a store whose change log covers every
//! version after V, the answer carries only what changed
//! ([`crate::client::protocol::delta_json`]): one strategy's JSON for a
//! one-strategy change, whatever the table's size; otherwise the full one.
//!
//! The strategies and blacklist of one config version are read from the
//! store and serialised once per instance, and every long-poll woken by
//! that version shares them ([`SnapshotCache`]; the number of builds is
//! `rate_ctl_serve_snapshot_builds_total` in `/metrics`). The hosts, which
//! change without a version (heartbeats, leases), are read per answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;
use tracing::debug;

use super::auth::SnapshotToken;
use super::body::query_param;
use super::error::ApiError;
use super::hosts::hosts_json;
use super::{Routes, Shared};
use crate::client::protocol::{delta_json, json_array, snapshot_json};
use crate::store::json::{blacklist_api_json, strategy_api_json};

pub fn router() -> Routes {
    Routes::default().add("/api/v1/snapshot", &["GET"], get(snapshot))
}

/// One version's strategies and blacklist, as JSON arrays.
pub struct Built {
    pub version: u64,
    strategies: String,
    blacklist: String,
}

/// The last built snapshot; one build at a time (the others wait for it
/// and take its result).
#[derive(Default)]
pub struct SnapshotCache {
    last: tokio::sync::Mutex<Option<Arc<Built>>>,
    /// Snapshots read from the store and serialised.
    pub builds: AtomicU64,
}

impl SnapshotCache {
    /// The snapshot of at least version `at_least` (the store's version
    /// just read), built only if the last one is older.
    pub async fn get(&self, st: &Shared, at_least: u64) -> Result<Arc<Built>, ApiError> {
        let mut last = self.last.lock().await;
        if let Some(b) = last.as_ref().filter(|b| b.version >= at_least) {
            return Ok(b.clone());
        }
        let snap = st.store.snapshot().await?;
        let strategies = json_array(&snap.strategies, |r| strategy_api_json(r));
        let blacklist = json_array(&snap.blacklist, |b| blacklist_api_json(b));
        let n = self.builds.fetch_add(1, Ordering::Relaxed) + 1;
        debug!(
            version = snap.version,
            strategies = snap.strategies.len(),
            builds = n,
            "snapshot built"
        );
        let b = Arc::new(Built {
            version: snap.version,
            strategies,
            blacklist,
        });
        *last = Some(b.clone());
        Ok(b)
    }
}

pub async fn snapshot(
    State(st): State<Shared>,
    _: SnapshotToken,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
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
    let delta =
        query_param(&q, "delta", |d: &u8| *d <= 1, "delta: must be 0 or 1")?.unwrap_or(0) == 1;
    if delta && after > 0 {
        if let Some(c) = st.store.changes_since(after).await? {
            if c.version > after {
                let (_, hosts) = hosts_json(&st).await?;
                let hosts = Value::from(hosts).to_string();
                let strategies = json_array(&c.strategies, |r| strategy_api_json(r));
                let blacklist = c
                    .blacklist
                    .as_ref()
                    .map(|b| json_array(b, |b| blacklist_api_json(b)));
                let mut removed = c.removed.clone();
                removed.extend(c.bad_rows.iter().filter_map(|b| u32::try_from(b.id).ok()));
                let body = delta_json(
                    c.version,
                    after,
                    &strategies,
                    &removed,
                    blacklist.as_deref(),
                    &hosts,
                );
                return Ok((
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    body,
                )
                    .into_response());
            }
        }
    }
    let now = st.store.version().await?;
    let snap = st.snapshots.get(&st, now).await?;
    let (_, hosts) = hosts_json(&st).await?;
    let hosts = Value::from(hosts).to_string();
    // The cached parts are serialised JSON arrays: spliced in as they are.
    let body = snapshot_json(
        snap.version,
        snap.version > after,
        &snap.strategies,
        &snap.blacklist,
        &hosts,
    );
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}
