//! The lease store's behaviour, one module per part of the protocol. Every test runs on a
//! manual clock and ends with an integrity check. The protocol's tests are functions over a
//! backend ([`on_both::Backend`]), each run on the redb store and on the PostgreSQL store
//! (`<module>::redb::<test>` and `<module>::postgres::<test>`); the tests of what only the
//! redb store has (its file, its group commit, its readers and process seats, its tables in
//! the application's transactions) use the redb [`common::Fixture`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bulk;
mod cancel;
mod checkpoint;
mod claim;
mod common;
mod edit;
mod endings;
mod enqueue;
mod events;
mod expiry;
mod fencing;
mod group;
mod keys;
mod logs;
mod nested;
mod open;
mod queues;
mod reader;
mod reap;
mod retry;
mod schedules;
mod served;
mod stall;
mod time_limit;
mod transaction;
mod unique;
mod wait_for;
mod wake;
mod workflow;

#[path = "../support/backends.rs"]
mod backends;
#[path = "../support/on_both.rs"]
mod on_both;

#[path = "../support/helper_process.rs"]
mod helper_process;

#[test]
#[ignore = "the helper process the other tests start, not a test of its own"]
fn helper_process() {
    helper_process::run();
}
