//! Opening and mapping a file pair (configuration + state) and the
//! accessors of its regions: what workers, the agent and tools hold.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::header::*;
use super::region::Region;
use super::ShmError;

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
    keys: crate::core::keys::KeyTable<'static>,
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
                    super::user_name(meta.uid()),
                    super::user_name(o)
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
                        super::user_name(meta.uid()),
                        dir.display(),
                        super::user_name(d.uid())
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
        let keys = crate::core::keys::KeyTable::new(
            mapped
                .sub(geometry.keys_off, geometry.keys_len)
                .expect("validated"),
            geometry.slot_count,
            geometry.keys_capacity,
            crate::core::keys::MixKeys::from_secret(key_secret),
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

    /// The id of the last key reset the agent applied to this file (0:
    /// none; see [`ST_KEY_RESET`]).
    pub fn key_reset_applied(&self) -> u64 {
        self.state_header().map_or(0, |h| h.load(ST_KEY_RESET))
    }

    /// Records `id` as the last key reset applied (the agent's, after it
    /// applied it).
    pub fn set_key_reset_applied(&self, id: u64) {
        if let Some(h) = self.state_header() {
            h.store(ST_KEY_RESET, id);
        }
    }

    /// The state file's header.
    fn state_header(&self) -> Option<Region<'_>> {
        self.region().sub(self.geometry.state_off, HEADER_SIZE)
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

    /// The per-key table (see [`crate::core::keys`]), built when the file was
    /// mapped.
    #[inline(always)]
    pub fn keys(&self) -> &crate::core::keys::KeyTable<'_> {
        &self.keys
    }

    /// The ban table (see [`crate::core::bans`]), in the state file.
    #[inline]
    pub fn bans(&self) -> crate::core::bans::BanTable<'_> {
        let g = &self.geometry;
        crate::core::bans::BanTable::with_capacity(
            self.region()
                .sub(g.bans_off, g.bans_len)
                .expect("validated"),
            g.bans_capacity,
        )
    }

    /// The top-keys tables (issue 33, [`crate::core::keys::top`]).
    #[inline]
    pub fn top(&self) -> crate::core::keys::top::TopKeys<'_> {
        let g = &self.geometry;
        let r = self.region().sub(g.top_off, g.top_len);
        let empty = self.region().sub(0, 0).expect("empty");
        crate::core::keys::top::TopKeys::new(r.unwrap_or(empty), g.top_tables)
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
    pub fn hold_key_unit(&self, at: crate::core::keys::KeyRef) {
        if let Some(row) = self.ledger_row() {
            self.ledger().add_key(row, at);
        }
    }

    /// Gives back a unit taken with [`hold_key_unit`](Self::hold_key_unit):
    /// off the ledger first, then off the key's entry (if it still holds
    /// the key).
    #[inline]
    pub fn release_key_unit(
        &self,
        at: crate::core::keys::KeyRef,
        lim: &crate::core::keys::KeyLimiter,
    ) {
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
        let whole = |file: &File, path: PathBuf, expected: u64| {
            let size = file
                .metadata()
                .map_err(|e| ShmError::io(&self.path, e))?
                .len();
            if size < expected {
                return Err(ShmError::Truncated {
                    path,
                    size,
                    expected,
                });
            }
            Ok(())
        };
        whole(&self.file, self.path.clone(), self.geometry.config_len())?;
        whole(
            &self.state,
            state_path(&self.path),
            self.geometry.state_len(),
        )?;
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
        let pair = crate::core::keys::new_secret();
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
        h.write_bytes(H_KEYS_SECRET, &crate::core::keys::new_secret());
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
