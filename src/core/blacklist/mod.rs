//! The shared-memory blacklist: the seed's multi-level hash, rebuilt in
//! place by the agent and read per request by every nginx worker.
//!
//! # Model
//!
//! An entry is `dimension = value` with an optional expiry time. A request is
//! blacklisted when one of its dimension values is an entry that has not
//! expired. `ip` values are stored exactly (128 bits, IPv4 as v4-mapped IPv6,
//! so `1.2.3.4` and `::ffff:1.2.3.4` are the same entry and `1.2.3.5` is
//! never confused with it); every other value is stored as a 64-bit hash.
//!
//! # Table
//!
//! `L` levels of strictly decreasing prime sizes (new tables: 4 levels with
//! 40 / 30 / 20 / 10 % of the slots, twice as many slots as the capacity). An
//! entry with 32-bit position hash `h` may sit at `h % size[0]` in level 0,
//! ..., `h % size[L-2]` in level `L-2`, or in the last level at one of
//! `probe` consecutive positions from `h % size[L-1]` (linear probing,
//! wrapping). The remainders are computed with two multiplies (Lemire's
//! fastmod), not a division.
//! An insert takes the first free position in that order. With 50 % load the
//! table holds its capacity with a wide margin (simulated: the first failed
//! insert comes after 1.3 × capacity random entries or more).
//!
//! A lookup checks every candidate position (removals leave holes, so an
//! empty slot does not end the search) but only the first `probe bound`
//! positions of the last level: the writer keeps that bound at the farthest
//! probe distance in use, so with a sparsely filled table a lookup is `L - 1`
//! slot checks, each one acquire load plus three relaxed loads on a hit.
//!
//! # Validity and rebuild (single writer: the agent)
//!
//! A slot is valid when its `seq` is non-zero and `>=` the public `seq` in
//! the header, and it has not expired. [`Blacklist::rebuild`] replaces the
//! whole list:
//!
//! 1. Plan in process memory first: which valid slots already hold an entry
//!    of the new list (kept), and where each new entry goes (a slot no kept
//!    or new entry uses: empty, stale, or holding an entry being removed). If
//!    an entry does not fit, nothing is written and the old list stays valid.
//! 2. Widen the header hints (dimensions in use, IP flag, probe bound) to
//!    cover the old and the new list.
//! 3. Pass 1: bump each kept slot in place to `seq + 1` (its expiry is
//!    rewritten first, its key never changes).
//! 4. Pass 2: write each new entry: slot `seq` := 0, fence, key and expiry,
//!    then `seq + 1` with release.
//! 5. Zero slots left over with a `seq` beyond the current one (a writer that
//!    died mid-rebuild), then store the public `seq + 1` with release: every
//!    slot not refreshed becomes invalid at once.
//! 6. Narrow the header hints to the new list and store the entry count.
//!
//! A kept entry's slot keeps its key and a valid `seq` throughout, so a
//! reader never misses it during a rebuild. Readers load the slot `seq`
//! (acquire), the key words and expiry, fence, and re-load `seq`; if it moved
//! they re-read the slot (bounded retries, then a miss).
//!
//! # Region layout (version 1)
//!
//! All fields are native-endian atomics; the project's hosts are
//! little-endian, so the file is little-endian. The region should start on a
//! 64-byte boundary so that no 32-byte slot straddles a cache line.
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | magic | `b"RCBLKLS1"` read as u64 LE; written last by [`init`] |
//! | 8 | 4 | version | layout version, 1 |
//! | 12 | 4 | levels | number of levels, 1..=8 |
//! | 16 | 4 | probe | linear-probe length of the last level, 1..=64, ≤ its size |
//! | 20 | 4 | capacity | entries the table was sized for; [`Blacklist::rebuild`] refuses more |
//! | 24 | 32 | level sizes | u32 × 8: slots per level, levels in use non-zero |
//! | 56 | 8 | seq | public sequence, starts at 1, +1 per rebuild (< 2^56) |
//! | 64 | 8 | count | entries in the current list (expired ones included) |
//! | 72 | 8 | probe bound | last-level positions a reader must check, 0..=probe |
//! | 80 | 8 | ip flag | 1 when exact IP entries may exist, else 0 |
//! | 88 | 8 | all-dims flag | 1 when more than 16 hashed dimensions are in use: check every dimension |
//! | 96 | 128 | dimension hashes | u64 × 16: [`dimension_hash`] of each hashed dimension in use, 0 = free |
//! | 224 | 16 | prefix lengths | u64 × 2: bit `L` (0..=127) set when network entries of IPv6-form prefix length `L` may exist (IPv4 `/n` is `96 + n`); layout version 3 |
//! | 240 | 16 | reserved | zero |
//! | 256 | 32 × Σ sizes | slots | level 0 slots, then level 1, ... |
//!
//! Slot (32 bytes):
//!
//! | offset | size | field | meaning |
//! |-------:|-----:|-------|---------|
//! | 0 | 8 | tag + seq | bits 56..63 tag (0 empty, 1 IP, 2 hashed value, `3 + L` a network of IPv6-form prefix length `L` < 128), bits 0..55 seq |
//! | 8 | 8 | key 1 | IP or network: high 64 bits of the IPv6 address (as `u128` from its octets; a network's host bits 0); hashed: [`value_hash`] |
//! | 16 | 8 | key 2 | IP: low 64 bits; hashed: [`dimension_hash`] of the dimension |
//! | 24 | 8 | expires | unix ms; the entry matches while `now < expires`; 0 = never (an input expiry of 0 is stored as 1) |
//!
//! # Hashes
//!
//! XXH3-64 (frozen since xxHash 0.8, no random seed, identical in every
//! process and build):
//!
//! * `dimension_hash(name) = xxh3_64(name)`, 0 replaced by 1;
//! * `value_hash(dh, value) = xxh3_64_with_seed(value, dh)`;
//! * position hash: `p = value_hash` for hashed entries, `p =
//!   xxh3_64(octets)` of the 16-byte IPv6 (v4-mapped) address for IPs,
//!   `xxh3_64_with_seed(octets, tag)` of a network's address,
//!   folded to 32 bits as `(p ^ (p >> 32)) as u32`.
//!
//! # Address ranges
//!
//! A network entry (`203.0.113.0/24`, see [`ipnet`](crate::core::model::ipnet))
//! is stored once under its masked address and its prefix length (in the
//! tag). The header lists the prefix lengths in use; a lookup of a client
//! address probes once per listed length with the address masked to it —
//! the cost grows with the number of distinct lengths, not of entries. The
//! writer widens the list before inserting and narrows it after, like the
//! dimension hints.
//!
//! False positives: IPs never (exact compare). A hashed value not in the
//! list matches only if its 64-bit value hash equals that of a listed value
//! of the same dimension: probability about `n / 2^64` per lookup for `n`
//! entries of that dimension, i.e. 5 × 10^-14 with a million entries (one
//! wrong block in roughly 600 years at a million lookups a second).
//!
//! Nothing here panics or reads out of bounds whatever the region holds:
//! [`Blacklist::open`] validates the geometry against the region length and
//! every access goes through [`Region`]'s bounds-checked atomics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::core::model::ipnet::{parse_ip_net, prefix_mask};
use crate::core::model::{parse_ip, valid_dimension_name, MAX_VALUE_LEN};
use crate::core::shm::region::Region;

