//! Everything but an attempt's own life: enqueueing (unique keys), an operator's cancel and
//! retry, the reaper's batches, a queue's settings and served mark, and schedules.

use super::attempt::{Stages, expire};
use super::claim::catch_up;
use super::{Inserted, Records, flow, keys};
use crate::batches::Batch;
use crate::error::{Error, Result};
use crate::ids::{JobId, StoreTime};
use crate::input;
use crate::job::{JobRecord, ReclaimPath};
use crate::new_job::NewJob;
use crate::queue::{QueueLimits, QueueRecord};
use crate::report::Reclaim;
use crate::retry::RetryPolicy;
use crate::rules::{self, Firing};
use crate::schedule::Schedule;
use crate::state::JobState;
use crate::workflow::GroupRecord;

/// Enqueues a job; with a unique key that another job holds ([`rules::holds_key`]), returns
/// that job instead.
pub(crate) fn enqueue(r: &mut (impl Records + ?Sized), new: &NewJob) -> Result<JobId> {
    if rules::is_plain(new) {
        input::check_new_job(new, r.policy().max_payload)?;
        if let Some(made) = insert_plain(r, std::slice::from_ref(new))? {
            return made
                .first()
                .copied()
                .ok_or(Error::Internal("an insert made no job"));
        }
    }
    enqueue_as(r, new, false, None)
}

/// Plain jobs ([`rules::is_plain`]) in the engine's one step, if it has one; their queues
/// woken.
fn insert_plain(r: &mut (impl Records + ?Sized), jobs: &[NewJob]) -> Result<Option<Vec<JobId>>> {
    let Some(made) = r.insert_plain(jobs)? else {
        return Ok(None);
    };
    if made.len() != jobs.len() {
        return Err(Error::Internal("a batch insert made another count of jobs"));
    }
    for job in jobs {
        r.readied(&job.queue)?;
    }
    Ok(Some(made))
}

/// [`enqueue`], for a group's own callback (`callback`: it may wait for its open group), or
/// for a member of the group `held` in hand (its count kept there, for the caller to store
/// once for many members).
pub(super) fn enqueue_as(
    r: &mut (impl Records + ?Sized),
    new: &NewJob,
    callback: bool,
    held: Option<&mut GroupRecord>,
) -> Result<JobId> {
    let max_payload = r.policy().max_payload;
    input::check_new_job(new, max_payload)?;
    if let Some(key) = &new.unique_key
        && let Some(holder) = key_holder(r, &new.queue, key)?
    {
        return Ok(holder.id);
    }
    let now = r.now()?;
    let job = rules::new_job(
        new,
        JobId(0),
        new.wait(),
        r.policy().default_max_attempts,
        max_payload,
        now,
    )?;
    let held = held.filter(|h| Some(h.id) == new.group);
    let (job, joined) = flow::links(r, new, job, callback, now, held.as_deref())?;
    let id = match r.insert(job.clone(), &new.payload)? {
        Inserted::Made(id) => id,
        Inserted::KeyTaken(id) => return Ok(id),
    };
    let job = JobRecord { id, ..job };
    keys::after(r, None, &job)?;
    match (held, joined) {
        // A member cancelled at once (a dependency had died) counts in its group as it is
        // linked: the group in hand is stored first, and read back after.
        (Some(held), Some(joined)) if job.state.is_terminal() => {
            r.save_group(&joined)?;
            flow::linked(r, &job, None, callback)?;
            *held = r.group(held.id)?.ok_or(Error::GroupNotFound(held.id))?;
        }
        (Some(held), Some(joined)) => {
            *held = joined;
            flow::linked(r, &job, None, callback)?;
        }
        (_, joined) => flow::linked(r, &job, joined, callback)?,
    }
    Ok(id)
}

