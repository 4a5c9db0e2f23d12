//! The lease protocol, written once: each operation is a function over one engine's write
//! transaction ([`Records`]). What becomes of a job is the rule book's ([`crate::rules`]);
//! these functions are the sequence around each rule (find the record, fence it, ask the
//! rule, store what it decided, count, wake), and the engines only load and save.
//!
//! The rules every function here keeps:
//! * A claim is one conditional update: a job is taken only if it is waiting and due, or
//!   running with an expired lease (takeover). Every claim increments `attempt`.
//! * A fenced write (heartbeat, complete, fail, release) first checks that the job is
//!   `Running` under the caller's attempt ([`rules::fence`]) and changes *nothing* if not:
//!   the caller gets [`crate::LeaseLost`] with what was found, and only a counter moves.
//! * An attempt ends in exactly one place ([`store_end`]), which records its run, so
//!   history has one record per ended attempt.
//!
//! Every sequence is here, for every engine. Where an engine can do for many rows in one
//! statement what a sequence does one row at a time (PostgreSQL's inserts, claims,
//! renewals and completions, `src/postgres/fast.rs`), the sequence asks it for that step
//! ([`Records::insert_plain`], [`Records::take_waiting`], [`Records::renew_fenced`],
//! [`Records::complete_fenced`]), and takes what the step leaves (a row it cannot decide
//! for, or all of them where an engine has no such step) one row at a time; what follows
//! (events, a key's count, the waiters an end releases) is the sequence's either way. The
//! shared suites hold every engine, and PostgreSQL with and without its steps, to the same
//! answers.
//!
//! | file | one idea |
//! |---|---|
//! | `records.rs` | what an engine implements: records loaded and saved in a transaction |
//! | `attempt.rs` | an attempt's life: granted, renewed, ended, expired |
//! | `claim.rs` | claims: the claim order, takeover, a queue's limits |
//! | `flow.rs` | jobs that wait for jobs: links made at enqueue, released by ends |
//! | `group.rs` | groups: opened with their callbacks, members enqueued, sealed, cancelled |
//! | `keys.rs` | limits per key: each change of a keyed job counts its key and moves its head |
//! | `operate.rs` | the rest: enqueue, cancel, retry, reclaims, queues' settings, schedules |
//! | `round.rs` | a pool's round: its completions, each its own unit, then its claim |

mod attempt;
mod claim;
mod flow;
mod group;
mod keys;
mod operate;
mod records;
mod round;

use std::time::Duration;

pub(crate) use crate::rules::Stage;
pub use attempt::End;
pub(crate) use attempt::{
    Stages, append_log, append_logs, complete, complete_by_steps, complete_many, end, expire,
    renew_batch, save_checkpoint,
};
pub(crate) use claim::{claim_batch, claim_job, round_claim};
pub(crate) use group::{
    cancel_group, enqueue_members, keyed_group, open_group, purge_groups, seal_group,
};
pub(crate) use operate::{
    cancel, declare_queue, declare_schedule, edit, enqueue, enqueue_batch, expire_waiting,
    fire_schedules, mark_served, pause_queue, pause_schedule, purge, purge_in_batches, reap_batch,
    remove_schedule, retry, set_queue_limits, set_queue_retry_policy,
};
#[cfg(feature = "postgres")]
pub(crate) use records::{ClaimLook, Completed, Taken};
pub(crate) use records::{HeldSchedule, Inserted, NamedRecords, Position, Records};
pub use round::{AnyWrites, Claim, Completion};
pub(crate) use round::{WritesPanicked, WritesResult, no_writes, round};

use crate::retry::RetryPolicy;

/// A store's policy, fixed at open, the same on every engine: what the rules need to know of
/// the store they run in.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The backoff of a failed attempt.
    pub retry: RetryPolicy,
    /// The attempts a job has unless it says otherwise.
    pub default_max_attempts: u32,
    /// The largest payload an enqueue takes.
    pub max_payload: usize,
    /// How many records one bounded batch (a reaper's, a purge's) looks at.
    pub reap_batch: usize,
    /// How long succeeded, cancelled and expired jobs are kept; `None`: until purged.
    pub retention: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            retry: RetryPolicy::default(),
            default_max_attempts: crate::config::DEFAULT_MAX_ATTEMPTS,
            max_payload: crate::config::DEFAULT_MAX_PAYLOAD,
            reap_batch: crate::config::DEFAULT_REAP_BATCH,
            retention: None,
        }
    }
}

impl Policy {
    /// Refuses a policy no store can run by: a backoff that is not one, a budget of no
    /// attempt, a batch of nothing (a loop over batches would never end).
    pub(crate) fn check(&self) -> Result<(), crate::error::ConfigError> {
        self.retry.validate()?;
        if self.default_max_attempts == 0 {
            return Err(crate::error::ConfigError::ZeroMaxAttempts);
        }
        if self.reap_batch == 0 {
            return Err(crate::error::ConfigError::ZeroBatch);
        }
        Ok(())
    }
}

/// Tells the store's subscribers `event` once the transaction commits, if anyone listens
/// (it is built only then).
pub(crate) fn tell(r: &mut (impl Records + ?Sized), event: impl FnOnce() -> crate::events::Event) {
    let events = r.events();
    if events.wanted() {
        events.push(event());
    }
}

/// Tells that `job` expired, if it did (a grant or the reaper ended it so).
fn expired(r: &mut (impl Records + ?Sized), job: &crate::job::JobRecord) {
    if job.state == crate::state::JobState::Expired {
        tell(r, || crate::events::Event::Expired {
            job: job.id,
            queue: job.queue.clone(),
        });
    }
}
