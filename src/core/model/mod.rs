//! Strategy model and its validation.
//!
//! A strategy is a conjunction of exact `dimension = value` conditions, one
//! algorithm, a rate and what to do on overflow. Everything that reaches the
//! shared-memory table has passed [`Strategy::validate`]: a rate of 0, an
//! absurd burst or an interval that rounds to 0 is an error here, never a
//! silent bypass later.

use std::net::IpAddr;
use std::str::FromStr;

pub mod each;
pub mod ipnet;
pub mod keyword;

pub use super::ipnet::{parse_ip_net, IpNet, IpNetError};
use super::keyword::keyword_enum;
pub use super::pattern::Op;

/// Largest number of conditions in one strategy.
pub const MAX_CONDITIONS: usize = 16;
/// Longest strategy name, in bytes (the store's limit).
pub const MAX_NAME_LEN: usize = 200;
/// Longest dimension name, in bytes.
pub const MAX_DIMENSION_LEN: usize = 32;
/// Longest condition value, in bytes.
pub const MAX_VALUE_LEN: usize = 256;
/// Largest burst of a token bucket.
pub const MAX_BURST: u32 = 1_000_000;
/// Largest wait of a delay action, in milliseconds (one hour).
pub const MAX_DELAY_MS: u32 = 3_600_000;
/// Smallest GCRA emission interval: 1 µs, i.e. at most 1,000,000 requests a
/// second per strategy and host. Integer nanoseconds keep the error of the
/// rounded-up interval under 0.1 % at this bound.
pub const MIN_INTERVAL_NS: u64 = 1_000;
/// nginx's cached clock (`ngx_current_msec`) moves in whole milliseconds:
/// every request of one tick sees the same time. A bucket whose horizon
/// (burst × interval, plus the longest delay) is shorter than a tick can
/// therefore admit only `burst` requests per tick, well under its rate, so
/// [`Strategy::validate`] refuses it.
pub const CLOCK_TICK_NS: u64 = 1_000_000;
/// Largest count per window for `fixed_window` and `sliding_window`, and the
/// largest in-flight limit of `concurrency` (counts are 32-bit in the slot).
pub const MAX_WINDOW_COUNT: u64 = u32::MAX as u64 - 1;
/// Warm-up period bounds of `warm_up`, in milliseconds (1 s … 1 h).
pub const MIN_WARM_UP_MS: u32 = 1_000;
pub const MAX_WARM_UP_MS: u32 = 3_600_000;
/// Cold factor bounds of `warm_up` (Guava and Sentinel use 3).
pub const MIN_COLD_FACTOR: u8 = 2;
pub const MAX_COLD_FACTOR: u8 = 10;
/// Cold factor when none is given.
pub const DEFAULT_COLD_FACTOR: u8 = 3;
/// Priority bounds (inclusive). Among the strategies a request matches,
/// only those at the highest priority present apply; the default is 0.
pub const MIN_PRIORITY: i32 = -1000;
pub const MAX_PRIORITY: i32 = 1000;

