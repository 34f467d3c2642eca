//! `$rate_ctl_status` and `$rate_ctl_strategy`, for access logs, and the
//! per-request record of what rate_ctl decided, which they read.
//!
//! # Where the decision lives
//! A request is decided once a strategy or the blacklist applied to it:
//! later visits of the PREACCESS phase (after a delay, an internal
//! redirect, a jump to a named location, or in a subrequest) must not
//! count it again, and the variables must still report it. A request that
//! matched nothing is recorded too (`PASSED`, no strategy) but not as
//! applied, so the next location evaluates it (see [`Decided::applied`]). nginx clears the
//! module contexts on an internal redirect, but not the request's array of
//! indexed variable values (`r->variables`, allocated with the request and
//! shared with its subrequests). So the decision is written there, in the
//! slot of a variable of this module that has no name lookup
//! (`NGX_HTTP_VAR_NOHASH`): one word of memory the request already has, no
//! allocation and no pool cleanup per request (like `limit_req`, which
//! keeps its status in three bits of the request). See [`record`].

use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_flushed_variable, ngx_http_get_variable_index,
    ngx_http_request_t, ngx_http_variable_t, ngx_http_variable_value_t, ngx_str_t, ngx_uint_t,
    NGX_HTTP_VAR_NOCACHEABLE, NGX_HTTP_VAR_NOHASH, NGX_HTTP_VAR_PREFIX,
};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule, Request};
use ngx::ngx_string;

use std::cell::Cell;

use super::conf::{ArgKind, CustomDimension, DimensionValue};
use super::decision::ReqStatus;
use super::ext::number_in_pool;
use super::parse;
use super::RateCtlModule;

pub(super) type GetHandler =
    unsafe extern "C" fn(*mut ngx_http_request_t, *mut ngx_http_variable_value_t, usize) -> isize;

/// The hidden variable whose per-request slot holds the decision.
const DECISION: &str = "rate_ctl_internal_decision";

fn static_str(s: &'static str) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr().cast_mut(),
    }
}

/// Registers the variables; called from preconfiguration. `key` is the
/// getter of `$rate_ctl_key`, which lives with the request path
/// (`handler.rs`).
///
/// # Safety
/// `cf` must be the configuration nginx passes to preconfiguration.
pub unsafe fn add_variables(cf: *mut ngx_conf_t, key: GetHandler) -> Status {
    let vars: [(ngx_str_t, GetHandler, u32); 4] = [
        (
            ngx_string!("rate_ctl_status"),
            status_variable,
            NGX_HTTP_VAR_NOCACHEABLE,
        ),
        (
            ngx_string!("rate_ctl_strategy"),
            strategy_variable,
            NGX_HTTP_VAR_NOCACHEABLE,
        ),
        (
            static_str(DECISION),
            undecided_variable,
            NGX_HTTP_VAR_NOHASH,
        ),
        (ngx_string!("rate_ctl_key"), key, NGX_HTTP_VAR_NOCACHEABLE),
    ];
    for (mut name, get, flags) in vars {
        // SAFETY: cf is valid (contract); nginx copies the name.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, flags as _) };
        if v.is_null() {
            return Status::NGX_ERROR;
        }
        // SAFETY: v was just returned non-null by nginx.
        unsafe {
            (*v).get_handler = Some(get);
            (*v).data = 0;
        }
    }
    Status::NGX_OK
}

/// Gives the decision variable its index (its slot in every request's
/// `r->variables`); called from postconfiguration.
///
/// # Safety
/// `cf` must be the http block's configuration.
pub unsafe fn index_decision(cf: *mut ngx_conf_t) -> Status {
    let mut name = static_str(DECISION);
    // SAFETY: cf is valid (contract); nginx copies the name.
    let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
    // SAFETY: as above; our main conf exists in the http block.
    let Some(mc) = RateCtlModule::main_conf_mut(unsafe { &*cf }) else {
        return Status::NGX_ERROR;
    };
    let Ok(index) = usize::try_from(index) else {
        return Status::NGX_ERROR;
    };
    mc.decision_index = index;
    Status::NGX_OK
}

