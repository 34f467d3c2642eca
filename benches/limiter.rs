//! Uncontended cost of one limiter decision, per algorithm, and of the
//! multi-strategy admission around it.
//!
//! `cargo bench --bench limiter`

use std::cell::Cell;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rate_ctl::core::admit::{admit, release, Hit};
use rate_ctl::core::limiter::Limiter;
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::slot::{LocalSlots, Slot};

const REJECT: Action = Action::Reject { status: None };

fn limiter(algorithm: Algorithm, rate: u64, per: Unit, burst: u32) -> Limiter {
    let s = Strategy::unconditioned(algorithm, rate, per, burst, REJECT);
    Limiter::from_strategy(&s.expect("valid strategy"))
}

fn acquire(c: &mut Criterion) {
    let mut g = c.benchmark_group("acquire");
    // Time advances so that every call is admitted (the common path): one
    // interval per call for the buckets, 1 µs per call for the windows
    // (a million per window, far under their limit).
    // (algorithm, rate per second, burst, ns per call); named by algorithm.
    let cases = [
        (Algorithm::TokenBucket, 1_000, 100, 1_000_000),
        (Algorithm::LeakyBucket, 1_000, 1, 1_000_000),
        (Algorithm::FixedWindow, 4_000_000_000, 0, 1_000),
        (Algorithm::SlidingWindow, 4_000_000_000, 0, 1_000),
    ];
    for (algorithm, rate, burst, step) in cases {
        let l = limiter(algorithm, rate, Unit::Second, burst);
        let local = LocalSlots::new(1);
        let region = local.region();
        let slot = Slot::at(&region, 0).unwrap();
        let now = Cell::new(1_000_000_000u64);
        g.bench_function(algorithm.as_str(), |b| {
            b.iter(|| {
                let t = now.get() + step;
                now.set(t);
                black_box(l.acquire(&slot, black_box(t)))
            })
        });
    }
    let l = limiter(Algorithm::Concurrency, 10, Unit::Second, 0);
    let local = LocalSlots::new(1);
    let region = local.region();
    let slot = Slot::at(&region, 0).unwrap();
    g.bench_function("concurrency_acquire_release", |b| {
        b.iter(|| {
            let o = l.acquire(&slot, 0);
            l.release(&slot);
            black_box(o)
        })
    });
    // The rejection path (a full fixed window).
    let l = limiter(Algorithm::FixedWindow, 1, Unit::Hour, 0);
    let local = LocalSlots::new(1);
    let region = local.region();
    let slot = Slot::at(&region, 0).unwrap();
    l.acquire(&slot, 1);
    g.bench_function("fixed_window_rejected", |b| {
        b.iter(|| black_box(l.acquire(&slot, black_box(2))))
    });
    g.finish();
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit");
    let limiters = [
        limiter(Algorithm::TokenBucket, 1_000, Unit::Second, 100),
        limiter(Algorithm::FixedWindow, 4_000_000_000, Unit::Second, 0),
        limiter(Algorithm::SlidingWindow, 4_000_000_000, Unit::Second, 0),
        limiter(Algorithm::Concurrency, 10, Unit::Second, 0),
    ];
    let local = LocalSlots::new(5);
    let region = local.region();
    let hits: Vec<Hit> = limiters
        .iter()
        .enumerate()
        .map(|(i, l)| Hit {
            id: i as u32 + 1,
            limiter: l,
            action: REJECT,
            slot: Slot::at(&region, i as u32).unwrap(),
            generation: 0,
            units: 1,
            check: false,
        })
        .collect();
    let now = Cell::new(1_000_000_000u64);
    g.bench_function("1_hit", |b| {
        b.iter(|| {
            let t = now.get() + 1_000_000;
            now.set(t);
            black_box(admit(black_box(&hits[..1]), t, false))
        })
    });
    g.bench_function("4_hits_pass_and_release", |b| {
        b.iter(|| {
            let t = now.get() + 1_000_000;
            now.set(t);
            let d = admit(black_box(&hits), t, false);
            release(&hits);
            black_box(d)
        })
    });
    // Three admitted, the fourth (a held concurrency limit of 1) rejects:
    // three refunds.
    let blocker = limiter(Algorithm::Concurrency, 1, Unit::Second, 0);
    let mut rejecting = hits[..3].to_vec();
    rejecting.push(Hit {
        id: 9,
        limiter: &blocker,
        action: REJECT,
        slot: Slot::at(&region, 4).unwrap(),
        generation: 0,
        units: 1,
        check: false,
    });
    admit(&rejecting[3..], 0, false);
    g.bench_function("4_hits_last_rejects_3_refunds", |b| {
        b.iter(|| {
            let t = now.get() + 1_000_000;
            now.set(t);
            black_box(admit(black_box(&rejecting), t, false))
        })
    });
    g.finish();
}

criterion_group!(benches, acquire, admission);
criterion_main!(benches);
