//! The penalty box in the agent (issue 32): every tick, the bans this
//! host's workers raised in the ban table (`core::bans`) are written to the
//! store as blacklist entries (`source: ban`, an expiry, a reason naming
//! the strategy, the count, the window and the host), so every host's agent
//! publishes them as any blacklist change; a local ban whose entry was
//! removed from the store (`blacklist rm`, the API, the page) is lifted
//! from the ban table; rows nothing needs any more are freed.
//!
//! An agent on the store writes them itself; an agent on `rate-ctl serve`
//! (`--store http://…`) through `POST /api/v1/hosts/{host}/bans`
//! (`src/serve/bans.rs`, its agent token bound to its host).

use std::collections::HashMap;

use tracing::{info, warn};

use super::{Agent, Sink};
use crate::store::record::BlacklistRecord;
use rate_ctl::core::bans::{key_text, BanRow};

/// What the agent remembers of the bans it wrote.
#[derive(Debug, Default)]
pub struct BanState {
    /// (dimension, value) of each ban written, and whether a snapshot
    /// read since held its entry (only then does a snapshot without it
    /// mean the entry was removed).
    written: HashMap<(String, String), bool>,
    /// The config version of the last snapshot looked at.
    seen_version: u64,
}

/// The reason stored with a ban's entry.
fn reason<S: Sink>(a: &Agent<S>, r: &BanRow) -> String {
    // The configuration as last read (strategies by id).
    let s = a.table.as_ref().and_then(|t| {
        let all = &t.snapshot().strategies;
        all.binary_search_by_key(&r.strategy_id, |s| s.id)
            .ok()
            .map(|i| &*all[i])
    });
    let name = s.map_or("?", |s| s.name.as_str());
    let within = s.and_then(|s| s.ban_within).unwrap_or(0);
    format!(
        "penalty box: strategy {} {name:?}: {} rejections within {within}s on host {}",
        r.strategy_id,
        r.count,
        a.opts.host_id.chars().take(100).collect::<String>()
    )
    .chars()
    .take(crate::store::record::MAX_REASON_LEN)
    .collect()
}

/// One round; see the module documentation. Never fails the tick: a store
/// error is logged and the ban retried at the next one.
pub(super) async fn tick<S: Sink>(a: &mut Agent<S>, now: u64) {
    let Some(map) = a.sink.mapping() else {
        return;
    };
    let table = map.bans();
    let rows = table.banned_rows();
    // Lifting: an entry seen in a snapshot and gone from a later one.
    if let Some(t) = a
        .table
        .as_ref()
        .filter(|t| t.version != a.bans.seen_version)
    {
        a.bans.seen_version = t.version;
        let snap = t.snapshot();
        let present: std::collections::HashSet<(&str, &str)> = snap
            .blacklist
            .iter()
            .map(|b| (b.dimension.as_str(), b.value.as_str()))
            .collect();
        for (k, seen) in a.bans.written.iter_mut() {
            if present.contains(&(k.0.as_str(), k.1.as_str())) {
                *seen = true;
            } else if *seen {
                for r in rows.iter().filter(|r| {
                    r.kind.dimension() == k.0 && key_text(r.kind, &r.key).as_ref() == Some(&k.1)
                }) {
                    if table.lift(r.index, r.ident) {
                        info!(dimension = %k.0, value = %k.1, strategy = r.strategy_id,
                              "penalty box: the ban's blacklist entry was removed; lifted on this host");
                    }
                }
                *seen = false;
            }
        }
        a.bans.written.retain(|k, seen| {
            *seen || present.contains(&(k.0.as_str(), k.1.as_str())) || {
                // Not seen yet: keep while its row holds a ban in force.
                rows.iter()
                    .any(|r| r.banned_until_ms > now && r.kind.dimension() == k.0)
            }
        });
    }
    for r in rows
        .iter()
        .filter(|r| r.banned_until_ms > now && r.reported_until_ms < r.banned_until_ms)
    {
        let Some(value) = key_text(r.kind, &r.key) else {
            // Not text the store takes: the ban stays on this host.
            table.set_reported(r.index, r.ident, r.banned_until_ms);
            continue;
        };
        let rec = BlacklistRecord {
            id: 0,
            dimension: r.kind.dimension().to_string(),
            value: value.clone(),
            expires_ms: Some(r.banned_until_ms),
            reason: reason(a, r),
            created_ms: 0,
            source: Some(crate::store::bans::SOURCE_BAN.into()),
        };
        let rec = match rec.into_valid() {
            Ok(rec) => rec,
            Err(e) => {
                warn!(error = %e, "penalty box: a ban the store cannot take stays on this host");
                table.set_reported(r.index, r.ident, r.banned_until_ms);
                continue;
            }
        };
        let who = format!(
            "ban:{}",
            a.opts.host_id.chars().take(24).collect::<String>()
        );
        match a
            .source
            .write_ban(&a.opts.host_id, &rec, r.strategy_id, &who)
            .await
        {
            Ok((id, created)) => {
                table.set_reported(r.index, r.ident, r.banned_until_ms);
                a.bans
                    .written
                    .entry((rec.dimension.clone(), value.clone()))
                    .or_insert(false);
                info!(dimension = %rec.dimension, %value, strategy = r.strategy_id, count = r.count,
                      until_ms = r.banned_until_ms, entry = id, created,
                      "penalty box: banned; written to the store");
            }
            Err(e) => warn!(error = %e, "penalty box: writing a ban to the store failed; retrying"),
        }
    }
    table.sweep(now);
}
