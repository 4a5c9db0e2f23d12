//! An attempt's life after its claim: renewed while its holder is alive, ended by its holder
//! (complete, fail, time out, snooze, release) under the fence, or taken back when its lease
//! ran out ([`expire`]). Every end goes through [`store_end`].

use std::time::Duration;

use super::Records;
use crate::error::{Error, Result};
use crate::ids::{Attempt, JobId};
use crate::input;
use crate::job::{JobRecord, Outcome, ReclaimPath};
use crate::lease::{Holding, Renewal};
use crate::report::Reclaim;
use crate::retry::RetryPolicy;
use crate::rules::{self, Change, Renewed, Retry, Stage, Write, corrupt_running};
use crate::state::JobState;

/// Renews the lease by its length from now (up to the attempt's deadline) if the caller
/// still holds it, storing progress. A cancel requested meanwhile ends the attempt here and
/// tells the holder; so do a stall (progress unchanged for the lease's stall timeout) and the
/// attempt's deadline.
pub(crate) fn heartbeat(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    progress: u64,
) -> Result<Renewal> {
    let job = fence(r, by, Write::Heartbeat)?;
    let now = r.now()?;
    let (change, answer) = match rules::renew(&job, progress, now, || backoff(r, &job))? {
        Renewed::Cancelled(change) => (change, Renewal::Cancelled),
        Renewed::Stalled(change) => (change, Renewal::Stalled),
        Renewed::TimedOut(change) => (change, Renewal::TimedOut),
        Renewed::Lease(renewed) => {
            let Some(expires_at) = renewed.expires_at else {
                return Err(corrupt_running(&job));
            };
            r.renew(&renewed.applied(job))?;
            return Ok(Renewal::Renewed { expires_at });
        }
    };
    store_end(r, &job, change)?;
    Ok(answer)
}

/// Keeps `data` as the checkpoint of the attempt `by` holds, for the job's next attempts to
/// resume from: under the fence of an attempt's end (refused once the lease is lost or the
/// attempt's deadline passed, and counted as a fenced write), and no larger than a payload.
pub(crate) fn save_checkpoint(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    data: &[u8],
) -> Result<()> {
    input::check_size("checkpoint", data.len(), r.policy().max_payload)?;
    fence(r, by, Write::End)?;
    let checkpoint = crate::checkpoint::CheckpointRecord {
        attempt: by.attempt,
        saved_at: r.now()?,
        data: data.to_vec(),
    };
    r.save_checkpoint(by.job, &checkpoint)
}

/// Appends `lines` to the log of the attempt `by` holds (or held: a holder whose lease was
/// lost still writes only its own attempt's lines). Nothing is written for a job that is
/// gone (purged meanwhile): its lines go with it. A log record that cannot be read (damaged)
/// is started afresh rather than fail the transaction: the lines ride with renewals, and a
/// log is never worth a lease.
pub(crate) fn append_log(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    lines: &crate::job_log::LogRecord,
) -> Result<()> {
    if r.job(by.job)?.is_none() || (lines.lines.is_empty() && lines.dropped == 0) {
        return Ok(());
    }
    let mut log = match r.attempt_log(by.job, by.attempt) {
        Ok(found) => found.unwrap_or_default(),
        Err(Error::Corrupt(why)) => {
            tracing::warn!(job = %by.job, attempt = %by.attempt, "a log record cannot be read; it starts again: {why}");
            crate::job_log::LogRecord::default()
        }
        Err(e) => return Err(e),
    };
    log.merge(lines);
    r.save_attempt_log(by.job, by.attempt, &log)
}

/// [`append_log`] for each of `logs`, of attempts that just completed (so their jobs exist),
/// in two steps whatever their number: read, then write.
pub(crate) fn append_logs(
    r: &mut (impl Records + ?Sized),
    logs: &[(Holding, &crate::job_log::LogRecord)],
) -> Result<()> {
    if logs.is_empty() {
        return Ok(());
    }
    let of: Vec<_> = logs.iter().map(|(by, _)| (by.job, by.attempt)).collect();
    let kept = r.attempt_logs(&of)?;
    let merged: Vec<_> = (logs.iter().zip(kept))
        .map(|((by, lines), kept)| {
            let mut log = kept.unwrap_or_default();
            log.merge(lines);
            (by.job, by.attempt, log)
        })
        .collect();
    r.save_attempt_logs(&merged)
}

