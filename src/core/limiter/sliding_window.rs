//! `sliding_window`: two packed words, even and odd windows.
//!
//! `estimate = floor(prev_count × (period − elapsed) / period) + cur_count`
//! (u128 arithmetic); a request is admitted when `estimate + 1 ≤ limit`, by
//! CAS-incrementing the current window's word. If either word holds a window
//! newer than `now`'s (stale or backwards time), the request is evaluated at
//! the *start* of that newest window (elapsed 0, the largest weight on the
//! previous window) and counted in it — the conservative reading.
//!
//! Two words cannot be updated in one CAS, so after a successful increment
//! the limiter re-reads the other word (all sliding-window accesses are
//! `SeqCst`, not just acquire/release: this is a store-then-load check
//! between two words, Dekker style, which only sequential consistency
//! makes sound). If the other word has meanwhile moved to a newer window,
//! or its count (our previous window) has grown so that the estimate is
//! over the limit, the increment is undone and the request re-evaluated.
//! Of two racing requests at least one sees the other, so a window boundary
//! never lets both through on stale counts. `retry_after` is computed
//! exactly from the two counts (assuming no other traffic), so it is never
//! early.

use std::sync::atomic::Ordering;

use super::window::{pack, unpack, window_of, window_start};
use super::{Acquired, Quota, Reservation};
use crate::core::slot::Slot;

/// `floor(prev × (period − elapsed) / period) + cur`.
#[inline]
fn sliding_estimate(prev: u64, cur: u64, elapsed: u64, period: u64) -> u64 {
    let weight = period.saturating_sub(elapsed);
    // A 64-bit division when the product fits (the common case), 128-bit
    // otherwise; the result is the same.
    let weighted = match prev.checked_mul(weight) {
        Some(p) => p / period,
        None => ((prev as u128 * weight as u128) / period as u128) as u64,
    };
    weighted.saturating_add(cur)
}

/// Smallest elapsed time `e` in a window with `prev` requests in the
/// previous one such that `floor(prev × (period − e) / period) ≤ k`;
/// `period` when no `e` inside the window qualifies.
#[inline]
fn sliding_min_elapsed(prev: u64, k: u64, period: u64) -> u64 {
    if prev == 0 {
        return 0;
    }
    // prev × (P − e) ≤ (k + 1) × P − 1  ⟺  P − e ≤ ((k + 1) × P − 1) / prev
    let bound = ((k as u128 + 1) * period as u128 - 1) / prev as u128;
    period.saturating_sub(bound.min(period as u128) as u64)
}

/// What a sliding-window request sees, after stale-time adjustment.
#[derive(Debug, Clone, Copy)]
struct SlidingView {
    /// The window the request counts in.
    window: u64,
    /// Elapsed time in it (0 if the window is newer than `now`'s).
    elapsed: u64,
    cur: u64,
    prev: u64,
    /// The raw word of the current window's position.
    cur_word: u64,
}

impl SlidingView {
    fn read(words: [u64; 2], now: u64, period: u64) -> SlidingView {
        let w_now = window_of(now, period);
        let newest = unpack(words[0]).0.max(unpack(words[1]).0);
        let (window, elapsed) = if newest > w_now {
            (newest, 0)
        } else {
            let e = now.saturating_sub(window_start(w_now, period));
            (w_now, e.min(period))
        };
        let cur_word = words[(window & 1) as usize];
        let prev_word = words[((window & 1) ^ 1) as usize];
        let (cw, cc) = unpack(cur_word);
        let (pw, pc) = unpack(prev_word);
        SlidingView {
            window,
            elapsed,
            cur: if cw == window { cc } else { 0 },
            prev: if window >= 1 && pw == window - 1 {
                pc
            } else {
                0
            },
            cur_word,
        }
    }

    fn estimate(&self, period: u64) -> u64 {
        sliding_estimate(self.prev, self.cur, self.elapsed, period)
    }

