//! Strict API input through a real `rate-ctl serve` (SQLite): control
//! characters, duplicate JSON keys, the Content-Type, an over-long body
//! answered in JSON, and DELETE with the version the client saw. Each case
//! checks the status, the error body and that nothing was written.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use serve::Serve;

/// One request with the given Content-Type (None: no header); status and
/// body as JSON. The body is written from another thread, so that an answer
/// sent before the body is read completely is still read.
fn send(s: &Serve, method: &str, path: &str, ctype: Option<&str>, body: Vec<u8>) -> (u16, Value) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n",
        s.addr,
        s.token,
        body.len()
    );
    if let Some(t) = ctype {
        head.push_str(&format!("Content-Type: {t}\r\n"));
    }
    head.push_str("\r\n");
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(head.as_bytes());
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let _ = writer.join();
    let (status, head, rest) = serve::parse_answer(&raw);
    let v = if rest.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(rest).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: answer not JSON ({e}): {head}\n{}",
                String::from_utf8_lossy(rest)
            )
        })
    };
    (status, v)
}

fn json_body(v: &str) -> Vec<u8> {
    v.as_bytes().to_vec()
}

fn count(s: &Serve) -> usize {
    s.get("/api/v1/strategies")["strategies"]
        .as_array()
        .map_or(0, Vec::len)
}

fn error_of(v: &Value) -> (Option<&str>, &str) {
    (
        v["error"]["field"].as_str(),
        v["error"]["message"].as_str().unwrap_or(""),
    )
}

#[test]
fn strict_input() {
    let store = cli::stores("serve_input").remove(0);
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_in(&store.url, dir.path(), &[]);
    let good = r#"{"name":"a","match":{"api":"/a"},"algorithm":"token_bucket","rate":5}"#;
    let j = Some("application/json");

    // Control characters in a condition value, a name, a blacklist value.
    for (body, field) in [
        (
            r#"{"name":"c","match":{"api":"/a\nb"},"algorithm":"token_bucket","rate":5}"#,
            "match.api",
        ),
        (
            r#"{"name":"c","match":{"api":"/a\u0000"},"algorithm":"token_bucket","rate":5}"#,
            "match.api",
        ),
        (
            r#"{"name":"c\nd","match":{"api":"/a"},"algorithm":"token_bucket","rate":5}"#,
            "name",
        ),
    ] {
        let (st, v) = send(&s, "POST", "/api/v1/strategies", j, json_body(body));
        assert_eq!(st, 422, "{body}: {v}");
        let (f, m) = error_of(&v);
        assert_eq!(f, Some(field), "{v}");
        assert!(m.contains("control characters"), "{v}");
    }
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/blacklist",
        j,
        json_body(r#"{"dimension":"userid","value":"u1\nforged"}"#),
    );
    assert_eq!((st, error_of(&v).0), (422, Some("value")), "{v}");
    assert_eq!(count(&s), 0, "nothing written");

    // Duplicate keys: top level, inside match, in an import line.
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/strategies",
        j,
        json_body(
            r#"{"name":"a","match":{"api":"/a"},"algorithm":"token_bucket","rate":5,"rate":5000}"#,
        ),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(error_of(&v), (Some("rate"), "rate: the key appears twice"));
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/strategies",
        j,
        json_body(
            r#"{"name":"a","match":{"ip":"10.0.0.1","ip":"10.0.0.2"},"algorithm":"token_bucket","rate":5}"#,
        ),
    );
    assert_eq!((st, error_of(&v).0), (400, Some("match.ip")), "{v}");
    let lines = format!(
        "{good}\n{}\n",
        r#"{"name":"b","match":{"api":"/b","api":"/c"},"algorithm":"token_bucket","rate":5}"#
    );
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/strategies/import",
        Some("application/x-ndjson"),
        json_body(&lines),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["line"], json!(2), "{v}");
    assert_eq!(error_of(&v).0, Some("match.api"), "{v}");
    let arr = format!(
        "[{good},{}]",
        r#"{"name":"b","name":"c","algorithm":"token_bucket","rate":5}"#
    );
    let (st, v) = send(&s, "POST", "/api/v1/strategies/import", j, json_body(&arr));
    assert_eq!(
        (st, v["error"]["line"].clone(), error_of(&v).0),
        (400, json!(2), Some("name")),
        "{v}"
    );
    assert_eq!(count(&s), 0, "nothing written");

    // Content-Type: JSON required (JSON lines too for import), 415 otherwise.
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let (st, v) = send(&s, "POST", "/api/v1/strategies", ct, json_body(good));
        assert_eq!(st, 415, "{ct:?}: {v}");
        assert_eq!(error_of(&v).0, Some("Content-Type"), "{v}");
        assert!(error_of(&v).1.contains("application/json"), "{v}");
    }
    let (st, v) = send(
        &s,
        "PATCH",
        "/api/v1/strategies/1",
        Some("text/plain"),
        json_body(r#"{"enabled":false}"#),
    );
    assert_eq!(st, 415, "{v}");
    assert_eq!(count(&s), 0, "nothing written");
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/strategies/import",
        Some("application/x-ndjson; charset=utf-8"),
        json_body(&format!("{good}\n")),
    );
    assert_eq!(st, 200, "JSON lines import: {v}");
    let (st, v) = send(
        &s,
        "POST",
        "/api/v1/strategies",
        Some("application/json; charset=utf-8"),
        json_body(&good.replace("\"a\"", "\"a2\"")),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(count(&s), 2);

    // 413 as the API's JSON error.
    let big = format!(r#"{{"name":"{}"}}"#, "x".repeat(3 << 20));
    let (st, v) = send(&s, "POST", "/api/v1/strategies", j, big.into_bytes());
    assert_eq!(st, 413, "{v}");
    assert!(error_of(&v).1.contains("limit"), "{v}");

    // An error axum words itself (a path it cannot decode) is JSON too.
    let (st, v) = send(&s, "GET", "/api/v1/strategies/%FF", None, vec![]);
    assert_eq!(st, 400, "{v}");
    assert!(error_of(&v).1.contains("Invalid UTF-8"), "{v}");

    // DELETE with the version seen: 409 when someone changed it since.
    let listed = s.get("/api/v1/strategies");
    let a = serve::find(&listed["strategies"], "name", "a");
    let (id, seen) = (a["id"].as_u64().unwrap(), a["version"].as_u64().unwrap());
    let (st, v) = send(
        &s,
        "PATCH",
        &format!("/api/v1/strategies/{id}"),
        j,
        json_body(&json!({"enabled": false, "version": seen}).to_string()),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = send(
        &s,
        "DELETE",
        &format!("/api/v1/strategies/{id}?version={seen}"),
        None,
        vec![],
    );
    assert_eq!(st, 409, "stale delete: {v}");
    assert_eq!(error_of(&v).0, Some("version"), "{v}");
    assert_eq!(count(&s), 2, "nothing deleted");
    let now = s.get(&format!("/api/v1/strategies/{id}"))["version"]
        .as_u64()
        .unwrap();
    let (st, _) = send(
        &s,
        "DELETE",
        &format!("/api/v1/strategies/{id}?version={now}"),
        None,
        vec![],
    );
    assert_eq!(st, 204);
    assert_eq!(count(&s), 1);
}
