//! # leasehold
//!
//! An embedded job scheduler in which workers hold jobs on time-limited leases. One crate
//! and no server of its own: the store is one file (a [redb] database), shared by the
//! processes of one host if need be ([`Sharing::MultiProcess`]), or (the `postgres`
//! feature) a PostgreSQL database that worker machines share.
//!
//! ## The lease story
//! A worker that dies rarely says so: it is OOM-killed, loses power, hangs or is cut off. A
//! job merely marked "running" would be orphaned forever. So in leasehold, holding a job is
//! time-bound:
//!
//! * **Claim** ([`JobStore::claim`]) is one atomic conditional update: a job is taken if it is
//!   waiting and due, or running with an *expired* lease (claim-time takeover). Two workers
//!   can never both win, and every claim increments the job's [`Attempt`].
//! * **Heartbeat** ([`JobStore::heartbeat`]) renews the lease only while the job is still
//!   running under the same attempt. A renewal that is refused means the lease is lost:
//!   stop, and commit nothing.
//! * **One clock.** Every expiry is written and compared on the store's clock ([`Clock`]),
//!   inside the store. Workers never compare wall clocks.
//! * **Reclaim** happens three ways: a [`Reaper`] pass finds expired leases, records a
//!   [`Outcome::LeaseExpired`] in the job's history and moves the job on; a claimer takes an
//!   expired job over; a worker that shuts down on purpose [releases](crate::JobStore::release) its
//!   jobs. (And at open, leases left by a process that is gone are taken back at once.)
//! * **Fencing.** The attempt, with the lease's random [`LeaseToken`], is the fence: a
//!   paused worker that wakes after its job was reclaimed has its heartbeat, completion and
//!   failure refused with [`Error::LeaseLost`], also after a database failover or a restored
//!   backup granted the same attempt number again. A false reclaim can run a job twice, so side effects must be
//!   idempotent; [`Store::complete_with`] commits the application's own writes in the same
//!   transaction as the completion, guarded by the fence.
//!
//! A dead worker's job is taken back at most **lease length + reaper interval** after its
//! last renewal (60 s + 15 s by default): the lease must run out, then the next reaper pass
//! must come.
//!
//! ## The state machine
//! Every job is in one [`JobState`]; these are the moves between them.
//! ```text
//!   enqueue
//!      │
//!      ├── waits for jobs or a group ──► Blocked ── one ended otherwise ──► Cancelled
//!      │                                    │
//!      │                                    │ what it waits for ended as it needs
//!      ▼                                    ▼
//!   Queued ◄────────────────────────────────────────────────┐
//!      │                                                    │ release; lease expired with
//!      │ claim: attempt + 1, a new lease token              │ budget left; snooze
//!      ▼                                                    │
//!   Running ────────────────────────────────────────────────┘
//!      ├── complete ──────────────────────────────────────────► Succeeded
//!      ├── fail, stall, time limit, budget left ──────────────► RetryWait ── backoff over ──► as Queued
//!      └── fail, stall, time limit, lease expired with the
//!          budget spent; fail_permanently ────────────────────► Dead
//!
//!   cancel: a waiting, backing-off or blocked job ──► Cancelled at once;
//!           a running one at its holder's next heartbeat or end
//!   expiry: a queued, backing-off or blocked job past its expires_at ──► Expired
//!           (at the claim that would start it, or the next reaper pass)
//! ```
//!
//! ## Quick start
//! ```
//! use std::time::Duration;
//! use leasehold::{ManualClock, NewJob, Store, JobState};
//! use leasehold::{JobStore, ReadJobs};
//!
//! # let dir = tempfile::tempdir().unwrap();
//! let clock = ManualClock::new();
//! let store = Store::builder(dir.path().join("jobs.redb")).clock(clock.clone()).open()?;
//! let id = store.enqueue(NewJob::new("thumbnails", b"photo-1.jpg".to_vec()))?;
//!
//! let lease = store.claim("thumbnails", "worker-a", Duration::from_secs(60))?.unwrap();
//! store.heartbeat(&lease, 1)?;                       // renews by 60 s from now
//!
//! clock.advance(Duration::from_secs(61));            // worker-a went silent...
//! let report = store.reap()?;                        // ...and the reaper takes the job back
//! assert_eq!(report.reclaimed.len(), 1);
//!
//! let again = store.claim("thumbnails", "worker-b", Duration::from_secs(60))?.unwrap();
//! assert!(store.complete(&lease, b"late").unwrap_err().is_lease_lost()); // fenced
//! store.complete(&again, b"done")?;
//! assert_eq!(store.job(id)?.unwrap().state(), JobState::Succeeded);
//! # Ok::<(), leasehold::Error>(())
//! ```
//!
//! [redb]: https://docs.rs/redb

