//! The per-key table in a real shared-memory file, used by real processes:
//! N processes racing on M keys admit exactly the allowance of each key;
//! a limited key stays limited through a flood of new keys; an older
//! layout's file is refused and replaced.

#[path = "support/shm.rs"]
mod shm;

use std::path::Path;
use std::time::{Duration, Instant};

use rate_ctl::core::admit::Verdict;
use rate_ctl::core::clock::Now;
use rate_ctl::core::keys::{Charge, KeyId, KeyLimiter, KeyTable};
use rate_ctl::core::model::each::{Each, OnFull};
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::shm::writer::{Opened, Writer};
use rate_ctl::core::shm::{Capacities, Mapping, ShmError, H_VERSION_INIT, LAYOUT_VERSION};
use rate_ctl::core::table::{Request, RequestOutcome, Scratch, Table};
use shm::{role, small_caps, spawn_role, strategy};

const S: u64 = 1_000_000_000;
const PROCS: usize = 4;
const KEYS: u32 = 64;
const ALLOWANCE: u64 = 5;
const ROUNDS: u64 = 40;
/// The same (synthetic) instant in every process: nothing refills.
const NOW: u64 = 5_000 * S;

fn caps(keys: u32) -> Capacities {
    Capacities {
        keys,
        ..small_caps()
    }
}

fn limiter() -> KeyLimiter {
    let s = Strategy::unconditioned(
        Algorithm::TokenBucket,
        1,
        Unit::Hour,
        ALLOWANCE as u32,
        Action::Reject { status: None },
    )
    .unwrap();
    KeyLimiter::from_strategy(&s).unwrap()
}

fn key(t: &KeyTable, map: &Mapping, name: &str) -> KeyId {
    let generation = Slot::at(&map.slots(), 0)
        .unwrap()
        .generation()
        .load(std::sync::atomic::Ordering::Acquire);
    let mut h = t.hasher(1);
    h.part(name.as_bytes());
    t.key(h, 0, generation).unwrap()
}

fn charge(t: &KeyTable, map: &Mapping, k: &KeyId, l: &KeyLimiter, now: u64) -> Charge {
    t.charge(k, l, Now::from(now), false, &map.slots(), |_| Some(l))
}

/// Child: wait for the common start, charge every key `ROUNDS` times
/// (keys interleaved), write "key admitted" lines to `out`.
fn race(path: &Path, start_unix_ms: u64, out: &Path) {
    let map = Mapping::open(path).unwrap();
    let t = map.keys();
    let l = limiter();
    let keys: Vec<KeyId> = (0..KEYS).map(|i| key(t, &map, &format!("k{i}"))).collect();
    while rate_ctl::core::clock::unix_ms() < start_unix_ms {
        std::hint::spin_loop();
    }
    let mut admitted = vec![0u64; keys.len()];
    for _ in 0..ROUNDS {
        for (i, k) in keys.iter().enumerate() {
            if matches!(charge(t, &map, k, &l, NOW), Charge::Admitted { .. }) {
                admitted[i] += 1;
            }
        }
    }
    let text: String = admitted
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i} {n}\n"))
        .collect();
    std::fs::write(out, text).unwrap();
}

