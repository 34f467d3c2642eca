//! Secrets off the command line: `--store` falls back to env
//! `RATE_CTL_STORE` (the Debian units pass it so), for the agent and the
//! config commands; `--api` (or RATE_CTL_API) wins over the environment.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::process::Stdio;
use std::time::Duration;

use agent::Reader;

#[test]
fn rate_ctl_store_from_the_environment() {
    let st = cli::sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let env = [("RATE_CTL_STORE", st.url.as_str())];
    // A config command without --store writes to the store of the env...
    let o = cli::rate_ctl_env(
        &[
            "strategy",
            "add",
            "--name",
            "from-env",
            "--algorithm",
            "token_bucket",
            "--rate",
            "5",
            "--match",
            "api=/env",
        ],
        &env,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = cli::ok(&["strategy", "list", "--store", &st.url, "--json"]);
    assert!(listed.contains("from-env"), "{listed}");

    // ... and so does the agent: `RATE_CTL_STORE=… rate-ctl agent --shm …`.
    let shm = dir.path().join("env.shm");
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let mut args = vec![
        "agent",
        "--shm",
        shm.to_str().unwrap(),
        "--host-id",
        "env-host",
    ];
    args.extend_from_slice(agent::SMALL_CAPS);
    let mut child = cli::command()
        .args(&args)
        .env("RATE_CTL_STORE", &st.url)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut r = Reader::open(&shm);
    let t = r.wait_version(1, Duration::from_secs(20));
    let text = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let t = t.unwrap_or_else(|| panic!("the agent never published; log:\n{text}"));
    assert_eq!(t.strategies().len(), 1, "the strategy of the env's store");
    let hosts = cli::ok(&["host", "list", "--store", &st.url, "--json"]);
    assert!(
        hosts.contains("env-host"),
        "the agent reported to that store: {hosts}"
    );

    // --api wins over the environment (no "cannot be used together").
    let o = cli::rate_ctl_env(
        &[
            "strategy",
            "list",
            "--api",
            "http://127.0.0.1:9",
            "--token",
            "t",
        ],
        &env,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(!err.contains("together"), "{err}");
}
