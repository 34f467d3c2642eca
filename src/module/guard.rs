//! The FFI edge fails open: every `extern "C"` entry of the module runs
//! its body through [`guard`], which catches a panic (the module is built
//! with the default `panic = "unwind"`: no Cargo profile sets `abort`) and
//! returns the entry's fail-open value instead — the phase handler
//! declines (the request passes), a variable getter reports "not found",
//! a hook or cleanup does nothing more. Unwinding into nginx's C frames
//! would abort the worker.
//!
//! One `alert` line per worker per minute names the entry and the panic's
//! message (escaped); the panic hook keeps Rust's own report off stderr
//! (which nginx sends to error.log) for panics of the worker's thread.
//!
//! `RATE_CTL_TEST_PANIC=ENTRY` in a worker's environment (nginx's `env`
//! directive) makes that entry panic: how `t-nginx/18-ffi-panic.t` proves
//! the above. Read once per worker at start; the request path has no
//! check of its own (the PREACCESS panic is raised on the slow path of the
//! handler's table check, see `Worker::refresh_request`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, Once};

use ngx::ffi::ngx_log_t;
use ngx::ngx_log_error;

use crate::core::escape::escape_bytes;

/// The entries a test may make panic (`RATE_CTL_TEST_PANIC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Entry {
    None = 0,
    Preaccess = 1,
    Variable = 2,
    Cleanup = 3,
    InitProcess = 4,
    ExitProcess = 5,
    Stats = 6,
    Timer = 7,
}

impl Entry {
    fn from_name(name: &str) -> Entry {
        match name {
            "preaccess" => Entry::Preaccess,
            "variable" => Entry::Variable,
            "cleanup" => Entry::Cleanup,
            "init_process" => Entry::InitProcess,
            "exit_process" => Entry::ExitProcess,
            "stats" => Entry::Stats,
            "timer" => Entry::Timer,
            _ => Entry::None,
        }
    }
}

static TEST_PANIC: AtomicU8 = AtomicU8::new(Entry::None as u8);

/// Reads `RATE_CTL_TEST_PANIC` (worker start).
pub fn read_test_knob() {
    if let Ok(v) = std::env::var("RATE_CTL_TEST_PANIC") {
        TEST_PANIC.store(Entry::from_name(&v) as u8, Ordering::Relaxed);
    }
}

/// Panics if a test asked `entry` to.
#[inline(always)]
pub fn test_panic(entry: Entry) {
    if TEST_PANIC.load(Ordering::Relaxed) == entry as u8 {
        test_panic_now(entry);
    }
}

/// Whether a test asked `entry` to panic (worker start).
pub fn test_panic_asked(entry: Entry) -> bool {
    TEST_PANIC.load(Ordering::Relaxed) == entry as u8
}

#[cold]
#[inline(never)]
fn test_panic_now(entry: Entry) {
    panic!("RATE_CTL_TEST_PANIC asked {entry:?} to panic \x1b[31m(test)");
}

/// The last panic's message and place on the worker's thread, from the
/// hook (taken by the alert line).
static LAST: Mutex<Option<String>> = Mutex::new(None);
/// The worker's event-loop thread (`pthread_self`), whose panics the hook
/// keeps quiet: they are caught by [`guard`] and reported there.
static WORKER_THREAD: AtomicU64 = AtomicU64::new(0);

fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// Installs the panic hook once per process (worker start) and records
/// the worker's thread: a panic there is recorded for [`guard`]'s alert
/// line; any other (helper threads) goes to the previous hook.
pub fn install_hook() {
    WORKER_THREAD.store(this_thread(), Ordering::Relaxed);
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if this_thread() != WORKER_THREAD.load(Ordering::Relaxed) {
                return previous(info);
            }
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            if let Ok(mut last) = LAST.lock() {
                *last = Some(format!("{msg}{at}"));
            }
        }));
    });
}

/// When the last alert line was written (unix ms).
static LAST_ALERT_MS: AtomicU64 = AtomicU64::new(0);
/// Panics caught since the last alert line.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
const ALERT_EVERY_MS: u64 = 60_000;

/// Runs `f`; a panic in it is caught and `fallback` returned (see the
/// module's doc). `log` is where the alert line goes (null: the cycle's).
#[inline(always)]
pub fn guard<T>(entry: &'static str, log: *mut ngx_log_t, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            caught(entry, log);
            fallback
        }
    }
}

#[cold]
#[inline(never)]
fn caught(entry: &'static str, log: *mut ngx_log_t) {
    let what = LAST
        .lock()
        .ok()
        .and_then(|mut l| l.take())
        .unwrap_or_else(|| "(no message)".into());
    let now = super::time::unix_ms();
    let last = LAST_ALERT_MS.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < ALERT_EVERY_MS {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    LAST_ALERT_MS.store(now.max(1), Ordering::Relaxed);
    let more = SUPPRESSED.swap(0, Ordering::Relaxed);
    let log = if log.is_null() {
        super::ext::cycle_log()
    } else {
        log
    };
    if log.is_null() {
        return;
    }
    ngx_log_error!(
        ngx::ffi::NGX_LOG_ALERT as usize,
        log,
        "rate_ctl: internal error (panic) in {entry}: {}; failing open (a request passes); \
         {more} more since the last such line, at most one a minute",
        escape_bytes(what.as_bytes(), 512)
    );
}
