//! Decision cost with address ranges (issue 14): 10,000 range strategies
//! over 24 prefix lengths and 100,000 over 4, through a real shared-memory
//! file. Run: `cargo bench --bench ranges`.
//!
//! `inside`: the request's address lies in one network and inside the span
//! of all of them, so every prefix length in use is probed (the worst
//! case); `outside`: an address no network's span holds (one compare).
//! The networks are IPv6 (random in 2000::/3): IPv4 has no room for
//! 10,000 disjoint networks as short as /9.

use std::hint::black_box;
use std::net::{IpAddr, Ipv6Addr};

use criterion::{Criterion, Throughput};
use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::reader::Reader;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, RequestOutcome, Scratch};
use rate_ctl::core::writer::Writer;
use smallvec::SmallVec;

/// `n` strategies `ip=<network>` with prefix lengths cycling through
/// `lens`, on random addresses of 2000::/3 (so that networks of the same
/// table hardly ever overlap: a request inside one matches that one, and
/// the benchmark measures the lookups, not the admission of many
/// matches); returns them and an address inside the first network.
/// With `v4`: IPv4 networks (`lens` over the 32 bits) anywhere in
/// 1.0.0.0 … 223.255.255.255, as `scripts/bench-instructions.sh`'s
/// `ranges` case (short ones overlap).
fn ranges(n: u32, lens: &[u8], v4: bool) -> (Vec<Strategy>, IpAddr) {
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
            let addr = match v4 {
                true => 0xffff_0000_0000 | u128::from((rnd() as u32 % (223 << 24)).max(1 << 24)),
                false => (u128::from(rnd()) << 64 | u128::from(rnd())) >> 3 | 0x2 << 124,
            };
            let len = if v4 { 96 + len } else { len };
            let net = addr & (u128::MAX << (128 - u32::from(len)));
            first.get_or_insert(Ipv6Addr::from(net | 1));
            let mut s = Strategy::unconditioned(
                Algorithm::TokenBucket,
                1_000_000,
                Unit::Second,
                1_000_000,
                Action::Reject { status: None },
            )
            .expect("valid");
            s.id = id;
            let net = rate_ctl::core::model::IpNet { addr: net, len };
            s.conditions = vec![Condition::new("ip", net.to_string())];
            s
        })
        .collect();
    (list, IpAddr::V6(first.expect("n > 0")))
}

fn decide_ranges(c: &mut Criterion) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let mut g = c.benchmark_group("decide_ranges");
    g.throughput(Throughput::Elements(1));
    let lens24: Vec<u8> = (40..64).collect();
    let lens24_v4: Vec<u8> = (8..32).collect();
    for (name, n, lens) in [
        ("10000x24", 10_000u32, &lens24[..]),
        ("100000x4", 100_000, &[48, 56, 60, 64][..]),
        ("10000x24_v4", 10_000, &lens24_v4[..]),
    ] {
        let v4 = name.ends_with("_v4");
        let (list, inside) = ranges(n, lens, v4);
        let path = dir.path().join(name);
        let caps = Capacities::tables(131_072, 32 << 20);
        let mut writer = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
        writer.publish(&list, &[], 1).unwrap();
        let mut reader = Reader::new(&path);
        reader.refresh(1);
        let t = reader.table().unwrap().clone();
        let values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
        let outside: IpAddr = "10.1.2.3".parse().unwrap();
        // IPv4: the nginx benchmark's client, inside two or three of the
        // short networks (per-/16 directory), and an IPv6 one.
        let cases = match v4 {
            true => [
                ("127.0.0.1", "127.0.0.1".parse().unwrap()),
                ("outside", "2001:db8::1".parse().unwrap()),
            ],
            false => [("inside", inside), ("outside", outside)],
        };
        for (case, ip) in cases {
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
            assert_eq!(t.matching(&values).len(), 0, "no text address given");
            let mut held = SmallVec::new();
            let o = t.decide_into(&r(now), &mut held, &mut scratch);
            assert_eq!(
                matches!(o, RequestOutcome::Limited(_)),
                case != "outside",
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

fn main() {
    let mut c = Criterion::default()
        .sample_size(30)
        .measurement_time(std::time::Duration::from_secs(3))
        .configure_from_args();
    decide_ranges(&mut c);
    c.final_summary();
}
