//! The header of the configuration file and the geometry it records:
//! field offsets, capacities, and the regions' offsets and sizes, checked
//! against the real file sizes before any region is used.

use std::path::{Path, PathBuf};

use super::region::Region;
use super::slot::SLOT_SIZE;
use super::ShmError;

/// `"RATECTL\0"` read as a little-endian u64.
pub const FILE_MAGIC: u64 = u64::from_le_bytes(*b"RATECTL\0");
/// Version of the whole layout (header, segments, slots, blacklist).
/// 2: the concurrency ledger region (`H_LEDGER_OFF`, `H_LEDGER_LEN`) and
/// the warm-up fields of a segment's strategy record. 3: the priority
/// in the strategy record (56 fixed bytes), action 4 `allow`, address
/// ranges in the blacklist (tags 3..=131, prefix bitset at 224), the
/// per-key table region (`H_KEYS_*`, [`crate::core::keys`]) and the per-key
/// fields after a strategy record's conditions. 4: two files, the
/// configuration (header, bitmap, segments, blacklist; written by the
/// agent only, mapped read-only by workers) and the state file beside it
/// (`PATH.state`: stat slots, ledger, key table; written by workers), the
/// regions' offsets counting on from the configuration into the state
/// file (`H_STATE_OFF`, `H_PAIR_ID`, [`state_path`]). Also in 4: a key of the key table
/// may be in any of three windows of 16 entries (was one range of 8), and
/// a key table holds at least 16 entries: a module of version 3 would not
/// find keys placed in the other windows, so the files differ. Also in 4: a strategy
/// record's response and cost fields after its per-key fields (issue 31)
/// and 64 bytes of counters per slot in the key table (was 32).
/// Version 5 (session 15, shared by its branches): record flags at record
/// bytes 54..56, and calendar windows (issue 33: units `week` 5 and
/// `month` 6, the calendar block ending a record with a `tz`).
/// 5: the ban table at the end of the state file (`H_BANS_*`, issue 32,
/// [`crate::core::bans`]) and the strategy record's flags (bytes 54..56).
/// 5: the top-keys region at the end of the state file (issue 33,
/// `H_TOP_*`, [`crate::core::keys::top`]).
pub const LAYOUT_VERSION: u32 = 5;
/// Value of the init flag once the file is fully initialised.
pub const INIT_DONE: u32 = u32::from_le_bytes(*b"INIT");
pub const HEADER_SIZE: u64 = 4096;
pub(super) const PAGE: u64 = 4096;

// Header field offsets (bytes from the start of the file).
pub const H_MAGIC: usize = 0;
pub const H_VERSION_INIT: usize = 8; // u32 layout version | u32 init flag << 32
pub const H_SEQ: usize = 16;
pub const H_HEARTBEAT: usize = 24;
pub const H_FILE_SIZE: usize = 32;
pub const H_SLOT_SIZE_COUNT: usize = 40; // u32 slot size | u32 slot count << 32
pub const H_BITMAP_OFF: usize = 48;
pub const H_BITMAP_LEN: usize = 56;
pub const H_SEG_A_OFF: usize = 64;
pub const H_SEG_B_OFF: usize = 72;
pub const H_SEG_LEN: usize = 80;
pub const H_SLOTS_OFF: usize = 88;
pub const H_SLOTS_LEN: usize = 96;
pub const H_BL_OFF: usize = 104;
pub const H_BL_LEN: usize = 112;
pub const H_BL_CAPACITY: usize = 120;
pub const H_GEOMETRY_CRC: usize = 128;
pub const H_CREATED: usize = 136;
pub const H_BOOT_ID: usize = 144; // 16 bytes
pub const H_WRITER_PID: usize = 160;
pub const H_CONFIG_VERSION: usize = 168;
pub const H_LEDGER_OFF: usize = 176;
pub const H_LEDGER_LEN: usize = 184;
pub const H_KEYS_OFF: usize = 192;
pub const H_KEYS_LEN: usize = 200;
pub const H_KEYS_CAPACITY: usize = 208;
/// 16 bytes: the key table's hash secret (random per file).
pub const H_KEYS_SECRET: usize = 216;
/// Where the state file begins in the offsets of the header (the
/// configuration file's length as laid out; page aligned).
pub const H_STATE_OFF: usize = 232;
/// 16 bytes: random per pair of files, repeated in the state file's
/// header, so that a configuration is never paired with another's state.
pub const H_PAIR_ID: usize = 240;
/// The ban table (issue 32): offset, length, rows (layout version 5).
pub const H_BANS_OFF: usize = 256;
pub const H_BANS_LEN: usize = 264;
pub const H_BANS_CAPACITY: usize = 272;
/// The top-keys region (issue 33): offset, length, tables
/// ([`crate::core::keys::top`]); the last region of the state file.
pub const H_TOP_OFF: usize = 280;
pub const H_TOP_LEN: usize = 288;
pub const H_TOP_CAPACITY: usize = 296;
/// `"RCSTATE\0"`: magic of the state file's header.
pub const STATE_MAGIC: u64 = u64::from_le_bytes(*b"RCSTATE\0");
/// State file header fields (bytes from the start of the state file).
pub const ST_MAGIC: usize = 0;
pub const ST_VERSION: usize = 8;
pub const ST_PAIR_ID: usize = 16;
/// The id of the last key reset (issue 33) the agent applied to this
/// file (0: none yet): an agent that restarts goes on from it, so a reset
/// recorded while it was down is still applied.
pub const ST_KEY_RESET: usize = 32;
/// Geometry fields covered by the CRC at `H_GEOMETRY_CRC`.
const GEOMETRY: std::ops::Range<usize> = H_FILE_SIZE..H_GEOMETRY_CRC;

