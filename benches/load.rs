//! Worker table load: what a worker (or its loader thread,
//! `src/core/loader.rs`) does when a table is published — copy the segment
//! out of shared memory, decode and check every record, build the matcher.
//! Freeing the table is not timed (the worker frees the table it replaces
//! on a helper thread). Run: `cargo bench --bench load`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rate_ctl::core::model::Strategy;
use rate_ctl::core::reader::Reader;
use rate_ctl::core::segment::read_segment;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::Table;
use rate_ctl::core::writer::Writer;

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

fn load(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("rate-ctl-bench-load")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let mut g = c.benchmark_group("load");
    g.sample_size(20);
    for (n, name, list) in [
        (65_536, "random", strategies(65_536)),
        (65_536, "grid256", grid(256)),
        (10_000, "random", strategies(10_000)),
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
                let d = read_segment(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap();
                let t = Table::build(d, Some(map.clone()));
                assert_eq!(t.strategies().len(), list.len());
                black_box(t)
            })
        });
        if name == "random" && n == 65_536 {
            // The first half alone: copy out, checksum, decode and check.
            g.bench_function(BenchmarkId::new("decode-only", n), |b| {
                b.iter_with_large_drop(|| {
                    let seq = map.seq();
                    read_segment(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);
