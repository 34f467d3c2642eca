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
use super::{Acquired, Quota, Reservation, Step};
use crate::core::shm::slot::Slot;

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

/// What a sliding-window request sees, after stale-time adjustment,
/// whatever the packing of the words it was read from (the shared
/// slot's two words, [`SlotView::read`]; a key's one, [`KeyView::read`]).
/// All of the algorithm's arithmetic is here.
#[derive(Debug, Clone, Copy)]
struct View {
    /// The window the request counts in.
    window: u64,
    /// Elapsed time in it (0 if the window is newer than `now`'s).
    elapsed: u64,
    cur: u64,
    prev: u64,
}

impl View {
    fn estimate(&self, period: u64) -> u64 {
        sliding_estimate(self.prev, self.cur, self.elapsed, period)
    }

    /// The step for `n` units: `estimate + n ≤ limit` admits, with the
    /// window's count after it; else `Err(retry_after_ns)`.
    #[inline(always)]
    fn step(&self, now: u64, period: u64, limit: u64, n: u64) -> Result<u64, u64> {
        if self.estimate(period).saturating_add(n) > limit {
            return Err(self.retry_after(now, period, limit, n));
        }
        // estimate + n ≤ limit ≤ u32::MAX − 1 and cur ≤ estimate: fits.
        Ok(self.cur + n)
    }

    /// Exact time from `now` until `estimate + n ≤ limit`, with no other
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

    /// Quota at `now` (`window_ns`: the period).
    fn quota(&self, now: u64, period: u64, limit: u64) -> Quota {
        let next = window_start(self.window.saturating_add(1), period);
        let reset = if self.cur > 0 {
            next.saturating_add(period).saturating_sub(now)
        } else if self.prev > 0 {
            next.saturating_sub(now)
        } else {
            0
        };
        Quota {
            window_ns: period,
            ..Quota::new(limit, limit.saturating_sub(self.estimate(period)), reset)
        }
    }
}

/// The shared slot's two words (even and odd windows) as a [`View`].
#[derive(Debug, Clone, Copy)]
struct SlotView {
    v: View,
    /// The raw word of the current window's position.
    cur_word: u64,
}

impl SlotView {
    fn read(words: [u64; 2], now: u64, period: u64) -> SlotView {
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
        SlotView {
            v: View {
                window,
                elapsed,
                cur: if cw == window { cc } else { 0 },
                prev: if window >= 1 && pw == window - 1 {
                    pc
                } else {
                    0
                },
            },
            cur_word,
        }
    }

    fn load(slot: &Slot, now: u64, period: u64) -> SlotView {
        let vals = [
            slot.state0().load(Ordering::SeqCst),
            slot.state1().load(Ordering::SeqCst),
        ];
        SlotView::read(vals, now, period)
    }
}

/// One request on the shared slot (a call: off the inlined path).
#[inline(never)]
pub(super) fn acquire(slot: &Slot, now: u64, period: u64, limit: u64) -> Acquired {
    run(slot, now, period, limit, 1, true)
}

/// `n` units (`cost_from`), or only their check (`count_if`, issue 31).
#[inline(never)]
pub(super) fn units(
    slot: &Slot,
    now: u64,
    period: u64,
    limit: u64,
    n: u64,
    write: bool,
) -> Acquired {
    run(slot, now, period, limit, n, write)
}

/// The shared slot's compare-and-swap loop around [`View::step`] for `n`
/// units; `write: false` only checks, nothing written.
#[inline(always)]
fn run(slot: &Slot, now: u64, period: u64, limit: u64, n: u64, write: bool) -> Acquired {
    let words = [slot.state0(), slot.state1()];
    loop {
        let sv = SlotView::load(slot, now, period);
        let v = sv.v;
        let next = match v.step(now, period, limit, n) {
            Ok(count) => pack(v.window, count),
            Err(retry_after_ns) => return Acquired::Rejected { retry_after_ns },
        };
        let r = Reservation {
            wait_ns: 0,
            token: next,
            prev: sv.cur_word,
        };
        if !write {
            return Acquired::Admitted(r);
        }
        let pos = (v.window & 1) as usize;
        if words[pos]
            .compare_exchange(sv.cur_word, next, Ordering::SeqCst, Ordering::SeqCst)
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
        if !stale {
            return Acquired::Admitted(r);
        }
        super::window::update(words[pos], |cur| {
            super::window::refund(cur, next, sv.cur_word, n)
        });
    }
}

pub(super) fn quota(slot: &Slot, now: u64, period: u64, limit: u64) -> Quota {
    SlotView::load(slot, now, period)
        .v
        .quota(now, period, limit)
}

