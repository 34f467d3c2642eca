//! The agent side: creates or adopts the shared-memory file and publishes
//! tables into it.
//!
//! * A new file is built under a temporary name in the same directory,
//!   fully initialised (init flag last) and renamed into place, so a worker
//!   never maps a half-made file; workers notice the new inode within a
//!   second.
//! * A publish writes the inactive segment under its seqlock and then stores
//!   the new sequence with release ordering (RCU): workers copy the active
//!   segment and never see a torn one.
//! * Each strategy keeps its stat slot (and so its counters and limiter
//!   state) across publishes while its algorithm stays the same. A new or
//!   re-typed strategy gets a free slot with a new generation and zeroed
//!   state. Slots of deleted strategies are freed but not reused for
//!   [`SLOT_QUARANTINE_MS`], so a worker still on the previous table cannot
//!   count into a slot that already belongs to someone else.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::blacklist::{self, Blacklist, BlacklistEntry};
use crate::core::clock::{self, MonotonicClock};
use crate::core::limiter::Limiter;
use crate::core::model::{Algorithm, Strategy, ValidStrategy};
use crate::core::segment::{self, Published, MAX_TABLE_DIMENSIONS};
use crate::core::shm::{
    self, user_name, Capacities, Geometry, Mapping, ShmError, H_CONFIG_VERSION, H_HEARTBEAT, H_SEQ,
};
use crate::core::slot::Slot;

/// How long a freed slot waits before it may be given to another strategy.
pub const SLOT_QUARANTINE_MS: u64 = 2_000;

/// What a publish will write, decided before anything is written.
struct Plan {
    /// The strategies with their slots, by id.
    published: Vec<Published>,
    /// Indexes into `published` of the strategies that get a new slot.
    fresh: Vec<usize>,
    /// The blacklist's dimensions, in table order.
    bl_dims: Vec<String>,
    /// The encoded segment payload.
    payload: Vec<u8>,
    /// The wall clock the plan was made at (slot quarantine, timestamps).
    now_ms: u64,
}

/// What a publish did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub seq: u64,
    pub strategies: usize,
    pub new_slots: usize,
    pub freed_slots: usize,
    pub blacklist_entries: usize,
    pub payload_bytes: usize,
    /// Strategies left out of this publish by [`Writer::publish_staged`]
    /// until the slots it freed may be reused; 0 for a complete publish.
    pub deferred: usize,
}

/// How the writer came by its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    Created,
    Adopted {
        strategies: usize,
        boot_changed: bool,
    },
    Recreated {
        reason: String,
    },
}

/// An attempt to open: give up, or try again (the path changed under us).
enum Retry {
    Fail(ShmError),
    Again(ShmError),
}

/// Whether the path still names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[derive(Debug, Clone, Copy)]
struct Assigned {
    slot: u32,
    generation: u64,
    algorithm: Algorithm,
    /// For [`Writer::repair_foreign`].
    limiter: Limiter,
}

impl Assigned {
    fn of(p: &Published) -> Assigned {
        Assigned {
            slot: p.slot,
            generation: p.generation,
            algorithm: p.strategy.algorithm,
            limiter: Limiter::from_strategy(&p.strategy),
        }
    }
}

pub struct Writer {
    map: Arc<Mapping>,
    assigned: HashMap<u32, Assigned>,
    seq: u64,
    opened: Opened,
    access: FileAccess,
    /// What the agent last wrote, to notice what someone else changed
    /// ([`check_live`](Self::check_live)).
    live: Live,
}

/// What only the agent writes, as it last wrote it: the header (without
/// the heartbeat), a digest of the active segment's header, the
/// blacklist's header.
#[derive(Clone, PartialEq, Eq)]
struct Live {
    header: Vec<u8>,
    segment: u32,
    blacklist: Vec<u8>,
}

impl Live {
    fn of(map: &Mapping) -> Live {
        let h = map.header();
        let mut header = vec![0u8; 256];
        h.read_bytes(0, &mut header);
        header[H_HEARTBEAT..H_HEARTBEAT + 8].fill(0);
        let seq = h.load(H_SEQ);
        // The segment's header carries its CRC and publish sequence: a
        // payload changed without them is refused by every worker (CRC),
        // and one changed with them changes this. 64 bytes a poll.
        let seg = map.segment((seq & 1) as usize);
        let mut bytes = [0u8; segment::SEG_HEADER];
        seg.read_bytes(0, &mut bytes);
        let mut blacklist = vec![0u8; blacklist::HEADER_BYTES];
        map.blacklist().read_bytes(0, &mut blacklist);
        Live {
            header,
            segment: crc32fast::hash(&bytes),
            blacklist,
        }
    }
}

/// Who may use the file: its permission bits and, optionally, its group.
/// Applied on the open descriptor (`fchmod`/`fchown`, never through the
/// path, which another user could swap for a symlink) to a new file and to
/// an adopted one alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileAccess {
    pub mode: u32,
    pub group: Option<u32>,
}

