//! Worker table load: what a worker (or its loader thread,
//! `src/core/shm/loader.rs`) does when a table is published — copy the segment
//! out of shared memory, decode and check every record, build the matcher.
//! Freeing the table is not timed (the worker frees the table it replaces
//! on a helper thread). Run: `cargo bench --bench load`.
//!
//! Two clocks: `load` is wall time, `load_cpu` the CPU time of the
//! loading thread (`CLOCK_THREAD_CPUTIME_ID`): on a 2-core VM shared with
//! builds, wall time counts the time the thread waits for a core, CPU time
//! only the work (the figure to compare across runs).

use std::hint::black_box;

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rate_ctl::core::model::Strategy;
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::segment::{decode_records, read_raw};
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::Table;

mod common;
use common::{passing, strategies};

/// Every `a=ai AND b=bj`, i, j < n.
fn grid(n: u32) -> Vec<Strategy> {
    let mut l = Vec::new();
    for i in 0..n {
        for j in 0..n {
            l.push(passing(
                1 + i * n + j,
                &[("a", format!("a{i}")), ("b", format!("b{j}"))],
            ));
        }
    }
    l
}

/// The publish benchmark's table (`scripts/bench-publish.sh`): `n - 1`
/// strategies `ip=<address> AND api=/x<i % 50>` and `api=/bench`, so the
/// address strategies are anchored under their api (see the matcher's
/// `reanchor`).
fn ip_api(n: u32) -> Vec<Strategy> {
    let mut l: Vec<Strategy> = (1..n)
        .map(|i| {
            let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
            passing(i, &[("ip", ip), ("api", format!("/x{}", i % 50))])
        })
        .collect();
    l.push(passing(n, &[("api", "/bench".to_string())]));
    l
}

/// t-nginx/43-propagation.t's background table: `userid=u<i> AND api=/y`.
fn userid_api(n: u32) -> Vec<Strategy> {
    (1..=n)
        .map(|i| passing(i, &[("userid", format!("u{i}")), ("api", "/y".to_string())]))
        .collect()
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; the clock id is a
    // constant every Linux has.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measurement: the benchmark thread's CPU time.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Ms
    }
}

/// Values in milliseconds of CPU time.
struct Ms;

impl ValueFormatter for Ms {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms (CPU)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let n = match *t {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
        };
        values.iter_mut().for_each(|v| *v = n as f64 * 1e9 / *v);
        "/s (CPU)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn load(c: &mut Criterion) {
    loads(c, "load");
}

fn load_cpu(c: &mut Criterion<ThreadCpu>) {
    loads(c, "load_cpu");
}

fn loads<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let dir = common::scratch_dir("rate-ctl-bench-load");
    let mut g = c.benchmark_group(group);
    g.sample_size(20);
    for (n, name, list) in [
        (65_536, "random", strategies(65_536)),
        (65_536, "grid256", grid(256)),
        (65_536, "ip_api", ip_api(65_536)),
        (10_000, "random", strategies(10_000)),
        (10_000, "userid_api", userid_api(10_000)),
    ] {
        let path = dir.path().join(format!("load-{name}-{n}"));
        let caps = Capacities::tables(131_072, 64 << 20);
        let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
        w.publish(&list, &[], 1).unwrap();
        let mut r = Reader::new(&path);
        r.refresh(1);
        let map = r.table().unwrap().mapping().unwrap().clone();
        let mut buf = Vec::new();
        g.bench_function(BenchmarkId::new(name, n), |b| {
            b.iter_with_large_drop(|| {
                let seq = map.seq();
                let seg = map.segment((seq & 1) as usize);
                let t = Table::read(&seg, seq, &mut buf, Some(map.clone())).unwrap();
                assert_eq!(t.strategies().len(), list.len());
                black_box(t)
            })
        });
        if (name == "random" && n == 65_536) || name == "userid_api" {
            // The first half alone: copy out, checksum, decode and check
            // every record (no table built).
            g.bench_function(BenchmarkId::new(format!("check-only-{name}"), n), |b| {
                b.iter(|| {
                    let seq = map.seq();
                    let seg = map.segment((seq & 1) as usize);
                    let raw = read_raw(&seg, seq, &mut buf).unwrap();
                    let mut k = 0;
                    decode_records(&buf, raw.count, |r| k += r.conditions.len()).unwrap();
                    black_box(k)
                })
            });
        }
    }
    patch_parts(&mut g, &dir);
    g.finish();
}

/// What a worker that holds sequence N-1 of t-nginx/43's 10,000-strategy
/// table would do for a one-strategy change (issue 29; compare
/// `userid_api/10000`, the full build): copy and checksum the payload,
/// find the changed ids against N-1's payload
/// ([`changed_ids`](rate_ctl::core::shm::segment_diff::changed_ids)),
/// build a table of the changed strategy alone.
fn patch_parts<M: Measurement>(g: &mut criterion::BenchmarkGroup<'_, M>, dir: &tempfile::TempDir) {
    use rate_ctl::core::shm::segment::{Decoded, Published};
    use rate_ctl::core::shm::segment_diff::{changed_ids, MAX_CHANGED};
    let n = 10_000u32;
    let mut list = userid_api(n);
    let path = dir.path().join("load-patch");
    let mut w =
        Writer::create_or_adopt(&path, Capacities::tables(16_384, 16 << 20), 0o600).unwrap();
    w.publish(&list, &[], 1).unwrap();
    let mut r = Reader::new(&path);
    r.refresh(1);
    let map = r.table().unwrap().mapping().unwrap().clone();
    let mut old = Vec::new();
    let seq = map.seq();
    read_raw(&map.segment((seq & 1) as usize), seq, &mut old).unwrap();
    list.push(passing(n + 1, &[("api", "/fresh".to_string())]));
    w.publish(&list, &[], 2).unwrap();
    let seq = map.seq();
    let mut new = Vec::new();
    read_raw(&map.segment((seq & 1) as usize), seq, &mut new).unwrap();
    let changed = changed_ids(&old, n, &new, n + 1, MAX_CHANGED).unwrap();
    assert_eq!(changed[0].0, n + 1);
    let mut buf = Vec::new();
    g.bench_function(BenchmarkId::new("patch-copy-checksum", n), |b| {
        b.iter(|| {
            let seq = map.seq();
            black_box(read_raw(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap())
        })
    });
    g.bench_function(BenchmarkId::new("patch-changed-ids", n), |b| {
        b.iter(|| black_box(changed_ids(&old, n, &new, n + 1, MAX_CHANGED)))
    });
    let one = Decoded {
        publish_seq: seq,
        config_version: 2,
        published_unix_ms: 0,
        strategies: vec![Published {
            strategy: list[n as usize].clone(),
            slot: 0,
            generation: 1,
        }],
        blacklist_dimensions: Vec::new(),
    };
    g.bench_function(BenchmarkId::new("patch-build-one", n), |b| {
        b.iter_with_large_drop(|| Table::build(black_box(one.clone()), Some(map.clone())))
    });
}

criterion_group!(benches, load);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = load_cpu
}
criterion_main!(benches, cpu);
