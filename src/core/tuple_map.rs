//! Tuple-space groups of the matcher: strategies of one *shape* (the set of
//! dimensions they constrain), found by one hash probe of the request's
//! value tuple over that shape.
//!
//! The matcher anchors every strategy under one of its values (see
//! [`table`](super::table)). When many strategies share an anchor value
//! (a grid such as `user=ui AND api=aj`: each user value anchors every
//! api), checking them one by one costs a compare per candidate. Such a
//! value instead lists its *groups* — one per shape among the strategies
//! anchored there — and a request probes each group once with the tuple of
//! its interned value ids over the group's dimensions: the cost is one
//! probe per shape, whatever the number of candidates.
//!
//! The keys are tuples of interned ids (`u32`, already resolved by the
//! request's one lookup per dimension), so a probe hashes a few integers
//! and compares a few integers: no byte string is hashed twice.

use smallvec::SmallVec;

use super::value_map::{mix, K1, K2, SEED};

/// A strategy's value ids over a group's dimensions (inline up to four:
/// building the groups of a large table allocates nothing per strategy).
pub type Tuple = SmallVec<[u32; 4]>;

/// An id that no value has (the request's value is absent or named by no
/// strategy): a tuple holding it matches nothing.
pub const NONE: u32 = u32::MAX;

/// The strategies of one shape anchored in one dimension, by the tuple of
/// their value ids over the shape's dimensions. Built once, then only read.
pub struct Group {
    /// The shape's dimensions, ascending.
    dims: Box<[u8]>,
    /// `(hash tag, entry)`, tag 0 = empty; power of two in length, at most
    /// half full.
    slots: Box<[(u32, u32)]>,
    /// Entry `e`'s tuple: `keys[e * k..(e + 1) * k]` (`k = dims.len()`),
    /// for shapes of more than two dimensions.
    keys: Box<[u32]>,
    /// Entry `e`'s tuple packed in one word ([`pack`]), for shapes of one
    /// or two dimensions (most tables): one multiply to hash, one compare.
    pairs: Box<[u64]>,
    /// Entry `e`'s strategies: `members[spans[e].0..spans[e].1]`, ascending.
    spans: Box<[(u32, u32)]>,
    members: Box<[u32]>,
}

#[inline]
fn tag(h: u64) -> u32 {
    (h >> 32) as u32 | 1
}

/// The hash of a tuple of ids.
#[inline(always)]
fn hash_ids(ids: impl Iterator<Item = u32>) -> u64 {
    let mut h = SEED;
    for v in ids {
        h = mix(h ^ u64::from(v), K1);
    }
    mix(h, K2)
}

/// A tuple of one or two ids in one word, the second id (or 0) high: all
/// tuples of a group have the group's length, so the words are distinct.
#[inline(always)]
fn pack(tuple: &[u32]) -> u64 {
    u64::from(tuple[0]) | tuple.get(1).map_or(0, |&b| u64::from(b) << 32)
}

#[inline(always)]
fn hash_pair(key: u64) -> u64 {
    mix(key ^ SEED, K1)
}

impl Group {
    /// A group of `dims` (ascending) holding `rows`: each a strategy index
    /// with its value ids over `dims`, in that order (`tuple.len() ==
    /// dims.len()`).
    pub fn build(dims: Vec<u8>, mut rows: Vec<(Tuple, u32)>) -> Group {
        let k = dims.len();
        rows.sort_unstable();
        let mut keys: Vec<u32> = Vec::new();
        let mut spans: Vec<(u32, u32)> = Vec::new();
        let mut members: Vec<u32> = Vec::with_capacity(rows.len());
        for (i, (tuple, si)) in rows.iter().enumerate() {
            debug_assert_eq!(tuple.len(), k);
            if i == 0 || rows[i - 1].0 != *tuple {
                keys.extend_from_slice(tuple);
                spans.push((members.len() as u32, members.len() as u32));
            }
            members.push(*si);
            if let Some(last) = spans.last_mut() {
                last.1 = members.len() as u32;
            }
        }
        let pairs: Vec<u64> = if k <= 2 {
            keys.chunks(k.max(1)).map(pack).collect()
        } else {
            Vec::new()
        };
        if k <= 2 {
            keys.clear();
        }
        let n = (spans.len() * 2).next_power_of_two().max(2);
        let mut slots = vec![(0u32, 0u32); n].into_boxed_slice();
        let mask = n - 1;
        for e in 0..spans.len() {
            let h = match pairs.get(e) {
                Some(&key) => hash_pair(key),
                None => hash_ids(keys[e * k..(e + 1) * k].iter().copied()),
            };
            let mut i = h as usize & mask;
            while slots[i].0 != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = (tag(h), e as u32);
        }
        Group {
            dims: dims.into_boxed_slice(),
            slots,
            keys: keys.into_boxed_slice(),
            pairs: pairs.into_boxed_slice(),
            spans: spans.into_boxed_slice(),
            members: members.into_boxed_slice(),
        }
    }

