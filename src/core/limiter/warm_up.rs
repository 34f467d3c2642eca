//! `warm_up`: a token bucket that starts slow after a quiet period and
//! reaches its rate over a warm-up period, as Guava's `SmoothWarmingUp`.
//!
//! # The formula
//!
//! `s` = stable interval = period / rate (rounded up), `c` = cold interval =
//! `cold_factor × s`, `W` = warm-up period. As in Guava, the bucket stores
//! *permits* while idle; a stored permit is expensive while many are
//! stored (the service is cold) and cheap when few are:
//!
//! ```text
//!   threshold   = W / (2 s)                      permits
//!   max_permits = threshold + 2 W / (s + c)
//!   cool        = W / max_permits               idle time that stores one permit
//!   interval(p) = s                                           p ≤ threshold
//!               = s + (c − s) × (p − threshold) / (max_permits − threshold)
//! ```
//!
//! Taking one permit when `p` are stored costs `∫ interval` over the permit
//! taken (`p − 1 … p`; a fraction below one permit costs `s` for the rest);
//! the next request is admitted that long after this one. Idle time stores
//! permits back at one per `cool`, up to `max_permits`, which is where a new
//! or long-idle strategy starts (**cold**: the next interval is `c`). Going
//! from `max_permits` down to `threshold` under saturation takes exactly
//! `W` (the area of the trapezoid), so a saturated strategy's interval
//! falls linearly in the permits it has used, from `c` to `s`, in `W`; in
//! time, `interval(t) = √(c² − (c² − s²) × t / W)` and the admissions by
//! `t` are `2 W (c − interval(t)) / (c² − s²)` (half the rate on average
//! over `W`); the README has a table.
//!
//! # State: two words, one 128-bit CAS
//!
//! `state0` = the time the next request may go (`next_free`, ns), `state1` =
//! the stored permits as idle time, `D = permits × cool` in ns (0 ≤ D ≤ W),
//! so that idle time adds to it one for one. Both words change together in
//! one 16-byte compare-and-swap (`lock cmpxchg16b`; the slot is 64-byte
//! aligned), no lock. A new slot (both 0) at `now ≥ W` is cold.
//!
//! A request at `now`: if `now ≥ next_free + s` (idle for at least one
//! interval), `D = min(W, D + now − next_free)` and `next_free = now`, as
//! Guava's resync. A request less than one interval late (nginx's clock
//! moves in ticks of up to 4 ms; a client is never exactly on time) is
//! taken as on time: `next_free` stays, nothing is stored — otherwise every
//! tick of lateness would count as idleness and a saturated strategy would
//! warm up far slower than `W` (measured: half the speed with 4 ms ticks).
//! It is admitted when `next_free − now ≤ max_delay` (0 unless the action
//! is `delay`, which then waits `next_free − now`); `next_free` grows by
//! the cost of one permit (rounded **up** to a nanosecond) and `D` loses
//! one permit's worth. Admissions by any time `T` stay within one interval
//! of the rate: `next_free` grows by at least `s` per admission. A rejection reads only
//! `state0` (one atomic load): `retry_after = next_free − now − max_delay`.
//!
//! Where 16-byte CAS is not available (not x86_64, a CPU without
//! `cmpxchg16b`, which no x86_64 server of the last 15 years lacks),
//! `warm_up` is a leaky bucket at the stable rate on `state0`: never more
//! than the rate, no warm-up.
//!
//! A `next_free` ahead of `now` is waited out whatever the distance (a
//! stale reading never rewinds it, so it never admits extra); `D > W` is
//! read as `W`. State no clock could have written (`next_free` beyond a
//! fresh `now + c + max_delay` by more than [`MAX_STALENESS_NS`]) is
//! replaced by the agent ([`repair_foreign`]) with the most restrictive
//! legitimate state: a full queue and a cold bucket.
//!
//! Refund: if the words still hold what the acquire wrote, `next_free` goes
//! back to what it was and `D` gets one permit back (at most `W`); otherwise
//! `next_free` goes back by the cost (saturating) and `D` gets one permit
//! back. Giving back a whole permit when the acquire took a fraction of one
//! leaves the bucket slightly colder: never more admissions.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Acquired, Quota, Reservation, MAX_STALENESS_NS};
use crate::core::shm::slot::Slot;

