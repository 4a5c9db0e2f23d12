//! An attempt after its grant: renewed, ended by its holder, or taken back.

use super::*;
use crate::ids::StoreTime;
use crate::input;
use crate::job::{JobRecord, Outcome, ReclaimPath};
use crate::queue::QueueRecord;
use crate::report::Reclaim;
use crate::retry::RetryPolicy;
use crate::state::JobState;
use crate::stats::Counters;

// ----- renewals -----

/// What a renewal made of a held lease.
pub(crate) enum Renewed {
    /// Renewed: the lease runs its length from now (never shortened).
    Lease(LeaseRenewed),
    /// A cancel was requested: the attempt ends here, cancelled.
    Cancelled(Change),
    /// No progress for the lease's stall timeout: the attempt ends here, stalled.
    Stalled(Change),
    /// The attempt's deadline has come: it ends here, timed out.
    TimedOut(Change),
}

/// Renews the lease of the held `job` at `now`, recording `progress`. A cancel requested
/// meanwhile comes first, then a stall (progress unchanged for the stall timeout), then the
/// attempt's hard time limit; else the lease runs its length from now, up to the deadline.
/// `retry` gives the job's backoff ([`backoff_policy`]), asked for only by an end that
/// waits one out.
pub(crate) fn renew<E>(
    job: &JobRecord,
    progress: u64,
    now: StoreTime,
    retry: impl FnOnce() -> Result<RetryPolicy, E>,
) -> Result<Renewed, E> {
    if job.cancel_requested {
        return Ok(Renewed::Cancelled(end(
            job,
            Outcome::Cancelled,
            Next::Cancelled,
            now,
        )));
    }
    let stalled = job
        .lease
        .as_ref()
        .and_then(|l| l.stall_timeout)
        .is_some_and(|limit| {
            progress == job.progress && now.saturating_since(job.progress_at) >= limit
        });
    if stalled {
        let next = after_failure(job, now, Some(&retry()?));
        let mut change = end(job, Outcome::Stalled, next, now);
        change.counts.stalled = 1;
        return Ok(Renewed::Stalled(change));
    }
    if past_deadline(job.lease.as_ref(), now) {
        return Ok(Renewed::TimedOut(time_out(job, None, now, &retry()?)));
    }
    let expires_at = job.lease.as_ref().map(|lease| {
        let renewed = capped(now.saturating_add(lease.length), lease.deadline);
        lease.expires_at.max(renewed)
    });
    let progress_at = match progress == job.progress {
        true => job.progress_at,
        false => now,
    };
    Ok(Renewed::Lease(LeaseRenewed {
        expires_at,
        progress,
        progress_at,
        updated_at: now,
    }))
}

/// What a renewal changes of its job, and nothing more: a pool renews hundreds of leases in
/// one commit, and each was a copy of its whole job (its strings too) made to change four
/// fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseRenewed {
    /// The lease's new expiry (`None` only for a job that holds no lease, which the fence
    /// never lets through).
    pub expires_at: Option<StoreTime>,
    pub progress: u64,
    pub progress_at: StoreTime,
    pub updated_at: StoreTime,
}

impl LeaseRenewed {
    /// `job` renewed.
    pub(crate) fn applied(self, mut job: JobRecord) -> JobRecord {
        if let (Some(lease), Some(expires_at)) = (job.lease.as_mut(), self.expires_at) {
            lease.expires_at = expires_at;
        }
        job.progress = self.progress;
        job.progress_at = self.progress_at;
        job.updated_at = self.updated_at;
        job
    }
}

// ----- the end of an attempt -----

/// Where an ended attempt sends its job.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Succeeded,
    Queued(StoreTime),
    RetryWait(StoreTime),
    Dead,
    Cancelled,
}

/// Whether an attempt that ended so spends the job's retry budget: a failure, a lease taken
/// back, a stall. A success, a release and a cancel do not.
pub(crate) fn spends_budget(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Failed(_)
            | Outcome::FailedPermanently(_)
            | Outcome::LeaseExpired { .. }
            | Outcome::Stalled
            | Outcome::TimedOut { .. }
    )
}

