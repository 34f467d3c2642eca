//! Issue 29: a patched table (the changed strategies over the previous
//! table) decides over exactly the strategies, in the order, that the
//! whole table built afresh does; what cannot be patched is refused.

use std::sync::Arc;

use super::Table;
use crate::core::model::{Action, Algorithm, Condition, Op, Strategy, Unit};
use crate::core::shm::segment::{encode_payload, Published, RawSegment};

const VALUES: [(&str, &[&str]); 4] = [
    ("a", &["a0", "a1", "a2", "a3", "a4"]),
    ("b", &["b0", "b1", "b2"]),
    ("c", &["c0", "c1"]),
    ("ip", &["10.0.0.1", "10.0.0.2"]),
];

fn strategy(id: u32, conds: &[(usize, usize)], rate: u64, enabled: bool) -> Published {
    let conditions = conds
        .iter()
        .map(|&(d, v)| Condition::new(VALUES[d].0, VALUES[d].1[v % VALUES[d].1.len()]))
        .collect();
    let mut s = Strategy::plain(id, conditions, Algorithm::FixedWindow, rate, Unit::Minute);
    s.enabled = enabled;
    Published {
        strategy: s,
        slot: id,
        generation: rate,
    }
}

fn raw(seq: u64, list: &[Published]) -> (RawSegment, Vec<u8>) {
    let payload = encode_payload(list, &[]);
    let raw = RawSegment {
        publish_seq: seq,
        config_version: seq,
        published_unix_ms: 0,
        count: list.len() as u32,
        bl_dims: 0,
    };
    (raw, payload)
}

/// The table of `list` as a worker's loader keeps it (with its payload).
fn base_of(list: &[Published]) -> Arc<Table> {
    let (r, payload) = raw(1, list);
    let mut t = Table::from_payload(r, &payload, None).unwrap();
    t.keep_payload(payload);
    Arc::new(t)
}

/// Every request over the dimensions (each value or none).
fn requests() -> Vec<Vec<(&'static str, &'static [u8])>> {
    let mut out = vec![Vec::new()];
    for (d, vals) in VALUES {
        let mut next = Vec::new();
        for r in &out {
            next.push(r.clone());
            for v in vals {
                let mut r = r.clone();
                r.push((d, v.as_bytes()));
                next.push(r);
            }
        }
        out = next;
    }
    out
}

/// Patched over `old` for `new`, and `new` built whole: every request is
/// decided over the same strategy ids in the same order. Returns whether
/// a patch was made.
fn check(old: &[Published], new: &[Published]) -> bool {
    let base = base_of(old);
    let (r, payload) = raw(2, new);
    let full = Table::from_payload(r, &payload, None).unwrap();
    let Some(patched) = Table::patch_payload(&base, r, &payload).unwrap() else {
        return false;
    };
    assert!(patched.is_patched());
    assert_eq!(patched.published_strategies(), new.len());
    assert_eq!(patched.dimensions(), base.dimensions());
    let mut all: Vec<u32> = patched.all_strategies().map(|c| c.strategy.id).collect();
    all.sort_unstable();
    let enabled: Vec<u32> = full.strategies().iter().map(|c| c.strategy.id).collect();
    assert_eq!(all, enabled);
    for req in requests() {
        let want = full.matching_ids(&full.values_of(&req));
        let got = patched.matching_ids(&patched.values_of(&req));
        assert_eq!(got, want, "{req:?}");
    }
    true
}

#[test]
fn an_added_strategy_is_decided_with_the_unchanged_ones_as_in_a_full_build() {
    let old: Vec<Published> = (1..=40)
        .map(|i| strategy(i * 2, &[(0, i as usize), (1, i as usize / 5)], 10, true))
        .collect();
    // Added (a new value and a known one), updated, disabled, removed, and
    // a strategy without conditions (matches every request).
    let mut new = old.clone();
    new.push(strategy(81, &[(0, 1)], 1, true));
    new.push(strategy(83, &[], 5, true));
    new[3] = strategy(8, &[(1, 2)], 3, true);
    new[4].strategy.enabled = false;
    new.remove(10);
    new.sort_by_key(|p| p.strategy.id);
    assert!(check(&old, &new));
    // Nothing changed: a patch of nothing (the base decides alone).
    assert!(check(&old, &old));
}

