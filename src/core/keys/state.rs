//! One key's limiter state in one 64-bit word, for every algorithm a
//! per-key strategy may use, as pure functions: the key table
//! ([`super::KeyTable`]) swaps the word together with the key's identity
//! in one 16-byte compare-and-swap, so a transition is computed here and
//! committed there.
//!
//! | algorithm | word | fresh (indistinguishable from a new key) |
//! |---|---|---|
//! | `token_bucket`, `leaky_bucket` | GCRA theoretical arrival time, monotonic ns | `tat ≤ now` (bucket full) |
//! | `fixed_window` | `window << 32 \| count`, window = Unix time / period | count 0 or window over |
//! | `sliding_window` | `window mod 2²⁴ << 40 \| previous count << 20 \| count` | both counts 0 at `now` |
//! | `concurrency` | requests in flight | 0 in flight |
//!
//! The word 0 is a new key's state for every algorithm. The semantics are
//! those of the shared strategies (`src/core/limiter.rs`): GCRA with
//! `T` = period / rate rounded up and `tau = T × burst`, a stale clock
//! counts against a newer window and never resets it. A sliding window
//! counts at most 2²⁰ − 1 requests per window and key
//! ([`MAX_SLIDING_COUNT`]); it stores only the low 24 bits of the window
//! index, so a stored window up to [`AHEAD_WINDOWS`] windows ahead of
//! `now` is read as newer (a stale clock), any other as older.

use super::super::limiter::Quota;
use super::super::model::{Algorithm, Strategy, MAX_WINDOW_COUNT};

/// Largest `rate` of a per-key `sliding_window` (20-bit counts).
pub const MAX_SLIDING_COUNT: u64 = (1 << 20) - 1;
/// How many windows ahead of `now` a sliding window's stored window may be
/// and still be read as newer (a worker's stale clock reading).
pub const AHEAD_WINDOWS: u64 = 16;
const W_MASK: u64 = (1 << 24) - 1;
const C_MASK: u64 = (1 << 20) - 1;

/// A per-key limiter compiled from a validated strategy: plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLimiter {
    Gcra {
        interval: u64,
        tau: u64,
        max_delay: u64,
    },
    Fixed {
        period: u64,
        limit: u64,
    },
    Sliding {
        period: u64,
        limit: u64,
    },
    Concurrency {
        limit: u64,
    },
}

/// A transition of one key's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Admitted: store `next`; the request waits `wait_ns` (delay action).
    Admit { next: u64, wait_ns: u64 },
    /// Rejected; the same request would pass `retry_after_ns` from now.
    Reject { retry_after_ns: u64 },
}

