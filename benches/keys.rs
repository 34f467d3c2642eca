//! Per-key decisions: one request through the table (match, key hash,
//! key table charge) with 1,000,000 keys resident; the key table charge
//! alone; and the same decision while a second process hammers the key
//! table (the same key, or other keys).
//!
//! `cargo bench --bench keys`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use rate_ctl::core::clock::MonotonicClock;
use rate_ctl::core::clock::Now;
use rate_ctl::core::keys::{Charge, KeyLimiter};
use rate_ctl::core::model::each::Each;
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::{Capacities, Mapping};
use rate_ctl::core::table::{Request, RequestOutcome, Scratch, Table};
use smallvec::SmallVec;

/// Keys resident while measuring.
const RESIDENT: u32 = 1_000_000;
/// Entries of the table: 1,000,000 keys fill it to 48 %.
const CAPACITY: u32 = 1 << 21;

/// One token an hour, a burst of a million: every request passes and a
/// charged key stays limited (resident) for an hour.
fn per_ip() -> Strategy {
    let mut s = Strategy::unconditioned(
        Algorithm::TokenBucket,
        1,
        Unit::Hour,
        1_000_000,
        Action::Reject { status: None },
    )
    .unwrap();
    s.each = Each::of(&["ip"]);
    s
}

fn ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
}

fn setup(path: &Path) -> (Arc<Table>, Writer) {
    let caps = Capacities {
        max_strategies: 1024,
        segment_bytes: 1 << 20,
        blacklist_entries: 16,
        keys: CAPACITY,
    };
    let mut w = Writer::create_or_adopt(path, caps, 0o600).unwrap();
    w.publish(&[per_ip()], &[], 1).unwrap();
    let mut e = Reader::new(path);
    e.refresh(1);
    (e.table().unwrap().clone(), w)
}

fn decide(t: &Table, scratch: &mut Scratch, addr: IpAddr, now_ns: u64) -> bool {
    let values: [Option<&[u8]>; 1] = [None];
    let mut held = SmallVec::new();
    let o = t.decide_into(
        &Request {
            values: &values[..t.dimensions().len()],
            ip: Some(addr.into()),
            now_ns,
            now_unix_ms: now_ns / 1_000_000,
            dry_run: false,
            quota: false,
        },
        &mut held,
        scratch,
    );
    matches!(o, RequestOutcome::Limited(_))
}

/// A child process: charges key `ip(0)` (`same`) or keys above the
/// resident ones for `secs` seconds.
fn hammer(path: &Path, same: bool, secs: u64) {
    let map = Mapping::open(path).unwrap();
    let kt = map.keys();
    let lim = KeyLimiter::from_strategy(&per_ip()).unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let generation = rate_ctl::core::shm::slot::Slot::at(&map.slots(), 0)
        .unwrap()
        .generation()
        .load(std::sync::atomic::Ordering::Acquire);
    let mut i = 0u32;
    while Instant::now() < end {
        for _ in 0..1000 {
            let mut h = kt.hasher(1);
            let n = if same { 0 } else { RESIDENT + (i % 100_000) };
            // The key a decision for ip(n) charges (same encoding).
            rate_ctl::core::keys::IpPrefix::new(ip(n), 32, 64).hash_into(&mut h);
            let k = kt.key(h, 0, generation).unwrap();
            let now = Now::from(MonotonicClock::now());
            let c = kt.charge(&k, &lim, now, false, &map.slots(), |_| Some(&lim));
            black_box(matches!(c, Charge::Admitted { .. }));
            i = i.wrapping_add(1);
        }
    }
}

