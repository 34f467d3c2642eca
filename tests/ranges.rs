//! Address ranges, `allow` and priorities (issue 14).
//!
//! * The matcher with `ip` networks agrees with brute force (every strategy
//!   checked one by one with `IpNet::contains`) on random tables and
//!   addresses, IPv4 and IPv6, networks of many prefix lengths mixed with
//!   exact addresses and another dimension.
//! * Decisions through a real file: only the highest priority present
//!   applies, an `allow` there passes unlimited and is counted by that
//!   strategy alone, equal priorities all apply, the blacklist beats allow.
//! * Blacklist networks: inside blocked, outside not, expiry, the prefix
//!   lengths listed follow the list.
//! * Priorities and `allow` with shared and per-key (`each ip`) strategies
//!   agree with a brute-force reference on random tables: which strategy
//!   allows, which count the request, how many keys each per-key strategy
//!   holds (an allowed request takes none).

#[path = "support/shm.rs"]
mod shm;
#[path = "support/table.rs"]
mod tables;

use std::net::IpAddr;

use proptest::prelude::*;
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::{parse_ip_net, Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::segment::Published;
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::table::{IpKey, Request, RequestOutcome, Scratch, Table};
use shm::{fresh_writer, strategy, table_at};
use tables::ids;

/// A random address near a few bases, so that networks and requests meet:
/// IPv4 in 10.0.0.0/8 and 192.0.2.0/24 style bases, IPv6 in 2001:db8::/32.
fn address(v6: bool, base: u8, bits: u64) -> u128 {
    if v6 {
        let prefix: u128 = 0x2001_0db8 << 96 | u128::from(base) << 88;
        prefix | u128::from(bits) << 8 | u128::from(bits as u8)
    } else {
        0xffff_0000_0000 | u128::from(base) << 24 | u128::from(bits as u32 & 0x00ff_ffff)
    }
}

fn text(addr: u128) -> String {
    IpKey(addr).addr().to_string()
}

/// A network of `len` bits (over the address family's own length) holding
/// `addr`, in canonical text (an exact address for the full length).
fn network(addr: u128, v6: bool, len: u8) -> String {
    let (full, base) = if v6 { (128, 0) } else { (32, 96) };
    let len = len % (full + 1);
    let mask = match base + len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l)),
    };
    let net = text(addr & mask);
    if len == full {
        net
    } else {
        format!("{net}/{len}")
    }
}

/// Table spec: `(v6, base, bits, prefix length, user condition)` per strategy.
type Spec = (bool, u8, u64, u8, Option<u8>);

fn table_of(specs: &[Spec]) -> (Vec<Published>, Table) {
    let published: Vec<Published> = specs
        .iter()
        .enumerate()
        .map(|(i, &(v6, base, bits, len, user))| {
            let mut conds = vec![("ip".to_string(), network(address(v6, base, bits), v6, len))];
            if let Some(u) = user {
                conds.push(("userid".to_string(), format!("u{u}")));
            }
            let pairs: Vec<(&str, &str)> = conds
                .iter()
                .map(|(d, v)| (d.as_str(), v.as_str()))
                .collect();
            let mut s = strategy(
                i as u32 + 1,
                &pairs,
                Algorithm::FixedWindow,
                10,
                Unit::Second,
            );
            s.validate().expect("generated networks are canonical");
            Published {
                strategy: s,
                slot: i as u32,
                generation: 1,
            }
        })
        .collect();
    let table = tables::table_of(published.clone());
    (published, table)
}

fn got_and_want(
    table: &Table,
    published: &[Published],
    addr: u128,
    user: Option<u8>,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<u32>) {
    let ip = text(addr);
    let uid = user.map(|u| format!("u{u}"));
    let values: Vec<Option<&[u8]>> = table
        .dimensions()
        .iter()
        .map(|d| match d.as_str() {
            "ip" => Some(ip.as_bytes()),
            "userid" => uid.as_deref().map(str::as_bytes),
            _ => None, // `ip/<len>`: the matcher masks the address itself
        })
        .collect();
    let got: Vec<u32> = ids(table, &table.matching(&values));
    // The same through the working space every request reuses.
    let reused: Vec<u32> = ids(table, &table.matching_with(&values, scratch));
    assert_eq!(got, reused, "{ip} after earlier requests");
    let want = published
        .iter()
        .filter(|p| {
            p.strategy
                .conditions
                .iter()
                .all(|c| match c.dimension.as_str() {
                    "ip" => parse_ip_net(&c.value).unwrap().contains(addr),
                    _ => uid.as_deref().map(str::as_bytes) == Some(&c.value[..]),
                })
        })
        .map(|p| p.strategy.id)
        .collect();
    (got, want)
}

