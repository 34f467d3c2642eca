//! Real processes, not threads: forked children hammer slots that live in a
//! `MAP_SHARED | MAP_ANONYMOUS` mapping, as nginx workers do with the
//! shared-memory file. No update may be lost or doubled.
//!
//! Children only touch atomics and call async-signal-safe libc functions
//! (`clock_gettime`, `_exit`): the test harness is multi-threaded, and a
//! forked child must not allocate. Every run is bounded: the parent kills
//! children that outlive a deadline and fails.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rate_ctl::core::admit::{admit, release, Hit, Verdict};
use rate_ctl::core::clock::MonotonicClock;
use rate_ctl::core::limiter::Limiter;
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::region::Region;
use rate_ctl::core::shm::slot::Slot;

const S: u64 = 1_000_000_000;
const CHILDREN: usize = 4;
const HAMMER_NS: u64 = 2 * S;
/// Results area: per child, per slot, `RESULT_WORDS` words.
const RESULTS_OFF: usize = 4096;
const RESULT_WORDS: usize = 8;
const MAX_SLOTS: usize = 8;
const CLOCK_OFF: usize = MAX_SLOTS * 64;
const INSIDE_OFF: usize = CLOCK_OFF + 8;
const MAX_INSIDE_OFF: usize = CLOCK_OFF + 16;
const MAP_LEN: usize = RESULTS_OFF + CHILDREN * MAX_SLOTS * RESULT_WORDS * 8;

// Result words.
const R_ATTEMPTS: usize = 0;
const R_ADMITTED: usize = 1;
const R_FIRST_ADMIT: usize = 2;
const R_LAST_ADMIT: usize = 3;
const R_LAST_REJECT: usize = 4;

/// The runs are CPU-bound; one at a time keeps them meaningful on a small
/// machine.
static SERIAL: Mutex<()> = Mutex::new(());

struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

impl SharedMap {
    fn new(len: usize) -> SharedMap {
        // SAFETY: a fresh anonymous shared mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap failed");
        SharedMap {
            ptr: ptr as *mut u8,
            len,
        }
    }