impl FileAccess {
    pub fn mode(mode: u32) -> FileAccess {
        FileAccess { mode, group: None }
    }

    /// The configuration file's mode: `mode` without group and other
    /// write (workers only read it; only the agent's user writes it).
    pub fn config_mode(&self) -> u32 {
        self.mode & !0o022
    }

    /// For the configuration file.
    fn config(self) -> FileAccess {
        FileAccess {
            mode: self.config_mode(),
            group: self.group,
        }
    }
}

/// Why `mode` is not a mode to give the files (`--mode`): any bit for
/// other users (world-writable: anyone could rewrite the rules or the
/// counters; world-readable: anyone could read the key table's secret
/// and mint colliding keys), or no write for the owner.
pub fn mode_refusal(mode: u32) -> Option<String> {
    if mode & !0o777 != 0 {
        return Some(format!(
            "{mode:04o}: only permission bits (0o777) are allowed"
        ));
    }
    if mode & 0o007 != 0 {
        return Some(format!(
            "{mode:04o} gives other users access (world-{}): the configuration carries the \
             key table's secret and the rules; give the workers' group access instead \
             (e.g. 0660 with --group)",
            if mode & 0o002 != 0 {
                "writable"
            } else {
                "readable"
            }
        ));
    }
    if mode & 0o600 != 0o600 {
        return Some(format!(
            "{mode:04o}: the owner (the agent) must be able to read and write"
        ));
    }
    None
}

/// A name no one can guess for a file made in `dir` beside `name`.
fn temp_name(dir: &Path, name: &str) -> PathBuf {
    let r = crate::core::keys::new_secret();
    let hex: String = r[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!(".{name}.tmp.{}.{hex}", std::process::id()))
}

/// Takes the one-writer lock on `file` (`flock`, released by the kernel
/// when the process dies). `Locked` names the holder's pid as the file's
/// header records it.
fn lock(file: &File, path: &Path) -> Result<(), ShmError> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(ShmError::io(path, err));
    }
    let mut pid = [0u8; 8];
    use std::os::unix::fs::FileExt;
    let holder = match file.read_exact_at(&mut pid, shm::H_WRITER_PID as u64) {
        Ok(()) => u64::from_le_bytes(pid),
        Err(_) => 0,
    };
    Err(ShmError::Locked {
        path: path.to_path_buf(),
        holder,
    })
}

/// Applies `access` through the descriptor (only what differs, so that
/// adopting a root-owned file that is already right needs no privilege).
fn apply_access(file: &File, path: &Path, access: FileAccess) -> Result<(), ShmError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = file.metadata().map_err(|e| ShmError::io(path, e))?;
    if access.group.is_none_or(|g| g == meta.gid()) && meta.mode() & 0o7777 == access.mode {
        return Ok(());
    }
    if let Some(gid) = access.group.filter(|&g| g != meta.gid()) {
        // SAFETY: fchown on a descriptor we own; -1 keeps the owner.
        if unsafe { libc::fchown(file.as_raw_fd(), u32::MAX, gid) } != 0 {
            return Err(ShmError::io(path, std::io::Error::last_os_error()));
        }
    }
    // After fchown, which may clear set-id bits; set_permissions on a File
    // is fchmod. open() applied the umask; the mode asked for is what
    // workers need.
    file.set_permissions(std::fs::Permissions::from_mode(access.mode))
        .map_err(|e| ShmError::io(path, e))
}

/// Who owns an existing file, if it is not this process's user or root:
/// such a file was planted (or left by another agent user) and is not
/// adopted.
fn foreign_owner(file: &File, path: &Path) -> Result<Option<u32>, ShmError> {
    use std::os::unix::fs::MetadataExt;
    let uid = file.metadata().map_err(|e| ShmError::io(path, e))?.uid();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    Ok((uid != me && uid != 0).then_some(uid))
}

impl Writer {
    /// Adopts a valid file of the same capacities at `path` (counters and
    /// slot assignments survive an agent restart), or creates one with
    /// permission bits `mode`. Refuses symlinks, non-regular files and files
    /// that are not rate_ctl files (it never overwrites a stranger's file).
    pub fn create_or_adopt(path: &Path, caps: Capacities, mode: u32) -> Result<Writer, ShmError> {
        Writer::open(path, caps, FileAccess::mode(mode))
    }

