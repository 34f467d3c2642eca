//! The PREACCESS handler: refresh → values → decide → pass / delay / reject.
//! The decision is recorded in the request (see [`super::variables`]); the
//! concurrency units a request holds are kept in a cleanup of its pool,
//! which releases them when the request ends.

use std::ffi::c_void;
use std::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_add_timer, ngx_handle_read_event, ngx_handle_write_event, ngx_http_block_reading,
    ngx_http_core_run_phases, ngx_http_finalize_request, ngx_http_request_t, ngx_http_test_reading,
    ngx_http_variable_value_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_pool_cleanup_add,
    ngx_post_event, ngx_posted_events, ngx_table_elt_t, sockaddr_in, sockaddr_in6, AF_INET,
    AF_INET6, NGX_HTTP_INTERNAL_SERVER_ERROR,
};
use ngx::http::{
    HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, NgxHttpCoreModule, Request,
};
use ngx::ngx_log_error;

use smallvec::SmallVec;

use super::conf::{CustomDimension, LocConf, MainConf};
use super::decision::ReqStatus;
use super::ext::bytes_in_pool;
use super::guard::{guard, test_panic, Entry};
use super::time::{monotonic_ns, unix_ms};
use super::variables::{self, Decided};
use super::worker::{with_worker, Event, EventLog, ValueSource, Worker};
use super::RateCtlModule;
use crate::core::admit::{Decision, Verdict as Admission};
use crate::core::headers::{rate_limit_headers, HeaderStyle};
use crate::core::normalise::{self, Normalise};
use crate::core::table::{IpKey, Request as TableRequest, RequestOutcome, Scratch, Table, Values};

/// Concurrency units a request holds until it ends: their slots and
/// generations in the mapping that granted them (released there even if a
/// newer table or file was loaded since), never the table itself. Kept in a
/// cleanup of the request pool, so they are released however the request
/// ends (finished, aborted, errored).
pub type Hold = crate::core::table::Units;

extern "C" fn hold_cleanup(data: *mut c_void) {
    guard("the request cleanup", ptr::null_mut(), (), || {
        test_panic(Entry::Cleanup);
        // SAFETY: `data` is the Hold written by `keep_hold`; nginx runs each
        // pool cleanup once, when the request pool is destroyed.
        let hold = unsafe { ptr::read(data.cast::<Hold>()) };
        hold.release();
    })
}

/// Puts `hold` in a cleanup of the request pool; `false` (units released
/// at once) if nginx cannot allocate one.
fn keep_hold(r: &mut Request, hold: Hold) -> bool {
    let raw: &mut ngx_http_request_t = r.as_mut();
    // SAFETY: r->pool is the live request pool; the cleanup's data area is
    // sized and (word-)aligned for Hold, whose alignment is at most 8.
    let cln = unsafe { ngx_pool_cleanup_add(raw.pool, std::mem::size_of::<Hold>()) };
    if cln.is_null() {
        hold.release();
        return false;
    }
    const { assert!(std::mem::align_of::<Hold>() <= std::mem::align_of::<usize>()) };
    // SAFETY: cln was just allocated with room for a Hold at cln->data.
    unsafe {
        ptr::write((*cln).data.cast::<Hold>(), hold);
        (*cln).handler = Some(hold_cleanup);
    }
    true
}

/// Records the decision (see [`variables`](super::variables)) and keeps
/// the units it holds; `false` if either failed (the request then ends
/// with 500, holding nothing).
#[inline(always)]
fn record(
    r: &mut Request,
    mc: &MainConf,
    status: ReqStatus,
    strategy: u32,
    hold: Option<Hold>,
) -> bool {
    record_as(r, mc, status, strategy, hold, true)
}

