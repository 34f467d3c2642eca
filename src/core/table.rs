//! The worker's in-process table: the decoded strategies, the matcher index,
//! and the per-request decision (blacklist → match → admit).
//!
//! ## Matching
//! Each strategy is *anchored* under one of its conditions: the one whose
//! `(dimension, value)` is shared by the fewest strategies. Per dimension a
//! hash map sends a value to its interned id and to the strategies anchored
//! there. A request looks each of its values up once (one hash probe per
//! dimension in use), then checks the anchored strategies' other conditions
//! by comparing interned ids — integer compares, no string work. The cost is
//! the number of probes plus the number of strategies anchored under the
//! request's own values, independent of the table size; strategies without
//! conditions match every request.

use std::net::IpAddr;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::admit::{self, Decision, Hit, Verdict};
use super::blacklist::Blacklist;
use super::limiter::Limiter;
use super::model::{Algorithm, Strategy};
use super::region::Region;
use super::segment::{Decoded, MAX_TABLE_DIMENSIONS};
use super::shm::Mapping;
use super::slot::Slot;

const NONE: u32 = u32::MAX;

/// One published strategy, compiled.
pub struct Compiled {
    pub strategy: Strategy,
    pub limiter: Limiter,
    pub slot: u32,
    pub generation: u64,
    /// `(dimension index, interned value id)` of every condition.
    conds: SmallVec<[(u8, u32); 4]>,
}

impl Compiled {
    /// This strategy's admission input, over its slot in `slots`.
    fn hit<'a>(&'a self, slots: &Region<'a>) -> Option<Hit<'a>> {
        Some(Hit {
            id: self.strategy.id,
            limiter: &self.limiter,
            action: self.strategy.action,
            slot: Slot::at(slots, self.slot)?,
            generation: self.generation,
        })
    }
}

#[derive(Default)]
struct DimIndex {
    values: FxHashMap<Box<[u8]>, (u32, u32, u32)>, // value → (value id, anchored start, anchored len)
}

/// What a request carries: its values for [`Table::dimensions`], by index,
/// and its client address for the exact blacklist lookup.
pub struct Request<'r> {
    pub values: &'r [Option<&'r [u8]>],
    pub ip: Option<IpAddr>,
    pub now_ns: u64,
    pub now_unix_ms: u64,
    /// Location-level dry run: count and report, never reject or delay.
    pub dry_run: bool,
}

/// The outcome for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No strategy matched.
    NoMatch,
    /// The blacklist holds the client address (`None`) or the request's
    /// value of this dimension (`Some(index)`).
    Blacklisted { dimension_index: Option<usize> },
    /// Strategies matched; see the decision.
    Limited(Decision),
}

/// A decision plus what is needed to release concurrency slots later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDecision {
    pub outcome: Outcome,
    /// Indexes (into the table) of concurrency strategies this request
    /// holds; release them with [`Table::release`] when it ends.
    pub held: SmallVec<[u32; 2]>,
}

impl TableDecision {
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.outcome {
            Outcome::Limited(d) => Some(&d.verdict),
            _ => None,
        }
    }
}

/// The table a worker decides with; rebuilt on every publish.
pub struct Table {
    map: Option<Arc<Mapping>>,
    publish_seq: u64,
    config_version: u64,
    published_unix_ms: u64,
    dims: Vec<String>,
    index: Vec<DimIndex>,
    anchored: Vec<u32>,
    unconditioned: Vec<u32>,
    strategies: Vec<Compiled>,
    /// Dimensions (by index, with their name hash) that have blacklist
    /// entries, `ip` excluded.
    bl_dims: Vec<(usize, u64)>,
    /// The blacklist held client addresses when this table was published
    /// (blacklist and table are published together).
    bl_ip: bool,
}

