//! Per-worker state: the core reader, the dimension sources resolved for
//! the current table version, and the aggregated rejection log.
//!
//! nginx runs every HTTP handler of a worker on one thread, so the state is
//! one static cell: no lock, and a re-entrant use (which nginx does not do)
//! is refused rather than aliased.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;
use std::path::PathBuf;
use std::ptr;

use ngx::ffi::{ngx_add_timer, ngx_event_t, ngx_log_t, ngx_msec_t};
use ngx::ngx_log_error;

use super::conf::MainConf;
use super::ext::cycle_log;
use super::parse::LogLevel;
use crate::core::shm::reader::{self, Reader};
use crate::core::shm::slot::Slot;
use crate::core::table::{Scratch, Table};

/// What a rejection log line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Rejected,
    Delayed,
    DryRunRejected,
    DryRunDelayed,
    Blacklisted,
    /// A new key of a per-key strategy found the key table full.
    KeyTableFull,
}

impl Event {
    fn past(self) -> &'static str {
        match self {
            Event::Rejected => "rejected",
            Event::Delayed => "delayed",
            Event::DryRunRejected => "would have rejected (dry run)",
            Event::DryRunDelayed => "would have delayed (dry run)",
            Event::Blacklisted => "refused (blacklisted)",
            Event::KeyTableFull => "found the key table full for the new keys of",
        }
    }
}

struct LogTally {
    id: u32,
    event: Event,
    level: LogLevel,
    suppressed: u64,
}

/// Aggregated rejection logging: the first event per strategy and kind in a
/// one-second window is logged with the request's context; the rest are
/// counted and summarised in one line when the window closes — by a timer
/// of the worker ([`arm_flush_timer`]), or when the worker exits — in the
/// worker's own log context, never another request's. An attack therefore
/// costs at most two lines per strategy per second per worker, and no count
/// is lost to a reload.
#[derive(Default)]
pub struct EventLog {
    window_start_ms: u64,
    entries: Vec<LogTally>,
}

pub const LOG_WINDOW_MS: u64 = 1000;

impl EventLog {
    /// Records one event; returns `true` when the caller should log it now
    /// (the first of its kind in the window).
    #[inline]
    pub fn record(&mut self, id: u32, event: Event, level: LogLevel, now_ms: u64) -> bool {
        if self.entries.is_empty() {
            self.open_window(now_ms);
        }
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.id == id && e.event == event)
        {
            e.suppressed += 1;
            return false;
        }
        self.entries.push(LogTally {
            id,
            event,
            level,
            suppressed: 0,
        });
        true
    }

    #[cold]
    fn open_window(&mut self, now_ms: u64) {
        self.window_start_ms = now_ms;
        arm_flush_timer();
    }

    /// Writes the summary lines and opens a new window.
    pub fn flush(&mut self, log: *mut ngx_log_t, now_ms: u64) {
        let secs = now_ms.saturating_sub(self.window_start_ms) as f64 / 1000.0;
        for e in self.entries.drain(..) {
            if e.suppressed == 0 {
                continue;
            }
            let what = if e.id == 0 {
                String::from("blacklist")
            } else {
                format!("strategy {}", e.id)
            };
            ngx_log_error!(
                e.level.ngx_level(),
                log,
                "rate_ctl: {what} {} {} more requests in the last {secs:.1} s",
                e.event.past(),
                e.suppressed
            );
        }
    }
}

/// One of the worker's timers: a static event (the worker owns one of each
/// kind), armed by [`WorkerTimer::arm`].
struct WorkerTimer(UnsafeCell<ngx_event_t>);

// SAFETY: only nginx's worker thread touches it (see WorkerCell).
unsafe impl Sync for WorkerTimer {}

impl WorkerTimer {
    const fn new() -> WorkerTimer {
        // SAFETY: an all-zero ngx_event_t is nginx's own initial state for
        // an event (it allocates them with ngx_pcalloc).
        WorkerTimer(UnsafeCell::new(unsafe { std::mem::zeroed() }))
    }

