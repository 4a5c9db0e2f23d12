//! The lease protocol on redb, readable in one place: each step is a function over a write
//! transaction ([`Tx`]) at one instant of store time (`tx.now`). What becomes of a job is the
//! rule book's ([`crate::rules`]); these functions find the records, apply the rules, and
//! store what they decide, keeping the indexes in step.
//!
//! The rules every function here keeps:
//! * A claim is one conditional update: a job is taken only if it is waiting and due, or
//!   running with an expired lease (takeover). Every claim increments `attempt`.
//! * A fenced write (heartbeat, complete, fail, release) first checks that the job is
//!   `Running` under the caller's attempt ([`fence`]) and changes *nothing* if not: the
//!   caller gets [`LeaseLost`] with what was found, and only the refusal counter moves.
//! * An attempt ends in exactly one place ([`end_attempt`]), which writes its history
//!   record, so history has one record per ended attempt. A running attempt has none: its
//!   lease record says who holds it and since when, and readers show it from there (one
//!   write less per claim, one read less per completion).
//! * Records are written only through [`index::save`], which keeps every index in step (or,
//!   for a renewal, which moves no entry, [`index::rewrite`]).

use redb::ReadableTable;

use crate::batches::Batch;
use crate::codec;
use crate::config::check_terms;
use crate::error::{Error, Result};
use crate::ids::{Attempt, InstanceId, JobId, StoreTime};
use crate::input;
use crate::job::{JobRecord, JobState, NewJob, ReclaimPath, RunRecord};
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::queue::QueueRecord;
use crate::redb_store::index;
use crate::redb_store::search;
use crate::redb_store::writing::{Tx, load};
use crate::report::Reclaim;
use crate::rules::corrupt_running;
use crate::rules::{self, Change, Firing, Granted, Renewed, Retry, Write};
use crate::schedule::{Schedule, ScheduleRecord};

/// Enqueues a job; with a unique key that another job holds ([`rules::holds_key`]), returns
/// that job instead.
pub(crate) fn enqueue(tx: &mut Tx<'_>, new: &NewJob) -> Result<JobId> {
    check_new_job(tx, new)?;
    if let Some(key) = &new.unique_key
        && let Some(holder) = key_holder(tx, &new.queue, key)?
    {
        if rules::holds_key(&holder, tx.now) {
            return Ok(holder.id);
        }
        index::save(tx, Some(&holder), &rules::release_key(&holder, tx.now))?;
    }
    let id = tx.next_job_id()?;
    let policy = tx.policy;
    let job = rules::new_job(
        new,
        id,
        policy.default_max_attempts,
        policy.max_payload,
        tx.now,
    )?;
    tx.tables.payloads.insert(id.0, new.payload.as_slice())?;
    index::save(tx, None, &job)?;
    Ok(id)
}

/// Enqueues many jobs, all or none: every input is checked before anything is written.
pub(crate) fn enqueue_batch(tx: &mut Tx<'_>, jobs: &[NewJob]) -> Result<Vec<JobId>> {
    for job in jobs {
        check_new_job(tx, job)?;
    }
    jobs.iter().map(|j| enqueue(tx, j)).collect()
}

fn check_new_job(tx: &Tx<'_>, new: &NewJob) -> Result<()> {
    Ok(input::check_new_job(new, tx.policy.max_payload)?)
}

/// Claims the most urgent claimable job of `queue`: the lowest priority among due waiting
/// jobs (first in, first out within a priority) and expired leases (taken over).
///
/// Cost: `O(P log n)`, where `P` is the number of distinct priorities whose jobs are all
/// delayed into the future (normally a handful), plus one `O(log n)` step per expired lease
/// whose job it finds out of budget on the way.
pub(crate) fn claim(
    tx: &mut Tx<'_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    Ok(claim_batch(tx, queue, worker, terms, 1)?.pop())
}

/// Claims up to `n` jobs of `queue` in one transaction, most urgent first.
pub(crate) fn claim_batch(
    tx: &mut Tx<'_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
) -> Result<Vec<Lease>> {
    input::check_claim(queue, worker, &terms)?;
    let (record, room) = room(tx, queue)?;
    let n = n.min(room.allowed);
    let mut leases = Vec::with_capacity(n.min(1024));
    // Once no lease has expired, none will within this transaction (its time stands still
    // and every lease it grants ends later), so the rest of the batch skips that search.
    let mut expired_left = true;
    while leases.len() < n {
        match next_claim(tx, queue, worker, terms, &mut expired_left)? {
            Some(l) => leases.push(l),
            None => break,
        }
    }
    noted(tx, queue, record, leases.len())?;
    Ok(leases)
}

