//! The build's index layout: which condition anchors each strategy
//! ([`anchor`], [`reanchor`]), heavy values' tuple-space groups
//! ([`group_heavy_values`]), the address ranges' order, span and IPv4
//! directory ([`range_layout`], [`v4_directory`]), and which prefix
//! lengths a request must clear ([`derived_resets`]).

use smallvec::SmallVec;

use super::{IpRanges, PrefixDim, TemplateDim, HEAVY, HEAVY_MIN, IP_VALUE, TEXT_VALUE};
use crate::core::tuple_map::{Group, NONE};

/// [`Table::v4_dir`] for `ranges` (at most 64): an IPv4 network `/l`
/// (IPv6-form length `96 + l`) marks the /16 entries it covers (one for
/// `l >= 16`, `2^(16-l)` below: at most 65,536 marks per length, whatever
/// the number of networks); a shorter IPv6 network holding the v4-mapped
/// space marks every entry. Empty when no network can hold an IPv4 address.
pub(super) fn v4_directory(ranges: &[IpRanges]) -> Box<[u64]> {
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
pub(super) fn reanchor<'c>(
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
pub(super) const REANCHOR_SHAPES: usize = 4;

/// The set of dimensions a strategy constrains, one bit per dimension
/// index (the segment allows at most 64).
pub(super) fn shape(conds: &[(u8, u32)]) -> u64 {
    conds.iter().fold(0, |m, &(d, _)| m | 1u64 << d)
}

/// Per interned value id, the span its entry gets (see [`ValueEntry`]):
/// its anchored list, or for a heavy value (a list of at least
/// [`HEAVY_MIN`] strategies with at most half as many shapes) its groups,
/// one per `(anchor dimension, shape)`. Returns the groups, the group
/// lists and the spans. `anchored[starts[v]..starts[v + 1]]` are the
/// strategies anchored under value `v` (their first condition).
pub(super) fn group_heavy_values<'c>(
    conds_of: impl Fn(u32) -> &'c [(u8, u32)],
    anchored: &[u32],
    starts: &[u32],
) -> (Vec<Group>, Vec<u32>, Vec<(u32, u32)>) {
    let values = starts.len().saturating_sub(1);
    let mut spans: Vec<(u32, u32)> = (0..values)
        .map(|v| (starts[v], starts[v + 1] - starts[v]))
        .collect();
    let mut group_of: std::collections::HashMap<(u8, u64), u32> = Default::default();
    let mut rows: Vec<Vec<(crate::core::tuple_map::Tuple, u32)>> = Vec::new();
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

/// What [`anchor`] gives: the anchored lists (`anchored[starts[v]..
/// starts[v + 1]]` under value `v`), the dimensions anchored in (bits),
/// the strategies without conditions.
pub(super) struct Anchors {
    pub(super) anchored: Vec<u32>,
    pub(super) starts: Vec<u32>,
    pub(super) anchored_dims: u64,
    pub(super) unconditioned: Vec<u32>,
}

/// Each strategy anchored under its least shared condition (moved by
/// [`reanchor`]), its anchor swapped first in `flat`.
#[inline(always)]
pub(super) fn anchor(
    flat: &mut [(u8, u32)],
    fspans: &[(u32, u32)],
    counts: &[u32],
    value_keys: &[(u8, u32)],
) -> Anchors {
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
        counts,
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
    Anchors {
        anchored,
        starts,
        anchored_dims,
        unconditioned,
    }
}

/// Address ranges longest first, and what a request reads of them: the
/// range dimensions, the span of addresses they hold, the IPv4 directory.
#[inline(always)]
pub(super) fn range_layout(
    ip_ranges: &mut [IpRanges],
) -> (std::ops::Range<usize>, (u128, u128), Box<[u64]>) {
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
        v4_directory(ip_ranges)
    } else {
        Box::default()
    };
    (range_dims, ip_span, v4_dir)
}

/// Which prefix lengths and template shapes a request must clear when it
/// finds nothing (see [`PrefixDim::reset`], [`TemplateDim::reset`]).
#[inline(always)]
pub(super) fn derived_resets(
    prefixes: &mut [PrefixDim],
    templates: &mut [TemplateDim],
    flat: &[(u8, u32)],
    fspans: &[(u32, u32)],
) {
    let conds_of = |si: usize| fspans[si].0 as usize..fspans[si].1 as usize;
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
    for t in templates.iter_mut() {
        t.reset = beside >> (t.dim % 64) & 1 == 1;
    }
}
