//! The build: a table from a segment's records (or a decoded file), its
//! strategies compiled, values interned and anchored, the matcher's
//! indexes laid out.

use std::sync::Arc;

use smallvec::SmallVec;

use super::layout::{anchor, derived_resets, group_heavy_values, range_layout, Anchors};
use super::{
    Compiled, DeriveKind, Derived, DimIndex, IpKey, IpRanges, PrefixDim, Table, TemplateBase,
    TemplateDim, TemplateFit, ValueEntry, BYTES, HEAVY, IP_CHECK, IP_VALUE, LOOKED_UP, RANGE_VALUE,
    TEXT_CHECK, TEXT_VALUE,
};
use crate::core::limiter::Limiter;
use crate::core::model::ipnet::{parse_ip_net, prefix_mask, IpNet};
use crate::core::model::{parse_canonical_ipv4, Action, Condition, Op};
use crate::core::pattern;
use crate::core::shm::region::Region;
use crate::core::shm::segment::{
    decode_blacklist_dimensions, decode_records, read_raw, Decoded, RawSegment, Record,
    SegmentError, MAX_TABLE_DIMENSIONS,
};
use crate::core::shm::segment_diff::{changed_ids, MAX_CHANGED};
use crate::core::shm::Mapping;
use crate::core::tuple_map::{Group, NONE};
use crate::core::value_map::{bytes_eq, hash_bytes, MapKey, ValueMap};

/// A condition of a record being built: borrowed from the segment (or
/// from a [`Decoded`]), with its `ip` value parsed once.
#[derive(Clone, Copy)]
pub(super) struct PendingCond<'a> {
    dim: &'a str,
    /// [`Op::Exact`], [`Op::Prefix`] or [`Op::Template`] (negations are
    /// kept apart, [`Builder::neg_pool`]).
    op: Op,
    value: &'a [u8],
    /// `hash_bytes(value)`, computed while the record is read.
    hash: u64,
    /// `Builder::names[name]` is `dim` (`NONE`: past `MAX_NAMES`).
    name: u32,
}

/// How many conditions ahead a table build prefetches the value map slot
/// a condition will probe (see [`ValueMap::prefetch`]).
pub(super) const PREFETCH_AHEAD: usize = 8;

/// Distinct dimension names a builder numbers as it reads (the table
/// uses at most [`MAX_TABLE_DIMENSIONS`]; a hostile file may name more).
pub(super) const MAX_NAMES: usize = 4 * MAX_TABLE_DIMENSIONS;

/// A table being built: the enabled strategies of the records so far
/// (conditions not yet interned) and their conditions, borrowed.
pub(super) struct Builder<'a> {
    /// Compiled as they are read (each moved once, into the table); their
    /// conditions and key plans are filled in once interned and anchored.
    strategies: Vec<Compiled>,
    /// `pool[start..end]` are `strategies[i]`'s conditions.
    spans: Vec<(u32, u32)>,
    pool: Vec<PendingCond<'a>>,
    /// Negated conditions `(dimension, value)`: [`Compiled::negs`] spans.
    neg_pool: Vec<(&'a str, &'a [u8])>,
    /// The dimension names of the conditions, each once, and how many
    /// conditions name each.
    names: Vec<(&'a str, usize)>,
    /// Per strategy: per-key (`each`)? Read here so that the passes over
    /// the strategies (large) happen once.
    keyed: Vec<bool>,
    /// Some strategy has a priority other than 0 or is an `allow`.
    ranked: bool,
    /// Records read, disabled included.
    published: usize,
}

impl<'a> Builder<'a> {
    pub(super) fn new(count: usize) -> Builder<'a> {
        Builder {
            strategies: Vec::with_capacity(count),
            spans: Vec::with_capacity(count),
            pool: Vec::with_capacity(count * 2),
            neg_pool: Vec::new(),
            names: Vec::new(),
            keyed: Vec::with_capacity(count),
            ranked: false,
            published: 0,
        }
    }

    pub(super) fn add(&mut self, r: Record<'a>) {
        self.published += 1;
        if !r.strategy.enabled {
            return;
        }
        let start = self.pool.len() as u32;
        let neg_start = self.neg_pool.len() as u32;
        for &(dim, op, value) in &r.conditions {
            if op == Op::Not {
                self.neg_pool.push((dim, value));
                continue;
            }
            let name = match self
                .names
                .iter()
                .position(|n| bytes_eq(n.0.as_bytes(), dim.as_bytes()))
            {
                Some(i) => i,
                None if self.names.len() < MAX_NAMES => {
                    self.names.push((dim, 0));
                    self.names.len() - 1
                }
                None => NONE as usize,
            };
            if let Some(n) = self.names.get_mut(name) {
                n.1 += 1;
            }
            self.pool.push(PendingCond {
                dim,
                op,
                value,
                hash: hash_bytes(value),
                name: name as u32,
            });
        }
        let end = self.pool.len() as u32;
        self.spans.push((start, end));
        self.keyed.push(r.strategy.each.is_keyed());
        self.ranked |= r.strategy.priority != 0 || r.strategy.action == Action::Allow;
        self.strategies.push(Compiled {
            limiter: Limiter::from_strategy(&r.strategy),
            strategy: r.strategy,
            slot: r.slot,
            generation: r.generation,
            // Where `Table::finish` interns them: `conds[i]` is `pool[i]`.
            conds: (start, end),
            negs: (neg_start, self.neg_pool.len() as u32),
            neg: (NONE, Box::default()),
            key: None,
            response: None,
        });
    }
}