/// How large the agent makes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacities {
    /// Strategies (and stat slots).
    pub max_strategies: u32,
    /// Bytes of one config segment (A and B are each this large).
    pub segment_bytes: u64,
    /// Blacklist entries.
    pub blacklist_entries: u32,
    /// Entries of the per-key table (one per client, user or value tuple
    /// of the strategies with `each`), rounded up to whole cache lines.
    pub keys: u32,
}

impl Capacities {
    /// Room for `max_strategies` in segments of `segment_bytes`, with a
    /// small blacklist (256) and key table (4,096): the files of tests,
    /// benchmarks and tools that size only the strategy table.
    pub fn tables(max_strategies: u32, segment_bytes: u64) -> Capacities {
        Capacities {
            max_strategies,
            segment_bytes,
            blacklist_entries: 256,
            keys: 4096,
        }
    }
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            max_strategies: 65_536,
            segment_bytes: 16 << 20,
            blacklist_entries: 65_536,
            keys: crate::core::keys::DEFAULT_KEYS,
        }
    }
}

/// Offsets and sizes of the regions, as validated from a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// End of the last region: the configuration file's length plus the
    /// state file's.
    pub file_size: u64,
    /// Where the state file begins (= the configuration file's length);
    /// its 4096-byte header is there, the slots after it.
    pub state_off: u64,
    pub slot_count: u32,
    pub bitmap_off: u64,
    pub bitmap_len: u64,
    pub seg_off: [u64; 2],
    pub seg_len: u64,
    pub slots_off: u64,
    pub slots_len: u64,
    pub bl_off: u64,
    pub bl_len: u64,
    pub bl_capacity: u32,
    pub ledger_off: u64,
    pub ledger_len: u64,
    pub keys_off: u64,
    pub keys_len: u64,
    /// Entries of the key table.
    pub keys_capacity: u64,
    /// The ban table, after the key table (issue 32).
    pub bans_off: u64,
    pub bans_len: u64,
    /// Rows of the ban table.
    pub bans_capacity: u64,
    /// The top-keys region (issue 33) and its tables.
    pub top_off: u64,
    pub top_len: u64,
    pub top_tables: u32,
}

/// Where the top-keys region goes after the region ending at `end`, for
/// `slot_count` stat slots: (offset, length, tables). The one place that
/// sizes it (a region added before it chains its end in here).
pub fn top_region(end: u64, slot_count: u32) -> (u64, u64, u32) {
    let tables = crate::core::keys::top::tables_for(slot_count);
    (
        end,
        page_up(crate::core::keys::top::region_bytes(tables)),
        tables,
    )
}

fn page_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

