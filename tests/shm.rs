//! Writer → file → reader, in one process: publishing, slot stability,
//! capacity errors, refusal of corrupt or hostile files, fail-open states.

#[path = "support/shm.rs"]
mod shm;

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rate_ctl::core::admit::Verdict;
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit, ValidStrategy};
use rate_ctl::core::shm::reader::{Reader, Severity, RECHECK_NS};
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::shm::writer::{Opened, Writer};
use rate_ctl::core::shm::{Mapping, ShmError, H_SEQ};
use rate_ctl::core::table::{Request, RequestOutcome, Table};
use shm::{
    adopt, adopt_published, api_bucket, capped_writer, fresh_writer, small_caps, strategy, table_at,
};

fn req<'a>(values: &'a [Option<&'a [u8]>], now_ns: u64) -> Request<'a> {
    Request {
        values,
        ip: None,
        now_ns,
        now_unix_ms: 1,
        dry_run: false,
        quota: true,
    }
}

/// Values for a table, by dimension name.
fn values<'a>(t: &Table, pairs: &[(&str, &'a str)]) -> Vec<Option<&'a [u8]>> {
    t.dimensions()
        .iter()
        .map(|d| {
            pairs
                .iter()
                .find(|(n, _)| n == d)
                .map(|(_, v)| v.as_bytes())
        })
        .collect()
}

/// What the agent hands the writer: validated strategies.
fn valid(list: &[Strategy]) -> Vec<ValidStrategy> {
    list.iter()
        .map(|s| s.clone().into_valid().unwrap())
        .collect()
}

/// `e.refresh(now_ns)` reports a change of state at `level` whose message
/// says `text`.
fn reports(e: &mut Reader, now_ns: u64, level: Severity, text: &str) {
    let c = e.refresh(now_ns).expect("a change of state reported");
    assert_eq!(c.level, level, "{}", c.message);
    assert!(c.message.contains(text), "{}", c.message);
}

fn passes(d: &rate_ctl::core::table::TableDecision) -> bool {
    match &d.outcome {
        RequestOutcome::NoMatch | RequestOutcome::Allowed { .. } => true,
        RequestOutcome::Blacklisted { .. } => false,
        RequestOutcome::Limited(x) => !matches!(x.verdict, Verdict::Reject { .. }),
    }
}

#[test]
fn publish_then_enforce_a_combination() {
    let (_dir, path, mut w) = fresh_writer();
    assert_eq!(*w.opened(), Opened::Created);
    let s = strategy(
        1,
        &[("ip", "127.0.0.1"), ("userid", "u1024"), ("api", "/pay")],
        Algorithm::FixedWindow,
        3,
        Unit::Hour,
    );
    let r = w.publish(&[s], &[], 11).unwrap();
    assert_eq!((r.seq, r.strategies, r.new_slots), (1, 1, 1));
    let mut e = Reader::new(&path);
    reports(&mut e, 1, Severity::Notice, "enforcing 1 strategies");
    assert!(
        e.refresh(2).is_none(),
        "no second log line without a change"
    );
    let t = e.table().unwrap().clone();
    assert_eq!(t.config_version(), 11);
    let full = values(
        &t,
        &[("ip", "127.0.0.1"), ("userid", "u1024"), ("api", "/pay")],
    );
    let admitted = (0..10)
        .filter(|_| passes(&t.decide(&req(&full, 5))))
        .count();
    assert_eq!(admitted, 3, "exactly the rate within the window");
    for other in [
        values(
            &t,
            &[("ip", "127.0.0.1"), ("userid", "u1025"), ("api", "/pay")],
        ),
        values(
            &t,
            &[("ip", "127.0.0.1"), ("userid", "u1024"), ("api", "/other")],
        ),
        values(&t, &[("ip", "127.0.0.1"), ("api", "/pay")]),
        values(
            &t,
            &[("ip", "127.0.0.2"), ("userid", "u1024"), ("api", "/pay")],
        ),
    ] {
        assert_eq!(t.decide(&req(&other, 5)).outcome, RequestOutcome::NoMatch);
    }
    let slot = Slot::at(&t.mapping().unwrap().slots(), t.strategies()[0].slot).unwrap();
    assert_eq!(slot.counters().passed, 3);
    assert_eq!(slot.counters().limited, 7);
}

