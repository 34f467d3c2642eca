//! Decision cost with address ranges (issue 14): 10,000 range strategies
//! over 24 prefix lengths and 100,000 over 4, through a real shared-memory
//! file. Run: `cargo bench --bench ranges`.
//!
//! `inside`: the request's address lies in one network and inside the span
//! of all of them, so every prefix length in use is probed (the worst
//! case); `outside`: an address no network's span holds (one compare).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rate_ctl::core::engine::Engine;
use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, Scratch, Table};
use rate_ctl::core::writer::Writer;
use smallvec::SmallVec;

/// `n` strategies `ip=<network>` with prefix lengths cycling through
/// `lens`, on random IPv4 addresses (1.0.0.0 … 223.255.255.255); returns
/// them and an address inside the first network.
fn ranges(n: u32, lens: &[u8]) -> (Vec<Strategy>, IpAddr) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut first = None;
    let list = (1..=n)
        .map(|id| {
            let len = lens[(id as usize) % lens.len()];
            let addr = (rnd() as u32 % (223 << 24)).max(1 << 24);
            let net = addr & (u32::MAX << (32 - u32::from(len)));
            first.get_or_insert(Ipv4Addr::from(net | 1));
            Strategy {
                id,
                conditions: vec![Condition::new(
                    "ip",
                    format!("{}/{len}", Ipv4Addr::from(net)),
                )],
                algorithm: Algorithm::TokenBucket,
                rate: 1_000_000,
                per: Unit::Second,
                burst: 1_000_000,
                action: Action::Reject { status: None },
                enabled: true,
                warm_up: Default::default(),
                priority: 0,
            }
        })
        .collect();
    (list, IpAddr::V4(first.expect("n > 0")))
}

fn publish(list: &[Strategy], path: &std::path::Path) -> (Arc<Table>, Writer) {
    let caps = Capacities {
        max_strategies: 262_144,
        segment_bytes: 64 << 20,
        blacklist_entries: 16,
    };
    let mut w = Writer::create_or_adopt(path, caps, 0o600).unwrap();
    w.publish(list, &[], 1).unwrap();
    let mut e = Engine::new(path);
    e.refresh(1);
    (e.table().unwrap().clone(), w)
}

fn decide_ranges(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("rate-ctl-bench-ranges")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let mut g = c.benchmark_group("decide_ranges");
    g.throughput(Throughput::Elements(1));
    let lens24: Vec<u8> = (8..32).collect();
    for (name, n, lens) in [
        ("10000x24", 10_000u32, &lens24[..]),
        ("100000x4", 100_000, &[16, 20, 24, 28][..]),
    ] {
        let (list, inside) = ranges(n, lens);
        let (t, _w) = publish(&list, &dir.path().join(name));
        let values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
        let outside: IpAddr = "2001:db8::1".parse().unwrap();
        for (case, ip) in [("inside", inside), ("outside", outside)] {
            let mut scratch = Scratch::default();
            scratch.fit(&t);
            let mut now = 1_000_000_000u64;
            let r = |now| Request {
                values: &values[..],
                ip: Some(ip.into()),
                now_ns: now,
                now_unix_ms: 1,
                dry_run: false,
                quota: false,
            };
            let mut held = SmallVec::new();
            let o = t.decide_into(&r(now), &mut held, &mut scratch);
            assert_eq!(
                matches!(o, rate_ctl::core::table::Outcome::Limited(_)),
                case == "inside",
                "{name} {case}: {o:?}"
            );
            g.bench_function(format!("{name}/{case}"), |b| {
                b.iter(|| {
                    now += 1_000;
                    let mut held = SmallVec::new();
                    black_box(t.decide_into(black_box(&r(now)), &mut held, &mut scratch))
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = decide_ranges
}
criterion_main!(benches);