/// [`record`], saying whether a strategy or the blacklist applied.
#[inline]
fn record_as(
    r: &mut Request,
    mc: &MainConf,
    status: ReqStatus,
    strategy: u32,
    hold: Option<Hold>,
    applied: bool,
) -> bool {
    let raw: &mut ngx_http_request_t = r.as_mut();
    let d = Decided {
        status,
        strategy,
        applied,
    };
    if !variables::record(raw, mc.decision_index, d) {
        if let Some(h) = hold {
            h.release();
        }
        return false;
    }
    match hold {
        Some(h) => keep_hold(r, h),
        None => true,
    }
}

/// The client address as the table keys it.
fn client_ip(raw: &ngx_http_request_t) -> Option<IpKey> {
    // SAFETY: r->connection and its sockaddr are valid for the request; the
    // family tells which sockaddr layout it is.
    unsafe {
        let sa = (*raw.connection).sockaddr;
        if sa.is_null() {
            return None;
        }
        match (*sa).sa_family as u32 {
            AF_INET => {
                let sin = &*sa.cast::<sockaddr_in>();
                Some(IpKey::v4(u32::from_be(sin.sin_addr.s_addr)))
            }
            AF_INET6 => {
                let sin6 = &*sa.cast::<sockaddr_in6>();
                Some(IpKey(u128::from_be_bytes(
                    sin6.sin6_addr.__in6_u.__u6_addr8,
                )))
            }
            _ => None,
        }
    }
}

fn str_bytes<'a>(s: &ngx::ffi::ngx_str_t) -> Option<&'a [u8]> {
    if s.len == 0 || s.data.is_null() {
        None
    } else {
        // SAFETY: request strings point to `len` bytes in the request's
        // buffers or pool, which outlive this handler call.
        Some(unsafe { std::slice::from_raw_parts(s.data, s.len) })
    }
}

/// The PREACCESS phase handler.
pub extern "C" fn preaccess_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    let log = r.log();
    // A panic declines: the request passes (fail open).
    guard("the PREACCESS handler", log, Status::NGX_DECLINED.0, || {
        handle(r).0
    })
}

#[inline(always)]
fn handle(r: &mut Request) -> Status {
    let Some(lc) = RateCtlModule::location_conf(r) else {
        return Status::NGX_DECLINED;
    };
    if !lc.enabled() {
        return Status::NGX_DECLINED;
    }
    let Some(mc) = RateCtlModule::main_conf(r) else {
        return Status::NGX_DECLINED;
    };
    // Decided already (resumed after a delay, an internal redirect after a
    // strategy applied, or a subrequest of a decided request, which shares
    // its main request's variables): never count a request twice.
    if variables::decided(r.as_ref(), mc.decision_index).is_some_and(|d| d.applied) {
        return Status::NGX_DECLINED;
    }
    let now_ns = monotonic_ns();
    let now_ms = unix_ms();
    let log = r.log();
    with_worker(
        mc,
        #[inline(always)]
        |w| {
            // Rejection summaries are written by the worker's timer (armed when
            // a window opens) and at exit, never on the request path. (The
            // test knob's PREACCESS panic is raised in this refresh's slow path.)
            w.refresh_request(mc, now_ns, log);
            let Worker {
                reader,
                sources,
                scratch,
                log,
                ..
            } = w;
            let Some(table) = reader.table() else {
                // No usable table: fail open.
                return act(r, mc, lc, log, None, None, now_ms, &|_, _| None);
            };
            let mut held = SmallVec::new();
            let mut d = Decision::pass();
            let outcome = decide(
                table, sources, scratch, log, mc, r, now_ns, now_ms, lc, &mut held, &mut d,
            );
            // The units the request holds (most hold none: no call then).
            let hold = table.units_with_keys(&held, scratch);
            // Issue 31: what it settles in the LOG phase (count_if, cost_after).
            if table.is_responsive() {
                super::log_phase::after_decide(r, mc, table, scratch, sources, now_ms);
            }
            let key_of = |r: &Request, id: u32| key_text(reader, sources, mc, r, id);
            act(r, mc, lc, log, Some((&outcome, &d)), hold, now_ms, &key_of)
        },
    )
    // The worker state is busy only if nginx re-entered us: let it pass.
    .unwrap_or(Status::NGX_DECLINED)
}

