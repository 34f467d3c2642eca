//! The concurrency ledger: which process holds which `concurrency` units,
//! so that the units of a process that died (`kill -9`, a crash) come back.
//!
//! A `concurrency` slot counts requests in flight in its `state0` word; a
//! request takes a unit when admitted and gives it back when it ends. A
//! worker that dies in between never gives its units back, and before the
//! ledger the count stayed up forever (every later request refused).
//!
//! # Layout
//!
//! The ledger region (after the blacklist; see `docs/SHM-LAYOUT.md`) holds
//! [`ROWS`] rows of [`ROW_BYTES`]. A row belongs to one process:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | owner pid (0 = free; bit 63 set = being reclaimed by the pid in the low bits) |
//! | 8 | 8 | owner start time (`/proc/PID/stat` field 22, clock ticks since boot) |
//! | 16 | 48 | reserved |
//! | 64 | 24 × [`ENTRIES`] | entries: slot index + 1 (0 = empty), slot generation, units held |
//!
//! # Protocol
//!
//! * A worker claims a free row the first time it takes a unit (CAS of the
//!   owner word from 0 to its pid), and records each unit it takes in its
//!   row **after** the slot's increment and removes it **before** the
//!   decrement, so a death between the two steps can only leave a unit
//!   held (as before), never give back one that is still in use.
//! * Each worker, when it rechecks the file (once a second) and when it
//!   starts, looks at the other rows: a row whose owner is gone (`kill(pid,
//!   0)` says no such process, or the pid now belongs to a process started
//!   later) is taken over (CAS to "being reclaimed"), each entry whose slot
//!   still has the entry's generation gives its units back, and the row is
//!   freed. **Bound**: the units of a dead worker return within about one
//!   recheck interval (1 s) of the next request any live worker serves, and
//!   at once when nginx starts a replacement worker.
//! * A worker records up to [`ENTRIES`] distinct slots at once; units taken
//!   beyond that are not recorded (and would not come back after a crash).
//!
//! Only the owner writes its entries (nginx workers are single-threaded);
//! a reclaimer writes a row only once its owner is dead. Everything read
//! here is untrusted: slot indexes are bounds-checked, counts saturate.

use std::sync::atomic::{AtomicU64, Ordering};

use super::region::Region;
use super::slot::Slot;

/// Rows (processes holding units at once: workers, old workers during a
/// reload).
pub const ROWS: u64 = 128;
pub const ROW_BYTES: u64 = 4096;
const ROW_HEADER: usize = 64;
const ENTRY_BYTES: usize = 24;
/// Distinct slots one process records at once.
pub const ENTRIES: usize = (ROW_BYTES as usize - ROW_HEADER) / ENTRY_BYTES;
const RECLAIMING: u64 = 1 << 63;

/// Bytes of the ledger region.
pub fn region_bytes() -> u64 {
    ROWS * ROW_BYTES
}

/// This process's pid and start time.
pub fn me() -> (u64, u64) {
    let pid = std::process::id() as u64;
    (pid, start_time(pid).unwrap_or(0))
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot).
fn start_time(pid: u64) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count after its ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process that claimed a row (pid, start time) still runs.
fn alive(pid: u64, started: u64) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for the process.
    if unsafe { libc::kill(p, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    // The pid may have been reused by a newer process.
    match start_time(pid) {
        Some(t) => started == 0 || t == started,
        None => true, // no /proc: trust kill()
    }
}

/// The ledger of one mapped file.
#[derive(Clone, Copy)]
pub struct Ledger<'a> {
    region: Region<'a>,
}

impl<'a> Ledger<'a> {
    pub fn new(region: Region<'a>) -> Ledger<'a> {
        Ledger { region }
    }

    fn word(&self, row: usize, off: usize) -> Option<&'a AtomicU64> {
        self.region
            .u64_at(row.checked_mul(ROW_BYTES as usize)?.checked_add(off)?)
    }

    fn rows(&self) -> usize {
        (self.region.len() / ROW_BYTES as usize).min(ROWS as usize)
    }