// The writer side (`Blacklist::rebuild`), apart from the request path
// (`open`, `contains*`) here.
mod build;

/// `b"RCBLKLS1"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RCBLKLS1");
/// Layout version written by [`init`] and accepted by [`Blacklist::open`].
pub const VERSION: u32 = 1;
/// Bytes before the first slot.
pub const HEADER_BYTES: usize = 256;
/// Bytes per slot.
pub const SLOT_BYTES: usize = 32;
/// Most levels a table may have.
pub const MAX_LEVELS: usize = 8;
/// Longest linear probe a table may have.
pub const MAX_PROBE: u32 = 64;
/// Hashed dimensions listed in the header; more set the all-dims flag.
pub const MAX_LISTED_DIMENSIONS: usize = 16;

/// Levels of a table made by [`init`].
const NEW_LEVELS: usize = 4;
/// Probe length of a table made by [`init`].
const NEW_PROBE: u32 = 16;
/// Share of the slots per level (percent) in a table made by [`init`].
const NEW_LEVEL_PERCENT: [u64; NEW_LEVELS] = [40, 30, 20, 10];
/// Slots per entry of capacity (load factor 1/2).
const SLOTS_PER_ENTRY: u64 = 2;
/// Fewest slots in a table made by [`init`].
const MIN_SLOTS: u64 = 64;

