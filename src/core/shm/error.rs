//! Why a file cannot be used (a leaf of the file layer: `keys` may name
//! it without naming the mapping).

use std::io;
use std::path::{Path, PathBuf};

use super::LAYOUT_VERSION;

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
        source: crate::core::model::ModelError,
    },
    #[error("capacity: {0}")]
    BadCapacity(&'static str),
    #[error("strategy {0}: id published twice")]
    DuplicateId(u32),
    #[error("blacklist: {0}")]
    Blacklist(#[from] crate::core::blacklist::BlacklistError),
}

impl ShmError {
    pub(crate) fn io(path: &Path, source: io::Error) -> ShmError {
        ShmError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
