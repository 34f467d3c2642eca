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
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::blacklist::{self, Blacklist, BlacklistEntry};
use super::model::{Algorithm, Strategy};
use super::segment::{self, Published, MAX_TABLE_DIMENSIONS};
use super::shm::{
    self, Capacities, Geometry, Mapping, ShmError, H_CONFIG_VERSION, H_HEARTBEAT, H_SEQ,
};
use super::slot::Slot;

/// How long a freed slot waits before it may be given to another strategy.
pub const SLOT_QUARANTINE_MS: u64 = 2_000;

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

#[derive(Debug, Clone, Copy)]
struct Assigned {
    slot: u32,
    generation: u64,
    algorithm: Algorithm,
}

pub struct Writer {
    map: Arc<Mapping>,
    assigned: HashMap<u32, Assigned>,
    seq: u64,
    opened: Opened,
}

impl Writer {
    /// Adopts a valid file of the same capacities at `path` (counters and
    /// slot assignments survive an agent restart), or creates one with
    /// permission bits `mode`. Refuses symlinks, non-regular files and files
    /// that are not rate_ctl files (it never overwrites a stranger's file).
    pub fn create_or_adopt(path: &Path, caps: Capacities, mode: u32) -> Result<Writer, ShmError> {
        let geometry = Geometry::for_capacities(&caps)?;
        match Mapping::open(path) {
            Ok(m) if m.geometry == geometry => Writer::adopt(m),
            Ok(m) => Writer::create(
                path,
                &geometry,
                mode,
                Opened::Recreated {
                    reason: format!(
                        "capacities changed (file has {} slots, {} segment bytes)",
                        m.geometry.slot_count, m.geometry.seg_len
                    ),
                },
            ),
            Err(ShmError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Writer::create(path, &geometry, mode, Opened::Created)
            }
            Err(
                e @ (ShmError::Version { .. }
                | ShmError::Uninitialised(_)
                | ShmError::Geometry { .. }
                | ShmError::Truncated { .. }),
            ) => Writer::create(
                path,
                &geometry,
                mode,
                Opened::Recreated {
                    reason: e.to_string(),
                },
            ),
            Err(ShmError::TooSmall { size: 0, .. }) => Writer::create(
                path,
                &geometry,
                mode,
                Opened::Recreated {
                    reason: "empty file".into(),
                },
            ),
            Err(e) => Err(e),
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

    fn create(path: &Path, g: &Geometry, mode: u32, opened: Opened) -> Result<Writer, ShmError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "rate_ctl".into());
        let tmp: PathBuf = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let file = shm::open_file(&tmp, true, mode)?;
        let cleanup = |e: ShmError| {
            let _ = std::fs::remove_file(&tmp);
            e
        };
        // open() applies the umask; the mode asked for is what workers need.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| cleanup(ShmError::io(&tmp, e)))?;
        file.set_len(g.file_size)
            .map_err(|e| cleanup(ShmError::io(&tmp, e)))?;
        {
            // Format through a raw mapping: the header is not valid yet.
            let raw = memmap2::MmapOptions::new()
                .len(g.file_size as usize)
                .map_raw(&file)
                .map_err(|e| cleanup(ShmError::io(&tmp, e)))?;
            // SAFETY: fresh private file of this size, mapped shared; nobody
            // else has it open yet; accessed only through Region atomics.
            let whole = unsafe { super::region::Region::from_raw(raw.as_mut_ptr(), raw.len()) };
            let header = whole.sub(0, shm::HEADER_SIZE).expect("file sized above");
            Mapping::format_header(&header, g, shm::boot_id(), shm::unix_ms());
            let bl = whole.sub(g.bl_off, g.bl_len).expect("file sized above");
            blacklist::init(bl, g.bl_capacity).map_err(|e| cleanup(e.into()))?;
        }
        let map = Mapping::from_file(file, &tmp, false).map_err(cleanup)?;
        map.set_init_done();
        std::fs::rename(&tmp, path).map_err(|e| cleanup(ShmError::io(path, e)))?;
        let mut map = map;
        map.path = path.to_path_buf();
        Ok(Writer {
            map: Arc::new(map),
            assigned: HashMap::new(),
            seq: 0,
            opened,
        })
    }