    fn region(&self) -> Region<'_> {
        // SAFETY: page-aligned, valid for `len` bytes while `self` lives, and
        // only ever accessed through atomics (by us and by the children).
        unsafe { Region::from_raw(self.ptr, self.len) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; no references outlive `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

fn word<'a>(r: &Region<'a>, off: usize) -> &'a AtomicU64 {
    r.u64_at(off).expect("offset inside the mapping")
}

fn result<'a>(r: &Region<'a>, child: usize, slot: usize, w: usize) -> &'a AtomicU64 {
    word(
        r,
        RESULTS_OFF + ((child * MAX_SLOTS + slot) * RESULT_WORDS + w) * 8,
    )
}

/// Forks `CHILDREN` processes running `body(child_index)`, waits for all of
/// them (killing them after `limit`), and asserts they exited with 0.
fn run_children(limit: Duration, body: impl Fn(usize)) {
    let mut pids = Vec::with_capacity(CHILDREN);
    for i in 0..CHILDREN {
        // SAFETY: the child only runs `body` (atomics and libc calls, no
        // allocation) and leaves with `_exit`, never returning into the
        // test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match std::panic::catch_unwind(AssertUnwindSafe(|| body(i))) {
                Ok(()) => 0,
                Err(_) => 101,
            };
            // SAFETY: ends the child without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        pids.push(pid);
    }
    let deadline = Instant::now() + limit;
    let mut statuses = vec![None; CHILDREN];
    while statuses.iter().any(Option::is_none) {
        for (pid, st) in pids.iter().zip(statuses.iter_mut()) {
            if st.is_some() {
                continue;
            }
            let mut status = 0;
            // SAFETY: reaping our own child.
            let r = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
            if r == *pid {
                *st = Some(status);
            }
        }
        if Instant::now() > deadline {
            for (pid, st) in pids.iter().zip(&statuses) {
                if st.is_none() {
                    // SAFETY: killing and reaping our own child by its pid.
                    unsafe {
                        libc::kill(*pid, libc::SIGKILL);
                        libc::waitpid(*pid, std::ptr::null_mut(), 0);
                    }
                }
            }
            panic!("children still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, st) in statuses.iter().enumerate() {
        let st = st.unwrap();
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "child {i} failed: status {st:#x}"
        );
    }
}

fn strategy(algorithm: Algorithm, rate: u64, per: Unit, burst: u32) -> Strategy {
    let reject = Action::Reject { status: None };
    Strategy::unconditioned(algorithm, rate, per, burst, reject).expect("valid strategy")
}

fn hit<'a>(region: &Region<'a>, index: u32, limiter: &'a Limiter) -> Hit<'a> {
    let slot = Slot::at(region, index).unwrap();
    slot.generation().store(7, Ordering::Release);
    Hit {
        id: index + 1,
        limiter,
        action: Action::Reject { status: None },
        slot,
        generation: 7,
        units: 1,
        check: false,
    }
}

/// One hit per limiter, in slots 0, 1, …
fn hits<'a>(region: &Region<'a>, limiters: &'a [Limiter]) -> Vec<Hit<'a>> {
    limiters
        .iter()
        .enumerate()
        .map(|(i, l)| hit(region, i as u32, l))
        .collect()
}

/// After the children are gone: `hit`'s first state word is `state0`
/// (`what` names it), and its counters show `admitted` of `attempts` passed
/// and the rest limited.
fn assert_slot_end(hit: &Hit, state0: u64, what: &str, admitted: u64, attempts: u64) {
    assert_eq!(hit.slot.state0().load(Ordering::SeqCst), state0, "{what}");
    let c = hit.slot.counters();
    assert_eq!((c.passed, c.limited), (admitted, attempts - admitted));
}

fn sum(r: &Region, slot: usize, w: usize) -> u64 {
    (0..CHILDREN)
        .map(|c| result(r, c, slot, w).load(Ordering::Relaxed))
        .sum()
}

/// A frozen shared clock: every algorithm must admit exactly its allowance,
/// however the four processes interleave.
#[test]
fn frozen_clock_every_algorithm_admits_exactly_its_allowance() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let map = SharedMap::new(MAP_LEN);
    let r = map.region();
    let now = 10 * 3600 * S + 1_800 * S; // half way through an hour window
    word(&r, CLOCK_OFF).store(now, Ordering::Release);
    let limiters = [
        Limiter::from_strategy(&strategy(Algorithm::FixedWindow, 150_000, Unit::Hour, 0)),
        Limiter::from_strategy(&strategy(Algorithm::SlidingWindow, 120_000, Unit::Hour, 0)),
        Limiter::from_strategy(&strategy(Algorithm::TokenBucket, 1, Unit::Second, 100_000)),
        Limiter::from_strategy(&strategy(Algorithm::LeakyBucket, 1, Unit::Second, 1)),
        Limiter::from_strategy(&strategy(Algorithm::Concurrency, 50_000, Unit::Second, 0)),
    ];
    let allowance = [150_000u64, 120_000, 100_000, 1, 50_000];
    let hits = hits(&r, &limiters);
    let end = MonotonicClock::now() + HAMMER_NS;

    run_children(Duration::from_secs(60), |child| {
        let clock = word(&r, CLOCK_OFF);
        let mut attempts = [0u64; 5];
        let mut admitted = [0u64; 5];
        while MonotonicClock::now() < end {
            for _ in 0..32 {
                let now = clock.load(Ordering::Acquire);
                for (i, h) in hits.iter().enumerate() {
                    attempts[i] += 1;
                    if admit(std::slice::from_ref(h), now, false).verdict == Verdict::Pass {
                        admitted[i] += 1;
                    }
                }
            }
        }
        for i in 0..5 {
            result(&r, child, i, R_ATTEMPTS).store(attempts[i], Ordering::Relaxed);
            result(&r, child, i, R_ADMITTED).store(admitted[i], Ordering::Relaxed);
        }
    });

    for (i, h) in hits.iter().enumerate() {
        let attempts = sum(&r, i, R_ATTEMPTS);
        let admitted = sum(&r, i, R_ADMITTED);
        let alg = limiters[i].algorithm();
        assert!(
            attempts > allowance[i] + 10_000,
            "{alg}: only {attempts} attempts, the slot was not saturated"
        );
        assert_eq!(admitted, allowance[i], "{alg}: admitted");
        let c = h.slot.counters();
        assert_eq!(c.passed, allowance[i], "{alg}: passed counter");
        assert_eq!(c.limited, attempts - allowance[i], "{alg}: limited counter");
    }
    let state = |i: usize| hits[i].slot.state0().load(Ordering::Relaxed);
    let window = 10u64;
    assert_eq!(state(0), window << 32 | 150_000);
    assert_eq!(
        hits[1].slot.state0().load(Ordering::Relaxed),
        window << 32 | 120_000
    );
    assert_eq!(state(2), now + 100_000 * S);
    assert_eq!(state(3), now + S);
    assert_eq!(state(4), 50_000);
}

/// A real clock: GCRA admits `burst + elapsed / T` (to within one), where
/// elapsed runs from the first admission to the last admission (upper
/// bound) or the last rejection (lower bound). The parent takes the whole
/// burst at `t0` before forking, so the start is known exactly and the
/// bucket is empty when the children start (a full bucket would refill
/// over its cap while they are being forked). The final TAT must be
/// exactly `t0 + n × T`: no update lost or doubled.
#[test]
fn real_clock_gcra_admits_burst_plus_rate_times_elapsed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let map = SharedMap::new(MAP_LEN);
    let r = map.region();
    // 100,000 a second, burst 50,000: tau = 0.5 s, so a scheduling pause of
    // all four processes shorter than that loses nothing.
    let s = strategy(Algorithm::TokenBucket, 100_000, Unit::Second, 50_000);
    let t = s.interval_ns();
    let limiter = Limiter::from_strategy(&s);
    let hits = [hit(&r, 0, &limiter)];
    let t0 = MonotonicClock::now();
    for _ in 0..50_000 {
        assert_eq!(admit(&hits, t0, false).verdict, Verdict::Pass);
    }
    assert!(matches!(
        admit(&hits, t0, false).verdict,
        Verdict::Reject { .. }
    ));
    let end = t0 + HAMMER_NS;

    run_children(Duration::from_secs(60), |child| {
        let (mut attempts, mut admitted) = (0u64, 0u64);
        let (mut first_admit, mut last_admit, mut last_reject) = (u64::MAX, 0u64, 0u64);
        loop {
            let now = MonotonicClock::now();
            if now >= end {
                break;
            }
            attempts += 1;
            if admit(&hits, now, false).verdict == Verdict::Pass {
                admitted += 1;
                first_admit = first_admit.min(now);
                last_admit = now;
            } else {
                last_reject = now;
            }
        }
        result(&r, child, 0, R_ATTEMPTS).store(attempts, Ordering::Relaxed);
        result(&r, child, 0, R_ADMITTED).store(admitted, Ordering::Relaxed);
        result(&r, child, 0, R_FIRST_ADMIT).store(first_admit, Ordering::Relaxed);
        result(&r, child, 0, R_LAST_ADMIT).store(last_admit, Ordering::Relaxed);
        result(&r, child, 0, R_LAST_REJECT).store(last_reject, Ordering::Relaxed);
    });

    let per_child =
        |w: usize| (0..CHILDREN).map(move |c| result(&r, c, 0, w).load(Ordering::Relaxed));
    let admitted = 50_000 + sum(&r, 0, R_ADMITTED);
    let attempts = 50_001 + sum(&r, 0, R_ATTEMPTS);
    let first = t0;
    assert!(per_child(R_FIRST_ADMIT).all(|f| f > t0));
    let last_admit = per_child(R_LAST_ADMIT).max().unwrap();
    let last_reject = per_child(R_LAST_REJECT).max().unwrap();
    assert!(
        last_reject > 0,
        "never rejected: the bucket was not saturated"
    );
    // Each admission moves the TAT by T and needs TAT ≤ now + tau.
    let upper = 50_000 + (last_admit - first) / t;
    // Continuous hammering keeps the bucket empty: by the last rejection
    // the TAT had to be past now + tau − T.
    let lower = 50_000 + (last_reject - first) / t - 1;
    println!(
        "real clock: {admitted} admitted of {attempts} attempts, bounds {lower}..={upper}, {} ms",
        (last_admit - t0) / 1_000_000
    );
    assert!(
        (lower..=upper).contains(&admitted),
        "admitted {admitted}, expected {lower}..={upper} ({attempts} attempts)"
    );
    assert!(upper - 50_000 >= 150_000, "ran for less than 1.5 s of rate");
    assert_slot_end(&hits[0], t0 + admitted * t, "final TAT", admitted, attempts);
}

/// Three strategies, the last one rejects: the others' counters and state
/// show only the requests that passed (reserve, then refund).
#[test]
fn a_rejecting_strategy_leaves_the_others_counting_only_admitted_requests() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let map = SharedMap::new(MAP_LEN);
    let r = map.region();
    let now = 5 * 3600 * S + 60 * S;
    word(&r, CLOCK_OFF).store(now, Ordering::Release);
    let limiters = [
        Limiter::from_strategy(&strategy(
            Algorithm::TokenBucket,
            1,
            Unit::Second,
            1_000_000,
        )),
        Limiter::from_strategy(&strategy(Algorithm::FixedWindow, 4_000_000, Unit::Hour, 0)),
        Limiter::from_strategy(&strategy(Algorithm::SlidingWindow, 100_000, Unit::Hour, 0)),
    ];
    let hits = hits(&r, &limiters);
    let end = MonotonicClock::now() + HAMMER_NS;

    run_children(Duration::from_secs(60), |child| {
        let clock = word(&r, CLOCK_OFF);
        let (mut attempts, mut admitted) = (0u64, 0u64);
        while MonotonicClock::now() < end {
            for _ in 0..32 {
                attempts += 1;
                match admit(&hits, clock.load(Ordering::Acquire), false).verdict {
                    Verdict::Pass => admitted += 1,
                    Verdict::Reject { id: 3, .. } => {}
                    _ => std::process::abort(),
                }
            }
        }
        result(&r, child, 0, R_ATTEMPTS).store(attempts, Ordering::Relaxed);
        result(&r, child, 0, R_ADMITTED).store(admitted, Ordering::Relaxed);
    });

    let attempts = sum(&r, 0, R_ATTEMPTS);
    let admitted = sum(&r, 0, R_ADMITTED);
    assert!(attempts > 200_000, "only {attempts} attempts");
    assert_eq!(admitted, 100_000);
    for h in &hits[..2] {
        let c = h.slot.counters();
        assert_eq!((c.passed, c.limited), (100_000, 0), "strategy {}", h.id);
    }
    let c = hits[2].slot.counters();
    assert_eq!((c.passed, c.limited), (100_000, attempts - 100_000));
    // State words: exactly 100,000 requests each.
    assert_eq!(
        hits[0].slot.state0().load(Ordering::Relaxed),
        now + 100_000 * S
    );
    assert_eq!(
        hits[1].slot.state0().load(Ordering::Relaxed),
        5 << 32 | 100_000
    );
    assert_eq!(
        hits[2].slot.state1().load(Ordering::Relaxed),
        5 << 32 | 100_000
    );
}

/// Concurrency acquire/release from four processes: never more than the
/// limit inside at once, nothing left in flight at the end.
#[test]
fn concurrency_limit_holds_across_processes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let map = SharedMap::new(MAP_LEN);
    let r = map.region();
    let limiter = Limiter::from_strategy(&strategy(Algorithm::Concurrency, 3, Unit::Second, 0));
    let hits = [hit(&r, 0, &limiter)];
    let end = MonotonicClock::now() + HAMMER_NS;

    run_children(Duration::from_secs(60), |child| {
        let inside = word(&r, INSIDE_OFF);
        let max_inside = word(&r, MAX_INSIDE_OFF);
        let (mut attempts, mut admitted) = (0u64, 0u64);
        while MonotonicClock::now() < end {
            attempts += 1;
            if admit(&hits, 0, false).verdict == Verdict::Pass {
                admitted += 1;
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(n, Ordering::SeqCst);
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                release(&hits);
            }
        }
        result(&r, child, 0, R_ATTEMPTS).store(attempts, Ordering::Relaxed);
        result(&r, child, 0, R_ADMITTED).store(admitted, Ordering::Relaxed);
    });

    let admitted = sum(&r, 0, R_ADMITTED);
    let attempts = sum(&r, 0, R_ATTEMPTS);
    let max_inside = word(&r, MAX_INSIDE_OFF).load(Ordering::SeqCst);
    assert!(admitted > 10_000, "only {admitted} admitted");
    assert!((1..=3).contains(&max_inside), "{max_inside} inside at once");
    assert_slot_end(&hits[0], 0, "left in flight", admitted, attempts);
}

/// `warm_up` from cold, four processes hammering on the real clock: the
/// 16-byte CAS keeps the two words consistent, so together they never
/// admit more than one saturated process could (the closed form of the
/// ramp, src/core/limiter/warm_up.rs), and they do climb.
#[test]
fn warm_up_across_processes_never_exceeds_the_single_process_ramp() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let map = SharedMap::new(MAP_LEN);
    let r = map.region();
    // 2,000/s: an interval of 500 µs, so that scheduling gaps of the four
    // processes on a busy machine rarely count as idle time (a gap of one
    // interval or more stores permits, as it should).
    let mut s = strategy(Algorithm::TokenBucket, 2_000, Unit::Second, 1);
    s.algorithm = Algorithm::WarmUp;
    s.warm_up = rate_ctl::core::model::WarmUp {
        period_ms: 1_000,
        cold_factor: 3,
    };
    s.validate().unwrap();
    let limiter = Limiter::from_strategy(&s);
    let hits = [hit(&r, 0, &limiter)];
    let t0 = MonotonicClock::now();
    let end = t0 + 3 * S / 2;
    run_children(Duration::from_secs(60), |child| {
        let (mut admitted, mut last_admit) = (0u64, 0u64);
        loop {
            let now = MonotonicClock::now();
            if now >= end {
                break;
            }
            if admit(&hits, now, false).verdict == Verdict::Pass {
                admitted += 1;
                last_admit = now;
            }
        }
        result(&r, child, 0, R_ADMITTED).store(admitted, Ordering::Relaxed);
        result(&r, child, 0, R_LAST_ADMIT).store(last_admit, Ordering::Relaxed);
    });
    let admitted = sum(&r, 0, R_ADMITTED);
    let last = (0..CHILDREN)
        .map(|c| result(&r, c, 0, R_LAST_ADMIT).load(Ordering::Relaxed))
        .max()
        .unwrap();
    // The single-process reference: a saturated stream from cold admits
    // 2 W (c − i(t)) / (c² − s²) by t ≤ W, i(t) = √(c² − (c² − s²) t / W),
    // then one per s; plus the first request, which goes at once.
    let (sf, cf, w) = (1.0 / 2_000.0, 3.0 / 2_000.0, 1.0);
    let t = (last.saturating_sub(t0)) as f64 / 1e9;
    let ramp = |t: f64| {
        let tw = t.min(w);
        let i = (cf * cf - (cf * cf - sf * sf) * tw / w).sqrt();
        2.0 * w * (cf - i) / (cf * cf - sf * sf) + (t - w).max(0.0) / sf
    };
    let reference = ramp(t).floor() as u64 + 1;
    println!("warm_up: {admitted} admitted by {t:.3} s, reference {reference}");
    assert!(
        admitted <= reference,
        "admitted {admitted} > single-process reference {reference}"
    );
    // The limit was binding (requests were refused), so the bound above
    // was tested. How fast it warms depends on how often four processes on
    // a busy 2-core machine get to poll (a gap of one interval stores
    // permits): the ramp itself is checked by the core tests (fake clock)
    // and t-nginx 08 (real nginx).
    assert!(hits[0].slot.counters().limited > 0, "never refused");
    assert_eq!(hits[0].slot.counters().passed, admitted);
}
