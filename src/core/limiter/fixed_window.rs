//! `fixed_window`: one packed word, the window and its count.
//!
//! The stored window is older than `now`'s window → the current window
//! starts with this request (count 1). The stored window is equal **or
//! newer** (this worker's clock reading is stale, or the clock went
//! backwards) → the request counts against the stored window: a stale time
//! never resets a window and never admits extra. `retry_after` is the end of
//! the counted window minus `now`, exact and at least 1 ns.

use std::sync::atomic::{AtomicU64, Ordering};

use super::window::{pack, unpack, window_of, window_start};
use super::{Acquired, Quota, Reservation};

#[inline(never)]
pub(super) fn acquire(w: &AtomicU64, now: u64, period: u64, limit: u64) -> Acquired {
    acquire_n(w, now, period, limit, 1)
}

/// `n` units at once (`cost_from`, issue 31): admitted only if all fit.
#[inline(never)]
pub(super) fn acquire_units(w: &AtomicU64, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    acquire_n(w, now, period, limit, n)
}

/// The step of both, on the word `cur`: `count + n ≤ limit` admits and
/// counts `n` (`Ok(next word)`); else `Err(retry_after_ns)`. With `n` = 1
/// (a constant in [`acquire`]) it is the one-request step.
#[inline(always)]
fn step(cur: u64, w_now: u64, now: u64, period: u64, limit: u64, n: u64) -> Result<u64, u64> {
    let (sw, sc) = unpack(cur);
    // Older → a fresh window; equal or newer → count against it.
    let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
    if count.saturating_add(n) > limit {
        let end = window_start(win.saturating_add(1), period);
        return Err(if n > limit {
            u64::MAX
        } else {
            end.saturating_sub(now).max(1)
        });
    }
    // count + n ≤ limit ≤ u32::MAX − 1: the sum fits in 32 bits.
    Ok(pack(win, count + n))
}

#[inline(always)]
fn acquire_n(w: &AtomicU64, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    let w_now = window_of(now, period);
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let next = match step(cur, w_now, now, period, limit, n) {
            Ok(next) => next,
            Err(retry_after_ns) => return Acquired::Rejected { retry_after_ns },
        };
        match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                return Acquired::Admitted(Reservation {
                    wait_ns: 0,
                    token: next,
                    prev: cur,
                })
            }
            Err(actual) => cur = actual,
        }
    }
}

/// Would `n` units be admitted now (`count_if`, issue 31)? The step on
/// the current word, nothing written (the request is charged later).
pub(super) fn check_units(w: &AtomicU64, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    let cur = w.load(Ordering::Acquire);
    match step(cur, window_of(now, period), now, period, limit, n) {
        Ok(next) => Acquired::Admitted(Reservation {
            wait_ns: 0,
            token: next,
            prev: cur,
        }),
        Err(retry_after_ns) => Acquired::Rejected { retry_after_ns },
    }
}

pub(super) fn quota(w: &AtomicU64, now: u64, period: u64, limit: u64) -> Quota {
    let w_now = window_of(now, period);
    let (sw, sc) = unpack(w.load(Ordering::Acquire));
    let (w, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
    let end = window_start(w.saturating_add(1), period);
    Quota::new(limit, limit.saturating_sub(count), end.saturating_sub(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::test_util::*;

    #[test]
    fn fixed_window_counts_and_retry_after_is_the_window_end() {
        let l = limiter(Algorithm::FixedWindow, 3, Unit::Minute, 0, REJECT);
        with_slot(|slot| {
            let now = 60 * S * 10 + 15 * S;
            admit_all(&l, slot, 3, now);
            let ra = retry(&l, slot, now);
            assert_eq!(ra, 45 * S);
            assert!(!admitted(&l, slot, now + ra - 1));
            assert!(admitted(&l, slot, now + ra));
            assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (11, 1));
        });
    }

    #[test]
    fn fixed_window_stale_time_counts_against_the_newer_window() {
        let l = limiter(Algorithm::FixedWindow, 2, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            assert!(admitted(&l, slot, 10 * S + 1));
            // A stale worker still in window 9: counted in window 10, not
            // a reset of window 9.
            assert!(admitted(&l, slot, 10 * S - 1));
            assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (10, 2));
            assert_eq!(retry(&l, slot, 10 * S - 1), S + 1);
            // The clock jumps back 5 s: still window 10's quota, exhausted.
            let clock = FakeClock::new(0);
            assert_eq!(drive(&l, slot, &clock, 5 * S, 11 * S, 10 * MS), 0);
            assert!(admitted(&l, slot, 11 * S));
        });
    }

    #[test]
    fn fixed_window_garbage_never_panics_nor_admits_more_than_a_window() {
        let l = limiter(Algorithm::FixedWindow, 50, Unit::Second, 0, REJECT);
        for garbage in [
            u64::MAX,
            pack(5, 7),
            pack(101, 20),
            pack(1 << 31, 0),
            0xffff_ffff,
        ] {
            with_slot(|slot| {
                slot.state0().store(garbage, Ordering::Relaxed);
                let clock = FakeClock::new(0);
                at_most_per_window(&l, slot, &clock, 50, &format!("{garbage:#x}"));
                // Healed by the agent's repair (or by time): the next
                // window grants the full quota.
                assert_eq!(drive(&l, slot, &clock, 110 * S, 111 * S, MS), 50);
            });
        }
    }
}
