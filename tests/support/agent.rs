//! Running `rate-ctl agent` processes and reading their files the way an
//! nginx worker does (through the core reader).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rate_ctl::core::clock::MonotonicClock;
use rate_ctl::core::shm::reader;
use rate_ctl::core::table::Table;

/// Small file capacities so that tests stay light.
pub const SMALL_CAPS: &[&str] = &[
    "--max-strategies",
    "1024",
    "--segment-bytes",
    "262144",
    "--blacklist-entries",
    "256",
];

/// A running agent; killed (SIGKILL) on drop if still running.
pub struct AgentProc {
    pub child: Child,
    pub log: PathBuf,
    pub shm: PathBuf,
}

impl AgentProc {
    /// Starts `rate-ctl agent` with `extra` arguments after the usual ones.
    pub fn start(store: &str, shm: &Path, host: &str, log: &Path, extra: &[&str]) -> AgentProc {
        AgentProc::start_with_caps(store, shm, host, log, SMALL_CAPS, extra)
    }

    /// [`start`](Self::start) with `caps` instead of [`SMALL_CAPS`] (empty:
    /// the agent's defaults, a full-size file).
    pub fn start_with_caps(
        store: &str,
        shm: &Path,
        host: &str,
        log: &Path,
        caps: &[&str],
        extra: &[&str],
    ) -> AgentProc {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut args: Vec<&str> = vec![
            "agent",
            "--store",
            store,
            "--shm",
            shm.to_str().unwrap(),
            "--host-id",
            host,
            "--log-level",
            "info",
        ];
        args.extend_from_slice(caps);
        args.extend_from_slice(extra);
        let child = crate::cli::command()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(logf)
            .env("NO_COLOR", "1")
            .spawn()
            .expect("spawn agent");
        AgentProc {
            child,
            log: log.to_path_buf(),
            shm: shm.to_path_buf(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill() on the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Sends `sig` and waits up to `timeout` for the exit status.
    pub fn stop_with(&mut self, sig: i32, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal(sig);
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log_text(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Asserts that the agent exits within 10 s with a non-zero code (an
    /// error, not a signal); returns its log. `what` names the case.
    pub fn exits_with_error(&mut self, what: &str) -> String {
        let status = wait_for(Duration::from_secs(10), || self.child.try_wait().unwrap());
        let text = self.log_text();
        let st = status.unwrap_or_else(|| panic!("{what}: agent did not exit\n{text}"));
        assert!(
            st.code().is_some_and(|c| c != 0),
            "{what}: exits with an error, not a signal: {st:?}\n{text}"
        );
        text
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `f` every millisecond until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A worker's view of a file.
pub struct Reader {
    reader: reader::Reader,
}

impl Reader {
    /// Waits until the file exists, then opens it like a worker.
    pub fn open(path: &Path) -> Reader {
        wait_for(Duration::from_secs(20), || path.exists().then_some(()))
            .unwrap_or_else(|| panic!("{} never appeared", path.display()));
        Reader {
            reader: reader::Reader::new(path.to_path_buf()),
        }
    }

    /// The current table (reloading if the sequence moved).
    pub fn table(&mut self) -> Option<Arc<Table>> {
        self.reader.refresh(MonotonicClock::now());
        self.reader.table().cloned()
    }

    /// Waits for a table of at least `config_version`.
    pub fn wait_version(&mut self, config_version: u64, timeout: Duration) -> Option<Arc<Table>> {
        wait_for(timeout, || {
            self.table()
                .filter(|t| t.config_version() >= config_version)
        })
    }

    /// (id, local rate, burst) of every published strategy.
    pub fn rates(&mut self) -> Vec<(u32, u64, u32)> {
        self.table()
            .map(|t| {
                t.strategies()
                    .iter()
                    .map(|c| (c.strategy.id, c.strategy.rate, c.strategy.burst))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Decides one request with `dim = value` against `t` (as a worker does)
/// and releases what it holds; whether it passed.
pub fn decide_one(t: &Table, dim: &str, value: &[u8]) -> bool {
    let mut values: Vec<Option<&[u8]>> = vec![None; t.dimensions().len()];
    if let Some(i) = t.dimension_index(dim) {
        values[i] = Some(value);
    }
    let d = t.decide(&rate_ctl::core::table::Request {
        values: &values,
        ip: None,
        now_ns: MonotonicClock::now(),
        now_unix_ms: rate_ctl::core::clock::unix_ms(),
        dry_run: false,
        quota: true,
    });
    t.release(&d.held);
    d.verdict() == Some(&rate_ctl::core::admit::Verdict::Pass)
}
