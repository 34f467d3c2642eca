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
//! ([`Now`]) gives the windows wall-clock time (Unix
//! nanoseconds), so windows are UTC minutes, hours and days on every host;
//! with a period of one second the index saturates in 2106, after which
//! every request falls in the last window, which can only reject more,
//! never admit more. The buckets get monotonic time.
//!
//! Each algorithm is in its own file: [`gcra`] (`token_bucket` and
//! `leaky_bucket`: the GCRA), [`fixed_window`] and [`sliding_window`] (over the
//! packed window words of [`window`]), [`concurrency`], [`warm_up`]. Each
//! file holds the algorithm's arithmetic once, as pure functions over its
//! state word(s): the step (a [`Step`]: the next word and the wait, or the
//! retry time), the refund, the charge after the response, freshness and
//! the quota. Two compare-and-swap loops run the same steps: this file's
//! over a shared slot's words ([`Limiter`]), and the key table's over a
//! key's word (`super::keys::KeyTable::charge_at`, dispatching through
//! `super::keys::KeyLimiter`). `strategy.rs` compiles a strategy into both
//! (the only file here that names the model). This file holds the rest of
//! what they share: the compiled [`Limiter`] and its dispatch, the clocks
//! ([`Now`]), the [`Acquired`] of an acquire, the [`Reservation`] a refund
//! needs and the [`Quota`] for the `RateLimit-*` headers.
//!
//! `warm_up` is the exception: its state is two words changed by one
//! 16-byte compare-and-swap, so it has its own loop and no per-key form
//! (see `KeyLimiter::from_strategy` in `strategy.rs`).
//!
//! # Stale and backward time, foreign state
//!
//! Legitimate state is never ahead of the newest clock reading of any
//! worker by more than the limiter's horizon (GCRA: `tau + max_delay`;
//! windows: the start of the stored window is ≤ now). A caller whose clock
//! reading is behind that (a stale reading, a process stopped between
//! reading the clock and updating the slot, a clock stepped back) is
//! treated conservatively (each algorithm's file says how), **whatever the
//! staleness**: the request path never moves state backwards, so a stale
//! worker never admits anything a fresh one would not.
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

use crate::core::shm::slot::Slot;
use gcra::Gcra;
use warm_up::WarmUpParams;

pub mod calendar_window;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_window;
mod strategy;
pub mod warm_up;
pub mod window;

/// How far beyond its legitimate horizon (at a fresh clock reading) a state
/// word may lie before [`Limiter::repair_foreign`] takes it as foreign
/// (garbage, another clock) and replaces it. See the module documentation.
pub const MAX_STALENESS_NS: u64 = 60 * 1_000_000_000;

/// `retry_after` advertised by a `concurrency` rejection (there is no time
/// in its state; one second is a polling hint).
pub const CONCURRENCY_RETRY_NS: u64 = 1_000_000_000;

/// A transition of one state word, as each algorithm's step computes it
/// (pure: the caller's compare-and-swap commits it, on a shared slot's
/// word here or on a key's word in `super::keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Admitted: store `next`; the request waits `wait_ns` (delay action).
    Admit { next: u64, wait_ns: u64 },
    /// Rejected; the same request would pass `retry_after_ns` from now.
    Reject { retry_after_ns: u64 },
}

pub use crate::core::clock::Now;

impl Now {
    /// The reading `limiter` runs on: wall time for the windows,
    /// monotonic for the rest.
    #[inline]
    pub fn for_limiter(self, limiter: &Limiter) -> u64 {
        match limiter.params {
            Params::Fixed { .. } | Params::Sliding { .. } | Params::Calendar { .. } => self.wall_ns,
            _ => self.mono_ns,
        }
    }
}

/// A limiter compiled from a validated strategy (`strategy.rs`, the one
/// file of `limiter/` that names the model). Plain data: the state lives
/// in the [`Slot`] passed to each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limiter {
    params: Params,
}

