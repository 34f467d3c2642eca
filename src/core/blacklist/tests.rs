use super::*;

fn words(capacity: u32) -> Vec<AtomicU64> {
    (0..region_bytes(capacity) / 8)
        .map(|_| AtomicU64::new(0))
        .collect()
}

/// An empty blacklist of `capacity` initialised in `w` (from
/// [`words`]), and its region.
fn fresh(w: &[AtomicU64], capacity: u32) -> (Region<'_>, Blacklist<'_>) {
    let r = Region::from_atomics(w);
    init(r, capacity).unwrap();
    (r, Blacklist::open(r).unwrap())
}

fn user(v: &str) -> BlacklistEntry {
    BlacklistEntry::new("userid", v, None)
}

#[test]
fn fastmod_is_the_remainder() {
    let mut rng = crate::core::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next() as u32;
    let edges = [0, 1, 2, 3, 16, 17, u32::MAX - 1, u32::MAX];
    let divisors: Vec<u32> = edges.into_iter().chain((0..2000).map(|_| next())).collect();
    let numerators: Vec<u32> = edges.into_iter().chain((0..200).map(|_| next())).collect();
    for &d in &divisors {
        let d = d.max(1);
        let m = fastmod_multiplier(d);
        for &a in &numerators {
            assert_eq!(fastmod(a, m, d), a % d, "{a} % {d}");
        }
    }
}

#[test]
fn geometry_is_decreasing_primes_with_room_for_the_probe() {
    for cap in [0, 1, 31, 32, 1000, 65_536, 1_000_000, u32::MAX] {
        let g = new_geometry(cap);
        assert!(g.iter().all(|&s| is_prime(u64::from(s))), "{cap}: {g:?}");
        assert!(g.windows(2).all(|w| w[0] > w[1]), "{cap}: {g:?}");
        assert!(g[NEW_LEVELS - 1] >= NEW_PROBE, "{cap}: {g:?}");
        let slots: u64 = g.iter().map(|&s| u64::from(s)).sum();
        assert!(slots >= u64::from(cap) * 2 * 98 / 100, "{cap}: {g:?}");
        assert!(
            slots <= (u64::from(cap) * 2).max(MIN_SLOTS) * 2,
            "{cap}: {g:?}"
        );
    }
    assert_eq!(region_bytes(65_536) % 64, 0);
    assert!(region_bytes(65_536) < 5 << 20);
}

#[test]
fn probe_bound_follows_the_farthest_entry() {
    let w = words(1000);
    let (r, bl) = fresh(&w, 1000);
    bl.rebuild(&[user("a")]).unwrap();
    assert_eq!(r.load(OFF_BOUND), 0, "one entry sits in level 0");
    let many: Vec<_> = (0..1000).map(|i| user(&format!("u{i}"))).collect();
    bl.rebuild(&many).unwrap();
    let bound = r.load(OFF_BOUND);
    assert!(bound >= 1 && bound <= u64::from(NEW_PROBE), "{bound}");
    assert!(many.iter().all(|e| bl.contains("userid", &e.value, 0)));
    bl.rebuild(&[user("a")]).unwrap();
    assert_eq!(r.load(OFF_BOUND), 0);
}

#[test]
fn leftovers_of_a_dead_writer_do_not_survive_a_rebuild() {
    let w = words(100);
    let (r, bl) = fresh(&w, 100);
    bl.rebuild(&[user("kept")]).unwrap();
    // A writer died in pass 2 of the next rebuild, after writing
    // "ghost" with seq + 1 into some free slot.
    let ghost = Key::hashed(dimension_hash("userid"), b"ghost");
    let public = r.load(OFF_SEQ);
    let mut placed = false;
    bl.any_position(ghost.position(), bl.probe, |slot| {
        let off = bl.slot_off(slot);
        if r.load(off) != 0 {
            return false;
        }
        r.store(off + 8, ghost.k1);
        r.store(off + 16, ghost.k2);
        r.store(off, (TAG_HASH << SEQ_BITS) | (public + 1));
        placed = true;
        true
    });
    assert!(placed);
    assert!(bl.contains("userid", b"ghost", 0), "visible before");
    let rep = bl.rebuild(&[user("kept")]).unwrap();
    assert!(!bl.contains("userid", b"ghost", 0), "gone after");
    assert!(bl.contains("userid", b"kept", 0));
    assert_eq!(rep.removed, 1);
    assert_eq!(rep.kept, 1);
}

#[test]
fn many_dimensions_fall_back_to_checking_all() {
    let w = words(100);
    let (_, bl) = fresh(&w, 100);
    let wide: Vec<_> = (0..20)
        .map(|i| BlacklistEntry::new(format!("d{i}"), "v", None))
        .collect();
    bl.rebuild(&wide).unwrap();
    let d = bl.dimensions_in_use();
    assert!(d.all && !d.ip);
    assert!(wide.iter().all(|e| bl.contains(&e.dimension, b"v", 0)));
    let narrow = vec![
        BlacklistEntry::new("d3", "v", None),
        BlacklistEntry::new("ip", "10.0.0.1", None),
    ];
    bl.rebuild(&narrow).unwrap();
    let d = bl.dimensions_in_use();
    assert!(!d.all && d.ip);
    assert!(d.contains("d3") && d.contains("ip") && !d.contains("d4"));
    assert_eq!(d.hashes().collect::<Vec<_>>(), vec![dimension_hash("d3")]);
    assert!(bl.contains("d3", b"v", 0));
    assert!(!bl.contains("d4", b"v", 0));
}

#[test]
fn duplicates_merge_to_the_longest_expiry() {
    let w = words(10);
    let (_, bl) = fresh(&w, 10);
    let rep = bl
        .rebuild(&[
            BlacklistEntry::new("userid", "a", Some(100)),
            BlacklistEntry::new("userid", "a", Some(300)),
            BlacklistEntry::new("userid", "a", Some(200)),
            BlacklistEntry::new("ip", "1.2.3.4", Some(100)),
            BlacklistEntry::new("ip", "::ffff:1.2.3.4", None),
        ])
        .unwrap();
    assert_eq!((rep.entries, rep.merged_duplicates), (2, 3));
    assert!(bl.contains("userid", b"a", 299));
    assert!(!bl.contains("userid", b"a", 300));
    assert!(bl.contains("ip", b"1.2.3.4", u64::MAX));
}
