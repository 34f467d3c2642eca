//! The agent protocol of `rate-ctl serve` (docs/API.md), each shape written
//! once beside its inverse: the host report an agent sends
//! (`POST /api/v1/hosts/{id}/report`: counters and lease
//! acknowledgements), the leases of its answer, and the snapshot long-poll
//! (`GET /api/v1/snapshot`). The agent (agent/source.rs) writes reports and
//! reads answers and snapshots; serve (serve/hosts.rs, serve/snapshot.rs)
//! reads reports and writes answers and snapshots. The records inside them
//! are the store's JSON ([`crate::store::json`]).

use serde_json::{json, Value};

use crate::store::json::{blacklist_from_api_json, host_from_api_json, strategy_from_api_json};
use crate::store::record::{BlacklistRecord, HostRecord, StrategyRecord};
use crate::store::{BadRow, Changes, CounterSample, Invalid, LeaseRow, Snapshot, StoreError};

/// What this host enforces for a `split: demand` strategy: strategy id,
/// lease epoch, value.
pub type LeaseAck = (u32, u64, u64);

/// A part of a report that is not what docs/API.md describes: the field
/// (`counters[2].passed`) and what is wrong with it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct BadField {
    pub field: String,
    pub problem: &'static str,
}

fn bad(field: String, problem: &'static str) -> BadField {
    BadField { field, problem }
}

/// A report's `counters`: the slot counters that moved since the last one.
pub fn counters_json(counters: &[CounterSample]) -> Value {
    counters
        .iter()
        .map(
            |c| json!({"id": c.id, "passed": c.passed, "limited": c.limited, "delayed": c.delayed}),
        )
        .collect()
}

/// One object of a report's list (`counters`, `leases`), read field by
/// field; errors name `list[i].field`.
struct Item<'a> {
    list: &'static str,
    i: usize,
    v: &'a Value,
}

impl Item<'_> {
    fn bad(&self, k: &str, problem: &'static str) -> BadField {
        bad(format!("{}[{}].{k}", self.list, self.i), problem)
    }

    /// A whole number up to `max`; null or absent is 0 if `null_is_zero`.
    fn number(&self, k: &str, max: u64, null_is_zero: bool) -> Result<u64, BadField> {
        match &self.v[k] {
            Value::Null if null_is_zero => Ok(0),
            v => v
                .as_u64()
                .filter(|n| *n <= max)
                .ok_or_else(|| self.bad(k, "must be a whole number")),
        }
    }

    /// A strategy id (0 refused unless `zero_ok`).
    fn strategy(&self, k: &str, max: u64, zero_ok: bool) -> Result<u32, BadField> {
        u32::try_from(self.number(k, max, false)?)
            .ok()
            .filter(|id| zero_ok || *id > 0)
            .ok_or_else(|| self.bad(k, "must be a strategy id"))
    }
}

/// A report's list `list` item by item; absent is empty.
fn items<T>(
    v: Option<&Value>,
    list: &'static str,
    item: impl Fn(Item) -> Result<T, BadField>,
) -> Result<Vec<T>, BadField> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let a = v
        .as_array()
        .ok_or_else(|| bad(list.into(), "must be a list"))?;
    a.iter()
        .enumerate()
        .map(|(i, v)| item(Item { list, i, v }))
        .collect()
}

/// The inverse of [`counters_json`]; absent is none, a missing or null
/// count is 0.
pub fn counters_from(v: Option<&Value>) -> Result<Vec<CounterSample>, BadField> {
    items(v, "counters", |c| {
        Ok(CounterSample {
            id: c.strategy("id", u64::MAX, false)?,
            passed: c.number("passed", u64::MAX, true)?,
            limited: c.number("limited", u64::MAX, true)?,
            delayed: c.number("delayed", u64::MAX, true)?,
        })
    })
}

/// A report's `leases`: what the host enforces for each `split: demand`
/// strategy, `[{"strategy", "epoch", "value"}]`.
pub fn acks_json(acks: &[LeaseAck]) -> Value {
    acks.iter()
        .map(|a| json!({"strategy": a.0, "epoch": a.1, "value": a.2}))
        .collect()
}