fn spec() -> impl proptest::strategy::Strategy<Value = Spec> {
    (
        any::<bool>(),
        0u8..3,
        any::<u64>(),
        prop_oneof![0u8..=128, 8u8..=32, Just(24u8), Just(128u8)],
        proptest::option::of(0u8..3),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn ranges_match_like_brute_force(
        specs in proptest::collection::vec(spec(), 0..80),
        requests in proptest::collection::vec((any::<bool>(), 0u8..3, any::<u64>(), proptest::option::of(0u8..4)), 1..40),
        near in any::<proptest::sample::Index>(),
    ) {
        let (published, table) = table_of(&specs);
        let mut scratch = Scratch::default();
        for (v6, base, bits, user) in requests {
            let (got, want) = got_and_want(&table, &published, address(v6, base, bits), user, &mut scratch);
            prop_assert_eq!(got, want);
        }
        // Addresses inside the table's own networks (and their neighbours).
        if !specs.is_empty() {
            let (v6, base, bits, _, user) = specs[near.index(specs.len())];
            let addr = address(v6, base, bits);
            for a in [addr, addr ^ 1, addr ^ 0x100, addr ^ 0x1_0000_0000] {
                let (got, want) = got_and_want(&table, &published, a, user, &mut scratch);
                prop_assert_eq!(got, want);
            }
        }
    }
}

/// 24 prefix lengths over 10,000 networks: one probe per length, and the
/// matches are still right.
#[test]
fn many_ranges_of_many_lengths() {
    let specs: Vec<Spec> = (0..10_000u64)
        .map(|i| {
            (
                i % 5 == 0,
                (i % 3) as u8,
                i * 0x9e37_79b9,
                8 + (i % 24) as u8,
                None,
            )
        })
        .collect();
    let (published, table) = table_of(&specs);
    assert!(
        table
            .dimensions()
            .iter()
            .filter(|d| d.starts_with("ip/"))
            .count()
            <= 48
    );
    let mut scratch = Scratch::default();
    for (i, &(v6, base, bits, _, _)) in specs.iter().enumerate().step_by(97) {
        let (got, want) = got_and_want(
            &table,
            &published,
            address(v6, base, bits),
            None,
            &mut scratch,
        );
        assert_eq!(got, want, "spec {i}");
        assert!(got.contains(&(i as u32 + 1)));
    }
}

fn with(id: u32, conds: &[(&str, &str)], rate: u64, priority: i32, action: Action) -> Strategy {
    let mut s = strategy(id, conds, Algorithm::FixedWindow, rate, Unit::Hour);
    s.priority = priority;
    s.action = action;
    s.validate().unwrap();
    s
}

const REJECT: Action = Action::Reject { status: None };

fn decide(t: &Table, ip: &str, user: &str, now_ms: u64) -> RequestOutcome {
    let values: Vec<Option<&[u8]>> = t
        .dimensions()
        .iter()
        .map(|d| match d.as_str() {
            "userid" => Some(user.as_bytes()),
            "ip" => Some(ip.as_bytes()),
            _ => None,
        })
        .collect();
    let ip: IpAddr = ip.parse().unwrap();
    t.decide(&Request {
        values: &values[..],
        ip: Some(ip.into()),
        now_ns: now_ms * 1_000_000,
        now_unix_ms: now_ms,
        dry_run: false,
        quota: false,
    })
    .outcome
}

fn passed(t: &Table, id: u32) -> (u64, u64) {
    let c = t.strategies().iter().find(|c| c.strategy.id == id).unwrap();
    let slots = t.mapping().unwrap().slots();
    let k = Slot::at(&slots, c.slot).unwrap().counters();
    (k.passed, k.limited)
}

fn id_of(o: &RequestOutcome) -> Option<(&'static str, u32)> {
    match o {
        RequestOutcome::Allowed { id } => Some(("allowed", *id)),
        RequestOutcome::Limited(d) => match d.verdict {
            rate_ctl::core::admit::Verdict::Pass => Some(("pass", d.passed_by.unwrap_or(0))),
            rate_ctl::core::admit::Verdict::Reject { id, .. } => Some(("reject", id)),
            rate_ctl::core::admit::Verdict::Delay { id, .. } => Some(("delay", id)),
        },
        _ => None,
    }
}

/// What each request from `ips` in turn (user `x`, at 10 ms) comes to.
fn outcomes(t: &Table, ips: &[&str]) -> Vec<Option<(&'static str, u32)>> {
    ips.iter()
        .map(|ip| id_of(&decide(t, ip, "x", 10)))
        .collect()
}

#[test]
fn the_highest_priority_present_decides_and_allow_wins_there() {
    let (_dir, path, mut w) = fresh_writer();
    let list = [
        // Everyone in 10/8: 2 an hour.
        with(1, &[("ip", "10.0.0.0/8")], 2, 0, REJECT),
        // The office: never limited (same priority as the limit).
        with(2, &[("ip", "10.1.0.0/16")], 1, 0, Action::Allow),
        // The VIP: 5 an hour instead of 2.
        with(3, &[("userid", "vip")], 5, 10, REJECT),
        // Equal priorities all apply: a second limit at 0 for user "two".
        with(4, &[("userid", "two")], 3, 0, REJECT),
        // An allow below the VIP's priority does not exempt the VIP.
        with(5, &[("ip", "10.2.0.0/16")], 1, 0, Action::Allow),
    ];
    w.publish(&list, &[BlacklistEntry::new("ip", "10.1.9.0/24", None)], 1)
        .unwrap();
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);

    // The office passes 100 requests, counted by the allow alone.
    assert_eq!(
        outcomes(&t, &["10.1.2.3"; 100]),
        [Some(("allowed", 2)); 100]
    );
    assert_eq!(passed(&t, 2), (100, 0));
    assert_eq!(passed(&t, 1), (0, 0), "the limit never saw the office");
    // The blacklist beats allow.
    assert!(matches!(
        decide(&t, "10.1.9.7", "x", 10),
        RequestOutcome::Blacklisted { .. }
    ));
    // Elsewhere in 10/8: two, then rejected.
    assert_eq!(
        outcomes(&t, &["10.3.0.1"; 4]),
        [
            Some(("pass", 1)),
            Some(("pass", 1)),
            Some(("reject", 1)),
            Some(("reject", 1))
        ]
    );
    // Outside 10/8 nothing applies.
    assert_eq!(decide(&t, "11.0.0.1", "x", 10), RequestOutcome::NoMatch);
    // The VIP inside the allowed 10.2/16 (priority 0) and inside the 10/8
    // limit: priority 10 alone applies, five then rejected by 3.
    let vip: Vec<_> = (0..6)
        .map(|_| id_of(&decide(&t, "10.2.0.1", "vip", 10)))
        .collect();
    assert_eq!(vip[..5], [Some(("pass", 3)); 5]);
    assert_eq!(vip[5], Some(("reject", 3)));
    assert_eq!(
        passed(&t, 5),
        (0, 0),
        "the allow below the VIP's level is not counted"
    );
    // Equal priorities: user "two" in 11/8 is under strategy 4 only (3 an
    // hour); in 10.4/16 under 1 and 4: 1 is exhausted, so rejected, and a
    // rejected request is counted by no strategy.
    let before = passed(&t, 4);
    assert_eq!(
        id_of(&decide(&t, "10.4.0.1", "two", 10)),
        Some(("reject", 1))
    );
    assert_eq!(
        passed(&t, 4),
        before,
        "a rejected request is counted by no strategy"
    );
}

