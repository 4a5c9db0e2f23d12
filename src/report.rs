//! Plain data returned by maintenance passes.

use std::time::Duration;

use bincode::{Decode, Encode};

use crate::ids::{Attempt, JobId, StoreTime};
use crate::job::ReclaimPath;
use crate::state::JobState;

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
    /// Waiting jobs ended as [`JobState::Expired`](crate::JobState::Expired): not started by
    /// their expiry ([`crate::NewJob::expires_in`]), and claimed by nobody since.
    pub expired: Vec<crate::ids::JobId>,
    /// The tables whose dead row versions this pass started a vacuum of (PostgreSQL only:
    /// see `PgStoreBuilder::vacuum_when_dead`; always empty on redb).
    pub vacuum_started: Vec<String>,
}

impl ReapReport {
    /// Whether the pass changed a job: took a lease back, ended a job as expired or purged
    /// one (what an idle pass does not do, and what leaves dead row versions behind).
    pub(crate) fn changed_jobs(&self) -> bool {
        !self.reclaimed.is_empty() || !self.expired.is_empty() || self.purged > 0
    }

    /// The longest detection delay in this pass.
    pub fn worst_detection_delay(&self) -> Option<Duration> {
        self.reclaimed.iter().map(|r| r.detection_delay).max()
    }
}

/// The last reaper pass made on a store, by any process or machine: recorded by each pass
/// in a small transaction of its own after its work, and read with the store's counts
/// ([`Stats::last_reaper_pass`](crate::Stats::last_reaper_pass)), so an operator sees that
/// something is taking back expired leases, and a pass that has not happened for a while
/// ([`ReaperPass::late`]) is seen as a reaper that died or was never started.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[non_exhaustive]
pub struct ReaperPass {
    /// When the pass ended.
    pub at: StoreTime,
    /// How long it took (store time, its purge included).
    pub took: Duration,
    /// Leases it took back.
    pub reclaimed: u64,
    /// Finished jobs it purged under the store's retention.
    pub purged: u64,
    /// How often the reaper that made it runs (`None` for a pass called directly, such as
    /// `leasehold reap`).
    pub every: Option<Duration>,
}

impl ReaperPass {
    /// The record of a pass that began at `began`, ended at `ended` and did `report`.
    pub(crate) fn of(
        report: &ReapReport,
        began: StoreTime,
        ended: StoreTime,
        every: Option<Duration>,
    ) -> ReaperPass {
        ReaperPass {
            at: ended,
            took: ended.saturating_since(began),
            reclaimed: report.reclaimed.len() as u64,
            purged: report.purged as u64,
            every,
        }
    }

    /// How long ago the pass ended, as of `now`.
    pub fn age(&self, now: StoreTime) -> Duration {
        now.saturating_since(self.at)
    }

    /// Whether, as of `now`, its reaper has missed at least two passes in a row: a reaper
    /// that stopped (its process gone, its thread never started again). A pass called
    /// directly (no interval) is never late; the age says how old it is.
    pub fn late(&self, now: StoreTime) -> bool {
        self.every
            .is_some_and(|every| self.age(now) > every.saturating_mul(3))
    }
}

/// The findings of an integrity check ([`ReadJobs::check`](crate::ReadJobs::check),
/// `ReadJobs::check` with the `postgres` feature).
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
    pub refused: Vec<(crate::ids::JobId, crate::error::Error)>,
}