    /// Exact time from `now` until `estimate + 1 ≤ limit`, with no other
    /// traffic.
    fn retry_after(&self, now: u64, period: u64, limit: u64, n: u64) -> u64 {
        if limit == 0 || n > limit {
            return u64::MAX;
        }
        let at = if self.cur + n <= limit {
            // Still possible inside this window, once prev has decayed.
            let e = sliding_min_elapsed(self.prev, limit - n - self.cur, period);
            window_start(self.window, period).saturating_add(e)
        } else {
            // Next window: prev becomes this window's count, cur 0.
            let e = sliding_min_elapsed(self.cur, limit - n, period);
            window_start(self.window.saturating_add(1), period).saturating_add(e)
        };
        at.saturating_sub(now).max(1)
    }
}

#[inline(never)]
pub(super) fn acquire(slot: &Slot, now: u64, period: u64, limit: u64) -> Acquired {
    acquire_n(slot, now, period, limit, 1)
}

/// `n` units at once (`cost_from`, issue 31): admitted only if all fit.
#[inline(never)]
pub(super) fn acquire_units(slot: &Slot, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    acquire_n(slot, now, period, limit, n)
}

/// The step of both: `estimate + n ≤ limit` admits and counts `n` in the
/// current window (`n` = 1, a constant, in [`acquire`]).
#[inline(always)]
fn acquire_n(slot: &Slot, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    let words = [slot.state0(), slot.state1()];
    loop {
        let vals = [
            words[0].load(Ordering::SeqCst),
            words[1].load(Ordering::SeqCst),
        ];
        let (v, next) = match step(vals, now, period, limit, n) {
            Ok(s) => s,
            Err(retry_after_ns) => return Acquired::Rejected { retry_after_ns },
        };
        let pos = (v.window & 1) as usize;
        if words[pos]
            .compare_exchange(v.cur_word, next, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            continue;
        }
        // Cross-check the other word (see the module documentation).
        let (ow, oc) = unpack(words[pos ^ 1].load(Ordering::SeqCst));
        let stale = ow > v.window
            || (v.window >= 1
                && ow == v.window - 1
                && oc > v.prev
                && sliding_estimate(oc, v.cur + n, v.elapsed, period) > limit);
        let r = Reservation {
            wait_ns: 0,
            token: next,
            prev: v.cur_word,
        };
        if !stale {
            return Acquired::Admitted(r);
        }
        super::window::refund_n(words[pos], r, n);
    }
}

/// The step on the two words `vals`: `estimate + n ≤ limit` admits, with
/// the view and the current window's next word; else `Err(retry_after_ns)`.
#[inline(always)]
fn step(
    vals: [u64; 2],
    now: u64,
    period: u64,
    limit: u64,
    n: u64,
) -> Result<(SlidingView, u64), u64> {
    let v = SlidingView::read(vals, now, period);
    if v.estimate(period).saturating_add(n) > limit {
        return Err(v.retry_after(now, period, limit, n));
    }
    // estimate + n ≤ limit ≤ u32::MAX − 1 and cur ≤ estimate: fits.
    Ok((v, pack(v.window, v.cur + n)))
}

/// Would `n` units be admitted now (`count_if`, issue 31)? The step on
/// the current words, nothing written.
pub(super) fn check_units(slot: &Slot, now: u64, period: u64, limit: u64, n: u64) -> Acquired {
    let vals = [
        slot.state0().load(Ordering::SeqCst),
        slot.state1().load(Ordering::SeqCst),
    ];
    match step(vals, now, period, limit, n) {
        Ok((v, next)) => Acquired::Admitted(Reservation {
            wait_ns: 0,
            token: next,
            prev: v.cur_word,
        }),
        Err(retry_after_ns) => Acquired::Rejected { retry_after_ns },
    }
}