/// Where a failed (or expired, or stalled) attempt sends its job at `now`: one more failure
/// against its budget, and a backoff (by `backoff`, the job's policy) only for failures the
/// holder reported (an expired lease has already waited out the lease, and the holder most
/// likely died rather than the job). A cancel requested meanwhile wins.
pub(crate) fn after_failure(
    job: &JobRecord,
    now: StoreTime,
    backoff: Option<&RetryPolicy>,
) -> Next {
    let failures = job.failures.saturating_add(1);
    if job.cancel_requested {
        Next::Cancelled
    } else if failures >= job.max_attempts {
        Next::Dead
    } else if let Some(policy) = backoff {
        let seed = crate::retry::splitmix64(job.id.0 ^ (u64::from(job.attempt.0) << 40));
        Next::RetryWait(now.saturating_add(policy.backoff(failures, seed)))
    } else {
        Next::Queued(job.run_at)
    }
}

/// The backoff a failure of `job` waits by: its own policy, else its queue's (`queue`, its
/// record: read only for a job without one), else the store's.
pub(crate) fn backoff_policy(
    job: &JobRecord,
    queue: Option<&QueueRecord>,
    store: &RetryPolicy,
) -> RetryPolicy {
    (job.retry.as_ref())
        .or(queue.and_then(|q| q.retry.as_ref()))
        .unwrap_or(store)
        .clone()
}

/// Ends the current attempt of the running `job` at `now` with `outcome`, moving it to
/// `next`: the budget spent where the outcome spends it, the lease gone, a terminal state's
/// finish time, and the attempt's history record.
pub(crate) fn end(job: &JobRecord, outcome: Outcome, next: Next, now: StoreTime) -> Change {
    let mut new = job.clone();
    if spends_budget(&outcome) {
        new.failures = new.failures.saturating_add(1);
    }
    new.lease = None;
    new.updated_at = now;
    match next {
        Next::Succeeded => finish(&mut new, JobState::Succeeded, now),
        Next::Dead => finish(&mut new, JobState::Dead, now),
        Next::Cancelled => finish(&mut new, JobState::Cancelled, now),
        Next::Queued(run_at) => {
            new.state = JobState::Queued;
            new.run_at = run_at;
        }
        Next::RetryWait(run_at) => {
            new.state = JobState::RetryWait;
            new.run_at = run_at;
        }
    }
    let ended = job.current_run().map(|mut run| {
        run.ended_at = Some(now);
        run.outcome = Some(outcome);
        run
    });
    Change {
        job: new,
        ended,
        counts: Counters::default(),
    }
}

pub(super) fn finish(job: &mut JobRecord, state: JobState, now: StoreTime) {
    job.state = state;
    job.finished_at = Some(now);
    job.updated_at = now;
}

/// Takes the holder's last progress (carried by its end) into the record: a short job ends
/// before any heartbeat carried its progress, and its history would always show 0.
pub(super) fn with_final_progress(
    job: &JobRecord,
    progress: Option<u64>,
    now: StoreTime,
) -> JobRecord {
    let mut job = job.clone();
    if let Some(p) = progress
        && p != job.progress
    {
        job.progress = p;
        job.progress_at = now;
    }
    job
}

/// The holder completed the attempt: the job succeeded.
pub(crate) fn complete(job: &JobRecord, progress: Option<u64>, now: StoreTime) -> Change {
    let job = with_final_progress(job, progress, now);
    end(&job, Outcome::Succeeded, Next::Succeeded, now)
}

/// Whether a failure may be retried.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// After a backoff, while the job's budget lasts (most failures: a timeout, a refused
    /// connection, a bug the next build fixes).
    WhileBudgetLasts,
    /// Never: running the job again would meet the same failure (a payload that does not
    /// decode, an output over the size limit, the handler's own word).
    Never,
    /// After this wait instead of the store's backoff, while the budget lasts: the handler
    /// knows when trying again can help (a rate limit's reset, a remote's `Retry-After`).
    After(std::time::Duration),
}

