//! Issue 29: a worker's reader that holds a large table applies a change
//! of a few strategies as a patch over it (decided at once, as the whole
//! table decides), then installs the whole table built behind it.

use std::time::{Duration, Instant};

use rate_ctl::core::admit::Verdict;
use rate_ctl::core::model::{Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, RequestOutcome, Table};

const N: u32 = 5000;

fn strategy(id: u32, conds: &[(&str, &str)], rate: u64, per: Unit) -> Strategy {
    let conditions = conds.iter().map(|&(d, v)| Condition::new(d, v)).collect();
    Strategy::plain(id, conditions, Algorithm::FixedWindow, rate, per)
}

/// Pass, reject (by which id) or no match, for `pairs`.
fn ask(t: &Table, pairs: &[(&str, &str)]) -> Option<Result<(), u32>> {
    let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|&(d, v)| (d, v.as_bytes())).collect();
    let values = t.values_of(&pairs);
    let r = Request {
        values: &values[..],
        ip: None,
        now_ns: 1_000_000_000,
        now_unix_ms: 1_000,
        dry_run: false,
        quota: false,
    };
    match t.decide(&r).outcome {
        RequestOutcome::Limited(d) => match d.verdict {
            Verdict::Reject { id, .. } => Some(Err(id)),
            _ => Some(Ok(())),
        },
        RequestOutcome::NoMatch => None,
        o => panic!("{o:?}"),
    }
}

fn refresh_until(r: &mut Reader, what: &str, done: impl Fn(&Table) -> bool) {
    let start = Instant::now();
    let mut now = 1u64;
    loop {
        now += 1_000_000;
        r.refresh(now);
        if r.table().is_some_and(|t| done(t)) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_few_changed_strategies_are_patched_in_then_the_whole_table_follows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("patch");
    let mut w = Writer::create_or_adopt(&path, Capacities::tables(8192, 8 << 20), 0o600).unwrap();
    let mut list: Vec<Strategy> = (1..=N)
        .map(|i| {
            strategy(
                i,
                &[("userid", &format!("u{i}")), ("api", "/y")],
                100,
                Unit::Minute,
            )
        })
        .collect();
    w.publish(&list, &[], 1).unwrap();
    let mut r = Reader::new(&path);
    r.refresh(1);
    assert_eq!(r.table().unwrap().published_strategies(), N as usize);
    r.set_background(true);
    // Strategy 3 now 1 a day, 4 removed, two added: `api=/p` alone and
    // `api=/y`, which every background request matches beside its own.
    list[2] = strategy(3, &[("userid", "u3"), ("api", "/y")], 1, Unit::Day);
    list.remove(3);
    list.push(strategy(N + 1, &[("api", "/p")], 1, Unit::Day));
    list.push(strategy(N + 2, &[("api", "/y")], 2, Unit::Day));
    w.publish(&list, &[], 2).unwrap();
    let seq = r.mapping().unwrap().seq();
    // Patched by the first refresh after the publish, on the caller's
    // thread: no helper thread to wait for (`loader::INLINE_PATCH_MAX`).
    r.refresh(2_000_000_000);
    let t = r.table().unwrap().clone();
    assert_eq!(
        t.version(),
        seq,
        "the first refresh after the publish installs the patch"
    );
    assert!(t.is_patched(), "a change of 4 strategies is a patch");
    assert_eq!(t.published_strategies(), N as usize + 1);
    assert_eq!(t.strategies().len(), 3, "the changed strategies alone");
    assert_eq!(t.all_strategies().count(), N as usize + 1);
    assert_eq!(ask(&t, &[("api", "/p")]), Some(Ok(())));
    assert_eq!(ask(&t, &[("api", "/p")]), Some(Err(N + 1)));
    assert_eq!(ask(&t, &[("api", "/q")]), None);
    // 3's new rate, decided with N + 2's.
    assert_eq!(ask(&t, &[("userid", "u3"), ("api", "/y")]), Some(Ok(())));
    assert_eq!(ask(&t, &[("userid", "u3"), ("api", "/y")]), Some(Err(3)));
    // 4 is gone: only N + 2 matches (its second and last unit).
    assert_eq!(ask(&t, &[("userid", "u4"), ("api", "/y")]), Some(Ok(())));
    assert_eq!(
        ask(&t, &[("userid", "u7"), ("api", "/y")]),
        Some(Err(N + 2))
    );
    assert_eq!(ask(&t, &[("userid", "u7")]), None);
    // Then the whole table, deciding on the same counters.
    refresh_until(&mut r, "whole table", |t| !t.is_patched());
    let full = r.table().unwrap().clone();
    assert_eq!(full.version(), seq);
    assert_eq!(full.strategies().len(), N as usize + 1);
    assert_eq!(ask(&full, &[("api", "/p")]), Some(Err(N + 1)));
    assert_eq!(
        ask(&full, &[("userid", "u9"), ("api", "/y")]),
        Some(Err(N + 2))
    );
    assert_eq!(ask(&full, &[("api", "/q")]), None);
    // A change of more strategies than a patch holds: built whole.
    for s in list.iter_mut().take(100) {
        s.rate += 1;
    }
    w.publish(&list, &[], 3).unwrap();
    let seq = r.mapping().unwrap().seq();
    refresh_until(&mut r, "big change", |t| t.version() == seq);
    assert!(!r.table().unwrap().is_patched());
    // And the next small change is a patch over that one.
    list.push(strategy(N + 3, &[("api", "/z")], 1, Unit::Day));
    w.publish(&list, &[], 4).unwrap();
    let seq = r.mapping().unwrap().seq();
    r.refresh(60_000_000_000);
    assert_eq!(r.table().unwrap().version(), seq);
    assert!(r.table().unwrap().is_patched());
}