/// Why a strategy was refused. Every variant names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("id: must be between 1 and {max}", max = u32::MAX)]
    ZeroId,
    #[error("name: at most {MAX_NAME_LEN} bytes, got {0}")]
    NameTooLong(usize),
    #[error("conditions: at most {MAX_CONDITIONS} per strategy, got {0}")]
    TooManyConditions(usize),
    #[error("conditions[{index}].dimension: {name:?} is not a valid name ([a-z][a-z0-9_]*, at most {MAX_DIMENSION_LEN} bytes)")]
    BadDimension { index: usize, name: String },
    #[error("conditions[{index}].dimension: {name:?} appears twice in one strategy")]
    DuplicateDimension { index: usize, name: String },
    #[error("conditions[{index}].value: must be 1 to {MAX_VALUE_LEN} bytes, got {len}")]
    BadValueLength { index: usize, len: usize },
    #[error("conditions[{index}].value: {value:?} is not a path template: {reason}")]
    BadTemplate {
        index: usize,
        value: String,
        reason: super::pattern::TemplateError,
    },
    #[error("conditions[{index}]: ip takes only = (an address or network), not {op}")]
    IpOperator { index: usize, op: &'static str },
    #[error("conditions[{index}].value: must not contain control characters (byte 0x{byte:02x})")]
    ControlCharacter { index: usize, byte: u8 },
    #[error("conditions[{index}].value: {value:?} is not an IPv4 or IPv6 address or network (address/prefix length)")]
    BadIp { index: usize, value: String },
    #[error("conditions[{index}].value: {value:?}: {reason}")]
    BadIpNet {
        index: usize,
        value: String,
        reason: IpNetError,
    },
    #[error("priority: must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {0}")]
    BadPriority(i32),
    #[error("rate: must be greater than 0")]
    ZeroRate,
    #[error("rate: {rate} per {per} is too high for {algorithm} (the interval between requests would be under {MIN_INTERVAL_NS} ns)")]
    RateTooHigh {
        rate: u64,
        per: Unit,
        algorithm: Algorithm,
    },
    #[error("rate: {rate} is more than the {algorithm} limit of {MAX_WINDOW_COUNT}")]
    CountTooHigh { rate: u64, algorithm: Algorithm },
    #[error("burst: must be between 1 and {MAX_BURST} for {algorithm}, got {burst}")]
    BadBurst { burst: u32, algorithm: Algorithm },
    #[error("burst: {burst} × interval of {interval_ns} ns does not fit the clock")]
    BurstOverflow { burst: u32, interval_ns: u64 },
    #[error("burst: {burst} at {rate} per {per} is shorter than nginx's 1 ms clock tick (burst × interval = {horizon_ns} ns), so at most {burst} requests per millisecond could pass; the smallest burst that works is {min_burst}{hint}")]
    BelowClockTick {
        burst: u32,
        rate: u64,
        per: Unit,
        horizon_ns: u64,
        min_burst: u64,
        hint: &'static str,
    },
    #[error("action.status: must be between 400 and 599, got {0}")]
    BadStatus(u16),
    #[error("action.max_delay_ms: must be between 1 and {MAX_DELAY_MS}, got {0}")]
    BadMaxDelay(u32),
    #[error("warm_up_ms: must be between {MIN_WARM_UP_MS} and {MAX_WARM_UP_MS} (1 s to 1 h) for warm_up, got {0}")]
    BadWarmUp(u32),
    #[error(
        "cold_factor: must be between {MIN_COLD_FACTOR} and {MAX_COLD_FACTOR} for warm_up, got {0}"
    )]
    BadColdFactor(u8),
    #[error("warm_up_ms: only the warm_up algorithm has a warm-up period, not {0}")]
    WarmUpNeedsWarmUp(Algorithm),
    #[error("action: delay needs token_bucket, leaky_bucket or warm_up, not {0}")]
    DelayNeedsBucket(Algorithm),
    #[error(transparent)]
    Each(#[from] super::each::EachError),
    #[error(transparent)]
    Response(#[from] super::response::ResponseError),
    #[error("{field}: unknown value {value:?} (expected one of {expected})")]
    UnknownKeyword {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

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
/// otherwise (see [`pattern`](super::pattern)).
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
    /// present apply (see [`table`](super::table)).
    pub priority: i32,
    /// Per-key: one limiter state per value tuple of these dimensions
    /// (empty: one shared state).
    pub each: super::each::Each,
    /// The store's name (for the module's metrics; empty: none). At most
    /// [`MAX_NAME_LEN`] bytes of any text: it is escaped where written.
    pub name: String,
    /// `count_if`, `cost_from`, `cost_after` (issue 31; all empty: plain).
    pub response: super::response::Response,
}

/// Is `name` a valid dimension name: `[a-z][a-z0-9_]*`, at most 32 bytes.
pub fn valid_dimension_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_DIMENSION_LEN
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// An IP address written as text (surrounding spaces ignored): what the
/// model, the blacklist and the matcher read `ip` values with.
pub fn parse_ip(value: &[u8]) -> Option<IpAddr> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// The canonical text of an IP address value: IPv4 dotted quad, IPv6 in
/// RFC 5952 form, IPv4-mapped IPv6 as IPv4, so that one address is stored
/// one way.
pub fn canonical_ip(value: &[u8]) -> Option<String> {
    Some(canonical_ip_addr(parse_ip(value)?))
}

/// Is `value` an IP address in the form [`canonical_ip`] gives? No
/// allocation: the reader checks every published `ip` value with it.
pub fn is_canonical_ip(value: &[u8]) -> bool {
    use std::io::Write;
    // A dotted quad is canonical if it parses: the whole check.
    if parse_canonical_ipv4(value).is_some() {
        return true;
    }
    let Ok(s) = std::str::from_utf8(value) else {
        return false;
    };
    let Ok(ip) = s.parse::<IpAddr>() else {
        return false;
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    let mut buf = [0u8; 64];
    let mut w = &mut buf[..];
    if write!(w, "{ip}").is_err() {
        return false;
    }
    let n = 64 - w.len();
    buf[..n] == *value
}

/// An IPv4 address in canonical text (what std's `Ipv4Addr` parser
/// accepts: four decimal octets of 1 to 3 digits, none above 255, no
/// leading zero, nothing around them), as its 32-bit value. No UTF-8 pass,
/// no allocation: the reader's path for the `ip` values of a table (most
/// are IPv4 addresses); anything else goes through the general parsers.
pub fn parse_canonical_ipv4(b: &[u8]) -> Option<u32> {
    let mut addr = 0u32;
    let mut i = 0;
    for octet in 0..4 {
        if octet > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut v = 0u32;
        while let Some(&c) = b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            if i - start == 3 {
                return None;
            }
            v = v * 10 + u32::from(c - b'0');
            i += 1;
        }
        let n = i - start;
        if n == 0 || v > 255 || (n > 1 && b[start] == b'0') {
            return None;
        }
        addr = addr << 8 | v;
    }
    (i == b.len()).then_some(addr)
}

/// See [`canonical_ip`].
pub fn canonical_ip_addr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    }
}