/// The holder failed the attempt with `error`: retried after a backoff (the store's, or the
/// wait the holder gave) while the budget lasts, else dead; dead at once if the failure is one no retry mends (a cancel requested
/// meanwhile still wins). Either way one failure is counted. The message is stored as
/// [`input::error_message`] cleans it.
pub(crate) fn fail(
    job: &JobRecord,
    error: &str,
    retry: Retry,
    progress: Option<u64>,
    now: StoreTime,
    policy: &RetryPolicy,
) -> Change {
    let mut job = with_final_progress(job, progress, now);
    job.last_error = Some(input::error_message(error));
    let next = match retry {
        Retry::WhileBudgetLasts => after_failure(&job, now, Some(policy)),
        Retry::After(wait) => match after_failure(&job, now, Some(policy)) {
            Next::RetryWait(_) => Next::RetryWait(now.saturating_add(wait)),
            dead_or_cancelled => dead_or_cancelled,
        },
        Retry::Never => match job.cancel_requested {
            true => Next::Cancelled,
            false => Next::Dead,
        },
    };
    end(&job, failure_outcome(error, retry), next, now)
}

/// What a failure with `error` records in the history: the message as
/// [`input::error_message`] cleans it, permanent where no retry mends it.
pub(crate) fn failure_outcome(error: &str, retry: Retry) -> Outcome {
    let message = input::error_message(error);
    match retry {
        Retry::WhileBudgetLasts | Retry::After(_) => Outcome::Failed(message),
        Retry::Never => Outcome::FailedPermanently(message),
    }
}

/// What a time-out of an attempt claimed at `claimed_at` records: the limit it ran into.
pub(crate) fn time_out_outcome(claimed_at: StoreTime, deadline: Option<StoreTime>) -> Outcome {
    let limit = deadline.map(|d| d.saturating_since(claimed_at));
    Outcome::TimedOut {
        limit: limit.unwrap_or_default(),
    }
}

/// The attempt ran into its hard time limit at `now` (its holder says so, or a renewal found
/// the deadline passed): `TimedOut`, one failure against the budget, retried after a
/// backoff while it lasts, counted.
pub(crate) fn time_out(
    job: &JobRecord,
    progress: Option<u64>,
    now: StoreTime,
    policy: &RetryPolicy,
) -> Change {
    let mut job = with_final_progress(job, progress, now);
    let outcome = match &job.lease {
        Some(l) => time_out_outcome(l.claimed_at, l.deadline),
        None => time_out_outcome(now, None),
    };
    job.last_error = Some(outcome.to_string());
    let next = after_failure(&job, now, Some(policy));
    let mut change = end(&job, outcome, next, now);
    change.counts.timed_out = 1;
    change
}

/// The holder put the job off by `delay` ("not yet"): the attempt ends as `Snoozed`, no
/// budget spent, and the job waits until `delay` from now (cancelled instead, if a cancel was
/// requested meanwhile). Counted.
pub(crate) fn snooze(
    job: &JobRecord,
    delay: std::time::Duration,
    progress: Option<u64>,
    now: StoreTime,
) -> Change {
    let job = with_final_progress(job, progress, now);
    let next = match job.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(now.saturating_add(delay)),
    };
    let mut change = end(&job, Outcome::Snoozed { delay }, next, now);
    change.counts.snoozed = 1;
    change
}

/// The holder gave the job back on purpose: claimable at once in its old place, no budget
/// spent (cancelled instead, if a cancel was requested meanwhile).
pub(crate) fn release(job: &JobRecord, progress: Option<u64>, now: StoreTime) -> Change {
    let job = with_final_progress(job, progress, now);
    let next = match job.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(job.run_at),
    };
    let mut change = end(&job, Outcome::Released, next, now);
    change.counts.released = 1;
    change
}

/// Whether the holder of a lease taken back on `path` is known to be dead (its process
/// ended), rather than silent.
fn dead_holder(path: ReclaimPath) -> bool {
    matches!(path, ReclaimPath::Recovery | ReclaimPath::ProcessDied)
}

