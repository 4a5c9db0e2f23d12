// Included (`include!`) by every fuzz target, not a target itself: the checks live with the
// tests (`tests/support/`), so `cargo test` replays the same code on the stored corpora.

#[path = "../../tests/support/model.rs"]
#[allow(dead_code)]
mod model;
#[path = "../../tests/support/backends.rs"]
#[allow(dead_code)]
mod backends;
#[path = "../../tests/support/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../../tests/support/fuzz_checks.rs"]
#[allow(dead_code)]
mod fuzz_checks;