impl Strategy {
    /// An enabled strategy with every optional field at its default: burst
    /// 1, `reject` with the location's status, no warm-up, priority 0, one
    /// shared state (no `each`). Not validated: callers set what differs
    /// (struct update syntax) and validate, so a new optional field needs
    /// one default here, not one in every builder.
    pub fn plain(
        id: u32,
        conditions: Vec<Condition>,
        algorithm: Algorithm,
        rate: u64,
        per: Unit,
    ) -> Strategy {
        Strategy {
            id,
            conditions,
            algorithm,
            rate,
            per,
            burst: 1,
            action: Action::Reject { status: None },
            enabled: true,
            warm_up: WarmUp::NONE,
            priority: 0,
            each: Default::default(),
            name: String::new(),
            response: Default::default(),
        }
    }

    /// A validated, enabled strategy with no conditions (id 1): a limit on
    /// its own, as limiter tests and benchmarks build them. The limiters
    /// work in nanoseconds, so nginx's clock-tick rule
    /// ([`check_clock_tick`](Self::check_clock_tick)) is not applied here.
    pub fn unconditioned(
        algorithm: Algorithm,
        rate: u64,
        per: Unit,
        burst: u32,
        action: Action,
    ) -> Result<Strategy, ModelError> {
        let mut s = Strategy {
            burst,
            action,
            ..Strategy::plain(1, vec![], algorithm, rate, per)
        };
        if s.algorithm == Algorithm::LeakyBucket {
            s.burst = 1;
        }
        s.check()?;
        Ok(s)
    }

    /// Checks every field and canonicalises `ip` values in place.
    ///
    /// Also refuses a bucket that nginx's millisecond clock cannot enforce
    /// ([`CLOCK_TICK_NS`]). That rule is for what is written and published
    /// (API, CLI, store, the agent after the fleet split, the writer), not
    /// for [`check`](Self::check): a worker still reads a segment that an
    /// older writer published with such a strategy.
    pub fn validate(&mut self) -> Result<(), ModelError> {
        for c in &mut self.conditions {
            if c.dimension == "ip" {
                if let Ok(net) = parse_ip_net(&c.value) {
                    c.value = net.to_string().into_bytes();
                }
            }
        }
        if matches!(self.algorithm, Algorithm::LeakyBucket | Algorithm::WarmUp) {
            self.burst = 1;
        }
        self.check_written()?;
        self.check_clock_tick()
    }

    /// [`check`](Self::check) plus the rule for what is written (API,
    /// CLI, store, tests): a rate of 0 is refused for every algorithm. Only
    /// a fleet lease publishes a window with 0 ([`ValidStrategy::leased`]).
    fn check_written(&self) -> Result<(), ModelError> {
        if self.rate == 0 {
            return Err(ModelError::ZeroRate);
        }
        self.check()
    }

