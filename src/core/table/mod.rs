//! The worker's in-process table: the decoded strategies, the matcher index,
//! and the per-request decision (blacklist → match → admit).
//!
//! ## Matching
//! Each strategy is *anchored* under one of its conditions: the one whose
//! `(dimension, value)` is shared by the fewest strategies, unless every
//! strategy anchored in a dimension can move to a condition in another
//! dimension that is looked up anyway, and the lists it joins stay cheap:
//! then they move, and that dimension is no longer looked up by every
//! request (`ip=X AND api=/pay` beside `api=/login`: the address is read
//! only for a request to `/pay`; see [`reanchor`]). Per dimension a
//! [`ValueMap`] sends a value to its interned id and to the strategies
//! anchored there. A request looks each of its values up once (one probe
//! per dimension some strategy is anchored in; the dimensions only named
//! beside an anchor are looked up only when there are candidates to
//! check), then checks the anchored strategies' other conditions by
//! comparing interned ids — integer compares, no string work.
//! A strategy alone under its value with no other condition (`api=/pay`)
//! matches on the lookup itself; when the lookups found one candidate
//! in all (the usual strategy on two values), its other conditions are
//! compared as bytes instead (no value interned for them).
//!
//! When many strategies share their anchor value (a grid `user=ui AND
//! api=aj`: every anchor value holds a whole row), the value holds instead
//! one tuple-space [`Group`] per shape (set of dimensions) among them, and
//! the request probes each group once with its tuple of interned ids
//! ([`tuple_map`](super::tuple_map)). When that value's list is the only
//! one found and its one group has two dimensions, the other of which
//! anchors nothing (the grid's `api`), the group is probed instead with
//! the bytes of the request's `api` ([`Group::index_bytes`]): nothing is
//! interned, one hash of the value and one probe. A value keeps its list of candidates
//! when that is shorter than [`HEAVY_MIN`] or than twice its number of
//! shapes, so the cost of a request is the number of lookups plus, per
//! value found, at most about twice the number of shapes anchored there —
//! independent of the table size and of how many strategies share a value;
//! strategies without conditions match every request (a table of nothing
//! else, `each ip` alone, skips the matcher). The working arrays
//! live in a [`Scratch`] the nginx worker keeps, so a request allocates and
//! clears nothing.

use std::net::IpAddr;
use std::sync::Arc;

use smallvec::SmallVec;

use super::admit::{self, Decision, Hit, Verdict};
use super::blacklist::Blacklist;
use super::ipnet::IpNet;
use super::ipnet::{parse_ip_net, prefix_mask};
use super::limiter::Limiter;
use super::model::{
    parse_canonical_ipv4, parse_ip, Action, Algorithm, Condition, Op, Strategy, MAX_VALUE_LEN,
};
use super::pattern::{self, Shape};
use super::region::Region;
use super::segment::{
    decode_blacklist_dimensions, decode_records, read_raw, Decoded, RawSegment, Record,
    SegmentError, MAX_TABLE_DIMENSIONS,
};
use super::shm::Mapping;
use super::slot::Slot;
use super::tuple_map::{Group, NONE};
use super::value_map::{bytes_eq, hash_bytes, MapKey, ValueMap};

/// Where an interned value is kept (see [`Table::conditions`]): the
/// dimension's text map, the `ip` address map, a prefix length's networks.
const TEXT_VALUE: u8 = 0;
const IP_VALUE: u8 = 1;
const RANGE_VALUE: u8 = 2;

/// How a request reads a dimension (see [`Table::check_kind`]).
const LOOKED_UP: u8 = 0;
const TEXT_CHECK: u8 = 1;
const IP_CHECK: u8 = 2;

/// An anchored list at least this long is probed by shape (when it has at
/// most half as many shapes as strategies): checking a candidate costs
/// about half a probe.
pub const HEAVY_MIN: u32 = 4;

/// Set in [`ValueEntry::len`] (and in a span of [`Scratch`]) when the span
/// indexes [`Table::group_lists`] rather than [`Table::anchored`].
const HEAVY: u32 = 1 << 31;

/// Set beside [`HEAVY`] when the span is one group indexed by the bytes of
/// its checked value ([`Group::index_bytes`]): decided when the table is
/// built, so that a request only compares its span with `HEAVY | BYTES | 1`.
const BYTES: u32 = 1 << 30;

/// The matcher's working space. A caller that decides many requests (the
/// nginx worker) keeps one, so a request neither allocates nor clears
/// arrays: each request writes the entries it then reads (the vectors only
/// grow, for a table with more dimensions or a request with more matches
/// than any before).
#[derive(Default)]
pub struct Scratch {
    /// Interned id of the request's value per dimension (NONE: absent or
    /// named by no strategy), written for every dimension looked up.
    req: Vec<u32>,
    /// Anchored lists (or group lists, [`HEAVY`]) to check, at most one
    /// per dimension.
    spans: Vec<(u32, u32)>,
    /// Matched strategy indexes.
    matches: Vec<u32>,
    /// Per-key concurrency units the last request took ([`Table::units_with_keys`]).
    key_holds: super::keys::KeyHolds,
    /// The first per-key strategy whose key found the table full in the
    /// last request, with its `on_full` (for the worker's log).
    key_full: Option<(u32, super::each::OnFull)>,
    /// What the last request settles when it ends and whether a cost was
    /// invalid (issue 31; cleared only by a table with such strategies).
    pub response: ResponseOut,
    /// A request's value projected onto a template shape
    /// ([`pattern::project`]): room made once, when a table with
    /// templates is loaded.
    tkey: Vec<u8>,
}

/// Matches room is made for when a table is loaded (more: the vector grows).
const MATCHES_ROOM: usize = 16;

/// The longest template key a request is projected to: no template is
/// longer than a value ([`pattern::project`] stops there).
const TKEY_ROOM: usize = MAX_VALUE_LEN + 8;

/// A pseudo-dimension derived from a request's value of another (see
/// [`pattern`]): its index, the base dimension's, and how.
#[derive(Clone, Copy)]
struct Derived {
    dim: usize,
    base: usize,
    kind: DeriveKind,
}

/// A prefix length in use (see [`Table::prefixes`]).
struct PrefixDim {
    base: u32,
    len: u32,
    dim: u32,
    /// The last bytes of the prefixes of this length (see [`DeriveKind`]).
    last: [u64; 4],
    /// Some strategy checks this length beside its anchor: a request
    /// must clear its id when it finds nothing (else the id is never read).
    reset: bool,
    /// This length or a longer one of the same base is `reset`: when the
    /// value is shorter than this length and none is, the rest of the
    /// base's lengths are skipped.
    reset_after: bool,
}

/// A template shape in use (see [`Table::template_dims`]).
struct TemplateDim {
    base: u32,
    dim: u32,
    shape: Shape,
}

#[derive(Clone, Copy, PartialEq)]
enum DeriveKind {
    /// The first `n` bytes (`api^n`), and the set of last bytes of the
    /// prefixes of that length (bit `b` of the 256): a request whose byte
    /// `n - 1` is none of them skips the probe (most lengths, most
    /// requests).
    Prefix(usize, [u64; 4]),
    /// The projection onto a template shape (`api~shape`).
    Template(Shape),
}

impl Scratch {
    /// The per-key strategy (id, `on_full`) whose new key found the key
    /// table full in the request decided last with this working space.
    pub fn key_table_full(&self) -> Option<(u32, super::each::OnFull)> {
        self.key_full
    }

    /// Makes room for `table` now (when a worker loads it), so that no
    /// request allocates.
    pub fn fit(&mut self, table: &Table) {
        let n = table.dimensions().len();
        if self.req.len() < n {
            self.req.resize(n, NONE);
            self.spans.resize(n, (0, 0));
        }
        self.matches.reserve(MATCHES_ROOM);
        if table.templates && self.tkey.capacity() < TKEY_ROOM {
            self.tkey.reserve(TKEY_ROOM);
        }
    }
}

/// One published strategy, compiled.
pub struct Compiled {
    /// The strategy as published, except its `conditions`, which are
    /// empty here: the table keeps each condition once, interned
    /// ([`Table::conditions`] gives them back).
    pub strategy: Strategy,
    pub limiter: Limiter,
    pub slot: u32,
    pub generation: u64,
    /// Its conditions, `Table::conds[start..end]`: `(dimension index,
    /// interned value id)` of each; the one it is anchored under comes
    /// first and is not re-checked (implied by where the matcher found
    /// the strategy). One array for the table, not one per strategy.
    conds: (u32, u32),
    /// Its negated conditions, `Table::negs[start..end]` (checked after
    /// the matcher found it, or on every request when it has no other).
    negs: (u32, u32),
    /// Per-key strategies (`each`): how the key is built, its limiter.
    pub key: Option<Box<super::keys::KeyPlan>>,
    /// `count_if`, `cost_from`, `cost_after` (issue 31; `None`: plain).
    pub response: Option<Box<super::response::ResponsePlan>>,
}

impl Compiled {
    /// This strategy's admission input, over its slot in `slots`.
    pub(crate) fn hit<'a>(&'a self, slots: &Region<'a>) -> Option<Hit<'a>> {
        Some(Hit {
            id: self.strategy.id,
            limiter: &self.limiter,
            action: self.strategy.action,
            slot: Slot::at(slots, self.slot)?,
            generation: self.generation,
            units: 1,
            check: false,
        })
    }

