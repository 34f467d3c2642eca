//! Agent fault handling: invalid rows, signals, capacity, store outage.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::process::Command;
use std::time::{Duration, Instant};

use agent::{wait_for, AgentProc, Reader};
use cli::{
    add_strategy, ok, sql, sqlite_and_dir, sqlite_store, stores, update_strategy, version,
    MYSQL_ENV, POSTGRES_ENV,
};

fn add(s: &str, name: &str, rate: u64) -> u32 {
    add_strategy(
        s,
        name,
        "token_bucket",
        &rate.to_string(),
        &["--match", &format!("api=/{name}"), "--scope", "host"],
    )
    .trim()
    .parse()
    .unwrap()
}

#[test]
fn bad_rows_are_skipped_and_named_in_the_log() {
    for st in stores("bad_rows") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let good = add(s, "good", 10);
        let ids: Vec<u32> = ["zero", "algo", "json", "ip", "dup"]
            .iter()
            .map(|n| add(s, n, 10))
            .collect();
        // Break rows behind the CLI's back, as a hand edit in the database would.
        sql(
            s,
            &format!("UPDATE strategies SET rate = 0 WHERE id = {}", ids[0]),
        );
        sql(
            s,
            &format!(
                "UPDATE strategies SET algorithm = 'bogus_bucket' WHERE id = {}",
                ids[1]
            ),
        );
        sql(
            s,
            &format!(
                "UPDATE strategies SET conditions = '{{not json' WHERE id = {}",
                ids[2]
            ),
        );
        sql(
            s,
            &format!(
                "UPDATE strategies SET conditions = '[[\"ip\",\"1.2.3.999\"]]' WHERE id = {}",
                ids[3]
            ),
        );
        sql(s, &format!("UPDATE strategies SET conditions = '[[\"api\",\"/a\"],[\"api\",\"/b\"]]' WHERE id = {}", ids[4]));
        sql(s, "UPDATE config_version SET version = version + 1");

        let shm = dir.path().join("f.shm");
        let a = AgentProc::start(s, &shm, "h", &dir.path().join("a.log"), &[]);
        let mut r = Reader::open(&shm);
        let v = version(s) as u64;
        let t = r
            .wait_version(v, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{}: nothing published; log:\n{}", st.label, a.log_text()));
        let published: Vec<u32> = t.strategies().iter().map(|c| c.strategy.id).collect();
        assert_eq!(
            published,
            vec![good],
            "{}: only the good row applies",
            st.label
        );
        let log = a.log_text();
        for (id, why) in ids.iter().zip([
            "rate: must be greater than 0",
            "algorithm: unknown value \"bogus_bucket\"",
            "conditions: not a JSON list",
            "1.2.3.999",
            "appears twice",
        ]) {
            let line = log
                .lines()
                .find(|l| {
                    l.contains("skipping invalid strategy row") && l.contains(&format!("id={id} "))
                })
                .unwrap_or_else(|| panic!("{}: no log line for id {id}:\n{log}", st.label));
            assert!(
                line.contains(why),
                "{}: {line:?} should say {why:?}",
                st.label
            );
        }
        // Logged once, not on every poll.
        std::thread::sleep(Duration::from_millis(600));
        let n = a.log_text().matches(&format!("id={} ", ids[0])).count();
        assert_eq!(n, 1, "{}: one line per bad row", st.label);

        // Fixing the row applies it.
        sql(
            s,
            &format!("UPDATE strategies SET rate = 5 WHERE id = {}", ids[0]),
        );
        sql(s, "UPDATE config_version SET version = version + 1");
        let t = r.wait_version(v + 1, Duration::from_secs(5)).unwrap();
        assert_eq!(t.strategies().len(), 2);
    }
}

#[test]
fn sigterm_and_sigint_exit_zero_and_restart_adopts_the_file() {
    let (st, dir) = sqlite_and_dir();
    let s = st.url.as_str();
    let shm = dir.path().join("f.shm");
    let id = add(s, "keep", 1_000);
    for (n, sig) in [libc::SIGTERM, libc::SIGINT].into_iter().enumerate() {
        let mut a = AgentProc::start(s, &shm, "h", &dir.path().join("a.log"), &[]);
        // Signal a running agent (before its handlers exist, a signal is fatal).
        let published = wait_for(Duration::from_secs(10), || {
            (a.log_text().matches("published:").count() > n).then_some(())
        });
        assert!(published.is_some(), "agent published:\n{}", a.log_text());
        let mut r = Reader::open(&shm);
        assert!(r
            .table()
            .is_some_and(|t| t.strategies().iter().any(|c| c.strategy.id == id)));
        let status = a.stop_with(sig, Duration::from_secs(10)).expect("exits");
        assert_eq!(status.code(), Some(0), "signal {sig} → exit 0");
        assert!(a.log_text().contains("received; exiting"));
    }
    let log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(log.contains("created the shared-memory file"));
    assert!(
        log.contains("adopted the shared-memory file"),
        "second start adopts:\n{log}"
    );
}

