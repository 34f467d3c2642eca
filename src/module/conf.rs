//! Directives: their handlers, the main and location configurations and
//! their merge (the command table naming the handlers is in [`super`], with
//! the rest of the module's registration; `rate_ctl_stats` is in
//! [`super::stats`] with the endpoint it installs). Argument parsing is in
//! [`super::parse`] (pure, unit-tested); here each handler reports a
//! [`ParseError`] once through nginx's conf error path, so `nginx -t` prints
//! the directive, the value and the line.

use std::cell::Cell;
use std::ffi::{c_char, c_void};

use ngx::core::{Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_http_get_variable_index, ngx_str_t, NGX_LOG_EMERG,
};
use ngx::http::{HttpModuleMainConf, Merge, MergeConfigError};
use ngx::ngx_conf_log_error;

use super::parse::{self, HeaderStyle, LogLevel, ParseError, DEFAULT_SHM_PATH};
use crate::core::normalise::Normalise;

/// A `rate_ctl_dimension NAME VALUE;`.
pub struct CustomDimension {
    pub name: String,
    /// Its flags' normalisation (`None`: no flag, the bytes as read,
    /// nothing more done per request than one compare).
    pub norm: Option<Normalise>,
    /// How a request's value is read (see [`super::variables::dimension_value`]).
    pub value: DimensionValue,
}

/// What a `$arg_NAME` binding turned out to be.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Unchecked,
    /// nginx's argument variable: the query string is read directly.
    Builtin,
    /// [`Builtin`](Self::Builtin) bound without a flag and without `last`:
    /// read by the request path's leaf (see
    /// [`super::variables::dimension_value`]; set on its first read).
    Plain,
    /// Defined otherwise (`map ... $arg_x`): read through nginx.
    Other,
}

/// The binding of a custom dimension.
pub enum DimensionValue {
    /// The value is one variable (`$http_x_user`): read by its index, the
    /// way nginx's own modules read a key variable (no template, no copy).
    Variable(usize),
    /// `$arg_NAME`: read from the request's query string directly while
    /// the variable is nginx's own argument variable (see
    /// [`super::variables::dimension_value`]); the index, NAME in lower
    /// case, and whether the variable was found to be nginx's own
    /// (checked on first use in a worker: nginx resolves variables after
    /// the directives are read).
    /// With `last` (the fourth field), the last of repeated items wins.
    Arg(usize, Box<[u8]>, Cell<ArgKind>, bool),
    /// Any other template: a compiled complex value, allocated from the
    /// configuration pool.
    Complex(*mut ngx_http_complex_value_t),
}

/// `http`-level configuration.
#[derive(Default)]
pub struct MainConf {
    pub shm_path: Option<String>,
    /// `rate_ctl_shm_owner`: the uid the configuration file may belong to
    /// (besides root).
    pub shm_owner: Option<u32>,
    pub dimensions: Vec<CustomDimension>,
    /// Some `rate_ctl on;` or `rate_ctl_stats;` exists: workers load the
    /// table when they start, not on their first request.
    pub used: bool,
    /// Index of the variable whose per-request slot records the decision
    /// (set in postconfiguration; see [`super::variables`]).
    pub decision_index: usize,
}

impl MainConf {
    pub fn shm_path(&self) -> &str {
        self.shm_path.as_deref().unwrap_or(DEFAULT_SHM_PATH)
    }

    pub fn dimension(&self, name: &str) -> Option<usize> {
        self.dimensions.iter().position(|d| d.name == name)
    }
}

/// `http` / `server` / `location` configuration; `None` = not set here,
/// inherited from the level above by [`Merge`].
#[derive(Debug, Default, Clone, Copy)]
pub struct LocConf {
    pub enable: Option<bool>,
    pub status: Option<u16>,
    pub blacklist_status: Option<u16>,
    pub dry_run: Option<bool>,
    pub log_level: Option<LogLevel>,
    pub headers: Option<HeaderStyle>,
}

impl LocConf {
    pub fn enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(503)
    }
    pub fn blacklist_status(&self) -> u16 {
        self.blacklist_status.unwrap_or(403)
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }
    pub fn log_level(&self) -> LogLevel {
        self.log_level.unwrap_or(LogLevel::Error)
    }
    pub fn headers(&self) -> HeaderStyle {
        self.headers.unwrap_or(HeaderStyle::Off)
    }
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), MergeConfigError> {
        self.enable = self.enable.or(prev.enable);
        self.status = self.status.or(prev.status);
        self.blacklist_status = self.blacklist_status.or(prev.blacklist_status);
        self.dry_run = self.dry_run.or(prev.dry_run);
        self.log_level = self.log_level.or(prev.log_level);
        self.headers = self.headers.or(prev.headers);
        Ok(())
    }
}

