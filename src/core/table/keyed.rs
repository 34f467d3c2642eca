//! Admission of a request that matched at least one per-key strategy.
//!
//! The per-key strategies are charged first, each on its key's entry
//! ([`KeyTable::charge`]); then the shared ones through
//! [`admit::admit_with`]. The rule of the shared strategies holds across
//! both: a request rejected by any strategy is counted by none — when a
//! key rejects, the keys already charged are refunded and no shared
//! strategy is asked; when a shared strategy rejects, every key charge is
//! refunded. (So a request both a per-key and a shared strategy would
//! reject is reported as rejected by the per-key one.)
//!
//! * A per-key strategy for which any `each` value of the request is
//!   empty (or the client address unknown, for `ip`) does not count the
//!   request.
//! * A key whose probe range is full follows its strategy's `on_full`:
//!   `overflow` charges the strategy's own stat slot with its shared
//!   limiter (an ordinary hit), `reject` refuses (`retry_after` 1 s),
//!   `allow` lets it through uncounted. Each case is counted in the key
//!   table's per-strategy counters.
//! * Dry runs, delays, `passed`/`limited`/`delayed` counters and quotas
//!   behave as for the shared strategies ([`admit`]).

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::super::admit::{self, Decision, Hit, Verdict};
use super::super::keys::{Charge, IpPrefix, KeyLimiter, KeyRef, KeyTable};
use super::super::limiter::Quota;
use super::super::model::each::OnFull;
use super::super::model::response::Owed;
use super::super::model::{Action, Algorithm};
use super::super::response::{OwedCharge, OwedTarget};
use super::super::shm::region::Region;
use super::super::shm::slot::Slot;
use super::super::shm::Mapping;
use super::super::table::ResponseOut;
use super::super::table::{IpKey, Request, Table, Values};

/// How a compiled per-key strategy builds its key.
#[derive(Debug, Clone)]
pub struct KeyPlan {
    /// Table dimension index of each `each` dimension, in order; `true`
    /// for `ip` (the client address, aggregated).
    pub dims: SmallVec<[(usize, bool); 4]>,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    pub on_full: super::super::model::each::OnFull,
    pub limiter: KeyLimiter,
    /// The hash state after the strategy id, with the secret of the file
    /// the table was built on (`None`: no file): computed once per table.
    pub seed: Option<super::super::keys::KeyHasher>,
    /// The strategy's `max_keys` (0: the table's default share).
    pub max_keys: u32,
}

/// Per-key `concurrency` units a request holds until it ends.
pub type KeyHolds = SmallVec<[(KeyRef, KeyLimiter); 1]>;

/// `retry_after` of an `on_full reject` refusal (a hint: the range frees
/// up when some key there is fresh again).
const FULL_RETRY_NS: u64 = 1_000_000_000;

/// The client address a request gives for `ip`.
#[inline]
fn client_addr<V: Values + ?Sized>(r: &Request<'_, V>, d: usize) -> Option<std::net::IpAddr> {
    match r.ip {
        Some(ip) => Some(ip.addr()),
        None => r.values.value(d).and_then(IpKey::parse).map(IpKey::addr),
    }
}