/// Whether a changed strategy can be patched in (see
/// [`Table::read_patch`]): enabled ones are plain (no key, no ranking, no
/// concurrency, response or penalty box), on exact values (`ip`: one
/// address); a disabled one is only masked.
fn patchable(r: &Record<'_>) -> bool {
    let s = &r.strategy;
    if !s.enabled {
        return true;
    }
    s.priority == 0
        && s.action != Action::Allow
        && s.algorithm != crate::core::model::Algorithm::Concurrency
        && !s.each.is_keyed()
        && s.response.is_plain()
        && s.ban.is_none()
        && r.conditions.iter().all(|&(dim, op, value)| {
            op == Op::Exact && (dim != "ip" || ip_net(value).is_some_and(|n| n.is_host()))
        })
}

/// An `ip` condition's value as a network (an address: the `/128`): the
/// IPv4 dotted quad most values are without the general parser.
pub(super) fn ip_net(value: &[u8]) -> Option<IpNet> {
    match parse_canonical_ipv4(value) {
        Some(a) => Some(IpNet::host(IpKey::v4(a).0)),
        None => parse_ip_net(value).ok(),
    }
}

impl Table {
    /// Compiles a decoded segment (tests, tools; a worker reads its
    /// segment with [`read`](Self::read)). `map` provides the slots and
    /// blacklist (None for a table that only matches, e.g. in tests).
    /// Strategies are taken by id, the first of a repeated id only.
    pub fn build(decoded: Decoded, map: Option<Arc<Mapping>>) -> Table {
        let mut published = decoded.strategies;
        published.sort_by_key(|p| p.strategy.id);
        published.dedup_by_key(|p| p.strategy.id);
        let owned: Vec<Vec<Condition>> = published
            .iter_mut()
            .map(|p| std::mem::take(&mut p.strategy.conditions))
            .collect();
        let mut b = Builder::new(published.len());
        for (p, conds) in published.into_iter().zip(&owned) {
            b.add(Record {
                strategy: p.strategy,
                slot: p.slot,
                generation: p.generation,
                conditions: conds
                    .iter()
                    .map(|c| (c.dimension.as_str(), c.op, &c.value[..]))
                    .collect(),
            });
        }
        let meta = RawSegment {
            publish_seq: decoded.publish_seq,
            config_version: decoded.config_version,
            published_unix_ms: decoded.published_unix_ms,
            count: b.published as u32,
            bl_dims: decoded.blacklist_dimensions.len() as u32,
        };
        Table::finish(b, meta, &decoded.blacklist_dimensions, map, &[])
    }

    /// What a worker does when a table is published: copies segment `seg`
    /// (named by header sequence `expected_seq`) into `buf`, checks it
    /// (header, checksum, every record with the model's rules) and
    /// compiles it, straight from the copied bytes (no owned copy of each
    /// condition on the way). A bad segment is refused whole.
    pub fn read(
        seg: &Region<'_>,
        expected_seq: u64,
        buf: &mut Vec<u8>,
        map: Option<Arc<Mapping>>,
    ) -> Result<Table, SegmentError> {
        let raw = read_raw(seg, expected_seq, buf)?;
        Table::from_payload(raw, buf, map)
    }

    /// [`read`](Self::read) after the copy: the table of `payload`, which
    /// `raw` describes (checked record by record).
    pub(super) fn from_payload(
        raw: RawSegment,
        payload: &[u8],
        map: Option<Arc<Mapping>>,
    ) -> Result<Table, SegmentError> {
        // `read_raw` bounded the count by the payload; the reservation is
        // bounded here too, whatever a later change does to that check.
        let mut b = Builder::new(
            (raw.count as usize).min(crate::core::shm::segment::max_records(payload.len())),
        );
        let end = decode_records(payload, raw.count, |r| b.add(r))?;
        let bl = decode_blacklist_dimensions(payload, end, raw.count, raw.bl_dims)?;
        Ok(Table::finish(b, raw, &bl, map, &[]))
    }

    /// Keeps `payload` (what [`read`](Self::read) read this table from,
    /// `buf` after it) for [`read_patch`](Self::read_patch) at the next
    /// publish: a worker's loader thread, whose buffer is its own.
    pub fn keep_payload(&mut self, payload: Vec<u8>) {
        self.payload = Some((payload, self.published as u32));
    }