    /// [`hit`](Self::hit) costing what `cost_from` says for `r`.
    #[inline(always)]
    pub(crate) fn hit_for<'a, V: Values + ?Sized>(
        &'a self,
        slots: &Region<'a>,
        r: &Request<'_, V>,
        out: &mut ResponseOut,
    ) -> Option<Hit<'a>> {
        let mut h = self.hit(slots)?;
        if let Some(p) = &self.response {
            // count_if: checked now, charged when the request ends.
            h.check = !p.count_if.is_empty();
            h.units = match p.cost(r.values) {
                Ok(n) => n,
                Err(n) => {
                    out.bad_cost.get_or_insert(self.strategy.id);
                    n
                }
            };
        }
        Some(h)
    }

    /// Records in `out` what this strategy's admitted request settles when
    /// it ends (shared strategies; the request costs `units` up front,
    /// charged then unless `count_if` only checked them).
    #[inline]
    pub(crate) fn owe_slot(&self, out: &mut ResponseOut, units: u64, now: super::admit::Now) {
        let Some(p) = self.response.as_deref().filter(|p| p.deferred()) else {
            return;
        };
        out.owed.push(super::response::OwedCharge {
            target: super::response::OwedTarget::Slot {
                slot: self.slot,
                generation: self.generation,
                limiter: self.limiter,
            },
            owed: super::response::Owed {
                charged: if p.count_if.is_empty() { units } else { 0 },
                units,
                count_if: p.count_if,
                after: p.cost_after.is_some(),
            },
            admitted: now,
            after_dim: p.cost_after,
            id: self.strategy.id,
        });
    }
}

/// Charges a request owes when it ends (see [`Table::owing`]).
pub type Owed = SmallVec<[super::response::OwedCharge; 1]>;

/// What the response options of the last request left (issue 31).
#[derive(Default)]
pub struct ResponseOut {
    /// Charges to settle when it ends.
    pub(crate) owed: Owed,
    /// The first strategy whose `cost_from` value was not a cost (charged 1).
    pub bad_cost: Option<u32>,
}

/// The networks of one prefix length (see [`Table::ip_ranges`]).
struct IpRanges {
    dim: usize,
    mask: u128,
    nets: ValueMap<u128, ValueEntry>,
    /// The lowest and highest network address of this length.
    lo: u128,
    hi: u128,
    /// Its distinct networks (for `v4_dir`).
    addrs: Vec<u128>,
    len: u8,
}

#[derive(Default)]
struct DimIndex {
    values: ValueMap<[u8], ValueEntry>,
}

/// What the matcher keeps for one value of one dimension.
#[derive(Clone, Copy)]
struct ValueEntry {
    /// The interned value id (what other conditions compare against).
    id: u32,
    /// The strategies anchored under this value: `anchored[start..start +
    /// len]`; or, with [`HEAVY`] set in `len`, the groups to probe for
    /// them: `group_lists[start..start + (len & !(HEAVY | BYTES))]`
    /// ([`BYTES`]: one group, found by bytes).
    start: u32,
    len: u32,
    /// The strategy anchored here when it is the only one and has no other
    /// condition: it matches on the lookup itself, without a second pass
    /// (NONE otherwise). The usual shape of `api=/pay: 100/s`.
    only: u32,
}

impl ValueEntry {
    fn new(id: u32) -> ValueEntry {
        ValueEntry {
            id,
            start: 0,
            len: 0,
            only: NONE,
        }
    }
}

/// A request's value of each of [`Table::dimensions`], by index, read only
/// for the dimensions the table looks up (a slice in tests and tools; the
/// nginx module reads each one from the request when asked, so a request
/// never collects values no strategy names). An empty value is absent.
pub trait Values {
    fn value(&self, dim: usize) -> Option<&[u8]>;
}

impl Values for [Option<&[u8]>] {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self.get(dim).copied().flatten()
    }
}

impl<const N: usize> Values for [Option<&[u8]>; N] {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self[..].value(dim)
    }
}

impl Values for Vec<Option<&[u8]>> {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self[..].value(dim)
    }
}

/// What a request carries: its values for [`Table::dimensions`], by index,
/// and its client address (matched for `ip` and looked up in the
/// blacklist; without one, an `ip` text value is parsed).
pub struct Request<'r, V: Values + ?Sized = [Option<&'r [u8]>]> {
    pub values: &'r V,
    pub ip: Option<IpKey>,
    /// Monotonic time (buckets, concurrency).
    pub now_ns: u64,
    /// Wall-clock time (blacklist expiry; fixed and sliding windows, which
    /// are aligned to UTC).
    pub now_unix_ms: u64,
    /// Location-level dry run: count and report, never reject or delay.
    pub dry_run: bool,
    /// Compute the tightest quota (for `RateLimit-*` headers).
    pub quota: bool,
}

impl<V: Values + ?Sized> Request<'_, V> {
    /// Both clocks for admission: buckets on `now_ns`, windows on the wall
    /// clock (see [`admit::Now`]).
    #[inline]
    pub(crate) fn now(&self) -> admit::Now {
        admit::Now {
            mono_ns: self.now_ns,
            wall_ns: self.now_unix_ms.saturating_mul(1_000_000),
        }
    }
}

/// The outcome for one request. `D` is where the decision of a request
/// that matched is: in the outcome ([`Table::decide_into`]), or `()` when
/// it was written to the caller's place ([`Table::decide_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome<D = Decision> {
    /// No strategy matched.
    NoMatch,
    /// The blacklist holds the client address (`None`) or the request's
    /// value of this dimension (`Some(index)`).
    Blacklisted { dimension_index: Option<usize> },
    /// Strategies matched; see the decision.
    Limited(D),
    /// An `allow` strategy (this id) at the highest priority the request
    /// matched: it passes unlimited, counted as passed by that strategy
    /// only.
    Allowed { id: u32 },
}

/// A decision plus what is needed to release concurrency slots later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDecision {
    pub outcome: RequestOutcome,
    /// Indexes (into the table) of concurrency strategies this request
    /// holds; release them with [`Table::release`] when it ends.
    pub held: SmallVec<[u32; 2]>,
}

impl TableDecision {
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.outcome {
            RequestOutcome::Limited(d) => Some(&d.verdict),
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
    /// Strategies in the segment, disabled ones included.
    published: usize,
    /// Prefix lengths and template shapes in use, each a pseudo-dimension
    /// computed from its base dimension and looked up by every request
    /// (sorted by base: each base value is read once; prefixes by length).
    prefixes: Box<[PrefixDim]>,
    template_dims: Box<[TemplateDim]>,
    /// Some prefix or template is in use: [`Table::derived_lookups`].
    derived: bool,
    /// Some derived dimension is a template ([`Scratch::tkey`]).
    templates: bool,
    /// Negated conditions: `(dimension, start, end)` of the value in
    /// `neg_bytes` ([`Compiled::negs`] spans).
    negs: Box<[(u32, u32, u32)]>,
    neg_bytes: Box<[u8]>,
    /// Per interned value id: which map holds it ([`TEXT_VALUE`],
    /// [`IP_VALUE`], [`RANGE_VALUE`]) and its entry there
    /// ([`conditions`](Self::conditions)).
    value_keys: Vec<(u8, u32)>,
    dims: Vec<String>,
    index: Vec<DimIndex>,
    /// The `ip` dimension, matched on the binary address (no text form).
    ip_dim: Option<usize>,
    ip_index: ValueMap<u128, ValueEntry>,
    /// Address ranges: per prefix length in use (longest first), the
    /// pseudo-dimension `ip/<len>` it is matched as, the mask, and the
    /// networks of that length (see [`ipnet`](super::ipnet)). A request
    /// probes each once with its address masked to that length.
    ip_ranges: Vec<IpRanges>,
    /// The dimension indexes of `ip_ranges` (contiguous), and the span of
    /// addresses any of their networks holds: a request outside it (most
    /// traffic, when the ranges are a few networks) skips every probe.
    /// `range_dims` is what a request clears before its probes: empty when
    /// no strategy checks a range dimension other than the one it is
    /// anchored under (found by the probe itself), so that an id a probe
    /// left there is never read and clearing is wasted (most tables).
    range_dims: std::ops::Range<usize>,
    ip_span: (u128, u128),
    /// For an IPv4 client: per /16 of the address (65,536 entries, empty
    /// without IPv4 networks), bit `i` set when `ip_ranges[i]` has a
    /// network that may hold an address of that /16 (exact: never unset
    /// for a network that holds one). A request probes only those lengths:
    /// usually none or a few, whatever the number of lengths in use.
    v4_dir: Box<[u64]>,
    /// Some enabled strategy has a priority other than 0 or is an `allow`:
    /// the matches are ranked before admission (else nothing to do).
    ranked: bool,
    /// No strategy has a condition and none is ranked (`each ip` alone,
    /// limit_req's zone): every request matches `unconditioned`, with
    /// nothing to look up or rank.
    match_free: bool,
    /// The other dimensions some strategy is anchored under a value of:
    /// the ones every request is asked for (by index).
    lookups: Box<[usize]>,
    /// The dimensions strategies name only beside their anchor (no value
    /// of theirs anchors anything): asked for only when a request found
    /// strategies to check, so a table's other shapes cost a request that
    /// matches none of them nothing.
    checks: Box<[usize]>,
    /// By dimension: looked up ([`LOOKED_UP`], or named by no strategy),
    /// one of `checks` ([`TEXT_CHECK`]) or `ip_check` ([`IP_CHECK`]).
    check_kind: Box<[u8]>,
    /// Some exact address anchors strategies: every request looks its
    /// address up.
    ip_lookup: bool,
    /// The `ip` dimension when exact addresses are only named beside
    /// anchors: a request with candidates to check looks its address up
    /// then (see [`reanchor`]).
    ip_check: Option<usize>,
    anchored: Vec<u32>,
    /// Every strategy's conditions ([`Compiled::conds`] spans).
    conds: Box<[(u8, u32)]>,
    /// Tuple-space groups, and the groups of each heavy value
    /// (see [`ValueEntry`]).
    groups: Vec<Group>,
    group_lists: Vec<u32>,
    unconditioned: Vec<u32>,
    strategies: Vec<Compiled>,
    /// Dimensions (by index, with their name hash) that have blacklist
    /// entries, `ip` excluded.
    bl_dims: Vec<(usize, u64)>,
    /// The blacklist held client addresses when this table was published
    /// (blacklist and table are published together).
    bl_ip: bool,
    /// Some strategy is per-key (`each`).
    keyed: bool,
    /// Stat slot → per-key limiter, sorted by slot (whether another
    /// strategy's key entry is fresh).
    key_owners: Vec<(u32, super::keys::KeyLimiter)>,
    /// Some strategy has `count_if` or `cost_after` or `cost_from` (issue
    /// 31): a request clears its [`ResponseOut`] (else nothing to do).
    responsive: bool,
}

/// A condition of a record being built: borrowed from the segment (or
/// from a [`Decoded`]), with its `ip` value parsed once.
#[derive(Clone, Copy)]
struct PendingCond<'a> {
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
const PREFETCH_AHEAD: usize = 8;

/// Distinct dimension names a builder numbers as it reads (the table
/// uses at most [`MAX_TABLE_DIMENSIONS`]; a hostile file may name more).
const MAX_NAMES: usize = 4 * MAX_TABLE_DIMENSIONS;

/// A table being built: the enabled strategies of the records so far
/// (conditions not yet interned) and their conditions, borrowed.
struct Builder<'a> {
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
    fn new(count: usize) -> Builder<'a> {
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

