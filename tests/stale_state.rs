//! Limiter state no clock could have written (issue 11, item 5): the
//! request path never rewinds state (a stale worker could not tell it from a
//! newer legitimate state), so the running agent, whose clock is fresh,
//! replaces it with an exhausted quota at its next poll, and leaves state a
//! clock could have written alone. A real `rate-ctl agent` and the file read
//! the way a worker reads it.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::sync::atomic::Ordering;
use std::time::Duration;

use agent::{wait_for, AgentProc, Reader};
use cli::{add_strategy, sqlite_store, version};
use rate_ctl::core::clock::MonotonicClock;
use rate_ctl::core::shm::slot::Slot;

const S: u64 = 1_000_000_000;

#[test]
fn the_agent_replaces_foreign_state_and_leaves_plausible_state_alone() {
    let st = sqlite_store();
    let s = st.url.as_str();
    add_strategy(s, "bucket", "token_bucket", "1", &["--match", "api=/b"]);
    add_strategy(s, "window", "fixed_window", "3", &["--match", "api=/w"]);
    add_strategy(s, "ahead", "token_bucket", "1", &["--match", "api=/a"]);
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("rc.shm");
    let agent = AgentProc::start(s, &shm, "h", &dir.path().join("a.log"), &[]);
    let mut reader = Reader::open(&shm);
    let table = reader
        .wait_version(version(s) as u64, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no table:\n{}", agent.log_text()));
    let map = table.mapping().expect("mapped").clone();
    let slots = map.slots();
    // Ids in the order added (a fresh store).
    let slot_of = |id: u32| {
        let c = table
            .strategies()
            .iter()
            .find(|c| c.strategy.id == id)
            .unwrap();
        Slot::at(&slots, c.slot).unwrap()
    };
    let (bucket, window, ahead) = (slot_of(1), slot_of(2), slot_of(3));
    // Garbage: a bucket time centuries ahead, a window in 2106.
    bucket.state0().store(u64::MAX - 7, Ordering::SeqCst);
    window
        .state0()
        .store((0xFFFF_FFF0u64 << 32) | 1, Ordering::SeqCst);
    // Plausible: 30 s ahead of now (a newer worker's full queue, a clock
    // stepped back): waited out, never rewound.
    let plausible = MonotonicClock::now() + 30 * S;
    ahead.state0().store(plausible, Ordering::SeqCst);

    let repaired = wait_for(Duration::from_secs(3), || {
        let now = MonotonicClock::now();
        let tat = bucket.state0().load(Ordering::SeqCst);
        let unix_s = rate_ctl::core::clock::unix_ms() / 1000;
        let w = window.state0().load(Ordering::SeqCst);
        (tat <= now + 2 * S && (w >> 32) <= unix_s + 1).then_some((tat, w, now))
    });
    let (tat, w, now) = repaired.unwrap_or_else(|| {
        panic!(
            "not repaired: {:#x} {:#x}\n{}",
            bucket.state0().load(Ordering::SeqCst),
            window.state0().load(Ordering::SeqCst),
            agent.log_text()
        )
    });
    // An exhausted quota, not a fresh one: the bucket empty (its time at
    // least now), the window at its limit.
    assert!(tat + 2 * S >= now, "bucket left empty: {tat} vs {now}");
    assert_eq!(w & 0xFFFF_FFFF, 3, "the window full: {w:#x}");
    assert_eq!(
        ahead.state0().load(Ordering::SeqCst),
        plausible,
        "plausible state left alone"
    );
    // The warning follows the repair (it may trail the file by a moment),
    // and a poll may fall between the two stores above: the slots of every
    // repair line add up to the two garbage states.
    let repaired_slots = |log: &str| -> u64 {
        log.lines()
            .filter(|l| l.contains("replaced by an exhausted quota"))
            .filter_map(|l| l.split("slots=").nth(1))
            .filter_map(|t| t.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    let counted = wait_for(Duration::from_secs(3), || {
        (repaired_slots(&agent.log_text()) >= 2).then_some(())
    });
    let log = agent.log_text();
    assert!(counted.is_some(), "no repair logged for both slots:\n{log}");
    assert_eq!(repaired_slots(&log), 2, "{log}");
}