/// The arguments of the directive being parsed; `[0]` is its name.
///
/// # Safety
/// `cf` must be the `ngx_conf_t` nginx passed to a directive handler.
unsafe fn args<'a>(cf: *mut ngx_conf_t) -> &'a mut [ngx_str_t] {
    // SAFETY: during a directive handler cf->args is an ngx_array_t of
    // ngx_str_t holding the directive name and its arguments.
    unsafe {
        let a = (*cf).args;
        std::slice::from_raw_parts_mut((*a).elts.cast::<ngx_str_t>(), (*a).nelts)
    }
}

/// Logs `e` once as an `[emerg]` with the file and line, and fails the directive.
pub(super) fn fail(cf: *mut ngx_conf_t, e: ParseError) -> *mut c_char {
    ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{e}");
    NGX_CONF_ERROR
}

/// Runs a once-only setter: parses `args[1]` into `field` of the conf
/// (`C`: our `LocConf` or `MainConf`) unless already set.
///
/// # Safety
/// `cf` and `conf` as nginx passes them to a directive handler registered
/// with the offset of a `C` (`NGX_HTTP_LOC_CONF_OFFSET` for `LocConf`,
/// `NGX_HTTP_MAIN_CONF_OFFSET` for `MainConf`).
unsafe fn set_once<C, T>(
    cf: *mut ngx_conf_t,
    conf: *mut c_void,
    directive: &'static str,
    field: fn(&mut C) -> &mut Option<T>,
    parse: impl FnOnce(&[u8]) -> Result<T, ParseError>,
) -> *mut c_char {
    // SAFETY: see the function's contract.
    let (c, a) = unsafe { (&mut *conf.cast::<C>(), args(cf)) };
    let slot = field(c);
    if slot.is_some() {
        return fail(cf, ParseError::Duplicate { directive });
    }
    match parse(a[1].as_bytes()) {
        Ok(v) => {
            *slot = Some(v);
            NGX_CONF_OK
        }
        Err(e) => fail(cf, e),
    }
}

/// Runs a directive handler's body under [`guard`](super::guard::guard):
/// a panic fails the configuration (nginx says so and keeps running the
/// configuration it had) instead of aborting the master.
pub(super) fn guard_directive(
    cf: *mut ngx_conf_t,
    body: impl FnOnce() -> *mut c_char,
) -> *mut c_char {
    // SAFETY: nginx passes every directive handler its live parser state.
    let log = unsafe { (*cf).log };
    super::guard::guard("a directive", log, NGX_CONF_ERROR, body)
}

/// One `extern "C"` handler per location-level directive, all through
/// [`set_once`]: `name => handler: field, parser`.
macro_rules! loc_setters {
    ($($directive:literal => $fn:ident: $field:ident, $parse:expr;)*) => {$(
        pub(super) extern "C" fn $fn(
            cf: *mut ngx_conf_t,
            _cmd: *mut ngx_command_t,
            conf: *mut c_void,
        ) -> *mut c_char {
            guard_directive(cf, || {
                // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET; nginx passes valid cf/conf.
                unsafe { set_once(cf, conf, $directive, |c: &mut LocConf| &mut c.$field, $parse) }
            })
        }
    )*};
}

/// Marks the module as used, so that workers load the table at start.
pub(super) fn mark_used(cf: *mut ngx_conf_t) {
    // SAFETY: cf is the parser state of a directive inside the http block,
    // whose main configuration of this module exists.
    if let Some(mc) = super::RateCtlModule::main_conf_mut(unsafe { &*cf }) {
        mc.used = true;
    }
}

pub(super) extern "C" fn set_enable(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    super::conf::guard_directive(cf, || set_enable_body(cf, cmd, conf))
}

fn set_enable_body(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET; nginx passes valid cf/conf.
    let rc = unsafe {
        set_once(
            cf,
            conf,
            "rate_ctl",
            |c: &mut LocConf| &mut c.enable,
            |v| parse::parse_flag("rate_ctl", v),
        )
    };
    // SAFETY: as above, conf is our LocConf.
    if rc.is_null() && unsafe { (*conf.cast::<LocConf>()).enable } == Some(true) {
        mark_used(cf);
    }
    rc
}

