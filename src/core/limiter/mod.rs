//! Lock-free limiters on stat slots.
//!
//! Every limiter keeps all of its state in the 64-bit words of its slot
//! (`state0`, and `state1` for the sliding window) and changes them with
//! compare-and-swap loops. There are no locks, so a process that dies in the
//! middle of a request leaves nothing held except, for `concurrency`, the
//! in-flight unit it had taken. Time is integer nanoseconds from a monotonic
//! clock ([`super::clock`]), passed in by the caller.
//!
//! The slot lives in a file that other processes write, so its words are
//! untrusted: every computation is saturating or checked and no value of the
//! words can make a limiter panic, overflow or admit more than the most
//! permissive *legitimate* state would.
//!
//! # Algorithms and state words
//!
//! | algorithm | `state0` | `state1` | new slot (all zero) |
//! |---|---|---|---|
//! | `token_bucket`, `leaky_bucket` | GCRA theoretical arrival time (TAT), ns | — | **full bucket** (TAT 0 ≤ now) |
//! | `fixed_window` | `window << 32 \| count` | — | empty window |
//! | `sliding_window` | `window << 32 \| count`, even windows | same, odd windows | empty windows |
//! | `concurrency` | requests in flight | — | nothing in flight |
//!
//! `window` is `now / period`, saturated at `u32::MAX`. Admission
//! ([`super::admit::Now`]) gives the windows wall-clock time (Unix
//! nanoseconds), so windows are UTC minutes, hours and days on every host;
//! with a period of one second the index saturates in 2106, after which
//! every request falls in the last window, which can only reject more,
//! never admit more. The buckets get monotonic time.
//!
//! ## GCRA (token and leaky bucket)
//! `T` = period / rate rounded **up** (so rounding never admits more than
//! the rate), `tau = T × burst` (leaky bucket: burst 1). A request at `now`
//! computes `new_tat = max(tat, now) + T` and is admitted when
//! `new_tat − now ≤ tau + max_delay` (`max_delay` is 0 unless the action is
//! `delay`); it then waits `(new_tat − now) − tau` (0 when there was a token).
//! A rejection reports the exact earliest time at which the same request
//! would be admitted: `retry_after = new_tat − now − (tau + max_delay)`.
//!
//! ## Fixed window
//! The stored window is older than `now`'s window → the current window
//! starts with this request (count 1). The stored window is equal **or
//! newer** (this worker's clock reading is stale, or the clock went
//! backwards) → the request counts against the stored window: a stale time
//! never resets a window and never admits extra. `retry_after` is the end of
//! the counted window minus `now`, exact and at least 1 ns.
//!
//! ## Sliding window
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
//!
//! ## Concurrency
//! `state0` counts requests in flight: acquire increments it if below the
//! limit, release decrements it and never goes below 0. There is no time in
//! it, so a rejection advertises [`CONCURRENCY_RETRY_NS`] as a hint.
//!
//! # Stale and backward time, foreign state
//!
//! Legitimate state is never ahead of the newest clock reading of any
//! worker by more than the limiter's horizon (GCRA: `tau + max_delay`;
//! windows: the start of the stored window is ≤ now). A caller whose clock
//! reading is behind that (a stale reading, a process stopped between
//! reading the clock and updating the slot, a clock stepped back) is
//! treated conservatively as above, **whatever the staleness**: the request
//! path never moves state backwards, so a stale worker never admits
//! anything a fresh one would not.
//!
//! State that claims to be more than [`MAX_STALENESS_NS`] beyond the
//! horizon of a *fresh* clock cannot have been written by this clock: it is
//! garbage, or a file that survived a reboot. Waiting it out could block a
//! strategy for years, so [`Limiter::repair_foreign`] replaces it with the
//! **most restrictive legitimate state** (GCRA: an empty bucket with a full
//! delay queue; windows: the current window full). Only the agent calls it
//! (at every poll, 200 ms by default, on the slots of the table it
//! published), and it reads its clock *after* loading the word: every
//! legitimate write happened before that load, at a clock reading no later
//! than the agent's, so a legitimate state is never taken for foreign — not
//! even when the agent itself is descheduled, since its compare-and-swap
//! then fails on any word written meanwhile. (Soundness needs the agent's
//! clocks to be the workers': `CLOCK_MONOTONIC` for the buckets — nginx's
//! `ngx_current_msec` is that clock, coarse, never ahead of it — and the
//! wall clock for the windows; a wall clock stepped back by more than a
//! minute makes the agent set the current window full once.)
//!
//! # Refunds
//!
//! A [`Reservation`] carries what is needed to give an admitted request
//! back (multi-strategy admission refunds when a later strategy rejects):
//! the word this acquire wrote and the word it replaced. If the word still
//! holds what this acquire wrote, it is put back to the value before it, so
//! the slot is bit for bit as if the request never came. Otherwise (other
//! requests changed it in between): windows decrement the count of the
//! window the request was counted in, if that word still holds that window
//! (exact in effect; a window that has been replaced no longer counts);
//! GCRA decreases the TAT by `T`, saturating, which is exact unless one of
//! the requests in between arrived more than `T` after ours and found the
//! bucket full (then the refunded token had already drained and one extra
//! request may pass). Concurrency: release (a decrement, exact).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::model::{Action, Algorithm, Strategy, MAX_WINDOW_COUNT};
use crate::core::slot::Slot;
use warm_up::WarmUpParams;

