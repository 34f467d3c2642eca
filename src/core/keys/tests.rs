use std::net::IpAddr;
use std::sync::atomic::Ordering;

use super::*;
use crate::core::limiter::Now;
use crate::core::model::{Action, Algorithm, Strategy, Unit};
use crate::core::shm::slot::{LocalSlots, Slot};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_000 * S;

fn limiter(algorithm: Algorithm, rate: u64, per: Unit, burst: u32) -> KeyLimiter {
    let s = Strategy::unconditioned(algorithm, rate, per, burst, Action::Reject { status: None })
        .unwrap();
    KeyLimiter::from_strategy(&s).unwrap()
}

struct Fixture {
    words: Vec<AtomicU64>,
    slots: LocalSlots,
    capacity: u64,
}

impl Fixture {
    fn new(capacity: u64) -> Fixture {
        let slots = LocalSlots::new(8);
        for i in 0..8 {
            Slot::at(&slots.region(), i).unwrap().reset(i + 1, 1);
        }
        Fixture {
            words: KeyTable::local_words(8, capacity),
            slots,
            capacity,
        }
    }

    fn table(&self) -> KeyTable<'_> {
        KeyTable::local(aligned(&self.words), 8, self.capacity, [7; 16])
    }
}

fn key(t: &KeyTable, slot: u32, parts: &[&[u8]]) -> KeyId {
    let mut h = t.hasher(100 + slot);
    for p in parts {
        h.part(p);
    }
    t.key(h, slot, 1).unwrap()
}

/// The keys `{prefix}{i}` of stat slot `slot`, `i` in `range`.
fn named<'t>(
    t: &'t KeyTable,
    slot: u32,
    prefix: &'t str,
    range: std::ops::Range<u32>,
) -> impl Iterator<Item = KeyId> + 't {
    range.map(move |i| key(t, slot, &[format!("{prefix}{i}").as_bytes()]))
}

fn charge(t: &KeyTable, f: &Fixture, k: &KeyId, l: &KeyLimiter, now: u64) -> Charge {
    t.charge(k, l, Now::from(now), false, &f.slots.region(), |_| Some(l))
}

fn admitted(c: Charge) -> bool {
    matches!(c, Charge::Admitted { .. })
}

#[test]
fn ip_prefixes_aggregate() {
    let p = |s: &str, v4, v6| IpPrefix::new(s.parse::<IpAddr>().unwrap(), v4, v6);
    assert_eq!(p("203.0.113.7", 32, 64).to_string(), "203.0.113.7");
    assert_eq!(p("203.0.113.7", 24, 64).to_string(), "203.0.113.0/24");
    assert_eq!(p("::ffff:203.0.113.7", 24, 64), p("203.0.113.9", 24, 64));
    assert_eq!(
        p("2001:db8:1:2:aaaa::1", 32, 64).to_string(),
        "2001:db8:1:2::/64"
    );
    assert_eq!(
        p("2001:db8:1:2:aaaa::1", 32, 64),
        p("2001:db8:1:2:ffff::9", 32, 64)
    );
    assert_ne!(p("2001:db8:1:2::1", 32, 64), p("2001:db8:1:3::1", 32, 64));
    assert_eq!(p("2001:db8::1", 32, 128).to_string(), "2001:db8::1");
    // The prefix length is part of the key: /24 and /25 of one address differ.
    assert_ne!(p("10.0.0.1", 24, 64).bytes(), p("10.0.0.1", 25, 64).bytes());
}

#[test]
fn tuples_are_length_prefixed_and_strategies_separate() {
    let f = Fixture::new(64);
    let t = f.table();
    assert_ne!(key(&t, 0, &[b"ab", b"c"]), key(&t, 0, &[b"a", b"bc"]));
    assert_eq!(key(&t, 0, &[b"ab", b"c"]), key(&t, 0, &[b"ab", b"c"]));
    assert_ne!(key(&t, 0, &[b"x"]).ident, key(&t, 1, &[b"x"]).ident);
    // Another secret puts keys elsewhere.
    let other = KeyTable::local(aligned(&f.words), 8, 64, [8; 16]);
    assert_ne!(key(&t, 0, &[b"x"]), key(&other, 0, &[b"x"]));
}

