//! Stat slots: one 64-byte, cache-line-aligned record per strategy.
//!
//! | offset | size | field      | written by | meaning                                            |
//! |-------:|-----:|------------|------------|----------------------------------------------------|
//! | 0      | 8    | state0     | workers    | limiter state word (GCRA TAT, window word, in-flight) |
//! | 8      | 8    | state1     | workers    | second limiter word (sliding window: odd windows)  |
//! | 16     | 8    | generation | agent      | bumped each time the slot is assigned to a strategy |
//! | 24     | 8    | passed     | workers    | requests admitted (monotonic)                      |
//! | 32     | 8    | limited    | workers    | requests rejected, or that a dry run would reject  |
//! | 40     | 8    | delayed    | workers    | requests admitted after a delay                    |
//! | 48     | 8    | owner      | agent      | strategy id (low 32 bits) the slot belongs to; bit 32 ([`OWNER_UNDEFINED_DIMENSION`], set by workers) |
//! | 56     | 8    | freed_at   | agent      | unix ms when the slot was freed (0 = in use/never) |

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::shm::region::Region;

pub const SLOT_SIZE: usize = 64;
pub const OFF_STATE0: usize = 0;
pub const OFF_STATE1: usize = 8;
pub const OFF_GENERATION: usize = 16;
pub const OFF_PASSED: usize = 24;
pub const OFF_LIMITED: usize = 32;
pub const OFF_DELAYED: usize = 40;
pub const OFF_OWNER: usize = 48;
pub const OFF_FREED_AT: usize = 56;

/// Bit of the owner word a worker sets when its nginx does not define a
/// dimension the strategy's conditions use (so the strategy never matches
/// there), and clears when it does; rewritten on every table load, cleared
/// by the agent with the rest of the word when the slot is reassigned.
pub const OWNER_UNDEFINED_DIMENSION: u64 = 1 << 32;

/// One stat slot: a reference to its eight words in shared memory (one
/// pointer, one bounds check when it is formed); the accessors name them.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    words: &'a [AtomicU64; SLOT_SIZE / 8],
}

/// Counter values of a slot, for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub passed: u64,
    pub limited: u64,
    pub delayed: u64,
}

