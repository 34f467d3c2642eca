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
//! | 4096 | 16 × [`KEY_ENTRIES`] | per-key entries: `(key table entry + 1) << 20 \| units held` (0 = never used), the key's ident |
//!
//! Per-key `concurrency` units (see [`crate::core::keys`]) are recorded by the
//! key's position in the key table and its identity: a row's per-key
//! entries are an open-addressed table (the position's hash picks where a
//! probe of [`KEY_PROBE`] entries starts; a probe stops at a never-used
//! entry). An entry whose count fell to 0 keeps its key and is reused
//! first by that key, or by another one. Reclaiming gives units back with
//! the key table's 16-byte compare-and-swap, only while the entry still
//! holds the recorded ident (the key's strategy slot, generation and tag)
//! and that slot still has the generation: a unit is never released from
//! another key's state (an entry with units in flight is never reused by
//! another key, so the ident cannot come back to it in between).
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
//! * A worker records up to [`ENTRIES`] distinct slots and up to
//!   [`KEY_ENTRIES`] distinct keys at once (fewer keys when their probes
//!   collide); units taken beyond that are not recorded (and would not come
//!   back after a crash).
//!
//! Only the owner writes its entries (nginx workers are single-threaded);
//! a reclaimer writes a row only once its owner is dead. Everything read
//! here is untrusted: slot indexes are bounds-checked, counts saturate.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::keys::{KeyRef, KeyTable};
use crate::core::shm::region::Region;
use crate::core::shm::slot::Slot;

