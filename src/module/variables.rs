//! `$rate_ctl_status` and `$rate_ctl_strategy`, for access logs.

use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_pnalloc,
    ngx_str_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use ngx::http::Request;
use ngx::ngx_string;

use super::handler::find_ctx;

type GetHandler =
    unsafe extern "C" fn(*mut ngx_http_request_t, *mut ngx_http_variable_value_t, usize) -> isize;

/// Registers the variables; called from preconfiguration.
///
/// # Safety
/// `cf` must be the configuration nginx passes to preconfiguration.
pub unsafe fn add_variables(cf: *mut ngx_conf_t) -> Status {
    let vars: [(ngx_str_t, GetHandler); 2] = [
        (ngx_string!("rate_ctl_status"), status_variable),
        (ngx_string!("rate_ctl_strategy"), strategy_variable),
    ];
    for (mut name, get) in vars {
        // SAFETY: cf is valid (contract); nginx copies the name.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as _) };
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

fn set_value(v: &mut ngx_http_variable_value_t, data: *mut u8, len: usize) {
    v.set_len(len as u32);
    v.set_valid(1);
    v.set_no_cacheable(1);
    v.set_not_found(0);
    v.set_escape(0);
    v.data = data;
}

fn not_found(v: &mut ngx_http_variable_value_t) {
    v.set_not_found(1);
}

unsafe extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> isize {
    // SAFETY: nginx calls variable getters with a live request and value.
    let (r, v) = unsafe { (Request::from_ngx_http_request(r), &mut *v) };
    match find_ctx(r) {
        Some(ctx) => {
            let s = ctx.status.as_str();
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
    let (r, v) = unsafe { (Request::from_ngx_http_request(r), &mut *v) };
    let Some(id) = find_ctx(r).map(|c| c.strategy).filter(|&id| id != 0) else {
        not_found(v);
        return Status::NGX_OK.0;
    };
    let text = id.to_string();
    // SAFETY: the request pool is live; we copy `len` bytes into it.
    let p = unsafe { ngx_pnalloc(r.pool().as_ptr(), text.len()) }.cast::<u8>();
    if p.is_null() {
        return Status::NGX_ERROR.0;
    }
    // SAFETY: p has room for text.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), p, text.len()) };
    set_value(v, p, text.len());
    Status::NGX_OK.0
}