/// One variant per algorithm (the variant is the algorithm: no separate
/// tag, so a compiled limiter is 32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Params {
    TokenBucket(Gcra),
    /// A GCRA of burst 1.
    LeakyBucket(Gcra),
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
    /// `warm_up` (src/core/limiter/warm_up.rs).
    WarmUp(WarmUpParams),
    /// `fixed_window` in calendar windows (`calendar_window.rs`, issue 33).
    Calendar {
        limit: u64,
        cal: crate::core::calendar::CalRef,
    },
}

/// Result of [`Limiter::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Admitted; the reservation may be refunded.
    Admitted(Reservation),
    /// Not admitted; the same request would be admitted `retry_after_ns`
    /// from now if nothing else arrived (never earlier).
    Rejected { retry_after_ns: u64 },
}

impl Acquired {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Acquired::Admitted(_))
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

/// The shared slot's compare-and-swap loop around a one-word step (the
/// per-key table's is `KeyTable::charge_at`, around the same steps):
/// `write: false` only checks (`count_if`, issue 31), answering as an
/// acquire would now with nothing written.
#[inline(always)]
fn acquire_word(w: &AtomicU64, write: bool, step: impl Fn(u64) -> Step) -> Acquired {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let (next, wait_ns) = match step(cur) {
            Step::Admit { next, wait_ns } => (next, wait_ns),
            Step::Reject { retry_after_ns } => return Acquired::Rejected { retry_after_ns },
        };
        let r = Reservation {
            wait_ns,
            token: next,
            prev: cur,
        };
        if !write {
            return Acquired::Admitted(r);
        }
        match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Acquired::Admitted(r),
            Err(actual) => cur = actual,
        }
    }
}

/// [`acquire_word`] as a call, for the algorithms off the inlined path.
#[inline(never)]
fn acquire_word_call(w: &AtomicU64, write: bool, step: impl Fn(u64) -> Step) -> Acquired {
    acquire_word(w, write, step)
}

/// One request on a `fixed_window` word (a call: off the inlined path).
#[inline(never)]
fn acquire_fixed(w: &AtomicU64, now: u64, period: u64, limit: u64) -> Acquired {
    acquire_word(w, true, |c| fixed_window::step(c, now, period, limit, 1))
}

/// One request on a `concurrency` word (a call: off the inlined path).
#[inline(never)]
fn acquire_concurrency(w: &AtomicU64, limit: u64) -> Acquired {
    acquire_word(w, true, |c| concurrency::step(c, limit))
}

/// Applies `f` to the word until it sticks or `f` answers `None`.
fn update_word(w: &AtomicU64, f: impl Fn(u64) -> Option<u64>) {
    let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, f);
}