    fn adopt(map: Mapping) -> Result<Writer, ShmError> {
        let seq = map.seq();
        let mut assigned = HashMap::new();
        let mut count = 0;
        if seq != 0 {
            let mut buf = Vec::new();
            // A writer killed mid-publish leaves the *other* segment half
            // written; the active one is whole.
            if let Ok(d) = segment::read_segment(&map.segment((seq & 1) as usize), seq, &mut buf) {
                count = d.strategies.len();
                for p in d.strategies {
                    assigned.insert(
                        p.strategy.id,
                        Assigned {
                            slot: p.slot,
                            generation: p.generation,
                            algorithm: p.strategy.algorithm,
                        },
                    );
                }
            }
        }
        // Monotonic time restarts with the machine: limiter state words from
        // another boot are meaningless. Reset them; keep the counters.
        let header = map.header();
        let mut file_boot = [0u8; 16];
        header.read_bytes(shm::H_BOOT_ID, &mut file_boot);
        let boot = shm::boot_id();
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
        }
        header.store(shm::H_WRITER_PID, std::process::id() as u64);
        let w = Writer {
            map: Arc::new(map),
            assigned,
            seq,
            opened: Opened::Adopted {
                strategies: count,
                boot_changed,
            },
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
        let now_ms = shm::unix_ms().max(1);
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

    /// Records the agent's heartbeat (unix ms) in the header.
    pub fn heartbeat(&self, unix_ms: u64) {
        if let Some(w) = self.map.header().u64_at(H_HEARTBEAT) {
            w.store(unix_ms, Ordering::Release);
        }
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

    /// Publishes `strategies` (rates already local to this host) and the
    /// full blacklist. Nothing in the file changes unless the whole publish
    /// fits: invalid strategies, duplicate ids and exceeded capacities are
    /// errors and the previous table stays active.
    /// [`publish`](Self::publish), and when the table fits the capacity
    /// but not the slots free right now (the slots of the strategies it
    /// replaces are still in use or in their 2 s quarantine — e.g. a
    /// replace-import of a full table), publish it in stages: now the
    /// strategies that keep their slots plus as many new ones as slots are
    /// free (which frees the replaced ones), the rest once the freed slots
    /// may be reused. The report's `deferred` counts what is left for a
    /// later call with the same table (2 s on); 0 when complete.
    pub fn publish_staged(
        &mut self,
        strategies: &[Strategy],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let free = match self.publish(strategies, blacklist, config_version) {
            Err(ShmError::SlotsBusy { free, .. }) => free as usize,
            other => return other,
        };
        let mut first: Vec<Strategy> = Vec::with_capacity(strategies.len());
        let mut new = 0;
        let mut by_id: Vec<&Strategy> = strategies.iter().collect();
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
        let mut report = self.publish(&first, blacklist, config_version)?;
        report.deferred = strategies.len() - first.len();
        Ok(report)
    }

    pub fn publish(
        &mut self,
        strategies: &[Strategy],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let g = self.map.geometry;
        let now_ms = shm::unix_ms();
        // 1. Validate and check capacities: no side effects yet.
        let mut list: Vec<Strategy> = Vec::with_capacity(strategies.len());
        for s in strategies {
            let mut s = s.clone();
            s.validate()
                .map_err(|source| ShmError::InvalidStrategy { id: s.id, source })?;
            list.push(s);
        }
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
        for s in &list {
            for c in &s.conditions {
                if !dims.contains(&c.dimension.as_str()) {
                    dims.push(&c.dimension);
                }
            }
        }
        for e in blacklist {
            if !bl_dims.contains(&e.dimension) {
                bl_dims.push(e.dimension.clone());
            }
        }
        let all_dims = dims.len()
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
        // 2. Blacklist: on error the previous list stays whole.
        let bl = Blacklist::open(self.map.blacklist())?;
        let bl_report = bl.rebuild(blacklist)?;
        // 3. Slots: reset the new ones, free the ones no longer used.
        for &i in &fresh {
            let p = &plan[i];
            if let Some(s) = Slot::at(&slots, p.slot) {
                s.reset(p.strategy.id, p.generation);
            }
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
            .map(|p| {
                (
                    p.strategy.id,
                    Assigned {
                        slot: p.slot,
                        generation: p.generation,
                        algorithm: p.strategy.algorithm,
                    },
                )
            })
            .collect();
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