const SEQ_BITS: u32 = 56;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const TAG_IP: u64 = 1;
const TAG_HASH: u64 = 2;
/// A network of prefix length `L` (< 128, IPv6 form) has tag `TAG_NET + L`.
const TAG_NET: u64 = 3;
/// Re-reads of one slot whose seq moved during the read.
const SLOT_RETRIES: usize = 16;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_LEVELS: usize = 12;
const OFF_PROBE: usize = 16;
const OFF_CAPACITY: usize = 20;
const OFF_SIZES: usize = 24;
const OFF_SEQ: usize = 56;
const OFF_COUNT: usize = 64;
const OFF_BOUND: usize = 72;
const OFF_IP: usize = 80;
const OFF_ALL_DIMS: usize = 88;
const OFF_DIMS: usize = 96;
const OFF_PREFIXES: usize = 224;

/// What went wrong with a blacklist region or a rebuild.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlacklistError {
    #[error("blacklist region: {needed} bytes needed, {available} available")]
    RegionTooSmall { needed: u64, available: u64 },
    #[error("blacklist region: bad magic {found:#018x} (not initialised or not a blacklist)")]
    BadMagic { found: u64 },
    #[error("blacklist region: layout version {found}, this build reads {VERSION}")]
    UnsupportedVersion { found: u32 },
    #[error("blacklist region: header field {field} has invalid value {value}")]
    BadHeader { field: &'static str, value: u64 },
    #[error("blacklist: {entries} distinct entries, the table capacity is {capacity}")]
    CapacityExceeded { entries: usize, capacity: u32 },
    #[error("blacklist: table full, no free slot for entry {index} ({dimension}) of {entries} (capacity {capacity}); the previous list is unchanged")]
    TableFull {
        index: usize,
        dimension: String,
        entries: usize,
        capacity: u32,
    },
    #[error("blacklist entry {index}: {reason}")]
    InvalidEntry { index: usize, reason: String },
    #[error("blacklist: sequence number exhausted; re-initialise the table")]
    SeqExhausted,
}

/// One blacklist entry as the writer gets it from the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlacklistEntry {
    pub dimension: String,
    pub value: Vec<u8>,
    /// Unix time in ms from which the entry no longer matches; `None` = never.
    pub expires_unix_ms: Option<u64>,
}

impl BlacklistEntry {
    pub fn new(
        dimension: impl Into<String>,
        value: impl Into<Vec<u8>>,
        expires_unix_ms: Option<u64>,
    ) -> BlacklistEntry {
        BlacklistEntry {
            dimension: dimension.into(),
            value: value.into(),
            expires_unix_ms,
        }
    }
}

/// What a rebuild did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RebuildReport {
    /// The public sequence now in force.
    pub seq: u64,
    /// Distinct entries in the new list.
    pub entries: usize,
    /// Entries of the old list kept in place.
    pub kept: usize,
    /// Entries written to a new slot.
    pub inserted: usize,
    /// Entries of the old list that are gone.
    pub removed: usize,
    /// Input entries merged into another with the same key (the later
    /// expiry wins, `None` = never beats any time).
    pub merged_duplicates: usize,
}

/// Hash of a dimension name (never 0): XXH3-64 of its bytes.
pub fn dimension_hash(name: &str) -> u64 {
    match xxh3_64(name.as_bytes()) {
        0 => 1,
        h => h,
    }
}

