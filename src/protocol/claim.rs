//! Claims: the most urgent claimable jobs of a queue under leases, within its limits.
//!
//! A job is claimable if it is waiting and due, or running with an expired lease (taken
//! over: its attempt ends as the silent holder's, then the job is granted anew if the rules
//! leave it claimable). Of the two kinds, the expired lease goes first when it is at least
//! as urgent ([`rules::takes_over`]); waiting jobs go by priority, then run time, then id.

use super::Records;
use super::attempt::{Stages, expire};
use crate::config::check_terms;
use crate::error::{Error, Result};
use crate::ids::{JobId, LeaseToken, StoreTime};
use crate::input;
use crate::job::{JobRecord, ReclaimPath};
use crate::lease::{Lease, LeaseTerms};
use crate::queue::{QueueLimits, QueueRecord};
use crate::rules::{self, Granted, corrupt_running};

/// Claims up to `n` jobs of `queue` in one transaction, most urgent first.
///
/// While expired leases are about, one at a time, each weighed against the waiting jobs
/// ([`next_claim`]); then the waiting ones, in batches where the engine grants many in one
/// step ([`Records::take_waiting`]) and one at a time where it cannot decide, or where a
/// per-key rate keeps each key's window.
pub(crate) fn claim_batch(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
) -> Result<Vec<Lease>> {
    input::check_claim(queue, worker, &terms)?;
    let look = r.claim_look(queue)?;
    let limited = look
        .record
        .as_ref()
        .is_some_and(|q| q.paused || q.limits.is_limited());
    let rated_keys = look.keyed
        && look
            .record
            .as_ref()
            .is_some_and(|q| q.limits.per_key_rate.is_some());
    if look.expired || limited || look.keyed {
        // What the round's completions change is decided as if they came first.
        r.completions_committed();
    }
    let (record, room) = match limited {
        true => room(r, queue)?,
        // (with no limit, room for any number whatever the time)
        false => (
            look.record.clone(),
            rules::claim_room(None, 0, StoreTime::ZERO),
        ),
    };
    if rated_keys {
        super::keys::reopen(r, queue)?;
    }
    let n = capped(r, queue, record.as_ref(), &room, n);
    let mut leases = Vec::with_capacity(n.min(1024));
    let limits = record.as_ref().map(|q| q.limits).unwrap_or_default();
    // Once no lease has expired, none will within this transaction (a lease it grants ends
    // later than any it finds), so the rest of the batch skips that search.
    let mut expired_left = look.expired;
    while expired_left && leases.len() < n {
        match next_claim(r, queue, worker, terms, &limits, &mut expired_left)? {
            Some(lease) => leases.push(lease),
            None => break,
        }
    }
    while leases.len() < n {
        let taken = match rated_keys {
            true => None,
            false => r.take_waiting(queue, worker, terms, n - leases.len(), &limits, look.keyed)?,
        };
        let Some(taken) = taken else {
            match next_claim(r, queue, worker, terms, &limits, &mut false)? {
                Some(lease) => leases.push(lease),
                None => break,
            }
            continue;
        };
        // rules::grant made them dead: what waits for them learns it in this transaction.
        if !taken.dead.is_empty() {
            super::flow::settle_all(r, &taken.dead)?;
        }
        for &job in &taken.expired {
            super::tell(r, || crate::events::Event::Expired {
                job,
                queue: queue.to_owned(),
            });
        }
        for lease in &taken.leases {
            super::tell(r, || crate::events::Event::Claimed {
                job: lease.job,
                attempt: lease.attempt,
                queue: lease.queue.clone(),
                worker: lease.worker.clone(),
            });
        }
        leases.extend(taken.leases);
        if !taken.more {
            break;
        }
    }
    noted(r, queue, record, leases.len())?;
    Ok(leases)
}

/// A pool's claim over its queues: each queue of `plan` up to its share, in order; then
/// what some could not fill (empty, paused, at a limit) taken by the others that gave all
/// of theirs (or had none to give), in the same order. `claim` claims up to so many jobs of
/// one queue.
fn claim_plan<R: ?Sized>(
    r: &mut R,
    plan: &[(String, usize)],
    mut claim: impl FnMut(&mut R, &str, usize) -> Result<Vec<Lease>>,
) -> Result<Vec<Lease>> {
    let mut leases = Vec::new();
    let (mut short, mut open) = (0, Vec::new());
    for (queue, share) in plan {
        if *share > 0 {
            let got = claim(r, queue, *share)?;
            short += share.saturating_sub(got.len());
            let filled = got.len() >= *share;
            leases.extend(got);
            if !filled {
                continue;
            }
        }
        open.push(queue);
    }
    for queue in open {
        if short == 0 {
            break;
        }
        let got = claim(r, queue, short)?;
        short = short.saturating_sub(got.len());
        leases.extend(got);
    }
    Ok(leases)
}