/// The request's dimension values, read from it only for the dimensions
/// the table looks up.
struct RequestValues<'a> {
    r: &'a Request,
    mc: &'a MainConf,
    sources: &'a [ValueSource],
    /// Which first bytes the query string's items have, once a `$arg`
    /// dimension was found absent (see `variables::dimension_value`).
    args_seen: std::cell::Cell<u64>,
}

impl<'a> RequestValues<'a> {
    fn new(r: &'a Request, mc: &'a MainConf, sources: &'a [ValueSource]) -> Self {
        RequestValues {
            r,
            mc,
            sources,
            args_seen: std::cell::Cell::new(0),
        }
    }

    /// The table's view of this request, without a clock, dry run or
    /// quota (what building a key needs; the decision sets those). The
    /// table matches `ip` (and the blacklist checks it) on the binary
    /// address: no text form.
    fn request(&self) -> TableRequest<'_, Self> {
        TableRequest {
            values: self,
            ip: client_ip(self.r.as_ref()),
            now_ns: 0,
            now_unix_ms: 0,
            dry_run: false,
            quota: false,
        }
    }
}

impl Values for RequestValues<'_> {
    #[inline(always)]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self.read(dim, variables::dimension_value)
    }

    /// A custom dimension's reader inlined too (see
    /// [`Values::value_inline`]); the other sources out of line, so the
    /// caller holds only this path.
    #[inline(always)]
    fn value_inline(&self, dim: usize) -> Option<&[u8]> {
        match self.sources.get(dim) {
            Some(&ValueSource::Custom(i)) => self
                .mc
                .dimensions
                .get(i)
                .and_then(|d| variables::dimension_value_inline(self.r, d, &self.args_seen)),
            _ => self.value_other(dim),
        }
    }

    /// [`value_inline`](Values::value_inline)'s path, a custom dimension
    /// compared where the reader finds it (a plain `$arg` in the query
    /// string, without finding the value's end first).
    #[inline(always)]
    fn differs(&self, dim: usize, not: &[u8]) -> bool {
        match self.sources.get(dim) {
            Some(&ValueSource::Custom(i)) => self.mc.dimensions.get(i).is_none_or(|d| {
                variables::dimension_differs_inline(self.r, d, &self.args_seen, not)
            }),
            _ => crate::core::table::value_differs(self.value_other(dim), not),
        }
    }
}

impl<'a> RequestValues<'a> {
    /// [`Values::value`] out of line, for `value_inline`'s other sources.
    #[inline(never)]
    fn value_other(&self, dim: usize) -> Option<&'a [u8]> {
        self.read(dim, variables::dimension_value)
    }
}

impl<'a> RequestValues<'a> {
    /// The value of dimension `dim`, a custom dimension's read by `custom`.
    #[inline(always)]
    fn read(
        &self,
        dim: usize,
        custom: for<'r> fn(
            &'r Request,
            &CustomDimension,
            &std::cell::Cell<u64>,
        ) -> Option<&'r [u8]>,
    ) -> Option<&'a [u8]> {
        let rr: &ngx_http_request_t = self.r.as_ref();
        match *self.sources.get(dim)? {
            ValueSource::Ip | ValueSource::Unbound => None,
            // `$uri`, `path` normalised (see `api_normalised`): a short
            // URI of the request line without `;` and a trailing `/` is
            // used as it is.
            ValueSource::Api => {
                let v = str_bytes(&rr.uri)?;
                if ptr::eq(rr.uri.data, rr.uri_start)
                    && rr.complex_uri() == 0
                    && normalise::short_path_plain(v)
                {
                    Some(v)
                } else {
                    api_normalised(self.r, v)
                }
            }
            ValueSource::Method => str_bytes(&rr.method_name),
            ValueSource::Host => host_value(self.r, rr),
            ValueSource::Custom(i) => self
                .mc
                .dimensions
                .get(i)
                .and_then(|d| custom(self.r, d, &self.args_seen)),
        }
    }
}

