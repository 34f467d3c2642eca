//! `/api/v1/hosts`: the hosts with their freshness and lag, weights, and
//! the agents' reports (heartbeat, applied version, counters).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post, put};
use serde_json::{json, Value};

use super::auth::{AdminToken, AgentToken, ReadToken, Token};
use super::body::{object, ok, Fields};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};
use crate::client::protocol::{acks_from, counters_from, granted_leases_json};
use crate::store::json::host_api_json;
use crate::store::LeaseRow;
use rate_ctl::core::clock::unix_ms;

pub fn router() -> Routes {
    Routes::default()
        .add("/api/v1/hosts", &["GET"], get(list_hosts))
        .add("/api/v1/hosts/{host_id}", &["PUT"], put(set_host_weight))
        .add("/api/v1/hosts/{host_id}/report", &["POST"], post(report))
}

pub async fn hosts_json(st: &Shared) -> Result<(u64, Vec<Value>), ApiError> {
    let version = st.store.version().await?;
    let now = unix_ms();
    let leases = st.store.leases(None).await?;
    let hosts = st
        .store
        .hosts()
        .await?
        .iter()
        .map(|h| {
            let mut v = host_api_json(h, version, now, st.freshness_ms);
            v["leases"] = leases_json(&leases, &h.host_id, now);
            v
        })
        .collect();
    Ok((version, hosts))
}

/// A host's leases (`split: demand` strategies): leased rate, the demand
/// it was computed from, lease age (since the leader granted or renewed
/// it) and what the host says it enforces.
fn leases_json(leases: &[LeaseRow], host: &str, now: u64) -> Value {
    leases
        .iter()
        .filter(|l| l.host_id == host)
        .map(|l| {
            json!({
                "strategy": l.strategy_id,
                "rate": l.value,
                "demand": l.demand_milli as f64 / 1000.0,
                "age_ms": now.saturating_sub(l.granted_ms),
                "expires": l.expires_ms,
                "epoch": l.epoch,
                "applied_rate": l.applied_value,
                "applied_epoch": l.applied_epoch,
            })
        })
        .collect()
}

pub async fn list_hosts(State(st): State<Shared>, _: ReadToken) -> ApiResult {
    let (version, hosts) = hosts_json(&st).await?;
    let leader = st
        .store
        .leader()
        .await?
        .filter(|l| !l.holder.is_empty())
        .map(|l| {
            json!({"holder": l.holder, "term": l.term, "expires": l.expires_ms,
               "valid": l.expires_ms >= unix_ms()})
        });
    ok(json!({"version": version, "hosts": hosts, "leader": leader}))
}

pub async fn set_host_weight(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
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
    Token(who): AgentToken,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let o = object(
        &body,
        &[
            "weight",
            "applied_version",
            "counters",
            "publish_error",
            "publish_error_at",
            "leases",
        ],
    )?;
    let f = Fields(&o);
    let weight = f.uint("weight", u32::MAX as u64)?.map(|w| w as u32);
    // A named agent token reports as its own host only, and sets no weight
    // (weights are the admin's: one host's agent could otherwise take the
    // fleet's share of every cluster rate).
    who.may_act_as(&host_id, "report")?;
    if who.named && who.kind == super::auth::Kind::Agent && weight.is_some() {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            Some("weight"),
            "weight: an agent token may not set a weight (the admin sets it: PUT /api/v1/hosts/{id})",
        ));
    }
    let applied = f.uint("applied_version", i64::MAX as u64)?;
    // Absent: unchanged (an older agent); null: cleared; a string: the
    // agent's last publish refusal, at `publish_error_at` (default now).
    let publish_error = match o.get("publish_error") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(m)) => {
            let at = f.uint("publish_error_at", i64::MAX as u64)?;
            Some(Some((m.clone(), at.unwrap_or_else(unix_ms))))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "publish_error",
                "must be a string or null",
            ))
        }
    };
    let counters = counters_from(f.present("counters"))?;
    let acks = acks_from(f.present("leases"))?;
    st.store
        .report(&host_id, weight, applied, &counters, who.name())
        .await?;
    st.store.ack_leases(&host_id, unix_ms(), &acks).await?;
    if let Some(e) = publish_error {
        st.store
            .set_publish_error(&host_id, e.as_ref().map(|(m, at)| (m.as_str(), *at)))
            .await?;
    }
    let (version, hosts) = hosts_json(&st).await?;
    let leases = granted_leases_json(&st.store.leases(Some(&host_id)).await?);
    ok(json!({"ok": true, "version": version, "hosts": hosts, "leases": leases}))
}