impl Geometry {
    /// The geometry a writer lays out for these capacities.
    pub fn for_capacities(c: &Capacities) -> Result<Geometry, ShmError> {
        if c.max_strategies == 0 {
            return Err(ShmError::BadCapacity("max strategies must be at least 1"));
        }
        if c.segment_bytes < 4096 || c.segment_bytes > (1 << 32) {
            return Err(ShmError::Capacity {
                what: "segment bytes (4 KiB ..= 4 GiB)",
                limit: 1 << 32,
                needed: c.segment_bytes,
            });
        }
        let bitmap_off = HEADER_SIZE;
        let bitmap_len = page_up((c.max_strategies as u64).div_ceil(64) * 8);
        let seg_len = page_up(c.segment_bytes);
        let seg_a = bitmap_off + bitmap_len;
        let seg_b = seg_a + seg_len;
        let bl_off = seg_b + seg_len;
        let bl_len = page_up(crate::core::blacklist::region_bytes(c.blacklist_entries));
        let state_off = bl_off + bl_len;
        let slots_off = state_off + HEADER_SIZE;
        let slots_len = page_up(c.max_strategies as u64 * SLOT_SIZE as u64);
        let ledger_off = slots_off + slots_len;
        let ledger_len = super::ledger::region_bytes();
        let keys_off = ledger_off + ledger_len;
        let keys_capacity = crate::core::keys::capacity_for(c.keys)?;
        let keys_len = page_up(crate::core::keys::region_bytes(
            c.max_strategies,
            keys_capacity,
        ));
        let (bans_off, bans_len, bans_capacity) = ban_region(keys_off + keys_len);
        let (top_off, top_len, top_tables) = top_region(bans_off + bans_len, c.max_strategies);
        Ok(Geometry {
            file_size: top_off + top_len,
            state_off,
            slot_count: c.max_strategies,
            bitmap_off,
            bitmap_len,
            seg_off: [seg_a, seg_b],
            seg_len,
            slots_off,
            slots_len,
            bl_off,
            bl_len,
            bl_capacity: c.blacklist_entries,
            ledger_off,
            ledger_len,
            keys_off,
            keys_len,
            keys_capacity,
            bans_off,
            bans_len,
            bans_capacity,
            top_off,
            top_len,
            top_tables,
        })
    }

    pub(super) fn write(&self, h: &Region<'_>) {
        h.store(H_FILE_SIZE, self.file_size);
        h.store(
            H_SLOT_SIZE_COUNT,
            SLOT_SIZE as u64 | (self.slot_count as u64) << 32,
        );
        h.store(H_BITMAP_OFF, self.bitmap_off);
        h.store(H_BITMAP_LEN, self.bitmap_len);
        h.store(H_SEG_A_OFF, self.seg_off[0]);
        h.store(H_SEG_B_OFF, self.seg_off[1]);
        h.store(H_SEG_LEN, self.seg_len);
        h.store(H_SLOTS_OFF, self.slots_off);
        h.store(H_SLOTS_LEN, self.slots_len);
        h.store(H_BL_OFF, self.bl_off);
        h.store(H_BL_LEN, self.bl_len);
        h.store(H_BL_CAPACITY, self.bl_capacity as u64);
        h.store(H_GEOMETRY_CRC, geometry_crc(h) as u64);
        h.store(H_LEDGER_OFF, self.ledger_off);
        h.store(H_LEDGER_LEN, self.ledger_len);
        h.store(H_KEYS_OFF, self.keys_off);
        h.store(H_KEYS_LEN, self.keys_len);
        h.store(H_KEYS_CAPACITY, self.keys_capacity);
        h.store(H_TOP_OFF, self.top_off);
        h.store(H_TOP_LEN, self.top_len);
        h.store(H_TOP_CAPACITY, self.top_tables as u64);
        h.store(H_STATE_OFF, self.state_off);
        h.store(H_BANS_OFF, self.bans_off);
        h.store(H_BANS_LEN, self.bans_len);
        h.store(H_BANS_CAPACITY, self.bans_capacity);
    }

    /// Bytes of the configuration file.
    pub fn config_len(&self) -> u64 {
        self.state_off
    }

    /// Bytes of the state file.
    pub fn state_len(&self) -> u64 {
        self.file_size - self.state_off
    }

