//! This host's share of cluster-scope rates.
//!
//! A `cluster` strategy's rate is for the whole fleet. Each host enforces
//! `ceil(rate × weight / Σ weights of fresh hosts)`, at least 1 — a host
//! never gets 0 for a positive rate. Rounding up means the fleet together
//! may admit up to one request per period per host more than the rate, never
//! less: with weights 1, 1, 2 and 400/s the shares are exactly 100, 100, 200;
//! with three equal hosts and 100/s each host gets 34/s (102 in all). The
//! token-bucket burst is split the same way (at least 1). A host is fresh
//! when its last heartbeat is at most the freshness window old; this host
//! always counts itself. `host` strategies apply as written.

use rate_ctl::core::model::{Algorithm, ValidStrategy};

use crate::store::record::{HostRecord, Scope, StrategyRecord};
use crate::store::valid::Valid;
use crate::store::Invalid;

/// This host's weight and the fleet's total (including this host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub weight: u64,
    pub total: u64,
}

impl Share {
    /// `ceil(v × weight / total)`, at least 1 when `v > 0`.
    pub fn of(&self, v: u64) -> u64 {
        if v == 0 || self.total == 0 {
            return v;
        }
        let x = (v as u128 * self.weight as u128).div_ceil(self.total as u128);
        (x.max(1)).min(v as u128) as u64
    }
}

/// This host's share: its own weight over the sum of the weights of itself
/// and every other host whose heartbeat is at most `freshness_ms` old.
pub fn share(
    hosts: &[HostRecord],
    me: &str,
    my_weight: u32,
    now_ms: u64,
    freshness_ms: u64,
) -> Share {
    let mut total = my_weight as u64;
    for h in hosts {
        if h.host_id == me || h.weight == 0 {
            continue;
        }
        let fresh = h
            .last_heartbeat_ms
            .is_some_and(|hb| hb.saturating_add(freshness_ms) >= now_ms);
        if fresh {
            total += h.weight as u64;
        }
    }
    Share {
        weight: my_weight as u64,
        total: total.max(1),
    }
}