impl Limiter {
    /// Tries to admit one request at `now_ns`. Inlined into the request
    /// path with the token bucket (the common algorithm); the others are
    /// calls (`inline(always)`: with the sixth algorithm the compiler
    /// stopped inlining it, 25 instructions more per request).
    #[inline(always)]
    pub fn acquire(&self, slot: &Slot, now_ns: u64) -> Acquired {
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => {
                acquire_word(slot.state0(), true, |tat| g.step(tat, now_ns, g.interval))
            }
            Params::Sliding { period, limit } => {
                sliding_window::acquire(slot, now_ns, period, limit)
            }
            Params::Fixed { period, limit } => acquire_fixed(slot.state0(), now_ns, period, limit),
            Params::Concurrency { limit } => acquire_concurrency(slot.state0(), limit),
            Params::WarmUp(p) => warm_up::acquire(&p, slot, now_ns),
            Params::Calendar { limit, cal } => acquire_word_call(slot.state0(), true, |w| {
                calendar_window::step(w, now_ns, cal.get(), limit, 1)
            }),
        }
    }

    /// [`acquire`](Self::acquire) of `n` units at once (`cost_from`,
    /// issue 31): admitted only if all `n` fit (a bucket: `n × T` within
    /// its horizon, so a cost above the burst never passes; a window:
    /// `count + n ≤ limit`); nothing is charged otherwise. `concurrency`
    /// and `warm_up` (which refuse `cost_from`) take one.
    pub fn acquire_units(&self, slot: &Slot, now_ns: u64, n: u64) -> Acquired {
        self.units(slot, now_ns, n, true)
    }

    /// Would `n` units be admitted now? (`count_if`, issue 31: the request
    /// is checked at admission and charged when it ends.) The algorithm's
    /// step on the current state, nothing written: `Admitted` carries the
    /// wait a bucket would impose, `Rejected` the retry time, exactly as
    /// [`acquire_units`](Self::acquire_units) would answer now.
    /// `concurrency` and `warm_up` (which refuse `count_if`) admit.
    pub fn check_units(&self, slot: &Slot, now_ns: u64, n: u64) -> Acquired {
        self.units(slot, now_ns, n, false)
    }

    /// The steps of [`acquire_units`](Self::acquire_units) (`write`) and
    /// [`check_units`](Self::check_units).
    fn units(&self, slot: &Slot, now_ns: u64, n: u64, write: bool) -> Acquired {
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => {
                acquire_word_call(slot.state0(), write, |tat| g.step(tat, now_ns, g.cost(n)))
            }
            Params::Sliding { period, limit } => {
                sliding_window::units(slot, now_ns, period, limit, n, write)
            }
            Params::Fixed { period, limit } => acquire_word_call(slot.state0(), write, |w| {
                fixed_window::step(w, now_ns, period, limit, n)
            }),
            Params::Calendar { limit, cal } => acquire_word_call(slot.state0(), write, |w| {
                calendar_window::step(w, now_ns, cal.get(), limit, n)
            }),
            Params::Concurrency { limit } if write => acquire_concurrency(slot.state0(), limit),
            Params::WarmUp(p) if write => warm_up::acquire(&p, slot, now_ns),
            _ => Acquired::Admitted(Reservation::default()),
        }
    }

    /// The word of a window limiter that counts window `window` (sliding:
    /// even windows in `state0`, odd ones in `state1`).
    fn window_word<'s>(&self, slot: &'s Slot, window: u64) -> &'s AtomicU64 {
        if matches!(self.params, Params::Sliding { .. }) && window & 1 == 1 {
            slot.state1()
        } else {
            slot.state0()
        }
    }

    /// [`refund`](Self::refund) of an [`acquire_units`](Self::acquire_units)
    /// of `n` units.
    pub fn refund_units(&self, slot: &Slot, r: Reservation, n: u64) {
        let n = n.max(1);
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => update_word(slot.state0(), |cur| {
                Some(g.refund(cur, r.token, r.prev, g.interval.saturating_mul(n)))
            }),
            Params::Fixed { .. } | Params::Sliding { .. } | Params::Calendar { .. } => {
                window::update(self.window_word(slot, r.token >> 32), |cur| {
                    window::refund(cur, r.token, r.prev, n)
                })
            }
            Params::Concurrency { .. } => update_word(slot.state0(), concurrency::release),
            Params::WarmUp(p) => warm_up::refund(&p, slot, r),
        }
    }

    /// The charge after the response (issue 31): `delta` units more
    /// (charged even over the limit: a bucket goes into debt, a window
    /// stays full until it ends) or, negative, given back. `now_ns` is
    /// this limiter's clock now, `admitted_ns` its reading when the
    /// request was admitted (windows give back to that window only).
    /// No-op for `concurrency` and `warm_up`.
    pub fn charge_after(&self, slot: &Slot, now_ns: u64, admitted_ns: u64, delta: i64) {
        if delta == 0 {
            return;
        }
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => update_word(slot.state0(), |cur| {
                Some(g.charge_after(cur, now_ns, delta))
            }),
            Params::Fixed { period, .. } | Params::Sliding { period, .. } => {
                let charged = window::window_of(admitted_ns, period);
                let at = if delta >= 0 {
                    window::window_of(now_ns, period)
                } else {
                    charged
                };
                window::update(self.window_word(slot, at), |cur| {
                    window::charge_after(cur, now_ns, period, charged, delta)
                });
            }
            Params::Calendar { cal, .. } => {
                let charged = calendar_window::window_id(admitted_ns, cal.get());
                update_word(slot.state0(), |cur| {
                    calendar_window::charge_after(cur, now_ns, cal.get(), charged, delta)
                });
            }
            _ => {}
        }
    }

    /// Gives back one request admitted by [`acquire`](Self::acquire) on
    /// this limiter and slot (see the module documentation for how exact
    /// that is under contention).
    pub fn refund(&self, slot: &Slot, r: Reservation) {
        self.refund_units(slot, r, 1)
    }

    /// `concurrency`: the request ended. A no-op for other algorithms.
    pub fn release(&self, slot: &Slot) {
        if let Params::Concurrency { .. } = self.params {
            update_word(slot.state0(), concurrency::release);
        }
    }

    /// Replaces state that no clock reading could have written (more than
    /// [`MAX_STALENESS_NS`] beyond the horizon) with the most restrictive
    /// legitimate state; `true` when a word was replaced. For the agent,
    /// never the request path: `clock` (this limiter's clock, see
    /// [`Now`]) must be fresh, and it is read only after the
    /// words are loaded, so a legitimate word is never taken for foreign
    /// (module documentation).
    pub fn repair_foreign(&self, slot: &Slot, clock: impl FnOnce() -> u64) -> bool {
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => {
                gcra::repair_foreign(&g, slot.state0(), clock)
            }
            Params::Fixed { period, limit } => {
                window::repair_foreign(slot, false, period, limit, clock)
            }
            Params::Sliding { period, limit } => {
                window::repair_foreign(slot, true, period, limit, clock)
            }
            Params::WarmUp(p) => warm_up::repair_foreign(&p, slot, clock),
            Params::Calendar { limit, cal } => {
                calendar_window::repair_foreign(slot, cal.get(), limit, clock)
            }
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
        slot.state0()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, concurrency::force)
            .ok()
            .map(|_| Reservation::default())
    }

    /// Quota as seen at `now_ns` (for `RateLimit-*` headers). Read-only.
    pub fn quota(&self, slot: &Slot, now_ns: u64) -> Quota {
        let w0 = slot.state0().load(Ordering::Acquire);
        match self.params {
            Params::TokenBucket(g) | Params::LeakyBucket(g) => g.quota(w0, now_ns),
            Params::Sliding { period, limit } => sliding_window::quota(slot, now_ns, period, limit),
            Params::Fixed { period, limit } => fixed_window::quota(w0, now_ns, period, limit),
            Params::Calendar { limit, cal } => calendar_window::quota(w0, now_ns, cal.get(), limit),
            Params::Concurrency { limit } => concurrency::quota(w0, limit),
            Params::WarmUp(p) => Quota {
                window_ns: p.stable,
                ..warm_up::quota(&p, slot, now_ns)
            },
        }
    }
}

