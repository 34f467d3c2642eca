//! The one place the module talks to the core engine.
//!
//! The handler, the variables and the stats endpoint use the module-local
//! types below; this file maps them to `core::engine` / `core::table`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::core::admit::Verdict as CoreVerdict;
use crate::core::engine::{Engine, LogLevel};
use crate::core::slot::Slot;
use crate::core::table::{Outcome, Request, Table, TableDecision};

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

/// What a request holds until it ends (concurrency slots): the table that
/// decided (slots are released against the same strategies even if a new
/// table was loaded meanwhile) and the decision.
pub struct Hold(Arc<Table>, TableDecision);

impl Hold {
    /// Gives the held concurrency slots back; called from the request
    /// pool's cleanup, so also for aborted and errored requests.
    pub fn release(self) {
        self.0.release(&self.1);
    }
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
    engine: Engine,
}

impl Backend {
    pub fn new(path: PathBuf) -> Backend {
        Backend {
            engine: Engine::new(path),
        }
    }

    /// Once per request: picks up a new table; `Some` = log this once.
    #[inline]
    pub fn refresh(&mut self, now_ns: u64) -> Option<(ChangeLevel, String)> {
        self.engine.refresh(now_ns).map(|c| {
            let level = match c.level {
                LogLevel::Error => ChangeLevel::Error,
                LogLevel::Notice => ChangeLevel::Notice,
            };
            (level, c.message)
        })
    }

    /// `(version, dimension names)` of the current table; `None` = fail open.
    #[inline]
    pub fn dimensions(&self) -> Option<(u64, &[String])> {
        self.engine.table().map(|t| (t.version(), t.dimensions()))
    }

    /// Decides one request. `values[i]` belongs to `dimensions()[i]`.
    pub fn decide(
        &self,
        values: &[Option<&[u8]>],
        ip: Option<IpAddr>,
        now_ns: u64,
        now_unix_ms: u64,
        dry_run: bool,
    ) -> Decided {
        let Some(table) = self.engine.table() else {
            return Decided {
                verdict: Verdict::NoTable,
                quota: None,
                hold: None,
            };
        };
        let d = table.decide(&Request {
            values,
            ip,
            now_ns,
            now_unix_ms,
            dry_run,
        });
        let (verdict, quota) = match &d.outcome {
            Outcome::NoMatch => (Verdict::NoMatch, None),
            Outcome::Blacklisted { .. } => (Verdict::Blacklisted, None),
            Outcome::Limited(dec) => {
                let quota = dec.tightest.map(|(id, q)| Quota {
                    id,
                    limit: q.limit,
                    remaining: q.remaining,
                    reset_ns: q.reset_ns,
                });
                let v = match dec.verdict {
                    CoreVerdict::Pass => match dec.dry_run_rejected {
                        Some(id) => Verdict::DryRunRejected { id },
                        None => Verdict::Pass {
                            id: dec.tightest.map(|(id, _)| id),
                        },
                    },
                    CoreVerdict::Delay { id, wait_ns } => Verdict::Delay { id, wait_ns },
                    CoreVerdict::Reject {
                        id,
                        status,
                        retry_after_ns,
                    } => Verdict::Reject {
                        id,
                        status,
                        retry_after_ns,
                    },
                };
                (v, quota)
            }
        };
        let hold = (!d.held.is_empty()).then(|| Hold(table.clone(), d));
        Decided {
            verdict,
            quota,
            hold,
        }
    }

    pub fn stats(&self) -> Stats {
        let Some(map) = self.engine.mapping() else {
            return Stats::default();
        };
        let sequence = map.seq();
        let mut s = Stats {
            enforcing: self.engine.table().is_some(),
            sequence,
            active_segment: sequence & 1,
            config_version: 0,
            heartbeat_unix_ms: map.heartbeat_unix_ms(),
            strategies: Vec::new(),
        };
        if let Some(t) = self.engine.table() {
            s.config_version = t.config_version();
            let slots = map.slots();
            s.strategies = t
                .strategies()
                .iter()
                .filter_map(|c| {
                    let slot = Slot::at(&slots, c.slot)?;
                    // A slot reassigned since this table was built is not ours.
                    if slot.generation.load(std::sync::atomic::Ordering::Relaxed) != c.generation {
                        return None;
                    }
                    let k = slot.counters();
                    Some(StrategyStats {
                        id: c.strategy.id,
                        passed: k.passed,
                        limited: k.limited,
                        delayed: k.delayed,
                    })
                })
                .collect();
        }
        s
    }
}
