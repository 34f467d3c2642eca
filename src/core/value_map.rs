//! The matcher's value maps: a request value (bytes, or an address as a
//! `u128`) → the entry the table built for it.
//!
//! Built once per published table, then only read, once per dimension per
//! request, so lookups are what counts: open addressing with linear
//! probing in a power-of-two array kept at most half full; each slot holds
//! 32 bits of the hash and the entry's index, so a probe compares the key
//! only when the hash bits agree. Short keys (URIs, user ids) are hashed
//! and compared a machine word at a time, inline, without the general
//! hasher and `memcmp` call a `HashMap<Box<[u8]>, _>` costs (about 50
//! instructions per nginx request, measured with callgrind).
//!
//! The keys are the operators' strategy values, not the clients': a
//! client chooses only what it looks up, and with the table at most half
//! full a lookup stops at the first empty slot.

use std::borrow::Borrow;

/// A key type the map can hold: hashed and compared in its borrowed form,
/// stored owned.
pub trait MapKey {
    /// How the map stores it.
    type Owned: Borrow<Self>;
    fn hash(&self) -> u64;
    fn same(&self, other: &Self) -> bool;
    fn to_owned_key(&self) -> Self::Owned;
}

impl MapKey for [u8] {
    type Owned = Box<[u8]>;

    #[inline]
    fn hash(&self) -> u64 {
        hash_bytes(self)
    }

    #[inline]
    fn same(&self, other: &[u8]) -> bool {
        bytes_eq(self, other)
    }

    fn to_owned_key(&self) -> Box<[u8]> {
        self.into()
    }
}

impl MapKey for u128 {
    type Owned = u128;

    #[inline]
    fn hash(&self) -> u64 {
        let lo = *self as u64;
        let hi = (*self >> 64) as u64;
        mix(mix(lo ^ SEED, K1) ^ hi, K2)
    }

    #[inline]
    fn same(&self, other: &u128) -> bool {
        self == other
    }

    fn to_owned_key(&self) -> u128 {
        *self
    }
}

/// Key → value, insert-only (see the module documentation).
pub struct ValueMap<K: MapKey + ?Sized, V> {
    /// `(hash tag, entry index)`; tag 0 = empty. A power of two in length,
    /// never full.
    slots: Box<[(u32, u32)]>,
    keys: Vec<K::Owned>,
    values: Vec<V>,
}

impl<K: MapKey + ?Sized, V> Default for ValueMap<K, V> {
    fn default() -> Self {
        ValueMap {
            // One empty slot: a lookup in an empty map needs no special case.
            slots: Box::new([(0, 0)]),
            keys: Vec::new(),
            values: Vec::new(),
        }
    }
}

/// The slot tag of a hash: its high half, never 0.
#[inline]
fn tag(h: u64) -> u32 {
    (h >> 32) as u32 | 1
}

impl<K: MapKey + ?Sized, V> ValueMap<K, V> {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The value of `key` (inlined: the request path makes one call per
    /// dimension, and the nginx module's handler is measured in
    /// instructions).
    #[inline(always)]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.values[i])
    }

    /// The index of `key`'s entry (inlined: the request path makes one
    /// call per dimension).
    #[inline(always)]
    fn find(&self, key: &K) -> Option<usize> {
        self.find_hashed(key, key.hash())
    }

