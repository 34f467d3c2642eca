//! `rate-ctl serve` against hostile or merely many clients, through a real
//! process over SQLite: 1,000 half-sent requests neither starve the others
//! nor stay open; past `--max-connections` a connection gets a JSON 503;
//! the unauthenticated health check tells nothing but ok; every answer
//! carries the page's security headers; 100 long-polls on a 10,000-strategy
//! table share one snapshot build.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve::Serve;

/// Raises this process's descriptor limit (its children inherit it):
/// 1,000 held connections need more than the usual soft 1,024 on both ends.
fn raise_nofile(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    if r.rlim_cur < want {
        assert!(
            r.rlim_max >= want,
            "the hard descriptor limit {} is below the {want} this test needs",
            r.rlim_max
        );
        r.rlim_cur = want;
        // SAFETY: setrlimit reads the rlimit we own.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    }
}

/// A request whose head never ends (no blank line).
fn half_sent(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /api/v1/strategies HTTP/1.1\r\nHost: x\r\nX-Slow: 1")
        .unwrap();
    c.set_nonblocking(true).unwrap();
    c
}

/// Whether the server closed `c` (EOF, reset, or an answer then EOF).
fn closed(c: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

#[test]
fn thousand_half_sent_requests_neither_starve_nor_stay() {
    raise_nofile(4096);
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let opened = Instant::now();
    let mut held: Vec<TcpStream> = (0..1000).map(|_| half_sent(&s.addr)).collect();
    eprintln!("1000 half-sent requests opened in {:?}", opened.elapsed());

    let ((code, v), t) = timed(|| s.req("GET", "/api/v1/strategies", None));
    eprintln!("authenticated GET: {code} in {t:?}");
    assert_eq!(code, 200, "{v}");
    assert!(t < Duration::from_secs(2), "authenticated GET took {t:?}");
    let ((code, v), t) = timed(|| serve::http(&s.addr, "GET", "/api/v1/health", None, None));
    eprintln!("health: {code} {v} in {t:?}");
    assert_eq!((code, &v), (200, &json!({"ok": true})));
    assert!(t < Duration::from_secs(2), "health took {t:?}");

    let mut closed_at = vec![None; held.len()];
    while opened.elapsed() < Duration::from_secs(20) {
        for (i, c) in held.iter_mut().enumerate() {
            if closed_at[i].is_none() && closed(c) {
                closed_at[i] = Some(opened.elapsed());
            }
        }
        if closed_at.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut times: Vec<Duration> = closed_at.iter().flatten().copied().collect();
    times.sort();
    eprintln!(
        "closed by the server within 20 s: {} of 1000 (first {:?}, last {:?})",
        times.len(),
        times.first(),
        times.last()
    );
    assert!(times.len() >= 900, "only {} of 1000 closed", times.len());
    // Closed by the header-read timeout, not at once.
    assert!(
        times[0] >= Duration::from_secs(5),
        "closed too early: {times:?}"
    );
    // Still serving, and /metrics shows no connection left over.
    let (code, _) = s.req("GET", "/api/v1/strategies", None);
    assert_eq!(code, 200);
    drop(held);
}

#[test]
fn past_the_connection_cap_a_json_503() {
    let st = cli::sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_in(&st.url, dir.path(), &["--max-connections", "20"]);
    let held: Vec<TcpStream> = (0..20).map(|_| half_sent(&s.addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let (code, raw) = serve::http_raw(&s.addr, "GET", "/api/v1/health", None, None);
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(code, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many connections"),
        "{v}"
    );
    drop(held);
    // The slots come back once the held connections are gone.
    let ok = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        s.req("GET", "/api/v1/strategies", None).0 == 200
    });
    assert!(ok, "no slot came back after the held connections closed");
    let m = metrics(&s);
    assert!(
        m.contains("rate_ctl_serve_connections_refused_total 1\n"),
        "{m}"
    );
}

fn metrics(s: &Serve) -> String {
    let (code, raw) = serve::http_raw(&s.addr, "GET", "/metrics", Some(&s.token), None);
    assert_eq!(code, 200);
    String::from_utf8(raw).unwrap()
}

fn builds(s: &Serve) -> u64 {
    metrics(s)
        .lines()
        .find_map(|l| l.strip_prefix("rate_ctl_serve_snapshot_builds_total "))
        .expect("rate_ctl_serve_snapshot_builds_total in /metrics")
        .parse()
        .unwrap()
}

#[test]
fn health_and_security_headers() {
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let (code, v) = serve::http(&s.addr, "GET", "/api/v1/health", None, None);
    assert_eq!(
        (code, v),
        (200, json!({"ok": true})),
        "nothing more unauthenticated"
    );
    let (code, v) = serve::http(&s.addr, "GET", "/api/v1/health", Some("wrong"), None);
    assert_eq!((code, v), (200, json!({"ok": true})));
    let (code, v) = s.req("GET", "/api/v1/health", None);
    assert_eq!(code, 200);
    assert!(v["version"].is_u64(), "with the token, the version: {v}");

    for path in ["/", "/app.js", "/api/v1/strategies"] {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        let (_, head, _) = serve::parse_answer(&raw);
        let head = head.to_ascii_lowercase();
        for want in [
            "content-security-policy: default-src 'self';",
            "frame-ancestors 'none'",
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
            "referrer-policy: no-referrer",
        ] {
            assert!(head.contains(want), "{path}: no {want:?} in\n{head}");
        }
    }
}

#[test]
fn hundred_long_polls_share_one_snapshot_build() {
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    let table: Vec<Value> = (0..10_000)
        .map(|i| json!({"name": format!("s{i}"), "match": {"api": format!("/a/{i}")}, "algorithm": "token_bucket", "rate": 5}))
        .collect();
    let (code, v) = s.req(
        "POST",
        "/api/v1/strategies/import",
        Some(&Value::from(table).to_string()),
    );
    assert_eq!(code, 200, "{v}");
    let version = v["version"].as_u64().unwrap();
    let before = builds(&s);
    let polls: Vec<_> = (0..100)
        .map(|_| {
            let addr = s.addr.clone();
            let token = s.token.clone();
            std::thread::spawn(move || {
                let path = format!("/api/v1/snapshot?after={version}");
                serve::http_raw(&addr, "GET", &path, Some(&token), None)
            })
        })
        .collect();
    // Let every long-poll reach its wait.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(builds(&s), before, "no build while the version stands");
    let (code, v) = s.req(
        "POST",
        "/api/v1/strategies",
        Some(&json!({"name": "one-more", "match": {"api": "/more"}, "algorithm": "token_bucket", "rate": 5}).to_string()),
    );
    assert!(code == 200 || code == 201, "{code} {v}");
    let t = Instant::now();
    let answers: Vec<(u16, Vec<u8>)> = polls.into_iter().map(|p| p.join().unwrap()).collect();
    eprintln!("100 long-polls answered in {:?}", t.elapsed());
    // All alike (no host has reported: the hosts part is the same too).
    let (code, first) = &answers[0];
    assert_eq!(*code, 200);
    let v: Value = serde_json::from_slice(first).unwrap();
    assert_eq!(v["version"].as_u64(), Some(version + 1));
    assert_eq!(v["changed"], json!(true));
    assert_eq!(v["strategies"].as_array().unwrap().len(), 10_001);
    for (code, raw) in &answers {
        assert_eq!((*code, raw.len()), (200, first.len()));
        assert!(
            raw == first,
            "long-polls of one version answered differently"
        );
    }
    let after = builds(&s);
    eprintln!(
        "snapshot builds {before} -> {after}; {} bytes each",
        first.len()
    );
    assert_eq!(after - before, 1, "one build for the new version");
}
