//! Small helpers over nginx's API (the request pool, the cycle's log)
//! that more than one part of the module uses.

use std::io::Write as _;
use std::ptr;

use ngx::ffi::{ngx_cycle, ngx_log_t, ngx_pnalloc};
use ngx::http::Request;

/// `n` in decimal, copied into the request pool (formatted on the stack:
/// no heap); `None` if the pool is out of memory.
pub(super) fn number_in_pool(r: &Request, n: u64) -> Option<ngx::ffi::ngx_str_t> {
    let mut buf = [0u8; 20];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    write!(cur, "{n}").ok()?;
    let len = cur.position() as usize;
    bytes_in_pool(r, &buf[..len])
}

/// `bytes` copied into the request pool; `None` if the pool is out of
/// memory.
pub(super) fn bytes_in_pool(r: &Request, bytes: &[u8]) -> Option<ngx::ffi::ngx_str_t> {
    let len = bytes.len();
    // SAFETY: the request pool is live; we allocate `len` bytes from it.
    let data = unsafe { ngx_pnalloc(r.pool().as_ptr(), len) }.cast::<u8>();
    if data.is_null() {
        return None;
    }
    // SAFETY: data has room for len bytes; `bytes` holds them.
    unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), data, len) };
    Some(ngx::ffi::ngx_str_t { len, data })
}

/// `v` (a value of request `r`) normalised by `n`: `v` itself when it
/// would not change (most values: no copy), else its normalised bytes in
/// the request pool (no heap); `None` when it is absent after
/// normalisation or the pool is out of memory.
#[inline]
pub(super) fn normalised<'r>(
    r: &'r Request,
    v: &'r [u8],
    n: crate::core::normalise::Normalise,
) -> Option<&'r [u8]> {
    if !n.needed(v) {
        return Some(v);
    }
    normalised_in_pool(r, v, n)
}

#[inline(never)]
fn normalised_in_pool<'r>(
    r: &'r Request,
    v: &[u8],
    n: crate::core::normalise::Normalise,
) -> Option<&'r [u8]> {
    let len = v.len();
    // SAFETY: the request pool is live; we allocate `len` bytes from it.
    let data = unsafe { ngx_pnalloc(r.pool().as_ptr(), len) }.cast::<u8>();
    if data.is_null() {
        return None;
    }
    // SAFETY: data points to `len` bytes of the request pool, ours alone,
    // that live as long as the request (`'r`); nginx frees them with it.
    let out = unsafe { std::slice::from_raw_parts_mut(data, len) };
    let used = n.apply(v, out)?;
    Some(&out[..used])
}

/// The worker's log, without any request's context.
pub(super) fn cycle_log() -> *mut ngx_log_t {
    // SAFETY: ngx_cycle is set before any worker code runs and points to
    // the live cycle for the worker's life; only its log pointer is read.
    unsafe {
        let cycle = ptr::addr_of!(ngx_cycle).read();
        if cycle.is_null() {
            ptr::null_mut()
        } else {
            (*cycle).log
        }
    }
}
