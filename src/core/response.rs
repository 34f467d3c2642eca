//! Limits that look at the response and at cost (issue 31): a strategy's
//! `count_if`, `cost_from` and `cost_after` (the options, their validation and the
//! arithmetic of [`Owed`] are in `model/response.rs`), and the charge a
//! request still owes when it ends (the LOG phase).
//!
//! * `count_if status=LIST` (LIST: codes `401` and classes `4xx`, comma
//!   separated): at PREACCESS the limiter is only checked — would the
//!   request's units be admitted now? — nothing written (a client over
//!   the limit is refused, headers as usual). When the request ends it is
//!   charged, unconditionally, if its final status is in LIST; otherwise
//!   nothing. Requests in flight hold nothing, so those that pass the
//!   check before any of them is charged all go through: the documented
//!   overshoot, at most the number in flight per worker.
//! * `cost_from DIM`: the request costs the integer value of dimension DIM
//!   (1 … [`MAX_COST`]); absent → 1; invalid (not a decimal integer in
//!   range) → 1. A request whose cost exceeds what is left is refused
//!   whole (nothing is charged).
//! * `cost_after DIM`: DIM is read when the request ends (e.g.
//!   `$upstream_http_x_cost`); the request was charged 1 (or its
//!   `cost_from`) up front and is charged the difference then, even past
//!   the limit: a bucket goes into debt (later requests wait until it is
//!   paid), a window stays full until it ends. A cost under what was
//!   charged up front gives the rest back. Absent or invalid: no change.
//!
//! `concurrency` and `warm_up` refuse all three (a unit in flight has no
//! cost; the warm-up rate changes with use).

use super::model::response::{Owed, Settled};

/// Where a charge to settle lives: a shared strategy's stat slot (with the
/// generation it was charged at) or a per-key strategy's key entry.
#[derive(Debug, Clone, Copy)]
pub enum OwedTarget {
    Slot {
        slot: u32,
        generation: u64,
        limiter: super::limiter::Limiter,
    },
    Key {
        at: super::keys::KeyRef,
        limiter: super::keys::KeyLimiter,
    },
    /// A per-key strategy's key only checked at admission (`count_if`):
    /// its entry is found, or claimed, when the charge is made.
    KeyId {
        key: super::keys::KeyId,
        limiter: super::keys::KeyLimiter,
        /// The strategy's cap of entries (`max_keys`; 0: the default).
        max_keys: u32,
    },
}

/// One strategy's charge a request settles when it ends.
#[derive(Debug, Clone, Copy)]
pub struct OwedCharge {
    pub target: OwedTarget,
    pub owed: Owed,
    /// When it was admitted (both clocks).
    pub admitted: super::clock::Now,
    /// The dimension of `cost_after`: the table's index when captured; the
    /// caller may replace it with its own source index.
    pub after_dim: Option<usize>,
    /// The strategy id (for logs).
    pub id: u32,
}

/// What a request settles when it ends, on the mapping that admitted it
/// (a request may outlive many tables).
pub struct Owing {
    pub map: std::sync::Arc<super::shm::Mapping>,
    pub items: smallvec::SmallVec<[OwedCharge; 1]>,
}

impl Owing {
    /// Settles every charge: the request ended with `status`; `cost(i)` is
    /// item `i`'s `cost_after` value (`None`: absent or invalid).
    pub fn settle(
        self,
        status: u16,
        now: super::clock::Now,
        cost: impl Fn(&OwedCharge) -> Option<u64>,
    ) -> Settled {
        let mut out = Settled::default();
        let slots = self.map.slots();
        let keys = self.map.keys();
        for item in &self.items {
            let after = if item.owed.after { cost(item) } else { None };
            let delta = item.owed.delta(status, after);
            let mut one = Settled::default();
            if !item.owed.count_if.is_empty() && !item.owed.count_if.contains(status) {
                one.not_counted = 1;
            }
            if delta > 0 {
                one.charged_after = delta as u64;
            } else {
                one.given_back = delta.unsigned_abs();
            }
            out.charged_after += one.charged_after;
            out.given_back += one.given_back;
            out.not_counted += one.not_counted;
            match item.target {
                OwedTarget::Slot {
                    slot,
                    generation,
                    limiter,
                } => {
                    let Some(s) = super::shm::slot::Slot::at(&slots, slot) else {
                        continue;
                    };
                    if s.generation().load(std::sync::atomic::Ordering::Acquire) != generation {
                        continue; // the strategy is gone
                    }
                    keys.count_settled(slot, &one);
                    if delta == 0 {
                        continue;
                    }
                    limiter.charge_after(
                        &s,
                        now.for_limiter(&limiter),
                        item.admitted.for_limiter(&limiter),
                        delta,
                    );
                }
                OwedTarget::KeyId {
                    key,
                    limiter,
                    max_keys,
                } => {
                    keys.count_settled(key.slot(), &one);
                    if delta == 0 {
                        continue;
                    }
                    keys.charge_after_key(
                        &key,
                        &limiter,
                        max_keys,
                        now,
                        limiter.clock(item.admitted),
                        delta,
                        &slots,
                    );
                }
                OwedTarget::Key { at, limiter } => {
                    if let Some(slot) = at.slot() {
                        keys.count_settled(slot, &one);
                    }
                    if delta == 0 {
                        continue;
                    }
                    keys.charge_after(
                        at,
                        &limiter,
                        limiter.clock(now),
                        limiter.clock(item.admitted),
                        delta,
                    );
                }
            }
        }
        out
    }
}
