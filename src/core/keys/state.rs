//! One key's limiter state in one 64-bit word, for every algorithm a
//! per-key strategy may use: the key table ([`super::KeyTable`]) swaps the
//! word together with the key's identity in one 16-byte compare-and-swap
//! (`KeyTable::charge_at`, the per-key twin of the shared slot's loop in
//! `src/core/limiter/mod.rs`). The arithmetic is not here: each arm calls
//! the step, refund, charge, freshness and quota of its algorithm's file in
//! `src/core/limiter/`, the same the shared slots use.
//!
//! | algorithm | word | fresh (indistinguishable from a new key) |
//! |---|---|---|
//! | `token_bucket`, `leaky_bucket` | GCRA theoretical arrival time, monotonic ns | `tat ≤ now` (bucket full) |
//! | `fixed_window` | `window << 32 \| count`, window = Unix time / period | count 0 or window over |
//! | `fixed_window`, calendar (issue 33) | `window << 32 \| count`, window = its start in Unix minutes | count 0 or window over |
//! | `sliding_window` | `window mod 2²⁴ << 40 \| previous count << 20 \| count` | both counts 0 at `now` |
//! | `concurrency` | requests in flight | 0 in flight |
//!
//! The word 0 is a new key's state for every algorithm. The GCRA, fixed
//! window and concurrency words are the shared slot's `state0`; the
//! sliding window packs its two windows into one word
//! (`sliding_window::KeyView`, beside the slot's reader). `warm_up` has no
//! per-key form: see `KeyLimiter::from_strategy` (compiled with the shared
//! limiter in `src/core/limiter/strategy.rs`, so that this file names no
//! model type).

use super::super::limiter::gcra::Gcra;
use super::super::limiter::{
    calendar_window, concurrency, fixed_window, sliding_window, window, Now, Quota,
};

pub use super::super::limiter::Step;

/// A per-key limiter compiled from a validated strategy: plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLimiter {
    Gcra(Gcra),
    Fixed {
        period: u64,
        limit: u64,
    },
    /// `fixed_window` in calendar windows (issue 33).
    Calendar {
        limit: u64,
        cal: crate::core::calendar::CalRef,
    },
    Sliding {
        period: u64,
        limit: u64,
    },
    Concurrency {
        limit: u64,
    },
}

impl KeyLimiter {
    /// The clock this limiter reads: wall time for the windows, monotonic
    /// for the rest (as the shared strategies).
    #[inline]
    pub fn clock(&self, now: Now) -> u64 {
        match self {
            KeyLimiter::Fixed { .. } | KeyLimiter::Sliding { .. } | KeyLimiter::Calendar { .. } => {
                now.wall_ns
            }
            _ => now.mono_ns,
        }
    }

    pub fn is_concurrency(&self) -> bool {
        matches!(self, KeyLimiter::Concurrency { .. })
    }

    /// One request at `now` on the word `w`.
    #[inline(always)]
    pub fn step(&self, w: u64, now: u64) -> Step {
        self.step_units(w, now, 1)
    }

    /// A request of `n` units (`cost_from`, issue 31) at `now` on the word
    /// `w`: admitted only if all `n` fit (a bucket: `n × T` within its
    /// horizon; a window: `count + n ≤ limit`), nothing written otherwise.
    /// `n` = 1 is [`step`](Self::step) (a constant there); `concurrency`
    /// takes one unit whatever `n`.
    #[inline(always)]
    pub fn step_units(&self, w: u64, now: u64, n: u64) -> Step {
        match *self {
            KeyLimiter::Gcra(g) => g.step(w, now, g.interval.saturating_mul(n)),
            KeyLimiter::Fixed { period, limit } => fixed_window::step(w, now, period, limit, n),
            KeyLimiter::Sliding { period, limit } => {
                sliding_window::key_step(w, now, period, limit, n)
            }
            KeyLimiter::Calendar { limit, cal } => {
                calendar_window::step(w, now, cal.get(), limit, n)
            }
            KeyLimiter::Concurrency { limit } => concurrency::step(w, limit),
        }
    }

