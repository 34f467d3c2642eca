//! The per-key table: one limiter state per distinct value tuple of a
//! strategy's `each` dimensions, in a bounded, lock-free region of the
//! shared-memory file.
//!
//! # Layout (region at header `H_KEYS_OFF`, see docs/SHM-LAYOUT.md)
//!
//! | offset | size | content |
//! |---:|---:|---|
//! | 0 | 4096 | table header: occupied entries, longest probe, claims |
//! | 4096 | slots × 64, page-rounded | per stat slot: keys in use, reclaims, `on_full` events, overflow admissions, the response counters of issue 31, new keys refused by the strategy's cap |
//! | after | capacity × 16 | entries |
//!
//! An **entry** is 16 bytes, four per cache line: `ident` (8 bytes) and the
//! key's limiter word (8 bytes, [`state`]). Both change together with one
//! 16-byte compare-and-swap (`lock cmpxchg16b`), so every update checks
//! the key's identity: a worker holding a stale position can never charge
//! another key (no ABA). `ident` 0 is an empty entry; otherwise
//!
//! ```text
//! ident = (stat slot + 1) << 44 | (slot generation mod 4096) << 32 | tag
//! ```
//!
//! where `tag` is the low 32 bits of `Mix(keys; strategy id, tuple)` and
//! the high 32 bits choose the probe range. `Mix` (`keys/hash.rs`) is a keyed
//! multiply-fold hash whose four 64-bit keys SipHash-1-3 derives from the
//! file header's 16 random secret bytes (once per mapping), so positions
//! are stable across the processes that map the file and cannot be
//! predicted from outside (the attack model is argued in `keys/hash.rs`). The
//! tuple is hashed as 64-bit words, each text value length-prefixed (a
//! length word, then its bytes zero-padded), so ("ab","c") ≠ ("a","bc");
//! an `ip` value is a fixed-form part whose first word carries the family
//! (IPv4: that one word, address, prefix length and family; IPv6: three
//! words), see [`KeyHasher::ip`]. Every encoding is injective for the
//! strategy's own dimension list. The hash state after the strategy id
//! is kept per compiled strategy ([`KeyPlan::seed`]): an IPv4 key costs
//! one multiplication plus two for the
//! finalisation. Two keys of one strategy share a state only if
//! they land in the same probe range with the same 32-bit tag (about 7 in
//! 2³² per new key): that can only over-limit, never admit more.
//!
//! # Probing and reuse
//!
//! A key has three probe windows of four cache lines (16 entries) each:
//! the first at the line its hash picks, the others at lines a remix of
//! the whole hash picks (wrapping at the table's end). A request scans the
//! idents of the windows in order and uses the key's entry if present (the
//! first window is one bounds check and a scan: most keys are there).
//! Otherwise a new key looks at its first window while at least half of
//! it is empty, else at its windows by how many entries are empty, most
//! first, and takes the first entry that is empty, or
//! whose state is **indistinguishable from a new key's** (bucket refilled,
//! window over, nothing in flight — [`KeyLimiter::is_fresh`], judged with
//! the owner strategy's own limiter; an entry whose strategy's slot has
//! moved to another generation belongs to a removed strategy and is free)
//! is claimed with the same compare-and-swap that charges the new key, so
//! reclaiming never changes a decision and a limited key is never evicted.
//! After a claim the entries before it are scanned again: if a racing
//! process claimed an earlier entry for the same key, ours is given back
//! and the request charged there (lookups always use the first copy).
//!
//! When no entry of the three windows can be used the table is full for
//! that key: [`Charge::Full`], and the strategy's `on_full` decides (the
//! caller). Measured (`keys::tests::new_keys_find_an_entry_until_90_percent`,
//! 1,048,576 entries, random keys): 0 new keys of 524,288 refused up to
//! 50 % occupancy, 0 of 838,860 up to 80 %, 2 of the first 900,000,
//! under 0.1 % of the last keys up to 90 %; before (one window of 8
//! entries) 0.64 %, 7.7 % and 15 % of all new keys up to 50, 80 and 90 %.
//! Placing by the emptier window never moves a key once placed (no
//! relocation: entries are claimed and given back by one 16-byte CAS
//! each, as before), so the lock-free protocol is unchanged; only where
//! a new key looks differs.
//!
//! # Per-strategy cap (`max_keys`)
//!
//! A strategy's keys hold at most its cap of entries (`--max-keys`, by
//! default [`KeyTable::default_cap`]: half of the table), counted by its
//! stat slot's "keys in use" word. A new key of a strategy at its cap may
//! only reuse a fresh entry of the same strategy (in use stays the same);
//! otherwise it is [`Charge::Full`] and the strategy's own `on_full`
//! applies, counted as "capped". The check is on the new-key path only:
//! the request path of a known key does not read the counter. Concurrent
//! claims can pass the check together, so a strategy may go over its cap
//! by at most the number of processes claiming at that moment.
//!
//! Per-key `concurrency` units are in the concurrency ledger
//! ([`super::shm::ledger`]) by entry and ident: the units of a worker killed
//! while holding them are given back ([`KeyTable::give_back`]) while the
//! entry still holds that key.