#[test]
fn slots_are_stable_across_publishes_and_reset_when_reassigned() {
    let (_dir, path, mut w) = fresh_writer();
    let a = strategy(1, &[("api", "/a")], Algorithm::FixedWindow, 5, Unit::Hour);
    let b = strategy(2, &[("api", "/b")], Algorithm::FixedWindow, 5, Unit::Hour);
    w.publish(&[a.clone(), b.clone()], &[], 1).unwrap();
    let mut e = Reader::new(&path);
    let t1 = table_at(&mut e, 1);
    let va = values(&t1, &[("api", "/a")]);
    for _ in 0..4 {
        t1.decide(&req(&va, 10));
    }
    let slot_a = t1.strategies()[0].slot;
    // Rate change only: same slot, same counters, same window state.
    let mut a2 = a.clone();
    a2.rate = 6;
    let r = w.publish(&[a2, b.clone()], &[], 2).unwrap();
    assert_eq!((r.new_slots, r.freed_slots), (0, 0));
    let t2 = table_at(&mut e, 2);
    assert_eq!(t2.strategies()[0].slot, slot_a);
    let admitted = (0..5).filter(|_| passes(&t2.decide(&req(&va, 20)))).count();
    assert_eq!(admitted, 2, "4 already counted in this window, new limit 6");
    // Algorithm change: a fresh slot with a new generation.
    let mut a3 = a.clone();
    a3.algorithm = Algorithm::SlidingWindow;
    let r = w.publish(&[a3, b.clone()], &[], 3).unwrap();
    assert_eq!((r.new_slots, r.freed_slots), (1, 1));
    let t3 = table_at(&mut e, 3);
    assert_ne!(t3.strategies()[0].slot, slot_a);
    // Delete b: its slot is freed and quarantined (not reused at once).
    let slot_b = t3.strategies()[1].slot;
    let c = strategy(3, &[("api", "/c")], Algorithm::FixedWindow, 5, Unit::Hour);
    let r = w.publish(&[c], &[], 4).unwrap();
    assert_eq!(r.freed_slots, 2);
    let t4 = table_at(&mut e, 4);
    assert_ne!(t4.strategies()[0].slot, slot_b);
    assert_ne!(t4.strategies()[0].slot, slot_a);
}

#[test]
fn restart_adopts_the_file_and_keeps_counters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let s = strategy(7, &[("api", "/x")], Algorithm::FixedWindow, 100, Unit::Hour);
    adopt_published(&path, std::slice::from_ref(&s));
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);
    let v = values(&t, &[("api", "/x")]);
    for _ in 0..10 {
        t.decide(&req(&v, 5));
    }
    let mut w = adopt(&path);
    assert!(matches!(w.opened(), Opened::Adopted { strategies: 1, .. }));
    let r = w.publish(&[s], &[], 2).unwrap();
    assert_eq!(r.new_slots, 0, "unchanged strategy keeps its slot");
    let t = table_at(&mut e, 2);
    let slot = Slot::at(&t.mapping().unwrap().slots(), t.strategies()[0].slot).unwrap();
    assert_eq!(slot.counters().passed, 10);
}

