//! Fuzz target: see `tests/support/fuzz_checks.rs` for what it checks.
#![no_main]

#[path = "../../tests/support/model.rs"]
#[allow(dead_code)]
mod model;
#[path = "../../tests/support/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../../tests/support/fuzz_checks.rs"]
#[allow(dead_code)]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::open_file(data));
