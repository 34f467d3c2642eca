//! The writer side of the blacklist: [`Blacklist::rebuild`] and the
//! stores it makes. The request path (`open`, `contains*`) is in the parent
//! module; this file only adds methods to the same type.

use super::*;

impl Blacklist<'_> {
    /// Replaces the list with `entries` (writer only: one process, one
    /// thread at a time). Entries present before and after stay visible
    /// throughout; on error nothing visible changes.
    pub fn rebuild(&self, entries: &[BlacklistEntry]) -> Result<RebuildReport, BlacklistError> {
        let r = &self.region;
        let public = r.load(OFF_SEQ);
        if public == 0 || public >= SEQ_MASK {
            return Err(BlacklistError::SeqExhausted);
        }
        let next = public + 1;

        // Normalise: keys in input order, duplicates merged.
        let mut keys: Vec<(Key, u64, usize)> = Vec::with_capacity(entries.len());
        let mut index: HashMap<Key, usize> = HashMap::with_capacity(entries.len());
        let mut merged = 0usize;
        let mut new_dims: Vec<u64> = Vec::new();
        let mut new_ip = false;
        let mut new_prefixes = [0u64; 2];
        for (i, e) in entries.iter().enumerate() {
            if !valid_dimension_name(&e.dimension) {
                return Err(BlacklistError::InvalidEntry {
                    index: i,
                    reason: format!("dimension {:?} is not a valid name", e.dimension),
                });
            }
            if e.value.is_empty() || e.value.len() > MAX_VALUE_LEN {
                return Err(BlacklistError::InvalidEntry {
                    index: i,
                    reason: format!(
                        "value must be 1 to {MAX_VALUE_LEN} bytes, got {}",
                        e.value.len()
                    ),
                });
            }
            let key = if e.dimension == "ip" {
                let net = parse_ip_net(&e.value).map_err(|why| BlacklistError::InvalidEntry {
                    index: i,
                    reason: format!("ip value {:?}: {why}", String::from_utf8_lossy(&e.value)),
                })?;
                if net.is_host() {
                    new_ip = true;
                    Key::ip(std::net::Ipv6Addr::from(net.addr).into())
                } else {
                    new_prefixes[net.len as usize / 64] |= 1 << (net.len % 64);
                    Key::net(net.addr, net.len)
                }
            } else {
                let dh = dimension_hash(&e.dimension);
                if !new_dims.contains(&dh) {
                    new_dims.push(dh);
                }
                Key::hashed(dh, &e.value)
            };
            // 0 in the slot means never; an expiry of 0 is long past.
            let expires = match e.expires_unix_ms {
                None => 0,
                Some(t) => t.max(1),
            };
            match index.get(&key) {
                Some(&k) => {
                    merged += 1;
                    let old = &mut keys[k].1;
                    if *old != 0 && (expires == 0 || expires > *old) {
                        *old = expires;
                    }
                }
                None => {
                    index.insert(key, keys.len());
                    keys.push((key, expires, i));
                }
            }
        }
        if keys.len() > self.capacity as usize {
            return Err(BlacklistError::CapacityExceeded {
                entries: keys.len(),
                capacity: self.capacity,
            });
        }

        // Plan without writing.
        let total = usize::try_from(self.total_slots).unwrap_or(usize::MAX);
        let mut taken = vec![false; total];
        let mut bumps: Vec<(u64, u64)> = Vec::new();
        let mut inserts: Vec<(u64, Key, u64)> = Vec::new();
        let mut pending: Vec<usize> = Vec::new();
        let mut bound = 0u32;
        let last_base = self.bases[self.levels - 1];
        let last_size = u64::from(self.sizes[self.levels - 1]);
        let probe_distance = |slot: u64, pos: u32| -> u32 {
            // Positions checked in the last level to reach `slot`.
            let start = u64::from(self.level_index(self.levels - 1, pos));
            let at = slot - last_base;
            let d = if at >= start {
                at - start
            } else {
                at + last_size - start
            };
            (d + 1) as u32
        };
        for (k, &(key, expires, _)) in keys.iter().enumerate() {
            let pos = key.position();
            let mut found = None;
            self.any_position(pos, self.probe, |slot| {
                let off = self.slot_off(slot);
                let s = r.load(off);
                let seq = s & SEQ_MASK;
                if !taken[slot as usize]
                    && s >> SEQ_BITS == key.tag
                    && seq != 0
                    && seq >= public
                    && r.load(off + 8) == key.k1
                    && r.load(off + 16) == key.k2
                {
                    found = Some(slot);
                    return true;
                }
                false
            });
            match found {
                Some(slot) => {
                    taken[slot as usize] = true;
                    bumps.push((slot, expires));
                    if slot >= last_base {
                        bound = bound.max(probe_distance(slot, pos));
                    }
                }
                None => pending.push(k),
            }
        }
        for &k in &pending {
            let (key, expires, input_index) = keys[k];
            let pos = key.position();
            let mut free = None;
            self.any_position(pos, self.probe, |slot| {
                if taken[slot as usize] {
                    return false;
                }
                free = Some(slot);
                true
            });
            let Some(slot) = free else {
                return Err(BlacklistError::TableFull {
                    index: input_index,
                    dimension: entries[input_index].dimension.clone(),
                    entries: keys.len(),
                    capacity: self.capacity,
                });
            };
            taken[slot as usize] = true;
            inserts.push((slot, key, expires));
            if slot >= last_base {
                bound = bound.max(probe_distance(slot, pos));
            }
        }
        // Old entries that are gone, and slots from the future (a writer
        // that died mid-rebuild) that must not survive the seq bump.
        let mut removed = 0usize;
        let mut future: Vec<u64> = Vec::new();
        for (slot, &t) in taken.iter().enumerate() {
            if t {
                continue;
            }
            let s = r.load(self.slot_off(slot as u64));
            let seq = s & SEQ_MASK;
            if s >> SEQ_BITS != 0 && seq != 0 && seq >= public {
                removed += 1;
                if seq >= next {
                    future.push(slot as u64);
                }
            }
        }

        // Widen the hints to old ∪ new.
        self.widen_dimensions(&new_dims);
        if new_ip {
            self.store_release(OFF_IP, 1);
        }
        for (w, bits) in new_prefixes.iter().enumerate() {
            let off = OFF_PREFIXES + 8 * w;
            self.store_release(off, r.load(off) | bits);
        }
        let old_bound = u32::try_from(r.load(OFF_BOUND))
            .unwrap_or(self.probe)
            .min(self.probe);
        self.store_release(OFF_BOUND, u64::from(old_bound.max(bound)));

        // Pass 1: kept entries, in place.
        for &(slot, expires) in &bumps {
            let off = self.slot_off(slot);
            let s = r.load(off);
            r.store(off + 24, expires);
            self.store_release(off, (s & !SEQ_MASK) | next);
        }
        // Pass 2: new entries.
        for &(slot, key, expires) in &inserts {
            let off = self.slot_off(slot);
            self.store_release(off, 0);
            fence(Ordering::Release);
            r.store(off + 8, key.k1);
            r.store(off + 16, key.k2);
            r.store(off + 24, expires);
            self.store_release(off, (key.tag << SEQ_BITS) | next);
        }
        for &slot in &future {
            self.store_release(self.slot_off(slot), 0);
        }
        // Publish: everything not refreshed is invalid from here on.
        self.store_release(OFF_SEQ, next);

        // Narrow the hints to the new list.
        self.store_release(OFF_COUNT, keys.len() as u64);
        self.store_release(OFF_BOUND, u64::from(bound));
        self.narrow_dimensions(&new_dims);
        self.store_release(OFF_IP, u64::from(new_ip));
        for (w, bits) in new_prefixes.iter().enumerate() {
            self.store_release(OFF_PREFIXES + 8 * w, *bits);
        }

        Ok(RebuildReport {
            seq: next,
            entries: keys.len(),
            kept: bumps.len(),
            inserted: inserts.len(),
            removed,
            merged_duplicates: merged,
        })
    }

    fn store_release(&self, off: usize, v: u64) {
        if let Some(w) = self.region.u64_at(off) {
            w.store(v, Ordering::Release);
        }
    }

    fn listed_dims(&self) -> [u64; MAX_LISTED_DIMENSIONS] {
        self.dimensions_in_use().hashes
    }

    /// Adds the new list's dimensions to the listed ones, or sets the
    /// all-dims flag when they do not fit. Never removes one.
    fn widen_dimensions(&self, new_dims: &[u64]) {
        if self.flag(OFF_ALL_DIMS) {
            return;
        }
        let listed = self.listed_dims();
        let missing: Vec<u64> = new_dims
            .iter()
            .copied()
            .filter(|h| !listed.contains(h))
            .collect();
        let free: Vec<usize> = (0..MAX_LISTED_DIMENSIONS)
            .filter(|&i| listed[i] == 0)
            .collect();
        if missing.len() > free.len() {
            self.store_release(OFF_ALL_DIMS, 1);
            return;
        }
        for (h, i) in missing.iter().zip(free) {
            self.store_release(OFF_DIMS + 8 * i, *h);
        }
    }

    /// Lists exactly the new list's dimensions (or sets the all-dims flag if
    /// they are too many). Dimensions that stay keep their place.
    fn narrow_dimensions(&self, new_dims: &[u64]) {
        if new_dims.len() > MAX_LISTED_DIMENSIONS {
            self.store_release(OFF_ALL_DIMS, 1);
            return;
        }
        let listed = self.listed_dims();
        for (i, h) in listed.iter().enumerate() {
            if *h != 0 && !new_dims.contains(h) {
                self.store_release(OFF_DIMS + 8 * i, 0);
            }
        }
        let listed = self.listed_dims();
        let mut free = (0..MAX_LISTED_DIMENSIONS).filter(|&i| listed[i] == 0);
        for h in new_dims {
            if !listed.contains(h) {
                if let Some(i) = free.next() {
                    self.store_release(OFF_DIMS + 8 * i, *h);
                }
            }
        }
        self.store_release(OFF_ALL_DIMS, 0);
    }
}