loc_setters! {
    "rate_ctl_status" => set_status: status, |v| parse::parse_status("rate_ctl_status", v);
    "rate_ctl_blacklist_status" => set_blacklist_status: blacklist_status,
        |v| parse::parse_status("rate_ctl_blacklist_status", v);
    "rate_ctl_dry_run" => set_dry_run: dry_run, |v| parse::parse_flag("rate_ctl_dry_run", v);
    "rate_ctl_log_level" => set_log_level: log_level, parse::parse_log_level;
    "rate_ctl_headers" => set_headers: headers, parse::parse_header_style;
}

pub(super) extern "C" fn set_shm(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    super::conf::guard_directive(cf, || set_shm_body(cf, cmd, conf))
}

fn set_shm_body(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET, so conf is our
    // MainConf; cf is the parser state nginx passes to every directive handler.
    unsafe {
        set_once(
            cf,
            conf,
            "rate_ctl_shm",
            |mc: &mut MainConf| &mut mc.shm_path,
            parse::parse_shm_path,
        )
    }
}

pub(super) extern "C" fn set_shm_owner(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET, so conf is our
    // MainConf; cf is the parser state nginx passes to every directive handler.
    unsafe {
        set_once(
            cf,
            conf,
            "rate_ctl_shm_owner",
            |mc: &mut MainConf| &mut mc.shm_owner,
            parse::parse_shm_owner,
        )
    }
}

pub(super) extern "C" fn set_dimension(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    super::conf::guard_directive(cf, || set_dimension_body(cf, cmd, conf))
}

fn set_dimension_body(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET, so conf is our MainConf;
    // cf is the parser state nginx passes to every directive handler.
    let (mc, a) = unsafe { (&mut *conf.cast::<MainConf>(), args(cf)) };
    let name = match parse::parse_dimension_name(
        a[1].as_bytes(),
        mc.dimensions.iter().map(|d| d.name.as_str()),
    ) {
        Ok(n) => n.to_string(),
        Err(e) => return fail(cf, e),
    };
    if let Err(e) = parse::check_dimension_value(&name, a[2].as_bytes()) {
        return fail(cf, e);
    }
    let single = parse::single_variable(a[2].as_bytes());
    let is_arg = single.is_some_and(|v| v.len() > 4 && v.starts_with(b"arg_"));
    let (norm, last) =
        match parse::parse_dimension_flags(&name, a[3..].iter().map(ngx_str_t::as_bytes), is_arg) {
            Ok((n, last)) => ((!n.is_none()).then_some(n), last),
            Err(e) => return fail(cf, e),
        };
    if let Some(var) = single {
        let mut var_str = ngx_str_t {
            len: var.len(),
            data: var.as_ptr().cast_mut(),
        };
        // SAFETY: cf is the parser state; nginx copies the name. An
        // unknown variable fails the configuration at postconfiguration
        // ("unknown variable"), as in a template.
        let index = unsafe { ngx_http_get_variable_index(cf, &mut var_str) };
        let Ok(index) = usize::try_from(index) else {
            return NGX_CONF_ERROR;
        };
        let value = match var.strip_prefix(b"arg_").filter(|n| !n.is_empty()) {
            Some(arg) => DimensionValue::Arg(
                index,
                arg.to_ascii_lowercase().into(),
                Cell::new(ArgKind::Unchecked),
                last,
            ),
            None => DimensionValue::Variable(index),
        };
        mc.dimensions.push(CustomDimension { name, norm, value });
        return NGX_CONF_OK;
    }
    // SAFETY: cf->pool is the configuration pool; it outlives the configuration.
    let cv = unsafe {
        ngx::ffi::ngx_pcalloc((*cf).pool, std::mem::size_of::<ngx_http_complex_value_t>())
    }
    .cast::<ngx_http_complex_value_t>();
    if cv.is_null() {
        return NGX_CONF_ERROR;
    }
    // SAFETY: an all-zero ngx_http_compile_complex_value_t is its documented
    // initial state (nginx's modules ngx_memzero it).
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { std::mem::zeroed() };
    ccv.cf = cf;
    ccv.value = &mut a[2];
    ccv.complex_value = cv;
    // SAFETY: ccv is fully initialised; nginx logs its own error on failure.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != Status::NGX_OK.0 {
        return NGX_CONF_ERROR;
    }
    mc.dimensions.push(CustomDimension {
        name,
        norm,
        value: DimensionValue::Complex(cv),
    });
    NGX_CONF_OK
}
