//! The REST API's JSON for strategies, blacklist entries and hosts
//! (docs/API.md), both ways, shared by `serve` and the client; and the
//! import format (JSON lines) read by `rate-ctl strategy import` and
//! `POST /api/v1/strategies/import` alike.

use crate::store::record::{BlacklistRecord, HostRecord, StrategyRecord};
use crate::store::Field;

/// The REST API's JSON for a strategy (docs/API.md): the record's fields
/// with `created_at`/`updated_at` and explicit nulls for absent parameters.
pub fn strategy_api_json(r: &StrategyRecord) -> serde_json::Value {
    serde_json::json!({
        "id": r.id,
        "name": r.name,
        "match": r.conditions,
        "algorithm": r.algorithm.as_str(),
        "rate": r.rate,
        "per": r.per.as_str(),
        "burst": r.burst,
        "action": r.action.as_str(),
        "status": r.status,
        "max_delay_ms": r.max_delay_ms,
        "enabled": r.enabled,
        "scope": r.scope.as_str(),
        "warm_up_ms": r.warm_up_ms,
        "cold_factor": r.cold_factor,
        "priority": r.priority,
        "each": r.each,
        "ipv4_prefix": r.ipv4_prefix,
        "ipv6_prefix": r.ipv6_prefix,
        "on_full": r.on_full.map(|o| o.as_str()),
        "split": r.split().as_str(),
        "version": r.version,
        "created_at": r.created_ms,
        "updated_at": r.updated_ms,
        "count_if": r.count_if,
        "cost_from": r.cost_from,
        "cost_after": r.cost_after,
        "max_keys": r.max_keys,
        "tz": r.tz,
        "ban_after": r.ban_after,
        "ban_within": r.ban_within,
        "ban_for": r.ban_for,
    })
}

/// JSON that is not what docs/API.md describes.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// An item of an answer (a strategy, blacklist entry or host).
    #[error("{what}: {problem}")]
    Item { what: &'static str, problem: String },
    /// A line of an import that is not a strategy; serde's message names
    /// the field.
    #[error("{0}")]
    Line(serde_json::Error),
}

impl WireError {
    fn item(what: &'static str, problem: impl std::fmt::Display) -> WireError {
        WireError::Item {
            what,
            problem: problem.to_string(),
        }
    }
}

/// The inverse of [`strategy_api_json`] (not validated).
pub fn strategy_from_api_json(v: &serde_json::Value) -> Result<StrategyRecord, WireError> {
    let mut v = v.clone();
    let o = v
        .as_object_mut()
        .ok_or_else(|| WireError::item("strategy", "not a JSON object"))?;
    for (from, to) in [("created_at", "created_ms"), ("updated_at", "updated_ms")] {
        if let Some(x) = o.remove(from) {
            o.insert(to.into(), x);
        }
    }
    o.retain(|_, x| !x.is_null());
    if o.get("action").and_then(|a| a.as_str()) == Some("allow") {
        // An allow as POST takes it, without rate fields: the placeholders
        // the record stores for it (see `StrategyRecord::validate`).
        o.entry("algorithm")
            .or_insert_with(|| "fixed_window".into());
        o.entry("rate").or_insert_with(|| 1.into());
    }
    serde_json::from_value(v).map_err(|e| WireError::item("strategy", e))
}

/// Parses one line of an import: the export format (a [`StrategyRecord`]
/// as `--json` prints it) or the API's strategy JSON (`created_at`,
/// explicit nulls), so that `GET /api/v1/strategies` items load too. The
/// error is the export format's (it names the field).
pub fn parse_strategy_line(line: &str) -> Result<StrategyRecord, WireError> {
    match serde_json::from_str::<StrategyRecord>(line) {
        Ok(r) => Ok(r),
        Err(e) => serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| strategy_from_api_json(&v).ok())
            .ok_or(WireError::Line(e)),
    }
}

/// The strategies of an import in JSON lines, each with its 1-based line
/// number (blank lines skipped, but counted); the first line that is not a
/// strategy is `Err((line, message))`. One rule for `rate-ctl strategy
/// import` and `POST /api/v1/strategies/import`, so both name the same line.
pub fn parse_strategy_lines(
    text: &str,
) -> Result<Vec<(usize, StrategyRecord)>, (usize, WireError)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            parse_strategy_line(l)
                .map(|r| (i + 1, r))
                .map_err(|e| (i + 1, e))
        })
        .collect()
}

/// The REST API's JSON for a blacklist entry.
pub fn blacklist_api_json(b: &BlacklistRecord) -> serde_json::Value {
    serde_json::json!({
        "id": b.id,
        "dimension": b.dimension,
        "value": b.value,
        "expires_at": b.expires_ms,
        "reason": b.reason,
        "created_at": b.created_ms,
        "source": b.source.as_deref().unwrap_or("manual"),
    })
}