/// Enqueues many jobs, all or none: every input is checked before anything is written.
pub(crate) fn enqueue_batch(
    r: &mut (impl Records + ?Sized),
    jobs: &[NewJob],
) -> Result<Vec<JobId>> {
    let max_payload = r.policy().max_payload;
    for job in jobs {
        input::check_new_job(job, max_payload)?;
    }
    // Each run of plain jobs in one step where the engine has one; else the run one by one
    // (each run counted once: counting what is left after every job made a batch of
    // 60,000 plain jobs take 1.8 billion looks, 10-18 s, on an engine without the step).
    let mut ids = Vec::with_capacity(jobs.len());
    let mut rest = jobs;
    while !rest.is_empty() {
        let run = rest.iter().take_while(|j| rules::is_plain(j)).count();
        if run > 1
            && let Some(made) = insert_plain(r, &rest[..run])?
        {
            ids.extend(made);
        } else {
            for job in &rest[..run.max(1)] {
                ids.push(enqueue(r, job)?);
            }
        }
        rest = &rest[run.max(1)..];
    }
    Ok(ids)
}

/// The job that holds `key` in `queue` now ([`rules::holds_key`]); a finished one whose
/// window ran out gives the key up here (stored), and is not the answer.
fn key_holder(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    key: &str,
) -> Result<Option<JobRecord>> {
    let Some(holder) = r.key_holder(queue, key)? else {
        return Ok(None);
    };
    let now = r.now()?;
    if rules::holds_key(&holder, now) {
        return Ok(Some(holder));
    }
    keys::save(r, &holder, &rules::release_key(&holder, now))?;
    Ok(None)
}

/// Cancels a job: a waiting one at once; a running one is flagged, and its holder learns of
/// it at its next heartbeat (or the attempt's end, whichever comes first). Returns its state
/// and whether anything changed (a cancelled job stays as it is).
pub(crate) fn cancel(r: &mut (impl Records + ?Sized), id: JobId) -> Result<(JobState, bool)> {
    let job = r.job(id)?.ok_or(Error::JobNotFound(id))?;
    let (new, answer) = rules::cancel(&job, r.now()?)?;
    let changed = new.is_some();
    if let Some(new) = new {
        let new = keys::save(r, &job, &new)?;
        flow::settle(r, &new)?;
    }
    Ok((answer, changed))
}

/// An operator's edit of a waiting job ([`rules::edit`]): its payload, priority, due time or
/// metadata, stored with every index in step; a job it makes due wakes its queue's workers.
pub(crate) fn edit(
    r: &mut (impl Records + ?Sized),
    id: JobId,
    edit: &crate::edit::Edit,
) -> Result<()> {
    let job = r.job(id)?.ok_or(Error::JobNotFound(id))?;
    let (now, max_payload) = (r.now()?, r.policy().max_payload);
    let new = rules::edit(&job, edit, edit.wait(), max_payload, now)?;
    r.edit(&job, &new, edit.payload.as_deref())?;
    keys::after(r, Some(&job), &new).map(drop)
}

/// Puts a dead or cancelled job back in the queue with a fresh retry budget (an operator's
/// decision). Its history is kept; its next claim is a new attempt.
///
/// A unique key deduplicates live jobs, and a finished job's key is free for a new one: if a
/// live job has taken it since, the retry is refused ([`Error::UniqueKeyHeld`]) rather than
/// make two live jobs hold one key. Refused, not re-keyed: the key is what the application
/// deduplicates by, and the live job already does the work it names.
pub(crate) fn retry(r: &mut (impl Records + ?Sized), id: JobId) -> Result<()> {
    let job = r.job(id)?.ok_or(Error::JobNotFound(id))?;
    let holder = match &job.unique_key {
        Some(key) => r.key_holder(&job.queue, key)?,
        None => None,
    };
    let (new, released) = rules::retry(&job, holder.as_ref(), r.now()?)?;
    if let (Some(holder), Some(released)) = (&holder, &released) {
        keys::save(r, holder, released)?;
    }
    let new = keys::save(r, &job, &new)?;
    flow::unsettle(r, &new, job.state)
}

