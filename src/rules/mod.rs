//! The rule book: every decision of the lease protocol, once, as a pure function of a job's
//! record, the input and the store time it acts at.
//!
//! Nothing here touches redb or SQL. The protocol ([`crate::protocol`], written once over
//! every engine's records) loads (and locks) a record, asks a rule what becomes of it, and
//! has the engine store the answer: the new record, the history record of an attempt that
//! ended, and the counters that move. PostgreSQL's single-statement shortcuts (a claim of
//! many, renewals of many, completions of many: `src/postgres/fast.rs`) compute the same
//! answers in SQL, and the shared test suites hold them to it.
//!
//! The rules:
//! * **New job** ([`new_job`]): checked inputs, `Queued`, due after its delay.
//! * **Fence** ([`fence`]): a write holds only for a job `Running` under the caller's
//!   attempt; a refusal moves one counter (a renewal after the holder's own end moves none).
//! * **The orders** ([`claim_order`], [`key_order`]): waiting jobs by priority, run time,
//!   id; a key's jobs by run time, id.
//! * **Takeover** ([`takes_over`]): an expired lease is taken over before the most urgent
//!   ready job only when it is at least as urgent.
//! * **Grant** ([`grant`]): a new attempt under a lease; a job whose attempt counter is
//!   exhausted is dead instead, never leased with a fence equal to the last; a job past its
//!   expiry ([`expired`]) is expired instead, never started.
//! * **Renewal** ([`renew`]): a cancel requested ends the attempt, then a stall does, else the
//!   lease runs its length from now.
//! * **End of an attempt** ([`end`]): which outcomes spend the budget, the next state, the
//!   finish time, the history record. [`complete`], [`fail`], [`release`] and [`expire`]
//!   choose the outcome and the next state ([`after_failure`]); a failure no retry mends
//!   ([`Retry::Never`]) is dead at once.
//! * **Cancel** ([`cancel`]) and **retry** ([`retry`]): an operator's decisions.
//! * **Jobs that wait for jobs** ([`waiting`], [`dependency_ended`], [`rearmed`]) and
//!   **groups** ([`member_ended`], [`sealed`]): a waiter is released, or cancelled, by the
//!   end it waited for, each end seen once.
//! * **Limits per key** ([`key_has_room`], [`key_head`]): a key's running jobs are counted,
//!   and only its head (the first of its waiting jobs to fall due) stands in the claim order
//!   while it has room.

mod attempt;
mod claims;
mod fence;
mod flow;
mod jobs;
mod keys;
mod order;
mod queues;
mod schedules;
#[cfg(test)]
mod tests;

pub(crate) use attempt::*;
pub(crate) use claims::*;
pub(crate) use fence::*;
pub(crate) use flow::*;
pub(crate) use jobs::*;
pub(crate) use keys::*;
pub(crate) use order::*;
pub(crate) use queues::*;
pub(crate) use schedules::*;

use crate::error::Error;
use crate::job::{JobRecord, RunRecord};
use crate::stats::Counters;

/// Why a job whose attempt counter ran out is dead.
pub(crate) const ATTEMPTS_EXHAUSTED: &str =
    "dead: its attempt counter is exhausted, so no new lease could be fenced apart from the last";

/// What a rule decided about one job: the record to store, the attempt that ended (its
/// history record) if one did, and what the counters gain.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    /// The job's record as it is to be stored.
    pub job: JobRecord,
    /// The record of the attempt that ended here, for history.
    pub ended: Option<RunRecord>,
    /// What the lifetime counters gain.
    pub counts: Counters,
}

/// The error for a running job found without its lease.
pub(crate) fn corrupt_running(job: &JobRecord) -> Error {
    Error::Corrupt(format!("job {} is running without a lease", job.id))
}
