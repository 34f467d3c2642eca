//! The decision's match and probe: a request's values looked up (exact
//! values, address ranges, prefixes, templates), the anchored candidates
//! checked, tuple-space groups probed, negations applied.

use super::{
    Compiled, IpKey, Scratch, Table, ValueEntry, Values, BYTES, HEAVY, IP_CHECK, IP_VALUE,
    LOOKED_UP, TEXT_CHECK, TEXT_VALUE,
};
use crate::core::model::MAX_VALUE_LEN;
use crate::core::pattern;
use crate::core::tuple_map::NONE;
use crate::core::value_map::{bytes_eq, hash_bytes};

impl Table {
    /// [`matching`](Self::matching) with the `ip` dimension taken from the
    /// client address when there is one (else parsed from its text value:
    /// callers that give values as text, e.g. tests; nginx gives the binary
    /// address).
    #[inline]
    pub(super) fn match_request<V: Values + ?Sized>(
        &self,
        values: &V,
        ip: Option<IpKey>,
        s: &mut Scratch,
    ) {
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
    pub(super) fn match_into<V: Values + ?Sized>(
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
            found_entry(d, e, req, spans, &mut ns, out, &mut sources);
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
            // Templates alone (no prefix): straight to their lookups.
            sources += match self.prefix_bases.is_empty() {
                true => self.template_lookups(values, tkey, req, spans, &mut ns, out),
                false => self.derived_lookups(values, tkey, req, spans, &mut ns, out),
            };
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
            self.apply_negations(values, out);
        }
    }

    /// The matches `out` whose negations fail removed. Out of line: only
    /// a table with negations carries it.
    #[inline(never)]
    pub(super) fn apply_negations<V: Values + ?Sized>(&self, values: &V, out: &mut Vec<u32>) {
        match out[..] {
            // One match (the usual): its negations checked with little
            // held across the value reads.
            [si] => {
                if !self.negations_hold_for(values, si) {
                    out.clear();
                }
            }
            [] => {}
            _ => self.drop_negated(values, out),
        }
    }