/// Takes back up to `limit` leases: on the reaper path those expired at or before now, on
/// the recovery path every lease (their holder's process is known to be gone). An index
/// entry that lags a renewal is caught up instead.
pub(crate) fn reap_batch(
    r: &mut (impl Records + ?Sized),
    limit: usize,
    path: ReclaimPath,
    stages: &Stages,
) -> Result<Batch<Reclaim>> {
    let now = r.now()?;
    let bound = match path {
        ReclaimPath::Recovery => StoreTime(u64::MAX),
        _ => now,
    };
    let ids = r.indexed_expiries(bound, limit)?;
    let mut reclaimed = Vec::new();
    for &id in &ids {
        let Some(job) = r.job(id)? else {
            continue;
        };
        if path == ReclaimPath::Recovery || rules::lease_expired(&job, now) {
            reclaimed.push(expire(r, &job, path, stages)?.1);
        } else if job.state == JobState::Running {
            catch_up(r, &job)?;
        }
    }
    Ok(Batch {
        items: reclaimed,
        looked: ids.len(),
    })
}

/// Ends as expired up to `limit` jobs that wait past their expiry ([`rules::expired`]),
/// first to expire first: those nobody claims (a paused queue's, a blocked one's, a queue
/// nobody serves), which a claim would have expired instead of starting. What waits for
/// them learns it in this transaction.
pub(crate) fn expire_waiting(
    r: &mut (impl Records + ?Sized),
    limit: usize,
) -> Result<Batch<JobId>> {
    let now = r.now()?;
    let ids = r.past_expiry(now, limit)?;
    let mut items = Vec::new();
    for &id in &ids {
        let Some(job) = r.job(id)? else {
            continue;
        };
        if let Some(expired) = rules::expired(&job, now) {
            let expired = keys::save(r, &job, &expired)?;
            flow::settle(r, &expired)?;
            super::expired(r, &expired);
            items.push(id);
        }
    }
    Ok(Batch {
        items,
        looked: ids.len(),
    })
}

/// Deletes the terminal jobs in `states` that finished at or before `cutoff`, with their
/// history, looking at up to `limit` finished jobs from position `from` (finish time, job)
/// on; returns the batch (the jobs it deleted, the jobs it looked at) and the position the
/// next batch starts from: just past the last job looked at, so that none is looked at
/// twice, kept ones included, even when a full batch ends exactly at the end of the range.
pub(crate) fn purge(
    r: &mut (impl Records + ?Sized),
    from: (StoreTime, JobId),
    cutoff: StoreTime,
    states: &[JobState],
    limit: usize,
) -> Result<(Batch<JobId>, (StoreTime, JobId))> {
    let finished = r.finished(from, cutoff, limit)?;
    let next = finished
        .last()
        .and_then(|j| Some(after(j.finished_at?, j.id.0, JobId)))
        .unwrap_or(from);
    let mut items = Vec::new();
    for job in finished.iter().filter(|j| states.contains(&j.state)) {
        r.delete(job)?;
        items.push(job.id);
    }
    let looked = finished.len();
    Ok((Batch { items, looked }, next))
}

/// A whole purge of what ended at least `older_than` before `now` (jobs: `step` runs
/// [`purge`]; groups: [`super::group::purge_groups`]), a batch of at most `batch` per
/// transaction, each starting where the last one stopped (`from` first). Returns how many
/// were deleted.
pub(crate) fn purge_in_batches<Id: Copy, T>(
    now: StoreTime,
    older_than: std::time::Duration,
    batch: usize,
    mut from: (StoreTime, Id),
    mut step: impl FnMut((StoreTime, Id), StoreTime, usize) -> Result<(Batch<T>, (StoreTime, Id))>,
) -> Result<usize> {
    let age = u64::try_from(older_than.as_nanos()).unwrap_or(u64::MAX);
    // A store younger than `older_than` has nothing that old (a cutoff saturated to zero
    // would take what ended at its first instant).
    let Some(cutoff) = now.0.checked_sub(age).map(StoreTime) else {
        return Ok(0);
    };
    let pass = crate::batches::run(batch, |limit| {
        let (done, next) = step(from, cutoff, limit)?;
        from = next;
        Ok::<_, Error>(done)
    })?;
    Ok(pass.items.len())
}

