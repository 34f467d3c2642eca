//! Decision cost for one request (blacklist + match + admit) and reload cost,
//! through a real shared-memory file. Run: `cargo bench --bench decision`.

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::{Condition, Strategy};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, RequestOutcome, Scratch, Table};
use smallvec::SmallVec;

mod common;
use common::{passing, strategies};

fn setup(n: u32, dir: &std::path::Path) -> (Arc<Table>, Writer) {
    let path = dir.join(format!("bench-{n}"));
    let caps = Capacities {
        blacklist_entries: 4096, // the 1,000 entries below
        ..Capacities::tables(131_072, 32 << 20)
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
    let mut e = Reader::new(&path);
    e.refresh(1);
    (e.table().unwrap().clone(), w)
}

/// The tables of `scripts/bench-instructions.sh` (same names): 10,000
/// strategies on ip + api the request never matches, plus the case's own:
/// `ratectl` (`api=/bench`), `args` (`a=a5 b=b5`), `gridN` (every
/// `a=ai b=bj`, i, j < N); `_bg` adds 100,000 strategies of other shapes
/// sharing the request's a and b values.
fn shaped(case: &str) -> Vec<Strategy> {
    let mut list: Vec<Strategy> = (1..=10_000u32)
        .map(|i| {
            passing(
                i,
                &[
                    (
                        "ip",
                        format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    ),
                    ("api", format!("/x{}", i % 50)),
                ],
            )
        })
        .collect();
    let own = case.trim_end_matches("_bg");
    match own {
        "ratectl" => list.push(passing(20_001, &[("api", "/bench".into())])),
        "args" => list.push(passing(20_003, &[("a", "a5".into()), ("b", "b5".into())])),
        // Condition operators (issue 30), as scripts/bench-instructions.sh
        // builds them: 10,000 prefixes of 8 lengths, 1,000 templates of
        // three shapes, 1,000 negations beside an exact api.
        "prefix" => {
            for i in 1..=10_000u32 {
                let x = &"xxx"[..(i % 4) as usize];
                list.push(passing(30_000 + i, &[("api^", format!("/p{i}/{x}"))]));
            }
            list.push(passing(20_001, &[("api^", "/ben".into())]));
        }
        "template" => {
            for i in 1..=1_000u32 {
                let t = match i % 3 {
                    0 => format!("/t{i}/*/x"),
                    1 => format!("/t{i}/*"),
                    _ => format!("/t{i}/*/**"),
                };
                list.push(passing(30_000 + i, &[("api~", t)]));
            }
            list.push(passing(20_001, &[("api~", "/bench/**".into())]));
        }
        "negation" => {
            for i in 1..=1_000u32 {
                list.push(passing(
                    30_000 + i,
                    &[("api", format!("/y{i}")), ("a!", format!("a{i}"))],
                ));
            }
            list.push(passing(
                20_001,
                &[("api", "/bench".into()), ("a!", "a1".into())],
            ));
        }
        grid => {
            let n: u32 = grid.trim_start_matches("grid").parse().unwrap();
            for i in 0..n {
                for j in 0..n {
                    list.push(passing(
                        30_001 + i * n + j,
                        &[("a", format!("a{i}")), ("b", format!("b{j}"))],
                    ));
                }
            }
        }
    }
    if case.ends_with("_bg") {
        for i in 0..25_000u32 {
            let id = 100_001 + 4 * i;
            list.push(passing(
                id,
                &[("a", format!("a{}", i % 300)), ("api", format!("/y{i}"))],
            ));
            list.push(passing(
                id + 1,
                &[("b", format!("b{}", i % 300)), ("c", format!("c{i}"))],
            ));
            list.push(passing(id + 2, &[("userid", format!("u{i}"))]));
            list.push(passing(
                id + 3,
                &[
                    ("a", format!("a{}", i % 300)),
                    ("b", format!("b{}", i % 290)),
                    ("c", format!("c{i}")),
                ],
            ));
        }
    }
    list
}

fn publish(list: &[Strategy], path: &std::path::Path) -> (Arc<Table>, Writer) {
    let caps = Capacities::tables(262_144, 64 << 20);
    let mut w = Writer::create_or_adopt(path, caps, 0o600).unwrap();
    w.publish(list, &[], 1).unwrap();
    let mut e = Reader::new(path);
    e.refresh(1);
    (e.table().unwrap().clone(), w)
}

/// One request from 127.0.0.1 with `values` per call, 1 µs apart, as the
/// nginx worker makes it: one working space, fitted at load.
fn decider<'a>(
    t: &'a Table,
    values: Vec<Option<&'a [u8]>>,
    quota: bool,
) -> impl FnMut() -> RequestOutcome + 'a {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let mut now = 1_000_000_000u64;
    let mut scratch = Scratch::default();
    scratch.fit(t);
    move || {
        now += 1_000;
        let r = Request {
            values: black_box(&values),
            ip: Some(ip.into()),
            now_ns: now,
            now_unix_ms: 1,
            dry_run: false,
            quota,
        };
        let mut held = SmallVec::new();
        black_box(t.decide_into(&r, &mut held, &mut scratch))
    }
}

fn decision(c: &mut Criterion) {
    let dir = common::scratch_dir("rate-ctl-bench");
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
        let mut decide = decider(&t, values, true);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(&mut decide)
        });
    }
    g.finish();

    // The instruction benchmark's tables; the request GET /bench?a=a5&b=b5
    // from 127.0.0.1 matches the case's own strategy.
    let mut g = c.benchmark_group("decide_shape");
    g.throughput(Throughput::Elements(1));
    for case in [
        "ratectl",
        "args",
        "prefix",
        "template",
        "negation",
        "grid10",
        "grid100",
        "grid250",
        "ratectl_bg",
        "args_bg",
        "grid10_bg",
        "grid100_bg",
        "grid250_bg",
    ] {
        let (t, _w) = publish(&shaped(case), &dir.path().join(case));
        let mut values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
        for (name, v) in [("api", "/bench"), ("a", "a5"), ("b", "b5")] {
            if let Some(i) = t.dimension_index(name) {
                values[i] = Some(v.as_bytes());
            }
        }
        assert_eq!(
            t.matching(&values).len(),
            1,
            "{case}: the request matches one strategy"
        );
        let mut decide = decider(&t, values, false);
        g.bench_function(case, |b| b.iter(&mut decide));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = decision
}
criterion_main!(benches);