    /// A bucket's horizon (burst × interval, plus the longest delay) must
    /// be at least one clock tick; see [`CLOCK_TICK_NS`].
    pub fn check_clock_tick(&self) -> Result<(), ModelError> {
        if !self.algorithm.is_bucket() {
            return Ok(());
        }
        let interval = self.interval_ns();
        let delay_ns = self.action.max_delay_ns();
        let horizon = interval.saturating_mul(self.burst as u64);
        if horizon.saturating_add(delay_ns) >= CLOCK_TICK_NS {
            return Ok(());
        }
        Err(ModelError::BelowClockTick {
            burst: self.burst,
            rate: self.rate,
            per: self.per,
            horizon_ns: horizon,
            min_burst: CLOCK_TICK_NS.div_ceil(interval.max(1)),
            hint: if self.algorithm == Algorithm::LeakyBucket {
                " (leaky_bucket has burst 1: use token_bucket, or action delay)"
            } else {
                ""
            },
        })
    }

    /// Checks every field without changing anything: `ip` values must
    /// already be canonical and a leaky bucket's burst 1 (the reader's check
    /// of published strategies).
    pub fn check(&self) -> Result<(), ModelError> {
        let c = &self.conditions;
        self.check_with(c.len(), |i| {
            (c[i].dimension.as_str(), c[i].op, &c[i].value[..])
        })
    }