pub(super) fn quota(slot: &Slot, now: u64, period: u64, limit: u64) -> Quota {
    let words = [
        slot.state0().load(Ordering::SeqCst),
        slot.state1().load(Ordering::SeqCst),
    ];
    let v = SlidingView::read(words, now, period);
    let next = window_start(v.window.saturating_add(1), period);
    let reset = if v.cur > 0 {
        next.saturating_add(period).saturating_sub(now)
    } else if v.prev > 0 {
        next.saturating_sub(now)
    } else {
        0
    };
    Quota::new(limit, limit.saturating_sub(v.estimate(period)), reset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::test_util::*;

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let l = limiter(Algorithm::SlidingWindow, 10, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            admit_all(&l, slot, 10, 20 * S + 500 * MS);
            assert!(!admitted(&l, slot, 20 * S + 999 * MS));
            // At 21.25 s the previous window weighs 0.75 × 10 = 7.5 → 7:
            // three more fit.
            let t = 21 * S + 250 * MS;
            admit_all(&l, slot, 3, t);
            // floor(10 × 0.7) + 3 = 10 at 21.3 s; floor(10 × 0.6) + 3 = 9 at 21.4 s.
            let ra = retry(&l, slot, t);
            assert_eq!(t + ra, 21 * S + 300 * MS + 1);
            assert!(!admitted(&l, slot, t + ra - 1));
            assert!(admitted(&l, slot, t + ra));
        });
    }

    #[test]
    fn sliding_window_retry_after_when_the_current_window_is_full() {
        let l = limiter(Algorithm::SlidingWindow, 4, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            admit_all(&l, slot, 4, 7 * S + 900 * MS);
            // Next window: floor(4 × (P − e) / P) + 1 ≤ 4 from e = 1 ns on.
            let ra = retry(&l, slot, 7 * S + 900 * MS);
            assert_eq!(7 * S + 900 * MS + ra, 8 * S + 1);
            assert!(!admitted(&l, slot, 8 * S));
            assert!(admitted(&l, slot, 8 * S + 1));
            // Now 1 in window 8 and prev = 4. At 0.5 s: floor(4 × 0.5) = 2,
            // 2 + 1 + 1 ≤ 4 admits; 2 + 2 + 1 does not. The next one needs
            // floor(4 × (P − e) / P) ≤ 1: e = 0.5 s + 1 ns; the one after
            // ≤ 0: e = 0.75 s + 1 ns.
            assert!(admitted(&l, slot, 8 * S + 500 * MS));
            let ra = retry(&l, slot, 8 * S + 500 * MS);
            assert_eq!(8 * S + 500 * MS + ra, 8 * S + 500 * MS + 1);
            assert!(admitted(&l, slot, 8 * S + 500 * MS + 1));
            let ra = retry(&l, slot, 8 * S + 500 * MS + 1);
            assert_eq!(8 * S + 500 * MS + 1 + ra, 8 * S + 750 * MS + 1);
            assert!(!admitted(&l, slot, 8 * S + 750 * MS));
            assert!(admitted(&l, slot, 8 * S + 750 * MS + 1));
        });
    }

    #[test]
    fn sliding_window_stale_time_is_evaluated_at_the_newest_window() {
        let l = limiter(Algorithm::SlidingWindow, 4, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            admit_all(&l, slot, 4, 9 * S + 999 * MS);
            // floor(4 × 0.1) = 0
            assert!(admitted(&l, slot, 10 * S + 900 * MS));
            // A stale reading in window 9 (or a clock stepped back): it is
            // taken at the start of window 10, where 4 + 1 ≥ 4.
            assert!(!admitted(&l, slot, 9 * S + 999 * MS));
            assert!(!admitted(&l, slot, 3 * S));
            assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (10, 1));
            assert_eq!(unpack(slot.state1().load(Ordering::Relaxed)), (9, 4));
        });
    }

    #[test]
    fn sliding_window_garbage_never_panics_nor_admits_more_than_a_window() {
        let l = limiter(Algorithm::SlidingWindow, 50, Unit::Second, 0, REJECT);
        let cases = [
            (u64::MAX, u64::MAX),
            (pack(101, 3), pack(100, 9)), // wrong parity
            (pack(100, 49), 0),
            (0, pack(1 << 30, 5)),
            (pack(104, 2), pack(103, 2)),
            (0xffff_ffff, 0xffff_ffff),
        ];
        for (a, b) in cases {
            with_slot(|slot| {
                slot.state0().store(a, Ordering::Relaxed);
                slot.state1().store(b, Ordering::Relaxed);
                let clock = FakeClock::new(0);
                at_most_per_window(&l, slot, &clock, 50, &format!("{a:#x}/{b:#x}"));
                let n = drive(&l, slot, &clock, 110 * S, 120 * S, MS);
                assert!((480..=500).contains(&n), "not healed: {n}");
            });
        }
    }
}

