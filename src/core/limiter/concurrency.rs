//! `concurrency`: requests in flight, no time.
//!
//! `state0` counts requests in flight: acquire increments it if below the
//! limit, release decrements it and never goes below 0. There is no time in
//! it, so a rejection advertises [`CONCURRENCY_RETRY_NS`](super::CONCURRENCY_RETRY_NS) as a hint.

use super::{Quota, Step, CONCURRENCY_RETRY_NS};

/// Upper bound of the in-flight count (dry-run acquisitions may exceed the
/// limit, never this).
const INFLIGHT_CAP: u64 = u32::MAX as u64;

/// The step on `inflight`: one more if below the limit.
#[inline(always)]
pub fn step(inflight: u64, limit: u64) -> Step {
    if inflight >= limit {
        return Step::Reject {
            retry_after_ns: CONCURRENCY_RETRY_NS,
        };
    }
    Step::Admit {
        next: inflight + 1,
        wait_ns: 0,
    }
}

/// The request ended: one less, never below 0 (`None`: already 0).
#[inline]
pub fn release(inflight: u64) -> Option<u64> {
    inflight.checked_sub(1)
}

/// A dry run counts one more in flight even over the limit, so that the
/// release at its end balances; `None` at `INFLIGHT_CAP` (2³² − 1).
#[inline]
pub fn force(inflight: u64) -> Option<u64> {
    (inflight < INFLIGHT_CAP).then(|| inflight + 1)
}

/// Quota at `inflight` (`window_ns` 0: there is no time in it).
pub fn quota(inflight: u64, limit: u64) -> Quota {
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