    /// [`check`](Self::check) with the conditions given apart, borrowed
    /// (`cond(i)` for `i < count`; `self.conditions` is not read): the
    /// reader checks a published record this way, straight from the
    /// segment's bytes.
    pub fn check_with<'c>(
        &self,
        count: usize,
        cond: impl Fn(usize) -> (&'c str, Op, &'c [u8]),
    ) -> Result<(), ModelError> {
        if self.id == 0 {
            return Err(ModelError::ZeroId);
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(ModelError::NameTooLong(self.name.len()));
        }
        if count > MAX_CONDITIONS {
            return Err(ModelError::TooManyConditions(count));
        }
        for index in 0..count {
            let (dimension, op, value) = cond(index);
            if !valid_dimension_name(dimension) {
                return Err(ModelError::BadDimension {
                    index,
                    name: dimension.to_string(),
                });
            }
            if (0..index).any(|p| cond(p).0 == dimension) {
                return Err(ModelError::DuplicateDimension {
                    index,
                    name: dimension.to_string(),
                });
            }
            if value.is_empty() || value.len() > MAX_VALUE_LEN {
                return Err(ModelError::BadValueLength {
                    index,
                    len: value.len(),
                });
            }
            // A newline would forge lines in listings and logs; no request
            // value nginx hands over carries NUL.
            if let Some(&byte) = value.iter().find(|b| b.is_ascii_control()) {
                return Err(ModelError::ControlCharacter { index, byte });
            }
            match op {
                Op::Exact => {}
                _ if dimension == "ip" => {
                    return Err(ModelError::IpOperator {
                        index,
                        op: op.symbol(),
                    })
                }
                Op::Template => {
                    if let Err(reason) = super::pattern::parse_template(value) {
                        return Err(ModelError::BadTemplate {
                            index,
                            value: String::from_utf8_lossy(value).into_owned(),
                            reason,
                        });
                    }
                }
                Op::Prefix | Op::Not => {}
            }
            if dimension == "ip" && !is_canonical_ip(value) {
                // Else a network in canonical form (`10.0.0.0/8`).
                let value_text = || String::from_utf8_lossy(value).into_owned();
                match parse_ip_net(value) {
                    Ok(net) if net.to_string().as_bytes() == value => {}
                    Ok(_) | Err(IpNetError::NotAnAddress) => {
                        return Err(ModelError::BadIp {
                            index,
                            value: value_text(),
                        })
                    }
                    Err(reason) => {
                        return Err(ModelError::BadIpNet {
                            index,
                            value: value_text(),
                            reason,
                        })
                    }
                }
            }
        }
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(ModelError::BadPriority(self.priority));
        }
        // A window with limit 0 admits nothing (a fleet lease of 0, see
        // `ValidStrategy::leased`); every other algorithm needs a rate.
        if self.rate == 0 && !self.algorithm.is_window() {
            return Err(ModelError::ZeroRate);
        }
        if self.algorithm == Algorithm::WarmUp {
            let w = self.warm_up;
            if !(MIN_WARM_UP_MS..=MAX_WARM_UP_MS).contains(&w.period_ms) {
                return Err(ModelError::BadWarmUp(w.period_ms));
            }
            if !(MIN_COLD_FACTOR..=MAX_COLD_FACTOR).contains(&w.cold_factor) {
                return Err(ModelError::BadColdFactor(w.cold_factor));
            }
        } else if self.warm_up != WarmUp::NONE {
            return Err(ModelError::WarmUpNeedsWarmUp(self.algorithm));
        }
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::WarmUp => {
                if self.burst == 0
                    || (self.algorithm != Algorithm::TokenBucket && self.burst != 1)
                    || self.burst > MAX_BURST
                {
                    return Err(ModelError::BadBurst {
                        burst: self.burst,
                        algorithm: self.algorithm,
                    });
                }
                let interval_ns = self.interval_ns();
                if interval_ns < MIN_INTERVAL_NS {
                    return Err(ModelError::RateTooHigh {
                        rate: self.rate,
                        per: self.per,
                        algorithm: self.algorithm,
                    });
                }
                // Tolerance plus the longest delay must stay far from u64::MAX
                // so that `now + tau + delay` never overflows (≈ 146 years).
                let tau = interval_ns.checked_mul(self.burst as u64);
                if tau.is_none_or(|t| t > u64::MAX / 4) {
                    return Err(ModelError::BurstOverflow {
                        burst: self.burst,
                        interval_ns,
                    });
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::Concurrency => {
                if self.rate > MAX_WINDOW_COUNT {
                    return Err(ModelError::CountTooHigh {
                        rate: self.rate,
                        algorithm: self.algorithm,
                    });
                }
            }
        }
        match self.action {
            Action::Reject { status: Some(s) } if !(400..=599).contains(&s) => {
                return Err(ModelError::BadStatus(s))
            }
            Action::Delay { max_delay_ms } | Action::DryRunDelay { max_delay_ms } => {
                if max_delay_ms == 0 || max_delay_ms > MAX_DELAY_MS {
                    return Err(ModelError::BadMaxDelay(max_delay_ms));
                }
                if !self.algorithm.can_delay() {
                    return Err(ModelError::DelayNeedsBucket(self.algorithm));
                }
            }
            _ => {}
        }
        self.each.check(self.algorithm, self.rate)?;
        self.response
            .check(self.algorithm, self.action == Action::Allow)?;
        if self.action == Action::Allow && self.each.is_keyed() {
            // An allowed request passes before any key is looked up.
            return Err(super::each::EachError::Allow.into());
        }
        Ok(())
    }

    /// GCRA emission interval: the period divided by the rate, rounded up so
    /// that rounding never admits more than the rate.
    pub fn interval_ns(&self) -> u64 {
        interval_ns(self.rate, self.per)
    }
}

/// `period / rate`, rounded up; `u64::MAX` for a rate of 0.
pub fn interval_ns(rate: u64, per: Unit) -> u64 {
    if rate == 0 {
        return u64::MAX;
    }
    per.period_ns().div_ceil(rate)
}

/// A strategy that passed [`Strategy::validate`]. [`Strategy::into_valid`]
/// makes one, and [`ValidStrategy::vouched`] for a caller holding its own
/// proof of that check, so whoever holds it needs no second check: the
/// writer publishes these. (The admin binary validates once at each trust
/// boundary — input, store read — and its agent vouches for the result;
/// the reader's boundary is the file: it [`check`](Strategy::check)s every
/// strategy it decodes.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidStrategy(Strategy);

impl Strategy {
    /// Validates (see [`validate`](Self::validate)) and keeps the proof.
    pub fn into_valid(mut self) -> Result<ValidStrategy, ModelError> {
        self.validate()?;
        Ok(ValidStrategy(self))
    }
}

impl ValidStrategy {
    pub fn into_inner(self) -> Strategy {
        self.0
    }

