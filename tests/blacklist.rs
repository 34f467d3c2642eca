//! Blacklist behaviour: exact IPs, hashed dimensions, expiry, rebuilds that
//! never hide a kept entry (threads and real processes), full tables, and
//! corrupt regions.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use proptest::prelude::*;
use rate_ctl::core::blacklist::{
    init, region_bytes, Blacklist, BlacklistEntry, BlacklistError, HEADER_BYTES, MAGIC, SLOT_BYTES,
};
use rate_ctl::core::shm::region::Region;

fn words(bytes: u64) -> Vec<AtomicU64> {
    (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect()
}

fn table(w: &[AtomicU64], capacity: u32) -> Blacklist<'_> {
    let r = Region::from_atomics(w);
    init(r, capacity).expect("init");
    Blacklist::open(r).expect("open")
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn e(dim: &str, value: &str) -> BlacklistEntry {
    BlacklistEntry::new(dim, value, None)
}

/// splitmix64: a deterministic generator for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn ipv4_and_ipv6_match_exactly() {
    let w = words(region_bytes(100));
    let bl = table(&w, 100);
    bl.rebuild(&[
        e("ip", "10.1.2.3"),
        e("ip", "2001:db8::1"),
        e("ip", "::ffff:192.0.2.7"),
    ])
    .unwrap();
    assert!(bl.contains_ip(ip("10.1.2.3"), 0));
    assert!(
        bl.contains_ip(ip("::ffff:10.1.2.3"), 0),
        "v4-mapped is the same address"
    );
    assert!(bl.contains_ip(ip("192.0.2.7"), 0));
    assert!(bl.contains_ip(ip("2001:db8::1"), 0));
    for neighbour in [
        "10.1.2.2",
        "10.1.2.4",
        "11.1.2.3",
        "10.1.3.3",
        "::10.1.2.3",
        "2001:db8::",
        "2001:db8::2",
        "2001:db8:0:0:1::1",
        "1.0.0.0",
        "::",
    ] {
        assert!(
            !bl.contains_ip(ip(neighbour), 0),
            "{neighbour} is not listed"
        );
    }
    // The text path parses and routes to the exact path.
    assert!(bl.contains("ip", b"10.1.2.3", 0));
    assert!(bl.contains("ip", b" 2001:DB8:0::1 ", 0));
    assert!(!bl.contains("ip", b"10.1.2.4", 0));
    assert!(!bl.contains("ip", b"not an ip", 0));
    // An IP blacklist says nothing about other dimensions.
    assert!(!bl.contains("forwarded", b"10.1.2.3", 0));
}

#[test]
fn every_address_of_a_dense_range_is_exact() {
    let w = words(region_bytes(4096));
    let bl = table(&w, 4096);
    // Every other address of 10.0.0.0/20 listed.
    let listed: Vec<_> = (0..4096u32)
        .step_by(2)
        .map(|i| e("ip", &std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string()))
        .collect();
    bl.rebuild(&listed).unwrap();
    for i in 0..4096u32 {
        let a = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        assert_eq!(bl.contains_ip(a, 0), i % 2 == 0, "{a}");
    }
}

#[test]
fn hashed_dimensions_match_dimension_and_value() {
    let w = words(region_bytes(100));
    let bl = table(&w, 100);
    assert!(!bl.contains("userid", b"u1024", 0), "empty table");
    bl.rebuild(&[e("userid", "u1024"), e("api", "/pay")])
        .unwrap();
    assert!(bl.contains("userid", b"u1024", 0));
    assert!(bl.contains("api", b"/pay", 0));
    assert!(!bl.contains("userid", b"u1025", 0));
    assert!(!bl.contains("userid", b"u10245", 0));
    assert!(
        !bl.contains("userid", b"/pay", 0),
        "value of another dimension"
    );
    assert!(
        !bl.contains("api", b"u1024", 0),
        "value of another dimension"
    );
    assert!(!bl.contains("host", b"u1024", 0), "dimension not in use");
    let d = bl.dimensions_in_use();
    assert!(d.contains("userid") && d.contains("api"));
    assert!(!d.contains("host") && !d.contains("ip"));
    assert_eq!(bl.len(), 2);
}

