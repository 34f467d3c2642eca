//! Charging a key: the request path's look and compare-and-swap
//! ([`KeyTable::charge_found`], [`KeyTable::charge_at`]: the per-key twin
//! of the shared slot's loop in `src/core/limiter/mod.rs`, around the same
//! steps, through [`KeyLimiter`]), the slow path of a new key or a race,
//! and the word's later changes (refund, release, the charge after the
//! response, the ledger's give-back). Where a key's entry is and which
//! entry a new key claims is [`super::probe`]'s.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::limiter::Now;
use super::super::shm::region::Region;
use super::super::shm::slot::Slot;
use super::{
    ident_generation, ident_slot, Charge, KeyId, KeyLimiter, KeyRef, KeyTable, Step, C_CAPPED,
    NO_CAP,
};

impl<'a> KeyTable<'a> {
    /// Charges one request of key `key` with `lim` at `now`, with no cap
    /// on the strategy's entries (tools, tests; the request path uses
    /// [`charge_capped`](Self::charge_capped)). `force`: a
    /// dry-run `concurrency` hit takes a unit even over the limit.
    /// `owner(slot)` gives the limiter of the strategy now in a stat slot
    /// (to judge whether another strategy's entry is fresh), `slots` the
    /// file's stat slots (their generations say whether an entry's
    /// strategy still exists).
    #[inline(always)]
    pub fn charge<'l>(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        now: Now,
        force: bool,
        slots: &Region<'_>,
        owner: impl Fn(u32) -> Option<&'l KeyLimiter>,
    ) -> Charge {
        self.charge_capped(key, lim, NO_CAP, now, force, 1, slots, owner)
    }

    /// [`charge`](Self::charge) of `n` units (`cost_from`, issue 31; see
    /// [`KeyLimiter::step_units`]) for a strategy whose `max_keys` is
    /// `max_keys` (0: [`default_cap`](Self::default_cap)): a new key of a
    /// strategy whose keys hold that many entries gets none
    /// ([`Charge::Full`]) unless it can reuse a fresh entry of its own.
    /// The common case inline (the key's entry is there and one CAS
    /// charges it); anything else (a new key, a race) takes the loop.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn charge_capped<'l>(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        max_keys: u32,
        now: Now,
        force: bool,
        n: u64,
        slots: &Region<'_>,
        owner: impl Fn(u32) -> Option<&'l KeyLimiter>,
    ) -> Charge {
        if let Some(c) = self.charge_found_n(key, lim, now, force, n) {
            return c;
        }
        if !self.usable() {
            return Charge::Full;
        }
        let t = lim.clock(now);
        self.charge_slow(key, lim, max_keys, now, t, force, slots, owner, n)
    }

    /// [`charge`](Self::charge) of a key whose entry is in the table:
    /// `None`, nothing charged, when it is not (a new key: the caller takes
    /// [`charge`](Self::charge)) or when the entry moved on under us. No
    /// call in it, so the request path that uses it keeps its registers.
    #[inline(always)]
    pub(crate) fn charge_found(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        now: Now,
        force: bool,
    ) -> Option<Charge> {
        self.charge_found_n(key, lim, now, force, 1)
    }

    /// [`charge_found`](Self::charge_found) of `n` units.
    #[inline(always)]
    fn charge_found_n(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        now: Now,
        force: bool,
        n: u64,
    ) -> Option<Charge> {
        if !self.usable() {
            return None;
        }
        let (i, e) = self.find(key)?;
        let st = e[1].load(Ordering::Acquire);
        self.charge_at(i, e, key.ident, st, lim, lim.clock(now), force, n)
    }

    /// [`charge`](Self::charge) for a new key or after a race.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn charge_slow<'l>(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        max_keys: u32,
        now: Now,
        t: u64,
        force: bool,
        slots: &Region<'_>,
        owner: impl Fn(u32) -> Option<&'l KeyLimiter>,
        n: u64,
    ) -> Charge {
        // Bounded: each round either commits or saw another process commit.
        for _ in 0..64 {
            // The key's entry: idents only (the common case, one pass).
            if let Some((i, e)) = self.find_any(key) {
                let st = e[1].load(Ordering::Acquire);
                match self.charge_at(i, e, key.ident, st, lim, t, force, n) {
                    Some(c) => return c,
                    None => continue, // the entry moved on: look again
                }
            }
            // A new key: an entry of its windows (see new_entry).
            let (p, old_ident, old_st) = match self.new_entry(key, max_keys, now, slots, &owner) {
                Ok(c) => c,
                Err(capped) => {
                    if capped {
                        self.bump(key.slot(), C_CAPPED);
                    }
                    return Charge::Full;
                }
            };
            let next = match lim.step_units(0, t, n) {
                Step::Admit { next, wait_ns } => (next, wait_ns, false),
                Step::Reject { retry_after_ns } => match force.then(|| lim.force(0)).flatten() {
                    Some(n) => (n, 0, true),
                    None => return Charge::Rejected { retry_after_ns },
                },
            };
            let i = self.at(key, p);
            if self
                .cas(i, [old_ident, old_st], [key.ident, next.0])
                .is_err()
            {
                continue;
            }
            self.claimed(key, old_ident, p);
            if let Some((j, st)) = self.earlier_copy(key, i, p) {
                if self.cas(i, [key.ident, next.0], [0, 0]).is_ok() {
                    self.drop_in_use(key.slot());
                }
                let e = self.words(j);
                if let Some(c) = self.charge_at(j, e, key.ident, st, lim, t, force, n) {
                    return c;
                }
            }
            return Charge::Admitted {
                at: KeyRef {
                    entry: i,
                    ident: key.ident,
                },
                wait_ns: next.1,
                forced: next.2,
                token: next.0,
                prev: 0,
            };
        }
        Charge::Full
    }

    /// One request on the key's entry `i`, whose words are `e` (last seen
    /// holding `st`); `None` when the entry no longer holds the key.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn charge_at(
        &self,
        i: u64,
        e: &[AtomicU64; 2],
        ident: u64,
        mut st: u64,
        lim: &KeyLimiter,
        t: u64,
        force: bool,
        n: u64,
    ) -> Option<Charge> {
        loop {
            let (next, wait_ns, forced) = match lim.step_units(st, t, n) {
                Step::Admit { next, wait_ns } => (next, wait_ns, false),
                Step::Reject { retry_after_ns } => {
                    let forced = if force { lim.force(st) } else { None };
                    match forced {
                        Some(n) => (n, 0, true),
                        None => {
                            // A rejection writes nothing: check that the
                            // word read was this key's.
                            if e[0].load(Ordering::Acquire) != ident {
                                return None;
                            }
                            return Some(Charge::Rejected { retry_after_ns });
                        }
                    }
                }
            };
            match super::super::limiter::warm_up::cas128(&e[0], [ident, st], [ident, next]) {
                Ok(()) => {
                    return Some(Charge::Admitted {
                        at: KeyRef { entry: i, ident },
                        wait_ns,
                        forced,
                        token: next,
                        prev: st,
                    })
                }
                Err([cur_ident, cur]) => {
                    if cur_ident != ident {
                        return None;
                    }
                    st = cur;
                }
            }
        }
    }

    /// Applies `f` to the key's word while the entry still holds the key.
    pub(super) fn update(&self, at: KeyRef, f: impl Fn(u64) -> Option<u64>) {
        if !self.usable() || at.entry >= self.capacity {
            return;
        }
        let (mut ident, mut st) = self.load(at.entry);
        for _ in 0..1024 {
            if ident != at.ident {
                return; // reclaimed: nothing of ours is left in it
            }
            let Some(next) = f(st) else { return };
            match self.cas(at.entry, [ident, st], [ident, next]) {
                Ok(()) => return,
                Err([i, s]) => (ident, st) = (i, s),
            }
        }
    }

    /// Gives back an admission (a later strategy rejected the request).
    pub fn refund(&self, at: KeyRef, lim: &KeyLimiter, token: u64, prev: u64) {
        self.update(at, |cur| lim.refund(cur, token, prev));
    }

    /// [`refund`](Self::refund) of an admission of `n` units.
    pub fn refund_units(&self, at: KeyRef, lim: &KeyLimiter, token: u64, prev: u64, n: u64) {
        self.update(at, |cur| lim.refund_units(cur, token, prev, n));
    }

    /// The charge after the response (issue 31): see
    /// [`KeyLimiter::charge_after`].
    pub fn charge_after(&self, at: KeyRef, lim: &KeyLimiter, now: u64, admitted: u64, delta: i64) {
        self.update(at, |cur| lim.charge_after(cur, now, admitted, delta));
    }

    /// Would `n` units of key `key` be admitted now? (`count_if`, issue
    /// 31: checked at admission, charged when the request ends.) The
    /// limiter's step on the key's word, nothing written; a key with no
    /// entry is checked as a fresh one (no entry is claimed for a check).
    /// `Admitted` carries the word the step would write as its `token`.
    pub fn check_units(&self, key: &KeyId, lim: &KeyLimiter, now: Now, n: u64) -> Charge {
        if !self.usable() {
            return Charge::Full;
        }
        let (entry, st) = match self.find(key) {
            Some((i, e)) => {
                let st = e[1].load(Ordering::Acquire);
                // Moved on under us: the key has no entry now.
                if e[0].load(Ordering::Acquire) == key.ident {
                    (i, st)
                } else {
                    (u64::MAX, 0)
                }
            }
            None => (u64::MAX, 0),
        };
        match lim.step_units(st, lim.clock(now), n) {
            Step::Admit { next, wait_ns } => Charge::Admitted {
                at: KeyRef {
                    entry,
                    ident: key.ident,
                },
                wait_ns,
                forced: false,
                token: next,
                prev: st,
            },
            Step::Reject { retry_after_ns } => Charge::Rejected { retry_after_ns },
        }
    }

    /// The charge after the response of a key that was only checked
    /// (`count_if`): [`KeyLimiter::charge_after`] on its entry, or on an
    /// entry claimed for it (empty, freed, or its own strategy's stale
    /// one: a request ending may outlive its table, so other strategies'
    /// entries are kept). `false`: no entry could be had (the charge is
    /// lost, as a full table's).
    #[allow(clippy::too_many_arguments)]
    pub fn charge_after_key(
        &self,
        key: &KeyId,
        lim: &KeyLimiter,
        max_keys: u32,
        now: Now,
        admitted: u64,
        delta: i64,
        slots: &Region<'_>,
    ) -> bool {
        if !self.usable() {
            return false;
        }
        let own = key.slot();
        let owner = |s: u32| (s == own).then_some(lim);
        let t = lim.clock(now);
        let charge = |cur| lim.charge_after(cur, t, admitted, delta);
        for _ in 0..64 {
            if let Some((i, _)) = self.find_any(key) {
                self.update(
                    KeyRef {
                        entry: i,
                        ident: key.ident,
                    },
                    charge,
                );
                return true;
            }
            // A new key: as charge_slow places one (new_entry).
            let (p, old_ident, old_st) = match self.new_entry(key, max_keys, now, slots, &owner) {
                Ok(c) => c,
                Err(capped) => {
                    if capped {
                        self.bump(key.slot(), C_CAPPED);
                    }
                    return false;
                }
            };
            let Some(next) = charge(0) else {
                return true;
            };
            let i = self.at(key, p);
            if self.cas(i, [old_ident, old_st], [key.ident, next]).is_err() {
                continue;
            }
            self.claimed(key, old_ident, p);
            if let Some((j, _)) = self.earlier_copy(key, i, p) {
                if self.cas(i, [key.ident, next], [0, 0]).is_ok() {
                    self.drop_in_use(key.slot());
                    self.update(
                        KeyRef {
                            entry: j,
                            ident: key.ident,
                        },
                        charge,
                    );
                }
            }
            return true;
        }
        false
    }

    /// `concurrency`: the request ended.
    pub fn release(&self, at: KeyRef, lim: &KeyLimiter) {
        self.update(at, |cur| lim.release(cur));
    }

    /// Ledger reclaim: gives back `n` `concurrency` units that a process
    /// which died held on the key at `at`, while the entry still holds that
    /// key and the key's strategy still has its stat slot (same generation);
    /// never below 0. Returns the units given back.
    pub fn give_back(&self, at: KeyRef, n: u64, slots: &Region<'_>) -> u64 {
        if !self.usable() || at.entry >= self.capacity {
            return 0;
        }
        let current = ident_slot(at.ident)
            .and_then(|s| Slot::at(slots, s))
            .is_some_and(|s| {
                s.generation().load(Ordering::Acquire) & 0xFFF == ident_generation(at.ident)
            });
        if !current {
            return 0; // the strategy is gone: its keys are free anyway
        }
        let (mut ident, mut st) = self.load(at.entry);
        for _ in 0..1024 {
            if ident != at.ident || st == 0 {
                return 0; // another key now, or nothing in flight
            }
            let k = n.min(st);
            match self.cas(at.entry, [ident, st], [ident, st - k]) {
                Ok(()) => return k,
                Err([i, s]) => (ident, st) = (i, s),
            }
        }
        0
    }
}
