//! The per-key table in a real shared-memory file, used by real processes:
//! N processes racing on M keys admit exactly the allowance of each key;
//! a limited key stays limited through a flood of new keys; an older
//! layout's file is refused and replaced.

#[path = "support/shm.rs"]
mod shm;

use std::path::Path;
use std::time::{Duration, Instant};

use rate_ctl::core::admit::Now;
use rate_ctl::core::keys::{Charge, KeyId, KeyLimiter, KeyTable};
use rate_ctl::core::model::{Action, Algorithm, Strategy, Unit};
use rate_ctl::core::shm::{Capacities, Mapping, ShmError, H_VERSION_INIT, LAYOUT_VERSION};
use rate_ctl::core::slot::Slot;
use rate_ctl::core::writer::{Opened, Writer};
use shm::{role, small_caps, spawn_role};

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
    let keys: Vec<KeyId> = (0..KEYS).map(|i| key(&t, &map, &format!("k{i}"))).collect();
    while rate_ctl::core::shm::unix_ms() < start_unix_ms {
        std::hint::spin_loop();
    }
    let mut admitted = vec![0u64; keys.len()];
    for _ in 0..ROUNDS {
        for (i, k) in keys.iter().enumerate() {
            if matches!(charge(&t, &map, k, &l, NOW), Charge::Admitted { .. }) {
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
    let start = rate_ctl::core::shm::unix_ms() + 500;
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
    let a = key(&t, &map, "A");
    let n = (0..10)
        .filter(|_| matches!(charge(&t, &map, &a, &l, NOW), Charge::Admitted { .. }))
        .count();
    assert_eq!(n, ALLOWANCE as usize);
    let mut full = 0;
    for i in 0..10 * cap {
        let k = key(&t, &map, &format!("flood{i}"));
        if charge(&t, &map, &k, &l, NOW + S) == Charge::Full {
            full += 1;
        }
    }
    assert!(full >= 9 * cap, "{full}");
    let interval = 3600 * S; // one token per hour
    for dt in [2 * S, interval / 2, interval - 1] {
        assert!(
            matches!(charge(&t, &map, &a, &l, NOW + dt), Charge::Rejected { .. }),
            "A admitted at +{dt} ns"
        );
    }
    assert!(matches!(
        charge(&t, &map, &a, &l, NOW + interval),
        Charge::Admitted { .. }
    ));
    // Another process sees the same state.
    let other = Mapping::open(&path).unwrap();
    let t2 = other.keys();
    assert!(matches!(
        charge(&t2, &other, &a, &l, NOW + interval),
        Charge::Rejected { .. }
    ));
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
        let a = key(&t, &map, "A");
        for _ in 0..ALLOWANCE {
            assert!(matches!(
                charge(&t, &map, &a, &l, NOW),
                Charge::Admitted { .. }
            ));
        }
    }
    drop(w);
    // The agent restarts: the file (secret, keys) is adopted as it is.
    let w = Writer::create_or_adopt(&path, caps(512), 0o600).unwrap();
    assert!(matches!(w.opened(), Opened::Adopted { .. }));
    {
        let map = Mapping::open(&path).unwrap();
        let t = map.keys();
        let a = key(&t, &map, "A");
        assert!(matches!(
            charge(&t, &map, &a, &l, NOW),
            Charge::Rejected { .. }
        ));
    }
    drop(w);
    // A file of the previous layout (version 2, no key table) is refused
    // by this build's workers (they fail open) and replaced by its agent.
    {
        let m = Mapping::open(&path).unwrap();
        let h = m.header();
        let vi = h.load(H_VERSION_INIT);
        h.store(
            H_VERSION_INIT,
            (vi & !0xFFFF_FFFF) | (LAYOUT_VERSION as u64 - 1),
        );
    }
    match Mapping::open(&path) {
        Err(ShmError::Version { found, .. }) => assert_eq!(found, LAYOUT_VERSION - 1),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let w = Writer::create_or_adopt(&path, caps(512), 0o600).unwrap();
    match w.opened() {
        Opened::Recreated { reason } => assert!(reason.contains("layout version"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A newer layout than this build's is refused the same way (what an
    // older module does with this file).
    {
        let m = Mapping::open(&path).unwrap();
        let h = m.header();
        let vi = h.load(H_VERSION_INIT);
        h.store(
            H_VERSION_INIT,
            (vi & !0xFFFF_FFFF) | (LAYOUT_VERSION as u64 + 1),
        );
    }
    assert!(matches!(
        Mapping::open(&path),
        Err(ShmError::Version { .. })
    ));
}