/// The request's value of a custom dimension (`rate_ctl_dimension`), not
/// empty; `None` when absent. A single-variable binding is read through
/// the variable's index (flushed, as a template reads it: a cacheable
/// value evaluated earlier in the request is reused, a non-cacheable one
/// such as `$arg_*` is evaluated again), in the request's variable array:
/// nothing is copied or allocated. Other templates are evaluated (in the
/// request pool). Out of line: the request path's value reader stays
/// small enough to be inlined for the built-in dimensions.
/// `seen` is the request's [`parse::query_arg_seen`] mask (0 until a
/// `$arg` dimension was found absent): a later one it rules out is absent
/// without a scan of the query string.
/// The usual binding, a plain `$arg_NAME` (nginx's own argument
/// variable, first item wins, no flag), is read by a short leaf path
/// ([`arg_first`]); everything else by [`dimension_value_any`], a tail
/// call (so the usual path saves no registers).
#[inline(never)]
pub fn dimension_value<'r>(
    r: &'r Request,
    d: &CustomDimension,
    seen: &Cell<u64>,
) -> Option<&'r [u8]> {
    dimension_value_inline(r, d, seen)
}

/// [`dimension_value`] inlined into its caller: for a caller out of line
/// that reads one value per request (a negation's check, see
/// `Values::value_inline`).
#[inline(always)]
pub fn dimension_value_inline<'r>(
    r: &'r Request,
    d: &CustomDimension,
    seen: &Cell<u64>,
) -> Option<&'r [u8]> {
    if let DimensionValue::Arg(index, ref name, ref kind, _) = d.value {
        if kind.get() == ArgKind::Plain {
            return arg_first(r.as_ref(), index, name, seen);
        }
    }
    dimension_value_any(r, d, seen)
}

/// Whether the request's value of custom dimension `d` differs from
/// `not`, an absent value differing from every value: what a negation
/// checks, `dimension_value_inline(..) != Some(not)`. A plain `$arg_NAME`
/// is compared in the query string in place ([`arg_first_differs`]);
/// every other binding read by [`dimension_value_any`].
#[inline(always)]
pub fn dimension_differs_inline(
    r: &Request,
    d: &CustomDimension,
    seen: &Cell<u64>,
    not: &[u8],
) -> bool {
    if let DimensionValue::Arg(index, ref name, ref kind, _) = d.value {
        if kind.get() == ArgKind::Plain {
            return arg_first_differs(r.as_ref(), index, name, seen, not);
        }
    }
    crate::core::table::value_differs(dimension_value_any(r, d, seen), not)
}

/// [`dimension_value`] for any binding.
#[inline(never)]
fn dimension_value_any<'r>(
    r: &'r Request,
    d: &CustomDimension,
    seen: &Cell<u64>,
) -> Option<&'r [u8]> {
    let bytes = match d.value {
        DimensionValue::Variable(index) => flushed_variable(r, index)?,
        DimensionValue::Arg(index, ref name, ref kind, last) => {
            let v = arg_variable(r, index, name, kind, seen, last);
            // Found nginx's own, bound without flag or `last`: the leaf's
            // from now on.
            if kind.get() == ArgKind::Builtin && !last && d.norm.is_none() {
                kind.set(ArgKind::Plain);
            }
            v?
        }
        // SAFETY: the complex value was compiled at configuration time
        // from the configuration pool, which outlives requests.
        DimensionValue::Complex(cv) => r.get_complex_value(unsafe { &*cv })?.as_bytes(),
    };
    if bytes.is_empty() {
        return None;
    }
    // Without flags nothing more is done (one compare).
    match d.norm {
        None => Some(bytes),
        Some(n) => super::ext::normalised(r, bytes, n).filter(|v| !v.is_empty()),
    }
}

/// Whether indexed variable `index` is nginx's argument variable (resolved
/// through the `arg_` prefix: `PREFIX` in its flags).
#[cold]
fn arg_kind(r: &Request, index: usize) -> ArgKind {
    let Some(cmcf) = NgxHttpCoreModule::main_conf(r) else {
        return ArgKind::Other;
    };
    if index >= cmcf.variables.nelts {
        return ArgKind::Other;
    }
    // SAFETY: cmcf->variables holds `nelts` ngx_http_variable_t (nginx's
    // array of indexed variables, fixed after configuration).
    let var = unsafe { &*cmcf.variables.elts.cast::<ngx_http_variable_t>().add(index) };
    if var.flags & NGX_HTTP_VAR_PREFIX as ngx_uint_t != 0 {
        ArgKind::Builtin
    } else {
        ArgKind::Other
    }
}

