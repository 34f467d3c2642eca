//! The strategy and its parts as the store, the API and the file hold
//! them: algorithm, unit, action, warm-up, condition.

use std::str::FromStr;

use super::keyword::keyword_enum;
use super::{ModelError, Op};

keyword_enum! {
    /// The limiting algorithm of a strategy.
    pub enum Algorithm {
        FixedWindow = 1 => "fixed_window",
        SlidingWindow = 2 => "sliding_window",
        TokenBucket = 3 => "token_bucket",
        LeakyBucket = 4 => "leaky_bucket",
        Concurrency = 5 => "concurrency",
        WarmUp = 6 => "warm_up",
    }
}

impl Algorithm {
    /// GCRA algorithms (one theoretical arrival time per slot).
    pub fn is_bucket(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    /// Algorithms whose state is a time, so that the `delay` action can
    /// queue on them: the buckets and `warm_up`.
    pub fn can_delay(self) -> bool {
        self.is_bucket() || self == Algorithm::WarmUp
    }

    /// Counting windows: a limit of 0 is meaningful for them (admit
    /// nothing more in this window), so a fleet lease of 0 may be
    /// published as is ([`ValidStrategy::leased`]).
    pub fn is_window(self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }
}

/// `word` as one of a keyword field's values, or the error naming the
/// field and the words it takes.
fn keyword<K>(
    field: &'static str,
    word: &str,
    parse: fn(&str) -> Option<K>,
    expected: &'static str,
) -> Result<K, ModelError> {
    parse(word).ok_or_else(|| ModelError::UnknownKeyword {
        field,
        value: word.to_string(),
        expected,
    })
}

impl FromStr for Algorithm {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        keyword("algorithm", s, Algorithm::parse, Algorithm::EXPECTED)
    }
}

keyword_enum! {
    /// The period a rate is counted over.
    pub enum Unit {
        Second = 1 => "second",
        Minute = 2 => "minute",
        Hour = 3 => "hour",
        Day = 4 => "day",
        // Calendar windows (issue 33): Monday 00:00 and the 1st 00:00 in
        // the strategy's `tz` (src/core/calendar.rs), fixed_window only.
        Week = 5 => "week",
        Month = 6 => "month",
    }
}

impl Unit {
    /// Length of the period in nanoseconds.
    pub fn period_ns(self) -> u64 {
        const S: u64 = 1_000_000_000;
        match self {
            Unit::Second => S,
            Unit::Minute => 60 * S,
            Unit::Hour => 3_600 * S,
            Unit::Day => 86_400 * S,
            // Nominal: the real length is the calendar's (28-31 days).
            Unit::Week => 7 * 86_400 * S,
            Unit::Month => 31 * 86_400 * S,
        }
    }
}

impl FromStr for Unit {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = match s {
            "s" | "sec" => "second",
            "m" | "min" => "minute",
            "h" => "hour",
            "d" => "day",
            "w" => "week",
            "mo" => "month",
            other => other.strip_suffix('s').unwrap_or(other),
        };
        keyword("per", s, Unit::parse, Unit::EXPECTED)
    }
}

/// What happens to a request the strategy does not admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Answer with this status; `None` uses the location's `rate_ctl_status`.
    Reject { status: Option<u16> },
    /// Queue the request (leaky bucket as a queue) for at most this long,
    /// then reject with the location's status.
    Delay { max_delay_ms: u32 },
    /// Count and log only.
    DryRun,
    /// Let the request through unlimited: a request whose matches at the
    /// highest priority present include an `allow` strategy is counted as
    /// passed by it and by no other strategy (`$rate_ctl_status` =
    /// `ALLOWED`). The blacklist still wins.
    Allow,
    /// Dry run of a `delay` strategy (the cap it enforces when dry run
    /// ends): the limiter queues as `Delay` would, so the counters and the
    /// would-be delays predict enforcement, but nothing waits or is refused.
    DryRunDelay { max_delay_ms: u32 },
}

impl Action {
    pub fn kind(&self) -> u8 {
        match self {
            Action::Reject { .. } => 1,
            Action::Delay { .. } => 2,
            Action::DryRun | Action::DryRunDelay { .. } => 3,
            Action::Allow => 4,
        }
    }

    /// Counts and logs only (`dry_run`, with or without a kept delay cap).
    #[inline]
    pub fn is_dry_run(&self) -> bool {
        matches!(self, Action::DryRun | Action::DryRunDelay { .. })
    }