#[test]
fn what_a_patch_cannot_hold_is_built_whole() {
    let old: Vec<Published> = (1..=10)
        .map(|i| strategy(i, &[(0, i as usize)], 10, true))
        .collect();
    let base = base_of(&old);
    let refused = |edit: &dyn Fn(&mut Strategy)| {
        let mut new = old.clone();
        let mut p = strategy(11, &[(0, 0)], 1, true);
        edit(&mut p.strategy);
        new.push(p);
        let (r, payload) = raw(2, &new);
        Table::patch_payload(&base, r, &payload).unwrap().is_none()
    };
    assert!(!refused(&|_| {}));
    assert!(refused(&|s| s.priority = 1));
    assert!(refused(&|s| s.action = Action::Allow));
    assert!(refused(&|s| s.algorithm = Algorithm::Concurrency));
    assert!(refused(
        &|s| s.each = crate::core::model::each::Each::of(&["ip"])
    ));
    assert!(refused(
        &|s| s.conditions = vec![Condition::with_op("a", Op::Prefix, "a")]
    ));
    assert!(refused(
        &|s| s.conditions = vec![Condition::with_op("a", Op::Not, "a1")]
    ));
    assert!(refused(
        &|s| s.conditions = vec![Condition::new("ip", "10.0.0.0/8")]
    ));
    // A dimension the base does not number.
    assert!(refused(&|s| s.conditions = vec![Condition::new("zz", "1")]));
    assert!(refused(&|s| s.conditions = vec![Condition::new("b", "b1")]));
    // More changes than the bound.
    let many: Vec<Published> = (1..=10)
        .chain(100..200)
        .map(|i| strategy(i, &[(0, i as usize)], 10, true))
        .collect();
    let (r, payload) = raw(2, &many);
    assert!(Table::patch_payload(&base, r, &payload).unwrap().is_none());
    // A base without its payload, a patch over a patch.
    let (r, payload) = raw(2, &old);
    let bare = Arc::new(Table::from_payload(r, &payload, None).unwrap());
    assert!(Table::patch_payload(&bare, r, &payload).unwrap().is_none());
    let patched = Arc::new(Table::patch_payload(&base, r, &payload).unwrap().unwrap());
    assert!(Table::patch_payload(&patched, r, &payload)
        .unwrap()
        .is_none());
    // A ranked base is never patched.
    let mut ranked = old.clone();
    ranked[0].strategy.priority = 2;
    let (r, payload) = raw(2, &old);
    assert!(Table::patch_payload(&base_of(&ranked), r, &payload)
        .unwrap()
        .is_none());
}

#[test]
fn a_hostile_changed_record_is_refused_whole() {
    let old: Vec<Published> = (1..=10)
        .map(|i| strategy(i, &[(0, i as usize)], 10, true))
        .collect();
    let base = base_of(&old);
    let mut new = old.clone();
    new.push(strategy(11, &[(0, 0)], 1, true));
    let (r, mut payload) = raw(2, &new);
    // The changed (last) record's algorithm byte made unknown: refused as
    // a full read refuses it, not patched in nor skipped.
    let mut at = 0;
    for _ in 0..10 {
        at += u32::from_le_bytes(payload[at..at + 4].try_into().unwrap()) as usize;
    }
    // len, id, slot, warm-up (u32 each), generation, rate (u64), burst,
    // max delay (u32): the algorithm at byte 40.
    payload[at + 40] = 0xee;
    assert!(Table::from_payload(r, &payload, None).is_err());
    assert!(Table::patch_payload(&base, r, &payload).is_err());
}

/// Random tables and random changes of a few strategies (added,
/// updated, disabled, removed): whenever a patch is made, it decides
/// every request over the strategies a full build does; most changes are
/// patched (every base names the four dimensions).
#[test]
fn patched_tables_decide_as_rebuilt_ones() {
    let mut rng = crate::core::test_rng::Rng(0x2545_F491_4F6C_DD1D);
    let mut rnd = move |n: u64| rng.below(n);
    let random = |rnd: &mut dyn FnMut(u64) -> u64, id: u32| {
        let mut conds: Vec<(usize, usize)> = (0..rnd(3))
            .map(|_| (rnd(4) as usize, rnd(5) as usize))
            .collect();
        conds.sort_unstable();
        conds.dedup_by_key(|c| c.0);
        strategy(id, &conds, 1 + rnd(3), rnd(10) != 0)
    };
    let mut patched = 0;
    for _ in 0..300 {
        // Strategy 100 names every dimension.
        let mut old: Vec<Published> = (0..rnd(30))
            .map(|_| {
                let id = 1 + rnd(60) as u32;
                random(&mut rnd, id)
            })
            .chain([strategy(100, &[(0, 0), (1, 0), (2, 0), (3, 0)], 1, true)])
            .collect();
        old.sort_by_key(|p| p.strategy.id);
        old.dedup_by_key(|p| p.strategy.id);
        let mut new = old.clone();
        for _ in 0..1 + rnd(6) {
            let id = 1 + rnd(60) as u32;
            new.retain(|p| p.strategy.id != id);
            // Removed one time in four, else added or replaced.
            if rnd(4) != 0 {
                new.push(random(&mut rnd, id));
            }
        }
        new.sort_by_key(|p| p.strategy.id);
        patched += usize::from(check(&old, &new));
    }
    assert!(patched > 250, "{patched} of 300 patched");
}