/// The built-in `host`'s value: the request's `Host`, else the server's
/// name. Out of line: the value reader stays small enough to be inlined
/// into the handler.
#[inline(never)]
fn host_value<'r>(r: &'r Request, rr: &'r ngx_http_request_t) -> Option<&'r [u8]> {
    str_bytes(&rr.headers_in.server)
        .or_else(|| NgxHttpCoreModule::server_conf(r).and_then(|cscf| str_bytes(&cscf.server_name)))
}

/// The built-in `api`'s value `v` (`$uri`) `path` normalised (`/login/`,
/// `/login;x=1` are `/login`): the URI itself unless it has a `;`, `//` or
/// a trailing `/`. The value reader calls it only for what its quick check
/// cannot tell: most URIs are the request line's own bytes (`uri.data` is
/// `uri_start`: nginx copies the URI when it parsed a `//`, `%`, `/.`, `\`
/// or `#` in it, setting `complex_uri`/`quoted_uri`, and a rewrite gives
/// it other bytes), so without `//`, and a short one is checked for `;`
/// and a trailing `/` in a few instructions. Out of line: the reader stays
/// small.
#[inline(never)]
fn api_normalised<'r>(r: &'r Request, v: &'r [u8]) -> Option<&'r [u8]> {
    super::ext::normalised(r, v, Normalise::PATH)
}

/// Blacklist, match and admit with the worker's current table. The
/// concurrency strategies the request holds go to `held`, its per-key
/// units to the working space (see `Table::units_with_keys`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn decide(
    table: &Table,
    sources: &[ValueSource],
    scratch: &mut Scratch,
    log: &mut EventLog,
    mc: &MainConf,
    r: &Request,
    now_ns: u64,
    now_ms: u64,
    lc: &LocConf,
    held: &mut SmallVec<[u32; 2]>,
    out: &mut Decision,
) -> RequestOutcome<()> {
    let values = RequestValues::new(r, mc, sources);
    let outcome = table.decide_in(
        &TableRequest {
            now_ns,
            now_unix_ms: now_ms,
            dry_run: lc.dry_run(),
            quota: lc.headers() != HeaderStyle::Off,
            ..values.request()
        },
        held,
        scratch,
        out,
    );
    // One flag read per request; what it stands for is taken out of line.
    if scratch.has_notices() {
        notices(table, sources, log, mc, r, lc, now_ms, scratch);
    }
    outcome
}

/// Logs what the request left to report (rare, out of line): a new key
/// that found the key table full, what a rejection did to its key's ban
/// count (issue 32; the key as text from the request built again).
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn notices(
    table: &Table,
    sources: &[ValueSource],
    log: &mut EventLog,
    mc: &MainConf,
    r: &Request,
    lc: &LocConf,
    now_ms: u64,
    scratch: &mut Scratch,
) {
    let n = scratch.take_notices();
    if let Some((id, on_full)) = n.key_full {
        key_table_full(log, lc, r, id, on_full, now_ms);
    }
    if let Some(e) = n.ban {
        let values = RequestValues::new(r, mc, sources);
        let key = table.key_text(e.strategy_id, &values.request());
        super::bans::log_ban(lc, r, e, key);
    }
}

/// Logs that a new key of strategy `id` found the key table full: at most
/// one line per strategy per second (the rest summarised). Cold, out of
/// line: the handler stays small enough for the inliner.
#[cold]
#[inline(never)]
fn key_table_full(
    log: &mut EventLog,
    lc: &LocConf,
    r: &Request,
    id: u32,
    on_full: impl std::fmt::Display,
    now_ms: u64,
) {
    let level = lc.log_level().lower();
    if log.record(id, Event::KeyTableFull, level, now_ms) {
        ngx_log_error!(
            level.ngx_level(),
            r.log(),
            "rate_ctl: strategy {id}: a new key found the key table full (on_full {on_full}); \
             see rate_ctl_key_table_full_total, or give the agent more --keys"
        );
    }
}

