//! A job's life outside its attempts: a new job, the unique key it may hold, and an
//! operator's decisions (cancel, retry).

use super::*;
use crate::endings::{EndOf, EndRecord};
use crate::error::Error;
use crate::ids::{Attempt, JobId, StoreTime};
use crate::input;
use crate::job::{JobRecord, LimitKey, RunRecord, Uniqueness};
use crate::new_job::NewJob;
use crate::state::JobState;

// ----- its end, kept -----

/// The ending a job's write from `old` (`None`: a new job) to `new` implies, if it is one:
/// the job came to an end (terminal now, and not the same end as before: an operator's
/// retry and its next end are two) ([`crate::endings`]).
pub(crate) fn job_ending(old: Option<&JobRecord>, new: &JobRecord) -> Option<EndRecord> {
    let at = new.finished_at.filter(|_| new.state.is_terminal())?;
    let before = old.and_then(|o| o.finished_at.filter(|_| o.state.is_terminal()));
    (before != Some(at)).then(|| EndRecord {
        of: EndOf::Job {
            id: new.id,
            queue: new.queue.clone(),
        },
        state: new.state,
        at,
    })
}

// ----- a new job -----

/// The record of a new job `id` enqueued at `now`: its inputs checked (the same refusal on
/// both engines), due `wait` from now (its delay, or what is left until its wall-clock run
/// time, which the caller reads: a rule reads no clock), with the store's default budget
/// unless it has its own.
pub(crate) fn new_job(
    new: &NewJob,
    id: JobId,
    wait: std::time::Duration,
    default_max_attempts: u32,
    max_payload: usize,
    now: StoreTime,
) -> Result<JobRecord, Error> {
    input::check_new_job(new, max_payload)?;
    Ok(JobRecord {
        id,
        queue: new.queue.clone(),
        state: JobState::Queued,
        priority: new.priority,
        attempt: Attempt(0),
        failures: 0,
        max_attempts: new.max_attempts.unwrap_or(default_max_attempts),
        unique_key: new.unique_key.clone(),
        created_at: now,
        run_at: now.saturating_add(wait),
        lease: None,
        progress: 0,
        progress_at: now,
        cancel_requested: false,
        last_error: None,
        finished_at: None,
        updated_at: now,
        uniqueness: new.uniqueness,
        key_released: false,
        time_limit: new.time_limit,
        metadata: new.metadata.clone(),
        flow: Default::default(),
        retry: new.retry.clone(),
        // Parked until the protocol makes it its key's head (`protocol::keys`).
        limit: new
            .limit_key
            .clone()
            .map(|key| LimitKey { key, parked: true }),
        token: crate::ids::LeaseToken::NONE,
        expires_at: new.expiry().map(|span| now.saturating_add(span)),
    })
}

// ----- unique keys -----

/// Whether a new job is plain: its record is its inputs alone, so an engine may insert it
/// by a statement of its own ([`crate::protocol::Records::insert_plain`]). Not plain: a
/// unique key (its holder may be the answer), dependencies or a group (linked as it is
/// made), a limit key (its key counts it), a retry policy or an expiry of its own.
pub(crate) fn is_plain(new: &NewJob) -> bool {
    new.unique_key.is_none()
        && new.needs.is_empty()
        && new.group.is_none()
        && new.retry.is_none()
        && new.limit_key.is_none()
        && new.expires.is_none()
}

/// Whether `holder` (a job with the unique key an enqueue or a retry asks for) holds it at
/// `now`: while it waits or runs, and after it succeeded for its window ([`Uniqueness`]),
/// unless a newer job has already taken the key after the window.
pub(crate) fn holds_key(holder: &JobRecord, now: StoreTime) -> bool {
    if holder.unique_key.is_none() || holder.key_released {
        return false;
    }
    if !holder.state.is_terminal() {
        return true;
    }
    match (holder.state, holder.uniqueness, holder.finished_at) {
        (JobState::Succeeded, Uniqueness::UntilPurged, _) => true,
        (JobState::Succeeded, Uniqueness::AfterSuccess(window), Some(at)) => {
            now < at.saturating_add(window)
        }
        _ => false,
    }
}

/// Whether `job` keeps its unique key in the index: it may hold it (see [`holds_key`]; a
/// finished one's window is judged when the key is next asked for, since an index entry
/// cannot depend on the time).
pub(crate) fn keeps_key(job: &JobRecord) -> bool {
    job.unique_key.is_some()
        && !job.key_released
        && (!job.state.is_terminal()
            || (job.state == JobState::Succeeded && job.uniqueness != Uniqueness::WhileUnfinished))
}

/// A finished `holder` whose window has run out gives its key up to a newer job.
pub(crate) fn release_key(holder: &JobRecord, now: StoreTime) -> JobRecord {
    let mut released = holder.clone();
    released.key_released = true;
    released.updated_at = now;
    released
}

// ----- an operator's decisions -----

/// Cancels `job` at `now`: a waiting one at once; a running one is flagged, and its holder
/// learns of it at its next heartbeat (or its attempt's end). Returns the record to store
/// (`None`: nothing changes) and the state to answer with; a finished job is refused.
pub(crate) fn cancel(
    job: &JobRecord,
    now: StoreTime,
) -> Result<(Option<JobRecord>, JobState), Error> {
    match job.state {
        JobState::Queued | JobState::RetryWait | JobState::Blocked => {
            let mut new = job.clone();
            finish(&mut new, JobState::Cancelled, now);
            Ok((Some(new), JobState::Cancelled))
        }
        JobState::Running => {
            let mut new = job.clone();
            new.cancel_requested = true;
            new.updated_at = now;
            Ok((Some(new), JobState::Running))
        }
        JobState::Cancelled => Ok((None, JobState::Cancelled)),
        state @ (JobState::Succeeded | JobState::Dead | JobState::Expired) => Err(Error::Refused {
            job: job.id,
            state,
            action: "cancel",
        }),
    }
}

