//! A strategy compiled into its limiters, the shared slot's ([`Limiter`])
//! and the per-key one ([`KeyLimiter`]), from the same parameters: the one
//! file of `limiter/` and `keys/state.rs` that names the model (the model
//! sits above the limiters; they know nothing of strategies but their
//! parameters). Nothing names this file: it only adds `from_strategy`.

use super::gcra::Gcra;
use super::sliding_window::MAX_SLIDING_COUNT;
use super::warm_up::WarmUpParams;
use super::{Limiter, Params};
use crate::core::calendar::{self, CalRef};
use crate::core::keys::KeyLimiter;
use crate::core::model::{Algorithm, Strategy, MAX_WINDOW_COUNT};

impl Limiter {
    /// Compiles a strategy. Meant for validated strategies; for any other
    /// input it still never panics and errs on the side of rejecting
    /// (e.g. rate 0 admits nothing).
    pub fn from_strategy(s: &Strategy) -> Limiter {
        let (period, limit) = window_params(s);
        let params = match s.algorithm {
            Algorithm::TokenBucket => Params::TokenBucket(gcra_of(s)),
            Algorithm::LeakyBucket => Params::LeakyBucket(gcra_of(s)),
            Algorithm::FixedWindow => match calendar_of(s) {
                Some(cal) => Params::Calendar { limit, cal },
                None => Params::Fixed { period, limit },
            },
            Algorithm::SlidingWindow => Params::Sliding { period, limit },
            Algorithm::Concurrency => Params::Concurrency { limit },
            Algorithm::WarmUp => Params::WarmUp(WarmUpParams::new(
                s.interval_ns(),
                s.warm_up.cold_factor,
                s.warm_up.period_ms,
                s.action.max_delay_ns(),
            )),
        };
        Limiter { params }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self.params {
            Params::TokenBucket(_) => Algorithm::TokenBucket,
            Params::LeakyBucket(_) => Algorithm::LeakyBucket,
            Params::Fixed { .. } | Params::Calendar { .. } => Algorithm::FixedWindow,
            Params::Sliding { .. } => Algorithm::SlidingWindow,
            Params::Concurrency { .. } => Algorithm::Concurrency,
            Params::WarmUp(_) => Algorithm::WarmUp,
        }
    }
}

impl KeyLimiter {
    /// `None` for `warm_up`, which has no per-key form: its state is two
    /// words (the next free time and the stored permits, changed together
    /// by one 16-byte compare-and-swap), and a key's entry has one word
    /// beside its identity, which the table's 16-byte compare-and-swap
    /// already spends. Packing both into 64 bits would cut `next_free`
    /// (monotonic ns) to too few bits to outlast an uptime; a second word
    /// per entry would double the table for one algorithm. The model
    /// refuses `each` with `warm_up` for this reason.
    pub fn from_strategy(s: &Strategy) -> Option<KeyLimiter> {
        let (period, limit) = window_params(s);
        Some(match s.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => KeyLimiter::Gcra(gcra_of(s)),
            Algorithm::FixedWindow => match calendar_of(s) {
                Some(cal) => KeyLimiter::Calendar { limit, cal },
                None => KeyLimiter::Fixed { period, limit },
            },
            Algorithm::SlidingWindow => KeyLimiter::Sliding {
                period,
                limit: limit.min(MAX_SLIDING_COUNT),
            },
            Algorithm::Concurrency => KeyLimiter::Concurrency { limit },
            Algorithm::WarmUp => return None,
        })
    }
}

/// The calendar of a `fixed_window` counted in calendar windows (issue
/// 33), its window starts listed from now (the table build: never on the
/// request path). A zone the host cannot resolve (checked when the
/// strategy was validated, so only if the database changed since) counts
/// in the UTC calendar of the same unit.
fn calendar_of(s: &Strategy) -> Option<CalRef> {
    if !calendar::is_calendar(s.per, &s.tz) {
        return None;
    }
    let now = crate::core::clock::unix_ns();
    calendar::intern(s.per, &s.tz, now)
        .or_else(|_| calendar::intern(s.per, "", now))
        .ok()
}

/// The GCRA parameters of a `token_bucket` or `leaky_bucket` strategy
/// (leaky: burst 1), for the shared and the per-key limiter alike.
fn gcra_of(s: &Strategy) -> Gcra {
    let burst = if s.algorithm == Algorithm::LeakyBucket {
        1
    } else {
        s.burst as u64
    };
    Gcra::new(s.interval_ns(), burst, s.action.max_delay_ns())
}

/// A window's period (ns, at least 1) and its count limit (also
/// `concurrency`'s in-flight limit), for the shared and the per-key
/// limiter alike (a per-key sliding window caps it lower, see
/// `sliding_window::MAX_SLIDING_COUNT`).
fn window_params(s: &Strategy) -> (u64, u64) {
    (s.per.period_ns().max(1), s.rate.min(MAX_WINDOW_COUNT))
}