    /// Issue 29: what a worker holding `base` makes of segment `seg`
    /// (sequence `expected_seq`) when few strategies changed: a table of
    /// the changed strategies alone, numbered as `base` numbers its
    /// dimensions, which decides with `base`'s other strategies (see
    /// [`decide_in`](Self::decide_in)). The segment is copied and
    /// checksummed as [`read`](Self::read) does, and compared with the
    /// payload `base` was read from record by record
    /// ([`changed_ids`]): only the changed records are decoded and checked
    /// (the others' bytes are those checked when `base` was read).
    ///
    /// `Ok(None)`: no patch, build the whole table (the fallback): `base`
    /// kept no payload, is itself a patch, or has per-key, ranked
    /// (priority or `allow`), concurrency, response or penalty-box
    /// strategies; more than [`MAX_CHANGED`] strategies changed, or the
    /// blacklist's dimensions; a changed strategy is one of those kinds,
    /// has a condition other than an exact value (a prefix, template,
    /// negation or address range), or names a dimension `base` has not.
    /// `buf` holds the payload afterwards (see [`keep_payload`](Self::keep_payload)).
    pub fn read_patch(
        base: &Arc<Table>,
        seg: &Region<'_>,
        expected_seq: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Option<Table>, SegmentError> {
        let raw = read_raw(seg, expected_seq, buf)?;
        Table::patch_payload(base, raw, buf)
    }

    /// [`read_patch`](Self::read_patch) after the copy.
    pub(super) fn patch_payload(
        base: &Arc<Table>,
        raw: RawSegment,
        buf: &[u8],
    ) -> Result<Option<Table>, SegmentError> {
        let Some((old, old_count)) = base.payload.as_ref() else {
            return Ok(None);
        };
        if base.patch.is_some()
            || base.ranked
            || base.keyed
            || base.concurrency
            || base.responsive
            || base.has_bans
        {
            return Ok(None);
        }
        let Some(changed) = changed_ids(old, *old_count, buf, raw.count, MAX_CHANGED) else {
            return Ok(None);
        };
        let mut b = Builder::new(changed.len());
        let mut plain = true;
        for &(_, span) in &changed {
            let Some((from, to)) = span else { continue };
            // One record alone, checked with the model's rules as
            // `decode_records` checks every record.
            decode_records(&buf[from..to], 1, |r| {
                plain &= patchable(&r);
                b.add(r);
            })?;
        }
        if !plain {
            return Ok(None);
        }
        b.published = raw.count as usize;
        let mut masked: Vec<u32> = changed
            .iter()
            .filter_map(|&(id, _)| {
                base.strategies
                    .binary_search_by_key(&id, |c| c.strategy.id)
                    .ok()
                    .map(|i| i as u32)
            })
            .collect();
        masked.sort_unstable();
        let bl: Vec<String> = Vec::new();
        let mut t = Table::finish(b, raw, &bl, base.map.clone(), &base.dims);
        // Unchanged blacklist dimensions (`changed_ids` compared them):
        // the base's blacklist decides.
        if t.dims.len() != base.dims.len() {
            return Ok(None);
        }
        t.bl_check = true;
        t.patch = Some(Box::new(super::Patch {
            base: base.clone(),
            masked: masked.into_boxed_slice(),
        }));
        Ok(Some(t))
    }

    fn finish(
        b: Builder<'_>,
        meta: RawSegment,
        blacklist_dimensions: &[String],
        map: Option<Arc<Mapping>>,
        seed_dims: &[String],
    ) -> Table {
        let Builder {
            strategies: pending,
            spans: cond_spans,
            pool,
            neg_pool,
            names,
            keyed,
            ranked,
            published,
        } = b;
        let Interned {
            mut dims,
            mut derived,
            mut index,
            mut ip_index,
            mut ip_ranges,
            counts,
            value_keys,
            dropped,
            mut key_owners,
            mut flat,
            fspans,
            plans,
            response_plans,
            responsive,
        } = intern(
            &pool,
            &cond_spans,
            &names,
            &keyed,
            &pending,
            map.as_ref(),
            seed_dims,
        );
        drop(pool);
        let (negs, neg_bytes) = negations(&neg_pool, &mut dims);
        let (mut prefixes, mut template_dims) = derived_dims(&mut derived);
        let has_negs = !negs.is_empty();
        let is_derived = |d: &usize| derived.iter().any(|x| x.dim == *d);
        // Room was made for every condition; most dimensions have fewer
        // distinct values.
        for d in &mut index {
            d.values.shrink_to_fit();
        }
        ip_index.shrink_to_fit();
        let (bl_dims, bl_ip) = blacklist_dims(blacklist_dimensions, &mut dims);
        index.resize_with(dims.len(), DimIndex::default);
        let Anchors {
            anchored,
            starts,
            anchored_dims,
            unconditioned,
        } = anchor(&mut flat, &fspans, &counts, &value_keys);
        let conds_of = |si: usize| fspans[si].0 as usize..fspans[si].1 as usize;
        let mut strategies = compiled(pending, &dropped, plans, response_plans);
        for c in strategies.iter_mut() {
            if let Some(&[(d, from, to)]) = negs.get(c.negs.0 as usize..c.negs.1 as usize) {
                c.neg = (d, neg_bytes[from as usize..to as usize].into());
            }
        }
        let (mut groups, group_lists, mut spans) =
            group_heavy_values(|si| &flat[conds_of(si as usize)], &anchored, &starts);
        let ip_dim = dims.iter().position(|d| d == "ip");
        let anchors = |d: &usize| anchored_dims >> (d % 64) & 1 == 1;
        let named = |d: &usize| Some(*d) != ip_dim && !index[*d].values.is_empty();
        // Derived dimensions are looked up apart, by every request.
        let plain = |d: &usize| !is_derived(d);
        let lookups = (0..dims.len())
            .filter(named)
            .filter(anchors)
            .filter(plain)
            .collect();
        let checks: Box<[usize]> = (0..dims.len())
            .filter(named)
            .filter(|d| !anchors(d))
            .filter(plain)
            .collect();
        // The client address is looked up only when some address anchors
        // strategies; named only beside anchors, it is a checked dimension
        // (see `reanchor`).
        let ip_lookup = ip_dim.is_some_and(|d| anchors(&d));
        let ip_check = ip_dim.filter(|_| !ip_lookup && !ip_index.is_empty());
        let mut check_kind = vec![LOOKED_UP; dims.len()].into_boxed_slice();
        for &d in checks.iter() {
            check_kind[d] = TEXT_CHECK;
        }
        if let Some(d) = ip_check {
            check_kind[d] = IP_CHECK;
        }
        index_by_bytes(
            &mut groups,
            &mut spans,
            &group_lists,
            &check_kind,
            &index,
            &value_keys,
        );
        fill_entries(
            &mut index,
            &mut ip_index,
            &mut ip_ranges,
            &spans,
            &anchored,
            &fspans,
        );
        key_owners.sort_by_key(|o| o.0);
        let (range_dims, ip_span, v4_dir) = range_layout(&mut ip_ranges);
        // Anchors come first in `conds` (swapped above); the groups of a
        // heavy value read the same conditions.
        let read = |d: &(u8, u32)| range_dims.contains(&usize::from(d.0));
        let checked = |si: usize| flat[conds_of(si)].iter().skip(1).any(read);
        derived_resets(&mut prefixes, &mut template_dims, &flat, &fspans);
        let (template_bases, template_fits, template_runs) = template_bases(&template_dims);
        let prefixes = prefixes.into_boxed_slice();
        let mut prefix_bases: Vec<(u32, u32, u32)> = Vec::new();
        for (i, p) in prefixes.iter().enumerate() {
            match prefix_bases.last_mut() {
                Some(b) if b.0 == p.base => b.2 = i as u32 + 1,
                _ => prefix_bases.push((p.base, i as u32, i as u32 + 1)),
            }
        }
        let range_dims = match !range_dims.is_empty() && (0..strategies.len()).any(checked) {
            true => range_dims,
            false => 0..0,
        };
        for r in &mut ip_ranges {
            r.addrs = Vec::new();
        }
        let bans = super::bans::Bans::of(&strategies);
        let concurrency = strategies
            .iter()
            .any(|c| c.strategy.algorithm == crate::core::model::Algorithm::Concurrency);
        let bl_dims_empty = bl_dims.is_empty();
        Table {
            map,
            publish_seq: meta.publish_seq,
            config_version: meta.config_version,
            published_unix_ms: meta.published_unix_ms,
            published,
            templates: !template_dims.is_empty(),
            template_escapes: template_dims.iter().filter(|t| t.shape.wild == 0).any(|t| {
                let m = &index[t.dim as usize].values;
                (0..m.len()).any(|i| m.key_at(i).contains(&b'\\'))
            }),
            derived: !derived.is_empty(),
            prefixes,
            prefix_bases: prefix_bases.into_boxed_slice(),
            template_bases,
            template_fits,
            template_runs,
            template_resets: template_dims
                .iter()
                .filter(|t| t.reset)
                .map(|t| t.dim)
                .collect(),
            negs: negs.into_boxed_slice(),
            neg_bytes: neg_bytes.into_boxed_slice(),
            value_keys,
            dims,
            index,
            ip_dim,
            ip_index,
            ip_ranges,
            range_dims,
            ip_span,
            v4_dir,
            ranked,
            // No strategy anchored anywhere: none has a condition.
            match_free: anchored.is_empty() && !ranked && !has_negs,
            lookups,
            checks,
            check_kind,
            ip_lookup,
            ip_check,
            anchored,
            conds: flat.into_boxed_slice(),
            groups,
            group_lists,
            unconditioned,
            strategies,
            bl_dims,
            bl_ip,
            keyed: !key_owners.is_empty(),
            key_owners,
            responsive,
            has_bans: !bans.is_empty(),
            bl_check: bl_ip || !bl_dims_empty || !bans.is_empty(),
            bans,
            concurrency,
            payload: None,
            patch: None,
        }
    }
}

// The build's steps below are `#[inline(always)]`: each is called once,
// from `finish`, which compiles as one function as it did before it was
// cut into them. Out of line, the crate's split into codegen units moved
// and the nginx handler's code with it: +15-18 instructions per request
// (callgrind, `ratectl` and `perkey`), nothing of the request path changed.

/// A dimension's index by name, numbering a new one (`None` past
/// [`MAX_TABLE_DIMENSIONS`]: the writer refuses such a file).
#[inline(always)]
fn dim_of(dims: &mut Vec<String>, name: &str) -> Option<usize> {
    if let Some(i) = dims.iter().position(|d| d == name) {
        return Some(i);
    }
    if dims.len() >= MAX_TABLE_DIMENSIONS {
        return None;
    }
    dims.push(name.to_string());
    Some(dims.len() - 1)
}

/// What [`intern`] gives the rest of the build.
struct Interned {
    dims: Vec<String>,
    derived: Vec<Derived>,
    index: Vec<DimIndex>,
    ip_index: ValueMap<u128, ValueEntry>,
    ip_ranges: Vec<IpRanges>,
    counts: Vec<u32>,
    value_keys: Vec<(u8, u32)>,
    dropped: Vec<usize>,
    key_owners: Vec<(u32, crate::core::keys::KeyLimiter)>,
    flat: Vec<(u8, u32)>,
    fspans: Vec<(u32, u32)>,
    plans: Vec<(usize, Box<super::keyed::KeyPlan>)>,
    response_plans: Vec<(usize, Box<crate::core::table::ResponsePlan>)>,
    responsive: bool,
}

/// The build's first step: every condition's dimension numbered and its
/// value interned (per dimension, the `ip` addresses, the networks per
/// prefix length, prefixes and templates as pseudo-dimensions), per-key
/// and response plans made; strategies that cannot be built dropped.
#[inline(always)]
fn intern(
    pool: &[PendingCond<'_>],
    cond_spans: &[(u32, u32)],
    names: &[(&str, usize)],
    keyed: &[bool],
    pending: &[Compiled],
    map: Option<&Arc<Mapping>>,
    seed_dims: &[String],
) -> Interned {
    // A patch numbers its dimensions as its base does (see `read_patch`).
    let mut dims: Vec<String> = seed_dims.to_vec();
    // Prefix lengths and template shapes in use (see `derived`).
    let mut derived: Vec<Derived> = Vec::new();
    // Per dimension: value → its entry (interned id, anchored list);
    // the `ip` dimension's values by address (see `ip_index`).
    let mut index: Vec<DimIndex> = Vec::new();
    let mut ip_index: ValueMap<u128, ValueEntry> = ValueMap::default();
    let mut ip_ranges: Vec<IpRanges> = Vec::new();
    // Strategies per interned value id.
    let mut counts: Vec<u32> = Vec::with_capacity(pool.len());
    // Per interned value id: which map holds it and its entry there
    // (see `conditions`).
    let mut value_keys: Vec<(u8, u32)> = Vec::with_capacity(pool.len());
    // Conditions per dimension name: room made in each map at once.
    let room = |name: &str| names.iter().find(|n| n.0 == name).map_or(0, |n| n.1);
    ip_index.reserve(room("ip"));
    // An `ip` value as a network (an address: the /128), parsed once.
    let any_ip = names.iter().any(|n| n.0 == "ip") || names.len() >= MAX_NAMES;
    let nets: Vec<Option<IpNet>> = match any_ip {
        true => pool
            .iter()
            .map(|c| {
                bytes_eq(c.dim.as_bytes(), b"ip")
                    .then(|| ip_net(c.value))
                    .flatten()
            })
            .collect(),
        false => Vec::new(),
    };
    let net_of = |i: usize| nets.get(i).copied().flatten();
    // The prefix lengths of the networks in use become dimensions
    // first, longest first, so that their indexes are contiguous
    // (`range_dims`: one fill clears them for a request outside).
    let mut lens: Vec<u8> = nets
        .iter()
        .flatten()
        .filter(|n| !n.is_host())
        .map(|n| n.len)
        .collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    lens.dedup();
    if !lens.is_empty() {
        dim_of(&mut dims, "ip");
    }
    let len_dims: Vec<(u8, Option<usize>)> = lens
        .iter()
        .map(|&l| (l, dim_of(&mut dims, &format!("ip/{l}"))))
        .collect();
    // Each name's dimension index, found once.
    let mut name_dims: Vec<Option<Option<usize>>> = vec![None; names.len()];
    let mut dropped: Vec<usize> = Vec::new();
    // Stat slot → per-key limiter (see `Table::key_owners`).
    let mut key_owners: Vec<(u32, crate::core::keys::KeyLimiter)> = Vec::new();
    // Every strategy's `(dimension, value id)`, `flat[fspans[si]]`:
    // compact, for the passes below (anchors), then boxed per strategy.
    let mut flat: Vec<(u8, u32)> = Vec::with_capacity(pool.len());
    let mut fspans: Vec<(u32, u32)> = Vec::with_capacity(pending.len());
    // Per-key plans, by index in `pending` (ascending).
    let mut plans: Vec<(usize, Box<super::keyed::KeyPlan>)> = Vec::new();
    let mut response_plans: Vec<(usize, Box<crate::core::table::ResponsePlan>)> = Vec::new();
    let mut responsive = false;
    'next: for (si, &(from, to)) in cond_spans.iter().enumerate() {
        // `flat[i]` is `pool[i]` ([`Compiled::conds`] was set so): a
        // dropped strategy's conditions are left as padding.
        flat.resize(from as usize, (0, NONE));
        let start = flat.len();
        for (i, c) in pool
            .iter()
            .enumerate()
            .take(to as usize)
            .skip(from as usize)
        {
            // The slot a later condition will probe, asked for now:
            // most values are new to their map (a cache miss each).
            let ahead = i + PREFETCH_AHEAD;
            match (pool.get(ahead), net_of(ahead)) {
                (_, Some(n)) if n.is_host() => ip_index.prefetch(n.addr.hash()),
                (Some(p), None) => {
                    let dim = name_dims.get(p.name as usize).copied().flatten().flatten();
                    if let Some(x) = dim.and_then(|d| index.get(d)) {
                        x.values.prefetch(p.hash);
                    }
                }
                _ => {}
            }
            let net = net_of(i);
            // A network is matched as the pseudo-dimension `ip/<len>`
            // (`len` over the IPv6 form), one per prefix length: a
            // strategy names it at most once, like any dimension, so
            // anchoring and tuple-space groups need nothing more.
            let d = match (net, c.op) {
                // A prefix or template: a pseudo-dimension of its base
                // (looked up by every request, see `pattern`), the base
                // itself a dimension the request supplies.
                (_, Op::Prefix | Op::Template) => {
                    let (name, kind) = match c.op {
                        Op::Prefix => (
                            pattern::prefix_dimension(c.dim, c.value.len()),
                            DeriveKind::Prefix(c.value.len(), [0; 4]),
                        ),
                        _ => match pattern::parse_template(c.value) {
                            Ok(shape) => (shape.dimension(c.dim), DeriveKind::Template(shape)),
                            Err(_) => (String::new(), DeriveKind::Prefix(0, [0; 4])),
                        },
                    };
                    let base = dim_of(&mut dims, c.dim);
                    let d = match (name.is_empty(), base) {
                        (false, Some(_)) => dim_of(&mut dims, &name),
                        _ => None,
                    };
                    if let (Some(d), Some(base)) = (d, base) {
                        let at = match derived.iter().position(|x| x.dim == d) {
                            Some(at) => at,
                            None => {
                                derived.push(Derived { dim: d, base, kind });
                                derived.len() - 1
                            }
                        };
                        if let (DeriveKind::Prefix(_, last), Some(&b)) =
                            (&mut derived[at].kind, c.value.last())
                        {
                            last[usize::from(b >> 6)] |= 1 << (b & 63);
                        }
                    }
                    d
                }
                (Some(n), _) if !n.is_host() => {
                    // The text form of a request's address is read
                    // through `ip` (callers without a binary address).
                    if dim_of(&mut dims, "ip").is_none() {
                        flat.truncate(start);
                        dropped.push(si);
                        continue 'next;
                    }
                    len_dims.iter().find(|x| x.0 == n.len).and_then(|x| x.1)
                }
                (_, _) => match name_dims.get_mut(c.name as usize) {
                    Some(Some(d)) => *d,
                    Some(slot) => *slot.insert(dim_of(&mut dims, c.dim)),
                    None => dim_of(&mut dims, c.dim),
                },
            };
            let Some(d) = d else {
                flat.truncate(start);
                dropped.push(si);
                continue 'next; // over the dimension limit: the writer refuses this
            };
            if index.len() <= d {
                let at = index.len();
                index.resize_with(d + 1, DimIndex::default);
                for (i, e) in index.iter_mut().enumerate().skip(at) {
                    if dims[i] != "ip" && !dims[i].starts_with("ip/") {
                        e.values.reserve(room(&dims[i]));
                    }
                }
            }
            let next = counts.len() as u32;
            // `ip` values are canonical addresses (the model validates
            // them): interned by their 128-bit form, so a request never
            // formats its address as text.
            let ip = match net {
                Some(n) if n.is_host() && dims[d] == "ip" => Some(n.addr),
                _ => None,
            };
            let net = net.filter(|_| c.op == Op::Exact);
            // A template is interned without its `/**` (the shape
            // says so): see `pattern::template_key`.
            let (key, key_hash) = match c.op {
                Op::Template => {
                    let k = pattern::template_key(c.value);
                    (k, hash_bytes(k))
                }
                _ => (c.value, c.hash),
            };
            let (id, entry) = match (net, ip) {
                (Some(n), _) if !n.is_host() => {
                    let r = match ip_ranges.iter().position(|r| r.dim == d) {
                        Some(r) => r,
                        None => {
                            ip_ranges.push(IpRanges {
                                dim: d,
                                mask: prefix_mask(n.len),
                                nets: ValueMap::default(),
                                lo: n.addr,
                                hi: n.addr,
                                addrs: Vec::new(),
                                len: n.len,
                            });
                            ip_ranges.len() - 1
                        }
                    };
                    let span = &mut ip_ranges[r];
                    (span.lo, span.hi) = (span.lo.min(n.addr), span.hi.max(n.addr));
                    let nets = &mut ip_ranges[r].nets;
                    let id = nets
                        .get_or_insert_with(&n.addr, || ValueEntry::new(next))
                        .id;
                    let entry = nets.len() - 1;
                    if id == next {
                        ip_ranges[r].addrs.push(n.addr);
                    }
                    (id, (RANGE_VALUE, entry))
                }
                (_, Some(ip)) => {
                    let id = ip_index
                        .get_or_insert_with(&ip, || ValueEntry::new(next))
                        .id;
                    (id, (IP_VALUE, ip_index.len() - 1))
                }
                (_, None) => {
                    let values = &mut index[d].values;
                    let id = values
                        .get_or_insert_hashed(key, key_hash, || ValueEntry::new(next))
                        .id;
                    (id, (TEXT_VALUE, values.len() - 1))
                }
            };
            if id == next {
                counts.push(0);
                value_keys.push((entry.0, entry.1 as u32));
            }
            counts[id as usize] += 1;
            flat.push((d as u8, id));
        }
        if keyed[si] {
            let s = &pending[si];
            let e = &s.strategy.each;
            let Some(limiter) = crate::core::keys::KeyLimiter::from_strategy(&s.strategy) else {
                flat.truncate(start);
                dropped.push(si);
                continue 'next; // the model refuses it
            };
            let mut kd = SmallVec::<[(usize, bool); 4]>::new();
            for name in &e.dims {
                let Some(d) = dim_of(&mut dims, name) else {
                    flat.truncate(start);
                    dropped.push(si);
                    continue 'next;
                };
                kd.push((d, name == "ip"));
            }
            key_owners.push((s.slot, limiter));
            plans.push((
                si,
                Box::new(super::keyed::KeyPlan {
                    dims: kd,
                    ipv4_prefix: e.ipv4_prefix,
                    ipv6_prefix: e.ipv6_prefix,
                    on_full: e.on_full,
                    limiter,
                    seed: map.as_ref().map(|m| m.keys().hasher(s.strategy.id)),
                    max_keys: e.max_keys,
                }),
            ));
        }
        // Issue 31: the cost dimensions are read by index, not matched.
        let resp = &pending[si].strategy.response;
        if !resp.is_plain() {
            let mut dim = |name: &str| {
                (!name.is_empty())
                    .then(|| dim_of(&mut dims, name))
                    .flatten()
            };
            let plan = crate::core::table::ResponsePlan {
                count_if: resp.count_if,
                cost_from: dim(&resp.cost_from),
                cost_after: dim(&resp.cost_after),
            };
            responsive = true;
            response_plans.push((si, Box::new(plan)));
        }
        fspans.push((start as u32, flat.len() as u32));
    }
    Interned {
        dims,
        derived,
        index,
        ip_index,
        ip_ranges,
        counts,
        value_keys,
        dropped,
        key_owners,
        flat,
        fspans,
        plans,
        response_plans,
        responsive,
    }
}

/// Negated conditions `(dimension, start, end)` of their values in the
/// returned bytes.
#[inline(always)]
fn negations(
    neg_pool: &[(&str, &[u8])],
    dims: &mut Vec<String>,
) -> (Vec<(u32, u32, u32)>, Vec<u8>) {
    // Negated conditions: each value once per condition, compared as
    // bytes with the request's (after the matcher, see `match_into`).
    let mut negs: Vec<(u32, u32, u32)> = Vec::with_capacity(neg_pool.len());
    let mut neg_bytes: Vec<u8> = Vec::new();
    for &(dim, value) in neg_pool {
        // Over the dimension limit (the writer refuses it): never holds.
        let d = dim_of(dims, dim).map_or(NONE, |d| d as u32);
        let at = neg_bytes.len() as u32;
        neg_bytes.extend_from_slice(value);
        negs.push((d, at, neg_bytes.len() as u32));
    }
    (negs, neg_bytes)
}

/// Each base's runs of template shapes (sorted by base, rest, segments:
/// see [`derived_dims`]), and per base the shapes each segment count fits
/// (see [`TemplateBase::fits`]), one run each in the returned shapes.
#[allow(clippy::type_complexity)]
fn template_bases(
    dims: &[TemplateDim],
) -> (Box<[TemplateBase]>, Box<[TemplateFit]>, Box<[TemplateDim]>) {
    let mut bases = template_runs(dims);
    let mut fits: Vec<TemplateFit> = Vec::new();
    let mut runs: Vec<TemplateDim> = Vec::new();
    for b in bases.iter_mut() {
        let start = fits.len() as u32;
        let (exact, rest) = (
            &dims[b.exact.0 as usize..b.exact.1 as usize],
            &dims[b.rest.0 as usize..b.rest.1 as usize],
        );
        let longest = exact.iter().chain(rest).map(|t| t.shape.segments).max();
        // Counts 0 ..= longest + 1: the last stands for every longer one.
        for s in 0..=usize::from(longest.unwrap_or(0)) + 1 {
            let from = runs.len() as u32;
            let n = |t: &&TemplateDim| usize::from(t.shape.segments);
            runs.extend(exact.iter().filter(|t| n(t) == s));
            runs.extend(rest.iter().filter(|t| n(t) <= s));
            fits.push(TemplateFit {
                run: (from, runs.len() as u32),
            });
        }
        b.fits = (start, fits.len() as u32 - start - 1);
    }
    (bases, fits.into_boxed_slice(), runs.into_boxed_slice())
}

/// Each base's runs of template shapes (see [`template_bases`]).
fn template_runs(dims: &[TemplateDim]) -> Box<[TemplateBase]> {
    let mut bases: Vec<TemplateBase> = Vec::new();
    for (i, t) in dims.iter().enumerate() {
        let i = i as u32;
        match bases.last_mut() {
            Some(b) if b.base == t.base => match t.shape.rest {
                false => b.exact.1 = i + 1,
                true if b.rest == (0, 0) => b.rest = (i, i + 1),
                true => b.rest.1 = i + 1,
            },
            _ => bases.push(TemplateBase {
                base: t.base,
                exact: if t.shape.rest { (i, i) } else { (i, i + 1) },
                rest: if t.shape.rest { (i, i + 1) } else { (0, 0) },
                fits: (0, 0),
            }),
        }
    }
    bases.into_boxed_slice()
}

/// The prefix lengths (by base, then length) and template shapes in use
/// (by base, rest, segment count).
#[inline(always)]
fn derived_dims(derived: &mut [Derived]) -> (Vec<PrefixDim>, Box<[TemplateDim]>) {
    derived.sort_by_key(|x| (x.base, x.dim));
    let mut prefixes: Vec<PrefixDim> = Vec::new();
    let mut template_dims: Vec<TemplateDim> = Vec::new();
    for x in derived.iter() {
        match x.kind {
            DeriveKind::Prefix(len, last) => prefixes.push(PrefixDim {
                base: x.base as u32,
                len: len as u32,
                dim: x.dim as u32,
                last,
                reset: true,
                reset_after: true,
            }),
            DeriveKind::Template(shape) => template_dims.push(TemplateDim {
                base: x.base as u32,
                dim: x.dim as u32,
                shape,
                reset: true,
            }),
        }
    }
    prefixes.sort_by_key(|p| (p.base, p.len));
    template_dims.sort_by_key(|t| (t.base, t.shape.rest, t.shape.segments, t.dim));
    let template_dims = template_dims.into_boxed_slice();
    (prefixes, template_dims)
}

/// The compiled strategies: those not dropped, with their key and
/// response plans.
#[inline(always)]
fn compiled(
    mut pending: Vec<Compiled>,
    dropped: &[usize],
    plans: Vec<(usize, Box<super::keyed::KeyPlan>)>,
    response_plans: Vec<(usize, Box<crate::core::table::ResponsePlan>)>,
) -> Vec<Compiled> {
    // The compiled strategies: those not dropped (usually all: then
    // none is moved or touched), in order, with their key plans.
    if !dropped.is_empty() {
        let mut si = 0;
        pending.retain(|_| {
            si += 1;
            dropped.binary_search(&(si - 1)).is_err()
        });
    }
    for (si, plan) in plans {
        let k = si - dropped.partition_point(|&d| d < si);
        pending[k].key = Some(plan);
    }
    for (si, plan) in response_plans {
        if dropped.binary_search(&si).is_ok() {
            continue;
        }
        let k = si - dropped.partition_point(|&d| d < si);
        pending[k].response = Some(plan);
    }
    pending
}

/// The blacklist's dimensions other than `ip` (index, name hash), and
/// whether it holds client addresses.
#[inline(always)]
fn blacklist_dims(names: &[String], dims: &mut Vec<String>) -> (Vec<(usize, u64)>, bool) {
    let mut bl_dims = Vec::new();
    let mut bl_ip = false;
    for d in names {
        if d == "ip" {
            bl_ip = true;
        } else {
            if let Some(i) = dim_of(dims, d) {
                bl_dims.push((i, crate::core::blacklist::dimension_hash(d)));
            }
        }
    }
    (bl_dims, bl_ip)
}

/// Groups of two dimensions one of which is only checked (a grid anchored
/// under its other dimension) keyed by that value's bytes as well, and
/// their spans flagged [`BYTES`]: a request finds its cell without
/// interning the value.
#[inline(always)]
fn index_by_bytes(
    groups: &mut [Group],
    spans: &mut [(u32, u32)],
    group_lists: &[u32],
    check_kind: &[u8],
    index: &[DimIndex],
    value_keys: &[(u8, u32)],
) {
    // A group of two dimensions, one of them only checked (a grid
    // anchored under its other dimension): keyed by that value's
    // bytes as well, so a request finds its cell without interning it.
    let text_check = |d: u8| check_kind[usize::from(d)] == TEXT_CHECK;
    for g in groups.iter_mut() {
        let &[d0, d1] = g.dims() else { continue };
        let at = match (text_check(d0), text_check(d1)) {
            (true, false) => 0,
            (false, true) => 1,
            _ => continue,
        };
        let map = &index[usize::from(g.dims()[at])].values;
        // A checked dimension's values are all text.
        let text = |id: u32| match value_keys[id as usize] {
            (TEXT_VALUE, e) => (hash_bytes(map.key_at(e as usize)), e),
            _ => (0, u32::MAX),
        };
        g.index_bytes(at, text);
    }
    for span in spans.iter_mut() {
        if span.1 == HEAVY | 1
            && groups[group_lists[span.0 as usize] as usize]
                .bytes_dims()
                .is_some()
        {
            span.1 |= BYTES;
        }
    }
}

/// Every value entry's span (its anchored list or groups), and the
/// strategy it matches alone when that one has no other condition.
#[inline(always)]
fn fill_entries(
    index: &mut [DimIndex],
    ip_index: &mut ValueMap<u128, ValueEntry>,
    ip_ranges: &mut [IpRanges],
    spans: &[(u32, u32)],
    anchored: &[u32],
    fspans: &[(u32, u32)],
) {
    let conds_of = |si: usize| fspans[si].0 as usize..fspans[si].1 as usize;
    let entries = index.iter_mut().flat_map(|d| d.values.values_mut());
    let ranges = ip_ranges.iter_mut().flat_map(|r| r.nets.values_mut());
    for e in entries.chain(ip_index.values_mut()).chain(ranges) {
        (e.start, e.len) = spans[e.id as usize];
        if e.len == 1 {
            let si = anchored[e.start as usize];
            if conds_of(si as usize).len() == 1 {
                e.only = si;
            }
        }
    }
}