    /// Vouches for `s` without running [`Strategy::validate`]: for a caller
    /// that holds its own proof that `s` passed it — the admin binary's
    /// validated store record (`store::valid::Valid`, made only by the
    /// record's `validate`, which is the core's plus the record's fields),
    /// converted as is. That caller must still check what its conversion
    /// changes (the agent re-checks a host's share of a cluster rate and the
    /// clock tick; see `agent/rates.rs`). The binary is another crate, so
    /// this cannot be crate-private. A broken promise is no memory-safety
    /// matter: the reader still [`check`](Strategy::check)s every strategy
    /// it decodes from the file.
    pub fn vouched(s: Strategy) -> ValidStrategy {
        ValidStrategy(s)
    }

    /// A host's part of a fleet strategy under a lease (src/agent/lease.rs
    /// in the binary): the published-file rules ([`check`](Strategy::check)
    /// and the clock tick) without the written-input rule `rate > 0`, so a
    /// window (`fixed_window`, `sliding_window`) leased 0 admits nothing
    /// more in its window. The only way a `ValidStrategy` carries a rate of
    /// 0: [`Strategy::into_valid`] still refuses it.
    pub fn leased(s: Strategy) -> Result<ValidStrategy, ModelError> {
        s.check()?;
        s.check_clock_tick()?;
        Ok(ValidStrategy(s))
    }
}

