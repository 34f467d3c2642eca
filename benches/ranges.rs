//! Decision cost with address ranges (issue 14): 10,000 range strategies
//! over 24 prefix lengths and 100,000 over 4, through a real shared-memory
//! file. Run: `cargo bench --bench ranges`.
//!
//! Every table is of DISJOINT networks (no network holds another), so that
//! a request inside one matches exactly that one strategy, as a request
//! matches one exact strategy: the benchmark measures finding it, not
//! admitting many matches. `inside`: the request's address lies in one
//! network (for IPv6, inside the span of all of them: every prefix length
//! in use is probed, the worst case); `outside`: an address no network
//! holds. IPv6 tables: random networks in 2000::/3. IPv4 (`_v4`, as
//! `scripts/bench-instructions.sh`'s `ranges` case): /8 … /31, few short
//! networks and about 1,000 of each length from /23 (10,000 disjoint
//! networks as short as /9 do not fit in IPv4), 127.0.0.0/24 holding the
//! client 127.0.0.1. `_v4_nested` is the separate case of a client inside
//! three nested networks (127.0.0.0/8, /16, /24 added to that table): three
//! matches found and admitted.

use std::collections::HashSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv6Addr};

use criterion::{Criterion, Throughput};
use rate_ctl::core::model::{Action, Algorithm, Condition, IpNet, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, RequestOutcome, Scratch};
use smallvec::SmallVec;

const V4_MAPPED: u128 = 0xffff_0000_0000;

fn mask(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// Disjoint networks: `place` adds one only when no network placed holds
/// it or lies inside it.
#[derive(Default)]
struct Disjoint {
    taken: HashSet<(u8, u128)>,
    under: HashSet<(u8, u128)>,
    nets: Vec<IpNet>,
}

impl Disjoint {
    fn place(&mut self, net: IpNet) -> bool {
        let (addr, len) = (net.addr, net.len);
        if (0..=len).any(|l| self.taken.contains(&(l, addr & mask(l))))
            || self.under.contains(&(len, addr))
        {
            return false;
        }
        self.taken.insert((len, addr));
        self.under.extend((0..len).map(|l| (l, addr & mask(l))));
        self.nets.push(net);
        true
    }
}

/// `want[i]` networks of length `lens[i]` (IPv6 form) on addresses from
/// `addr`, disjoint from each other and from `first` (placed first).
fn disjoint(
    first: &[IpNet],
    lens: &[u8],
    want: &[u32],
    mut addr: impl FnMut() -> u128,
) -> Vec<IpNet> {
    let mut d = Disjoint::default();
    for &n in first {
        assert!(d.place(n), "{n}");
    }
    let mut left = want.to_vec();
    while left.iter().any(|&w| w > 0) {
        for (i, &len) in lens.iter().enumerate() {
            if left[i] > 0
                && d.place(IpNet {
                    addr: addr() & mask(len),
                    len,
                })
            {
                left[i] -= 1;
            }
        }
    }
    d.nets
}

/// One strategy `ip=<network>` each (ids from 1).
fn strategies(nets: &[IpNet]) -> Vec<Strategy> {
    nets.iter()
        .zip(1..)
        .map(|(net, id)| {
            let mut s = Strategy::unconditioned(
                Algorithm::TokenBucket,
                1_000_000,
                Unit::Second,
                1_000_000,
                Action::Reject { status: None },
            )
            .expect("valid");
            s.id = id;
            s.conditions = vec![Condition::new("ip", net.to_string())];
            s
        })
        .collect()
}

/// The tables: name, strategies, a client inside (exactly one network, but
/// for `_nested`) and one outside every network.
fn tables() -> Vec<(&'static str, Vec<Strategy>, IpAddr, IpAddr)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v6 = move || (u128::from(rnd()) << 64 | u128::from(rnd())) >> 3 | 0x2 << 124;
    let mut out = Vec::new();
    let lens: Vec<u8> = (40..64).collect();
    let nets = disjoint(&[], &lens, &[10_000 / 24 + 1; 24], &mut v6);
    let inside = IpAddr::V6(Ipv6Addr::from(nets[0].addr | 1));
    let outside = "10.1.2.3".parse().unwrap();
    out.push(("10000x24", strategies(&nets[..10_000]), inside, outside));
    let nets = disjoint(&[], &[48, 56, 60, 64], &[25_000; 4], &mut v6);
    let inside = IpAddr::V6(Ipv6Addr::from(nets[0].addr | 1));
    out.push(("100000x4", strategies(&nets), inside, outside));
    // IPv4 /8 … /31: 1 of each up to /13, 2^(len-13) up to /22, the rest
    // evenly over /23 … /31; first octets 1 … 223.
    let client = V4_MAPPED | 0x7f00_0000;
    let home = IpNet {
        addr: client,
        len: 96 + 24,
    };
    let lens: Vec<u8> = (8..32).map(|l| 96 + l).collect();
    let short: Vec<u32> = (8..23)
        .map(|l| if l < 13 { 1 } else { 1 << (l - 13) })
        .collect();
    let rest = 10_000 - 1 - short.iter().sum::<u32>();
    let want: Vec<u32> = short
        .iter()
        .copied()
        .chain((0..9).map(|i| rest / 9 + u32::from(i < rest % 9)))
        .collect();
    let mut v4 = move || V4_MAPPED | u128::from(rnd() as u32 % (223 << 24) + (1 << 24));
    let nets = disjoint(&[home], &lens, &want, &mut v4);
    let inside = "127.0.0.1".parse().unwrap();
    let v6_client = "2001:db8::1".parse().unwrap();
    out.push(("10000x24_v4", strategies(&nets), inside, v6_client));
    // The same with 127.0.0.0/8 and /16 around 127.0.0.0/24 (instead of
    // the last two networks): 127.0.0.1 inside three.
    let mut nested = nets[..nets.len() - 2].to_vec();
    for len in [8, 16] {
        nested.push(IpNet {
            addr: client,
            len: 96 + len,
        });
    }
    out.push(("10000x24_v4_nested", strategies(&nested), inside, v6_client));
    out
}

fn decide_ranges(c: &mut Criterion) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let mut g = c.benchmark_group("decide_ranges");
    g.throughput(Throughput::Elements(1));
    for (name, list, inside, outside) in tables() {
        let path = dir.path().join(name);
        let caps = Capacities::tables(131_072, 32 << 20);
        let mut writer = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
        writer.publish(&list, &[], 1).unwrap();
        let mut reader = Reader::new(&path);
        reader.refresh(1);
        let t = reader.table().unwrap().clone();
        let values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
        let inside_case = match name {
            "10000x24_v4" | "10000x24_v4_nested" => "127.0.0.1",
            _ => "inside",
        };
        let cases = [(inside_case, inside), ("outside", outside)];
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
            // The table as meant: one match inside (three nested), none out.
            let text = ip.to_string();
            let mut with_ip = values.clone();
            with_ip[t.dimension_index("ip").expect("ip")] = Some(text.as_bytes());
            let want = match case {
                "outside" => 0,
                _ if name.ends_with("_nested") => 3,
                _ => 1,
            };
            assert_eq!(t.matching(&with_ip).len(), want, "{name} {case}");
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
