//! The worker's table load (`benches/load.rs`'s `load_cpu`) with the nginx
//! module's own allocator (`src/module/alloc.rs`, issue 29) as the global
//! allocator, as in the module: what the allocator costs a table build.
//! Compare with `cargo bench --bench load -- load_cpu/random` (the system
//! allocator), run alternately:
//!
//!   cargo bench --bench load_module_alloc

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::Table;

// (Benches build with cfg(test): the allocator's unit tests come along, unused.)
#[allow(dead_code, unused_imports)]
#[path = "../src/module/alloc.rs"]
mod module_alloc;

#[global_allocator]
static ALLOCATOR: module_alloc::ModuleAlloc = module_alloc::ModuleAlloc::new();

mod common;

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`): the work,
/// not the time spent waiting for a core on a shared VM.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn load_cpu(c: &mut Criterion) {
    let dir = common::scratch_dir("rate-ctl-bench-load-alloc");
    let mut g = c.benchmark_group("load_cpu_module_alloc");
    g.sample_size(20);
    for n in [65_536, 10_000] {
        let list = common::strategies(n);
        let path = dir.path().join(format!("load-random-{n}"));
        let caps = Capacities::tables(131_072, 64 << 20);
        let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
        w.publish(&list, &[], 1).unwrap();
        let mut r = Reader::new(&path);
        r.refresh(1);
        let map = r.table().unwrap().mapping().unwrap().clone();
        let mut buf = Vec::new();
        g.bench_function(BenchmarkId::new("random", n), |b| {
            b.iter_custom(|iters| {
                let mut cpu = Duration::ZERO;
                for _ in 0..iters {
                    let start = thread_cpu();
                    let seq = map.seq();
                    let seg = map.segment((seq & 1) as usize);
                    let t = Table::read(&seg, seq, &mut buf, Some(map.clone())).unwrap();
                    cpu += thread_cpu() - start;
                    assert_eq!(t.strategies().len(), list.len());
                    // Freed outside the timed part, as the worker frees
                    // the table it replaces on a helper thread.
                    drop(black_box(t));
                }
                cpu
            })
        });
    }
    g.finish();
}

criterion_group!(benches, load_cpu);
criterion_main!(benches);