macro_rules! slot_words {
    ($($(#[$doc:meta])* $name:ident = $off:ident;)*) => {
        $(
            $(#[$doc])*
            #[inline]
            pub fn $name(&self) -> &'a AtomicU64 {
                &self.words[$off / 8]
            }
        )*
    };
}

impl<'a> Slot<'a> {
    /// The slot at `index` of a slot array region; `None` past the end.
    #[inline]
    pub fn at(slots: &Region<'a>, index: u32) -> Option<Slot<'a>> {
        let base = (index as usize).checked_mul(SLOT_SIZE)?;
        Some(Slot {
            words: slots.words_at(base)?,
        })
    }

    slot_words! {
        /// Limiter state word (GCRA TAT, window word, in-flight count).
        state0 = OFF_STATE0;
        /// Second limiter word (sliding window).
        state1 = OFF_STATE1;
        /// Bumped by the agent each time the slot is assigned.
        generation = OFF_GENERATION;
        passed = OFF_PASSED;
        limited = OFF_LIMITED;
        delayed = OFF_DELAYED;
        /// Strategy id the slot belongs to (low 32 bits).
        owner = OFF_OWNER;
        /// Unix ms when the slot was freed (0 = in use or never).
        freed_at = OFF_FREED_AT;
    }

    /// The counters of the slot at `index`, if it still belongs to the
    /// strategy it was assigned to at `generation` (a slot reassigned since
    /// counts for another strategy).
    pub fn counters_at(slots: &Region<'a>, index: u32, generation: u64) -> Option<Counters> {
        let slot = Slot::at(slots, index)?;
        (slot.generation().load(Ordering::Relaxed) == generation).then(|| slot.counters())
    }

    pub fn counters(&self) -> Counters {
        Counters {
            passed: self.passed().load(Ordering::Relaxed),
            limited: self.limited().load(Ordering::Relaxed),
            delayed: self.delayed().load(Ordering::Relaxed),
        }
    }

    /// Worker side: records whether the strategy holding the slot at
    /// `generation` uses a dimension this nginx does not define (see
    /// [`OWNER_UNDEFINED_DIMENSION`]); nothing if the slot moved on.
    pub fn mark_undefined_dimension(&self, generation: u64, undefined: bool) {
        if self.generation().load(Ordering::Acquire) != generation {
            return;
        }
        let set = self.owner().load(Ordering::Relaxed) & OWNER_UNDEFINED_DIMENSION != 0;
        if undefined && !set {
            self.owner()
                .fetch_or(OWNER_UNDEFINED_DIMENSION, Ordering::Relaxed);
        } else if !undefined && set {
            self.owner()
                .fetch_and(!OWNER_UNDEFINED_DIMENSION, Ordering::Relaxed);
        }
    }

    /// Whether a worker found a dimension of the strategy undefined.
    pub fn undefined_dimension(&self) -> bool {
        self.owner().load(Ordering::Relaxed) & OWNER_UNDEFINED_DIMENSION != 0
    }

    /// Agent side: give the slot to `owner` with a fresh generation; the
    /// limiter state and the counters start from zero (a new bucket is full,
    /// a new window empty).
    pub fn reset(&self, owner: u32, generation: u64) {
        self.state0().store(0, Ordering::Relaxed);
        self.state1().store(0, Ordering::Relaxed);
        self.passed().store(0, Ordering::Relaxed);
        self.limited().store(0, Ordering::Relaxed);
        self.delayed().store(0, Ordering::Relaxed);
        self.owner().store(owner as u64, Ordering::Relaxed);
        self.freed_at().store(0, Ordering::Relaxed);
        self.generation().store(generation, Ordering::Release);
    }
}

/// Process-local slots for tests and benchmarks, aligned like the file's
/// (64 bytes: `warm_up` swaps `state0` and `state1` as one 16-byte unit).
pub struct LocalSlots {
    lines: Vec<Line>,
}

#[repr(C, align(64))]
struct Line([AtomicU64; SLOT_SIZE / 8]);

impl LocalSlots {
    pub fn new(count: usize) -> LocalSlots {
        LocalSlots {
            lines: (0..count)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    pub fn region(&self) -> Region<'_> {
        // SAFETY: the lines are contiguous (`Vec`), `repr(C)` arrays of
        // AtomicU64 without padding (64 bytes each, aligned to 64), valid for
        // `len × 64` bytes while `self` is borrowed, and only accessed
        // atomically.
        unsafe { Region::from_raw(self.lines.as_ptr() as *mut u8, self.lines.len() * SLOT_SIZE) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounds_checked() {
        let local = LocalSlots::new(2);
        let r = local.region();
        assert!(Slot::at(&r, 1).is_some());
        assert!(Slot::at(&r, 2).is_none());
        assert!(Slot::at(&r, u32::MAX).is_none());
        let s = Slot::at(&r, 1).unwrap();
        s.passed().fetch_add(3, Ordering::Relaxed);
        s.reset(9, 2);
        assert_eq!(s.counters(), Counters::default());
        assert_eq!(s.owner().load(Ordering::Relaxed), 9);
        s.mark_undefined_dimension(2, true);
        assert!(s.undefined_dimension());
        assert_eq!(s.owner().load(Ordering::Relaxed) as u32, 9);
        s.mark_undefined_dimension(1, false); // another generation: untouched
        assert!(s.undefined_dimension());
        s.mark_undefined_dimension(2, false);
        assert!(!s.undefined_dimension());
        s.mark_undefined_dimension(2, true);
        s.reset(9, 3);
        assert!(!s.undefined_dimension(), "a reassigned slot starts clear");
    }
}
