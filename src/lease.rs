//! Plain data handed to a worker: the lease it holds and the answer to a renewal.

use std::time::Duration;

use crate::ids::{Attempt, JobId, LeaseToken, StoreTime};

/// A worker's hold on one attempt of one job.
///
/// `attempt` and `token` are the fence: heartbeat, complete, fail and release succeed only
/// while the job is still `Running` under this very attempt, granted by this very lease.
/// Cloning a lease does not clone the right to act on it: a stale clone is refused by the
/// store like any other stale holder.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The job.
    pub job: JobId,
    /// The attempt this lease was granted for.
    pub attempt: Attempt,
    /// The lease's own token, drawn when it was granted: it tells this lease from another
    /// granted for the same attempt number by a store that lost its last commits (see
    /// [`LeaseToken`]).
    pub token: LeaseToken,
    /// The job's queue.
    pub queue: String,
    /// The worker that claimed it.
    pub worker: String,
    /// When the claim happened, on the store clock.
    pub claimed_at: StoreTime,
    /// When the job was due (its run-at when it was claimed): how long it waited is
    /// `claimed_at` less this, on the store clock.
    pub due_at: StoreTime,
    /// When the lease expires unless renewed, as granted at claim. Renewals move the stored
    /// expiry; see [`Renewal`]. Workers never compare this with their own clock.
    pub expires_at: StoreTime,
    /// The lease length; each renewal extends by this much.
    pub length: Duration,
    /// When the attempt's hard time limit ends it, on the store clock (the job's own limit,
    /// or the claimer's [`LeaseTerms::time_limit`]); `None` without one.
    pub deadline: Option<StoreTime>,
    /// The job's payload.
    pub payload: Vec<u8>,
}

impl Lease {
    /// What this lease's writes name for the fence.
    pub(crate) fn holding(&self) -> Holding {
        Holding {
            job: self.job,
            attempt: self.attempt,
            token: self.token,
        }
    }
}

/// What a holder's write names, and the fence compares with the job's record: the job, the
/// attempt and the token of the lease it holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holding {
    /// The job.
    pub job: JobId,
    /// The attempt the lease was granted for.
    pub attempt: Attempt,
    /// The lease's token.
    pub token: LeaseToken,
}

/// The terms a lease is granted on. A plain [`Duration`] converts into terms with no stall
/// timeout, so `store.claim(queue, worker, Duration::from_secs(60))` reads as it should.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseTerms {
    /// How long the lease lasts; each renewal extends it by this much from the renewal.
    pub length: Duration,
    /// If set, a heartbeat that finds the job's progress unchanged for this long revokes the
    /// lease instead of renewing it ([`Renewal::Stalled`]): a hung job cannot hold its lease
    /// forever just because its heartbeat thread is healthy.
    pub stall_timeout: Option<Duration>,
    /// If set, the hard time limit of an attempt of a job that has none of its own
    /// ([`crate::NewJob::time_limit`]): a renewal at or after claim time plus the limit
    /// ends the attempt as timed out ([`Renewal::TimedOut`]) instead of renewing.
    pub time_limit: Option<Duration>,
}

impl LeaseTerms {
    /// A lease of `length` with no stall timeout and no time limit.
    pub fn new(length: Duration) -> LeaseTerms {
        LeaseTerms {
            length,
            stall_timeout: None,
            time_limit: None,
        }
    }

    /// Revoke the lease when progress has not advanced for `timeout`.
    pub fn stall_timeout(mut self, timeout: Duration) -> LeaseTerms {
        self.stall_timeout = Some(timeout);
        self
    }

    /// End an attempt (of a job without a limit of its own) once it has run for `limit`.
    pub fn time_limit(mut self, limit: Duration) -> LeaseTerms {
        self.time_limit = Some(limit);
        self
    }
}

impl From<Duration> for LeaseTerms {
    fn from(length: Duration) -> LeaseTerms {
        LeaseTerms::new(length)
    }
}

/// The answer to a successful heartbeat.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// The lease now expires at this store time.
    Renewed {
        /// The new expiry.
        expires_at: StoreTime,
    },
    /// The job was cancelled: the lease is over and the job is `Cancelled`. Stop working and
    /// commit nothing.
    Cancelled,
    /// The job made no progress for its stall timeout: the lease is revoked (history outcome
    /// `Stalled`, one unit of retry budget spent). Stop working and commit nothing.
    Stalled,
    /// The attempt ran into its hard time limit: the lease is over (history outcome
    /// `TimedOut`, one unit of retry budget spent). Stop working and commit nothing.
    TimedOut,
}
