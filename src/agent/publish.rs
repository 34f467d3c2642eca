//! The one place the agent meets the core shared-memory writer and reader.

use std::path::Path;

use tracing::{info, warn};

use super::Sink;
use crate::store::record::BlacklistRecord;
use crate::store::CounterSample;
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::ValidStrategy;
use rate_ctl::core::shm::segment::{read_segment, Decoded, SegmentError};
use rate_ctl::core::shm::slot::Slot;
/// Why the file may not be created with a mode (the command line checks
/// `--mode` with it before the agent starts).
pub use rate_ctl::core::shm::writer::mode_refusal;
use rate_ctl::core::shm::writer::{FileAccess, Opened, Writer};
use rate_ctl::core::shm::{Capacities, Mapping, ShmError};

/// The core writer as the agent's [`Sink`].
pub struct ShmSink {
    writer: Writer,
    /// Strategies the last publish deferred (see `Writer::publish_staged`).
    deferred: usize,
}

impl Sink for ShmSink {
    fn check_file(&mut self) -> Result<Option<String>, ShmError> {
        self.writer.check_live()
    }

    fn publish(
        &mut self,
        strategies: &[&ValidStrategy],
        blacklist: &[BlacklistRecord],
        config_version: u64,
        changed: Option<&[u32]>,
    ) -> Result<String, ShmError> {
        let entries: Vec<BlacklistEntry> = blacklist
            .iter()
            .map(|b| BlacklistEntry {
                dimension: b.dimension.clone(),
                value: b.value.clone().into_bytes(),
                expires_unix_ms: b.expires_ms,
            })
            .collect();
        let r = self
            .writer
            .publish_staged(strategies, &entries, config_version, changed)?;
        self.deferred = r.deferred;
        // A full key table lifts these strategies' limit for new keys.
        let allow: Vec<u32> = strategies
            .iter()
            .filter(|s| {
                s.each.is_keyed() && s.each.on_full == rate_ctl::core::model::each::OnFull::Allow
            })
            .map(|s| s.id)
            .collect();
        if !allow.is_empty() {
            warn!(
                strategies = ?allow,
                "on_full allow: once the key table is full, new keys of these strategies pass unlimited"
            );
        }
        Ok(format!(
            "sequence {}, {} strategies ({} new slots, {} freed), {} blacklist entries, {} bytes",
            r.seq, r.strategies, r.new_slots, r.freed_slots, r.blacklist_entries, r.payload_bytes
        ))
    }

    fn heartbeat(&self, unix_ms: u64) {
        self.writer.heartbeat(unix_ms);
        let repaired = self.writer.repair_foreign();
        if repaired > 0 {
            warn!(
                slots = repaired,
                "limiter state no clock could have written (garbage, another boot) replaced by an exhausted quota"
            );
        }
    }

    fn deferred(&self) -> usize {
        self.deferred
    }

    fn mapping(&self) -> Option<std::sync::Arc<Mapping>> {
        Some(self.writer.mapping().clone())
    }

    fn counters(&self) -> Vec<CounterSample> {
        // From the writer's slot assignments (what it published), not a
        // decode of the whole segment: with 10,000 strategies that took
        // milliseconds at every heartbeat, during which a change waited.
        let slots = self.writer.mapping().slots();
        self.writer
            .published()
            .filter_map(|(id, slot, generation)| {
                let c = Slot::counters_at(&slots, slot, generation)?;
                Some(CounterSample {
                    id,
                    passed: c.passed,
                    limited: c.limited,
                    delayed: c.delayed,
                })
            })
            .collect()
    }
}

/// Creates or adopts the file at `path` (an adopted file keeps its slots
/// and counters).
pub fn open(
    path: &Path,
    caps: Capacities,
    mode: u32,
    group: Option<u32>,
) -> Result<ShmSink, ShmError> {
    // The SIGBUS guard before the first mapping: a file truncated under
    // the agent becomes an error, not a crash.
    if let Err(e) = rate_ctl::core::shm::sigbus::install() {
        warn!(error = %e, "cannot install the SIGBUS guard");
    }
    // Workers (nginx's user, not the agent's) write the stat slots.
    let others_write = mode & 0o002 != 0;
    let group_write = mode & 0o020 != 0;
    let workers_write = others_write || (group_write && group.is_some());
    if !workers_write {
        warn!(
            path = %path.display(),
            mode = format!("{mode:04o}"),
            group = group.map(|g| g.to_string()).unwrap_or_else(|| "(the agent's)".into()),
            "nginx workers can write the file only if they run as the agent's user{}; \
             otherwise limits do not count (use --mode 0660 --group <workers' group>)",
            if group_write { " or group" } else { "" }
        );
    }
    let writer = Writer::open(path, caps, FileAccess { mode, group })?;
    match writer.opened() {
        Opened::Created => info!(path = %path.display(), "created the shared-memory file"),
        Opened::Adopted {
            strategies,
            boot_changed,
        } => info!(
            path = %path.display(), strategies, boot_changed,
            "adopted the shared-memory file; counters of unchanged strategies continue"
        ),
        Opened::Recreated { reason } => {
            warn!(path = %path.display(), %reason, "recreated the shared-memory file")
        }
    }
    Ok(ShmSink {
        writer,
        deferred: 0,
    })
}

/// Why the active table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("active segment (sequence {seq}): {source}")]
    Segment { seq: u64, source: SegmentError },
    #[error("the writer kept publishing; try again")]
    Busy,
}

/// Reads the active segment, retrying while the writer is mid-publish.
pub fn read_active(map: &Mapping) -> Result<Option<Decoded>, ReadError> {
    let mut buf = Vec::new();
    for _ in 0..10_000 {
        let seq = map.seq();
        if seq == 0 {
            return Ok(None);
        }
        match read_segment(&map.segment((seq & 1) as usize), seq, &mut buf) {
            Ok(d) => return Ok(Some(d)),
            Err(SegmentError::Busy) => std::thread::yield_now(),
            Err(SegmentError::Sequence { .. }) if map.seq() != seq => {}
            Err(source) => return Err(ReadError::Segment { seq, source }),
        }
    }
    Err(ReadError::Busy)
}