    /// Arms the timer to call `handler` (with `data` in the event) in `ms`
    /// milliseconds, unless it is armed already. Cancelable: it never holds
    /// up a worker that is shutting down.
    fn arm(&self, handler: extern "C" fn(*mut ngx_event_t), data: *mut c_void, ms: ngx_msec_t) {
        let log = cycle_log();
        if log.is_null() {
            return;
        }
        let ev = self.0.get();
        // SAFETY: the static event is used on the worker thread only; nginx
        // keeps it in its timer tree until it fires or is re-added.
        unsafe {
            if (*ev).timer_set() != 0 {
                return;
            }
            (*ev).handler = Some(handler);
            (*ev).data = data;
            (*ev).log = log;
            (*ev).set_cancelable(1);
            ngx_add_timer(ev, ms);
        }
    }
}

/// The summary timer: armed when a window opens.
static FLUSH_TIMER: WorkerTimer = WorkerTimer::new();

/// Makes sure the open window is summarised when it closes, whether or not
/// another request comes (a worker that is shutting down flushes in its
/// exit handler instead).
fn arm_flush_timer() {
    FLUSH_TIMER.arm(
        flush_timer_handler,
        ptr::null_mut(),
        LOG_WINDOW_MS as ngx_msec_t,
    );
}

extern "C" fn flush_timer_handler(_ev: *mut ngx_event_t) {
    super::guard::guard("the summary timer", ptr::null_mut(), (), || {
        super::guard::test_panic(super::guard::Entry::Timer);
        flush_now()
    })
}

/// Writes the pending summaries now (timer, worker exit).
pub fn flush_now() {
    let now_ms = super::time::unix_ms();
    let log = cycle_log();
    if log.is_null() {
        return;
    }
    with_existing_worker(|w| w.log.flush(log, now_ms));
}

/// Where a request value comes from, resolved once per table version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueSource {
    /// The client address: the table matches it in binary, no value needed.
    Ip,
    Api,
    Method,
    Host,
    /// Index into the main conf's `rate_ctl_dimension` list.
    Custom(usize),
    /// Not bound in nginx.conf: strategies that need it never match.
    Unbound,
}

pub struct Worker {
    pub reader: Reader,
    /// The table they were made for: its sequence, and whether it is a
    /// patch (issue 29; the full build of the same sequence that replaces
    /// it may number its dimensions otherwise).
    sources_version: Option<(u64, bool)>,
    pub sources: Vec<ValueSource>,
    /// Dimensions of the current table this nginx does not define, with
    /// the strategies that use them (they never match); for stats.
    pub undefined: Vec<(String, Vec<u32>)>,
    pub log: EventLog,
    /// The matcher's working space, reused by every request.
    pub scratch: Scratch,
}

impl Worker {
    fn new(path: PathBuf, owner: Option<u32>) -> Worker {
        Worker {
            reader: Reader::new(path).with_owner(owner),
            sources_version: None,
            sources: Vec::new(),
            undefined: Vec::new(),
            log: EventLog::default(),
            scratch: Scratch::default(),
        }
    }

    /// Picks up a new table (and maps its dimensions to request sources),
    /// logging a state change once. Per request: the reader's version check.
    #[inline]
    pub fn refresh(&mut self, mc: &MainConf, now_ns: u64, log: *mut ngx_log_t) {
        if !self.reader.is_current(now_ns) {
            self.refresh_slow(mc, now_ns, log);
        }
    }

    /// [`refresh`](Self::refresh) for the PREACCESS handler: the test
    /// knob's panic (`RATE_CTL_TEST_PANIC=preaccess`) is raised on its slow
    /// path, which such a worker takes on every request (see `start`), so
    /// the request path has no check of its own.
    #[inline(always)]
    pub fn refresh_request(&mut self, mc: &MainConf, now_ns: u64, log: *mut ngx_log_t) {
        if !self.reader.is_current(now_ns) {
            self.refresh_request_slow(mc, now_ns, log);
        }
    }

    #[cold]
    #[inline(never)]
    fn refresh_request_slow(&mut self, mc: &MainConf, now_ns: u64, log: *mut ngx_log_t) {
        // Before the reader's refresh: it stays due for the next request.
        super::guard::test_panic(super::guard::Entry::Preaccess);
        self.refresh_slow(mc, now_ns, log);
    }