#[test]
fn a_table_that_fits_once_replaced_slots_are_free_is_published_in_stages() {
    let (_dir, path, mut w) = capped_writer(6);
    let make = |ids: std::ops::RangeInclusive<u32>| -> Vec<_> {
        ids.map(|i| api_bucket(i, "/a")).collect()
    };
    w.publish(&make(1..=4), &[], 1).unwrap();
    // Six new strategies for the four: 2 slots free now, 4 held until freed.
    let six = make(11..=16);
    let err = w.publish(&six, &[], 2).unwrap_err();
    assert!(matches!(err, ShmError::SlotsBusy { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "capacity: this table needs 6 new stat slots; 2 are free now and 4 more become free \
         within 2 s (the slots of removed strategies wait before reuse; max strategies 6)"
    );
    let first = w.publish_staged(&valid(&six), &[], 2, None).unwrap();
    assert_eq!(
        (first.strategies, first.deferred, first.freed_slots),
        (2, 4, 4)
    );
    let mut e = Reader::new(&path);
    e.refresh(1);
    let ids: Vec<u32> = e
        .table()
        .unwrap()
        .strategies()
        .iter()
        .map(|c| c.strategy.id)
        .collect();
    assert_eq!(ids, [11, 12], "the first stage: what fits now");
    // Within the quarantine: nothing more yet.
    assert_eq!(
        w.publish_staged(&valid(&six), &[], 2, None)
            .unwrap()
            .deferred,
        4
    );
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let done = w.publish_staged(&valid(&six), &[], 2, None).unwrap();
    assert_eq!((done.strategies, done.deferred), (6, 0));
}

#[test]
fn capacity_and_invalid_input_leave_the_previous_table_active() {
    let (_dir, path, mut w) = capped_writer(4);
    let one = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&one), &[], 1).unwrap();
    let five: Vec<_> = (1..=5).map(|i| api_bucket(i, "/a")).collect();
    let err = w.publish(&five, &[], 2).unwrap_err();
    assert!(matches!(err, ShmError::Capacity { .. }), "{err}");
    assert!(err.to_string().contains("max strategies (4)"), "{err}");
    // publish_staged does not split a table over the capacity.
    let err = w.publish_staged(&valid(&five), &[], 2, None).unwrap_err();
    assert!(err.to_string().contains("max strategies (4)"), "{err}");
    let mut bad = one.clone();
    bad.rate = 0;
    let err = w.publish(&[bad], &[], 3).unwrap_err();
    assert!(err.to_string().starts_with("strategy 1: rate"), "{err}");
    let err = w.publish(&[one.clone(), one.clone()], &[], 3).unwrap_err();
    assert!(matches!(err, ShmError::DuplicateId(1)));
    let mut e = Reader::new(&path);
    e.refresh(1);
    assert_eq!(e.table().unwrap().config_version(), 1);
    assert_eq!(w.seq(), 1);
}

#[test]
fn blacklist_through_the_table() {
    let (_dir, path, mut w) = fresh_writer();
    let bl = vec![
        BlacklistEntry {
            dimension: "ip".into(),
            value: b"10.1.2.3".to_vec(),
            expires_unix_ms: None,
        },
        BlacklistEntry {
            dimension: "ip".into(),
            value: b"2001:db8::1".to_vec(),
            expires_unix_ms: None,
        },
        BlacklistEntry {
            dimension: "userid".into(),
            value: b"evil".to_vec(),
            expires_unix_ms: Some(1_000),
        },
    ];
    w.publish(&[], &bl, 1).unwrap();
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);
    assert_eq!(t.dimensions(), ["userid"]);
    let check = |ip: &str, user: Option<&str>, now_ms: u64| {
        let v = [user.map(str::as_bytes)];
        let r = Request {
            values: &v,
            ip: Some(ip.parse::<IpAddr>().unwrap().into()),
            now_ns: 1,
            now_unix_ms: now_ms,
            dry_run: false,
            quota: true,
        };
        t.decide(&r).outcome
    };
    assert!(matches!(
        check("10.1.2.3", None, 10),
        RequestOutcome::Blacklisted {
            dimension_index: None
        }
    ));
    assert!(matches!(
        check("2001:db8::1", None, 10),
        RequestOutcome::Blacklisted { .. }
    ));
    assert_eq!(check("10.1.2.4", None, 10), RequestOutcome::NoMatch);
    assert_eq!(check("2001:db8::2", None, 10), RequestOutcome::NoMatch);
    assert!(matches!(
        check("10.0.0.1", Some("evil"), 10),
        RequestOutcome::Blacklisted {
            dimension_index: Some(0)
        }
    ));
    assert_eq!(
        check("10.0.0.1", Some("evil"), 2_000),
        RequestOutcome::NoMatch,
        "expired"
    );
}

