//! `rate-ctl serve` processes and a tiny blocking HTTP client for the
//! serve tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `rate-ctl serve`; SIGTERM then SIGKILL on drop (by PID).
pub struct Serve {
    pub child: Child,
    pub addr: String,
    pub token: String,
    pub log: PathBuf,
    /// The directory of [`start_temp`](Self::start_temp), removed after
    /// the process is stopped.
    dir: Option<tempfile::TempDir>,
}

impl Serve {
    /// [`start`](Self::start) with the admin token and the log in `dir`
    /// (`admin.token`, `serve.log`): one instance per directory.
    pub fn start_in(store: &str, dir: &Path, extra: &[&str]) -> Serve {
        Serve::start(
            store,
            &dir.join("admin.token"),
            &dir.join("serve.log"),
            extra,
        )
    }

    /// [`start_in`](Self::start_in) a new temporary directory, kept as long
    /// as the instance.
    pub fn start_temp(store: &str, extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Serve::start_in(store, dir.path(), extra);
        s.dir = Some(dir);
        s
    }

    /// [`start_in`](Self::start_in) with a token file per name in `roles`
    /// (`read`, `agent`): `DIR/ROLE.token` holding `ROLE-secret`, passed as
    /// `--ROLE-token-file`.
    pub fn start_with_tokens(store: &str, dir: &Path, roles: &[&str]) -> Serve {
        let mut args = Vec::new();
        for role in roles {
            let file = dir.join(format!("{role}.token"));
            std::fs::write(&file, format!("{role}-secret\n")).unwrap();
            args.push(format!("--{role}-token-file"));
            args.push(file.to_str().unwrap().to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Serve::start_in(store, dir, &args)
    }

    /// Starts an instance on a free loopback port with the admin token in
    /// `token_file` (created by the first instance), plus `extra` arguments.
    pub fn start(store: &str, token_file: &Path, log: &Path, extra: &[&str]) -> Serve {
        Serve::start_listening(store, token_file, log, "127.0.0.1:0", extra)
    }

    /// A new instance on this one's address, token and log (appended),
    /// after this one was killed: clients keep their URL.
    pub fn restart(&self, store: &str, extra: &[&str]) -> Serve {
        let token_file = self.log.with_file_name("admin.token");
        Serve::start_listening(store, &token_file, &self.log, &self.addr, extra)
    }

    fn start_listening(
        store: &str,
        token_file: &Path,
        log: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Serve {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_rate-ctl"))
            .args([
                "serve",
                "--store",
                store,
                "--listen",
                listen,
                "--admin-token-file",
                token_file.to_str().unwrap(),
            ])
            .args(extra)
            .env_remove("RATE_CTL_ADMIN_TOKEN")
            .env_remove("RATE_CTL_READ_TOKEN")
            .env_remove("RATE_CTL_AGENT_TOKEN")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(logf)
            .spawn()
            .expect("spawn rate-ctl serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addr = None;
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            // `https://` with --tls-cert/--tls-key.
            let listening = line.trim().strip_prefix("listening on ");
            if let Some(a) = listening.and_then(|l| l.split_once("://")).map(|(_, a)| a) {
                addr = Some(a.to_string());
                break;
            }
            line.clear();
        }
        let addr = addr.unwrap_or_else(|| {
            panic!(
                "serve did not start; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
        let token = std::fs::read_to_string(token_file)
            .unwrap()
            .trim()
            .to_string();
        Serve {
            child,
            addr,
            token,
            log: log.to_path_buf(),
            dir: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn req(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        http(&self.addr, method, path, Some(&self.token), body)
    }

    /// `PUT /api/v1/strategies/{id}` with `body`.
    pub fn put_strategy(&self, id: impl std::fmt::Display, body: &Value) -> (u16, Value) {
        let path = format!("/api/v1/strategies/{id}");
        self.req("PUT", &path, Some(&body.to_string()))
    }

    /// `POST /api/v1/strategies` with `body`: created (201); the answer.
    pub fn post_strategy(&self, body: &Value) -> Value {
        let (code, v) = self.req("POST", "/api/v1/strategies", Some(&body.to_string()));
        assert_eq!(code, 201, "{v}");
        v
    }

    /// `POST /api/v1/strategies` of a valid token bucket with the fields of
    /// `bad` laid over it: refused with 422 naming `field`.
    pub fn strategy_refused(&self, bad: &Value, field: &str) {
        let mut b = serde_json::json!({"name": "bad", "algorithm": "token_bucket", "rate": 5});
        for (k, v) in bad.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (code, v) = self.req("POST", "/api/v1/strategies", Some(&b.to_string()));
        assert_eq!(code, 422, "{b}: {v}");
        assert_eq!(v["error"]["field"], field, "{b}: {v}");
    }

    pub fn get(&self, path: &str) -> Value {
        let (s, v) = self.req("GET", path, None);
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // Killed and reaped already (a test's outage): its pid may be reused.
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: kill() on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request (Connection: close); status and JSON body (Null if empty).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let (s, raw) = http_raw(addr, method, path, token, body);
    let v = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: not JSON ({e}): {}",
                String::from_utf8_lossy(&raw)
            )
        })
    };
    (s, v)
}

/// The element of the JSON array `list` whose `key` is `want`.
pub fn find(list: &Value, key: &str, want: &str) -> Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x[key] == want)
        .unwrap_or_else(|| panic!("no {key} {want:?} in {list}"))
        .clone()
}

/// An HTTP answer's status, head (status line and headers) and body.
pub fn parse_answer(raw: &[u8]) -> (u16, String, &[u8]) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete HTTP answer");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, &raw[split + 4..])
}

pub fn http_raw(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, head, rest) = parse_answer(&raw);
    let mut rest = rest.to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        rest = dechunk(&rest);
    }
    (status, rest)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + n]);
        b = &b[nl + 2 + n + 2..];
    }
}