#[test]
fn keys_have_separate_exact_buckets() {
    let f = Fixture::new(1024);
    let t = f.table();
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Minute, 3);
    for name in [&b"alice"[..], b"bob", b"carol"] {
        let k = key(&t, 0, &[name]);
        let n = (0..10)
            .filter(|_| admitted(charge(&t, &f, &k, &l, T0)))
            .count();
        assert_eq!(n, 3, "{}", String::from_utf8_lossy(name));
    }
    assert_eq!(t.counters(0).in_use, 3);
    assert_eq!(t.stats().occupied, 3);
    // One minute later alice has exactly one more.
    let k = key(&t, 0, &[b"alice"]);
    let n = (0..5)
        .filter(|_| admitted(charge(&t, &f, &k, &l, T0 + 60 * S)))
        .count();
    assert_eq!(n, 1);
}

#[test]
fn a_limited_key_survives_a_flood_of_new_keys() {
    let cap = 64;
    let f = Fixture::new(cap);
    let t = f.table();
    // 1 per 10 s, burst 2.
    let l = limiter(Algorithm::TokenBucket, 6, Unit::Minute, 2);
    let a = key(&t, 0, &[b"A"]);
    assert!(admitted(charge(&t, &f, &a, &l, T0)));
    assert!(admitted(charge(&t, &f, &a, &l, T0)));
    assert!(!admitted(charge(&t, &f, &a, &l, T0)));
    // 10× the capacity of new keys, each charged once (not fresh after).
    let mut full = 0;
    for i in 0..10 * cap {
        let k = key(&t, 0, &[format!("new{i}").as_bytes()]);
        if charge(&t, &f, &k, &l, T0 + S) == Charge::Full {
            full += 1;
            t.count_full(0, false);
        }
    }
    assert!(
        full >= 9 * cap,
        "{full} of {} new keys found the table full",
        10 * cap
    );
    assert_eq!(t.counters(0).full, full);
    assert_eq!(t.stats().occupied, cap);
    assert!(t.stats().max_probe <= PROBE);
    // A is still limited until one interval (10 s) after its last token.
    for dt in [S, 5 * S, 10 * S - 1] {
        assert!(
            matches!(charge(&t, &f, &a, &l, T0 + dt), Charge::Rejected { .. }),
            "A admitted at +{dt} ns"
        );
    }
    assert!(admitted(charge(&t, &f, &a, &l, T0 + 10 * S)));
    assert!(!admitted(charge(&t, &f, &a, &l, T0 + 10 * S)));
}

#[test]
fn entries_are_reused_only_when_fresh() {
    let cap = 8; // one probe range: every key competes for the same 8 entries
    let f = Fixture::new(cap);
    let t = f.table();
    let l = limiter(Algorithm::FixedWindow, 2, Unit::Minute, 1);
    let start = 60 * 1000 * S;
    let keys: Vec<KeyId> = (0..8)
        .map(|i| key(&t, 0, &[format!("k{i}").as_bytes()]))
        .collect();
    for k in &keys {
        assert!(admitted(charge(&t, &f, k, &l, start)));
    }
    let newcomer = key(&t, 0, &[b"late"]);
    assert_eq!(charge(&t, &f, &newcomer, &l, start + S), Charge::Full);
    // The window is over: every old key is fresh, the newcomer reclaims one.
    let next = start + 60 * S;
    assert!(admitted(charge(&t, &f, &newcomer, &l, next)));
    assert_eq!(t.counters(0).reclaims, 1);
    assert_eq!(t.counters(0).in_use, 8);
    // A key whose window is still open is never reclaimed: fill the range
    // in the new window, then one more key finds it full.
    for k in &keys[..7] {
        assert!(admitted(charge(&t, &f, k, &l, next)));
    }
    let last = key(&t, 0, &[b"last"]);
    assert_eq!(charge(&t, &f, &last, &l, next + S), Charge::Full);
}