pub mod warm_up;

/// How far beyond its legitimate horizon (at a fresh clock reading) a state
/// word may lie before [`Limiter::repair_foreign`] takes it as foreign
/// (garbage, another clock) and replaces it. See the module documentation.
pub const MAX_STALENESS_NS: u64 = 60 * 1_000_000_000;

/// `retry_after` advertised by a `concurrency` rejection (there is no time
/// in its state; one second is a polling hint).
pub const CONCURRENCY_RETRY_NS: u64 = 1_000_000_000;

/// Upper bound of the in-flight count (dry-run acquisitions may exceed the
/// limit, never this).
const INFLIGHT_CAP: u64 = u32::MAX as u64;

/// A limiter compiled from a validated [`Strategy`]. Plain data: the state
/// lives in the [`Slot`] passed to each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limiter {
    algorithm: Algorithm,
    params: Params,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Params {
    /// `interval` = T; `tau` = T × burst; `max_delay` in ns.
    Gcra {
        interval: u64,
        tau: u64,
        max_delay: u64,
    },
    /// Fixed and sliding windows.
    Window {
        period: u64,
        limit: u64,
    },
    Concurrency {
        limit: u64,
    },
    /// `warm_up` (src/core/limiter/warm_up.rs).
    WarmUp(WarmUpParams),
}

/// Result of [`Limiter::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; the reservation may be refunded.
    Admitted(Reservation),
    /// Not admitted; the same request would be admitted `retry_after_ns`
    /// from now if nothing else arrived (never earlier).
    Rejected { retry_after_ns: u64 },
}

impl Outcome {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Outcome::Admitted(_))
    }
}

/// One admitted request. `wait_ns` > 0 only for a `delay` action: the
/// request must wait that long before it proceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservation {
    pub wait_ns: u64,
    /// The state word this acquire wrote (GCRA: the TAT; windows:
    /// `window << 32 | count`, so `token >> 32` is the window counted in).
    token: u64,
    /// The state word it replaced.
    prev: u64,
}

/// Quota information for `RateLimit-*` response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    /// Buckets: the burst; windows: requests per window; concurrency: the
    /// in-flight limit.
    pub limit: u64,
    /// Requests still available now (after the current request, if it was
    /// admitted).
    pub remaining: u64,
    /// Buckets and sliding window: time until the quota is full again;
    /// fixed window: time until the window ends. Never 0 when `remaining`
    /// is 0.
    pub reset_ns: u64,
    /// The period the limit is counted over (`RateLimit-Policy`'s `w`):
    /// buckets: burst × interval; windows: the period; concurrency: 0.
    pub window_ns: u64,
}

impl Quota {
    pub(crate) fn new(limit: u64, remaining: u64, reset_ns: u64) -> Quota {
        let remaining = remaining.min(limit);
        let reset_ns = if remaining == 0 {
            reset_ns.max(1)
        } else {
            reset_ns
        };
        Quota {
            limit,
            remaining,
            reset_ns,
            window_ns: 0,
        }
    }
}

impl Reservation {
    /// A reservation from its words (limiters in other files).
    pub(crate) fn raw(wait_ns: u64, token: u64, prev: u64) -> Reservation {
        Reservation {
            wait_ns,
            token,
            prev,
        }
    }

    /// The word written and the word replaced.
    pub(crate) fn raw_words(&self) -> (u64, u64) {
        (self.token, self.prev)
    }
}

#[inline]
fn pack(window: u64, count: u64) -> u64 {
    (window.min(u32::MAX as u64) << 32) | count.min(u32::MAX as u64)
}

#[inline]
fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & 0xFFFF_FFFF)
}

#[inline]
fn window_of(now: u64, period: u64) -> u64 {
    (now / period).min(u32::MAX as u64)
}