/// Hash of a value of the dimension whose [`dimension_hash`] is `dim_hash`.
pub fn value_hash(dim_hash: u64, value: &[u8]) -> u64 {
    xxh3_64_with_seed(value, dim_hash)
}

/// A slot key: tag, the two key words, and the position hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    tag: u64,
    k1: u64,
    k2: u64,
}

impl Key {
    fn ip(ip: IpAddr) -> Key {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let u = u128::from(v6);
        Key {
            tag: TAG_IP,
            k1: (u >> 64) as u64,
            k2: u as u64,
        }
    }

    /// A network: `addr` (IPv6 form) masked to `len` < 128 bits.
    fn net(addr: u128, len: u8) -> Key {
        Key {
            tag: TAG_NET + u64::from(len),
            k1: (addr >> 64) as u64,
            k2: addr as u64,
        }
    }

    fn addr(&self) -> u128 {
        (u128::from(self.k1) << 64) | u128::from(self.k2)
    }

    fn hashed(dim_hash: u64, value: &[u8]) -> Key {
        Key {
            tag: TAG_HASH,
            k1: value_hash(dim_hash, value),
            k2: dim_hash,
        }
    }

    /// The 32-bit position hash: the 64-bit one folded.
    fn position(&self) -> u32 {
        let h = if self.tag == TAG_IP {
            xxh3_64(&self.addr().to_be_bytes())
        } else if self.tag >= TAG_NET {
            xxh3_64_with_seed(&self.addr().to_be_bytes(), self.tag)
        } else {
            self.k1
        };
        (h ^ (h >> 32)) as u32
    }
}

/// Multiplier for [`fastmod`] by `d` (Lemire, Kaser, Kurz: "Faster
/// remainder by direct computation", 2019).
fn fastmod_multiplier(d: u32) -> u64 {
    (u64::MAX / u64::from(d.max(1))).wrapping_add(1)
}

/// `a % d` for `d >= 1` without a division instruction (two multiplies).
#[inline]
fn fastmod(a: u32, m: u64, d: u32) -> u32 {
    let low = m.wrapping_mul(u64::from(a));
    ((u128::from(low) * u128::from(d)) >> 64) as u32
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let mut d = 3u64;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// Largest prime `<= n`, at least 2.
fn prime_at_most(mut n: u64) -> u64 {
    while n > 2 && !is_prime(n) {
        n -= 1;
    }
    n.max(2)
}

/// Smallest prime `>= n`.
fn prime_at_least(mut n: u64) -> u64 {
    while !is_prime(n) {
        n += 1;
    }
    n
}

/// Level sizes of a new table for `capacity` entries: primes, strictly
/// decreasing, the last one at least the probe length.
fn new_geometry(capacity: u32) -> [u32; NEW_LEVELS] {
    let total = (u64::from(capacity) * SLOTS_PER_ENTRY).max(MIN_SLOTS);
    let mut sizes = [0u32; NEW_LEVELS];
    let mut below = u64::from(NEW_PROBE) - 1;
    for (size, pct) in sizes.iter_mut().zip(NEW_LEVEL_PERCENT).rev() {
        let p = prime_at_most(total * pct / 100).max(prime_at_least(below + 1));
        // total <= 2^33, so each level is below 2^32.
        *size = u32::try_from(p).unwrap_or(u32::MAX);
        below = p;
    }
    sizes
}

/// Bytes a table for `capacity` entries needs (header and slots).
pub fn region_bytes(capacity: u32) -> u64 {
    let slots: u64 = new_geometry(capacity).iter().map(|&s| u64::from(s)).sum();
    HEADER_BYTES as u64 + slots * SLOT_BYTES as u64
}

fn header_word<'a>(region: &Region<'a>, off: usize) -> Result<&'a AtomicU64, BlacklistError> {
    region.u64_at(off).ok_or(BlacklistError::RegionTooSmall {
        needed: HEADER_BYTES as u64,
        available: region.len() as u64,
    })
}