#[test]
fn expired_entries_do_not_match() {
    let w = words(region_bytes(100));
    let bl = table(&w, 100);
    bl.rebuild(&[
        BlacklistEntry::new("userid", "temp", Some(1_000)),
        BlacklistEntry::new("ip", "192.0.2.1", Some(2_000)),
        BlacklistEntry::new("userid", "epoch", Some(0)),
        BlacklistEntry::new("userid", "forever", None),
    ])
    .unwrap();
    assert!(bl.contains("userid", b"temp", 999));
    assert!(!bl.contains("userid", b"temp", 1_000));
    assert!(bl.contains_ip(ip("192.0.2.1"), 1_999));
    assert!(!bl.contains_ip(ip("192.0.2.1"), 2_000));
    assert!(
        !bl.contains("userid", b"epoch", 1),
        "expiry 0 is not 'never'"
    );
    assert!(bl.contains("userid", b"forever", u64::MAX));
    // A rebuild can extend an expiry in place.
    let rep = bl
        .rebuild(&[BlacklistEntry::new("userid", "temp", Some(5_000))])
        .unwrap();
    assert_eq!(rep.kept, 1);
    assert!(bl.contains("userid", b"temp", 4_999));
}

#[test]
fn rebuild_keeps_adds_and_removes() {
    let w = words(region_bytes(100));
    let bl = table(&w, 100);
    let seq0 = bl.seq();
    // (entries, kept, inserted, removed) and the sequence of a rebuild.
    let counts = |list: &[BlacklistEntry]| {
        let rep = bl.rebuild(list).unwrap();
        ((rep.entries, rep.kept, rep.inserted, rep.removed), rep.seq)
    };
    let (c, seq) = counts(&[e("userid", "a"), e("userid", "b"), e("ip", "10.0.0.1")]);
    assert_eq!(c, (3, 0, 3, 0));
    assert_eq!(seq, seq0 + 1);
    let (c, _) = counts(&[e("userid", "b"), e("userid", "c"), e("ip", "10.0.0.2")]);
    assert_eq!(c, (3, 1, 2, 2));
    assert!(!bl.contains("userid", b"a", 0));
    assert!(bl.contains("userid", b"b", 0));
    assert!(bl.contains("userid", b"c", 0));
    assert!(!bl.contains_ip(ip("10.0.0.1"), 0));
    assert!(bl.contains_ip(ip("10.0.0.2"), 0));
    let rep = bl.rebuild(&[]).unwrap();
    assert_eq!(rep.removed, 3);
    assert!(bl.is_empty());
    assert!(!bl.contains("userid", b"b", 0));
    assert!(!bl.contains_ip(ip("10.0.0.2"), 0));
    assert!(!bl.dimensions_in_use().contains("userid"));
}

#[test]
fn bad_entries_are_refused_and_change_nothing() {
    let w = words(region_bytes(10));
    let bl = table(&w, 10);
    bl.rebuild(&[e("userid", "a")]).unwrap();
    let seq = bl.seq();
    for (bad, what) in [
        (e("ip", "10.0.0.300"), "not an IPv4 or IPv6"),
        (e("User", "x"), "not a valid name"),
        (e("userid", ""), "1 to 256 bytes"),
        (
            BlacklistEntry::new("userid", vec![b'x'; 257], None),
            "1 to 256 bytes",
        ),
    ] {
        let err = bl.rebuild(&[e("userid", "b"), bad]).unwrap_err();
        assert!(matches!(err, BlacklistError::InvalidEntry { index: 1, .. }));
        assert!(err.to_string().contains(what), "{err}");
    }
    assert_eq!(bl.seq(), seq);
    assert!(bl.contains("userid", b"a", 0));
    assert!(!bl.contains("userid", b"b", 0));
}

