//! Fuzz target: see `tests/support/fuzz_checks.rs` for what it checks.
#![no_main]

include!("shared_modules.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::open_file(data));
