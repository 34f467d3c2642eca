//! The shared-memory reader on arbitrary file contents: must refuse or
//! accept, never panic or read out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rate_ctl::core::fuzz::fuzz_reader(data);
});
