//! The LOG phase (issue 31): a request admitted by strategies with
//! `count_if` or `cost_after` settles its charge when it ends, with its
//! final status and the `cost_after` dimension's value then.
//!
//! The PREACCESS handler keeps what the request owes ([`Owing`]: the
//! mapping, and per strategy its slot or key entry) in a cleanup of the
//! request pool (dropped with the pool whatever happens) and points the
//! module's request context at it. The LOG handler reads that one pointer:
//! a request rate_ctl did not charge this way costs one load and a branch.
//!
//! An internal redirect (`error_page`, `try_files` to a named location…)
//! clears nginx's request contexts, so the LOG handler finds nothing: the
//! pool cleanup then settles what is still owed with the request's final
//! status when the request is freed (`count_if` charged if it matches;
//! `cost_after` not read there: what was charged up front stays).
//! Subrequests settle nothing (only the main request has a LOG phase).

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;

use ngx::core::Status;
use ngx::ffi::{ngx_http_request_t, ngx_int_t, ngx_pool_cleanup_add};
use ngx::http::{HttpModule, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use super::conf::MainConf;
use super::parse::LogLevel;
use super::time::{self, unix_ms};
use super::variables;
use super::worker::ValueSource;
use super::RateCtlModule;
use crate::core::model::response::parse_cost;
use crate::core::response::Owing;

/// The module's context index (set by nginx before any request).
#[inline(always)]
fn ctx_index() -> usize {
    RateCtlModule::module().ctx_index
}

/// What `keep` puts in the request pool's cleanup: the charges still
/// owed (taken by the LOG handler) and the request they belong to.
struct Kept {
    owing: Option<Owing>,
    r: *mut ngx_http_request_t,
}

extern "C" fn owing_cleanup(data: *mut c_void) {
    let kept = data.cast::<Kept>();
    // SAFETY: `data` is the Kept written by `keep`; nginx runs each pool
    // cleanup once, when the request pool is destroyed (after the LOG
    // phase, which takes the charges out unless an internal redirect
    // cleared the context that points at them).
    let (owing, r) = unsafe { ((*kept).owing.take(), (*kept).r) };
    if let Some(owing) = owing {
        settle_late(r, owing);
    }
    // SAFETY: as above; dropped once, here.
    unsafe { ptr::drop_in_place(kept) };
}

/// Settles, when the request is freed, what its LOG phase did not (an
/// internal redirect cleared the context): with the final status only
/// (no variable is read while the pool goes).
#[cold]
#[inline(never)]
fn settle_late(r: *mut ngx_http_request_t, owing: Owing) {
    let settle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the request is allocated in the pool being destroyed,
        // whose cleanups run before any of its memory is freed
        // (ngx_destroy_pool), so `r` and its status fields are live.
        let status = final_status(unsafe { &*r });
        let now = time::now();
        owing.settle(status, now, |_| None);
    }));
    if settle.is_err() {
        // SAFETY: ngx_http_free_request destroys the request pool before
        // ngx_http_close_connection: the connection and its log are live.
        unsafe { log_settle_failure(r) };
    }
}

/// Keeps what request `r` settles when it ends. `cost_after` dimensions
/// are turned from the table's indexes (`sources`) into the main conf's
/// `rate_ctl_dimension` indexes, which outlive any table. `false` (nothing
/// kept: the request keeps what it was charged) if nginx cannot allocate.
pub fn keep(r: &mut Request, mut owing: Owing, sources: &[ValueSource]) -> bool {
    for item in &mut owing.items {
        item.after_dim = match item.after_dim.and_then(|d| sources.get(d)) {
            Some(&ValueSource::Custom(i)) => Some(i),
            _ => None,
        };
    }
    let raw: &mut ngx_http_request_t = r.as_mut();
    // SAFETY: r->pool is the live request pool; the cleanup's data area
    // is sized and (word-)aligned for Kept (alignment ≤ 8).
    let cln = unsafe { ngx_pool_cleanup_add(raw.pool, std::mem::size_of::<Kept>()) };
    if cln.is_null() {
        return false;
    }
    const { assert!(std::mem::align_of::<Kept>() <= std::mem::align_of::<usize>()) };
    let req: *mut ngx_http_request_t = raw;
    // SAFETY: cln was just allocated with room for a Kept; the context
    // array has one entry per HTTP module, ours at ctx_index.
    unsafe {
        let data = (*cln).data.cast::<Kept>();
        ptr::write(
            data,
            Kept {
                owing: Some(owing),
                r: req,
            },
        );
        (*cln).handler = Some(owing_cleanup);
        *raw.ctx.add(ctx_index()) = data.cast();
    }
    true
}

