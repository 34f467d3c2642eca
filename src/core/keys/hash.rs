//! The key table's hashes: SipHash-1-3 (Aumasson and Bernstein), which
//! turns the file's 128-bit secret into the key hash's four mixing keys
//! once per mapping, and [`Mix`], the keyed multiply-fold hash a request's
//! key goes through (a few instructions a word instead of SipHash's
//! rounds).
//!
//! # Why a multiply-fold hash is enough here (attack model)
//!
//! What the hash must resist is an outsider choosing keys (addresses, user
//! names, query values) that land in one probe range, to fill it and force
//! `on_full` for a victim, or that share a tag with a limited key. The
//! outsider never sees a hash value or a position: the only signal is
//! indirect (a range that is full, after eight limited keys share it),
//! so an attack would have to predict positions offline. [`Mix`] is the
//! folded-multiply construction of foldhash and wyhash (the 128-bit
//! product of the state xor a word with a secret multiplier, its halves
//! xored), with four 64-bit keys derived from the 128-bit per-file secret
//! by SipHash, so the keys are pseudo-random and unknown outside; the
//! state starts from a secret-dependent value and the strategy id, and a
//! final fold with two further keys hides the last state. Predicting where
//! a chosen key lands means knowing those keys (2¹²⁸ candidates through the
//! SipHash derivation), the property the issue asks for ("not predictable
//! from outside"). It is not a MAC and needs not be: nothing is
//! authenticated with it. Collisions of the 32-bit tag inside one range
//! stay as rare as before (a pseudo-random 64-bit output) and can only
//! over-limit.

#[derive(Clone, Copy)]
pub struct Sip13 {
    v: [u64; 4],
    tail: u64,
    ntail: u32,
    len: u64,
}

#[inline(always)]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

