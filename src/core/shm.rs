//! The shared-memory file: header, geometry, mapping and validation.
//!
//! The byte-by-byte layout is documented in `docs/SHM-LAYOUT.md`; the
//! constants here are the source of truth and a test checks the document
//! against them. Everything read from the file is untrusted: the header's
//! geometry is validated against the real file size before any region is
//! used, and every later access goes through a bounds-checked [`Region`].

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use memmap2::{MmapOptions, MmapRaw};

use super::region::Region;
use super::slot::SLOT_SIZE;

/// `"RATECTL\0"` read as a little-endian u64.
pub const FILE_MAGIC: u64 = u64::from_le_bytes(*b"RATECTL\0");
/// Version of the whole layout (header, segments, slots, blacklist).
/// 2: the concurrency ledger region (`H_LEDGER_OFF`, `H_LEDGER_LEN`) and
/// the warm-up fields of a segment's strategy record. 3: the priority
/// in the strategy record (56 fixed bytes), action 4 `allow`, address
/// ranges in the blacklist (tags 3..=131, prefix bitset at 224), the
/// per-key table region (`H_KEYS_*`, [`super::keys`]) and the per-key
/// fields after a strategy record's conditions.
pub const LAYOUT_VERSION: u32 = 4;
/// Value of the init flag once the file is fully initialised.
pub const INIT_DONE: u32 = u32::from_le_bytes(*b"INIT");
pub const HEADER_SIZE: u64 = 4096;
const PAGE: u64 = 4096;

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
            keys: super::keys::DEFAULT_KEYS,
        }
    }
}

