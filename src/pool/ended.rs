//! Telling the application how an attempt ended, once that end is committed.
//!
//! A handler returns its output and goes on; with completions committed in batches by
//! another thread, the handler itself never learns when (or whether) its job's end reached
//! the store. An application that must answer someone only after the result is durable (an
//! HTTP caller waiting on a job, a test counting what was acknowledged) hangs a hook on the
//! pool instead: [`PoolBuilder::on_ended`](super::PoolBuilder::on_ended) is called after each
//! end this pool wrote has committed, never before, and never for a write the fence refused.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::ids::{Attempt, JobId};
use crate::job::Outcome;
use crate::lease::Lease;
use crate::state::JobState;

/// An attempt of this pool's that ended in the store through the pool's own write.
///
/// Ends the store decided on its own (a cancel or a stall found by a renewal, a lease taken
/// over) are not reported: the pool wrote nothing, and another holder may be at work.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptEnded {
    /// The job.
    pub job: JobId,
    /// The attempt that ended.
    pub attempt: Attempt,
    /// What the store recorded in the job's run history for the attempt.
    pub outcome: Outcome,
    /// The job's state after the commit (`Succeeded`; `Queued` to run again, after a backoff
    /// or a snooze; `Dead` when its budget is spent or no retry mends it; `Cancelled`).
    pub state: JobState,
}

pub(crate) type Hook = Arc<dyn Fn(&AttemptEnded) + Send + Sync>;

/// Calls the hook, if there is one, for `lease`'s attempt. The hook is the application's
/// code: its panic is logged, not allowed to take a worker or the dispatcher with it.
pub(crate) fn tell(hook: Option<&Hook>, lease: &Lease, outcome: Outcome, state: JobState) {
    let Some(hook) = hook else { return };
    let ended = AttemptEnded {
        job: lease.job,
        attempt: lease.attempt,
        outcome,
        state,
    };
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| hook(&ended))) {
        tracing::error!(job = %lease.job, panic = %crate::error::panic_message(&*panic), "the pool's on_ended hook panicked");
    }
}