/// The key of per-key strategy `id` for request `r`, as text (`None`: no
/// table, not a per-key strategy, or an empty value).
fn key_text(
    reader: &crate::core::shm::reader::Reader,
    sources: &[ValueSource],
    mc: &MainConf,
    r: &Request,
    id: u32,
) -> Option<String> {
    let values = RequestValues::new(r, mc, sources);
    reader.table()?.key_text(id, &values.request())
}

/// `$rate_ctl_key`: the key of the per-key strategy that decided the
/// request (`$rate_ctl_strategy`), as text; not found otherwise. Formatted
/// only when read.
pub unsafe extern "C" fn key_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    unsafe { variables::guarded(r, v, || key_value(r, v)) }
}

fn key_value(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    let (r, v) = unsafe { (Request::from_ngx_http_request(r), &mut *v) };
    let id = variables::decision_of(r)
        .map(|d| d.strategy)
        .filter(|&id| id != 0);
    let text = match (id, RateCtlModule::main_conf(r)) {
        (Some(id), Some(mc)) => {
            with_worker(mc, |w| key_text(&w.reader, &w.sources, mc, r, id)).flatten()
        }
        _ => None,
    };
    let Some(text) = text else {
        variables::not_found(v);
        return Status::NGX_OK.0;
    };
    let Some(s) = bytes_in_pool(r, text.as_bytes()) else {
        return Status::NGX_ERROR.0;
    };
    variables::set_value(v, s.data, s.len);
    Status::NGX_OK.0
}

/// How a log line names the key of the strategy that decided.
type KeyOf<'a> = &'a dyn Fn(&Request, u32) -> Option<String>;