impl KeyLimiter {
    /// `None` for `warm_up`, which has no per-key form.
    pub fn from_strategy(s: &Strategy) -> Option<KeyLimiter> {
        Some(match s.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let burst = if s.algorithm == Algorithm::LeakyBucket {
                    1
                } else {
                    s.burst.max(1) as u64
                };
                let interval = s.interval_ns().clamp(1, u64::MAX / 4);
                KeyLimiter::Gcra {
                    interval,
                    tau: interval.saturating_mul(burst).min(u64::MAX / 4),
                    max_delay: s.action.max_delay_ns().min(u64::MAX / 4),
                }
            }
            Algorithm::FixedWindow => KeyLimiter::Fixed {
                period: s.per.period_ns().max(1),
                limit: s.rate.min(MAX_WINDOW_COUNT),
            },
            Algorithm::SlidingWindow => KeyLimiter::Sliding {
                period: s.per.period_ns().max(1),
                limit: s.rate.min(MAX_SLIDING_COUNT),
            },
            Algorithm::Concurrency => KeyLimiter::Concurrency {
                limit: s.rate.min(MAX_WINDOW_COUNT),
            },
            Algorithm::WarmUp => return None,
        })
    }

    /// The clock this limiter reads: wall time for the windows, monotonic
    /// for the rest (as the shared strategies).
    #[inline]
    pub fn clock(&self, now: super::super::admit::Now) -> u64 {
        match self {
            KeyLimiter::Fixed { .. } | KeyLimiter::Sliding { .. } => now.wall_ns,
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
            KeyLimiter::Gcra {
                interval,
                tau,
                max_delay,
            } => {
                let horizon = tau.saturating_add(max_delay);
                let Some(next) = w.max(now).checked_add(interval.saturating_mul(n)) else {
                    return Step::Reject {
                        retry_after_ns: u64::MAX,
                    };
                };
                let ahead = next - now;
                if ahead > horizon {
                    Step::Reject {
                        retry_after_ns: ahead - horizon,
                    }
                } else {
                    Step::Admit {
                        next,
                        wait_ns: ahead.saturating_sub(tau),
                    }
                }
            }
            KeyLimiter::Fixed { period, limit } => {
                let w_now = (now / period).min(u32::MAX as u64);
                let (sw, sc) = (w >> 32, w & 0xFFFF_FFFF);
                let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
                if count.saturating_add(n) > limit {
                    let end = win.saturating_add(1).saturating_mul(period);
                    Step::Reject {
                        retry_after_ns: if n > limit {
                            u64::MAX
                        } else {
                            end.saturating_sub(now).max(1)
                        },
                    }
                } else {
                    Step::Admit {
                        next: (win << 32) | (count + n),
                        wait_ns: 0,
                    }
                }
            }
            KeyLimiter::Sliding { period, limit } => {
                let v = SlidingView::read(w, now, period);
                if v.estimate(period).saturating_add(n) > limit {
                    Step::Reject {
                        retry_after_ns: v.retry_after(now, period, limit, n),
                    }
                } else {
                    Step::Admit {
                        next: pack_sliding(v.window, v.prev, v.cur + n),
                        wait_ns: 0,
                    }
                }
            }
            KeyLimiter::Concurrency { limit } => {
                if w >= limit {
                    Step::Reject {
                        retry_after_ns: super::super::limiter::CONCURRENCY_RETRY_NS,
                    }
                } else {
                    Step::Admit {
                        next: w + 1,
                        wait_ns: 0,
                    }
                }
            }
        }
    }

    /// The charge after the response (issue 31) on the word `w`: `delta`
    /// units more, even over the limit (a bucket goes into debt, at most
    /// `MAX_DEBT_NS` beyond its horizon; a window stays full until it
    /// ends), or, negative, given back to the window the request was
    /// admitted in (`admitted`, this limiter's clock then). `None`:
    /// nothing to change.
    pub fn charge_after(&self, w: u64, now: u64, admitted: u64, delta: i64) -> Option<u64> {
        let d = delta.unsigned_abs();
        if d == 0 {
            return None;
        }
        match *self {
            KeyLimiter::Gcra {
                interval,
                tau,
                max_delay,
            } => Some(if delta > 0 {
                let cap = now
                    .saturating_add(tau.saturating_add(max_delay))
                    .saturating_add(super::super::limiter::gcra::MAX_DEBT_NS);
                w.max(now)
                    .saturating_add(interval.saturating_mul(d))
                    .min(cap.max(w))
            } else {
                w.saturating_sub(interval.saturating_mul(d))
            }),
            KeyLimiter::Fixed { period, .. } => {
                let (sw, sc) = (w >> 32, w & 0xFFFF_FFFF);
                if delta > 0 {
                    let w_now = (now / period).min(u32::MAX as u64);
                    let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
                    Some((win << 32) | count.saturating_add(d).min(u32::MAX as u64 - 1))
                } else {
                    let charged = (admitted / period).min(u32::MAX as u64);
                    (sw == charged && sc > 0).then(|| (sw << 32) | sc.saturating_sub(d))
                }
            }
            KeyLimiter::Sliding { period, .. } => {
                if delta > 0 {
                    let v = SlidingView::read(w, now, period);
                    return Some(pack_sliding(v.window, v.prev, v.cur.saturating_add(d)));
                }
                let v = SlidingView::read(w, admitted, period);
                if w == 0 {
                    return None;
                }
                // Read at the admission's time: its window is `cur` there
                // if the word still holds it; moved on: nothing (the
                // weighted previous count keeps it, conservatively).
                (v.cur > 0 && !v.ahead)
                    .then(|| pack_sliding(v.window, v.prev, v.cur.saturating_sub(d)))
            }
            KeyLimiter::Concurrency { .. } => None,
        }
    }

    /// `concurrency` under a dry run: one more in flight even over the
    /// limit (the release at the end balances it).
    pub fn force(&self, w: u64) -> Option<u64> {
        match self {
            KeyLimiter::Concurrency { .. } if w < u32::MAX as u64 => Some(w + 1),
            _ => None,
        }
    }

    /// [`refund`](Self::refund) of an admission of `n` units.
    pub fn refund_units(&self, cur: u64, token: u64, prev: u64, n: u64) -> Option<u64> {
        if n <= 1 || cur == token {
            return self.refund(cur, token, prev);
        }
        match *self {
            KeyLimiter::Gcra { interval, .. } => {
                Some(cur.saturating_sub(interval.saturating_mul(n)))
            }
            KeyLimiter::Fixed { .. } => (cur >> 32 == token >> 32 && cur & 0xFFFF_FFFF > 0)
                .then(|| (cur & !0xFFFF_FFFF) | (cur & 0xFFFF_FFFF).saturating_sub(n)),
            KeyLimiter::Sliding { .. } => (cur >> 40 == token >> 40 && cur & C_MASK > 0)
                .then(|| (cur & !C_MASK) | (cur & C_MASK).saturating_sub(n)),
            KeyLimiter::Concurrency { .. } => self.release(cur),
        }
    }

    /// The word after giving back an admission that turned `prev` into
    /// `token`, when the word is now `cur`; `None`: nothing to change.
    pub fn refund(&self, cur: u64, token: u64, prev: u64) -> Option<u64> {
        if cur == token {
            return Some(prev);
        }
        match *self {
            KeyLimiter::Gcra { interval, .. } => Some(cur.saturating_sub(interval)),
            KeyLimiter::Fixed { .. } => {
                (cur >> 32 == token >> 32 && cur & 0xFFFF_FFFF > 0).then(|| cur - 1)
            }
            KeyLimiter::Sliding { .. } => {
                (cur >> 40 == token >> 40 && cur & C_MASK > 0).then(|| cur - 1)
            }
            KeyLimiter::Concurrency { .. } => self.release(cur),
        }
    }

    /// `concurrency`: the request ended.
    pub fn release(&self, cur: u64) -> Option<u64> {
        match self {
            KeyLimiter::Concurrency { .. } if cur > 0 => Some(cur - 1),
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
            KeyLimiter::Gcra { .. } => w <= now,
            KeyLimiter::Fixed { period, .. } => {
                w & 0xFFFF_FFFF == 0 || w >> 32 < (now / period).min(u32::MAX as u64)
            }
            KeyLimiter::Sliding { period, .. } => {
                let v = SlidingView::read(w, now, period);
                !v.ahead && v.prev == 0 && v.cur == 0
            }
            KeyLimiter::Concurrency { .. } => false,
        }
    }

    /// Quota of a key whose word is `w` (for `RateLimit-*` headers).
    pub fn quota(&self, w: u64, now: u64) -> Quota {
        match *self {
            KeyLimiter::Gcra { interval, tau, .. } => {
                let used = w.max(now) - now;
                let mut q = Quota::new(
                    tau / interval,
                    tau.saturating_sub(used) / interval,
                    w.saturating_sub(now),
                );
                q.window_ns = tau;
                q
            }
            KeyLimiter::Fixed { period, limit } => {
                let w_now = (now / period).min(u32::MAX as u64);
                let (sw, sc) = (w >> 32, w & 0xFFFF_FFFF);
                let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
                let end = win.saturating_add(1).saturating_mul(period);
                let mut q = Quota::new(limit, limit.saturating_sub(count), end.saturating_sub(now));
                q.window_ns = period;
                q
            }
            KeyLimiter::Sliding { period, limit } => {
                let v = SlidingView::read(w, now, period);
                let next = v.window.saturating_add(1).saturating_mul(period);
                let reset = if v.cur > 0 {
                    next.saturating_add(period).saturating_sub(now)
                } else if v.prev > 0 {
                    next.saturating_sub(now)
                } else {
                    0
                };
                let mut q = Quota::new(limit, limit.saturating_sub(v.estimate(period)), reset);
                q.window_ns = period;
                q
            }
            KeyLimiter::Concurrency { limit } => {
                let remaining = limit.saturating_sub(w);
                let reset = if remaining == 0 {
                    super::super::limiter::CONCURRENCY_RETRY_NS
                } else {
                    0
                };
                Quota::new(limit, remaining, reset)
            }
        }
    }
}

