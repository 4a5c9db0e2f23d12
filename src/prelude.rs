//! Everything an application names every day, in one import: `use leasehold::prelude::*;`.
//!
//! The stores' calls are the methods of two traits, [`JobStore`] (every write) and
//! [`ReadJobs`] (every read), which must be in scope to be called; this brings them, and
//! the types the calls take and give. It leaves out `Error` and `Result`, whose names an
//! application's own code is likely to use: name them `leasehold::Error` and
//! `leasehold::Result`.

pub use crate::{
    Durability, Edit, Job, JobContext, JobError, JobFilter, JobId, JobState, JobStore, Lease,
    LeaseTerms, NewGroup, NewJob, Output, QueueLimits, Queues, ReadJobs, Reaper, Renewal,
    RetryPolicy, Schedule, Scheduler, Sharing, Store, StoreBuilder, StoreReader, WorkerPool,
};

#[cfg(feature = "postgres")]
pub use crate::postgres::PgStore;