/// What a claim of `queue` may take now ([`rules::claim_room`]), and the queue's record. A
/// queue with a concurrency limit has its expired leases taken back first: a lease that ran
/// out holds no slot, and its holder's late renewal must not take one back from the claim
/// that filled it.
fn room(tx: &mut Tx<'_>, queue: &str) -> Result<(Option<QueueRecord>, rules::Room)> {
    let record = queue_record(tx, queue)?;
    let limited = record
        .as_ref()
        .is_some_and(|r| !r.paused && r.limits.concurrency.is_some());
    let mut running = 0;
    if limited {
        while let Some(id) = search::next_expired(tx, queue)? {
            let job = load(tx, id)?;
            expire(tx, job, ReclaimPath::Takeover)?;
        }
        running = tx.count(queue, JobState::Running)?;
    }
    let room = rules::claim_room(record.as_ref(), running, tx.now);
    Ok((record, room))
}

/// Keeps `claimed` claims of `queue` in its rate window, if it has a rate limit.
fn noted(tx: &mut Tx<'_>, queue: &str, record: Option<QueueRecord>, claimed: usize) -> Result<()> {
    match record {
        Some(r) if claimed > 0 && r.limits.rate.is_some() => {
            save_queue(tx, queue, &rules::note_claims(&r, claimed, tx.now))
        }
        _ => Ok(()),
    }
}

/// The claim itself, inputs checked: see [`claim`]. Looks for expired leases only while
/// `expired_left`, and clears it once it finds none.
fn next_claim(
    tx: &mut Tx<'_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    expired_left: &mut bool,
) -> Result<Option<Lease>> {
    loop {
        let expired = match expired_left {
            true => search::next_expired(tx, queue)?,
            false => None,
        };
        *expired_left = expired.is_some();
        let ready = search::next_ready(tx, queue)?;
        let (id, takeover) = match (ready, expired) {
            (None, None) => return Ok(None),
            (Some((_, id)), None) => (id, false),
            (None, Some(id)) => (id, true),
            (Some((p, ready_id)), Some(expired_id)) => {
                match rules::takes_over(&load(tx, expired_id)?, Some(p)) {
                    true => (expired_id, true),
                    false => (ready_id, false),
                }
            }
        };
        let mut job = load(tx, id)?;
        if takeover {
            job = expire(tx, job, ReclaimPath::Takeover)?.0;
            if !rules::claimable(&job, tx.now) {
                // Out of budget or cancelled (now terminal), or timed out and waiting out
                // its backoff: look for the next candidate.
                continue;
            }
        }
        if let Some(lease) = grant(tx, job, worker, terms)? {
            return Ok(Some(lease));
        }
        // Its attempt counter was exhausted and it is now dead: the next candidate.
    }
}

/// Claims one named job if it is claimable now: waiting and due, or running with an expired
/// lease. The conditional update of the seed design:
/// `UPDATE jobs SET state='running', attempt=attempt+1, ... WHERE id=? AND (state='queued'
/// OR (state='running' AND lease_expires_at <= now))`.
pub(crate) fn claim_job(
    tx: &mut Tx<'_>,
    id: JobId,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    input::check_worker(worker)?;
    check_terms(&terms)?;
    let job = tx.tables.job(id)?.ok_or(Error::JobNotFound(id))?;
    if !rules::claimable(&job, tx.now) && !rules::lease_expired(&job, tx.now) {
        return Ok(None);
    }
    let queue = job.queue.clone();
    let (record, room) = room(tx, &queue)?;
    // (taking back the queue's expired leases may have made this one claimable)
    let job = tx.tables.job(id)?.ok_or(Error::JobNotFound(id))?;
    if room.allowed == 0 {
        return Ok(None);
    }
    let job = match rules::lease_expired(&job, tx.now) {
        true => expire(tx, job, ReclaimPath::Takeover)?.0,
        false => job,
    };
    if !rules::claimable(&job, tx.now) {
        return Ok(None);
    }
    let lease = grant(tx, job, worker, terms)?;
    noted(tx, &queue, record, usize::from(lease.is_some()))?;
    Ok(lease)
}

