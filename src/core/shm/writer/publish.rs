//! Publishing a table: plan (check capacities, assign slots, encode),
//! then apply (blacklist, slots, the inactive segment, the sequence).

use std::borrow::Borrow;

use super::*;

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

/// One strategy of a plan: borrowed from the caller's table, with its slot.
struct Item<'a> {
    strategy: &'a Strategy,
    slot: u32,
    generation: u64,
}

/// What a publish will write, decided before anything is written.
struct Plan<'a> {
    /// The strategies with their slots, by id.
    published: Vec<Item<'a>>,
    /// Indexes into `published` of the strategies that get a new slot.
    fresh: Vec<usize>,
    /// The blacklist's dimensions, in table order.
    bl_dims: Vec<String>,
    /// The encoded segment payload.
    payload: Vec<u8>,
    /// Each record's strategy id and start in `payload`, by id.
    starts: Vec<(u32, u32)>,
    /// Where the records end in `payload` (the blacklist's names follow).
    records_end: usize,
    /// The wall clock the plan was made at (slot quarantine, timestamps).
    now_ms: u64,
}

/// The payload a writer last wrote, kept to copy unchanged records from.
pub(super) struct Prev {
    payload: Vec<u8>,
    /// Each record's strategy id and start, by id.
    starts: Vec<(u32, u32)>,
    records_end: usize,
}

impl Prev {
    /// The record of strategy `id` at `starts[j]` (the caller's walk), if
    /// it was written with `slot` and `generation`.
    fn record(&self, j: usize, id: u32, slot: u32, generation: u64) -> Option<&[u8]> {
        let &(at_id, start) = self.starts.get(j)?;
        if at_id != id {
            return None;
        }
        let end = self
            .starts
            .get(j + 1)
            .map_or(self.records_end, |n| n.1 as usize);
        let r = self.payload.get(start as usize..end)?;
        // Bytes 8..12 the slot, 16..24 the generation (encode_record).
        let same = r.get(8..12) == Some(&slot.to_le_bytes()[..])
            && r.get(16..24) == Some(&generation.to_le_bytes()[..]);
        same.then_some(r)
    }
}

/// A set of slot numbers below the file's slot count (a bitmap).
struct SlotSet {
    bits: Vec<u64>,
    len: u64,
}

impl SlotSet {
    fn new(slot_count: u32) -> SlotSet {
        SlotSet {
            bits: vec![0; (slot_count as usize).div_ceil(64)],
            len: 0,
        }
    }

    fn insert(&mut self, slot: u32) {
        if let Some(w) = self.bits.get_mut(slot as usize / 64) {
            let m = 1u64 << (slot % 64);
            self.len += u64::from(*w & m == 0);
            *w |= m;
        }
    }

    fn contains(&self, slot: u32) -> bool {
        self.bits
            .get(slot as usize / 64)
            .is_some_and(|w| w & (1u64 << (slot % 64)) != 0)
    }
}

