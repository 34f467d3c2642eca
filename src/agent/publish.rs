//! The one place the agent meets the core shared-memory writer and reader.

use std::path::Path;

use tracing::{info, warn};

use super::Sink;
use crate::store::record::BlacklistRecord;
use crate::store::CounterSample;
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::Strategy;
use rate_ctl::core::segment::{read_segment, Decoded, SegmentError};
use rate_ctl::core::shm::{Capacities, Mapping};
use rate_ctl::core::slot::Slot;
use rate_ctl::core::writer::{Opened, Writer};

/// File capacities chosen on the command line.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_strategies: u32,
    pub segment_bytes: u64,
    pub blacklist_entries: u32,
}

/// The core writer as the agent's [`Sink`].
pub struct ShmSink {
    writer: Writer,
}

impl Sink for ShmSink {
    fn publish(
        &mut self,
        strategies: &[Strategy],
        blacklist: &[BlacklistRecord],
        config_version: u64,
    ) -> Result<String, String> {
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
            .publish(strategies, &entries, config_version)
            .map_err(|e| e.to_string())?;
        Ok(format!(
            "sequence {}, {} strategies ({} new slots, {} freed), {} blacklist entries, {} bytes",
            r.seq, r.strategies, r.new_slots, r.freed_slots, r.blacklist_entries, r.payload_bytes
        ))
    }

    fn heartbeat(&self, unix_ms: u64) {
        self.writer.heartbeat(unix_ms);
    }

    fn counters(&self) -> Vec<CounterSample> {
        let map = self.writer.mapping();
        let Ok(Some(decoded)) = read_active(map) else {
            return Vec::new();
        };
        let slots = map.slots();
        decoded
            .strategies
            .iter()
            .filter_map(|p| {
                let c = Slot::counters_at(&slots, p.slot, p.generation)?;
                Some(CounterSample {
                    id: p.strategy.id,
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
pub fn open(path: &Path, caps: Caps, mode: u32) -> Result<ShmSink, String> {
    let writer = Writer::create_or_adopt(
        path,
        Capacities {
            max_strategies: caps.max_strategies,
            segment_bytes: caps.segment_bytes,
            blacklist_entries: caps.blacklist_entries,
        },
        mode,
    )
    .map_err(|e| e.to_string())?;
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
    Ok(ShmSink { writer })
}

/// Reads the active segment, retrying while the writer is mid-publish.
pub fn read_active(map: &Mapping) -> Result<Option<Decoded>, String> {
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
            Err(e) => return Err(format!("active segment (sequence {seq}): {e}")),
        }
    }
    Err("the writer kept publishing; try again".into())
}