#[test]
fn a_table_holds_its_capacity() {
    for cap in [1u32, 2, 7, 50, 333, 5000] {
        let w = words(region_bytes(cap));
        let bl = table(&w, cap);
        let mut rng = Rng(u64::from(cap));
        let list: Vec<_> = (0..cap)
            .map(|i| {
                if i % 2 == 0 {
                    e("userid", &format!("user-{}", rng.next()))
                } else {
                    let a = std::net::Ipv6Addr::from(u128::from(rng.next()) << 64 | 1);
                    e("ip", &a.to_string())
                }
            })
            .collect();
        let rep = bl.rebuild(&list).unwrap();
        assert_eq!(rep.entries, cap as usize);
        for x in &list {
            assert!(bl.contains(&x.dimension, &x.value, 0), "cap {cap}: {x:?}");
        }
        // Replace the whole list by another full one.
        let other: Vec<_> = (0..cap).map(|i| e("api", &format!("/a/{i}"))).collect();
        bl.rebuild(&other).unwrap();
        assert!(other.iter().all(|x| bl.contains("api", &x.value, 0)));
        assert!(!list.iter().any(|x| bl.contains(&x.dimension, &x.value, 0)));
    }
}

#[test]
fn over_capacity_is_an_error_naming_it_and_the_old_list_stays() {
    let w = words(region_bytes(100));
    let bl = table(&w, 100);
    let old: Vec<_> = (0..100).map(|i| e("userid", &format!("old{i}"))).collect();
    bl.rebuild(&old).unwrap();
    let seq = bl.seq();
    let mut new: Vec<_> = (0..101).map(|i| e("userid", &format!("new{i}"))).collect();
    let err = bl.rebuild(&new).unwrap_err();
    assert_eq!(
        err,
        BlacklistError::CapacityExceeded {
            entries: 101,
            capacity: 100
        }
    );
    assert!(err.to_string().contains("capacity is 100"), "{err}");
    // Duplicates do not count against the capacity.
    new.truncate(100);
    new.push(e("userid", "new0"));
    bl.rebuild(&old).unwrap();
    assert_eq!(bl.seq(), seq + 1);
    assert!(old.iter().all(|x| bl.contains("userid", &x.value, 0)));
    assert_eq!(bl.rebuild(&new).unwrap().merged_duplicates, 1);
}

/// Writes a header by hand, following the documented layout, for a
/// geometry `init` would never choose.
fn handmade<'a>(w: &'a [AtomicU64], levels: &[u32], probe: u32, capacity: u32) -> Region<'a> {
    let r = Region::from_atomics(w);
    let u32_at = |off: usize, v: u32| r.u32_at(off).unwrap().store(v, Ordering::Relaxed);
    u32_at(8, 1);
    u32_at(12, levels.len() as u32);
    u32_at(16, probe);
    u32_at(20, capacity);
    for (i, s) in levels.iter().enumerate() {
        u32_at(24 + 4 * i, *s);
    }
    r.store(56, 1);
    r.store(0, MAGIC);
    r
}