/// Renews the lease by its length from now, if the caller still holds it; stores progress.
/// A cancel requested meanwhile ends the attempt here and tells the holder; so does a stall
/// (progress unchanged for the lease's stall timeout), which revokes the lease.
pub(crate) fn heartbeat(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    progress: u64,
) -> Result<Renewal> {
    let job = fence(tx, id, attempt, Write::Heartbeat)?;
    match rules::renew(&job, progress, tx.now, &tx.policy.retry) {
        Renewed::Cancelled(change) => {
            store_end(tx, &job, change)?;
            Ok(Renewal::Cancelled)
        }
        Renewed::Stalled(change) => {
            store_end(tx, &job, change)?;
            Ok(Renewal::Stalled)
        }
        Renewed::TimedOut(change) => {
            store_end(tx, &job, change)?;
            Ok(Renewal::TimedOut)
        }
        Renewed::Lease(renewed) => {
            let Some(expires_at) = renewed.lease.as_ref().map(|l| l.expires_at) else {
                return Err(corrupt_running(&job));
            };
            tx.tally.wrote_time(expires_at);
            // A renewal moves no index entry (the expiry entry catches up later, see
            // `LeaseRecord::indexed_expiry`), so the record is rewritten in place.
            index::rewrite(tx, &renewed)?;
            Ok(Renewal::Renewed { expires_at })
        }
    }
}

/// Completes the attempt: the job succeeded and `output` is kept. `progress`, if given, is
/// the holder's last progress, recorded with the attempt.
pub(crate) fn complete(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    output: &[u8],
    progress: Option<u64>,
) -> Result<()> {
    input::check_size("output", output.len(), tx.policy.max_payload)?;
    let job = fence(tx, id, attempt, Write::End)?;
    if !output.is_empty() {
        tx.tables.outputs.insert(job.id.0, output)?;
    }
    let change = rules::complete(&job, progress, tx.now);
    store_end(tx, &job, change)?;
    Ok(())
}

/// Fails the attempt: retry after a backoff while the budget lasts (or never), else dead.
pub(crate) fn fail(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    error: &str,
    retry: Retry,
    progress: Option<u64>,
) -> Result<JobState> {
    let job = fence(tx, id, attempt, Write::End)?;
    let change = rules::fail(&job, error, retry, progress, tx.now, &tx.policy.retry);
    store_end(tx, &job, change).map(|j| j.state)
}

/// Ends the attempt as timed out: its holder found it past its hard time limit.
pub(crate) fn time_out(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    progress: Option<u64>,
) -> Result<JobState> {
    let job = fence(tx, id, attempt, Write::TimeOut)?;
    let change = rules::time_out(&job, progress, tx.now, &tx.policy.retry);
    store_end(tx, &job, change).map(|j| j.state)
}

/// Puts the job off by `delay`: the attempt ends, no budget spent ([`rules::snooze`]).
pub(crate) fn snooze(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    delay: std::time::Duration,
    progress: Option<u64>,
) -> Result<JobState> {
    let job = fence(tx, id, attempt, Write::End)?;
    let change = rules::snooze(&job, delay, progress, tx.now);
    store_end(tx, &job, change).map(|j| j.state)
}

/// Gives the job back on purpose: claimable at once, in its old place, no budget spent.
pub(crate) fn release(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: Attempt,
    progress: Option<u64>,
) -> Result<JobState> {
    let job = fence(tx, id, attempt, Write::End)?;
    let change = rules::release(&job, progress, tx.now);
    store_end(tx, &job, change).map(|j| j.state)
}

/// Cancels a job: a waiting one at once; a running one is flagged, and its holder learns of
/// it at its next heartbeat (or the attempt's end, whichever comes first). Returns its state
/// and whether anything changed (a cancelled job stays as it is).
pub(crate) fn cancel(tx: &mut Tx<'_>, id: JobId) -> Result<(JobState, bool)> {
    let job = tx.tables.job(id)?.ok_or(Error::JobNotFound(id))?;
    let (new, answer) = rules::cancel(&job, tx.now)?;
    let changed = new.is_some();
    if let Some(new) = new {
        index::save(tx, Some(&job), &new)?;
    }
    Ok((answer, changed))
}