impl Writer {
    /// [`publish_valid`](Self::publish_valid), and when the table fits the capacity
    /// but not the slots free right now (the slots of the strategies it
    /// replaces are still in use or in their 2 s quarantine — e.g. a
    /// replace-import of a full table), publish it in stages: now the
    /// strategies that keep their slots plus as many new ones as slots are
    /// free (which frees the replaced ones), the rest once the freed slots
    /// may be reused. The report's `deferred` counts what is left for a
    /// later call with the same table (2 s on); 0 when complete.
    ///
    /// `changed`: the ids (sorted ascending) that may differ from this
    /// writer's last successful publish (`None`: any of them). The records of the others
    /// that keep their slot are copied from the last payload instead of
    /// encoded again (issue 29: a one-strategy change of a 10,000-strategy
    /// table). A `changed` list that misses a changed strategy publishes
    /// its old record: the caller must list every id it touched.
    pub fn publish_staged<S: Borrow<ValidStrategy>>(
        &mut self,
        strategies: &[S],
        blacklist: &[BlacklistEntry],
        config_version: u64,
        changed: Option<&[u32]>,
    ) -> Result<PublishReport, ShmError> {
        let free = match self.publish_changed(strategies, blacklist, config_version, changed) {
            Err(ShmError::SlotsBusy { free, .. }) => free as usize,
            other => return other,
        };
        let mut first: Vec<&ValidStrategy> = Vec::with_capacity(strategies.len());
        let mut new = 0;
        let mut by_id: Vec<&ValidStrategy> = strategies.iter().map(|s| s.borrow()).collect();
        by_id.sort_by_key(|s| s.id);
        for s in by_id {
            let keeps = self
                .assigned
                .get(s.id)
                .is_some_and(|a| a.algorithm == s.algorithm);
            if keeps || new < free {
                new += usize::from(!keeps);
                first.push(s);
            }
        }
        // The first stage is not all of `config_version`: it goes out under
        // the version already in the file, so that a reader (workers' stats,
        // the agent's applied version, host lag) sees the new version only
        // once the whole table is in.
        let previous = self.map.header().load(H_CONFIG_VERSION);
        let mut report = self.publish_changed(&first, blacklist, previous, changed)?;
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
    ///
    /// The table is taken by reference (`&[ValidStrategy]` or
    /// `&[&ValidStrategy]`): nothing in it is copied, and a table already
    /// sorted by id (the agent's) is not sorted again.
    pub fn publish_valid<S: Borrow<ValidStrategy>>(
        &mut self,
        strategies: &[S],
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        self.publish_changed(strategies, blacklist, config_version, None)
    }

    /// [`publish_valid`](Self::publish_valid) with the ids that may have
    /// changed since the last publish (see [`publish_staged`](Self::publish_staged)).
    pub fn publish_changed<S: Borrow<ValidStrategy>>(
        &mut self,
        strategies: &[S],
        blacklist: &[BlacklistEntry],
        config_version: u64,
        changed: Option<&[u32]>,
    ) -> Result<PublishReport, ShmError> {
        // A file replaced here drops `prev`: everything is encoded.
        self.ensure_whole()?;
        let list: Vec<&Strategy> = strategies.iter().map(|s| &**s.borrow()).collect();
        // Any doubt (no list, not sorted): every record encoded.
        let changed = changed.filter(|c| c.is_sorted());
        let plan = self.plan(list, blacklist, changed)?;
        self.apply(plan, blacklist, config_version)
    }

    /// Step 1 of a publish: checks every capacity (the strategies carry
    /// their validation), assigns slots and encodes the payload. No side
    /// effects.
    fn plan<'a>(
        &self,
        mut list: Vec<&'a Strategy>,
        blacklist: &[BlacklistEntry],
        changed: Option<&[u32]>,
    ) -> Result<Plan<'a>, ShmError> {
        let g = self.map.geometry;
        let now_ms = clock::unix_ms();
        if !list.is_sorted_by_key(|s| s.id) {
            list.sort_by_key(|s| s.id);
        }
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
        // the matcher (see core::model::ipnet).
        let mut prefixes: Vec<u8> = Vec::new();
        // So is each prefix length and template shape (see core::pattern).
        let mut derived: Vec<String> = Vec::new();
        for s in &list {
            for c in &s.conditions {
                if let Some(p) = c.matcher_dimension() {
                    if !derived.contains(&p) {
                        derived.push(p);
                    }
                }
                if !dims.contains(&c.dimension.as_str()) {
                    dims.push(&c.dimension);
                }
                if c.dimension == "ip" {
                    match crate::core::model::ipnet::parse_ip_net(&c.value) {
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
        // Slot plan: the table and the assignments, both sorted by id,
        // walked side by side.
        let slots = self.map.slots();
        let mut plan: Vec<Item> = Vec::with_capacity(list.len());
        let mut fresh: Vec<usize> = Vec::new(); // indexes into plan needing a new slot
        let mut keep = SlotSet::new(g.slot_count);
        let assigned = self.assigned.as_slice();
        let mut j = 0;
        for s in list {
            while j < assigned.len() && assigned[j].0 < s.id {
                j += 1;
            }
            match assigned.get(j).filter(|a| a.0 == s.id) {
                Some((_, a)) if a.algorithm == s.algorithm => {
                    keep.insert(a.slot);
                    plan.push(Item {
                        slot: a.slot,
                        generation: a.generation,
                        strategy: s,
                    })
                }
                _ => {
                    fresh.push(plan.len());
                    plan.push(Item {
                        slot: u32::MAX,
                        generation: 0,
                        strategy: s,
                    });
                }
            }
        }
        let mut free = Vec::with_capacity(fresh.len());
        let mut candidate = 0u32;
        while free.len() < fresh.len() && candidate < g.slot_count {
            let usable = !self.slot_in_use(candidate)
                && Slot::at(&slots, candidate).is_some_and(|s| {
                    let freed = s.freed_at().load(Ordering::Relaxed);
                    freed == 0 || now_ms.saturating_sub(freed) >= SLOT_QUARANTINE_MS
                });
            if usable && !keep.contains(candidate) {
                free.push(candidate);
            }
            candidate += 1;
        }
        if free.len() < fresh.len() {
            // Count every free slot (not just the ones needed) and the ones
            // that will be: freed by this publish or in quarantine.
            let free_now = (0..g.slot_count)
                .filter(|&c| {
                    !keep.contains(c)
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
                .saturating_sub(keep.len);
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
        // The last payload's size: one allocation, no regrowth.
        let mut payload = Vec::with_capacity((self.last_payload + 4096).max(plan.len() * 96));
        let mut starts = Vec::with_capacity(plan.len());
        // Unchanged records (not in `changed`, same slot and generation)
        // copied from the last payload, both walked by id; the rest encoded.
        let reuse = changed.zip(self.prev.as_ref());
        let mut j = 0;
        for p in &plan {
            let id = p.strategy.id;
            starts.push((id, payload.len() as u32));
            let old = reuse.and_then(|(changed, prev)| {
                while prev.starts.get(j).is_some_and(|s| s.0 < id) {
                    j += 1;
                }
                if changed.binary_search(&id).is_ok() {
                    return None;
                }
                prev.record(j, id, p.slot, p.generation)
            });
            match old {
                Some(bytes) => payload.extend_from_slice(bytes),
                None => segment::encode_record(p.strategy, p.slot, p.generation, &mut payload),
            }
        }
        let records_end = payload.len();
        segment::encode_tail(&bl_dims, &mut payload);
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
            starts,
            records_end,
            now_ms,
        })
    }

    /// Steps 2 to 4 of a publish: writes what `plan` decided (blacklist,
    /// slots, the inactive segment) and flips the sequence.
    fn apply(
        &mut self,
        plan: Plan<'_>,
        blacklist: &[BlacklistEntry],
        config_version: u64,
    ) -> Result<PublishReport, ShmError> {
        let Plan {
            published: plan,
            fresh,
            bl_dims,
            payload,
            starts,
            records_end,
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
        // Both sorted by id: walked side by side.
        let mut freed = 0;
        let mut j = 0;
        for (id, a) in self.assigned.as_slice() {
            while j < plan.len() && plan[j].strategy.id < *id {
                j += 1;
            }
            let kept = plan
                .get(j)
                .is_some_and(|p| p.strategy.id == *id && p.slot == a.slot);
            if !kept {
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
        self.assigned = AssignedList::from_sorted(
            plan.iter()
                .map(|p| {
                    (
                        p.strategy.id,
                        Assigned::of(p.strategy, p.slot, p.generation),
                    )
                })
                .collect(),
        );
        self.last_payload = payload.len();
        let payload_bytes = payload.len();
        self.prev = Some(Prev {
            payload,
            starts,
            records_end,
        });
        self.live = Live::of(&self.map);
        Ok(PublishReport {
            seq: next,
            strategies: plan.len(),
            new_slots: fresh.len(),
            freed_slots: freed,
            blacklist_entries: bl_report.entries,
            payload_bytes,
            deferred: 0,
        })
    }
}