/// `Quota { limit, remaining, reset_ns, window_ns }` as written (tests).
#[cfg(test)]
pub(crate) fn q(limit: u64, remaining: u64, reset_ns: u64, window_ns: u64) -> Quota {
    Quota {
        limit,
        remaining,
        reset_ns,
        window_ns,
    }
}

#[cfg(test)]
mod test_util {
    //! What the algorithms' tests share.
    pub(super) use super::{Acquired, Limiter, Quota};
    pub(super) use crate::core::clock::{Clock, FakeClock};
    pub(super) use crate::core::model::{Action, Algorithm, Strategy, Unit};
    pub(super) use crate::core::shm::slot::{LocalSlots, Slot};
    pub(super) use std::sync::atomic::Ordering;

    pub(super) const S: u64 = 1_000_000_000;

    pub(super) const MS: u64 = 1_000_000;

    pub(super) fn limiter(
        algorithm: Algorithm,
        rate: u64,
        per: Unit,
        burst: u32,
        action: Action,
    ) -> Limiter {
        let s = Strategy::unconditioned(algorithm, rate, per, burst, action);
        Limiter::from_strategy(&s.expect("valid strategy"))
    }

    pub(super) const REJECT: Action = Action::Reject { status: None };

    pub(super) fn with_slot<R>(f: impl FnOnce(&Slot) -> R) -> R {
        let local = LocalSlots::new(1);
        let region = local.region();
        let slot = Slot::at(&region, 0).unwrap();
        f(&slot)
    }