#[test]
fn hostile_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real");
    std::fs::write(&target, b"precious data that is not ours").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(matches!(
        Writer::create_or_adopt(&link, small_caps(), 0o600),
        Err(ShmError::Symlink(_))
    ));
    assert!(matches!(Mapping::open(&link), Err(ShmError::Symlink(_))));
    // A file that is not ours is never overwritten.
    assert!(Writer::create_or_adopt(&target, small_caps(), 0o600).is_err());
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"precious data that is not ours"
    );
    assert!(matches!(
        Mapping::open(dir.path()),
        Err(ShmError::NotRegular(_)) | Err(ShmError::Io { .. })
    ));
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain libc call on a valid C string.
    unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert!(Mapping::open(&fifo).is_err());
}

#[test]
fn created_file_has_the_requested_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    Writer::create_or_adopt(&path, small_caps(), 0o660).unwrap();
    // The configuration without group write (workers only read it), the
    // state file as asked.
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let state = rate_ctl::core::shm::state_path(&path);
    let mode = std::fs::metadata(state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
}

#[test]
fn fail_open_states_are_logged_once_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut e = Reader::new(&path);
    let c = e.refresh(0).expect("missing file reported");
    assert_eq!(c.level, Severity::Error);
    assert!(e.table().is_none());
    assert!(
        e.refresh(RECHECK_NS).is_none(),
        "one line per state, not per check"
    );
    // The agent creates the file: enforcement resumes within a second.
    let mut w = adopt(&path);
    let s = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&s), &[], 5).unwrap();
    assert!(
        e.refresh(RECHECK_NS + 1).is_none(),
        "not rechecked before a second"
    );
    assert!(e.table().is_none());
    let c = e.refresh(2 * RECHECK_NS).expect("recovery reported");
    assert!(c.message.contains("enforcing"), "{}", c.message);
    assert_eq!(e.table().unwrap().config_version(), 5);

    // A corrupt publish: the previous table stays, one error line. (Through
    // the agent's mapping: the worker's configuration is read-only.)
    let map = w.mapping().clone();
    let seg = map.segment(0);
    for off in (64..256).step_by(8) {
        seg.store(off, 0xdead_beef);
    }
    // Claim sequence 2 (segment 0) without a proper write.
    map.header()
        .u64_at(H_SEQ)
        .unwrap()
        .store(2, Ordering::Release);
    reports(
        &mut e,
        2 * RECHECK_NS + 1,
        Severity::Error,
        "keeping the previous table",
    );
    assert_eq!(e.table().unwrap().config_version(), 5);
    assert!(e.refresh(2 * RECHECK_NS + 2).is_none());

    // The agent recreates the file (new inode): picked up within a second.
    std::fs::remove_file(&path).unwrap();
    let mut w2 = adopt(&path);
    w2.publish(&[s], &[], 9).unwrap();
    e.refresh(4 * RECHECK_NS);
    assert_eq!(e.table().unwrap().config_version(), 9);

    // Truncated under us: dropped at the next check, before any access.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(8192).unwrap();
    let c = e.refresh(6 * RECHECK_NS).expect("truncation reported");
    assert!(c.message.contains("shrank"), "{}", c.message);
    assert!(e.table().is_none());
    drop(w);
}