fn pack_sliding(window: u64, prev: u64, cur: u64) -> u64 {
    ((window & W_MASK) << 40) | (prev.min(C_MASK) << 20) | cur.min(C_MASK)
}

/// A sliding-window word as seen at `now`.
struct SlidingView {
    /// Full index of the window counted in.
    window: u64,
    elapsed: u64,
    prev: u64,
    cur: u64,
    /// The stored window is newer than `now`'s (stale clock).
    ahead: bool,
}

impl SlidingView {
    fn read(w: u64, now: u64, period: u64) -> SlidingView {
        let w_now = now / period;
        let elapsed = now - w_now * period;
        let fresh = SlidingView {
            window: w_now,
            elapsed,
            prev: 0,
            cur: 0,
            ahead: false,
        };
        if w == 0 {
            return fresh;
        }
        let (sw, prev, cur) = (w >> 40, (w >> 20) & C_MASK, w & C_MASK);
        let d = w_now.wrapping_sub(sw) & W_MASK;
        match d {
            0 => SlidingView { prev, cur, ..fresh },
            1 => SlidingView {
                prev: cur,
                cur: 0,
                ..fresh
            },
            d if d > W_MASK - AHEAD_WINDOWS => SlidingView {
                window: w_now + (W_MASK + 1 - d),
                elapsed: 0,
                prev,
                cur,
                ahead: true,
            },
            _ => fresh,
        }
    }