    pub(super) fn admitted(l: &Limiter, slot: &Slot, now: u64) -> bool {
        l.acquire(slot, now).is_admitted()
    }

    /// Asserts that `n` requests at `now` are all admitted.
    pub(super) fn admit_all(l: &Limiter, slot: &Slot, n: usize, now: u64) {
        for i in 0..n {
            assert!(admitted(l, slot, now), "request {i} of {n} at {now}");
        }
    }

    pub(super) fn retry(l: &Limiter, slot: &Slot, now: u64) -> u64 {
        match l.acquire(slot, now) {
            Acquired::Rejected { retry_after_ns } => retry_after_ns,
            other => panic!("expected a rejection at {now}, got {other:?}"),
        }
    }

    /// Counts admissions of one request every `step` ns in `[from, to)`.
    pub(super) fn drive(
        l: &Limiter,
        slot: &Slot,
        clock: &FakeClock,
        from: u64,
        to: u64,
        step: u64,
    ) -> u64 {
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

    /// Drives one request a millisecond through windows 100..110 (1 s
    /// each) from whatever the slot holds, asserting at most `per_window`
    /// admissions in each, then lets the agent repair it at 110 s.
    pub(super) fn at_most_per_window(
        l: &Limiter,
        slot: &Slot,
        clock: &FakeClock,
        per_window: u64,
        what: &str,
    ) {
        for w in 100..110u64 {
            let n = drive(l, slot, clock, w * S, (w + 1) * S, MS);
            assert!(n <= per_window, "garbage {what}, window {w}: {n}");
        }
        let _ = l.repair_foreign(slot, || 110 * S - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::window::{pack, unpack};
    use super::{q, CONCURRENCY_RETRY_NS};

    impl Quota {
        fn no_window(mut self) -> Quota {
            self.window_ns = 0;
            self
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

    /// Compiled table entries hold a limiter: the variant is the
    /// algorithm (no separate tag), the largest parameters 24 bytes.
    #[test]
    fn a_compiled_limiter_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Limiter>(), 32);
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
    fn quota_reports_remaining_and_reset() {
        with_slot(|slot| {
            let l = limiter(Algorithm::TokenBucket, 10, Unit::Second, 3, REJECT);
            let now = 50 * S;
            assert_eq!(l.quota(slot, now).no_window(), q(3, 3, 0, 0));
            assert!(admitted(&l, slot, now));
            assert_eq!(l.quota(slot, now).no_window(), q(3, 2, 100 * MS, 0));
            admit_all(&l, slot, 2, now);
            assert_eq!(l.quota(slot, now).no_window(), q(3, 0, 300 * MS, 0));
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::FixedWindow, 2, Unit::Minute, 0, REJECT);
            let now = 60 * S + 10 * S;
            assert_eq!(l.quota(slot, now).no_window(), q(2, 2, 50 * S, 0));
            admit_all(&l, slot, 2, now);
            assert_eq!(l.quota(slot, now).no_window(), q(2, 0, 50 * S, 0));
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::SlidingWindow, 4, Unit::Second, 0, REJECT);
            assert_eq!(l.quota(slot, 5 * S).remaining, 4);
            admit_all(&l, slot, 4, 5 * S + 500 * MS);
            assert_eq!(l.quota(slot, 5 * S + 500 * MS), q(4, 0, 1_500 * MS, S));
            // Next window at 6.5 s: floor(4 × 0.5) = 2 used.
            assert_eq!(l.quota(slot, 6 * S + 500 * MS), q(4, 2, 500 * MS, S));
        });
        with_slot(|slot| {
            let l = limiter(Algorithm::Concurrency, 1, Unit::Second, 0, REJECT);
            assert_eq!(l.quota(slot, 0), q(1, 1, 0, 0));
            assert!(admitted(&l, slot, 0));
            assert_eq!(l.quota(slot, 0), q(1, 0, CONCURRENCY_RETRY_NS, 0));
        });
    }
}