/// Compiled `warm_up` parameters. 24 bytes, like the GCRA parameters, so
/// that the limiter enum (and every compiled table entry) does not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmUpParams {
    /// Stable interval `s`, ns.
    pub stable: u64,
    /// Longest wait of the `delay` action (0 otherwise), ns.
    pub max_delay: u64,
    /// Warm-up period `W`, ms.
    period_ms: u32,
    cold_factor: u8,
}

/// The derived quantities of [`WarmUpParams`], in D-space (ns of idle time).
#[derive(Debug, Clone, Copy)]
struct Curve {
    s: f64,
    /// Idle time per stored permit.
    cool: f64,
    /// `D` at the threshold.
    d_thr: f64,
    /// Slope of the interval above the threshold, per ns of `D`.
    m: f64,
    w: f64,
}

impl WarmUpParams {
    pub fn new(stable: u64, cold_factor: u8, period_ms: u32, max_delay: u64) -> WarmUpParams {
        WarmUpParams {
            stable: stable.clamp(1, u64::MAX / 64),
            max_delay: max_delay.min(u64::MAX / 4),
            period_ms: period_ms.max(1),
            cold_factor: cold_factor.max(1),
        }
    }

    /// Cold interval `c = cold_factor × s`, ns.
    pub fn cold(&self) -> u64 {
        self.stable.saturating_mul(self.cold_factor as u64)
    }

    /// Warm-up period `W` (also the largest `D`), ns.
    pub fn period(&self) -> u64 {
        self.period_ms as u64 * 1_000_000
    }

    fn curve(&self) -> Curve {
        let s = self.stable as f64;
        let c = (self.cold() as f64).max(s);
        let w = self.period() as f64;
        let threshold = w / (2.0 * s);
        let max_permits = threshold + 2.0 * w / (s + c);
        let cool = w / max_permits;
        let d_thr = threshold * cool;
        let m = (c - s) / (w - d_thr).max(1.0);
        Curve {
            s,
            cool,
            d_thr,
            m,
            w,
        }
    }

    /// `max_permits` (for documentation and tests).
    pub fn max_permits(&self) -> f64 {
        let c = self.curve();
        c.w / c.cool
    }

    fn horizon(&self) -> u64 {
        self.cold().saturating_add(self.max_delay)
    }
}

impl Curve {
    /// `∫_0^x interval` in D-space (ns × ns).
    fn area(&self, x: f64) -> f64 {
        let above = (x - self.d_thr).max(0.0);
        self.s * x + self.m / 2.0 * above * above
    }

    /// Cost in ns of one permit when `d` ns of idle time are stored, and
    /// the `D` taken from the store.
    fn cost(&self, d: u64) -> (u64, u64) {
        let df = (d as f64).min(self.w);
        let taken = df.min(self.cool);
        let stored_part = (self.area(df) - self.area(df - taken)) / self.cool;
        let fresh = (1.0 - taken / self.cool).max(0.0) * self.s;
        let cost = (stored_part + fresh).ceil();
        // Never cheaper than the stable interval (rounding), never absurd.
        let cost = if cost.is_finite() {
            cost as u64
        } else {
            u64::MAX / 4
        };
        (cost.max(self.s as u64), (taken.ceil() as u64).min(d))
    }
}

/// Tries to admit one request at `now` (see the module documentation).
#[inline(never)]
pub fn acquire(p: &WarmUpParams, slot: &Slot, now: u64) -> Acquired {
    let words = [slot.state0(), slot.state1()];
    if !cas128_available(words[0]) {
        return leaky_fallback(p, words[0], now);
    }
    let curve = p.curve();
    let mut cur = [
        words[0].load(Ordering::Acquire),
        words[1].load(Ordering::Acquire),
    ];
    loop {
        // A `next_free` ahead of `now` (however far: a stale reading, or
        // foreign state the agent has yet to repair) is waited out, never
        // rewound (issue 11, item 5).
        let (mut nf, mut d) = (cur[0], cur[1].min(p.period()));
        if now >= nf.saturating_add(p.stable) {
            // Idle for at least one interval: store permits, start from now.
            d = d.saturating_add(now - nf).min(p.period());
            nf = now;
        }
        // Less late than one interval: a coarse clock (nginx's moves in
        // ticks of up to 4 ms) or a slow client, not idleness; the next
        // admission is spaced from `next_free`, not from `now`, so
        // lateness neither cools the bucket nor costs capacity.
        let wait = nf.saturating_sub(now);
        if wait > p.max_delay {
            return Acquired::Rejected {
                retry_after_ns: wait - p.max_delay,
            };
        }
        let (cost, taken) = curve.cost(d);
        let next = [nf.saturating_add(cost), d - taken];
        match cas128(words[0], cur, next) {
            Ok(()) => {
                return Acquired::Admitted(Reservation::raw(wait, next[0], nf));
            }
            Err(actual) => cur = actual,
        }
    }
}

