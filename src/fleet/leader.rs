//! The fleet leader's loop: reads the hosts' reports from the store, runs
//! one [`Allocator`] per `split: demand` cluster strategy and writes the
//! leases back. Run by every `rate-ctl serve` (src/serve/mod.rs) and by
//! agents that reach the store directly; the leader row
//! ([`Store::try_lead`]) lets one of them lead at a time.
//!
//! Demand comes from the counter samples the agents already report each
//! heartbeat (cumulative passed/limited per strategy): the leader takes the
//! difference between a host's newest sample and the one it used last. A
//! host whose counters did not move for [`QUIET_MS`] reports zero demand.
//! What a host enforces comes from its acknowledgement in the lease row;
//! a host that has acknowledged nothing is assumed to enforce its static
//! share. A new leader starts from the stored leases ([`Allocator::resume`]).

use std::collections::HashMap;

use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::model::Algorithm;

use super::lease::{Allocator, Applied, Config, Grant, Kind, Report, Stored};
use super::rates::share;
use crate::store::record::{HostRecord, Scope, Split, StrategyRecord};
use crate::store::{LeaseRow, Store, StoreError};

/// How often agents with leases report (demand and acknowledgements).
pub const PERIOD: std::time::Duration = std::time::Duration::from_millis(500);
/// The allocation period of the leader (in `serve`; a leading agent
/// allocates at each of its reports): half the report period, so an
/// acknowledgement is acted on soon after it arrives.
pub const LEADER_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);
/// How long the leadership lasts without renewal.
pub const LEADER_TTL_MS: u64 = 3_000;
/// How long without a new counter sample before a host's demand counts as
/// zero (the agents report each second, and once more when counters stop).
pub const QUIET_MS: u64 = 2_500;
/// How far back counter samples are read.
const SAMPLES_MS: u64 = 10_000;

/// How a strategy's capacity is counted.
pub fn kind_of(rec: &StrategyRecord) -> Kind {
    let per_ms = rec.per.period_ns() / 1_000_000;
    match rec.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => Kind::Window { window_ms: per_ms },
        _ => Kind::Rate { per_ms },
    }
}

/// Whether the leader allocates `rec`.
pub fn leased(rec: &StrategyRecord) -> bool {
    rec.enabled && rec.scope == Scope::Cluster && rec.split() == Split::Demand
}

/// The last counter sample used for one host.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at_ms: u64,
    passed: u64,
    limited: u64,
}

struct StrategyLeases {
    alloc: Allocator,
    seen: HashMap<String, Seen>,
}

pub struct Coordinator {
    me: String,
    cfg: Config,
    leading: bool,
    entries: HashMap<u32, StrategyLeases>,
}

impl Coordinator {
    /// `me` names this candidate in the leader row.
    pub fn new(me: String) -> Coordinator {
        Coordinator {
            me,
            cfg: Config::default(),
            leading: false,
            entries: HashMap::new(),
        }
    }

    fn step_down(&mut self) {
        if self.leading {
            tracing::info!(me = %self.me, "no longer the fleet leader");
        }
        self.leading = false;
        self.entries.clear();
    }

    /// Gives the leadership up (a clean stop).
    pub async fn resign(&mut self, store: &Store) {
        if self.leading {
            let _ = store.resign(&self.me).await;
        }
        self.step_down();
    }

