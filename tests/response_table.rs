//! Issue 31 through the core's request path (no nginx): a table with
//! `count_if`, `cost_from` and `cost_after` strategies decides requests,
//! `Table::owing` gives what each owes, and settling it with the final
//! status (what the module's LOG phase does) gives units back or charges
//! more — shared and per key, with several strategies on one request, and
//! under a location dry run.

#[path = "support/shm.rs"]
mod support;

use rate_ctl::core::admit::Verdict;
use rate_ctl::core::clock::Now;
use rate_ctl::core::model::response::StatusSet;
use rate_ctl::core::model::{Algorithm, Strategy, Unit};
use rate_ctl::core::response::Owing;
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::{Request, RequestOutcome, Scratch, Table};
use support::{small_caps, strategy};

/// Mid-minute, mid-day of a fixed date (windows are wall-clock).
const NOW_MS: u64 = 1_795_000_030_000;

fn table_of(list: &[Strategy]) -> (tempfile::TempDir, Writer, std::sync::Arc<Table>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let caps = Capacities {
        keys: 4096,
        ..small_caps()
    };
    let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
    w.publish(list, &[], 1).unwrap();
    let mut e = Reader::new(&path);
    e.refresh(1);
    let t = e.table().unwrap().clone();
    (dir, w, t)
}

/// One request: passed?, and what it owes.
fn ask(
    t: &Table,
    scratch: &mut Scratch,
    ip: &str,
    pairs: &[(&str, &str)],
    dry_run: bool,
) -> (bool, Option<Owing>) {
    let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|&(d, v)| (d, v.as_bytes())).collect();
    let values = t.values_of(&pairs);
    let r = Request {
        values: &values[..],
        ip: Some(ip.parse::<std::net::IpAddr>().unwrap().into()),
        now_ns: 5_000_000_000_000,
        now_unix_ms: NOW_MS,
        dry_run,
        quota: false,
    };
    let mut held = smallvec::SmallVec::new();
    let passed = match t.decide_into(&r, &mut held, scratch) {
        RequestOutcome::Limited(d) => !matches!(d.verdict, Verdict::Reject { .. }),
        _ => true,
    };
    (passed, t.owing(scratch))
}

fn now() -> Now {
    Now {
        mono_ns: 5_000_000_000_000,
        wall_ns: NOW_MS * 1_000_000,
    }
}

/// A request that ends with `status` (and `cost_after` value `cost`).
fn served(
    t: &Table,
    s: &mut Scratch,
    ip: &str,
    pairs: &[(&str, &str)],
    status: u16,
    cost: Option<u64>,
) -> bool {
    let (passed, owing) = ask(t, s, ip, pairs, false);
    if let Some(o) = owing {
        o.settle(status, now(), |_| cost);
    }
    passed
}

fn login(id: u32, api: &str, keyed: bool) -> Strategy {
    let mut s = strategy(id, &[("api", api)], Algorithm::FixedWindow, 3, Unit::Day);
    s.response.count_if = StatusSet::parse("401").unwrap();
    if keyed {
        s.each = rate_ctl::core::model::each::Each::of(&["ip"]);
    }
    s
}

#[test]
fn count_if_counts_only_the_listed_statuses_shared_and_per_key() {
    let (_d, _w, t) = table_of(&[login(1, "/login", false), login(2, "/klogin", true)]);
    let mut s = Scratch::default();
    for api in ["/login", "/klogin"] {
        let p = [("api", api)];
        for i in 0..10 {
            assert!(
                served(&t, &mut s, "192.0.2.1", &p, 200, None),
                "{api}: success {i}"
            );
        }
        for i in 0..3 {
            assert!(
                served(&t, &mut s, "192.0.2.1", &p, 401, None),
                "{api}: failure {i}"
            );
        }
        assert!(
            !served(&t, &mut s, "192.0.2.1", &p, 200, None),
            "{api}: over the limit"
        );
    }
    // Per key: another address has its own count; shared: it does not.
    assert!(served(
        &t,
        &mut s,
        "192.0.2.2",
        &[("api", "/klogin")],
        401,
        None
    ));
    assert!(!served(
        &t,
        &mut s,
        "192.0.2.2",
        &[("api", "/login")],
        401,
        None
    ));
    let map = t.mapping().unwrap();
    let c = map.keys().settled(t.strategies()[0].slot);
    // Checked, not charged: nothing to give back; the 3 failures charged.
    assert_eq!((c.not_counted, c.given_back, c.charged_after), (10, 0, 3));
}