/// The inverse of [`acks_json`]; absent is none.
pub fn acks_from(v: Option<&Value>) -> Result<Vec<LeaseAck>, BadField> {
    const MAX: u64 = i64::MAX as u64;
    items(v, "leases", |l| {
        Ok((
            l.strategy("strategy", MAX, true)?,
            l.number("epoch", MAX, false)?,
            l.number("value", MAX, false)?,
        ))
    })
}

/// A report answer's `leases`: the host's leases as the leader granted
/// them.
pub fn granted_leases_json(leases: &[LeaseRow]) -> Value {
    leases
        .iter()
        .map(|l| {
            json!({"strategy": l.strategy_id, "value": l.value, "epoch": l.epoch,
                   "expires": l.expires_ms, "granted": l.granted_ms})
        })
        .collect()
}

/// The inverse of [`granted_leases_json`] for `host_id` (the fields the answer
/// does not carry are zero or none); an entry that is not a lease is
/// skipped.
pub fn granted_leases_from(v: &Value, host_id: &str) -> Vec<LeaseRow> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            Some(LeaseRow {
                strategy_id: u32::try_from(l["strategy"].as_u64()?).ok()?,
                host_id: host_id.to_string(),
                value: l["value"].as_u64()?,
                epoch: l["epoch"].as_u64()?,
                expires_ms: l["expires"].as_u64()?,
                granted_ms: l["granted"].as_u64().unwrap_or(0),
                demand_milli: 0,
                window_start_ms: 0,
                window_admitted: 0,
                applied_epoch: None,
                applied_value: None,
                applied_ms: None,
            })
        })
        .collect()
}

/// The hosts of an answer (a report's or a snapshot's `hosts`: each the
/// store's host JSON); an entry that is not a host is skipped.
pub fn hosts_from(v: &Value) -> Vec<HostRecord> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| host_from_api_json(h).ok())
        .collect()
}

/// A list as a serialised JSON array (a part of [`snapshot_json`]).
pub fn json_array<T>(items: &[T], json: impl Fn(&T) -> Value) -> String {
    Value::from(items.iter().map(json).collect::<Vec<_>>()).to_string()
}

/// A snapshot answer from its parts, each already serialised JSON (the
/// strategies and blacklist as arrays of the store's JSON, shared by every
/// long-poll of one version; the hosts as an array): spliced in as they are.
pub fn snapshot_json(
    version: u64,
    changed: bool,
    strategies: &str,
    blacklist: &str,
    hosts: &str,
) -> String {
    format!(
        "{{\"version\":{version},\"changed\":{changed},\"strategies\":{strategies},\"blacklist\":{blacklist},\"hosts\":{hosts}}}"
    )
}

/// Whether a snapshot answer carries a newer version than asked for
/// (absent: assume it does).
pub fn snapshot_changed(v: &Value) -> bool {
    v["changed"].as_bool().unwrap_or(true)
}

/// The inverse of [`snapshot_json`]: the store's [`Snapshot`]; strategies
/// and blacklist entries are validated here, once (what an HTTP store
/// sends is read like a row: one implementation,
/// [`crate::store::record::StrategyRecord::validate`]).
pub fn snapshot_from(v: &Value) -> Result<Snapshot, StoreError> {
    let version = v["version"]
        .as_u64()
        .ok_or_else(|| StoreError::Http("snapshot: no version".into()))?;
    let mut strategies = Vec::new();
    let mut bad_rows = Vec::new();
    for s in v["strategies"].as_array().into_iter().flatten() {
        let id = s["id"].as_i64().unwrap_or(-1);
        let rec = strategy_from_api_json(s).map_err(|e| Invalid::whole(None, e.to_string()));
        match rec.and_then(StrategyRecord::into_valid) {
            Ok(r) => strategies.push(r),
            Err(reason) => bad_rows.push(BadRow { id, reason }),
        }
    }
    let mut blacklist = Vec::new();
    for b in v["blacklist"].as_array().into_iter().flatten() {
        if let Ok(Ok(r)) = blacklist_from_api_json(b).map(BlacklistRecord::into_valid) {
            blacklist.push(r);
        }
    }
    Ok(Snapshot {
        version,
        strategies,
        bad_rows,
        blacklist,
    })
}

