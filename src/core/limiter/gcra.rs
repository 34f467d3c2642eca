//! The GCRA (generic cell rate algorithm): `token_bucket` and `leaky_bucket`.
//!
//! `T` = period / rate rounded **up** (so rounding never admits more than
//! the rate), `tau = T × burst` (leaky bucket: burst 1). A request at `now`
//! computes `new_tat = max(tat, now) + T` and is admitted when
//! `new_tat − now ≤ tau + max_delay` (`max_delay` is 0 unless the action is
//! `delay`); it then waits `(new_tat − now) − tau` (0 when there was a token).
//! A rejection reports the exact earliest time at which the same request
//! would be admitted: `retry_after = new_tat − now − (tau + max_delay)`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Quota, Step, MAX_STALENESS_NS};

/// The compiled parameters: `interval` = T (for `n` units: `n × T`, see
/// [`Gcra::cost`]); `tau` = T × burst; `max_delay` in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    pub interval: u64,
    pub tau: u64,
    pub max_delay: u64,
}

impl Gcra {
    /// From a strategy's interval (ns), burst and longest delay (ns):
    /// leaky bucket is burst 1. Clamped so that no sum overflows.
    pub fn new(interval_ns: u64, burst: u64, max_delay_ns: u64) -> Gcra {
        let interval = interval_ns.clamp(1, u64::MAX / 4);
        Gcra {
            interval,
            tau: interval.saturating_mul(burst.max(1)).min(u64::MAX / 4),
            max_delay: max_delay_ns.min(u64::MAX / 4),
        }
    }

    /// What `n` units cost: `n × T`, clamped as `T` is.
    #[inline(always)]
    pub fn cost(&self, n: u64) -> u64 {
        self.interval.saturating_mul(n).min(u64::MAX / 4)
    }

    /// The step on the TAT `tat` for a request costing `cost` (T, or
    /// [`cost`](Self::cost) of n units): admitted (new TAT, wait) when it
    /// fits within the horizon `tau + max_delay`.
    #[inline(always)]
    pub fn step(&self, tat: u64, now: u64, cost: u64) -> Step {
        let horizon = self.tau.saturating_add(self.max_delay);
        let Some(next) = tat.max(now).checked_add(cost) else {
            return Step::Reject {
                retry_after_ns: u64::MAX,
            };
        };
        let ahead = next - now; // next > max(tat, now) ≥ now
        if ahead > horizon {
            return Step::Reject {
                retry_after_ns: ahead - horizon,
            };
        }
        Step::Admit {
            next,
            wait_ns: ahead.saturating_sub(self.tau),
        }
    }

    /// The TAT after giving back an admission of `cost` that turned `prev`
    /// into `token`, the TAT being `cur` now: `prev` if nothing came in
    /// between, else `cur − cost` (saturating).
    #[inline]
    pub fn refund(&self, cur: u64, token: u64, prev: u64, cost: u64) -> u64 {
        if cur == token {
            prev
        } else {
            cur.saturating_sub(cost)
        }
    }

    /// The charge after the response (issue 31): a positive `delta` moves
    /// the TAT on by `delta × T` even past the horizon (debt: later
    /// requests wait until it is paid), at most [`MAX_DEBT_NS`] beyond it
    /// so that the agent's repair never takes a debt for foreign state; a
    /// negative one gives units back (as a refund does).
    pub fn charge_after(&self, tat: u64, now: u64, delta: i64) -> u64 {
        let units = self.interval.saturating_mul(delta.unsigned_abs());
        if delta >= 0 {
            let horizon = self.tau.saturating_add(self.max_delay);
            let cap = now.saturating_add(horizon).saturating_add(MAX_DEBT_NS);
            tat.max(now).saturating_add(units).min(cap.max(tat))
        } else {
            tat.saturating_sub(units)
        }
    }

    /// A TAT not ahead of `now` is a full bucket, as a new one.
    #[inline]
    pub fn is_fresh(&self, tat: u64, now: u64) -> bool {
        tat <= now
    }

    /// Quota of the TAT `tat` at `now` (`window_ns`: tau).
    pub fn quota(&self, tat: u64, now: u64) -> Quota {
        let burst = self.tau / self.interval;
        let used = tat.max(now) - now; // max(tat, now) ≥ now
        let remaining = self.tau.saturating_sub(used) / self.interval;
        Quota {
            window_ns: self.tau,
            ..Quota::new(burst, remaining, tat.saturating_sub(now))
        }
    }
}

/// Longest debt a bucket takes beyond its horizon ([`charge_after`]):
/// half the agent's foreign-state margin.
pub const MAX_DEBT_NS: u64 = MAX_STALENESS_NS / 2;

