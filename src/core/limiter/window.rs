//! The packed words of the window algorithms ([`super::fixed_window`],
//! [`super::sliding_window`]): `window << 32 | count`, with `window` =
//! `now / period` saturated at `u32::MAX`; their refund and their repair.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Reservation, MAX_STALENESS_NS};
use crate::core::slot::Slot;

#[inline]
pub(super) fn pack(window: u64, count: u64) -> u64 {
    (window.min(u32::MAX as u64) << 32) | count.min(u32::MAX as u64)
}

#[inline]
pub(super) fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & 0xFFFF_FFFF)
}

#[inline]
pub(super) fn window_of(now: u64, period: u64) -> u64 {
    (now / period).min(u32::MAX as u64)
}

#[inline]
pub(super) fn window_start(w: u64, period: u64) -> u64 {
    w.saturating_mul(period)
}

/// Puts back the word `r` replaced if `w` still holds the one it wrote;
/// else decrements the count of `r`'s window, if `w` still holds it.
pub(super) fn refund(w: &AtomicU64, r: Reservation) {
    let window = r.token >> 32;
    // `None`: the word no longer holds the request's window, nothing to do.
    let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
        let (sw, sc) = unpack(cur);
        if cur == r.token {
            Some(r.prev)
        } else if sw == window && sc > 0 {
            Some(pack(sw, sc - 1))
        } else {
            None
        }
    });
}

/// [`refund`] of an admission of `n` units.
pub(super) fn refund_n(w: &AtomicU64, r: Reservation, n: u64) {
    let window = r.token >> 32;
    let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
        let (sw, sc) = unpack(cur);
        if cur == r.token {
            Some(r.prev)
        } else if sw == window && sc > 0 {
            Some(pack(sw, sc.saturating_sub(n)))
        } else {
            None
        }
    });
}

/// Charges `delta` units after the response (issue 31): more than the
/// limit is allowed (the window stays full until it ends); a negative
/// `delta` gives units back to window `charged` only (`now`'s window for
/// a positive one, as a request of `now` would count).
pub(super) fn charge_after(w: &AtomicU64, now: u64, period: u64, charged: u64, delta: i64) {
    let w_now = window_of(now, period);
    let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
        let (sw, sc) = unpack(cur);
        if delta >= 0 {
            let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
            Some(pack(
                win,
                count.saturating_add(delta as u64).min(u32::MAX as u64 - 1),
            ))
        } else if sw == charged && sc > 0 {
            Some(pack(sw, sc.saturating_sub(delta.unsigned_abs())))
        } else {
            None
        }
    });
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