/// Largest `rate` of a per-key `sliding_window` (20-bit counts).
pub const MAX_SLIDING_COUNT: u64 = (1 << 20) - 1;
/// How many windows ahead of `now` a key's stored window may be and still
/// be read as newer (a worker's stale clock reading).
pub const AHEAD_WINDOWS: u64 = 16;
const W_MASK: u64 = (1 << 24) - 1;
const C_MASK: u64 = (1 << 20) - 1;

/// A key's one word (`src/core/keys/state.rs`): `window mod 2²⁴ << 40 |
/// previous count << 20 | count`, as a [`View`]. The word 0 is a new
/// key's. It stores only the low 24 bits of the window index, so a stored
/// window up to [`AHEAD_WINDOWS`] windows ahead of `now` is read as newer
/// (a stale clock), any other as older.
#[derive(Debug, Clone, Copy)]
struct KeyView {
    v: View,
    /// The stored window is newer than `now`'s (stale clock).
    ahead: bool,
}

impl KeyView {
    fn read(w: u64, now: u64, period: u64) -> KeyView {
        let w_now = now / period;
        let elapsed = now - w_now * period;
        let fresh = View {
            window: w_now,
            elapsed,
            prev: 0,
            cur: 0,
        };
        let v = |v: View, ahead: bool| KeyView { v, ahead };
        if w == 0 {
            return v(fresh, false);
        }
        let (sw, prev, cur) = (w >> 40, (w >> 20) & C_MASK, w & C_MASK);
        let d = w_now.wrapping_sub(sw) & W_MASK;
        match d {
            0 => v(View { prev, cur, ..fresh }, false),
            1 => v(
                View {
                    prev: cur,
                    cur: 0,
                    ..fresh
                },
                false,
            ),
            d if d > W_MASK - AHEAD_WINDOWS => v(
                View {
                    window: w_now + (W_MASK + 1 - d),
                    elapsed: 0,
                    prev,
                    cur,
                },
                true,
            ),
            _ => v(fresh, false),
        }
    }

    fn pack(v: &View, cur: u64) -> u64 {
        ((v.window & W_MASK) << 40) | (v.prev.min(C_MASK) << 20) | cur.min(C_MASK)
    }
}

/// [`View::step`] on a key's word.
#[inline(always)]
pub fn key_step(w: u64, now: u64, period: u64, limit: u64, n: u64) -> Step {
    let kv = KeyView::read(w, now, period);
    match kv.v.step(now, period, limit, n) {
        Ok(count) => Step::Admit {
            next: KeyView::pack(&kv.v, count),
            wait_ns: 0,
        },
        Err(retry_after_ns) => Step::Reject { retry_after_ns },
    }
}

/// The charge after the response (issue 31) on a key's word: `delta`
/// more in `now`'s window, even over the limit; a negative `delta` given
/// back to the admission's window (`admitted`) if the word still counts
/// in it (moved on: nothing, the weighted previous count keeps it,
/// conservatively).
pub fn key_charge_after(w: u64, now: u64, admitted: u64, period: u64, delta: i64) -> Option<u64> {
    let d = delta.unsigned_abs();
    if delta > 0 {
        let v = KeyView::read(w, now, period).v;
        return Some(KeyView::pack(&v, v.cur.saturating_add(d)));
    }
    let kv = KeyView::read(w, admitted, period);
    if w == 0 {
        return None;
    }
    (kv.v.cur > 0 && !kv.ahead).then(|| KeyView::pack(&kv.v, kv.v.cur.saturating_sub(d)))
}

/// The key's word after giving back an admission of `n` units that
/// turned `prev` into `token`, the word being `cur` now: `prev` if nothing
/// came in between, else the count less `n` if the word still holds
/// `token`'s window.
pub fn key_refund(cur: u64, token: u64, prev: u64, n: u64) -> Option<u64> {
    if cur == token {
        return Some(prev);
    }
    (cur >> 40 == token >> 40 && cur & C_MASK > 0)
        .then(|| (cur & !C_MASK) | (cur & C_MASK).saturating_sub(n))
}

/// Is the key's word at `now` a new key's (nothing counted that still
/// weighs)?
pub fn key_is_fresh(w: u64, now: u64, period: u64) -> bool {
    let kv = KeyView::read(w, now, period);
    !kv.ahead && kv.v.prev == 0 && kv.v.cur == 0
}

/// Quota of a key's word at `now`.
pub fn key_quota(w: u64, now: u64, period: u64, limit: u64) -> Quota {
    KeyView::read(w, now, period).v.quota(now, period, limit)
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
    use crate::core::shm::slot::LocalSlots;
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