/// [`heartbeat`] for each of `leases` (the lease's holding, progress): an answer each, in
/// their order, or the error that failed them all (a refusal answers its own lease). Those
/// the engine renews in one step ([`Records::renew_fenced`]) first, the rest one by one in
/// job order, so that an index is walked once from left to right rather than at random (a
/// pool's leases come in no order).
pub(crate) fn renew_batch(
    r: &mut (impl Records + ?Sized),
    leases: &[(Holding, u64)],
) -> Result<Vec<Result<Renewal>>> {
    let renewed = r.renew_fenced(leases)?;
    // (sorted by the job's id alone, beside its place: no lookup into `leases` per compare)
    let mut order: Vec<(JobId, usize)> = (leases.iter().enumerate())
        .map(|(i, (by, _))| (by.job, i))
        .collect();
    order.sort_unstable();
    let mut answers: Vec<Option<Result<Renewal>>> = (0..leases.len()).map(|_| None).collect();
    for (_, i) in order {
        let (by, progress) = leases[i];
        let answer = match renewed.get(&by) {
            Some(&expires_at) => Ok(Renewal::Renewed { expires_at }),
            None => heartbeat(r, by, progress),
        };
        match answer {
            Err(e) if !e.is_lease_lost() => return Err(e),
            answer => answers[i] = Some(answer),
        }
    }
    // (every place was answered)
    Ok(answers.into_iter().flatten().collect())
}

/// Completes the attempt: the job succeeded and `output` is kept. `progress`, if given, is
/// the holder's last progress, recorded with the attempt.
pub(crate) fn complete(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    output: &[u8],
    progress: Option<u64>,
) -> Result<()> {
    input::check_size("output", output.len(), r.policy().max_payload)?;
    if !complete_many(r, &[(by, output, progress)])?.is_empty() {
        return Ok(());
    }
    complete_by_steps(r, by, output, progress)
}

/// [`complete`] by the protocol's own steps, the fence first: for a completion the engine's
/// one step ([`Records::complete_fenced`]) already passed over, whose refusal the fence
/// says (its output within the size limit).
pub(crate) fn complete_by_steps(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    output: &[u8],
    progress: Option<u64>,
) -> Result<()> {
    let job = fence(r, by, Write::End)?;
    let now = r.now()?;
    store_end(r, &job, rules::complete(&job, progress, now))?;
    if !output.is_empty() {
        r.keep_output(by.job, output)?;
    }
    Ok(())
}

/// Completes each attempt of `done` (holding, output, progress) that the engine completes
/// in one step ([`Records::complete_fenced`]: those whose fence holds), then does for each
/// what [`store_end`] does after an end's write: its key counts the end, what waits for it
/// is released, its subscribers hear it. Returns those it completed: the caller completes
/// the others by [`complete`], which says why each is refused.
pub(crate) fn complete_many(
    r: &mut (impl Records + ?Sized),
    done: &[(Holding, &[u8], Option<u64>)],
) -> Result<std::collections::HashSet<Holding>> {
    let stored = r.complete_fenced(done)?;
    let mut awaited = Vec::new();
    for c in &stored {
        if let Some(key) = &c.key {
            super::keys::ended(r, &c.queue, key)?;
        }
        if c.awaited {
            awaited.push((c.by.job, JobState::Succeeded, c.group));
        }
    }
    if !awaited.is_empty() {
        super::flow::settle_all(r, &awaited)?;
    }
    for c in &stored {
        super::tell(r, || crate::events::Event::Ended {
            job: c.by.job,
            attempt: c.by.attempt,
            queue: c.queue.clone(),
            outcome: Outcome::Succeeded,
            state: JobState::Succeeded,
        });
    }
    Ok(stored.into_iter().map(|c| c.by).collect())
}

/// How its holder ends an attempt. (Public only in name, as [`Records`] is.)
#[derive(Clone, Debug)]
#[allow(private_interfaces)]
pub enum End {
    /// Completed, with this output.
    Complete(Vec<u8>),
    /// Failed with this error: retried after a backoff while the budget lasts (or never),
    /// else dead.
    Fail(String, Retry),
    /// Given back on purpose: claimable at once, in its old place, no budget spent.
    Release,
    /// Put off by this long: the attempt ends, no budget spent ([`rules::snooze`]).
    Snooze(Duration),
    /// Ran into its hard time limit, as its holder found.
    TimeOut,
}