    /// The strategies whose tuple is the request's: `req[d]` is the
    /// request's value id of dimension `d` ([`NONE`] if absent).
    #[inline]
    pub fn find(&self, req: &[u32]) -> &[u32] {
        let dims = &self.dims[..];
        if dims.len() <= 2 {
            return self.find_pair(req);
        }
        let mut h = SEED;
        for &d in dims {
            let v = req[d as usize];
            if v == NONE {
                return &[];
            }
            h = mix(h ^ u64::from(v), K1);
        }
        let h = mix(h, K2);
        let t = tag(h);
        let mask = self.slots.len() - 1;
        let k = dims.len();
        let mut i = h as usize & mask;
        loop {
            let (st, e) = self.slots[i];
            if st == 0 {
                return &[];
            }
            if st == t {
                let e = e as usize;
                let key = &self.keys[e * k..(e + 1) * k];
                if dims.iter().zip(key).all(|(&d, &v)| req[d as usize] == v) {
                    let (a, b) = self.spans[e];
                    return &self.members[a as usize..b as usize];
                }
            }
            i = (i + 1) & mask;
        }
    }
}

impl Group {
    /// [`find`](Self::find) for a shape of one or two dimensions.
    #[inline]
    fn find_pair(&self, req: &[u32]) -> &[u32] {
        let a = req[self.dims[0] as usize];
        let b = match self.dims.get(1) {
            Some(&d) => req[d as usize],
            None => 0,
        };
        if a == NONE || b == NONE {
            return &[];
        }
        let key = u64::from(a) | u64::from(b) << 32;
        let h = hash_pair(key);
        let t = tag(h);
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let (st, e) = self.slots[i];
            if st == 0 {
                return &[];
            }
            if st == t && self.pairs[e as usize] == key {
                let (from, to) = self.spans[e as usize];
                return &self.members[from as usize..to as usize];
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    #[test]
    fn finds_the_strategies_of_the_request_tuple_only() {
        // Dimensions 0 and 2; a 30 × 30 grid, two strategies on (3, 4).
        let mut rows = Vec::new();
        for i in 0..30u32 {
            for j in 0..30u32 {
                rows.push((smallvec![i, 100 + j], i * 30 + j));
            }
        }
        rows.push((smallvec![3, 104], 5000));
        let g = Group::build(vec![0, 2], rows);
        let mut req = [3, 7, 104];
        assert_eq!(g.find(&req), &[3 * 30 + 4, 5000]);
        req[1] = NONE; // a dimension outside the shape does not matter
        assert_eq!(g.find(&req), &[3 * 30 + 4, 5000]);
        req[2] = 130;
        assert!(g.find(&req).is_empty());
        req[2] = NONE;
        assert!(g.find(&req).is_empty());
        req = [29, 0, 129];
        assert_eq!(g.find(&req), &[29 * 30 + 29]);
    }

    #[test]
    fn one_and_three_dimension_shapes() {
        let g = Group::build(
            vec![1],
            (0..50u32).map(|i| (smallvec![i], 1000 + i)).collect(),
        );
        assert_eq!(g.find(&[NONE, 7]), &[1007]);
        assert!(g.find(&[7, 50]).is_empty());
        assert!(g.find(&[7, NONE]).is_empty());
        let mut rows = Vec::new();
        for i in 0..10u32 {
            for j in 0..10u32 {
                rows.push((smallvec![i, 100 + j, 200 + (i + j) % 3], i * 10 + j));
            }
        }
        let g = Group::build(vec![0, 1, 3], rows);
        assert_eq!(g.find(&[4, 105, NONE, 200]), &[45]);
        assert!(g.find(&[4, 105, NONE, 201]).is_empty());
        assert!(g.find(&[4, 105, 0, NONE]).is_empty());
    }
}