/// The value of indexed variable `index`, as a template reads it.
#[inline(never)]
fn flushed_variable(r: &Request, index: usize) -> Option<&[u8]> {
    let raw: *const ngx_http_request_t = r.as_ref();
    // SAFETY: r is the live request; `index` was given by
    // ngx_http_get_variable_index at configuration time (nginx checked at
    // postconfiguration that the variable exists).
    let v = unsafe { ngx_http_get_flushed_variable(raw.cast_mut(), index) };
    // SAFETY: a non-null result is the request's value slot, live with
    // the request.
    value_bytes(unsafe { v.as_ref() }?)
}

/// A found value's bytes.
#[inline]
fn value_bytes(v: &ngx_http_variable_value_t) -> Option<&[u8]> {
    if v.not_found() != 0 || v.data.is_null() {
        return None;
    }
    // SAFETY: a found value points to `len` bytes that live with the
    // request (its buffers or pool).
    Some(unsafe { std::slice::from_raw_parts(v.data, v.len() as usize) })
}

/// `$arg_NAME` at index `index`: what [`flushed_variable`] would give,
/// without the variable machinery when it is nginx's argument variable
/// (resolved through the `arg_` prefix: `PREFIX` in its flags). As
/// `ngx_http_get_flushed_variable` does, a value stored in the request's
/// slot and marked cacheable (`set $arg_x ...;`) is that value; otherwise
/// the query string is searched as `ngx_http_arg` does
/// ([`parse::query_arg_seen`]). A variable of that name defined by another
/// module (`map ... $arg_x`) is read through nginx.
#[inline]
fn arg_variable<'r>(
    r: &'r Request,
    index: usize,
    name: &[u8],
    kind: &Cell<ArgKind>,
    seen: &Cell<u64>,
    last: bool,
) -> Option<&'r [u8]> {
    let rr: &ngx_http_request_t = r.as_ref();
    if kind.get() == ArgKind::Unchecked {
        kind.set(arg_kind(r, index));
    }
    if !matches!(kind.get(), ArgKind::Builtin | ArgKind::Plain) {
        return flushed_variable(r, index);
    }
    let v = slot(rr, index);
    // SAFETY: v is this request's slot (see `slot`), live with the request.
    let v = unsafe { v.as_ref() }?;
    if (v.valid() != 0 || v.not_found() != 0) && v.no_cacheable() == 0 {
        return value_bytes(v);
    }
    let args = query_string(rr)?;
    if last {
        return parse::query_arg_last(args, name);
    }
    first_arg(args, name, seen)
}

/// The request's query string (`r->args`), if it has one (perhaps empty:
/// every search finds nothing in it).
#[inline(always)]
fn query_string(rr: &ngx_http_request_t) -> Option<&[u8]> {
    if rr.args.data.is_null() {
        return None;
    }
    // SAFETY: r->args points to `len` bytes of the request line or the
    // request pool, live with the request.
    Some(unsafe { std::slice::from_raw_parts(rr.args.data, rr.args.len) })
}

/// The first item `name` of the query string `args`, as `ngx_http_arg`
/// finds it, using and updating the request's `seen` mask (see
/// [`dimension_value`]).
#[inline(always)]
fn first_arg<'r>(args: &'r [u8], name: &[u8], seen: &Cell<u64>) -> Option<&'r [u8]> {
    let mask = seen.get();
    if mask != 0 && mask & parse::first_byte_bit(*name.first()?) == 0 {
        return None; // no item of the query string starts with it
    }
    let mut mask = 0;
    let found = parse::query_arg_seen(args, name, &mut mask);
    if mask != 0 {
        seen.set(mask);
    }
    found
}

/// [`first_arg`], giving where the value starts in `args` (see
/// [`parse::query_arg_from`]).
#[inline(always)]
fn first_arg_from(args: &[u8], name: &[u8], seen: &Cell<u64>) -> Option<usize> {
    let mask = seen.get();
    if mask != 0 && mask & parse::first_byte_bit(*name.first()?) == 0 {
        return None; // no item of the query string starts with it
    }
    let mut mask = 0;
    let found = parse::query_arg_from(args, name, &mut mask);
    if mask != 0 {
        seen.set(mask);
    }
    found
}

