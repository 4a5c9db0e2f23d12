//! Limits per key: how many of one key's jobs may run, and which of its waiting jobs stands
//! in the claim order.
//!
//! A queue's per-key limit ([`crate::QueueLimits::per_key`]) is kept by a record per key
//! ([`KeyRecord`]): its running jobs, counted as they start and end, and its *head*. Of a
//! key's waiting jobs only the head is in the ready index; the others are parked, and so is
//! the head while the key is at its limit. So a claim never meets a job of a key at its
//! limit (no scan past a tenant's backlog: the index holds at most one entry per key), and a
//! claim of a key's head makes the next one its head in the same transaction. The limit
//! itself is kept by the count, checked at every grant ([`key_has_room`]): a head is where
//! claims look, never what allows them.

use crate::ids::JobId;
use crate::ids::StoreTime;
use crate::job::JobRecord;
use crate::queue::{KeyRecord, QueueLimits, Rate};
use crate::state::JobState;
use crate::stats::Stats;

/// Whether one more of a key's jobs may start at `now` under `limits`, with `record` as it
/// stands: fewer of them run than the per-key limit, and fewer were claimed in the per-key
/// rate's window than it allows.
pub(crate) fn key_has_room(limits: &QueueLimits, record: &KeyRecord, now: StoreTime) -> bool {
    let in_window = |rate: &Rate| {
        let recent = record
            .recent
            .iter()
            .filter(|t| t.saturating_add(rate.per) > now);
        recent.count() < rate.claims as usize
    };
    limits.per_key.is_none_or(|n| record.running < n)
        && limits.per_key_rate.as_ref().is_none_or(in_window)
}

/// Counts into `stats`'s queues (their limits noted first) each queue's keys at their limit
/// at `stats.now` and its parked jobs, from each key's record (`keys`: queue and record, the
/// empty ones left out) and how many jobs with a limit key wait in each queue
/// (`keyed_waiting`): of a key's waiting jobs only its head is in the claim order, so the
/// rest of them are parked.
pub(crate) fn count_keys(
    stats: &mut Stats,
    keys: impl IntoIterator<Item = (String, KeyRecord)>,
    keyed_waiting: impl IntoIterator<Item = (String, u64)>,
) {
    let now = stats.now;
    for (queue, n) in keyed_waiting {
        stats.queues.entry(queue).or_default().parked += n;
    }
    for (queue, record) in keys {
        let counts = stats.queues.entry(queue).or_default();
        if record.head.is_some() {
            counts.parked = counts.parked.saturating_sub(1);
        }
        if !record.is_empty() && !key_has_room(&counts.limits, &record, now) {
            counts.keys_at_limit += 1;
        }
    }
}

/// How a change of a keyed job from `old` (`None`: new) to `new` moves its key: the change in
/// its running count, if it may move its head.
pub(crate) fn key_moved(old: Option<&JobRecord>, new: &JobRecord) -> Option<i64> {
    let running = |j: Option<&JobRecord>| j.is_some_and(|j| j.state == JobState::Running);
    let waits = |j: Option<&JobRecord>| j.is_some_and(|j| j.state.is_waiting());
    let delta = i64::from(running(Some(new))) - i64::from(running(old));
    let place = |j: Option<&JobRecord>| j.map(|j| (j.state.is_waiting(), j.run_at));
    let moved = delta != 0
        || waits(old) != waits(Some(new))
        || (waits(old) && place(old) != place(Some(new)));
    moved.then_some(delta)
}

/// A keyed job as it is to be stored after `old` (`None`: new) became `new`: one that comes
/// to wait is parked until its key makes it its head ([`key_head`]); any other is as given.
pub(crate) fn parked_on_arrival(old: Option<&JobRecord>, new: &JobRecord) -> Option<JobRecord> {
    let limit = new.limit.as_ref()?;
    let arrives = new.state.is_waiting() && old.is_none_or(|o| !o.state.is_waiting());
    (arrives && !limit.parked).then(|| parked(new, true))
}

/// The key's record at `now` with `delta` more running jobs (a job comes to run only by a
/// claim, so each is a claim its rate window keeps while the window lasts), and when its
/// window has room again if it has none now.
pub(crate) fn counted(
    record: KeyRecord,
    delta: i64,
    limits: &QueueLimits,
    now: StoreTime,
) -> KeyRecord {
    let running = i64::from(record.running).saturating_add(delta).max(0);
    let mut new = KeyRecord {
        running: u32::try_from(running).unwrap_or(u32::MAX),
        ..record
    };
    match limits.per_key_rate {
        Some(rate) => {
            new.recent.retain(|t| t.saturating_add(rate.per) > now);
            let claims = usize::try_from(delta.max(0)).unwrap_or(0);
            new.recent.extend(std::iter::repeat_n(now, claims));
            new.opens_at = (new.recent.len() >= rate.claims as usize)
                .then(|| new.recent.first().map(|t| t.saturating_add(rate.per)))
                .flatten();
        }
        None => {
            new.recent.clear();
            new.opens_at = None;
        }
    }
    new
}

/// The key's head: its first waiting job in the key's order (run time, then id; `first`
/// finds it, asked only then), while the key has room under `limits`; none while it is at
/// its limit. Within a key jobs go in the order they fall due, so the head is always the
/// first of them to be claimable and no job of a key waits behind one that is not due.
pub(crate) fn key_head<E>(
    limits: &QueueLimits,
    record: &KeyRecord,
    now: StoreTime,
    first: impl FnOnce() -> Result<Option<JobId>, E>,
) -> Result<Option<JobId>, E> {
    match key_has_room(limits, record, now) {
        true => first(),
        false => Ok(None),
    }
}

/// `job` parked (out of the claim order) or not.
pub(crate) fn parked(job: &JobRecord, parked: bool) -> JobRecord {
    let mut new = job.clone();
    if let Some(limit) = new.limit.as_mut() {
        limit.parked = parked;
    }
    new
}

/// Whether `job` stands in the claim order: waiting, and unkeyed or its key's head.
pub(crate) fn in_claim_order(job: &JobRecord) -> bool {
    job.state.is_waiting() && job.limit.as_ref().is_none_or(|l| !l.parked)
}

/// Whether `new` gives its queue a job in the claim order that `old` (`None`: new) did not,
/// or moves one there: the queue's idle workers are to be woken.
pub(crate) fn readies(old: Option<&JobRecord>, new: &JobRecord) -> bool {
    let place = |j: &JobRecord| (in_claim_order(j), j.run_at, j.priority);
    in_claim_order(new) && old.is_none_or(|o| place(o) != place(new))
}