impl KeyPlan {
    /// Hashes the request's key into `h`; `false` when a value is empty
    /// (the strategy does not count the request). The one-address key
    /// (`each ip`, the common per-client limit) without the loop.
    #[inline(always)]
    fn hash<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        h: &mut super::super::keys::KeyHasher,
    ) -> bool {
        if let [(d, true)] = self.dims[..] {
            return self.hash_ip(r, d, h);
        }
        for &(d, is_ip) in &self.dims {
            if is_ip {
                if !self.hash_ip(r, d, h) {
                    return false;
                }
            } else {
                match r.values.value(d) {
                    Some(v) if !v.is_empty() => h.part(v),
                    _ => return false,
                }
            }
        }
        true
    }

    /// The `ip` part of the key (dimension `d` when the request has no
    /// client address of its own); `false` when there is none.
    #[inline(always)]
    fn hash_ip<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        d: usize,
        h: &mut super::super::keys::KeyHasher,
    ) -> bool {
        let k = match r.ip {
            Some(ip) => ip,
            None => match r.values.value(d).and_then(IpKey::parse) {
                Some(ip) => ip,
                None => return false,
            },
        };
        h.ip(k.0, self.ipv4_prefix, self.ipv6_prefix);
        true
    }

    /// The key as text (`ip=203.0.113.0/24,userid=u1`), `None` when a value
    /// is empty.
    pub fn text<V: Values + ?Sized>(&self, names: &[String], r: &Request<'_, V>) -> Option<String> {
        let mut out = String::new();
        for &(d, is_ip) in &self.dims {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(names.get(d).map_or("?", |n| n.as_str()));
            out.push('=');
            if is_ip {
                let p = IpPrefix::new(client_addr(r, d)?, self.ipv4_prefix, self.ipv6_prefix);
                out.push_str(&p.to_string());
            } else {
                let v = r.values.value(d).filter(|v| !v.is_empty())?;
                // Client bytes: escaped and capped (they reach error.log).
                crate::core::escape::push_escaped(&mut out, v, crate::core::escape::LOG_VALUE_MAX);
            }
        }
        Some(out)
    }
}

/// One key charged by this request.
struct Taken {
    si: u32,
    at: KeyRef,
    token: u64,
    prev: u64,
    wait_ns: u64,
    forced: bool,
    /// Units charged (`cost_from`; 1 otherwise).
    units: u64,
    /// `count_if` (issue 31): the key was only checked (nothing to give
    /// back); charged when the request ends.
    checked: Option<super::super::keys::KeyId>,
}

fn refund_all(kt: &KeyTable, table: &Table, taken: &[Taken]) {
    for t in taken.iter().filter(|t| t.checked.is_none()) {
        if let Some(plan) = &table.strategies()[t.si as usize].key {
            kt.refund_units(t.at, &plan.limiter, t.token, t.prev, t.units);
        }
    }
}

fn reject_status(a: Action) -> Option<u16> {
    match a {
        Action::Reject { status } => status,
        _ => None,
    }
}

/// See the module documentation. `held` receives the shared concurrency
/// strategies the request holds (as [`Table::decide_into`]), `key_holds`
/// the per-key ones.
#[inline(always)]
pub(crate) fn decide<V: Values + ?Sized>(
    table: &Table,
    matched: &[u32],
    map: &Mapping,
    slots: &Region<'_>,
    r: &Request<'_, V>,
    held: &mut SmallVec<[u32; 2]>,
    (key_holds, full, response): (&mut KeyHolds, &mut Option<(u32, OnFull)>, &mut ResponseOut),
) -> Decision {
    let o = Outs {
        held,
        key_holds,
        full,
        response,
    };
    if let [si] = *matched {
        return decide_one(table, si, map, slots, r, o);
    }
    decide_all(table, matched, map, r, o)
}

/// Where a decision's effects go: the shared concurrency strategies the
/// request holds, its per-key units, the first per-key strategy whose
/// range was full, what its response options leave.
struct Outs<'o> {
    held: &'o mut SmallVec<[u32; 2]>,
    key_holds: &'o mut KeyHolds,
    full: &'o mut Option<(u32, OnFull)>,
    response: &'o mut ResponseOut,
}