    fn add(&mut self, r: Record<'a>) {
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
            key: None,
            response: None,
        });
    }
}

/// An `ip` condition's value as a network (an address: the `/128`): the
/// IPv4 dotted quad most values are without the general parser.
fn ip_net(value: &[u8]) -> Option<IpNet> {
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
        Table::finish(b, meta, &decoded.blacklist_dimensions, map)
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
        // `read_raw` bounded the count by the payload; the reservation is
        // bounded here too, whatever a later change does to that check.
        let mut b = Builder::new((raw.count as usize).min(super::segment::max_records(buf.len())));
        let end = decode_records(buf, raw.count, |r| b.add(r))?;
        let bl = decode_blacklist_dimensions(buf, end, raw.count, raw.bl_dims)?;
        Ok(Table::finish(b, raw, &bl, map))
    }

    fn finish(
        b: Builder<'_>,
        meta: RawSegment,
        blacklist_dimensions: &[String],
        map: Option<Arc<Mapping>>,
    ) -> Table {
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
        let Builder {
            strategies: mut pending,
            spans: cond_spans,
            pool,
            neg_pool,
            names,
            keyed,
            ranked,
            published,
        } = b;
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
        let mut key_owners: Vec<(u32, super::keys::KeyLimiter)> = Vec::new();
        // Every strategy's `(dimension, value id)`, `flat[fspans[si]]`:
        // compact, for the passes below (anchors), then boxed per strategy.
        let mut flat: Vec<(u8, u32)> = Vec::with_capacity(pool.len());
        let mut fspans: Vec<(u32, u32)> = Vec::with_capacity(pending.len());
        // Per-key plans, by index in `pending` (ascending).
        let mut plans: Vec<(usize, Box<super::keys::KeyPlan>)> = Vec::new();
        let mut response_plans: Vec<(usize, Box<super::response::ResponsePlan>)> = Vec::new();
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
                let Some(limiter) = super::keys::KeyLimiter::from_strategy(&s.strategy) else {
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
                    Box::new(super::keys::KeyPlan {
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
                let plan = super::response::ResponsePlan {
                    count_if: resp.count_if,
                    cost_from: dim(&resp.cost_from),
                    cost_after: dim(&resp.cost_after),
                };
                responsive = true;
                response_plans.push((si, Box::new(plan)));
            }
            fspans.push((start as u32, flat.len() as u32));
        }
        drop(pool);
        // Negated conditions: each value once per condition, compared as
        // bytes with the request's (after the matcher, see `match_into`).
        let mut negs: Vec<(u32, u32, u32)> = Vec::with_capacity(neg_pool.len());
        let mut neg_bytes: Vec<u8> = Vec::new();
        for &(dim, value) in &neg_pool {
            // Over the dimension limit (the writer refuses it): never holds.
            let d = dim_of(&mut dims, dim).map_or(NONE, |d| d as u32);
            let at = neg_bytes.len() as u32;
            neg_bytes.extend_from_slice(value);
            negs.push((d, at, neg_bytes.len() as u32));
        }
        derived.sort_by_key(|x| (x.base, x.dim));
        let mut prefixes: Vec<PrefixDim> = Vec::new();
        let mut template_dims: Vec<TemplateDim> = Vec::new();
        for x in &derived {
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
                }),
            }
        }
        prefixes.sort_by_key(|p| (p.base, p.len));
        let template_dims = template_dims.into_boxed_slice();
        let has_negs = !negs.is_empty();
        let is_derived = |d: &usize| derived.iter().any(|x| x.dim == *d);
        // Room was made for every condition; most dimensions have fewer
        // distinct values.
        for d in &mut index {
            d.values.shrink_to_fit();
        }
        ip_index.shrink_to_fit();
        let mut bl_dims = Vec::new();
        let mut bl_ip = false;
        for d in blacklist_dimensions {
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
        let count = fspans.len();
        let mut anchor_of: Vec<(u8, u32)> = Vec::with_capacity(count);
        let mut per_value = vec![0u32; counts.len() + 1];
        let mut unconditioned = Vec::new();
        let conds_of = |si: usize| fspans[si].0 as usize..fspans[si].1 as usize;
        for si in 0..count {
            match flat[conds_of(si)]
                .iter()
                .min_by_key(|(_, v)| counts[*v as usize])
            {
                Some(&c) => anchor_of.push(c),
                None => {
                    anchor_of.push((0, NONE));
                    unconditioned.push(si as u32);
                }
            }
        }
        reanchor(
            |si| &flat[conds_of(si)],
            &mut anchor_of,
            &counts,
            |v| value_keys[v as usize].0,
        );
        // The dimensions strategies are anchored in: the ones a request
        // looks up (the others it names are only checked).
        let anchored_dims = anchor_of
            .iter()
            .filter(|a| a.1 != NONE)
            .fold(0u64, |m, &(d, _)| m | 1 << (d % 64));
        let anchor_of: Vec<u32> = anchor_of.into_iter().map(|(_, v)| v).collect();
        for &v in &anchor_of {
            if v != NONE {
                per_value[v as usize + 1] += 1;
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
                let conds = &mut flat[conds_of(si)];
                if let Some(i) = conds.iter().position(|&(_, c)| c == v) {
                    conds.swap(0, i);
                }
            }
        }
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
        let strategies = pending;
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
        // A group of two dimensions, one of them only checked (a grid
        // anchored under its other dimension): keyed by that value's
        // bytes as well, so a request finds its cell without interning it.
        let text_check = |d: u8| check_kind[usize::from(d)] == TEXT_CHECK;
        for g in &mut groups {
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
        for span in &mut spans {
            if span.1 == HEAVY | 1
                && groups[group_lists[span.0 as usize] as usize]
                    .bytes_dims()
                    .is_some()
            {
                span.1 |= BYTES;
            }
        }
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
        key_owners.sort_by_key(|o| o.0);
        // Longest prefix first (any order gives the same matches).
        ip_ranges.sort_by_key(|r| std::cmp::Reverse(r.mask.count_ones()));
        let range_dims = match (ip_ranges.first(), ip_ranges.last()) {
            (Some(a), Some(b)) => a.dim..b.dim + 1,
            _ => 0..0,
        };
        // Contiguous by construction (see `lens`); a table over the
        // dimension limit dropped some: then no fast path.
        let contiguous = ip_ranges
            .iter()
            .enumerate()
            .all(|(i, r)| r.dim == range_dims.start + i);
        let ip_span = if contiguous {
            ip_ranges.iter().fold((u128::MAX, 0), |(lo, hi), r| {
                (lo.min(r.lo), hi.max(r.hi | !r.mask))
            })
        } else {
            (0, u128::MAX)
        };
        let v4_dir = if contiguous && ip_ranges.len() <= 64 {
            v4_directory(&ip_ranges)
        } else {
            Box::default()
        };
        // Anchors come first in `conds` (swapped above); the groups of a
        // heavy value read the same conditions.
        let read = |d: &(u8, u32)| range_dims.contains(&usize::from(d.0));
        let checked = |si: usize| flat[conds_of(si)].iter().skip(1).any(read);
        // The prefix lengths some strategy checks beside its anchor (the
        // others' ids are read only where found: see `PrefixDim::reset`).
        let mut beside = 0u64;
        for si in 0..fspans.len() {
            for &(d, _) in flat[conds_of(si)].iter().skip(1) {
                beside |= 1 << (d % 64);
            }
        }
        let mut after = false;
        for i in (0..prefixes.len()).rev() {
            if i + 1 < prefixes.len() && prefixes[i + 1].base != prefixes[i].base {
                after = false;
            }
            let p = &mut prefixes[i];
            p.reset = beside >> (p.dim % 64) & 1 == 1;
            after |= p.reset;
            p.reset_after = after;
        }
        let prefixes = prefixes.into_boxed_slice();
        let range_dims = match !range_dims.is_empty() && (0..strategies.len()).any(checked) {
            true => range_dims,
            false => 0..0,
        };
        for r in &mut ip_ranges {
            r.addrs = Vec::new();
        }
        Table {
            map,
            publish_seq: meta.publish_seq,
            config_version: meta.config_version,
            published_unix_ms: meta.published_unix_ms,
            published,
            templates: !template_dims.is_empty(),
            derived: !derived.is_empty(),
            prefixes,
            template_dims,
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
        }
    }

    /// The per-key limiter of the strategy in stat slot `slot`.
    #[inline]
    pub fn key_owner(&self, slot: u32) -> Option<&super::keys::KeyLimiter> {
        let i = self.key_owners.binary_search_by_key(&slot, |o| o.0).ok()?;
        Some(&self.key_owners[i].1)
    }

    /// The key of per-key strategy `id` for this request, as text
    /// (`$rate_ctl_key`, log lines): `ip=203.0.113.0/24,userid=u1`. `None`
    /// for a strategy without `each` or a request with an empty value.
    pub fn key_text<V: Values + ?Sized>(&self, id: u32, r: &Request<'_, V>) -> Option<String> {
        let i = self
            .strategies
            .binary_search_by_key(&id, |c| c.strategy.id)
            .ok()?;
        self.strategies[i].key.as_ref()?.text(&self.dims, r)
    }

    /// Strategies the table was read from, disabled ones included.
    pub fn published_strategies(&self) -> usize {
        self.published
    }

    /// `c`'s `(dimension index, value id)` conditions, anchor first.
    #[inline(always)]
    fn conds_of(&self, c: &Compiled) -> &[(u8, u32)] {
        &self.conds[c.conds.0 as usize..c.conds.1 as usize]
    }

    /// The dimension named by each condition of `c` (a strategy of this
    /// table): anchor first, then as published.
    pub fn condition_dimensions<'t>(&'t self, c: &'t Compiled) -> impl Iterator<Item = &'t str> {
        let negs = &self.negs[c.negs.0 as usize..c.negs.1 as usize];
        self.conds_of(c)
            .iter()
            .map(|&(d, _)| base_dimension(&self.dims[usize::from(d)]).0)
            .chain(
                negs.iter()
                    .filter_map(|n| self.dims.get(n.0 as usize))
                    .map(String::as_str),
            )
    }

    /// The conditions of `c` (a strategy of this table), anchor first:
    /// the table keeps each value once, interned, not per strategy (tools,
    /// tests; allocates).
    pub fn conditions(&self, c: &Compiled) -> Vec<Condition> {
        let negs = self.negs[c.negs.0 as usize..c.negs.1 as usize]
            .iter()
            .filter_map(|&(d, from, to)| {
                let name = self.dims.get(d as usize)?;
                let value = &self.neg_bytes[from as usize..to as usize];
                Some(Condition::with_op(name.as_str(), Op::Not, value))
            });
        self.conds_of(c)
            .iter()
            .map(|&(d, id)| {
                let (name, op) = base_dimension(&self.dims[usize::from(d)]);
                let (kind, entry) = self.value_keys[id as usize];
                let entry = entry as usize;
                let value = match kind {
                    IP_VALUE => IpNet::host(*self.ip_index.key_at(entry)).to_string(),
                    RANGE_VALUE => {
                        let r = self.ip_ranges.iter().find(|r| r.dim == usize::from(d));
                        match r {
                            Some(r) => IpNet {
                                addr: *r.nets.key_at(entry),
                                len: r.len,
                            }
                            .to_string(),
                            None => String::new(),
                        }
                    }
                    _ => {
                        let mut value = self.index[d as usize].values.key_at(entry).to_vec();
                        // A template's key lost its rest (see `template_key`).
                        if op == Op::Template && self.dims[usize::from(d)].ends_with('+') {
                            value.extend_from_slice(b"/**");
                        }
                        return Condition::with_op(name, op, value);
                    }
                };
                Condition::new(name, value)
            })
            .chain(negs)
            .collect()
    }

    /// Dimension names the request must supply, by index.
    pub fn dimensions(&self) -> &[String] {
        &self.dims
    }

    /// A request's values by dimension name, laid out as the table asks
    /// for them (tests, tools).
    pub fn values_of<'v>(&self, pairs: &[(&str, &'v [u8])]) -> Vec<Option<&'v [u8]>> {
        self.dims
            .iter()
            .map(|d| pairs.iter().find(|(n, _)| n == d).map(|&(_, v)| v))
            .collect()
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

    /// The number of tuple-space groups the matcher probes by shape (0
    /// when every anchored list is short); for tests and benchmarks.
    pub fn shape_groups(&self) -> usize {
        self.groups.len()
    }

    pub fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.map.as_ref()
    }

    /// Indexes of the strategies matching `values`, ascending (= by id).
    /// The `ip` dimension's value, if given, is parsed as an address.
    pub fn matching<V: Values + ?Sized>(&self, values: &V) -> Vec<u32> {
        let mut scratch = Scratch::default();
        self.match_request(values, None, &mut scratch);
        scratch.matches
    }

    /// [`matching`](Self::matching) with the caller's working space, reused
    /// from request to request as the request path does (what one request
    /// leaves in it must never change the next one's matches).
    pub fn matching_with<V: Values + ?Sized>(&self, values: &V, scratch: &mut Scratch) -> Vec<u32> {
        self.match_request(values, None, scratch);
        scratch.matches.clone()
    }

    /// [`matching`](Self::matching) with the `ip` dimension taken from the
    /// client address when there is one (else parsed from its text value:
    /// callers that give values as text, e.g. tests; nginx gives the binary
    /// address).
    #[inline]
    fn match_request<V: Values + ?Sized>(&self, values: &V, ip: Option<IpKey>, s: &mut Scratch) {
        let ip = match (ip, self.ip_dim) {
            (Some(ip), _) => Some(ip),
            (None, Some(d)) => values.value(d).and_then(IpKey::parse),
            (None, None) => None,
        };
        if s.req.len() < self.dims.len() {
            s.fit(self);
        }
        s.matches.clear();
        self.match_into(
            values,
            ip,
            &mut s.req,
            &mut s.spans,
            &mut s.matches,
            &mut s.tkey,
        );
    }

    /// `req[d]`: interned id of the request's value of dimension `d`,
    /// written here for every dimension looked up (the only ones a
    /// condition names); `spans`: anchored lists to check (at most one per
    /// dimension); `out`: the matches, ascending.
    #[inline(always)]
    fn match_into<V: Values + ?Sized>(
        &self,
        values: &V,
        ip: Option<IpKey>,
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        out: &mut Vec<u32>,
        tkey: &mut Vec<u8>,
    ) {
        // Lists to merge: each is ascending, only a mix needs sorting.
        let mut sources = 0;
        if !self.unconditioned.is_empty() {
            out.extend_from_slice(&self.unconditioned);
            sources = 1;
        }
        let mut ns = 0;
        // Address ranges: probed only for an address some network may hold.
        let mut in_ranges = None;
        if !self.ip_ranges.is_empty() {
            match ip {
                // IPv4 with a directory: only the lengths it names.
                Some(ip) if ip.0 >> 32 == 0xffff && !self.v4_dir.is_empty() => {
                    if !self.range_dims.is_empty() {
                        req[self.range_dims.clone()].fill(NONE);
                    }
                    let bits = self.v4_dir[(ip.0 as u32 >> 16) as usize];
                    if bits != 0 {
                        in_ranges = Some((ip, bits));
                    }
                }
                Some(ip) if self.ip_span.0 <= ip.0 && ip.0 <= self.ip_span.1 => {
                    in_ranges = Some((ip, u64::MAX))
                }
                _ if !self.range_dims.is_empty() => req[self.range_dims.clone()].fill(NONE),
                _ => {}
            }
        }
        let mut found = |d: usize, e: Option<&ValueEntry>| {
            let Some(e) = e else {
                req[d] = NONE;
                return;
            };
            req[d] = e.id;
            if e.only != NONE {
                out.push(e.only);
                sources += 1;
            } else if e.len > 0 {
                spans[ns] = (e.start, e.len);
                ns += 1;
            }
        };
        if let Some(d) = self.ip_dim {
            // No exact address anchors strategies (none in the table, or
            // each only named beside an anchor in another dimension: then
            // looked up for candidates, see `ip_check`): nothing to hash.
            let e = match ip {
                Some(ip) if self.ip_lookup => self.ip_index.get(&ip.0),
                _ => None,
            };
            found(d, e);
        }
        match in_ranges {
            Some((ip, u64::MAX)) => {
                for r in &self.ip_ranges {
                    let m = ip.0 & r.mask;
                    let e = if r.lo <= m && m <= r.hi {
                        r.nets.get(&m)
                    } else {
                        None
                    };
                    found(r.dim, e);
                }
            }
            Some((ip, mut bits)) => {
                while bits != 0 {
                    let r = &self.ip_ranges[bits.trailing_zeros() as usize];
                    bits &= bits - 1;
                    if let Some(e) = r.nets.get(&(ip.0 & r.mask)) {
                        found(r.dim, Some(e));
                    }
                }
            }
            None => {}
        }
        for &d in self.lookups.iter() {
            let e = match values.value(d) {
                Some(v) if !v.is_empty() => self.index[d].values.get(v),
                _ => None,
            };
            found(d, e);
        }
        if self.derived {
            sources += self.derived_lookups(values, tkey, req, spans, &mut ns, out);
        }
        if ns > 0 {
            if let [(at, 1)] = spans[..ns] {
                // One candidate (the usual strategy on two values): its
                // conditions on dimensions not looked up are compared as
                // bytes, without interning the request's values first.
                let si = self.anchored[at as usize];
                let others = &self.conds_of(&self.strategies[si as usize])[1..];
                if others
                    .iter()
                    .all(|&(d, v)| self.holds(values, ip, req, d, v))
                {
                    out.push(si);
                }
                sources += 1;
            } else if ns == 1 && spans[0].1 == HEAVY | BYTES | 1 {
                // One list of one group (a grid's row): its cell found by
                // the bytes of the checked value, nothing interned.
                sources += self.probe_bytes(values, req, spans[0].0, out);
            } else {
                if let Some(d) = self.ip_check {
                    req[d] = match ip {
                        Some(ip) => self.ip_index.get(&ip.0).map_or(NONE, |e| e.id),
                        None => NONE,
                    };
                }
                for &d in self.checks.iter() {
                    req[d] = match values.value(d) {
                        Some(v) if !v.is_empty() => {
                            self.index[d].values.get(v).map_or(NONE, |e| e.id)
                        }
                        _ => NONE,
                    };
                }
                for &(start, len) in &spans[..ns] {
                    if len & HEAVY != 0 {
                        sources += self.probe_groups(start, len & !(HEAVY | BYTES), req, out);
                        continue;
                    }
                    sources += 1;
                    for &si in &self.anchored[start as usize..(start + len) as usize] {
                        // The anchor (first) is implied by where it was found.
                        let others = &self.conds_of(&self.strategies[si as usize])[1..];
                        if others.iter().all(|&(d, v)| req[d as usize] == v) {
                            out.push(si);
                        }
                    }
                }
            }
        }
        if sources > 1 {
            out.sort_unstable();
        }
        if !self.negs.is_empty() {
            self.drop_negated(values, out);
        }
    }

    /// Prefix lengths and template shapes: one probe each (see
    /// [`pattern`]), the base value read once per base; each result
    /// handed to `found` as a lookup's. Out of line: only a table with
    /// prefixes or templates carries it.
    /// Returns how many lists it added to `out` (as `found` in
    /// [`match_into`](Self::match_into) counts them).
    #[inline(never)]
    fn derived_lookups<V: Values + ?Sized>(
        &self,
        values: &V,
        tkey: &mut Vec<u8>,
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        ns: &mut usize,
        out: &mut Vec<u32>,
    ) -> u32 {
        let mut sources = 0;
        let mut found = |d: usize, e: Option<&ValueEntry>| {
            // What `found` does in `match_into`.
            let Some(e) = e else {
                req[d] = NONE;
                return;
            };
            req[d] = e.id;
            if e.only != NONE {
                out.push(e.only);
                sources += 1;
            } else if e.len > 0 {
                spans[*ns] = (e.start, e.len);
                *ns += 1;
            }
        };
        // Prefixes, by base then length: a length longer than the value,
        // or whose last byte ends no prefix of that length, is no probe.
        let mut base = (u32::MAX, &[][..]);
        let mut skip = u32::MAX; // a base whose remaining lengths need nothing
        for p in self.prefixes.iter() {
            if p.base == skip {
                continue;
            }
            if base.0 != p.base {
                base = (p.base, values.value(p.base as usize).unwrap_or_default());
            }
            let n = p.len as usize;
            let e = match base.1.get(..n) {
                Some(v)
                    if n > 0 && p.last[usize::from(v[n - 1] >> 6)] >> (v[n - 1] & 63) & 1 == 1 =>
                {
                    self.index[p.dim as usize].values.get(v)
                }
                // Sorted by length: no longer one fits, none needs clearing.
                None if !p.reset_after => {
                    skip = p.base;
                    continue;
                }
                _ => None,
            };
            match e {
                None if !p.reset => {}
                e => found(p.dim as usize, e),
            }
        }
        // Templates, by base: a shape of another segment count than the
        // value's is no probe (most shapes); the others are projected.
        let mut base = (u32::MAX, &[][..], 0usize);
        for t in self.template_dims.iter() {
            if base.0 != t.base {
                let v = values.value(t.base as usize).unwrap_or_default();
                base = (t.base, v, v.iter().filter(|&&b| b == b'/').count() + 1);
            }
            let n = usize::from(t.shape.segments);
            let fits = match t.shape.rest {
                true => base.2 >= n,
                false => base.2 == n,
            };
            let map = &self.index[t.dim as usize].values;
            let e = match fits && !base.1.is_empty() {
                // No wildcard: the key is the value's first segments as
                // they are (unless a byte needs escaping): no copy.
                true if t.shape.wild == 0 => match pattern::literal_key(t.shape, base.1) {
                    Some(k) => map.get(k),
                    None => match pattern::project(t.shape, base.1, MAX_VALUE_LEN, tkey) {
                        true => map.get(&tkey[..]),
                        false => None,
                    },
                },
                true => match pattern::project(t.shape, base.1, MAX_VALUE_LEN, tkey) {
                    true => map.get(&tkey[..]),
                    false => None,
                },
                false => None,
            };
            found(t.dim as usize, e);
        }
        sources
    }

    /// The matches whose negations fail removed (see [`negations_hold`]).
    #[inline(never)]
    fn drop_negated<V: Values + ?Sized>(&self, values: &V, out: &mut Vec<u32>) {
        out.retain(|&si| self.negations_hold(values, &self.strategies[si as usize]));
    }

    /// Whether the request's values differ from each value `c` negates
    /// (an absent value differs from every value). Out of line: only a
    /// table with negations carries it.
    #[inline]
    fn negations_hold<V: Values + ?Sized>(&self, values: &V, c: &Compiled) -> bool {
        self.negs[c.negs.0 as usize..c.negs.1 as usize]
            .iter()
            .all(|&(d, from, to)| {
                let not = &self.neg_bytes[from as usize..to as usize];
                match values.value(d as usize) {
                    _ if d == NONE => false,
                    Some(v) if !v.is_empty() => !bytes_eq(v, not),
                    _ => true,
                }
            })
    }

    /// Whether the request's value of dimension `d` is interned value `v`:
    /// by the id a lookup wrote to `req`, or for a dimension only checked
    /// ([`Self::checks`], not looked up), by comparing the bytes (the
    /// client address, when only checked: the address).
    #[inline(always)]
    fn holds<V: Values + ?Sized>(
        &self,
        values: &V,
        ip: Option<IpKey>,
        req: &[u32],
        d: u8,
        v: u32,
    ) -> bool {
        let d = usize::from(d);
        let kind = self.check_kind[d];
        if kind == LOOKED_UP {
            return req[d] == v;
        }
        let (held_in, entry) = self.value_keys[v as usize];
        match (kind, held_in) {
            (TEXT_CHECK, TEXT_VALUE) => values.value(d).is_some_and(|x| {
                !x.is_empty() && bytes_eq(x, self.index[d].values.key_at(entry as usize))
            }),
            (IP_CHECK, IP_VALUE) => {
                ip.is_some_and(|ip| *self.ip_index.key_at(entry as usize) == ip.0)
            }
            _ => false,
        }
    }

    /// The strategies of group `group_lists[list]` the request's values
    /// select, found by the bytes of its checked value (see
    /// [`Group::index_bytes`]: a span flagged [`BYTES`]), added to `out`;
    /// returns how many lists were added (0 or 1). The other dimension is
    /// the group's anchor, whose id the lookups wrote to `req`. Out of
    /// line: only a grid's request carries it.
    #[inline(never)]
    fn probe_bytes<V: Values + ?Sized>(
        &self,
        values: &V,
        req: &[u32],
        list: u32,
        out: &mut Vec<u32>,
    ) -> u32 {
        let g = &self.groups[self.group_lists[list as usize] as usize];
        // Flagged only when indexed (see `BYTES`).
        let Some((d, anchor)) = g.bytes_dims() else {
            return 0;
        };
        let d = usize::from(d);
        let found = match values.value(d) {
            Some(v) if !v.is_empty() => {
                let map = &self.index[d].values;
                let same = |e: u32| map.key_get(e as usize).is_some_and(|k| bytes_eq(v, k));
                g.find_bytes(req[usize::from(anchor)], hash_bytes(v), same)
            }
            _ => &[],
        };
        if found.is_empty() {
            return 0;
        }
        // One by one (a cell holds one strategy or a few): no memcpy call.
        for &si in found {
            out.push(si);
        }
        1
    }

    /// Probes the groups `group_lists[start..start + len]` with the
    /// request's ids, adding what they hold to `out`; returns how many
    /// groups matched (ascending lists to merge). Out of line: the usual
    /// request (short lists) does not carry its code.
    #[inline(never)]
    fn probe_groups(&self, start: u32, len: u32, req: &[u32], out: &mut Vec<u32>) -> u32 {
        let mut sources = 0;
        for &g in &self.group_lists[start as usize..(start + len) as usize] {
            let found = self.groups[g as usize].find(req);
            if !found.is_empty() {
                // One by one: a cell holds one strategy or a few.
                for &si in found {
                    out.push(si);
                }
                sources += 1;
            }
        }
        sources
    }

    /// Blacklist, match and admit one request.
    pub fn decide<V: Values + ?Sized>(&self, r: &Request<'_, V>) -> TableDecision {
        let mut held = SmallVec::new();
        let outcome = self.decide_into(r, &mut held, &mut Scratch::default());
        TableDecision { outcome, held }
    }

    /// [`decide`](Self::decide) with the caller's working space (fitted to
    /// this table by [`Scratch::fit`] beforehand, or on first use), adding
    /// the concurrency strategies the request holds to `held` (the request
    /// path keeps that list only when it is not empty).
    #[inline]
    pub fn decide_into<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        held: &mut SmallVec<[u32; 2]>,
        scratch: &mut Scratch,
    ) -> RequestOutcome {
        let mut d = Decision::pass();
        match self.decide_in(r, held, scratch, &mut d) {
            RequestOutcome::Limited(()) => RequestOutcome::Limited(d),
            RequestOutcome::NoMatch => RequestOutcome::NoMatch,
            RequestOutcome::Blacklisted { dimension_index } => {
                RequestOutcome::Blacklisted { dimension_index }
            }
            RequestOutcome::Allowed { id } => RequestOutcome::Allowed { id },
        }
    }

    /// [`decide_into`](Self::decide_into) writing the decision of a
    /// request that matched (`Limited`) to `out` (left as it was
    /// otherwise): the request path's form, where the decision is built in
    /// its place rather than moved through the outcome.
    // Always inlined into the request path (nginx's handler), as it was
    // before the operators' out-of-line calls tipped the inliner.
    #[inline(always)]
    pub fn decide_in<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        held: &mut SmallVec<[u32; 2]>,
        scratch: &mut Scratch,
        out: &mut Decision,
    ) -> RequestOutcome<()> {
        // (What response options leave in `scratch.response` is taken by
        // `owing` after each request: nothing to clear here.)
        // An empty blacklist costs nothing per request.
        if self.bl_ip || !self.bl_dims.is_empty() {
            if let Some(o) = self.blacklisted(r) {
                return o;
            }
        }
        let matched: &[u32] = if self.match_free {
            // Nothing to look up: every request matches the same list.
            &self.unconditioned
        } else {
            self.match_request(r.values, r.ip, scratch);
            if self.ranked {
                if let Some(id) = self.rank(&mut scratch.matches) {
                    return RequestOutcome::Allowed { id };
                }
            }
            &scratch.matches
        };
        let (Some(map), false) = (&self.map, matched.is_empty()) else {
            return RequestOutcome::NoMatch;
        };
        let slots = map.slots();
        let keyed = |si: &u32| self.strategies[*si as usize].key.is_some();
        if self.keyed
            && match *matched {
                [si] => keyed(&si),
                _ => matched.iter().any(keyed),
            }
        {
            scratch.key_holds.clear();
            scratch.key_full = None;
            *out = super::keys::decide(
                self,
                matched,
                map,
                &slots,
                r,
                held,
                (
                    &mut scratch.key_holds,
                    &mut scratch.key_full,
                    &mut scratch.response,
                ),
            );
            return RequestOutcome::Limited(());
        }
        if let [si] = *matched {
            // The common case, without the lists below.
            let c = &self.strategies[si as usize];
            if c.response.is_some() {
                *out = self.admit_matched(matched, map, &slots, r, held, &mut scratch.response);
                return RequestOutcome::Limited(());
            }
            let Some(hit) = c.hit(&slots) else {
                *out = admit::admit_with(&[], r.now(), r.dry_run, r.quota);
                return RequestOutcome::Limited(());
            };
            *out = admit::admit_with(std::slice::from_ref(&hit), r.now(), r.dry_run, r.quota);
            if holds(&hit, out) {
                held.push(si);
                map.hold_unit(hit_slot(&self.strategies[si as usize]), hit.generation);
            }
            return RequestOutcome::Limited(());
        }
        *out = self.admit_matched(matched, map, &slots, r, held, &mut scratch.response);
        RequestOutcome::Limited(())
    }

    /// Priorities and `allow`: keeps in `matched` only the strategies at
    /// the highest priority present; if one of them is an `allow`, the
    /// request passes on it: counted as passed by the first such strategy
    /// (lowest id, if its slot is still its own), whose id is returned.
    #[cold]
    fn rank(&self, matched: &mut Vec<u32>) -> Option<u32> {
        let prio = |si: &u32| self.strategies[*si as usize].strategy.priority;
        let top = matched.iter().map(prio).max()?;
        matched.retain(|si| prio(si) == top);
        let &si = matched
            .iter()
            .find(|&&si| self.strategies[si as usize].strategy.action == Action::Allow)?;
        let c = &self.strategies[si as usize];
        if let Some(map) = &self.map {
            let slots = map.slots();
            if let Some(hit) = c.hit(&slots) {
                if hit
                    .slot
                    .generation()
                    .load(std::sync::atomic::Ordering::Acquire)
                    == hit.generation
                {
                    hit.slot
                        .passed()
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        Some(c.strategy.id)
    }

    /// Admission of a request that matched several strategies (out of the
    /// one-match path, which stays small).
    #[inline(never)]
    fn admit_matched<V: Values + ?Sized>(
        &self,
        matched: &[u32],
        map: &Mapping,
        slots: &Region<'_>,
        r: &Request<'_, V>,
        held: &mut SmallVec<[u32; 2]>,
        response: &mut ResponseOut,
    ) -> Decision {
        let mut hits: SmallVec<[Hit<'_>; 8]> = SmallVec::new();
        let mut hit_index: SmallVec<[u32; 8]> = SmallVec::new();
        for &si in matched {
            if let Some(hit) = self.strategies[si as usize].hit_for(slots, r, response) {
                hits.push(hit);
                hit_index.push(si);
            }
        }
        // Several units (cost_from) or a check (count_if) take the general
        // path; the one-hit path of `admit_with` acquires one unit.
        let decision = if hits.iter().any(|h| h.units != 1 || h.check) {
            admit::admit_listed(&hits, r.now(), r.dry_run, r.quota)
        } else {
            admit::admit_with(&hits, r.now(), r.dry_run, r.quota)
        };
        for (h, &si) in hits.iter().zip(&hit_index) {
            if holds(h, &decision) {
                held.push(si);
                map.hold_unit(hit_slot(&self.strategies[si as usize]), h.generation);
            }
        }
        if self.responsive {
            owe_hits(&self.strategies, &hits, &hit_index, &decision, r, response);
        }
        decision
    }

    /// The blacklist's verdict on the request, if it holds the client
    /// address or one of its values.
    #[cold]
    fn blacklisted<V: Values + ?Sized>(&self, r: &Request<'_, V>) -> Option<RequestOutcome<()>> {
        let bl = self.blacklist()?;
        if let Some(ip) = r.ip.filter(|_| self.bl_ip) {
            if bl.contains_ip(ip.addr(), r.now_unix_ms) {
                return Some(RequestOutcome::Blacklisted {
                    dimension_index: None,
                });
            }
        }
        for &(d, hash) in &self.bl_dims {
            if let Some(v) = r.values.value(d).filter(|v| !v.is_empty()) {
                if bl.contains_hashed(hash, v, r.now_unix_ms) {
                    return Some(RequestOutcome::Blacklisted {
                        dimension_index: Some(d),
                    });
                }
            }
        }
        None
    }

    /// Releases the concurrency slots a finished request held
    /// ([`TableDecision::held`]).
    pub fn release(&self, held: &[u32]) {
        if let Some(u) = self.units(held) {
            u.release();
        }
    }

    /// What a request that holds `held` needs to give its units back when
    /// it ends: the mapping and each unit's slot and generation, not the
    /// table (a request may outlive many tables).
    pub fn units(&self, held: &[u32]) -> Option<Units> {
        let map = self.map.as_ref()?;
        let units = held
            .iter()
            .filter_map(|&si| self.strategies.get(si as usize))
            .map(|c| (c.slot, c.generation))
            .collect();
        Some(Units {
            map: map.clone(),
            units,
            keys: SmallVec::new(),
        })
    }

    /// [`units`](Self::units) plus the per-key units the request decided
    /// last with `scratch` took (recorded in this process's ledger row
    /// from here on); `None` when it holds nothing.
    #[inline]
    pub fn units_with_keys(&self, held: &[u32], scratch: &mut Scratch) -> Option<Units> {
        if held.is_empty() && scratch.key_holds.is_empty() {
            return None;
        }
        self.units_held(held, scratch)
    }

    /// [`units_with_keys`](Self::units_with_keys) of a request that holds
    /// units (out of line: most hold none).
    #[cold]
    #[inline(never)]
    fn units_held(&self, held: &[u32], scratch: &mut Scratch) -> Option<Units> {
        let mut u = self.units(held)?;
        u.keys = std::mem::take(&mut scratch.key_holds);
        for (at, _) in &u.keys {
            u.map.hold_key_unit(*at);
        }
        Some(u)
    }

    /// What the request decided last with `scratch` settles when it ends
    /// (issue 31): `None` when nothing (most requests: one branch).
    #[inline]
    pub fn owing(&self, scratch: &mut Scratch) -> Option<super::response::Owing> {
        if !self.responsive || scratch.response.owed.is_empty() {
            return None;
        }
        self.owing_held(scratch)
    }

    #[cold]
    #[inline(never)]
    fn owing_held(&self, scratch: &mut Scratch) -> Option<super::response::Owing> {
        let items = std::mem::take(&mut scratch.response.owed);
        Some(super::response::Owing {
            map: self.map.as_ref()?.clone(),
            items,
        })
    }

    /// Some strategy has response or cost options (issue 31).
    #[inline]
    pub fn is_responsive(&self) -> bool {
        self.responsive
    }

    /// The table's dimension names (by index), e.g. to resolve an owed
    /// charge's `after_dim`.
    pub fn dimension_name(&self, d: usize) -> Option<&str> {
        self.dims.get(d).map(String::as_str)
    }

    fn blacklist(&self) -> Option<Blacklist<'_>> {
        let map = self.map.as_ref()?;
        Blacklist::open(map.blacklist()).ok()
    }
}

/// [`Table::v4_dir`] for `ranges` (at most 64): an IPv4 network `/l`
/// (IPv6-form length `96 + l`) marks the /16 entries it covers (one for
/// `l >= 16`, `2^(16-l)` below: at most 65,536 marks per length, whatever
/// the number of networks); a shorter IPv6 network holding the v4-mapped
/// space marks every entry. Empty when no network can hold an IPv4 address.
fn v4_directory(ranges: &[IpRanges]) -> Box<[u64]> {
    const V4_MAPPED: u128 = 0xffff_0000_0000;
    let mut dir: Vec<u64> = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        let bit = 1u64 << i;
        for &a in &r.addrs {
            let (from, count) = if r.len >= 96 && a >> 32 == V4_MAPPED >> 32 {
                let l4 = u32::from(r.len - 96);
                let first = (a as u32 >> 16) as usize;
                (first, if l4 >= 16 { 1 } else { 1usize << (16 - l4) })
            } else if V4_MAPPED & r.mask == a {
                (0, 1 << 16)
            } else {
                continue; // an IPv6 network: no IPv4 address is in it
            };
            if dir.is_empty() {
                dir = vec![0; 1 << 16];
            }
            for e in &mut dir[from..from + count] {
                *e |= bit;
            }
        }
    }
    dir.into_boxed_slice()
}

/// Fewer dimensions for every request to look up. A dimension is looked
/// up because strategies are anchored under its values. When every
/// strategy anchored in dimension `d` also has a condition in another
/// dimension that is looked up anyway (`ip=X AND api=/pay` beside
/// `api=/login`: `api` is looked up for the latter), those strategies are
/// anchored there instead, and `d` is no longer looked up: a request reads
/// it only when it found candidates that name it (a checked dimension).
/// Done only when every list that grows stays cheap to check: at most
/// [`HEAVY_MIN`] strategies (checked one by one), or probed by shape
/// (tuple-space groups) with at most [`REANCHOR_SHAPES`] shapes. Address
/// ranges (`ip/<len>`) are neither moved nor targets.
///
/// `anchor_of[si]`: strategy `si`'s anchor `(dimension, value id)` (id
/// [`NONE`]: no condition), rewritten in place; `conds(si)` its
/// conditions; `counts[v]`: how many strategies name value `v`;
/// `kind(v)`: where value `v` is kept ([`TEXT_VALUE`] …).
fn reanchor<'c>(
    conds: impl Fn(usize) -> &'c [(u8, u32)],
    anchor_of: &mut [(u8, u32)],
    counts: &[u32],
    kind: impl Fn(u32) -> u8,
) {
    // Strategies anchored per dimension: the dimensions looked up.
    let mut anchored_in = [0u32; 64];
    for &(d, v) in anchor_of.iter() {
        if v != NONE {
            anchored_in[usize::from(d) % 64] += 1;
        }
    }
    let movable = |v: u32| matches!(kind(v), TEXT_VALUE | IP_VALUE);
    for d in 0..64u8 {
        if anchored_in[usize::from(d)] == 0 {
            continue;
        }
        // Each strategy anchored in `d`: its new anchor, the least shared
        // of its conditions in another looked-up dimension.
        let mut moves: Vec<(usize, (u8, u32))> = Vec::new();
        let mut possible = true;
        for (si, &(ad, v)) in anchor_of.iter().enumerate() {
            if v == NONE || ad != d {
                continue;
            }
            let target = conds(si)
                .iter()
                .filter(|&&(cd, cv)| {
                    cd != d && anchored_in[usize::from(cd) % 64] > 0 && movable(cv)
                })
                .min_by_key(|&&(_, cv)| counts[cv as usize]);
            match target {
                Some(&t) if movable(v) => moves.push((si, t)),
                _ => {
                    possible = false;
                    break;
                }
            }
        }
        if !possible {
            continue;
        }
        // The lists that grow (by value id, `list_of`): their length and
        // their strategies' shapes, before and after.
        let mut list_of = vec![NONE; counts.len()];
        let mut lists: Vec<(u32, SmallVec<[u64; 4]>)> = Vec::new();
        let add = |list: &mut (u32, SmallVec<[u64; 4]>), si: usize| {
            list.0 += 1;
            let m = shape(conds(si));
            if list.1.len() <= REANCHOR_SHAPES && !list.1.contains(&m) {
                list.1.push(m);
            }
        };
        for &(si, (_, v)) in &moves {
            if list_of[v as usize] == NONE {
                list_of[v as usize] = lists.len() as u32;
                lists.push(Default::default());
            }
            add(&mut lists[list_of[v as usize] as usize], si);
        }
        for (si, &(_, v)) in anchor_of.iter().enumerate() {
            if let Some(&list) = list_of.get(v as usize).filter(|&&l| l != NONE) {
                add(&mut lists[list as usize], si);
            }
        }
        let cheap = lists.iter().all(|(len, shapes)| {
            *len <= HEAVY_MIN
                || (shapes.len() <= REANCHOR_SHAPES && shapes.len() * 2 <= *len as usize)
        });
        if !cheap {
            continue;
        }
        for (si, t) in moves {
            anchor_of[si] = t;
            anchored_in[usize::from(t.0) % 64] += 1;
        }
        anchored_in[usize::from(d)] = 0;
    }
}

