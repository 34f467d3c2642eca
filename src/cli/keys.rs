//! Per-key operations (issue 33): `rate-ctl shm key` (this host's file),
//! `rate-ctl key show|reset` (the fleet, through serve or the store).

use std::path::Path;

use serde_json::{json, Value};

use super::Failure;
use crate::agent::publish::read_active;
use rate_ctl::core::key_ops::read_published;
use rate_ctl::core::keys::read::{now, KeyReading};
use rate_ctl::core::shm::segment::Published;
use rate_ctl::core::shm::Mapping;

/// A reading as JSON (the fields of `shm key --json` and of a host in the
/// fleet view).
pub fn reading_json(r: &KeyReading) -> Value {
    let mut v = json!({
        "found": r.found,
        "limit": r.limit,
        "used": r.used,
        "remaining": r.remaining,
        "reset_ms": r.reset_ms,
    });
    if let Some(n) = r.in_flight {
        v["in_flight"] = json!(n);
    }
    v
}

/// The published strategy `id` of `map` (a per-key one).
pub fn published(map: &Mapping, id: u32) -> Result<Published, Failure> {
    let decoded = read_active(map)
        .map_err(|e| Failure::other(e.to_string()))?
        .ok_or_else(|| Failure::other("nothing published in the file yet"))?;
    let p = decoded
        .strategies
        .into_iter()
        .find(|p| p.strategy.id == id)
        .ok_or_else(|| Failure::usage(format!("--strategy {id}: not in the file's table")))?;
    if !p.strategy.each.is_keyed() {
        return Err(Failure::usage(format!(
            "--strategy {id}: not a per-key strategy (no `each`)"
        )));
    }
    Ok(p)
}

/// `rate-ctl shm key PATH --strategy ID --key K`.
pub fn shm_key(path: &Path, id: u32, key: &str, as_json: bool) -> Result<(), Failure> {
    let map = Mapping::open(path).map_err(|e| Failure::other(e.to_string()))?;
    let p = published(&map, id)?;
    let (text, r) = read_published(&map, &p, key, now())
        .map_err(|e| Failure::usage(format!("--key: {}", e.0)))?;
    if as_json {
        let mut v = json!({"strategy": id, "key": text});
        if let (Value::Object(o), Value::Object(r)) = (&mut v, reading_json(&r)) {
            o.extend(r);
        }
        super::out(v.to_string());
    } else {
        let mut line = format!(
            "strategy {id} key {text}: used {} of {}, remaining {}, reset in {} ms",
            r.used, r.limit, r.remaining, r.reset_ms
        );
        if let Some(n) = r.in_flight {
            line.push_str(&format!(", {n} in flight"));
        }
        if !r.found {
            line.push_str(" (no entry: a new key)");
        }
        super::out(line);
    }
    Ok(())
}

/// `rate-ctl key show|reset`.
pub async fn key_cmd(
    target: &crate::client::Target,
    as_json: bool,
    c: super::args::KeyCmd,
) -> Result<(), Failure> {
    use super::args::KeyCmd;
    let backend = super::open(target).await?;
    let key_failure = |e: crate::store::StoreError| match e {
        crate::store::StoreError::Invalid(i) => {
            Failure::usage(format!("invalid --key: {}", i.text()))
        }
        crate::store::StoreError::NotFound(m) => Failure::usage(format!("--strategy: {m}")),
        e => Failure::from(e),
    };
    match c {
        KeyCmd::Reset { strategy, key } => {
            let v = backend
                .key_reset(strategy, &key)
                .await
                .map_err(key_failure)?;
            if as_json {
                super::out(v.to_string());
            } else {
                super::out(format!(
                    "reset {} of strategy {strategy} requested (reset id {}); every agent applies it within its poll",
                    v["key"].as_str().unwrap_or(&key),
                    v["id"]
                ));
            }
        }
        KeyCmd::Show { strategy, key } => {
            let v = backend
                .key_show(strategy, &key)
                .await
                .map_err(key_failure)?;
            if as_json {
                super::out(v.to_string());
                return Ok(());
            }
            let f = &v["fleet"];
            super::out(format!(
                "strategy {strategy} key {}: fleet used {}, remaining {}, reset in {} ms ({} of {} hosts answered)",
                v["key"].as_str().unwrap_or(&key),
                f["used"],
                f["remaining"],
                f["reset_ms"],
                f["hosts_answered"],
                f["hosts_asked"]
            ));
            for h in v["hosts"].as_array().into_iter().flatten() {
                let name = h["host"].as_str().unwrap_or("?");
                if h["answered"] == json!(true) {
                    super::out(format!(
                        "  {name}: used {} of {}, remaining {}, reset in {} ms",
                        h["used"], h["limit"], h["remaining"], h["reset_ms"]
                    ));
                } else {
                    super::out(format!("  {name}: no answer within 1 s"));
                }
            }
        }
    }
    Ok(())
}

/// The top keys of a published strategy as JSON entries (`key`,
/// `rejections`, `requests`, `truncated`).
pub fn top_json(map: &Mapping, p: &Published) -> Vec<Value> {
    rate_ctl::core::key_ops::top_of(map, p)
        .into_iter()
        .map(|e| {
            json!({"key": e.key, "rejections": e.rejections, "requests": e.requests,
                   "truncated": e.truncated})
        })
        .collect()
}

/// `rate-ctl shm top PATH --strategy ID`.
pub fn shm_top(path: &Path, id: u32, as_json: bool) -> Result<(), Failure> {
    let map = Mapping::open(path).map_err(|e| Failure::other(e.to_string()))?;
    let p = published(&map, id)?;
    if p.slot >= map.top().tables() {
        return Err(Failure::other(format!(
            "strategy {id} is in stat slot {}: only the first {} slots keep top keys",
            p.slot,
            map.top().tables()
        )));
    }
    let entries = top_json(&map, &p);
    if as_json {
        super::out(
            json!({"strategy": id, "sample": rate_ctl::core::keys::top::SAMPLE,
                          "entries": entries})
            .to_string(),
        );
        return Ok(());
    }
    super::out(format!(
        "strategy {id}: keys by rejections, then requests, in the last minute (admissions sampled 1 in {})",
        rate_ctl::core::keys::top::SAMPLE
    ));
    for e in &entries {
        super::out(format!(
            "  {:>8} rejected {:>10} requests  {}",
            e["rejections"],
            e["requests"],
            e["key"].as_str().unwrap_or("")
        ));
    }
    Ok(())
}
