use super::{IpKey, Table};
use crate::core::model::each::Each;
use crate::core::model::{Algorithm, Condition, Strategy, Unit};
use crate::core::shm::segment::MAX_TABLE_DIMENSIONS;
use crate::core::shm::segment::{Decoded, Published};
use std::net::IpAddr;

fn published(id: u32, conds: &[(&str, &str)], each: &[&str]) -> Published {
    let conditions = conds.iter().map(|&(d, v)| Condition::new(d, v)).collect();
    let mut strategy = Strategy::plain(id, conditions, Algorithm::TokenBucket, 10, Unit::Second);
    strategy.each = Each::of(each);
    Published {
        strategy,
        slot: id,
        generation: 1,
    }
}

fn table_of(list: Vec<Published>) -> Table {
    Table::build(
        Decoded {
            publish_seq: 1,
            config_version: 1,
            published_unix_ms: 0,
            strategies: list,
            blacklist_dimensions: Vec::new(),
        },
        None,
    )
}

/// A grid `a=ai AND b=bj` (b anchors nothing) is found by the bytes of
/// the request's b: its group is indexed by bytes, the request's b
/// value is never interned (`req[b]` untouched), and what it matches
/// is the cell. With b anchoring strategies of its own, b is looked up
/// and the group is probed by ids only.
#[test]
fn a_grid_on_a_checked_dimension_is_found_by_its_bytes() {
    let mut list = Vec::new();
    for i in 0..8 {
        for j in 0..6 {
            let (a, b) = (format!("a{i}"), format!("b{j}"));
            list.push(published(1 + i * 6 + j, &[("a", &a), ("b", &b)], &[]));
        }
    }
    let t = table_of(list.clone());
    let by_bytes = |t: &Table| t.groups.iter().filter(|g| g.bytes_dims().is_some()).count();
    assert_eq!((t.groups.len(), by_bytes(&t)), (1, 1));
    let (a, b) = (
        t.dimension_index("a").unwrap(),
        t.dimension_index("b").unwrap(),
    );
    let mut values = vec![None; t.dimensions().len()];
    values[a] = Some(&b"a3"[..]);
    values[b] = Some(&b"b4"[..]);
    let mut scratch = super::Scratch::default();
    scratch.fit(&t);
    scratch.req[b] = 77;
    let ids = |m: Vec<u32>| -> Vec<u32> {
        m.iter()
            .map(|&i| t.strategies()[i as usize].strategy.id)
            .collect()
    };
    assert_eq!(ids(t.matching_with(&values, &mut scratch)), [1 + 3 * 6 + 4]);
    assert_eq!(scratch.req[b], 77, "b was interned");
    values[b] = Some(&b"b6"[..]);
    assert!(t.matching_with(&values, &mut scratch).is_empty());
    // b anchoring something (and a too, so that neither can hand its
    // strategies to the other: see `reanchor`): both looked up, no
    // group by bytes.
    list.push(published(1000, &[("b", "b9")], &[]));
    list.push(published(1001, &[("a", "a9")], &[]));
    let t = table_of(list);
    assert_eq!((t.groups.len(), by_bytes(&t)), (1, 0));
}