/// Why the file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}: is a symbolic link; refusing to follow it")]
    Symlink(PathBuf),
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    #[error("{path}: file is {size} bytes, too small for a rate_ctl table")]
    TooSmall { path: PathBuf, size: u64 },
    #[error("{0}: bad magic (not a rate_ctl file)")]
    BadMagic(PathBuf),
    #[error("{path}: layout version {found}, this build reads {LAYOUT_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{0}: not initialised yet (the agent has not finished creating it)")]
    Uninitialised(PathBuf),
    #[error("{path}: corrupt header: {what}")]
    Geometry { path: PathBuf, what: &'static str },
    #[error("{path}: file shrank to {size} bytes while in use (expected {expected})")]
    Truncated {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    #[error(
        "{0}: file truncated or rewritten in place while mapped (SIGBUS caught; the mapping now reads as zeros)"
    )]
    Faulted(PathBuf),
    #[error("{path}: another writer holds it (pid {holder}); one agent per file")]
    Locked { path: PathBuf, holder: u64 },
    #[error("{path}: owned by {owner}, neither this user nor root, and cannot be replaced; remove it or run the agent as its owner")]
    ForeignOwner { path: PathBuf, owner: String },
    #[error("capacity: {what} ({limit}) exceeded: {needed} needed")]
    Capacity {
        what: &'static str,
        limit: u64,
        needed: u64,
    },
    #[error(
        "capacity: this table needs {needed} new stat slots; {free} are free now and \
         {waiting} more become free within 2 s (the slots of removed strategies wait \
         before reuse; max strategies {limit})"
    )]
    SlotsBusy {
        needed: u64,
        free: u64,
        /// Slots this publish would free, or freed less than 2 s ago.
        waiting: u64,
        limit: u64,
    },
    #[error("strategy {id}: {source}")]
    InvalidStrategy {
        id: u32,
        #[source]
        source: super::model::ModelError,
    },
    #[error("capacity: {0}")]
    BadCapacity(&'static str),
    #[error("strategy {0}: id published twice")]
    DuplicateId(u32),
    #[error("blacklist: {0}")]
    Blacklist(#[from] super::blacklist::BlacklistError),
}

impl ShmError {
    pub(crate) fn io(path: &Path, source: io::Error) -> ShmError {
        ShmError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Offsets and sizes of the regions, as validated from a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub file_size: u64,
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
        let slots_off = seg_b + seg_len;
        let slots_len = page_up(c.max_strategies as u64 * SLOT_SIZE as u64);
        let bl_off = slots_off + slots_len;
        let bl_len = page_up(super::blacklist::region_bytes(c.blacklist_entries));
        let ledger_off = bl_off + bl_len;
        let ledger_len = super::ledger::region_bytes();
        let keys_off = ledger_off + ledger_len;
        let keys_capacity = super::keys::capacity_for(c.keys)?;
        let keys_len = page_up(super::keys::region_bytes(c.max_strategies, keys_capacity));
        Ok(Geometry {
            file_size: keys_off + keys_len,
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
        })
    }

    fn write(&self, h: &Region<'_>) {
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
    }

    /// Reads and validates the geometry of a mapped file of `actual_size`.
    pub(crate) fn read(
        h: &Region<'_>,
        actual_size: u64,
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
        };
        if g.file_size > actual_size {
            return Err(ShmError::Truncated {
                path: path.to_path_buf(),
                size: actual_size,
                expected: g.file_size,
            });
        }
        // Regions in file order, page aligned, inside the file, not overlapping.
        let regions = [
            (HEADER_SIZE, 0u64),
            (g.bitmap_off, g.bitmap_len),
            (g.seg_off[0], g.seg_len),
            (g.seg_off[1], g.seg_len),
            (g.slots_off, g.slots_len),
            (g.bl_off, g.bl_len),
            (g.ledger_off, g.ledger_len),
            (g.keys_off, g.keys_len),
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
        if !super::keys::fits(g.slot_count, g.keys_capacity, g.keys_len) {
            return Err(bad("key table capacity does not fit its region"));
        }
        Ok(g)
    }
}

fn geometry_crc(h: &Region<'_>) -> u32 {
    let mut buf = [0u8; GEOMETRY.end - GEOMETRY.start];
    h.read_bytes(GEOMETRY.start, &mut buf);
    crc32fast::hash(&buf)
}

/// A mapped rate_ctl file (shared, read-write: workers update slots).
pub struct Mapping {
    /// The SIGBUS guard of the range; declared first so that it is
    /// unregistered before `map` unmaps the range.
    guard: Option<super::sigbus::Guard>,
    /// The key table, built once: its parts' bounds, hash keys (derived
    /// from the header's secret, written once at creation) and whether its
    /// entries take a 16-byte CAS (asked once), so that the request path
    /// takes it by reference ([`keys`](Self::keys)) without rebuilding or
    /// re-checking anything. It borrows `map`'s memory: private, handed out
    /// only as a borrow of the Mapping (see `from_file`), and declared
    /// before `map` so that it is gone before the range is unmapped.
    keys: super::keys::KeyTable<'static>,
    /// The stat slot array, bounds checked once here (as `keys`, and
    /// handed out the same way: [`slots`](Self::slots)): every decision
    /// takes it.
    slots: Region<'static>,
    map: MmapRaw,
    file: File,
    pub path: PathBuf,
    pub geometry: Geometry,
    /// Device and inode of the mapped file, to notice a replaced file.
    pub dev_ino: (u64, u64),
    /// This process's row in the concurrency ledger (claimed on first use).
    ledger_row: std::sync::atomic::AtomicUsize,
}

const NO_ROW: usize = usize::MAX;
const ROW_FULL: usize = usize::MAX - 1;

/// Opens `path` without following symlinks; it must be a regular file.
pub(crate) fn open_file(path: &Path, create: bool, mode: u32) -> Result<File, ShmError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true);
    if create {
        opts.create_new(true).mode(mode);
    }
    opts.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    let file = opts.open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            ShmError::Symlink(path.to_path_buf())
        } else {
            ShmError::io(path, e)
        }
    })?;
    let meta = file.metadata().map_err(|e| ShmError::io(path, e))?;
    if !meta.file_type().is_file() || meta.file_type().is_fifo() {
        return Err(ShmError::NotRegular(path.to_path_buf()));
    }
    Ok(file)
}

impl Mapping {
    /// Maps an existing file and validates its header (magic, version, init
    /// flag, geometry against the real size).
    pub fn open(path: &Path) -> Result<Mapping, ShmError> {
        let file = open_file(path, false, 0)?;
        Mapping::from_file(file, path, true)
    }