/// Puts a dead or cancelled job back in the queue with a fresh retry budget (an operator's
/// decision). Its history is kept; its next claim is a new attempt.
///
/// A unique key deduplicates live jobs, and a finished job's key is free for a new one: if a
/// live job has taken it since, the retry is refused ([`Error::UniqueKeyHeld`]) rather than
/// make two live jobs hold one key. Refused, not re-keyed: the key is what the application
/// deduplicates by, and the live job already does the work it names.
pub(crate) fn retry(tx: &mut Tx<'_>, id: JobId) -> Result<()> {
    let job = tx.tables.job(id)?.ok_or(Error::JobNotFound(id))?;
    let holder = match &job.unique_key {
        Some(key) => key_holder(tx, &job.queue, key)?,
        None => None,
    };
    let (new, released) = rules::retry(&job, holder.as_ref(), tx.now)?;
    if let (Some(holder), Some(released)) = (&holder, &released) {
        index::save(tx, Some(holder), released)?;
    }
    index::save(tx, Some(&job), &new)
}

/// The job the `unique` index names for `key` in `queue`, if any.
fn key_holder(tx: &Tx<'_>, queue: &str, key: &str) -> Result<Option<JobRecord>> {
    match tx.tables.unique.get((queue, key))? {
        Some(id) => Ok(Some(load(tx, JobId(id.value()))?)),
        None => Ok(None),
    }
}

/// A position in the `finished` index: (finished at, job).
pub(crate) type FinishedKey = (u64, u64);

/// Deletes the terminal jobs in `states` that finished at or before `cutoff`, with their
/// history, looking at up to `limit` of them from the `finished` key `from`; returns the
/// batch (the jobs it deleted, the entries it looked at) and the key the next batch starts
/// from: just past the last entry looked at, so that no entry is looked at twice, kept ones
/// included, even when a full batch ends exactly at the end of the range.
pub(crate) fn purge(
    tx: &mut Tx<'_>,
    from: FinishedKey,
    cutoff: StoreTime,
    states: &[JobState],
    limit: usize,
) -> Result<(Batch<JobId>, FinishedKey)> {
    let mut due = Vec::new();
    let (mut last, mut looked) = (None, 0);
    // Every entry looked at counts against the batch, kept ones too (dead jobs, say), so a
    // batch's work stays bounded.
    for entry in tx
        .tables
        .finished
        .range(from..=(cutoff.0, u64::MAX))?
        .take(limit)
    {
        let key = entry?.0.value();
        (last, looked) = (Some(key), looked + 1);
        let job = load(tx, JobId(key.1))?;
        if states.contains(&job.state) {
            due.push(job);
        }
    }
    for job in &due {
        index::delete(tx, job)?;
    }
    let next = last.map_or(from, just_after);
    let items = due.iter().map(|j| j.id).collect();
    Ok((Batch { items, looked }, next))
}

/// The first `finished` key after `key`.
fn just_after((at, id): FinishedKey) -> FinishedKey {
    match id.checked_add(1) {
        Some(id) => (at, id),
        None => (at.saturating_add(1), 0),
    }
}

/// Takes back up to `limit` leases: on the reaper path those expired at or before now, on
/// the recovery path every lease (their holder's process is known to be gone).
pub(crate) fn reap_batch(
    tx: &mut Tx<'_>,
    limit: usize,
    path: ReclaimPath,
) -> Result<Batch<Reclaim>> {
    let bound = match path {
        ReclaimPath::Recovery => u64::MAX,
        _ => tx.now.0,
    };
    let mut reclaimed = Vec::new();
    // Index entries looked at (reclaims and catch-ups alike) count against the batch, so a
    // batch's work stays bounded.
    let mut visited = 0usize;
    for queue in search::running_queues(tx)? {
        loop {
            let Some(id) = search::first_indexed_expiry(tx, &queue, bound)? else {
                break;
            };
            if visited == limit {
                break;
            }
            visited += 1;
            let job = load(tx, id)?;
            if path == ReclaimPath::Recovery || rules::lease_expired(&job, tx.now) {
                let (_, reclaim) = expire(tx, job, path)?;
                reclaimed.push(reclaim);
            } else {
                search::catch_up(tx, job)?;
            }
        }
    }
    Ok(Batch {
        items: reclaimed,
        looked: visited,
    })
}