#[test]
fn a_stale_reference_never_touches_another_key() {
    let cap = 8;
    let f = Fixture::new(cap);
    let t = f.table();
    let l = limiter(Algorithm::Concurrency, 1, Unit::Second, 1);
    let fl = limiter(Algorithm::FixedWindow, 1, Unit::Minute, 1);
    let start = 60 * 1000 * S;
    // Fill the range with fixed-window keys of slot 1, then let them expire.
    let olds: Vec<KeyId> = (0..8)
        .map(|i| key(&t, 1, &[format!("o{i}").as_bytes()]))
        .collect();
    let mut refs = Vec::new();
    for k in &olds {
        match t.charge(k, &fl, Now::from(start), false, &f.slots.region(), |_| {
            Some(&fl)
        }) {
            Charge::Admitted {
                at, token, prev, ..
            } => refs.push((at, token, prev)),
            other => panic!("{other:?}"),
        }
    }
    // A concurrency key of slot 0 takes one of those entries a minute later.
    let c = key(&t, 0, &[b"c"]);
    let owner = |s: u32| if s == 0 { Some(&l) } else { Some(&fl) };
    let now = Now::from(start + 60 * S);
    let Charge::Admitted { at, .. } = t.charge(&c, &l, now, false, &f.slots.region(), owner) else {
        panic!("not admitted")
    };
    // Stale refunds of the old keys never reach it.
    for (r, token, prev) in refs {
        t.refund(r, &fl, token, prev);
    }
    assert_eq!(t.peek(&c), Some(1));
    assert!(matches!(
        t.charge(&c, &l, now, false, &f.slots.region(), owner),
        Charge::Rejected { .. }
    ));
    t.release(at, &l);
    assert_eq!(t.peek(&c), Some(0));
}

#[test]
fn a_removed_strategy_frees_its_keys() {
    let cap = 8;
    let f = Fixture::new(cap);
    let t = f.table();
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Hour, 1);
    for i in 0..8 {
        let k = key(&t, 2, &[format!("r{i}").as_bytes()]);
        assert!(admitted(charge(&t, &f, &k, &l, T0)));
    }
    let k = key(&t, 3, &[b"new"]);
    assert_eq!(charge(&t, &f, &k, &l, T0), Charge::Full);
    // Slot 2 goes to another strategy (new generation): its keys are free.
    Slot::at(&f.slots.region(), 2).unwrap().reset(99, 2);
    assert!(admitted(charge(&t, &f, &k, &l, T0)));
}

#[test]
fn refund_gives_the_admission_back() {
    let f = Fixture::new(64);
    let t = f.table();
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Hour, 2);
    let k = key(&t, 0, &[b"x"]);
    let Charge::Admitted {
        at, token, prev, ..
    } = charge(&t, &f, &k, &l, T0)
    else {
        panic!()
    };
    t.refund(at, &l, token, prev);
    assert_eq!(t.peek(&k), Some(0));
    assert!(admitted(charge(&t, &f, &k, &l, T0)));
    assert!(admitted(charge(&t, &f, &k, &l, T0)));
    assert!(!admitted(charge(&t, &f, &k, &l, T0)));
}