/// The inverse of [`blacklist_api_json`] (not validated).
pub fn blacklist_from_api_json(v: &serde_json::Value) -> Result<BlacklistRecord, WireError> {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    let missing = |k: &str| WireError::item("blacklist entry", format!("{k} missing"));
    Ok(BlacklistRecord {
        id: v["id"].as_u64().ok_or_else(|| missing("id"))?,
        dimension: s("dimension").ok_or_else(|| missing("dimension"))?,
        value: s("value").ok_or_else(|| missing("value"))?,
        expires_ms: v["expires_at"].as_u64(),
        reason: s("reason").unwrap_or_default(),
        created_ms: v["created_at"].as_u64().unwrap_or(0),
        source: s("source").filter(|s| s != "manual"),
    })
}

/// The REST API's JSON for a host (without its leases) at config `version`
/// and time `now`: fresh when its last heartbeat is at most
/// `freshness_ms` old.
pub fn host_api_json(
    h: &HostRecord,
    version: u64,
    now: u64,
    freshness_ms: u64,
) -> serde_json::Value {
    serde_json::json!({
        "host_id": h.host_id,
        "weight": h.weight,
        "last_heartbeat": h.last_heartbeat_ms,
        "applied_version": h.applied_version,
        "applied_at": h.applied_ms,
        "lag": h.applied_version.map(|a| version.saturating_sub(a)),
        "fresh": h.last_heartbeat_ms.is_some_and(|hb| hb.saturating_add(freshness_ms) >= now),
        "publish_error": h.publish_error,
        "publish_error_at": h.publish_error_ms,
    })
}

/// The inverse of [`host_api_json`] (not validated): a host of
/// `GET /api/v1/hosts`, of a report's answer or of a snapshot.
///
/// A host of the REST API's host JSON (`GET /api/v1/hosts`, the answer of
/// a host report): the fields a [`HostRecord`] holds (not validated).
pub fn host_from_api_json(v: &serde_json::Value) -> Result<HostRecord, WireError> {
    let missing = |k: &str| WireError::item("host", format!("{k} missing"));
    Ok(HostRecord {
        host_id: v["host_id"]
            .as_str()
            .ok_or_else(|| missing("host_id"))?
            .to_string(),
        weight: v["weight"]
            .as_u64()
            .and_then(|w| u32::try_from(w).ok())
            .ok_or_else(|| missing("weight"))?,
        last_heartbeat_ms: v["last_heartbeat"].as_u64(),
        applied_version: v["applied_version"].as_u64(),
        applied_ms: v["applied_at"].as_u64(),
        publish_error: v["publish_error"].as_str().map(str::to_string),
        publish_error_ms: v["publish_error_at"].as_u64(),
    })
}

/// A field's name in the API (docs/API.md): the one place it is decided.
/// A condition is `match.<dimension>` when the record is at hand.
pub fn api_name(field: Field, rec: Option<&StrategyRecord>) -> String {
    match field {
        Field::Id => "id".into(),
        Field::Name => "name".into(),
        Field::Conditions => "match".into(),
        Field::Condition(i) => rec
            .and_then(|r| r.conditions.keys().nth(i))
            .map(|d| format!("match.{d}"))
            .unwrap_or_else(|| "match".into()),
        Field::Algorithm => "algorithm".into(),
        Field::Rate => "rate".into(),
        Field::Per => "per".into(),
        Field::Burst => "burst".into(),
        Field::Action => "action".into(),
        Field::Status => "status".into(),
        Field::MaxDelayMs => "max_delay_ms".into(),
        Field::WarmUpMs => "warm_up_ms".into(),
        Field::ColdFactor => "cold_factor".into(),
        Field::Priority => "priority".into(),
        Field::Each => "each".into(),
        Field::Ipv4Prefix => "ipv4_prefix".into(),
        Field::Ipv6Prefix => "ipv6_prefix".into(),
        Field::OnFull => "on_full".into(),
        Field::Enabled => "enabled".into(),
        Field::Scope => "scope".into(),
        Field::Dimension => "dimension".into(),
        Field::Value => "value".into(),
        Field::Expires => "expires".into(),
        Field::Reason => "reason".into(),
        Field::HostId => "host_id".into(),
        Field::Weight => "weight".into(),
        Field::Column(c) => c.into(),
        Field::CountIf => "count_if".into(),
        Field::CostFrom => "cost_from".into(),
        Field::CostAfter => "cost_after".into(),
        Field::Tz => "tz".into(),
    }
}