/// The friendly table: strategies `ip=X AND api=/xk` beside `api=/login`.
/// `api` is looked up for the latter, so the others are anchored under
/// their api as well and no request looks its address up; a request
/// whose api holds candidates looks it up then. The same for a text
/// dimension (`userid`). And when one strategy names the address
/// alone, the address stays looked up.
#[test]
fn a_dimension_named_beside_looked_up_ones_is_not_looked_up() {
    let mut list = vec![published(1, &[("api", "/login")], &[])];
    for i in 0..40u32 {
        let ip = format!("10.0.0.{i}");
        let api = format!("/x{}", i % 4);
        list.push(published(10 + i, &[("ip", &ip), ("api", &api)], &[]));
    }
    let t = table_of(list.clone());
    let ip = t.dimension_index("ip").unwrap();
    assert!(!t.ip_lookup);
    assert_eq!(t.ip_check, Some(ip));
    // The ids of the strategies a request with `dim` = `value` and
    // `api` = `path` matches.
    let ids = |t: &Table, dim: &str, value: &str, path: &str| -> Vec<u32> {
        let mut values = vec![None; t.dimensions().len()];
        values[t.dimension_index(dim).unwrap()] = Some(value.as_bytes());
        values[t.dimension_index("api").unwrap()] = Some(path.as_bytes());
        let m = t.matching(&values);
        m.iter()
            .map(|&i| t.strategies()[i as usize].strategy.id)
            .collect()
    };
    let run = |t: &Table, addr: &str, path: &str| ids(t, "ip", addr, path);
    assert_eq!(run(&t, "10.0.0.5", "/x1"), [15]);
    assert!(run(&t, "10.0.0.5", "/x2").is_empty());
    assert!(run(&t, "10.0.0.99", "/x1").is_empty());
    assert_eq!(run(&t, "10.0.0.5", "/login"), [1]);
    // One candidate (a list of one): the address compared, not looked up.
    let mut one = vec![published(1, &[("api", "/login")], &[])];
    one.push(published(2, &[("ip", "10.0.0.7"), ("api", "/pay")], &[]));
    let t1 = table_of(one);
    assert_eq!(t1.ip_check, Some(ip));
    assert_eq!(run(&t1, "10.0.0.7", "/pay"), [2]);
    assert!(run(&t1, "10.0.0.8", "/pay").is_empty());
    // An address alone anchors: looked up as before.
    list.push(published(100, &[("ip", "10.0.0.200")], &[]));
    let t = table_of(list);
    assert!(t.ip_lookup);
    assert_eq!(t.ip_check, None);
    assert_eq!(run(&t, "10.0.0.5", "/x1"), [15]);
    assert_eq!(run(&t, "10.0.0.200", "/x1"), [100]);
    // A text dimension: `userid=uK AND api=/xk` beside `api=/login`
    // are anchored under their api, and `userid` is only checked.
    let mut list = vec![published(1, &[("api", "/login")], &[])];
    for i in 0..40u32 {
        let user = format!("u{i}");
        let api = format!("/x{}", i % 4);
        list.push(published(10 + i, &[("userid", &user), ("api", &api)], &[]));
    }
    let t = table_of(list);
    let user = t.dimension_index("userid").unwrap();
    let api = t.dimension_index("api").unwrap();
    assert_eq!(&*t.lookups, [api]);
    assert_eq!(&*t.checks, [user]);
    assert_eq!(t.check_kind[user], super::TEXT_CHECK);
    let run = |u: &str, path: &str| ids(&t, "userid", u, path);
    assert_eq!(run("u5", "/x1"), [15]);
    assert!(run("u5", "/x2").is_empty());
    assert!(run("u99", "/x1").is_empty());
    assert_eq!(run("u5", "/login"), [1]);
}

/// A strategy over the dimension limit (a file the writer would
/// refuse) is dropped alone: the ones after it keep their own
/// conditions, key plan and matches (the builder lays every strategy's
/// conditions out where the records list them, dropped ones padded).
#[test]
fn strategies_after_a_dropped_one_keep_their_conditions_and_key() {
    // d0 and d1 … d65: 66 names, two over the limit.
    let names: Vec<String> = (1..MAX_TABLE_DIMENSIONS + 2)
        .map(|i| format!("d{i}"))
        .collect();
    let mut list: Vec<Published> = names
        .iter()
        .enumerate()
        .map(|(i, n)| published(i as u32 + 1, &[("d0", "a"), (n.as_str(), "v")], &[]))
        .collect();
    let after = [
        published(1000, &[("d1", "y"), ("d2", "z")], &["d3"]),
        published(1001, &[("d2", "z")], &[]),
        published(1002, &[("d3", "w"), ("d1", "y")], &[]),
    ];
    list.extend(after.iter().cloned());
    let t = table_of(list);
    // d0 … d63 fit; the strategies naming d64 and d65 are dropped.
    assert_eq!(t.dimensions().len(), MAX_TABLE_DIMENSIONS);
    let kept = MAX_TABLE_DIMENSIONS - 1;
    assert_eq!(t.strategies().len(), kept + after.len());
    assert_eq!(t.published_strategies(), kept + 2 + after.len());
    for (c, p) in t.strategies()[kept..].iter().zip(&after) {
        assert_eq!(c.strategy.id, p.strategy.id);
        let mut got = t.conditions(c);
        let mut want = p.strategy.conditions.clone();
        got.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        want.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        assert_eq!(got, want, "strategy {}", p.strategy.id);
        assert_eq!(c.key.is_some(), p.strategy.id == 1000);
    }
    let values = t.values_of(&[("d1", b"y"), ("d2", b"z"), ("d3", b"w")]);
    let ids: Vec<u32> = t
        .matching(&values)
        .iter()
        .map(|&i| t.strategies()[i as usize].strategy.id)
        .collect();
    assert_eq!(ids, [1000, 1001, 1002]);
}