/// Formats an empty table for `capacity` entries (writer only, while no
/// reader uses the region). The magic is written last.
pub fn init(region: Region<'_>, capacity: u32) -> Result<(), BlacklistError> {
    let needed = region_bytes(capacity);
    if (region.len() as u64) < needed {
        return Err(BlacklistError::RegionTooSmall {
            needed,
            available: region.len() as u64,
        });
    }
    let magic = header_word(&region, OFF_MAGIC)?;
    magic.store(0, Ordering::Release);
    // needed <= region.len(), a usize, and is a multiple of 8.
    let len = usize::try_from(needed).unwrap_or(usize::MAX);
    region.zero(8, len - 8);
    let sizes = new_geometry(capacity);
    let u32_at = |off: usize, v: u32| {
        if let Some(w) = region.u32_at(off) {
            w.store(v, Ordering::Relaxed);
        }
    };
    u32_at(OFF_VERSION, VERSION);
    u32_at(OFF_LEVELS, NEW_LEVELS as u32);
    u32_at(OFF_PROBE, NEW_PROBE);
    u32_at(OFF_CAPACITY, capacity);
    for (i, s) in sizes.iter().enumerate() {
        u32_at(OFF_SIZES + 4 * i, *s);
    }
    region.store(OFF_SEQ, 1);
    magic.store(MAGIC, Ordering::Release);
    Ok(())
}

/// The hashed dimensions (and whether IPs) that have entries; a request's
/// other dimensions need no lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimensionsInUse {
    /// Exact IP entries may exist.
    pub ip: bool,
    /// More than [`MAX_LISTED_DIMENSIONS`] hashed dimensions: every
    /// dimension may have entries.
    pub all: bool,
    hashes: [u64; MAX_LISTED_DIMENSIONS],
}

impl DimensionsInUse {
    /// May `dimension` have entries? (`ip` asks about exact IP entries.)
    pub fn contains(&self, dimension: &str) -> bool {
        if dimension == "ip" {
            return self.ip;
        }
        self.contains_hash(dimension_hash(dimension))
    }

    /// As [`contains`](Self::contains) for a hashed dimension's
    /// [`dimension_hash`].
    pub fn contains_hash(&self, dim_hash: u64) -> bool {
        self.all || self.hashes.contains(&dim_hash)
    }

    /// The listed dimension hashes.
    pub fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.hashes.iter().copied().filter(|&h| h != 0)
    }
}

/// A blacklist table over a shared-memory region, for readers and the
/// (single) writer.
#[derive(Clone, Copy)]
pub struct Blacklist<'a> {
    region: Region<'a>,
    levels: usize,
    probe: u32,
    capacity: u32,
    sizes: [u32; MAX_LEVELS],
    multipliers: [u64; MAX_LEVELS],
    bases: [u64; MAX_LEVELS],
    total_slots: u64,
}