/// The field an API name stands for (the inverse of [`api_name`]), for
/// the client reading an error answer; `None` for a name of no field.
pub fn field_of_api_name(name: &str) -> Option<Field> {
    Some(match name {
        "id" => Field::Id,
        "name" => Field::Name,
        n if n == "match" || n.starts_with("match.") => Field::Conditions,
        "algorithm" => Field::Algorithm,
        "rate" => Field::Rate,
        "per" => Field::Per,
        "burst" => Field::Burst,
        "action" => Field::Action,
        "status" => Field::Status,
        "max_delay_ms" => Field::MaxDelayMs,
        "warm_up_ms" => Field::WarmUpMs,
        "cold_factor" => Field::ColdFactor,
        "priority" => Field::Priority,
        n if n == "each" || n.starts_with("each[") => Field::Each,
        "ipv4_prefix" => Field::Ipv4Prefix,
        "ipv6_prefix" => Field::Ipv6Prefix,
        "on_full" => Field::OnFull,
        "enabled" => Field::Enabled,
        "scope" => Field::Scope,
        "dimension" => Field::Dimension,
        "value" => Field::Value,
        "expires" => Field::Expires,
        "reason" => Field::Reason,
        "host_id" => Field::HostId,
        "weight" => Field::Weight,
        "count_if" => Field::CountIf,
        "cost_from" => Field::CostFrom,
        "cost_after" => Field::CostAfter,
        "tz" => Field::Tz,
        "max_keys" => Field::Column("max_keys"),
        "ban_after" => Field::Column("ban_after"),
        "ban_within" => Field::Column("ban_within"),
        "ban_for" => Field::Column("ban_for"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_lines_are_numbered_counting_blank_ones() {
        let good = r#"{"name":"a","algorithm":"fixed_window","rate":1}"#;
        let recs = parse_strategy_lines(&format!(
            "{good}\n\n  \n{}\n",
            good.replace("\"a\"", "\"b\"")
        ))
        .unwrap();
        let lines: Vec<(usize, &str)> = recs.iter().map(|(n, r)| (*n, r.name.as_str())).collect();
        assert_eq!(lines, [(1, "a"), (4, "b")]);
        let (line, e) = parse_strategy_lines(&format!("{good}\n\n{{\"name\":1}}\n")).unwrap_err();
        assert_eq!(line, 3, "{e}");
    }

    /// Every field set (none at its default), so a field one side forgets
    /// fails the round trip.
    fn full_strategy() -> StrategyRecord {
        serde_json::from_value(serde_json::json!({
            "id": 7, "name": "api", "match": {"path": "/api/*", "method": "POST"},
            "algorithm": "token_bucket", "rate": 100, "per": "minute", "burst": 20,
            "action": "reject", "status": 503, "max_delay_ms": 250, "enabled": false,
            "scope": "cluster", "warm_up_ms": 5000, "cold_factor": 4, "priority": -3,
            "each": ["ip"], "ipv4_prefix": 24, "ipv6_prefix": 56, "on_full": "reject",
            "split": "demand", "created_ms": 11, "updated_ms": 12, "version": 13,
            "count_if": "4xx", "cost_from": "arg:n", "cost_after": "header:x-cost",
            "max_keys": 1000, "tz": "Europe/Berlin"
        }))
        .unwrap()
    }

    #[test]
    fn strategy_api_json_round_trips() {
        let r = full_strategy();
        assert_eq!(strategy_from_api_json(&strategy_api_json(&r)).unwrap(), r);
        // An import line in either format gives the same record.
        let export = serde_json::to_string(&r).unwrap();
        let api = strategy_api_json(&r).to_string();
        assert_eq!(parse_strategy_line(&export).unwrap(), r);
        assert_eq!(parse_strategy_line(&api).unwrap(), r);
    }

    #[test]
    fn blacklist_api_json_round_trips() {
        for expires_ms in [Some(99), None] {
            let b = BlacklistRecord {
                id: 3,
                dimension: "ip".into(),
                value: "192.0.2.0/24".into(),
                expires_ms,
                reason: "scraper".into(),
                created_ms: 42,
                source: expires_ms.map(|_| "ban".into()),
            };
            assert_eq!(blacklist_from_api_json(&blacklist_api_json(&b)).unwrap(), b);
        }
    }

    #[test]
    fn host_api_json_round_trips() {
        let h = HostRecord {
            host_id: "web-1".into(),
            weight: 3,
            last_heartbeat_ms: Some(1_000),
            applied_version: Some(7),
            applied_ms: Some(900),
            publish_error: Some("capacity".into()),
            publish_error_ms: Some(950),
        };
        let v = host_api_json(&h, 9, 1_500, 1_000);
        assert_eq!(
            (v["lag"].as_u64(), v["fresh"].as_bool()),
            (Some(2), Some(true))
        );
        assert_eq!(host_from_api_json(&v).unwrap(), h);
    }

    #[test]
    fn host_api_json_is_read_back() {
        let h = host_from_api_json(&serde_json::json!({"host_id": "web-1", "weight": 3,
            "last_heartbeat": 5, "applied_version": 7, "applied_at": null, "lag": 0}))
        .unwrap();
        assert_eq!(
            h,
            HostRecord {
                host_id: "web-1".into(),
                weight: 3,
                last_heartbeat_ms: Some(5),
                applied_version: Some(7),
                applied_ms: None,
                publish_error: None,
                publish_error_ms: None,
            }
        );
        let e = host_from_api_json(&serde_json::json!({"weight": 3})).unwrap_err();
        assert!(e.to_string().contains("host_id"), "{e}");
        let e = host_from_api_json(&serde_json::json!({"host_id": "a", "weight": 1u64 << 32}))
            .unwrap_err();
        assert!(e.to_string().contains("weight"), "{e}");
    }
}
