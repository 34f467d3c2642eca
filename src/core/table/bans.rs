//! The penalty box on the request path (issue 32): the check of the ban
//! table with the blacklist, before any strategy, and the count of a
//! rejection by a strategy with `ban_after` (see [`crate::core::bans`]).

use smallvec::SmallVec;

use super::{IpKey, Request, RequestOutcome, Table, Values};
use crate::core::admit::{Decision, Verdict};
use crate::core::bans::{self, Counted, Kind};
use crate::core::keys::IpPrefix;
use crate::core::shm::Mapping;

/// How a request's key of one ban dimension is read: table dimension
/// `dim`, and for `ip` the strategy's prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    kind: Kind,
    dim: usize,
    v4: u8,
    v6: u8,
}

/// The table's penalty boxes: the distinct keys to check, and the
/// strategies (id, index, key plan) that count rejections.
#[derive(Debug, Clone, Default)]
pub struct Bans {
    plans: SmallVec<[Plan; 1]>,
    counting: Vec<(u32, u32, Plan)>,
}

/// What a request's rejection did to its key's count (for the worker's
/// log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanEvent {
    pub strategy_id: u32,
    pub counted: Counted,
}

impl Bans {
    /// From the compiled strategies (enabled, per-key on `ip` or `userid`,
    /// with `ban_after`).
    pub(super) fn of(strategies: &[super::Compiled]) -> Bans {
        let mut b = Bans::default();
        for (si, c) in strategies.iter().enumerate() {
            let Some(p) = Plan::of(c).filter(|_| c.strategy.enabled) else {
                continue;
            };
            if !b.plans.contains(&p) {
                b.plans.push(p);
            }
            b.counting.push((c.strategy.id, si as u32, p));
        }
        b
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

impl Plan {
    /// The key plan of a strategy with a penalty box (`each` one `ip` or
    /// `userid` dimension, as the model requires of one).
    fn of(c: &super::Compiled) -> Option<Plan> {
        c.strategy.ban.as_ref()?;
        let plan = c.key.as_ref()?;
        let [(dim, is_ip)] = plan.dims[..] else {
            return None;
        };
        Some(Plan {
            kind: if is_ip { Kind::Ip } else { Kind::UserId },
            dim,
            v4: plan.ipv4_prefix,
            v6: plan.ipv6_prefix,
        })
    }

    /// The request's key bytes for this plan, handed to `f` (`None`: an
    /// empty value or no client address).
    fn with_key<V: Values + ?Sized, T>(
        &self,
        r: &Request<'_, V>,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Option<T> {
        match self.kind {
            Kind::Ip => {
                let ip = match r.ip {
                    Some(ip) => ip,
                    None => r.values.value(self.dim).and_then(IpKey::parse)?,
                };
                let (b, n) = IpPrefix::new(ip.addr(), self.v4, self.v6).bytes();
                Some(f(&b[..n]))
            }
            Kind::UserId => r.values.value(self.dim).filter(|v| !v.is_empty()).map(f),
        }
    }
}

impl Table {
    /// Some strategy of this table has a penalty box.
    #[inline(always)]
    pub fn has_bans(&self) -> bool {
        self.has_bans
    }

    /// The ban table's verdict: the request's key is banned on this host.
    /// One load while nobody is banned.
    #[cold]
    pub(super) fn banned<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
    ) -> Option<RequestOutcome<()>> {
        let map: &Mapping = self.map.as_ref()?;
        let bt = map.bans();
        if !bt.any_banned() {
            return None;
        }
        for p in &self.bans.plans {
            let hit = p.with_key(r, |key| {
                let id = bans::ident(map.keys().hasher(0), p.kind, key);
                bt.is_banned(id, p.kind, key, r.now_unix_ms)
            });
            if hit == Some(true) {
                return Some(RequestOutcome::Blacklisted {
                    dimension_index: (p.kind == Kind::UserId).then_some(p.dim),
                });
            }
        }
        None
    }

    /// Counts the rejection `d` (or the dry run's) if its strategy has a
    /// penalty box; bans the key once it reaches `ban_after`.
    /// [`decide_in`](Self::decide_in) calls it after a per-key decision
    /// when [`has_bans`](Self::has_bans) (the event in `Scratch::ban`).
    #[cold]
    #[inline(never)]
    pub(crate) fn count_ban<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        d: &Decision,
    ) -> Option<BanEvent> {
        let (id, dry) = match d.verdict {
            Verdict::Reject { id, .. } => (id, false),
            _ => (d.dry_run_rejected?, true),
        };
        let &(_, si, p) = self.bans.counting.iter().find(|(i, ..)| *i == id)?;
        let c = &self.strategies[si as usize];
        let ban = c.strategy.ban.as_ref()?;
        let map: &Mapping = self.map.as_ref()?;
        let dry = dry || r.dry_run || c.strategy.action.is_dry_run();
        let counted = p.with_key(r, |key| {
            let ident = bans::ident(map.keys().hasher(0), p.kind, key);
            map.bans()
                .count(ident, p.kind, key, id, ban, dry, r.now_unix_ms)
        })?;
        Some(BanEvent {
            strategy_id: id,
            counted,
        })
    }
}
