//! Propagation: 100 changes made through the CLI, each visible in the
//! shared-memory file (as a worker reads it): p99 ≤ 100 ms against SQLite,
//! MariaDB and PostgreSQL (agent poll 50 ms), and through `rate-ctl serve`
//! (the agent long-polls it, changes made with `--api`). Prints p50/p99.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use agent::{AgentProc, Reader};
use cli::{add_strategy, ok, quantile, stores};
use serde_json::Value;

/// The first row of `host list --json`.
fn first_host(store: &str) -> Value {
    let out = ok(&["host", "list", "--store", store, "--json"]);
    serde_json::from_str(out.lines().next().unwrap()).unwrap()
}

#[test]
fn hundred_cli_changes_each_visible_within_100ms() {
    for st in stores("propagation") {
        let s = st.url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let shm = dir.path().join("rate_ctl.shm");
        let id = add_strategy(
            s,
            "p",
            "token_bucket",
            "1000",
            &["--match", "api=/p", "--burst", "5", "--scope", "host"],
        );
        let id: u32 = id.trim().parse().unwrap();
        let mut a = AgentProc::start(s, &shm, "prop-host", &dir.path().join("agent.log"), &[]);
        let mut r = Reader::open(&shm);
        r.wait_version(1, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{}: first publish; log:\n{}", st.label, a.log_text()));

        let lat_ms = hundred_changes(&mut r, id, st.label, &a, |update| {
            let mut args = update.to_vec();
            args.extend_from_slice(&["--store", s]);
            ok(&args)
        });
        let (p50, p99, max) = (quantile(&lat_ms, 0.5), quantile(&lat_ms, 0.99), lat_ms[99]);
        println!(
            "PROPAGATION {}: 100 CLI changes, commit → visible in the file: p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms (poll 50 ms)",
            st.label
        );
        assert!(p99 <= 100.0, "{}: p99 {p99:.0} ms > 100 ms", st.label);
        assert!(a.alive());

        // The hosts table records what was applied.
        let hosts = first_host(s);
        assert_eq!(hosts["host_id"], "prop-host");
        assert_eq!(hosts["fresh"], true);
        let st_v = cli::version(s) as u64;
        let applied = agent::wait_for(Duration::from_secs(3), || {
            let h = first_host(s);
            (h["applied_version"].as_u64() == Some(st_v)).then_some(h)
        });
        assert!(applied.is_some(), "{}: applied version recorded", st.label);
        // And the heartbeat goes into the file header.
        let map = rate_ctl::core::shm::Mapping::open(&shm).unwrap();
        let age = rate_ctl::core::clock::unix_ms().saturating_sub(map.heartbeat_unix_ms());
        assert!(age < 2_000, "{}: file heartbeat {age} ms old", st.label);
        let status = a.stop_with(libc::SIGTERM, Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "{}: SIGTERM → exit 0",
            st.label
        );
    }
}

/// The same through `rate-ctl serve` on SQLite: the agent long-polls the
/// snapshot, the changes go through the API (`rate-ctl --api`).
#[test]
fn hundred_api_changes_through_serve_each_visible_within_100ms() {
    let st = cli::sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let srv = serve::Serve::start_in(&st.url, dir.path(), &[]);
    let api = srv.url();
    let with_api = |args: &[&str]| {
        let mut a = vec!["--api", api.as_str(), "--token", srv.token.as_str()];
        a.extend_from_slice(args);
        ok(&a)
    };
    let id: u32 = with_api(&[
        "strategy",
        "add",
        "--name",
        "p",
        "--algorithm",
        "token_bucket",
        "--rate",
        "1000",
        "--match",
        "api=/p",
        "--burst",
        "5",
        "--scope",
        "host",
    ])
    .trim()
    .parse()
    .unwrap();
    let shm = dir.path().join("rate_ctl.shm");
    let a = AgentProc::start(
        &api,
        &shm,
        "prop-host",
        &dir.path().join("agent.log"),
        &["--token", &srv.token],
    );
    let mut r = Reader::open(&shm);
    r.wait_version(1, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("first publish; log:\n{}", a.log_text()));
    let lat_ms = hundred_changes(&mut r, id, "serve", &a, with_api);
    let (p50, p99, max) = (quantile(&lat_ms, 0.5), quantile(&lat_ms, 0.99), lat_ms[99]);
    println!(
        "PROPAGATION serve (sqlite): 100 API changes, commit → visible in the file: p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms"
    );
    assert!(p99 <= 100.0, "through serve: p99 {p99:.0} ms > 100 ms");
}

/// 100 changes of strategy `id`'s rate (2000, 2001, …) made by `change`
/// (given `strategy update ID --rate R --json`, it runs the CLI and returns
/// its answer; the change is committed when it returns) at random points
/// of the agent's poll cycle; each one's time from commit until the file
/// carries it, sorted (ms).
fn hundred_changes(
    r: &mut Reader,
    id: u32,
    label: &str,
    a: &AgentProc,
    mut change: impl FnMut(&[&str]) -> String,
) -> Vec<f64> {
    let mut lat_ms = Vec::with_capacity(100);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for i in 0..100u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(rng % 100));
        let rate = 2000 + i;
        let (id_s, rate_s) = (id.to_string(), rate.to_string());
        let out = change(&["strategy", "update", &id_s, "--rate", &rate_s, "--json"]);
        let committed = Instant::now();
        let v = serde_json::from_str::<Value>(&out).unwrap()["version"]
            .as_u64()
            .unwrap();
        let t = r
            .wait_version(v, Duration::from_secs(5))
            .unwrap_or_else(|| {
                panic!(
                    "{label}: version {v} never reached the file; log:\n{}",
                    a.log_text()
                )
            });
        lat_ms.push(committed.elapsed().as_secs_f64() * 1000.0);
        let got = t.strategies().iter().find(|c| c.strategy.id == id).unwrap();
        assert_eq!(
            got.strategy.rate, rate,
            "{label}: the file carries the new rate"
        );
    }
    lat_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lat_ms
}