impl Sip13 {
    #[inline]
    pub fn new(key: [u64; 2]) -> Sip13 {
        Sip13 {
            v: [
                key[0] ^ 0x736f_6d65_7073_6575,
                key[1] ^ 0x646f_7261_6e64_6f6d,
                key[0] ^ 0x6c79_6765_6e65_7261,
                key[1] ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }

    #[inline(always)]
    fn block(&mut self, m: u64) {
        self.v[3] ^= m;
        round(&mut self.v);
        self.v[0] ^= m;
    }

    pub fn write(&mut self, bytes: &[u8]) {
        self.len = self.len.wrapping_add(bytes.len() as u64);
        let mut rest = bytes;
        if self.ntail > 0 {
            while self.ntail < 8 {
                let Some((&b, r)) = rest.split_first() else {
                    return;
                };
                self.tail |= (b as u64) << (8 * self.ntail);
                self.ntail += 1;
                rest = r;
            }
            let m = self.tail;
            self.block(m);
            self.tail = 0;
            self.ntail = 0;
        }
        let mut chunks = rest.chunks_exact(8);
        for c in &mut chunks {
            self.block(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for (i, &b) in chunks.remainder().iter().enumerate() {
            self.tail |= (b as u64) << (8 * i);
        }
        self.ntail = chunks.remainder().len() as u32;
    }

    /// Appends one 64-bit word (little-endian). When everything written so
    /// far is whole words (the key table writes only words), this is one
    /// compression round, no byte shuffling.
    #[inline(always)]
    pub fn word(&mut self, w: u64) {
        if self.ntail == 0 {
            self.len = self.len.wrapping_add(8);
            self.block(w);
        } else {
            self.write(&w.to_le_bytes());
        }
    }

    #[inline(always)]
    pub fn finish(mut self) -> u64 {
        let b = ((self.len & 0xff) << 56) | self.tail;
        self.block(b);
        self.v[2] ^= 0xff;
        for _ in 0..3 {
            round(&mut self.v);
        }
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

/// The four mixing keys of [`Mix`], derived from a file's 128-bit
/// secret (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MixKeys([u64; 4]);

impl std::fmt::Debug for MixKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MixKeys(..)") // never the keys
    }
}

impl MixKeys {
    /// SipHash-1-3 under `secret` of the words 1..=4, multipliers forced
    /// odd (a multiplier with low zero bits would drop input bits).
    pub fn from_secret(secret: [u8; 16]) -> MixKeys {
        let key = [
            u64::from_le_bytes(secret[..8].try_into().expect("8")),
            u64::from_le_bytes(secret[8..].try_into().expect("8")),
        ];
        let k = |i: u64| {
            let mut h = Sip13::new(key);
            h.word(0x6b65_7973_6d69_7800 | i); // "keysmix" + i
            h.finish()
        };
        MixKeys([k(1), k(2) | 1, k(3), k(4) | 1])
    }
}

/// The 128-bit product of `a` and `b`, its two halves xored.
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// A keyed multiply-fold hash over 64-bit words (see the module
/// documentation): one multiplication a word, two to finish.
#[derive(Clone, Copy)]
pub struct Mix {
    acc: u64,
    k: MixKeys,
}

impl Mix {
    /// Starts a hash whose first word is `first` (the strategy id).
    #[inline]
    pub fn new(k: MixKeys, first: u64) -> Mix {
        Mix {
            acc: fold(k.0[0] ^ first, k.0[1]),
            k,
        }
    }

    /// Appends one word.
    #[inline(always)]
    pub fn word(&mut self, w: u64) {
        self.acc = fold(self.acc ^ w, self.k.0[1]);
    }

    /// Appends `bytes` as whole words, the last one zero-padded (callers
    /// write the length first, so the padding is unambiguous).
    #[inline]
    pub fn padded(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(b));
        }
    }

    #[inline(always)]
    pub fn finish(self) -> u64 {
        fold(self.acc ^ self.k.0[2], self.k.0[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of the reference implementation (github.com/veorq/SipHash,
    /// one compression round, three finalisation rounds), key all zero,
    /// messages 00 01 02 … of length 0 and 1.
    #[test]
    fn reference_vectors() {
        let msg: Vec<u8> = (0..16).collect();
        for (n, e) in [(0, 0xd1fb_a762_150c_532c_u64), (1, 0x68a9_1412_8e01_e473)] {
            let mut h = Sip13::new([0, 0]);
            h.write(&msg[..n]);
            assert_eq!(h.finish(), e, "length {n}");
        }
        let key = [1, 2];
        // Split writes give the same result as one.
        let mut a = Sip13::new(key);
        a.write(&msg[..3]);
        a.write(&msg[3..11]);
        a.write(&msg[11..]);
        let mut b = Sip13::new(key);
        b.write(&msg);
        assert_eq!(a.finish(), b.finish());
    }

    /// The mix depends on every word, on their order and on the secret;
    /// its outputs spread over both halves (line and tag).
    #[test]
    fn mix_is_keyed_and_spreads() {
        let k1 = MixKeys::from_secret([7; 16]);
        let k2 = MixKeys::from_secret([8; 16]);
        let h = |k: MixKeys, ws: &[u64]| {
            let mut m = Mix::new(k, 1);
            for &w in ws {
                m.word(w);
            }
            m.finish()
        };
        assert_ne!(h(k1, &[1, 2]), h(k1, &[2, 1]));
        assert_ne!(h(k1, &[1, 2]), h(k2, &[1, 2]));
        assert_ne!(h(k1, &[0]), h(k1, &[0, 0]));
        assert_eq!(h(k1, &[5, 6]), h(k1, &[5, 6]));
        // 4,096 consecutive IPv4 words: the high halves (positions) of
        // a 1,024-line table and the low halves (tags) both spread.
        let mut lines = std::collections::HashSet::new();
        let mut tags = std::collections::HashSet::new();
        for i in 0..4096u64 {
            let v = h(k1, &[(0x0a00_0000 + i) << 32 | 32 << 8 | 4]);
            lines.insert(((v >> 32) * 1024) >> 32);
            tags.insert(v as u32);
        }
        assert!(lines.len() > 950, "{} lines of 1,024", lines.len());
        assert_eq!(tags.len(), 4096);
    }
}