/// The position just after `(at, id)` in the order jobs or groups ended (`make` the id).
pub(super) fn after<Id>(at: StoreTime, id: u64, make: fn(u64) -> Id) -> (StoreTime, Id) {
    match id.checked_add(1) {
        Some(next) => (at, make(next)),
        None => (
            at.saturating_add(std::time::Duration::from_nanos(1)),
            make(0),
        ),
    }
}

/// Marks `queue` as served now: a worker asked it for work or renewed one of its leases
/// (see [`crate::queue`]).
pub(crate) fn mark_served(r: &mut (impl Records + ?Sized), queue: &str) -> Result<()> {
    let record = r.queue(queue, false)?;
    let now = r.now()?;
    r.save_queue(queue, &rules::served(record, now))
}

/// Pauses `queue` (or resumes it): claims take none of its jobs while it is paused, in any
/// process; running jobs finish. A resume wakes its waiting workers.
pub(crate) fn pause_queue(r: &mut (impl Records + ?Sized), queue: &str, pause: bool) -> Result<()> {
    let record = known_queue(r, queue)?;
    r.save_queue(queue, &rules::paused(record.as_ref(), pause))?;
    super::tell(r, || crate::events::Event::QueuePaused {
        queue: queue.to_owned(),
        paused: pause,
    });
    if !pause {
        r.readied(queue)?;
    }
    Ok(())
}

/// Sets `queue`'s limits ([`rules::limited`]), waking its waiters, which may have more room.
pub(crate) fn set_queue_limits(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    limits: QueueLimits,
) -> Result<()> {
    // (limits that make no sense are refused first, whatever the queue)
    rules::limited(None, limits)?;
    let record = known_queue(r, queue)?;
    let per_key = |l: &QueueLimits| (l.per_key, l.per_key_rate);
    let old = record
        .as_ref()
        .map(|q| per_key(&q.limits))
        .unwrap_or_default();
    r.save_queue(queue, &rules::limited(record.as_ref(), limits)?)?;
    if old != per_key(&limits) {
        // A key at the old limit may have room now, or a head too many.
        keys::settle_queue(r, queue)?;
    }
    r.readied(queue)
}

/// Sets the retry policy of `queue`'s jobs that have none of their own ([`rules::with_retry`]);
/// `None` leaves them the store's. Each failure from now on waits by it.
pub(crate) fn set_queue_retry_policy(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    retry: Option<RetryPolicy>,
) -> Result<()> {
    rules::with_retry(None, retry.clone())?;
    let record = known_queue(r, queue)?;
    r.save_queue(queue, &rules::with_retry(record.as_ref(), retry)?)
}

/// The record of `queue`, held for writing, for a change of its controls: a queue the store
/// does not know (no record, no job) is refused, so that a typo makes no new queue.
fn known_queue(r: &mut (impl Records + ?Sized), queue: &str) -> Result<Option<QueueRecord>> {
    input::check_queue(queue)?;
    let record = r.queue(queue, true)?;
    if record.is_none() && !r.has_jobs(queue)? {
        return Err(Error::QueueNotFound(queue.to_owned()));
    }
    Ok(record)
}

/// Makes `queue` known with no settings, so that its controls may be set before its first
/// job; a queue known already is left as it is.
pub(crate) fn declare_queue(r: &mut (impl Records + ?Sized), queue: &str) -> Result<()> {
    input::check_queue(queue)?;
    if r.queue(queue, true)?.is_none() {
        r.save_queue(queue, &QueueRecord::default())?;
    }
    Ok(())
}

/// Declares a schedule ([`rules::declare`]): new, or as it was but for its job and catch-up.
pub(crate) fn declare_schedule(
    r: &mut (impl Records + ?Sized),
    s: &Schedule,
    wall: i64,
) -> Result<()> {
    let existing = r.schedule(s.name())?;
    let now = r.now()?;
    let record = rules::declare(existing.as_ref(), s, r.policy().max_payload, now, wall)?;
    if existing.as_ref() != Some(&record) {
        r.save_schedule(&record)?;
    }
    // Declared anew, it is checked anew: a failure it had is the next pass's to find.
    r.note_schedule_failure(s.name(), None)
}