#[test]
fn delay_action_reports_the_wait() {
    let (_dir, path, mut w) = fresh_writer();
    let mut s = strategy(
        1,
        &[("api", "/slow")],
        Algorithm::LeakyBucket,
        10,
        Unit::Second,
    );
    s.action = Action::Delay { max_delay_ms: 250 };
    w.publish(&[s], &[], 1).unwrap();
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);
    let v = values(&t, &[("api", "/slow")]);
    let t0 = 1_000_000_000;
    let mut waits = vec![];
    for _ in 0..5 {
        match t.decide(&req(&v, t0)).outcome {
            RequestOutcome::Limited(d) => waits.push(d.verdict),
            o => panic!("{o:?}"),
        }
    }
    // 10/s: 0, 100, 200 ms queued; the next would wait 300 ms > 250 ms cap.
    assert!(matches!(waits[0], Verdict::Pass));
    assert!(
        matches!(
            waits[1],
            Verdict::Delay {
                wait_ns: 100_000_000,
                ..
            }
        ),
        "{:?}",
        waits[1]
    );
    assert!(
        matches!(
            waits[2],
            Verdict::Delay {
                wait_ns: 200_000_000,
                ..
            }
        ),
        "{:?}",
        waits[2]
    );
    assert!(matches!(waits[3], Verdict::Reject { .. }), "{:?}", waits[3]);
}

#[test]
fn adoption_frees_slots_no_published_strategy_owns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let s = strategy(1, &[("api", "/a")], Algorithm::FixedWindow, 5, Unit::Hour);
    {
        let w = adopt_published(&path, std::slice::from_ref(&s));
        // A writer killed after marking slots 5 and 6 but before publishing.
        let bm = w.mapping().bitmap();
        bm.store(0, bm.load(0) | 0b110_0000);
    }
    let w = adopt(&path);
    let bm = w.mapping().bitmap();
    let word = bm.load(0);
    assert_eq!(word & 0b110_0000, 0, "leaked slots freed on adoption");
    assert_eq!(
        word.count_ones(),
        1,
        "the published strategy keeps its slot"
    );
    let freed = Slot::at(&w.mapping().slots(), 5)
        .unwrap()
        .freed_at()
        .load(Ordering::Relaxed);
    assert!(freed > 0, "freed slots are quarantined");
}

#[test]
fn concurrency_units_are_released_in_dry_run_too() {
    let (_dir, path, mut w) = fresh_writer();
    let c = strategy(
        1,
        &[("api", "/slow")],
        Algorithm::Concurrency,
        1,
        Unit::Second,
    );
    let mut dry = strategy(
        2,
        &[("api", "/dry")],
        Algorithm::Concurrency,
        1,
        Unit::Second,
    );
    dry.action = Action::DryRun;
    w.publish(&[c, dry], &[], 1).unwrap();
    let mut e = Reader::new(&path);
    let t = table_at(&mut e, 1);
    for (api, location_dry_run) in [("/slow", true), ("/dry", false), ("/slow", false)] {
        let v = values(&t, &[("api", api)]);
        for i in 0..5 {
            let r = Request {
                values: &v,
                ip: None,
                now_ns: 10,
                now_unix_ms: 1,
                dry_run: location_dry_run,
                quota: true,
            };
            let d = t.decide(&r);
            assert!(
                passes(&d),
                "{api} request {i} (dry run {location_dry_run}) passes"
            );
            t.release(&d.held); // the request ended
        }
    }
    // Nothing leaked: one in-flight request is still admitted by the enforcing one.
    let v = values(&t, &[("api", "/slow")]);
    let held = t.decide(&req(&v, 20));
    assert!(passes(&held));
    assert!(
        !passes(&t.decide(&req(&v, 20))),
        "limit 1 holds while one is in flight"
    );
    t.release(&held.held);
    assert!(passes(&t.decide(&req(&v, 30))));
}

#[test]
fn a_zero_capacity_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut caps = small_caps();
    caps.max_strategies = 0;
    let err = Writer::create_or_adopt(&dir.path().join("rc"), caps, 0o600)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "capacity: max strategies must be at least 1"
    );
    assert!(!dir.path().join("rc").exists(), "nothing created");
}