/// A delta answer of the long-poll (`delta=1`, issue 29): like
/// [`snapshot_json`] with only the strategies changed after `after`, the
/// ids changed that are gone (or invalid), and the blacklist only when it
/// changed (`blacklist_changed`).
pub fn delta_json(
    version: u64,
    after: u64,
    strategies: &str,
    removed: &[u32],
    blacklist: Option<&str>,
    hosts: &str,
) -> String {
    let removed = Value::from(removed.to_vec()).to_string();
    format!(
        "{{\"version\":{version},\"changed\":true,\"delta\":{{\"after\":{after},\"removed\":{removed},\"blacklist_changed\":{}}},\"strategies\":{strategies},\"blacklist\":{},\"hosts\":{hosts}}}",
        blacklist.is_some(),
        blacklist.unwrap_or("[]"),
    )
}

/// The inverse of [`delta_json`]: `None` for a full answer (no `delta`,
/// e.g. from a serve without deltas); an error for a delta from another
/// version than `after`.
pub fn delta_from(v: &Value, after: u64) -> Result<Option<Changes>, StoreError> {
    let Some(d) = v.get("delta").filter(|d| d.is_object()) else {
        return Ok(None);
    };
    if d["after"].as_u64() != Some(after) {
        return Err(StoreError::Http(format!(
            "snapshot: a delta after {} answered the long-poll after {after}",
            d["after"]
        )));
    }
    let snap = snapshot_from(v)?;
    let mut removed = Vec::new();
    for id in d["removed"].as_array().into_iter().flatten() {
        let id = id
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| StoreError::Http("snapshot: delta.removed: not an id".into()))?;
        removed.push(id);
    }
    Ok(Some(Changes {
        version: snap.version,
        strategies: snap.strategies,
        bad_rows: snap.bad_rows,
        removed,
        blacklist: (d["blacklist_changed"].as_bool() == Some(true)).then_some(snap.blacklist),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::json::{blacklist_api_json, host_api_json, strategy_api_json};

    #[test]
    fn counters_round_trip_and_name_the_bad_field() {
        let c = [
            CounterSample {
                id: 1,
                passed: 10,
                limited: 2,
                delayed: 0,
            },
            CounterSample {
                id: 9,
                passed: 0,
                limited: 0,
                delayed: 5,
            },
        ];
        assert_eq!(counters_from(Some(&counters_json(&c))).unwrap(), c);
        assert_eq!(counters_from(None).unwrap(), []);
        let e = counters_from(Some(&json!([{"id": 1}, {"id": 2, "passed": -1}]))).unwrap_err();
        assert_eq!(e.to_string(), "counters[1].passed: must be a whole number");
        let e = counters_from(Some(&json!([{"id": 0}]))).unwrap_err();
        assert_eq!(e.to_string(), "counters[0].id: must be a strategy id");
        let e = counters_from(Some(&json!({}))).unwrap_err();
        assert_eq!(e.to_string(), "counters: must be a list");
    }

    #[test]
    fn acks_round_trip_and_name_the_bad_field() {
        let a = [(3, 7, 500), (4, 1, 0)];
        assert_eq!(acks_from(Some(&acks_json(&a))).unwrap(), a);
        let e = acks_from(Some(
            &json!([{"strategy": 1u64 << 32, "epoch": 1, "value": 1}]),
        ))
        .unwrap_err();
        assert_eq!(e.to_string(), "leases[0].strategy: must be a strategy id");
        let e = acks_from(Some(&json!([{"strategy": 1, "value": 1}]))).unwrap_err();
        assert_eq!(e.to_string(), "leases[0].epoch: must be a whole number");
    }

    #[test]
    fn granted_leases_round_trip() {
        // A lease row as the leader stores it: the answer carries what the
        // host enforces, not the leader's bookkeeping.
        let row = LeaseRow {
            strategy_id: 5,
            host_id: "web-2".into(),
            value: 120,
            epoch: 4,
            expires_ms: 9_000,
            granted_ms: 8_000,
            demand_milli: 1_500,
            window_start_ms: 7_000,
            window_admitted: 33,
            applied_epoch: Some(3),
            applied_value: Some(100),
            applied_ms: Some(8_500),
        };
        let mut v = granted_leases_json(std::slice::from_ref(&row));
        v.as_array_mut().unwrap().push(json!({"strategy": "x"}));
        let back = granted_leases_from(&v, "web-2");
        let carried = |l: &LeaseRow| {
            (
                l.strategy_id,
                l.host_id.clone(),
                l.value,
                l.epoch,
                l.expires_ms,
                l.granted_ms,
            )
        };
        assert_eq!(
            back.iter().map(carried).collect::<Vec<_>>(),
            [carried(&row)]
        );
        assert_eq!((back[0].demand_milli, back[0].applied_epoch), (0, None));
    }

    #[test]
    fn snapshot_round_trips() {
        let s: StrategyRecord = serde_json::from_value(json!({
            "id": 2, "name": "api", "match": {"path": "/api/*"},
            "algorithm": "fixed_window", "rate": 10, "per": "second"
        }))
        .unwrap();
        let bad: StrategyRecord = serde_json::from_value(json!({
            "id": 3, "name": "", "algorithm": "fixed_window", "rate": 10
        }))
        .unwrap();
        let b = BlacklistRecord {
            id: 1,
            dimension: "ip".into(),
            value: "192.0.2.1".into(),
            expires_ms: None,
            reason: "r".into(),
            created_ms: 5,
            source: None,
        };
        let h = HostRecord {
            host_id: "web-1".into(),
            weight: 2,
            last_heartbeat_ms: Some(10),
            applied_version: Some(6),
            applied_ms: Some(9),
            publish_error: None,
            publish_error_ms: None,
        };
        let body = snapshot_json(
            7,
            true,
            &json_array(&[s, bad], strategy_api_json),
            &json_array(&[b], blacklist_api_json),
            &json_array(std::slice::from_ref(&h), |h| host_api_json(h, 7, 10, 1_000)),
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(snapshot_changed(&v));
        let snap = snapshot_from(&v).unwrap();
        assert_eq!(snap.version, 7);
        let names: Vec<&str> = snap.strategies.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["api"]);
        assert_eq!(snap.bad_rows.len(), 1);
        assert_eq!(snap.bad_rows[0].id, 3);
        assert_eq!(snap.blacklist.len(), 1);
        assert_eq!(snap.blacklist[0].value, "192.0.2.1");
        assert_eq!(hosts_from(&v["hosts"]), [h]);
    }

    #[test]
    fn delta_round_trips_and_a_delta_from_another_version_is_refused() {
        let s: StrategyRecord = serde_json::from_value(json!({
            "id": 2, "name": "api", "algorithm": "fixed_window", "rate": 10, "per": "second"
        }))
        .unwrap();
        let body = delta_json(
            9,
            7,
            &json_array(&[s], strategy_api_json),
            &[4, 5],
            None,
            "[]",
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(snapshot_changed(&v));
        let c = delta_from(&v, 7).unwrap().expect("a delta");
        assert_eq!(c.version, 9);
        assert_eq!(c.strategies.len(), 1);
        assert_eq!(c.removed, [4, 5]);
        assert!(c.blacklist.is_none(), "the blacklist did not change");
        let with_bl = delta_json(9, 7, "[]", &[], Some("[]"), "[]");
        let v2: Value = serde_json::from_str(&with_bl).unwrap();
        assert_eq!(
            delta_from(&v2, 7)
                .unwrap()
                .unwrap()
                .blacklist
                .map(|b| b.len()),
            Some(0)
        );
        assert!(
            delta_from(&v, 8).is_err(),
            "a delta after 7 for a poll after 8"
        );
        // A full answer (a serve without deltas) is no delta.
        let full: Value = serde_json::from_str(&snapshot_json(9, true, "[]", "[]", "[]")).unwrap();
        assert!(delta_from(&full, 7).unwrap().is_none());
    }
}
