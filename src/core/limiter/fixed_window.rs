//! `fixed_window`: one packed word, the window and its count.
//!
//! The stored window is older than `now`'s window → the current window
//! starts with this request (count 1). The stored window is equal **or
//! newer** (this worker's clock reading is stale, or the clock went
//! backwards) → the request counts against the stored window: a stale time
//! never resets a window and never admits extra. `retry_after` is the end of
//! the counted window minus `now`, exact and at least 1 ns.

use super::window::{current, pack, unpack, window_of, window_start};
use super::{Quota, Step};

/// The step on the word `word` for `n` units: `count + n ≤ limit` admits
/// and counts `n`; else the retry is the end of the counted window (never,
/// `u64::MAX`, when `n > limit`). `n` = 1 is the one-request step.
#[inline(always)]
pub fn step(word: u64, now: u64, period: u64, limit: u64, n: u64) -> Step {
    let (win, count) = current(word, now, period);
    if count.saturating_add(n) > limit {
        let end = window_start(win.saturating_add(1), period);
        return Step::Reject {
            retry_after_ns: if n > limit {
                u64::MAX
            } else {
                end.saturating_sub(now).max(1)
            },
        };
    }
    // count + n ≤ limit ≤ u32::MAX − 1: the sum fits in 32 bits.
    Step::Admit {
        next: pack(win, count + n),
        wait_ns: 0,
    }
}

/// Is the word at `now` a new key's (count 0 or its window over)?
#[inline]
pub fn is_fresh(word: u64, now: u64, period: u64) -> bool {
    let (sw, sc) = unpack(word);
    sc == 0 || sw < window_of(now, period)
}

/// Quota of the word at `now` (`window_ns`: the period).
pub fn quota(word: u64, now: u64, period: u64, limit: u64) -> Quota {
    let (win, count) = current(word, now, period);
    let end = window_start(win.saturating_add(1), period);
    Quota {
        window_ns: period,
        ..Quota::new(limit, limit.saturating_sub(count), end.saturating_sub(now))
    }
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
