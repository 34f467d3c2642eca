use super::*;
use crate::core::keys::KeyTable;
use crate::core::model::ban::Ban;

fn words(capacity: u64) -> Vec<AtomicU64> {
    (0..region_bytes(capacity) / 8)
        .map(|_| AtomicU64::new(0))
        .collect()
}

fn hasher() -> crate::core::keys::KeyHasher {
    let kw = KeyTable::local_words(1, 16);
    let kt = KeyTable::local(&kw, 1, 16, [7; 16]);
    kt.hasher(0)
}

const BAN: Ban = Ban {
    after: 3,
    within_s: 10,
    for_s: 30,
};

#[test]
fn three_rejections_within_the_window_ban_until_it_ends() {
    let w = words(64);
    let t = BanTable::new(Region::from_atomics(&w));
    assert_eq!(t.capacity(), 64);
    let key = b"u1";
    let id = ident(hasher(), Kind::UserId, key);
    let now = 1_000_000;
    assert!(!t.any_banned());
    assert_eq!(
        t.count(id, Kind::UserId, key, 9, &BAN, false, now),
        Counted::Counted(1)
    );
    assert_eq!(
        t.count(id, Kind::UserId, key, 9, &BAN, false, now + 1),
        Counted::Counted(2)
    );
    assert!(!t.is_banned(id, Kind::UserId, key, now + 2));
    assert_eq!(
        t.count(id, Kind::UserId, key, 9, &BAN, false, now + 2),
        Counted::Banned {
            until_ms: now + 2 + 30_000,
            count: 3
        }
    );
    assert!(t.any_banned());
    assert!(t.is_banned(id, Kind::UserId, key, now + 3));
    // Another key, the same key as another kind: not banned.
    let other = ident(hasher(), Kind::UserId, b"u2");
    assert!(!t.is_banned(other, Kind::UserId, b"u2", now + 3));
    let as_ip = ident(hasher(), Kind::Ip, key);
    assert!(!t.is_banned(as_ip, Kind::Ip, key, now + 3));
    // Expiry lifts it by itself.
    assert!(!t.is_banned(id, Kind::UserId, key, now + 2 + 30_000));
    let rows = t.banned_rows();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].strategy_id, rows[0].count), (9, 3));
    assert_eq!(key_text(rows[0].kind, &rows[0].key).as_deref(), Some("u1"));
    // The agent's sweep frees it once ended and out of its window.
    assert_eq!(t.sweep(now + 1_000), 0, "still banned");
    assert_eq!(t.sweep(now + 40_000), 1);
    assert!(!t.any_banned());
    assert!(t.banned_rows().is_empty());
}

#[test]
fn rejections_spread_wider_than_the_window_never_ban() {
    let w = words(16);
    let t = BanTable::new(Region::from_atomics(&w));
    let key = b"u1";
    let id = ident(hasher(), Kind::UserId, key);
    for i in 0..10u64 {
        let c = t.count(id, Kind::UserId, key, 1, &BAN, false, i * 6_000);
        assert!(matches!(c, Counted::Counted(1 | 2)), "{i}: {c:?}");
    }
    assert!(!t.any_banned());
}

#[test]
fn a_dry_run_would_ban_and_bans_nobody() {
    let w = words(16);
    let t = BanTable::new(Region::from_atomics(&w));
    let id = ident(hasher(), Kind::UserId, b"x");
    for _ in 0..2 {
        t.count(id, Kind::UserId, b"x", 1, &BAN, true, 5_000);
    }
    assert_eq!(
        t.count(id, Kind::UserId, b"x", 1, &BAN, true, 5_000),
        Counted::WouldBan { count: 3 }
    );
    assert!(!t.any_banned() && !t.is_banned(id, Kind::UserId, b"x", 5_001));
    assert_eq!(t.stats().would, 1);
}

