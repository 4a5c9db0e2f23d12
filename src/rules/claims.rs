//! Claims: the claim order, which jobs are claimable, and a new attempt granted.

use super::*;
use crate::ids::{LeaseToken, StoreTime};
use crate::job::{JobRecord, LeaseRecord};
use crate::lease::LeaseTerms;
use crate::state::JobState;

/// Whether a lease that expired is taken over before the most urgent due waiting job (of
/// priority `ready`, if there is one): when it is at least as urgent. An expired lease is a
/// job that was already due, so at equal priority it goes first.
pub(crate) fn takes_over(expired: &JobRecord, ready: Option<i32>) -> bool {
    ready.is_none_or(|priority| expired.priority <= priority)
}

/// Whether a running job's expiry index entry stands at its lease's real expiry. Only such
/// an entry counts when looking for the lease that expired first: one that lags a renewal
/// (see [`LeaseRecord`]) is caught up and looked at again there, so a renewed lease never
/// goes ahead of one that expired before it.
pub(crate) fn expiry_in_place(job: &JobRecord) -> bool {
    job.lease
        .as_ref()
        .is_some_and(|l| l.indexed_expiry == l.expires_at)
}

/// Whether `job` runs under a lease that has expired at `now`.
pub(crate) fn lease_expired(job: &JobRecord, now: StoreTime) -> bool {
    job.state == JobState::Running && job.lease.as_ref().is_some_and(|l| l.expires_at <= now)
}

/// Whether a waiting `job` may be claimed at `now`.
pub(crate) fn claimable(job: &JobRecord, now: StoreTime) -> bool {
    job.state.is_waiting() && job.run_at <= now
}

/// Whether no attempt of `job` may start at `now`: its expiry has come
/// ([`crate::NewJob::expires_in`]).
pub(crate) fn past_expiry(job: &JobRecord, now: StoreTime) -> bool {
    job.expires_at.is_some_and(|at| at <= now)
}

/// Whether `job` waits (queued, backing off or blocked) past its expiry at `now`: the jobs
/// [`expired`] ends.
pub(crate) fn waits_past_expiry(job: &JobRecord, now: StoreTime) -> bool {
    let waits = job.state.is_waiting() || job.state == JobState::Blocked;
    waits && past_expiry(job, now)
}

/// `job` ended as expired at `now`, if it waits past its expiry ([`waits_past_expiry`]);
/// `None` for any other job (a running attempt runs to its end; its job expires at its next
/// claim).
pub(crate) fn expired(job: &JobRecord, now: StoreTime) -> Option<JobRecord> {
    waits_past_expiry(job, now).then(|| {
        let mut new = job.clone();
        finish(&mut new, JobState::Expired, now);
        new
    })
}

/// What a grant made of a waiting job.
pub(crate) enum Granted {
    /// A new attempt under a lease.
    Lease(JobRecord),
    /// Its attempt counter is exhausted: no fence could tell a new attempt from the last, so
    /// it is dead instead, with the reason as its last error.
    Exhausted(JobRecord),
    /// Its expiry has come: it is expired instead, and never runs again.
    Expired(JobRecord),
}

/// Starts a new attempt of the waiting `job` under a lease for `worker` at `now`, the lease
/// drawn as `token` (fresh for each grant: see [`crate::LeaseToken`]).
pub(crate) fn grant(
    job: &JobRecord,
    worker: &str,
    terms: LeaseTerms,
    now: StoreTime,
    token: LeaseToken,
) -> Granted {
    if let Some(expired) = expired(job, now) {
        return Granted::Expired(expired);
    }
    let Some(attempt) = job.attempt.next() else {
        let mut dead = job.clone();
        finish(&mut dead, JobState::Dead, now);
        dead.last_error = Some(ATTEMPTS_EXHAUSTED.to_owned());
        return Granted::Exhausted(dead);
    };
    let deadline = job
        .time_limit
        .or(terms.time_limit)
        .map(|limit| now.saturating_add(limit));
    let expires_at = capped(now.saturating_add(terms.length), deadline);
    let mut new = job.clone();
    new.state = JobState::Running;
    new.attempt = attempt;
    new.token = token;
    new.lease = Some(LeaseRecord {
        owner: worker.to_owned(),
        claimed_at: now,
        expires_at,
        indexed_expiry: expires_at,
        length: terms.length,
        stall_timeout: terms.stall_timeout,
        deadline,
    });
    new.progress = 0;
    new.progress_at = now;
    new.updated_at = now;
    Granted::Lease(new)
}

/// A lease's expiry, never past the attempt's deadline: a holder that goes silent after the
/// deadline loses the job then, not a lease later.
pub(super) fn capped(expires_at: StoreTime, deadline: Option<StoreTime>) -> StoreTime {
    deadline.map_or(expires_at, |d| expires_at.min(d))
}
