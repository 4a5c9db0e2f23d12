//! The worker pool with real threads on a manual store clock: leases expire only when a test
//! moves time, and every wait is on a condition with a generous deadline. Most tests are
//! functions over a backend, run on the redb store and on the PostgreSQL store (see
//! `on_both`); those of what only redb has use its `Fixture`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../lease_store/common.rs"]
#[allow(dead_code)]
mod common;

#[path = "../support/backends.rs"]
mod backends;
#[path = "../support/on_both.rs"]
mod on_both;

#[cfg(feature = "tokio")]
mod asynchronous;
mod ended;
mod failures;
mod lifecycle;
mod queues;
mod renewals;
mod resume;
#[cfg(feature = "serde")]
mod typed;
mod workflow;

use std::time::Duration;

use leasehold::{JobContext, JobError, PoolBuilder, WorkerPool};

use common::Fixture;
use on_both::{Backend, LEASE, Q};

/// Heartbeats tick every few real milliseconds, so each test sees many of them.
pub const BEAT: Duration = Duration::from_millis(5);

/// A pool of worker `id` on the backend's queue [`Q`], heartbeating every [`BEAT`].
pub fn pool(f: &Backend, id: &str) -> PoolBuilder {
    settings(f.pool(Q.into()), id)
}

/// [`pool`] on the redb fixture, for the tests of what only redb has.
pub fn redb_pool(f: &Fixture, id: &str) -> PoolBuilder<leasehold::Store> {
    settings(WorkerPool::builder((**f).clone(), Q), id)
}

pub fn settings<S: leasehold::Engine>(builder: PoolBuilder<S>, id: &str) -> PoolBuilder<S> {
    builder
        .worker_id(id)
        .lease(LEASE)
        .heartbeat_every(BEAT)
        .shutdown_grace(Duration::from_secs(5))
}

/// Whether `p` holds `n` jobs and has started every one: none waits claimed ahead (a job
/// interrupted before its worker takes it is never run, so a test that means to interrupt a
/// running handler waits for this, not for the claim alone).
pub fn started(p: &WorkerPool, n: u64) -> bool {
    let stats = p.stats();
    stats.in_flight == n && stats.claimed_ahead == 0
}

/// A handler that works until its job is interrupted, then reports the interruption.
pub fn until_interrupted(ctx: &JobContext) -> Result<Vec<u8>, JobError> {
    loop {
        ctx.sleep(Duration::from_secs(3600))?;
    }
}
