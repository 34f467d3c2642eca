//! SIGBUS guard for the shared-memory mappings of this process.
//!
//! A file mapped `MAP_SHARED` that another process truncates (or rewrites in
//! place: `cp backup /dev/shm/rate_ctl` truncates first), or whose pages a
//! full tmpfs cannot back, raises SIGBUS on the next access to a page past
//! its new end. Checking the size before each access cannot close that
//! window, so the process catches the signal instead:
//!
//! * [`install`] adds a SIGBUS handler once per process (the nginx module
//!   at worker start, the agent at start), remembering the handler that was
//!   there before.
//! * Every [`Mapping`](crate::core::shm::Mapping) registers its address range
//!   ([`register`]); dropping the returned [`Guard`] unregisters it (before
//!   the range is unmapped).
//! * On a SIGBUS the kernel raised (`si_code > 0`; one sent with `kill`
//!   or `sigqueue` is never believed) at an address inside a registered
//!   range, the handler maps
//!   anonymous zero pages over the **whole** range (`MAP_FIXED`), marks the
//!   guard faulted and returns: the faulting instruction runs again on a
//!   zero page. A zeroed file reads as "nothing published" and every slot
//!   generation as 0, so whatever the process was doing fails open (hits
//!   are skipped as stale). The owner of the mapping notices
//!   [`Guard::faulted`] on its next check, logs one line and drops the
//!   mapping; a worker maps the file afresh when it is whole again.
//! * Any other SIGBUS goes to the previous handler; with none (the
//!   default action), the default is restored and the fault repeats, so
//!   the process dies exactly as it would have without the guard.
//!
//! The handler does only async-signal-safe work: atomic loads and stores
//! and one `mmap` system call. Registration is a fixed table of
//! [`MAX_GUARDED`] ranges; a mapping that finds it full is simply not
//! guarded (a process holds one or two mappings in practice: the current
//! file and, for a moment, the one it replaced).

use std::cell::UnsafeCell;
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

/// Ranges guarded at once.
pub const MAX_GUARDED: usize = 64;

struct Range {
    /// Start and length in one word ([`pack`]), so that no reader can pair
    /// one registration's start with another's length; 0 = free entry.
    span: AtomicU64,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    span: AtomicU64::new(0),
    faulted: AtomicBool::new(false),
};

/// The granule of [`pack`]: mappings start on a page (4 KiB or a multiple)
/// and cover whole pages.
const GRANULE: usize = 4096;
/// Bits of the packed word for the length in granules (2 TiB); the start
/// granule takes the other 35 (user addresses below 2^47).
const LEN_BITS: u32 = 29;

/// `[start, start + len)` as one word: start granule << 29 | length in
/// granules (rounded up). `None` if the start is not page aligned or
/// either does not fit (the range is then not guarded).
fn pack(start: usize, len: usize) -> Option<u64> {
    if start == 0 || len == 0 || start % GRANULE != 0 {
        return None;
    }
    let s = (start / GRANULE) as u64;
    let l = len.div_ceil(GRANULE) as u64;
    if s >> (64 - LEN_BITS) != 0 || l >> LEN_BITS != 0 {
        return None;
    }
    Some(s << LEN_BITS | l)
}

/// The range of a packed word (0: none).
fn unpack(w: u64) -> Option<(usize, usize)> {
    if w == 0 {
        return None;
    }
    let start = (w >> LEN_BITS) as usize * GRANULE;
    let len = (w & ((1 << LEN_BITS) - 1)) as usize * GRANULE;
    Some((start, len))
}

static RANGES: [Range; MAX_GUARDED] = [FREE; MAX_GUARDED];
/// SIGBUS faults absorbed since the process started (tests, stats).
static FAULTS: AtomicU64 = AtomicU64::new(0);