/// [`decide`] for any number of matched strategies, per-key and shared
/// (out of line: the one-strategy path keeps a small frame).
#[inline(never)]
fn decide_all<V: Values + ?Sized>(
    table: &Table,
    matched: &[u32],
    map: &Mapping,
    r: &Request<'_, V>,
    o: Outs<'_>,
) -> Decision {
    let Outs {
        held,
        key_holds,
        full,
        response,
    } = o;
    let slots = &map.slots();
    let kt = map.keys();
    let now = r.now();
    let owner = |slot: u32| table.key_owner(slot);
    let mut shared: SmallVec<[Hit<'_>; 8]> = SmallVec::new();
    let mut shared_index: SmallVec<[u32; 8]> = SmallVec::new();
    let mut overflow: SmallVec<[u32; 2]> = SmallVec::new();
    let mut taken: SmallVec<[Taken; 4]> = SmallVec::new();
    let mut dry_run_rejected = None;
    let strategies = table.strategies();
    for &si in matched {
        let c = &strategies[si as usize];
        let Some(plan) = &c.key else {
            if let Some(h) = c.hit_for(slots, r, response) {
                shared.push(h);
                shared_index.push(si);
            }
            continue;
        };
        let Some(slot) = Slot::at(slots, c.slot) else {
            continue;
        };
        if slot.generation().load(Ordering::Acquire) != c.generation {
            continue; // stale table: the slot is another strategy's now
        }
        let mut h = plan.seed.unwrap_or_else(|| kt.hasher(c.strategy.id));
        if !plan.hash(r, &mut h) {
            continue; // an empty value: not counted
        }
        let dry = r.dry_run || c.strategy.action.is_dry_run();
        let force = dry && plan.limiter.is_concurrency();
        // `cost_from` (issue 31): the key is charged its units at once.
        let units = match &c.response {
            Some(p) => p.cost(r.values).unwrap_or_else(|n| {
                response.bad_cost.get_or_insert(c.strategy.id);
                n
            }),
            None => 1,
        };
        // `count_if` (issue 31): only checked now, charged when it ends.
        let check = c
            .response
            .as_deref()
            .is_some_and(|p| !p.count_if.is_empty());
        let key = kt.key(h, c.slot, c.generation);
        let charge = match key {
            Some(key) if check => kt.check_units(&key, &plan.limiter, now, units),
            // Several units are never forced (a dry run's concurrency unit is one).
            Some(key) => kt.charge_capped(
                &key,
                &plan.limiter,
                plan.max_keys,
                now,
                force && units == 1,
                units,
                slots,
                owner,
            ),
            None => Charge::Full,
        };
        let retry_after_ns = match charge {
            Charge::Admitted {
                at,
                wait_ns,
                forced,
                token,
                prev,
            } => {
                if forced {
                    slot.limited().fetch_add(1, Ordering::Relaxed);
                    dry_run_rejected.get_or_insert(c.strategy.id);
                }
                taken.push(Taken {
                    si,
                    at,
                    token,
                    prev,
                    wait_ns,
                    forced,
                    units,
                    checked: key.filter(|_| check),
                });
                continue;
            }
            Charge::Rejected { retry_after_ns } => {
                if let Some(k) = key {
                    track_top(map, table, si, r, k.ident, true);
                }
                retry_after_ns
            }
            Charge::Full => {
                full.get_or_insert((c.strategy.id, plan.on_full));
                match plan.on_full {
                    OnFull::Overflow => {
                        if let Some(h) = c.hit_for(slots, r, response) {
                            shared.push(h);
                            shared_index.push(si);
                            overflow.push(si);
                        }
                        continue;
                    }
                    OnFull::Allow => {
                        kt.count_full(c.slot, false);
                        continue;
                    }
                    OnFull::Reject => {
                        kt.count_full(c.slot, false);
                        FULL_RETRY_NS
                    }
                }
            }
        };
        slot.limited().fetch_add(1, Ordering::Relaxed);
        if dry {
            dry_run_rejected.get_or_insert(c.strategy.id);
            continue;
        }
        refund_all(kt, table, &taken);
        let tightest = r.quota.then(|| {
            let t = plan.limiter.clock(now);
            (c.strategy.id, quota_of(kt, table, si, None, t))
        });
        return Decision {
            verdict: Verdict::Reject {
                id: c.strategy.id,
                status: reject_status(c.strategy.action),
                retry_after_ns,
            },
            dry_run_rejected,
            would_delay: None,
            tightest: tightest.flatten_quota(),
            passed_by: None,
        };
    }
    let mut d = if shared.is_empty() {
        Decision::pass()
    } else if shared.iter().any(|h| h.units != 1 || h.check) {
        // Several units (cost_from) or a check (count_if): the general path.
        admit::admit_listed(&shared, now, r.dry_run, r.quota)
    } else {
        admit::admit_with(&shared, now, r.dry_run, r.quota)
    };
    if let Verdict::Reject { .. } = d.verdict {
        refund_all(kt, table, &taken);
        for &si in &overflow {
            kt.count_full(strategies[si as usize].slot, false);
        }
        d.dry_run_rejected = d.dry_run_rejected.or(dry_run_rejected);
        return d;
    }
    for (h, &si) in shared.iter().zip(&shared_index) {
        if h.limiter.algorithm() == Algorithm::Concurrency {
            held.push(si);
            map.hold_unit(strategies[si as usize].slot, h.generation);
        }
    }
    for &si in &overflow {
        kt.count_full(strategies[si as usize].slot, true);
    }
    d.dry_run_rejected = d.dry_run_rejected.or(dry_run_rejected);
    let mut longest = match d.verdict {
        Verdict::Delay { wait_ns, .. } => wait_ns,
        _ => 0,
    };
    if table.is_responsive() {
        super::super::table::owe_hits(strategies, &shared, &shared_index, &d, r, response);
    }
    for t in &taken {
        let c = &strategies[t.si as usize];
        let Some(plan) = &c.key else { continue };
        if plan.limiter.is_concurrency() {
            key_holds.push((t.at, plan.limiter));
        }
        if t.forced {
            continue;
        }
        if let Some(p) = c.response.as_deref().filter(|p| p.deferred()) {
            response.owed.push(OwedCharge {
                target: match t.checked {
                    Some(key) => OwedTarget::KeyId {
                        key,
                        limiter: plan.limiter,
                        max_keys: plan.max_keys,
                    },
                    None => OwedTarget::Key {
                        at: t.at,
                        limiter: plan.limiter,
                    },
                },
                owed: Owed {
                    charged: if t.checked.is_some() { 0 } else { t.units },
                    units: t.units,
                    count_if: p.count_if,
                    after: p.cost_after.is_some(),
                },
                admitted: now,
                after_dim: p.cost_after,
                id: c.strategy.id,
            });
        }
        let Some(slot) = Slot::at(slots, c.slot) else {
            continue;
        };
        slot.passed().fetch_add(1, Ordering::Relaxed);
        let dry = r.dry_run || c.strategy.action.is_dry_run();
        if t.wait_ns > 0 {
            slot.delayed().fetch_add(1, Ordering::Relaxed);
            if dry {
                if d.would_delay.is_none_or(|(_, w)| t.wait_ns > w) {
                    d.would_delay = Some((c.strategy.id, t.wait_ns));
                }
            } else if t.wait_ns > longest {
                longest = t.wait_ns;
                d.verdict = Verdict::Delay {
                    id: c.strategy.id,
                    wait_ns: t.wait_ns,
                };
            }
        }
        if c.strategy.action.is_dry_run() {
            continue;
        }
        if d.passed_by.is_none_or(|p| c.strategy.id < p) {
            d.passed_by = Some(c.strategy.id);
        }
        if r.quota {
            let q = quota_of(kt, table, t.si, Some(t.token), plan.limiter.clock(now));
            if let Some(q) = q {
                match d.tightest {
                    Some((_, tq)) if tq.remaining <= q.remaining => {}
                    _ => d.tightest = Some((c.strategy.id, q)),
                }
            }
        }
    }
    d
}

/// The common case, one enforcing per-key strategy, without the lists of
/// [`decide_all`]: the same decision and effects. What it does not handle
/// (a dry run, a new key, a full range) goes to [`decide_all`] before
/// anything is charged. It returns the decision itself (no `Option` around it to
/// unpack and copy): the caller's frame receives it directly. Inlined into
/// the request path: out of line, its call, prologue and spills cost a
/// per-address request about 40 instructions (callgrind).
#[inline(always)]
fn decide_one<V: Values + ?Sized>(
    table: &Table,
    si: u32,
    map: &Mapping,
    slots: &Region<'_>,
    r: &Request<'_, V>,
    o: Outs<'_>,
) -> Decision {
    let c = &table.strategies()[si as usize];
    // Response options (issue 31) take the general path, which records
    // what the request settles when it ends.
    let (Some(plan), false) = (
        &c.key,
        r.dry_run || c.strategy.action.is_dry_run() || c.response.is_some(),
    ) else {
        return decide_all(table, &[si], map, r, o);
    };
    let id = c.strategy.id;
    let kt = map.keys();
    // The key first: its entry's line is the one memory access that may
    // miss the cache, and what follows (the stat slot, the clock) does
    // not depend on it.
    let mut h = plan.seed.unwrap_or_else(|| kt.hasher(id));
    if !plan.hash(r, &mut h) {
        return Decision::pass(); // an empty value: not counted
    }
    let Some(key) = kt.key(h, c.slot, c.generation) else {
        return decide_all(table, &[si], map, r, o);
    };
    let Some(slot) = Slot::at(slots, c.slot) else {
        return Decision::pass(); // no such slot: nothing counted
    };
    if slot.generation().load(Ordering::Acquire) != c.generation {
        return Decision::pass(); // stale table
    }
    let now = r.now();
    // A key found in the table; a new key (its entry to claim, maybe
    // another strategy's to judge) takes the general path.
    let Some(charge) = kt.charge_found(&key, &plan.limiter, now, false) else {
        return decide_all(table, &[si], map, r, o);
    };
    let (d, track) = match charge {
        Charge::Admitted {
            at, wait_ns, token, ..
        } => {
            slot.passed().fetch_add(1, Ordering::Relaxed);
            let verdict = if wait_ns > 0 {
                slot.delayed().fetch_add(1, Ordering::Relaxed);
                Verdict::Delay { id, wait_ns }
            } else {
                Verdict::Pass
            };
            if plan.limiter.is_concurrency() {
                o.key_holds.push((at, plan.limiter));
            }
            let mut d = Decision {
                verdict,
                passed_by: Some(id),
                ..Decision::pass()
            };
            if r.quota {
                d.tightest = Some((id, plan.limiter.quota(token, plan.limiter.clock(now))));
            }
            (d, super::super::keys::top::sampled(token))
        }
        Charge::Rejected { retry_after_ns } => {
            slot.limited().fetch_add(1, Ordering::Relaxed);
            let tightest = if r.quota {
                let t = plan.limiter.clock(now);
                quota_of(kt, table, si, None, t).map(|q| (id, q))
            } else {
                None
            };
            let d = Decision {
                verdict: Verdict::Reject {
                    id,
                    status: reject_status(c.strategy.action),
                    retry_after_ns,
                },
                tightest,
                ..Decision::pass()
            };
            (d, true)
        }
        Charge::Full => return decide_all(table, &[si], map, r, o),
    };
    // Top keys (issue 33): every rejection, sampled admissions; one call
    // site, last, so that little is live across the (rare) call.
    if track {
        let rejected = matches!(d.verdict, Verdict::Reject { .. });
        track_top(map, table, si, r, key.ident, rejected);
    }
    d
}

/// Counts a request of strategy `si`'s key `ident` in the top-keys
/// tables (issue 33, [`super::super::keys::top`]): a rejection, or a
/// sampled admission worth [`SAMPLE`](super::super::keys::top::SAMPLE)
/// requests. Out of line: the request path pays the sampling compare only.
#[cold]
#[inline(never)]
fn track_top<V: Values + ?Sized>(
    map: &Mapping,
    table: &Table,
    si: u32,
    r: &Request<'_, V>,
    ident: u64,
    rejected: bool,
) {
    let c = &table.strategies()[si as usize];
    let minute = r.now_unix_ms / 60_000;
    let weight = super::super::keys::top::SAMPLE;
    map.top().count(
        c.slot,
        c.generation,
        ident,
        minute,
        rejected,
        weight,
        || c.key.as_ref()?.text(&table.dims, r),
    );
}

/// The quota of strategy `si`'s key: from the word this request wrote, or
/// (a rejection) a fresh key's — the rejected key's own word is not kept.
fn quota_of(kt: &KeyTable, table: &Table, si: u32, word: Option<u64>, now: u64) -> Option<Quota> {
    let _ = kt;
    let plan = table.strategies()[si as usize].key.as_ref()?;
    let mut q = plan.limiter.quota(word.unwrap_or(0), now);
    if word.is_none() {
        q.remaining = 0;
        q.reset_ns = q.reset_ns.max(1);
    }
    Some(q)
}

trait FlattenQuota {
    fn flatten_quota(self) -> Option<(u32, Quota)>;
}

impl FlattenQuota for Option<(u32, Option<Quota>)> {
    fn flatten_quota(self) -> Option<(u32, Quota)> {
        let (id, q) = self?;
        Some((id, q?))
    }
}
