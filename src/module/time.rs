//! nginx's cached clocks, as the handler, the worker and the stats
//! endpoint read them (FFI only: every other clock is `core::clock`).

use std::ptr;

use ngx::ffi::ngx_timeofday;

use crate::core::clock::Now;

/// nginx's cached monotonic clock, in nanoseconds: `ngx_current_msec`
/// (`CLOCK_MONOTONIC` in whole milliseconds, the same in every worker),
/// refreshed once per event-loop iteration. It is the clock `limit_req`
/// uses: reading it costs a load instead of a `clock_gettime`, and a
/// request that arrives a fraction of a millisecond after its token does
/// not waste that fraction (with a nanosecond clock, a burst-1 limit under
/// overload admitted ~1 % less than its rate).
#[inline]
pub fn monotonic_ns() -> u64 {
    // SAFETY: a plain word that nginx writes only on this thread (the
    // worker's event loop) between handler calls.
    let ms = unsafe { ptr::addr_of!(ngx::ffi::ngx_current_msec).read() };
    (ms as u64).saturating_mul(1_000_000)
}

/// Wall-clock milliseconds from nginx's cached time (blacklist expiry).
#[inline]
pub fn unix_ms() -> u64 {
    let tp = ngx_timeofday();
    (tp.sec as u64) * 1000 + tp.msec as u64
}

/// Both cached clocks as the core's [`Now`]: what the LOG phase settles a
/// request's charges at.
#[inline]
pub fn now() -> Now {
    Now {
        mono_ns: monotonic_ns(),
        wall_ns: unix_ms().saturating_mul(1_000_000),
    }
}
