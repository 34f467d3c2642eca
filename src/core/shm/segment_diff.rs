//! Which strategies changed between two published payloads (issue 29:
//! the first step of a worker applying a small change without a full
//! rebuild).
//!
//! A worker holds the payload of the table it decides with (sequence
//! N-1). When sequence N is published it compares the two payloads record
//! by record, by id: a record whose bytes are the same was validated
//! when N-1 was read and compiles to the same strategy (its stat slot and
//! generation are in the bytes), so only the ids returned here need
//! decoding and compiling. The list is computed by the worker from the
//! bytes it copied and checksummed, never read from the file: a hostile
//! file cannot make a worker skip a change by lying about what changed.
//!
//! Bounded: at most `max` ids; more, or anything unexpected in either
//! payload (a bad record length, ids out of order, different blacklist
//! dimensions after the records), gives `None`, the caller's cue to build
//! the whole table as before. Nothing here allocates more than `max` ids
//! or panics on any input.

use smallvec::SmallVec;

use super::segment::REC_FIXED;

/// Ids that changed, ascending, each with where its record is in the new
/// payload (`None`: removed).
pub type Changed = SmallVec<[(u32, Option<(usize, usize)>); 8]>;

/// The bound a worker would use: a change of more strategies than this
/// is a full rebuild.
pub const MAX_CHANGED: usize = 64;

/// One record: its id, its bytes, where they start.
type Rec<'a> = (u32, &'a [u8], usize);

/// Walks the `count` records at the start of a payload: `(id, bytes)` of
/// each, then where the records end.
struct Records<'a> {
    payload: &'a [u8],
    pos: usize,
    left: u32,
    last: Option<u32>,
}

impl<'a> Records<'a> {
    fn new(payload: &'a [u8], count: u32) -> Records<'a> {
        Records {
            payload,
            pos: 0,
            left: count,
            last: None,
        }
    }

    /// The next record, `Ok(None)` after the last, `Err` for a record
    /// that cannot be one (the whole comparison is then refused).
    fn next(&mut self) -> Result<Option<Rec<'a>>, ()> {
        if self.left == 0 {
            return Ok(None);
        }
        let start = self.pos;
        let head = self.payload.get(start..start.checked_add(8).ok_or(())?);
        let head = head.ok_or(())?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let id = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let end = start.checked_add(len).ok_or(())?;
        if len < REC_FIXED || len % 8 != 0 || end > self.payload.len() {
            return Err(());
        }
        if self.last.is_some_and(|l| id <= l) {
            return Err(());
        }
        self.last = Some(id);
        self.left -= 1;
        self.pos = end;
        Ok(Some((id, &self.payload[start..end], start)))
    }
}