impl<'a> Blacklist<'a> {
    /// Checks the header of an untrusted region: magic, version, geometry
    /// within the region, sequence in range.
    pub fn open(region: Region<'a>) -> Result<Blacklist<'a>, BlacklistError> {
        if region.len() < HEADER_BYTES {
            return Err(BlacklistError::RegionTooSmall {
                needed: HEADER_BYTES as u64,
                available: region.len() as u64,
            });
        }
        let magic = header_word(&region, OFF_MAGIC)?.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(BlacklistError::BadMagic { found: magic });
        }
        let u32_at = |off: usize| {
            region
                .u32_at(off)
                .map(|w| w.load(Ordering::Relaxed))
                .unwrap_or(0)
        };
        let version = u32_at(OFF_VERSION);
        if version != VERSION {
            return Err(BlacklistError::UnsupportedVersion { found: version });
        }
        let levels = u32_at(OFF_LEVELS);
        if levels == 0 || levels as usize > MAX_LEVELS {
            return Err(BlacklistError::BadHeader {
                field: "levels",
                value: levels.into(),
            });
        }
        let levels = levels as usize;
        let probe = u32_at(OFF_PROBE);
        if probe == 0 || probe > MAX_PROBE {
            return Err(BlacklistError::BadHeader {
                field: "probe",
                value: probe.into(),
            });
        }
        let mut sizes = [0u32; MAX_LEVELS];
        let mut multipliers = [0u64; MAX_LEVELS];
        let mut bases = [0u64; MAX_LEVELS];
        let mut total = 0u64;
        for i in 0..levels {
            let s = u32_at(OFF_SIZES + 4 * i);
            if s == 0 {
                return Err(BlacklistError::BadHeader {
                    field: "level size",
                    value: 0,
                });
            }
            sizes[i] = s;
            multipliers[i] = fastmod_multiplier(s);
            bases[i] = total;
            total += u64::from(s); // at most 8 × 2^32: no overflow
        }
        if probe > sizes[levels - 1] {
            return Err(BlacklistError::BadHeader {
                field: "probe",
                value: probe.into(),
            });
        }
        let needed = HEADER_BYTES as u64 + total * SLOT_BYTES as u64;
        if needed > region.len() as u64 {
            return Err(BlacklistError::RegionTooSmall {
                needed,
                available: region.len() as u64,
            });
        }
        let seq = region.load(OFF_SEQ);
        if seq == 0 || seq > SEQ_MASK {
            return Err(BlacklistError::BadHeader {
                field: "seq",
                value: seq,
            });
        }
        Ok(Blacklist {
            region,
            levels,
            probe,
            capacity: u32_at(OFF_CAPACITY),
            sizes,
            multipliers,
            bases,
            total_slots: total,
        })
    }

