//! Strategy model and its validation.
//!
//! A strategy is a conjunction of exact `dimension = value` conditions, one
//! algorithm, a rate and what to do on overflow. Everything that reaches the
//! shared-memory table has passed [`Strategy::validate`]: a rate of 0, an
//! absurd burst or an interval that rounds to 0 is an error here, never a
//! silent bypass later.

pub mod ban;
pub mod calendar;
pub mod each;
pub mod ipnet;
pub mod keyword;
mod records;
pub mod response;
mod validate;

pub use ipnet::{canonical_ip, canonical_ip_addr, is_canonical_ip, parse_canonical_ipv4, parse_ip};
pub use records::*;
pub use validate::*;

pub use crate::core::pattern::Op;
pub use ipnet::{parse_ip_net, IpNet, IpNetError};

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
/// Largest `rate` of a per-key `sliding_window` (its state keeps 20-bit
/// counts; the key table's word layout is why, the model checks it).
pub const MAX_SLIDING_COUNT: u64 = (1 << 20) - 1;
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
        reason: crate::core::pattern::TemplateError,
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
    Each(#[from] each::EachError),
    #[error(transparent)]
    Response(#[from] response::ResponseError),
    #[error(transparent)]
    Calendar(#[from] calendar::CalendarError),
    #[error(transparent)]
    Ban(#[from] ban::BanError),
    #[error("{field}: unknown value {value:?} (expected one of {expected})")]
    UnknownKeyword {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

#[cfg(test)]
mod tests;