/// A worker's engine (background loads on) builds a large table on a
/// helper thread: the refresh that sees the publish keeps deciding with the
/// table it has, a later one installs the new table; a small table still
/// loads at once, and a bad large segment is refused as before.
#[test]
fn a_large_table_is_built_off_the_request_path_and_installed_when_ready() {
    use rate_ctl::core::shm::loader::BACKGROUND_MIN;
    use rate_ctl::core::shm::Capacities;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let caps = Capacities::tables(8192, 2 << 20);
    let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
    let small = strategy(1, &[("api", "/pay")], Algorithm::FixedWindow, 1, Unit::Hour);
    w.publish(std::slice::from_ref(&small), &[], 1).unwrap();
    let mut e = Reader::new(&path);
    e.set_background(true);
    e.refresh(1);
    assert_eq!(
        e.table().unwrap().config_version(),
        1,
        "small: loaded at once"
    );
    let n = BACKGROUND_MIN + 10;
    let large: Vec<_> = (1..=n)
        .map(|i| {
            let user = format!("u{i}");
            strategy(
                i,
                &[("userid", &user)],
                Algorithm::FixedWindow,
                1,
                Unit::Hour,
            )
        })
        .collect();
    w.publish(&large, &[], 2).unwrap();
    let old = e.table().unwrap().clone();
    assert!(e.refresh(2).is_none());
    assert!(
        Arc::ptr_eq(e.table().unwrap(), &old),
        "the refresh that sees the publish decides with the table it has"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut now = 3;
    while e.table().unwrap().config_version() != 2 {
        assert!(std::time::Instant::now() < deadline, "never installed");
        std::thread::sleep(std::time::Duration::from_millis(2));
        e.refresh(now);
        now += 1;
    }
    let t = e.table().unwrap().clone();
    assert_eq!(t.strategies().len(), n as usize);
    let v = values(&t, &[("userid", "u77")]);
    assert!(passes(&t.decide(&req(&v, now))));
    assert!(!passes(&t.decide(&req(&v, now))), "strategy 77 enforced");
    // Back to a small table: at once again.
    w.publish(std::slice::from_ref(&small), &[], 3).unwrap();
    e.refresh(now + 1);
    assert_eq!(e.table().unwrap().config_version(), 3);
}

/// An nginx module of one layout version and a file of another (after an
/// upgrade of only one side): the worker fails open with one line naming
/// both versions, never misreads records laid out otherwise; the agent
/// replaces the file and enforcement resumes. Here the file is made to
/// claim the previous version (2, before priorities).
#[test]
fn a_file_of_another_layout_version_fails_open_and_the_agent_replaces_it() {
    use rate_ctl::core::shm::{H_VERSION_INIT, LAYOUT_VERSION};
    use std::os::unix::fs::FileExt;
    let (_dir, path, mut w) = fresh_writer();
    let s = strategy(1, &[("api", "/pay")], Algorithm::FixedWindow, 1, Unit::Hour);
    w.publish(std::slice::from_ref(&s), &[], 1).unwrap();
    drop(w);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_at(&(LAYOUT_VERSION - 1).to_le_bytes(), H_VERSION_INIT as u64)
        .unwrap();
    let mut e = Reader::new(&path);
    let c = e.refresh(1).expect("refusal reported");
    assert_eq!(c.level, Severity::Error);
    let want = format!(
        "layout version {}, this build reads {LAYOUT_VERSION}",
        LAYOUT_VERSION - 1
    );
    assert!(c.message.contains(&want), "{}", c.message);
    assert!(e.table().is_none(), "fails open");
    let mut w = Writer::create_or_adopt(&path, small_caps(), 0o600).unwrap();
    assert!(
        matches!(w.opened(), Opened::Recreated { reason } if reason.contains(&want)),
        "{:?}",
        w.opened()
    );
    w.publish(&[s], &[], 2).unwrap();
    e.refresh(RECHECK_NS + 1);
    assert_eq!(e.table().map(|t| t.config_version()), Some(2));
}

/// A large table published over before its build was installed: the first
/// request after that decides with the newest table, never with the
/// superseded one (t-nginx/03-dynamic.t saw a request pass uncounted this
/// way: the finished build of the older table was installed first).
#[test]
fn a_build_of_a_table_since_replaced_is_never_installed() {
    use rate_ctl::core::shm::loader::BACKGROUND_MIN;
    use rate_ctl::core::shm::Capacities;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut w = Writer::create_or_adopt(&path, Capacities::tables(8192, 2 << 20), 0o600).unwrap();
    let small = strategy(1, &[("api", "/pay")], Algorithm::FixedWindow, 1, Unit::Hour);
    w.publish(std::slice::from_ref(&small), &[], 1).unwrap();
    let mut e = Reader::new(&path);
    e.set_background(true);
    e.refresh(1);
    let large: Vec<_> = (2..=BACKGROUND_MIN + 10)
        .map(|i| {
            strategy(
                i,
                &[("userid", &format!("u{i}"))],
                Algorithm::FixedWindow,
                1,
                Unit::Hour,
            )
        })
        .collect();
    w.publish(&large, &[], 2).unwrap();
    assert!(e.refresh(2).is_none(), "the build of version 2 starts");
    assert_eq!(e.table().unwrap().config_version(), 1);
    w.publish(std::slice::from_ref(&small), &[], 3).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    e.refresh(3);
    assert_eq!(
        e.table().unwrap().config_version(),
        3,
        "the superseded build is not installed"
    );
}

/// Issue 28: a worker refuses a world-writable configuration file (anyone
/// could have written its rules): one error line naming it, requests
/// pass; the agent's mode back, the table is enforced again.
#[test]
fn a_world_writable_configuration_is_refused_by_workers() {
    let (_dir, path, mut w) = fresh_writer();
    let s = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&s), &[], 1).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o646)).unwrap();
    assert!(matches!(
        Mapping::open(&path),
        Err(ShmError::Untrusted { .. })
    ));
    let mut e = Reader::new(&path);
    reports(&mut e, 0, Severity::Error, "world-writable (mode 0646)");
    assert!(e.table().is_none(), "fails open");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let c = e.refresh(2 * RECHECK_NS).expect("recovery reported");
    assert!(c.message.contains("enforcing"), "{}", c.message);
}