/// Takes back up to `limit` leases held by `instance`, a process that is known to be dead
/// (its instance lock was free): all of them in one transaction when they fit, recorded as
/// [`ReclaimPath::ProcessDied`].
pub(crate) fn reclaim_holder(
    tx: &mut Tx<'_>,
    instance: InstanceId,
    limit: usize,
) -> Result<Batch<Reclaim>> {
    let Some(holders) = &tx.tables.holders else {
        return Ok(Batch {
            items: Vec::new(),
            looked: 0,
        });
    };
    let mut held = Vec::new();
    for entry in holders.iter()? {
        let (job, holder) = entry?;
        let (holder, attempt) = holder.value();
        if holder != instance.0 {
            continue;
        }
        if held.len() == limit {
            break;
        }
        held.push((JobId(job.value()), Attempt(attempt)));
    }
    let looked = held.len();
    let mut reclaimed = Vec::with_capacity(held.len());
    for (id, attempt) in held {
        let job = load(tx, id)?;
        if job.state == JobState::Running && job.attempt == attempt {
            reclaimed.push(expire(tx, job, ReclaimPath::ProcessDied)?.1);
        } else {
            // An entry its attempt's end did not remove cannot exist; tolerate one anyway.
            tx.tables.unhold(id)?;
        }
    }
    Ok(Batch {
        items: reclaimed,
        looked,
    })
}

/// At open in a store shared by processes: takes back up to `limit` running leases whose
/// holder is not `alive` ([`ReclaimPath::ProcessDied`]), and those no process instance holds
/// (granted while the store was not shared, by a process that is gone: [`ReclaimPath::Recovery`]).
/// A live neighbour's lease is never touched.
pub(crate) fn reclaim_orphans(
    tx: &mut Tx<'_>,
    limit: usize,
    mut alive: impl FnMut(InstanceId) -> bool,
) -> Result<Batch<Reclaim>> {
    let mut orphans = Vec::new();
    for entry in tx.tables.expiry.iter()? {
        let (_, _, id) = entry?.0.value();
        let holder = match &tx.tables.holders {
            Some(holders) => holders.get(id)?.map(|h| InstanceId(h.value().0)),
            None => None,
        };
        let path = match holder {
            Some(holder) if alive(holder) => continue,
            Some(_) => ReclaimPath::ProcessDied,
            None => ReclaimPath::Recovery,
        };
        if orphans.len() == limit {
            break;
        }
        orphans.push((JobId(id), path));
    }
    let looked = orphans.len();
    let mut reclaimed = Vec::with_capacity(orphans.len());
    for (id, path) in orphans {
        reclaimed.push(expire(tx, load(tx, id)?, path)?.1);
    }
    Ok(Batch {
        items: reclaimed,
        looked,
    })
}

/// Marks `queue` as served at this transaction's time: a worker asked it for work or
/// renewed one of its leases (see [`crate::queue`]).
pub(crate) fn mark_served(tx: &mut Tx<'_>, queue: &str) -> Result<()> {
    let now = tx.now;
    let mut record = queue_record(tx, queue)?.unwrap_or_default();
    record.served_at = Some(record.served_at.map_or(now, |at| at.max(now)));
    save_queue(tx, queue, &record)
}

/// Pauses `queue` (or resumes it): claims take none of its jobs while it is paused, in any
/// process; running jobs finish. A resume wakes its waiting workers.
pub(crate) fn pause_queue(tx: &mut Tx<'_>, queue: &str, pause: bool) -> Result<()> {
    input::check_queue(queue)?;
    let record = queue_record(tx, queue)?;
    save_queue(tx, queue, &rules::paused(record.as_ref(), pause))?;
    if !pause {
        tx.tally.readied.insert(queue.to_owned());
    }
    Ok(())
}

/// Sets `queue`'s limits ([`rules::limited`]); waking its waiters, which may have more room.
pub(crate) fn set_queue_limits(
    tx: &mut Tx<'_>,
    queue: &str,
    limits: crate::queue::QueueLimits,
) -> Result<()> {
    input::check_queue(queue)?;
    let record = queue_record(tx, queue)?;
    save_queue(tx, queue, &rules::limited(record.as_ref(), limits)?)?;
    tx.tally.readied.insert(queue.to_owned());
    Ok(())
}