    /// The longest wait the limiter queues a request for, in ns: the cap of
    /// `delay` and of a dry run that keeps it (it queues the same way), 0
    /// for every other action. The limiters and the clock-tick rule share
    /// it, so what is checked is what is enforced.
    #[inline]
    pub fn max_delay_ns(&self) -> u64 {
        match *self {
            Action::Delay { max_delay_ms } | Action::DryRunDelay { max_delay_ms } => {
                (max_delay_ms as u64).saturating_mul(1_000_000)
            }
            _ => 0,
        }
    }
}

/// The warm-up of a `warm_up` strategy (both 0 for every other algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WarmUp {
    /// Time a saturated strategy takes from cold to the full rate.
    pub period_ms: u32,
    /// Interval between admissions when cold = `cold_factor` × 1/rate.
    pub cold_factor: u8,
}

impl WarmUp {
    pub const NONE: WarmUp = WarmUp {
        period_ms: 0,
        cold_factor: 0,
    };
}

/// One `dimension OP value` condition: exact bytes unless `op` says
/// otherwise (see [`pattern`](crate::core::pattern)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Condition {
    pub dimension: String,
    pub value: Vec<u8>,
    pub op: Op,
}

impl Condition {
    pub fn new(dimension: impl Into<String>, value: impl Into<Vec<u8>>) -> Condition {
        Condition::with_op(dimension, Op::Exact, value)
    }

    pub fn with_op(dimension: impl Into<String>, op: Op, value: impl Into<Vec<u8>>) -> Condition {
        Condition {
            dimension: dimension.into(),
            value: value.into(),
            op,
        }
    }

    /// The pseudo-dimension the matcher adds for this condition (a prefix
    /// or a template), beside its dimension: the writer counts them
    /// against the table's dimension limit.
    pub fn matcher_dimension(&self) -> Option<String> {
        match self.op {
            Op::Prefix => Some(crate::core::pattern::prefix_dimension(
                &self.dimension,
                self.value.len(),
            )),
            Op::Template => crate::core::pattern::parse_template(&self.value)
                .ok()
                .map(|s| s.dimension(&self.dimension)),
            Op::Exact | Op::Not => None,
        }
    }

    /// The key the store, the API and import files give this condition:
    /// the dimension, then the operator's character (`api^`).
    pub fn key(&self) -> String {
        format!("{}{}", self.dimension, self.op.suffix())
    }

    /// A condition from its key (`api^`) and value.
    pub fn from_key(key: &str, value: impl Into<Vec<u8>>) -> Condition {
        let (dim, op) = Op::split_key(key);
        Condition::with_op(dim, op, value)
    }
}

/// A rate-limiting strategy as stored and as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strategy {
    pub id: u32,
    pub conditions: Vec<Condition>,
    pub algorithm: Algorithm,
    /// Requests per `per` (for `concurrency`: requests in flight).
    pub rate: u64,
    pub per: Unit,
    /// Bucket capacity for `token_bucket` (≥ 1); ignored and stored as 1
    /// for `leaky_bucket`; ignored by the window and concurrency algorithms.
    pub burst: u32,
    pub action: Action,
    pub enabled: bool,
    /// `warm_up` only; [`WarmUp::NONE`] otherwise.
    pub warm_up: WarmUp,
    /// [`MIN_PRIORITY`] ..= [`MAX_PRIORITY`], default 0: among the
    /// strategies a request matches only those at the highest priority
    /// present apply (see [`table`](crate::core::table)).
    pub priority: i32,
    /// Per-key: one limiter state per value tuple of these dimensions
    /// (empty: one shared state).
    pub each: super::each::Each,
    /// The store's name (for the module's metrics; empty: none). At most
    /// [`MAX_NAME_LEN`] bytes of any text: it is escaped where written.
    pub name: String,
    /// `count_if`, `cost_from`, `cost_after` (issue 31; all empty: plain).
    pub response: super::response::Response,
    /// Calendar windows (issue 33): the IANA zone whose local days, weeks
    /// and months a `fixed_window` counts in (empty: UTC). See
    /// [`calendar`](crate::core::calendar).
    pub tz: String,
    /// The penalty box (issue 32; `None`: none): see [`super::ban`].
    pub ban: Option<super::ban::Ban>,
}