#[test]
fn ipv4_and_its_v4_mapped_form_are_one_key() {
    let v4 = IpKey::parse(b"1.2.3.4").unwrap();
    assert_eq!(v4, IpKey::v4(0x0102_0304));
    assert_eq!(IpKey::parse(b"::ffff:1.2.3.4"), Some(v4));
    assert_eq!(v4.addr(), "1.2.3.4".parse::<IpAddr>().unwrap());
    assert_ne!(IpKey::parse(b"::1"), IpKey::parse(b"0.0.0.1"));
    for bad in [&b"1.2.3"[..], b"256.1.1.1", b"", b"\xff"] {
        assert_eq!(IpKey::parse(bad), None);
    }
}

/// The worker's read (decoded straight into the table) gives the
/// strategies and conditions the owned decoding gives, and refuses what
/// it refuses, with the same error. (Here rather than in the segment's
/// tests, so that the segment never names the table.)
#[test]
fn a_table_read_from_the_segment_holds_what_was_published() {
    use crate::core::shm::region::Region;
    use crate::core::shm::segment::{encode_payload, read_segment, write_segment, SegmentError};
    use std::sync::atomic::AtomicU64;
    let words: Vec<AtomicU64> = (0..4096).map(|_| AtomicU64::new(0)).collect();
    let seg = Region::from_atomics(&words);
    let mut items: Vec<Published> = (1..=10)
        .map(|id| {
            let u = format!("u{id}");
            let each: &[&str] = if id % 2 == 0 { &["ip", "userid"] } else { &[] };
            let mut p = published(id, &[("ip", "10.0.0.1"), ("userid", &u)], each);
            p.strategy.priority = id as i32 - 5;
            p.generation = u64::from(id) * 3;
            p
        })
        .collect();
    items[4].strategy.enabled = false;
    items[5].strategy.conditions[0].value = b"2001:db8::/32".to_vec();
    items[6].strategy.conditions[0].value = b"2001:db8::7".to_vec();
    let payload = encode_payload(&items, &["userid".to_string()]);
    write_segment(&seg, &payload, 10, 1, 7, 42, 1000);
    let mut buf = Vec::new();
    let t = Table::read(&seg, 7, &mut buf, None).unwrap();
    assert_eq!((t.published_strategies(), t.strategies().len()), (10, 9));
    assert_eq!(t.config_version(), 42);
    for c in t.strategies() {
        let p = items
            .iter()
            .find(|p| p.strategy.id == c.strategy.id)
            .unwrap();
        let mut got = t.conditions(c);
        let mut want = p.strategy.conditions.clone();
        got.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        want.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        assert_eq!(got, want, "strategy {}", c.strategy.id);
        assert_eq!((c.slot, c.generation), (p.slot, p.generation));
        let named: Vec<&str> = t.condition_dimensions(c).collect();
        assert_eq!(named.len(), want.len());
        assert!(want.iter().all(|w| named.contains(&w.dimension.as_str())));
    }
    // A record the model refuses, under a good checksum: refused whole.
    items[8].strategy.conditions[0].value = b"10.0.0.01".to_vec();
    let payload = encode_payload(&items, &[]);
    write_segment(&seg, &payload, 10, 0, 8, 43, 1000);
    let err = Table::read(&seg, 8, &mut buf, None).err().unwrap();
    assert_eq!(Some(&err), read_segment(&seg, 8, &mut buf).err().as_ref());
    assert!(
        matches!(&err, SegmentError::Record { index: 8, what } if what.contains("10.0.0.01")),
        "{err}"
    );
}