/// See [`super::Limiter::repair_foreign`]: a TAT beyond the horizon of a
/// fresh clock by more than [`MAX_STALENESS_NS`] becomes an empty bucket
/// with a full delay queue.
pub(super) fn repair_foreign(g: &Gcra, w: &AtomicU64, clock: impl FnOnce() -> u64) -> bool {
    let tat = w.load(Ordering::SeqCst);
    let now = clock();
    let horizon = g.tau.saturating_add(g.max_delay);
    if tat <= now.saturating_add(horizon).saturating_add(MAX_STALENESS_NS) {
        return false;
    }
    let repaired = now.saturating_add(horizon);
    w.compare_exchange(tat, repaired, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::test_util::*;

    #[test]
    fn new_gcra_slot_is_a_full_bucket_and_retry_after_is_exact() {
        let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 5, REJECT);
        with_slot(|slot| {
            let clock = FakeClock::new(1_000 * S);
            admit_all(&l, slot, 5, clock.now_ns());
            let ra = retry(&l, slot, clock.now_ns());
            assert_eq!(ra, 100 * MS);
            assert!(!admitted(&l, slot, clock.now_ns() + ra - 1));
            assert!(admitted(&l, slot, clock.now_ns() + ra));
        });
    }

    #[test]
    fn gcra_full_bucket_even_at_time_zero() {
        // A TAT of 0 is never ahead of any clock, so a new slot is full
        // even right after boot.
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Hour, 3, REJECT);
        with_slot(|slot| {
            admit_all(&l, slot, 3, 0);
            assert!(!admitted(&l, slot, 0));
        });
    }

    #[test]
    fn leaky_bucket_delay_queues_up_to_the_bound() {
        let l = limiter(
            Algorithm::LeakyBucket,
            10,
            Unit::Second,
            99,
            Action::Delay { max_delay_ms: 350 },
        );
        with_slot(|slot| {
            let now = 5 * S;
            let waits: Vec<u64> = (0..4)
                .map(|_| match l.acquire(slot, now) {
                    Acquired::Admitted(r) => r.wait_ns,
                    o => panic!("{o:?}"),
                })
                .collect();
            assert_eq!(waits, vec![0, 100 * MS, 200 * MS, 300 * MS]);
            // The fifth would wait 400 ms > 350 ms.
            let ra = retry(&l, slot, now);
            assert_eq!(ra, 50 * MS);
            match l.acquire(slot, now + ra) {
                Acquired::Admitted(r) => assert_eq!(r.wait_ns, 350 * MS),
                o => panic!("{o:?}"),
            }
        });
    }

    #[test]
    fn gcra_refund_restores_the_state_exactly() {
        let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 2, REJECT);
        with_slot(|slot| {
            slot.state0().store(3 * S, Ordering::Relaxed);
            let before = slot.state0().load(Ordering::Relaxed);
            let Acquired::Admitted(r) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            l.refund(slot, r);
            assert_eq!(slot.state0().load(Ordering::Relaxed), before);
            // Under interleaving the refund subtracts one interval.
            let Acquired::Admitted(a) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            let Acquired::Admitted(_b) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            l.refund(slot, a);
            assert_eq!(slot.state0().load(Ordering::Relaxed), 7 * S + 100 * MS);
        });
    }

    #[test]
    fn gcra_clock_going_backwards_admits_nothing_extra() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 5, REJECT);
        with_slot(|slot| {
            let clock = FakeClock::new(100 * S);
            admit_all(&l, slot, 5, 100 * S);
            assert!(!admitted(&l, slot, 100 * S));
            // Back 10 s: the bucket stays empty until the clock catches up
            // with the state (TAT 105 s: one token again at 101 s).
            assert_eq!(drive(&l, slot, &clock, 90 * S, 101 * S, 10 * MS), 0);
            assert!(admitted(&l, slot, 101 * S));
            // A stale reading slightly behind never admits either.
            assert!(!admitted(&l, slot, 101 * S - 1));
        });
    }

    #[test]
    fn gcra_garbage_and_foreign_state_never_panics_nor_admits_extra() {
        let l = limiter(Algorithm::TokenBucket, 100, Unit::Second, 10, REJECT);
        for garbage in [
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            0xdead_beef_dead_beef,
            500 * S,
        ] {
            with_slot(|slot| {
                slot.state0().store(garbage, Ordering::Relaxed);
                let clock = FakeClock::new(100 * S);
                // 1000 requests a second for 10 s: the request path never
                // rewinds, so at most the rate, no burst...
                let n = drive(&l, slot, &clock, 100 * S, 110 * S, MS);
                assert!(n <= 1000, "garbage {garbage:#x}: {n} admitted");
                // ...and once the agent repaired it (an empty bucket with a
                // full queue), the rate is granted again.
                let _ = l.repair_foreign(slot, || 110 * S);
                let n = drive(&l, slot, &clock, 110 * S, 120 * S, MS);
                assert!(n <= 1000, "garbage {garbage:#x}: {n} admitted");
                assert!(n >= 990, "garbage {garbage:#x}: only {n} admitted");
            });
        }
    }

    #[test]
    fn gcra_state_within_staleness_is_waited_out_not_repaired() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 1, REJECT);
        with_slot(|slot| {
            // 30 s ahead: a clock stepped back within tolerance. Waited out.
            slot.state0().store(130 * S, Ordering::Relaxed);
            assert_eq!(retry(&l, slot, 100 * S), 30 * S);
            assert_eq!(slot.state0().load(Ordering::Relaxed), 130 * S);
        });
    }

    #[test]
    fn gcra_near_the_end_of_time_rejects_without_panicking() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 3, REJECT);
        with_slot(|slot| {
            assert_eq!(
                l.acquire(slot, u64::MAX),
                Acquired::Rejected {
                    retry_after_ns: u64::MAX
                }
            );
            assert!(admitted(&l, slot, u64::MAX - 2 * S));
            let _ = l.quota(slot, u64::MAX);
        });
    }
}