/// [`arg_variable`] for nginx's own argument variable, the first item
/// winning, an empty value absent: what [`dimension_value`] gives for a
/// plain `$arg_NAME` binding. Few live values, no call: a leaf.
#[inline(always)]
fn arg_first<'r>(
    rr: &'r ngx_http_request_t,
    index: usize,
    name: &[u8],
    seen: &Cell<u64>,
) -> Option<&'r [u8]> {
    let v = slot(rr, index);
    if v.is_null() {
        return None;
    }
    // The slot's flags as one word (bindgen's accessors are calls here).
    const { assert!(std::mem::offset_of!(ngx_http_variable_value_t, data) == 8) };
    const { assert!(cfg!(target_endian = "little")) };
    // SAFETY: v is this request's slot (see `slot`), live with the
    // request; its first 4 bytes are the C bitfield word `len:28 valid:1
    // no_cacheable:1 not_found:1 escape:1`, allocated from the low bit
    // (x86-64 and AArch64 SysV ABIs; the offset of `data` checked above).
    let flags = unsafe { v.cast::<u32>().read() };
    if slot_holds_value(flags) {
        // SAFETY: as above.
        return cached_value(unsafe { &*v });
    }
    first_arg(query_string(rr)?, name, seen).filter(|b| !b.is_empty())
}

/// Whether [`arg_first`]'s value differs from `not` (an absent or empty
/// value differs from every value): the query string's item compared in
/// place ([`parse::query_value_differs`]), its end not searched. A leaf
/// as `arg_first` is.
#[inline(always)]
fn arg_first_differs(
    rr: &ngx_http_request_t,
    index: usize,
    name: &[u8],
    seen: &Cell<u64>,
    not: &[u8],
) -> bool {
    let v = slot(rr, index);
    if v.is_null() {
        return true;
    }
    // SAFETY: as in `arg_first`: the request's slot, its flag word first.
    let flags = unsafe { v.cast::<u32>().read() };
    if slot_holds_value(flags) {
        // SAFETY: as above.
        return crate::core::table::value_differs(cached_value(unsafe { &*v }), not);
    }
    let Some(args) = query_string(rr) else {
        return true;
    };
    match first_arg_from(args, name, seen) {
        Some(from) => parse::query_value_differs(args, from, not),
        None => true,
    }
}

/// The bits of an `ngx_variable_value_t`'s flag word (see [`arg_first`]).
const VALUE_VALID: u32 = 1 << 28;
const VALUE_NO_CACHEABLE: u32 = 1 << 29;
const VALUE_NOT_FOUND: u32 = 1 << 30;

/// Whether a slot's flag word holds a value nginx's flushed read reuses:
/// valid or not found, and cacheable. The flag bits (28 to 31) index a
/// table of the 16 answers: one shift and a bit test, no branch per flag.
#[inline(always)]
fn slot_holds_value(flags: u32) -> bool {
    const HOLDS: u32 = {
        let mut t = 0;
        let mut i = 0;
        while i < 16 {
            let w = i << 28;
            if w & (VALUE_VALID | VALUE_NOT_FOUND) != 0 && w & VALUE_NO_CACHEABLE == 0 {
                t |= 1 << i;
            }
            i += 1;
        }
        t
    };
    HOLDS >> (flags >> 28) & 1 != 0
}

/// A value stored in the slot of `$arg_NAME` (`set $arg_x ...;`): rare,
/// out of line.
#[cold]
#[inline(never)]
fn cached_value(v: &ngx_http_variable_value_t) -> Option<&[u8]> {
    value_bytes(v).filter(|b| !b.is_empty())
}

/// What rate_ctl decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub status: ReqStatus,
    /// The strategy that decided (0 = none).
    pub strategy: u32,
    /// A strategy or the blacklist applied (so the request is decided for
    /// good). `false` for a request that matched nothing or met no table:
    /// its status is reported, but the PREACCESS phase of the location an
    /// internal redirect or a subrequest leads to evaluates it again, as
    /// `limit_req` marks a request only when one of its limits ran.
    pub applied: bool,
}

/// The request's slot of the decision variable.
#[inline]
fn slot(r: &ngx_http_request_t, index: usize) -> *mut ngx_http_variable_value_t {
    if r.variables.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: nginx allocates r->variables with one value per indexed
    // variable, and `index` is one (given by ngx_http_get_variable_index).
    unsafe { r.variables.add(index) }
}