#[cfg(test)]
mod race_tests {
    use super::*;
    use crate::core::limiter::Limiter;
    use crate::core::model::Unit;
    use crate::core::model::{Action, Algorithm, Strategy};
    use crate::core::slot::LocalSlots;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Barrier;

    /// Requests racing across a sliding-window boundary: some threads read
    /// a time at the very end of window 0 (stale), others the very start of
    /// window 1, where the estimate is `count(0) + count(1)`. Whatever the
    /// interleaving, `count(0) + count(1)` may never exceed the limit: that
    /// is what the cross-check after each increment guarantees (without it
    /// a late increment of window 0 is missed by a window-1 request).
    #[test]
    fn sliding_window_boundary_race_never_overcounts() {
        const THREADS: usize = 4;
        const LIMIT: u64 = 3;
        let reject = Action::Reject { status: None };
        let st = Strategy::unconditioned(Algorithm::SlidingWindow, LIMIT, Unit::Second, 0, reject);
        let l = Limiter::from_strategy(&st.unwrap());
        let period = Unit::Second.period_ns();
        let local = LocalSlots::new(1);
        let region = local.region();
        let slot = Slot::at(&region, 0).unwrap();
        let start = Barrier::new(THREADS + 1);
        let done = Barrier::new(THREADS + 1);
        let admitted = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let panicked = AtomicBool::new(false);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut rounds = 0u64;
        let mut failure = None;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (l, slot, start, done, admitted, stop, panicked) =
                    (&l, &slot, &start, &done, &admitted, &stop, &panicked);
                s.spawn(move || loop {
                    start.wait();
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    // A panic must not leave the others waiting forever.
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        for i in 0..6 {
                            // Threads mix stale (end of window 0) and fresh
                            // (start of window 1) readings.
                            let now = if (t + i) % 3 == 0 { period } else { period - 1 };
                            if l.acquire(slot, now).is_admitted() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                    if run.is_err() {
                        panicked.store(true, Ordering::SeqCst);
                    }
                    done.wait();
                });
            }
            while std::time::Instant::now() < deadline && rounds < 200_000 {
                slot.state0().store(0, Ordering::SeqCst);
                slot.state1().store(0, Ordering::SeqCst);
                admitted.store(0, Ordering::SeqCst);
                start.wait();
                done.wait();
                let (w0, c0) = unpack(slot.state0().load(Ordering::SeqCst));
                let (w1, c1) = unpack(slot.state1().load(Ordering::SeqCst));
                let c0 = if w0 == 0 { c0 } else { 0 };
                let c1 = if w1 == 1 { c1 } else { 0 };
                let n = admitted.load(Ordering::SeqCst);
                rounds += 1;
                if panicked.load(Ordering::SeqCst) {
                    failure = Some(format!("round {rounds}: acquire panicked"));
                    break;
                }
                if c0 + c1 > LIMIT || c0 + c1 != n {
                    // Not a panic here: the workers wait on the barriers.
                    failure = Some(format!("round {rounds}: {c0} + {c1} counted, {n} admitted"));
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            start.wait();
        });
        assert_eq!(failure, None, "limit {LIMIT} exceeded or counts lost");
        assert!(rounds > 1_000, "only {rounds} rounds");
    }
}