/// Strategies without conditions match every request without a lookup;
/// that shortcut must keep ranking (a priority or an `allow` among them),
/// per-key limits, shared limits and the blacklist as they are with
/// conditions.
#[test]
fn tables_without_conditions_rank_limit_per_key_and_blacklist() {
    let (_dir, path, mut w) = fresh_writer();
    let mut e = Reader::new(&path);
    let mut per_ip = with(1, &[], 2, 0, REJECT);
    per_ip.each = rate_ctl::core::model::each::Each::of(&["ip"]);
    // Per client: 2 an hour.
    w.publish(
        std::slice::from_ref(&per_ip),
        &[BlacklistEntry::new("ip", "10.9.0.0/16", None)],
        1,
    )
    .unwrap();
    let t = table_at(&mut e, 1);
    for ip in ["10.0.0.1", "10.0.0.2"] {
        let got: Vec<_> = (0..3).map(|_| id_of(&decide(&t, ip, "x", 10))).collect();
        assert_eq!(
            got,
            [Some(("pass", 1)), Some(("pass", 1)), Some(("reject", 1))],
            "{ip}"
        );
    }
    assert!(matches!(
        decide(&t, "10.9.0.1", "x", 10),
        RequestOutcome::Blacklisted { .. }
    ));
    // A shared limit beside it: both apply; the first to refuse refuses.
    let shared = with(2, &[], 3, 0, REJECT);
    w.publish(&[per_ip.clone(), shared.clone()], &[], 2)
        .unwrap();
    let t = table_at(&mut e, 2);
    assert_eq!(
        outcomes(&t, &["10.0.0.3", "10.0.0.3", "10.0.0.4", "10.0.0.5"]),
        [
            Some(("pass", 1)),
            Some(("pass", 1)),
            Some(("pass", 1)),
            Some(("reject", 2))
        ]
    );
    // An allow at a higher priority, without conditions either: every
    // request passes on it, counted by it alone.
    let allow = with(3, &[], 1, 5, Action::Allow);
    w.publish(&[per_ip, shared, allow], &[], 3).unwrap();
    let t = table_at(&mut e, 3);
    assert_eq!(outcomes(&t, &["10.0.0.6"; 5]), [Some(("allowed", 3)); 5]);
    assert_eq!(passed(&t, 3), (5, 0));
}

