//! What a queue's record allows: the room a claim has (pause, concurrency, rate), and the
//! record after a claim, a pause, new limits or a worker's visit.

use crate::error::Error;
use crate::ids::StoreTime;
use crate::input;
use crate::queue::{QueueLimits, QueueRecord};
use crate::retry::RetryPolicy;

/// What a claim may take of a queue now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    /// How many of its jobs (`usize::MAX`: no limit).
    pub allowed: usize,
    /// When there is none, when to look again: the end of a rate window, or soon for a full
    /// queue (a holder in another process or machine may finish any moment); `None` while
    /// paused (a resume wakes the waiters).
    pub more_at: Option<StoreTime>,
}

/// How soon a waiting pool looks again at a queue whose concurrency limit is full.
pub(crate) const FULL_QUEUE_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a claim may take at `now` of a queue with `record` (`None`: never paused or
/// limited) and `running` of its jobs held: nothing while it is paused; else what its
/// concurrency limit leaves (the engine takes back its expired leases first, so a lease
/// that ran out holds no slot) and what its rate limit's window leaves.
pub(crate) fn claim_room(record: Option<&QueueRecord>, running: u64, now: StoreTime) -> Room {
    let mut room = Room {
        allowed: usize::MAX,
        more_at: None,
    };
    let Some(record) = record else {
        return room;
    };
    if record.paused {
        room.allowed = 0;
        return room;
    }
    if let Some(limit) = record.limits.concurrency {
        let free = u64::from(limit).saturating_sub(running);
        room.allowed = room
            .allowed
            .min(usize::try_from(free).unwrap_or(usize::MAX));
        if free == 0 {
            room.more_at = Some(now.saturating_add(FULL_QUEUE_LOOK));
        }
    }
    if let Some(rate) = record.limits.rate {
        let in_window: Vec<StoreTime> = record
            .recent_claims
            .iter()
            .copied()
            .filter(|t| t.saturating_add(rate.per) > now)
            .collect();
        let free = (rate.claims as usize).saturating_sub(in_window.len());
        room.allowed = room.allowed.min(free);
        if free == 0 {
            let ends = in_window
                .first()
                .map_or(now, |oldest| oldest.saturating_add(rate.per));
            room.more_at = Some(room.more_at.map_or(ends, |at| at.max(ends)));
        }
    }
    room
}

/// Whether claims of a queue with `record` count its slots or its rate window, so that the
/// claims of every process and machine must take its record one at a time.
pub(crate) fn counts_claims(record: &QueueRecord) -> bool {
    !record.paused && record.limits.is_limited()
}

/// Whether a claim of a queue with `record` takes its expired leases back before it counts
/// the running jobs: with a concurrency limit, a lease that ran out holds no slot, and its
/// holder's late renewal must not take one back from the claim that filled it.
pub(crate) fn takes_back_first(record: &QueueRecord) -> bool {
    !record.paused && record.limits.concurrency.is_some()
}

/// The queue's record once a worker has asked it for work (or renewed one of its leases) at
/// `now`: served then, never earlier than a mark already kept (see [`crate::queue`]).
pub(crate) fn served(record: Option<QueueRecord>, now: StoreTime) -> QueueRecord {
    let mut new = record.unwrap_or_default();
    new.served_at = Some(new.served_at.map_or(now, |at| at.max(now)));
    new
}

/// The queue's record after `n` claims at `now`: with a rate limit, each claim's time is
/// kept while its window lasts.
pub(crate) fn note_claims(record: &QueueRecord, n: usize, now: StoreTime) -> QueueRecord {
    let mut new = record.clone();
    if let Some(rate) = record.limits.rate {
        new.recent_claims
            .retain(|t| t.saturating_add(rate.per) > now);
        new.recent_claims.extend(std::iter::repeat_n(now, n));
    }
    new
}

/// When a waiting pool should look at a queue again at `now`: when its next waiting job
/// (`waiting`: the earliest run time of one in the claim order) or lease expiry (`expiry`:
/// the earliest indexed one) falls due, or a limit key's rate window opens again (`gate`:
/// the earliest, when its parked jobs may have a head); but while the queue has no room
/// for a claim (paused, full, its rate spent: see [`claim_room`], with `record` and
/// `running` as there), only when there may be room, whatever its keys' windows say.
pub(crate) fn next_look(
    record: Option<&QueueRecord>,
    running: u64,
    now: StoreTime,
    waiting: Option<StoreTime>,
    expiry: Option<StoreTime>,
    gate: Option<StoreTime>,
) -> Option<StoreTime> {
    let room = claim_room(record, running, now);
    match room.allowed {
        0 => room.more_at,
        _ => waiting.into_iter().chain(expiry).chain(gate).min(),
    }
}

/// The record of a queue paused (or resumed).
pub(crate) fn paused(record: Option<&QueueRecord>, paused: bool) -> QueueRecord {
    let mut new = record.cloned().unwrap_or_default();
    new.paused = paused;
    new
}

/// The record of a queue with a new retry policy for its jobs that have none (checked), or
/// none (`None`: its jobs wait by the store's).
pub(crate) fn with_retry(
    record: Option<&QueueRecord>,
    retry: Option<RetryPolicy>,
) -> Result<QueueRecord, Error> {
    if let Some(policy) = &retry {
        policy
            .check()
            .map_err(crate::error::InputError::RetryPolicy)?;
    }
    let mut new = record.cloned().unwrap_or_default();
    new.retry = retry;
    Ok(new)
}

/// The record of a queue with new limits (checked); the rate window's claims are kept, so
/// a new rate counts the claims already made in its window.
pub(crate) fn limited(
    record: Option<&QueueRecord>,
    limits: QueueLimits,
) -> Result<QueueRecord, Error> {
    input::check_limits(&limits)?;
    let mut new = record.cloned().unwrap_or_default();
    new.limits = limits;
    if limits.rate.is_none() {
        new.recent_claims.clear();
    }
    Ok(new)
}
