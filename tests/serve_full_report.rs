//! An agent reading through `rate-ctl serve` with a full table (65,536
//! strategies) reports the counters of all of them. serve takes at most
//! 2 MiB a request and such a report is about 4 MiB of JSON: before the
//! agent sent it in chunks, every heartbeat was refused (HTTP 413), the
//! agent took serve for unreachable and reconnected forever, and no
//! counter of the host ever reached the store.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::io::Write;
use std::time::Duration;

use agent::{decide_one, wait_for, AgentProc, Reader};
use serve::{http_raw, Serve};

const N: u32 = 65_536;

#[test]
fn every_counter_of_a_full_table_reaches_the_store_through_serve() {
    let (st, dir) = cli::sqlite_and_dir();
    let file = dir.path().join("full.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    for i in 1..=N {
        writeln!(
            f,
            r#"{{"name":"s{i}","algorithm":"fixed_window","rate":100,"per":"minute","scope":"host","match":{{"userid":"u{i}"}}}}"#
        )
        .unwrap();
    }
    drop(f);
    cli::ok(&[
        "strategy",
        "import",
        "--replace",
        "--store",
        &st.url,
        file.to_str().unwrap(),
    ]);

    let s = Serve::start_in(&st.url, dir.path(), &[]);
    let shm = dir.path().join("full.shm");
    let log = dir.path().join("agent.log");
    let mut ag = AgentProc::start_with_caps(
        &s.url(),
        &shm,
        "web-1",
        &log,
        &[],
        &["--token", &s.token, "--heartbeat-ms", "200"],
    );
    let mut r = Reader::open(&shm);
    let t = wait_for(Duration::from_secs(120), || {
        r.table().filter(|t| t.published_strategies() == N as usize)
    })
    .unwrap_or_else(|| {
        panic!(
            "the agent never published {N} strategies\n{}",
            ag.log_text()
        )
    });

    // One request for every strategy: every counter moves at once.
    let ids: Vec<u32> = t.strategies().iter().map(|c| c.strategy.id).collect();
    for i in 1..=N {
        assert!(decide_one(&t, "userid", format!("u{i}").as_bytes()), "u{i}");
    }
    let (first, last) = (ids.iter().min().unwrap(), ids.iter().max().unwrap());
    let series = |id: &u32| format!("rate_ctl_fleet_passed_total{{strategy=\"{id}\"");
    // 65,536 counters through serve's debug build into SQLite: a minute
    // on a quiet machine, more beside CI's other suites (a run at 60 s
    // failed with the reports still arriving): the bound is liveness only.
    let seen = wait_for(Duration::from_secs(240), || {
        let (c, body) = http_raw(&s.addr, "GET", "/metrics", Some(&s.token), None);
        let text = String::from_utf8_lossy(&body).into_owned();
        let has = |id: &u32| {
            text.lines().any(|l| {
                l.starts_with(&series(id)) && l.contains("host=\"web-1\"") && l.ends_with(" 1")
            })
        };
        (c == 200 && has(first) && has(last)).then_some(())
    });
    let text = ag.log_text();
    assert!(
        seen.is_some(),
        "the counters of strategies {first} and {last} never reached the store\n{text}"
    );
    assert!(
        !text.contains("HTTP 413") && !text.contains("error=report"),
        "the agent's reports were refused:\n{text}"
    );
    assert!(ag.alive());
}
