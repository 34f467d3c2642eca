//! The one place the module talks to the core engine.
//!
//! The handler, the variables and the stats endpoint use the module-local
//! types below; this file maps them to `core::engine` / `core::table`. Until
//! the engine is available the backend fails open (no table: every request
//! passes with `$rate_ctl_status = FAIL_OPEN`).

use std::path::PathBuf;

/// The outcome of one request, as the nginx glue acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No usable table: fail open.
    NoTable,
    /// No strategy matched.
    NoMatch,
    /// Every matched strategy admitted the request.
    Pass { id: Option<u32> },
    /// Admitted after waiting this long (leaky bucket as a queue).
    Delay { id: u32, wait_ns: u64 },
    /// Refused; `status` is the strategy's own, `None` = the location's.
    Reject {
        id: u32,
        status: Option<u16>,
        retry_after_ns: u64,
    },
    /// The client address or one of the request's values is blacklisted.
    Blacklisted,
    /// A dry-run strategy (or the location's dry run) would have refused it.
    DryRunRejected { id: u32 },
}

/// The tightest matched strategy's quota, for the RateLimit-* headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub id: u32,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ns: u64,
}

/// What a request holds until it ends (concurrency slots).
pub struct Hold(());

impl Hold {
    /// Gives the held concurrency slots back; called from the request
    /// pool's cleanup, so also for aborted and errored requests.
    pub fn release(self) {}
}

pub struct Decided {
    pub verdict: Verdict,
    pub quota: Option<Quota>,
    pub hold: Option<Hold>,
}

/// Severity of an engine state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeLevel {
    Error,
    Notice,
}

/// One strategy's counters, for the stats endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyStats {
    pub id: u32,
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
}

/// A snapshot for the stats endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub enforcing: bool,
    pub sequence: u64,
    pub active_segment: u64,
    pub config_version: u64,
    pub heartbeat_unix_ms: u64,
    pub strategies: Vec<StrategyStats>,
}

/// Where a request value comes from, resolved once per table version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Ip,
    Api,
    Method,
    Host,
    /// Index into the main conf's `rate_ctl_dimension` list.
    Custom(usize),
    /// Not bound in nginx.conf: strategies that need it never match.
    Unbound,
}

/// One per worker.
pub struct Backend {
    path: PathBuf,
}

impl Backend {
    pub fn new(path: PathBuf) -> Backend {
        Backend { path }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Once per request: picks up a new table; `Some` = log this once.
    #[inline]
    pub fn refresh(&mut self, _now_ns: u64) -> Option<(ChangeLevel, String)> {
        None
    }

    /// `(version, dimension names)` of the current table; `None` = fail open.
    #[inline]
    pub fn dimensions(&self) -> Option<(u64, &[String])> {
        None
    }

    /// Decides one request. `values[i]` belongs to `dimensions()[i]`.
    pub fn decide(
        &self,
        _values: &[Option<&[u8]>],
        _ip: Option<std::net::IpAddr>,
        _now_ns: u64,
        _now_unix_ms: u64,
        _dry_run: bool,
    ) -> Decided {
        Decided {
            verdict: Verdict::NoTable,
            quota: None,
            hold: None,
        }
    }

    pub fn stats(&self) -> Stats {
        Stats::default()
    }
}