/// After the decision (PREACCESS): keeps what the request owes and logs
/// an invalid `cost_from` value. Only for a table with response options.
#[cold]
#[inline(never)]
pub fn after_decide(
    r: &mut Request,
    mc: &MainConf,
    table: &crate::core::table::Table,
    scratch: &mut crate::core::table::Scratch,
    sources: &[ValueSource],
    now_ms: u64,
) {
    if let Some(id) = scratch.response.bad_cost.take() {
        bad_cost(r, mc, id, "cost_from", now_ms);
    }
    if let Some(owing) = table.owing(scratch) {
        keep(r, owing, sources);
    }
}

/// The LOG phase handler: one load and a branch for a request that owes
/// nothing (the rest out of line).
pub extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a valid request whose ctx
    // array has an entry per HTTP module.
    let data = unsafe { *(*r).ctx.add(ctx_index()) };
    if !data.is_null() {
        settle_request(r, data);
    }
    Status::NGX_OK.0
}

/// [`log_handler`] for a request that owes something.
#[cold]
#[inline(never)]
fn settle_request(r: *mut ngx_http_request_t, data: *mut c_void) {
    let settle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: a non-null context of ours is the Kept `keep` wrote in
        // the request pool's cleanup, live until the pool goes; taken once
        // (the context is cleared here, the cleanup finds None).
        let owing = unsafe {
            *(*r).ctx.add(ctx_index()) = ptr::null_mut();
            (*data.cast::<Kept>()).owing.take()
        };
        // SAFETY: as above, a valid request.
        let req = unsafe { Request::from_ngx_http_request(r) };
        if let Some(owing) = owing {
            settle(req, owing);
        }
    }));
    if settle.is_err() {
        // SAFETY: the request and its connection are live (LOG phase).
        unsafe { log_settle_failure(r) };
    }
}

/// One error line for a settle that panicked (the guard caught it).
///
/// # Safety
/// `r` is a live request whose connection (and its log) is live.
unsafe fn log_settle_failure(r: *mut ngx_http_request_t) {
    // SAFETY: the caller guarantees `r` and its connection are live.
    let log = unsafe { (*(*r).connection).log };
    ngx_log_error!(
        LogLevel::Error.ngx_level(),
        log,
        "rate_ctl: internal error settling a request's charge (count_if, cost_after); nothing settled"
    );
}

/// The request's final status as `$status` gives it.
fn final_status(raw: &ngx_http_request_t) -> u16 {
    let s = if raw.err_status != 0 {
        raw.err_status
    } else {
        raw.headers_out.status
    };
    u16::try_from(s).unwrap_or(0)
}

fn settle(r: &Request, owing: Owing) {
    let raw: &ngx_http_request_t = r.as_ref();
    let status = final_status(raw);
    let Some(mc) = RateCtlModule::main_conf(r) else {
        return;
    };
    let now = time::now();
    let bad = Cell::new(None);
    owing.settle(status, now, |item| {
        let d = mc.dimensions.get(item.after_dim?)?;
        let v = variables::dimension_value(r, d, &Cell::new(0))?;
        let cost = parse_cost(v);
        if cost.is_none() {
            bad.set(Some(item.id));
        }
        cost
    });
    if let Some(id) = bad.get() {
        bad_cost(r, mc, id, "cost_after", unix_ms());
    }
}

thread_local! {
    /// The minute of the last "invalid cost" line (one a minute per worker).
    static BAD_COST_MINUTE: Cell<u64> = const { Cell::new(0) };
}

/// Logs (at most once a minute per worker) that strategy `id`'s cost
/// dimension held something other than an integer 1 … 1,000,000.
pub fn bad_cost(r: &Request, mc: &MainConf, id: u32, field: &str, now_ms: u64) {
    let _ = mc;
    let minute = now_ms / 60_000 + 1;
    if BAD_COST_MINUTE.with(|m| m.replace(minute)) == minute {
        return;
    }
    ngx_log_error!(
        LogLevel::Warn.ngx_level(),
        r.log(),
        "rate_ctl: strategy {id}: the {field} dimension's value is not an integer 1-1000000; charged {} (at most one such line a minute)",
        if field == "cost_from" { "1" } else { "what was charged up front" }
    );
}
