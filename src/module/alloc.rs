//! The module's own allocator (issue 29): every Rust allocation of the
//! nginx module — tables, their builders, the worker's state, the helper
//! thread's work — comes from memory this allocator maps itself, never
//! from glibc's `malloc`. nginx's own per-request allocations
//! (`ngx_create_pool` → `posix_memalign`, `malloc`) then find glibc's heap
//! as nginx alone left it: loading, replacing or freeing a table of any
//! size does not change their cost (with the table on glibc's heap, a
//! worker's request pool took other paths through `_int_malloc` and
//! `unlink_chunk`, a few hundred instructions per request up or down
//! depending on what the last table load left behind).
//!
//! Installed as the `#[global_allocator]` of the module only (see
//! `module/mod.rs`); the `rate-ctl` binary keeps the system allocator.
//!
//! * **Small blocks** (up to [`SMALL_MAX`], 64 KiB): 44 size classes, four
//!   per power of two above 128 bytes (16-byte steps below), so a block
//!   wastes at most 20 % of its size. A class keeps a free list of its
//!   returned blocks (the link in the block itself) and carves new blocks
//!   from its current 256 KiB region; regions are cut from 4 MiB chunks
//!   mapped with `mmap`. Small memory is reused, not returned to the
//!   system: a table replaced by one of the same shape reuses its blocks.
//! * **Large blocks**: their own anonymous mapping each (zeroed by the
//!   kernel, so `alloc_zeroed` writes nothing), grown or shrunk in place or
//!   moved by `mremap`. A freed one is kept mapped for reuse by a later
//!   request of its size or up to an eighth less (the surplus tail
//!   unmapped then), at most 16 blocks and 16 MiB together, the oldest
//!   returned to the system (`munmap`) first: the next table build reuses
//!   the replaced table's pages instead of faulting fresh ones in.
//! * **Alignment**: a request aligned to more than 16 bytes (at most a
//!   page) takes the power-of-two class of at least its alignment, whose
//!   blocks sit at multiples of their size from a page-aligned region; a
//!   larger alignment takes a mapping trimmed to it.
//! * **Threads**: one spin lock around the classes (the worker's event
//!   loop and the table loader's helper thread are the only users, and
//!   neither holds it for more than a list pop or a bump); unlocking is
//!   a plain release store. No allocation path panics: a failed `mmap`
//!   returns null, and Rust's allocation-failure handling takes over.
//!
//! The size of every block is recomputed from the `Layout` the caller
//! passes back on `dealloc`/`realloc` (Rust's allocator contract), so
//! blocks carry no header.
//!
//! This file is nginx-free; the ordinary (non-module) build compiles it
//! for its unit tests (`src/lib.rs`).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The page size the regions and mappings are aligned to (x86-64 and
/// aarch64 Linux: 4 KiB base pages; a larger kernel page still gives
/// 4 KiB-aligned addresses).
const PAGE: usize = 4096;
/// The largest block served from the size classes.
pub const SMALL_MAX: usize = 64 * 1024;
/// A class carves its blocks from regions of this size.
const REGION: usize = 256 * 1024;
/// Regions are cut from chunks of this size (one `mmap` each).
const CHUNK: usize = 4 * 1024 * 1024;
/// Classes: 8 of 16-byte steps up to 128, then 4 per power of two up to
/// [`SMALL_MAX`] (128 → 64 KiB: 9 powers).
const CLASSES: usize = 8 + 4 * 9;

/// The class of a block of `size` bytes, at most 16-aligned (`size` in
/// 1..=SMALL_MAX).
#[inline]
const fn class_of(size: usize) -> usize {
    if size <= 128 {
        size.div_ceil(16) - 1
    } else {
        // size in (2^(b-1), 2^b]: four steps of 2^(b-3).
        let b = (usize::BITS - (size - 1).leading_zeros()) as usize;
        let step = 1usize << (b - 3);
        let sub = (size - (1usize << (b - 1))).div_ceil(step);
        8 + (b - 8) * 4 + sub - 1
    }
}

/// The block size of class `c`.
#[inline]
const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 16
    } else {
        let b = (c - 8) / 4 + 8;
        let sub = (c - 8) % 4 + 1;
        (1usize << (b - 1)) + sub * (1usize << (b - 3))
    }
}