/// Issue 28: with nginx's `rate_ctl_shm_owner`, a worker refuses a
/// configuration owned by anyone but root or that user (fails open, one
/// line naming the owner); without it, by anyone but root or the owner
/// of its directory.
#[test]
fn a_configuration_of_another_owner_is_refused_with_rate_ctl_shm_owner() {
    use std::os::unix::fs::MetadataExt;
    let (_dir, path, mut w) = fresh_writer();
    let s = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&s), &[], 1).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // chown needs root
    }
    std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
    assert!(Mapping::open(&path).is_ok(), "tools: any owner is read");
    assert!(Mapping::open_owned(&path, Some(65534)).is_ok(), "its owner");
    // Without rate_ctl_shm_owner: root or the directory's owner (root).
    match Mapping::open_owned(&path, None) {
        Err(e @ ShmError::Untrusted { .. }) => {
            let m = e.to_string();
            assert!(m.contains("neither root nor the owner of"), "{m}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let dir = path.parent().unwrap();
    std::os::unix::fs::chown(dir, Some(65534), None).unwrap();
    assert!(
        Mapping::open_owned(&path, None).is_ok(),
        "the directory's owner's file"
    );
    std::os::unix::fs::chown(dir, Some(0), None).unwrap();
    match Mapping::open_owned(&path, Some(1)) {
        Err(e @ ShmError::Untrusted { .. }) => {
            let m = e.to_string();
            assert!(m.contains("owned by") && m.contains("uid 65534"), "{m}");
            assert!(m.contains("rate_ctl_shm_owner"), "{m}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut e = Reader::new(&path).with_owner(Some(1));
    let c = e.refresh(0).expect("refusal reported");
    assert!(c.message.contains("not trusted"), "{}", c.message);
    assert!(e.table().is_none(), "fails open");
    std::os::unix::fs::chown(&path, Some(0), None).unwrap();
    let c = e.refresh(2 * RECHECK_NS).expect("root's file: enforced");
    assert!(c.message.contains("enforcing"), "{}", c.message);
}