/// See [`reanchor`]: the most shapes a list that grows may be probed by.
const REANCHOR_SHAPES: usize = 4;

/// The set of dimensions a strategy constrains, one bit per dimension
/// index (the segment allows at most 64).
fn shape(conds: &[(u8, u32)]) -> u64 {
    conds.iter().fold(0, |m, &(d, _)| m | 1u64 << d)
}

/// Per interned value id, the span its entry gets (see [`ValueEntry`]):
/// its anchored list, or for a heavy value (a list of at least
/// [`HEAVY_MIN`] strategies with at most half as many shapes) its groups,
/// one per `(anchor dimension, shape)`. Returns the groups, the group
/// lists and the spans. `anchored[starts[v]..starts[v + 1]]` are the
/// strategies anchored under value `v` (their first condition).
fn group_heavy_values<'c>(
    conds_of: impl Fn(u32) -> &'c [(u8, u32)],
    anchored: &[u32],
    starts: &[u32],
) -> (Vec<Group>, Vec<u32>, Vec<(u32, u32)>) {
    let values = starts.len().saturating_sub(1);
    let mut spans: Vec<(u32, u32)> = (0..values)
        .map(|v| (starts[v], starts[v + 1] - starts[v]))
        .collect();
    let mut group_of: std::collections::HashMap<(u8, u64), u32> = Default::default();
    let mut rows: Vec<Vec<(super::tuple_map::Tuple, u32)>> = Vec::new();
    let mut group_dims: Vec<Vec<u8>> = Vec::new();
    let mut group_lists = Vec::new();
    let mut shapes: Vec<u64> = Vec::new();
    for (v, span) in spans.iter_mut().enumerate() {
        let (start, len) = *span;
        if len < HEAVY_MIN {
            continue;
        }
        let list = &anchored[start as usize..(start + len) as usize];
        shapes.clear();
        let mut distinct_dims = true;
        for &si in list {
            let conds = conds_of(si);
            let m = shape(conds);
            // A strategy naming a dimension twice (the model refuses it)
            // has no tuple: the value keeps its list.
            distinct_dims &= m.count_ones() as usize == conds.len();
            shapes.push(m);
        }
        shapes.sort_unstable();
        shapes.dedup();
        if !distinct_dims || shapes.len() * 2 > len as usize {
            continue;
        }
        let anchor_dim = conds_of(list[0])[0].0;
        debug_assert_eq!(conds_of(list[0])[0].1, v as u32);
        let first = group_lists.len() as u32;
        for &m in &shapes {
            let g = *group_of.entry((anchor_dim, m)).or_insert_with(|| {
                rows.push(Vec::new());
                group_dims.push((0..64u8).filter(|&d| m >> d & 1 == 1).collect());
                (rows.len() - 1) as u32
            });
            group_lists.push(g);
        }
        for &si in list {
            let conds = conds_of(si);
            let g = group_of[&(anchor_dim, shape(conds))] as usize;
            let tuple = group_dims[g]
                .iter()
                .map(|&d| conds.iter().find(|c| c.0 == d).map_or(NONE, |c| c.1))
                .collect();
            rows[g].push((tuple, si));
        }
        *span = (first, (group_lists.len() as u32 - first) | HEAVY);
    }
    let groups = rows
        .into_iter()
        .zip(group_dims)
        .map(|(r, d)| Group::build(d, r))
        .collect();
    (groups, group_lists, spans)
}