struct Previous(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: written once, inside `INSTALL.call_once`, by the sigaction call
// that installs our handler; read only by the handler afterwards.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(UnsafeCell::new(MaybeUninit::zeroed()));
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installs the handler (once per process; later calls do nothing).
pub fn install() -> io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
        // value; we fill in the handler and flags and pass valid pointers.
        // PREVIOUS is written by the kernel before our handler can run.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let prev = (*PREVIOUS.0.get()).as_mut_ptr();
            if libc::sigaction(libc::SIGBUS, &sa, prev) != 0 {
                result = Err(io::Error::last_os_error());
            } else {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    result
}

/// Whether [`install`] succeeded in this process.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// SIGBUS faults absorbed so far in this process.
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

/// A registered range; unregistered on drop.
#[derive(Debug)]
pub struct Guard {
    index: usize,
}

impl Guard {
    /// Whether a SIGBUS hit this range (it now holds zero pages).
    #[inline]
    pub fn faulted(&self) -> bool {
        RANGES[self.index].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let r = &RANGES[self.index];
        r.faulted.store(false, Ordering::Relaxed);
        r.span.store(0, Ordering::Release);
    }
}

/// Registers `[start, start + len)`; `None` if the table is full (the
/// range is then not guarded), the range is empty or its start is not
/// page aligned. An entry is claimed with one compare-and-swap of the
/// whole range (start and length in one word): concurrent registrations
/// never mix their starts and lengths.
pub fn register(start: *mut u8, len: usize) -> Option<Guard> {
    let w = pack(start as usize, len)?;
    for (index, r) in RANGES.iter().enumerate() {
        if r.span.load(Ordering::Relaxed) != 0 {
            continue;
        }
        if r.span
            .compare_exchange(0, w, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(Guard { index });
        }
    }
    None
}

/// The registered range that a SIGBUS with this `si_code` at `addr` is
/// ours to absorb: only a fault the kernel raised (`si_code > 0`:
/// `BUS_ADRERR` and the like). A signal another process (or this one)
/// sent with `kill`, `sigqueue` or `rt_sigqueueinfo` (`si_code <= 0`) can
/// claim any address; it goes to the previous handler.
fn claimed_range(si_code: libc::c_int, addr: usize) -> Option<(usize, &'static Range, usize)> {
    if si_code <= 0 {
        return None;
    }
    RANGES.iter().find_map(|r| {
        let (start, len) = unpack(r.span.load(Ordering::Acquire))?;
        (addr >= start && addr - start < len).then_some((start, r, len))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if let Some((start, r, len)) = claimed_range(code, addr) {
        // SAFETY: [start, start + len) is a live mapping of this process
        // (registered until just before it is unmapped); replacing it with
        // private zero pages keeps every pointer into it valid.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            r.faulted.store(true, Ordering::Release);
            FAULTS.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    // SAFETY: PREVIOUS was filled by the sigaction call that installed us.
    unsafe { chain(sig, info, ctx) }
}

/// Hands a foreign SIGBUS to the handler installed before ours, or
/// restores the default action so that the fault, repeated on return,
/// ends the process as it would have without the guard.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: see the caller.
    let prev = unsafe { (*PREVIOUS.0.get()).assume_init_ref() };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is valid.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: with SA_SIGINFO the stored address is a three-argument handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO it is a one-argument handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_kernel_faults_inside_a_range_are_claimed() {
        let start = 0x7f00_0000_0000usize;
        let g = register(start as *mut u8, 3 * 4096 + 1).unwrap();
        let inside = start + 4 * 4096 - 1; // the last byte of the 4th page
        assert!(claimed_range(libc::BUS_ADRERR, inside).is_some());
        assert!(claimed_range(libc::BUS_ADRERR, start + 4 * 4096).is_none());
        assert!(claimed_range(libc::BUS_ADRERR, start - 1).is_none());
        // Sent, not raised: kill (SI_USER 0), sigqueue (SI_QUEUE -1),
        // tgkill (SI_TKILL -6): whatever address they name.
        for code in [0, -1, -6] {
            assert!(claimed_range(code, inside).is_none(), "si_code {code}");
        }
        drop(g);
        assert!(claimed_range(libc::BUS_ADRERR, inside).is_none());
    }

    #[test]
    fn ranges_are_packed_whole_or_refused() {
        assert_eq!(unpack(pack(0x1000, 1).unwrap()), Some((0x1000, 0x1000)));
        let big = (0x7fff_f000_0000usize, 1usize << 40);
        assert_eq!(unpack(pack(big.0, big.1).unwrap()), Some(big));
        assert_eq!(pack(0x1001, 4096), None, "unaligned");
        assert_eq!(pack(0, 4096), None);
        assert_eq!(pack(0x1000, 0), None);
        assert_eq!(pack(0x1000, 1 << 42), None, "longer than 2 TiB");
        assert_eq!(pack(1 << 48, 4096), None, "past user space");
    }

    #[test]
    fn concurrent_registrations_never_pair_one_start_with_another_length() {
        let threads: Vec<_> = (1..=8usize)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..2000usize {
                        let start = (t << 32) + (i % 7 + 1) * 4096;
                        let len = t * 4096;
                        if let Some(g) = register(start as *mut u8, len) {
                            let seen = unpack(RANGES[g.index].span.load(Ordering::Acquire));
                            assert_eq!(seen, Some((start, len)));
                            // The handler's view of an address inside it.
                            let (s, _, l) = claimed_range(libc::BUS_ADRERR, start + len - 1)
                                .expect("own range found");
                            assert_eq!((s, l), (start, len));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_truncated_mapping_reads_zero_and_is_marked_faulted() {
        install().unwrap();
        let dir = std::env::temp_dir().join(format!("rate_ctl_sigbus_{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dir)
            .unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        let map = memmap2::MmapOptions::new().len(8192).map_raw(&f).unwrap();
        let guard = register(map.as_mut_ptr(), map.len()).unwrap();
        // SAFETY: the mapping is 8192 bytes long.
        let last = unsafe { map.as_ptr().add(8000) };
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { last.read_volatile() }, 7);
        f.set_len(0).unwrap();
        let before = faults();
        // SAFETY: inside the mapping; past the end of the file now, which
        // the guard turns into a zero page instead of a crash.
        assert_eq!(unsafe { last.read_volatile() }, 0);
        assert!(guard.faulted());
        assert!(faults() > before);
        drop(guard);
        drop(map);
        let _ = std::fs::remove_file(&dir);
    }
}
