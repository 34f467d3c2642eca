//! Validation of a strategy: every field checked, `ValidStrategy` the
//! proof of it.

use super::*;

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
            tz: String::new(),
            ban: None,
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
                    if let Err(reason) = crate::core::pattern::parse_template(value) {
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
        super::calendar::check(self.algorithm, self.per, &self.tz)?;
        self.response
            .check(self.algorithm, self.action == Action::Allow)?;
        if self.action == Action::Allow && self.each.is_keyed() {
            // An allowed request passes before any key is looked up.
            return Err(super::each::EachError::Allow.into());
        }
        if let Some(b) = &self.ban {
            if self.action == Action::Allow {
                return Err(super::ban::BanError::Allow.into());
            }
            b.check(&self.each.dims)?;
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