/// Declares a schedule ([`rules::declare`]): new, or as it was but for its job and catch-up.
pub(crate) fn declare_schedule(tx: &mut Tx<'_>, s: &Schedule, wall: i64) -> Result<()> {
    let existing = schedule_record(tx, s.name())?;
    let record = rules::declare(existing.as_ref(), s, tx.policy.max_payload, tx.now, wall)?;
    if existing.as_ref() != Some(&record) {
        save_schedule(tx, &record)?;
    }
    // Declared anew, it is checked anew: a failure it had is the next pass's to find.
    note_schedule_failure(tx, s.name(), None)
}

/// Fires every schedule whose tick has come ([`rules::firing`]): each tick's job enqueued
/// in this transaction, which also moves the schedule's cursor past it, so a tick fires once
/// whichever process's scheduler comes first. A schedule that cannot fire (its record
/// unreadable, its ticks refused) is passed over with its failure kept beside it, and the
/// others fire. Returns the jobs enqueued.
pub(crate) fn fire_schedules(tx: &mut Tx<'_>, wall: i64) -> Result<Vec<JobId>> {
    let mut records = Vec::new();
    for entry in tx.tables.schedules()?.iter()? {
        let (name, bytes) = entry?;
        let name = name.value().to_owned();
        let record = decode_schedule(&name, bytes.value());
        records.push((name, record));
    }
    let mut enqueued = Vec::new();
    for (name, record) in records {
        let failure = match rules::firing(record, tx.now, wall, tx.policy.max_payload) {
            Firing::Fire { jobs, save } => {
                for job in &jobs {
                    enqueued.push(enqueue(tx, job)?);
                }
                if let Some(new) = save {
                    save_schedule(tx, &new)?;
                }
                None
            }
            Firing::Failed(why) => {
                tracing::warn!(schedule = %name, error = %why, "a schedule could not fire; the others did");
                Some(why)
            }
        };
        note_schedule_failure(tx, &name, failure.as_deref())?;
    }
    Ok(enqueued)
}

/// Keeps schedule `name`'s failure beside it (`None`: it has none), writing only a change.
fn note_schedule_failure(tx: &mut Tx<'_>, name: &str, failure: Option<&str>) -> Result<()> {
    let key = rules::schedule_failure_key(name);
    let kept = tx
        .tables
        .meta
        .get(key.as_str())?
        .map(|v| v.value().to_vec());
    if kept.as_deref() == failure.map(str::as_bytes) {
        return Ok(());
    }
    match failure {
        Some(failure) => tx.tables.meta.insert(key.as_str(), failure.as_bytes())?,
        None => tx.tables.meta.remove(key.as_str())?,
    };
    tx.tally.writes += 1;
    Ok(())
}

/// Pauses (or resumes) a schedule: no tick of a paused one fires.
pub(crate) fn pause_schedule(tx: &mut Tx<'_>, name: &str, paused: bool) -> Result<()> {
    let mut record =
        schedule_record(tx, name)?.ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))?;
    if record.paused != paused {
        record.paused = paused;
        save_schedule(tx, &record)?;
    }
    Ok(())
}

/// Removes a schedule; its jobs already enqueued stay. `false` if there was none.
pub(crate) fn remove_schedule(tx: &mut Tx<'_>, name: &str) -> Result<bool> {
    let removed = tx.tables.schedules()?.remove(name)?.is_some();
    if removed {
        tx.tally.writes += 1;
    }
    note_schedule_failure(tx, name, None)?;
    Ok(removed)
}

fn schedule_record(tx: &mut Tx<'_>, name: &str) -> Result<Option<ScheduleRecord>> {
    match tx.tables.schedules()?.get(name)? {
        Some(b) => decode_schedule(name, b.value()).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn decode_schedule(name: &str, bytes: &[u8]) -> Result<ScheduleRecord> {
    codec::decode(bytes).map_err(|e| Error::Corrupt(format!("schedule {name:?}: {e}")))
}

fn save_schedule(tx: &mut Tx<'_>, record: &ScheduleRecord) -> Result<()> {
    tx.tables
        .schedules()?
        .insert(record.name.as_str(), codec::encode(record).as_slice())?;
    tx.tally.writes += 1;
    Ok(())
}

/// The record of `queue`, if it has one.
fn queue_record(tx: &mut Tx<'_>, queue: &str) -> Result<Option<QueueRecord>> {
    match tx.tables.queues()?.get(queue)? {
        Some(b) => codec::decode(b.value())
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("the record of queue {queue:?}: {e}"))),
        None => Ok(None),
    }
}

