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

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::blacklist::{self, Blacklist, BlacklistEntry};
use crate::core::clock::{self, MonotonicClock};
use crate::core::limiter::Limiter;
use crate::core::model::{Algorithm, Strategy, ValidStrategy};
use crate::core::shm::segment::{self, MAX_TABLE_DIMENSIONS};
use crate::core::shm::slot::Slot;
use crate::core::shm::{
    self, user_name, Capacities, Geometry, Mapping, ShmError, H_CONFIG_VERSION, H_HEARTBEAT, H_SEQ,
};

mod access;
mod publish;
mod slots;

use access::{apply_access, foreign_owner, lock, temp_name};
pub use access::{mode_refusal, FileAccess};
pub use publish::PublishReport;
use slots::{Assigned, AssignedList};

/// How long a freed slot waits before it may be given to another strategy.
pub const SLOT_QUARANTINE_MS: u64 = 2_000;

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

pub struct Writer {
    map: Arc<Mapping>,
    assigned: AssignedList,
    seq: u64,
    opened: Opened,
    access: FileAccess,
    /// What the agent last wrote, to notice what someone else changed
    /// ([`check_live`](Self::check_live)).
    live: Live,
    /// The last payload's length: the next one's buffer is allocated once.
    last_payload: usize,
    /// The payload this writer last wrote, its own copy (never read back
    /// from the file): a publish told which strategies changed since
    /// copies the others' records from it (issue 29). `None` after
    /// creating or adopting a file.
    prev: Option<publish::Prev>,
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

    /// The published strategies as `(id, slot, generation)`, by id: what
    /// the active segment says, without decoding it (the agent reads the
    /// counters of every strategy at each heartbeat).
    pub fn published(&self) -> impl Iterator<Item = (u32, u32, u64)> + '_ {
        self.assigned
            .as_slice()
            .iter()
            .map(|(id, a)| (*id, a.slot, a.generation))
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
                unsafe { crate::core::shm::region::Region::from_raw(raw.as_mut_ptr(), raw.len()) };
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
            assigned: AssignedList::default(),
            seq: 0,
            opened,
            access,
            last_payload: 0,
            prev: None,
        })
    }

    fn adopt(map: Mapping, access: FileAccess) -> Result<Writer, ShmError> {
        let seq = map.seq();
        let mut assigned = Vec::new();
        let mut count = 0;
        if seq != 0 {
            let mut buf = Vec::new();
            // A writer killed mid-publish leaves the *other* segment half
            // written; the active one is whole.
            if let Ok(d) = segment::read_segment(&map.segment((seq & 1) as usize), seq, &mut buf) {
                count = d.strategies.len();
                for p in &d.strategies {
                    assigned.push((
                        p.strategy.id,
                        Assigned::of(&p.strategy, p.slot, p.generation),
                    ));
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
        let assigned = AssignedList::from_unsorted(assigned);
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
            for row in 0..crate::core::shm::ledger::ROWS as usize {
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
            last_payload: 0,
            prev: None,
        };
        w.reconcile_bitmap();
        Ok(w)
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
}