#[test]
fn a_full_table_is_an_error_and_the_old_list_stays_valid() {
    // Two slots in one level, probe 2, but a declared capacity of 10: the
    // third distinct entry cannot be placed.
    let w = words((HEADER_BYTES + 2 * SLOT_BYTES) as u64);
    let r = handmade(&w, &[2], 2, 10);
    let bl = Blacklist::open(r).unwrap();
    let old = [e("userid", "a"), e("ip", "10.0.0.1")];
    bl.rebuild(&old).unwrap();
    let seq = bl.seq();
    let err = bl
        .rebuild(&[e("userid", "x"), e("userid", "y"), e("userid", "z")])
        .unwrap_err();
    match &err {
        BlacklistError::TableFull {
            index,
            dimension,
            entries,
            capacity,
        } => {
            assert_eq!((*index, dimension.as_str(), *entries), (2, "userid", 3));
            assert_eq!(*capacity, 10);
        }
        other => panic!("expected TableFull, got {other:?}"),
    }
    assert!(err.to_string().contains("capacity 10"), "{err}");
    assert_eq!(bl.seq(), seq, "nothing published");
    assert!(bl.contains("userid", b"a", 0));
    assert!(bl.contains_ip(ip("10.0.0.1"), 0));
    assert!(!bl.contains("userid", b"x", 0));
    // Replacing one entry by another still works when the table is full.
    bl.rebuild(&[e("userid", "a"), e("userid", "x")]).unwrap();
    assert!(bl.contains("userid", b"x", 0) && !bl.contains_ip(ip("10.0.0.1"), 0));
}

#[test]
fn open_refuses_bad_headers() {
    let bytes = region_bytes(10);
    let w = words(bytes);
    let r = Region::from_atomics(&w);
    assert!(matches!(
        Blacklist::open(r),
        Err(BlacklistError::BadMagic { found: 0 })
    ));
    init(r, 10).unwrap();
    assert!(Blacklist::open(r).is_ok());
    // Truncated: every shorter prefix is refused.
    for len in (0..bytes).step_by(8) {
        let short = r.sub(0, len).unwrap();
        assert!(Blacklist::open(short).is_err(), "{len} bytes");
    }
    let poke = |off: usize, v: u32| {
        let saved = r.u32_at(off).unwrap().swap(v, Ordering::Relaxed);
        let res = Blacklist::open(r).err();
        r.u32_at(off).unwrap().store(saved, Ordering::Relaxed);
        res.expect("refused")
    };
    assert_eq!(poke(8, 2), BlacklistError::UnsupportedVersion { found: 2 });
    // (offset, value, the header field named in the refusal)
    for (off, v, want) in [
        (12, 0, "levels"),
        (12, 9, "levels"),
        (16, 0, "probe"),
        (16, 65, "probe"),
        (56, 0, "seq"),
        (60, 0x0100_0000, "seq"),
    ] {
        let got = poke(off, v);
        assert!(
            matches!(got, BlacklistError::BadHeader { field, .. } if field == want),
            "poke({off}, {v}): {got:?}"
        );
    }
    assert!(matches!(poke(24, 0), BlacklistError::BadHeader { .. }));
    assert!(matches!(
        poke(24, u32::MAX),
        BlacklistError::RegionTooSmall { .. }
    ));
    assert!(matches!(
        init(r.sub(0, bytes - 8).unwrap(), 10),
        Err(BlacklistError::RegionTooSmall { .. })
    ));
}

/// The writer's side of the no-hide tests: `rounds` rebuilds, each with the
/// kept entries plus a random selection of churn entries that fills most of
/// the table, so slots of removed entries are reused all the time.
fn churn(bl: &Blacklist<'_>, kept: &[BlacklistEntry], capacity: usize, rounds: u64, seed: u64) {
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let mut list = kept.to_vec();
        let extra = capacity - kept.len() - rng.below(20) as usize;
        for _ in 0..extra {
            let n = rng.below(4 * capacity as u64);
            list.push(if n % 3 == 0 {
                e(
                    "ip",
                    &std::net::Ipv4Addr::from(0xc000_0000 + n as u32).to_string(),
                )
            } else {
                e("userid", &format!("churn-{n}"))
            });
        }
        // Kept entries move around in the input order too.
        let k = rng.below(list.len() as u64) as usize;
        list.rotate_left(k);
        bl.rebuild(&list)
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
    }
}

fn kept_entries() -> Vec<BlacklistEntry> {
    (0..48)
        .map(|i| match i % 3 {
            0 => e("ip", &format!("203.0.113.{i}")),
            1 => e("ip", &format!("2001:db8::{i:x}")),
            _ => BlacklistEntry::new("userid", format!("kept-{i}"), Some(u64::MAX)),
        })
        .collect()
}

