//! Tuple-space groups of the matcher: strategies of one *shape* (the set of
//! dimensions they constrain), found by one hash probe of the request's
//! value tuple over that shape.
//!
//! The matcher anchors every strategy under one of its values (see
//! the `table` module). When many strategies share an anchor value
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
//!
//! A group of two dimensions whose other dimension anchors nothing (a
//! grid anchored under `user`: `api` is only ever checked) is keyed a
//! second way, by the anchor's id and the *bytes* of the other value, so
//! that a request whose only candidates are such a row finds its cell
//! with one hash of its `api` and one probe, without first interning the
//! value (a second hash and probe). That index costs 16 bytes per slot
//! (twice the cells, rounded up to a power of two).

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
    /// For a shape of two dimensions of which one is only ever checked
    /// (the grid `a=ai AND b=bj` anchored under `a`): the entries again,
    /// keyed by the other dimension's id and the *bytes* of the checked
    /// value ([`find_bytes`](Self::find_bytes)), so that a request finds
    /// its cell without interning that value first.
    by_bytes: Option<ByBytes>,
}

/// See [`Group::by_bytes`].
struct ByBytes {
    /// The checked dimension and the other one (the group's anchor).
    dim: u8,
    anchor: u8,
    /// Power of two in length, at most half full.
    slots: Box<[ByteSlot]>,
}

/// One entry of [`ByBytes`]: all a probe reads, in one place.
#[derive(Clone, Copy, Default)]
struct ByteSlot {
    /// Hash tag, 0 = empty.
    tag: u32,
    /// The anchor's value id.
    anchor: u32,
    /// The checked value: the caller's handle on its bytes.
    text: u32,
    /// The entry (`spans`).
    entry: u32,
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

/// A packed pair's id at position `at` (0 or 1) and the other one.
#[inline(always)]
fn unpack(key: u64, at: usize) -> (u32, u32) {
    let (lo, hi) = (key as u32, (key >> 32) as u32);
    if at == 0 {
        (lo, hi)
    } else {
        (hi, lo)
    }
}

#[inline(always)]
fn hash_pair(key: u64) -> u64 {
    mix(key ^ SEED, K1)
}

/// The hash of (an id, a value whose bytes hash to `bytes_hash`).
#[inline(always)]
fn hash_with_bytes(id: u32, bytes_hash: u64) -> u64 {
    mix(bytes_hash ^ u64::from(id), K1)
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
            by_bytes: None,
        }
    }

    /// The shape's dimensions, ascending.
    pub fn dims(&self) -> &[u8] {
        &self.dims
    }

    /// For a shape of two dimensions: keys the entries also by the id of
    /// the value of the dimension other than `dims()[at]` and the bytes of
    /// the value of `dims()[at]`: `text_of(id)` gives [`hash_bytes`] of
    /// value `id`'s bytes and the caller's handle on them
    /// ([`find_bytes`](Self::find_bytes)).
    ///
    /// [`hash_bytes`]: super::value_map::hash_bytes
    pub fn index_bytes(&mut self, at: usize, text_of: impl Fn(u32) -> (u64, u32)) {
        if self.dims.len() != 2 || at > 1 {
            return;
        }
        let mut slots = vec![ByteSlot::default(); self.slots.len()].into_boxed_slice();
        let mask = slots.len() - 1;
        for (e, &key) in self.pairs.iter().enumerate() {
            let (id, anchor) = unpack(key, at);
            let (hash, text) = text_of(id);
            let h = hash_with_bytes(anchor, hash);
            let mut i = h as usize & mask;
            while slots[i].tag != 0 {
                i = (i + 1) & mask;
            }
            let entry = e as u32;
            slots[i] = ByteSlot {
                tag: tag(h),
                anchor,
                text,
                entry,
            };
        }
        self.by_bytes = Some(ByBytes {
            dim: self.dims[at],
            anchor: self.dims[at ^ 1],
            slots,
        });
    }

    /// The dimension found by its bytes ([`index_bytes`](Self::index_bytes))
    /// and the other one (the anchor), found by id.
    #[inline]
    pub fn bytes_dims(&self) -> Option<(u8, u8)> {
        let b = self.by_bytes.as_ref()?;
        Some((b.dim, b.anchor))
    }

    /// The strategies of the cell of `anchor` (the id of the anchor's
    /// value) and of the checked value whose bytes hash to `bytes_hash`
    /// and that `same` accepts (given the handle [`index_bytes`]
    /// recorded: the caller compares the bytes). Nothing for a group not
    /// indexed by bytes.
    ///
    /// [`index_bytes`]: Self::index_bytes
    #[inline]
    pub fn find_bytes(&self, anchor: u32, bytes_hash: u64, same: impl Fn(u32) -> bool) -> &[u32] {
        let Some(b) = &self.by_bytes else {
            return &[];
        };
        let h = hash_with_bytes(anchor, bytes_hash);
        let t = tag(h);
        let mask = b.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let slot = b.slots[i];
            if slot.tag == 0 {
                return &[];
            }
            if slot.tag == t && slot.anchor == anchor && same(slot.text) {
                let (from, to) = self.spans[slot.entry as usize];
                return &self.members[from as usize..to as usize];
            }
            i = (i + 1) & mask;
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
    use super::super::value_map::hash_bytes;
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
    fn a_pair_indexed_by_bytes_finds_the_cell_of_the_anchor_and_the_bytes() {
        // Dimension 1 (anchor ids 0..10) × dimension 4 (ids 100..105, the
        // value of id i being the text "t{i}", handle i - 100).
        let text = |id: u32| format!("t{id}");
        let mut rows = Vec::new();
        for i in 0..10u32 {
            for j in 100..105u32 {
                rows.push((smallvec![i, j], i * 10 + j - 100));
            }
        }
        let mut g = Group::build(vec![1, 4], rows);
        assert_eq!(g.bytes_dims(), None);
        assert!(g.find_bytes(3, hash_bytes(b"t102"), |_| true).is_empty());
        g.index_bytes(1, |id| (hash_bytes(text(id).as_bytes()), id - 100));
        assert_eq!(g.bytes_dims(), Some((4, 1)));
        let find = |anchor: u32, bytes: &str| {
            let same = |handle: u32| text(handle + 100) == bytes;
            g.find_bytes(anchor, hash_bytes(bytes.as_bytes()), same)
                .to_vec()
        };
        assert_eq!(find(3, "t102"), [32]);
        assert_eq!(find(9, "t104"), [94]);
        assert!(find(10, "t102").is_empty(), "no such anchor");
        assert!(find(3, "t105").is_empty(), "no such value");
        assert!(find(3, "t10").is_empty());
        // The ids still find the same cells.
        assert_eq!(g.find(&[NONE, 3, NONE, NONE, 102]), &[32]);
        // A shape of one or three dimensions is not indexed.
        let mut one = Group::build(vec![1], vec![(smallvec![1], 7)]);
        one.index_bytes(0, |_| (0, 0));
        assert_eq!(one.bytes_dims(), None);
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
