//! Slot reuse: which slot each strategy holds (by generation), the in-use
//! bitmap, and the repairs made on adoption.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) struct Assigned {
    pub(super) slot: u32,
    pub(super) generation: u64,
    pub(super) algorithm: Algorithm,
    /// For [`Writer::repair_foreign`].
    limiter: Limiter,
}

impl Assigned {
    pub(super) fn of(strategy: &Strategy, slot: u32, generation: u64) -> Assigned {
        Assigned {
            slot,
            generation,
            algorithm: strategy.algorithm,
            limiter: Limiter::from_strategy(strategy),
        }
    }
}

/// Which slot each published strategy holds, sorted by strategy id: a
/// publish (its table sorted by id too) walks both side by side, one
/// sequential pass instead of a hash lookup per strategy (issue 29: with
/// 10,000 strategies the lookups' cache misses alone cost ~1.4 ms a publish).
#[derive(Debug, Clone, Default)]
pub(super) struct AssignedList(Vec<(u32, Assigned)>);

impl AssignedList {
    /// From pairs in any order; a repeated id keeps its first pair.
    pub(super) fn from_unsorted(mut v: Vec<(u32, Assigned)>) -> AssignedList {
        v.sort_by_key(|p| p.0);
        v.dedup_by_key(|p| p.0);
        AssignedList(v)
    }

    /// From pairs already sorted by id, each id once.
    pub(super) fn from_sorted(v: Vec<(u32, Assigned)>) -> AssignedList {
        debug_assert!(v.windows(2).all(|w| w[0].0 < w[1].0));
        AssignedList(v)
    }

    pub(super) fn get(&self, id: u32) -> Option<&Assigned> {
        self.0
            .binary_search_by_key(&id, |p| p.0)
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub(super) fn as_slice(&self) -> &[(u32, Assigned)] {
        &self.0
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Assigned> {
        self.0.iter().map(|p| &p.1)
    }
}

impl Writer {
    /// After adoption the active segment is the truth: a slot marked in use
    /// that no published strategy owns (a writer killed between allocating
    /// and publishing, or an unreadable segment) is freed, with quarantine.
    pub(super) fn reconcile_bitmap(&self) {
        let owned: std::collections::HashSet<u32> =
            self.assigned.values().map(|a| a.slot).collect();
        let slots = self.map.slots();
        let now_ms = clock::unix_ms().max(1);
        for slot in 0..self.map.geometry.slot_count {
            let used = self.slot_in_use(slot);
            let owns = owned.contains(&slot);
            if used && !owns {
                self.set_slot_bit(slot, false);
                if let Some(s) = Slot::at(&slots, slot) {
                    s.freed_at().store(now_ms, Ordering::Relaxed);
                }
            } else if owns && !used {
                self.set_slot_bit(slot, true);
            }
        }
    }

    /// Replaces limiter state that no clock reading could have written
    /// (garbage, a slot rewritten by hand) with the most restrictive
    /// legitimate state, in every slot of the published table; returns how
    /// many slots it changed. The agent calls this at every poll: the
    /// request path never moves state backwards (a stale worker could not
    /// tell garbage from a newer legitimate state), the agent's fresh clock
    /// can ([`Limiter::repair_foreign`]).
    pub fn repair_foreign(&self) -> usize {
        let slots = self.map.slots();
        let mut repaired = 0;
        for a in self.assigned.values() {
            let Some(slot) = Slot::at(&slots, a.slot) else {
                continue;
            };
            let fixed = match a.algorithm {
                Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                    a.limiter.repair_foreign(&slot, clock::unix_ns)
                }
                _ => a.limiter.repair_foreign(&slot, MonotonicClock::now),
            };
            repaired += usize::from(fixed);
        }
        repaired
    }

    pub(super) fn bit(&self, slot: u32) -> (usize, u64) {
        ((slot as usize / 64) * 8, 1u64 << (slot % 64))
    }

    pub(super) fn slot_in_use(&self, slot: u32) -> bool {
        let (off, mask) = self.bit(slot);
        self.map.bitmap().load(off) & mask != 0
    }

    pub(super) fn set_slot_bit(&self, slot: u32, used: bool) {
        let (off, mask) = self.bit(slot);
        let bm = self.map.bitmap();
        let v = bm.load(off);
        bm.store(off, if used { v | mask } else { v & !mask });
    }
}
