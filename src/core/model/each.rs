//! The per-key part of a strategy: `each` (1–4 dimensions; one limiter
//! state per distinct value tuple), the client-address aggregation
//! (`ipv4_prefix`, `ipv6_prefix`) and `on_full`. The state lives in the key
//! table ([`crate::core::keys`]).

use std::str::FromStr;

use super::keyword::keyword_enum;
use super::{valid_dimension_name, Algorithm, MAX_DIMENSION_LEN, MAX_SLIDING_COUNT};

/// Most dimensions in `each`.
pub const MAX_EACH: usize = 4;
pub const DEFAULT_IPV4_PREFIX: u8 = 32;
pub const DEFAULT_IPV6_PREFIX: u8 = 64;
/// Largest `max_keys` (a sanity bound: the key table of `rate-ctl agent
/// --keys` has at most 2^32 entries; 0 means the default share,
/// [`crate::core::keys::KeyTable::default_cap`]).
pub const MAX_MAX_KEYS: u32 = 1 << 31;

keyword_enum! {
    /// What a new key gets when no entry of its probe range can be used.
    #[derive(Default)]
    pub enum OnFull {
        /// Charged against the strategy's shared overflow limiter (its stat
        /// slot, at the strategy's rate): a crowd of new keys may be
        /// over-limited, no key is ever handed a fresh bucket.
        #[default]
        Overflow = 1 => "overflow",
        /// Refused (nginx `limit_req`'s behaviour).
        Reject = 2 => "reject",
        /// Let through uncounted.
        Allow = 3 => "allow",
    }
}

impl FromStr for OnFull {
    type Err = EachError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OnFull::parse(s).ok_or_else(|| EachError::OnFull(s.to_string()))
    }
}

/// Why the per-key fields were refused; each message names its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EachError {
    #[error("each: at most {MAX_EACH} dimensions, got {0}")]
    TooMany(usize),
    #[error("each[{index}]: {name:?} is not a valid dimension name ([a-z][a-z0-9_]*, at most {MAX_DIMENSION_LEN} bytes)")]
    BadDimension { index: usize, name: String },
    #[error("each[{index}]: {name:?} appears twice")]
    Duplicate { index: usize, name: String },
    #[error("each: {0} has no per-key form (use token_bucket, leaky_bucket, fixed_window, sliding_window or concurrency)")]
    Algorithm(Algorithm),
    #[error(
        "rate: a per-key sliding_window counts at most {MAX_SLIDING_COUNT} per window, got {0}"
    )]
    SlidingCount(u64),
    #[error("ipv4_prefix: must be between 1 and 32, got {0}")]
    Ipv4Prefix(u8),
    #[error("ipv6_prefix: must be between 1 and 128, got {0}")]
    Ipv6Prefix(u8),
    #[error("{0}: applies only to a strategy with each")]
    NeedsEach(&'static str),
    #[error("on_full: unknown value {0:?} (expected one of {expected})", expected = OnFull::EXPECTED)]
    OnFull(String),
    #[error("max_keys: must be between 1 and {MAX_MAX_KEYS}, got {0}")]
    MaxKeys(u64),
    #[error("each: makes no sense for action allow (an allowed request is not limited, and never gets a key)")]
    Allow,
}

/// The per-key fields of a strategy; `dims` empty = one shared limiter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Each {
    pub dims: Vec<String>,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    pub on_full: OnFull,
    /// Most key-table entries the strategy's keys may hold (`--max-keys`);
    /// 0: the default share of the table ([`crate::core::keys::KeyTable::default_cap`]).
    pub max_keys: u32,
}

impl Default for Each {
    fn default() -> Each {
        Each {
            dims: Vec::new(),
            ipv4_prefix: DEFAULT_IPV4_PREFIX,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            on_full: OnFull::Overflow,
            max_keys: 0,
        }
    }
}

impl Each {
    /// Per-key dimensions `dims` with the default aggregation and `on_full`.
    pub fn of(dims: &[&str]) -> Each {
        Each {
            dims: dims.iter().map(|d| d.to_string()).collect(),
            ..Each::default()
        }
    }

