//! A strategy's response and cost options (`count_if`, `cost_from`,
//! `cost_after`, issue 31) and their validation; what a request owes when
//! it ends is in `core/response.rs`.

use std::fmt;

use super::Algorithm;

/// Largest cost one request may be charged.
pub const MAX_COST: u64 = 1_000_000;
/// Longest `count_if` text (canonical form).
pub const MAX_COUNT_IF_LEN: usize = 200;

/// A set of HTTP status codes 100 … 599 (one bit each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct StatusSet {
    bits: [u64; 8],
}

/// Why a `count_if`, `cost_from` or `cost_after` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("count_if: expected status=LIST (codes 100-599 and classes 1xx-5xx, comma separated, e.g. status=401,403 or status=429,5xx), got {0:?}")]
    BadCountIf(String),
    #[error("{field}: {name:?} is not a valid dimension name ([a-z][a-z0-9_]*, at most 32 bytes)")]
    BadDimension { field: &'static str, name: String },
    #[error("{field}: not available for {algorithm} (only fixed_window, sliding_window, token_bucket and leaky_bucket count units)")]
    Algorithm {
        field: &'static str,
        algorithm: Algorithm,
    },
    #[error("{field}: not available with action allow")]
    Allow { field: &'static str },
}

impl StatusSet {
    pub fn is_empty(&self) -> bool {
        self.bits == [0; 8]
    }

    fn index(code: u16) -> Option<usize> {
        (100..=599).contains(&code).then(|| usize::from(code - 100))
    }

    pub fn insert(&mut self, code: u16) {
        if let Some(i) = Self::index(code) {
            self.bits[i / 64] |= 1 << (i % 64);
        }
    }

    #[inline]
    pub fn contains(&self, code: u16) -> bool {
        Self::index(code).is_some_and(|i| self.bits[i / 64] & (1 << (i % 64)) != 0)
    }

    fn has_class(&self, class: u16) -> bool {
        (class * 100..class * 100 + 100).all(|c| self.contains(c))
    }

    /// Parses `LIST` (`401,403`, `4xx`, `429,5xx`; spaces around items
    /// ignored) or the same prefixed with `status=`. Empty text: the empty
    /// set (no `count_if`).
    pub fn parse(text: &str) -> Result<StatusSet, ResponseError> {
        let bad = || ResponseError::BadCountIf(text.chars().take(80).collect());
        let t = text.trim();
        let list = t.strip_prefix("status=").unwrap_or(t);
        let mut set = StatusSet::default();
        if list.is_empty() {
            return if t.is_empty() { Ok(set) } else { Err(bad()) };
        }
        if list.len() > 4 * MAX_COUNT_IF_LEN {
            return Err(bad());
        }
        for item in list.split(',') {
            let b = item.trim().as_bytes();
            match b {
                [c @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                    let class = u16::from(c - b'0');
                    for code in class * 100..class * 100 + 100 {
                        set.insert(code);
                    }
                }
                [a, b, c] if b.is_ascii_digit() && c.is_ascii_digit() && a.is_ascii_digit() => {
                    let code =
                        u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0');
                    if !(100..=599).contains(&code) {
                        return Err(bad());
                    }
                    set.insert(code);
                }
                _ => return Err(bad()),
            }
        }
        Ok(set)
    }
}

/// Canonical form: classes first where complete (`4xx`), then codes, in
/// ascending order, comma separated, without `status=`.
impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            if !std::mem::take(&mut first) {
                f.write_str(",")?;
            }
            Ok::<(), fmt::Error>(())
        };
        for class in 1..=5u16 {
            if self.has_class(class) {
                sep(f)?;
                write!(f, "{class}xx")?;
            } else {
                for code in class * 100..class * 100 + 100 {
                    if self.contains(code) {
                        sep(f)?;
                        write!(f, "{code}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A strategy's response and cost options (all empty: a plain strategy).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Response {
    /// Statuses that count (empty: every request counts when admitted).
    pub count_if: StatusSet,
    /// Dimension whose value is the request's cost up front ("": 1).
    pub cost_from: String,
    /// Dimension read when the request ends for its final cost ("": none).
    pub cost_after: String,
}

impl Response {
    /// No option set: the request path never looks further.
    pub fn is_plain(&self) -> bool {
        self.count_if.is_empty() && self.cost_from.is_empty() && self.cost_after.is_empty()
    }

    /// Is anything charged or given back when the request ends?
    pub fn deferred(&self) -> bool {
        !self.count_if.is_empty() || !self.cost_after.is_empty()
    }

    /// The model's rules for these fields on a strategy of `algorithm`.
    pub fn check(&self, algorithm: Algorithm, allow: bool) -> Result<(), ResponseError> {
        for (field, name) in [
            ("cost_from", &self.cost_from),
            ("cost_after", &self.cost_after),
        ] {
            if !name.is_empty() && !super::valid_dimension_name(name) {
                return Err(ResponseError::BadDimension {
                    field,
                    name: name.chars().take(40).collect(),
                });
            }
        }
        let fields = [
            ("count_if", !self.count_if.is_empty()),
            ("cost_from", !self.cost_from.is_empty()),
            ("cost_after", !self.cost_after.is_empty()),
        ];
        for (field, set) in fields {
            if !set {
                continue;
            }
            if matches!(algorithm, Algorithm::Concurrency | Algorithm::WarmUp) {
                return Err(ResponseError::Algorithm { field, algorithm });
            }
            if allow {
                return Err(ResponseError::Allow { field });
            }
        }
        // Every record of a table is checked when a worker loads it: the
        // canonical text is only written out for a strategy that has a
        // list (formatting an empty set walked all 500 codes per record).
        if !self.count_if.is_empty() {
            let text = self.count_if.to_string();
            if text.len() > MAX_COUNT_IF_LEN {
                return Err(ResponseError::BadCountIf(text.chars().take(80).collect()));
            }
        }
        Ok(())
    }
}

/// A cost read from a dimension value: `Some(1 ..= MAX_COST)` for a
/// decimal integer in range (surrounding spaces ignored), `None` otherwise
/// (the caller uses 1 and logs).
#[inline]
pub fn parse_cost(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 7 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b - b'0');
    }
    (1..=MAX_COST).contains(&n).then_some(n)
}

/// What a request owes when it ends, on one strategy it was admitted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owed {
    /// Units charged up front (0 with `count_if`: only checked then).
    pub charged: u64,
    /// The request's cost up front (`cost_from`, else 1): what a matching
    /// status charges when `cost_after` gives no final cost.
    pub units: u64,
    /// Statuses that count (empty: all).
    pub count_if: StatusSet,
    /// `cost_after` is set: read the final cost.
    pub after: bool,
}

impl Owed {
    /// The units to add (positive) or give back (negative) when the
    /// request ends with `status` and final cost `after_cost` (`None`:
    /// absent or invalid, keep what was charged).
    ///
    /// With `count_if` nothing was charged up front: a status in the list
    /// charges the cost (`cost_after`'s, else `units`), unconditionally;
    /// any other status charges nothing.
    pub fn delta(&self, status: u16, after_cost: Option<u64>) -> i64 {
        let charged = self.charged.min(MAX_COST) as i64;
        if !self.count_if.is_empty() && !self.count_if.contains(status) {
            return -charged;
        }
        let cost = match (self.after, after_cost) {
            (true, Some(c)) => c,
            _ => self.units,
        };
        cost.min(MAX_COST) as i64 - charged
    }
}

/// What settling did (per-strategy counters and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Units charged after the response (sum of positive deltas).
    pub charged_after: u64,
    /// Units given back (sum of negative deltas).
    pub given_back: u64,
    /// Requests not counted: `count_if` set and the status not in it.
    pub not_counted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_parse_to_codes_and_classes() {
        let s = StatusSet::parse("status=401,403").unwrap();
        assert!(s.contains(401) && s.contains(403));
        assert!(!s.contains(402) && !s.contains(200));
        assert_eq!(s.to_string(), "401,403");
        let s = StatusSet::parse("4xx").unwrap();
        assert!((400..500).all(|c| s.contains(c)));
        assert!(!s.contains(399) && !s.contains(500));
        assert_eq!(s.to_string(), "4xx");
        let s = StatusSet::parse(" 5XX , 429 ").unwrap();
        assert_eq!(s.to_string(), "429,5xx");
        assert!(s.contains(599) && s.contains(429) && !s.contains(428));
        assert!(StatusSet::parse("").unwrap().is_empty());
        // The canonical text parses to the same set.
        for t in [
            "401,403",
            "4xx",
            "429,5xx",
            "100,599",
            "1xx,2xx,3xx,4xx,5xx",
        ] {
            let s = StatusSet::parse(t).unwrap();
            assert_eq!(StatusSet::parse(&s.to_string()).unwrap(), s, "{t}");
        }
    }

    #[test]
    fn status_lists_refuse_what_is_not_a_code_or_class() {
        for bad in [
            "status=",
            "401,",
            ",401",
            "099",
            "600",
            "6xx",
            "0xx",
            "40",
            "4011",
            "4x",
            "abc",
            "401;403",
            "status=4xx,",
            "-401",
            "x401",
            "status =401",
        ] {
            let e = StatusSet::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("count_if:"), "{bad}: {e}");
        }
        assert!(StatusSet::parse(&"401,".repeat(1000)).is_err());
    }

    #[test]
    fn costs_are_decimal_integers_in_range() {
        assert_eq!(parse_cost(b"4"), Some(4));
        assert_eq!(parse_cost(b" 1000000 "), Some(MAX_COST));
        for bad in [
            &b""[..],
            b"0",
            b"1000001",
            b"-1",
            b"1.5",
            b"4x",
            b"99999999",
            b" ",
        ] {
            assert_eq!(parse_cost(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn concurrency_warm_up_and_allow_refuse_the_options() {
        let r = Response {
            count_if: StatusSet::parse("401").unwrap(),
            ..Default::default()
        };
        assert!(r.check(Algorithm::FixedWindow, false).is_ok());
        assert!(r.check(Algorithm::TokenBucket, false).is_ok());
        let e = r.check(Algorithm::Concurrency, false).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("count_if: not available for concurrency"));
        assert!(r.check(Algorithm::WarmUp, false).is_err());
        assert!(r.check(Algorithm::FixedWindow, true).is_err());
        let r = Response {
            cost_after: "Bad".into(),
            ..Default::default()
        };
        let e = r.check(Algorithm::FixedWindow, false).unwrap_err();
        assert!(e.to_string().starts_with("cost_after:"), "{e}");
    }

    #[test]
    fn the_owed_delta_follows_status_and_final_cost() {
        let count_if = StatusSet::parse("401").unwrap();
        // count_if: checked up front, charged only when the status counts.
        let o = Owed {
            charged: 0,
            units: 1,
            count_if,
            after: false,
        };
        assert_eq!(o.delta(401, None), 1);
        assert_eq!(o.delta(200, None), 0);
        let o = Owed {
            charged: 4,
            units: 4,
            count_if: StatusSet::default(),
            after: true,
        };
        assert_eq!(o.delta(200, Some(6)), 2);
        assert_eq!(o.delta(200, Some(1)), -3);
        assert_eq!(o.delta(500, None), 0);
        let o = Owed {
            charged: 0,
            count_if,
            ..o
        };
        assert_eq!(o.delta(200, Some(6)), 0);
        assert_eq!(o.delta(401, Some(6)), 6);
        assert_eq!(o.delta(401, None), 4);
    }
}
