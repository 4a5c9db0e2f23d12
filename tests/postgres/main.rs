//! The lease protocol on PostgreSQL, against a real server: `LEASEHOLD_PG_URL` names it
//! (`.ci/run` sets it; without it, `cargo test` says in one line that the suite did not run).
//! Each test works in a schema of its own, dropped at its end.
//!
//! Store time is the database's clock, which a test cannot stop; instead of waiting out a
//! lease, a test moves the lease's expiry into the past with SQL ([`db::Db::lapse`]), which
//! is what time passing does to it.
//!
//! - `suite`: the protocol, pools, partitions and kills on a real server.
//! - `sql_functions`: `add_job` and the ends and edits asked for in SQL.
//! - `attacks`: what attacks on the engine broke, each defect with its regression test
//!   (hostile names and schemas, tables altered by hand, backends ended mid-commit, roles
//!   with other defaults, deadlocks in the application's SQL, stopped pool processes).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../support/groups.rs"]
mod groups;
#[path = "../support/helper_process.rs"]
mod helper_process;

#[test]
#[ignore = "the helper process the other tests start, not a test of its own"]
fn helper_process() {
    helper_process::run();
}

/// A line on stderr that the test harness does not capture: a skipped suite must be seen.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[macro_use]
mod db;

mod attacks;
mod failover;
mod sql_functions;
mod suite;