/// Rows (processes holding units at once: workers, old workers during a
/// reload).
pub const ROWS: u64 = 128;
/// Bytes of a row's header and shared-strategy entries.
const SHARED_BYTES: usize = 4096;
const ROW_HEADER: usize = 64;
const ENTRY_BYTES: usize = 24;
/// Distinct slots one process records at once.
pub const ENTRIES: usize = (SHARED_BYTES - ROW_HEADER) / ENTRY_BYTES;
/// Distinct per-key entries one process records at once (at most).
pub const KEY_ENTRIES: usize = 1024;
const KEY_ENTRY_BYTES: usize = 16;
/// Per-key entries a lookup scans (from the one its position's hash picks).
pub const KEY_PROBE: usize = 16;
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
pub const ROW_BYTES: u64 = (SHARED_BYTES + KEY_ENTRIES * KEY_ENTRY_BYTES) as u64;
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
                self.clear_keys(row);
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
        self.clear_keys(row);
        if let Some(owner) = self.word(row, 0) {
            owner.store(0, Ordering::Release);
        }
    }

    /// Every per-key entry of `row` never used.
    fn clear_keys(&self, row: usize) {
        for e in 0..KEY_ENTRIES {
            if let Some([w, i]) = self.key_entry(row, e) {
                w.store(0, Ordering::Relaxed);
                i.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Per-key entry `e` of `row`: its count word and the key's ident.
    #[inline]
    fn key_entry(&self, row: usize, e: usize) -> Option<[&'a AtomicU64; 2]> {
        let off = SHARED_BYTES + e * KEY_ENTRY_BYTES;
        Some([self.word(row, off)?, self.word(row, off + 8)?])
    }

    /// The per-key entry of `row` recording `at`, or the first free one of
    /// its probe (`(entry, found)`); `None`: neither.
    #[inline]
    fn find_key(&self, row: usize, at: KeyRef) -> Option<([&'a AtomicU64; 2], bool)> {
        let tag = at
            .entry
            .checked_add(1)
            .filter(|&t| t <= u64::MAX >> COUNT_BITS)?;
        let start = (at.entry.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % KEY_ENTRIES;
        let mut free = None;
        for p in 0..KEY_PROBE {
            let words = self.key_entry(row, (start + p) % KEY_ENTRIES)?;
            let w = words[0].load(Ordering::Relaxed);
            if w >> COUNT_BITS == tag && words[1].load(Ordering::Relaxed) == at.ident {
                return Some((words, true));
            }
            if w & COUNT_MAX == 0 && free.is_none() {
                free = Some(words);
            }
            if w == 0 {
                break; // never used: the key was never recorded past it
            }
        }
        free.map(|w| (w, false))
    }

    /// Records one more per-key `concurrency` unit of the key at `at` in
    /// `row` (the caller's own), after the key's entry was charged.
    /// `false` if it could not be recorded.
    pub fn add_key(&self, row: usize, at: KeyRef) -> bool {
        let Some(([w, i], found)) = self.find_key(row, at) else {
            return false;
        };
        let cur = w.load(Ordering::Relaxed);
        if found {
            if cur & COUNT_MAX == COUNT_MAX {
                return false;
            }
            w.store(cur + 1, Ordering::Release);
        } else {
            i.store(at.ident, Ordering::Relaxed);
            w.store((at.entry + 1) << COUNT_BITS | 1, Ordering::Release);
        }
        true
    }

    /// Removes one per-key unit of the key at `at` from `row`, before the
    /// key's entry is released; `false` if none was recorded.
    pub fn remove_key(&self, row: usize, at: KeyRef) -> bool {
        match self.find_key(row, at) {
            Some(([w, _], true)) => {
                let cur = w.load(Ordering::Relaxed);
                if cur & COUNT_MAX == 0 {
                    return false;
                }
                w.store(cur - 1, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Gives back the per-key units recorded in a dead owner's `row`.
    fn reclaim_keys(&self, row: usize, keys: &KeyTable<'_>, slots: &Region<'_>) -> u64 {
        let mut returned = 0;
        for e in 0..KEY_ENTRIES {
            let Some([w, i]) = self.key_entry(row, e) else {
                break;
            };
            let v = w.swap(0, Ordering::AcqRel);
            let n = v & COUNT_MAX;
            if n == 0 {
                continue;
            }
            let Some(entry) = (v >> COUNT_BITS).checked_sub(1) else {
                continue; // garbage: no key
            };
            let at = KeyRef {
                entry,
                ident: i.load(Ordering::Relaxed),
            };
            returned += keys.give_back(at, n, slots);
        }
        returned
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
    pub fn reclaim(&self, slots: &Region<'_>, keys: &KeyTable<'_>, me: (u64, u64)) -> u64 {
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
            returned += self.reclaim_keys(row, keys, slots);
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
    use crate::core::keys::{Charge, KeyId, KeyLimiter};
    use crate::core::shm::slot::LocalSlots;

    /// Zeroed words for `n` ledger rows.
    fn rows(n: u64) -> Vec<AtomicU64> {
        (0..n * ROW_BYTES / 8).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn units_of_a_dead_owner_come_back_and_live_ones_stay() {
        let words = rows(2);
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
        let kw = KeyTable::local_words(2, 8);
        let kt = KeyTable::local(crate::core::keys::aligned(&kw), 2, 8, [1; 16]);
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 2);
        assert_eq!(s0.state0().load(Ordering::Relaxed), 1);
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 0, "once");
        // The dead row is free again.
        assert_eq!(ledger.claim(4_000_000_001, 1), Some(dead));
        assert!(ledger.remove(mine, 0, 3));
        assert!(!ledger.remove(mine, 0, 3));
        // A reassigned slot (new generation) is not touched.
        s0.state0().store(5, Ordering::Relaxed);
        assert!(ledger.add(dead, 0, 3));
        s0.generation().store(4, Ordering::Relaxed);
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 0);
        assert_eq!(s0.state0().load(Ordering::Relaxed), 5);
    }

    fn concurrency(limit: u64) -> KeyLimiter {
        use crate::core::model::{Action, Algorithm, Strategy, Unit};
        let s = Strategy::unconditioned(
            Algorithm::Concurrency,
            limit,
            Unit::Second,
            1,
            Action::Reject { status: None },
        )
        .unwrap();
        KeyLimiter::from_strategy(&s).unwrap()
    }

    /// Charges one unit of `key` and returns where it lives.
    fn take(kt: &KeyTable, slots: &Region, key: &KeyId, lim: &KeyLimiter) -> Option<KeyRef> {
        let now = crate::core::clock::Now::from(1_000_000_000);
        match kt.charge(key, lim, now, false, slots, |_| Some(lim)) {
            Charge::Admitted { at, .. } => Some(at),
            _ => None,
        }
    }

    #[test]
    fn per_key_units_of_a_dead_owner_come_back_to_their_key_only() {
        // Four strategies at generation 7, a key table, two ledger rows.
        let local = LocalSlots::new(4);
        let slots = local.region();
        for i in 0..4 {
            Slot::at(&slots, i).unwrap().reset(i + 1, 7);
        }
        let words = rows(2);
        let ledger = Ledger::new(Region::from_atomics(&words));
        let kw = KeyTable::local_words(4, 64);
        let kt = KeyTable::local(crate::core::keys::aligned(&kw), 4, 64, [9; 16]);
        let lim = concurrency(1);
        let key = |slot: u32, v: &[u8]| {
            let mut h = kt.hasher(slot + 1);
            h.part(v);
            kt.key(h, slot, 7).unwrap()
        };
        let (a, b) = (key(0, b"a"), key(0, b"b"));
        let dead = ledger.claim(4_000_000_000, 1).unwrap();
        let mine = ledger.claim(me().0, me().1).unwrap();
        // The dead process holds key a's only unit; we hold key b's.
        let at_a = take(&kt, &slots, &a, &lim).unwrap();
        assert!(ledger.add_key(dead, at_a));
        let at_b = take(&kt, &slots, &b, &lim).unwrap();
        assert!(ledger.add_key(mine, at_b));
        assert_eq!(take(&kt, &slots, &a, &lim), None, "a is at its limit");
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 1);
        assert_eq!(kt.peek(&a), Some(0));
        assert_eq!(kt.peek(&b), Some(1), "a live owner's unit stays");
        assert!(take(&kt, &slots, &a, &lim).is_some(), "a is admitted again");
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 0, "once");
        // Our own unit: recorded once, removed once.
        assert!(ledger.remove_key(mine, at_b));
        assert!(!ledger.remove_key(mine, at_b));

        // A dead owner's record of an entry that now holds another key (or
        // one whose strategy moved to another generation) releases nothing.
        let dead = ledger.claim(4_000_000_001, 1).unwrap();
        let c = key(1, b"c");
        let at_c = take(&kt, &slots, &c, &lim).unwrap();
        let other = KeyRef {
            entry: at_c.entry,
            ident: at_c.ident ^ 1,
        };
        assert!(ledger.add_key(dead, other));
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 0);
        assert_eq!(kt.peek(&c), Some(1), "another key's unit is never released");
        let dead = ledger.claim(4_000_000_002, 1).unwrap();
        assert!(ledger.add_key(dead, at_c));
        Slot::at(&slots, 1).unwrap().reset(2, 8);
        assert_eq!(ledger.reclaim(&slots, &kt, me()), 0, "strategy gone");
        assert_eq!(kt.peek(&c), Some(1));
    }

    #[test]
    fn per_key_entries_are_bounded_and_counted() {
        let words = rows(1);
        let ledger = Ledger::new(Region::from_atomics(&words));
        let row = ledger.claim(4_000_000_000, 1).unwrap();
        let at = |e: u64| KeyRef {
            entry: e,
            ident: 1 << 44 | e,
        };
        // Many distinct keys: most are recorded, none twice, each removable.
        let recorded: Vec<u64> = (0..2 * KEY_ENTRIES as u64)
            .filter(|&e| ledger.add_key(row, at(e)))
            .collect();
        assert!(recorded.len() >= KEY_ENTRIES / 2, "{}", recorded.len());
        assert!(recorded.len() <= KEY_ENTRIES);
        for &e in &recorded {
            assert!(ledger.remove_key(row, at(e)), "entry {e}");
            assert!(!ledger.remove_key(row, at(e)));
        }
        // One key several times: one entry, its count.
        for _ in 0..3 {
            assert!(ledger.add_key(row, at(5)));
        }
        for _ in 0..3 {
            assert!(ledger.remove_key(row, at(5)));
        }
        assert!(!ledger.remove_key(row, at(5)));
        // A garbage entry (no position) is skipped by a reclaim.
        assert!(!ledger.add_key(
            row,
            KeyRef {
                entry: u64::MAX,
                ident: 1
            }
        ));
    }
}