/// Records what the admitted hits with `count_if` or `cost_after` settle
/// when the request ends (issue 31). Admitted: the request was not
/// refused, the slot is still the strategy's, and no dry run may have
/// refused the hit (a dry-run rejection charges nothing: giving back what
/// was never charged would admit extra, so such a hit settles nothing).
pub(crate) fn owe_hits<V: Values + ?Sized>(
    strategies: &[Compiled],
    hits: &[Hit<'_>],
    index: &[u32],
    d: &Decision,
    r: &Request<'_, V>,
    out: &mut ResponseOut,
) {
    if let Verdict::Reject { .. } = d.verdict {
        return;
    }
    for (h, &si) in hits.iter().zip(index) {
        let c = &strategies[si as usize];
        if c.response.is_none()
            || h.slot
                .generation()
                .load(std::sync::atomic::Ordering::Acquire)
                != h.generation
            || ((r.dry_run || h.action.is_dry_run()) && d.dry_run_rejected.is_some())
        {
            continue;
        }
        c.owe_slot(out, h.units, r.now());
    }
}

/// The dimension a table dimension stands for, and how its values are
/// compared: an address range `ip/<len>` is `ip`; a prefix length
/// `api^<n>` and a template shape `api~<shape>` (see [`pattern`]) are
/// `api`'s prefixes and templates.
fn base_dimension(name: &str) -> (&str, Op) {
    if name.starts_with("ip/") {
        return ("ip", Op::Exact);
    }
    match name.find(['^', '~']) {
        Some(i) if name.as_bytes()[i] == b'^' => (&name[..i], Op::Prefix),
        Some(i) => (&name[..i], Op::Template),
        None => (name, Op::Exact),
    }
}

#[inline]
fn hit_slot(c: &Compiled) -> u32 {
    c.slot
}

/// Concurrency units a request holds: `(slot, generation)` in one mapping.
pub struct Units {
    map: Arc<Mapping>,
    units: SmallVec<[(u32, u64); 2]>,
    /// Per-key units: the key's entry and its limiter.
    keys: super::keys::KeyHolds,
}

impl Units {
    /// The request ended: each unit off this process's ledger and off its
    /// slot (if the slot still has the generation).
    pub fn release(self) {
        for &(slot, generation) in &self.units {
            self.map.release_unit(slot, generation);
        }
        for (at, lim) in &self.keys {
            self.map.release_key_unit(*at, lim);
        }
    }
}

/// After a pass or a delay every concurrency hit holds one unit (a dry run
/// too: it counts real requests in flight); after a rejection none does
/// (admit refunded them).
#[inline]
fn holds(h: &Hit, d: &Decision) -> bool {
    h.limiter.algorithm() == Algorithm::Concurrency && !matches!(d.verdict, Verdict::Reject { .. })
}

/// A client address as the matcher keys it: the IPv6 form, IPv4 as
/// v4-mapped (the model's canonical text writes a v4-mapped address as plain
/// IPv4, so both spellings meet here). A `u128` moves in two registers,
/// where an `IpAddr` is copied byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpKey(pub u128);

impl IpKey {
    /// An IPv4 address given as its 32-bit value (host order).
    #[inline]
    pub fn v4(addr: u32) -> IpKey {
        IpKey(0xffff_0000_0000 | u128::from(addr))
    }

    /// Parses an address in text (`1.2.3.4`, `::1`, `::ffff:1.2.3.4`).
    pub fn parse(text: &[u8]) -> Option<IpKey> {
        parse_ip(text).map(IpKey::from)
    }

    /// The address, v4-mapped IPv6 given back as IPv4.
    pub fn addr(self) -> IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }
}