/// Where a layout is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Small(usize),
    /// A mapping of this many bytes (a multiple of the page).
    Large(usize),
}

/// The one decision every entry point makes from the layout (the same on
/// `alloc` and on the `dealloc`/`realloc` of that block). `None`: the size
/// rounded up overflows.
#[inline]
fn kind(layout: Layout) -> Option<Kind> {
    // Zero-size requests (which GlobalAlloc callers must not make) get the
    // smallest block rather than undefined behaviour.
    let size = layout.size().max(1);
    let align = layout.align();
    if align <= 16 {
        if size <= SMALL_MAX {
            return Some(Kind::Small(class_of(size)));
        }
    } else if align <= PAGE {
        // A power-of-two class: its blocks are aligned to min(size, PAGE).
        let p = size.max(align).checked_next_power_of_two()?;
        if p <= SMALL_MAX {
            return Some(Kind::Small(class_of(p)));
        }
    }
    Some(Kind::Large(size.checked_add(PAGE - 1)? & !(PAGE - 1)))
}

/// One size class: returned blocks, and the unused part of its region.
#[derive(Clone, Copy)]
struct Class {
    free: *mut u8,
    bump: usize,
    end: usize,
}

struct State {
    classes: [Class; CLASSES],
    /// The unused part of the current chunk.
    chunk_next: usize,
    chunk_end: usize,
    /// Freed large blocks kept mapped for the next table build.
    kept: Kept,
}

/// Large blocks freed and kept for reuse (issue 29): a table build
/// allocates the same large blocks as the build before it (the replaced
/// table's, freed meanwhile), and a fresh mapping costs a page fault per
/// page touched — with 10,000 strategies the build took 1.8 times as long
/// as with glibc's heap. At most [`KEPT_BLOCKS`] blocks of together at most
/// [`KEPT_BYTES`]; the oldest go back to the system first, so memory held
/// for reuse is bounded whatever the sizes.
#[derive(Clone, Copy)]
struct Kept {
    blocks: [(usize, usize, u64); KEPT_BLOCKS],
    bytes: usize,
    stamp: u64,
}

/// Freed large blocks kept at most, and their bytes together (blocks
/// larger than half of it are never kept).
const KEPT_BLOCKS: usize = 16;
const KEPT_BYTES: usize = 16 * 1024 * 1024;

impl Kept {
    const EMPTY: Kept = Kept {
        blocks: [(0, 0, 0); KEPT_BLOCKS],
        bytes: 0,
        stamp: 0,
    };

    /// A kept block of `len` bytes or somewhat more (at most an eighth),
    /// the smallest such: `(address, its length)`.
    fn take(&mut self, len: usize) -> Option<(usize, usize)> {
        let most = len + len / 8;
        let i = (0..KEPT_BLOCKS)
            .filter(|&i| {
                let l = self.blocks[i].1;
                l >= len && l <= most
            })
            .min_by_key(|&i| self.blocks[i].1)?;
        let (p, l, _) = self.blocks[i];
        self.blocks[i] = (0, 0, 0);
        self.bytes -= l;
        Some((p, l))
    }

    /// Keeps the block `p` of `len` bytes; the blocks to unmap instead
    /// (`p` itself when it is too large to keep, or the oldest kept ones,
    /// evicted to make room) go to `out`, their count returned.
    fn put(&mut self, p: usize, len: usize, out: &mut [(usize, usize); KEPT_BLOCKS + 1]) -> usize {
        let mut n = 0;
        if len > KEPT_BYTES / 2 {
            out[0] = (p, len);
            return 1;
        }
        loop {
            let free = (0..KEPT_BLOCKS).find(|&i| self.blocks[i].1 == 0);
            if let (Some(i), true) = (free, self.bytes + len <= KEPT_BYTES) {
                self.stamp += 1;
                self.blocks[i] = (p, len, self.stamp);
                self.bytes += len;
                return n;
            }
            // Evict the oldest.
            let Some(i) = (0..KEPT_BLOCKS)
                .filter(|&i| self.blocks[i].1 != 0)
                .min_by_key(|&i| self.blocks[i].2)
            else {
                out[n] = (p, len);
                return n + 1;
            };
            let (q, l, _) = self.blocks[i];
            self.blocks[i] = (0, 0, 0);
            self.bytes -= l;
            out[n] = (q, l);
            n += 1;
        }
    }
}

