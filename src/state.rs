//! The states a job moves through, and what each allows. Plain data, beneath everything
//! else: errors name states, jobs and groups are in them, rules move jobs between them.

use std::fmt;

use bincode::{Decode, Encode};

/// Where a job is in its life. The state machine is drawn in the crate docs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum JobState {
    /// Waiting to be claimed; claimable once its `run_at` has come.
    Queued,
    /// Held by a worker under a lease that expires at `lease.expires_at` unless renewed.
    Running,
    /// An attempt failed (or its lease expired) and the job waits out a backoff before it is
    /// claimable again; claimable once its `run_at` has come.
    RetryWait,
    /// Finished: the holder completed it. Terminal.
    Succeeded,
    /// Its retry budget is spent. Terminal until an operator retries it.
    Dead,
    /// Cancelled on request, or because a job it waited for ended otherwise than it
    /// required. Terminal.
    Cancelled,
    /// Waits for other jobs ([`crate::NewJob::after`], [`crate::NewGroup`]): claimable once each
    /// has ended as it requires, cancelled as soon as one ended otherwise.
    Blocked,
    /// Not started by its expiry ([`crate::NewJob::expires_in`]): it never ran again once the
    /// time passed, and never will. To what waits for it, and to its group's counts, an
    /// expired job is a cancelled one. Terminal until an operator retries it.
    Expired,
}

impl JobState {
    /// Every state, in a stable order (used for stats).
    pub const ALL: [JobState; 8] = [
        JobState::Blocked,
        JobState::Queued,
        JobState::Running,
        JobState::RetryWait,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
        JobState::Expired,
    ];

    /// Whether the job will not run again on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled | JobState::Expired
        )
    }

    /// Whether the job waits to be claimed (queued or in retry backoff).
    pub fn is_waiting(self) -> bool {
        matches!(self, JobState::Queued | JobState::RetryWait)
    }

    /// A stable one-byte code, used in index keys.
    pub(crate) fn code(self) -> u8 {
        match self {
            JobState::Queued => 0,
            JobState::Running => 1,
            JobState::RetryWait => 2,
            JobState::Succeeded => 3,
            JobState::Dead => 4,
            JobState::Cancelled => 5,
            JobState::Blocked => 6,
            JobState::Expired => 7,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The lower-case name used in output (`queued`, `retry_wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::RetryWait => "retry_wait",
            JobState::Succeeded => "succeeded",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
            JobState::Blocked => "blocked",
            JobState::Expired => "expired",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
