//! `rate_ctl_stats;` — a content handler answering with the table state and
//! per-strategy counters, as JSON or (`?format=prometheus`) in the
//! Prometheus text exposition format.

use std::ffi::{c_char, c_void};

use ngx::core::{Buffer, Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_chain_t, ngx_command_t, ngx_conf_t, ngx_http_request_t, ngx_int_t, NGX_HTTP_GET,
    NGX_HTTP_HEAD, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_ALLOWED,
};
use ngx::http::{
    HTTPStatus, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, Request,
};

use super::conf::{fail, mark_used};
use super::parse::ParseError;
use super::worker::with_worker;
use super::RateCtlModule;
use crate::core::stats::{render_json, render_prometheus, snapshot, wants_prometheus};

/// `rate_ctl_stats;`: makes the location answer with the stats.
pub(super) extern "C" fn set_stats(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    super::conf::guard_directive(cf, || set_stats_body(cf))
}

fn set_stats_body(cf: *mut ngx_conf_t) -> *mut c_char {
    // SAFETY: cf is the parser state inside a location block, whose core
    // location configuration exists.
    let Some(clcf) = NgxHttpCoreModule::location_conf_mut(unsafe { &*cf }) else {
        return NGX_CONF_ERROR;
    };
    if clcf.handler.is_some() {
        return fail(
            cf,
            ParseError::Duplicate {
                directive: "rate_ctl_stats",
            },
        );
    }
    clcf.handler = Some(stats_handler);
    mark_used(cf);
    NGX_CONF_OK
}

extern "C" fn stats_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls content handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    let log = r.log();
    super::guard::guard(
        "the stats handler",
        log,
        NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        || {
            super::guard::test_panic(super::guard::Entry::Stats);
            serve(r).0
        },
    )
}

fn serve(r: &mut Request) -> Status {
    let raw: &ngx_http_request_t = r.as_ref();
    if raw.method & (NGX_HTTP_GET | NGX_HTTP_HEAD) as usize == 0 {
        return HTTPStatus(NGX_HTTP_NOT_ALLOWED as usize).into();
    }
    let prometheus = wants_prometheus(raw.args.as_bytes());
    let Some(mc) = RateCtlModule::main_conf(r) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let now_ns = super::time::monotonic_ns();
    let now_ms = super::time::unix_ms();
    let log = r.log();
    let Some(stats) = with_worker(mc, |w| {
        w.refresh(mc, now_ns, log);
        let mut s = snapshot(&w.reader);
        s.undefined_dimensions = w.undefined.clone();
        s
    }) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let (body, ctype) = if prometheus {
        (
            render_prometheus(&stats, now_ms),
            "text/plain; version=0.0.4",
        )
    } else {
        (render_json(&stats, now_ms), "application/json")
    };
    let rc = r.discard_request_body();
    if !rc.is_ok() {
        return rc;
    }
    r.set_status(HTTPStatus::OK);
    r.set_content_length_n(body.len());
    {
        let raw: &mut ngx_http_request_t = r.as_mut();
        raw.headers_out.content_type.len = ctype.len();
        raw.headers_out.content_type.data = ctype.as_ptr().cast_mut();
        raw.headers_out.content_type_len = ctype.len();
        raw.headers_out.content_type_lowcase = std::ptr::null_mut();
    }
    let rc = r.send_header();
    if rc == Status::NGX_ERROR || rc.0 > Status::NGX_OK.0 || r.header_only() {
        return rc;
    }
    let Some(mut buf) = r.pool().create_buffer_from_str(&body) else {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
    };
    let b = buf.as_ngx_buf_mut();
    // SAFETY: b is a valid buffer just created in the request pool.
    unsafe {
        (*b).set_last_buf(1);
        (*b).set_last_in_chain(1);
    }
    let mut out = ngx_chain_t {
        buf: b,
        next: std::ptr::null_mut(),
    };
    r.output_filter(&mut out)
}
