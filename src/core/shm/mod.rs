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

pub mod ledger;
pub mod loader;
pub mod reader;
pub mod region;
pub mod segment;
pub mod sigbus;
pub mod slot;
pub mod writer;

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
/// Where the state file begins in the offsets of the header (the
/// configuration file's length as laid out; page aligned).
pub const H_STATE_OFF: usize = 232;
/// 16 bytes: random per pair of files, repeated in the state file's
/// header, so that a configuration is never paired with another's state.
pub const H_PAIR_ID: usize = 240;
/// `"RCSTATE\0"`: magic of the state file's header.
pub const STATE_MAGIC: u64 = u64::from_le_bytes(*b"RCSTATE\0");
/// State file header fields (bytes from the start of the state file).
pub const ST_MAGIC: usize = 0;
pub const ST_VERSION: usize = 8;
pub const ST_PAIR_ID: usize = 16;
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
    #[error("{path}: not trusted: {what}; refusing it")]
    Untrusted { path: PathBuf, what: String },
    #[error("{path}: state file: {what}")]
    State { path: PathBuf, what: String },
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
        let bl_len = page_up(super::blacklist::region_bytes(c.blacklist_entries));
        let state_off = bl_off + bl_len;
        let slots_off = state_off + HEADER_SIZE;
        let slots_len = page_up(c.max_strategies as u64 * SLOT_SIZE as u64);
        let ledger_off = slots_off + slots_len;
        let ledger_len = super::ledger::region_bytes();
        let keys_off = ledger_off + ledger_len;
        let keys_capacity = super::keys::capacity_for(c.keys)?;
        let keys_len = page_up(super::keys::region_bytes(c.max_strategies, keys_capacity));
        Ok(Geometry {
            file_size: keys_off + keys_len,
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
        h.store(H_STATE_OFF, self.state_off);
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

/// The state file beside the configuration file `path`: `PATH.state`.
pub fn state_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".state");
    PathBuf::from(s)
}

/// The two files mapped back to back in one range of address space: the
/// configuration file's first `config_len` bytes (read-only unless the
/// agent maps it), then the state file (read-write). So every offset of
/// the header is an offset into this one range, and the request path
/// addresses the slots and keys exactly as when they were one file.
pub(crate) struct Mapped {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the range is process memory valid until Drop; all access goes
// through Region atomics.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Mapped {
    pub(crate) fn pair(
        config: &File,
        config_len: u64,
        state: &File,
        state_len: u64,
        config_writable: bool,
    ) -> io::Result<Mapped> {
        use std::os::fd::AsRawFd;
        let too_big = || io::Error::other("file too large to map");
        let cl = usize::try_from(config_len).map_err(|_| too_big())?;
        let sl = usize::try_from(state_len).map_err(|_| too_big())?;
        let len = cl.checked_add(sl).ok_or_else(too_big)?;
        if len == 0 || cl % PAGE as usize != 0 {
            return Err(io::Error::other("unaligned configuration length"));
        }
        // SAFETY: an anonymous reservation at an address of the kernel's
        // choosing; nothing else is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Unmapped by Drop should a step below fail.
        let m = Mapped {
            ptr: base.cast(),
            len,
        };
        let prot = if config_writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: MAP_FIXED inside the reservation made above, which this
        // Mapped owns: it replaces only our own PROT_NONE pages.
        let c = unsafe {
            libc::mmap(
                base,
                cl,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                config.as_raw_fd(),
                0,
            )
        };
        if c == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if sl > 0 {
            // SAFETY: as above, the reservation's pages after the
            // configuration's `cl` bytes (cl + sl = len).
            let st = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(cl).cast(),
                    sl,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    state.as_raw_fd(),
                    0,
                )
            };
            if st == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(m)
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the range this Mapped reserved and mapped; nothing
        // borrows it any more (Mapping drops its borrowers first).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A mapped rate_ctl file pair: the configuration (read-only for workers)
/// and its state file (read-write: workers update slots, ledger, keys).
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
    map: Mapped,
    file: File,
    state: File,
    pub path: PathBuf,
    pub geometry: Geometry,
    /// Device and inode of the mapped configuration file, to notice a
    /// replaced file.
    pub dev_ino: (u64, u64),
    /// This process's row in the concurrency ledger (claimed on first use).
    ledger_row: std::sync::atomic::AtomicUsize,
}

