//! The fence: which writes of an attempt's holder hold, and how a refusal is counted.

use crate::error::LeaseLost;
use crate::ids::StoreTime;
use crate::job::{JobRecord, LeaseRecord, Outcome};
use crate::lease::Holding;
use crate::state::JobState;
use crate::stats::Counters;

/// Which kind of fenced write asks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// A renewal: refused, it counts as a lost lease unless its holder had ended the attempt.
    Heartbeat,
    /// An end of the attempt (complete, fail, snooze, release): refused, it counts as a
    /// fenced write. After the attempt's deadline it is refused too ([`before_deadline`]).
    End,
    /// The holder ends the attempt as timed out: the one end its deadline allows.
    TimeOut,
}

/// The fence's verdict on a write by the holder of a lease (`by`: the job, the attempt and
/// the lease's token), given the record found (`None`: no such job), which it hands back
/// when the write holds: the job must be `Running` under that attempt, granted by that
/// lease. The token tells this lease from another granted for the same attempt number by
/// a store that lost its last commits (see [`crate::LeaseToken`]). `ended_by_holder` is
/// asked only when the job is at that attempt under that lease but no longer running:
/// whether its history says its holder completed, failed or released it (a heartbeat tick
/// overlapping the holder's own end lost nothing).
///
/// `Ok` when the write holds; else the refusal to return, and what the counters gain.
pub(crate) fn fence<E>(
    found: Option<JobRecord>,
    by: Holding,
    write: Write,
    ended_by_holder: impl FnOnce() -> Result<bool, E>,
) -> Result<Result<JobRecord, Refused>, E> {
    let same_lease = |job: &JobRecord| job.attempt == by.attempt && job.token == by.token;
    let found = match found {
        Some(job) if job.state == JobState::Running && same_lease(&job) => {
            return Ok(Ok(job));
        }
        found => found,
    };
    let ended_by_holder = match &found {
        // Only its holder's completion makes a job succeed (an engine may keep no history
        // row of that attempt: the PostgreSQL one keeps it in the job's row).
        Some(job) if same_lease(job) && job.state == JobState::Succeeded => true,
        Some(job) if same_lease(job) => ended_by_holder()?,
        _ => false,
    };
    let mut counts = Counters::default();
    match write {
        Write::Heartbeat if ended_by_holder => {}
        Write::Heartbeat => counts.leases_lost = 1,
        Write::End | Write::TimeOut => counts.fenced_writes_rejected = 1,
    }
    let lost = LeaseLost {
        job: by.job,
        attempt: by.attempt,
        found: found.map(|j| (j.attempt, j.state)),
        ended_by_holder,
    };
    Ok(Err(Refused { lost, counts }))
}

/// The deadline's part of the fence, asked of a write the fence let through: an end its
/// holder writes at or after the attempt's deadline (the claim time plus its hard time limit)
/// is refused, found still running. The attempt ran into its limit, and ends as timed out
/// whoever meets it first: its holder's time-out ([`Write::TimeOut`]), a renewal, the reaper
/// or a claim's takeover ([`expire`]); never as its holder says, so a result that came late
/// is never committed.
pub(crate) fn before_deadline(
    job: JobRecord,
    write: Write,
    now: StoreTime,
) -> Result<JobRecord, Refused> {
    if write != Write::End || !past_deadline(job.lease.as_ref(), now) {
        return Ok(job);
    }
    Err(Refused {
        lost: LeaseLost {
            job: job.id,
            attempt: job.attempt,
            found: Some((job.attempt, job.state)),
            ended_by_holder: false,
        },
        counts: Counters {
            fenced_writes_rejected: 1,
            ..Counters::default()
        },
    })
}

/// Whether an attempt under `lease` has run into its hard time limit at `now`.
pub(super) fn past_deadline(lease: Option<&LeaseRecord>, now: StoreTime) -> bool {
    lease
        .and_then(|l| l.deadline)
        .is_some_and(|deadline| deadline <= now)
}

/// A write the fence refused: the answer, and what the counters gain (the refusal is
/// counted even though the write changes nothing else).
#[derive(Debug)]
pub(crate) struct Refused {
    pub lost: LeaseLost,
    pub counts: Counters,
}

/// Whether an ended attempt's outcome was its holder's own doing (so a renewal that comes
/// after it lost nothing).
pub(crate) fn ended_by_its_holder(outcome: Option<&Outcome>) -> bool {
    matches!(
        outcome,
        Some(
            Outcome::Succeeded
                | Outcome::Failed(_)
                | Outcome::FailedPermanently(_)
                | Outcome::Released
                | Outcome::Snoozed { .. }
        )
    )
}