    /// Does the strategy keep one state per key?
    #[inline]
    pub fn is_keyed(&self) -> bool {
        !self.dims.is_empty()
    }

    pub fn check(&self, algorithm: Algorithm, rate: u64) -> Result<(), EachError> {
        if self.dims.len() > MAX_EACH {
            return Err(EachError::TooMany(self.dims.len()));
        }
        for (index, name) in self.dims.iter().enumerate() {
            if !valid_dimension_name(name) {
                return Err(EachError::BadDimension {
                    index,
                    name: name.clone(),
                });
            }
            if self.dims[..index].contains(name) {
                return Err(EachError::Duplicate {
                    index,
                    name: name.clone(),
                });
            }
        }
        if !(1..=32).contains(&self.ipv4_prefix) {
            return Err(EachError::Ipv4Prefix(self.ipv4_prefix));
        }
        if !(1..=128).contains(&self.ipv6_prefix) {
            return Err(EachError::Ipv6Prefix(self.ipv6_prefix));
        }
        if self.max_keys > MAX_MAX_KEYS {
            return Err(EachError::MaxKeys(self.max_keys as u64));
        }
        if !self.is_keyed() {
            let d = Each::default();
            if self.ipv4_prefix != d.ipv4_prefix {
                return Err(EachError::NeedsEach("ipv4_prefix"));
            }
            if self.ipv6_prefix != d.ipv6_prefix {
                return Err(EachError::NeedsEach("ipv6_prefix"));
            }
            if self.on_full != d.on_full {
                return Err(EachError::NeedsEach("on_full"));
            }
            if self.max_keys != d.max_keys {
                return Err(EachError::NeedsEach("max_keys"));
            }
            return Ok(());
        }
        match algorithm {
            Algorithm::WarmUp => Err(EachError::Algorithm(algorithm)),
            Algorithm::SlidingWindow if rate > MAX_SLIDING_COUNT => {
                Err(EachError::SlidingCount(rate))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let ok = Each::of(&["ip", "userid"]);
        assert_eq!(ok.check(Algorithm::TokenBucket, 10), Ok(()));
        let msg = |e: Each, a| e.check(a, 10).unwrap_err().to_string();
        assert!(
            msg(Each::of(&["a", "b", "c", "d", "e"]), Algorithm::TokenBucket).starts_with("each:")
        );
        assert!(msg(Each::of(&["ip", "Bad"]), Algorithm::TokenBucket).starts_with("each[1]:"));
        assert!(msg(Each::of(&["ip", "ip"]), Algorithm::TokenBucket).starts_with("each[1]:"));
        assert!(msg(Each::of(&["ip"]), Algorithm::WarmUp).starts_with("each:"));
        let e = Each {
            ipv4_prefix: 33,
            ..Each::of(&["ip"])
        };
        assert!(msg(e, Algorithm::TokenBucket).starts_with("ipv4_prefix:"));
        let e = Each {
            ipv6_prefix: 0,
            ..Each::of(&["ip"])
        };
        assert!(msg(e, Algorithm::TokenBucket).starts_with("ipv6_prefix:"));
        let e = Each {
            on_full: OnFull::Reject,
            ..Each::default()
        };
        assert_eq!(
            msg(e, Algorithm::TokenBucket),
            "on_full: applies only to a strategy with each"
        );
        assert!(Each::of(&["ip"])
            .check(Algorithm::SlidingWindow, 2_000_000)
            .unwrap_err()
            .to_string()
            .starts_with("rate:"));
        let e = Each {
            max_keys: 100,
            ..Each::default()
        };
        assert_eq!(
            msg(e, Algorithm::TokenBucket),
            "max_keys: applies only to a strategy with each"
        );
        let e = Each {
            max_keys: MAX_MAX_KEYS + 1,
            ..Each::of(&["ip"])
        };
        assert!(msg(e, Algorithm::TokenBucket).starts_with("max_keys:"));
        assert_eq!("reject".parse::<OnFull>(), Ok(OnFull::Reject));
        assert!("drop"
            .parse::<OnFull>()
            .unwrap_err()
            .to_string()
            .starts_with("on_full:"));
    }
}