/// The decision recorded for the request, if any (also after an internal
/// redirect, and from a subrequest, which shares its main request's slots).
#[inline]
pub fn decided(r: &ngx_http_request_t, index: usize) -> Option<Decided> {
    let v = slot(r, index);
    if v.is_null() {
        return None;
    }
    // SAFETY: v is this request's slot (see `slot`), live with the request.
    let word = unsafe { (*v).data } as usize as u64;
    Some(Decided {
        status: ReqStatus::from_code((word & 0xff) as u32)?,
        strategy: (word >> 8) as u32,
        applied: word & APPLIED != 0,
    })
}

/// The bit of the recorded word that says [`Decided::applied`].
const APPLIED: u64 = 1 << 40;

/// Records the decision in the request's slot: one word, the status code
/// in the low byte, the strategy id in the 32 bits above it and
/// [`APPLIED`] (in the data pointer,
/// which nobody dereferences: a reader of the variable finds it not found
/// and nginx zeroes the array with the request). `false` if the request
/// has no variable array (nginx allocates one with every request).
#[inline]
pub fn record(r: &mut ngx_http_request_t, index: usize, d: Decided) -> bool {
    const { assert!(std::mem::size_of::<usize>() == 8) };
    let v = slot(r, index);
    if v.is_null() {
        return false;
    }
    let word =
        (u64::from(d.strategy) << 8) | u64::from(d.status.code()) | (APPLIED * d.applied as u64);
    // SAFETY: v is this request's slot (see `slot`); only this module
    // writes it, on nginx's worker thread.
    unsafe { (*v).data = word as usize as *mut u8 };
    true
}

pub(super) fn set_value(v: &mut ngx_http_variable_value_t, data: *mut u8, len: usize) {
    v.set_len(len as u32);
    v.set_valid(1);
    v.set_no_cacheable(1);
    v.set_not_found(0);
    v.set_escape(0);
    v.data = data;
}

pub(super) fn not_found(v: &mut ngx_http_variable_value_t) {
    v.set_len(0);
    v.set_not_found(1);
}

/// The decision of the request `r` whose variable is being read.
pub(super) fn decision_of(r: &Request) -> Option<Decided> {
    let mc = RateCtlModule::main_conf(r)?;
    decided(r.as_ref(), mc.decision_index)
}

/// Runs a variable getter's body under [`guard`](super::guard::guard):
/// a panic reports the variable not found.
///
/// # Safety
/// `r` and `v` are the live request and value nginx passes a getter.
pub(super) unsafe fn guarded(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    body: impl FnOnce() -> isize,
) -> isize {
    // SAFETY: a live request has a live connection and log (contract).
    let log = unsafe { (*(*r).connection).log };
    match super::guard::guard("a variable getter", log, None, || Some(body())) {
        Some(rc) => rc,
        None => {
            // SAFETY: `v` is live (contract).
            not_found(unsafe { &mut *v });
            Status::NGX_OK.0
        }
    }
}

unsafe extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    unsafe { guarded(r, v, || status_value(r, v)) }
}

fn status_value(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t) -> isize {
    super::guard::test_panic(super::guard::Entry::Variable);
    // SAFETY: nginx calls variable getters with a live request and value.
    let (r, v) = unsafe { (Request::from_ngx_http_request(r), &mut *v) };
    match decision_of(r) {
        Some(d) => {
            let s = d.status.as_str();
            // nginx never writes through a variable's data; static text is fine.
            set_value(v, s.as_ptr().cast_mut(), s.len());
        }
        None => not_found(v),
    }
    Status::NGX_OK.0
}

unsafe extern "C" fn strategy_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    unsafe { guarded(r, v, || strategy_value(r, v)) }
}

fn strategy_value(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    let (r, v) = unsafe { (Request::from_ngx_http_request(r), &mut *v) };
    let Some(id) = decision_of(r).map(|d| d.strategy).filter(|&id| id != 0) else {
        not_found(v);
        return Status::NGX_OK.0;
    };
    let Some(text) = number_in_pool(r, u64::from(id)) else {
        return Status::NGX_ERROR.0;
    };
    set_value(v, text.data, text.len);
    Status::NGX_OK.0
}

/// The decision variable, read by a configuration that names it: not
/// found, whether decided or not (the recorded word is left as it is).
unsafe extern "C" fn undecided_variable(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> isize {
    // SAFETY: nginx calls variable getters with a live value.
    unsafe { (*v).set_not_found(1) };
    Status::NGX_OK.0
}