#[test]
fn a_full_window_counts_nothing_new_and_keeps_the_bans() {
    // One window: 8 rows for every key.
    let w = words(8);
    let t = BanTable::new(Region::from_atomics(&w));
    let one = Ban { after: 1, ..BAN };
    for i in 0..8u32 {
        let k = format!("u{i}");
        let id = ident(hasher(), Kind::UserId, k.as_bytes());
        assert!(matches!(
            t.count(id, Kind::UserId, k.as_bytes(), 1, &one, false, 1_000),
            Counted::Banned { .. }
        ));
    }
    let id = ident(hasher(), Kind::UserId, b"late");
    assert_eq!(
        t.count(id, Kind::UserId, b"late", 1, &one, false, 1_000),
        Counted::Full
    );
    assert_eq!(t.stats().full, 1);
    assert_eq!(t.stats().banned_rows, 8);
    let id0 = ident(hasher(), Kind::UserId, b"u0");
    assert!(t.is_banned(id0, Kind::UserId, b"u0", 2_000));
    // Lifting frees a row for the next key.
    let r = t
        .banned_rows()
        .into_iter()
        .find(|r| r.key == b"u0")
        .unwrap();
    assert!(t.lift(r.index, r.ident));
    assert!(!t.is_banned(id0, Kind::UserId, b"u0", 2_000));
    assert!(matches!(
        t.count(id, Kind::UserId, b"late", 1, &one, false, 2_000),
        Counted::Banned { .. }
    ));
}

#[test]
fn long_keys_and_hostile_rows_are_refused() {
    let w = words(8);
    let t = BanTable::new(Region::from_atomics(&w));
    let long = vec![b'a'; MAX_KEY + 1];
    let id = ident(hasher(), Kind::UserId, &long);
    assert_eq!(
        t.count(id, Kind::UserId, &long, 1, &BAN, false, 0),
        Counted::TooLong
    );
    let exact = vec![b'b'; MAX_KEY];
    let id = ident(hasher(), Kind::UserId, &exact);
    assert_eq!(
        t.count(id, Kind::UserId, &exact, 1, &BAN, false, 0),
        Counted::Counted(1)
    );
    // Garbage written over every word: no panic, nothing read as a ban
    // of a real key, rows with lengths past a row skipped.
    for x in &w {
        x.store(u64::MAX, Ordering::Relaxed);
    }
    let t = BanTable::new(Region::from_atomics(&w));
    assert!(t.banned_rows().is_empty());
    assert!(!t.is_banned(id, Kind::UserId, &exact, 0));
    assert_eq!(
        t.count(id, Kind::UserId, &exact, 1, &BAN, false, 0),
        Counted::Full
    );
    t.sweep(u64::MAX);
    // A region too small for one window is an empty table.
    let small: Vec<AtomicU64> = (0..40).map(|_| AtomicU64::new(0)).collect();
    let t = BanTable::new(Region::from_atomics(&small));
    assert_eq!(t.capacity(), 0);
    assert_eq!(t.count(1, Kind::Ip, b"k", 1, &BAN, false, 0), Counted::Full);
    assert!(!t.is_banned(1, Kind::Ip, b"k", 0));
    assert!(!fits(7, region_bytes(7)) && fits(8, region_bytes(8)) && !fits(8, region_bytes(8) - 1));
    // The header's capacity bounds a larger (page-rounded) region.
    let w = words(64);
    assert_eq!(
        BanTable::with_capacity(Region::from_atomics(&w), 16).capacity(),
        16
    );
    assert_eq!(
        BanTable::with_capacity(Region::from_atomics(&w), 1 << 40).capacity(),
        64
    );
    assert_eq!(
        BanTable::with_capacity(Region::from_atomics(&w), 7).capacity(),
        0
    );
}

#[test]
fn ip_keys_read_back_as_blacklist_text() {
    let p = crate::core::keys::IpPrefix::new("203.0.113.7".parse().unwrap(), 32, 64);
    let (b, n) = p.bytes();
    assert_eq!(key_text(Kind::Ip, &b[..n]).as_deref(), Some("203.0.113.7"));
    let p = crate::core::keys::IpPrefix::new("2001:db8::1".parse().unwrap(), 32, 64);
    let (b, n) = p.bytes();
    assert_eq!(
        key_text(Kind::Ip, &b[..n]).as_deref(),
        Some("2001:db8::/64")
    );
    assert_eq!(key_text(Kind::Ip, b"\x04\x01"), None);
    assert_eq!(key_text(Kind::UserId, b"\xff"), None);
}
