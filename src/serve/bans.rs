//! `POST /api/v1/hosts/{host_id}/bans`: an agent that reaches the store
//! through `rate-ctl serve` hands the penalty box's bans of its host to the
//! store here (issue 32), as an agent on the store writes them itself
//! (`Store::blacklist_ban`: one entry per key, `source: ban`, audited).

use axum::body::Bytes;
use axum::extract::{Path, State};
use serde_json::json;

use super::auth::{AgentToken, Token};
use super::body::{object, ok, Fields};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};
use crate::store::bans::SOURCE_BAN;
use crate::store::record::BlacklistRecord;
use rate_ctl::core::clock::unix_ms;

pub fn router() -> Routes {
    Routes::default().add(
        "/api/v1/hosts/{host_id}/bans",
        &["POST"],
        axum::routing::post(write_ban),
    )
}

/// One ban: `dimension`, `value`, `expires_ms` (Unix ms, in the future),
/// `reason`, `strategy` (the strategy id that raised it). Answers the
/// entry's `id` and whether it is new (`created`).
pub async fn write_ban(
    State(st): State<Shared>,
    Token(who): AgentToken,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    who.may_act_as(&host_id, "write bans")?;
    let o = object(
        &body,
        &["dimension", "value", "expires_ms", "reason", "strategy"],
    )?;
    let f = Fields(&o);
    let expires_ms = f.required("expires_ms", f.uint("expires_ms", i64::MAX as u64)?)?;
    let now = unix_ms();
    if expires_ms <= now {
        return Err(ApiError::invalid(
            "expires_ms",
            format!("{expires_ms} is not in the future (now {now}; Unix ms)"),
        ));
    }
    let strategy = f.required("strategy", f.uint("strategy", u32::MAX as u64)?)? as u32;
    let rec = BlacklistRecord {
        id: 0,
        dimension: f.required("dimension", f.str("dimension")?)?,
        value: f.required("value", f.str("value")?)?,
        expires_ms: Some(expires_ms),
        reason: f.str("reason")?.unwrap_or_default(),
        created_ms: 0,
        source: Some(SOURCE_BAN.into()),
    };
    if !matches!(rec.dimension.as_str(), "ip" | "userid") {
        return Err(ApiError::invalid(
            "dimension",
            "a ban is on ip or userid (the penalty box's dimensions)",
        ));
    }
    let rec = rec
        .into_valid()
        .map_err(|e| ApiError::from_invalid(&e, None))?;
    let agent = format!("ban:{}", host_id.chars().take(24).collect::<String>());
    let w = st.store.blacklist_ban(&rec, strategy, &agent).await?;
    if let Some(v) = w.version {
        st.announce(v);
    }
    ok(json!({"id": w.id, "created": w.created}))
}
