//! The two orders waiting jobs are taken in, named once. Every engine keeps an index in
//! each, and a search that sorts (the memory engine's, a listing by priority, the model
//! test's) sorts by these functions; SQL spells them with [`claim_order_sql`] and
//! [`key_order_sql`]. A newcomer asked for "priority within a key" changes [`key_order`],
//! then every index and statement these name (redb's `keyed` key in `redb_store/index.rs`,
//! PostgreSQL's `leasehold_jobs_keyed` index), and the shared suites hold each engine to it.

use crate::ids::{JobId, StoreTime};
use crate::job::JobRecord;

/// A waiting job's place in its queue's claim order: the lowest priority number first, then
/// the earliest run time, then the oldest id (first in, first out among equals). redb's
/// `ready` index is keyed `(queue, priority, run_at, id)`; PostgreSQL's
/// `leasehold_jobs_ready` index is `(queue, priority, run_at, id)` and its claims order by
/// [`claim_order_sql`].
pub(crate) fn claim_order(job: &JobRecord) -> (i32, StoreTime, JobId) {
    (job.priority, job.run_at, job.id)
}

/// A keyed job's place among its key's waiting jobs: the earliest run time, then the oldest
/// id. Priority orders the keys' heads in the claim order, not a key's own jobs: a key runs
/// its jobs as they fall due. redb's `keyed` index is keyed `(queue, key, run_at, id)`;
/// PostgreSQL's `leasehold_jobs_keyed` index is `(queue, limit_key, run_at, id)` and its
/// statements order by [`key_order_sql`].
pub(crate) fn key_order(job: &JobRecord) -> (StoreTime, JobId) {
    (job.run_at, job.id)
}

/// [`claim_order`] as the columns of an `ORDER BY` (a literal, for `concat!`).
#[cfg(feature = "postgres")]
macro_rules! claim_order_sql {
    () => {
        "priority, run_at, id"
    };
}

/// [`key_order`] as the columns of an `ORDER BY` (a literal, for `concat!`).
#[cfg(feature = "postgres")]
macro_rules! key_order_sql {
    () => {
        "run_at, id"
    };
}

#[cfg(feature = "postgres")]
pub(crate) use {claim_order_sql, key_order_sql};