/// The strategy this host publishes for `rec`: rates local. `rec` was
/// validated once, where it was read (its proof is [`Valid`]); the writer
/// takes this function's proof and does not check again. Only what this
/// derivation can break is checked here:
/// - a share of a cluster rate has a new rate and burst: the model's rules
///   on them ([`Strategy::check`](rate_ctl::core::model::Strategy::check)),
///   as rounding up can push burst × interval past the clock's bound (the
///   clock tick itself survives a share: `rate ≤ K·burst` implies
///   `ceil(rate·w/t) ≤ K·ceil(burst·w/t)`);
/// - the clock tick, for every strategy: a dry run is validated with the
///   delay it goes back to, but published without it.
///
/// `lease`: this host's valid lease for a `split: demand` strategy
/// (src/fleet/lease.rs), which replaces the static share (the token-bucket
/// burst in proportion, at least 1; a lease of 0 enforces 1, the smallest
/// rate a bucket takes). A window (`fixed_window`, `sliding_window`: the
/// lease is a count of the window's allowance) leased 0 publishes limit 0,
/// admit nothing more in this window: the core's
/// [`ValidStrategy::leased`] is the one constructor that takes a rate of 0,
/// and only this branch calls it; the written input (API, CLI, store)
/// still goes through `Strategy::validate`, which refuses 0.
///
/// `Err` names the field at fault.
pub fn local_strategy(
    rec: &Valid<StrategyRecord>,
    share: Share,
    lease: Option<u64>,
) -> Result<ValidStrategy, Invalid> {
    if let (Scope::Cluster, Some(lease)) = (rec.scope, lease) {
        let least = if rec.algorithm.is_window() { 0 } else { 1 };
        let rate = lease.clamp(least, rec.rate.max(1));
        let burst = if rec.algorithm == Algorithm::TokenBucket && rec.rate > 0 {
            ((rec.burst as u128 * rate as u128).div_ceil(rec.rate as u128)).max(1) as u32
        } else {
            rec.burst
        };
        return Ok(ValidStrategy::leased(rec.to_core(rate, burst)?)?);
    }
    let (rate, burst) = match rec.scope {
        Scope::Host => (rec.rate, rec.burst),
        Scope::Cluster => {
            let burst = if rec.algorithm == Algorithm::TokenBucket {
                share.of(rec.burst as u64) as u32
            } else {
                rec.burst
            };
            (share.of(rec.rate), burst)
        }
    };
    let core = rec.to_core(rate, burst)?;
    if rec.scope == Scope::Cluster {
        core.check()?;
    }
    core.check_clock_tick()?;
    Ok(ValidStrategy::vouched(core))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(id: &str, weight: u32, hb: Option<u64>) -> HostRecord {
        HostRecord {
            host_id: id.into(),
            weight,
            last_heartbeat_ms: hb,
            applied_version: None,
            applied_ms: None,
            publish_error: None,
            publish_error_ms: None,
        }
    }

    #[test]
    fn weights_1_1_2_split_400_exactly() {
        let now = 1_000_000;
        let hosts = vec![
            host("a", 1, Some(now)),
            host("b", 1, Some(now - 5_000)),
            host("c", 2, Some(now - 9_999)),
        ];
        let rates: Vec<u64> = [("a", 1), ("b", 1), ("c", 2)]
            .iter()
            .map(|(me, w)| share(&hosts, me, *w, now, 10_000).of(400))
            .collect();
        assert_eq!(rates, vec![100, 100, 200]);
        // c goes stale: a and b split 400 between them.
        let later = now + 10_500;
        let hosts = vec![
            host("a", 1, Some(later)),
            host("b", 1, Some(later)),
            host("c", 2, Some(now - 9_999)),
        ];
        assert_eq!(share(&hosts, "a", 1, later, 10_000).of(400), 200);
    }

    #[test]
    fn never_zero_and_rounds_up() {
        let s = Share {
            weight: 1,
            total: 3,
        };
        assert_eq!(s.of(100), 34);
        assert_eq!(s.of(1), 1);
        let tiny = Share {
            weight: 1,
            total: 1_000_000,
        };
        assert_eq!(tiny.of(5), 1);
        let whole = Share {
            weight: 1,
            total: 1,
        };
        assert_eq!(whole.of(u64::MAX), u64::MAX);
        assert_eq!(s.of(0), 0);
    }

    #[test]
    fn self_counts_even_without_a_row() {
        assert_eq!(
            share(&[], "me", 3, 0, 10_000),
            Share {
                weight: 3,
                total: 3
            }
        );
    }

    #[test]
    fn host_scope_as_written_cluster_burst_split() {
        let mut r: StrategyRecord = serde_json::from_str(
            r#"{"id":4,"name":"x","algorithm":"token_bucket","rate":400,"burst":20,"scope":"host"}"#,
        )
        .unwrap();
        let half = Share {
            weight: 1,
            total: 2,
        };
        let s = local_strategy(&r.clone().into_valid().unwrap(), half, None).unwrap();
        assert_eq!((s.rate, s.burst), (400, 20));
        r.scope = Scope::Cluster;
        let s = local_strategy(&r.clone().into_valid().unwrap(), half, None).unwrap();
        assert_eq!((s.id, s.rate, s.burst), (4, 200, 10));
        // A lease replaces the share; the burst follows in proportion.
        let s = local_strategy(&r.clone().into_valid().unwrap(), half, Some(300)).unwrap();
        assert_eq!((s.rate, s.burst), (300, 15));
        let s = local_strategy(&r.clone().into_valid().unwrap(), half, Some(0)).unwrap();
        assert_eq!((s.rate, s.burst), (1, 1));
    }

    /// A window leased 0 publishes limit 0 (admit nothing more in this
    /// window), which the reader's check of the file accepts; the written
    /// input still refuses a rate of 0.
    #[test]
    fn window_lease_of_0_is_published_as_0() {
        let r: StrategyRecord = serde_json::from_str(
            r#"{"id":5,"name":"d","algorithm":"fixed_window","rate":100,"per":"day","scope":"cluster"}"#,
        )
        .unwrap();
        let third = Share {
            weight: 1,
            total: 3,
        };
        let v = r.clone().into_valid().unwrap();
        let s = local_strategy(&v, third, Some(0)).unwrap();
        assert_eq!(s.rate, 0);
        assert!(s.check().is_ok(), "the reader takes a leased window of 0");
        assert_eq!(local_strategy(&v, third, None).unwrap().rate, 34);
        let mut zero = r;
        zero.rate = 0;
        let e = zero.into_valid().unwrap_err().to_string();
        assert!(e.starts_with("rate:"), "{e}");
    }

    /// What the record's one validation cannot see is checked here: a
    /// share's new rate and burst (rounding can push burst × interval past
    /// what the clock holds), and a dry run that publishes without the
    /// delay it was validated with (below the clock tick).
    #[test]
    fn derived_strategies_are_checked_where_the_derivation_can_break_them() {
        // 3 per day with the largest burst that fits: a third of it rounds
        // the rate up to 1 per day and the burst up, past the bound.
        let r: StrategyRecord = serde_json::from_str(
            r#"{"id":4,"name":"x","algorithm":"token_bucket","rate":3,"per":"day","burst":160127}"#,
        )
        .unwrap();
        let r = r.into_valid().unwrap();
        let alone = Share {
            weight: 1,
            total: 1,
        };
        assert_eq!(local_strategy(&r, alone, None).unwrap().burst, 160_127);
        let third = Share {
            weight: 1,
            total: 3,
        };
        let e = local_strategy(&r, third, None).unwrap_err().to_string();
        assert!(e.starts_with("burst: 53376 × interval"), "{e}");

        // Host scope, leaky bucket at 2000/s (0.5 ms), dry run keeping a
        // 1 ms delay: it queues like the delay, so the cap counts towards
        // the tick as it did when the input was validated; published with it.
        let r: StrategyRecord = serde_json::from_str(
            r#"{"id":5,"name":"y","algorithm":"leaky_bucket","rate":2000,"scope":"host",
                "action":"dry_run","max_delay_ms":1}"#,
        )
        .unwrap();
        let r = r.into_valid().unwrap();
        let s = local_strategy(&r, alone, None).unwrap();
        use rate_ctl::core::model::Action;
        assert_eq!(s.action, Action::DryRunDelay { max_delay_ms: 1 });
        // Without the cap (a dry run of reject) it is below a tick again.
        let mut r = r.into_inner();
        r.max_delay_ms = None;
        let e = r.into_valid().unwrap_err().to_string();
        assert!(e.contains("clock tick"), "{e}");
    }
}
