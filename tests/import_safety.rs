//! An import cannot wipe the table by accident, and what it deletes can be
//! rebuilt from the audit log: an empty `replace` import is refused without
//! `allow_empty` (API) / `--allow-empty` (CLI); a confirmed one leaves one
//! before-image per deleted strategy, from which the test restores them; an
//! import that changes nothing keeps the version. And a request hyper
//! refuses at the header level (a NUL byte in Content-Type) still gets the
//! JSON error body.
#![cfg(feature = "cli")]

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::{json, Value};
use serve::Serve;

fn strategies(s: &Serve) -> Vec<Value> {
    s.get("/api/v1/strategies")["strategies"]
        .as_array()
        .unwrap()
        .clone()
}

/// What an operator wrote (no versions or times, which move on import).
fn written(list: &[Value]) -> Vec<Value> {
    let mut v: Vec<Value> = list
        .iter()
        .map(|x| {
            let mut x = x.clone();
            for k in ["version", "created_at", "updated_at"] {
                x.as_object_mut().unwrap().remove(k);
            }
            x
        })
        .collect();
    v.sort_by_key(|x| x["id"].as_u64());
    v
}

fn version(s: &Serve) -> u64 {
    s.get("/api/v1/version")["version"].as_u64().unwrap()
}

/// Every audit entry, newest first (pages of 1000).
fn audit(s: &Serve) -> Vec<Value> {
    let mut all = Vec::new();
    let mut before = String::new();
    loop {
        let page = s.get(&format!("/api/v1/audit?limit=1000{before}"))["entries"]
            .as_array()
            .unwrap()
            .clone();
        let Some(last) = page.last() else { break };
        before = format!("&before_id={}", last["id"]);
        all.extend(page);
    }
    all
}

#[test]
fn empty_replace_import_refused_then_restorable_from_the_audit_log() {
    for st in cli::stores("import_safety") {
        let dir = tempfile::tempdir().unwrap();
        let s = Serve::start_in(&st.url, dir.path(), &[]);
        let table: Vec<Value> = (0..1500)
            .map(|i| {
                json!({"name": format!("s{i}"), "match": {"api": format!("/a/{i}")},
                            "algorithm": "token_bucket", "rate": 5 + i % 500, "burst": 2 + i % 7})
            })
            .collect();
        let (code, v) = s.req(
            "POST",
            "/api/v1/strategies/import",
            Some(&Value::from(table).to_string()),
        );
        assert_eq!(code, 200, "{}: {v}", st.label);
        let original = written(&strategies(&s));
        assert_eq!(original.len(), 1500);

        // An empty import changes nothing, not even the version.
        let v0 = version(&s);
        let (code, v) = s.req("POST", "/api/v1/strategies/import", Some("[]"));
        assert_eq!((code, v["version"].as_u64()), (200, Some(v0)), "{v}");
        // An empty replace is refused without the flag (API and CLI).
        let (code, v) = s.req("POST", "/api/v1/strategies/import?replace=true", Some("[]"));
        assert_eq!(code, 422, "{}: {v}", st.label);
        assert_eq!(v["error"]["field"], "allow_empty", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("1500"),
            "{v}"
        );
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let o = cli::rate_ctl(&[
            "strategy",
            "import",
            "--store",
            &st.url,
            "--replace",
            empty.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("--allow-empty"),
            "{err}"
        );
        assert_eq!(version(&s), v0, "{}: nothing written", st.label);
        assert_eq!(strategies(&s).len(), 1500);

        // Confirmed: everything goes, one audit entry per strategy.
        let (code, v) = s.req(
            "POST",
            "/api/v1/strategies/import?replace=true&allow_empty=true",
            Some("[]"),
        );
        assert_eq!(code, 200, "{v}");
        assert!(strategies(&s).is_empty());
        let log = audit(&s);
        let summary = log
            .iter()
            .find(|e| e["action"] == "strategy.import")
            .unwrap();
        assert_eq!(summary["after"]["deleted"], 1500, "{summary}");
        // Who: the token's name and role, and the client's address.
        assert_eq!(
            (&summary["token"], &summary["role"]),
            (&json!("admin"), &json!("admin")),
            "{summary}"
        );
        assert!(
            summary["client"]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.1:"),
            "{summary}"
        );
        let images: Vec<Value> = log
            .iter()
            .filter(|e| e["action"] == "strategy.import.delete")
            .map(|e| e["before"].clone())
            .collect();
        assert_eq!(images.len(), 1500);

        // Restored from the audit log alone: the same strategies, ids kept.
        let (code, v) = s.req(
            "POST",
            "/api/v1/strategies/import",
            Some(&Value::from(images).to_string()),
        );
        assert_eq!(code, 200, "{}: restore: {v}", st.label);
        assert_eq!(written(&strategies(&s)), original, "{}", st.label);
        eprintln!(
            "import_safety {}: 1500 deleted and restored from the audit log",
            st.label
        );
    }
}

#[test]
fn header_level_errors_carry_the_json_body() {
    let st = cli::sqlite_store();
    let s = Serve::start_temp(&st.url, &[]);
    for raw in [
        &b"POST /api/v1/strategies HTTP/1.1\r\nHost: x\r\nContent-Type: application/\x00json\r\nContent-Length: 2\r\n\r\n{}"[..],
        &b"GET /api/v1/strategies HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n"[..],
    ] {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(raw).unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        let (status, head, body) = serve::parse_answer(&answer);
        assert_eq!(status, 400, "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {head}"));
        assert!(
            v["error"]["message"].as_str().unwrap().contains("malformed"),
            "{v}"
        );
    }
    // The server goes on answering.
    assert_eq!(s.req("GET", "/api/v1/strategies", None).0, 200);
}