/// A round's claim, after its completions: [`claim_plan`] of [`claim_batch`]es for
/// `worker` under `terms`, then `marks` (the queues whose served mark is due) marked served.
/// Each queue after the first waits for the completions committing beside the claim
/// ([`Records::completions_committed`]): what the first queue's claim says it has taken is
/// only what it has taken.
pub(crate) fn round_claim(
    r: &mut (impl Records + ?Sized),
    plan: &[(String, usize)],
    worker: &str,
    terms: LeaseTerms,
    marks: &[String],
) -> Result<Vec<Lease>> {
    let mut first = true;
    let claimed = claim_plan(r, plan, |r, queue, n| {
        if !std::mem::take(&mut first) {
            r.completions_committed();
        }
        claim_batch(r, queue, worker, terms, n)
    })?;
    r.mark_served(marks)?;
    Ok(claimed)
}

/// The next claim of a batch, inputs checked and room counted, under the queue's `limits`.
/// Looks for expired leases only while `expired_left`, and clears it once it finds none.
pub(crate) fn next_claim(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    limits: &QueueLimits,
    expired_left: &mut bool,
) -> Result<Option<Lease>> {
    let mut parked = None;
    loop {
        let expired = match expired_left {
            true => next_expired(r, queue)?,
            false => None,
        };
        *expired_left = expired.is_some();
        let now = r.now()?;
        let ready = r.next_ready(queue, now)?;
        let job = match (ready, expired) {
            (None, None) => return Ok(None),
            (Some((p, id)), Some(expired)) if !rules::takes_over(&expired, Some(p)) => {
                waiting(r, id)?
            }
            (Some((_, id)), None) => waiting(r, id)?,
            (_, Some(expired)) => {
                let (taken, _) = expire(r, &expired, ReclaimPath::Takeover, &Stages::default())?;
                if !rules::claimable(&taken, r.now()?) || taken.limit.is_some() {
                    // Out of budget or cancelled (now terminal), or timed out and waiting
                    // out its backoff: the next candidate. (One with a limit key is back
                    // in its key's order, where its key's head is the next candidate.)
                    continue;
                }
                taken
            }
        };
        if !super::keys::has_room(r, &job, limits)? {
            // Its key is at its limit (lowered since it became its head): parked now. An
            // index that still names it is damaged, and would be met again and again.
            if parked.replace(job.id) == Some(job.id) {
                return Err(Error::Corrupt(format!(
                    "job {} stays in the claim order after it was parked",
                    job.id
                )));
            }
            continue;
        }
        if let Some(lease) = grant(r, &job, worker, terms)? {
            return Ok(Some(lease));
        }
        // Its attempt counter was exhausted and it is now dead, or its expiry had come and it
        // is now expired: the next candidate.
    }
}

/// The record of a job a search named: its absence is corruption.
fn waiting(r: &mut (impl Records + ?Sized), id: JobId) -> Result<JobRecord> {
    r.job(id)?
        .ok_or_else(|| Error::Corrupt(format!("an index names job {id}, which has no record")))
}

/// The running job of `queue` whose lease expired first, if any has: by the real expiry,
/// ties by job id. Only an index entry in its real place counts: one that lags a renewal is
/// caught up on the way (and looked at again there), so a renewed lease never goes ahead of
/// one that expired before it.
pub(crate) fn next_expired(
    r: &mut (impl Records + ?Sized),
    queue: &str,
) -> Result<Option<JobRecord>> {
    loop {
        let now = r.now()?;
        let Some(id) = r.first_indexed_expiry(queue, now)? else {
            return Ok(None);
        };
        let job = waiting(r, id)?;
        if rules::expiry_in_place(&job) && rules::lease_expired(&job, now) {
            return Ok(Some(job));
        }
        catch_up(r, &job)?;
    }
}

/// Moves a renewed lease's index entry up to its real expiry (it lags a renewal by design,
/// see [`crate::job::LeaseRecord`]).
pub(crate) fn catch_up(r: &mut (impl Records + ?Sized), job: &JobRecord) -> Result<()> {
    let mut moved = job.clone();
    match moved.lease.as_mut() {
        Some(lease) => lease.indexed_expiry = lease.expires_at,
        None => return Err(corrupt_running(job)),
    }
    r.save(job, &moved)
}

