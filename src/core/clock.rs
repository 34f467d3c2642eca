//! Time, in one place: monotonic nanoseconds (the limiters), the wall
//! clock (windows, heartbeats, expiries) and the kernel's boot id (when
//! monotonic time restarted). nginx's cached clocks are read in
//! `src/module/time.rs`; everything else reads time here.
//!
//! Monotonic time in integer nanoseconds.
//!
//! The limiters never read a clock themselves: every call takes `now_ns`, so
//! one request reads the clock once and every strategy it hits sees the same
//! instant. [`MonotonicClock`] is the production source (`CLOCK_MONOTONIC`,
//! shared by every process of the host, so workers of one nginx agree on it;
//! it does not count across reboots, which is fine for a file in
//! `/dev/shm`). [`FakeClock`] drives the tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// A source of monotonic time in nanoseconds.
pub trait Clock {
    fn now_ns(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// `CLOCK_MONOTONIC` through libc (a vDSO call on Linux, about 20 ns).
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// Nanoseconds since an arbitrary, fixed point (boot on Linux).
    #[inline]
    pub fn now() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is
        // always supported on the platforms we build for.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        if rc != 0 {
            // Cannot happen for CLOCK_MONOTONIC; 0 is the most conservative
            // answer the limiters can get (it never moves state forward).
            return 0;
        }
        (ts.tv_sec.max(0) as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec.max(0) as u64)
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        MonotonicClock::now()
    }
}

/// A clock the test moves by hand. Shareable between threads.
#[derive(Debug, Default)]
pub struct FakeClock {
    ns: AtomicU64,
}

impl FakeClock {
    pub fn new(start_ns: u64) -> FakeClock {
        FakeClock {
            ns: AtomicU64::new(start_ns),
        }
    }

    /// Sets the time; going backwards is allowed (to test that it is safe).
    pub fn set(&self, ns: u64) {
        self.ns.store(ns, Ordering::SeqCst);
    }

    /// Moves the time forward by `ns` (saturating at `u64::MAX`).
    pub fn advance(&self, ns: u64) {
        let _ = self
            .ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ns))
            });
    }
}

impl Clock for FakeClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }
}

/// Time since the Unix epoch by the wall clock (zero if the clock is set
/// before 1970).
fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Wall-clock unix milliseconds (heartbeats, expiries, the store's times).
pub fn unix_ms() -> u64 {
    since_epoch().as_millis() as u64
}

/// The wall clock in Unix nanoseconds, the windows' clock.
pub fn unix_ns() -> u64 {
    u64::try_from(since_epoch().as_nanos()).unwrap_or(u64::MAX)
}

/// The kernel's boot id (random per boot), to notice that monotonic time
/// restarted and limiter state words are meaningless.
pub fn boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let txt = std::str::from_utf8(pair).unwrap_or("0");
            out[i] = u8::from_str_radix(txt, 16).unwrap_or(0);
        }
    }
    out
}

/// The time of a request, from both clocks: the buckets run on the
/// monotonic one (nanoseconds; immune to clock steps), the fixed and sliding
/// windows on the wall clock (Unix nanoseconds), so that their windows are
/// UTC minutes, hours and days, the same on every host. A plain `u64` is
/// both (tests, benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub mono_ns: u64,
    pub wall_ns: u64,
}

impl From<u64> for Now {
    #[inline]
    fn from(ns: u64) -> Now {
        Now {
            mono_ns: ns,
            wall_ns: ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = MonotonicClock.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = MonotonicClock.now_ns();
        assert!(a > 0);
        assert!(b >= a + 1_000_000, "{a} -> {b}");
    }

    #[test]
    fn fake_clock_is_set_and_advanced_and_saturates() {
        let c = FakeClock::new(10);
        assert_eq!(c.now_ns(), 10);
        c.advance(5);
        fn read<K: Clock>(k: K) -> u64 {
            k.now_ns()
        }
        assert_eq!(read(&c), 15, "a reference is a clock too");
        c.set(3);
        assert_eq!(c.now_ns(), 3);
        c.advance(u64::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
    }
}