#[test]
fn blacklist_networks_block_inside_only_and_expire() {
    let (_dir, path, mut w) = fresh_writer();
    w.publish(
        &[],
        &[
            BlacklistEntry::new("ip", "203.0.113.0/24", Some(5_000)),
            BlacklistEntry::new("ip", "2001:db8::/32", None),
            BlacklistEntry::new("ip", "198.51.100.7", None),
        ],
        1,
    )
    .unwrap();
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);
    let bl = rate_ctl::core::blacklist::Blacklist::open(t.mapping().unwrap().blacklist()).unwrap();
    assert_eq!(bl.prefix_lengths(), vec![32, 120]);
    let at = |ip: &str, ms: u64| bl.contains_ip(ip.parse().unwrap(), ms);
    assert!(at("203.0.113.0", 1) && at("203.0.113.255", 4_999));
    assert!(!at("203.0.113.5", 5_000), "expired");
    assert!(!at("203.0.112.255", 1) && !at("203.0.114.0", 1));
    assert!(at("::ffff:203.0.113.9", 1), "IPv4-mapped IPv6 is IPv4");
    assert!(at("2001:db8:ffff::1", 1) && !at("2001:db9::1", 1));
    assert!(at("198.51.100.7", 1) && !at("198.51.100.8", 1));
    assert!(matches!(
        decide(&t, "203.0.113.77", "x", 10),
        RequestOutcome::Blacklisted { .. }
    ));
    // The list narrows: the lengths no entry uses are no longer probed.
    w.publish(&[], &[BlacklistEntry::new("ip", "203.0.113.0/24", None)], 2)
        .unwrap();
    assert_eq!(bl.prefix_lengths(), vec![120]);
    assert!(!at("2001:db8::1", 1));
    // Host bits set: refused, naming the network.
    let e = w
        .publish(&[], &[BlacklistEntry::new("ip", "203.0.113.1/24", None)], 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("203.0.113.0/24"), "{e}");
}