impl std::ops::Deref for ValidStrategy {
    type Target = Strategy;
    fn deref(&self) -> &Strategy {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Strategy {
        Strategy {
            id: 7,
            conditions: vec![
                Condition::new("ip", "::ffff:1.2.3.4"),
                Condition::new("userid", "u1024"),
            ],
            algorithm: Algorithm::TokenBucket,
            rate: 100,
            per: Unit::Second,
            burst: 20,
            action: Action::Reject { status: None },
            enabled: true,
            warm_up: WarmUp::NONE,
            priority: 0,
            each: Default::default(),
            name: String::new(),
            response: Default::default(),
        }
    }

    /// The reader's IPv4 fast path accepts exactly what std's parser
    /// does (canonical text is what std parses and prints alike).
    #[test]
    fn canonical_ipv4_parses_exactly_what_std_parses() {
        let std_v4 = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()?
                .parse::<std::net::Ipv4Addr>()
                .ok()
                .map(u32::from)
        };
        let mut cases: Vec<Vec<u8>> = [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.1",
            "1.2.3.4",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3.00",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.",
            ".1.2.3.4",
            "1..2.3",
            "1.2.3.4 ",
            " 1.2.3.4",
            "1.2.3.4/8",
            "1.2.3.-4",
            "1.2.3.+4",
            "1000.1.1.1",
            "1.2.3.1000",
            "::1",
            "",
            "1.2.3.4\0",
            "9.99.199.249",
            "0.00.0.0",
        ]
        .iter()
        .map(|c| c.as_bytes().to_vec())
        .collect();
        // Every quad of these octet spellings (valid, leading zeros, too
        // large, too long, empty, stray bytes), and random bytes over the
        // grammar's alphabet.
        let octets = [
            "0", "00", "01", "1", "9", "10", "99", "100", "199", "249", "255", "256", "999",
            "0000", "", "1x",
        ];
        for i in 0..octets.len().pow(4) {
            let o = |k: u32| octets[i / octets.len().pow(k) % octets.len()];
            cases.push(format!("{}.{}.{}.{}", o(0), o(1), o(2), o(3)).into_bytes());
        }
        let alphabet = b"0129.5x";
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut y = x;
            let v: Vec<u8> = (0..x % 16)
                .map(|_| {
                    let b = alphabet[(y % 7) as usize];
                    y /= 7;
                    b
                })
                .collect();
            cases.push(v);
        }
        for c in &cases {
            assert_eq!(
                parse_canonical_ipv4(c),
                std_v4(c),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
        assert!(cases.iter().filter(|c| std_v4(c).is_some()).count() >= 6_561);
    }

    #[test]
    fn ip_networks_are_canonicalised_or_refused_naming_the_value() {
        let mut s = base();
        s.conditions[0].value = b"::ffff:10.0.0.0/104".to_vec();
        s.validate().unwrap();
        assert_eq!(s.conditions[0].value, b"10.0.0.0/8");
        s.check().unwrap();
        s.conditions[0].value = b"10.0.0.1/32".to_vec();
        s.validate().unwrap();
        assert_eq!(s.conditions[0].value, b"10.0.0.1", "a /32 is the address");
        s.conditions[0].value = b"2001:DB8::/32".to_vec();
        assert!(s.check().is_err(), "check() wants the canonical form");
        s.validate().unwrap();
        assert_eq!(s.conditions[0].value, b"2001:db8::/32");
        for (bad, says) in [
            (
                "10.0.0.1/8",
                "host bits are set past the /8 prefix; the network is 10.0.0.0/8",
            ),
            (
                "10.0.0.0/33",
                "prefix length \"33\" is not a number from 0 to 32",
            ),
            ("10.0.0/8", "not an IPv4 or IPv6 address or network"),
        ] {
            s.conditions[0].value = bad.as_bytes().to_vec();
            let e = s.validate().unwrap_err().to_string();
            assert!(e.starts_with("conditions[0].value: "), "{e}");
            assert!(e.contains(bad) && e.contains(says), "{e}");
        }
    }

    #[test]
    fn priority_has_a_range_and_allow_needs_nothing() {
        let mut s = base();
        for p in [MIN_PRIORITY, 0, MAX_PRIORITY] {
            s.priority = p;
            s.validate().unwrap();
        }
        for p in [MIN_PRIORITY - 1, MAX_PRIORITY + 1] {
            s.priority = p;
            let e = s.validate().unwrap_err().to_string();
            assert!(
                e.starts_with("priority: must be between -1000 and 1000"),
                "{e}"
            );
        }
        s.priority = 0;
        s.action = Action::Allow;
        s.validate().unwrap();
        assert!(!s.action.is_dry_run());
        // An allow keeps no per-key state: `each` is refused, naming it
        // (also when the file is read: `check`).
        s.each = super::super::each::Each::of(&["ip"]);
        let e = s.check().unwrap_err().to_string();
        assert!(
            e.starts_with("each: makes no sense for action allow"),
            "{e}"
        );
    }

    #[test]
    fn valid_strategy_canonicalises_ip() {
        let mut s = base();
        s.validate().unwrap();
        assert_eq!(s.conditions[0].value, b"1.2.3.4");
        let mut s = base();
        s.conditions[0].value = b"0:0:0:0:0:0:0:1".to_vec();
        s.validate().unwrap();
        assert_eq!(s.conditions[0].value, b"::1");
        assert!(s.check().is_ok());
        s.conditions[0].value = b"0::1".to_vec();
        assert!(s.check().is_err(), "check() wants the canonical form");
        assert!(is_canonical_ip(b"10.0.0.1"));
        assert!(!is_canonical_ip(b"::ffff:10.0.0.1"));
        assert!(!is_canonical_ip(b"10.0.0.1 "));
        assert!(!is_canonical_ip(b"10.0.0.01"));
        assert!(is_canonical_ip(b"2001:db8::1"));
        assert!(!is_canonical_ip(b"2001:DB8::1"));
    }

    #[test]
    fn buckets_shorter_than_the_clock_tick_are_refused_with_the_smallest_burst() {
        let mut s = base();
        s.conditions.clear();
        (s.rate, s.burst) = (5_000, 1);
        let e = s.validate().unwrap_err();
        assert!(
            matches!(e, ModelError::BelowClockTick { min_burst: 5, .. }),
            "{e}"
        );
        assert!(e.to_string().starts_with("burst: "), "{e}");
        assert!(
            e.to_string().contains("smallest burst that works is 5"),
            "{e}"
        );
        s.burst = 5;
        s.validate().unwrap();
        (s.rate, s.burst) = (1_000_000, 999);
        assert!(matches!(
            s.validate().unwrap_err(),
            ModelError::BelowClockTick {
                min_burst: 1000,
                ..
            }
        ));
        (s.rate, s.burst) = (1_000, 1);
        s.validate().expect("1 ms interval is one tick");
        s.algorithm = Algorithm::LeakyBucket;
        s.rate = 1_001;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("use token_bucket"));
        s.action = Action::Delay { max_delay_ms: 1 };
        s.validate().expect("a delay queue spans ticks");
        // A dry run keeping that cap queues the same way.
        s.action = Action::DryRunDelay { max_delay_ms: 1 };
        s.validate().expect("a dry run's delay queue spans ticks");
        // The reader's check accepts what an older writer published.
        s.action = Action::Reject { status: None };
        assert!(s.check().is_ok());
        // Windows count per period (≥ 1 s): no tick rule.
        (s.algorithm, s.rate) = (Algorithm::FixedWindow, 1_000_000);
        s.validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        type Case = (fn(&mut Strategy), &'static str);
        let cases: Vec<Case> = vec![
            (|s| s.id = 0, "id"),
            (|s| s.rate = 0, "rate"),
            (|s| s.rate = 2_000_000, "rate"),
            (|s| s.burst = 0, "burst"),
            (|s| s.burst = MAX_BURST + 1, "burst"),
            (
                |s| s.conditions[1].dimension = "User".into(),
                "conditions[1].dimension",
            ),
            (
                |s| s.conditions[1].dimension = "ip".into(),
                "conditions[1].dimension",
            ),
            (|s| s.conditions[1].value = vec![], "conditions[1].value"),
            (
                |s| s.conditions[1].value = vec![b'x'; 257],
                "conditions[1].value",
            ),
            (
                |s| s.conditions[0].value = b"1.2.3".to_vec(),
                "conditions[0].value",
            ),
            (
                |s| s.action = Action::Reject { status: Some(200) },
                "action.status",
            ),
            (
                |s| s.action = Action::Delay { max_delay_ms: 0 },
                "action.max_delay_ms",
            ),
            (
                |s| {
                    s.algorithm = Algorithm::FixedWindow;
                    s.action = Action::Delay { max_delay_ms: 10 }
                },
                "action",
            ),
            (
                |s| {
                    s.conditions = (0..17)
                        .map(|i| Condition::new(format!("d{i}"), "v"))
                        .collect()
                },
                "conditions",
            ),
            (
                |s| {
                    s.per = Unit::Day;
                    s.rate = 1;
                    s.burst = MAX_BURST
                },
                "burst",
            ),
        ];
        for (mutate, field) in cases {
            let mut s = base();
            mutate(&mut s);
            let err = s.validate().unwrap_err().to_string();
            assert!(err.starts_with(field), "{err:?} should name {field}");
        }
    }

    #[test]
    fn leaky_bucket_is_burst_one_and_windows_allow_large_counts() {
        let mut s = base();
        s.algorithm = Algorithm::LeakyBucket;
        s.burst = 50;
        s.validate().unwrap();
        assert_eq!(s.burst, 1);
        let mut s = base();
        s.algorithm = Algorithm::FixedWindow;
        s.per = Unit::Day;
        s.rate = 4_000_000_000;
        s.validate().unwrap();
        s.rate = u32::MAX as u64;
        assert!(s.validate().is_err());
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(interval_ns(3, Unit::Second), 333_333_334);
        assert_eq!(interval_ns(1000, Unit::Second), 1_000_000);
        assert_eq!(interval_ns(0, Unit::Second), u64::MAX);
    }

    #[test]
    fn keywords_parse() {
        assert_eq!(
            "token_bucket".parse::<Algorithm>().unwrap(),
            Algorithm::TokenBucket
        );
        assert_eq!("minutes".parse::<Unit>().unwrap(), Unit::Minute);
        assert_eq!("s".parse::<Unit>().unwrap(), Unit::Second);
        assert!("weekly"
            .parse::<Unit>()
            .unwrap_err()
            .to_string()
            .starts_with("per:"));
    }

    /// Only a fleet lease publishes a rate of 0, and only for a window:
    /// written input refuses it for every algorithm.
    #[test]
    fn rate_0_only_for_a_leased_window() {
        let mut s = base();
        s.validate().unwrap();
        s.algorithm = Algorithm::FixedWindow;
        s.rate = 0;
        assert_eq!(s.clone().validate(), Err(ModelError::ZeroRate));
        assert!(s.check().is_ok());
        assert_eq!(ValidStrategy::leased(s.clone()).unwrap().rate, 0);
        s.algorithm = Algorithm::SlidingWindow;
        assert!(ValidStrategy::leased(s.clone()).is_ok());
        for a in [Algorithm::TokenBucket, Algorithm::Concurrency] {
            s.algorithm = a;
            assert_eq!(ValidStrategy::leased(s.clone()), Err(ModelError::ZeroRate));
        }
    }
}
