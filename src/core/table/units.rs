//! Units: the concurrency units and per-key holds a request keeps until
//! it ends, and the charges it owes then (issue 31).

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Scratch, Table};
use crate::core::shm::Mapping;

impl Table {
    /// Releases the concurrency slots a finished request held
    /// ([`TableDecision::held`]).
    pub fn release(&self, held: &[u32]) {
        if let Some(u) = self.units(held) {
            u.release();
        }
    }

    /// What a request that holds `held` needs to give its units back when
    /// it ends: the mapping and each unit's slot and generation, not the
    /// table (a request may outlive many tables).
    pub fn units(&self, held: &[u32]) -> Option<Units> {
        let map = self.map.as_ref()?;
        let units = held
            .iter()
            .filter_map(|&si| self.strategies.get(si as usize))
            .map(|c| (c.slot, c.generation))
            .collect();
        Some(Units {
            map: map.clone(),
            units,
            keys: SmallVec::new(),
        })
    }

    /// [`units`](Self::units) plus the per-key units the request decided
    /// last with `scratch` took (recorded in this process's ledger row
    /// from here on); `None` when it holds nothing.
    #[inline]
    pub fn units_with_keys(&self, held: &[u32], scratch: &mut Scratch) -> Option<Units> {
        if held.is_empty() && scratch.key_holds.is_empty() {
            return None;
        }
        self.units_held(held, scratch)
    }

    /// [`units_with_keys`](Self::units_with_keys) of a request that holds
    /// units (out of line: most hold none).
    #[cold]
    #[inline(never)]
    fn units_held(&self, held: &[u32], scratch: &mut Scratch) -> Option<Units> {
        let mut u = self.units(held)?;
        u.keys = std::mem::take(&mut scratch.key_holds);
        for (at, _) in &u.keys {
            u.map.hold_key_unit(*at);
        }
        Some(u)
    }

    /// What the request decided last with `scratch` settles when it ends
    /// (issue 31): `None` when nothing (most requests: one branch).
    #[inline]
    pub fn owing(&self, scratch: &mut Scratch) -> Option<crate::core::response::Owing> {
        if !self.responsive || scratch.response.owed.is_empty() {
            return None;
        }
        self.owing_held(scratch)
    }

    #[cold]
    #[inline(never)]
    fn owing_held(&self, scratch: &mut Scratch) -> Option<crate::core::response::Owing> {
        let items = std::mem::take(&mut scratch.response.owed);
        Some(crate::core::response::Owing {
            map: self.map.as_ref()?.clone(),
            items,
        })
    }
}

/// Concurrency units a request holds: `(slot, generation)` in one mapping.
pub struct Units {
    map: Arc<Mapping>,
    units: SmallVec<[(u32, u64); 2]>,
    /// Per-key units: the key's entry and its limiter.
    keys: super::keyed::KeyHolds,
}

impl Units {
    /// The request ended: each unit off this process's ledger and off its
    /// slot (if the slot still has the generation).
    pub fn release(self) {
        for &(slot, generation) in &self.units {
            self.map.release_unit(slot, generation);
        }
        for (at, lim) in &self.keys {
            self.map.release_key_unit(*at, lim);
        }
    }
}