    /// The charge after the response (issue 31) on the word `w`: `delta`
    /// units more, even over the limit (a bucket goes into debt, at most
    /// `MAX_DEBT_NS` beyond its horizon; a window stays full until it
    /// ends), or, negative, given back to the window the request was
    /// admitted in (`admitted`, this limiter's clock then). `None`:
    /// nothing to change.
    pub fn charge_after(&self, w: u64, now: u64, admitted: u64, delta: i64) -> Option<u64> {
        if delta == 0 {
            return None;
        }
        match *self {
            KeyLimiter::Gcra(g) => Some(g.charge_after(w, now, delta)),
            KeyLimiter::Fixed { period, .. } => {
                let charged = window::window_of(admitted, period);
                window::charge_after(w, now, period, charged, delta)
            }
            KeyLimiter::Sliding { period, .. } => {
                sliding_window::key_charge_after(w, now, admitted, period, delta)
            }
            KeyLimiter::Calendar { cal, .. } => {
                let charged = calendar_window::window_id(admitted, cal.get());
                calendar_window::charge_after(w, now, cal.get(), charged, delta)
            }
            KeyLimiter::Concurrency { .. } => None,
        }
    }

    /// `concurrency` under a dry run: one more in flight even over the
    /// limit (the release at the end balances it).
    pub fn force(&self, w: u64) -> Option<u64> {
        match self {
            KeyLimiter::Concurrency { .. } => concurrency::force(w),
            _ => None,
        }
    }

    /// [`refund`](Self::refund) of an admission of `n` units.
    pub fn refund_units(&self, cur: u64, token: u64, prev: u64, n: u64) -> Option<u64> {
        let n = n.max(1);
        match *self {
            KeyLimiter::Gcra(g) => Some(g.refund(cur, token, prev, g.interval.saturating_mul(n))),
            KeyLimiter::Fixed { .. } | KeyLimiter::Calendar { .. } => {
                window::refund(cur, token, prev, n)
            }
            KeyLimiter::Sliding { .. } => sliding_window::key_refund(cur, token, prev, n),
            KeyLimiter::Concurrency { .. } if cur == token => Some(prev),
            KeyLimiter::Concurrency { .. } => self.release(cur),
        }
    }

    /// The word after giving back an admission that turned `prev` into
    /// `token`, when the word is now `cur`; `None`: nothing to change.
    pub fn refund(&self, cur: u64, token: u64, prev: u64) -> Option<u64> {
        self.refund_units(cur, token, prev, 1)
    }

    /// `concurrency`: the request ended.
    pub fn release(&self, cur: u64) -> Option<u64> {
        match self {
            KeyLimiter::Concurrency { .. } => concurrency::release(cur),
            _ => None,
        }
    }

    /// Is `w` at `now` indistinguishable from a new key's state? Only then
    /// may its entry go to another key: reclaiming never changes a decision.
    #[inline]
    pub fn is_fresh(&self, w: u64, now: u64) -> bool {
        if w == 0 {
            return true;
        }
        match *self {
            KeyLimiter::Gcra(g) => g.is_fresh(w, now),
            KeyLimiter::Fixed { period, .. } => fixed_window::is_fresh(w, now, period),
            KeyLimiter::Calendar { cal, .. } => calendar_window::is_fresh(w, now, cal.get()),
            KeyLimiter::Sliding { period, .. } => sliding_window::key_is_fresh(w, now, period),
            KeyLimiter::Concurrency { .. } => false,
        }
    }