mod charge;
mod hash;
mod probe;
pub mod read;
pub mod segment;
pub mod state;
pub mod top;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

pub use hash::{Mix, MixKeys, Sip13};
pub use read::{key_text, parse_key, KeyPart, KeyReading, KeyTextError};
pub use state::{KeyLimiter, Step};

use super::shm::error::ShmError;
use super::shm::region::Region;

/// Default entries of the key table (`rate-ctl agent --keys`).
pub const DEFAULT_KEYS: u32 = 1 << 20;
/// Bytes per key.
pub const ENTRY_BYTES: u64 = 16;
const LINE_ENTRIES: u64 = 4;
/// Entries of one probe window: four cache lines.
pub const WINDOW: u64 = 16;
/// Probe windows per key, each at a line its hash picks.
pub const WINDOWS: u64 = 3;
/// Entries a key may be in: its windows, in order.
pub const PROBE: u64 = WINDOW * WINDOWS;
/// A new key goes to its first window while at least this many of the
/// window's entries are empty; past that, to the window with the most.
const FIRST_WINDOW_EMPTY: usize = 8;
const HEADER_BYTES: u64 = 4096;
/// Bytes of one stat slot's counters here: the key counters, and since
/// layout version 4 the response counters (issue 31).
const COUNTER_BYTES: u64 = 64;
/// `max_keys` of [`KeyTable::charge`]: no cap (larger than any table;
/// the model allows at most [`crate::core::model::each::MAX_MAX_KEYS`]).
pub const NO_CAP: u32 = u32::MAX;
/// Stat slots a per-key strategy may use (20 bits of the ident).
pub const MAX_SLOT: u32 = (1 << 20) - 2;

// Table header words.
const T_OCCUPIED: usize = 0;
const T_MAX_PROBE: usize = 8;
const T_CLAIMS: usize = 16;

// Per-slot counters.
const C_IN_USE: usize = 0;
const C_RECLAIMS: usize = 8;
const C_FULL: usize = 16;
const C_OVERFLOW: usize = 24;
// Response counters (issue 31), for every strategy with count_if,
// cost_from or cost_after (per key or not).
const C_CHARGED_AFTER: usize = 32;
const C_GIVEN_BACK: usize = 40;
const C_NOT_COUNTED: usize = 48;
// New keys refused by the strategy's cap (`max_keys`).
const C_CAPPED: usize = 56;

/// Entries for a requested `--keys`: whole cache lines, at least two.
pub fn capacity_for(keys: u32) -> Result<u64, ShmError> {
    if keys < WINDOW as u32 {
        return Err(ShmError::BadCapacity("keys must be at least 16"));
    }
    Ok((keys as u64).div_ceil(LINE_ENTRIES) * LINE_ENTRIES)
}

fn counters_bytes(slot_count: u32) -> u64 {
    (slot_count as u64 * COUNTER_BYTES).div_ceil(4096) * 4096
}

/// Bytes of the region (before page rounding).
pub fn region_bytes(slot_count: u32, capacity: u64) -> u64 {
    HEADER_BYTES + counters_bytes(slot_count) + capacity * ENTRY_BYTES
}

/// Does a region of `len` bytes hold this table? (header validation)
pub fn fits(slot_count: u32, capacity: u64, len: u64) -> bool {
    capacity >= WINDOW
        && capacity % LINE_ENTRIES == 0
        && capacity
            .checked_mul(ENTRY_BYTES)
            .and_then(|b| b.checked_add(HEADER_BYTES + counters_bytes(slot_count)))
            .is_some_and(|need| need <= len)
}