    fn estimate(&self, period: u64) -> u64 {
        let weight = period.saturating_sub(self.elapsed);
        let weighted = ((self.prev as u128 * weight as u128) / period as u128) as u64;
        weighted.saturating_add(self.cur)
    }

    /// Exact time from `now` until `estimate + n ≤ limit` with no other
    /// traffic (as the shared sliding window's).
    fn retry_after(&self, now: u64, period: u64, limit: u64, n: u64) -> u64 {
        if limit == 0 || n > limit {
            return u64::MAX;
        }
        // Smallest elapsed e with floor(prev × (P − e) / P) ≤ k.
        let min_elapsed = |prev: u64, k: u64| -> u64 {
            if prev == 0 {
                return 0;
            }
            let bound = ((k as u128 + 1) * period as u128 - 1) / prev as u128;
            period.saturating_sub(bound.min(period as u128) as u64)
        };
        let at = if self.cur + n <= limit {
            let e = min_elapsed(self.prev, limit - n - self.cur);
            self.window.saturating_mul(period).saturating_add(e)
        } else {
            let e = min_elapsed(self.cur, limit - n);
            self.window
                .saturating_add(1)
                .saturating_mul(period)
                .saturating_add(e)
        };
        at.saturating_sub(now).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Action;
    use crate::core::model::Unit;

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