    /// Quota of a key whose word is `w` (for `RateLimit-*` headers).
    pub fn quota(&self, w: u64, now: u64) -> Quota {
        match *self {
            KeyLimiter::Gcra(g) => g.quota(w, now),
            KeyLimiter::Fixed { period, limit } => fixed_window::quota(w, now, period, limit),
            KeyLimiter::Calendar { limit, cal } => calendar_window::quota(w, now, cal.get(), limit),
            KeyLimiter::Sliding { period, limit } => {
                sliding_window::key_quota(w, now, period, limit)
            }
            KeyLimiter::Concurrency { limit } => concurrency::quota(w, limit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Unit;
    use crate::core::model::{Action, Algorithm, Strategy};

    const S: u64 = 1_000_000_000;

    fn lim(algorithm: Algorithm, rate: u64, per: Unit, burst: u32) -> KeyLimiter {
        let s =
            Strategy::unconditioned(algorithm, rate, per, burst, Action::Reject { status: None })
                .unwrap();
        KeyLimiter::from_strategy(&s).unwrap()
    }

    /// Runs `n` requests at `now`, committing admissions; returns admits.
    fn run(l: &KeyLimiter, w: &mut u64, now: u64, n: u32) -> u32 {
        let mut admitted = 0;
        for _ in 0..n {
            if let Step::Admit { next, .. } = l.step(*w, now) {
                *w = next;
                admitted += 1;
            }
        }
        admitted
    }

    #[test]
    fn each_algorithm_counts_and_turns_fresh() {
        let base = 1_700_000_000 * S;
        // token bucket 10/s burst 5: 5 at once, then one per 100 ms.
        let tb = lim(Algorithm::TokenBucket, 10, Unit::Second, 5);
        let mut w = 0;
        assert_eq!(run(&tb, &mut w, base, 9), 5);
        assert!(!tb.is_fresh(w, base));
        assert_eq!(run(&tb, &mut w, base + S / 10, 3), 1);
        assert!(!tb.is_fresh(w, base + S / 10 + S / 2 - 1));
        assert!(tb.is_fresh(w, base + S / 10 + S / 2));
        // fixed window 3/min.
        let fw = lim(Algorithm::FixedWindow, 3, Unit::Minute, 1);
        let mut w = 0;
        let t = base - base % (60 * S);
        assert_eq!(run(&fw, &mut w, t + 5 * S, 5), 3);
        match fw.step(w, t + 10 * S) {
            Step::Reject { retry_after_ns } => assert_eq!(retry_after_ns, 50 * S),
            other => panic!("{other:?}"),
        }
        assert!(!fw.is_fresh(w, t + 59 * S));
        assert!(fw.is_fresh(w, t + 60 * S));
        assert_eq!(run(&fw, &mut w, t + 60 * S, 5), 3);
        // sliding window 4/s: 4 in window n; in window n+1 at half time the
        // estimate is 2, so 2 more; two windows later it is fresh.
        let sw = lim(Algorithm::SlidingWindow, 4, Unit::Second, 1);
        let mut w = 0;
        let t = base - base % S;
        assert_eq!(run(&sw, &mut w, t, 6), 4);
        assert_eq!(run(&sw, &mut w, t + S + S / 2, 6), 2);
        assert!(!sw.is_fresh(w, t + 2 * S));
        assert!(sw.is_fresh(w, t + 3 * S));
        // A stale reading one window back counts against the newer window.
        let mut w2 = w;
        assert_eq!(run(&sw, &mut w2, t, 6), 0);
        // concurrency 2.
        let cc = lim(Algorithm::Concurrency, 2, Unit::Second, 1);
        let mut w = 0;
        assert_eq!(run(&cc, &mut w, base, 3), 2);
        assert!(!cc.is_fresh(w, base));
        w = cc.release(w).unwrap();
        w = cc.release(w).unwrap();
        assert_eq!(cc.release(w), None);
        assert!(cc.is_fresh(w, base));
    }

    #[test]
    fn refund_restores_or_decrements() {
        let fw = lim(Algorithm::FixedWindow, 3, Unit::Minute, 1);
        let now = 120 * S;
        let Step::Admit { next, .. } = fw.step(0, now) else {
            panic!()
        };
        assert_eq!(fw.refund(next, next, 0), Some(0));
        let Step::Admit { next: n2, .. } = fw.step(next, now) else {
            panic!()
        };
        // Another request came after ours: decrement the same window.
        assert_eq!(fw.refund(n2, next, 0), Some(n2 - 1));
        let sw = lim(Algorithm::SlidingWindow, 3, Unit::Second, 1);
        let Step::Admit { next, .. } = sw.step(0, now) else {
            panic!()
        };
        let Step::Admit { next: n2, .. } = sw.step(next, now) else {
            panic!()
        };
        assert_eq!(sw.refund(n2, next, 0), Some(n2 - 1));
    }

    #[test]
    fn warm_up_has_no_per_key_form() {
        let mut s = Strategy::unconditioned(
            Algorithm::TokenBucket,
            1,
            Unit::Second,
            1,
            Action::Reject { status: None },
        )
        .unwrap();
        s.algorithm = Algorithm::WarmUp;
        assert_eq!(KeyLimiter::from_strategy(&s), None);
    }
}