/// 16 random bytes for a new file's hash secret.
pub fn new_secret() -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: getrandom writes at most `out.len()` bytes into our buffer.
    let n = unsafe { libc::getrandom(out.as_mut_ptr().cast(), out.len(), 0) };
    if n != out.len() as isize {
        // No getrandom: still unpredictable enough from outside the host.
        let mut h = Sip13::new([std::process::id() as u64, super::clock::unix_ms()]);
        h.write(&super::clock::boot_id());
        let t = std::time::Instant::now();
        h.write(format!("{t:?}").as_bytes());
        let a = h.finish();
        out[..8].copy_from_slice(&a.to_le_bytes());
        out[8..].copy_from_slice(
            &a.rotate_left(29)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .to_le_bytes(),
        );
    }
    out
}

/// One key of one strategy, ready to be looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyId {
    pub ident: u64,
    /// First entry of the probe range.
    pub start: u64,
}

impl KeyId {
    /// The stat slot of the strategy the key belongs to.
    pub fn slot(&self) -> u32 {
        ident_slot(self.ident).unwrap_or(u32::MAX)
    }
}

fn ident_slot(ident: u64) -> Option<u32> {
    ((ident >> 44) as u32).checked_sub(1)
}

fn ident_generation(ident: u64) -> u64 {
    (ident >> 32) & 0xFFF
}

/// Where a charged key lives: enough to refund or release it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef {
    pub entry: u64,
    pub ident: u64,
}

impl KeyRef {
    /// The stat slot of the key's strategy.
    pub fn slot(&self) -> Option<u32> {
        ident_slot(self.ident)
    }
}

/// The result of [`KeyTable::charge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Admitted {
        at: KeyRef,
        wait_ns: u64,
        /// A dry-run `concurrency` unit taken over the limit (the key
        /// rejected the request; see `force`).
        forced: bool,
        /// The word written and the word replaced (for a refund).
        token: u64,
        prev: u64,
    },
    Rejected {
        retry_after_ns: u64,
    },
    /// No entry in the key's range is free or reusable.
    Full,
}

/// Hashes a key tuple: strategy id, then each part length-prefixed, as
/// 64-bit words (a part's last word zero-padded), with the file's keyed
/// [`Mix`].
#[derive(Clone, Copy)]
pub struct KeyHasher(Mix);

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(..)") // never the keyed state
    }
}

impl KeyHasher {
    /// The hash so far (the ban table's ident, [`crate::core::bans::ident`]).
    #[inline]
    pub fn finish(self) -> u64 {
        self.0.finish()
    }

    /// A value part: its length, then its bytes.
    #[inline]
    pub fn part(&mut self, bytes: &[u8]) {
        self.0.word(bytes.len() as u64);
        self.0.padded(bytes);
    }

    /// A client-address part, aggregated (see [`IpPrefix`]), as whole
    /// words from the matcher's 128-bit form without an `IpAddr`: IPv4
    /// (and IPv4-mapped IPv6) one word `masked address << 32 | prefix << 8
    /// | 4`; IPv6 the word `prefix << 8 | 6`, then the masked address's
    /// high and low halves. The family in the first word fixes the part's
    /// length, so no length prefix is needed; one word for the common
    /// IPv4 key (one multiply-fold of [`Mix`]).
    #[inline(always)]
    pub fn ip(&mut self, k: u128, v4: u8, v6: u8) {
        if k >> 32 == 0xffff {
            let p = v4.min(32);
            // The top `p` bits of the address (p in 0..=32, no branch).
            let mask = !(u64::from(u32::MAX) >> p) as u32;
            self.0
                .word(((k as u32 & mask) as u64) << 32 | (p as u64) << 8 | 4);
        } else {
            let p = v6.min(128);
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            let a = k & mask;
            self.0.word((p as u64) << 8 | 6);
            self.0.word((a >> 64) as u64);
            self.0.word(a as u64);
        }
    }
}

/// Table-wide figures (stats, `shm inspect`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    pub capacity: u64,
    /// Entries ever claimed from empty (entries are reused, never emptied,
    /// except by a claim given back to a racing copy).
    pub occupied: u64,
    /// Longest probe a claim needed (1..=8).
    pub max_probe: u64,
    pub claims: u64,
}

/// One strategy's key figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyCounters {
    /// Entries held by the strategy's keys.
    pub in_use: u64,
    /// Entries taken over from a fresh-equivalent key.
    pub reclaims: u64,
    /// Requests of new keys that found their range full.
    pub full: u64,
    /// Of those, admitted by the strategy's overflow limiter.
    pub overflow_admits: u64,
    /// Requests of new keys refused an entry because the strategy's keys
    /// held its cap (`max_keys`); also counted in `full`.
    pub capped: u64,
}