impl Table {
    /// Compiles a decoded segment. `map` provides the slots and blacklist
    /// (None for a table that only matches, e.g. in tests).
    pub fn build(decoded: Decoded, map: Option<Arc<Mapping>>) -> Table {
        let mut dims: Vec<String> = Vec::new();
        let dim_of = |dims: &mut Vec<String>, name: &str| -> Option<usize> {
            if let Some(i) = dims.iter().position(|d| d == name) {
                return Some(i);
            }
            if dims.len() >= MAX_TABLE_DIMENSIONS {
                return None;
            }
            dims.push(name.to_string());
            Some(dims.len() - 1)
        };
        let mut strategies: Vec<Compiled> = Vec::with_capacity(decoded.strategies.len());
        // Per dimension: value → (interned id, anchored start, anchored len).
        let mut index: Vec<DimIndex> = Vec::new();
        let mut counts: Vec<u32> = Vec::new(); // strategies per value id
        let mut published = decoded.strategies;
        published.sort_by_key(|p| p.strategy.id);
        published.dedup_by_key(|p| p.strategy.id);
        'next: for p in published {
            if !p.strategy.enabled {
                continue;
            }
            let mut conds = SmallVec::new();
            for c in &p.strategy.conditions {
                let Some(d) = dim_of(&mut dims, &c.dimension) else {
                    continue 'next; // over the dimension limit: the writer refuses this
                };
                if index.len() <= d {
                    index.resize_with(d + 1, DimIndex::default);
                }
                let next = counts.len() as u32;
                let id = match index[d].values.get(&c.value[..]) {
                    Some(&(id, _, _)) => id,
                    None => {
                        index[d]
                            .values
                            .insert(c.value.clone().into_boxed_slice(), (next, 0, 0));
                        counts.push(0);
                        next
                    }
                };
                counts[id as usize] += 1;
                conds.push((d as u8, id));
            }
            strategies.push(Compiled {
                limiter: Limiter::from_strategy(&p.strategy),
                strategy: p.strategy,
                slot: p.slot,
                generation: p.generation,
                conds,
            });
        }
        let mut bl_dims = Vec::new();
        let mut bl_ip = false;
        for d in &decoded.blacklist_dimensions {
            if d == "ip" {
                bl_ip = true;
            } else {
                if let Some(i) = dim_of(&mut dims, d) {
                    bl_dims.push((i, super::blacklist::dimension_hash(d)));
                }
            }
        }
        index.resize_with(dims.len(), DimIndex::default);
        // Anchor each strategy under its least shared condition; lay the
        // anchored lists out contiguously (counting sort by value id).
        let mut anchor_of: Vec<u32> = Vec::with_capacity(strategies.len());
        let mut per_value = vec![0u32; counts.len() + 1];
        let mut unconditioned = Vec::new();
        for (si, s) in strategies.iter().enumerate() {
            match s.conds.iter().min_by_key(|(_, v)| counts[*v as usize]) {
                Some(&(_, v)) => {
                    anchor_of.push(v);
                    per_value[v as usize + 1] += 1;
                }
                None => {
                    anchor_of.push(NONE);
                    unconditioned.push(si as u32);
                }
            }
        }
        for v in 1..per_value.len() {
            per_value[v] += per_value[v - 1];
        }
        let starts = per_value.clone();
        let mut anchored = vec![0u32; *per_value.last().unwrap_or(&0) as usize];
        for (si, &v) in anchor_of.iter().enumerate() {
            if v != NONE {
                anchored[per_value[v as usize] as usize] = si as u32;
                per_value[v as usize] += 1;
            }
        }
        for d in &mut index {
            for (id, start, len) in d.values.values_mut() {
                *start = starts[*id as usize];
                *len = starts[*id as usize + 1] - *start;
            }
        }
        Table {
            map,
            publish_seq: decoded.publish_seq,
            config_version: decoded.config_version,
            published_unix_ms: decoded.published_unix_ms,
            dims,
            index,
            anchored,
            unconditioned,
            strategies,
            bl_dims,
            bl_ip,
        }
    }

    /// Dimension names the request must supply, by index.
    pub fn dimensions(&self) -> &[String] {
        &self.dims
    }

    pub fn dimension_index(&self, name: &str) -> Option<usize> {
        self.dims.iter().position(|d| d == name)
    }

    /// The publish sequence this table was read at (changes on every publish).
    pub fn version(&self) -> u64 {
        self.publish_seq
    }

    /// The store's config version the agent published.
    pub fn config_version(&self) -> u64 {
        self.config_version
    }

    pub fn published_unix_ms(&self) -> u64 {
        self.published_unix_ms
    }

    pub fn strategies(&self) -> &[Compiled] {
        &self.strategies
    }

    pub fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.map.as_ref()
    }

    /// Indexes of the strategies matching `values`, ascending (= by id).
    pub fn matching(&self, values: &[Option<&[u8]>], out: &mut SmallVec<[u32; 8]>) {
        const INLINE: usize = 16;
        let n = self.dims.len().min(values.len());
        if n <= INLINE {
            // The common case: scratch space on the stack, nothing allocated.
            let mut req = [NONE; INLINE];
            let mut spans = [(0u32, 0u32); INLINE];
            self.match_into(&values[..n], &mut req[..n], &mut spans[..n], out);
        } else {
            let mut req = vec![NONE; n];
            let mut spans = vec![(0u32, 0u32); n];
            self.match_into(&values[..n], &mut req, &mut spans, out);
        }
    }

    /// `req[d]`: interned id of the request's value of dimension `d` (NONE:
    /// absent or named by no strategy); `spans`: anchored lists to check.
    fn match_into(
        &self,
        values: &[Option<&[u8]>],
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        out: &mut SmallVec<[u32; 8]>,
    ) {
        out.clear();
        out.extend_from_slice(&self.unconditioned);
        let mut ns = 0;
        for (d, v) in values.iter().enumerate() {
            let Some(v) = v.filter(|v| !v.is_empty()) else {
                continue;
            };
            if let Some(&(id, start, len)) = self.index[d].values.get(v) {
                req[d] = id;
                if len > 0 {
                    spans[ns] = (start, len);
                    ns += 1;
                }
            }
        }
        let sources = ns + usize::from(!out.is_empty());
        for &(start, len) in &spans[..ns] {
            for &si in &self.anchored[start as usize..(start + len) as usize] {
                let s = &self.strategies[si as usize];
                if s.conds.iter().all(|&(d, v)| req[d as usize] == v) {
                    out.push(si);
                }
            }
        }
        // Each source is ascending already; only a mix needs sorting.
        if sources > 1 {
            out.sort_unstable();
        }
    }

    /// Blacklist, match and admit one request.
    pub fn decide(&self, r: &Request<'_>) -> TableDecision {
        let mut held = SmallVec::new();
        // An empty blacklist costs nothing per request.
        let bl = (self.bl_ip || !self.bl_dims.is_empty())
            .then(|| self.blacklist())
            .flatten();
        if let Some(bl) = bl {
            if let Some(ip) = r.ip.filter(|_| self.bl_ip) {
                if bl.contains_ip(ip, r.now_unix_ms) {
                    return TableDecision {
                        outcome: Outcome::Blacklisted {
                            dimension_index: None,
                        },
                        held,
                    };
                }
            }
            for &(d, hash) in &self.bl_dims {
                if let Some(Some(v)) = r.values.get(d) {
                    if !v.is_empty() && bl.contains_hashed(hash, v, r.now_unix_ms) {
                        return TableDecision {
                            outcome: Outcome::Blacklisted {
                                dimension_index: Some(d),
                            },
                            held,
                        };
                    }
                }
            }
        }
        let mut matched = SmallVec::new();
        self.matching(r.values, &mut matched);
        if matched.is_empty() {
            return TableDecision {
                outcome: Outcome::NoMatch,
                held,
            };
        }
        let Some(map) = &self.map else {
            return TableDecision {
                outcome: Outcome::NoMatch,
                held,
            };
        };
        let slots = map.slots();
        let mut hits: SmallVec<[Hit<'_>; 8]> = SmallVec::new();
        let mut hit_index: SmallVec<[u32; 8]> = SmallVec::new();
        for &si in &matched {
            if let Some(hit) = self.strategies[si as usize].hit(&slots) {
                hits.push(hit);
                hit_index.push(si);
            }
        }
        let decision = admit::admit(&hits, r.now_ns, r.dry_run);
        // After a pass or a delay every concurrency hit holds one unit (a
        // dry run too: it counts real requests in flight); after a
        // rejection none does (admit refunded them).
        if !matches!(decision.verdict, Verdict::Reject { .. }) {
            for (h, &si) in hits.iter().zip(&hit_index) {
                if h.limiter.algorithm() == Algorithm::Concurrency {
                    held.push(si);
                }
            }
        }
        TableDecision {
            outcome: Outcome::Limited(decision),
            held,
        }
    }

    /// Releases the concurrency slots a finished request held.
    pub fn release(&self, d: &TableDecision) {
        let Some(map) = &self.map else { return };
        let slots = map.slots();
        let mut hits: SmallVec<[Hit<'_>; 2]> = SmallVec::new();
        for &si in &d.held {
            if let Some(hit) = self.strategies.get(si as usize).and_then(|s| s.hit(&slots)) {
                hits.push(hit);
            }
        }
        admit::release(&hits);
    }

    fn blacklist(&self) -> Option<Blacklist<'_>> {
        let map = self.map.as_ref()?;
        Blacklist::open(map.blacklist()).ok()
    }
}
