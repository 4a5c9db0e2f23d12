//! What an operator asks of a store, whatever its engine: which jobs to list and in what
//! order, and when things fall due in a queue.

use crate::ids::StoreTime;
use crate::job::JobState;

/// Which jobs to list, and in what order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<JobState>,
    /// At most this many (after sorting); `None` for all.
    pub limit: Option<usize>,
    /// The order.
    pub order: JobOrder,
}

/// The order of a job listing.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum JobOrder {
    /// Oldest first (by id).
    #[default]
    Oldest,
    /// Newest first.
    Newest,
    /// In claim order: lowest priority number, then earliest run-at.
    Priority,
    /// Most recently changed first.
    Updated,
}

/// When things fall due in one queue: for operators' views.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueTiming {
    /// The earliest run-at of a waiting job: in the past, how long the oldest has waited.
    pub earliest_run_at: Option<StoreTime>,
    /// The earliest lease expiry: in the past, the most overdue lease.
    pub earliest_expiry: Option<StoreTime>,
    /// The earliest lease expiry that has not passed: the nearest one.
    pub next_expiry: Option<StoreTime>,
}
