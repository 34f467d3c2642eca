//! The packed words of the window algorithms ([`super::fixed_window`],
//! [`super::sliding_window`]): `window << 32 | count`, with `window` =
//! `now / period` saturated at `u32::MAX`; their refund and their repair.

use std::sync::atomic::{AtomicU64, Ordering};

use super::MAX_STALENESS_NS;
use crate::core::shm::slot::Slot;

#[inline]
pub(super) fn pack(window: u64, count: u64) -> u64 {
    (window.min(u32::MAX as u64) << 32) | count.min(u32::MAX as u64)
}

#[inline]
pub(super) fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & 0xFFFF_FFFF)
}

#[inline]
pub fn window_of(now: u64, period: u64) -> u64 {
    (now / period).min(u32::MAX as u64)
}

#[inline]
pub(super) fn window_start(w: u64, period: u64) -> u64 {
    w.saturating_mul(period)
}

/// `window` and count as a request at `now` sees the word: a stored
/// window older than `now`'s is over (a fresh window, count 0); an equal
/// or newer one (a stale clock) counts.
#[inline(always)]
pub(super) fn current(word: u64, now: u64, period: u64) -> (u64, u64) {
    let (sw, sc) = unpack(word);
    let w_now = window_of(now, period);
    if sw < w_now {
        (w_now, 0)
    } else {
        (sw, sc)
    }
}

/// `n` units off the count of the word, if it still holds window
/// `window` and counts something; `None`: nothing to change (a window
/// that has been replaced no longer counts).
#[inline]
pub(super) fn take_back(word: u64, window: u64, n: u64) -> Option<u64> {
    let (sw, sc) = unpack(word);
    (sw == window && sc > 0).then(|| pack(sw, sc.saturating_sub(n)))
}

/// The word after giving back an admission of `n` units that turned
/// `prev` into `token`, the word being `cur` now: `prev` if nothing came
/// in between, else the count of `token`'s window less `n`.
#[inline]
pub fn refund(cur: u64, token: u64, prev: u64, n: u64) -> Option<u64> {
    if cur == token {
        Some(prev)
    } else {
        take_back(cur, token >> 32, n)
    }
}

/// The charge after the response (issue 31) on a window word: `delta`
/// units more even over the limit (the window stays full until it
/// ends), counted as a request at `now` would be; a negative `delta`
/// gives units back to window `charged` only (the admission's). `None`:
/// nothing to change.
pub fn charge_after(word: u64, now: u64, period: u64, charged: u64, delta: i64) -> Option<u64> {
    if delta >= 0 {
        let (win, count) = current(word, now, period);
        Some(pack(
            win,
            count.saturating_add(delta as u64).min(u32::MAX as u64 - 1),
        ))
    } else {
        take_back(word, charged, delta.unsigned_abs())
    }
}

/// Applies `f` to the word until it sticks or `f` answers `None` (the
/// shared slot's refunds and charges, `SeqCst` for the sliding window's
/// two-word check).
pub(super) fn update(w: &AtomicU64, f: impl Fn(u64) -> Option<u64>) {
    let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, f);
}

/// See [`super::Limiter::repair_foreign`]: a window word beyond a fresh
/// clock by more than [`MAX_STALENESS_NS`] becomes the current window full
/// (sliding: and the previous one).
pub(super) fn repair_foreign(
    slot: &Slot,
    sliding: bool,
    period: u64,
    limit: u64,
    clock: impl FnOnce() -> u64,
) -> bool {
    let words = [slot.state0(), slot.state1()];
    let n = if sliding { 2 } else { 1 };
    let vals = [
        words[0].load(Ordering::SeqCst),
        words[1].load(Ordering::SeqCst),
    ];
    let now = clock();
    let w_now = window_of(now, period);
    let foreign_above = now.saturating_add(MAX_STALENESS_NS);
    let mut repaired = false;
    for i in 0..n {
        let (vw, _) = unpack(vals[i]);
        if vw <= w_now || window_start(vw, period) <= foreign_above {
            continue;
        }
        // The current window full (sliding: and the previous).
        let fix = if !sliding || (w_now & 1) as usize == i {
            pack(w_now, limit)
        } else if w_now >= 1 {
            pack(w_now - 1, limit)
        } else {
            0
        };
        repaired |= words[i]
            .compare_exchange(vals[i], fix, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    }
    repaired
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::test_util::*;

    #[test]
    fn window_refund_is_exact_and_only_for_its_window() {
        for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let l = limiter(alg, 5, Unit::Second, 0, REJECT);
            with_slot(|slot| {
                assert!(admitted(&l, slot, 3 * S));
                let before = (
                    slot.state0().load(Ordering::Relaxed),
                    slot.state1().load(Ordering::Relaxed),
                );
                let Acquired::Admitted(r) = l.acquire(slot, 3 * S + 1) else {
                    panic!()
                };
                l.refund(slot, r);
                let after = (
                    slot.state0().load(Ordering::Relaxed),
                    slot.state1().load(Ordering::Relaxed),
                );
                assert_eq!(before, after, "{alg}");
                // A reservation of window 3 refunded after the window moved
                // on does not touch window 4's count.
                let Acquired::Admitted(r) = l.acquire(slot, 3 * S + 2) else {
                    panic!()
                };
                assert!(admitted(&l, slot, 4 * S));
                if alg == Algorithm::FixedWindow {
                    l.refund(slot, r);
                    assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (4, 1));
                } else {
                    // Sliding: window 3 is the previous window and still
                    // weighs, so its refund is applied there.
                    l.refund(slot, r);
                    assert_eq!(unpack(slot.state1().load(Ordering::Relaxed)), (3, 1));
                    assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (4, 1));
                }
            });
        }
    }
}