    /// Prefix lengths and template shapes: one probe each (see
    /// [`pattern`]), the base value read once per base; each result
    /// handed to `found` as a lookup's. Out of line: only a table with
    /// prefixes or templates carries it.
    /// Returns how many lists it added to `out` (as `found` in
    /// [`match_into`](Self::match_into) counts them).
    #[inline(never)]
    pub(super) fn derived_lookups<V: Values + ?Sized>(
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
            found_entry(d, e, req, spans, ns, out, &mut sources);
        };
        // Prefixes, by base then length: a length longer than the value,
        // or whose last byte ends no prefix of that length, is no probe;
        // each base's value read once.
        for &(b, start, end) in self.prefix_bases.iter() {
            let value = values.value(b as usize).unwrap_or_default();
            for p in &self.prefixes[start as usize..end as usize] {
                let n = p.len as usize;
                // The prefix's last byte: one bound check for 1 <= n <=
                // the value's length.
                let e = match value.get(n.wrapping_sub(1)) {
                    Some(&b) if p.last[usize::from(b >> 6)] >> (b & 63) & 1 == 1 => {
                        self.index[p.dim as usize].values.get(&value[..n])
                    }
                    // Sorted by length: no longer one fits, none needs
                    // clearing: on to the next base. (An empty prefix,
                    // which the model refuses, matches nothing.)
                    None if n > 0 && !p.reset_after => break,
                    _ => None,
                };
                match e {
                    None if !p.reset => {}
                    e => found(p.dim as usize, e),
                }
            }
        }
        if !self.template_bases.is_empty() {
            sources += self.template_lookups(values, tkey, req, spans, ns, out);
        }
        sources
    }

    /// The template part of [`derived_lookups`](Self::derived_lookups),
    /// each result recorded as a lookup's; returns how many lists it added
    /// to `out`. Out of line (the handler's own registers stay as they
    /// are for a table without templates), no closure.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn template_lookups<V: Values + ?Sized>(
        &self,
        values: &V,
        tkey: &mut Vec<u8>,
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        ns: &mut usize,
        out: &mut Vec<u32>,
    ) -> u32 {
        let mut sources = 0;
        // Only the shapes a value fits are visited (`template_base`); the
        // others' ids are cleared only where some strategy checks them
        // beside its anchor (`template_resets`).
        for &d in self.template_resets.iter() {
            req[d as usize] = NONE;
        }
        // The first base (the usual: `api` alone) outside the loop over
        // the others: nothing is hoisted for it.
        if let Some((first, more)) = self.template_bases.split_first() {
            self.template_base(first, values, tkey, req, spans, ns, out, &mut sources);
            for tb in more {
                self.template_base(tb, values, tkey, req, spans, ns, out, &mut sources);
            }
        }
        sources
    }

    /// One base's templates: only the shapes its value's segment count
    /// fits are visited (found by that count in `template_fits`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn template_base<V: Values + ?Sized>(
        &self,
        tb: &super::TemplateBase,
        values: &V,
        tkey: &mut Vec<u8>,
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        ns: &mut usize,
        out: &mut Vec<u32>,
        sources: &mut u32,
    ) {
        let v = values.value(tb.base as usize).unwrap_or_default();
        if v.is_empty() {
            return;
        }
        let segs = pattern::segment_count(v);
        let at = tb.fits.0 as usize + segs.min(tb.fits.1 as usize);
        let Some(&fit) = self.template_fits.get(at) else {
            return;
        };
        let run = self
            .template_runs
            .get(fit.run.0 as usize..fit.run.1 as usize);
        self.template_run(
            run.unwrap_or_default(),
            v,
            segs,
            tkey,
            req,
            spans,
            ns,
            out,
            sources,
        );
    }

    /// The shapes `run` probed for `v`: the first (the usual: one)
    /// outside the loop over the others.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn template_run(
        &self,
        run: &[super::TemplateDim],
        v: &[u8],
        segs: usize,
        tkey: &mut Vec<u8>,
        req: &mut [u32],
        spans: &mut [(u32, u32)],
        ns: &mut usize,
        out: &mut Vec<u32>,
        sources: &mut u32,
    ) {
        if let Some((t, more)) = run.split_first() {
            let e = self.template_entry(t, v, segs, tkey);
            found_entry(t.dim as usize, e, req, spans, ns, out, sources);
            for t in more {
                let e = self.template_entry(t, v, segs, tkey);
                found_entry(t.dim as usize, e, req, spans, ns, out, sources);
            }
        }
    }

    /// The entry of template shape `t` for value `v` (of `segs` segments,
    /// which the shape fits): its first segments as they are (see
    /// [`Table::template_escapes`]), else projected
    /// ([`template_projected`](Self::template_projected)).
    #[inline(always)]
    fn template_entry(
        &self,
        t: &super::TemplateDim,
        v: &[u8],
        segs: usize,
        tkey: &mut Vec<u8>,
    ) -> Option<&ValueEntry> {
        match t.shape.wild == 0 && !self.template_escapes {
            true => self.template_literal(t, v, segs),
            false => self.template_projected(t, v, segs, tkey),
        }
    }

    /// The entry of a wildcard-free shape `t`: `v`'s first segments as
    /// they are.
    #[inline(always)]
    fn template_literal(
        &self,
        t: &super::TemplateDim,
        v: &[u8],
        segs: usize,
    ) -> Option<&ValueEntry> {
        let first = pattern::first_segments(v, usize::from(t.shape.segments), segs);
        self.index[t.dim as usize].values.get(first)
    }

    /// [`template_entry`](Self::template_entry) for a shape with a
    /// wildcard, or where some key holds an escape: out of line, so that
    /// the usual probe holds fewer values across the shapes.
    #[inline(never)]
    fn template_projected(
        &self,
        t: &super::TemplateDim,
        v: &[u8],
        segs: usize,
        tkey: &mut Vec<u8>,
    ) -> Option<&ValueEntry> {
        let special = || v.iter().any(|&b| b == b'*' || b == b'\\');
        if t.shape.wild == 0 && !special() {
            return self.template_literal(t, v, segs);
        }
        match pattern::project(t.shape, v, MAX_VALUE_LEN, tkey) {
            true => self.index[t.dim as usize].values.get(&tkey[..]),
            false => None,
        }
    }

    /// The matches whose negations fail removed (see [`negations_hold`]),
    /// kept in order. A plain loop (not `Vec::retain`, whose guard and
    /// closure cost more than the usual one match with one negation).
    #[inline(never)]
    pub(super) fn drop_negated<V: Values + ?Sized>(&self, values: &V, out: &mut Vec<u32>) {
        let mut kept = 0;
        for i in 0..out.len() {
            let si = out[i];
            let Some(c) = self.strategies.get(si as usize) else {
                continue;
            };
            if c.negs.0 == c.negs.1 || self.negations_hold(values, c) {
                out[kept] = si;
                kept += 1;
            }
        }
        out.truncate(kept);
    }

    /// [`negations_hold`](Self::negations_hold) for strategy `si` (false
    /// for an index out of the table).
    #[inline(always)]
    pub(super) fn negations_hold_for<V: Values + ?Sized>(&self, values: &V, si: u32) -> bool {
        let Some(c) = self.strategies.get(si as usize) else {
            return false;
        };
        // One negation of a dimension the table has (the usual):
        // straight-line, from the record. `neg` is `NONE` otherwise (no
        // negation, several, or one of a dimension the table lacks, which
        // `negations_hold` finds failing).
        match c.neg.0 {
            NONE => c.negs.0 == c.negs.1 || self.negations_hold(values, c),
            d => values.differs(d as usize, &c.neg.1),
        }
    }

    /// Whether the request's value of a negation's dimension differs from
    /// the negated bytes (an absent or empty value differs from every
    /// value; a negation of a dimension the table lacks never holds).
    #[inline(always)]
    fn negation_holds<V: Values + ?Sized>(
        &self,
        values: &V,
        &(d, from, to): &(u32, u32, u32),
    ) -> bool {
        if d == NONE {
            return false;
        }
        // Compared through the reader's inline path: the check is out of
        // line, one call per request.
        self.neg_bytes
            .get(from as usize..to as usize)
            .is_none_or(|not| values.differs(d as usize, not))
    }

    /// Whether the request's values differ from each value `c` negates
    /// (an absent value differs from every value).
    #[inline]
    pub(super) fn negations_hold<V: Values + ?Sized>(&self, values: &V, c: &Compiled) -> bool {
        let Some(negs) = self.negs.get(c.negs.0 as usize..c.negs.1 as usize) else {
            return false;
        };
        negs.iter().all(|n| self.negation_holds(values, n))
    }

    /// Whether the request's value of dimension `d` is interned value `v`:
    /// by the id a lookup wrote to `req`, or for a dimension only checked
    /// ([`Self::checks`], not looked up), by comparing the bytes (the
    /// client address, when only checked: the address).
    #[inline(always)]
    pub(super) fn holds<V: Values + ?Sized>(
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
    pub(super) fn probe_bytes<V: Values + ?Sized>(
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
    pub(super) fn probe_groups(
        &self,
        start: u32,
        len: u32,
        req: &[u32],
        out: &mut Vec<u32>,
    ) -> u32 {
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
}

/// What a lookup of dimension `d` found (`e`): its interned id written to
/// `req[d]` (or [`NONE`]); a strategy alone under the value pushed to
/// `out` (one more list to merge: `sources`), else its anchored list (or
/// groups) noted in `spans[*ns]` to check. Shared by every lookup of
/// [`Table::match_into`] and [`Table::derived_lookups`].
#[inline(always)]
fn found_entry(
    d: usize,
    e: Option<&ValueEntry>,
    req: &mut [u32],
    spans: &mut [(u32, u32)],
    ns: &mut usize,
    out: &mut Vec<u32>,
    sources: &mut u32,
) {
    let Some(e) = e else {
        req[d] = NONE;
        return;
    };
    req[d] = e.id;
    if e.only != NONE {
        out.push(e.only);
        *sources += 1;
    } else if e.len > 0 {
        spans[*ns] = (e.start, e.len);
        *ns += 1;
    }
}
