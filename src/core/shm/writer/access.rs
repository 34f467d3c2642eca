//! The file's access: permissions and group, the writer's lock, a
//! planted file's owner, and the temporary name a new file is built under.

use super::*;

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
    pub(super) fn config(self) -> FileAccess {
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
pub(super) fn temp_name(dir: &Path, name: &str) -> PathBuf {
    let r = crate::core::keys::new_secret();
    let hex: String = r[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!(".{name}.tmp.{}.{hex}", std::process::id()))
}

/// Takes the one-writer lock on `file` (`flock`, released by the kernel
/// when the process dies). `Locked` names the holder's pid as the file's
/// header records it.
pub(super) fn lock(file: &File, path: &Path) -> Result<(), ShmError> {
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
pub(super) fn apply_access(file: &File, path: &Path, access: FileAccess) -> Result<(), ShmError> {
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
pub(super) fn foreign_owner(file: &File, path: &Path) -> Result<Option<u32>, ShmError> {
    use std::os::unix::fs::MetadataExt;
    let uid = file.metadata().map_err(|e| ShmError::io(path, e))?.uid();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    Ok((uid != me && uid != 0).then_some(uid))
}
