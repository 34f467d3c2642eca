//! `concurrency`: requests in flight, no time.
//!
//! `state0` counts requests in flight: acquire increments it if below the
//! limit, release decrements it and never goes below 0. There is no time in
//! it, so a rejection advertises [`CONCURRENCY_RETRY_NS`](super::CONCURRENCY_RETRY_NS) as a hint.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Acquired, Quota, Reservation, CONCURRENCY_RETRY_NS};

/// Upper bound of the in-flight count (dry-run acquisitions may exceed the
/// limit, never this).
const INFLIGHT_CAP: u64 = u32::MAX as u64;

#[inline(never)]
pub(super) fn acquire(w: &AtomicU64, limit: u64) -> Acquired {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        if cur >= limit {
            return Acquired::Rejected {
                retry_after_ns: CONCURRENCY_RETRY_NS,
            };
        }
        match w.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Acquired::Admitted(Reservation::default()),
            Err(actual) => cur = actual,
        }
    }
}

pub(super) fn release(w: &AtomicU64) {
    // Never below 0 (`None` leaves it).
    let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        cur.checked_sub(1)
    });
}

/// Counts one more in flight even over the limit (dry run); `None` at
/// [`INFLIGHT_CAP`].
pub(super) fn force_acquire(w: &AtomicU64) -> Option<Reservation> {
    w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        (cur < INFLIGHT_CAP).then(|| cur + 1)
    })
    .ok()
    .map(|_| Reservation::default())
}

pub(super) fn quota(w: &AtomicU64, limit: u64) -> Quota {
    let inflight = w.load(Ordering::Acquire);
    let remaining = limit.saturating_sub(inflight);
    let reset = if remaining == 0 {
        CONCURRENCY_RETRY_NS
    } else {
        0
    };
    Quota::new(limit, remaining, reset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::test_util::*;

    #[test]
    fn concurrency_acquire_release_never_below_zero() {
        let l = limiter(Algorithm::Concurrency, 2, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            assert!(admitted(&l, slot, 0));
            assert!(admitted(&l, slot, 0));
            assert_eq!(retry(&l, slot, 0), CONCURRENCY_RETRY_NS);
            l.release(slot);
            assert!(admitted(&l, slot, 0));
            for _ in 0..5 {
                l.release(slot);
            }
            assert_eq!(slot.state0().load(Ordering::Relaxed), 0);
            slot.state0().store(u64::MAX, Ordering::Relaxed);
            assert!(!admitted(&l, slot, 0));
            assert!(l.force_acquire(slot).is_none());
            l.release(slot);
            assert_eq!(slot.state0().load(Ordering::Relaxed), u64::MAX - 1);
        });
    }
}
