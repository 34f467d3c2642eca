//! The one place the agent meets the core shared-memory writer.

use std::path::Path;

use super::agent::Sink;
use super::record::BlacklistRecord;
use rate_ctl::core::model::Strategy;

/// File capacities chosen on the command line.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_strategies: u32,
    pub segment_bytes: u64,
    pub blacklist_entries: u32,
}

pub struct ShmSink;

impl Sink for ShmSink {
    fn publish(&mut self, _: &[Strategy], _: &[BlacklistRecord], _: u64) -> Result<String, String> {
        Err("the core shared-memory writer is not in this build yet".into())
    }
    fn heartbeat(&self, _: u64) {}
}

/// Creates or adopts the file at `path`.
pub fn open(_path: &Path, _caps: Caps, _mode: u32) -> Result<ShmSink, String> {
    Err("the core shared-memory writer is not in this build yet".into())
}

/// `rate-ctl shm inspect`.
pub fn inspect(_path: &Path, _json: bool) -> Result<(), String> {
    Err("the core shared-memory reader is not in this build yet".into())
}