/// Looks every kept entry up once; returns how many were missed.
fn check_kept(bl: &Blacklist<'_>, kept: &[BlacklistEntry]) -> u64 {
    let mut missed = 0;
    for x in kept {
        if !bl.contains(&x.dimension, &x.value, 1) {
            missed += 1;
        }
    }
    // Never-listed values are never found.
    if bl.contains("userid", b"never", 1) || bl.contains_ip(ip("198.51.100.1"), 1) {
        missed += 1_000_000;
    }
    missed
}

#[test]
fn rebuilds_never_hide_a_kept_entry_threads() {
    const CAP: u32 = 256;
    let w = words(region_bytes(CAP));
    let bl = table(&w, CAP);
    let kept = kept_entries();
    bl.rebuild(&kept).unwrap();
    let done = AtomicBool::new(false);
    let (misses, passes, seen) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut misses, mut passes, mut seen, mut last) = (0u64, 0u64, 0u64, 0u64);
            while !done.load(Ordering::Acquire) {
                misses += check_kept(&bl, &kept);
                passes += 1;
                let seq = bl.seq();
                if seq != last {
                    seen += 1;
                    last = seq;
                }
            }
            (misses, passes, seen)
        });
        churn(&bl, &kept, CAP as usize, 3_000, 7);
        done.store(true, Ordering::Release);
        reader.join().unwrap()
    });
    assert_eq!(misses, 0, "kept entries missed in {passes} passes");
    assert!(
        seen > 100,
        "reader saw only {seen} rebuilds in {passes} passes"
    );
    assert_eq!(bl.seq(), 1 + 1 + 3_000);
}

#[test]
fn rebuilds_never_hide_a_kept_entry_processes() {
    const CAP: u32 = 256;
    const READERS: usize = 2;
    let table_bytes = region_bytes(CAP);
    // The table, then one control word ("done") and two result words per
    // reader (misses, rebuilds seen).
    let file = tempfile::tempfile().unwrap();
    let total = table_bytes + 8 + 16 * READERS as u64;
    file.set_len(total).unwrap();
    // SAFETY: a fresh private temp file, mapped shared and only accessed
    // through atomics by this process and its children.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file).unwrap() };
    // SAFETY: the mapping is page aligned, `total` bytes long, and outlives
    // every use below (children exit before the parent unmaps).
    let all = unsafe { Region::from_raw(map.as_mut_ptr(), total as usize) };
    let region = all.sub(0, table_bytes).unwrap();
    init(region, CAP).unwrap();
    let bl = Blacklist::open(region).unwrap();
    let kept = kept_entries();
    bl.rebuild(&kept).unwrap();
    let done = table_bytes as usize;
    let result = |i: usize| done + 8 + 16 * i;

    let mut pids = Vec::new();
    for i in 0..READERS {
        // SAFETY: the child only reads shared memory through atomics and
        // leaves with _exit, running no destructors or test harness code.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let bl = Blacklist::open(region).unwrap_or_else(|_| {
                // SAFETY: _exit ends the forked child without running
                // destructors or the parent's test harness code.
                unsafe { libc::_exit(3) }
            });
            let (mut misses, mut seen, mut last) = (0u64, 0u64, 0u64);
            while all.u64_at(done).unwrap().load(Ordering::Acquire) == 0 {
                misses += check_kept(&bl, &kept);
                let seq = bl.seq();
                if seq != last {
                    seen += 1;
                    last = seq;
                }
            }
            all.store(result(i), misses);
            all.store(result(i) + 8, seen);
            // SAFETY: ends the child without unwinding into the harness.
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    churn(&bl, &kept, CAP as usize, 5_000, 11);
    all.u64_at(done).unwrap().store(1, Ordering::Release);
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    for i in 0..READERS {
        let misses = all.load(result(i));
        let seen = all.load(result(i) + 8);
        assert_eq!(misses, 0, "reader {i} missed kept entries");
        assert!(seen > 100, "reader {i} saw only {seen} rebuilds");
    }
    drop(map);
}