/// How far a holder's process got with an attempt before it died, as its table says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Not known: the holder kept no log (or it is alive, for all anyone knows).
    Unknown,
    /// Held ahead of the workers: no handler started it.
    NotStarted,
    /// In its handler when the process died: it may be what killed it.
    InHandler,
    /// Its handler returned and no code of the application's ran for it since; its result
    /// was not committed.
    Returned,
}

/// Takes back the lease of a dead holder's job that was not in a handler when the process
/// died (see [`Stage`]): claimable at once in its old place, no budget spent, as a release
/// is (cancelled instead, if a cancel was requested meanwhile).
fn spared(job: &JobRecord, path: ReclaimPath, stage: Stage, now: StoreTime) -> Change {
    let next = match job.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(job.run_at),
    };
    let outcome = match stage {
        Stage::Returned => Outcome::ResultLost { path },
        _ => Outcome::NeverStarted { path },
    };
    end(job, outcome, next, now)
}

/// Takes back the lease of the running `job` at `now` on `path`: records `LeaseExpired`
/// (how long after its expiry), or `TimedOut` past the attempt's deadline, spends the
/// budget, and counts the reclaim by its path. The
/// detection delay (lease length plus overdue) is recorded for the paths that detect a
/// silent holder (the reaper, a takeover); a death the kernel reported or a recovery at open
/// says nothing about it. A lease whose holder is known dead (`Recovery`, `ProcessDied`) and
/// whose attempt was not in its handler then (`stage`) goes back as
/// [`Outcome::NeverStarted`] or [`Outcome::ResultLost`] instead, no budget spent; one that
/// was in its handler spends budget and waits out a backoff. `None` for a record that is
/// not running under a lease.
pub(crate) fn expire<E>(
    job: &JobRecord,
    path: ReclaimPath,
    stage: Stage,
    now: StoreTime,
    retry: impl FnOnce() -> Result<RetryPolicy, E>,
) -> Result<Option<(Change, Reclaim)>, E> {
    let Some(lease) = job
        .lease
        .as_ref()
        .filter(|_| job.state == JobState::Running)
    else {
        return Ok(None);
    };
    let overdue = now.saturating_since(lease.expires_at);
    let detection_delay = lease.length + overdue;
    let mut change = match past_deadline(Some(lease), now) {
        // Only a holder known dead says what was not in a handler when it died.
        _ if matches!(stage, Stage::NotStarted | Stage::Returned) && dead_holder(path) => {
            spared(job, path, stage, now)
        }
        // Past its deadline the attempt ran into its hard time limit, whoever finds it: it
        // ends timed out (retried after a backoff), not as a silent holder's.
        true => time_out(job, None, now, &retry()?),
        false => {
            // One that was in its handler when its process died may be what killed it: it
            // waits out a backoff as a reported failure does, so that a process that
            // crash-loops on it runs (and commits) the others first. Any other expired lease
            // has waited out its lease already, and its holder most likely died, not the job.
            let suspect = stage == Stage::InHandler && dead_holder(path);
            let backoff = if suspect { Some(retry()?) } else { None };
            let next = after_failure(job, now, backoff.as_ref());
            end(job, Outcome::LeaseExpired { path, overdue }, next, now)
        }
    };
    let counts = &mut change.counts;
    match path {
        ReclaimPath::Reaper => counts.reclaimed_by_reaper = 1,
        ReclaimPath::Takeover => counts.reclaimed_by_takeover = 1,
        ReclaimPath::Recovery => counts.reclaimed_at_open = 1,
        ReclaimPath::ProcessDied => counts.reclaimed_process_died = 1,
    }
    if matches!(path, ReclaimPath::Reaper | ReclaimPath::Takeover) {
        counts.worst_detection_delay = detection_delay;
    }
    let reclaim = Reclaim {
        job: job.id,
        attempt: job.attempt,
        worker: lease.owner.clone(),
        expired_at: lease.expires_at,
        reclaimed_at: now,
        overdue,
        detection_delay,
        path,
        job_state: change.job.state,
    };
    Ok(Some((change, reclaim)))
}
