//! `ngx_http_rate_ctl_module`: registration only (the context, the command
//! table, the phase handler). The directives' handlers are in [`conf`], the
//! PREACCESS handler in [`handler`], variables in [`variables`], the stats
//! endpoint and its directive in [`stats`], per-worker state (the core
//! reader) in [`worker`], the allocator of all of it in [`alloc`].

mod alloc;
mod bans;
mod conf;
mod decision;
mod ext;
mod guard;
mod handler;
mod log_phase;
pub(crate) mod parse;
mod stats;
mod time;
mod variables;
mod worker;

use std::ffi::{c_char, c_void};
use std::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, ngx_int_t, ngx_module_t, ngx_str_t, ngx_uint_t,
    NGX_CONF_2MORE, NGX_CONF_FLAG, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_HTTP_LOC_CONF,
    NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE,
    NGX_HTTP_SRV_CONF,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_string;

pub struct RateCtlModule;

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(RateCtlModule::preconfiguration),
    postconfiguration: Some(RateCtlModule::postconfiguration),
    create_main_conf: Some(RateCtlModule::create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(RateCtlModule::create_loc_conf),
    merge_loc_conf: Some(RateCtlModule::merge_loc_conf),
};

/// Every Rust allocation of the module (tables, builders, the worker's
/// state) comes from the module's own mappings, not from the glibc heap
/// nginx's request pools use (issue 29, see [`alloc`]).
#[global_allocator]
static ALLOCATOR: alloc::ModuleAlloc = alloc::ModuleAlloc::new();

// The `ngx_modules` table nginx looks up in a dynamic module.
ngx::ngx_modules!(ngx_http_rate_ctl_module);

const ANY_LEVEL: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

const fn command(
    name: ngx_str_t,
    type_: u32,
    set: unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char,
    conf: usize,
) -> ngx_command_t {
    ngx_command_t {
        name,
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf,
        offset: 0,
        post: ptr::null_mut(),
    }
}

