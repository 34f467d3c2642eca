//! Cluster rates split by host weight: three agents with weights 1, 1, 2
//! on one store, a cluster strategy of 400/s → 100, 100, 200; one host goes
//! stale → the others re-split within the freshness window.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::time::{Duration, Instant};

use agent::{wait_for, AgentProc, Reader};
use cli::{add_strategy, ok, stores};

fn rate_of(r: &mut Reader, id: u32) -> Option<u64> {
    r.rates()
        .into_iter()
        .find(|(i, _, _)| *i == id)
        .map(|(_, rate, _)| rate)
}

#[test]
fn weights_1_1_2_split_400_and_resplit_when_a_host_goes_stale() {
    const FRESH_MS: u64 = 2_000;
    for st in stores("weights") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let [cluster, per_host]: [u32; 2] = [
            (
                "fleet",
                "token_bucket",
                ["--match", "api=/pay", "--burst", "40"],
            ),
            (
                "each",
                "fixed_window",
                ["--match", "api=/login", "--scope", "host"],
            ),
        ]
        .map(|(name, algorithm, extra)| {
            // The weighted split is what this test is about (cluster
            // strategies default to leases by demand).
            let extra = [&extra[..], &["--split", "static"]].concat();
            let id = add_strategy(s, name, algorithm, "400", &extra);
            id.trim().parse().unwrap()
        });
        let fresh = format!("{FRESH_MS}ms");
        let extra = ["--freshness", fresh.as_str(), "--heartbeat-ms", "200"];
        let hosts = [("a", "1"), ("b", "1"), ("c", "2")];
        let mut procs: Vec<AgentProc> = hosts
            .iter()
            .map(|(h, w)| {
                let mut args = extra.to_vec();
                args.extend_from_slice(&["--weight", w]);
                AgentProc::start(
                    s,
                    &dir.path().join(format!("{h}.shm")),
                    h,
                    &dir.path().join(format!("{h}.log")),
                    &args,
                )
            })
            .collect();
        let mut readers: Vec<Reader> = procs.iter().map(|p| Reader::open(&p.shm)).collect();

        let want = [100u64, 100, 200];
        let split = wait_for(Duration::from_secs(10), || {
            let got: Vec<Option<u64>> = readers.iter_mut().map(|r| rate_of(r, cluster)).collect();
            (got == want.map(Some)).then_some(())
        });
        assert!(
            split.is_some(),
            "{}: local rates {:?}, want {want:?}; logs:\n{}",
            st.label,
            readers.iter_mut().map(|r| r.rates()).collect::<Vec<_>>(),
            procs
                .iter()
                .map(|p| p.log_text())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        for r in readers.iter_mut() {
            assert_eq!(
                rate_of(r, per_host),
                Some(400),
                "{}: host scope as written",
                st.label
            );
            let burst = r.rates().into_iter().find(|x| x.0 == cluster).unwrap().2;
            assert!(
                burst == 10 || burst == 20,
                "{}: burst split too, got {burst}",
                st.label
            );
        }

        // c stops heartbeating (SIGKILL: no goodbye); a and b take 200 each.
        let killed = Instant::now();
        procs[2].signal(libc::SIGKILL);
        let resplit = wait_for(Duration::from_millis(FRESH_MS + 3_000), || {
            let got: Vec<Option<u64>> = readers[..2]
                .iter_mut()
                .map(|r| rate_of(r, cluster))
                .collect();
            (got == [Some(200), Some(200)]).then(|| killed.elapsed())
        });
        let took = resplit.unwrap_or_else(|| {
            panic!(
                "{}: no re-split; rates {:?}",
                st.label,
                readers[..2]
                    .iter_mut()
                    .map(|r| r.rates())
                    .collect::<Vec<_>>()
            )
        });
        println!(
            "WEIGHTS {}: 400/s split 100/100/200; host c killed → 200/200 after {:.1} s (freshness {:.1} s)",
            st.label,
            took.as_secs_f64(),
            FRESH_MS as f64 / 1000.0
        );
        assert!(
            took <= Duration::from_millis(FRESH_MS + 1_500),
            "{}: re-split took {took:?}",
            st.label
        );
        // c stays stale in the hosts table.
        let list = ok(&[
            "host",
            "list",
            "--store",
            s,
            "--json",
            "--freshness",
            &fresh,
        ]);
        let c: serde_json::Value = list
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|h| h["host_id"] == "c")
            .unwrap();
        assert_eq!(c["fresh"], false);

        // c comes back: 100/100/200 again; then a weight change re-splits.
        let mut args = extra.to_vec();
        args.extend_from_slice(&["--weight", "2"]);
        procs[2] = AgentProc::start(
            s,
            &dir.path().join("c.shm"),
            "c",
            &dir.path().join("c.log"),
            &args,
        );
        let back = wait_for(Duration::from_secs(10), || {
            let got: Vec<Option<u64>> = readers.iter_mut().map(|r| rate_of(r, cluster)).collect();
            (got == want.map(Some)).then_some(())
        });
        assert!(back.is_some(), "{}: c rejoined", st.label);
        ok(&["host", "set-weight", "--store", s, "b", "2"]);
        let reweighted = wait_for(Duration::from_secs(5), || {
            let got: Vec<Option<u64>> = readers.iter_mut().map(|r| rate_of(r, cluster)).collect();
            (got == [Some(80), Some(160), Some(160)]).then_some(())
        });
        assert!(
            reweighted.is_some(),
            "{}: weights 1,2,2 → 80,160,160",
            st.label
        );
    }
}