#[inline]
fn window_start(w: u64, period: u64) -> u64 {
    w.saturating_mul(period)
}

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
    fn retry_after(&self, now: u64, period: u64, limit: u64) -> u64 {
        if limit == 0 {
            return u64::MAX;
        }
        let at = if self.cur < limit {
            // Still possible inside this window, once prev has decayed.
            let e = sliding_min_elapsed(self.prev, limit - 1 - self.cur, period);
            window_start(self.window, period).saturating_add(e)
        } else {
            // Next window: prev becomes this window's count, cur 0.
            let e = sliding_min_elapsed(self.cur, limit - 1, period);
            window_start(self.window.saturating_add(1), period).saturating_add(e)
        };
        at.saturating_sub(now).max(1)
    }
}

impl Limiter {
    /// Compiles a strategy. Meant for validated strategies; for any other
    /// input it still never panics and errs on the side of rejecting
    /// (e.g. rate 0 admits nothing).
    pub fn from_strategy(s: &Strategy) -> Limiter {
        let params = match s.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let burst = if s.algorithm == Algorithm::LeakyBucket {
                    1
                } else {
                    s.burst.max(1) as u64
                };
                let interval = s.interval_ns().clamp(1, u64::MAX / 4);
                let tau = interval.saturating_mul(burst).min(u64::MAX / 4);
                let max_delay = max_delay_ns(s.action);
                Params::Gcra {
                    interval,
                    tau,
                    max_delay: max_delay.min(u64::MAX / 4),
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => Params::Window {
                period: s.per.period_ns().max(1),
                limit: s.rate.min(MAX_WINDOW_COUNT),
            },
            Algorithm::Concurrency => Params::Concurrency {
                limit: s.rate.min(MAX_WINDOW_COUNT),
            },
            Algorithm::WarmUp => Params::WarmUp(WarmUpParams::new(
                s.interval_ns(),
                s.warm_up.cold_factor,
                s.warm_up.period_ms,
                max_delay_ns(s.action),
            )),
        };
        Limiter {
            algorithm: s.algorithm,
            params,
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Tries to admit one request at `now_ns`. Inlined into the request
    /// path with the token bucket (the common algorithm); the others are
    /// calls (`inline(always)`: with the sixth algorithm the compiler
    /// stopped inlining it, 25 instructions more per request).
    #[inline(always)]
    pub fn acquire(&self, slot: &Slot, now_ns: u64) -> Outcome {
        match self.params {
            Params::Gcra {
                interval,
                tau,
                max_delay,
            } => gcra_acquire(slot.state0(), now_ns, interval, tau, max_delay),
            Params::Window { period, limit } => {
                if self.algorithm == Algorithm::SlidingWindow {
                    sliding_acquire(slot, now_ns, period, limit)
                } else {
                    fixed_acquire(slot.state0(), now_ns, period, limit)
                }
            }
            Params::Concurrency { limit } => concurrency_acquire(slot.state0(), limit),
            Params::WarmUp(p) => warm_up::acquire(&p, slot, now_ns),
        }
    }

    /// Gives back one request admitted by [`acquire`](Self::acquire) on
    /// this limiter and slot (see the module documentation for how exact
    /// that is under contention).
    pub fn refund(&self, slot: &Slot, r: Reservation) {
        match self.params {
            Params::Gcra { interval, .. } => gcra_refund(slot.state0(), r, interval),
            Params::Window { .. } => {
                let window = r.token >> 32;
                let word = if self.algorithm == Algorithm::SlidingWindow && window & 1 == 1 {
                    slot.state1()
                } else {
                    slot.state0()
                };
                window_refund(word, r);
            }
            Params::Concurrency { .. } => concurrency_release(slot.state0()),
            Params::WarmUp(p) => warm_up::refund(&p, slot, r),
        }
    }

    /// `concurrency`: the request ended. A no-op for other algorithms.
    pub fn release(&self, slot: &Slot) {
        if let Params::Concurrency { .. } = self.params {
            concurrency_release(slot.state0());
        }
    }

    /// Replaces state that no clock reading could have written (more than
    /// [`MAX_STALENESS_NS`] beyond the horizon) with the most restrictive
    /// legitimate state; `true` when a word was replaced. For the agent,
    /// never the request path: `clock` (this limiter's clock, see
    /// [`super::admit::Now`]) must be fresh, and it is read only after the
    /// words are loaded, so a legitimate word is never taken for foreign
    /// (module documentation).
    pub fn repair_foreign(&self, slot: &Slot, clock: impl FnOnce() -> u64) -> bool {
        match self.params {
            Params::Gcra { tau, max_delay, .. } => {
                let w = slot.state0();
                let tat = w.load(Ordering::SeqCst);
                let now = clock();
                let horizon = tau.saturating_add(max_delay);
                if tat <= now.saturating_add(horizon).saturating_add(MAX_STALENESS_NS) {
                    return false;
                }
                let repaired = now.saturating_add(horizon);
                w.compare_exchange(tat, repaired, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            }
            Params::Window { period, limit } => {
                let sliding = self.algorithm == Algorithm::SlidingWindow;
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
            Params::WarmUp(p) => warm_up::repair_foreign(&p, slot, clock),
            Params::Concurrency { .. } => false,
        }
    }

    /// `concurrency` under a dry run: count the request in flight even over
    /// the limit, so that the release at its end balances. `None` only at
    /// the (unreachable in practice) cap of 2³² − 1 in flight, or for other
    /// algorithms.
    pub(crate) fn force_acquire(&self, slot: &Slot) -> Option<Reservation> {
        let Params::Concurrency { .. } = self.params else {
            return None;
        };
        let w = slot.state0();
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur >= INFLIGHT_CAP {
                return None;
            }
            match w.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Reservation::default()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Quota as seen at `now_ns` (for `RateLimit-*` headers). Read-only.
    pub fn quota(&self, slot: &Slot, now_ns: u64) -> Quota {
        let mut q = self.quota_now(slot, now_ns);
        q.window_ns = match self.params {
            Params::Gcra { tau, .. } => tau,
            Params::Window { period, .. } => period,
            Params::Concurrency { .. } => 0,
            Params::WarmUp(p) => p.stable,
        };
        q
    }

    fn quota_now(&self, slot: &Slot, now_ns: u64) -> Quota {
        let now = now_ns;
        match self.params {
            Params::Gcra { interval, tau, .. } => {
                let tat = slot.state0().load(Ordering::Acquire);
                let burst = tau / interval;
                let used = tat.max(now) - now; // max(tat, now) ≥ now
                let remaining = tau.saturating_sub(used) / interval;
                Quota::new(burst, remaining, tat.saturating_sub(now))
            }
            Params::Window { period, limit } => {
                if self.algorithm == Algorithm::SlidingWindow {
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
                } else {
                    let w_now = window_of(now, period);
                    let (sw, sc) = unpack(slot.state0().load(Ordering::Acquire));
                    let (w, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
                    let end = window_start(w.saturating_add(1), period);
                    Quota::new(limit, limit.saturating_sub(count), end.saturating_sub(now))
                }
            }
            Params::Concurrency { limit } => {
                let inflight = slot.state0().load(Ordering::Acquire);
                let remaining = limit.saturating_sub(inflight);
                let reset = if remaining == 0 {
                    CONCURRENCY_RETRY_NS
                } else {
                    0
                };
                Quota::new(limit, remaining, reset)
            }
            Params::WarmUp(p) => warm_up::quota(&p, slot, now),
        }
    }
}

/// The `delay` action's cap in ns (0 for other actions).
fn max_delay_ns(action: Action) -> u64 {
    match action {
        Action::Delay { max_delay_ms } | Action::DryRunDelay { max_delay_ms } => {
            (max_delay_ms as u64).saturating_mul(1_000_000)
        }
        _ => 0,
    }
}

#[inline(always)]
fn gcra_acquire(w: &AtomicU64, now: u64, interval: u64, tau: u64, max_delay: u64) -> Outcome {
    let horizon = tau.saturating_add(max_delay);
    let mut tat = w.load(Ordering::Acquire);
    loop {
        let Some(new_tat) = tat.max(now).checked_add(interval) else {
            return Outcome::Rejected {
                retry_after_ns: u64::MAX,
            };
        };
        let ahead = new_tat - now; // new_tat > max(tat, now) ≥ now
        if ahead > horizon {
            return Outcome::Rejected {
                retry_after_ns: ahead - horizon,
            };
        }
        match w.compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                return Outcome::Admitted(Reservation {
                    wait_ns: ahead.saturating_sub(tau),
                    token: new_tat,
                    prev: tat,
                })
            }
            Err(actual) => tat = actual,
        }
    }
}

fn gcra_refund(w: &AtomicU64, r: Reservation, interval: u64) {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let back = if cur == r.token {
            r.prev
        } else {
            cur.saturating_sub(interval)
        };
        match w.compare_exchange_weak(cur, back, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

#[inline(never)]
fn fixed_acquire(w: &AtomicU64, now: u64, period: u64, limit: u64) -> Outcome {
    let w_now = window_of(now, period);
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let (sw, sc) = unpack(cur);
        // Older → a fresh window; equal or newer → count against it.
        let (win, count) = if sw < w_now { (w_now, 0) } else { (sw, sc) };
        if count >= limit {
            let end = window_start(win.saturating_add(1), period);
            return Outcome::Rejected {
                retry_after_ns: end.saturating_sub(now).max(1),
            };
        }
        // count < limit ≤ u32::MAX − 1: the increment fits in 32 bits.
        let next = pack(win, count + 1);
        match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                return Outcome::Admitted(Reservation {
                    wait_ns: 0,
                    token: next,
                    prev: cur,
                })
            }
            Err(actual) => cur = actual,
        }
    }
}

/// Puts back the word `r` replaced if `w` still holds the one it wrote;
/// else decrements the count of `r`'s window, if `w` still holds it.
fn window_refund(w: &AtomicU64, r: Reservation) {
    let window = r.token >> 32;
    let mut cur = w.load(Ordering::SeqCst);
    loop {
        let (sw, sc) = unpack(cur);
        let back = if cur == r.token {
            r.prev
        } else if sw == window && sc > 0 {
            pack(sw, sc - 1)
        } else {
            return;
        };
        match w.compare_exchange_weak(cur, back, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

#[inline(never)]
fn sliding_acquire(slot: &Slot, now: u64, period: u64, limit: u64) -> Outcome {
    let words = [slot.state0(), slot.state1()];
    loop {
        let vals = [
            words[0].load(Ordering::SeqCst),
            words[1].load(Ordering::SeqCst),
        ];
        let v = SlidingView::read(vals, now, period);
        let estimate = v.estimate(period);
        if estimate.saturating_add(1) > limit {
            return Outcome::Rejected {
                retry_after_ns: v.retry_after(now, period, limit),
            };
        }
        let pos = (v.window & 1) as usize;
        // estimate < limit ≤ u32::MAX − 1 and cur ≤ estimate: fits.
        let next = pack(v.window, v.cur + 1);
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
                && sliding_estimate(oc, v.cur + 1, v.elapsed, period) > limit);
        let r = Reservation {
            wait_ns: 0,
            token: next,
            prev: v.cur_word,
        };
        if !stale {
            return Outcome::Admitted(r);
        }
        window_refund(words[pos], r);
    }
}

#[inline(never)]
fn concurrency_acquire(w: &AtomicU64, limit: u64) -> Outcome {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        if cur >= limit {
            return Outcome::Rejected {
                retry_after_ns: CONCURRENCY_RETRY_NS,
            };
        }
        match w.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Outcome::Admitted(Reservation::default()),
            Err(actual) => cur = actual,
        }
    }
}

fn concurrency_release(w: &AtomicU64) {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        if cur == 0 {
            return;
        }
        match w.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::{Clock, FakeClock};
    use crate::core::model::Unit;
    use crate::core::slot::LocalSlots;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn limiter(algorithm: Algorithm, rate: u64, per: Unit, burst: u32, action: Action) -> Limiter {
        let s = Strategy::unconditioned(algorithm, rate, per, burst, action);
        Limiter::from_strategy(&s.expect("valid strategy"))
    }

    const REJECT: Action = Action::Reject { status: None };

    fn with_slot<R>(f: impl FnOnce(&Slot) -> R) -> R {
        let local = LocalSlots::new(1);
        let region = local.region();
        let slot = Slot::at(&region, 0).unwrap();
        f(&slot)
    }

    impl Quota {
        fn no_window(mut self) -> Quota {
            self.window_ns = 0;
            self
        }
    }

    fn admitted(l: &Limiter, slot: &Slot, now: u64) -> bool {
        l.acquire(slot, now).is_admitted()
    }

    fn retry(l: &Limiter, slot: &Slot, now: u64) -> u64 {
        match l.acquire(slot, now) {
            Outcome::Rejected { retry_after_ns } => retry_after_ns,
            other => panic!("expected a rejection at {now}, got {other:?}"),
        }
    }

    /// Counts admissions of one request every `step` ns in `[from, to)`.
    fn drive(l: &Limiter, slot: &Slot, clock: &FakeClock, from: u64, to: u64, step: u64) -> u64 {
        let mut n = 0;
        clock.set(from);
        while clock.now_ns() < to {
            if admitted(l, slot, clock.now_ns()) {
                n += 1;
            }
            clock.advance(step);
        }
        n
    }

    #[test]
    fn new_gcra_slot_is_a_full_bucket_and_retry_after_is_exact() {
        let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 5, REJECT);
        with_slot(|slot| {
            let clock = FakeClock::new(1_000 * S);
            for _ in 0..5 {
                assert!(admitted(&l, slot, clock.now_ns()));
            }
            let ra = retry(&l, slot, clock.now_ns());
            assert_eq!(ra, 100 * MS);
            assert!(!admitted(&l, slot, clock.now_ns() + ra - 1));
            assert!(admitted(&l, slot, clock.now_ns() + ra));
        });
    }

    #[test]
    fn gcra_full_bucket_even_at_time_zero() {
        // A TAT of 0 is never ahead of any clock, so a new slot is full
        // even right after boot.
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Hour, 3, REJECT);
        with_slot(|slot| {
            for _ in 0..3 {
                assert!(admitted(&l, slot, 0));
            }
            assert!(!admitted(&l, slot, 0));
        });
    }

    #[test]
    fn leaky_bucket_delay_queues_up_to_the_bound() {
        let l = limiter(
            Algorithm::LeakyBucket,
            10,
            Unit::Second,
            99,
            Action::Delay { max_delay_ms: 350 },
        );
        with_slot(|slot| {
            let now = 5 * S;
            let waits: Vec<u64> = (0..4)
                .map(|_| match l.acquire(slot, now) {
                    Outcome::Admitted(r) => r.wait_ns,
                    o => panic!("{o:?}"),
                })
                .collect();
            assert_eq!(waits, vec![0, 100 * MS, 200 * MS, 300 * MS]);
            // The fifth would wait 400 ms > 350 ms.
            let ra = retry(&l, slot, now);
            assert_eq!(ra, 50 * MS);
            match l.acquire(slot, now + ra) {
                Outcome::Admitted(r) => assert_eq!(r.wait_ns, 350 * MS),
                o => panic!("{o:?}"),
            }
        });
    }

    #[test]
    fn gcra_refund_restores_the_state_exactly() {
        let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 2, REJECT);
        with_slot(|slot| {
            slot.state0().store(3 * S, Ordering::Relaxed);
            let before = slot.state0().load(Ordering::Relaxed);
            let Outcome::Admitted(r) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            l.refund(slot, r);
            assert_eq!(slot.state0().load(Ordering::Relaxed), before);
            // Under interleaving the refund subtracts one interval.
            let Outcome::Admitted(a) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            let Outcome::Admitted(_b) = l.acquire(slot, 7 * S) else {
                panic!()
            };
            l.refund(slot, a);
            assert_eq!(slot.state0().load(Ordering::Relaxed), 7 * S + 100 * MS);
        });
    }

