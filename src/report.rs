//! Plain data returned by maintenance passes.

use std::time::Duration;

use crate::ids::{Attempt, JobId, StoreTime};
use crate::job::{JobState, ReclaimPath};

/// One lease taken back.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclaim {
    /// The job.
    pub job: JobId,
    /// The attempt whose lease was taken back.
    pub attempt: Attempt,
    /// The worker that held it.
    pub worker: String,
    /// When the lease expired.
    pub expired_at: StoreTime,
    /// When it was taken back.
    pub reclaimed_at: StoreTime,
    /// How long after the expiry it was taken back.
    pub overdue: Duration,
    /// How long after the holder's last renewal it was taken back (lease length + overdue):
    /// the detection delay, bounded by lease length + reaper interval.
    pub detection_delay: Duration,
    /// Which path took it back.
    pub path: ReclaimPath,
    /// The state the reclaim moved the job to (`Queued`, `Dead` or `Cancelled`).
    pub job_state: JobState,
}

/// What one reaper pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReapReport {
    /// Every lease taken back, in the order they were.
    pub reclaimed: Vec<Reclaim>,
    /// How many transactions of the pass looked at leases (each looks at most the configured
    /// batch; a pass stops at the first that finds fewer).
    pub batches: usize,
    /// The most leases one of those transactions took back.
    pub largest_batch: usize,
    /// Finished jobs deleted because they outlived the store's retention (see
    /// [`crate::StoreBuilder::retention`]).
    pub purged: usize,
    /// The tables whose dead row versions this pass started a vacuum of (PostgreSQL only:
    /// see `PgStoreBuilder::vacuum_when_dead`; always empty on redb).
    pub vacuum_started: Vec<String>,
}

impl ReapReport {
    /// The longest detection delay in this pass.
    pub fn worst_detection_delay(&self) -> Option<Duration> {
        self.reclaimed.iter().map(|r| r.detection_delay).max()
    }
}

/// The findings of an integrity check ([`Store::check`](crate::Store::check),
/// `PgStore::check` with the `postgres` feature).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// How many job records were checked.
    pub jobs: u64,
    /// Every inconsistency found, in words. Empty means the store is sound.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What an operator's action on many jobs did ([`crate::JobStore::retry_all`],
/// [`crate::JobStore::cancel_all`]).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct BulkReport {
    /// How many jobs the filter named.
    pub matched: usize,
    /// How many of them the action changed.
    pub changed: usize,
    /// Those it refused, with why (a job in a state the action does not apply to, a retry
    /// whose unique key another job holds); each refusal wrote nothing.
    pub refused: Vec<(crate::JobId, crate::Error)>,
}