/// Records the decision in the request context and answers: pass on,
/// delay, or refuse.
#[allow(clippy::too_many_arguments)]
fn act(
    r: &mut Request,
    mc: &MainConf,
    lc: &LocConf,
    events: &mut EventLog,
    outcome: Option<(&RequestOutcome<()>, &Decision)>,
    hold: Option<Hold>,
    now_ms: u64,
    key_of: KeyOf<'_>,
) -> Status {
    let error = Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    let d = match outcome {
        Some((RequestOutcome::Limited(()), d)) => d,
        Some((&RequestOutcome::Allowed { id }, _)) => {
            return if record(r, mc, ReqStatus::Allowed, id, hold) {
                Status::NGX_DECLINED
            } else {
                error
            };
        }
        other => {
            let (status, answer, blacklisted) = match other {
                // A dry-run location only reports what it would have refused.
                Some((RequestOutcome::Blacklisted { .. }, _)) if lc.dry_run() => {
                    (ReqStatus::DryRunRejected, Status::NGX_DECLINED, true)
                }
                Some((RequestOutcome::Blacklisted { .. }, _)) => {
                    let answer = Status(lc.blacklist_status() as ngx_int_t);
                    (ReqStatus::Blacklisted, answer, true)
                }
                None => (ReqStatus::FailOpen, Status::NGX_DECLINED, false),
                _ => (ReqStatus::Passed, Status::NGX_DECLINED, false),
            };
            // Matching nothing (or no table) leaves the request open to
            // the next location's strategies.
            if !record_as(r, mc, status, 0, hold, blacklisted) {
                return error;
            }
            if blacklisted {
                log_event(
                    r,
                    events,
                    0,
                    Event::Blacklisted,
                    lc.log_level(),
                    now_ms,
                    None,
                );
            }
            return answer;
        }
    };
    if let (Admission::Pass, None, None, None) =
        (&d.verdict, d.dry_run_rejected, &d.tightest, d.would_delay)
    {
        // The plain pass: most requests.
        return if record(r, mc, ReqStatus::Passed, d.passed_by.unwrap_or(0), hold) {
            Status::NGX_DECLINED
        } else {
            error
        };
    }
    let (status, strategy) = match (d.verdict, d.dry_run_rejected) {
        (Admission::Pass, Some(id)) => (ReqStatus::DryRunRejected, id),
        (Admission::Pass, None) => match d.would_delay {
            Some((id, _)) => (ReqStatus::DryRunDelayed, id),
            None => (ReqStatus::Passed, d.passed_by.unwrap_or(0)),
        },
        (Admission::Delay { id, .. }, _) => (ReqStatus::Delayed, id),
        (Admission::Reject { id, .. }, _) => (ReqStatus::Rejected, id),
    };
    if !record(r, mc, status, strategy, hold) {
        return error;
    }
    // `rate_ctl_headers` (the quota is computed only when it is not off).
    let style = lc.headers();
    if style != HeaderStyle::Off {
        let retry = match d.verdict {
            Admission::Reject { retry_after_ns, .. } => Some(retry_after_ns),
            _ => None,
        };
        add_rate_limit_headers(r, style, d.tightest, retry);
    }
    match d.verdict {
        Admission::Pass => {
            if let Some(id) = d.dry_run_rejected {
                let level = lc.log_level();
                log_event(
                    r,
                    events,
                    id,
                    Event::DryRunRejected,
                    level,
                    now_ms,
                    Some(key_of),
                );
            } else if let Some((id, wait_ns)) = d.would_delay {
                let level = lc.log_level().lower();
                if events.record(id, Event::DryRunDelayed, level, now_ms) {
                    let ms = wait_ns.div_ceil(1_000_000);
                    ngx_log_error!(
                        level.ngx_level(),
                        r.log(),
                        "rate_ctl: would delay request by {ms} ms (dry run) by strategy {id}"
                    );
                }
            }
            Status::NGX_DECLINED
        }
        Admission::Reject { id, status, .. } => {
            // Retry-After went out with the headers above.
            let level = lc.log_level();
            log_event(r, events, id, Event::Rejected, level, now_ms, Some(key_of));
            Status(status.unwrap_or(lc.status()) as ngx_int_t)
        }
        Admission::Delay { id, wait_ns } => {
            let level = lc.log_level().lower();
            log_event(r, events, id, Event::Delayed, level, now_ms, Some(key_of));
            let ms = wait_ns.div_ceil(1_000_000);
            if ms == 0 || background(r) {
                return Status::NGX_DECLINED;
            }
            start_delay(r, ms)
        }
    }
}

fn log_event(
    r: &Request,
    events: &mut EventLog,
    id: u32,
    event: Event,
    level: super::parse::LogLevel,
    now_ms: u64,
    key_of: Option<KeyOf<'_>>,
) {
    if events.record(id, event, level, now_ms) {
        let key = key_of.and_then(|k| k(r, id));
        let what = match event {
            Event::Rejected => "rejecting request",
            Event::Delayed => "delaying request",
            Event::DryRunRejected => "would reject request (dry run)",
            Event::DryRunDelayed => "would delay request (dry run)",
            Event::Blacklisted => "refusing blacklisted request",
            Event::KeyTableFull => "key table full for a new key",
        };
        if id == 0 {
            ngx_log_error!(level.ngx_level(), r.log(), "rate_ctl: {what}");
        } else if let Some(key) = key {
            ngx_log_error!(
                level.ngx_level(),
                r.log(),
                "rate_ctl: {what} by strategy {id} for key {key}"
            );
        } else {
            ngx_log_error!(
                level.ngx_level(),
                r.log(),
                "rate_ctl: {what} by strategy {id}"
            );
        }
    }
}