impl From<IpAddr> for IpKey {
    #[inline]
    fn from(ip: IpAddr) -> IpKey {
        match ip {
            IpAddr::V4(a) => IpKey::v4(u32::from(a)),
            IpAddr::V6(a) => IpKey(u128::from(a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{IpKey, Table, MAX_TABLE_DIMENSIONS};
    use crate::core::each::Each;
    use crate::core::model::{Algorithm, Condition, Strategy, Unit};
    use crate::core::segment::{Decoded, Published};
    use std::net::IpAddr;

    fn published(id: u32, conds: &[(&str, &str)], each: &[&str]) -> Published {
        let conditions = conds.iter().map(|&(d, v)| Condition::new(d, v)).collect();
        let mut strategy =
            Strategy::plain(id, conditions, Algorithm::TokenBucket, 10, Unit::Second);
        strategy.each = Each::of(each);
        Published {
            strategy,
            slot: id,
            generation: 1,
        }
    }

    fn table_of(list: Vec<Published>) -> Table {
        Table::build(
            Decoded {
                publish_seq: 1,
                config_version: 1,
                published_unix_ms: 0,
                strategies: list,
                blacklist_dimensions: Vec::new(),
            },
            None,
        )
    }

    /// A grid `a=ai AND b=bj` (b anchors nothing) is found by the bytes of
    /// the request's b: its group is indexed by bytes, the request's b
    /// value is never interned (`req[b]` untouched), and what it matches
    /// is the cell. With b anchoring strategies of its own, b is looked up
    /// and the group is probed by ids only.
    #[test]
    fn a_grid_on_a_checked_dimension_is_found_by_its_bytes() {
        let mut list = Vec::new();
        for i in 0..8 {
            for j in 0..6 {
                let (a, b) = (format!("a{i}"), format!("b{j}"));
                list.push(published(1 + i * 6 + j, &[("a", &a), ("b", &b)], &[]));
            }
        }
        let t = table_of(list.clone());
        let by_bytes = |t: &Table| t.groups.iter().filter(|g| g.bytes_dims().is_some()).count();
        assert_eq!((t.groups.len(), by_bytes(&t)), (1, 1));
        let (a, b) = (
            t.dimension_index("a").unwrap(),
            t.dimension_index("b").unwrap(),
        );
        let mut values = vec![None; t.dimensions().len()];
        values[a] = Some(&b"a3"[..]);
        values[b] = Some(&b"b4"[..]);
        let mut scratch = super::Scratch::default();
        scratch.fit(&t);
        scratch.req[b] = 77;
        let ids = |m: Vec<u32>| -> Vec<u32> {
            m.iter()
                .map(|&i| t.strategies()[i as usize].strategy.id)
                .collect()
        };
        assert_eq!(ids(t.matching_with(&values, &mut scratch)), [1 + 3 * 6 + 4]);
        assert_eq!(scratch.req[b], 77, "b was interned");
        values[b] = Some(&b"b6"[..]);
        assert!(t.matching_with(&values, &mut scratch).is_empty());
        // b anchoring something (and a too, so that neither can hand its
        // strategies to the other: see `reanchor`): both looked up, no
        // group by bytes.
        list.push(published(1000, &[("b", "b9")], &[]));
        list.push(published(1001, &[("a", "a9")], &[]));
        let t = table_of(list);
        assert_eq!((t.groups.len(), by_bytes(&t)), (1, 0));
    }

    /// The friendly table: strategies `ip=X AND api=/xk` beside `api=/login`.
    /// `api` is looked up for the latter, so the others are anchored under
    /// their api as well and no request looks its address up; a request
    /// whose api holds candidates looks it up then. The same for a text
    /// dimension (`userid`). And when one strategy names the address
    /// alone, the address stays looked up.
    #[test]
    fn a_dimension_named_beside_looked_up_ones_is_not_looked_up() {
        let mut list = vec![published(1, &[("api", "/login")], &[])];
        for i in 0..40u32 {
            let ip = format!("10.0.0.{i}");
            let api = format!("/x{}", i % 4);
            list.push(published(10 + i, &[("ip", &ip), ("api", &api)], &[]));
        }
        let t = table_of(list.clone());
        let ip = t.dimension_index("ip").unwrap();
        assert!(!t.ip_lookup);
        assert_eq!(t.ip_check, Some(ip));
        // The ids of the strategies a request with `dim` = `value` and
        // `api` = `path` matches.
        let ids = |t: &Table, dim: &str, value: &str, path: &str| -> Vec<u32> {
            let mut values = vec![None; t.dimensions().len()];
            values[t.dimension_index(dim).unwrap()] = Some(value.as_bytes());
            values[t.dimension_index("api").unwrap()] = Some(path.as_bytes());
            let m = t.matching(&values);
            m.iter()
                .map(|&i| t.strategies()[i as usize].strategy.id)
                .collect()
        };
        let run = |t: &Table, addr: &str, path: &str| ids(t, "ip", addr, path);
        assert_eq!(run(&t, "10.0.0.5", "/x1"), [15]);
        assert!(run(&t, "10.0.0.5", "/x2").is_empty());
        assert!(run(&t, "10.0.0.99", "/x1").is_empty());
        assert_eq!(run(&t, "10.0.0.5", "/login"), [1]);
        // One candidate (a list of one): the address compared, not looked up.
        let mut one = vec![published(1, &[("api", "/login")], &[])];
        one.push(published(2, &[("ip", "10.0.0.7"), ("api", "/pay")], &[]));
        let t1 = table_of(one);
        assert_eq!(t1.ip_check, Some(ip));
        assert_eq!(run(&t1, "10.0.0.7", "/pay"), [2]);
        assert!(run(&t1, "10.0.0.8", "/pay").is_empty());
        // An address alone anchors: looked up as before.
        list.push(published(100, &[("ip", "10.0.0.200")], &[]));
        let t = table_of(list);
        assert!(t.ip_lookup);
        assert_eq!(t.ip_check, None);
        assert_eq!(run(&t, "10.0.0.5", "/x1"), [15]);
        assert_eq!(run(&t, "10.0.0.200", "/x1"), [100]);
        // A text dimension: `userid=uK AND api=/xk` beside `api=/login`
        // are anchored under their api, and `userid` is only checked.
        let mut list = vec![published(1, &[("api", "/login")], &[])];
        for i in 0..40u32 {
            let user = format!("u{i}");
            let api = format!("/x{}", i % 4);
            list.push(published(10 + i, &[("userid", &user), ("api", &api)], &[]));
        }
        let t = table_of(list);
        let user = t.dimension_index("userid").unwrap();
        let api = t.dimension_index("api").unwrap();
        assert_eq!(&*t.lookups, [api]);
        assert_eq!(&*t.checks, [user]);
        assert_eq!(t.check_kind[user], super::TEXT_CHECK);
        let run = |u: &str, path: &str| ids(&t, "userid", u, path);
        assert_eq!(run("u5", "/x1"), [15]);
        assert!(run("u5", "/x2").is_empty());
        assert!(run("u99", "/x1").is_empty());
        assert_eq!(run("u5", "/login"), [1]);
    }

    /// A strategy over the dimension limit (a file the writer would
    /// refuse) is dropped alone: the ones after it keep their own
    /// conditions, key plan and matches (the builder lays every strategy's
    /// conditions out where the records list them, dropped ones padded).
    #[test]
    fn strategies_after_a_dropped_one_keep_their_conditions_and_key() {
        // d0 and d1 … d65: 66 names, two over the limit.
        let names: Vec<String> = (1..MAX_TABLE_DIMENSIONS + 2)
            .map(|i| format!("d{i}"))
            .collect();
        let mut list: Vec<Published> = names
            .iter()
            .enumerate()
            .map(|(i, n)| published(i as u32 + 1, &[("d0", "a"), (n.as_str(), "v")], &[]))
            .collect();
        let after = [
            published(1000, &[("d1", "y"), ("d2", "z")], &["d3"]),
            published(1001, &[("d2", "z")], &[]),
            published(1002, &[("d3", "w"), ("d1", "y")], &[]),
        ];
        list.extend(after.iter().cloned());
        let t = table_of(list);
        // d0 … d63 fit; the strategies naming d64 and d65 are dropped.
        assert_eq!(t.dimensions().len(), MAX_TABLE_DIMENSIONS);
        let kept = MAX_TABLE_DIMENSIONS - 1;
        assert_eq!(t.strategies().len(), kept + after.len());
        assert_eq!(t.published_strategies(), kept + 2 + after.len());
        for (c, p) in t.strategies()[kept..].iter().zip(&after) {
            assert_eq!(c.strategy.id, p.strategy.id);
            let mut got = t.conditions(c);
            let mut want = p.strategy.conditions.clone();
            got.sort_by(|a, b| a.dimension.cmp(&b.dimension));
            want.sort_by(|a, b| a.dimension.cmp(&b.dimension));
            assert_eq!(got, want, "strategy {}", p.strategy.id);
            assert_eq!(c.key.is_some(), p.strategy.id == 1000);
        }
        let values = t.values_of(&[("d1", b"y"), ("d2", b"z"), ("d3", b"w")]);
        let ids: Vec<u32> = t
            .matching(&values)
            .iter()
            .map(|&i| t.strategies()[i as usize].strategy.id)
            .collect();
        assert_eq!(ids, [1000, 1001, 1002]);
    }

    #[test]
    fn ipv4_and_its_v4_mapped_form_are_one_key() {
        let v4 = IpKey::parse(b"1.2.3.4").unwrap();
        assert_eq!(v4, IpKey::v4(0x0102_0304));
        assert_eq!(IpKey::parse(b"::ffff:1.2.3.4"), Some(v4));
        assert_eq!(v4.addr(), "1.2.3.4".parse::<IpAddr>().unwrap());
        assert_ne!(IpKey::parse(b"::1"), IpKey::parse(b"0.0.0.1"));
        for bad in [&b"1.2.3"[..], b"256.1.1.1", b"", b"\xff"] {
            assert_eq!(IpKey::parse(bad), None);
        }
    }
}
