//! Fleet leases (issue 17) on one machine: one `rate-ctl serve` on SQLite,
//! three agents with distinct host ids reading through it, each writing
//! its own shm file; a load generator per host decides requests against
//! that host's file with the core table (the code nginx workers run) at
//! an offered rate, and counts what is admitted each second.
//!
//! A `cluster` token bucket of 300/s with `split: demand`, offered 80/15/5:
//! at 1.0× and 2.0× the fleet admits ≥ 95 % and ≤ 102 % of the rate over
//! 10 s once converged (the static split admits 53 % and 73 %), no second
//! above 105 %; the skew flipped to 5/15/80 is back within ±5 % in ≤ 6 s;
//! with serve killed no second goes above 105 % and after the leases
//! expire each host admits at least its static share; serve back (after
//! 11 s) brings the demand split back; a fourth host joining while one
//! dies re-converges with the total held. A per-day quota of
//! 100 with all traffic on one host admits exactly 100 (static: 34; each
//! idle host is leased a count of 0).
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent::{wait_for, AgentProc, Reader};
use serve::Serve;

const RATE: u64 = 300;

/// The tests of this file one at a time: the load generators' timing is
/// what they measure.
static SERIAL: Mutex<()> = Mutex::new(());

/// Offered load per host and admitted per host per second.
struct Load {
    offered: Vec<Arc<AtomicU64>>,
    /// Admitted per second since the start, per host.
    admitted: Arc<Mutex<Vec<Vec<u64>>>>,
    start: Instant,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// One thread per shm file offering `api=<api>` requests.
    fn start(shms: &[std::path::PathBuf], api: &'static str) -> Load {
        let n = shms.len();
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let admitted = Arc::new(Mutex::new(Vec::<Vec<u64>>::new()));
        let offered: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let threads = shms
            .iter()
            .enumerate()
            .map(|(i, shm)| {
                let (stop, admitted, offered) =
                    (stop.clone(), admitted.clone(), offered[i].clone());
                let mut reader = Reader::open(shm);
                std::thread::spawn(move || {
                    let mut due = 0.0f64;
                    let mut last = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(2));
                        let now = Instant::now();
                        due += offered.load(Ordering::Relaxed) as f64
                            * now.duration_since(last).as_secs_f64();
                        last = now;
                        let Some(t) = reader.table() else { continue };
                        let mut passed = 0;
                        while due >= 1.0 {
                            due -= 1.0;
                            passed += u64::from(agent::decide_one(&t, "api", api.as_bytes()));
                        }
                        let sec = now.duration_since(start).as_secs() as usize;
                        let mut a = admitted.lock().unwrap();
                        while a.len() <= sec {
                            a.push(vec![0; n]);
                        }
                        a[sec][i] += passed;
                    }
                })
            })
            .collect();
        Load {
            offered,
            admitted,
            start,
            stop,
            threads,
        }
    }

    fn offer(&self, rates: &[u64]) {
        for (o, r) in self.offered.iter().zip(rates) {
            o.store(*r, Ordering::Relaxed);
        }
    }

    /// The current second since the start.
    fn now(&self) -> usize {
        self.start.elapsed().as_secs() as usize
    }

    /// Waits for the second `sec` to be complete.
    fn wait_past(&self, sec: usize) {
        while self.now() <= sec {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Fleet-wide admitted in each second of `from..to`.
    fn totals(&self, from: usize, to: usize) -> Vec<u64> {
        let a = self.admitted.lock().unwrap();
        (from..to)
            .map(|s| a.get(s).map_or(0, |v| v.iter().sum()))
            .collect()
    }

    fn per_host(&self, from: usize, to: usize) -> Vec<Vec<u64>> {
        let a = self.admitted.lock().unwrap();
        (from..to)
            .map(|s| a.get(s).cloned().unwrap_or_default())
            .collect()
    }

    /// The first whole second from `from` (within `max` s) from which
    /// three seconds in a row are within 5 % of `target`; seconds after
    /// `from`.
    fn converge(&self, from: usize, target: u64, max: usize) -> Option<usize> {
        for s in from..from + max {
            self.wait_past(s + 2);
            let t = self.totals(s, s + 3);
            if t.iter().all(|v| v.abs_diff(target) * 20 <= target) {
                return Some(s - from);
            }
        }
        None
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

fn skew(total: u64, pct: [u64; 3]) -> Vec<u64> {
    pct.iter().map(|p| total * p / 100).collect()
}

/// An agent for host `h` through `serve`, its log `DIR/h.log`.
fn fleet_agent(serve: &Serve, dir: &std::path::Path, shm: &std::path::Path, h: &str) -> AgentProc {
    AgentProc::start(
        &serve.url(),
        shm,
        h,
        &dir.join(format!("{h}.log")),
        &[
            "--token",
            &serve.token,
            "--freshness",
            "3s",
            "--max-backoff-ms",
            "500",
        ],
    )
}

#[test]
fn demand_split_admits_the_rate_under_skew() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let st = cli::sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let mut serve = Serve::start_in(&st.url, dir.path(), &["--freshness", "3s"]);
    let (code, v) = serve.req(
        "POST",
        "/api/v1/strategies",
        Some(
            r#"{"name":"fleet","algorithm":"token_bucket","rate":300,"burst":20,
                "match":{"api":"/fleet"},"split":"demand"}"#,
        ),
    );
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_u64().unwrap();
    let (code, v) = serve.req(
        "POST",
        "/api/v1/strategies",
        Some(
            r#"{"name":"daily","algorithm":"fixed_window","rate":100,"per":"day",
                "match":{"api":"/daily"},"split":"demand"}"#,
        ),
    );
    assert_eq!(code, 201, "{v}");

    let hosts = ["h0", "h1", "h2"];
    let shms: Vec<_> = hosts
        .iter()
        .map(|h| dir.path().join(format!("{h}.shm")))
        .collect();
    let mut agents: Vec<AgentProc> = hosts
        .iter()
        .zip(&shms)
        .map(|(h, shm)| fleet_agent(&serve, dir.path(), shm, h))
        .collect();
    let logs = |agents: &[AgentProc]| {
        agents
            .iter()
            .map(|a| a.log_text())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    // Every host has a table with the strategy.
    for shm in &shms {
        let mut r = Reader::open(shm);
        assert!(
            wait_for(Duration::from_secs(10), || r
                .rates()
                .iter()
                .any(|x| x.0 as u64 == id)
                .then_some(()))
            .is_some(),
            "{}",
            logs(&agents)
        );
    }

    let load = Load::start(&shms, "/fleet");
    // The per-day quota, all traffic on h0, during the rest of the test.
    let daily = Load::start(&shms, "/daily");
    daily.offer(&[20, 0, 0]);
    let mut figures = Vec::new();
    for (mult, label) in [(100u64, "1.0x"), (200, "2.0x")] {
        let from = load.now();
        load.offer(&skew(RATE * mult / 100, [80, 15, 5]));
        let t = load.converge(from, RATE, 15).unwrap_or_else(|| {
            panic!(
                "{label}: no convergence; per second {:?}\nhosts: {}\n{}",
                load.per_host(from, load.now()),
                serve.get("/api/v1/hosts"),
                logs(&agents)
            )
        });
        let s = from + t + 3;
        load.wait_past(s + 10);
        let secs = load.totals(s, s + 10);
        let avg = secs.iter().sum::<u64>() as f64 / 10.0;
        figures.push(format!(
            "{label}: converged in {t} s, {:.1} % of the rate over 10 s, max second {} ({:?})",
            avg * 100.0 / RATE as f64,
            secs.iter().max().unwrap(),
            load.per_host(s, s + 10).last()
        ));
        assert!(
            avg >= 0.95 * RATE as f64 && avg <= 1.02 * RATE as f64,
            "{label}: {avg}/s {secs:?}"
        );
        assert!(
            secs.iter().all(|v| *v * 100 <= RATE * 105),
            "{label}: {secs:?}"
        );
    }

    // Flip to 5/15/80 (2.0×).
    let from = load.now();
    load.offer(&skew(RATE * 2, [5, 15, 80]));
    let t = load.converge(from, RATE, 15).unwrap_or_else(|| {
        panic!(
            "flip: no convergence: {:?}",
            load.per_host(from, load.now())
        )
    });
    figures.push(format!("flip 80/15/5 → 5/15/80: within ±5 % after {t} s"));
    assert!(
        t <= 6,
        "flip took {t} s: {:?}",
        load.per_host(from, from + t + 3)
    );
    let api = serve.get("/api/v1/hosts");
    let leases = &api["hosts"][2]["leases"];
    assert!(
        leases
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["strategy"] == id && l["rate"].as_u64().unwrap() > 150),
        "h2 leases: {api}"
    );
    assert!(api["leader"]["holder"]
        .as_str()
        .unwrap()
        .starts_with("serve:"));
    let (code, metrics) = serve::http_raw(&serve.addr, "GET", "/metrics", Some(&serve.token), None);
    assert_eq!(code, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(&format!(
            "rate_ctl_lease_rate{{strategy=\"{id}\",name=\"fleet\",host=\"h2\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("rate_ctl_lease_age_seconds{"));
    let list = cli::ok(&[
        "--api",
        &serve.url(),
        "--token",
        &serve.token,
        "host",
        "list",
    ]);
    assert!(
        list.contains(&format!("  lease: strategy {id} rate ")),
        "{list}"
    );
    // The per-day quota: 100 fleet-wide (the static split: 34 on h0).
    let day: Vec<u64> = daily
        .per_host(0, daily.now())
        .iter()
        .fold(vec![0; 3], |acc, s| {
            acc.iter()
                .zip(s.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a + b)
                .collect()
        });
    figures.push(format!(
        "per-day quota 100, all traffic on h0: admitted {day:?}"
    ));
    // Idle hosts are leased 0 (a window of limit 0 admits nothing more
    // today): all 100 go to h0.
    assert_eq!(day, vec![100, 0, 0], "per-day quota");

    // serve killed: leases hold until they expire (5 s), then the static
    // split (100 each: 30 + 90 + 100 admitted of 30/90/480 offered).
    serve.child.kill().unwrap();
    let _ = serve.child.wait();
    let from = load.now();
    load.wait_past(from + 11);
    let secs = load.totals(from, from + 11);
    let hosts_after = load.per_host(from + 8, from + 11);
    figures.push(format!(
        "serve killed: per second {secs:?}; last 3 s per host {hosts_after:?}"
    ));
    assert!(
        secs.iter().all(|v| *v * 100 <= RATE * 105),
        "serve down: {secs:?}"
    );
    for (i, want) in [30u64, 90, 100].iter().enumerate() {
        for s in &hosts_after {
            assert!(
                s[i] * 100 >= want * 90,
                "host {i} after expiry: {hosts_after:?}\n{}",
                logs(&agents)
            );
        }
    }
    // serve back (same address) after 11 s down: the leases expired at 5 s
    // (the shortest outage that exercises the expiry and the static
    // fallback; the issue's 30 s adds nothing but wall time). A new leader
    // resumes and the demand split is back within ±5 % of the rate.
    let serve = serve.restart(&st.url, &["--freshness", "3s"]);
    let from = load.now();
    let back = load.converge(from, RATE, 15);
    figures.push(format!(
        "serve back: converged in {} s",
        seconds_or_none(back)
    ));
    assert!(
        back.is_some(),
        "serve back: {:?}\n{}",
        load.totals(from, load.now()),
        logs(&agents)
    );

    // A fourth host joins (offered 150/s) and h0 dies (its agent killed,
    // its traffic gone): the shares re-converge — h3 gets its fair share
    // of what h1 (90/s) leaves, about (300 − 95) / 2 — and the total holds.
    let shm3 = dir.path().join("h3.shm");
    let mut h3 = fleet_agent(&serve, dir.path(), &shm3, "h3");
    let load3 = Load::start(std::slice::from_ref(&shm3), "/fleet");
    load3.offer(&[150]);
    load.offer(&[0, 90, 480]);
    agents[0].stop_with(9, Duration::from_secs(5));
    let from = load.now();
    let from3 = load3.now();
    // Fleet-wide per second: the three first hosts plus h3.
    let fleet = |a: usize, b: usize| -> Vec<u64> {
        let t3 = load3.totals(from3 + a, from3 + b);
        load.totals(from + a, from + b)
            .iter()
            .zip(t3)
            .map(|(x, y)| x + y)
            .collect()
    };
    let mut settled = None;
    for s in 0..20 {
        load.wait_past(from + s + 2);
        load3.wait_past(from3 + s + 2);
        let h3s = load3.totals(from3 + s, from3 + s + 3);
        if fleet(s, s + 3)
            .iter()
            .all(|v| v.abs_diff(RATE) * 20 <= RATE)
            && h3s.iter().all(|v| *v >= 90)
        {
            settled = Some(s);
            break;
        }
    }
    let seen = fleet(0, load.now() - from);
    figures.push(format!(
        "h3 joins, h0 dies: re-converged in {} s; max second {}; fleet per second {seen:?}; h3 {:?}",
        seconds_or_none(settled),
        seen.iter().max().unwrap_or(&0),
        load3.totals(from3, load3.now())
    ));
    assert!(
        settled.is_some(),
        "h3 joins, h0 dies: fleet {seen:?}, h3 {:?}\n{}\n---\n{}",
        load3.totals(from3, load3.now()),
        logs(&agents),
        h3.log_text()
    );
    // Until its first lease (≤ 2 s: a report, an allocation, the next
    // report) h3 enforces its static share, ⌈300 / 4⌉ = 75, on top of the
    // leases in force (README, residual error); from then on no second
    // above 105 %.
    let h3s = load3.totals(from3, load3.now());
    assert!(
        seen.iter()
            .take(2)
            .all(|v| *v * 100 <= RATE * 105 + 75 * 100)
            && seen.iter().skip(2).all(|v| *v * 100 <= RATE * 105),
        "h3 joins, h0 dies: fleet {seen:?}, h3 {h3s:?}"
    );
    load3.stop();
    h3.stop_with(15, Duration::from_secs(5));
    load.stop();
    daily.stop();
    for f in &figures {
        eprintln!("{f}");
    }
    // h0's agent was killed and reaped above: its pid is not signalled.
    for a in &mut agents {
        if a.alive() {
            a.stop_with(15, Duration::from_secs(5));
        }
    }
}

/// Agents on the store itself (no serve): one of them leads. On every
/// configured store (SQLite; MariaDB and PostgreSQL when their URLs are
/// set): the leases appear with Σ = the rate, each host publishes its lease
/// as its local rate, the leader is an agent; when the leading agent stops,
/// another takes over and the hosts keep leases (never Σ above the rate).
#[test]
fn agents_on_a_direct_store_elect_a_leader() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for st in cli::stores("fleet_leases") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let id: u32 = cli::add_strategy(
            s,
            "fleet",
            "token_bucket",
            "300",
            &[
                "--match",
                "api=/fleet",
                "--split",
                "demand",
                "--burst",
                "20",
            ],
        )
        .trim()
        .parse()
        .unwrap();
        let mut agents: Vec<AgentProc> = ["a", "b"]
            .iter()
            .map(|h| {
                AgentProc::start(
                    s,
                    &dir.path().join(format!("{h}.shm")),
                    h,
                    &dir.path().join(format!("{h}.log")),
                    &["--freshness", "3s"],
                )
            })
            .collect();
        let mut readers: Vec<Reader> = agents.iter().map(|a| Reader::open(&a.shm)).collect();
        let leases = || -> Vec<(String, u64)> {
            cli::json_lines(&cli::ok(&["--store", s, "--json", "host", "list"]))
                .iter()
                .flat_map(|h| {
                    let host = h["host_id"].as_str().unwrap().to_string();
                    h["leases"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|l| l["strategy"] == id && l["age_ms"].as_u64().unwrap() < 3_000)
                        .map(|l| (host.clone(), l["rate"].as_u64().unwrap()))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        // Both hosts leased (idle: the floors and the spare by weight, Σ =
        // 300), and each publishes its lease.
        let got = wait_for(Duration::from_secs(15), || {
            let l = leases();
            let rates: Vec<u64> = readers
                .iter_mut()
                .map(|r| r.rates().iter().find(|x| x.0 == id).map_or(0, |x| x.1))
                .collect();
            (l.len() == 2
                && l.iter().map(|x| x.1).sum::<u64>() == 300
                && l.iter().map(|x| x.1).collect::<Vec<_>>() == rates)
                .then_some(l)
        });
        assert!(
            got.is_some(),
            "{}: leases {:?}\n{}\n---\n{}",
            st.label,
            leases(),
            agents[0].log_text(),
            agents[1].log_text()
        );
        // The leader logs when it takes the lead.
        let leads = |a: &AgentProc| a.log_text().contains("fleet leader: resuming");
        let leaders: Vec<usize> = (0..2).filter(|&i| leads(&agents[i])).collect();
        assert_eq!(leaders.len(), 1, "{}: one leader", st.label);
        // The leader stops (SIGTERM); the other agent takes over.
        let i = leaders[0];
        agents[i].stop_with(15, Duration::from_secs(5));
        let j = 1 - i;
        assert!(
            wait_for(Duration::from_secs(10), || leads(&agents[j]).then_some(())).is_some(),
            "{}: no new leader\n{}",
            st.label,
            agents[j].log_text()
        );
        for a in &mut agents {
            a.stop_with(15, Duration::from_secs(5));
        }
    }
}

/// `split` not given: `demand` for a cluster strategy, `static` for host
/// scope and allow (CLI add, import); a row stored before the column
/// existed (NULL) stays `static`; `strategy update` without `--split`
/// keeps the strategy's split; export writes every split out, so an
/// exported static strategy imports as static.
#[test]
fn split_defaults_to_demand_for_cluster_scope() {
    let st = cli::sqlite_store();
    let s = st.url.as_str();
    let id = |out: String| out.trim().to_string();
    cli::add_strategy(s, "c", "token_bucket", "300", &[]);
    cli::add_strategy(s, "h", "token_bucket", "300", &["--scope", "host"]);
    cli::ok(&[
        "strategy", "add", "--store", s, "--name", "a", "--action", "allow",
    ]);
    let old = id(cli::add_strategy(s, "old", "fixed_window", "100", &[]));
    // A row from before migration 7 (written with the static split).
    cli::sql(
        s,
        &format!("UPDATE strategies SET split = NULL WHERE id = {old}"),
    );
    // "name split" of every strategy, in id order.
    let splits = || -> String {
        cli::json_lines(&cli::ok(&["--store", s, "--json", "strategy", "list"]))
            .iter()
            .map(|v| format!("{} {}", v["name"].as_str().unwrap(), v["split"]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let before = r#"c "demand", h "static", a "static", old "static""#;
    assert_eq!(splits(), before);
    // update without --split keeps it (the old row stays static).
    cli::ok(&["strategy", "update", "--store", s, &old, "--rate", "50"]);
    assert_eq!(splits(), before);
    // Into allow, the demand split goes with the other parameters an allow
    // has no use for (nothing to lease): the strategy is static from then
    // on, also back to reject, until `--split demand` says otherwise.
    let c = "1";
    cli::ok(&["strategy", "update", "--store", s, c, "--action", "allow"]);
    assert!(splits().starts_with(r#"c "static""#), "{}", splits());
    cli::ok(&["strategy", "update", "--store", s, c, "--priority", "3"]);
    assert!(splits().starts_with(r#"c "static""#), "{}", splits());
    cli::ok(&["strategy", "update", "--store", s, c, "--action", "reject"]);
    assert!(splits().starts_with(r#"c "static""#), "{}", splits());
    cli::ok(&["strategy", "update", "--store", s, c, "--split", "demand"]);
    assert_eq!(splits(), before);
    // Export names every split; import of it keeps them, and an import
    // line without a split gets the default.
    let (_dir, file, text) = cli::export_strategies(s);
    assert_eq!(text.matches("\"split\":\"static\"").count(), 3, "{text}");
    let mut lines = text;
    lines.push_str(
        r#"{"name":"new","match":{"api":"/new"},"algorithm":"fixed_window","rate":5,"per":"day"}"#,
    );
    lines.push('\n');
    std::fs::write(&file, lines).unwrap();
    cli::ok(&["strategy", "import", "--store", s, "--replace", &file]);
    assert_eq!(splits(), format!(r#"{before}, new "demand""#));
}

/// A figure's "converged in N s" (scripts/fleet-split.sh reads N): the
/// seconds, or `none`.
fn seconds_or_none(t: Option<impl std::fmt::Display>) -> String {
    t.map_or_else(|| "none".to_string(), |t| t.to_string())
}
