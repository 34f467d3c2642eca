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
use cli::{ok, stores};

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
        let cluster: u32 = ok(&[
            "strategy",
            "add",
            "--store",
            s,
            "--name",
            "fleet",
            "--match",
            "api=/pay",
            "--algorithm",
            "token_bucket",
            "--rate",
            "400",
            "--burst",
            "40",
        ])
        .trim()
        .parse()
        .unwrap();
        let per_host: u32 = ok(&[
            "strategy",
            "add",
            "--store",
            s,
            "--name",
            "each",
            "--match",
            "api=/login",
            "--algorithm",
            "fixed_window",
            "--rate",
            "400",
            "--scope",
            "host",
        ])
        .trim()
        .parse()
        .unwrap();
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