    /// Reads and validates the geometry of a configuration file of
    /// `config_size` bytes whose state file has `state_size` bytes.
    pub(crate) fn read(
        h: &Region<'_>,
        config_size: u64,
        state_size: u64,
        path: &Path,
    ) -> Result<Geometry, ShmError> {
        let bad = |what| ShmError::Geometry {
            path: path.to_path_buf(),
            what,
        };
        if h.load(H_GEOMETRY_CRC) != geometry_crc(h) as u64 {
            return Err(bad("geometry checksum mismatch"));
        }
        let sc = h.load(H_SLOT_SIZE_COUNT);
        if sc & 0xffff_ffff != SLOT_SIZE as u64 {
            return Err(bad("slot size"));
        }
        let g = Geometry {
            file_size: h.load(H_FILE_SIZE),
            state_off: h.load(H_STATE_OFF),
            slot_count: (sc >> 32) as u32,
            bitmap_off: h.load(H_BITMAP_OFF),
            bitmap_len: h.load(H_BITMAP_LEN),
            seg_off: [h.load(H_SEG_A_OFF), h.load(H_SEG_B_OFF)],
            seg_len: h.load(H_SEG_LEN),
            slots_off: h.load(H_SLOTS_OFF),
            slots_len: h.load(H_SLOTS_LEN),
            bl_off: h.load(H_BL_OFF),
            bl_len: h.load(H_BL_LEN),
            bl_capacity: h.load(H_BL_CAPACITY).min(u32::MAX as u64) as u32,
            ledger_off: h.load(H_LEDGER_OFF),
            ledger_len: h.load(H_LEDGER_LEN),
            keys_off: h.load(H_KEYS_OFF),
            keys_len: h.load(H_KEYS_LEN),
            keys_capacity: h.load(H_KEYS_CAPACITY),
            bans_off: h.load(H_BANS_OFF),
            bans_len: h.load(H_BANS_LEN),
            bans_capacity: h.load(H_BANS_CAPACITY),
            top_off: h.load(H_TOP_OFF),
            top_len: h.load(H_TOP_LEN),
            top_tables: h.load(H_TOP_CAPACITY).min(u32::MAX as u64) as u32,
        };
        if g.state_off > g.file_size || g.state_off < HEADER_SIZE {
            return Err(bad("state offset outside the file"));
        }
        if g.state_off > config_size {
            return Err(ShmError::Truncated {
                path: path.to_path_buf(),
                size: config_size,
                expected: g.state_off,
            });
        }
        if g.state_len() > state_size {
            return Err(ShmError::Truncated {
                path: state_path(path),
                size: state_size,
                expected: g.state_len(),
            });
        }
        // Regions in file order, page aligned, inside the file, not
        // overlapping; the configuration's before the state file's.
        let regions = [
            (HEADER_SIZE, 0u64),
            (g.bitmap_off, g.bitmap_len),
            (g.seg_off[0], g.seg_len),
            (g.seg_off[1], g.seg_len),
            (g.bl_off, g.bl_len),
            (g.state_off, HEADER_SIZE),
            (g.slots_off, g.slots_len),
            (g.ledger_off, g.ledger_len),
            (g.keys_off, g.keys_len),
            (g.bans_off, g.bans_len),
            (g.top_off, g.top_len),
        ];
        let mut end = HEADER_SIZE;
        for (off, len) in regions {
            if off % PAGE != 0 || off < end {
                return Err(bad("region offsets out of order or unaligned"));
            }
            end = off.checked_add(len).ok_or(bad("region length overflows"))?;
            if end > g.file_size {
                return Err(bad("region past the end of the file"));
            }
        }
        if g.seg_len < 4096 {
            return Err(bad("segment too small"));
        }
        if (g.slot_count as u64).div_ceil(64) * 8 > g.bitmap_len
            || g.slot_count as u64 * SLOT_SIZE as u64 > g.slots_len
        {
            return Err(bad("slot count does not fit its regions"));
        }
        if !crate::core::keys::fits(g.slot_count, g.keys_capacity, g.keys_len) {
            return Err(bad("key table capacity does not fit its region"));
        }
        if !crate::core::bans::fits(g.bans_capacity, g.bans_len) {
            return Err(bad("ban table capacity does not fit its region"));
        }
        if !crate::core::keys::top::fits(g.top_tables, g.slot_count, g.top_len) {
            return Err(bad("top-keys tables do not fit their region"));
        }
        Ok(g)
    }
}

/// The ban table's region (offset, length, rows) laid out from `from`
/// (the end of the key table): the one function that sizes it, so that a
/// region after it starts at `offset + length`.
pub fn ban_region(from: u64) -> (u64, u64, u64) {
    let rows = crate::core::bans::ROWS;
    (
        page_up(from),
        page_up(crate::core::bans::region_bytes(rows)),
        rows,
    )
}

fn geometry_crc(h: &Region<'_>) -> u32 {
    let mut buf = [0u8; GEOMETRY.end - GEOMETRY.start];
    h.read_bytes(GEOMETRY.start, &mut buf);
    crc32fast::hash(&buf)
}

/// The state file beside the configuration file `path`: `PATH.state`.
pub fn state_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".state");
    PathBuf::from(s)
}