/// The `rate_ctl_headers` of this request (formatted by core::headers).
/// Out of line: its header buffers stay off the handler's stack frame.
#[inline(never)]
fn add_rate_limit_headers(
    r: &mut Request,
    style: HeaderStyle,
    tightest: Option<(u32, crate::core::limiter::Quota)>,
    retry_after_ns: Option<u64>,
) {
    let (headers, n) = rate_limit_headers(style, tightest, retry_after_ns);
    for h in headers[..n].iter().flatten() {
        add_header(r, h.name, h.value());
    }
}

/// Adds `name: value` to the response headers; the name is static, the
/// value is copied into the request pool.
fn add_header(r: &mut Request, name: &'static str, value: &[u8]) {
    // SAFETY: the request pool is live; we allocate `len` bytes from it.
    let data = unsafe { ngx_pnalloc(r.pool().as_ptr(), value.len()) }.cast::<u8>();
    if data.is_null() {
        return;
    }
    // SAFETY: data has room for value.len() bytes.
    unsafe { ptr::copy_nonoverlapping(value.as_ptr(), data, value.len()) };
    let value = ngx::ffi::ngx_str_t {
        len: value.len(),
        data,
    };
    let raw: &mut ngx_http_request_t = r.as_mut();
    // SAFETY: headers_out.headers is the request's initialised header list;
    // a pushed element is zeroed (covering every nginx version's fields)
    // and then filled with a static name and the pool-allocated value.
    unsafe {
        let h = ngx_list_push(&mut raw.headers_out.headers).cast::<ngx_table_elt_t>();
        if h.is_null() {
            return;
        }
        ptr::write_bytes(h, 0, 1);
        (*h).hash = 1;
        (*h).key.len = name.len();
        (*h).key.data = name.as_ptr().cast_mut();
        (*h).value = value;
    }
}

/// A background subrequest (`mirror`, cache updates): the connection's
/// events go to the main request, so a timer could never resume it; its
/// wait is charged but not served.
fn background(r: &Request) -> bool {
    let raw: &ngx_http_request_t = r.as_ref();
    raw.background() != 0
}

/// Delays the request by `ms` like limit_req: a timer on the write event,
/// the read side watched for a client that goes away, then the phases run
/// again (and this handler declines, the decision being recorded).
fn start_delay(r: &mut Request, ms: u64) -> Status {
    let raw: &mut ngx_http_request_t = r.as_mut();
    // SAFETY: the request's connection and its events are valid; this is
    // the sequence nginx's limit_req module uses to suspend a request.
    unsafe {
        let c = raw.connection;
        if (*(*c).read).ready() != 0 {
            ngx_post_event((*c).read, ptr::addr_of_mut!(ngx_posted_events));
        } else if ngx_handle_read_event((*c).read, 0) != Status::NGX_OK.0 {
            return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
        }
        raw.read_event_handler = Some(ngx_http_test_reading);
        raw.write_event_handler = Some(delay_handler);
        (*(*c).write).set_delayed(1);
        ngx_add_timer((*c).write, ms as ngx::ffi::ngx_msec_t);
    }
    Status::NGX_AGAIN
}

extern "C" fn delay_handler(r: *mut ngx_http_request_t) {
    guard("the delay handler", ptr::null_mut(), (), || delay_resume(r))
}

fn delay_resume(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls the write event handler with the live request
    // whose handlers `start_delay` installed.
    unsafe {
        let c = (*r).connection;
        let wev = (*c).write;
        if (*wev).delayed() != 0 {
            // Woken before the timer (the socket became writable): wait on.
            if ngx_handle_write_event(wev, 0) != Status::NGX_OK.0 {
                ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
            }
            return;
        }
        if ngx_handle_read_event((*c).read, 0) != Status::NGX_OK.0 {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
            return;
        }
        (*r).read_event_handler = Some(ngx_http_block_reading);
        (*r).write_event_handler = Some(ngx_http_core_run_phases);
        ngx_http_core_run_phases(r);
    }
}
