//! The lease store's behaviour, one module per part of the protocol. Every test runs on a
//! manual clock and ends with an integrity check (see `common::Fixture`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cancel;
mod claim;
mod common;
mod enqueue;
mod fencing;
mod group;
mod open;
mod reader;
mod reap;
mod retry;
mod stall;
mod wake;

#[path = "../support/helper_process.rs"]
mod helper_process;

#[test]
#[ignore = "the helper process the other tests start, not a test of its own"]
fn helper_process() {
    helper_process::run();
}
