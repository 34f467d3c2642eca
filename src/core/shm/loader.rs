//! Loading a large table off the request path.
//!
//! Copying, checking and indexing a published segment takes about half a
//! microsecond per strategy (`cargo bench --bench load`), and freeing the
//! table it replaces some more: tens of milliseconds for 65,536
//! strategies, during which an nginx worker that did it on its event loop
//! would answer nobody. So a worker
//! ([`Reader::set_background`](crate::core::shm::reader::Reader::set_background))
//! hands a segment of at least [`BACKGROUND_MIN`] strategies to a helper
//! thread, which reads, decodes and builds the [`Table`]; the worker goes
//! on deciding with the table it has and installs the new one at the first
//! request or tick of its watch timer (every 5 ms, see the module's
//! `worker.rs`) after the thread is done (one atomic load per request until
//! then). The table replaced is dropped on a helper thread too. A change
//! of a few strategies is patched in by the worker itself, at once (issue
//! 29, [`INLINE_PATCH_MAX`]); the whole table follows here.
//!
//! The helper threads run nginx-free code only (this crate's core) and
//! start with every asynchronous signal blocked: nginx's signals (reload,
//! stop, reopen) keep reaching the worker's own thread. Synchronous
//! faults stay deliverable, so a SIGBUS while reading a truncated file is
//! absorbed by [`sigbus`](crate::core::shm::sigbus) as on the worker's thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::core::shm::segment::SegmentError;
use crate::core::shm::Mapping;
use crate::core::table::Table;

/// Segments of at least this many strategies are loaded by a helper
/// thread (when the engine allows it): smaller ones load in well under a
/// millisecond per thousand strategies, and a caller sees them at once.
pub const BACKGROUND_MIN: u32 = 4096;

/// Attempts to read a segment the writer is busy with.
const BUSY_RETRIES: usize = 64;

/// A worker tries to patch its table ([`Table::read_patch`]) on its own
/// thread, at once, for segments of up to this many strategies (issue 29):
/// copying, checksumming and comparing the payload costs about 0.15 ms per
/// 10,000 strategies (`cargo bench --bench load`, `patch-*`), so at most
/// about 1 ms of the event loop once per change, less than the inline
/// build of a table just under [`BACKGROUND_MIN`]. A helper thread
/// started for it would first wait for the scheduler to run it: a new
/// thread waits its turn behind every runnable one (up to a scheduling
/// period, several ms on a busy host), which was the largest term of
/// "change published → every worker enforces it".
pub const INLINE_PATCH_MAX: u32 = 65_536;

/// What a helper thread made of one segment.
pub enum Built {
    Table {
        table: Box<Table>,
        strategies: usize,
        config_version: u64,
    },
    /// The segment was refused (bad content), or the build failed: the
    /// previous table stays until the next publish.
    Refused(String),
    /// The writer kept publishing, or published again: read afresh.
    Busy,
}

/// A load under way.
pub struct Pending {
    /// The publish sequence being read.
    pub seq: u64,
    handle: JoinHandle<Built>,
}

impl Built {
    /// A table built (or patched) from segment `table.version()`.
    pub fn of(table: Table) -> Built {
        Built::Table {
            strategies: table.published_strategies(),
            config_version: table.config_version(),
            table: Box::new(table),
        }
    }
}

impl Pending {
    /// Whether the thread is done ([`take`](Self::take) does not wait).
    #[inline]
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The thread's result (waits for it if it is not done). A thread that
    /// panicked refuses the segment: retried only when the next publish
    /// comes, not at every request.
    pub fn take(self) -> Built {
        self.handle
            .join()
            .unwrap_or_else(|_| Built::Refused("building the table failed".into()))
    }
}

/// Starts reading segment `seq` of `map` on a helper thread; `None` if no
/// thread could be started (the caller loads it itself). With `base`, the
/// table the caller decides with (read from `map`), a change of a few
/// strategies is made a patch over it ([`Table::read_patch`], issue 29),
/// which the caller replaces with a full build once installed.
pub fn start(map: Arc<Mapping>, seq: u64, base: Option<Arc<Table>>) -> Option<Pending> {
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
    let handle = spawn_quiet("rate_ctl-load", move || {
        let _done = InFlight;
        build(&map, seq, base)
    });
    if handle.is_none() {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
    Some(Pending {
        seq,
        handle: handle?,
    })
}

/// Builder threads of this process not finished yet (every reader
/// together): a [`Reader`](crate::core::shm::reader::Reader) keeps at most one.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts a builder thread out when it ends, however it ends.
struct InFlight;

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Builder threads of this process still running (tests: a writer
/// flipping sequences must not grow them).
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Relaxed)
}

/// Drops `value` on a helper thread (a big table's memory is freed there,
/// not on the request path); here if no thread can be started.
pub fn drop_later<T: Send + 'static>(value: T) {
    if let Some(v) = spawn_quiet("rate_ctl-free", move || drop(value)) {
        drop(v); // detached
    }
}

/// The strategy count segment `seq` of `map` announces (racy: a hint for
/// choosing where to load it, validated by the read itself).
pub fn announced_strategies(map: &Mapping, seq: u64) -> u32 {
    crate::core::shm::segment::announced_count(&map.segment((seq & 1) as usize))
}

fn build(map: &Arc<Mapping>, seq: u64, base: Option<Arc<Table>>) -> Built {
    let mut buf = Vec::new();
    let table = Built::of;
    if let Some(base) = base.filter(|b| b.mapping().is_some_and(|m| Arc::ptr_eq(m, map))) {
        for _ in 0..BUSY_RETRIES {
            if map.seq() != seq {
                return Built::Busy;
            }
            match Table::read_patch(&base, &map.segment((seq & 1) as usize), seq, &mut buf) {
                Ok(Some(patched)) => return table(patched),
                // Not a patch: the whole table below.
                Ok(None) => break,
                Err(SegmentError::Busy) => std::thread::yield_now(),
                Err(SegmentError::Sequence { .. }) => return Built::Busy,
                Err(e) => return Built::Refused(e.to_string()),
            }
        }
    }
    for _ in 0..BUSY_RETRIES {
        if map.seq() != seq {
            return Built::Busy;
        }
        match Table::read(
            &map.segment((seq & 1) as usize),
            seq,
            &mut buf,
            Some(map.clone()),
        ) {
            Ok(mut t) => {
                // Compared with the next publish (`read_patch`).
                t.keep_payload(std::mem::take(&mut buf));
                return table(t);
            }
            Err(SegmentError::Busy) => std::thread::yield_now(),
            Err(SegmentError::Sequence { .. }) => return Built::Busy,
            Err(e) => return Built::Refused(e.to_string()),
        }
    }
    Built::Busy
}

/// Spawns `f` on a thread that starts with every asynchronous signal
/// blocked (faults — SIGBUS, SIGSEGV, SIGFPE, SIGILL — stay deliverable).
/// `None` if the thread cannot be created.
fn spawn_quiet<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<JoinHandle<T>> {
    // SAFETY: sigset_t is plain data that sigfillset/sigdelset initialise;
    // pthread_sigmask changes only this thread's mask, restored below, and
    // a new thread inherits the mask in force when it is created.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut block);
        for sig in [libc::SIGBUS, libc::SIGSEGV, libc::SIGFPE, libc::SIGILL] {
            libc::sigdelset(&mut block, sig);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &block, &mut old);
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(f)
            .ok();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        handle
    }
}
