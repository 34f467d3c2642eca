//! Decision cost for one request (blacklist + match + admit) and reload cost,
//! through a real shared-memory file. Run: `cargo bench --bench decision`.

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::engine::Engine;
use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::segment::read_segment;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, Scratch, Table};
use rate_ctl::core::writer::Writer;
use smallvec::SmallVec;

const DIMS: [&str; 6] = ["ip", "userid", "api", "method", "host", "appid"];

/// `n` strategies over 6 dimensions, 1 to 3 conditions each, deterministic.
/// Like real strategy sets, low-cardinality values (method, host) only
/// narrow a strategy that also names a caller (ip, userid, appid) or an
/// api: thousands of global "every GET" limits would be one strategy.
fn strategies(n: u32) -> Vec<Strategy> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (1..=n)
        .map(|id| {
            let k = 1 + (rnd() % 3) as usize;
            // First condition: a high-cardinality dimension.
            let mut dims: Vec<usize> = vec![[0, 1, 2, 5][(rnd() % 4) as usize]];
            while dims.len() < k {
                let d = (rnd() % 6) as usize;
                if !dims.contains(&d) {
                    dims.push(d);
                }
            }
            let conditions = dims
                .iter()
                .map(|&d| {
                    let v = match DIMS[d] {
                        "ip" => format!("10.{}.{}.{}", rnd() % 256, rnd() % 256, rnd() % 256),
                        "api" => format!("/api/v{}", rnd() % 200),
                        "method" => ["GET", "POST", "PUT"][(rnd() % 3) as usize].to_string(),
                        "host" => format!("h{}.example", rnd() % 50),
                        other => format!("{other}{}", rnd() % (n as u64 * 4)),
                    };
                    Condition::new(DIMS[d], v)
                })
                .collect();
            Strategy {
                id,
                conditions,
                algorithm: Algorithm::TokenBucket,
                rate: 1_000_000,
                per: Unit::Second,
                burst: 1_000_000,
                action: Action::Reject { status: None },
                enabled: true,
                warm_up: Default::default(),
            }
        })
        .collect()
}

fn setup(n: u32, dir: &std::path::Path) -> (Arc<Table>, Writer) {
    let path = dir.join(format!("bench-{n}"));
    let caps = Capacities {
        max_strategies: 131_072,
        segment_bytes: 32 << 20,
        blacklist_entries: 4096,
    };
    let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
    let mut list = strategies(n);
    // The request's own strategy: ip AND userid AND api, never rejects.
    list.push(Strategy {
        id: n + 1,
        conditions: vec![
            Condition::new("ip", "127.0.0.1"),
            Condition::new("userid", "u1024"),
            Condition::new("api", "/pay"),
        ],
        ..list[0].clone()
    });
    let bl: Vec<BlacklistEntry> = (0..1000)
        .map(|i| BlacklistEntry {
            dimension: if i % 2 == 0 {
                "ip".into()
            } else {
                "userid".into()
            },
            value: if i % 2 == 0 {
                format!("192.168.{}.{}", i / 256, i % 256).into_bytes()
            } else {
                format!("bad{i}").into_bytes()
            },
            expires_unix_ms: None,
        })
        .collect();
    w.publish(&list, &bl, 1).unwrap();
    let mut e = Engine::new(&path);
    e.refresh(1);
    (e.table().unwrap().clone(), w)
}

fn decision(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("rate-ctl-bench")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let mut g = c.benchmark_group("decide");
    g.throughput(Throughput::Elements(1));
    for n in [10u32, 1_000, 10_000, 100_000] {
        let (t, _w) = setup(n, dir.path());
        let pick = |name: &str, v: &'static str| t.dimension_index(name).map(|i| (i, v));
        let mut values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
        for (i, v) in [
            pick("ip", "127.0.0.1"),
            pick("userid", "u1024"),
            pick("api", "/pay"),
            pick("method", "GET"),
            pick("host", "h1.example"),
            pick("appid", "app7"),
        ]
        .into_iter()
        .flatten()
        {
            values[i] = Some(v.as_bytes());
        }
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let mut now = 1_000_000_000u64;
        // As the nginx worker does: one working space, fitted at load.
        let mut scratch = Scratch::default();
        scratch.fit(&t);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                now += 1_000;
                let r = Request {
                    values: black_box(&values),
                    ip: Some(ip.into()),
                    now_ns: now,
                    now_unix_ms: 1,
                    dry_run: false,
                    quota: true,
                };
                let mut held = SmallVec::new();
                black_box(t.decide_into(&r, &mut held, &mut scratch))
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("reload");
    {
        let n = 10_000u32;
        let (t, _w) = setup(n, dir.path());
        let map = t.mapping().unwrap().clone();
        let mut buf = Vec::new();
        g.bench_with_input(BenchmarkId::new("copy+decode+build", n), &n, |b, _| {
            b.iter(|| {
                let seq = map.seq();
                let d = read_segment(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap();
                black_box(Table::build(d, Some(map.clone())))
            })
        });
        g.bench_with_input(BenchmarkId::new("copy+decode", n), &n, |b, _| {
            b.iter(|| {
                let seq = map.seq();
                black_box(read_segment(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = decision
}
criterion_main!(benches);
