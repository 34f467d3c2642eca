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

use std::sync::Arc;

use smallvec::SmallVec;

use super::admit::Hit;
use super::blacklist::Blacklist;
use super::limiter::Limiter;
use super::model::ipnet::IpNet;
use super::model::{Condition, Op, Strategy, MAX_VALUE_LEN};
use super::pattern::Shape;
use super::shm::region::Region;
use super::shm::slot::Slot;
use super::shm::Mapping;
use super::tuple_map::{Group, NONE};
use super::value_map::ValueMap;

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
    key_holds: keyed::KeyHolds,
    /// The first per-key strategy whose key found the table full in the
    /// last request, with its `on_full` (for the worker's log).
    key_full: Option<(u32, super::model::each::OnFull)>,
    /// What the last request settles when it ends and whether a cost was
    /// invalid (issue 31; cleared only by a table with such strategies).
    pub response: ResponseOut,
    /// A request's value projected onto a template shape
    /// ([`pattern::project`]): room made once, when a table with
    /// templates is loaded.
    tkey: Vec<u8>,
    /// What a request's rejection did to its key's ban count (issue 32;
    /// set by [`Table::decide_in`] for a table with a penalty box).
    ban: Option<BanEvent>,
    /// A patched table's matches (issue 29, see `Table::decide_patched`).
    patched: Vec<(u32, bool, u32)>,
    /// `key_full` or `ban` waits for the caller ([`Scratch::take_notices`]):
    /// the one flag a request path reads after each request.
    notice: bool,
}

/// What a request left for the worker to report (its log lines), taken
/// once by [`Scratch::take_notices`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Notices {
    /// The per-key strategy (id, `on_full`) whose new key found the key
    /// table full.
    pub key_full: Option<(u32, super::model::each::OnFull)>,
    /// What a rejection did to its key's ban count (issue 32).
    pub ban: Option<BanEvent>,
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

/// A template shape in use (see [`Table::template_runs`]).
#[derive(Clone, Copy)]
struct TemplateDim {
    base: u32,
    dim: u32,
    shape: Shape,
    /// Some strategy checks this shape beside its anchor: a request it
    /// does not fit must clear its id (as [`PrefixDim::reset`]).
    reset: bool,
}

/// One base's template shapes (see [`Table::template_bases`]): ranges of
/// the table's shapes (by base, rest, segment count) at build.
struct TemplateBase {
    base: u32,
    /// Shapes without a rest, by segment count.
    exact: (u32, u32),
    /// Shapes with a rest, by segment count.
    rest: (u32, u32),
    /// `(start, last)`: its runs by a value's segment count `s` are
    /// [`Table::template_fits`]`[start + min(s, last)]` (entry `last`
    /// stands for every count past the longest shape).
    fits: (u32, u32),
}

/// The shapes a value of one segment count fits (see
/// [`TemplateBase::fits`]): `template_runs[run.0..run.1]`, those without
/// a rest of exactly that count, then those with a rest of at most that
/// count. Built with the table: a request goes straight to one run.
#[derive(Clone, Copy)]
struct TemplateFit {
    run: (u32, u32),
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
    /// Some [`Notices`] wait since the last [`take_notices`](Self::take_notices).
    #[inline(always)]
    pub fn has_notices(&self) -> bool {
        self.notice
    }

    /// What the requests decided since the last call left to report; the
    /// caller takes it after each request it decides (else a later per-key
    /// request's clears it).
    pub fn take_notices(&mut self) -> Notices {
        self.notice = false;
        Notices {
            key_full: self.key_full.take(),
            ban: self.ban.take(),
        }
    }