/// What a claim of `queue` may take now ([`rules::claim_room`]), and the queue's record. A
/// queue with a concurrency limit has its expired leases taken back first: a lease that ran
/// out holds no slot, and its holder's late renewal must not take one back from the claim
/// that filled it.
pub(crate) fn room(
    r: &mut (impl Records + ?Sized),
    queue: &str,
) -> Result<(Option<QueueRecord>, rules::Room)> {
    let mut record = r.queue(queue, false)?;
    if record.as_ref().is_some_and(rules::counts_claims) {
        // Held, so that the claims of every process and machine count its slots one at a
        // time.
        record = r.queue(queue, true)?;
    }
    let mut running = 0;
    if record.as_ref().is_some_and(rules::takes_back_first) {
        while let Some(job) = next_expired(r, queue)? {
            expire(r, &job, ReclaimPath::Takeover, &Stages::default())?;
        }
        running = r.running(queue)?;
    }
    let room = rules::claim_room(record.as_ref(), running, r.now()?);
    Ok((record, room))
}

/// How many of `n` jobs a claim of `queue` may take with `room`: fewer where its limits
/// hold it back (told as [`crate::Event::LimitReached`]; a paused queue reached none).
pub(crate) fn capped(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    record: Option<&QueueRecord>,
    room: &rules::Room,
    n: usize,
) -> usize {
    if room.allowed < n && record.is_some_and(|q| !q.paused) {
        super::tell(r, || crate::events::Event::LimitReached {
            queue: queue.to_owned(),
        });
    }
    n.min(room.allowed)
}

/// Keeps `claimed` claims of `queue` in its rate window, if it has a rate limit.
pub(crate) fn noted(
    r: &mut (impl Records + ?Sized),
    queue: &str,
    record: Option<QueueRecord>,
    claimed: usize,
) -> Result<()> {
    match record {
        Some(rec) if claimed > 0 && rec.limits.rate.is_some() => {
            let now = r.now()?;
            r.save_queue(queue, &rules::note_claims(&rec, claimed, now))
        }
        _ => Ok(()),
    }
}

/// Claims one named job if it is claimable now: waiting and due, or running with an expired
/// lease. The conditional update of the seed design:
/// `UPDATE jobs SET state='running', attempt=attempt+1, ... WHERE id=? AND (state='queued'
/// OR (state='running' AND lease_expires_at <= now))`.
pub(crate) fn claim_job(
    r: &mut (impl Records + ?Sized),
    id: JobId,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    input::check_worker(worker)?;
    check_terms(&terms)?;
    let job = r.job(id)?.ok_or(Error::JobNotFound(id))?;
    let now = r.now()?;
    if !rules::claimable(&job, now) && !rules::lease_expired(&job, now) {
        return Ok(None);
    }
    let (record, room) = room(r, &job.queue)?;
    if capped(r, &job.queue, record.as_ref(), &room, 1) == 0 {
        return Ok(None);
    }
    // (taking back the queue's expired leases may have made this one claimable)
    let job = r.job(id)?.ok_or(Error::JobNotFound(id))?;
    let job = match rules::lease_expired(&job, r.now()?) {
        true => expire(r, &job, ReclaimPath::Takeover, &Stages::default())?.0,
        false => job,
    };
    let limits = record.as_ref().map(|q| q.limits).unwrap_or_default();
    if !rules::claimable(&job, r.now()?) || !super::keys::has_room(r, &job, &limits)? {
        return Ok(None);
    }
    let lease = grant(r, &job, worker, terms)?;
    noted(r, &job.queue, record, usize::from(lease.is_some()))?;
    Ok(lease)
}

/// Starts a new attempt of the waiting `job` under a lease for `worker` ([`rules::grant`]). A
/// job whose attempt counter is exhausted is dead instead, and one past its expiry expired
/// (`None`).
fn grant(
    r: &mut (impl Records + ?Sized),
    job: &JobRecord,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    let now = r.now()?;
    let new = match rules::grant(job, worker, terms, now, LeaseToken::fresh()) {
        Granted::Exhausted(ended) | Granted::Expired(ended) => {
            let ended = super::keys::save(r, job, &ended)?;
            super::flow::settle(r, &ended)?;
            super::expired(r, &ended);
            return Ok(None);
        }
        Granted::Lease(new) => new,
    };
    super::keys::save(r, job, &new)?;
    let Some(granted) = new.lease.as_ref() else {
        return Err(corrupt_running(&new));
    };
    let (expires_at, deadline) = (granted.expires_at, granted.deadline);
    let payload = r.payload(new.id)?;
    super::tell(r, || crate::events::Event::Claimed {
        job: new.id,
        attempt: new.attempt,
        queue: new.queue.clone(),
        worker: worker.to_owned(),
    });
    Ok(Some(Lease {
        job: new.id,
        attempt: new.attempt,
        token: new.token,
        queue: new.queue,
        worker: worker.to_owned(),
        claimed_at: now,
        due_at: job.run_at,
        expires_at,
        length: terms.length,
        deadline,
        payload,
    }))
}