/// Strategy spec for the priority reference: `(v6, base, bits, prefix
/// length, priority, kind)`, kind 0 = allow, 1 = shared limit, 2 = per-key
/// limit (`each ip`, default /32 and /64 keys).
type RankSpec = (bool, u8, u64, u8, i32, u8);

fn rank_spec() -> impl proptest::strategy::Strategy<Value = RankSpec> {
    (
        any::<bool>(),
        0u8..3,
        any::<u64>(),
        prop_oneof![0u8..=128, 8u8..=32, Just(24u8), Just(128u8)],
        0i32..3,
        0u8..3,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn priority_and_allow_with_per_key_strategies_agree_with_brute_force(
        specs in proptest::collection::vec(rank_spec(), 1..24),
        requests in proptest::collection::vec((any::<bool>(), 0u8..3, any::<u64>()), 1..24),
        near in proptest::collection::vec(any::<proptest::sample::Index>(), 1..8),
    ) {
        let list: Vec<(Strategy, u128)> = specs
            .iter()
            .enumerate()
            .map(|(i, &(v6, base, bits, len, priority, kind))| {
                let addr = address(v6, base, bits);
                let net = network(addr, v6, len);
                // Never limits within the test: only who counts matters.
                let mut s = with(i as u32 + 1, &[("ip", &net)], 1000, priority, match kind {
                    0 => Action::Allow,
                    _ => REJECT,
                });
                if kind == 2 {
                    s.each = rate_ctl::core::model::each::Each::of(&["ip"]);
                }
                (s, addr)
            })
            .collect();
        let (_dir, path, mut w) = fresh_writer();
        let strategies: Vec<Strategy> = list.iter().map(|(s, _)| s.clone()).collect();
        w.publish(&strategies, &[], 1).unwrap();
        let mut e = Reader::new(&path);
        let t = table_at(&mut e, 1);

        let mut addrs: Vec<u128> = requests.iter().map(|&(v6, base, bits)| address(v6, base, bits)).collect();
        addrs.extend(near.iter().map(|i| list[i.index(list.len())].1));
        let mut want_passed = vec![0u64; list.len()];
        let mut want_keys = vec![std::collections::BTreeSet::new(); list.len()];
        for addr in addrs {
            // The reference: every strategy checked one by one.
            let matched: Vec<usize> = (0..list.len())
                .filter(|&i| parse_ip_net(&list[i].0.conditions[0].value).unwrap().contains(addr))
                .collect();
            let top = matched.iter().map(|&i| list[i].0.priority).max();
            let at_top: Vec<usize> = matched.into_iter().filter(|&i| Some(list[i].0.priority) == top).collect();
            let allow = at_top.iter().copied().find(|&i| list[i].0.action == Action::Allow);
            let got = decide(&t, &text(addr), "x", 10);
            match allow {
                Some(i) => {
                    prop_assert_eq!(&got, &RequestOutcome::Allowed { id: i as u32 + 1 });
                    want_passed[i] += 1;
                }
                None if at_top.is_empty() => prop_assert_eq!(&got, &RequestOutcome::NoMatch),
                None => {
                    let is_pass = matches!(&got, RequestOutcome::Limited(d) if d.verdict == rate_ctl::core::admit::Verdict::Pass);
                    prop_assert!(is_pass, "{:?}", got);
                    for i in at_top {
                        want_passed[i] += 1;
                        if list[i].0.each.is_keyed() {
                            // /32 for IPv4, /64 for IPv6 (IPv4 is mapped).
                            let v4 = addr >> 32 == 0xffff;
                            want_keys[i].insert(if v4 { addr } else { addr >> 64 });
                        }
                    }
                }
            }
        }
        let keys = t.mapping().unwrap().keys();
        for (i, (s, _)) in list.iter().enumerate() {
            prop_assert_eq!(passed(&t, s.id), (want_passed[i], 0), "strategy {}", s.id);
            let slot = t.strategies().iter().find(|c| c.strategy.id == s.id).unwrap().slot;
            prop_assert_eq!(keys.counters(slot).in_use, want_keys[i].len() as u64, "keys of strategy {}", s.id);
        }
    }
}
