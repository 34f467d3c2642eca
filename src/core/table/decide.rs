//! The decision: blacklist, match, rank and admit one request.

use smallvec::SmallVec;

use super::{
    Compiled, Patch, Request, RequestOutcome, ResponseOut, Scratch, Table, TableDecision, Values,
};
use crate::core::admit::{self, Decision, Hit, Verdict};
use crate::core::model::{Action, Algorithm};
use crate::core::shm::region::Region;
use crate::core::shm::Mapping;

impl Table {
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
        // And the penalty box's local bans (issue 32), answered as the
        // blacklist: one flag for both.
        // And a patched table (issue 29): decided out of line, with its
        // base, behind the same flag.
        if self.bl_check {
            if let Some(o) = self.screened(r, scratch, out) {
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
            *out = super::keyed::decide(
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
            // A penalty box (issue 32) is on a per-key strategy: a
            // rejection it counts is decided here, and only here.
            if self.has_bans() {
                scratch.ban = self.count_ban(r, out);
            }
            if scratch.key_full.is_some() || scratch.ban.is_some() {
                scratch.notice = true;
            }
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
                map.hold_unit(self.strategies[si as usize].slot, hit.generation);
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
    pub(super) fn rank(&self, matched: &mut Vec<u32>) -> Option<u32> {
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
    pub(super) fn admit_matched<V: Values + ?Sized>(
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
                map.hold_unit(self.strategies[si as usize].slot, h.generation);
            }
        }
        if self.responsive {
            owe_hits(&self.strategies, &hits, &hit_index, &decision, r, response);
        }
        decision
    }

    /// The blacklist's and the penalty box's verdict on the request, or a
    /// patched table's whole decision (see [`decide_patched`](Self::decide_patched)).
    #[cold]
    fn screened<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
        scratch: &mut Scratch,
        out: &mut Decision,
    ) -> Option<RequestOutcome<()>> {
        match &self.patch {
            Some(p) => Some(self.decide_patched(p, r, scratch, out)),
            None => self.blacklisted(r),
        }
    }

    /// Issue 29: the decision of a patched table, as the whole table
    /// would decide: the base's blacklist, then the base's matches except
    /// the strategies that changed, and this table's (the changed ones),
    /// by id as one table lists them, admitted together. A patch holds
    /// and sits over only plain strategies ([`Table::read_patch`]): no
    /// ranking, key, concurrency unit, response plan or ban to decide.
    #[inline(never)]
    fn decide_patched<V: Values + ?Sized>(
        &self,
        p: &Patch,
        r: &Request<'_, V>,
        scratch: &mut Scratch,
        out: &mut Decision,
    ) -> RequestOutcome<()> {
        let base = &*p.base;
        if base.bl_check {
            if let Some(o) = base.blacklisted(r) {
                return o;
            }
        }
        let mut m = std::mem::take(&mut scratch.patched);
        self.patched_matches(p, r.values, r.ip, scratch, &mut m);
        let outcome = match (&self.map, m.is_empty()) {
            (Some(map), false) => {
                let slots = map.slots();
                let hits: SmallVec<[Hit<'_>; 8]> = m
                    .iter()
                    .filter_map(|&(_, own, si)| match own {
                        true => self.strategies[si as usize].hit(&slots),
                        false => base.strategies[si as usize].hit(&slots),
                    })
                    .collect();
                *out = admit::admit_with(&hits, r.now(), r.dry_run, r.quota);
                RequestOutcome::Limited(())
            }
            _ => RequestOutcome::NoMatch,
        };
        scratch.patched = m;
        outcome
    }

    /// A patched table's matches: `(id, this table's, index)`, the base's
    /// unchanged ones and this table's merged by id.
    pub(super) fn patched_matches<V: Values + ?Sized>(
        &self,
        p: &Patch,
        values: &V,
        ip: Option<super::IpKey>,
        scratch: &mut Scratch,
        out: &mut Vec<(u32, bool, u32)>,
    ) {
        out.clear();
        let base = &*p.base;
        // Through a type of its own: the request path's `match_request`
        // stays the one instance of its values' type, inlined there (a
        // second call made it a call: +25 instructions per request).
        let values = &Apart(values);
        let listed = |t: &Table, scratch: &mut Scratch, own: bool, out: &mut Vec<_>| {
            let list: &[u32] = if t.match_free {
                &t.unconditioned
            } else {
                t.match_request(values, ip, scratch);
                &scratch.matches
            };
            for &si in list {
                if own || p.masked.binary_search(&si).is_err() {
                    out.push((t.strategies[si as usize].strategy.id, own, si));
                }
            }
        };
        listed(base, scratch, false, out);
        let at = out.len();
        listed(self, scratch, true, out);
        if at > 0 && at < out.len() {
            // Two runs, each ascending: merged (a few entries).
            out.sort_unstable_by_key(|x| x.0);
        }
    }

    /// The ids of the strategies a request with `values` is decided over,
    /// in the order the decision lists them (a patched table's merged
    /// with its base's): what a patched and a fully built table must agree
    /// on (tests).
    pub fn matching_ids<V: Values + ?Sized>(&self, values: &V) -> Vec<u32> {
        let mut scratch = Scratch::default();
        match &self.patch {
            Some(p) => {
                let mut m = Vec::new();
                self.patched_matches(p, values, None, &mut scratch, &mut m);
                m.into_iter().map(|x| x.0).collect()
            }
            None => {
                let list: Vec<u32> = if self.match_free {
                    self.unconditioned.clone()
                } else {
                    self.match_request(values, None, &mut scratch);
                    scratch.matches.clone()
                };
                list.iter()
                    .map(|&si| self.strategies[si as usize].strategy.id)
                    .collect()
            }
        }
    }

    /// The blacklist's verdict on the request, if it holds the client
    /// address or one of its values.
    #[cold]
    pub(super) fn blacklisted<V: Values + ?Sized>(
        &self,
        r: &Request<'_, V>,
    ) -> Option<RequestOutcome<()>> {
        if self.has_bans() {
            if let Some(o) = self.banned(r) {
                return Some(o);
            }
        }
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
}

/// A request's values seen by a patched table's matching (see
/// [`Table::patched_matches`]).
struct Apart<'a, V: ?Sized>(&'a V);

impl<V: Values + ?Sized> Values for Apart<'_, V> {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self.0.value(dim)
    }
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

/// After a pass or a delay every concurrency hit holds one unit (a dry run
/// too: it counts real requests in flight); after a rejection none does
/// (admit refunded them).
#[inline]
pub(super) fn holds(h: &Hit, d: &Decision) -> bool {
    h.limiter.algorithm() == Algorithm::Concurrency && !matches!(d.verdict, Verdict::Reject { .. })
}
