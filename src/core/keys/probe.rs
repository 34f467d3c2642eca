//! Where a key's entry is: the request path's look at its first window,
//! the look at all of its windows, the entry a new key claims (empty, or
//! fresh and reusable), and the bookkeeping of a claim. Charging the entry
//! is [`super::charge`]'s.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::limiter::Now;
use super::super::shm::region::Region;
use super::super::shm::slot::Slot;
use super::{
    ident_generation, ident_slot, KeyId, KeyLimiter, KeyTable, C_IN_USE, C_RECLAIMS, PROBE,
    T_CLAIMS, T_MAX_PROBE, T_OCCUPIED, WINDOW,
};

impl<'a> KeyTable<'a> {
    /// The request path's look: the key's first window only, when it does
    /// not wrap (one bounds check and a scan, no call, as most keys are
    /// there); `None` sends the caller to the slow path, which looks at
    /// every window ([`find_any`](Self::find_any)).
    #[inline(always)]
    pub(super) fn find(&self, key: &KeyId) -> Option<(u64, &'a [AtomicU64; 2])> {
        let s = key.start as usize;
        self.pairs
            .get(s..s.wrapping_add(WINDOW as usize))?
            .iter()
            .enumerate()
            .find(|(_, e)| e[0].load(Ordering::Acquire) == key.ident)
            .map(|(p, e)| (key.start + p as u64, e))
    }

    /// The key's entry in any of its windows (the first copy, in order).
    pub(super) fn find_any(&self, key: &KeyId) -> Option<(u64, &'a [AtomicU64; 2])> {
        (0..PROBE)
            .map(|p| self.at(key, p))
            .find(|&i| self.entry(i).load(Ordering::Acquire) == key.ident)
            .map(|i| (i, self.words(i)))
    }

    /// A new key's entry: the first of its windows' entries that is
    /// empty or reusable, the windows in their order of preference. A key
    /// of a strategy at its cap (`max_keys`) may only take over a fresh
    /// entry of its own strategy (same slot and generation: its count of
    /// entries stays the same). `(position, ident, state)` of the entry,
    /// or `Err(capped)` when there is none.
    pub(super) fn new_entry<'l>(
        &self,
        key: &KeyId,
        max_keys: u32,
        now: Now,
        slots: &Region<'_>,
        owner: &impl Fn(u32) -> Option<&'l KeyLimiter>,
    ) -> Result<(u64, u64, u64), bool> {
        let capped = self
            .counter(key.slot(), C_IN_USE)
            .is_some_and(|c| c.load(Ordering::Relaxed) >= self.cap(max_keys));
        self.window_order(key)
            .into_iter()
            .find_map(|w| {
                (w * WINDOW..(w + 1) * WINDOW).find_map(|p| {
                    let (ident, st) = self.load(self.at(key, p));
                    (ident != key.ident
                        && (!capped || ident >> 32 == key.ident >> 32)
                        && self.reusable(ident, st, now, slots, owner))
                    .then_some((p, ident, st))
                })
            })
            .ok_or(capped)
    }

    /// After claiming entry `i` (position `p`) for `key`: an earlier entry
    /// of its windows that a racing process claimed for the same key after
    /// our scan, with its state. The first copy wins.
    pub(super) fn earlier_copy(&self, key: &KeyId, i: u64, p: u64) -> Option<(u64, u64)> {
        (0..p)
            .map(|q| self.at(key, q))
            .filter(|&j| j != i) // windows that overlap: our own entry
            .find_map(|j| {
                let (ident, st) = self.load(j);
                (ident == key.ident).then_some((j, st))
            })
    }

    pub(super) fn claimed(&self, key: &KeyId, old_ident: u64, p: u64) {
        self.bump(key.slot(), C_IN_USE);
        if old_ident == 0 {
            if let Some(w) = self.header.u64_at(T_OCCUPIED) {
                w.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            self.bump(key.slot(), C_RECLAIMS);
            if let Some(old) = ident_slot(old_ident) {
                self.drop_in_use(old);
            }
        }
        if let Some(w) = self.header.u64_at(T_CLAIMS) {
            w.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(w) = self.header.u64_at(T_MAX_PROBE) {
            if w.load(Ordering::Relaxed) < p + 1 {
                w.fetch_max(p + 1, Ordering::Relaxed);
            }
        }
    }

    /// May the entry `(ident, st)` go to another key at `now`?
    fn reusable<'l>(
        &self,
        ident: u64,
        st: u64,
        now: Now,
        slots: &Region<'_>,
        owner: &impl Fn(u32) -> Option<&'l KeyLimiter>,
    ) -> bool {
        let Some(slot) = ident_slot(ident) else {
            return true; // empty
        };
        let Some(s) = Slot::at(slots, slot) else {
            return true; // no such slot: garbage
        };
        if s.generation().load(Ordering::Acquire) & 0xFFF != ident_generation(ident) {
            return true; // its strategy is gone (slot reassigned or freed)
        }
        match owner(slot) {
            Some(l) => l.is_fresh(st, l.clock(now)),
            None => false, // not in this process's table: keep it
        }
    }

    /// The key's word (`None`: not in the table), for quotas and tests.
    pub fn peek(&self, key: &KeyId) -> Option<u64> {
        (0..PROBE).find_map(|p| {
            let (ident, st) = self.load(self.at(key, p));
            (ident == key.ident).then_some(st)
        })
    }
}
