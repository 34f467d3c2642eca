//! `kill -9` the agent while it publishes, many times: a worker never
//! accepts a torn table, every restart adopts the file, and the counters of
//! a strategy that never changes keep counting in the same slot.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::{AgentProc, Reader};
use cli::{ok, stores, TestStore};
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::table::Table;

const CHANGING: u32 = 300;

/// Generation `g` of the strategy set: id 1 never changes; ids 2..=CHANGING+1 all
/// carry rate `g` and a userid naming `g`, so any mix of two generations
/// is visible.
fn generation(g: u64) -> String {
    let mut s = String::from(
        "{\"id\":1,\"name\":\"steady\",\"match\":{\"api\":\"/steady\"},\"algorithm\":\"fixed_window\",\
         \"rate\":4000000000,\"per\":\"day\",\"scope\":\"host\"}\n",
    );
    for id in 2..2 + CHANGING {
        s.push_str(&format!(
            "{{\"id\":{id},\"name\":\"c{id}\",\"match\":{{\"userid\":\"u{id}-{g}\"}},\
             \"algorithm\":\"token_bucket\",\"rate\":{g},\"burst\":1,\"scope\":\"host\"}}\n"
        ));
    }
    s
}

/// Is `t` exactly one generation?
fn consistent(t: &Table) -> Result<(), String> {
    let list = t.strategies();
    if list.len() != 1 + CHANGING as usize {
        return Err(format!("{} strategies", list.len()));
    }
    let g = list
        .iter()
        .find(|c| c.strategy.id == 2)
        .ok_or("no id 2")?
        .strategy
        .rate;
    for c in list {
        let s = &c.strategy;
        // The table keeps conditions once, interned; `conditions` gives
        // them back.
        let value = &t.conditions(c)[0].value;
        if s.id == 1 {
            if s.rate != 4_000_000_000 || value != b"/steady" {
                return Err("steady strategy changed".into());
            }
            continue;
        }
        let want = format!("u{}-{g}", s.id);
        if s.rate != g || value != want.as_bytes() {
            return Err(format!(
                "torn: id {} has rate {} value {:?}, id 2 has generation {g}",
                s.id,
                s.rate,
                String::from_utf8_lossy(value)
            ));
        }
    }
    Ok(())
}

/// Passes one `api=/steady` request through the table (counts in slot 1).
fn hit_steady(t: &Table) {
    agent::decide_one(t, "api", b"/steady");
}

fn steady_slot(t: &Table) -> (u32, u64, u64) {
    let c = t.strategies().iter().find(|c| c.strategy.id == 1).unwrap();
    let map = t.mapping().expect("mapped");
    let slot = Slot::at(&map.slots(), c.slot).unwrap();
    (c.slot, c.generation, slot.counters().passed)
}

fn run(st: &TestStore, kills: usize, budget: Duration) {
    let s = st.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let gen_file = |g: u64| {
        let p = dir.path().join(format!("g{}.jsonl", g % 2));
        std::fs::write(&p, generation(g)).unwrap();
        p
    };
    ok(&[
        "strategy",
        "import",
        "--store",
        s,
        gen_file(1).to_str().unwrap(),
    ]);
    let shm = dir.path().join("f.shm");
    let log = dir.path().join("agent.log");
    let args = ["--poll-ms", "10"];
    let mut a = AgentProc::start(s, &shm, "k9", &log, &args);
    let mut r0 = Reader::open(&shm);
    let first = r0
        .wait_version(1, Duration::from_secs(20))
        .expect("first publish");
    consistent(&first).unwrap();
    let (slot0, gen0, _) = steady_slot(&first);
    drop(first);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    // Readers: like workers, reload on every sequence change and check.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, seen, shm) = (stop.clone(), seen.clone(), shm.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut r = Reader::open(&shm);
                let mut last_seq = 0;
                let mut last_passed = 0;
                let mut tables = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(t) = r.table() {
                        if t.version() != last_seq {
                            last_seq = t.version();
                            tables += 1;
                            consistent(&t)?;
                            let (slot, gen, passed) = steady_slot(&t);
                            if (slot, gen) != (slot0, gen0) {
                                return Err(format!(
                                    "steady strategy moved: slot {slot0}/{gen0} → {slot}/{gen}"
                                ));
                            }
                            if passed < last_passed {
                                return Err(format!("counter went back {last_passed} → {passed}"));
                            }
                            last_passed = passed;
                        }
                        hit_steady(&t);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                seen.fetch_add(tables, Ordering::Relaxed);
                Ok(tables)
            })
        })
        .collect();
    // A changer: a new generation every ~15 ms, one transaction each.
    let changer = {
        let (stop, s, dir) = (stop.clone(), s.to_string(), dir.path().to_path_buf());
        std::thread::spawn(move || {
            let mut g = 2u64;
            while !stop.load(Ordering::Relaxed) {
                let p = dir.join(format!("c{}.jsonl", g % 2));
                std::fs::write(&p, generation(g)).unwrap();
                ok(&["strategy", "import", "--store", &s, p.to_str().unwrap()]);
                g += 1;
                std::thread::sleep(Duration::from_millis(15));
            }
            g
        })
    };

    let start = Instant::now();
    let mut done = 0;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    while done < kills && start.elapsed() < budget {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Kill at a random point: start-up, adoption, first publish, polling
        // or a later publish.
        std::thread::sleep(Duration::from_millis(5 + rng % 150));
        a.signal(libc::SIGKILL);
        let _ = a.child.wait();
        done += 1;
        a = AgentProc::start(s, &shm, "k9", &log, &args);
    }
    // Let the last agent publish the latest generation.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let gens = changer.join().unwrap();
    let mut tables = 0;
    for h in readers {
        tables += h
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {e}", st.label));
    }
    let t = r0.table().unwrap();
    consistent(&t).unwrap();
    let (slot, gen, passed) = steady_slot(&t);
    assert_eq!(
        (slot, gen),
        (slot0, gen0),
        "{}: same slot after {done} restarts",
        st.label
    );
    assert!(passed > 0);
    let logtext = a.log_text();
    // Some kills land before the agent has even opened the file; every
    // start that did open it adopted it: one creation, no re-creation.
    let adopted = logtext.matches("adopted the shared-memory file").count();
    assert!(
        adopted >= done / 2,
        "{}: {adopted} adoptions for {done} restarts",
        st.label
    );
    assert!(
        !logtext.contains("recreated the shared-memory file"),
        "{}",
        st.label
    );
    assert_eq!(logtext.matches("created the shared-memory file").count(), 1);
    println!(
        "KILL9 {}: {done} kill -9 in {:.1} s, {adopted} adoptions, {} generations written, {tables} table loads checked, \
         steady counter {passed} in slot {slot} throughout",
        st.label,
        start.elapsed().as_secs_f64(),
        gens - 1
    );
    assert!(done >= 30, "{}: only {done} kills in the budget", st.label);
    let status = a.stop_with(libc::SIGTERM, Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

#[test]
fn kill_9_during_publishes_never_tears_and_counters_continue() {
    let all = stores("kill9");
    // 100 kills per store; the time budget caps a slow machine (at least 30
    // kills must fit) so the test stays under two minutes.
    for st in &all {
        run(st, 100, Duration::from_secs(45));
    }
}
