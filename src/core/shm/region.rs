//! A bounds-checked window onto shared memory.
//!
//! Every byte of the shared-memory file may be written by another process at
//! any time, so the core never forms `&[u8]` or `&mut` references into it:
//! all access goes through atomics (`AtomicU64` / `AtomicU32`) at checked,
//! aligned offsets. That keeps concurrent access free of data races in
//! Rust's memory model and makes out-of-bounds access impossible: an offset
//! past the end is `None`, never a read.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A borrowed, 8-byte-aligned range of shared memory.
#[derive(Clone, Copy)]
pub struct Region<'a> {
    ptr: *mut u8,
    len: usize,
    _life: PhantomData<&'a AtomicU64>,
}

// SAFETY: a Region only hands out atomics, which are Sync; the memory it
// points to outlives 'a by construction (see `from_raw`).
unsafe impl Send for Region<'_> {}
// SAFETY: as above.
unsafe impl Sync for Region<'_> {}

impl<'a> Region<'a> {
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `len`
    /// bytes for the lifetime `'a`, and only ever accessed atomically by
    /// anyone else while this region exists.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Region<'a> {
        debug_assert_eq!(ptr as usize % 8, 0);
        Region {
            ptr,
            len,
            _life: PhantomData,
        }
    }

    /// Process-local words holding `bytes` (little-endian, the last word
    /// zero-padded): arbitrary input made into a region for fuzzing.
    pub fn words_from_bytes(bytes: &[u8]) -> Vec<AtomicU64> {
        bytes
            .chunks(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                AtomicU64::new(u64::from_le_bytes(b))
            })
            .collect()
    }

    /// A region over process-local atomics (tests, benchmarks, fuzzing).
    pub fn from_atomics(words: &'a [AtomicU64]) -> Region<'a> {
        // SAFETY: the slice is aligned, valid for its length and only
        // accessible through atomics.
        unsafe { Region::from_raw(words.as_ptr() as *mut u8, std::mem::size_of_val(words)) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The sub-region `[off, off + len)`, if it lies inside and is aligned.
    pub fn sub(&self, off: u64, len: u64) -> Option<Region<'a>> {
        let off = usize::try_from(off).ok()?;
        let len = usize::try_from(len).ok()?;
        let end = off.checked_add(len)?;
        if end > self.len || off % 8 != 0 {
            return None;
        }
        // SAFETY: inside our own range, aligned, same lifetime.
        Some(unsafe { Region::from_raw(self.ptr.add(off), len) })
    }

    /// The 64-bit word at `off`, if it lies inside and is aligned.
    #[inline]
    pub fn u64_at(&self, off: usize) -> Option<&'a AtomicU64> {
        self.atomic_at(off)
    }

    /// The atomic word (or array of words) `T` at `off`, if it lies inside
    /// and is aligned for `T`. Only for `T` made of atomics (`AtomicU64`,
    /// `AtomicU32`, arrays of them): the memory is shared with other
    /// processes and only ever accessed atomically.
    #[inline(always)]
    fn atomic_at<T>(&self, off: usize) -> Option<&'a T> {
        if off % std::mem::align_of::<T>() != 0
            || off.checked_add(std::mem::size_of::<T>())? > self.len
        {
            return None;
        }
        // SAFETY: in bounds and aligned for T (checked above); T is made of
        // atomics (see above), so it has their layout; the memory is valid
        // for 'a and only accessed atomically (contract of `from_raw`).
        Some(unsafe { &*(self.ptr.add(off) as *const T) })
    }

    /// `N` consecutive 64-bit words at `off`, if they lie inside and are
    /// aligned: one bounds check for a whole record.
    #[inline]
    pub fn words_at<const N: usize>(&self, off: usize) -> Option<&'a [AtomicU64; N]> {
        // AtomicU64 arrays have the layout of N consecutive words.
        self.atomic_at(off)
    }

    /// The region as consecutive records of `N` 64-bit words (a tail
    /// shorter than a record left out): index a record without an offset
    /// check of its own.
    #[inline]
    pub fn records<const N: usize>(&self) -> &'a [[AtomicU64; N]] {
        if N == 0 {
            return &[];
        }
        // SAFETY: `ptr` is 8-byte aligned and valid for `len` bytes for 'a
        // (contract of `from_raw`); `[AtomicU64; N]` has the layout and
        // alignment of N consecutive words and the count is rounded down,
        // so the slice lies inside; the memory is only accessed atomically.
        unsafe { std::slice::from_raw_parts(self.ptr as *const [AtomicU64; N], self.len / (8 * N)) }
    }

    /// The 32-bit word at `off`, if it lies inside and is aligned.
    #[inline]
    pub fn u32_at(&self, off: usize) -> Option<&'a AtomicU32> {
        self.atomic_at(off)
    }

    /// Relaxed load of the word at `off`; 0 when out of range.
    #[inline]
    pub fn load(&self, off: usize) -> u64 {
        self.u64_at(off)
            .map(|w| w.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Relaxed store; returns false when out of range.
    #[inline]
    pub fn store(&self, off: usize, v: u64) -> bool {
        match self.u64_at(off) {
            Some(w) => {
                w.store(v, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Copies `dst.len()` bytes from `off` (8-aligned) with relaxed 64-bit
    /// loads. Returns false, copying nothing, when the range padded to whole
    /// words is not inside the region.
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) -> bool {
        let padded = dst.len().div_ceil(8) * 8;
        let Some(end) = off.checked_add(padded) else {
            return false;
        };
        if off % 8 != 0 || end > self.len {
            return false;
        }
        // Whole words first (a plain store each, no copy call per word),
        // then the partial one.
        let mut words = dst.chunks_exact_mut(8);
        for (i, chunk) in (&mut words).enumerate() {
            chunk.copy_from_slice(&self.load(off + i * 8).to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let n = tail.len();
            let v = self.load(off + padded - 8).to_le_bytes();
            tail.copy_from_slice(&v[..n]);
        }
        true
    }

    /// Writes `src` at `off` (8-aligned) with relaxed 64-bit stores; a
    /// trailing partial word is zero-padded. Returns false when the padded
    /// range is not inside the region.
    pub fn write_bytes(&self, off: usize, src: &[u8]) -> bool {
        let padded = src.len().div_ceil(8) * 8;
        let Some(end) = off.checked_add(padded) else {
            return false;
        };
        if off % 8 != 0 || end > self.len {
            return false;
        }
        // SAFETY: `[off, end)` is inside the region and `off` 8-aligned
        // (checked above; the mapping is page-aligned), so it holds
        // `padded / 8` aligned words, only ever accessed atomically
        // (contract of `from_raw`). One bounds check for the whole copy
        // (issue 29: a 10,000-strategy payload is 100,000 words).
        let words = unsafe {
            std::slice::from_raw_parts(self.ptr.add(off) as *const AtomicU64, padded / 8)
        };
        let mut chunks = src.chunks_exact(8);
        for (w, chunk) in words.iter().zip(&mut chunks) {
            let mut buf = [0u8; 8];
            buf.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(buf), Ordering::Relaxed);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            words[padded / 8 - 1].store(u64::from_le_bytes(buf), Ordering::Relaxed);
        }
        true
    }

    /// Zeroes `[off, off + len)` (both 8-aligned).
    pub fn zero(&self, off: usize, len: usize) -> bool {
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        if off % 8 != 0 || len % 8 != 0 || end > self.len {
            return false;
        }
        let mut o = off;
        while o < end {
            self.store(o, 0);
            o += 8;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment_are_checked() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let r = Region::from_atomics(&words);
        assert_eq!(r.len(), 32);
        assert!(r.u64_at(24).is_some());
        assert!(r.u64_at(25).is_none());
        assert!(r.u64_at(32).is_none());
        assert!(r.u64_at(usize::MAX - 3).is_none());
        assert!(r.sub(8, 24).is_some());
        assert!(r.sub(8, 25).is_none());
        assert!(r.sub(u64::MAX, 8).is_none());
        r.store(16, u64::MAX);
        assert!(r.write_bytes(8, b"hello world"));
        // The trailing partial word is zero-padded.
        assert_eq!(r.load(16), u64::from_le_bytes(*b"rld\0\0\0\0\0"));
        assert!(r.write_bytes(32, &[]));
        let mut out = [0u8; 11];
        assert!(r.read_bytes(8, &mut out));
        assert_eq!(&out, b"hello world");
        assert!(!r.read_bytes(24, &mut [0u8; 9]));
        assert!(!r.write_bytes(24, &[1u8; 9]));
        let mut tail = [0u8; 3];
        assert!(r.read_bytes(24, &mut tail));
        assert!(r.zero(0, 32));
        assert_eq!(r.load(8), 0);
    }
}