#[test]
fn processes_racing_on_keys_admit_exactly_the_allowance() {
    if let Some((r, path)) = role() {
        let mut it = r.split(':');
        let (_, start, out) = (it.next(), it.next().unwrap(), it.next().unwrap());
        race(&path, start.parse().unwrap(), Path::new(out));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    // 64 keys in 1024 entries: no range ever fills; every key races.
    let _w = Writer::create_or_adopt(&path, caps(1024), 0o600).unwrap();
    let start = rate_ctl::core::clock::unix_ms() + 500;
    let mut children = Vec::new();
    let outs: Vec<_> = (0..PROCS)
        .map(|i| dir.path().join(format!("out{i}")))
        .collect();
    for out in &outs {
        let r = format!("race:{start}:{}", out.display());
        children.push(spawn_role(
            "processes_racing_on_keys_admit_exactly_the_allowance",
            &r,
            &path,
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for mut c in children {
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "child failed: {st}");
                break;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("child did not finish in 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut per_key = vec![0u64; KEYS as usize];
    for out in &outs {
        for line in std::fs::read_to_string(out).unwrap().lines() {
            let (k, n) = line.split_once(' ').unwrap();
            per_key[k.parse::<usize>().unwrap()] += n.parse::<u64>().unwrap();
        }
    }
    assert_eq!(per_key, vec![ALLOWANCE; KEYS as usize]);
    let map = Mapping::open(&path).unwrap();
    let t = map.keys();
    assert_eq!(t.counters(0).in_use, KEYS as u64);
    assert_eq!(
        t.scan_occupied(),
        KEYS as u64,
        "one entry per key, no copies"
    );
}

#[test]
fn a_limited_key_stays_limited_through_ten_times_capacity_of_new_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let cap = 256u32;
    let _w = Writer::create_or_adopt(&path, caps(cap), 0o600).unwrap();
    let map = Mapping::open(&path).unwrap();
    let t = map.keys();
    let l = limiter(); // 5 at once, then one per 12 minutes
    let a = key(t, &map, "A");
    let n = (0..10)
        .filter(|_| matches!(charge(t, &map, &a, &l, NOW), Charge::Admitted { .. }))
        .count();
    assert_eq!(n, ALLOWANCE as usize);
    let mut full = 0;
    for i in 0..10 * cap {
        let k = key(t, &map, &format!("flood{i}"));
        if charge(t, &map, &k, &l, NOW + S) == Charge::Full {
            full += 1;
        }
    }
    assert!(full >= 9 * cap, "{full}");
    let interval = 3600 * S; // one token per hour
    for dt in [2 * S, interval / 2, interval - 1] {
        assert!(
            matches!(charge(t, &map, &a, &l, NOW + dt), Charge::Rejected { .. }),
            "A admitted at +{dt} ns"
        );
    }
    assert!(matches!(
        charge(t, &map, &a, &l, NOW + interval),
        Charge::Admitted { .. }
    ));
    // Another process sees the same state.
    let other = Mapping::open(&path).unwrap();
    let t2 = other.keys();
    assert!(matches!(
        charge(t2, &other, &a, &l, NOW + interval),
        Charge::Rejected { .. }
    ));
}

/// Writes `version` into the file's header (through the file: a worker's
/// mapping of the configuration is read-only).
fn set_layout_version(path: &std::path::Path, version: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&version.to_le_bytes(), H_VERSION_INIT as u64)
        .unwrap();
}

/// `Writer::create_or_adopt` again after the last writer was dropped. Its
/// lock (`flock`) may outlive the drop for a moment: a test of this binary
/// that spawns a process at that instant shares the descriptor between
/// fork and exec. A real restart is another process, started after the
/// old one exited.
fn readopt(path: &Path) -> Writer {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match Writer::create_or_adopt(path, caps(512), 0o600) {
            Err(ShmError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            r => return r.unwrap(),
        }
    }
}

#[test]
fn keys_survive_an_agent_restart_and_an_older_layout_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let l = limiter();
    let w = Writer::create_or_adopt(&path, caps(512), 0o600).unwrap();
    {
        let map = Mapping::open(&path).unwrap();
        let t = map.keys();
        let a = key(t, &map, "A");
        for _ in 0..ALLOWANCE {
            assert!(matches!(
                charge(t, &map, &a, &l, NOW),
                Charge::Admitted { .. }
            ));
        }
    }
    drop(w);
    // The agent restarts: the file (secret, keys) is adopted as it is.
    let w = readopt(&path);
    assert!(matches!(w.opened(), Opened::Adopted { .. }));
    {
        let map = Mapping::open(&path).unwrap();
        let t = map.keys();
        let a = key(t, &map, "A");
        assert!(matches!(
            charge(t, &map, &a, &l, NOW),
            Charge::Rejected { .. }
        ));
    }
    drop(w);
    // A file of the previous layout (version 2, no key table) is refused
    // by this build's workers (they fail open) and replaced by its agent.
    set_layout_version(&path, LAYOUT_VERSION - 1);
    match Mapping::open(&path) {
        Err(ShmError::Version { found, .. }) => assert_eq!(found, LAYOUT_VERSION - 1),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let w = readopt(&path);
    match w.opened() {
        Opened::Recreated { reason } => assert!(reason.contains("layout version"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A newer layout than this build's is refused the same way (what an
    // older module does with this file).
    set_layout_version(&path, LAYOUT_VERSION + 1);
    assert!(matches!(
        Mapping::open(&path),
        Err(ShmError::Version { .. })
    ));
}

// ---- Per-key strategies through the table (publish → decide) ----------

/// A per-key strategy: `each` over `dims`, on `conds`.
fn keyed(
    id: u32,
    conds: &[(&str, &str)],
    dims: &[&str],
    alg: Algorithm,
    rate: u64,
    per: Unit,
) -> Strategy {
    let mut s = strategy(id, conds, alg, rate, per);
    s.burst = rate as u32;
    s.each = Each::of(dims);
    s
}

/// Publishes `list` into a new file with `keys` entries; the table.
fn table_of(list: &[Strategy], keys: u32) -> (tempfile::TempDir, Writer, std::sync::Arc<Table>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut w = Writer::create_or_adopt(&path, caps(keys), 0o600).unwrap();
    w.publish(list, &[], 1).unwrap();
    let mut e = Reader::new(&path);
    e.refresh(1);
    let t = e.table().unwrap().clone();
    (dir, w, t)
}

/// One request from `ip` with `pairs` as values, at `now_ns`; the verdict
/// (`None`: no strategy matched) and the key text of the deciding strategy.
fn ask(t: &Table, ip: &str, pairs: &[(&str, &str)], now_ns: u64) -> Option<Verdict> {
    let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|&(d, v)| (d, v.as_bytes())).collect();
    let values = t.values_of(&pairs);
    let r = Request {
        values: &values[..],
        ip: Some(ip.parse::<std::net::IpAddr>().unwrap().into()),
        now_ns,
        now_unix_ms: now_ns / 1_000_000,
        dry_run: false,
        quota: false,
    };
    match t.decide(&r).outcome {
        RequestOutcome::Limited(d) => Some(d.verdict),
        _ => None,
    }
}

fn passed(v: Option<Verdict>) -> bool {
    !matches!(v, Some(Verdict::Reject { .. }))
}

fn count(t: &Table, ip: &str, pairs: &[(&str, &str)], n: usize, now: u64) -> usize {
    (0..n).filter(|_| passed(ask(t, ip, pairs, now))).count()
}

#[test]
fn each_client_address_has_its_own_bucket() {
    let s = keyed(
        1,
        &[("api", "/login")],
        &["ip"],
        Algorithm::TokenBucket,
        3,
        Unit::Minute,
    );
    let (_d, _w, t) = table_of(&[s], 4096);
    let login = [("api", "/login")];
    assert_eq!(count(&t, "192.0.2.1", &login, 10, NOW), 3);
    assert_eq!(count(&t, "192.0.2.2", &login, 10, NOW), 3);
    assert_eq!(
        count(&t, "::ffff:192.0.2.1", &login, 10, NOW),
        0,
        "v4-mapped = v4"
    );
    // Another api is not selected by the conditions.
    assert_eq!(count(&t, "192.0.2.1", &[("api", "/home")], 10, NOW), 10);
    // 20 s later (rate 3/min) each client has exactly one more.
    assert_eq!(count(&t, "192.0.2.1", &login, 5, NOW + 20 * S), 1);
    let d = ask(&t, "192.0.2.1", &login, NOW + 20 * S);
    let Some(Verdict::Reject { id, .. }) = d else {
        panic!("{d:?}")
    };
    let values: Vec<Option<&[u8]>> = t
        .dimensions()
        .iter()
        .map(|d| (d == "api").then_some(&b"/login"[..]))
        .collect();
    let r = Request {
        values: &values[..],
        ip: Some("192.0.2.1".parse::<std::net::IpAddr>().unwrap().into()),
        now_ns: 0,
        now_unix_ms: 0,
        dry_run: false,
        quota: false,
    };
    assert_eq!(t.key_text(id, &r).as_deref(), Some("ip=192.0.2.1"));
    let map = t.mapping().unwrap();
    assert_eq!(map.keys().counters(t.strategies()[0].slot).in_use, 2);
}

#[test]
fn addresses_in_one_ipv6_prefix_share_a_bucket() {
    let s = keyed(1, &[], &["ip"], Algorithm::FixedWindow, 5, Unit::Hour);
    let (_d, _w, t) = table_of(&[s], 4096);
    // 10,000 addresses inside 2001:db8:0:1::/64: five pass in all.
    let mut admitted = 0;
    for i in 0..10_000u32 {
        let ip = format!("2001:db8:0:1:{:x}:{:x}::{:x}", i >> 8, i & 0xff, i % 7 + 1);
        admitted += passed(ask(&t, &ip, &[], NOW)) as usize;
    }
    assert_eq!(admitted, 5);
    // The next /64 is another key.
    assert_eq!(count(&t, "2001:db8:0:2::1", &[], 10, NOW), 5);
    let map = t.mapping().unwrap();
    assert_eq!(map.keys().counters(t.strategies()[0].slot).in_use, 2);
    // /56 aggregation puts both in one key.
    let mut s = keyed(1, &[], &["ip"], Algorithm::FixedWindow, 5, Unit::Hour);
    s.each.ipv6_prefix = 56;
    let (_d, _w, t) = table_of(&[s], 4096);
    assert_eq!(count(&t, "2001:db8:0:1::1", &[], 3, NOW), 3);
    assert_eq!(count(&t, "2001:db8:0:2::1", &[], 5, NOW), 2);
}

/// nginx-tests limit_req2.t: keys from two variables, two per-key
/// strategies on one request.
#[test]
fn two_per_key_strategies_and_empty_values() {
    let a = keyed(1, &[], &["a"], Algorithm::TokenBucket, 2, Unit::Hour);
    let b = keyed(2, &[], &["b"], Algorithm::TokenBucket, 3, Unit::Hour);
    let (_d, _w, t) = table_of(&[a, b], 4096);
    let ip = "10.0.0.1";
    // a=x b=y: a allows 2 → 2 pass; the third is rejected by strategy 1
    // and b is not charged for it.
    assert_eq!(count(&t, ip, &[("a", "x"), ("b", "y")], 5, NOW), 2);
    // b=y has one left: a=z (fresh) b=y passes once, then b rejects and
    // a=z is not charged (it still has 1 of 2 left afterwards).
    assert_eq!(count(&t, ip, &[("a", "z"), ("b", "y")], 3, NOW), 1);
    assert_eq!(count(&t, ip, &[("a", "z")], 5, NOW), 1);
    // Empty or missing values are not counted.
    assert_eq!(count(&t, ip, &[("a", ""), ("b", "")], 20, NOW), 20);
    assert_eq!(count(&t, ip, &[], 20, NOW), 20);
    // Length-prefixed: per-value buckets are per exact value.
    assert_eq!(count(&t, ip, &[("a", "x2")], 5, NOW), 2);
}

#[test]
fn on_full_decides_for_new_keys_only() {
    for (on_full, expect_new) in [
        (OnFull::Reject, 0),
        (OnFull::Allow, 20),
        (OnFull::Overflow, 4),
    ] {
        let mut s = keyed(1, &[], &["u"], Algorithm::TokenBucket, 4, Unit::Hour);
        s.each.on_full = on_full;
        // The whole table (the default cap is half of it).
        s.each.max_keys = 16;
        // 16 entries: the smallest table, every window of a key the whole
        // of it.
        let (_d, _w, t) = table_of(&[s], 16);
        for i in 0..16 {
            assert_eq!(count(&t, "10.0.0.1", &[("u", &format!("k{i}"))], 1, NOW), 1);
        }
        // The 17th key finds the table full.
        let n = count(&t, "10.0.0.1", &[("u", "new")], 20, NOW);
        assert_eq!(n, expect_new, "{on_full}");
        let map = t.mapping().unwrap();
        let c = map.keys().counters(t.strategies()[0].slot);
        assert_eq!(c.full, 20, "{on_full}");
        assert_eq!(
            c.overflow_admits,
            if on_full == OnFull::Overflow { 4 } else { 0 }
        );
        // An old key is still charged on its own entry.
        assert_eq!(count(&t, "10.0.0.1", &[("u", "k0")], 5, NOW), 3);
    }
}

/// The worker logs "key table full" for the request whose new key found
/// it full, and not again for the requests after it that decide no key.
#[test]
fn a_full_key_table_is_reported_for_its_request_only() {
    let mut s = keyed(
        1,
        &[("api", "/k")],
        &["u"],
        Algorithm::TokenBucket,
        4,
        Unit::Hour,
    );
    s.each.max_keys = 16;
    let shared = strategy(
        2,
        &[("api", "/s")],
        Algorithm::TokenBucket,
        100,
        Unit::Second,
    );
    let (_d, _w, t) = table_of(&[s, shared], 16);
    for i in 0..16 {
        assert_eq!(
            count(
                &t,
                "10.0.0.1",
                &[("api", "/k"), ("u", &format!("k{i}"))],
                1,
                NOW
            ),
            1
        );
    }
    let mut scratch = Scratch::default();
    let mut decide = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|&(d, v)| (d, v.as_bytes())).collect();
        let values = t.values_of(&pairs);
        let r = Request {
            values: &values[..],
            ip: Some("10.0.0.1".parse::<std::net::IpAddr>().unwrap().into()),
            now_ns: NOW,
            now_unix_ms: NOW / 1_000_000,
            dry_run: false,
            quota: false,
        };
        t.decide_into(&r, &mut smallvec::SmallVec::new(), &mut scratch);
        scratch.take_notices().key_full
    };
    assert_eq!(
        decide(&[("api", "/k"), ("u", "new")]),
        Some((1, OnFull::Overflow))
    );
    assert_eq!(
        decide(&[("api", "/s")]),
        None,
        "a request with no key reported it again"
    );
}

#[test]
fn per_key_concurrency_is_released_when_the_request_ends() {
    let s = keyed(1, &[], &["ip"], Algorithm::Concurrency, 2, Unit::Second);
    let (_d, _w, t) = table_of(&[s], 4096);
    let values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
    let req = |ip: &str| Request {
        values: &values[..],
        ip: Some(ip.parse::<std::net::IpAddr>().unwrap().into()),
        now_ns: NOW,
        now_unix_ms: 1,
        dry_run: false,
        quota: false,
    };
    let mut scratch = Scratch::default();
    let mut held_units = Vec::new();
    let mut pass = |ip: &str, held_units: &mut Vec<_>| {
        let mut held = smallvec::SmallVec::new();
        let o = t.decide_into(&req(ip), &mut held, &mut scratch);
        let ok = matches!(o, RequestOutcome::Limited(ref d) if !matches!(d.verdict, Verdict::Reject { .. }));
        if let Some(u) = t.units_with_keys(&held, &mut scratch) {
            held_units.push(u);
        }
        ok
    };
    assert!(pass("10.1.1.1", &mut held_units));
    assert!(pass("10.1.1.1", &mut held_units));
    assert!(!pass("10.1.1.1", &mut held_units));
    assert!(pass("10.1.1.2", &mut held_units), "another client");
    assert_eq!(held_units.len(), 3);
    held_units.remove(0).release();
    assert!(pass("10.1.1.1", &mut held_units));
    assert!(!pass("10.1.1.1", &mut held_units));
}

/// `rate-ctl shm inspect ARGS`.
fn shm_inspect(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rate-ctl"))
        .args(["shm", "inspect"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn key_figures_in_stats_prometheus_and_shm_inspect() {
    let mut s = keyed(7, &[], &["u"], Algorithm::TokenBucket, 1, Unit::Hour);
    s.each.on_full = OnFull::Reject;
    // The whole table (the default cap is half): at 16 keys the strategy
    // is at its cap as well, so its refused new keys count as capped too.
    s.each.max_keys = 16;
    // The name goes through the file and comes out escaped in Prometheus.
    s.name = "per \"user\" \\ 2".into();
    let plain = strategy(8, &[("api", "/x")], Algorithm::TokenBucket, 5, Unit::Second);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut w = Writer::create_or_adopt(&path, caps(16), 0o600).unwrap();
    w.publish(&[s, plain], &[], 1).unwrap();
    let mut e = Reader::new(&path);
    e.refresh(1);
    let t = e.table().unwrap().clone();
    for i in 0..16 {
        assert_eq!(count(&t, "10.0.0.1", &[("u", &format!("k{i}"))], 1, NOW), 1);
    }
    // Two new keys find the single range full (on_full reject); an hour
    // later the old keys are fresh and a new key reclaims one entry.
    assert_eq!(count(&t, "10.0.0.1", &[("u", "n1")], 2, NOW), 0);
    assert_eq!(count(&t, "10.0.0.1", &[("u", "n2")], 1, NOW + 3600 * S), 1);
    let stats = rate_ctl::core::stats::snapshot(&e);
    let json = rate_ctl::core::stats::render_json(&stats, 0);
    assert!(
        json.contains(r#"{"id":7,"passed":17,"limited":2,"delayed":0,"keys":{"in_use":16,"reclaims":1,"full":2,"overflow_admits":0,"capped":2}}"#),
        "{json}"
    );
    assert!(
        json.contains(r#"{"id":8,"passed":0,"limited":0,"delayed":0}"#),
        "{json}"
    );
    assert!(
        json.contains(r#""key_table":{"capacity":16,"occupied":16,"max_probe":"#),
        "{json}"
    );
    let probe = stats.key_table.max_probe;
    assert!((1..=48).contains(&probe), "{probe}");
    let prom = rate_ctl::core::stats::render_prometheus(&stats, 0);
    for line in [
        r#"rate_ctl_keys_in_use{strategy="7",name="per \"user\" \\ 2"} 16"#,
        r#"rate_ctl_key_reclaims_total{strategy="7",name="per \"user\" \\ 2"} 1"#,
        r#"rate_ctl_key_table_full_total{strategy="7",name="per \"user\" \\ 2"} 2"#,
        r#"rate_ctl_passed_total{strategy="7",name="per \"user\" \\ 2"} 17"#,
        r#"rate_ctl_passed_total{strategy="8",name=""} 0"#,
        "rate_ctl_key_table_occupied 16",
    ] {
        assert!(prom.lines().any(|l| l == line), "{line} missing:\n{prom}");
    }
    let probe_line = format!("rate_ctl_key_table_max_probe {probe}");
    assert!(prom.lines().any(|l| l == probe_line), "{prom}");
    let out = shm_inspect(&["--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["key_table"]["occupied"], 16, "{doc}");
    assert_eq!(doc["key_table"]["bytes_per_key"], 16);
    let row = doc["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == 7)
        .unwrap();
    assert_eq!(row["each"], serde_json::json!(["u"]));
    assert_eq!(row["name"], "per \"user\" \\ 2");
    assert_eq!(row["keys"]["reclaims"], 1);
    assert_eq!(row["on_full"], "reject");
    assert_eq!(
        (&row["max_keys"], &row["keys"]["capped"]),
        (&serde_json::json!(16), &serde_json::json!(2))
    );
    let text = shm_inspect(&[path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    let want =
        format!("key table:       16 of 16 entries in use (16 bytes each), longest probe {probe}");
    assert!(text.contains(&want), "{text}");
    assert!(
        text.contains("each=u (keys 16, reclaims 1, on_full reject 2, max_keys 16 capped 2)"),
        "{text}"
    );
}

/// Memory never grows with the number of distinct keys: after 2,000,000
/// new keys the file has the same size, and this process's resident
/// memory grew by at most the key region it touched (bounded by `--keys`).
#[test]
fn two_million_distinct_keys_change_neither_file_size_nor_memory_beyond_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let _w = Writer::create_or_adopt(&path, caps(65_536), 0o600).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let map = Mapping::open(&path).unwrap();
    let t = map.keys();
    let l = limiter();
    let rss_kib = || -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // Touch the whole table once, then measure from there.
    for i in 0..200_000u32 {
        charge(t, &map, &key(t, &map, &format!("warm{i}")), &l, NOW);
    }
    let before = rss_kib();
    let mut full = 0u64;
    for i in 0..2_000_000u32 {
        let mut h = t.hasher(1);
        h.part(&i.to_le_bytes());
        let k = t.key(h, 0, 0).unwrap();
        full += (charge(t, &map, &k, &l, NOW) == Charge::Full) as u64;
    }
    assert!(full > 1_900_000, "the table was full for new keys: {full}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 4 * 1024, "resident memory grew by {grown} KiB");
}

/// Every action per key: delay queues each key on its own, dry_run counts
/// and passes; a sliding window counts per key.
#[test]
fn delay_dry_run_and_sliding_window_per_key() {
    let mut delay = keyed(
        1,
        &[("api", "/d")],
        &["ip"],
        Algorithm::LeakyBucket,
        10,
        Unit::Second,
    );
    delay.burst = 1;
    delay.action = Action::Delay { max_delay_ms: 250 };
    let mut dry = keyed(
        2,
        &[("api", "/r")],
        &["ip"],
        Algorithm::FixedWindow,
        1,
        Unit::Hour,
    );
    dry.action = Action::DryRun;
    let sliding = keyed(
        3,
        &[("api", "/s")],
        &["ip"],
        Algorithm::SlidingWindow,
        2,
        Unit::Minute,
    );
    let (_d, _w, t) = table_of(&[delay, dry, sliding], 4096);
    let d = [("api", "/d")];
    assert_eq!(ask(&t, "10.0.0.1", &d, NOW), Some(Verdict::Pass));
    assert_eq!(
        ask(&t, "10.0.0.1", &d, NOW),
        Some(Verdict::Delay {
            id: 1,
            wait_ns: 100_000_000
        }),
        "the key's second request waits one interval"
    );
    assert_eq!(
        ask(&t, "10.0.0.2", &d, NOW),
        Some(Verdict::Pass),
        "another key does not wait"
    );
    // dry_run: over the limit still passes; limited is counted.
    for _ in 0..3 {
        assert_eq!(
            ask(&t, "10.0.0.1", &[("api", "/r")], NOW),
            Some(Verdict::Pass)
        );
    }
    let map = t.mapping().unwrap();
    let slot = rate_ctl::core::shm::slot::Slot::at(&map.slots(), t.strategies()[1].slot).unwrap();
    let c = slot.counters();
    assert_eq!(
        (c.passed, c.limited),
        (1, 2),
        "dry run: 1 passed, 2 would have been rejected"
    );
    // Sliding window 2/min, per key.
    let s = [("api", "/s")];
    let wall = 1_700_000_040 * S; // 40 s into a minute
    assert_eq!(count(&t, "10.0.0.1", &s, 4, wall), 2);
    assert_eq!(count(&t, "10.0.0.2", &s, 4, wall), 2);
}

#[test]
fn key_text_escapes_client_bytes_and_caps_them() {
    // What `... for key {key}` writes to error.log and $rate_ctl_key holds:
    // an ESC, a newline, invalid UTF-8 from a cookie or argument appear as
    // \xNN; a 10,000-byte value is cut.
    let s = keyed(1, &[], &["userid"], Algorithm::FixedWindow, 5, Unit::Hour);
    let (_d, _w, t) = table_of(&[s], 4096);
    let text = |v: &[u8]| {
        let values: Vec<Option<&[u8]>> = t
            .dimensions()
            .iter()
            .map(|d| (d == "userid").then_some(v))
            .collect();
        t.key_text(
            1,
            &Request {
                values: &values[..],
                ip: None,
                now_ns: 0,
                now_unix_ms: 0,
                dry_run: false,
                quota: false,
            },
        )
        .unwrap()
    };
    assert_eq!(text(b"u1"), "userid=u1");
    assert_eq!(
        text(b"a\x1b[2Jb\nfake: line\xff"),
        "userid=a\\x1b[2Jb\\x0afake: line\\xff"
    );
    let long = text(&[b'x'; 10_000]);
    assert!(
        long.len() < 300 && long.ends_with("...(10000 bytes)"),
        "{}",
        long.len()
    );
}
