//! Limits per key, applied: every change of a job with a limit key goes through [`save`],
//! which counts the key's running jobs and keeps its head ([`crate::rules::key_head`]) in
//! step, in the transaction of the change. A grant asks [`has_room`] first.

use super::Records;
use crate::error::Result;
use crate::job::JobRecord;
use crate::queue::QueueLimits;
use crate::rules;

/// Stores `new` over `old` ([`Records::save`]), and settles its key if it has one and the
/// change moves it. Returns the record as it then stands (a keyed job that comes to wait is
/// parked, and its key may have made it its head since): what a later change starts from.
pub(crate) fn save(
    r: &mut (impl Records + ?Sized),
    old: &JobRecord,
    new: &JobRecord,
) -> Result<JobRecord> {
    let stored = rules::parked_on_arrival(Some(old), new).unwrap_or_else(|| new.clone());
    r.save(old, &stored)?;
    Ok(match after(r, Some(old), &stored)? {
        Some(head) if head.id == stored.id => head,
        _ => stored,
    })
}

/// [`save`] for many changes ([`Records::save_all`]).
pub(crate) fn save_all(
    r: &mut (impl Records + ?Sized),
    changes: &[(JobRecord, JobRecord)],
) -> Result<()> {
    if changes.iter().all(|(_, new)| new.limit.is_none()) {
        return r.save_all(changes);
    }
    for (old, new) in changes {
        save(r, old, new)?;
    }
    Ok(())
}

/// Whether one more job of `job`'s key may start now under its queue's `limits` (one
/// without a key always may). A head found without room is parked, so no claim meets it
/// again until its key has room.
pub(crate) fn has_room(
    r: &mut (impl Records + ?Sized),
    job: &JobRecord,
    limits: &QueueLimits,
) -> Result<bool> {
    let Some(limit) = &job.limit else {
        return Ok(true);
    };
    let record = r.limit_key(&job.queue, &limit.key)?.unwrap_or_default();
    if rules::key_has_room(limits, &record, r.now()?) {
        return Ok(true);
    }
    if rules::in_claim_order(job) {
        r.save(job, &rules::parked(job, true))?;
    }
    settle(r, &job.queue, &limit.key, 0)?;
    Ok(false)
}

/// Settles every key of `queue` that has a record: its limit changed, so a key at the old
/// limit may have room now (a key that has none has a record: it runs a job, or its rate
/// window is spent).
pub(crate) fn settle_queue(r: &mut (impl Records + ?Sized), queue: &str) -> Result<()> {
    for key in r.limit_keys(queue)? {
        settle(r, queue, &key, 0)?;
    }
    Ok(())
}

/// Settles the keys of `queue` whose rate window has room again by now: a claim of the queue
/// asks first, so that a key held back by its rate has its head again when it may.
pub(crate) fn reopen(r: &mut (impl Records + ?Sized), queue: &str) -> Result<()> {
    let now = r.now()?;
    for key in r.gated_keys(queue, now)? {
        settle(r, queue, &key, 0)?;
    }
    Ok(())
}

/// Counts the end of a running job of `key` stored by an engine's own step
/// ([`Records::complete_fenced`]): what [`save`] does for an end.
pub(crate) fn ended(r: &mut (impl Records + ?Sized), queue: &str, key: &str) -> Result<()> {
    settle(r, queue, key, -1).map(drop)
}

/// Settles the key of `new` (stored over `old`; `None`: a new job, stored parked as
/// [`rules::new_job`] makes it) if the change moves it. Returns the job it made the key's
/// head, if it made one (as stored).
pub(crate) fn after(
    r: &mut (impl Records + ?Sized),
    old: Option<&JobRecord>,
    new: &JobRecord,
) -> Result<Option<JobRecord>> {
    let Some(limit) = &new.limit else {
        return Ok(None);
    };
    match rules::key_moved(old, new) {
        Some(delta) => settle(r, &new.queue, &limit.key, delta),
        None => Ok(None),
    }
}

/// Counts `delta` more running jobs of `key` and moves its head where [`rules::key_head`]
/// says: the old head parked, the new one in the claim order (returned, as stored, if it
/// was parked). A job another transaction holds is left as it is: that transaction changes
/// it and settles the key after this one.
fn settle(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    key: &str,
    delta: i64,
) -> Result<Option<JobRecord>> {
    let limits = r.queue(queue, false)?.unwrap_or_default().limits;
    let now = r.now()?;
    let record = r.limit_key(queue, key)?.unwrap_or_default();
    let record = rules::counted(record, delta, &limits, now);
    let mut head = rules::key_head(&limits, &record, now, || r.first_of_key(queue, key))?;
    let mut unparked = None;
    if head != record.head {
        if let Some(old) = record.head
            && let Some(job) = r.try_job(old)?
            && rules::in_claim_order(&job)
        {
            r.save(&job, &rules::parked(&job, true))?;
        }
        if let Some(new) = head {
            match r.try_job(new)? {
                Some(job) if !rules::in_claim_order(&job) => {
                    let new = rules::parked(&job, false);
                    r.save(&job, &new)?;
                    unparked = Some(new);
                }
                Some(_) => {}
                None => head = None,
            }
        }
    }
    let record = crate::queue::KeyRecord { head, ..record };
    r.save_limit_key(queue, key, (!record.is_empty()).then_some(&record))?;
    Ok(unparked)
}