/// The module's allocator. `const`-constructed, usable as a static.
pub struct ModuleAlloc {
    locked: AtomicBool,
    state: UnsafeCell<State>,
    /// Bytes currently mapped (chunks and large blocks): for tests and
    /// diagnostics.
    mapped: AtomicUsize,
}

// SAFETY: `state` is only reached under `locked` (see `lock`), which
// orders every access between threads; the raw pointers in it are
// addresses of memory this allocator mapped, not shared references.
unsafe impl Sync for ModuleAlloc {}
// SAFETY: as for Sync: the state's pointers name memory of the allocator
// itself, valid from any thread.
unsafe impl Send for ModuleAlloc {}

impl Default for ModuleAlloc {
    fn default() -> ModuleAlloc {
        ModuleAlloc::new()
    }
}

/// Holds the lock; releases it when dropped.
struct Locked<'a> {
    a: &'a ModuleAlloc,
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        self.a.locked.store(false, Ordering::Release);
    }
}

impl Locked<'_> {
    #[inline]
    fn state(&mut self) -> &mut State {
        // SAFETY: this guard holds the lock, so no other reference to the
        // state exists until it is dropped, and `&mut self` keeps this one
        // unique within the guard.
        unsafe { &mut *self.a.state.get() }
    }
}

impl ModuleAlloc {
    pub const fn new() -> ModuleAlloc {
        ModuleAlloc {
            locked: AtomicBool::new(false),
            state: UnsafeCell::new(State {
                classes: [Class {
                    free: ptr::null_mut(),
                    bump: 0,
                    end: 0,
                }; CLASSES],
                chunk_next: 0,
                chunk_end: 0,
                kept: Kept::EMPTY,
            }),
            mapped: AtomicUsize::new(0),
        }
    }