    pub(crate) fn from_file(
        file: File,
        path: &Path,
        require_init: bool,
    ) -> Result<Mapping, ShmError> {
        let meta = file.metadata().map_err(|e| ShmError::io(path, e))?;
        let size = meta.len();
        if size < HEADER_SIZE {
            return Err(ShmError::TooSmall {
                path: path.to_path_buf(),
                size,
            });
        }
        let len = usize::try_from(size).map_err(|_| ShmError::TooSmall {
            path: path.to_path_buf(),
            size,
        })?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| ShmError::io(path, e))?;
        // SAFETY: the mapping is page aligned, `len` bytes long and lives as
        // long as this Mapping; all access to it goes through Region atomics.
        let whole = unsafe { Region::from_raw(map.as_mut_ptr(), len) };
        let h = whole.sub(0, HEADER_SIZE).expect("size checked above");
        if h.load(H_MAGIC) != FILE_MAGIC {
            return Err(ShmError::BadMagic(path.to_path_buf()));
        }
        let vi = h.load(H_VERSION_INIT);
        if vi as u32 != LAYOUT_VERSION {
            return Err(ShmError::Version {
                path: path.to_path_buf(),
                found: vi as u32,
            });
        }
        if require_init
            && h.u64_at(H_VERSION_INIT)
                .map(|w| (w.load(Ordering::Acquire) >> 32) as u32)
                != Some(INIT_DONE)
        {
            return Err(ShmError::Uninitialised(path.to_path_buf()));
        }
        let geometry = Geometry::read(&h, size, path)?;
        let mut key_secret = [0u8; 16];
        h.read_bytes(H_KEYS_SECRET, &mut key_secret);
        // SAFETY: as `whole`, for the lifetime of the Mapping that keeps
        // `map` (the memory never moves with the Mapping); the 'static
        // table and slot region built on it stay private to the Mapping
        // and are handed out only borrowed from it (`keys`, `slots`), so
        // nothing of them outlives the mapping.
        let mapped: Region<'static> = unsafe { Region::from_raw(map.as_mut_ptr(), len) };
        let keys = super::keys::KeyTable::new(
            mapped
                .sub(geometry.keys_off, geometry.keys_len)
                .expect("validated"),
            geometry.slot_count,
            geometry.keys_capacity,
            super::keys::MixKeys::from_secret(key_secret),
            None,
        );
        let slots = mapped
            .sub(geometry.slots_off, geometry.slots_len)
            .expect("validated");
        let m = Mapping {
            keys,
            slots,
            guard: super::sigbus::register(map.as_mut_ptr(), len),
            map,
            file,
            path: path.to_path_buf(),
            geometry,
            dev_ino: (meta.dev(), meta.ino()),
            ledger_row: std::sync::atomic::AtomicUsize::new(NO_ROW),
        };
        Ok(m)
    }

    /// The open file (its lock, for the writer).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The whole mapped file.
    pub fn region(&self) -> Region<'_> {
        // SAFETY: see `from_file`; the mapping outlives the borrow of self.
        unsafe { Region::from_raw(self.map.as_mut_ptr(), self.map.len()) }
    }

    pub fn header(&self) -> Region<'_> {
        self.region().sub(0, HEADER_SIZE).expect("validated")
    }

    pub fn segment(&self, index: usize) -> Region<'_> {
        let g = &self.geometry;
        self.region()
            .sub(g.seg_off[index & 1], g.seg_len)
            .expect("validated")
    }

    #[inline]
    pub fn slots(&self) -> Region<'_> {
        self.slots
    }

    pub fn bitmap(&self) -> Region<'_> {
        let g = &self.geometry;
        self.region()
            .sub(g.bitmap_off, g.bitmap_len)
            .expect("validated")
    }

    pub fn blacklist(&self) -> Region<'_> {
        let g = &self.geometry;
        self.region().sub(g.bl_off, g.bl_len).expect("validated")
    }

    /// The per-key table (see [`super::keys`]), built when the file was
    /// mapped.
    #[inline(always)]
    pub fn keys(&self) -> &super::keys::KeyTable<'_> {
        &self.keys
    }

    /// The concurrency ledger (see [`super::ledger`]).
    pub fn ledger(&self) -> super::ledger::Ledger<'_> {
        let g = &self.geometry;
        super::ledger::Ledger::new(
            self.region()
                .sub(g.ledger_off, g.ledger_len)
                .expect("validated"),
        )
    }

    /// This process's ledger row, claimed on first use; `None` when every
    /// row is taken.
    fn ledger_row(&self) -> Option<usize> {
        match self.ledger_row.load(Ordering::Relaxed) {
            ROW_FULL => None,
            NO_ROW => {
                let (pid, started) = super::ledger::me();
                let row = self.ledger().claim(pid, started);
                self.ledger_row
                    .store(row.unwrap_or(ROW_FULL), Ordering::Relaxed);
                row
            }
            row => Some(row),
        }
    }

    /// Records that this process took one unit of the concurrency slot
    /// `slot` at `generation` (after the slot's increment), so that it is
    /// given back if the process dies holding it.
    pub fn hold_unit(&self, slot: u32, generation: u64) {
        let slots = self.slots();
        let current = super::slot::Slot::at(&slots, slot)
            .is_some_and(|s| s.generation().load(Ordering::Acquire) == generation);
        if !current {
            return; // a stale hit took nothing
        }
        if let Some(row) = self.ledger_row() {
            self.ledger().add(row, slot, generation);
        }
    }

    /// Gives back a unit taken with [`hold_unit`](Self::hold_unit): off
    /// the ledger first, then off the slot, if the slot still has
    /// `generation` (else it was reassigned and zeroed).
    pub fn release_unit(&self, slot: u32, generation: u64) {
        if let Some(row) = self.ledger_row() {
            self.ledger().remove(row, slot, generation);
        }
        let slots = self.slots();
        if let Some(s) = super::slot::Slot::at(&slots, slot) {
            if s.generation().load(Ordering::Acquire) == generation {
                super::ledger::release_units(&s, 1);
            }
        }
    }

    /// Records that this process holds one per-key `concurrency` unit of
    /// the key at `at` (after the key's entry was charged), so that it is
    /// given back if the process dies holding it.
    #[inline]
    pub fn hold_key_unit(&self, at: super::keys::KeyRef) {
        if let Some(row) = self.ledger_row() {
            self.ledger().add_key(row, at);
        }
    }

    /// Gives back a unit taken with [`hold_key_unit`](Self::hold_key_unit):
    /// off the ledger first, then off the key's entry (if it still holds
    /// the key).
    #[inline]
    pub fn release_key_unit(&self, at: super::keys::KeyRef, lim: &super::keys::KeyLimiter) {
        if let Some(row) = self.ledger_row() {
            self.ledger().remove_key(row, at);
        }
        self.keys().release(at, lim);
    }

    /// Gives back the units of processes that died holding them; returns
    /// how many.
    pub fn reclaim_dead(&self) -> u64 {
        self.ledger()
            .reclaim(&self.slots(), self.keys(), super::ledger::me())
    }

    /// The published sequence (Acquire): changes on every publish; its low
    /// bit is the active segment. 0 = nothing published yet.
    #[inline]
    pub fn seq(&self) -> u64 {
        self.header()
            .u64_at(H_SEQ)
            .map(|w| w.load(Ordering::Acquire))
            .unwrap_or(0)
    }

    /// The agent's last heartbeat, unix milliseconds (0 = never).
    pub fn heartbeat_unix_ms(&self) -> u64 {
        self.header().load(H_HEARTBEAT)
    }

    /// Whether a SIGBUS hit this mapping (the file was truncated under
    /// it): its range now holds zero pages; drop it and map the file again
    /// once it is whole. Always `false` where no guard is installed.
    #[inline]
    pub fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.faulted())
    }

    /// The error to report for a [`faulted`](Self::faulted) mapping.
    pub fn fault_error(&self) -> ShmError {
        ShmError::Faulted(self.path.clone())
    }

    /// Is the file still the one mapped, whole? Checks the size of the open
    /// file (a truncated file would raise SIGBUS on access) and whether the
    /// path now names another file (the agent recreated it).
    pub fn still_valid(&self) -> Result<bool, ShmError> {
        if self.faulted() {
            return Err(self.fault_error());
        }
        let size = self
            .file
            .metadata()
            .map_err(|e| ShmError::io(&self.path, e))?
            .len();
        if size < self.geometry.file_size {
            return Err(ShmError::Truncated {
                path: self.path.clone(),
                size,
                expected: self.geometry.file_size,
            });
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) == self.dev_ino),
            Err(_) => Ok(false),
        }
    }

    /// Writer side: format a fresh file's header (init flag last).
    pub(crate) fn format_header(h: &Region<'_>, g: &Geometry, boot_id: [u8; 16], now_ms: u64) {
        h.store(H_MAGIC, FILE_MAGIC);
        h.store(H_VERSION_INIT, LAYOUT_VERSION as u64);
        h.store(H_SEQ, 0);
        g.write(h);
        h.store(H_CREATED, now_ms);
        h.write_bytes(H_BOOT_ID, &boot_id);
        h.store(H_WRITER_PID, std::process::id() as u64);
        h.write_bytes(H_KEYS_SECRET, &super::keys::new_secret());
    }

    /// Writer side: mark the file initialised (Release, after everything else).
    pub(crate) fn set_init_done(&self) {
        if let Some(w) = self.header().u64_at(H_VERSION_INIT) {
            w.store(
                LAYOUT_VERSION as u64 | (INIT_DONE as u64) << 32,
                Ordering::Release,
            );
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Holds keep their mapping alive, so nothing is held any more.
        let row = *self.ledger_row.get_mut();
        if row != NO_ROW && row != ROW_FULL && !self.faulted() {
            self.ledger().free(row, std::process::id() as u64);
        }
    }
}

/// The kernel's boot id (random per boot), to notice that monotonic time
/// restarted and limiter state words are meaningless.
pub fn boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let txt = std::str::from_utf8(pair).unwrap_or("0");
            out[i] = u8::from_str_radix(txt, 16).unwrap_or(0);
        }
    }
    out
}

/// Wall-clock unix milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
