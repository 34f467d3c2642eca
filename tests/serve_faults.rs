//! `rate-ctl serve` under large unauthenticated bodies (issue 11 #11): the
//! token is checked before a body is read, and bodies are bounded per
//! route (64 MiB only for import), so an unauthenticated client cannot
//! make the service hold its body in memory.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use agent::{wait_for, AgentProc};
use cli::sqlite_store;
use serve::Serve;

/// Peak resident memory (VmHWM) of `pid`, KiB.
fn peak_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sends a POST with a body of `len` bytes (streamed, without waiting for
/// the answer in between); returns the status line's code (0 if the server
/// closed before answering).
fn post(addr: &str, path: &str, token: Option<&str>, len: usize) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 1 << 20];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        if s.write_all(&chunk[..n]).is_err() {
            break; // the server answered and closed: fine
        }
        sent += n;
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn unauthenticated_60_mb_bodies_are_refused_without_being_held() {
    let st = sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let pid = s.child.id();
    // Warm up the idle service (one authenticated request of each kind).
    let (code, _) = s.req("GET", "/api/v1/strategies", None);
    assert_eq!(code, 200);
    let idle = peak_kib(pid);
    const MB60: usize = 60 << 20;
    for path in [
        "/api/v1/strategies/import",
        "/api/v1/strategies",
        "/api/v1/blacklist",
    ] {
        let code = post(&s.addr, path, None, MB60);
        assert!(
            code == 401 || code == 0,
            "{path}: unauthenticated → 401 before the body, got {code}"
        );
        let code = post(&s.addr, path, Some("wrong-token"), MB60);
        assert!(
            code == 401 || code == 403 || code == 0,
            "{path}: bad token → {code}"
        );
    }
    // Authenticated: a non-import route refuses a huge body early (413).
    let code = post(&s.addr, "/api/v1/strategies", Some(&s.token), MB60);
    assert_eq!(code, 413, "the strategy route's body bound");
    let grown = peak_kib(pid).saturating_sub(idle);
    assert!(
        grown < 10 * 1024,
        "serve's peak RSS grew by {grown} KiB (idle peak {idle} KiB)"
    );
    // The service still answers.
    let (code, _) = s.req("GET", "/api/v1/strategies", None);
    assert_eq!(code, 200);
}

/// Issue 11 #13: a refused token is a configuration error, not an outage.
#[test]
fn an_agent_whose_token_is_refused_exits_with_a_configuration_error() {
    let st = sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_in(&st.url, dir.path(), &[]);
    for (n, extra) in [vec!["--token", "wrong"], vec![]].into_iter().enumerate() {
        let shm = dir.path().join(format!("rc{n}.shm"));
        let log = dir.path().join(format!("a{n}.log"));
        let mut a = AgentProc::start(&s.url(), &shm, "h", &log, &extra);
        let text = a.exits_with_error(&format!("{extra:?}"));
        assert!(
            text.contains("ERROR")
                && text.contains("refused the agent's credentials")
                && text.contains("HTTP 401"),
            "{extra:?}: says so at error level: {text}"
        );
    }
}

/// Issue 11 #13: a mode that leaves nginx's workers without write access is
/// warned about at start.
#[test]
fn a_mode_workers_cannot_write_is_warned_about() {
    let st = sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let group: &[&str] = &["--group", "0"];
    for (mode, extra, warned) in [
        ("0640", &[][..], true),
        ("0600", &[], true),
        ("0660", group, false),
    ] {
        let shm = dir.path().join(format!("rc{mode}.shm"));
        let log = dir.path().join(format!("a{mode}.log"));
        let mut args = vec!["--mode", mode];
        args.extend_from_slice(extra);
        let a = AgentProc::start(&st.url, &shm, "h", &log, &args);
        let started = wait_for(Duration::from_secs(10), || {
            a.log_text()
                .contains("registered with the store")
                .then_some(())
        });
        assert!(started.is_some(), "{mode}: {}", a.log_text());
        let text = a.log_text();
        assert_eq!(
            text.contains("WARN") && text.contains("nginx workers can write the file only if"),
            warned,
            "{mode}: {text}"
        );
    }
}

/// Issue 28: a mode giving other users any access (world-writable: anyone
/// rewrites the rules; world-readable: anyone reads the key secret) is
/// refused at start, naming `--mode`; the default is not such a mode.
#[test]
fn a_mode_open_to_other_users_is_refused() {
    for mode in ["0666", "0664", "0644", "0606"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rate-ctl"))
            .args(["agent", "--mode", mode, "--shm", "/nonexistent/i28"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mode} accepted");
        assert!(
            err.contains("--mode") && err.contains("other users"),
            "{mode}: {err}"
        );
    }
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_rate-ctl"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: 0660]"), "{help}");
}