/// Four strategies named `{prefix}0`..`{prefix}3` in the store, an agent
/// capped at four (`--max-strategies` after SMALL_CAPS overrides it) on
/// `dir/f.shm` logging to `dir/a.log`, and a reader that has seen the full
/// table published at the store's version `v`.
fn full_table_of_four(s: &str, dir: &std::path::Path, prefix: &str) -> (AgentProc, Reader, u64) {
    let shm = dir.join("f.shm");
    for i in 0..4 {
        add(s, &format!("{prefix}{i}"), 10);
    }
    let a = AgentProc::start(s, &shm, "h", &dir.join("a.log"), &["--max-strategies", "4"]);
    let mut r = Reader::open(&shm);
    let v = version(s) as u64;
    assert_eq!(
        r.wait_version(v, Duration::from_secs(10))
            .unwrap()
            .strategies()
            .len(),
        4
    );
    (a, r, v)
}

#[test]
fn capacity_exceeded_names_the_limit_and_keeps_the_previous_table() {
    let (st, dir) = sqlite_and_dir();
    let s = st.url.as_str();
    let (a, mut r, v) = full_table_of_four(s, dir.path(), "s");
    let fifth = add(s, "s4", 10);
    let found = wait_for(Duration::from_secs(5), || {
        a.log_text()
            .lines()
            .find(|l| l.contains("publish refused"))
            .map(String::from)
    })
    .unwrap_or_else(|| panic!("no refusal logged:\n{}", a.log_text()));
    assert!(
        found.contains("max strategies") && found.contains("(4)"),
        "{found}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let t = r.table().unwrap();
    assert_eq!(t.config_version(), v, "previous table kept");
    assert_eq!(t.strategies().len(), 4);
    assert_eq!(
        a.log_text().matches("publish refused").count(),
        1,
        "logged once"
    );
    ok(&["strategy", "rm", "--store", s, &fifth.to_string()]);
    ok(&["strategy", "update", "--store", s, "1", "--rate", "11"]);
    let v2 = version(s) as u64;
    let t = r
        .wait_version(v2, Duration::from_secs(5))
        .expect("recovers once it fits");
    assert_eq!(t.strategies().len(), 4);
}

#[test]
fn replace_import_of_a_full_table_is_published_in_stages() {
    let (st, dir) = sqlite_and_dir();
    let s = st.url.as_str();
    let (a, mut r, _) = full_table_of_four(s, dir.path(), "old");
    // Four new strategies replace the four: the table fits, but their slots
    // are taken until this very publish frees them (and 2 s more).
    let file = dir.path().join("new.jsonl");
    let lines: Vec<String> = (0..4)
        .map(|i| {
            format!(
                r#"{{"name":"new{i}","match":{{"api":"/new{i}"}},"algorithm":"token_bucket","rate":10,"scope":"host"}}"#
            )
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    ok(&[
        "strategy",
        "import",
        "--store",
        s,
        "--replace",
        file.to_str().unwrap(),
    ]);
    let v2 = version(s) as u64;
    let t0 = Instant::now();
    let t = wait_for(Duration::from_secs(8), || {
        r.table()
            .filter(|t| t.config_version() == v2 && t.strategies().len() == 4)
    })
    .unwrap_or_else(|| panic!("the new table never arrived whole:\n{}", a.log_text()));
    let names: Vec<String> = t
        .strategies()
        .iter()
        .map(|c| String::from_utf8_lossy(&t.conditions(c)[0].value).into_owned())
        .collect();
    assert_eq!(names, ["/new0", "/new1", "/new2", "/new3"]);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let log = a.log_text();
    assert!(log.contains("published in stages"), "{log}");
    assert!(!log.contains("publish refused"), "{log}");
}

/// Stops and restarts a private MariaDB server (its own data directory and
/// port) under a running agent.
#[test]
fn store_down_for_10s_agent_keeps_enforcing_then_catches_up() {
    store_down(MYSQL_ENV, "mariadb");
}

/// The same with a private PostgreSQL server.
#[test]
fn store_down_for_10s_agent_keeps_enforcing_then_catches_up_postgres() {
    store_down(POSTGRES_ENV, "postgres");
}

/// `env` set means the server is available; `kind` names
/// scripts/{kind}-test-server.sh.
fn store_down(env: &str, kind: &str) {
    if std::env::var(env).is_err() {
        eprintln!("\n!!!!!! store_down: SKIPPED: {env} is not set ({kind} not available).\n");
        return;
    }
    let script = cli::repo_root().join(format!("scripts/{kind}-test-server.sh"));
    let dir = tempfile::tempdir().unwrap();
    // PostgreSQL runs as its own user, who must reach the data directory.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let db_dir = dir.path().join(kind);
    let server = |cmd: &str| -> String {
        let o = Command::new("bash")
            .arg(&script)
            .arg(cmd)
            .arg(&db_dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    struct Stop<'a>(&'a dyn Fn(&str) -> String);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            (self.0)("stop");
        }
    }
    let url = server("start");
    let _stop = Stop(&server);
    let id = add(&url, "steady", 1_000);
    let shm = dir.path().join("f.shm");
    let mut a = AgentProc::start(
        &url,
        &shm,
        "h",
        &dir.path().join("a.log"),
        &["--max-backoff-ms", "1000"],
    );
    let mut r = Reader::open(&shm);
    let v = version(&url) as u64;
    r.wait_version(v, Duration::from_secs(10))
        .expect("published");

    server("stop");
    let down = Instant::now();
    let mut beats = Vec::new();
    while down.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(500));
        assert!(a.alive(), "agent must not crash while the store is down");
        let t = r.table().expect("the file keeps its table");
        assert!(t.strategies().iter().any(|c| c.strategy.id == id));
        beats.push(
            rate_ctl::core::shm::Mapping::open(&shm)
                .unwrap()
                .heartbeat_unix_ms(),
        );
    }
    assert!(
        beats.windows(2).all(|w| w[1] >= w[0]) && beats.last() > beats.first(),
        "file heartbeat goes on while the store is down: {beats:?}"
    );
    server("start");
    let up = Instant::now();
    update_strategy(&url, &id.to_string(), &["--rate", "999"]);
    let v2 = version(&url) as u64;
    let caught = r.wait_version(v2, Duration::from_secs(10));
    assert!(caught.is_some(), "agent catches up; log:\n{}", a.log_text());
    println!(
        "OUTAGE {kind}: store down 10 s; change after restart visible {:.2} s after the server was back",
        up.elapsed().as_secs_f64()
    );
    // The recovery line follows the publish it made possible.
    wait_for(Duration::from_secs(2), || {
        a.log_text().contains("store reachable again").then_some(())
    });
    let log = a.log_text();
    // One line per change of state, not one per retry (about ten retries
    // happened). A server that is shutting down may take one more query
    // before it goes, so an outage can log down/up twice.
    let down = log.matches("store unreachable").count();
    let up = log.matches("store reachable again").count();
    assert!(
        (1..=2).contains(&down) && up == down,
        "down {down}, up {up}:\n{log}"
    );
    assert!(!log.contains(":rate_ctl@"), "password in the log:\n{log}");
    assert_eq!(
        a.stop_with(libc::SIGTERM, Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );

    // An agent (re)started while the store is down adopts the file and
    // keeps its table, then catches up once the store is back.
    server("stop");
    let log2 = dir.path().join("b.log");
    let mut b = AgentProc::start(&url, &shm, "h", &log2, &["--max-backoff-ms", "500"]);
    let unreachable = wait_for(Duration::from_secs(10), || {
        b.log_text().contains("store unreachable").then_some(())
    });
    assert!(unreachable.is_some(), "{}", b.log_text());
    assert!(b.log_text().contains("adopted the shared-memory file"));
    std::thread::sleep(Duration::from_secs(1));
    assert!(b.alive());
    let t = r.table().expect("table kept");
    assert_eq!(t.config_version(), v2);
    let rate = |t: &rate_ctl::core::table::Table| {
        t.strategies()
            .iter()
            .find(|c| c.strategy.id == id)
            .map(|c| c.strategy.rate)
    };
    assert_eq!(rate(&t), Some(999));
    server("start");
    update_strategy(&url, &id.to_string(), &["--rate", "998"]);
    let v3 = version(&url) as u64;
    let t = r
        .wait_version(v3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("restarted agent catches up:\n{}", b.log_text()));
    assert_eq!(rate(&t), Some(998));
    assert_eq!(
        b.stop_with(libc::SIGTERM, Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
}

/// The first row of `host list --json`.
fn first_host(store: &str) -> serde_json::Value {
    let out = ok(&["host", "list", "--store", store, "--json"]);
    serde_json::from_str(out.lines().next().unwrap()).unwrap()
}

/// Whether a worker opening `shm` now enforces `n` strategies.
fn enforcing(shm: &std::path::Path, n: usize) -> bool {
    let mut r = rate_ctl::core::shm::reader::Reader::new(shm.to_path_buf());
    r.refresh(rate_ctl::core::clock::MonotonicClock::now());
    r.table().is_some_and(|t| t.published_strategies() == n)
}

/// Issue 28: the agent checks what is live at every poll. The file
/// removed, replaced by a symbolic link, its mode set to 0, the state file
/// removed, the blacklist header overwritten, a checksum-valid hostile
/// segment announced under a sequence the agent did not write: each is found within a poll
/// (50 ms; 2 s allowed here for a loaded machine), logged at error level
/// naming what changed, repaired (workers enforce the table again) and
/// shown by `host list` as the host's publish error (kept 60 s).
#[test]
fn changes_to_the_live_files_are_repaired_within_a_poll_and_reported() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let st = sqlite_store();
    let s = st.url.as_str();
    add(s, "live", 10);
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("rc.shm");
    let state = rate_ctl::core::shm::state_path(&shm);
    let a = AgentProc::start(
        s,
        &shm,
        "live-host",
        &dir.path().join("a.log"),
        &["--poll-ms", "50"],
    );
    assert!(
        wait_for(Duration::from_secs(20), || enforcing(&shm, 1).then_some(())).is_some(),
        "published: {}",
        a.log_text()
    );
    assert!(first_host(s)["publish_error"].is_null());
    let restored = |what: &str, check: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        let back = wait_for(Duration::from_secs(2), || {
            (check() && enforcing(&shm, 1)).then_some(())
        });
        assert!(back.is_some(), "{what}: not restored: {}", a.log_text());
        let took = t0.elapsed();
        // The report follows at the next heartbeat (forced at once; 5 s
        // allowed: a loaded machine delayed it past 2 s once).
        let shown = wait_for(Duration::from_secs(5), || {
            let h = first_host(s);
            h["publish_error"]
                .as_str()
                .is_some_and(|f| f.contains(what))
                .then_some(())
        });
        assert!(shown.is_some(), "{what}: host list shows {}", first_host(s));
        assert!(
            a.log_text().contains(what),
            "{what}: logged: {}",
            a.log_text()
        );
        took
    };

    std::fs::remove_file(&shm).unwrap();
    let t = restored("removed", &|| shm.exists());
    eprintln!("removed: restored in {t:?}");

    let moved = dir.path().join("moved");
    std::fs::rename(&shm, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &shm).unwrap();
    let t = restored("symbolic link", &|| {
        std::fs::symlink_metadata(&shm).is_ok_and(|m| m.file_type().is_file())
    });
    eprintln!("symlink: restored in {t:?}");

    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o000)).unwrap();
    let t = restored("mode changed", &|| {
        std::fs::metadata(&shm).is_ok_and(|m| m.mode() & 0o7777 == 0o640)
    });
    eprintln!("chmod 0: restored in {t:?}");

    std::fs::remove_file(&state).unwrap();
    let t = restored(".state removed", &|| state.exists());
    eprintln!("state removed: restored in {t:?}");

    {
        let m = rate_ctl::core::shm::Mapping::open_writable(&shm).unwrap();
        m.blacklist().store(0, 0xdead_beef);
    }
    let t = restored("blacklist header", &|| {
        rate_ctl::core::shm::Mapping::open(&shm)
            .is_ok_and(|m| rate_ctl::core::blacklist::Blacklist::open(m.blacklist()).is_ok())
    });
    eprintln!("blacklist header: restored in {t:?}");

    // A checksum-valid hostile segment announced under a new sequence (a
    // count of 2^32-1; issue 28): workers refuse it and keep their table,
    // the agent notices the sequence it did not write and publishes its
    // table again within a poll.
    // (Not through `restored`: the fault shown by `host list` may still be
    // the previous one here, as faults are kept 60 s; the repair is what
    // this case checks.)
    {
        let m = rate_ctl::core::shm::Mapping::open_writable(&shm).unwrap();
        rate_ctl::core::fuzz::Crafted::Count.publish(&m);
    }
    let t0 = Instant::now();
    let back = wait_for(Duration::from_secs(2), || {
        // The active segment decodes again (the agent may reuse the
        // crafted one's sequence number for its own publish).
        let m = rate_ctl::core::shm::Mapping::open(&shm).ok()?;
        let seq = m.seq();
        let mut buf = Vec::new();
        let good = rate_ctl::core::shm::segment::read_segment(
            &m.segment((seq & 1) as usize),
            seq,
            &mut buf,
        )
        .is_ok();
        (good && enforcing(&shm, 1)).then_some(())
    });
    assert!(
        back.is_some(),
        "crafted segment: not replaced: {}",
        a.log_text()
    );
    eprintln!("crafted segment: replaced in {:?}", t0.elapsed());
    // Restored as the agent's own: the state file's owner.
    assert_eq!(
        std::fs::metadata(&shm).unwrap().uid(),
        std::fs::metadata(&state).unwrap().uid()
    );
}