    #[cold]
    fn refresh_slow(&mut self, mc: &MainConf, now_ns: u64, log: *mut ngx_log_t) {
        let change = self.reader.refresh(now_ns);
        for change in change.into_iter().chain(self.reader.take_notice()) {
            let level = match change.level {
                reader::Severity::Error => LogLevel::Error,
                reader::Severity::Notice => LogLevel::Notice,
            };
            ngx_log_error!(
                level.ngx_level(),
                log,
                "{}",
                crate::core::escape::escape_bytes(change.message.as_bytes(), 1024)
            );
        }
        // Once per table: map its dimensions to request sources and make
        // room in the working space.
        let table = self.reader.table();
        let version = table.map(|t| (t.version(), t.is_patched()));
        if version != self.sources_version {
            self.sources = match table {
                Some(t) => {
                    self.scratch.fit(t);
                    t.dimensions().iter().map(|d| source_for(d, mc)).collect()
                }
                None => Vec::new(),
            };
            self.sources_version = version;
            self.undefined = match table {
                Some(t) => undefined_dimensions(t, &self.sources, log),
                None => Vec::new(),
            };
        }
    }
}

/// Once per table load: the dimensions no source gives a value for, each
/// with the strategies that use it, logged once and marked in their slots
/// (cleared in the others) for `rate-ctl shm inspect`.
fn undefined_dimensions(
    t: &Table,
    sources: &[ValueSource],
    log: *mut ngx_log_t,
) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = sources
        .iter()
        .zip(t.dimensions())
        .filter(|(s, _)| **s == ValueSource::Unbound)
        .map(|(_, name)| (name.clone(), Vec::new()))
        .collect();
    let slots = t.mapping().map(|m| m.slots());
    for c in t.strategies() {
        let mut undefined = false;
        for dim in t.condition_dimensions(c) {
            if let Some((_, ids)) = out.iter_mut().find(|(n, _)| *n == dim) {
                if ids.last() != Some(&c.strategy.id) {
                    ids.push(c.strategy.id);
                }
                undefined = true;
            }
        }
        if let Some(slot) = slots.as_ref().and_then(|s| Slot::at(s, c.slot)) {
            slot.mark_undefined_dimension(c.generation, undefined);
        }
    }
    out.retain(|(_, ids)| !ids.is_empty());
    for (name, ids) in &out {
        let list = ids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        ngx_log_error!(
            LogLevel::Warn.ngx_level(),
            log,
            "rate_ctl: dimension \"{name}\" is not defined in this nginx \
             (built in: ip, api, method, host; others need rate_ctl_dimension): \
             strategies {list} never match here"
        );
    }
    out
}

/// Where the value of dimension `name` comes from.
fn source_for(name: &str, mc: &MainConf) -> ValueSource {
    match name {
        // `ip/<len>`: the table's address ranges of one prefix length.
        "ip" => ValueSource::Ip,
        range if range.starts_with("ip/") => ValueSource::Ip,
        // `rate_ctl_dimension api ...;` rebinds it (raw `$uri`, flags).
        "api" => mc
            .dimension("api")
            .map_or(ValueSource::Api, ValueSource::Custom),
        "method" => ValueSource::Method,
        "host" => ValueSource::Host,
        other => mc
            .dimension(other)
            .map_or(ValueSource::Unbound, ValueSource::Custom),
    }
}

/// Worker start: load the table now (and log its state once).
pub fn start(mc: &MainConf, log: *mut ngx_log_t) {
    // Before the file is first mapped: a truncation under a worker then
    // fails open instead of killing it (see core::shm::sigbus).
    if let Err(e) = crate::core::shm::sigbus::install() {
        ngx_log_error!(
            LogLevel::Error.ngx_level(),
            log,
            "rate_ctl: cannot install the SIGBUS guard: {e}; a file truncated under a worker will crash it"
        );
    }
    let now_ns = super::time::monotonic_ns();
    with_worker(mc, |w| {
        w.refresh(mc, now_ns, log);
        // From now on requests are served: a large table published later
        // is built by a helper thread (core::shm::loader), not on the event loop.
        w.reader.set_background(true);
        // The test knob's PREACCESS panic is raised where the handler
        // finds the table due for a check: make it due for every request.
        if super::guard::test_panic_asked(super::guard::Entry::Preaccess) {
            w.reader.recheck_always();
        }
    });
    arm_watch_timer(mc);
}