#![warn(missing_docs)]
// On docs.rs (nightly, `--cfg docsrs`), every item behind a feature says which one it needs,
// so `NewJob::json` without `serde` has a findable answer.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The vocabulary: plain data, errors, settings and the checks of inputs, and the one place
// records become bytes.
mod checkpoint;
mod clock;
mod codec;
mod config;
mod edit;
mod endings;
mod error;
mod events;
mod ids;
mod input;
mod job;
mod job_log;
mod lease;
mod new_job;
mod query;
mod queue;
mod random;
mod report;
mod retry;
mod schedule;
mod state;
mod stats;
mod workflow;

// The rule book, and maintenance in batches.
mod batches;
mod protocol;
mod rules;

// The contract both engines keep, the seam between them and what runs on them, and the
// wake-ups both use.
mod backend;
mod conveniences;
mod engine;
mod holder;
mod job_store;
mod notify;
mod wait_end;

// What runs on either engine.
#[cfg(feature = "tokio")]
mod asynchronous;
#[cfg(feature = "serde")]
mod json;
pub mod memory;
mod pool;
pub mod prelude;
mod reaper;
mod scheduler;
mod ticker;

// The engines: a redb file (named apart from the redb crate, which `leasehold::redb`
// re-exports), and PostgreSQL.
mod redb_store;

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "postgres")]
pub mod postgres;

pub use checkpoint::Checkpoint;
pub use clock::{Clock, ClockReading, ManualClock, MonotonicClock};
pub use config::{
    DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD, DEFAULT_REAP_BATCH,
    DEFAULT_REAPER_INTERVAL, Durability, MAX_LEASE,
};
pub use edit::Edit;
pub use endings::{EndCursor, EndOf, Ending, Endings};
pub use engine::{Backend, Engine};
pub use error::{ConfigError, Error, InputError, LeaseLost, OpenError, Result};
pub use events::{EVENTS_BUFFER, Event, Events};
pub use ids::{Attempt, GroupId, InstanceId, JobId, LeaseToken, StoreTime};
pub use job::{Job, JobLease, Outcome, ReclaimPath, Run, Uniqueness};
pub use job_log::{AttemptLog, MAX_LOG_LINE, MAX_LOG_LINES};
pub use job_store::{JobStore, ReadJobs};
pub use lease::{Lease, LeaseTerms, Renewal};
pub use new_job::{NewGroup, NewJob};
pub use pool::{
    AnyWrites, AttemptEnded, DEFAULT_MAX_BATCH, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WINDOW,
    Interrupted, Interruption, JOB_TIME_BOUNDS, JobContext, JobError, LATENCY_BOUNDS,
    LATENCY_BUCKETS, Latencies, MAX_POOL_QUEUES, Output, PoolBuilder, PoolStats, QueueTally,
    Queues, ShutdownReport, WorkerPool,
};
pub use query::{JobFilter, JobOrder, QueueTiming};
pub use queue::{MAX_RATE_CLAIMS, QueueLimits, QueueSettings, Rate, UNSERVED_AFTER, UnservedQueue};
pub use reaper::{Reaper, ReaperMetrics};
pub use redb_store::{
    HolderState, RESERVED_TABLE_PREFIX, RedbWrites, SCHEMA_VERSION, Sharing, Store, StoreBuilder,
    StoreReader, Transaction,
};
pub use report::{BulkReport, CheckReport, ReapReport, ReaperPass, Reclaim};
pub use retry::{MAX_RETRY_DELAYS, RetryPolicy};
pub use schedule::{
    CatchUp, MAX_TICKS_PER_PASS, MIN_INTERVAL, ON_TIME, Schedule, ScheduleInfo, Tick, When,
};
pub use scheduler::{Scheduler, SchedulerMetrics};
pub use state::JobState;
pub use stats::{Counters, QueueCounts, Stats, WriteMetrics};
pub use wait_end::{FOLLOW_LOOK, WAIT_MAX_PAUSE};
pub use workflow::{
    Group, MAX_DEPENDENCIES, MAX_GROUP_MEMBERS, MAX_GROUP_WAITERS, MAX_SUBGROUPS, Need, Require,
    Target,
};