    /// Makes room for `table` now (when a worker loads it), so that no
    /// request allocates.
    pub fn fit(&mut self, table: &Table) {
        if let Some(p) = &table.patch {
            self.fit(&p.base);
        }
        let n = table.dimensions().len();
        if self.req.len() < n {
            self.req.resize(n, NONE);
            self.spans.resize(n, (0, 0));
        }
        self.matches.reserve(MATCHES_ROOM);
        if table.patch.is_some() {
            self.patched.reserve(MATCHES_ROOM);
        }
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
    /// Its negation when it has exactly one (the usual): `(dimension,
    /// value)` as in `Table::negs`, read by the matcher without going
    /// through `Table::negs` and `Table::neg_bytes`.
    neg: (u32, Box<[u8]>),
    /// Per-key strategies (`each`): how the key is built, its limiter.
    pub key: Option<Box<keyed::KeyPlan>>,
    /// `count_if`, `cost_from`, `cost_after` (issue 31; `None`: plain).
    pub response: Option<Box<ResponsePlan>>,
}

impl Compiled {
    /// This strategy's admission input, over its slot in `slots`.
    /// (`#[inline]`: a copy in the nginx handler's codegen unit whatever
    /// the crate's partitioning, which moves with unrelated changes.)
    #[inline]
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
    pub(crate) fn owe_slot(&self, out: &mut ResponseOut, units: u64, now: super::clock::Now) {
        let Some(p) = self.response.as_deref().filter(|p| p.deferred()) else {
            return;
        };
        out.owed.push(super::response::OwedCharge {
            target: super::response::OwedTarget::Slot {
                slot: self.slot,
                generation: self.generation,
                limiter: self.limiter,
            },
            owed: super::model::response::Owed {
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
    /// Per base (ascending): `(base, start, end)`, its lengths in
    /// `prefixes[start..end]`.
    prefix_bases: Box<[(u32, u32, u32)]>,
    /// Per base (ascending), its shapes (at build): those without
    /// a rest, then those with one, each run by segment count (a request
    /// visits only the shapes its value's segment count fits).
    template_bases: Box<[TemplateBase]>,
    /// Every base's [`TemplateFit`]s (see [`TemplateBase::fits`]).
    template_fits: Box<[TemplateFit]>,
    /// Per base and segment count, the shapes it fits, one contiguous run
    /// each (copies: a shape with a rest is in
    /// the run of every count from its own to the longest shape's + 1, so
    /// at most [`pattern::MAX_TEMPLATE_SEGMENTS`] + 1 times).
    template_runs: Box<[TemplateDim]>,
    /// The template dimensions some strategy checks beside its anchor
    /// ([`TemplateDim::reset`]): cleared before the shapes are probed.
    template_resets: Box<[u32]>,
    /// Some prefix or template is in use: [`Table::derived_lookups`].
    derived: bool,
    /// Some derived dimension is a template ([`Scratch::tkey`]).
    templates: bool,
    /// Some key of a wildcard-free template shape holds an escape (`\\`):
    /// only then is a request's value with a `*` or `\\` projected (escaped)
    /// before its lookup. Otherwise no key holds either byte, so the raw
    /// value misses exactly where its escaped form would.
    template_escapes: bool,
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
    /// networks of that length (see [`ipnet`](super::model::ipnet)). A request
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
    /// The penalty boxes (issue 32; empty: none, nothing checked).
    bans: bans::Bans,
    /// `!bans.is_empty()`.
    has_bans: bool,
    /// `bl_ip || !bl_dims.is_empty() || has_bans || patch.is_some()`: the
    /// request path's one load for the blacklist, the penalty box and a
    /// patched table (issue 29: no load more for a table without them).
    bl_check: bool,
    /// Some strategy is a concurrency limit (a patch is made only over a
    /// table without one: see [`Table::read_patch`]).
    concurrency: bool,
    /// The payload this table was read from, kept by a worker's loader
    /// thread ([`Table::keep_payload`]) so that the next publish can be
    /// compared with it record by record ([`Table::read_patch`]).
    payload: Option<(Vec<u8>, u32)>,
    /// Issue 29: this table holds only the strategies that changed since
    /// `patch.base` (whose dimension numbering it shares); the others are
    /// decided in the base ([`Table::decide_in`]'s patched path). A worker
    /// replaces it with a full build as soon as that is done.
    patch: Option<Box<Patch>>,
}

/// What a patched table decides with besides its own strategies.
struct Patch {
    base: Arc<Table>,
    /// Indexes in `base.strategies` of the strategies that changed
    /// (replaced or removed by this table), ascending.
    masked: Box<[u32]>,
}

impl Table {
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

    /// This table's compiled strategies: for a patched table
    /// ([`is_patched`](Self::is_patched)), the changed ones only (see
    /// [`all_strategies`](Self::all_strategies)).
    pub fn strategies(&self) -> &[Compiled] {
        &self.strategies
    }

    /// Every strategy the table decides with: a patched table's own and
    /// its base's unchanged ones (stats).
    pub fn all_strategies(&self) -> impl Iterator<Item = &Compiled> {
        let base = self.patch.as_deref().map(|p| {
            p.base
                .strategies
                .iter()
                .enumerate()
                .filter(|(i, _)| p.masked.binary_search(&(*i as u32)).is_err())
                .map(|(_, c)| c)
        });
        base.into_iter().flatten().chain(self.strategies.iter())
    }

    /// Whether this table is a patch over the previous one (issue 29),
    /// which a full build replaces shortly.
    pub fn is_patched(&self) -> bool {
        self.patch.is_some()
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

mod bans;
mod build;
mod decide;
mod keyed;
mod layout;
mod matcher;
mod request;
mod response_plan;
mod units;

pub use bans::BanEvent;
pub(crate) use decide::owe_hits;
pub use keyed::{KeyHolds, KeyPlan};
pub use request::{value_differs, IpKey, Request, RequestOutcome, TableDecision, Values};
pub use response_plan::ResponsePlan;
pub use units::Units;

#[cfg(test)]
mod patch_tests;
#[cfg(test)]
mod tests;