fn populated(w: &[AtomicU64], n: usize) -> Vec<BlacklistEntry> {
    let bl = Blacklist::open(Region::from_atomics(w)).unwrap();
    let list: Vec<_> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                e("userid", &format!("p{i}"))
            } else {
                e("ip", &format!("10.9.{}.{}", i / 256, i % 256))
            }
        })
        .collect();
    bl.rebuild(&list).unwrap();
    list
}

/// Exercises every reader and writer entry point; must not panic.
fn poke_all(bl: &Blacklist<'_>, seed: u64) {
    let mut rng = Rng(seed);
    let _ = bl.len();
    let _ = bl.dimensions_in_use().contains("userid");
    for _ in 0..8 {
        let a = IpAddr::from(std::net::Ipv6Addr::from(u128::from(rng.next())));
        let _ = bl.contains_ip(a, rng.next());
        let _ = bl.contains("userid", &rng.next().to_le_bytes(), rng.next());
        let _ = bl.contains("ip", b"10.9.0.2", rng.next());
    }
    let _ = bl.rebuild(&[e("userid", "z"), e("ip", "10.0.0.9")]);
    let _ = bl.contains("userid", b"z", 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_are_refused_or_answered(
        raw in prop::collection::vec(any::<u64>(), 0..200),
        stamp in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let w: Vec<AtomicU64> = raw.iter().map(|&v| AtomicU64::new(v)).collect();
        if stamp && w.len() > 8 {
            // Valid magic and version so the geometry checks get exercised.
            w[0].store(MAGIC, Ordering::Relaxed);
            let v = w[1].load(Ordering::Relaxed);
            w[1].store((v & !0xffff_ffff) | 1, Ordering::Relaxed);
        }
        if let Ok(bl) = Blacklist::open(Region::from_atomics(&w)) {
            poke_all(&bl, seed);
        }
    }

    #[test]
    fn corrupt_header_words_are_refused_or_answered(
        hits in prop::collection::vec((0usize..32, any::<u64>()), 1..4),
        seed in any::<u64>(),
    ) {
        let w = words(region_bytes(64));
        init(Region::from_atomics(&w), 64).unwrap();
        populated(&w, 40);
        for (i, v) in hits {
            w[i].store(v, Ordering::Relaxed);
        }
        if let Ok(bl) = Blacklist::open(Region::from_atomics(&w)) {
            poke_all(&bl, seed);
        }
    }

    #[test]
    fn corrupt_slot_words_lose_at_most_one_entry_each(
        hits in prop::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 1..8),
        flip in any::<bool>(),
    ) {
        let w = words(region_bytes(64));
        init(Region::from_atomics(&w), 64).unwrap();
        let list = populated(&w, 60);
        let slot_words = w.len() - HEADER_BYTES / 8;
        for (at, v) in &hits {
            let i = HEADER_BYTES / 8 + at.index(slot_words);
            let v = if flip { w[i].load(Ordering::Relaxed) ^ (1 << (v % 64)) } else { *v };
            w[i].store(v, Ordering::Relaxed);
        }
        let bl = Blacklist::open(Region::from_atomics(&w)).unwrap();
        let found = list.iter().filter(|x| bl.contains(&x.dimension, &x.value, 0)).count();
        prop_assert!(found + hits.len() >= list.len(), "{found} of {}", list.len());
        prop_assert!(!bl.contains("userid", b"never", 0));
        // The writer repairs the table.
        bl.rebuild(&list).unwrap();
        prop_assert!(list.iter().all(|x| bl.contains(&x.dimension, &x.value, 0)));
    }
}