    /// One period (≈ 1 s): lead if possible, and if leading, allocate and
    /// publish the leases of `strategies`' `split: demand` ones.
    pub async fn tick(
        &mut self,
        store: &Store,
        strategies: &[StrategyRecord],
        freshness_ms: u64,
    ) -> Result<(), StoreError> {
        let demand: Vec<&StrategyRecord> = strategies.iter().filter(|r| leased(r)).collect();
        if demand.is_empty() {
            // Nothing to lead: leave the row to others (and to the next
            // strategy that needs it).
            if self.leading {
                self.resign(store).await;
            }
            return Ok(());
        }
        let now = unix_ms();
        if !store.try_lead(&self.me, now, LEADER_TTL_MS).await? {
            self.step_down();
            return Ok(());
        }
        let hosts = store.hosts().await?;
        let rows = store.leases(None).await?;
        if !self.leading {
            tracing::info!(me = %self.me, "fleet leader: resuming from the stored leases");
            self.entries.clear();
            for rec in &demand {
                let stored: Vec<Stored> = rows
                    .iter()
                    .filter(|r| r.strategy_id == rec.id)
                    .map(|r| stored_of(r, &hosts))
                    .collect();
                self.entries.insert(
                    rec.id,
                    StrategyLeases {
                        alloc: Allocator::resume(rec.rate, kind_of(rec), self.cfg, &stored),
                        seen: HashMap::new(),
                    },
                );
            }
            self.leading = true;
        }
        let fresh: Vec<&HostRecord> = hosts
            .iter()
            .filter(|h| {
                h.weight > 0
                    && h.last_heartbeat_ms
                        .is_some_and(|hb| hb.saturating_add(freshness_ms) >= now)
            })
            .collect();
        let mut out = Vec::new();
        let ids: Vec<u32> = demand.iter().map(|r| r.id).collect();
        self.entries.retain(|id, _| ids.contains(id));
        for rec in &demand {
            let cfg = self.cfg;
            let e = self
                .entries
                .entry(rec.id)
                .or_insert_with(|| StrategyLeases {
                    alloc: Allocator::new(rec.rate, kind_of(rec), cfg),
                    seen: HashMap::new(),
                });
            e.alloc.set_capacity(rec.rate, kind_of(rec));
            let samples = store
                .samples(rec.id, now.saturating_sub(SAMPLES_MS))
                .await?;
            for h in &fresh {
                let newest = samples.iter().rev().find(|s| s.host_id == h.host_id);
                let prev = e.seen.get(&h.host_id).copied();
                let (admitted, rejected, elapsed_ms) = match (prev, newest) {
                    // A counter reset (a new slot) falls through: a new
                    // baseline.
                    (Some(p), Some(n))
                        if n.at_ms > p.at_ms && n.passed >= p.passed && n.limited >= p.limited =>
                    {
                        (
                            n.passed - p.passed,
                            n.limited - p.limited,
                            n.at_ms - p.at_ms,
                        )
                    }
                    (Some(p), _) if now.saturating_sub(p.at_ms) > QUIET_MS => {
                        // Quiet: zero demand since then; the counters have
                        // not moved, so the baseline moves on.
                        (0, 0, now - p.at_ms)
                    }
                    _ => (0, 0, 0),
                };
                match (prev, newest) {
                    (Some(p), Some(n)) if n.at_ms <= p.at_ms && elapsed_ms > 0 => {
                        e.seen.insert(h.host_id.clone(), Seen { at_ms: now, ..p });
                    }
                    (Some(p), None) if elapsed_ms > 0 => {
                        e.seen.insert(h.host_id.clone(), Seen { at_ms: now, ..p });
                    }
                    (_, Some(n)) if prev.is_none_or(|p| n.at_ms > p.at_ms) => {
                        e.seen.insert(
                            h.host_id.clone(),
                            Seen {
                                at_ms: n.at_ms,
                                passed: n.passed,
                                limited: n.limited,
                            },
                        );
                    }
                    _ => {}
                }
                let row = rows
                    .iter()
                    .find(|r| r.strategy_id == rec.id && r.host_id == h.host_id);
                let applied = match row.and_then(|r| r.applied_epoch.zip(r.applied_value)) {
                    Some((epoch, value)) => Applied { epoch, value },
                    // Never acknowledged: the static share it enforces.
                    None => Applied {
                        epoch: 0,
                        value: share(&hosts, &h.host_id, h.weight, now, freshness_ms).of(rec.rate),
                    },
                };
                e.alloc.report(
                    now,
                    &Report {
                        host: h.host_id.clone(),
                        weight: h.weight,
                        admitted,
                        rejected,
                        elapsed_ms,
                        applied: Some(applied),
                    },
                );
            }
            for g in e.alloc.allocate(now) {
                out.push(row_of(rec.id, &g, now));
            }
        }
        if !store
            .put_leases(&self.me, now, LEADER_TTL_MS, &out, &ids)
            .await?
        {
            self.step_down();
        }
        Ok(())
    }
}

fn row_of(strategy_id: u32, g: &Grant, now: u64) -> LeaseRow {
    LeaseRow {
        strategy_id,
        host_id: g.host.clone(),
        value: g.value,
        epoch: g.epoch,
        expires_ms: g.expires_ms,
        granted_ms: now,
        demand_milli: (g.demand * 1000.0).clamp(0.0, i64::MAX as f64) as u64,
        window_start_ms: g.window_start_ms,
        window_admitted: g.window_admitted,
        applied_epoch: None,
        applied_value: None,
        applied_ms: None,
    }
}

fn stored_of(r: &LeaseRow, hosts: &[HostRecord]) -> Stored {
    Stored {
        host: r.host_id.clone(),
        weight: hosts
            .iter()
            .find(|h| h.host_id == r.host_id)
            .map_or(1, |h| h.weight.max(1)),
        grant: Grant {
            host: r.host_id.clone(),
            value: r.value,
            epoch: r.epoch,
            expires_ms: r.expires_ms,
            demand: r.demand_milli as f64 / 1000.0,
            window_start_ms: r.window_start_ms,
            window_admitted: r.window_admitted,
        },
        applied: r
            .applied_epoch
            .zip(r.applied_value)
            .map(|(epoch, value)| Applied { epoch, value }),
    }
}
