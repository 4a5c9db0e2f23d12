//! What an operator asks of a store, whatever its engine: which jobs to list and in what
//! order, and when things fall due in a queue.

use std::time::Duration;

use crate::ids::{GroupId, JobId, StoreTime};
use crate::job::JobRecord;
use crate::state::JobState;

/// Which jobs to list (or act on in bulk), and in what order. Build it from
/// `JobFilter::default()` with the fields that matter.
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
    /// Only jobs that carry every one of these metadata pairs ([`crate::NewJob::metadata`]).
    pub metadata: Vec<(String, String)>,
    /// Only jobs whose record has not changed for at least this long of store time (a dead
    /// job: how long it has been dead; a waiting one: how long since it was enqueued or
    /// last failed).
    pub unchanged_for: Option<Duration>,
    /// Only jobs with a greater id: the cursor of a listing read page by page.
    pub after: Option<JobId>,
    /// Only the members of this group ([`crate::NewGroup`]): its callbacks, which wait for
    /// it, are not members ([`crate::Group::waiters`] names them).
    pub group: Option<GroupId>,
}

impl JobFilter {
    /// Checks the filter's queue and metadata as an enqueue checks a job's: for a caller
    /// that takes them from a person (a form, a command line) and would rather say what is
    /// wrong than list nothing. A store lists nothing for a filter no job can pass, and
    /// never refuses one.
    pub fn check(&self) -> Result<(), crate::error::InputError> {
        if let Some(queue) = &self.queue {
            crate::input::check_queue(queue)?;
        }
        crate::input::check_metadata(&self.metadata)
    }

    /// Whether any job could pass the filter: not if it names a queue or a metadata pair no
    /// job can have (a NUL byte, a key with `=`: an enqueue refuses them). Such a filter
    /// answers nothing on every engine, rather than match by accident where an engine
    /// stores pairs as `key=value` text, or fail where it cannot store a NUL.
    pub(crate) fn can_match(&self) -> bool {
        !self.queue.as_deref().is_some_and(|q| q.contains('\0'))
            && self
                .metadata
                .iter()
                .all(|(k, v)| crate::input::check_metadata_pair(k, v).is_ok())
    }

    /// Whether `job` passes the filter's conditions (not its order or limit) at `now`: the
    /// one reading of them, for an engine that filters records itself.
    pub(crate) fn admits(&self, job: &JobRecord, now: StoreTime) -> bool {
        self.queue.as_ref().is_none_or(|q| *q == job.queue)
            && self.state.is_none_or(|s| s == job.state)
            && self.after.is_none_or(|after| job.id > after)
            && self.group.is_none_or(|g| job.flow.group == Some(g))
            && self
                .unchanged_for
                .is_none_or(|d| now.saturating_since(job.updated_at) >= d)
            && self
                .metadata
                .iter()
                .all(|(k, v)| job.metadata.iter().any(|(jk, jv)| jk == k && jv == v))
    }

    /// `admitted` (the records that passed, in id order or, for [`JobOrder::Newest`], the
    /// reverse) in the filter's order and cut to its limit: the one reading of them.
    pub(crate) fn arrange(&self, mut admitted: Vec<JobRecord>) -> Vec<crate::job::Job> {
        match self.order {
            JobOrder::Oldest | JobOrder::Newest => {}
            JobOrder::Priority => admitted.sort_by_key(crate::rules::claim_order),
            JobOrder::Updated => admitted.sort_by_key(|j| std::cmp::Reverse((j.updated_at, j.id))),
        }
        admitted.truncate(self.limit.unwrap_or(usize::MAX));
        admitted.into_iter().map(crate::job::Job).collect()
    }
}

/// What a listing does with a job whose record it cannot read (damaged by hand or by a
/// fault): a record that is not a job's (`Error::Corrupt`) is left out, and said on
/// `tracing`, so that one bad record does not hide every other job from an operator
/// (`check` names it); any other error fails the listing.
pub(crate) fn unreadable(id: u64, e: crate::error::Error) -> crate::error::Result<()> {
    match e {
        crate::error::Error::Corrupt(why) => {
            tracing::warn!(
                job = id,
                "a job's record cannot be read; the listing leaves it out: {why}"
            );
            Ok(())
        }
        e => Err(e),
    }
}

/// The order of a job listing.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