/// The redb this build stores into: the application's own tables in the store's file
/// ([`Transaction::open_table`], [`Store::begin_read`], [`StoreReader::begin_read`]) use its
/// types, so name them through this re-export rather than a separately chosen version.
pub use redb;

/// The README's examples are compiled and run as doctests, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's page `docs/workers.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/workers.md")]
struct GuideWorkers;

/// The guide's page `docs/workflows.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/workflows.md")]
struct GuideWorkflows;

/// The guide's page `docs/queues.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/queues.md")]
struct GuideQueues;

/// The guide's page `docs/schedules.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/schedules.md")]
struct GuideSchedules;

/// The guide's page `docs/processes.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/processes.md")]
struct GuideProcesses;

/// The guide's page `docs/postgres.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/postgres.md")]
struct GuidePostgres;

/// The guide's page `docs/operating.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
struct GuideOperating;

/// The guide's page `docs/page.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/page.md")]
struct GuidePage;

/// The guide's page `docs/events.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/events.md")]
struct GuideEvents;

/// The guide's page `docs/testing-handlers.md`, its examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/testing-handlers.md")]
struct GuideTestingHandlers;

/// For leasehold's own fuzzers and tests (the `__internal` feature); not part of the API.
#[cfg(feature = "__internal")]
#[doc(hidden)]
pub mod __private {
    use crate::codec::{decode, decode_job, encode};
    use crate::job::{JobRecord, RunRecord};

    /// Decodes `data` as every kind of stored record, for the fuzzers: whatever the bytes,
    /// decoding returns an error or a value and never panics.
    pub fn decode_stored_records(data: &[u8]) {
        let _ = decode_job(data);
        let _ = decode::<RunRecord>(data);
        let _ = crate::redb_store::decode_counters(data);
        let _ = decode::<crate::clock::Anchor>(data);
    }

    /// When an idle pool of `queue` would look again on any store (`LeaseBackend::next_due`).
    pub fn next_due(
        store: &(impl crate::JobStore + ?Sized),
        queue: &str,
    ) -> crate::Result<Option<crate::StoreTime>> {
        crate::backend::LeaseBackend::next_due(store, queue)
    }

    /// Rewrites job `id`'s attempt counter on any store, as a store that ran that many
    /// claims would hold it: for the suites' tests of an exhausted counter.
    pub fn forge_attempt(store: &impl crate::JobStore, id: crate::JobId, attempt: u32) {
        let _ = crate::backend::write(store, move |r| {
            if let Some(old) = r.job(id)? {
                let forged = JobRecord {
                    attempt: crate::Attempt(attempt),
                    ..old.clone()
                };
                r.save(&old, &forged)?;
            }
            Ok(())
        });
    }

    /// A stored job record with its attempt counter replaced, for tests that need a store
    /// that ran that many claims; `None` if `record` is not a job record.
    pub fn with_attempt(record: &[u8], attempt: u32) -> Option<Vec<u8>> {
        let mut job: JobRecord = decode_job(record).ok()?;
        job.attempt = crate::Attempt(attempt);
        Some(encode(&job))
    }
}