/// Issue 31's semantics: at admission a `count_if` strategy is only
/// checked; a request is charged when it ends, if its status counts. So
/// requests in flight hold nothing: 5 requests decided before any ends all
/// pass a limit of 2 (the documented overshoot), and once two of them end
/// with a counted status the next is refused. (Charging at admission and
/// giving back on a mismatch refuses the third in flight instead.)
#[test]
fn count_if_checks_at_admission_and_charges_when_the_request_ends() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        for keyed in [false, true] {
            let mut st = strategy(1, &[("api", "/a")], algorithm, 2, Unit::Day);
            if algorithm == Algorithm::TokenBucket {
                st.burst = 2;
            }
            st.response.count_if = StatusSet::parse("4xx").unwrap();
            if keyed {
                st.each = rate_ctl::core::model::each::Each::of(&["ip"]);
            }
            let (_d, _w, t) = table_of(&[st]);
            let mut s = Scratch::default();
            let p = [("api", "/a")];
            let what = format!("{algorithm:?} keyed={keyed}");
            let mut in_flight = Vec::new();
            for i in 0..5 {
                let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, false);
                assert!(ok, "{what}: request {i} in flight is admitted");
                in_flight.push(owing.expect("a count_if request owes its settlement"));
            }
            // Three end with 200: not counted, nothing charged.
            for o in in_flight.drain(2..) {
                o.settle(200, now(), |_| None);
            }
            let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, false);
            assert!(ok, "{what}: successes are not counted");
            drop(owing);
            // Two end with 401: both charged (past the check), limit reached.
            for o in in_flight.drain(..) {
                o.settle(401, now(), |_| None);
            }
            let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, false);
            assert!(!ok, "{what}: refused after two counted statuses");
            assert!(owing.is_none(), "{what}: a refused request owes nothing");
            if keyed {
                // Another address was never charged.
                assert!(ask(&t, &mut s, "192.0.2.9", &p, false).0, "{what}");
            }
            let map = t.mapping().unwrap();
            let c = map.keys().settled(t.strategies()[0].slot);
            assert_eq!(
                (c.not_counted, c.given_back, c.charged_after),
                (3, 0, 2),
                "{what}"
            );
        }
    }
}

/// A check writes nothing: a per-key `count_if` strategy checked for many
/// addresses claims no key entry until a request is charged.
#[test]
fn a_per_key_check_claims_no_entry() {
    let mut st = login(1, "/k", true);
    st.response.count_if = StatusSet::parse("401").unwrap();
    let (_d, _w, t) = table_of(&[st]);
    let mut s = Scratch::default();
    let map = t.mapping().unwrap();
    for i in 0..50 {
        let ip = format!("192.0.2.{i}");
        let (ok, owing) = ask(&t, &mut s, &ip, &[("api", "/k")], false);
        assert!(ok);
        owing.unwrap().settle(200, now(), |_| None);
    }
    assert_eq!(map.keys().stats().occupied, 0, "checks claim no entry");
    assert!(served(&t, &mut s, "192.0.2.1", &[("api", "/k")], 401, None));
    assert_eq!(map.keys().stats().occupied, 1, "the charge claims one");
}

#[test]
fn a_refused_request_owes_nothing_and_a_later_refusal_refunds_every_unit() {
    // /m: a bucket of 10 charged by X-Cost, and one request a day.
    let mut cost = strategy(
        1,
        &[("api", "/m")],
        Algorithm::TokenBucket,
        10,
        Unit::Minute,
    );
    cost.burst = 10;
    cost.response.cost_from = "cost".into();
    let mut after = strategy(2, &[("api", "/m")], Algorithm::FixedWindow, 1, Unit::Day);
    after.response.cost_after = "upcost".into();
    let (_d, _w, t) = table_of(&[cost, after]);
    let mut s = Scratch::default();
    let p = [("api", "/m"), ("cost", "4")];
    let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, false);
    assert!(ok);
    let owing = owing.expect("cost_after owes");
    assert_eq!(owing.items.len(), 1, "only the cost_after strategy settles");
    // The second request: strategy 2 refuses, strategy 1's 4 units come back.
    let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, false);
    assert!(!ok);
    assert!(owing.is_none(), "a refused request owes nothing");
    let map = t.mapping().unwrap();
    let slots = map.slots();
    let c = &t.strategies()[0];
    let slot = rate_ctl::core::shm::slot::Slot::at(&slots, c.slot).unwrap();
    assert_eq!(
        c.limiter.quota(&slot, now().mono_ns).remaining,
        6,
        "4 of 10 used, not 8"
    );
}

#[test]
fn cost_after_charges_the_difference_and_a_dry_run_refusal_settles_nothing() {
    let mut up = strategy(1, &[("api", "/up")], Algorithm::FixedWindow, 10, Unit::Day);
    up.response.cost_after = "upcost".into();
    let (_d, _w, t) = table_of(&[up]);
    let mut s = Scratch::default();
    let p = [("api", "/up")];
    assert!(served(&t, &mut s, "192.0.2.1", &p, 200, Some(6)));
    assert!(served(&t, &mut s, "192.0.2.1", &p, 200, Some(6)));
    assert!(
        !served(&t, &mut s, "192.0.2.1", &p, 200, Some(6)),
        "12 of 10 used"
    );
    // Under a location dry run the refused hit charged nothing: it owes
    // nothing either (settling it would give back what was never taken).
    let (ok, owing) = ask(&t, &mut s, "192.0.2.1", &p, true);
    assert!(ok && owing.is_none());
    let map = t.mapping().unwrap();
    let c = map.keys().settled(t.strategies()[0].slot);
    assert_eq!(c.charged_after, 10);
}