const NO_ROW: usize = usize::MAX;
const ROW_FULL: usize = usize::MAX - 1;

/// Opens `path` without following symlinks; it must be a regular file.
/// Read-only unless `writable` (a new file is always writable).
pub(crate) fn open_file(
    path: &Path,
    create: bool,
    writable: bool,
    mode: u32,
) -> Result<File, ShmError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(writable || create);
    if create {
        opts.create_new(true).mode(mode);
    }
    // O_NONBLOCK: a FIFO planted at the path must not block a read-only
    // open (a worker at start); it is refused below.
    opts.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
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
    /// Maps an existing pair the way a worker does: the configuration
    /// file opened read-only and mapped `PROT_READ`, the state file
    /// (`PATH.state`) read-write; validates the header (magic, version,
    /// init flag, geometry against the real sizes) and that the state
    /// file belongs to this configuration.
    ///
    /// A world-writable configuration is refused ([`ShmError::Untrusted`]):
    /// anyone could have written its rules (the agent never makes one).
    pub fn open(path: &Path) -> Result<Mapping, ShmError> {
        Mapping::open_trusting(path, None, false)
    }

    /// [`open`](Self::open) as nginx's workers do it: a configuration owned
    /// by anyone but root or `owner` (nginx's `rate_ctl_shm_owner`) is
    /// refused too ([`ShmError::Untrusted`]); without `owner`, by anyone
    /// but root or the owner of its directory (the agent's own directory,
    /// `/run/rate-ctl` by default: whoever owns it could replace the file
    /// anyway, and anyone else's file there was not put by the agent).
    pub fn open_owned(path: &Path, owner: Option<u32>) -> Result<Mapping, ShmError> {
        Mapping::open_trusting(path, owner, true)
    }

    fn open_trusting(path: &Path, owner: Option<u32>, check: bool) -> Result<Mapping, ShmError> {
        let file = open_file(path, false, false, 0)?;
        let meta = file.metadata().map_err(|e| ShmError::io(path, e))?;
        let mode = meta.mode();
        if mode & 0o002 != 0 {
            return Err(ShmError::Untrusted {
                path: path.to_path_buf(),
                what: format!("world-writable (mode {:04o})", mode & 0o7777),
            });
        }
        if let Some(o) = owner.filter(|&o| meta.uid() != 0 && meta.uid() != o) {
            return Err(ShmError::Untrusted {
                path: path.to_path_buf(),
                what: format!(
                    "owned by {}, neither root nor rate_ctl_shm_owner ({})",
                    super::writer::user_name(meta.uid()),
                    super::writer::user_name(o)
                ),
            });
        }
        if check && owner.is_none() && meta.uid() != 0 {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let d = std::fs::metadata(dir).map_err(|e| ShmError::io(dir, e))?;
            if d.uid() != meta.uid() {
                return Err(ShmError::Untrusted {
                    path: path.to_path_buf(),
                    what: format!(
                        "owned by {}, neither root nor the owner of {} ({}); \
                         rate_ctl_shm_owner names another user to trust",
                        super::writer::user_name(meta.uid()),
                        dir.display(),
                        super::writer::user_name(d.uid())
                    ),
                });
            }
        }
        Mapping::from_file(file, None, path, true, false)
    }

    /// Maps an existing pair with the configuration writable too (tools
    /// and tests that write the header or a segment as the agent would;
    /// needs write permission on the configuration file).
    pub fn open_writable(path: &Path) -> Result<Mapping, ShmError> {
        let file = open_file(path, false, true, 0)?;
        Mapping::from_file(file, None, path, true, true)
    }

    /// `state`: the state file, or `None` to open `PATH.state`.
    pub(crate) fn from_file(
        file: File,
        state: Option<File>,
        path: &Path,
        require_init: bool,
        writable: bool,
    ) -> Result<Mapping, ShmError> {
        use std::os::unix::fs::FileExt;
        let meta = file.metadata().map_err(|e| ShmError::io(path, e))?;
        let size = meta.len();
        if size < HEADER_SIZE {
            return Err(ShmError::TooSmall {
                path: path.to_path_buf(),
                size,
            });
        }
        // The header, copied (the geometry sizes the mapping).
        let mut bytes = vec![0u8; HEADER_SIZE as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| ShmError::io(path, e))?;
        let words = Region::words_from_bytes(&bytes);
        let h = Region::from_atomics(&words);
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
        let spath = state_path(path);
        let state = match state {
            Some(s) => s,
            None => open_file(&spath, false, true, 0)?,
        };
        let state_size = state.metadata().map_err(|e| ShmError::io(&spath, e))?.len();
        let geometry = Geometry::read(&h, size, state_size, path)?;
        let map = Mapped::pair(
            &file,
            geometry.config_len(),
            &state,
            geometry.state_len(),
            writable,
        )
        .map_err(|e| ShmError::io(path, e))?;
        let len = map.len();
        // SAFETY: the mapping is page aligned, `len` bytes long and lives as
        // long as this Mapping; all access to it goes through Region atomics
        // (loads only in the read-only part, unless `writable`).
        let whole = unsafe { Region::from_raw(map.as_mut_ptr(), len) };
        let mh = whole.sub(0, HEADER_SIZE).expect("size checked above");
        if require_init
            && mh
                .u64_at(H_VERSION_INIT)
                .map(|w| (w.load(Ordering::Acquire) >> 32) as u32)
                != Some(INIT_DONE)
        {
            return Err(ShmError::Uninitialised(path.to_path_buf()));
        }
        if require_init {
            let sh = whole
                .sub(geometry.state_off, HEADER_SIZE)
                .expect("validated");
            let bad = |what: &str| ShmError::State {
                path: spath.clone(),
                what: what.to_string(),
            };
            if sh.load(ST_MAGIC) != STATE_MAGIC {
                return Err(bad("bad magic (not a rate_ctl state file)"));
            }
            if sh.load(ST_VERSION) != LAYOUT_VERSION as u64 {
                return Err(bad("layout version differs from its configuration's"));
            }
            let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
            mh.read_bytes(H_PAIR_ID, &mut a);
            sh.read_bytes(ST_PAIR_ID, &mut b);
            if a != b {
                return Err(bad(
                    "belongs to another configuration file (pair id differs)",
                ));
            }
        }
        let mut key_secret = [0u8; 16];
        mh.read_bytes(H_KEYS_SECRET, &mut key_secret);
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
            state,
            path: path.to_path_buf(),
            geometry,
            dev_ino: (meta.dev(), meta.ino()),
            ledger_row: std::sync::atomic::AtomicUsize::new(NO_ROW),
        };
        Ok(m)
    }

    /// The open state file.
    pub(crate) fn state_file(&self) -> &File {
        &self.state
    }

    /// The open file (its lock, for the writer).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The whole mapped file.
    /// Only the agent's mapping may be written below
    /// `geometry.state_off` (a worker's is `PROT_READ` there).
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
        if size < self.geometry.config_len() {
            return Err(ShmError::Truncated {
                path: self.path.clone(),
                size,
                expected: self.geometry.config_len(),
            });
        }
        let size = self
            .state
            .metadata()
            .map_err(|e| ShmError::io(&self.path, e))?
            .len();
        if size < self.geometry.state_len() {
            return Err(ShmError::Truncated {
                path: state_path(&self.path),
                size,
                expected: self.geometry.state_len(),
            });
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) == self.dev_ino),
            Err(_) => Ok(false),
        }
    }

    /// Writer side: format a fresh pair's headers (init flag last);
    /// `whole` is both files mapped back to back.
    pub(crate) fn format_header(whole: &Region<'_>, g: &Geometry, boot_id: [u8; 16], now_ms: u64) {
        let h = &whole.sub(0, HEADER_SIZE).expect("sized by the writer");
        let st = whole
            .sub(g.state_off, HEADER_SIZE)
            .expect("sized by the writer");
        let pair = super::keys::new_secret();
        h.write_bytes(H_PAIR_ID, &pair);
        st.store(ST_MAGIC, STATE_MAGIC);
        st.store(ST_VERSION, LAYOUT_VERSION as u64);
        st.write_bytes(ST_PAIR_ID, &pair);
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

/// The uid of a user name, or of a number (`rate_ctl_shm_owner`).
pub fn uid_of(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Some(n);
    }
    let c = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf.len() is its size.
    let rc = unsafe {
        libc::getpwnam_r(
            c.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// Wall-clock unix milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
