//! The request path: a random table (per-key strategies, priorities,
//! allow, blacklist) published into a small real file, then random
//! requests through the worker's decide path. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rate_ctl::core::fuzz::fuzz_decide(data);
});