    /// [`create_or_adopt`](Self::create_or_adopt), the agent's way:
    ///
    /// * **One writer per file**: the file is locked (`flock`) for as long
    ///   as this writer lives; a second writer gets [`ShmError::Locked`]
    ///   naming the holder's pid. A file is created under a temporary name
    ///   and linked into place only if the path is still free, and a bad
    ///   file is replaced only while its lock is held, so two writers never
    ///   both believe they own the path.
    /// * **Ownership**: a file owned by another user than this process's
    ///   or root is not adopted; it is replaced (reason names the owner),
    ///   or, where the directory does not allow that (sticky `/dev/shm`
    ///   and no privilege), refused with [`ShmError::ForeignOwner`].
    /// * `access` (mode and group) is applied on the descriptor to a new
    ///   and to an adopted file.
    /// * The file is allocated in full (`posix_fallocate`), so a full
    ///   tmpfs is an error here, never a SIGBUS in a worker later.
    pub fn open(path: &Path, caps: Capacities, access: FileAccess) -> Result<Writer, ShmError> {
        let geometry = Geometry::for_capacities(&caps)?;
        // A few rounds: another writer may create or replace the file
        // between our open and our lock.
        let mut last = None;
        for _ in 0..8 {
            match Writer::try_open(path, &geometry, access) {
                Err(Retry::Again(e)) => last = Some(e),
                Err(Retry::Fail(e)) => return Err(e),
                Ok(w) => return Ok(w),
            }
        }
        Err(last.unwrap_or_else(|| ShmError::io(path, std::io::ErrorKind::WouldBlock.into())))
    }

    fn try_open(path: &Path, geometry: &Geometry, access: FileAccess) -> Result<Writer, Retry> {
        let file = match shm::open_file(path, false, true, 0) {
            Ok(f) => f,
            Err(ShmError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Writer::create(path, geometry, access, Opened::Created, None);
            }
            Err(e) => return Err(Retry::Fail(e)),
        };
        let recreate = |reason: String, file: File| {
            Writer::create(
                path,
                geometry,
                access,
                Opened::Recreated { reason },
                Some(file),
            )
        };
        // Before the lock: a planted file's owner could hold it to keep us out.
        if let Some(uid) = foreign_owner(&file, path).map_err(Retry::Fail)? {
            let reason = format!(
                "owned by {}, neither this user nor root: not adopted",
                user_name(uid)
            );
            return recreate(reason, file).map_err(|e| match e {
                Retry::Fail(ShmError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    Retry::Fail(ShmError::ForeignOwner {
                        path: path.to_path_buf(),
                        owner: user_name(uid),
                    })
                }
                other => other,
            });
        }
        lock(&file, path).map_err(Retry::Fail)?;
        // Locked: is it still the file at the path?
        if !same_file(&file, path) {
            return Err(Retry::Again(ShmError::io(
                path,
                std::io::Error::other("replaced while being opened"),
            )));
        }
        let dup = file
            .try_clone()
            .map_err(|e| Retry::Fail(ShmError::io(path, e)))?;
        let mapped = Mapping::from_file(dup, None, path, true, true);
        if let Ok(m) = &mapped {
            // A state file planted by another user is not adopted.
            let spath = shm::state_path(path);
            if let Some(uid) = foreign_owner(m.state_file(), &spath).map_err(Retry::Fail)? {
                let reason = format!(
                    "{}: owned by {}, neither this user nor root: not adopted",
                    spath.display(),
                    user_name(uid)
                );
                drop(mapped);
                return recreate(reason, file);
            }
        }
        match mapped {
            Ok(m) if m.geometry == *geometry => {
                apply_access(&file, path, access.config()).map_err(Retry::Fail)?;
                apply_access(m.state_file(), &shm::state_path(path), access)
                    .map_err(Retry::Fail)?;
                drop(file); // the lock stays with the mapping's descriptor
                Writer::adopt(m, access).map_err(Retry::Fail)
            }
            Ok(m) => {
                let reason = format!(
                    "capacities changed (file has {} slots, {} segment bytes)",
                    m.geometry.slot_count, m.geometry.seg_len
                );
                drop(m);
                recreate(reason, file)
            }
            Err(
                e @ (ShmError::Version { .. }
                | ShmError::Uninitialised(_)
                | ShmError::Geometry { .. }
                | ShmError::Truncated { .. }
                | ShmError::State { .. }
                | ShmError::Symlink(_)
                | ShmError::NotRegular(_)),
            ) => recreate(e.to_string(), file),
            // No state file beside it (removed, or a file of layout 3).
            Err(ShmError::Io { path: p, source })
                if p != path && source.kind() == std::io::ErrorKind::NotFound =>
            {
                recreate(format!("{}: {source}", p.display()), file)
            }
            Err(ShmError::TooSmall { size: 0, .. }) => recreate("empty file".into(), file),
            Err(e) => Err(Retry::Fail(e)),
        }
    }

    /// How the file was obtained.
    pub fn opened(&self) -> &Opened {
        &self.opened
    }

    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    pub fn path(&self) -> &Path {
        &self.map.path
    }

