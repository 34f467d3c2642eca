//! Admission of one request against every strategy it hits.
//!
//! A request passes only if every strategy admits it. The hits are
//! evaluated in the given order and each admitted one keeps its
//! reservation; when one rejects, the reservations already taken in this
//! call are refunded, so a rejected request is counted by **no** strategy
//! (neither in its limiter state nor in its `passed` counter), and no
//! further hit is evaluated.
//!
//! * A hit whose slot generation (acquire load) differs from
//!   `hit.generation` is skipped: the slot was reassigned and the worker's
//!   table is stale (it reloads on its next refresh).
//! * A rejection by a hit whose action is `dry_run`, or any rejection when
//!   `dry_run_all` is set, only counts (`limited`) and is reported in
//!   [`Decision::dry_run_rejected`] (the first such hit); nothing is
//!   reserved and evaluation goes on. With `dry_run_all` the verdict is
//!   always [`Verdict::Pass`]: never delayed, never rejected.
//! * Counters: `limited` on every rejecting hit; when the request passes,
//!   `passed` on every admitting hit and `delayed` on those that asked for
//!   a wait. With `dry_run_all` such a wait is not served, but the
//!   reservation is kept (the bucket moves as if the request had queued)
//!   and it counts as `delayed`: the counters show what enforcement would
//!   have done, and [`Decision::would_delay`] says by how long. The same
//!   holds for a hit whose action is `dry_run` with a kept delay cap
//!   ([`Action::DryRunDelay`]): it queues like the delay it stands for.
//!
//! # Concurrency hits
//!
//! *Deviation from "a dry-run rejection reserves nothing", on purpose:* a
//! `concurrency` hit rejected under a dry run still takes an in-flight unit
//! (over its limit). [`release`] is given only the hits, not which of them
//! reserved, so it releases every current concurrency hit; without the
//! unit, the release of a dry-run-rejected request would drive the count
//! below the real number in flight and later admit more than the limit.
//! The rule for callers is therefore simple: **after a `Pass` or `Delay`
//! verdict every non-stale concurrency hit holds one unit, call
//! [`release`] once with the same hits when the request ends; after a
//! `Reject` nothing is held, do not call it.** A dry-run concurrency
//! strategy then counts real requests in flight, which is what a dry run
//! is meant to observe.
//!
//! # Allocation
//!
//! No heap allocation for up to [`STACK_HITS`] hits: reservations live in
//! a stack array (sized 4, 16 or 64 to keep the common case cheap). A
//! request that hits more strategies than that (a configuration with more
//! than 64 overlapping strategies) falls back to one `Vec` of the same
//! entries; the semantics are identical.

use std::sync::atomic::Ordering;

use super::clock::Now;
use super::limiter::{Acquired, Limiter, Quota, Reservation};
use super::model::{Action, Algorithm};
use super::shm::slot::Slot;

/// Largest number of hits admitted without a heap allocation.
pub const STACK_HITS: usize = 64;

/// One strategy a request matched, with its limiter and stat slot.
#[derive(Clone, Copy)]
pub struct Hit<'a> {
    pub id: u32,
    pub limiter: &'a Limiter,
    pub action: Action,
    pub slot: Slot<'a>,
    /// The slot generation the table was built for.
    pub generation: u64,
    /// Units this request costs (`cost_from`, issue 31; 1 otherwise).
    pub units: u64,
    /// `count_if` (issue 31): only check that `units` would be admitted,
    /// charge nothing (the request is charged when it ends, if its status
    /// counts). Such a hit must go through [`admit_listed`].
    pub check: bool,
}

/// The outcome of [`admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The first hit that rejected under a dry run (to log).
    pub dry_run_rejected: Option<u32>,
    /// The longest wait a dry run did not serve, with its hit: a `dry_run`
    /// hit with a kept delay cap, or any delaying hit under `dry_run_all`
    /// (what enforcement would have delayed the request by).
    pub would_delay: Option<(u32, u64)>,
    /// For `RateLimit-*` headers: on a rejection the rejecting hit; else
    /// the hit with the smallest `remaining` (first on ties) among the
    /// current hits whose action is not `dry_run`. `None` if there is none,
    /// and always `None` when [`admit_with`] was not asked for quotas.
    pub tightest: Option<(u32, Quota)>,
    /// On a pass, the first (lowest id) current hit whose action is not
    /// `dry_run`: the strategy reported as having let the request through.
    pub passed_by: Option<u32>,
}