    /// Bytes this allocator has mapped and not unmapped (the unit tests'
    /// check that large blocks are returned).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn mapped_bytes(&self) -> usize {
        self.mapped.load(Ordering::Relaxed)
    }

    #[inline]
    fn lock(&self) -> Locked<'_> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                spins = spins.saturating_add(1);
                if spins < 100 {
                    std::hint::spin_loop();
                } else {
                    // The holder may have been descheduled: give it the CPU.
                    std::thread::yield_now();
                }
            }
        }
        Locked { a: self }
    }

    /// Maps `len` bytes (a multiple of the page) of fresh zeroed memory.
    fn map(&self, len: usize) -> *mut u8 {
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing touches no existing memory.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return ptr::null_mut();
        }
        self.mapped.fetch_add(len, Ordering::Relaxed);
        p.cast()
    }

    /// Unmaps `len` bytes at `p`, a range this allocator mapped.
    fn unmap(&self, p: *mut u8, len: usize) {
        if len == 0 {
            return;
        }
        // SAFETY: `p .. p + len` is (part of) a mapping this allocator made
        // and nothing refers to it any more (the caller's contract).
        if unsafe { libc::munmap(p.cast(), len) } == 0 {
            self.mapped.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// A small block of class `c`.
    #[inline]
    fn alloc_small(&self, c: usize) -> *mut u8 {
        let mut g = self.lock();
        let State {
            classes,
            chunk_next,
            chunk_end,
            ..
        } = g.state();
        let Some(class) = classes.get_mut(c) else {
            return ptr::null_mut();
        };
        if !class.free.is_null() {
            let b = class.free;
            // SAFETY: a block on the free list is a block of this class
            // (at least 16 bytes, 16-aligned) whose first word holds the
            // next link, written by `dealloc_small`.
            class.free = unsafe { b.cast::<*mut u8>().read() };
            return b;
        }
        let size = class_size(c);
        if class.end - class.bump < size {
            // A new region; the old one's tail (less than one block) is
            // left unused.
            if *chunk_end - *chunk_next < REGION {
                let chunk = self.map(CHUNK);
                if chunk.is_null() {
                    return ptr::null_mut();
                }
                *chunk_next = chunk as usize;
                *chunk_end = chunk as usize + CHUNK;
            }
            class.bump = *chunk_next;
            class.end = *chunk_next + REGION;
            *chunk_next += REGION;
        }
        let b = class.bump;
        class.bump += size;
        b as *mut u8
    }

    /// Returns a small block of class `c` to its free list.
    #[inline]
    fn dealloc_small(&self, p: *mut u8, c: usize) {
        let mut g = self.lock();
        let st = g.state();
        let Some(class) = st.classes.get_mut(c) else {
            return;
        };
        // SAFETY: `p` is a block of class `c` the caller no longer uses
        // (GlobalAlloc's contract), at least 16 bytes and 16-aligned: its
        // first word can hold the link.
        unsafe { p.cast::<*mut u8>().write(class.free) };
        class.free = p;
    }

    /// A kept block (see [`Kept`]) of exactly `len` bytes, its tail
    /// beyond `len` unmapped; null if none fits. `zero`: cleared.
    fn reuse_large(&self, len: usize, zero: bool) -> *mut u8 {
        let Some((p, l)) = self.lock().state().kept.take(len) else {
            return ptr::null_mut();
        };
        // The block is ours alone now (out of the list): the lock is not
        // held for the system call or the clearing.
        self.unmap((p + len) as *mut u8, l - len);
        if zero {
            // SAFETY: `p .. p + len` is a mapping of ours that nothing else
            // refers to (taken off the kept list above).
            unsafe { ptr::write_bytes(p as *mut u8, 0, len) };
        }
        p as *mut u8
    }

    /// Frees the large block `p` of `len` bytes (page-aligned, a whole
    /// mapping of ours): kept for reuse, or unmapped.
    fn free_large(&self, p: *mut u8, len: usize) {
        let mut out = [(0usize, 0usize); KEPT_BLOCKS + 1];
        let n = self.lock().state().kept.put(p as usize, len, &mut out);
        for &(q, l) in &out[..n] {
            self.unmap(q as *mut u8, l);
        }
    }

    /// A mapping of `len` bytes (a page multiple) aligned to `align`.
    fn alloc_large(&self, len: usize, align: usize, zero: bool) -> *mut u8 {
        if align <= PAGE {
            let p = self.reuse_large(len, zero);
            if !p.is_null() {
                return p;
            }
            return self.map(len);
        }
        // Over-map, then trim the head and tail so that exactly the
        // aligned `len` bytes stay mapped (what `dealloc` unmaps).
        let Some(over) = len.checked_add(align) else {
            return ptr::null_mut();
        };
        let p = self.map(over);
        if p.is_null() {
            return p;
        }
        let start = p as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        self.unmap(p, head);
        // SAFETY: `aligned + len` is inside the `over` bytes just mapped
        // (head < align).
        let tail_start = unsafe { p.add(head + len) };
        self.unmap(tail_start, over - head - len);
        aligned as *mut u8
    }
}

// SAFETY: every block handed out is either a distinct block of a size
// class (carved once from a region, or popped from its class's free list
// after its owner returned it) at least `layout.size()` bytes long and
// aligned to `layout.align()` (see `kind`), or a fresh mapping of at
// least that size and alignment; blocks are handed back to the class the
// same `kind` computation names. Failures return null, nothing panics.
unsafe impl GlobalAlloc for ModuleAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match kind(layout) {
            Some(Kind::Small(c)) => self.alloc_small(c),
            Some(Kind::Large(len)) => self.alloc_large(len, layout.align(), false),
            None => ptr::null_mut(),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match kind(layout) {
            Some(Kind::Small(c)) => {
                let p = self.alloc_small(c);
                if !p.is_null() {
                    // SAFETY: `p` is a block of at least `layout.size()`
                    // bytes, ours until returned.
                    unsafe { ptr::write_bytes(p, 0, layout.size()) };
                }
                p
            }
            // A fresh anonymous mapping is zeroed by the kernel, a kept
            // block by `reuse_large`.
            Some(Kind::Large(len)) => self.alloc_large(len, layout.align(), true),
            None => ptr::null_mut(),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        match kind(layout) {
            Some(Kind::Small(c)) => self.dealloc_small(p, c),
            // Only whole page-aligned mappings are kept: a block aligned
            // to more was trimmed out of a larger one, and is unmapped.
            Some(Kind::Large(len)) if layout.align() <= PAGE => self.free_large(p, len),
            Some(Kind::Large(len)) => self.unmap(p, len),
            None => {}
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return ptr::null_mut();
        };
        let (old, new) = match (kind(layout), kind(new_layout)) {
            (Some(old), Some(new)) => (old, new),
            _ => return ptr::null_mut(),
        };
        if old == new {
            // Same class, or the same number of pages.
            return p;
        }
        if let (Kind::Large(old_len), Kind::Large(new_len)) = (old, new) {
            if layout.align() <= PAGE {
                // SAFETY: `p .. p + old_len` is a whole mapping of ours
                // (page-aligned); MREMAP_MAYMOVE keeps its contents, at
                // this or another page-aligned address, and unmaps the
                // old range if it moves.
                let q = unsafe { libc::mremap(p.cast(), old_len, new_len, libc::MREMAP_MAYMOVE) };
                if q == libc::MAP_FAILED {
                    return ptr::null_mut();
                }
                if new_len > old_len {
                    self.mapped.fetch_add(new_len - old_len, Ordering::Relaxed);
                } else {
                    self.mapped.fetch_sub(old_len - new_len, Ordering::Relaxed);
                }
                return q.cast();
            }
        }
        // SAFETY: `new_layout` has a non-zero size unless the caller asked
        // for zero bytes, which `kind` serves with the smallest block.
        let q = unsafe { self.alloc(new_layout) };
        if !q.is_null() {
            // SAFETY: both blocks are at least min(old, new) bytes long and
            // distinct (the old one is still ours until freed below).
            unsafe { ptr::copy_nonoverlapping(p, q, layout.size().min(new_size)) };
            // SAFETY: `p` was allocated with `layout` and is no longer used.
            unsafe { self.dealloc(p, layout) };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn classes_cover_every_small_size_with_at_most_a_fifth_wasted() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(16), 0);
        assert_eq!(class_of(17), 1);
        assert_eq!(class_of(128), 7);
        assert_eq!(class_of(129), 8);
        assert_eq!(class_size(8), 160);
        assert_eq!(class_of(SMALL_MAX), CLASSES - 1);
        assert_eq!(class_size(CLASSES - 1), SMALL_MAX);
        let mut last = 0;
        for size in 1..=SMALL_MAX {
            let c = class_of(size);
            let s = class_size(c);
            assert!(s >= size, "size {size}: class {c} of {s}");
            assert!(
                c == 0 || class_size(c - 1) < size,
                "size {size}: a smaller class fits"
            );
            assert!(c >= last, "classes grow with the size");
            assert_eq!(s % 16, 0);
            if size > 128 {
                assert!(
                    s * 4 <= size * 5,
                    "size {size}: class of {s} wastes more than 20 %"
                );
            }
            last = c;
        }
        // Every power of two is a class of its own size (the aligned path).
        let mut p = 16;
        while p <= SMALL_MAX {
            assert_eq!(class_size(class_of(p)), p);
            p *= 2;
        }
    }

    /// Fills a block with a pattern of its address and checks it later.
    fn fill(p: *mut u8, len: usize, seed: u8) {
        for i in 0..len {
            // SAFETY: `p` is a live block of at least `len` bytes.
            unsafe { p.add(i).write(seed.wrapping_add(i as u8)) };
        }
    }

    fn check(p: *mut u8, len: usize, seed: u8) -> bool {
        // SAFETY: as in fill.
        (0..len).all(|i| unsafe { p.add(i).read() } == seed.wrapping_add(i as u8))
    }

    #[test]
    fn blocks_are_aligned_sized_and_disjoint() {
        let a = ModuleAlloc::new();
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let sizes = [
            1, 7, 16, 17, 100, 129, 1000, 4096, 5000, 65536, 65537, 300_000,
        ];
        let aligns = [1, 8, 16, 32, 64, 256, 4096, 8192, 65536];
        let mut seed = 0u8;
        for &size in &sizes {
            for &align in &aligns {
                let l = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero-size layout.
                let p = unsafe { a.alloc(l) };
                assert!(!p.is_null(), "{l:?}");
                assert_eq!(p as usize % align, 0, "{l:?} at {p:?}");
                seed = seed.wrapping_add(37);
                fill(p, size, seed);
                live.push((p, l, seed));
            }
        }
        for &(p, l, s) in &live {
            assert!(check(p, l.size(), s), "{l:?} overwritten by another block");
        }
        let mut ranges: Vec<(usize, usize)> = live
            .iter()
            .map(|&(p, l, _)| (p as usize, p as usize + l.size()))
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "blocks overlap: {w:?}");
        }
        for (p, l, _) in live {
            // SAFETY: allocated above with `l`.
            unsafe { a.dealloc(p, l) };
        }
    }

    #[test]
    fn freed_blocks_are_reused_and_large_ones_kept_within_a_bound() {
        let a = ModuleAlloc::new();
        let l = Layout::from_size_align(48, 8).unwrap();
        // SAFETY: non-zero-size layouts; each block freed with its own.
        unsafe {
            let p = a.alloc(l);
            a.dealloc(p, l);
            assert_eq!(a.alloc(l), p, "the freed block comes back first");
        }
        let chunks = a.mapped_bytes();
        assert_eq!(chunks, CHUNK);
        let big = Layout::from_size_align(6 << 20, 8).unwrap();
        // SAFETY: as above.
        unsafe {
            let p = a.alloc_zeroed(big);
            assert!(!p.is_null());
            assert!(std::slice::from_raw_parts(p, big.size())
                .iter()
                .all(|&b| b == 0));
            assert_eq!(a.mapped_bytes(), chunks + (6 << 20));
            a.dealloc(p, big);
            assert_eq!(a.mapped_bytes(), chunks + (6 << 20), "kept for reuse");
            // A request an eighth smaller takes it, zeroed, its tail unmapped.
            let smaller = Layout::from_size_align(11 << 19, 8).unwrap();
            fill(p, 4096, 7);
            let q = a.alloc_zeroed(smaller);
            assert_eq!(q, p, "the kept block is reused");
            assert!(std::slice::from_raw_parts(q, smaller.size())
                .iter()
                .all(|&b| b == 0));
            assert_eq!(a.mapped_bytes(), chunks + (11 << 19));
            a.dealloc(q, smaller);
            // Too large to keep: back to the system at once.
            let huge = Layout::from_size_align(KEPT_BYTES / 2 + PAGE, 8).unwrap();
            let h = a.alloc(huge);
            assert!(!h.is_null());
            a.dealloc(h, huge);
            assert_eq!(a.mapped_bytes(), chunks + (11 << 19));
            // Many freed blocks: at most KEPT_BYTES stay mapped, the
            // oldest go first (the 5.5 MiB one among them).
            let mid = Layout::from_size_align(3 << 20, 8).unwrap();
            let blocks: Vec<*mut u8> = (0..20).map(|_| a.alloc(mid)).collect();
            for &b in &blocks {
                a.dealloc(b, mid);
            }
            assert_eq!(
                a.mapped_bytes(),
                chunks + (KEPT_BYTES / (3 << 20)).min(KEPT_BLOCKS) * (3 << 20)
            );
            assert!(a.mapped_bytes() - chunks <= KEPT_BYTES);
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_even_when_reused() {
        let a = ModuleAlloc::new();
        let l = Layout::from_size_align(200, 16).unwrap();
        // SAFETY: non-zero-size layout, freed with it.
        unsafe {
            let p = a.alloc(l);
            fill(p, 200, 1);
            a.dealloc(p, l);
            let q = a.alloc_zeroed(l);
            assert_eq!(q, p);
            assert!(std::slice::from_raw_parts(q, 200).iter().all(|&b| b == 0));
            a.dealloc(q, l);
        }
    }

    #[test]
    fn realloc_keeps_contents_across_classes_and_mappings() {
        let a = ModuleAlloc::new();
        for align in [8, 64, 8192] {
            let mut l = Layout::from_size_align(10, align).unwrap();
            // SAFETY: each block reallocated with the layout it has.
            let mut p = unsafe { a.alloc(l) };
            fill(p, 10, 9);
            let mut kept = 10;
            for new in [12, 100, 5000, 70_000, 1 << 20, 3 << 20, 200_000, 64, 5] {
                // SAFETY: `p` was allocated with `l`.
                p = unsafe { a.realloc(p, l, new) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                kept = kept.min(new);
                assert!(
                    check(p, kept, 9),
                    "align {align}: contents lost growing to {new}"
                );
                l = Layout::from_size_align(new, align).unwrap();
                if new > kept {
                    fill(p, new, 9);
                    kept = new;
                }
            }
            // SAFETY: as above.
            unsafe { a.dealloc(p, l) };
        }
    }

    #[test]
    fn an_impossible_size_is_refused_not_a_panic() {
        let a = ModuleAlloc::new();
        let l = Layout::from_size_align(isize::MAX as usize - 4096, 8).unwrap();
        // SAFETY: a non-zero-size layout; the kernel refuses the mapping.
        assert!(unsafe { a.alloc(l) }.is_null());
        let l = Layout::from_size_align(isize::MAX as usize - 16384, 8192).unwrap();
        // SAFETY: as above.
        assert!(unsafe { a.alloc(l) }.is_null());
        let small = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: as above; then a realloc to a size no layout allows.
        unsafe {
            let p = a.alloc(small);
            assert!(a.realloc(p, small, isize::MAX as usize).is_null());
            // The block is still the caller's after a failed realloc.
            a.dealloc(p, small);
        }
    }

    /// Four threads allocate, fill, check and free blocks of random sizes
    /// and alignments; a quarter of the blocks are handed to the next
    /// thread and freed there (a table built on the helper thread and
    /// dropped on the event loop).
    #[test]
    fn stress_across_threads() {
        let a = Arc::new(ModuleAlloc::new());
        const THREADS: usize = 4;
        const ROUNDS: usize = 20_000;
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| std::sync::mpsc::channel::<(usize, Layout, u8)>())
            .unzip();
        let mut handles = Vec::new();
        for (t, rx) in rxs.into_iter().enumerate() {
            let a = Arc::clone(&a);
            let tx = txs[(t + 1) % THREADS].clone();
            handles.push(std::thread::spawn(move || {
                let mut rng = crate::core::test_rng::Rng(0x9e37_79b9_7f4a_7c15 ^ t as u64);
                let mut live: Vec<(usize, Layout, u8)> = Vec::new();
                for round in 0..ROUNDS {
                    let x = rng.next();
                    let size = match x % 100 {
                        0 => 65_000 + (x >> 8) as usize % 200_000,
                        1..=9 => 1 + (x >> 8) as usize % SMALL_MAX,
                        _ => 1 + (x >> 8) as usize % 512,
                    };
                    let align = 1usize << ((x >> 40) % 8);
                    let l = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: a non-zero-size layout.
                    let p = unsafe { a.alloc(l) };
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0);
                    let seed = (x >> 32) as u8;
                    fill(p, size.min(256), seed);
                    live.push((p as usize, l, seed));
                    while let Ok((p, l, s)) = rx.try_recv() {
                        assert!(
                            check(p as *mut u8, l.size().min(256), s),
                            "a block handed over was overwritten"
                        );
                        // SAFETY: allocated by another thread with `l` and handed over.
                        unsafe { a.dealloc(p as *mut u8, l) };
                    }
                    if live.len() > 64 || round % 7 == 0 {
                        let i = (x >> 20) as usize % live.len();
                        let (p, l, s) = live.swap_remove(i);
                        assert!(
                            check(p as *mut u8, l.size().min(256), s),
                            "a live block was overwritten"
                        );
                        if round % 4 == 0 {
                            let _ = tx.send((p, l, s));
                        } else {
                            // SAFETY: allocated above with `l`.
                            unsafe { a.dealloc(p as *mut u8, l) };
                        }
                    }
                }
                for (p, l, s) in live {
                    assert!(check(p as *mut u8, l.size().min(256), s));
                    // SAFETY: as above.
                    unsafe { a.dealloc(p as *mut u8, l) };
                }
                rx
            }));
        }
        drop(txs);
        let rxs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for rx in rxs {
            while let Ok((p, l, s)) = rx.try_recv() {
                assert!(check(p as *mut u8, l.size().min(256), s));
                // SAFETY: handed over, never freed.
                unsafe { a.dealloc(p as *mut u8, l) };
            }
        }
        // Every large block went back or is kept (within the bound); only
        // the chunks of the classes stay besides.
        let kept = a.lock().state().kept.bytes;
        assert!(kept <= KEPT_BYTES);
        assert_eq!(
            (a.mapped_bytes() - kept) % CHUNK,
            0,
            "large blocks left mapped"
        );
    }
}