/// The key table of a mapped file.
#[derive(Clone, Copy)]
pub struct KeyTable<'a> {
    header: Region<'a>,
    counters: Region<'a>,
    entries: Region<'a>,
    /// `entries` as (ident, state) pairs: `capacity` of them.
    pairs: &'a [[AtomicU64; 2]],
    slot_count: u32,
    capacity: u64,
    lines: u64,
    mix: MixKeys,
    /// The 16-byte CAS works on the entries and there are at least two
    /// lines ([`usable`](Self::usable)): asked once, when the table is built.
    usable: bool,
}

impl<'a> KeyTable<'a> {
    /// The table in `region` (validated by the header checks), hashing
    /// with `mix` (the keys [`MixKeys::from_secret`] derives from the
    /// file's secret, once per mapping); `cas`:
    /// whether the 16-byte CAS is usable on this region (`None`: find out).
    /// A file's [`Mapping`](super::shm::Mapping) builds its table once, so
    /// the request path neither rebuilds it nor asks the CPU.
    #[inline]
    pub fn new(
        region: Region<'a>,
        slot_count: u32,
        capacity: u64,
        mix: MixKeys,
        cas: Option<bool>,
    ) -> KeyTable<'a> {
        let cb = counters_bytes(slot_count);
        let empty = region.sub(0, 0).expect("empty");
        let header = region.sub(0, HEADER_BYTES).unwrap_or(empty);
        let counters = region.sub(HEADER_BYTES, cb).unwrap_or(empty);
        let entries = region
            .sub(HEADER_BYTES + cb, capacity.saturating_mul(ENTRY_BYTES))
            .unwrap_or(empty);
        let capacity = entries.len() as u64 / ENTRY_BYTES;
        let cas = cas.unwrap_or_else(|| {
            entries
                .u64_at(0)
                .is_some_and(super::limiter::warm_up::cas128_available)
        });
        KeyTable {
            header,
            counters,
            entries,
            pairs: entries.records::<2>(),
            slot_count,
            capacity,
            lines: capacity / LINE_ENTRIES,
            mix,
            usable: cas && capacity / LINE_ENTRIES >= 2,
        }
    }

    /// A table over process-local memory (tests, benchmarks).
    pub fn local(
        words: &'a [AtomicU64],
        slot_count: u32,
        capacity: u64,
        secret: [u8; 16],
    ) -> KeyTable<'a> {
        KeyTable::new(
            Region::from_atomics(words),
            slot_count,
            capacity,
            MixKeys::from_secret(secret),
            None,
        )
    }

    /// Words of process-local memory for [`local`](Self::local); the
    /// first entry must be 16-byte aligned: allocate one spare word and
    /// use [`aligned`].
    pub fn local_words(slot_count: u32, capacity: u64) -> Vec<AtomicU64> {
        (0..region_bytes(slot_count, capacity) / 8 + 2)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The cap of a per-key strategy without `max_keys`: half of the
    /// table's entries. One flooded strategy can then fill at most half
    /// of the table, where new keys of the others still find an entry
    /// (0 of 524,288 refused up to 50 % occupancy, see above).
    pub fn default_cap(&self) -> u64 {
        (self.capacity / 2).max(1)
    }

    /// The cap of a strategy whose `max_keys` is `max_keys` (0: default).
    #[inline]
    pub fn cap(&self, max_keys: u32) -> u64 {
        if max_keys == 0 {
            self.default_cap()
        } else {
            max_keys as u64
        }
    }

    /// Can this CPU and mapping run the table (16-byte CAS)?
    #[inline]
    pub fn usable(&self) -> bool {
        self.usable
    }

    /// Starts hashing a key of strategy `strategy_id`.
    #[inline]
    pub fn hasher(&self, strategy_id: u32) -> KeyHasher {
        KeyHasher(Mix::new(self.mix, strategy_id as u64))
    }

    /// The key a finished hash names, for the strategy in stat slot `slot`
    /// at `generation`; `None` for a slot past [`MAX_SLOT`].
    #[inline(always)]
    pub fn key(&self, h: KeyHasher, slot: u32, generation: u64) -> Option<KeyId> {
        if slot > MAX_SLOT || self.lines == 0 {
            return None;
        }
        let hv = h.0.finish();
        let line = ((hv >> 32) * self.lines) >> 32;
        Some(KeyId {
            ident: ((slot as u64 + 1) << 44) | ((generation & 0xFFF) << 32) | (hv & 0xFFFF_FFFF),
            start: line * LINE_ENTRIES,
        })
    }

    /// The first entry of window `w` of `key` (window 0: `key.start`; the
    /// others at lines a remix of the key's tag and first line picks: the
    /// key stays two words, as the request path passes it).
    #[inline]
    pub fn window_start(&self, key: &KeyId, w: u64) -> u64 {
        if w == 0 {
            return key.start;
        }
        let seed = (key.ident & 0xFFFF_FFFF) << 32 ^ key.start;
        let mut h =
            (seed ^ w.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        h ^= h >> 32;
        h = h.wrapping_mul(0xA076_1D64_78BD_642F);
        (((h >> 32) * self.lines) >> 32) * LINE_ENTRIES
    }

    /// Entry `p` (< [`PROBE`]) of `key`'s windows, in order.
    #[inline]
    fn at(&self, key: &KeyId, p: u64) -> u64 {
        (self.window_start(key, p / WINDOW) + p % WINDOW) % self.capacity
    }

    /// The order in which a new key looks at its windows for an entry:
    /// its first window while at least half of it is empty (most keys
    /// stay there: found in one window), else the windows by empty
    /// entries, most first (ties in window order). Placing by the emptier
    /// of three windows keeps a table 90 % full usable (see the module's
    /// doc for the measured figures).
    fn window_order(&self, key: &KeyId) -> [u64; WINDOWS as usize] {
        let empty = |w: u64| {
            let s = self.window_start(key, w);
            (0..WINDOW)
                .filter(|&o| self.entry((s + o) % self.capacity).load(Ordering::Acquire) == 0)
                .count()
        };
        let first = empty(0);
        if first >= FIRST_WINDOW_EMPTY {
            return [0, 1, 2];
        }
        let mut order = [(0u64, first), (1, empty(1)), (2, empty(2))];
        order.sort_by_key(|&(w, e)| (std::cmp::Reverse(e), w));
        order.map(|(w, _)| w)
    }

    /// The two words of entry `i` (< capacity; anything else is wrapped).
    #[inline(always)]
    fn words(&self, i: u64) -> &'a [AtomicU64; 2] {
        let i = if i < self.capacity {
            i
        } else {
            i % self.capacity
        };
        &self.pairs[i as usize]
    }

    #[inline(always)]
    fn entry(&self, i: u64) -> &'a AtomicU64 {
        &self.words(i)[0]
    }

    #[inline(always)]
    fn load(&self, i: u64) -> (u64, u64) {
        let w = self.words(i);
        (w[0].load(Ordering::Acquire), w[1].load(Ordering::Acquire))
    }

    #[inline]
    fn cas(&self, i: u64, old: [u64; 2], new: [u64; 2]) -> Result<(), [u64; 2]> {
        super::limiter::warm_up::cas128(self.entry(i), old, new)
    }

    fn counter(&self, slot: u32, off: usize) -> Option<&'a AtomicU64> {
        if slot >= self.slot_count {
            return None;
        }
        self.counters
            .u64_at(slot as usize * COUNTER_BYTES as usize + off)
    }

    fn bump(&self, slot: u32, off: usize) {
        if let Some(c) = self.counter(slot, off) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn drop_in_use(&self, slot: u32) {
        if let Some(c) = self.counter(slot, C_IN_USE) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }

    /// Counts a request of strategy `slot` that found its range full, and
    /// whether its overflow limiter admitted it.
    pub fn count_full(&self, slot: u32, overflow_admitted: bool) {
        self.bump(slot, C_FULL);
        if overflow_admitted {
            self.bump(slot, C_OVERFLOW);
        }
    }

    /// Agent side: a stat slot given to a new strategy starts with zero key
    /// counters (its old keys are free: their generation is another).
    pub fn reset_counters(&self, slot: u32) {
        for off in [
            C_IN_USE,
            C_RECLAIMS,
            C_FULL,
            C_OVERFLOW,
            C_CHARGED_AFTER,
            C_GIVEN_BACK,
            C_NOT_COUNTED,
            C_CAPPED,
        ] {
            if let Some(c) = self.counter(slot, off) {
                c.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Agent side, for a file adopted after a reboot (monotonic time
    /// restarted): every entry empty, every counter zero.
    pub fn clear(&self) {
        self.header.zero(0, self.header.len());
        self.counters.zero(0, self.counters.len());
        self.entries.zero(0, self.entries.len());
    }

    pub fn counters(&self, slot: u32) -> KeyCounters {
        let get = |off| {
            self.counter(slot, off)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        };
        KeyCounters {
            in_use: get(C_IN_USE),
            reclaims: get(C_RECLAIMS),
            full: get(C_FULL),
            overflow_admits: get(C_OVERFLOW),
            capped: get(C_CAPPED),
        }
    }

    /// Adds what settling a request did to strategy `slot`'s response
    /// counters (issue 31).
    pub fn count_settled(&self, slot: u32, s: &super::model::response::Settled) {
        for (off, n) in [
            (C_CHARGED_AFTER, s.charged_after),
            (C_GIVEN_BACK, s.given_back),
            (C_NOT_COUNTED, s.not_counted),
        ] {
            if n > 0 {
                if let Some(c) = self.counter(slot, off) {
                    c.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
    }

    /// Strategy `slot`'s response counters (issue 31).
    pub fn settled(&self, slot: u32) -> super::model::response::Settled {
        let get = |off| {
            self.counter(slot, off)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        };
        super::model::response::Settled {
            charged_after: get(C_CHARGED_AFTER),
            given_back: get(C_GIVEN_BACK),
            not_counted: get(C_NOT_COUNTED),
        }
    }

    pub fn stats(&self) -> TableStats {
        TableStats {
            capacity: self.capacity,
            occupied: self.header.load(T_OCCUPIED).min(self.capacity),
            max_probe: self.header.load(T_MAX_PROBE),
            claims: self.header.load(T_CLAIMS),
        }
    }

    /// Counts entries whose ident is not 0 (a full scan: `shm inspect`).
    pub fn scan_occupied(&self) -> u64 {
        (0..self.capacity).filter(|&i| self.load(i).0 != 0).count() as u64
    }
}

/// A 16-byte-aligned sub-slice of [`KeyTable::local_words`].
pub fn aligned(words: &[AtomicU64]) -> &[AtomicU64] {
    let skip = (words.as_ptr() as usize % 16) / 8;
    &words[skip..words.len() - 2 + skip]
}

/// A client address aggregated to its prefix: the bytes hashed as the
/// `ip` part of a key, and its text for `$rate_ctl_key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPrefix {
    addr: IpAddr,
    prefix: u8,
}

impl IpPrefix {
    /// `addr` masked to `v4` bits (IPv4, and IPv4-mapped IPv6) or `v6`
    /// bits (IPv6).
    pub fn new(addr: IpAddr, v4: u8, v6: u8) -> IpPrefix {
        let addr = match addr {
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v) => IpAddr::V4(v),
                None => IpAddr::V6(a),
            },
            a => a,
        };
        // The top `p` of an address's `width` bits.
        let top = |bits: u128, width: u8, p: u8| match p {
            0 => 0,
            p => bits & (u128::MAX << (width - p)),
        };
        let (addr, prefix) = match addr {
            IpAddr::V4(a) => {
                let p = v4.min(32);
                let bits = top(u32::from(a).into(), 32, p) as u32;
                (IpAddr::V4(bits.into()), p)
            }
            IpAddr::V6(a) => {
                let p = v6.min(128);
                (IpAddr::V6(top(u128::from(a), 128, p).into()), p)
            }
        };
        IpPrefix { addr, prefix }
    }

    /// Hashes this prefix as the `ip` part of a key (the words of
    /// [`KeyHasher::ip`]).
    pub fn hash_into(&self, h: &mut KeyHasher) {
        match self.addr {
            IpAddr::V4(a) => h.ip(0xffff_0000_0000 | u32::from(a) as u128, self.prefix, 128),
            IpAddr::V6(a) => h.ip(u128::from(a), 32, self.prefix),
        }
    }

    /// Family, masked address, prefix length, as bytes.
    pub fn bytes(&self) -> ([u8; 18], usize) {
        let mut b = [0u8; 18];
        match self.addr {
            IpAddr::V4(a) => {
                b[0] = 4;
                b[1..5].copy_from_slice(&a.octets());
                b[5] = self.prefix;
                (b, 6)
            }
            IpAddr::V6(a) => {
                b[0] = 6;
                b[1..17].copy_from_slice(&a.octets());
                b[17] = self.prefix;
                (b, 18)
            }
        }
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests;