impl Decision {
    /// A pass that no strategy reported on (nothing current, nothing
    /// counted): what a decision starts from.
    #[inline(always)]
    pub fn pass() -> Decision {
        Decision {
            verdict: Verdict::Pass,
            dry_run_rejected: None,
            would_delay: None,
            tightest: None,
            passed_by: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Proceed after `wait_ns`; `id` is the hit with the longest wait.
    Delay {
        id: u32,
        wait_ns: u64,
    },
    /// `status` from the rejecting strategy's action (`None`: the
    /// location's default, also for a delay whose wait would exceed its
    /// bound); `retry_after_ns` is that strategy's earliest retry time.
    Reject {
        id: u32,
        status: Option<u16>,
        retry_after_ns: u64,
    },
}

/// Per-hit bookkeeping of one call.
#[derive(Debug, Clone, Copy)]
enum HitState {
    /// Slot generation differs from the table's: skipped.
    Stale,
    /// Evaluated, nothing held (dry-run rejection).
    Rejected,
    /// Admitted: holds this reservation.
    Admitted(Reservation),
    /// Dry-run-rejected concurrency hit holding an in-flight unit.
    Forced(Reservation),
}

/// Admits or refuses one request at `now` against `hits`, in order. A hit
/// of several `units` (`cost_from`) must go through [`admit_listed`]
/// (the one-hit path here takes one unit).
pub fn admit(hits: &[Hit], now: impl Into<Now>, dry_run_all: bool) -> Decision {
    admit_with(hits, now, dry_run_all, true)
}

/// [`admit`], computing [`Decision::tightest`] only when `quota` is set
/// (it is for `RateLimit-*` headers; reading every hit's quota is the
/// most expensive part of a pass otherwise).
#[inline(always)]
pub fn admit_with(hits: &[Hit], now: impl Into<Now>, dry_run_all: bool, quota: bool) -> Decision {
    let now_ns = now.into();
    if let [hit] = hits {
        return admit_one(hit, now_ns, dry_run_all, quota);
    }
    admit_listed(hits, now_ns, dry_run_all, quota)
}

/// The general path of [`admit_with`], also for a single hit: public so
/// that a property test can hold [`admit_one`] to it.
#[doc(hidden)]
#[inline(never)]
pub fn admit_listed(hits: &[Hit], now: impl Into<Now>, dry_run_all: bool, quota: bool) -> Decision {
    let now_ns = now.into();
    let n = hits.len();
    if n <= 4 {
        admit_in(
            hits,
            now_ns,
            dry_run_all,
            quota,
            &mut [HitState::Stale; 4][..n],
        )
    } else if n <= 16 {
        admit_in(
            hits,
            now_ns,
            dry_run_all,
            quota,
            &mut [HitState::Stale; 16][..n],
        )
    } else if n <= STACK_HITS {
        admit_in(
            hits,
            now_ns,
            dry_run_all,
            quota,
            &mut [HitState::Stale; STACK_HITS][..n],
        )
    } else {
        admit_in(
            hits,
            now_ns,
            dry_run_all,
            quota,
            &mut vec![HitState::Stale; n],
        )
    }
}

/// [`admit_listed`] for exactly one hit (most requests): the same decision
/// and the same effects on the slot, without the per-hit bookkeeping a
/// list needs for refunds. Inlined into the request path.
#[inline(always)]
fn admit_one(hit: &Hit, now: Now, dry_run_all: bool, quota: bool) -> Decision {
    let now = now.for_limiter(hit.limiter);
    let mut d = Decision::pass();
    if !current(hit) {
        return d;
    }
    // One unit: a hit of several (cost_from) takes `admit_listed`.
    match hit.limiter.acquire(&hit.slot, now) {
        Acquired::Admitted(r) => {
            hit.slot.passed().fetch_add(1, Ordering::Relaxed);
            if r.wait_ns > 0 {
                hit.slot.delayed().fetch_add(1, Ordering::Relaxed);
                if dry_run_all || hit.action.is_dry_run() {
                    d.would_delay = Some((hit.id, r.wait_ns));
                } else {
                    d.verdict = Verdict::Delay {
                        id: hit.id,
                        wait_ns: r.wait_ns,
                    };
                }
            }
        }
        Acquired::Rejected { retry_after_ns } => {
            hit.slot.limited().fetch_add(1, Ordering::Relaxed);
            if dry_run_all || hit.action.is_dry_run() {
                d.dry_run_rejected = Some(hit.id);
                // Concurrency: hold a unit anyway (see the module docs).
                let _ = hit.limiter.force_acquire(&hit.slot);
            } else {
                d.verdict = Verdict::Reject {
                    id: hit.id,
                    status: match hit.action {
                        Action::Reject { status } => status,
                        _ => None,
                    },
                    retry_after_ns,
                };
                d.tightest = quota.then(|| (hit.id, hit.limiter.quota(&hit.slot, now)));
                return d;
            }
        }
    }
    if !hit.action.is_dry_run() {
        d.passed_by = Some(hit.id);
        if quota {
            d.tightest = Some((hit.id, hit.limiter.quota(&hit.slot, now)));
        }
    }
    d
}

/// Releases the in-flight unit of every concurrency hit whose slot still
/// has the table's generation. Call once when a request that was given
/// `Pass` or `Delay` ends (see the module documentation).
pub fn release(hits: &[Hit]) {
    for hit in hits {
        if hit.limiter.algorithm() == Algorithm::Concurrency && current(hit) {
            hit.limiter.release(&hit.slot);
        }
    }
}

/// The hit's acquire: one unit, or its `units` at once (`cost_from`).
#[inline(always)]
fn acquire(hit: &Hit, now: u64) -> Acquired {
    if hit.check {
        hit.limiter.check_units(&hit.slot, now, hit.units)
    } else if hit.units == 1 {
        hit.limiter.acquire(&hit.slot, now)
    } else {
        hit.limiter.acquire_units(&hit.slot, now, hit.units)
    }
}

#[inline]
fn current(hit: &Hit) -> bool {
    hit.slot.generation().load(Ordering::Acquire) == hit.generation
}

fn admit_in(
    hits: &[Hit],
    now_both: Now,
    dry_run_all: bool,
    quota: bool,
    entries: &mut [HitState],
) -> Decision {
    let mut dry_run_rejected = None;
    for (i, hit) in hits.iter().enumerate() {
        if !current(hit) {
            entries[i] = HitState::Stale;
            continue;
        }
        let now = now_both.for_limiter(hit.limiter);
        match acquire(hit, now) {
            Acquired::Admitted(r) => entries[i] = HitState::Admitted(r),
            Acquired::Rejected { retry_after_ns } => {
                hit.slot.limited().fetch_add(1, Ordering::Relaxed);
                if dry_run_all || hit.action.is_dry_run() {
                    dry_run_rejected.get_or_insert(hit.id);
                    entries[i] = match hit.limiter.force_acquire(&hit.slot) {
                        Some(r) => HitState::Forced(r),
                        None => HitState::Rejected,
                    };
                    continue;
                }
                for (taken, h) in entries[..i].iter().zip(hits) {
                    match *taken {
                        // A checked hit charged nothing: nothing to give back.
                        HitState::Admitted(_) if h.check => {}
                        HitState::Admitted(r) => h.limiter.refund_units(&h.slot, r, h.units),
                        HitState::Forced(r) => h.limiter.refund(&h.slot, r),
                        _ => {}
                    }
                }
                let status = match hit.action {
                    Action::Reject { status } => status,
                    _ => None,
                };
                return Decision {
                    verdict: Verdict::Reject {
                        id: hit.id,
                        status,
                        retry_after_ns,
                    },
                    dry_run_rejected,
                    would_delay: None,
                    tightest: quota.then(|| (hit.id, hit.limiter.quota(&hit.slot, now))),
                    passed_by: None,
                };
            }
        }
    }

    let mut verdict = Verdict::Pass;
    let mut longest = 0;
    let mut would_delay: Option<(u32, u64)> = None;
    let mut tightest: Option<(u32, Quota)> = None;
    let mut passed_by = None;
    for (entry, hit) in entries.iter().zip(hits) {
        if let HitState::Admitted(r) = *entry {
            hit.slot.passed().fetch_add(1, Ordering::Relaxed);
            if r.wait_ns > 0 {
                hit.slot.delayed().fetch_add(1, Ordering::Relaxed);
                if dry_run_all || hit.action.is_dry_run() {
                    if would_delay.is_none_or(|(_, w)| r.wait_ns > w) {
                        would_delay = Some((hit.id, r.wait_ns));
                    }
                } else if r.wait_ns > longest {
                    longest = r.wait_ns;
                    verdict = Verdict::Delay {
                        id: hit.id,
                        wait_ns: r.wait_ns,
                    };
                }
            }
        }
        if matches!(entry, HitState::Stale) || hit.action.is_dry_run() {
            continue;
        }
        passed_by.get_or_insert(hit.id);
        if !quota {
            continue;
        }
        let q = hit
            .limiter
            .quota(&hit.slot, now_both.for_limiter(hit.limiter));
        match tightest {
            Some((_, t)) if t.remaining <= q.remaining => {}
            _ => tightest = Some((hit.id, q)),
        }
    }
    Decision {
        verdict,
        dry_run_rejected,
        would_delay,
        tightest,
        passed_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Strategy, Unit};
    use crate::core::shm::slot::{Counters, LocalSlots};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const REJECT: Action = Action::Reject { status: None };

    fn limiter(algorithm: Algorithm, rate: u64, per: Unit, burst: u32, action: Action) -> Limiter {
        let s = Strategy::unconditioned(algorithm, rate, per, burst, action);
        Limiter::from_strategy(&s.expect("valid strategy"))
    }

    /// A spec whose strategy rejects.
    fn rejecting(algorithm: Algorithm, rate: u64, per: Unit, burst: u32) -> (Limiter, Action) {
        (limiter(algorithm, rate, per, burst, REJECT), REJECT)
    }

    fn hits<'a>(
        region: &crate::core::shm::region::Region<'a>,
        specs: &'a [(Limiter, Action)],
    ) -> Vec<Hit<'a>> {
        specs
            .iter()
            .enumerate()
            .map(|(i, (l, a))| {
                let slot = Slot::at(region, i as u32).unwrap();
                slot.generation().store(1, Ordering::Relaxed);
                Hit {
                    id: 100 + i as u32,
                    limiter: l,
                    action: *a,
                    slot,
                    generation: 1,
                    units: 1,
                    check: false,
                }
            })
            .collect()
    }