    /// The last published sequence.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Builds a new file under a temporary name and puts it at `path`:
    /// renamed over `old` (whose lock we hold), or linked into a free path
    /// (`Retry::Again` if another writer got there first).
    fn create(
        path: &Path,
        g: &Geometry,
        access: FileAccess,
        opened: Opened,
        old: Option<File>,
    ) -> Result<Writer, Retry> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "rate_ctl".into());
        // Random names, created exclusively at 0600: nobody can have made
        // them before us, and nobody else can open them while they are
        // formatted; mode and group are set once they are whole.
        let tmp = temp_name(dir, &name);
        let tmp_state = shm::state_path(&tmp);
        let fail = |e: ShmError| {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&tmp_state);
            Retry::Fail(e)
        };
        let file = shm::open_file(&tmp, true, true, 0o600).map_err(Retry::Fail)?;
        let state = shm::open_file(&tmp_state, true, true, 0o600).map_err(fail)?;
        lock(&file, &tmp).map_err(fail)?;
        for (f, p, len) in [
            (&file, &tmp, g.config_len()),
            (&state, &tmp_state, g.state_len()),
        ] {
            use std::os::fd::AsRawFd;
            // Every page backed now: a full tmpfs is this error, not a
            // SIGBUS when a page is first touched (by us or a worker).
            // SAFETY: posix_fallocate on a descriptor we own.
            let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len as i64) };
            if rc != 0 {
                let e = std::io::Error::from_raw_os_error(rc);
                return Err(fail(ShmError::io(
                    p,
                    std::io::Error::new(e.kind(), format!("allocating {len} bytes: {e}")),
                )));
            }
        }
        {
            // Format through a raw mapping: the header is not valid yet.
            let raw = shm::Mapped::pair(&file, g.config_len(), &state, g.state_len(), true)
                .map_err(|e| fail(ShmError::io(&tmp, e)))?;
            // SAFETY: fresh private files of these sizes, mapped shared;
            // nobody else has them open yet; accessed only through Region
            // atomics.
            let whole =
                unsafe { crate::core::region::Region::from_raw(raw.as_mut_ptr(), raw.len()) };
            Mapping::format_header(&whole, g, clock::boot_id(), clock::unix_ms());
            let bl = whole.sub(g.bl_off, g.bl_len).expect("file sized above");
            blacklist::init(bl, g.bl_capacity).map_err(|e| fail(e.into()))?;
        }
        apply_access(&file, &tmp, access.config()).map_err(fail)?;
        apply_access(&state, &tmp_state, access).map_err(fail)?;
        let map = Mapping::from_file(file, Some(state), &tmp, false, true).map_err(fail)?;
        map.set_init_done();
        match old {
            // We hold the old file's lock: nobody else can be replacing it.
            // The state file first: a worker opening the pair between the
            // two renames finds their pair ids differ and tries again.
            Some(old) => {
                std::fs::rename(&tmp_state, shm::state_path(path))
                    .map_err(|e| fail(ShmError::io(&shm::state_path(path), e)))?;
                std::fs::rename(&tmp, path).map_err(|e| fail(ShmError::io(path, e)))?;
                drop(old);
            }
            // No file: link ours in only if the path is still free.
            None => {
                let linked = std::fs::hard_link(&tmp, path);
                let _ = std::fs::remove_file(&tmp);
                if linked.is_ok() {
                    if let Err(e) = std::fs::rename(&tmp_state, shm::state_path(path)) {
                        let _ = std::fs::remove_file(&tmp_state);
                        let _ = std::fs::remove_file(path);
                        return Err(Retry::Fail(ShmError::io(&shm::state_path(path), e)));
                    }
                } else {
                    let _ = std::fs::remove_file(&tmp_state);
                }
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Err(Retry::Again(ShmError::io(path, e)));
                    }
                    Err(e) => return Err(Retry::Fail(ShmError::io(path, e))),
                }
            }
        }
        let mut map = map;
        map.path = path.to_path_buf();
        Ok(Writer {
            live: Live::of(&map),
            map: Arc::new(map),
            assigned: HashMap::new(),
            seq: 0,
            opened,
            access,
        })
    }

    fn adopt(map: Mapping, access: FileAccess) -> Result<Writer, ShmError> {
        let seq = map.seq();
        let mut assigned = HashMap::new();
        let mut count = 0;
        if seq != 0 {
            let mut buf = Vec::new();
            // A writer killed mid-publish leaves the *other* segment half
            // written; the active one is whole.
            if let Ok(d) = segment::read_segment(&map.segment((seq & 1) as usize), seq, &mut buf) {
                count = d.strategies.len();
                for p in &d.strategies {
                    assigned.insert(p.strategy.id, Assigned::of(p));
                }
            }
        }
        // Monotonic time restarts with the machine: limiter state words from
        // another boot are meaningless. Reset them; keep the counters.
        let header = map.header();
        let mut file_boot = [0u8; 16];
        header.read_bytes(shm::H_BOOT_ID, &mut file_boot);
        let boot = clock::boot_id();
        let boot_changed = file_boot != boot;
        if boot_changed {
            let slots = map.slots();
            for a in assigned.values() {
                if let Some(s) = Slot::at(&slots, a.slot) {
                    s.state0().store(0, Ordering::Relaxed);
                    s.state1().store(0, Ordering::Relaxed);
                }
            }
            header.write_bytes(shm::H_BOOT_ID, &boot);
            // Per-key states are monotonic times too: every key starts new.
            map.keys().clear();
            // Pids of another boot mean nothing; the counts were zeroed above.
            let ledger = map.ledger();
            for row in 0..crate::core::ledger::ROWS as usize {
                ledger.free_any(row);
            }
        }
        header.store(shm::H_WRITER_PID, std::process::id() as u64);
        let w = Writer {
            live: Live::of(&map),
            map: Arc::new(map),
            assigned,
            seq,
            opened: Opened::Adopted {
                strategies: count,
                boot_changed,
            },
            access,
        };
        w.reconcile_bitmap();
        Ok(w)
    }

    /// After adoption the active segment is the truth: a slot marked in use
    /// that no published strategy owns (a writer killed between allocating
    /// and publishing, or an unreadable segment) is freed, with quarantine.
    fn reconcile_bitmap(&self) {
        let owned: std::collections::HashSet<u32> =
            self.assigned.values().map(|a| a.slot).collect();
        let slots = self.map.slots();
        let now_ms = clock::unix_ms().max(1);
        for slot in 0..self.map.geometry.slot_count {
            let used = self.slot_in_use(slot);
            let owns = owned.contains(&slot);
            if used && !owns {
                self.set_slot_bit(slot, false);
                if let Some(s) = Slot::at(&slots, slot) {
                    s.freed_at().store(now_ms, Ordering::Relaxed);
                }
            } else if owns && !used {
                self.set_slot_bit(slot, true);
            }
        }
    }

    /// A file truncated or rewritten in place under us (our mapping took a
    /// SIGBUS, or the file is shorter than its layout) is replaced by a new
    /// one before anything is written: every strategy then gets a fresh
    /// slot. `Ok(true)` when it was replaced.
    pub fn ensure_whole(&mut self) -> Result<bool, ShmError> {
        let reason = if self.map.faulted() {
            self.map.fault_error().to_string()
        } else {
            match self.map.still_valid() {
                Err(e @ ShmError::Truncated { .. }) => e.to_string(),
                _ => return Ok(false),
            }
        };
        let old = self
            .map
            .file()
            .try_clone()
            .map_err(|e| ShmError::io(&self.map.path, e))?;
        let path = self.map.path.clone();
        let w = Writer::create(
            &path,
            &self.map.geometry,
            self.access,
            Opened::Recreated { reason },
            Some(old),
        )
        .map_err(|r| match r {
            Retry::Fail(e) | Retry::Again(e) => e,
        })?;
        *self = w;
        Ok(true)
    }

    /// The agent's check of what is live, at every poll: the path and the
    /// state path still name this writer's files (not removed, not
    /// replaced by another file or a symlink), with their owner, mode and
    /// group; the header, the active segment and the blacklist's header
    /// as this writer last wrote them; the files whole. Repairs what it
    /// finds: a file gone or replaced, or a header changed, is replaced by
    /// a new pair (the caller publishes its table again); a mode or group
    /// is set again; a changed blacklist header is rebuilt. Returns what
    /// changed (for the log and the store), `None` when all is as written.
    pub fn check_live(&mut self) -> Result<Option<String>, ShmError> {
        if self.ensure_whole()? {
            return Ok(Some(match &self.opened {
                Opened::Recreated { reason } => reason.clone(),
                _ => "damaged".into(),
            }));
        }
        use std::os::unix::fs::MetadataExt;
        let path = self.map.path.clone();
        let spath = shm::state_path(&path);
        let mut gone = Vec::new();
        let mut access = Vec::new();
        for (p, f, want) in [
            (&path, self.map.file(), self.access.config()),
            (&spath, self.map.state_file(), self.access),
        ] {
            let mine = f.metadata().map_err(|e| ShmError::io(p, e))?;
            match std::fs::symlink_metadata(p) {
                Err(_) => gone.push(format!("{} removed", p.display())),
                Ok(m) if m.file_type().is_symlink() => {
                    gone.push(format!("{} replaced by a symbolic link", p.display()))
                }
                Ok(m) if (m.dev(), m.ino()) != (mine.dev(), mine.ino()) => {
                    gone.push(format!("{} replaced by another file", p.display()))
                }
                Ok(m) => {
                    if m.mode() & 0o7777 != want.mode {
                        access.push(format!(
                            "{} mode changed to {:04o} (want {:04o})",
                            p.display(),
                            m.mode() & 0o7777,
                            want.mode
                        ));
                    }
                    if want.group.is_some_and(|g| g != m.gid()) {
                        access.push(format!("{} group changed to {}", p.display(), m.gid()));
                    }
                    // SAFETY: geteuid has no preconditions.
                    let me = unsafe { libc::geteuid() };
                    if m.uid() != me && m.uid() != 0 {
                        gone.push(format!(
                            "{} owner changed to {}",
                            p.display(),
                            user_name(m.uid())
                        ));
                    }
                }
            }
        }
        let now = Live::of(&self.map);
        if now.header != self.live.header {
            let seq = u64::from_le_bytes(now.header[H_SEQ..H_SEQ + 8].try_into().expect("8"));
            if seq != self.seq {
                access.push(format!(
                    "header sequence changed from {} to {seq}",
                    self.seq
                ));
            } else {
                gone.push("header changed".into());
            }
        } else if now.segment != self.live.segment {
            access.push(format!("active segment (sequence {}) changed", self.seq));
        }
        if now.blacklist != self.live.blacklist {
            access.push("blacklist header changed; rebuilt".into());
            blacklist::init(self.map.blacklist(), self.map.geometry.bl_capacity)?;
        }
        if !gone.is_empty() {
            let mut what = gone;
            what.extend(access);
            let reason = what.join("; ");
            let old = self
                .map
                .file()
                .try_clone()
                .map_err(|e| ShmError::io(&path, e))?;
            let w = Writer::create(
                &path,
                &self.map.geometry,
                self.access,
                Opened::Recreated {
                    reason: reason.clone(),
                },
                Some(old),
            )
            .map_err(|r| match r {
                Retry::Fail(e) | Retry::Again(e) => e,
            })?;
            *self = w;
            return Ok(Some(format!("{reason}: recreated")));
        }
        if access.is_empty() {
            return Ok(None);
        }
        apply_access(self.map.file(), &path, self.access.config())?;
        apply_access(self.map.state_file(), &spath, self.access)?;
        // The caller publishes again, which rewrites the sequence, the
        // segment and the blacklist; until then this is what was found.
        self.live = Live::of(&self.map);
        Ok(Some(access.join("; ")))
    }

    /// Records the agent's heartbeat (unix ms) in the header.
    pub fn heartbeat(&self, unix_ms: u64) {
        if let Some(w) = self.map.header().u64_at(H_HEARTBEAT) {
            w.store(unix_ms, Ordering::Release);
        }
    }

    /// Replaces limiter state that no clock reading could have written
    /// (garbage, a slot rewritten by hand) with the most restrictive
    /// legitimate state, in every slot of the published table; returns how
    /// many slots it changed. The agent calls this at every poll: the
    /// request path never moves state backwards (a stale worker could not
    /// tell garbage from a newer legitimate state), the agent's fresh clock
    /// can ([`Limiter::repair_foreign`]).
    pub fn repair_foreign(&self) -> usize {
        let slots = self.map.slots();
        let mut repaired = 0;
        for a in self.assigned.values() {
            let Some(slot) = Slot::at(&slots, a.slot) else {
                continue;
            };
            let fixed = match a.algorithm {
                Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                    a.limiter.repair_foreign(&slot, clock::unix_ns)
                }
                _ => a.limiter.repair_foreign(&slot, MonotonicClock::now),
            };
            repaired += usize::from(fixed);
        }
        repaired
    }

    fn bit(&self, slot: u32) -> (usize, u64) {
        ((slot as usize / 64) * 8, 1u64 << (slot % 64))
    }

    fn slot_in_use(&self, slot: u32) -> bool {
        let (off, mask) = self.bit(slot);
        self.map.bitmap().load(off) & mask != 0
    }

    fn set_slot_bit(&self, slot: u32, used: bool) {
        let (off, mask) = self.bit(slot);
        let bm = self.map.bitmap();
        let v = bm.load(off);
        bm.store(off, if used { v | mask } else { v & !mask });
    }

    /// [`publish_valid`](Self::publish_valid), and when the table fits the capacity
    /// but not the slots free right now (the slots of the strategies it
    /// replaces are still in use or in their 2 s quarantine — e.g. a
    /// replace-import of a full table), publish it in stages: now the
    /// strategies that keep their slots plus as many new ones as slots are
    /// free (which frees the replaced ones), the rest once the freed slots
    /// may be reused. The report's `deferred` counts what is left for a
    /// later call with the same table (2 s on); 0 when complete.
    pub fn publish_staged(
        &mut self,
        strategies: &[ValidStrategy],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let free = match self.publish_valid(strategies, blacklist, config_version) {
            Err(ShmError::SlotsBusy { free, .. }) => free as usize,
            other => return other,
        };
        let mut first: Vec<ValidStrategy> = Vec::with_capacity(strategies.len());
        let mut new = 0;
        let mut by_id: Vec<&ValidStrategy> = strategies.iter().collect();
        by_id.sort_by_key(|s| s.id);
        for s in by_id {
            let keeps = self
                .assigned
                .get(&s.id)
                .is_some_and(|a| a.algorithm == s.algorithm);
            if keeps || new < free {
                new += usize::from(!keeps);
                first.push(s.clone());
            }
        }
        // The first stage is not all of `config_version`: it goes out under
        // the version already in the file, so that a reader (workers' stats,
        // the agent's applied version, host lag) sees the new version only
        // once the whole table is in.
        let previous = self.map.header().load(H_CONFIG_VERSION);
        let mut report = self.publish_valid(&first, blacklist, previous)?;
        report.deferred = strategies.len() - first.len();
        Ok(report)
    }

    /// Publishes `strategies` (rates already local to this host) and the
    /// full blacklist. Nothing in the file changes unless the whole publish
    /// fits: invalid strategies, duplicate ids and exceeded capacities are
    /// errors and the previous table stays active.
    ///
    /// For callers holding strategies no one validated yet (a table file,
    /// tests): validates each once, then [`publish_valid`](Self::publish_valid).
    pub fn publish(
        &mut self,
        strategies: &[Strategy],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let valid = strategies
            .iter()
            .map(|s| {
                s.clone()
                    .into_valid()
                    .map_err(|source| ShmError::InvalidStrategy { id: s.id, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.publish_valid(&valid, blacklist, config_version)
    }

    /// [`publish`](Self::publish) for strategies already validated (the
    /// agent's): they are not checked again.
    pub fn publish_valid(
        &mut self,
        strategies: &[ValidStrategy],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        self.ensure_whole()?;
        let plan = self.plan(strategies, blacklist)?;
        self.apply(plan, blacklist, config_version)
    }

    /// Step 1 of a publish: checks every capacity (the strategies carry
    /// their validation), assigns slots and encodes the payload. No side
    /// effects.
    fn plan(
        &self,
        strategies: &[ValidStrategy],
        blacklist: &[BlacklistEntry],
    ) -> Result<Plan, ShmError> {
        let g = self.map.geometry;
        let now_ms = clock::unix_ms();
        let mut list: Vec<Strategy> = strategies.iter().map(|s| (**s).clone()).collect();
        list.sort_by_key(|s| s.id);
        if let Some(w) = list.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(ShmError::DuplicateId(w[0].id));
        }
        if list.len() > g.slot_count as usize {
            return Err(ShmError::Capacity {
                what: "max strategies",
                limit: g.slot_count as u64,
                needed: list.len() as u64,
            });
        }
        let mut dims: Vec<&str> = Vec::new();
        let mut bl_dims: Vec<String> = Vec::new();
        // Each prefix length of an `ip` network is one more dimension to
        // the matcher (see core::ipnet).
        let mut prefixes: Vec<u8> = Vec::new();
        // So is each prefix length and template shape (see core::pattern).
        let mut derived: Vec<String> = Vec::new();
        for s in &list {
            for c in &s.conditions {
                if let Some(p) = crate::core::pattern::matcher_dimension(c) {
                    if !derived.contains(&p) {
                        derived.push(p);
                    }
                }
                if !dims.contains(&c.dimension.as_str()) {
                    dims.push(&c.dimension);
                }
                if c.dimension == "ip" {
                    match crate::core::ipnet::parse_ip_net(&c.value) {
                        Ok(n) if !n.is_host() && !prefixes.contains(&n.len) => prefixes.push(n.len),
                        _ => {}
                    }
                }
            }
        }
        for e in blacklist {
            if !bl_dims.contains(&e.dimension) {
                bl_dims.push(e.dimension.clone());
            }
        }
        let all_dims = dims.len()
            + prefixes.len()
            + derived.len()
            + bl_dims
                .iter()
                .filter(|d| !dims.contains(&d.as_str()))
                .count();
        if all_dims > MAX_TABLE_DIMENSIONS {
            return Err(ShmError::Capacity {
                what: "dimensions per table",
                limit: MAX_TABLE_DIMENSIONS as u64,
                needed: all_dims as u64,
            });
        }
        // Slot plan.
        let slots = self.map.slots();
        let mut plan: Vec<Published> = Vec::with_capacity(list.len());
        let mut fresh: Vec<usize> = Vec::new(); // indexes into plan needing a new slot
        for s in list {
            match self.assigned.get(&s.id) {
                Some(a) if a.algorithm == s.algorithm => plan.push(Published {
                    slot: a.slot,
                    generation: a.generation,
                    strategy: s,
                }),
                _ => {
                    fresh.push(plan.len());
                    plan.push(Published {
                        slot: u32::MAX,
                        generation: 0,
                        strategy: s,
                    });
                }
            }
        }
        let keep: std::collections::HashSet<u32> = plan
            .iter()
            .filter(|p| p.slot != u32::MAX)
            .map(|p| p.slot)
            .collect();
        let mut free = Vec::with_capacity(fresh.len());
        let mut candidate = 0u32;
        while free.len() < fresh.len() && candidate < g.slot_count {
            let usable = !self.slot_in_use(candidate)
                && Slot::at(&slots, candidate).is_some_and(|s| {
                    let freed = s.freed_at().load(Ordering::Relaxed);
                    freed == 0 || now_ms.saturating_sub(freed) >= SLOT_QUARANTINE_MS
                });
            if usable && !keep.contains(&candidate) {
                free.push(candidate);
            }
            candidate += 1;
        }
        if free.len() < fresh.len() {
            // Count every free slot (not just the ones needed) and the ones
            // that will be: freed by this publish or in quarantine.
            let free_now = (0..g.slot_count)
                .filter(|&c| {
                    !keep.contains(&c)
                        && !self.slot_in_use(c)
                        && Slot::at(&slots, c).is_some_and(|s| {
                            let freed = s.freed_at().load(Ordering::Relaxed);
                            freed == 0 || now_ms.saturating_sub(freed) >= SLOT_QUARANTINE_MS
                        })
                })
                .count() as u64;
            // Every other slot is kept by this table, or in use by a
            // strategy it drops, or in quarantine.
            let waiting = (g.slot_count as u64)
                .saturating_sub(free_now)
                .saturating_sub(keep.len() as u64);
            return Err(ShmError::SlotsBusy {
                needed: fresh.len() as u64,
                free: free_now,
                waiting,
                limit: g.slot_count as u64,
            });
        }
        for (&i, &slot) in fresh.iter().zip(&free) {
            let gen = Slot::at(&slots, slot)
                .map(|s| s.generation().load(Ordering::Relaxed))
                .unwrap_or(0)
                .wrapping_add(1)
                .max(1);
            plan[i].slot = slot;
            plan[i].generation = gen;
        }
        let payload = segment::encode_payload(&plan, &bl_dims);
        if payload.len() as u64 > segment::capacity_bytes(g.seg_len) {
            return Err(ShmError::Capacity {
                what: "segment bytes",
                limit: segment::capacity_bytes(g.seg_len),
                needed: payload.len() as u64,
            });
        }
        Ok(Plan {
            published: plan,
            fresh,
            bl_dims,
            payload,
            now_ms,
        })
    }

    /// Steps 2 to 4 of a publish: writes what `plan` decided (blacklist,
    /// slots, the inactive segment) and flips the sequence.
    fn apply(
        &mut self,
        plan: Plan,
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let Plan {
            published: plan,
            fresh,
            bl_dims,
            payload,
            now_ms,
        } = plan;
        let slots = self.map.slots();
        // 2. Blacklist: on error the previous list stays whole. A header
        // that no longer opens (written by someone else) is rebuilt: a
        // damaged header must not fail every later publish.
        let bl = match Blacklist::open(self.map.blacklist()) {
            Ok(bl) => bl,
            Err(_) => {
                blacklist::init(self.map.blacklist(), self.map.geometry.bl_capacity)?;
                Blacklist::open(self.map.blacklist())?
            }
        };
        let bl_report = bl.rebuild(blacklist)?;
        // 3. Slots: reset the new ones, free the ones no longer used.
        let keys = self.map.keys();
        for &i in &fresh {
            let p = &plan[i];
            if let Some(s) = Slot::at(&slots, p.slot) {
                s.reset(p.strategy.id, p.generation);
            }
            keys.reset_counters(p.slot);
            self.set_slot_bit(p.slot, true);
        }
        let mut freed = 0;
        let in_plan: HashMap<u32, u32> = plan.iter().map(|p| (p.strategy.id, p.slot)).collect();
        for (id, a) in &self.assigned {
            if in_plan.get(id) != Some(&a.slot) {
                if let Some(s) = Slot::at(&slots, a.slot) {
                    s.freed_at().store(now_ms.max(1), Ordering::Relaxed);
                }
                self.set_slot_bit(a.slot, false);
                freed += 1;
            }
        }
        // 4. Write the inactive segment, then publish (Release).
        let next = self.seq.wrapping_add(1).max(1);
        segment::write_segment(
            &self.map.segment((next & 1) as usize),
            &payload,
            plan.len() as u32,
            bl_dims.len() as u32,
            next,
            config_version,
            now_ms,
        );
        let header = self.map.header();
        header.store(H_CONFIG_VERSION, config_version);
        if let Some(w) = header.u64_at(H_SEQ) {
            w.store(next, Ordering::Release);
        }
        self.seq = next;
        self.assigned = plan
            .iter()
            .map(|p| (p.strategy.id, Assigned::of(p)))
            .collect();
        self.live = Live::of(&self.map);
        Ok(PublishReport {
            seq: next,
            strategies: plan.len(),
            new_slots: fresh.len(),
            freed_slots: freed,
            blacklist_entries: bl_report.entries,
            payload_bytes: payload.len(),
            deferred: 0,
        })
    }
}