/// Fires every schedule whose tick has come ([`rules::firing`]): each tick's job enqueued
/// in this transaction, which also moves the schedule's cursor past it, so a tick fires once
/// whichever process's scheduler comes first. A schedule that cannot fire (its record
/// unreadable, its ticks refused) is passed over with its failure kept beside it, and the
/// others fire. Returns the jobs enqueued.
pub(crate) fn fire_schedules(r: &mut (impl Records + ?Sized), wall: i64) -> Result<Fired> {
    let held = r.schedules()?;
    let now = r.now()?;
    let mut enqueued = Vec::new();
    let mut next = None;
    for (name, record, kept) in held {
        // (a record that cannot be read has no tick to wait for: it fails each pass)
        let (paused, tick) = match &record {
            Ok(r) => (r.paused, Some(r.next)),
            Err(_) => (true, None),
        };
        let failure = match rules::firing(record, now, wall, r.policy().max_payload) {
            Firing::Fire { jobs, save } => {
                for job in &jobs {
                    let id = enqueue(r, job)?;
                    super::tell(r, || crate::events::Event::ScheduleFired {
                        schedule: name.clone(),
                        job: id,
                    });
                    enqueued.push(id);
                }
                let tick = save.as_ref().map(|new| new.next).or(tick);
                if let Some(new) = save {
                    r.save_schedule(&new)?;
                }
                if let Some(tick) = tick.filter(|_| !paused) {
                    next = soonest(next, tick, now, wall);
                }
                None
            }
            Firing::Failed(why) => {
                tracing::warn!(schedule = %name, error = %why, "a schedule could not fire; the others did");
                // (due and not fired: the soonest, so that the scheduler tries again soon)
                if let Some(tick) = tick.filter(|_| !paused) {
                    next = soonest(next, tick, now, wall);
                }
                Some(why)
            }
        };
        if failure != kept {
            r.note_schedule_failure(&name, failure.as_deref())?;
        }
    }
    Ok(Fired {
        jobs: enqueued,
        next,
    })
}

/// What a pass over the schedules did: the jobs it enqueued, and the soonest tick of a
/// schedule that is not paused (one due that did not fire included), if any.
pub(crate) struct Fired {
    pub jobs: Vec<JobId>,
    pub next: Option<crate::schedule::Tick>,
}

/// The sooner of `next` and `tick`, as of store time `now` and the wall clock's `wall`
/// seconds (a store tick and a wall tick compare by how long until each).
fn soonest(
    next: Option<crate::schedule::Tick>,
    tick: crate::schedule::Tick,
    now: crate::ids::StoreTime,
    wall: i64,
) -> Option<crate::schedule::Tick> {
    let until = |t: crate::schedule::Tick| match t {
        crate::schedule::Tick::Store(at) => at.saturating_since(now),
        crate::schedule::Tick::Wall(secs) => {
            std::time::Duration::from_secs(u64::try_from(secs.saturating_sub(wall)).unwrap_or(0))
        }
    };
    match next {
        Some(n) if until(n) <= until(tick) => Some(n),
        _ => Some(tick),
    }
}

/// Pauses (or resumes) a schedule: no tick of a paused one fires.
pub(crate) fn pause_schedule(
    r: &mut (impl Records + ?Sized),
    name: &str,
    paused: bool,
) -> Result<()> {
    let mut record = r
        .schedule(name)?
        .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))?;
    if record.paused != paused {
        record.paused = paused;
        r.save_schedule(&record)?;
    }
    Ok(())
}

/// Removes a schedule; its jobs already enqueued stay. `false` if there was none.
pub(crate) fn remove_schedule(r: &mut (impl Records + ?Sized), name: &str) -> Result<bool> {
    let removed = r.remove_schedule(name)?;
    r.note_schedule_failure(name, None)?;
    Ok(removed)
}
