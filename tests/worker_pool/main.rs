//! The worker pool with real threads on a manual store clock: leases expire only when a test
//! moves time, and every wait is on a condition with a generous deadline.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../lease_store/common.rs"]
#[allow(dead_code)]
mod common;

#[cfg(feature = "tokio")]
mod asynchronous;
mod failures;
mod lifecycle;
mod renewals;
#[cfg(feature = "serde")]
mod typed;

use std::time::Duration;

use leasehold::{JobContext, JobError, PoolBuilder, WorkerPool};

use common::{Fixture, LEASE, Q};

/// Heartbeats tick every few real milliseconds, so each test sees many of them.
pub const BEAT: Duration = Duration::from_millis(5);

pub fn pool(f: &Fixture, id: &str) -> PoolBuilder {
    WorkerPool::builder((**f).clone(), Q)
        .worker_id(id)
        .lease(LEASE)
        .heartbeat_every(BEAT)
        .shutdown_grace(Duration::from_secs(5))
}

/// A handler that works until its job is interrupted, then reports the interruption.
pub fn until_interrupted(ctx: &JobContext) -> Result<Vec<u8>, JobError> {
    loop {
        ctx.sleep(Duration::from_secs(3600))?;
    }
}
