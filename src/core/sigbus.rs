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
//! * Every [`Mapping`](super::shm::Mapping) registers its address range
//!   ([`register`]); dropping the returned [`Guard`] unregisters it (before
//!   the range is unmapped).
//! * On SIGBUS at an address inside a registered range, the handler maps
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// Ranges guarded at once.
pub const MAX_GUARDED: usize = 64;

struct Range {
    /// Start address; 0 = free entry.
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

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
        r.start.store(0, Ordering::Release);
    }
}

/// Registers `[start, start + len)`; `None` if the table is full (the
/// range is then not guarded) or the range is empty.
pub fn register(start: *mut u8, len: usize) -> Option<Guard> {
    let start = start as usize;
    if start == 0 || len == 0 {
        return None;
    }
    for (index, r) in RANGES.iter().enumerate() {
        // Claim the entry: len first is invisible until start is set.
        if r.start.load(Ordering::Relaxed) != 0 {
            continue;
        }
        r.len.store(len, Ordering::Relaxed);
        r.faulted.store(false, Ordering::Relaxed);
        if r.start
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(Guard { index });
        }
    }
    None
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in &RANGES {
        let start = r.start.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Relaxed);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
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
        break;
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