fn spawn_hammer(path: &Path, same: bool) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("RATE_CTL_BENCH_HAMMER", if same { "same" } else { "other" })
        .env("RATE_CTL_BENCH_PATH", path)
        .spawn()
        .unwrap()
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let (t, _w) = setup(&path);
    let mut scratch = Scratch::default();
    let t0 = MonotonicClock::now();
    let start = Instant::now();
    for i in 0..RESIDENT {
        assert!(decide(&t, &mut scratch, ip(i), t0));
    }
    let map = t.mapping().unwrap().clone();
    let stats = map.keys().stats();
    eprintln!(
        "{RESIDENT} keys resident in {:.1} s: {} of {} entries ({} bytes each), longest probe {}",
        start.elapsed().as_secs_f64(),
        stats.occupied,
        stats.capacity,
        rate_ctl::core::keys::ENTRY_BYTES,
        stats.max_probe
    );
    // A pseudo-random walk over the resident keys (no cache-friendly order).
    let mut g = c.benchmark_group("keys");
    g.sampling_mode(SamplingMode::Flat);
    let mut x = 12345u32;
    let mut now = t0;
    g.bench_function("decision_1M_resident", |b| {
        b.iter(|| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            now += 1;
            black_box(decide(&t, &mut scratch, ip(x % RESIDENT), now))
        })
    });
    // Realistic traffic is skewed: 90 % of the requests from 10,000 busy
    // clients (their entries stay cached), 10 % from the whole million.
    g.bench_function("decision_1M_resident_hot10k", |b| {
        b.iter(|| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            now += 1;
            let k = if (x >> 8) % 10 == 0 {
                x % RESIDENT
            } else {
                (x >> 4) % 10_000 * 100
            };
            black_box(decide(&t, &mut scratch, ip(k), now))
        })
    });
    let kt = map.keys();
    let lim = KeyLimiter::from_strategy(&per_ip()).unwrap();
    let slots = map.slots();
    let generation = t.strategies()[0].generation;
    g.bench_function("charge_only_1M_resident", |b| {
        b.iter(|| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            now += 1;
            let mut h = kt.hasher(1);
            rate_ctl::core::keys::IpPrefix::new(ip(x % RESIDENT), 32, 64).hash_into(&mut h);
            let k = kt.key(h, 0, generation).unwrap();
            black_box(kt.charge(&k, &lim, Now::from(now), false, &slots, |_| Some(&lim)))
        })
    });
    // The floor under a uniform-key decision: one read of a random line of
    // a shared file mapping as large as the key table (4 KiB pages, as the
    // module's), each read's address taken from the previous one so that no
    // two overlap. A decision for a key not in cache pays this at least
    // once; the figure says how much of `decision_1M_resident` is the
    // machine's memory latency rather than our code.
    // The same read in smaller mappings (8 and 16 MiB): where the
    // machine's last-level cache ends, i.e. how much of the floor a key
    // table of that size would avoid.
    // 32 MiB is the key table's own size.
    assert_eq!(
        CAPACITY as u64 * rate_ctl::core::keys::ENTRY_BYTES,
        32 << 20
    );
    for mib in [8usize, 16, 32] {
        let floor = Floor::new(dir.path(), mib << 20);
        let mut line = 0usize;
        g.bench_function(format!("memory_floor_random_line_{mib}MiB"), |b| {
            b.iter(|| {
                line = floor.next(line);
                black_box(line)
            })
        });
    }
    for (name, same) in [
        ("decision_vs_process_on_same_key", true),
        ("decision_vs_process_on_other_keys", false),
    ] {
        let mut child = spawn_hammer(&path, same);
        std::thread::sleep(Duration::from_millis(200));
        g.bench_function(name, |b| {
            b.iter(|| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                now += 1;
                // The same key as the other process, or resident keys.
                let k = if same { 0 } else { x % RESIDENT };
                black_box(decide(&t, &mut scratch, ip(k), MonotonicClock::now()))
            })
        });
        let _ = child.kill();
        let _ = child.wait();
    }
    g.finish();
}

/// A file mapping whose 64-byte lines form one random cycle: line `i`
/// holds the number of the line to read after it.
struct Floor {
    map: memmap2::MmapMut,
}

impl Floor {
    fn new(dir: &Path, bytes: usize) -> Floor {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("floor"))
            .unwrap();
        f.set_len(bytes as u64).unwrap();
        // SAFETY: the file is this benchmark's own, in its own temporary
        // directory; nothing else maps or resizes it.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.unwrap();
        let lines = bytes / 64;
        // Sattolo's shuffle: a single cycle through every line.
        let mut next: Vec<u64> = (0..lines as u64).collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..lines).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            next.swap(i, (x % i as u64) as usize);
        }
        for (i, n) in next.iter().enumerate() {
            map[i * 64..i * 64 + 8].copy_from_slice(&n.to_ne_bytes());
        }
        Floor { map }
    }

    #[inline(always)]
    fn next(&self, line: usize) -> usize {
        let b: [u8; 8] = self.map[line * 64..line * 64 + 8].try_into().unwrap();
        u64::from_ne_bytes(b) as usize
    }
}

fn main() {
    if let (Ok(kind), Some(path)) = (
        std::env::var("RATE_CTL_BENCH_HAMMER"),
        std::env::var_os("RATE_CTL_BENCH_PATH"),
    ) {
        hammer(Path::new(&path), kind == "same", 120);
        return;
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    benches(&mut c);
    c.final_summary();
}