/// The directive table; nginx walks it until the null entry.
pub static mut COMMANDS: [ngx_command_t; 11] = [
    command(
        ngx_string!("rate_ctl"),
        ANY_LEVEL | NGX_CONF_FLAG,
        conf::set_enable,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_shm"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        conf::set_shm,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_shm_owner"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        conf::set_shm_owner,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_dimension"),
        // NAME VALUE [path] [lowercase] [decode] [last]
        NGX_HTTP_MAIN_CONF | NGX_CONF_2MORE,
        conf::set_dimension,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_status"),
        ANY_LEVEL | NGX_CONF_TAKE1,
        conf::set_status,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_blacklist_status"),
        ANY_LEVEL | NGX_CONF_TAKE1,
        conf::set_blacklist_status,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_dry_run"),
        ANY_LEVEL | NGX_CONF_FLAG,
        conf::set_dry_run,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_log_level"),
        ANY_LEVEL | NGX_CONF_TAKE1,
        conf::set_log_level,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_headers"),
        ANY_LEVEL | NGX_CONF_TAKE1,
        conf::set_headers,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("rate_ctl_stats"),
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        stats::set_stats,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    ngx_command_t::empty(),
];

#[used]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_rate_ctl_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(MODULE_CTX) as *mut c_void,
    // SAFETY: taking the address of the static command table, not reading it.
    commands: unsafe { ptr::addr_of_mut!(COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

/// Each worker maps the file and compiles the table as it starts (when a
/// location uses rate_ctl), so no request waits for a table to be built.
extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx calls init_process with the worker's complete cycle.
    let cycle = unsafe { &*cycle };
    guard::install_hook();
    guard::read_test_knob();
    // A panic leaves the worker without a table: its requests pass.
    guard::guard("init_process", cycle.log, Status::NGX_OK.0, || {
        guard::test_panic(guard::Entry::InitProcess);
        if let Some(mc) = <RateCtlModule as HttpModuleMainConf>::main_conf(cycle) {
            if mc.used {
                worker::start(mc, cycle.log);
            }
        }
        Status::NGX_OK.0
    })
}

/// A worker that exits (reload, shutdown) writes its pending rejection
/// summaries first.
extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    // SAFETY: nginx calls exit_process with the worker's cycle.
    let log = unsafe { (*cycle).log };
    guard::guard("exit_process", log, (), || {
        guard::test_panic(guard::Entry::ExitProcess);
        worker::flush_now()
    })
}

impl HttpModule for RateCtlModule {
    fn module() -> &'static ngx_module_t {
        // SAFETY: nginx only writes the module's index fields during
        // configuration, before any handler reads them.
        unsafe { &*ptr::addr_of!(ngx_http_rate_ctl_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes the configuration being parsed.
        let log = unsafe { (*cf).log };
        guard::guard("preconfiguration", log, Status::NGX_ERROR.0, || {
            // SAFETY: as above.
            unsafe { variables::add_variables(cf, handler::key_variable) }.0
        })
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes the http block's configuration.
        let log = unsafe { (*cf).log };
        guard::guard("postconfiguration", log, Status::NGX_ERROR.0, || {
            // SAFETY: as above.
            unsafe { RateCtlModule::postconfigure(cf) }
        })
    }
}

impl RateCtlModule {
    /// # Safety
    /// `cf` is the http block's configuration (nginx's postconfiguration).
    unsafe fn postconfigure(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes the http block's configuration.
        if unsafe { variables::index_decision(cf) } != Status::NGX_OK {
            return Status::NGX_ERROR.0;
        }
        // SAFETY: cf is the http block's configuration, whose core main conf exists.
        let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(unsafe { &*cf }) else {
            return Status::NGX_ERROR.0;
        };
        let phase = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize];
        // SAFETY: the phase's handler array was initialised by the core
        // module with ngx_http_handler_pt elements.
        if !unsafe { register_last(&mut phase.handlers, handler::preaccess_handler) } {
            return Status::NGX_ERROR.0;
        }
        // Issue 31: count_if and cost_after settle in the LOG phase.
        let log = &mut cmcf.phases[ngx::ffi::ngx_http_phases_NGX_HTTP_LOG_PHASE as usize];
        // SAFETY: as above, an array of ngx_http_handler_pt.
        let h = unsafe { ngx_array_push(&mut log.handlers) }.cast::<ngx_http_handler_pt>();
        if h.is_null() {
            return Status::NGX_ERROR.0;
        }
        // SAFETY: h is the element just pushed.
        unsafe { *h = Some(log_phase::log_handler) };
        Status::NGX_OK.0
    }
}

/// Puts `handler` at the front of a phase's handler array, so that it runs
/// **last** in the phase.
///
/// nginx builds the phase engine (`ngx_http_init_phase_handlers`) by walking
/// each phase's array from its last element to its first: a handler pushed
/// later runs earlier. A dynamic module's postconfiguration runs after
/// every built-in module's, so a plain push would make rate_ctl the first
/// PREACCESS handler — before realip's location-level handler (the client
/// address would still be the proxy's) and before `limit_req` /
/// `limit_conn`. At the front it runs after all of them, as a built-in
/// module registered first would.
///
/// # Safety
/// `handlers` must be an initialised `ngx_array_t` of `ngx_http_handler_pt`.
unsafe fn register_last(handlers: &mut ngx::ffi::ngx_array_t, handler: HandlerFn) -> bool {
    // SAFETY: the array holds ngx_http_handler_pt elements (contract).
    let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
    if h.is_null() {
        return false;
    }
    let elts = handlers.elts.cast::<ngx_http_handler_pt>();
    let n = handlers.nelts;
    // SAFETY: after the push the array holds `n` elements (the last one
    // new and unset) in one allocation; shifting the first n - 1 up by one
    // stays inside it, then the first element is ours.
    unsafe {
        ptr::copy(elts, elts.add(1), n - 1);
        *elts = Some(handler);
    }
    true
}

type HandlerFn = unsafe extern "C" fn(*mut ngx::ffi::ngx_http_request_t) -> ngx_int_t;

// SAFETY: create_main_conf allocates exactly `conf::MainConf` for this module.
unsafe impl HttpModuleMainConf for RateCtlModule {
    type MainConf = conf::MainConf;
}

// SAFETY: create_loc_conf allocates exactly `conf::LocConf` for this module.
unsafe impl HttpModuleLocationConf for RateCtlModule {
    type LocationConf = conf::LocConf;
}