/// Ends the attempt as its holder says, under the fence, with its last progress if given;
/// the job's state after.
pub(crate) fn end(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    end: &End,
    progress: Option<u64>,
) -> Result<JobState> {
    let write = match end {
        End::Complete(output) => {
            complete(r, by, output, progress)?;
            return Ok(JobState::Succeeded);
        }
        End::TimeOut => Write::TimeOut,
        _ => Write::End,
    };
    let job = fence(r, by, write)?;
    let now = r.now()?;
    let change = match end {
        End::Fail(error, retry) => {
            rules::fail(&job, error, *retry, progress, now, &backoff(r, &job)?)
        }
        End::Snooze(delay) => rules::snooze(&job, *delay, progress, now),
        End::TimeOut => rules::time_out(&job, progress, now, &backoff(r, &job)?),
        End::Release | End::Complete(_) => rules::release(&job, progress, now),
    };
    store_end(r, &job, change).map(|j| j.state)
}

/// The backoff a failure of `job` waits by ([`rules::backoff_policy`]): its queue's record
/// is read only for a job without a policy of its own, and only by an end that waits one out.
fn backoff(r: &mut (impl Records + ?Sized), job: &JobRecord) -> Result<RetryPolicy> {
    let queue = match job.retry {
        Some(_) => None,
        None => r.queue(&job.queue, false)?,
    };
    Ok(rules::backoff_policy(
        job,
        queue.as_ref(),
        &r.policy().retry,
    ))
}

/// How far a dead holder's process got with each attempt it held, as it kept them:
/// unknown (charged as in its handler) unless an engine read the holder's table and it names
/// the attempt.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stages(
    pub Option<std::sync::Arc<std::collections::HashMap<(JobId, Attempt), Stage>>>,
);

impl Stages {
    /// How far `job`'s current attempt got.
    pub(crate) fn stage(&self, job: &JobRecord) -> Stage {
        match &self.0 {
            None => Stage::Unknown,
            Some(log) => (log.get(&(job.id, job.attempt)).copied()).unwrap_or(Stage::Unknown),
        }
    }
}

/// Takes back the lease of a running job ([`rules::expire`]): records its end and moves the
/// job on; returns its new record and the reclaim. `stages`: how far its holder's process
/// got with each attempt, where that process is known dead and kept a table.
pub(crate) fn expire(
    r: &mut (impl Records + ?Sized),
    job: &JobRecord,
    path: ReclaimPath,
    stages: &Stages,
) -> Result<(JobRecord, Reclaim)> {
    let now = r.now()?;
    let retry = || backoff(r, job);
    let Some((change, reclaim)) = rules::expire(job, path, stages.stage(job), now, retry)? else {
        return Err(corrupt_running(job));
    };
    let new = store_end(r, job, change)?;
    Ok((new, reclaim))
}

/// The fence ([`rules::fence`], then [`rules::before_deadline`]): the job must be `Running`
/// under exactly this attempt and lease, and an end its holder writes must come before the
/// attempt's deadline. A refusal changes nothing but its counter.
pub(crate) fn fence(
    r: &mut (impl Records + ?Sized),
    by: Holding,
    write: Write,
) -> Result<JobRecord> {
    let found = r.job(by.job)?;
    let verdict = rules::fence(found, by, write, || {
        Ok::<_, Error>(rules::ended_by_its_holder(
            r.run_outcome(by.job, by.attempt)?.as_ref(),
        ))
    })?;
    let verdict = match verdict {
        // (the time is read only for an attempt that has a deadline)
        Ok(job) if job.lease.as_ref().is_some_and(|l| l.deadline.is_some()) => {
            rules::before_deadline(job, write, r.now()?)
        }
        verdict => verdict,
    };
    match verdict {
        Ok(job) => Ok(job),
        Err(refused) => {
            r.count(&refused.counts)?;
            Err(refused.lost.into())
        }
    }
}

/// Stores the end of an attempt a rule decided: its run recorded, the job moved on (every
/// index in step), the counters, and what waits for the job released if it ended for good
/// ([`super::flow::settle`]). The only place an attempt ends.
pub(crate) fn store_end(
    r: &mut (impl Records + ?Sized),
    old: &JobRecord,
    change: Change,
) -> Result<JobRecord> {
    let Some(run) = &change.ended else {
        return Err(corrupt_running(old));
    };
    r.record_run(old, run)?;
    let job = super::keys::save(r, old, &change.job)?;
    r.count(&change.counts)?;
    super::flow::settle(r, &job)?;
    if let Some(outcome) = &run.outcome {
        super::tell(r, || crate::events::Event::Ended {
            job: old.id,
            attempt: old.attempt,
            queue: old.queue.clone(),
            outcome: outcome.clone(),
            state: job.state,
        });
    }
    Ok(job)
}
