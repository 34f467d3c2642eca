//! One segment (header and payload) with arbitrary counts, lengths and
//! records: the worker's decoder and table builder and the agent's decoder
//! must refuse or accept, never panic, abort or allocate by what the bytes
//! announce. Fuzz builds skip the segment checksum (`cfg(fuzzing)`), so
//! the fuzzer reaches the records.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rate_ctl::core::fuzz::fuzz_segment(data);
});