/// Replaces state no clock could have written with a full queue and a cold
/// bucket; `true` when it did. For the agent only: `clock` is fresh and read
/// after the words (see [`super`], stale and foreign state).
pub fn repair_foreign(p: &WarmUpParams, slot: &Slot, clock: impl FnOnce() -> u64) -> bool {
    let words = [slot.state0(), slot.state1()];
    let cur = [
        words[0].load(Ordering::SeqCst),
        words[1].load(Ordering::SeqCst),
    ];
    let now = clock();
    let limit = now
        .saturating_add(p.horizon())
        .saturating_add(MAX_STALENESS_NS);
    if cur[0] <= limit {
        return false;
    }
    let full = now.saturating_add(p.max_delay);
    if !cas128_available(words[0]) {
        return words[0]
            .compare_exchange(cur[0], full, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    }
    cas128(words[0], cur, [full, p.period()]).is_ok()
}

/// Gives back one request admitted by [`acquire`].
pub fn refund(p: &WarmUpParams, slot: &Slot, r: Reservation) {
    let words = [slot.state0(), slot.state1()];
    let (token, prev) = r.raw_words();
    if !cas128_available(words[0]) {
        leaky_refund(words[0], token, prev, p.stable);
        return;
    }
    let cost = token.saturating_sub(prev);
    let permit = p.curve().cool.ceil() as u64;
    let mut cur = [
        words[0].load(Ordering::Acquire),
        words[1].load(Ordering::Acquire),
    ];
    loop {
        let nf = if cur[0] == token {
            prev
        } else {
            cur[0].saturating_sub(cost)
        };
        let d = cur[1].saturating_add(permit).min(p.period());
        match cas128(words[0], cur, [nf, d]) {
            Ok(()) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// Quota for the response headers: like a leaky bucket (limit 1).
pub fn quota(_p: &WarmUpParams, slot: &Slot, now: u64) -> Quota {
    let nf = slot.state0().load(Ordering::Acquire);
    let remaining = u64::from(nf <= now);
    Quota::new(1, remaining, nf.saturating_sub(now))
}

/// The interval a saturated request stream sees right now (ns): the cost
/// of the next permit. For tests and `shm inspect`-like tools.
pub fn current_interval(p: &WarmUpParams, slot: &Slot, now: u64) -> u64 {
    let nf = slot.state0().load(Ordering::Acquire);
    let mut d = slot.state1().load(Ordering::Acquire).min(p.period());
    if now >= nf.saturating_add(p.stable) {
        d = d.saturating_add(now - nf).min(p.period());
    }
    p.curve().cost(d).0
}

fn leaky_fallback(p: &WarmUpParams, w: &AtomicU64, now: u64) -> Acquired {
    let mut nf = w.load(Ordering::Acquire);
    loop {
        let base = nf.max(now);
        let wait = base - now;
        if wait > p.max_delay {
            return Acquired::Rejected {
                retry_after_ns: wait - p.max_delay,
            };
        }
        let next = base.saturating_add(p.stable);
        match w.compare_exchange_weak(nf, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Acquired::Admitted(Reservation::raw(wait, next, base)),
            Err(actual) => nf = actual,
        }
    }
}

fn leaky_refund(w: &AtomicU64, token: u64, prev: u64, stable: u64) {
    let mut cur = w.load(Ordering::Acquire);
    loop {
        let back = if cur == token {
            prev
        } else {
            cur.saturating_sub(stable)
        };
        match w.compare_exchange_weak(cur, back, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// Can the pair of words starting at `w` be swapped in one 16-byte CAS?
#[inline]
pub(crate) fn cas128_available(w: &AtomicU64) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (w.as_ptr() as usize) % 16 == 0 && std::arch::is_x86_feature_detected!("cmpxchg16b")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        false
    }
}

/// Compare-and-swap of the two words at `w` (and the next word) as one
/// 16-byte unit, sequentially consistent. `Err` carries the current value.
/// Callers check [`cas128_available`] first.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn cas128(w: &AtomicU64, old: [u64; 2], new: [u64; 2]) -> Result<(), [u64; 2]> {
    debug_assert!(cas128_available(w));
    let dst = w.as_ptr();
    let (prev_lo, prev_hi, ok_word): (u64, u64, u64);
    // SAFETY: `dst` points to two consecutive AtomicU64 (state0, state1 of
    // one stat slot: a `Slot` borrows all eight words of its slot; or the
    // ident and word of a key table entry, one `[AtomicU64; 2]`; so the
    // second word is in bounds) and is 16-byte aligned and the CPU has
    // cmpxchg16b (both checked by `cas128_available`). The memory is only
    // ever accessed atomically (see `Region`), and `lock cmpxchg16b` is an
    // atomic read-modify-write, so this is no data race. rbx cannot be named
    // as an operand (LLVM may reserve it), so the low new word goes in
    // another register and is swapped into rbx around the instruction, and
    // rbx is restored before the block ends; `dst` is pinned to rdi so it
    // can never be rbx. The result goes to cl (rcx is free once the
    // instruction has read it), never to a register the compiler picks:
    // it could pick bl, which restoring rbx overwrites — a failed swap
    // then read as done, or a done one as failed and charged again.
    unsafe {
        std::arch::asm!(
            "xchg {tmp}, rbx",
            "lock cmpxchg16b xmmword ptr [rdi]",
            "sete cl",
            "mov rbx, {tmp}",
            in("rdi") dst,
            tmp = inout(reg) new[0] => _,
            inout("rax") old[0] => prev_lo,
            inout("rdx") old[1] => prev_hi,
            inout("rcx") new[1] => ok_word,
            options(nostack),
        );
    }
    let ok = ok_word as u8;
    if ok != 0 {
        Ok(())
    } else {
        Err([prev_lo, prev_hi])
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn cas128(_w: &AtomicU64, old: [u64; 2], _new: [u64; 2]) -> Result<(), [u64; 2]> {
    // Unreachable: `cas128_available` is false here.
    Err(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limiter::Limiter;
    use crate::core::model::{Action, Algorithm, Strategy, Unit, WarmUp};
    use crate::core::shm::slot::LocalSlots;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn warm_up(rate: u64, period_ms: u32, cold_factor: u8, action: Action) -> Limiter {
        let mut s =
            Strategy::unconditioned(Algorithm::TokenBucket, rate, Unit::Second, 1, action).unwrap();
        s.algorithm = Algorithm::WarmUp;
        s.warm_up = WarmUp {
            period_ms,
            cold_factor,
        };
        s.validate().unwrap();
        Limiter::from_strategy(&s)
    }

    const REJECT: Action = Action::Reject { status: None };

    /// Guava's SmoothWarmingUp written out in permits and seconds (f64),
    /// independently of the implementation: `try_acquire` at `now`.
    struct Reference {
        stable: f64,
        threshold: f64,
        max: f64,
        slope: f64,
        cool: f64,
        stored: f64,
        next_free: f64,
    }

    impl Reference {
        fn new(rate: f64, warm_up_s: f64, cold_factor: f64) -> Reference {
            let stable = 1.0 / rate;
            let cold = stable * cold_factor;
            let threshold = 0.5 * warm_up_s / stable;
            let max = threshold + 2.0 * warm_up_s / (stable + cold);
            Reference {
                stable,
                threshold,
                max,
                slope: (cold - stable) / (max - threshold),
                cool: warm_up_s / max,
                stored: max,
                next_free: 0.0,
            }
        }

        fn permits_to_time(&self, permits: f64) -> f64 {
            self.stable + permits * self.slope
        }

        /// Time to take `k` stored permits out of `stored`.
        fn wait_for_stored(&self, stored: f64, k: f64) -> f64 {
            let above = stored - self.threshold;
            let mut k = k;
            let mut micros = 0.0;
            if above > 0.0 {
                let take_above = above.min(k);
                let len = self.permits_to_time(above) + self.permits_to_time(above - take_above);
                micros = take_above * len / 2.0;
                k -= take_above;
            }
            micros + self.stable * k
        }

        fn try_acquire(&mut self, now: f64) -> bool {
            if now > self.next_free {
                self.stored = (self.stored + (now - self.next_free) / self.cool).min(self.max);
                self.next_free = now;
            }
            if self.next_free > now {
                return false;
            }
            let from_stored = self.stored.min(1.0);
            let fresh = 1.0 - from_stored;
            let wait = self.wait_for_stored(self.stored, from_stored) + fresh * self.stable;
            self.next_free += wait;
            self.stored -= from_stored;
            true
        }
    }

    fn with_slot<R>(f: impl FnOnce(&Slot) -> R) -> R {
        let local = LocalSlots::new(1);
        let region = local.region();
        let slot = Slot::at(&region, 0).unwrap();
        f(&slot)
    }

    /// Admissions per `bucket` of a client sending every `step` from `from`.
    fn counts(l: &Limiter, slot: &Slot, from: u64, steps: u64, step: u64, per: u64) -> Vec<u64> {
        let mut out = vec![0u64; (steps / per) as usize];
        for i in 0..steps {
            if l.acquire(slot, from + i * step).is_admitted() {
                out[(i / per) as usize] += 1;
            }
        }
        out
    }

    #[test]
    fn saturated_from_cold_matches_guava_within_one_per_100ms() {
        // 100/s, warm-up 10 s, cold factor 3; a client every 20 µs for 12 s
        // (so that neither side loses more than 20 µs per admission to
        // polling), both from cold.
        let l = warm_up(100, 10_000, 3, REJECT);
        let start = 3_600 * S; // long after boot: a new slot is cold
        let step = 20_000;
        let steps = 12 * S / step;
        let per = 100 * MS / step;
        with_slot(|slot| {
            let ours = counts(&l, slot, start, steps, step, per);
            let mut r = Reference::new(100.0, 10.0, 3.0);
            r.next_free = 3_600.0;
            let mut theirs = vec![0u64; 120];
            for i in 0..steps {
                if r.try_acquire(3_600.0 + (i * step) as f64 / 1e9) {
                    theirs[(i / per) as usize] += 1;
                }
            }
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    a.abs_diff(*b) <= 1,
                    "step {i}: ours {a}, Guava {b}\n{ours:?}\n{theirs:?}"
                );
            }
            // The shape: about a third of the rate at first, the full rate
            // from the end of the warm-up.
            assert!((3..=5).contains(&ours[0]), "{ours:?}");
            assert!(ours[101..].iter().all(|&n| n == 10), "{ours:?}");
            // The closed form: 2 W (c − √(c² − (c² − s²) t / W)) / (c² − s²)
            // = 34.1 by 1 s and 500 by W (half the rate on average), plus
            // the first request, which goes at once.
            let first_s: u64 = ours[..10].iter().sum();
            assert!((34..=36).contains(&first_s), "{first_s}");
            let warm: u64 = ours[..100].iter().sum();
            assert!((499..=502).contains(&warm), "{warm}");
        });
    }

    #[test]
    fn a_coarse_clock_warms_up_in_the_warm_up_period() {
        // nginx's clock moves in ticks of up to 4 ms (CLOCK_MONOTONIC_COARSE)
        // and a client polls every ~0.5 ms: lateness within an interval is
        // not idleness, so the ramp still takes W (2 s here).
        let l = warm_up(100, 2_000, 3, REJECT);
        with_slot(|slot| {
            let t0 = 3_600 * S;
            let mut per_200ms = [0u64; 18];
            let mut t = 0;
            while t < 3_600 * MS {
                let now = t0 + t / (4 * MS) * (4 * MS);
                if l.acquire(slot, now).is_admitted() {
                    per_200ms[(t / (200 * MS)) as usize] += 1;
                }
                t += 476_000;
            }
            assert!((6..=8).contains(&per_200ms[0]), "{per_200ms:?}");
            assert!(per_200ms[11..].iter().all(|&n| n == 20), "{per_200ms:?}");
        });
    }

    #[test]
    fn idle_refills_to_cold_and_busy_stays_warm() {
        let l = warm_up(100, 2_000, 3, REJECT);
        let t0 = 3_600 * S;
        with_slot(|slot| {
            let cold = counts(&l, slot, t0, 200, MS, 200)[0];
            // Saturate until warm.
            counts(&l, slot, t0 + 200 * MS, 3_000, MS, 3_000);
            let t1 = t0 + 3_200 * MS;
            // Busy at 90 % of the rate for 10 s: stays warm.
            for i in 0..90u64 * 10 {
                let _ = l.acquire(slot, t1 + i * (S / 90));
            }
            let t2 = t1 + 10 * S;
            let warm = counts(&l, slot, t2, 200, MS, 200)[0];
            assert!(warm >= 19, "busy strategy got colder: {warm} in 200 ms");
            // Idle for the warm-up period: cold again.
            let t3 = t2 + 200 * MS + 2 * S;
            let again = counts(&l, slot, t3, 200, MS, 200)[0];
            assert_eq!(again, cold, "after idling W the bucket is cold");
            assert!(cold <= 8, "{cold}");
            // Three quarters of the idle time: somewhere in between (half
            // of it only refills up to the threshold: still warm).
            counts(&l, slot, t3 + 200 * MS, 3_000, MS, 3_000);
            let t4 = t3 + 3_200 * MS + 1_500 * MS;
            let half = counts(&l, slot, t4, 200, MS, 200)[0];
            assert!(half > cold && half < warm, "{cold} < {half} < {warm}");
        });
    }

    #[test]
    fn delay_queues_with_the_cold_intervals_and_refund_restores() {
        let l = warm_up(
            10,
            10_000,
            3,
            Action::Delay {
                max_delay_ms: 1_000,
            },
        );
        with_slot(|slot| {
            let now = 3_600 * S;
            let mut waits = vec![];
            loop {
                match l.acquire(slot, now) {
                    Acquired::Admitted(r) => waits.push(r.wait_ns),
                    Acquired::Rejected { retry_after_ns } => {
                        assert!(retry_after_ns > 0);
                        break;
                    }
                }
            }
            // Cold: 300 ms apart (a little less as permits are used).
            assert_eq!(waits.len(), 4, "{waits:?}");
            assert_eq!(waits[0], 0);
            assert!(waits[1] > 290 * MS && waits[1] <= 300 * MS, "{waits:?}");
            assert!(waits[3] <= 1_000 * MS);
            // Refund of an admission that nothing followed: exact.
            let before = [
                slot.state0().load(Ordering::Relaxed),
                slot.state1().load(Ordering::Relaxed),
            ];
            let later = now + 5 * S;
            let Acquired::Admitted(r) = l.acquire(slot, later) else {
                panic!()
            };
            l.refund(slot, r);
            let nf = slot.state0().load(Ordering::Relaxed);
            assert!(nf == later || nf == before[0].max(later));
            assert!(slot.state1().load(Ordering::Relaxed) <= 10_000 * MS);
        });
    }

    #[test]
    fn cas128_swaps_both_words_or_neither() {
        with_slot(|slot| {
            let w = slot.state0();
            assert!(cas128_available(w), "slots are 64-byte aligned");
            assert_eq!(cas128(w, [0, 0], [1, 2]), Ok(()));
            assert_eq!(cas128(w, [0, 0], [5, 5]), Err([1, 2]));
            assert_eq!(cas128(w, [1, 3], [5, 5]), Err([1, 2]));
            assert_eq!(slot.state1().load(Ordering::Relaxed), 2);
        });
    }

    /// Issue 11, item 5: a worker 61 s or 600 s stale, after a fresh one
    /// took what there was, admits nothing, and leaves nothing extra for
    /// the fresh one.
    #[test]
    fn a_stale_worker_admits_nothing_extra() {
        for stale in [61 * S, 600 * S] {
            let l = warm_up(100, 1_000, 3, REJECT);
            with_slot(|slot| {
                let t = 1_000_000 * S;
                let mut fresh = 0;
                while l.acquire(slot, t).is_admitted() {
                    fresh += 1;
                    assert!(fresh <= 100);
                }
                let mut extra = 0;
                for i in 0..100 {
                    extra += u32::from(l.acquire(slot, t - stale + i * MS).is_admitted());
                }
                assert!(!l.repair_foreign(slot, || t));
                for _ in 0..100 {
                    extra += u32::from(l.acquire(slot, t).is_admitted());
                }
                assert_eq!(extra, 0, "{} s stale", stale / S);
            });
        }
    }

    #[test]
    fn foreign_state_is_read_as_cold_and_full() {
        let l = warm_up(100, 1_000, 3, REJECT);
        with_slot(|slot| {
            let now = 100 * S;
            slot.state0().store(u64::MAX - 5, Ordering::Relaxed);
            slot.state1().store(u64::MAX, Ordering::Relaxed);
            // The request path waits it out, never rewinds it...
            assert!(!l.acquire(slot, now).is_admitted());
            // ...the agent (fresh clock) replaces it: a full queue (0
            // here) and a cold bucket, admitted now at the cold interval.
            assert!(l.repair_foreign(slot, || now));
            assert!(!l.repair_foreign(slot, || now));
            assert!(l.acquire(slot, now).is_admitted());
            assert!(!l.acquire(slot, now + 29 * MS).is_admitted());
            assert!(l.acquire(slot, now + 30 * MS).is_admitted());
        });
    }
}