/// The ids whose records differ between payload `old` (`old_count`
/// records) and `new` (`new_count`): added, removed, or with any byte
/// changed (conditions, rate, enabled, slot, generation...), ascending,
/// each with its record's bytes `start..end` in `new` (`None`: removed).
/// `None` when more than `max` differ, when the bytes after the records
/// (the blacklist dimensions) differ, or when either payload is not a
/// well-formed run of records (lengths, ascending ids).
pub fn changed_ids(
    old: &[u8],
    old_count: u32,
    new: &[u8],
    new_count: u32,
    max: usize,
) -> Option<Changed> {
    let mut a = Records::new(old, old_count);
    let mut b = Records::new(new, new_count);
    let mut out = Changed::new();
    let push = |id: u32, at: Option<(usize, &[u8])>, out: &mut Changed| {
        out.push((id, at.map(|(start, r)| (start, start + r.len()))));
        out.len() <= max
    };
    let (mut x, mut y) = (a.next().ok()?, b.next().ok()?);
    loop {
        match (x, y) {
            (None, None) => break,
            (Some((i, ra, _)), Some((j, rb, at))) if i == j => {
                if ra != rb && !push(i, Some((at, rb)), &mut out) {
                    return None;
                }
                x = a.next().ok()?;
                y = b.next().ok()?;
            }
            (Some((i, _, _)), Some((j, _, _))) if i < j => {
                if !push(i, None, &mut out) {
                    return None;
                }
                x = a.next().ok()?;
            }
            (Some((i, _, _)), None) => {
                if !push(i, None, &mut out) {
                    return None;
                }
                x = a.next().ok()?;
            }
            (_, Some((j, rb, at))) => {
                if !push(j, Some((at, rb)), &mut out) {
                    return None;
                }
                y = b.next().ok()?;
            }
        }
    }
    // The blacklist's dimension names follow the records: a change there
    // changes every table's blacklist lookups (a full build).
    (old.get(a.pos..)? == new.get(b.pos..)?).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Action, Algorithm, Condition, Strategy, Unit, WarmUp};
    use crate::core::shm::segment::{encode_payload, Published};

    fn strategy(id: u32, api: &str, rate: u64) -> Published {
        let s = Strategy {
            id,
            conditions: vec![Condition::new("api", api)],
            algorithm: Algorithm::FixedWindow,
            rate,
            per: Unit::Minute,
            burst: 0,
            action: Action::Reject { status: None },
            enabled: true,
            warm_up: WarmUp::NONE,
            priority: 0,
            name: format!("s{id}"),
            each: Default::default(),
            response: Default::default(),
            tz: Default::default(),
            ban: Default::default(),
        };
        Published {
            strategy: s,
            slot: id,
            generation: 1,
        }
    }

    fn payload(list: &[Published], bl: &[&str]) -> (Vec<u8>, u32) {
        let bl: Vec<String> = bl.iter().map(|s| s.to_string()).collect();
        (encode_payload(list, &bl), list.len() as u32)
    }

    fn ids(c: &Changed) -> Vec<u32> {
        c.iter().map(|x| x.0).collect()
    }

    fn table(n: u32) -> Vec<Published> {
        (1..=n)
            .map(|i| strategy(i * 2, &format!("/a{i}"), 10))
            .collect()
    }

    #[test]
    fn added_updated_removed_and_disabled_ids_are_found_in_order() {
        let base = table(100);
        let (old, oc) = payload(&base, &[]);
        assert_eq!(changed_ids(&old, oc, &old, oc, 64).unwrap().len(), 0);
        let mut next = base.clone();
        next.insert(10, strategy(21, "/new", 1)); // added between 20 and 22
        next[3].strategy.rate = 11; // updated
        next[5].strategy.enabled = false; // disabled
        next.retain(|p| p.strategy.id != 150); // removed
        next.push(strategy(1000, "/last", 1)); // added at the end
        let (new, nc) = payload(&next, &[]);
        let got = changed_ids(&old, oc, &new, nc, 64).unwrap();
        assert_eq!(ids(&got), [8, 12, 21, 150, 1000]);
        // Where each record is in the new payload (150: removed).
        for &(id, at) in &got {
            match at {
                Some((from, to)) => {
                    let got = u32::from_le_bytes(new[from + 4..from + 8].try_into().unwrap());
                    assert_eq!(got, id);
                    assert_eq!(
                        u32::from_le_bytes(new[from..from + 4].try_into().unwrap()) as usize,
                        to - from
                    );
                }
                None => assert_eq!(id, 150),
            }
        }
        // The other way round: the same ids.
        let back = changed_ids(&new, nc, &old, oc, 64).unwrap();
        assert_eq!(ids(&back), [8, 12, 21, 150, 1000]);
        // A new stat slot or generation is a change too.
        let mut moved = base.clone();
        moved[0].generation = 2;
        let (m, mc) = payload(&moved, &[]);
        assert_eq!(ids(&changed_ids(&old, oc, &m, mc, 64).unwrap()), [2]);
    }

    #[test]
    fn more_changes_than_the_bound_or_other_blacklist_dimensions_give_none() {
        let base = table(100);
        let (old, oc) = payload(&base, &[]);
        let mut next = base.clone();
        for p in next.iter_mut().take(5) {
            p.strategy.rate += 1;
        }
        let (new, nc) = payload(&next, &[]);
        assert_eq!(changed_ids(&old, oc, &new, nc, 5).unwrap().len(), 5);
        assert!(changed_ids(&old, oc, &new, nc, 4).is_none());
        let (bl, bc) = payload(&base, &["userid"]);
        assert!(changed_ids(&old, oc, &bl, bc, 64).is_none());
        // Everything removed: every id, within the bound or not.
        let (empty, ec) = payload(&[], &[]);
        assert_eq!(changed_ids(&old, oc, &empty, ec, 100).unwrap().len(), 100);
        assert!(changed_ids(&old, oc, &empty, ec, 99).is_none());
    }

    #[test]
    fn hostile_payloads_give_none_and_never_panic() {
        let base = table(20);
        let (old, oc) = payload(&base, &[]);
        // Counts the bytes cannot hold.
        assert!(changed_ids(&old, oc, &old, u32::MAX, 64).is_none());
        assert!(changed_ids(&old, oc + 1, &old, oc, 64).is_none());
        // A record length past the end, too short, not a multiple of 8.
        for len in [u32::MAX, old.len() as u32 + 8, 8, 57] {
            let mut bad = old.clone();
            bad[..4].copy_from_slice(&len.to_le_bytes());
            assert!(changed_ids(&old, oc, &bad, oc, 64).is_none(), "{len}");
        }
        // Ids out of order (the second record's id below the first's).
        let first = u32::from_le_bytes(old[..4].try_into().unwrap()) as usize;
        let mut bad = old.clone();
        bad[first + 4..first + 8].copy_from_slice(&1u32.to_le_bytes());
        assert!(changed_ids(&old, oc, &bad, oc, 64).is_none());
        // Truncated anywhere, and random bytes: no panic.
        for cut in 0..old.len() {
            let _ = changed_ids(&old, oc, &old[..cut], oc, 64);
        }
        let mut rng = crate::core::test_rng::Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2000 {
            let mut junk = old.clone();
            for _ in 0..4 {
                let x = rng.next();
                let at = (x as usize) % junk.len();
                junk[at] = (x >> 32) as u8;
            }
            let _ = changed_ids(&old, oc, &junk, oc, 64);
            let _ = changed_ids(&junk, oc, &old, oc, 64);
        }
    }
}