fn save_queue(tx: &mut Tx<'_>, queue: &str, record: &QueueRecord) -> Result<()> {
    tx.tables
        .queues()?
        .insert(queue, codec::encode(record).as_slice())?;
    tx.tally.writes += 1;
    Ok(())
}

// ----- the pieces -----

/// The fence ([`rules::fence`]): the job must be `Running` under exactly this attempt. A
/// refusal changes nothing but its counter.
fn fence(tx: &mut Tx<'_>, id: JobId, attempt: Attempt, write: Write) -> Result<JobRecord> {
    let found = tx.tables.job(id)?;
    let verdict = rules::fence(found, id, attempt, write, || {
        ended_by_holder(tx, id, attempt)
    })?;
    match verdict.and_then(|job| rules::before_deadline(job, write, tx.now)) {
        Ok(job) => Ok(job),
        Err(refused) => {
            tx.tally.add(&refused.counts);
            Err(refused.lost.into())
        }
    }
}

/// Whether the attempt's history says its holder ended it (completed, failed or released it),
/// rather than the store taking it back.
fn ended_by_holder(tx: &Tx<'_>, id: JobId, attempt: Attempt) -> Result<bool> {
    let Some(bytes) = tx.tables.history.get((id.0, attempt.0))? else {
        return Ok(false);
    };
    let run: RunRecord = codec::decode(bytes.value())
        .map_err(|e| Error::Corrupt(format!("history of job {id} attempt {attempt}: {e}")))?;
    Ok(rules::ended_by_its_holder(run.outcome.as_ref()))
}

/// Stores the end of an attempt a rule decided: its history record, the job moved on (every
/// index in step), its holder forgotten, the counters. The only place an attempt ends.
fn store_end(tx: &mut Tx<'_>, old: &JobRecord, change: Change) -> Result<JobRecord> {
    let Some(run) = &change.ended else {
        return Err(corrupt_running(old));
    };
    tx.tables
        .history
        .insert((old.id.0, old.attempt.0), codec::encode(run).as_slice())?;
    index::save(tx, Some(old), &change.job)?;
    tx.tables.unhold(old.id)?;
    tx.tally.add(&change.counts);
    Ok(change.job)
}

/// Starts a new attempt of a waiting job under a lease for `worker` ([`rules::grant`]). A
/// job whose attempt counter is exhausted is dead instead (`None`).
fn grant(
    tx: &mut Tx<'_>,
    job: JobRecord,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    let new = match rules::grant(&job, worker, terms, tx.now) {
        Granted::Exhausted(dead) => {
            index::save(tx, Some(&job), &dead)?;
            return Ok(None);
        }
        Granted::Lease(new) => new,
    };
    index::save(tx, Some(&job), &new)?;
    if let Some(instance) = tx.policy.instance {
        tx.tables.hold(new.id, instance, new.attempt.0)?;
    }
    let Some(granted) = new.lease.as_ref() else {
        return Err(corrupt_running(&new));
    };
    let (claimed_at, expires_at, deadline) = (tx.now, granted.expires_at, granted.deadline);
    tx.tally.wrote_time(expires_at);
    let payload = tx
        .tables
        .payloads
        .get(new.id.0)?
        .map(|p| p.value().to_vec())
        .ok_or_else(|| Error::Corrupt(format!("job {} has no payload", new.id)))?;
    Ok(Some(Lease {
        job: new.id,
        attempt: new.attempt,
        queue: new.queue,
        worker: worker.to_owned(),
        claimed_at,
        expires_at,
        length: terms.length,
        deadline,
        payload,
    }))
}

/// Takes back the lease of a running job ([`rules::expire`]): records `LeaseExpired` and
/// moves the job on.
fn expire(tx: &mut Tx<'_>, job: JobRecord, path: ReclaimPath) -> Result<(JobRecord, Reclaim)> {
    let Some((change, reclaim)) = rules::expire(&job, path, tx.now, &tx.policy.retry) else {
        return Err(corrupt_running(&job));
    };
    let new = store_end(tx, &job, change)?;
    Ok((new, reclaim))
}