/// How often a worker looks at the file's publish sequence without
/// waiting for a request (issue 29): a table published while nginx is idle
/// is built (on a helper thread from [`BACKGROUND_MIN`] strategies on) and
/// installed before requests need it.
///
/// [`BACKGROUND_MIN`]: crate::core::shm::loader::BACKGROUND_MIN
pub const WATCH_MS: ngx_msec_t = 5;

/// The watch timer: re-armed by its handler.
static WATCH_TIMER: WorkerTimer = WorkerTimer::new();

/// Arms the watch timer; its event's `data` is the main conf, which lives
/// in the cycle's pool for the worker's life.
fn arm_watch_timer(mc: &MainConf) {
    WATCH_TIMER.arm(
        watch_timer_handler,
        mc as *const MainConf as *mut c_void,
        WATCH_MS,
    );
}

/// One acquire load of the sequence when nothing changed; otherwise the
/// reader's refresh: starts the build of the new table (a helper thread
/// for a large one, inline for a small one) or installs a finished build.
extern "C" fn watch_timer_handler(ev: *mut ngx_event_t) {
    super::guard::guard("the table watch timer", ptr::null_mut(), (), || {
        // SAFETY: nginx passes the event armed by arm_watch_timer, whose
        // `data` is the main conf (alive for the worker's life) or null.
        let mc = unsafe { ((*ev).data as *const MainConf).as_ref() };
        let Some(mc) = mc else { return };
        // Re-armed first: a panic below (caught here) does not stop the
        // watch; requests still check the sequence themselves anyway.
        arm_watch_timer(mc);
        let now_ns = super::time::monotonic_ns();
        let log = cycle_log();
        with_existing_worker(|w| {
            w.refresh(mc, now_ns, log);
        });
    })
}

/// The worker's state. nginx runs a worker's HTTP handlers, init_process
/// and timers on its one event-loop thread, and only from there is this
/// reached (the module registers nothing that other threads run): a plain
/// static, without the thread-local lookup a shared library pays on every
/// access. `busy` refuses a re-entrant use instead of aliasing.
struct WorkerCell {
    busy: Cell<bool>,
    worker: UnsafeCell<Option<Worker>>,
}

// SAFETY: only nginx's worker thread touches the cell (see above), so it
// is never accessed from two threads.
unsafe impl Sync for WorkerCell {}

static WORKER: WorkerCell = WorkerCell {
    busy: Cell::new(false),
    worker: UnsafeCell::new(None),
};

/// Runs `f` with this worker's state, creating it on first use from the
/// `rate_ctl_shm` path. `None` if the state is already in use.
#[inline(always)]
pub fn with_worker<R>(mc: &MainConf, f: impl FnOnce(&mut Worker) -> R) -> Option<R> {
    if WORKER.busy.replace(true) {
        return None;
    }
    // SAFETY: one thread (see WorkerCell) and `busy` was false: no other
    // reference to the worker exists until `busy` is cleared below.
    let w = unsafe { &mut *WORKER.worker.get() };
    let w = w.get_or_insert_with(|| Worker::new(PathBuf::from(mc.shm_path()), mc.shm_owner));
    // Cleared however `f` ends: after a panic (caught at the FFI edge,
    // see super::guard) the next request finds the state free again.
    let _free = Free;
    Some(f(w))
}

/// Clears `busy` when dropped (also while unwinding).
struct Free;

impl Drop for Free {
    #[inline(always)]
    fn drop(&mut self) {
        WORKER.busy.set(false);
    }
}

/// [`with_worker`] for a worker state that exists already (timers, exit).
fn with_existing_worker(f: impl FnOnce(&mut Worker)) {
    if WORKER.busy.replace(true) {
        return;
    }
    let _free = Free;
    // SAFETY: as in with_worker.
    if let Some(w) = unsafe { &mut *WORKER.worker.get() } {
        f(w);
    }
}