/// A dry run that keeps a delay cap queues like the delay, so nginx's 1 ms
/// clock-tick rule counts the cap for it too: a host-scope leaky bucket of
/// 2000/s (0.5 ms) with `max_delay_ms` 1 is accepted by the CLI, whether
/// added as a dry run or switched to one from `delay`, and the agent must
/// publish it with that cap (it used to skip it as below one tick).
#[test]
fn dry_run_keeping_a_delay_cap_is_published_as_accepted() {
    use rate_ctl::core::model::Action;
    for st in stores("dry_run_tick") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        // One made a dry run at once, one a delay first and then switched
        // to dry run (the toggle keeps the cap).
        let [added, toggled]: [u32; 2] = [
            ("rehearse", "api=/a", "dry_run"),
            ("queue", "api=/b", "delay"),
        ]
        .map(|(name, m, action)| {
            let args = [
                "--scope",
                "host",
                "--max-delay-ms",
                "1",
                "--match",
                m,
                "--action",
                action,
            ];
            let id = add_strategy(s, name, "leaky_bucket", "2000", &args);
            let id = id.trim().to_string();
            if action == "delay" {
                ok(&[
                    "strategy", "update", "--store", s, &id, "--action", "dry_run",
                ]);
            }
            id.parse().unwrap()
        });

        let agent = AgentProc::start(
            s,
            &dir.path().join("a.shm"),
            "a",
            &dir.path().join("a.log"),
            &[],
        );
        let mut reader = Reader::open(&agent.shm);
        let want = vec![
            (added, Action::DryRunDelay { max_delay_ms: 1 }),
            (toggled, Action::DryRunDelay { max_delay_ms: 1 }),
        ];
        let got = wait_for(Duration::from_secs(10), || {
            let t = reader.table()?;
            let got: Vec<(u32, Action)> = t
                .strategies()
                .iter()
                .map(|c| (c.strategy.id, c.strategy.action))
                .collect();
            (got == want).then_some(got)
        });
        assert!(
            got.is_some(),
            "{}: published {:?}, want {want:?}; agent log:\n{}",
            st.label,
            reader.table().map(|t| t
                .strategies()
                .iter()
                .map(|c| (c.strategy.id, c.strategy.action))
                .collect::<Vec<_>>()),
            agent.log_text()
        );
        assert!(
            !agent.log_text().contains("clock tick"),
            "{}: {}",
            st.label,
            agent.log_text()
        );
    }
}