/// Puts a dead, cancelled or expired `job` back in its queue at `now` with a fresh budget
/// and no expiry (an operator's decision); its history is kept and its next claim is a new
/// attempt.
/// `key_holder` is the job the index names for its unique key, if another: while it holds
/// the key ([`holds_key`]) the retry is refused rather than make two jobs hold one key (the
/// key is what the application deduplicates by, and the holder already does the work it
/// names); a holder whose window ran out gives it up (the second record returned, to store).
pub(crate) fn retry(
    job: &JobRecord,
    key_holder: Option<&JobRecord>,
    now: StoreTime,
) -> Result<(JobRecord, Option<JobRecord>), Error> {
    if !matches!(
        job.state,
        JobState::Dead | JobState::Cancelled | JobState::Expired
    ) {
        return Err(Error::Refused {
            job: job.id,
            state: job.state,
            action: "retry (only dead, cancelled or expired jobs are retried)",
        });
    }
    let mut released = None;
    if let (Some(key), Some(holder)) = (&job.unique_key, key_holder)
        && holder.id != job.id
    {
        if holds_key(holder, now) {
            return Err(Error::UniqueKeyHeld {
                job: job.id,
                key: key.clone(),
                holder: holder.id,
            });
        }
        released = Some(release_key(holder, now));
    }
    let mut new = job.clone();
    new.state = JobState::Queued;
    new.failures = 0;
    new.cancel_requested = false;
    new.finished_at = None;
    new.key_released = false;
    // (an operator who retries an expired job wants it run: its expiry is behind it)
    new.expires_at = None;
    new.run_at = now;
    new.updated_at = now;
    Ok((new, released))
}

/// `job` as an operator's `edit` leaves it at `now` (`wait`: how long from now it is due, if
/// the edit moves it; `max_payload`: the store's limit). Only a waiting job is edited
/// (queued, backing off, or blocked); one claimed since the attempt the edit names is left
/// as it is ([`Error::EditConflict`]), so an edit never touches a job that ran meanwhile.
pub(crate) fn edit(
    job: &JobRecord,
    edit: &crate::edit::Edit,
    wait: Option<std::time::Duration>,
    max_payload: usize,
    now: StoreTime,
) -> Result<JobRecord, Error> {
    if let Some(expected) = edit.if_attempt
        && expected != job.attempt
    {
        return Err(Error::EditConflict {
            job: job.id,
            expected,
            found: job.attempt,
        });
    }
    if !(job.state.is_waiting() || job.state == JobState::Blocked) {
        return Err(Error::Refused {
            job: job.id,
            state: job.state,
            action: "edit (only a job that waits is edited)",
        });
    }
    if let Some(payload) = &edit.payload {
        input::check_size("payload", payload.len(), max_payload)?;
    }
    let mut new = job.clone();
    if let Some(priority) = edit.priority {
        new.priority = priority;
    }
    if let Some(wait) = wait {
        new.run_at = now.saturating_add(wait);
    }
    for (key, value) in &edit.metadata {
        let at = new.metadata.iter().position(|(k, _)| k == key);
        match (at, value) {
            (Some(i), Some(v)) => new.metadata[i].1 = v.clone(),
            (None, Some(v)) => new.metadata.push((key.clone(), v.clone())),
            (Some(i), None) => {
                new.metadata.remove(i);
            }
            (None, None) => {}
        }
    }
    input::check_metadata(&new.metadata)?;
    new.updated_at = now;
    Ok(new)
}

// ----- what every stored job must be -----

/// What is wrong with a stored `job` whose history holds `runs` (attempt number, record),
/// oldest first, added to `problems`: the integrity check's part that is the same on every
/// engine. A running job and only it holds a lease, indexed no later than it expires; the
/// history has one ended record per ended attempt, `1..=attempt` or `1..attempt` while the
/// job runs (a running attempt's record is written when it ends; a store written by an
/// earlier build may hold an open one, which is accepted).
pub(crate) fn check_job(job: &JobRecord, runs: &[(u32, RunRecord)], problems: &mut Vec<String>) {
    let (id, attempt, running) = (job.id, job.attempt.0, job.state == JobState::Running);
    if running != job.lease.is_some() {
        problems.push(format!(
            "job {id} is {} but lease is {:?}",
            job.state, job.lease
        ));
    }
    if let Some(l) = job
        .lease
        .as_ref()
        .filter(|l| l.indexed_expiry > l.expires_at)
    {
        problems.push(format!(
            "job {id}'s lease is indexed at {} after it expires at {}",
            l.indexed_expiry, l.expires_at
        ));
    }
    let numbers: Vec<u32> = runs.iter().map(|(a, _)| *a).collect();
    let legacy_open = running && numbers.last() == Some(&attempt);
    let ended = attempt - u32::from(running && !legacy_open && attempt > 0);
    // 1, 2, ..., ended, compared without building that list: a hostile record's attempt
    // may be in the billions.
    let consecutive =
        numbers.len() == ended as usize && numbers.iter().zip(1u32..).all(|(a, want)| *a == want);
    if !consecutive {
        let problem = format!("job {id} at attempt {attempt} has history for attempts {numbers:?}");
        return problems.push(problem);
    }
    for (a, run) in runs {
        if run.attempt.0 != *a {
            problems.push(format!(
                "job {id}: history key {a} holds attempt {}",
                run.attempt
            ));
        }
        if (running && *a == attempt) == run.outcome.is_some() {
            problems.push(format!(
                "job {id} attempt {a}: outcome {:?} while job is {}",
                run.outcome, job.state
            ));
        }
    }
}