    #[test]
    fn gcra_clock_going_backwards_admits_nothing_extra() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 5, REJECT);
        with_slot(|slot| {
            let clock = FakeClock::new(100 * S);
            for _ in 0..5 {
                assert!(admitted(&l, slot, 100 * S));
            }
            assert!(!admitted(&l, slot, 100 * S));
            // Back 10 s: the bucket stays empty until the clock catches up
            // with the state (TAT 105 s: one token again at 101 s).
            assert_eq!(drive(&l, slot, &clock, 90 * S, 101 * S, 10 * MS), 0);
            assert!(admitted(&l, slot, 101 * S));
            // A stale reading slightly behind never admits either.
            assert!(!admitted(&l, slot, 101 * S - 1));
        });
    }

    #[test]
    fn gcra_garbage_and_foreign_state_never_panics_nor_admits_extra() {
        let l = limiter(Algorithm::TokenBucket, 100, Unit::Second, 10, REJECT);
        for garbage in [
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            0xdead_beef_dead_beef,
            500 * S,
        ] {
            with_slot(|slot| {
                slot.state0().store(garbage, Ordering::Relaxed);
                let clock = FakeClock::new(100 * S);
                // 1000 requests a second for 10 s: the request path never
                // rewinds, so at most the rate, no burst...
                let n = drive(&l, slot, &clock, 100 * S, 110 * S, MS);
                assert!(n <= 1000, "garbage {garbage:#x}: {n} admitted");
                // ...and once the agent repaired it (an empty bucket with a
                // full queue), the rate is granted again.
                let _ = l.repair_foreign(slot, || 110 * S);
                let n = drive(&l, slot, &clock, 110 * S, 120 * S, MS);
                assert!(n <= 1000, "garbage {garbage:#x}: {n} admitted");
                assert!(n >= 990, "garbage {garbage:#x}: only {n} admitted");
            });
        }
    }

    /// Issue 11, item 5: a fresh worker drains the quota at `t`, then a
    /// worker whose clock reads `t − stale` (61 s, 600 s) tries; neither it
    /// nor the fresh worker afterwards admits anything, and the agent's
    /// repair (fresh clock) leaves the legitimate state alone.
    #[test]
    fn a_stale_worker_admits_nothing_extra_at_any_staleness() {
        let cases = [
            (Algorithm::TokenBucket, 1, Unit::Minute, 5, 5),
            (Algorithm::TokenBucket, 20, Unit::Second, 20, 20),
            (Algorithm::LeakyBucket, 1, Unit::Minute, 0, 1),
            (Algorithm::FixedWindow, 20, Unit::Second, 0, 20),
            (Algorithm::FixedWindow, 5, Unit::Hour, 0, 5),
            (Algorithm::SlidingWindow, 20, Unit::Second, 0, 20),
            (Algorithm::SlidingWindow, 5, Unit::Minute, 0, 5),
        ];
        for (alg, rate, per, burst, quota) in cases {
            for stale in [61 * S, 600 * S, 3600 * S + 1] {
                let l = limiter(alg, rate, per, burst, REJECT);
                with_slot(|slot| {
                    // Mid-window, far from the epoch: windows are UTC.
                    let t = 1_700_000_000 * S + 7 * S + 300 * MS;
                    let mut fresh = 0;
                    while admitted(&l, slot, t) {
                        fresh += 1;
                        assert!(fresh <= quota, "{alg:?}: more than the quota fresh");
                    }
                    assert_eq!(fresh, quota, "{alg:?}");
                    let words = (
                        slot.state0().load(Ordering::Relaxed),
                        slot.state1().load(Ordering::Relaxed),
                    );
                    let mut extra = 0;
                    for i in 0..100 {
                        // The stale reading, creeping up by 1 ms.
                        extra += u32::from(admitted(&l, slot, t - stale + i * MS));
                    }
                    assert!(!l.repair_foreign(slot, || t), "{alg:?}: repaired");
                    for _ in 0..100 {
                        extra += u32::from(admitted(&l, slot, t));
                    }
                    let s = stale / S;
                    assert_eq!(
                        extra, 0,
                        "{alg:?} {rate}/{per:?}: {s} s stale admitted extra"
                    );
                    assert_eq!(
                        words,
                        (
                            slot.state0().load(Ordering::Relaxed),
                            slot.state1().load(Ordering::Relaxed)
                        ),
                        "{alg:?}: state moved by rejected requests"
                    );
                });
            }
        }
    }

    #[test]
    fn repair_foreign_replaces_only_what_no_clock_wrote() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 2, REJECT);
        with_slot(|slot| {
            // Horizon 2 s: up to 62 s ahead of a fresh clock is legitimate.
            slot.state0().store(162 * S, Ordering::Relaxed);
            assert!(!l.repair_foreign(slot, || 100 * S));
            slot.state0().store(162 * S + 1, Ordering::Relaxed);
            assert!(l.repair_foreign(slot, || 100 * S));
            // The most restrictive legitimate state: empty bucket.
            assert_eq!(slot.state0().load(Ordering::Relaxed), 102 * S);
            assert!(!admitted(&l, slot, 100 * S));
            assert!(admitted(&l, slot, 101 * S));
        });
        let l = limiter(Algorithm::FixedWindow, 3, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            slot.state0().store(pack(160, 1), Ordering::Relaxed);
            assert!(!l.repair_foreign(slot, || 100 * S));
            slot.state0().store(pack(161, 1), Ordering::Relaxed);
            assert!(l.repair_foreign(slot, || 100 * S + 5));
            assert_eq!(unpack(slot.state0().load(Ordering::Relaxed)), (100, 3));
        });
        let l = limiter(Algorithm::Concurrency, 3, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            slot.state0().store(u64::MAX, Ordering::Relaxed);
            assert!(!l.repair_foreign(slot, || 100 * S));
        });
    }

    #[test]
    fn gcra_state_within_staleness_is_waited_out_not_repaired() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 1, REJECT);
        with_slot(|slot| {
            // 30 s ahead: a clock stepped back within tolerance. Waited out.
            slot.state0().store(130 * S, Ordering::Relaxed);
            assert_eq!(retry(&l, slot, 100 * S), 30 * S);
            assert_eq!(slot.state0().load(Ordering::Relaxed), 130 * S);
        });
    }

    #[test]
    fn gcra_near_the_end_of_time_rejects_without_panicking() {
        let l = limiter(Algorithm::TokenBucket, 1, Unit::Second, 3, REJECT);
        with_slot(|slot| {
            assert_eq!(
                l.acquire(slot, u64::MAX),
                Outcome::Rejected {
                    retry_after_ns: u64::MAX
                }
            );
            assert!(admitted(&l, slot, u64::MAX - 2 * S));
            let _ = l.quota(slot, u64::MAX);
        });
    }

    #[test]
    fn fixed_window_counts_and_retry_after_is_the_window_end() {
        let l = limiter(Algorithm::FixedWindow, 3, Unit::Minute, 0, REJECT);
        with_slot(|slot| {
            let now = 60 * S * 10 + 15 * S;
            for _ in 0..3 {
                assert!(admitted(&l, slot, now));
            }
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
                for w in 100..110u64 {
                    let n = drive(&l, slot, &clock, w * S, (w + 1) * S, MS);
                    assert!(n <= 50, "garbage {garbage:#x}, window {w}: {n}");
                }
                // Healed by the agent's repair (or by time): the next
                // window grants the full quota.
                let _ = l.repair_foreign(slot, || 110 * S - 1);
                assert_eq!(drive(&l, slot, &clock, 110 * S, 111 * S, MS), 50);
            });
        }
    }

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
                let Outcome::Admitted(r) = l.acquire(slot, 3 * S + 1) else {
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
                let Outcome::Admitted(r) = l.acquire(slot, 3 * S + 2) else {
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

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let l = limiter(Algorithm::SlidingWindow, 10, Unit::Second, 0, REJECT);
        with_slot(|slot| {
            for _ in 0..10 {
                assert!(admitted(&l, slot, 20 * S + 500 * MS));
            }
            assert!(!admitted(&l, slot, 20 * S + 999 * MS));
            // At 21.25 s the previous window weighs 0.75 × 10 = 7.5 → 7:
            // three more fit.
            let t = 21 * S + 250 * MS;
            for _ in 0..3 {
                assert!(admitted(&l, slot, t));
            }
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
            for _ in 0..4 {
                assert!(admitted(&l, slot, 7 * S + 900 * MS));
            }
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
            for _ in 0..4 {
                assert!(admitted(&l, slot, 9 * S + 999 * MS));
            }
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
                for w in 100..110u64 {
                    let n = drive(&l, slot, &clock, w * S, (w + 1) * S, MS);
                    assert!(n <= 50, "garbage {a:#x}/{b:#x}, window {w}: {n}");
                }
                let _ = l.repair_foreign(slot, || 110 * S - 1);
                let n = drive(&l, slot, &clock, 110 * S, 120 * S, MS);
                assert!((480..=500).contains(&n), "not healed: {n}");
            });
        }
    }

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

    #[test]
    fn quota_reports_remaining_and_reset() {
        with_slot(|slot| {
            let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 3, REJECT);
            let now = 50 * S;
            assert_eq!(
                l.quota(slot, now).no_window(),
                Quota {
                    limit: 3,
                    remaining: 3,
                    reset_ns: 0,
                    window_ns: 0
                }
            );
            assert!(admitted(&l, slot, now));
            assert_eq!(
                l.quota(slot, now).no_window(),
                Quota {
                    limit: 3,
                    remaining: 2,
                    reset_ns: 100 * MS,
                    window_ns: 0
                }
            );
            assert!(admitted(&l, slot, now));
            assert!(admitted(&l, slot, now));
            assert_eq!(
                l.quota(slot, now).no_window(),
                Quota {
                    limit: 3,
                    remaining: 0,
                    reset_ns: 300 * MS,
                    window_ns: 0
                }
            );
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::FixedWindow, 2, Unit::Minute, 0, REJECT);
            let now = 60 * S + 10 * S;
            assert_eq!(
                l.quota(slot, now).no_window(),
                Quota {
                    limit: 2,
                    remaining: 2,
                    reset_ns: 50 * S,
                    window_ns: 0
                }
            );
            assert!(admitted(&l, slot, now));
            assert!(admitted(&l, slot, now));
            assert_eq!(
                l.quota(slot, now).no_window(),
                Quota {
                    limit: 2,
                    remaining: 0,
                    reset_ns: 50 * S,
                    window_ns: 0
                }
            );
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::SlidingWindow, 4, Unit::Second, 0, REJECT);
            assert_eq!(l.quota(slot, 5 * S).remaining, 4);
            for _ in 0..4 {
                assert!(admitted(&l, slot, 5 * S + 500 * MS));
            }
            assert_eq!(
                l.quota(slot, 5 * S + 500 * MS),
                Quota {
                    limit: 4,
                    remaining: 0,
                    reset_ns: 1_500 * MS,
                    window_ns: S
                }
            );
            // Next window at 6.5 s: floor(4 × 0.5) = 2 used.
            assert_eq!(
                l.quota(slot, 6 * S + 500 * MS),
                Quota {
                    limit: 4,
                    remaining: 2,
                    reset_ns: 500 * MS,
                    window_ns: S
                }
            );
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::Concurrency, 1, Unit::Second, 0, REJECT);
            assert_eq!(
                l.quota(slot, 0),
                Quota {
                    limit: 1,
                    remaining: 1,
                    reset_ns: 0,
                    window_ns: 0
                }
            );
            assert!(admitted(&l, slot, 0));
            assert_eq!(
                l.quota(slot, 0),
                Quota {
                    limit: 1,
                    remaining: 0,
                    reset_ns: CONCURRENCY_RETRY_NS,
                    window_ns: 0
                }
            );
        });
    }
}

#[cfg(test)]
mod race_tests {
    use super::*;
    use crate::core::model::Unit;
    use crate::core::slot::LocalSlots;
    use std::sync::atomic::AtomicBool;
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