#[test]
fn threads_racing_on_keys_admit_exactly_the_allowance() {
    let cap = 256;
    let f = Fixture::new(cap);
    let t = f.table();
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Hour, 5);
    let keys: Vec<KeyId> = (0..40)
        .map(|i| key(&t, 0, &[format!("k{i}").as_bytes()]))
        .collect();
    let admits: Vec<AtomicU64> = (0..keys.len()).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20 {
                    for (i, k) in keys.iter().enumerate() {
                        if admitted(charge(&t, &f, k, &l, T0)) {
                            admits[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for a in &admits {
        assert_eq!(a.load(Ordering::Relaxed), 5);
    }
}

#[test]
fn the_ip_part_is_the_aggregated_prefix() {
    let f = Fixture::new(64);
    let t = f.table();
    for (text, v4, v6) in [
        ("203.0.113.7", 24, 64),
        ("::ffff:203.0.113.7", 32, 64),
        ("2001:db8:1:2:3::9", 32, 56),
        ("2001:db8::1", 32, 128),
    ] {
        let addr: IpAddr = text.parse().unwrap();
        let mut a = t.hasher(3);
        a.ip(crate::core::table::IpKey::from(addr).0, v4, v6);
        let mut b = t.hasher(3);
        IpPrefix::new(addr, v4, v6).hash_into(&mut b);
        assert_eq!(t.key(a, 0, 1), t.key(b, 0, 1), "{text}");
    }
    let ip = |text: &str, v4: u8, v6: u8| {
        let mut h = t.hasher(3);
        let addr: IpAddr = text.parse().unwrap();
        h.ip(crate::core::table::IpKey::from(addr).0, v4, v6);
        t.key(h, 0, 1)
    };
    // Same network, same key; another prefix length or address, another.
    assert_eq!(ip("203.0.113.7", 24, 64), ip("203.0.113.99", 24, 64));
    assert_ne!(ip("203.0.113.7", 24, 64), ip("203.0.113.7", 25, 64));
    assert_ne!(ip("203.0.113.7", 32, 64), ip("203.0.113.8", 32, 64));
    assert_eq!(ip("2001:db8::1", 32, 64), ip("2001:db8::2", 32, 64));
    assert_ne!(ip("2001:db8::1", 32, 64), ip("2001:db8::1", 32, 65));
    assert_ne!(ip("2001:db8:0:1::1", 32, 64), ip("2001:db8::1", 32, 64));
}

/// A key whose range is the table's last line and the first (the probe
/// range wraps) is found again, charged on its own entry, and its
/// neighbours of the last line stay apart from it.
#[test]
fn a_range_that_wraps_keeps_its_keys() {
    let f = Fixture::new(64);
    let t = f.table();
    let l = limiter(Algorithm::FixedWindow, 2, Unit::Hour, 0);
    let last: Vec<KeyId> = (0u32..)
        .map(|i| key(&t, 0, &[&i.to_le_bytes()]))
        .filter(|k| k.start == 60)
        .take(6)
        .collect();
    // Six keys in a range of eight: four on the last line, two wrapped.
    for k in &last {
        assert!(admitted(charge(&t, &f, k, &l, T0)));
    }
    for k in &last {
        assert!(admitted(charge(&t, &f, k, &l, T0)), "second request");
        assert!(
            matches!(charge(&t, &f, k, &l, T0), Charge::Rejected { .. }),
            "third request of a key with 2 an hour"
        );
        assert!(t.peek(k).is_some());
    }
    // Two of them live in the first line (wrapped).
    let wrapped = (0..4).filter(|&i| t.load(i).0 != 0).count();
    assert_eq!(wrapped, 2);
}

/// The key table keeps its promise (issue 28): a new key finds an entry
/// while the table is below 90 % occupied. 1,048,576 entries, random keys
/// each charged once (a fixed window of 5 an hour: never fresh again, so
/// never reclaimed), the share refused by occupancy band. Bar: fewer than
/// 0.01 % of 900,000 new keys refused. (One window of 8 entries refused
/// 0.64 % up to 50 %, 7.7 % up to 80 %.)
#[test]
fn new_keys_find_an_entry_until_90_percent() {
    let cap = 1u64 << 20;
    let f = Fixture::new(cap);
    let t = f.table();
    let l = limiter(Algorithm::FixedWindow, 5, Unit::Hour, 0);
    let marks = [cap / 2, cap * 8 / 10, cap * 9 / 10];
    let mut tried = 0u64;
    let mut refused = 0u64;
    let mut refused_first_900k = None;
    let mut at_marks = Vec::new();
    let mut i = 0u64;
    while t.stats().occupied < marks[2] {
        let k = key(&t, 0, &[&i.to_le_bytes()]);
        i += 1;
        tried += 1;
        match charge(&t, &f, &k, &l, T0) {
            Charge::Full => refused += 1,
            c => assert!(admitted(c), "{c:?}"),
        }
        if tried == 900_000 {
            refused_first_900k = Some(refused);
        }
        let occ = t.stats().occupied;
        if at_marks.len() < marks.len() && occ >= marks[at_marks.len()] {
            at_marks.push((tried, refused));
        }
    }
    let share = |r: u64, n: u64| 100.0 * r as f64 / n as f64;
    for (pct, (n, r)) in [50, 80, 90].iter().zip(&at_marks) {
        eprintln!(
            "up to {pct} % occupied: {r} of {n} new keys refused ({:.4} %)",
            share(*r, *n)
        );
    }
    let r900 = refused_first_900k.expect("900,000 keys tried");
    eprintln!("first 900,000 new keys: {r900} refused");
    assert_eq!(at_marks[0].1, 0, "none refused up to 50 %");
    assert!(at_marks[1].1 <= 5, "up to 80 %: {:?}", at_marks[1]);
    assert!(
        r900 < 90,
        "{r900} of 900,000 new keys refused (bar: < 0.01 %)"
    );
    assert_eq!(t.counters(0).in_use, t.stats().occupied);
    // Every placed key is found again, charged on its own entry.
    for j in (0..i).step_by(997) {
        let k = key(&t, 0, &[&j.to_le_bytes()]);
        if let Some(w) = t.peek(&k) {
            assert_ne!(w, 0);
        }
    }
}

fn charge_capped(
    t: &KeyTable,
    f: &Fixture,
    k: &KeyId,
    l: &KeyLimiter,
    max_keys: u32,
    now: u64,
) -> Charge {
    t.charge_capped(
        k,
        l,
        max_keys,
        Now::from(now),
        false,
        1,
        &f.slots.region(),
        |_| Some(l),
    )
}

#[test]
fn a_capped_strategy_floods_only_itself() {
    let f = Fixture::new(4096);
    let t = f.table();
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Minute, 1);
    // Strategy A (slot 0, max_keys 100): 1,000 distinct keys, each limited
    // (not fresh), so none can be reused.
    let mut got = 0;
    for (i, k) in named(&t, 0, "a", 0..1000).enumerate() {
        match charge_capped(&t, &f, &k, &l, 100, T0) {
            Charge::Admitted { .. } => got += 1,
            Charge::Full => {}
            c => panic!("key a{i}: {c:?}"),
        }
    }
    assert_eq!(got, 100, "A's new keys with an entry");
    let a = t.counters(0);
    assert_eq!(a.in_use, 100);
    assert_eq!(a.capped, 900, "A's extra keys go to its on_full");
    // A key of A that has its entry is still charged there (limited).
    let k = key(&t, 0, &[b"a0"]);
    assert!(matches!(
        charge_capped(&t, &f, &k, &l, 100, T0),
        Charge::Rejected { .. }
    ));
    // Strategy B (slot 1, default cap: half of 4,096): its new keys get
    // their own entries while A is at its cap.
    for (i, k) in named(&t, 1, "b", 0..500).enumerate() {
        assert!(
            admitted(charge_capped(&t, &f, &k, &l, 0, T0)),
            "B's key b{i} found no entry"
        );
    }
    assert_eq!(t.counters(1).in_use, 500);
    assert_eq!(t.counters(1).capped, 0);
    assert_eq!(t.counters(0).in_use, 100);
    // Two minutes later A's keys are fresh: a new key of A reuses one of
    // A's own entries (its count stays at the cap), never B's.
    let reused = named(&t, 0, "a", 1000..1100)
        .filter(|k| admitted(charge_capped(&t, &f, k, &l, 100, T0 + 120 * S)))
        .count();
    assert!(reused > 0, "no fresh entry of A reused");
    assert_eq!(t.counters(0).in_use, 100);
    assert_eq!(t.counters(1).in_use, 500);
}

#[test]
fn the_default_cap_is_half_the_table() {
    let f = Fixture::new(1024);
    let t = f.table();
    assert_eq!(t.default_cap(), 512);
    assert_eq!(t.cap(0), 512);
    assert_eq!(t.cap(7), 7);
    let l = limiter(Algorithm::TokenBucket, 1, Unit::Minute, 1);
    for k in named(&t, 0, "a", 0..2000) {
        charge_capped(&t, &f, &k, &l, 0, T0);
    }
    assert_eq!(t.counters(0).in_use, 512);
    assert!(t.counters(0).capped > 0);
    // The other half is there for another strategy's new keys: 400 of
    // them (78 % of the table in use then) all find an entry.
    let got = named(&t, 1, "b", 0..400)
        .filter(|k| admitted(charge_capped(&t, &f, k, &l, 0, T0)))
        .count();
    assert_eq!(got, 400);
}

/// The LOG phase's charge of a key only checked at admission (`count_if`,
/// issue 31) claims its entry then: it honours the strategy's cap as a
/// charge at admission does (the merge of issues 28 and 31 first let it
/// claim past the cap).
#[test]
fn a_charge_after_the_response_honours_the_cap() {
    let f = Fixture::new(4096);
    let t = f.table();
    let l = limiter(Algorithm::FixedWindow, 3, Unit::Hour, 1);
    let clock = l.clock(Now::from(T0));
    let charged = named(&t, 0, "c", 0..10)
        .filter(|k| t.charge_after_key(k, &l, 4, Now::from(T0), clock, 1, &f.slots.region()))
        .count();
    assert_eq!(charged, 4, "keys with an entry");
    assert_eq!(t.counters(0).in_use, 4);
    assert_eq!(t.counters(0).capped, 6);
}