    /// Claims a free row for `(pid, started)`; `None` if all are taken.
    pub fn claim(&self, pid: u64, started: u64) -> Option<usize> {
        for row in 0..self.rows() {
            let owner = self.word(row, 0)?;
            if owner
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.word(row, 8)?.store(started, Ordering::Release);
                for e in 0..ENTRIES {
                    if let Some(w) = self.entry(row, e, 2) {
                        w.store(0, Ordering::Relaxed);
                    }
                }
                return Some(row);
            }
        }
        None
    }

    /// Frees `row` (its owner holds nothing any more).
    pub fn free(&self, row: usize, pid: u64) {
        if let Some(owner) = self.word(row, 0) {
            let _ = owner.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Frees `row` whoever holds it, entries included (a file adopted
    /// after a reboot).
    pub fn free_any(&self, row: usize) {
        for e in 0..ENTRIES {
            if let Some(c) = self.entry(row, e, 2) {
                c.store(0, Ordering::Relaxed);
            }
        }
        if let Some(owner) = self.word(row, 0) {
            owner.store(0, Ordering::Release);
        }
    }

    /// Word `w` (0 slot + 1, 1 generation, 2 count) of entry `e` of `row`.
    fn entry(&self, row: usize, e: usize, w: usize) -> Option<&'a AtomicU64> {
        self.word(row, ROW_HEADER + e * ENTRY_BYTES + w * 8)
    }

    /// Entry `e` of `row` as its three words: key (slot + 1), generation,
    /// count. `None` past the region.
    #[inline]
    fn entry_words(&self, row: usize, e: usize) -> Option<[&'a AtomicU64; 3]> {
        Some([
            self.entry(row, e, 0)?,
            self.entry(row, e, 1)?,
            self.entry(row, e, 2)?,
        ])
    }

    /// Records one more unit of `(slot, generation)` in `row` (the
    /// caller's own). `false` if the row is full (the unit is then not
    /// recorded).
    pub fn add(&self, row: usize, slot: u32, generation: u64) -> bool {
        let key = slot as u64 + 1;
        let mut empty = None;
        for e in 0..ENTRIES {
            let Some([k, g, c]) = self.entry_words(row, e) else {
                return false;
            };
            let count = c.load(Ordering::Relaxed);
            if k.load(Ordering::Relaxed) == key && g.load(Ordering::Relaxed) == generation {
                c.store(count.saturating_add(1), Ordering::Release);
                return true;
            }
            if count == 0 && empty.is_none() {
                empty = Some((k, g, c));
            }
        }
        match empty {
            Some((k, g, c)) => {
                k.store(key, Ordering::Relaxed);
                g.store(generation, Ordering::Relaxed);
                c.store(1, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Removes one unit of `(slot, generation)` from `row`; `false` if it
    /// was not recorded.
    pub fn remove(&self, row: usize, slot: u32, generation: u64) -> bool {
        let key = slot as u64 + 1;
        for e in 0..ENTRIES {
            let Some([k, g, c]) = self.entry_words(row, e) else {
                return false;
            };
            let count = c.load(Ordering::Relaxed);
            if count > 0
                && k.load(Ordering::Relaxed) == key
                && g.load(Ordering::Relaxed) == generation
            {
                c.store(count - 1, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Gives back the units of every row whose owner is gone (never
    /// `me`'s). Returns the units given back.
    pub fn reclaim(&self, slots: &Region<'_>, me: (u64, u64)) -> u64 {
        let mut returned = 0;
        for row in 0..self.rows() {
            let (Some(owner), Some(start)) = (self.word(row, 0), self.word(row, 8)) else {
                break;
            };
            let o = owner.load(Ordering::Acquire);
            if o == 0 || o == me.0 {
                continue;
            }
            // A reclaimer that died mid-way: its own pid is in the low bits.
            let (pid, started) = if o & RECLAIMING != 0 {
                (o & !RECLAIMING, 0)
            } else {
                (o, start.load(Ordering::Acquire))
            };
            if alive(pid, started) {
                continue;
            }
            if owner
                .compare_exchange(o, RECLAIMING | me.0, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            for e in 0..ENTRIES {
                let Some([k, g, c]) = self.entry_words(row, e) else {
                    break;
                };
                let n = c.swap(0, Ordering::AcqRel);
                let key = k.load(Ordering::Relaxed);
                if n == 0 || key == 0 || key > u32::MAX as u64 {
                    continue;
                }
                let Some(slot) = Slot::at(slots, (key - 1) as u32) else {
                    continue;
                };
                // A slot given to another strategy since was zeroed then.
                if slot.generation().load(Ordering::Acquire) == g.load(Ordering::Relaxed) {
                    release_units(&slot, n);
                    returned += n;
                }
            }
            start.store(0, Ordering::Relaxed);
            owner.store(0, Ordering::Release);
        }
        returned
    }
}

/// Takes `n` units off a concurrency slot's in-flight count, never below 0.
pub fn release_units(slot: &Slot<'_>, n: u64) {
    let _ = slot
        .state0()
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_sub(n))
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::slot::LocalSlots;

    #[test]
    fn units_of_a_dead_owner_come_back_and_live_ones_stay() {
        let words: Vec<AtomicU64> = (0..(2 * ROW_BYTES / 8))
            .map(|_| AtomicU64::new(0))
            .collect();
        let ledger = Ledger::new(Region::from_atomics(&words));
        let local = LocalSlots::new(2);
        let slots = local.region();
        let s0 = Slot::at(&slots, 0).unwrap();
        s0.generation().store(3, Ordering::Relaxed);
        // A dead process (pid far above pid_max) holds 2 units, we hold 1.
        let dead = ledger.claim(4_000_000_000, 1).unwrap();
        let mine = ledger.claim(me().0, me().1).unwrap();
        assert_ne!(dead, mine);
        for row in [dead, dead, mine] {
            s0.state0().fetch_add(1, Ordering::Relaxed);
            assert!(ledger.add(row, 0, 3));
        }
        assert_eq!(ledger.reclaim(&slots, me()), 2);
        assert_eq!(s0.state0().load(Ordering::Relaxed), 1);
        assert_eq!(ledger.reclaim(&slots, me()), 0, "once");
        // The dead row is free again.
        assert_eq!(ledger.claim(4_000_000_001, 1), Some(dead));
        assert!(ledger.remove(mine, 0, 3));
        assert!(!ledger.remove(mine, 0, 3));
        // A reassigned slot (new generation) is not touched.
        s0.state0().store(5, Ordering::Relaxed);
        assert!(ledger.add(dead, 0, 3));
        s0.generation().store(4, Ordering::Relaxed);
        assert_eq!(ledger.reclaim(&slots, me()), 0);
        assert_eq!(s0.state0().load(Ordering::Relaxed), 5);
    }
}