    /// Entries the table was sized for.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries in the current list (expired ones included).
    pub fn len(&self) -> usize {
        usize::try_from(self.load_acquire(OFF_COUNT)).unwrap_or(usize::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The public sequence (bumped by every rebuild).
    pub fn seq(&self) -> u64 {
        self.region.load(OFF_SEQ)
    }

    /// Which dimensions have entries.
    pub fn dimensions_in_use(&self) -> DimensionsInUse {
        let mut hashes = [0u64; MAX_LISTED_DIMENSIONS];
        let all = self.flag(OFF_ALL_DIMS);
        for (i, h) in hashes.iter_mut().enumerate() {
            *h = self.region.load(OFF_DIMS + 8 * i);
        }
        DimensionsInUse {
            ip: self.flag(OFF_IP),
            all,
            hashes,
        }
    }

    /// Is `ip` blacklisted, exactly or by a network holding it (and not
    /// expired at `now_unix_ms`)? One probe for the address, one per
    /// prefix length of the networks listed.
    pub fn contains_ip(&self, ip: IpAddr, now_unix_ms: u64) -> bool {
        let key = Key::ip(ip);
        if self.flag(OFF_IP) && self.lookup(key, now_unix_ms) {
            return true;
        }
        let addr = key.addr();
        for w in 0..2 {
            let mut bits = self.load_acquire(OFF_PREFIXES + 8 * w);
            while bits != 0 {
                let len = (64 * w as u32 + bits.trailing_zeros()) as u8;
                bits &= bits - 1;
                if self.lookup(Key::net(addr & prefix_mask(len), len), now_unix_ms) {
                    return true;
                }
            }
        }
        false
    }

    /// Prefix lengths (IPv6 form) of the network entries that may exist.
    pub fn prefix_lengths(&self) -> Vec<u8> {
        (0..128u8)
            .filter(|&l| {
                self.load_acquire(OFF_PREFIXES + 8 * (l as usize / 64)) >> (l % 64) & 1 == 1
            })
            .collect()
    }

    /// Is `dimension = value` blacklisted? `ip` values that parse as an
    /// address take the exact path of [`contains_ip`](Self::contains_ip).
    pub fn contains(&self, dimension: &str, value: &[u8], now_unix_ms: u64) -> bool {
        if dimension == "ip" {
            if let Some(ip) = parse_ip(value) {
                return self.contains_ip(ip, now_unix_ms);
            }
            // A network: is that entry listed?
            if let Ok(n) = parse_ip_net(value) {
                return self.lookup(Key::net(n.addr, n.len), now_unix_ms);
            }
        }
        self.contains_hashed(dimension_hash(dimension), value, now_unix_ms)
    }

    /// As [`contains`](Self::contains) for a hashed dimension given by its
    /// precomputed [`dimension_hash`] (no IP parsing).
    pub fn contains_hashed(&self, dim_hash: u64, value: &[u8], now_unix_ms: u64) -> bool {
        if !self.dimension_listed(dim_hash) {
            return false;
        }
        self.lookup(Key::hashed(dim_hash, value), now_unix_ms)
    }

    fn load_acquire(&self, off: usize) -> u64 {
        self.region
            .u64_at(off)
            .map(|w| w.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    fn flag(&self, off: usize) -> bool {
        self.load_acquire(off) != 0
    }

    fn dimension_listed(&self, dim_hash: u64) -> bool {
        self.flag(OFF_ALL_DIMS)
            || (0..MAX_LISTED_DIMENSIONS).any(|i| self.region.load(OFF_DIMS + 8 * i) == dim_hash)
    }

    fn slot_off(&self, slot: u64) -> usize {
        // slot < total_slots, and open() checked that all slots fit.
        HEADER_BYTES + (slot as usize) * SLOT_BYTES
    }

    /// `pos % size` of level `lvl`.
    #[inline]
    fn level_index(&self, lvl: usize, pos: u32) -> u32 {
        fastmod(pos, self.multipliers[lvl], self.sizes[lvl])
    }

    /// Calls `f` with every candidate slot of `pos` in insertion order,
    /// checking `last_probes` positions of the last level; stops at `true`.
    #[inline]
    fn any_position(&self, pos: u32, last_probes: u32, mut f: impl FnMut(u64) -> bool) -> bool {
        let last = self.levels - 1;
        for lvl in 0..last {
            if f(self.bases[lvl] + u64::from(self.level_index(lvl, pos))) {
                return true;
            }
        }
        let size = self.sizes[last];
        let mut p = self.level_index(last, pos);
        for _ in 0..last_probes.min(self.probe) {
            if f(self.bases[last] + u64::from(p)) {
                return true;
            }
            p += 1;
            if p == size {
                p = 0;
            }
        }
        false
    }

    #[inline]
    fn lookup(&self, key: Key, now_unix_ms: u64) -> bool {
        if self.load_acquire(OFF_COUNT) == 0 {
            return false;
        }
        let public = match self.region.u64_at(OFF_SEQ) {
            Some(w) => w.load(Ordering::Acquire),
            None => return false,
        };
        let bound = u32::try_from(self.region.load(OFF_BOUND)).unwrap_or(u32::MAX);
        self.any_position(key.position(), bound, |slot| {
            self.slot_matches(self.slot_off(slot), key, public, now_unix_ms)
        })
    }

    /// Seqlock read of one slot.
    #[inline]
    fn slot_matches(&self, off: usize, key: Key, public: u64, now_unix_ms: u64) -> bool {
        let r = &self.region;
        let Some(w0) = r.u64_at(off) else {
            return false;
        };
        let mut s1 = w0.load(Ordering::Acquire);
        // Most slots a lookup visits are empty, stale or of another kind:
        // one load decides.
        if s1 >> SEQ_BITS != key.tag {
            return false;
        }
        let (Some(w1), Some(w2), Some(w3)) =
            (r.u64_at(off + 8), r.u64_at(off + 16), r.u64_at(off + 24))
        else {
            return false;
        };
        for _ in 0..SLOT_RETRIES {
            let seq = s1 & SEQ_MASK;
            if s1 >> SEQ_BITS != key.tag || seq == 0 || seq < public {
                return false;
            }
            let k1 = w1.load(Ordering::Relaxed);
            let k2 = w2.load(Ordering::Relaxed);
            let expires = w3.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            let s2 = w0.load(Ordering::Relaxed);
            if s2 == s1 {
                return k1 == key.k1 && k2 == key.k2 && (expires == 0 || now_unix_ms < expires);
            }
            s1 = w0.load(Ordering::Acquire);
        }
        false
    }
}

#[cfg(test)]
mod tests;