    /// [`find`](Self::find) with `key`'s hash `h` given.
    #[inline(always)]
    fn find_hashed(&self, key: &K, h: u64) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let t = tag(h);
        let mut i = h as usize & mask;
        loop {
            let (st, e) = self.slots[i];
            if st == 0 {
                return None;
            }
            if st == t && key.same(self.keys[e as usize].borrow()) {
                return Some(e as usize);
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`, inserting `make()` first if it is absent.
    pub fn get_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> &mut V {
        self.get_or_insert_hashed(key, key.hash(), make)
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) with `key`'s hash
    /// `h` (`key.hash()`) computed by the caller (a table build hashes
    /// each value once, ahead, to [`prefetch`](Self::prefetch) its slot).
    pub fn get_or_insert_hashed(&mut self, key: &K, h: u64, make: impl FnOnce() -> V) -> &mut V {
        debug_assert_eq!(h, key.hash());
        let i = match self.find_hashed(key, h) {
            Some(i) => i,
            None => {
                if (self.keys.len() + 1) * 2 > self.slots.len() {
                    self.grow();
                }
                let i = self.keys.len();
                self.keys.push(key.to_owned_key());
                self.values.push(make());
                self.place(h, i as u32);
                i
            }
        };
        &mut self.values[i]
    }

    /// Hints that the slot of hash `h` is about to be probed: a build
    /// inserting many distinct values (a cache miss each, the slots of a
    /// large map being out of cache) asks for the slot some inserts ahead,
    /// so that its miss overlaps the inserts in between.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        let slot = &self.slots[h as usize & (self.slots.len() - 1)];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch only hints the cache: it reads nothing the
        // program sees and never faults; the address is one of our slots.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>((slot as *const (u32, u32)).cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// The key of entry `i` (entries are numbered in insertion order:
    /// the first inserted is 0).
    pub fn key_at(&self, i: usize) -> &K {
        self.keys[i].borrow()
    }

    /// Entry `i`'s key, if there is an entry `i`.
    #[inline]
    pub fn key_get(&self, i: usize) -> Option<&K> {
        self.keys.get(i).map(|k| k.borrow())
    }

    /// Makes room for `additional` more keys, so that inserting them
    /// never re-places the entries (a table build knows how many values
    /// it may insert).
    pub fn reserve(&mut self, additional: usize) {
        let want = ((self.keys.len() + additional) * 2).next_power_of_two();
        self.keys.reserve(additional);
        self.values.reserve(additional);
        if want > self.slots.len() {
            self.resize(want);
        }
    }

    /// Shrinks a map [`reserve`](Self::reserve) made much larger than its
    /// entries need (fewer distinct values than conditions): the lookups'
    /// array back to at most four times the entries.
    pub fn shrink_to_fit(&mut self) {
        let want = ((self.keys.len() + 1) * 2).next_power_of_two().max(8);
        if self.slots.len() > 2 * want {
            self.resize(want);
        }
        self.keys.shrink_to_fit();
        self.values.shrink_to_fit();
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.values.iter()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.values.iter_mut()
    }

    /// Puts entry `e` (hash `h`) in the first free slot of its probe run.
    fn place(&mut self, h: u64, e: u32) {
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        while self.slots[i].0 != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = (tag(h), e);
    }

    /// Doubles the slot array (at least 8) and re-places every entry.
    fn grow(&mut self) {
        self.resize((self.slots.len() * 2).max(8));
    }

    /// A slot array of `n` (a power of two, more than twice the entries)
    /// with every entry re-placed.
    fn resize(&mut self, n: usize) {
        self.slots = vec![(0, 0); n].into_boxed_slice();
        for e in 0..self.keys.len() {
            let h = self.keys[e].borrow().hash();
            self.place(h, e as u32);
        }
    }
}

pub(crate) const SEED: u64 = 0x243f_6a88_85a3_08d3;
pub(crate) const K1: u64 = 0x9e37_79b9_7f4a_7c15;
pub(crate) const K2: u64 = 0xf135_7aea_2e62_a9c5;

/// 64×64 → 128-bit multiply, folded: every input bit reaches every output bit.
#[inline]
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline]
fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

#[inline]
fn half(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

/// Hashes `b` a word at a time; the last (partial) word is read as the
/// word that ends the key, overlapping the one before.
#[inline]
pub fn hash_bytes(b: &[u8]) -> u64 {
    let n = b.len();
    let mut h = SEED ^ n as u64;
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            h = mix(h ^ word(b, i), K1);
            i += 8;
        }
        h = mix(h ^ word(b, n - 8), K2);
    } else if n >= 4 {
        let x = u64::from(half(b, 0)) << 32 | u64::from(half(b, n - 4));
        h = mix(h ^ x, K2);
    } else if n > 0 {
        let x = u64::from(b[0]) << 16 | u64::from(b[n / 2]) << 8 | u64::from(b[n - 1]);
        h = mix(h ^ x, K2);
    }
    h
}

/// `a == b`, a word at a time (overlapping at the end), inline.
#[inline]
pub fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n >= 4 {
        true => words_eq(a, b),
        false => a.iter().zip(b).all(|(x, y)| x == y),
    }
}

/// [`bytes_eq`], always inlined, a short pair compared without a loop:
/// for a caller out of line that compares once (a negation's check),
/// where a call would cost more than the bytes.
#[inline(always)]
pub fn bytes_eq_inline(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        // Bytes 0, n / 2 and n - 1 are every byte of 1 to 3.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        _ => words_eq(a, b),
    }
}

/// `a == b` for two slices of the same length, at least 4: a word at a
/// time, overlapping at the end.
#[inline(always)]
fn words_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if word(a, i) != word(b, i) {
                return false;
            }
            i += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn finds_what_was_inserted_and_nothing_else() {
        let mut m: ValueMap<[u8], u32> = ValueMap::default();
        assert_eq!(m.get(b"/pay"), None);
        for (i, k) in [&b"/pay"[..], b"", b"u1024", b"/api/v1/orders/create"]
            .iter()
            .enumerate()
        {
            *m.get_or_insert_with(k, || 0) = i as u32;
        }
        assert_eq!(m.len(), 4);
        assert_eq!(m.get(b"/pay"), Some(&0));
        assert_eq!(m.get(b""), Some(&1));
        assert_eq!(m.get(b"/api/v1/orders/create"), Some(&3));
        assert_eq!(m.get(b"/api/v1/orders/creatE"), None);
        assert_eq!(m.get(b"/pa"), None);
        // A second insert of a key keeps its entry.
        assert_eq!(*m.get_or_insert_with(b"u1024", || 9), 2);
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn addresses() {
        let mut m: ValueMap<u128, u32> = ValueMap::default();
        for a in 0..1000u128 {
            *m.get_or_insert_with(&(a << 64 | 0xffff_0a00_0000 | a), || 0) = a as u32;
        }
        for a in 0..1000u128 {
            assert_eq!(m.get(&(a << 64 | 0xffff_0a00_0000 | a)), Some(&(a as u32)));
        }
        assert_eq!(m.get(&0xffff_7f00_0001), None);
    }

    proptest! {
        #[test]
        fn agrees_with_a_hash_map(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..200),
            probes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..50),
        ) {
            let mut ours: ValueMap<[u8], usize> = ValueMap::default();
            let mut std_map: HashMap<Vec<u8>, usize> = HashMap::new();
            for (i, k) in keys.iter().enumerate() {
                let v = *std_map.entry(k.clone()).or_insert(i);
                prop_assert_eq!(*ours.get_or_insert_with(k, || i), v);
            }
            prop_assert_eq!(ours.len(), std_map.len());
            for k in keys.iter().chain(&probes) {
                prop_assert_eq!(ours.get(k), std_map.get(k));
            }
        }

        #[test]
        fn bytes_eq_is_equality(a in proptest::collection::vec(any::<u8>(), 0..40), flip in any::<(usize, u8)>()) {
            let mut b = a.clone();
            prop_assert!(bytes_eq(&a, &b));
            prop_assert!(bytes_eq_inline(&a, &b));
            if !b.is_empty() {
                let i = flip.0 % b.len();
                b[i] ^= flip.1 | 1;
                prop_assert!(!bytes_eq(&a, &b));
                prop_assert!(!bytes_eq_inline(&a, &b));
            }
            let shorter = &a[..a.len().saturating_sub(1)];
            prop_assert!(!bytes_eq(&a, shorter) || a.is_empty());
            prop_assert!(!bytes_eq_inline(&a, shorter) || a.is_empty());
        }
    }
}