    fn words(h: &Hit) -> (u64, u64) {
        (
            h.slot.state0().load(Ordering::Relaxed),
            h.slot.state1().load(Ordering::Relaxed),
        )
    }

    fn counters(h: &Hit) -> (u64, u64, u64) {
        let Counters {
            passed,
            limited,
            delayed,
        } = h.slot.counters();
        (passed, limited, delayed)
    }

    #[test]
    fn a_rejected_request_is_counted_by_no_strategy() {
        let specs = [
            rejecting(Algorithm::TokenBucket, 10, Unit::Second, 5),
            rejecting(Algorithm::SlidingWindow, 10, Unit::Second, 0),
            rejecting(Algorithm::Concurrency, 10, Unit::Second, 0),
            (
                limiter(Algorithm::FixedWindow, 2, Unit::Minute, 0, REJECT),
                Action::Reject { status: Some(429) },
            ),
        ];
        let local = LocalSlots::new(4);
        let region = local.region();
        let hits = hits(&region, &specs);
        let now = 100 * S;
        for _ in 0..2 {
            let d = admit(&hits, now, false);
            assert_eq!(d.verdict, Verdict::Pass);
        }
        let before: Vec<_> = hits.iter().map(words).collect();
        let d = admit(&hits, now, false);
        assert_eq!(
            d.verdict,
            Verdict::Reject {
                id: 103,
                status: Some(429),
                retry_after_ns: 20 * S
            }
        );
        assert_eq!(d.tightest.map(|(id, q)| (id, q.remaining)), Some((103, 0)));
        let after: Vec<_> = hits.iter().map(words).collect();
        assert_eq!(before, after, "refunds restore every earlier strategy");
        for h in &hits[..3] {
            assert_eq!(counters(h), (2, 0, 0));
        }
        assert_eq!(counters(&hits[3]), (2, 1, 0));
        // Concurrency: two requests in flight, both released.
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 2);
        release(&hits);
        release(&hits);
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 0);
    }

    #[test]
    fn dry_run_counts_and_goes_on_and_dry_run_all_never_rejects() {
        let specs = [
            (
                limiter(Algorithm::FixedWindow, 1, Unit::Hour, 0, Action::DryRun),
                Action::DryRun,
            ),
            rejecting(Algorithm::FixedWindow, 2, Unit::Hour, 0),
            (
                limiter(Algorithm::Concurrency, 1, Unit::Second, 0, Action::DryRun),
                Action::DryRun,
            ),
        ];
        let local = LocalSlots::new(3);
        let region = local.region();
        let hits = hits(&region, &specs);
        let d = admit(&hits, S, false);
        assert_eq!(d.verdict, Verdict::Pass);
        assert_eq!(d.dry_run_rejected, None);
        // Only the enforcing strategy is a header candidate.
        assert_eq!(d.tightest.map(|(id, q)| (id, q.remaining)), Some((101, 1)));
        let d = admit(&hits, S, false);
        assert_eq!(d.verdict, Verdict::Pass);
        assert_eq!(d.dry_run_rejected, Some(100));
        assert_eq!(counters(&hits[0]), (1, 1, 0));
        assert_eq!(counters(&hits[1]), (2, 0, 0));
        // The dry-run concurrency hit counts both requests in flight.
        assert_eq!(counters(&hits[2]), (1, 1, 0));
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 2);
        // Third request: the enforcing strategy rejects; nothing is held.
        let d = admit(&hits, S, false);
        assert!(matches!(d.verdict, Verdict::Reject { id: 101, .. }));
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 2);
        assert_eq!(counters(&hits[1]), (2, 1, 0));
        // dry_run_all: passes, counts the would-be rejection.
        let d = admit(&hits, S, true);
        assert_eq!(d.verdict, Verdict::Pass);
        assert_eq!(d.dry_run_rejected, Some(100));
        assert_eq!(counters(&hits[1]), (2, 2, 0));
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 3);
        for _ in 0..3 {
            release(&hits);
        }
        assert_eq!(hits[2].slot.state0().load(Ordering::Relaxed), 0);
    }

    #[test]
    fn windows_run_on_the_wall_clock_and_buckets_on_the_monotonic_one() {
        let specs = [
            rejecting(Algorithm::FixedWindow, 1, Unit::Minute, 0),
            rejecting(Algorithm::TokenBucket, 1, Unit::Minute, 1),
        ];
        let local = LocalSlots::new(2);
        let region = local.region();
        let hits = hits(&region, &specs);
        let at = |mono_s: u64, wall_ms: u64| Now {
            mono_ns: mono_s * S,
            wall_ns: wall_ms * MS,
        };
        // 59.9 s into a UTC minute, 5 s after boot.
        let w = 29_000_000 * 60_000 + 59_900;
        let fixed = &hits[..1];
        let bucket = &hits[1..];
        assert_eq!(admit(fixed, at(5, w), false).verdict, Verdict::Pass);
        assert!(matches!(
            admit(fixed, at(5, w + 50), false).verdict,
            Verdict::Reject { .. }
        ));
        // The UTC minute turns 0.2 s later; the monotonic one does not.
        assert_eq!(admit(fixed, at(5, w + 200), false).verdict, Verdict::Pass);
        // The bucket ignores the wall clock (a step forward refills nothing).
        assert_eq!(admit(bucket, at(5, w), false).verdict, Verdict::Pass);
        assert!(matches!(
            admit(bucket, at(5, w + 3_600_000), false).verdict,
            Verdict::Reject { .. }
        ));
    }

    #[test]
    fn a_dry_run_delay_queues_like_the_delay_and_reports_the_wait() {
        let dry = Action::DryRunDelay { max_delay_ms: 1000 };
        let specs = [(
            limiter(Algorithm::LeakyBucket, 4, Unit::Second, 1, dry),
            dry,
        )];
        let local = LocalSlots::new(1);
        let region = local.region();
        let hits = hits(&region, &specs);
        let first = admit(&hits, S, false);
        assert_eq!((first.verdict, first.would_delay), (Verdict::Pass, None));
        // Single-hit and listed paths agree: served now, the wait reported.
        let d = admit(&hits, S, false);
        assert_eq!(d.verdict, Verdict::Pass);
        assert_eq!(d.would_delay, Some((100, 250 * MS)));
        assert_eq!(d.dry_run_rejected, None);
        let d = admit_listed(&hits, S, false, false);
        assert_eq!(d.would_delay, Some((100, 500 * MS)));
        assert_eq!(counters(&hits[0]), (3, 0, 2));
        // 750 ms, 1 s, then over the cap: a would-be rejection.
        admit(&hits, S, false);
        admit(&hits, S, false);
        let d = admit(&hits, S, false);
        assert_eq!((d.verdict, d.dry_run_rejected), (Verdict::Pass, Some(100)));
        assert_eq!(counters(&hits[0]), (5, 1, 4));
    }

    #[test]
    fn delay_reports_the_longest_wait_unless_dry_run_all() {
        let delay = Action::Delay { max_delay_ms: 1000 };
        let specs = [
            (
                limiter(Algorithm::LeakyBucket, 10, Unit::Second, 1, delay),
                delay,
            ),
            (
                limiter(Algorithm::LeakyBucket, 4, Unit::Second, 1, delay),
                delay,
            ),
        ];
        let local = LocalSlots::new(2);
        let region = local.region();
        let hits = hits(&region, &specs);
        assert_eq!(admit(&hits, S, false).verdict, Verdict::Pass);
        assert_eq!(
            admit(&hits, S, false).verdict,
            Verdict::Delay {
                id: 101,
                wait_ns: 250 * MS
            }
        );
        assert_eq!(counters(&hits[0]), (2, 0, 1));
        assert_eq!(counters(&hits[1]), (2, 0, 1));
        assert_eq!(admit(&hits, S, true).verdict, Verdict::Pass);
        assert_eq!(counters(&hits[1]), (3, 0, 2));
        // 4/s, 3 queued: the next would wait 750 ms ≤ 1 s; then 1 s; then over.
        assert!(
            matches!(admit(&hits, S, false).verdict, Verdict::Delay { id: 101, wait_ns } if wait_ns == 750 * MS)
        );
        assert!(
            matches!(admit(&hits, S, false).verdict, Verdict::Delay { id: 101, wait_ns } if wait_ns == S)
        );
        let d = admit(&hits, S, false);
        assert_eq!(
            d.verdict,
            Verdict::Reject {
                id: 101,
                status: None,
                retry_after_ns: 250 * MS
            }
        );
    }

    #[test]
    fn stale_generation_is_skipped_by_admit_and_release() {
        let specs = [
            rejecting(Algorithm::Concurrency, 1, Unit::Second, 0),
            rejecting(Algorithm::FixedWindow, 1, Unit::Second, 0),
        ];
        let local = LocalSlots::new(2);
        let region = local.region();
        let hits = hits(&region, &specs);
        hits[1].slot.generation().store(2, Ordering::Release); // reassigned
        for _ in 0..3 {
            hits[0].slot.state0().store(0, Ordering::Relaxed);
            let d = admit(&hits, S, false);
            assert_eq!(d.verdict, Verdict::Pass);
            assert_eq!(d.tightest.map(|(id, _)| id), Some(100));
        }
        assert_eq!(counters(&hits[1]), (0, 0, 0));
        assert_eq!(words(&hits[1]), (0, 0));
        hits[0].slot.generation().store(2, Ordering::Release);
        release(&hits);
        assert_eq!(hits[0].slot.state0().load(Ordering::Relaxed), 1);
        let d = admit(&hits, S, false);
        assert_eq!(d.verdict, Verdict::Pass);
        assert_eq!(d.tightest, None);
    }

    #[test]
    fn tightest_is_the_smallest_remaining() {
        let specs = [
            rejecting(Algorithm::FixedWindow, 10, Unit::Second, 0),
            rejecting(Algorithm::TokenBucket, 1, Unit::Second, 3),
            rejecting(Algorithm::SlidingWindow, 2, Unit::Second, 0),
        ];
        let local = LocalSlots::new(3);
        let region = local.region();
        let hits = hits(&region, &specs);
        let d = admit(&hits, 10 * S, false);
        // Remaining 9, 2, 1.
        let (id, q) = d.tightest.unwrap();
        assert_eq!((id, q.limit, q.remaining), (102, 2, 1));
        assert_eq!(q.reset_ns, 2 * S);
    }

    #[test]
    fn more_hits_than_the_stack_array_are_handled_alike() {
        for n in [4usize, 5, 16, 17, 64, 65, 130] {
            let mut specs: Vec<(Limiter, Action)> = (0..n - 1)
                .map(|_| rejecting(Algorithm::FixedWindow, 5, Unit::Hour, 0))
                .collect();
            specs.push(rejecting(Algorithm::FixedWindow, 1, Unit::Hour, 0));
            let local = LocalSlots::new(n);
            let region = local.region();
            let hits = hits(&region, &specs);
            assert_eq!(admit(&hits, S, false).verdict, Verdict::Pass);
            let d = admit(&hits, S, false);
            assert!(
                matches!(d.verdict, Verdict::Reject { id, .. } if id == 100 + n as u32 - 1),
                "{n}"
            );
            for h in &hits[..n - 1] {
                assert_eq!(counters(h), (1, 0, 0), "{n}");
                assert_eq!(h.slot.state0().load(Ordering::Relaxed), 1, "{n}");
            }
        }
    }
}
