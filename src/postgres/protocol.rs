//! The lease protocol in SQL, readable in one place: each step is a function over one
//! PostgreSQL transaction, and every time it reads or writes is the database's clock
//! (`clock_timestamp()`, not `now()`, which is the transaction's start), taken
//! once per statement (the `c` CTE) so that a statement sees one
//! instant.
//!
//! The rules are [`crate::protocol`]'s: a claim takes a job only if it is waiting and due, or
//! running with an expired lease (taken over first, its attempt recorded as
//! `LeaseExpired { Takeover }`); every claim increments `attempt`; a fenced write matches
//! `id AND attempt AND state = 'running'` and must change exactly one row, and a refusal
//! changes nothing but a counter; an attempt ends in one place ([`end_attempt`]), which
//! writes its history row.

use std::time::Duration;

use postgres::Transaction;
use postgres::types::ToSql;

use super::rows::{Col, attempt, clamp, id, job_by, job_columns, key, micros, time, us};
use super::{PgError, Prepared, Settings};
use crate::error::{Error, LeaseLost, Result};
use crate::ids::{Attempt, JobId, StoreTime};
use crate::input;
use crate::job::{JobRecord, JobState, NewJob, Outcome, ReclaimPath};
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::report::Reclaim;
use crate::retry::{self, Next};

type Tx<'a, 'b> = &'a mut Transaction<'b>;

const NOW: &str = "SELECT {s}.us({now})";

/// The store's clock: the database's.
pub(crate) fn now(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<StoreTime> {
    let st = p.get(tx, NOW)?;
    Ok(time(tx.query_one(&st, &[])?.col(0)?))
}

// ----- enqueue -----

const INSERT: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
INSERT INTO {s}.leasehold_jobs
    (queue, state, priority, max_attempts, unique_key, created_at, run_at, progress_at,
     updated_at, payload)
SELECT $1, 'queued', $2, $3, $4, c.t, c.t + $5::bigint * interval '1 microsecond', c.t, c.t, $6 FROM c
ON CONFLICT (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running', 'retry_wait')
    DO NOTHING
RETURNING id";

const LIVE_KEY_HOLDER: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE queue = $1 AND unique_key = $2 AND state IN ('queued', 'running', 'retry_wait')";

/// Enqueues a job; with a unique key that a live job holds, returns that job instead.
pub(crate) fn enqueue(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    new: &NewJob,
) -> Result<JobId> {
    check_new_job(s, new)?;
    let max_attempts = i64::from(new.max_attempts.unwrap_or(s.default_max_attempts));
    // A live job holding the key is the answer. Looked up first rather than left to the
    // INSERT's conflict, which would spend a value of the id sequence for nothing.
    if new.unique_key.is_some() {
        let holder = p.get(tx, LIVE_KEY_HOLDER)?;
        if let Some(row) = tx.query_opt(&holder, &[&new.queue, &new.unique_key])? {
            return Ok(id(row.col(0)?));
        }
    }
    let insert = p.get(tx, INSERT)?;
    let delay = micros(new.delay);
    let params: [&(dyn ToSql + Sync); 6] = [
        &new.queue,
        &new.priority,
        &max_attempts,
        &new.unique_key,
        &delay,
        &new.payload,
    ];
    if let Some(row) = tx.query_opt(&insert, &params)? {
        notify(tx, p, &new.queue)?;
        return Ok(id(row.col(0)?));
    }
    // The key is held by a live job: that one is the answer.
    let holder = p.get(tx, LIVE_KEY_HOLDER)?;
    match tx.query_opt(&holder, &[&new.queue, &new.unique_key])? {
        Some(row) => Ok(id(row.col(0)?)),
        None => Err(PgError::Database {
            code: None,
            message: "a unique key conflicted with a job that then could not be found".into(),
            transient: true,
        }
        .into()),
    }
}

fn check_new_job(s: &Settings, new: &NewJob) -> Result<()> {
    Ok(input::check_new_job(new, s.max_payload)?)
}

// ----- claim -----

/// Moves a renewed lease's index entry up to its real expiry (it lags a renewal by design).
const CATCH_UP: &str =
    "UPDATE {s}.leasehold_jobs SET lease_indexed_expiry = lease_expires_at WHERE id = $1";

/// The earliest indexed expiry of the queue that has passed (the candidate for takeover).
const FIRST_EXPIRED: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE queue = $1 AND state = 'running' AND lease_indexed_expiry <= {now}
ORDER BY lease_indexed_expiry, id
LIMIT 1
FOR UPDATE SKIP LOCKED";

/// The most urgent due waiting job of the queue.
const FIRST_READY: &str = "
SELECT id, priority FROM {s}.leasehold_jobs
WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND run_at <= {now}
    AND attempt < 4294967295
ORDER BY priority, run_at, id
LIMIT 1
FOR UPDATE SKIP LOCKED";

const CLAIM: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
picked AS (
    SELECT id FROM {s}.leasehold_jobs, c
    WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND run_at <= c.t
        AND attempt < 4294967295
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {s}.leasehold_jobs j
SET state = 'running', attempt = j.attempt + 1, lease_owner = $3, lease_claimed_at = c.t,
    lease_expires_at = c.t + $4::bigint * interval '1 microsecond',
    lease_indexed_expiry = c.t + $4::bigint * interval '1 microsecond',
    lease_length_us = $4::bigint, stall_timeout_us = $5::bigint, progress = 0, progress_at = c.t,
    updated_at = c.t
FROM picked, c
WHERE j.id = picked.id
RETURNING j.id, j.attempt, {s}.us(c.t), {s}.us(j.lease_expires_at), j.payload, j.priority,
    {s}.us(j.run_at)";

/// Claims up to `n` jobs of `queue`, most urgent first, as [`crate::protocol::claim_batch`]
/// does: a job is taken if it is waiting and due, or running with an expired lease (taken
/// over), the expired one first when its priority is at least as urgent. While no lease of
/// the queue has expired (nearly always), the whole batch is one statement.
pub(crate) fn claim_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
) -> Result<Vec<Lease>> {
    input::check_queue(queue)?;
    input::check_worker(worker)?;
    crate::config::check_terms(&terms)?;
    let mut leases = Vec::new();
    // One at a time while expired leases are about, each weighed against the ready jobs.
    while leases.len() < n {
        let Some(expired) = first_expired(tx, p, queue)? else {
            break;
        };
        let ready = p.get(tx, FIRST_READY)?;
        let ready = match tx.query_opt(&ready, &[&queue])? {
            Some(r) => Some((r.col::<i64>(0)?, r.col::<i32>(1)?)),
            None => None,
        };
        let take_over = match ready {
            None => true,
            Some((_, priority)) => expired.priority <= priority,
        };
        let job = match (take_over, ready) {
            (false, Some((ready, _))) => ready,
            _ => {
                let now = now(tx, p)?;
                if !expire(tx, p, s, &expired, ReclaimPath::Takeover, now)?
                    .now
                    .is_waiting()
                {
                    continue; // out of budget or cancelled: now terminal; the next candidate
                }
                key(expired.id)
            }
        };
        match grant(tx, p, JobId(job as u64), worker, terms)? {
            Some(lease) => leases.push(lease),
            // Due a moment ago by the same predicate: cannot happen; never loop on it.
            None => break,
        }
    }
    if leases.len() == n {
        return Ok(leases);
    }
    let claim = p.get(tx, CLAIM)?;
    let limit = i64::try_from(n - leases.len()).unwrap_or(i64::MAX);
    let (length, stall) = (micros(terms.length), terms.stall_timeout.map(micros));
    let rows = tx.query(&claim, &[&queue, &limit, &worker, &length, &stall])?;
    let mut claimed = Vec::with_capacity(rows.len());
    for r in &rows {
        let order = (r.col::<i32>(5)?, r.col::<i64>(6)?, r.col::<i64>(0)?);
        let lease = Lease {
            job: id(r.col(0)?),
            attempt: attempt(r.col(1)?)?,
            queue: queue.to_owned(),
            worker: worker.to_owned(),
            claimed_at: time(r.col(2)?),
            expires_at: time(r.col(3)?),
            length: terms.length,
            payload: r.col(4)?,
        };
        claimed.push((order, lease));
    }
    claimed.sort_by_key(|(order, _)| *order);
    leases.extend(claimed.into_iter().map(|(_, lease)| lease));
    Ok(leases)
}

/// The queue's running job with the earliest indexed expiry that has really expired (its
/// row locked), moving up the index entries of renewed leases met on the way.
fn first_expired(tx: Tx<'_, '_>, p: &mut Prepared<'_>, queue: &str) -> Result<Option<JobRecord>> {
    loop {
        let st = p.get(tx, FIRST_EXPIRED)?;
        let Some(row) = tx.query_opt(&st, &[&queue])? else {
            return Ok(None);
        };
        let Some(record) = load(tx, p, id(row.col(0)?))? else {
            return Ok(None);
        };
        // Only an entry in its real place counts: one that lags a renewal is caught up and
        // looked at again there, so a renewed lease never goes ahead of one that expired
        // before it (redb's rule, `search::next_expired`).
        let now = now(tx, p)?;
        let in_place = record
            .lease
            .as_ref()
            .is_some_and(|l| l.indexed_expiry == l.expires_at);
        if in_place && record.lease.as_ref().is_some_and(|l| l.expires_at <= now) {
            return Ok(Some(record));
        }
        let catch_up = p.get(tx, CATCH_UP)?;
        tx.execute(&catch_up, &[&key(record.id)])?;
    }
}

/// Starts a new attempt of the waiting job `job` under a lease for `worker`, if it is due.
fn grant(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    let st = p.get(tx, GRANT)?;
    let (length, stall) = (micros(terms.length), terms.stall_timeout.map(micros));
    tx.query_opt(&st, &[&key(job), &worker, &length, &stall])?
        .map(|r| {
            Ok(Lease {
                job: id(r.col(0)?),
                attempt: attempt(r.col(1)?)?,
                queue: r.col(5)?,
                worker: worker.to_owned(),
                claimed_at: time(r.col(2)?),
                expires_at: time(r.col(3)?),
                length: terms.length,
                payload: r.col(4)?,
            })
        })
        .transpose()
}

const GRANT: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
UPDATE {s}.leasehold_jobs j
SET state = 'running', attempt = j.attempt + 1, lease_owner = $2, lease_claimed_at = c.t,
    lease_expires_at = c.t + $3::bigint * interval '1 microsecond',
    lease_indexed_expiry = c.t + $3::bigint * interval '1 microsecond',
    lease_length_us = $3::bigint, stall_timeout_us = $4::bigint, progress = 0, progress_at = c.t,
    updated_at = c.t
FROM c
WHERE j.id = $1 AND j.state IN ('queued', 'retry_wait') AND j.run_at <= c.t
    AND j.attempt < 4294967295
RETURNING j.id, j.attempt, {s}.us(c.t), {s}.us(j.lease_expires_at), j.payload, j.queue";

/// Claims one named job if it is claimable now: waiting and due, or running with an expired
/// lease (taken over first). The seed design's conditional update.
pub(crate) fn claim_job(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    input::check_worker(worker)?;
    crate::config::check_terms(&terms)?;
    if load(tx, p, job)?.is_none() {
        return Err(Error::JobNotFound(job));
    }
    expire_or_catch_up(tx, p, s, &[key(job)], ReclaimPath::Takeover)?;
    grant(tx, p, job, worker, terms)
}

// ----- heartbeat -----

const RENEW: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
UPDATE {s}.leasehold_jobs j
SET lease_expires_at = greatest(j.lease_expires_at,
        c.t + j.lease_length_us * interval '1 microsecond'),
    progress = $3,
    progress_at = CASE WHEN j.progress = $3 THEN j.progress_at ELSE c.t END,
    updated_at = c.t
FROM c
WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running' AND NOT j.cancel_requested
    AND NOT (j.stall_timeout_us IS NOT NULL AND j.progress = $3
             AND c.t - j.progress_at >= j.stall_timeout_us * interval '1 microsecond')
RETURNING {s}.us(j.lease_expires_at)";

const RENEW_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
r AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS r(id, attempt, progress))
UPDATE {s}.leasehold_jobs j
SET lease_expires_at = greatest(j.lease_expires_at,
        c.t + j.lease_length_us * interval '1 microsecond'),
    progress = r.progress,
    progress_at = CASE WHEN j.progress = r.progress THEN j.progress_at ELSE c.t END,
    updated_at = c.t
FROM c, r
WHERE j.id = r.id AND j.attempt = r.attempt AND j.state = 'running' AND NOT j.cancel_requested
    AND NOT (j.stall_timeout_us IS NOT NULL AND j.progress = r.progress
             AND c.t - j.progress_at >= j.stall_timeout_us * interval '1 microsecond')
RETURNING j.id, j.attempt, {s}.us(j.lease_expires_at)";

/// Renews the lease by its length from now if the caller still holds it, storing progress;
/// a cancel requested meanwhile, or a stall, ends the attempt instead and says so.
pub(crate) fn heartbeat(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    progress: u64,
) -> Result<Renewal> {
    match renew(tx, p, job, at, progress)? {
        Some(expires_at) => Ok(Renewal::Renewed { expires_at }),
        None => not_renewed(tx, p, s, job, at, progress),
    }
}

/// The renewal statement for one lease: the new expiry, or `None` if it changed no row.
fn renew(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    progress: u64,
) -> Result<Option<StoreTime>> {
    let st = p.get(tx, RENEW)?;
    match tx.query_opt(&st, &[&key(job), &i64::from(at.0), &clamp(progress)])? {
        Some(row) => Ok(Some(time(row.col(0)?))),
        None => Ok(None),
    }
}

/// Renews many leases in one statement; each answer as [`heartbeat`] would give it.
pub(crate) fn heartbeat_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    leases: &[(JobId, Attempt, u64)],
) -> Result<Vec<Result<Renewal>>> {
    let renew = p.get(tx, RENEW_MANY)?;
    let ids: Vec<i64> = leases.iter().map(|l| key(l.0)).collect();
    let attempts: Vec<i64> = leases.iter().map(|l| i64::from(l.1.0)).collect();
    let progress: Vec<i64> = leases.iter().map(|l| clamp(l.2)).collect();
    // Keyed by job and attempt: a batch may hold a stale attempt beside the live one of the
    // same job, and only the live one was renewed.
    let renewed: std::collections::HashMap<(i64, i64), i64> = tx
        .query(&renew, &[&ids, &attempts, &progress])?
        .iter()
        .map(|r| Ok(((r.col(0)?, r.col(1)?), r.col(2)?)))
        .collect::<Result<_>>()?;
    let mut answers = Vec::with_capacity(leases.len());
    for &(job, at, progress) in leases {
        answers.push(match renewed.get(&(key(job), i64::from(at.0))) {
            Some(us) => Ok(Renewal::Renewed {
                expires_at: time(*us),
            }),
            // The slow path, one by one: cancelled, stalled or refused.
            None => match not_renewed(tx, p, s, job, at, progress) {
                Err(e) if !e.is_lease_lost() => return Err(e),
                answer => answer,
            },
        });
    }
    Ok(answers)
}

/// Why a renewal changed no row: a cancel or a stall (which end the attempt here), or the
/// fence.
fn not_renewed(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    progress: u64,
) -> Result<Renewal> {
    let record = fence(tx, p, job, at, Refusal::Heartbeat)?;
    let now = now(tx, p)?;
    if record.cancel_requested {
        end_attempt(tx, p, &record, Outcome::Cancelled, Next::Cancelled, now)?;
        return Ok(Renewal::Cancelled);
    }
    let stalled = record
        .lease
        .as_ref()
        .and_then(|l| l.stall_timeout)
        .is_some_and(|limit| {
            progress == record.progress && now.saturating_since(record.progress_at) >= limit
        });
    if stalled {
        bump(tx, p, "stalled", 1)?;
        let next = retry::after_failure(&record, now, &s.retry, true);
        end_attempt(tx, p, &record, Outcome::Stalled, next, now)?;
        return Ok(Renewal::Stalled);
    }
    // Running under this attempt, neither cancelled nor stalled, yet not renewed: the row
    // changed between the two statements, which the row lock `fence` took now rules out.
    match renew(tx, p, job, at, progress)? {
        Some(expires_at) => Ok(Renewal::Renewed { expires_at }),
        None => Err(Error::Corrupt(format!(
            "job {job} attempt {at}: a renewal of a held lease changed nothing"
        ))),
    }
}

// ----- ends of an attempt -----

/// Completes the attempt: the job succeeded and `output` is kept. One statement when the
/// fence holds (the common case); a refusal takes the slow path, which says why.
pub(crate) fn complete(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    output: &[u8],
    progress: Option<u64>,
) -> Result<()> {
    input::check_size("output", output.len(), s.max_payload)?;
    match complete_many(tx, p, &[(job, at, output, progress)])?.is_empty() {
        true => refused_completion(tx, p, job, at),
        false => Ok(()),
    }
}

/// Why the completion statement did not complete attempt `at` of `job`: the fence says (and
/// counts the refusal). It cannot find the attempt running and unlocked, since the
/// statement waited for the row's lock and would have completed it.
pub(crate) fn refused_completion(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
) -> Result<()> {
    fence(tx, p, job, at, Refusal::Write)?;
    Err(Error::Corrupt(format!(
        "job {job} attempt {at}: a completion of a held lease changed nothing"
    )))
}

/// Completes attempts whose fence holds, in one statement: locks each row under the fence
/// (`id AND attempt AND state = 'running'`), in id order so that two batches never wait on
/// each other in a cycle, ends the attempt and writes its history row.
const COMPLETE_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
r AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::bigint[])
          AS r(id, attempt, output, progress)),
old AS (
    SELECT j.id, j.attempt, j.lease_owner, j.lease_claimed_at, r.output, r.progress AS reported
    FROM {s}.leasehold_jobs j JOIN r ON j.id = r.id AND j.attempt = r.attempt
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
),
done AS (
    UPDATE {s}.leasehold_jobs j
    SET state = 'succeeded', finished_at = c.t, updated_at = c.t,
        output = CASE WHEN octet_length(old.output) > 0 THEN old.output END,
        progress = coalesce(old.reported, j.progress),
        progress_at = CASE WHEN old.reported IS NOT NULL AND old.reported <> j.progress
                           THEN c.t ELSE j.progress_at END,
        lease_owner = NULL, lease_claimed_at = NULL, lease_expires_at = NULL,
        lease_indexed_expiry = NULL, lease_length_us = NULL, stall_timeout_us = NULL
    FROM old, c
    WHERE j.id = old.id
    RETURNING j.id, j.attempt, old.lease_owner, old.lease_claimed_at, j.progress
)
INSERT INTO {s}.leasehold_runs (job, attempt, worker, claimed_at, ended_at, outcome, progress)
SELECT done.id, done.attempt, done.lease_owner, done.lease_claimed_at, c.t, 'succeeded',
    done.progress
FROM done, c
RETURNING job, attempt";

/// Completes many attempts with one statement where their fences hold; returns those it
/// completed. The caller completes the others one by one, which says why each was refused.
/// Each attempt may appear once; its output must be within the size limit.
pub(crate) fn complete_many(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    done: &[(JobId, Attempt, &[u8], Option<u64>)],
) -> Result<std::collections::HashSet<(JobId, Attempt)>> {
    let st = p.get(tx, COMPLETE_MANY)?;
    let ids: Vec<i64> = done.iter().map(|d| key(d.0)).collect();
    let attempts: Vec<i64> = done.iter().map(|d| i64::from(d.1.0)).collect();
    let outputs: Vec<&[u8]> = done.iter().map(|d| d.2).collect();
    let progress: Vec<Option<i64>> = done.iter().map(|d| d.3.map(clamp)).collect();
    tx.query(&st, &[&ids, &attempts, &outputs, &progress])?
        .iter()
        .map(|row| Ok((id(row.col(0)?), attempt(row.col(1)?)?)))
        .collect()
}

/// Fails the attempt: retried after a backoff while the budget lasts, else dead.
pub(crate) fn fail(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    error: &str,
    progress: Option<u64>,
) -> Result<JobState> {
    let message = input::error_message(error);
    let mut record = fence(tx, p, job, at, Refusal::Write)?;
    let now = now(tx, p)?;
    final_progress(&mut record, progress, now);
    record.last_error = Some(message.clone());
    let next = retry::after_failure(&record, now, &s.retry, true);
    end_attempt(tx, p, &record, Outcome::Failed(message), next, now)
}

/// Gives the job back on purpose: claimable at once, in its old place, no budget spent.
pub(crate) fn release(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    progress: Option<u64>,
) -> Result<JobState> {
    let mut record = fence(tx, p, job, at, Refusal::Write)?;
    let now = now(tx, p)?;
    final_progress(&mut record, progress, now);
    let next = match record.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(record.run_at),
    };
    bump(tx, p, "released", 1)?;
    notify(tx, p, &record.queue)?;
    end_attempt(tx, p, &record, Outcome::Released, next, now)
}

/// Cancels a job: a waiting one at once; a running one is flagged, and its holder learns of
/// it at its next heartbeat.
pub(crate) fn cancel(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<JobState> {
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    let st = match record.state {
        JobState::Queued | JobState::RetryWait => {
            "UPDATE {s}.leasehold_jobs SET state = 'cancelled', finished_at = {now},
             updated_at = {now} WHERE id = $1"
        }
        JobState::Running => {
            "UPDATE {s}.leasehold_jobs SET cancel_requested = true,
             updated_at = {now} WHERE id = $1"
        }
        JobState::Cancelled => return Ok(JobState::Cancelled),
        state @ (JobState::Succeeded | JobState::Dead) => {
            return Err(Error::Refused {
                job,
                state,
                action: "cancel",
            });
        }
    };
    let st = p.get(tx, st)?;
    tx.execute(&st, &[&key(job)])?;
    Ok(match record.state {
        JobState::Running => JobState::Running,
        _ => JobState::Cancelled,
    })
}

/// Puts a dead or cancelled job back in the queue with a fresh budget; refused while a live
/// job holds its unique key.
pub(crate) fn retry(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<()> {
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    if !matches!(record.state, JobState::Dead | JobState::Cancelled) {
        return Err(Error::Refused {
            job,
            state: record.state,
            action: "retry (only dead or cancelled jobs are retried)",
        });
    }
    if let Some(k) = &record.unique_key {
        let holder = p.get(tx, LIVE_KEY_HOLDER)?;
        if let Some(row) = tx.query_opt(&holder, &[&record.queue, k])? {
            return Err(Error::UniqueKeyHeld {
                job,
                key: k.clone(),
                holder: id(row.col(0)?),
            });
        }
    }
    let st = p.get(
        tx,
        "UPDATE {s}.leasehold_jobs SET state = 'queued', failures = 0, cancel_requested = false,
         finished_at = NULL, run_at = {now}, updated_at = {now}
         WHERE id = $1",
    )?;
    tx.execute(&st, &[&key(job)])?;
    notify(tx, p, &record.queue)
}

// ----- reclaim -----

const EXPIRED_ANY: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE state = 'running' AND lease_indexed_expiry <= {now}
ORDER BY lease_indexed_expiry
LIMIT $1
FOR UPDATE SKIP LOCKED";

/// One reaper batch: takes back up to `limit` expired leases of any queue (the predicate
/// re-checked on each locked row), moving up the index entry of those renewed meanwhile.
/// Returns the reclaims and how many index entries it looked at.
pub(crate) fn reap_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    limit: usize,
) -> Result<(Vec<Reclaim>, usize)> {
    let st = p.get(tx, EXPIRED_ANY)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let ids: Vec<i64> = tx
        .query(&st, &[&limit])?
        .iter()
        .map(|r| r.col(0))
        .collect::<Result<_>>()?;
    let looked = ids.len();
    let reclaimed = expire_or_catch_up(tx, p, s, &ids, ReclaimPath::Reaper)?;
    if !reclaimed.is_empty() {
        notify(tx, p, super::listen::ALL_QUEUES)?;
    }
    Ok((reclaimed, looked))
}

/// For each locked running job in `ids`: if its lease has really expired, takes it back on
/// `path`; if it was renewed since its index entry was written, moves the entry up.
fn expire_or_catch_up(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    ids: &[i64],
    path: ReclaimPath,
) -> Result<Vec<Reclaim>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = now(tx, p)?;
    let mut reclaimed = Vec::new();
    let catch_up = p.get(tx, CATCH_UP)?;
    for &row_id in ids {
        let Some(record) = load(tx, p, id(row_id))? else {
            continue;
        };
        let expired = record.state == JobState::Running
            && record.lease.as_ref().is_some_and(|l| l.expires_at <= now);
        if expired {
            reclaimed.push(expire(tx, p, s, &record, path, now)?);
        } else if record.state == JobState::Running {
            tx.execute(&catch_up, &[&row_id])?;
        }
    }
    Ok(reclaimed)
}

/// Takes back the lease of a running job: records `LeaseExpired` and moves the job on.
fn expire(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    record: &JobRecord,
    path: ReclaimPath,
    now: StoreTime,
) -> Result<Reclaim> {
    let Some(lease) = record.lease.clone() else {
        return Err(crate::tx::corrupt_running(record));
    };
    let overdue = now.saturating_since(lease.expires_at);
    let detection_delay = lease.length + overdue;
    bump(
        tx,
        p,
        match path {
            ReclaimPath::Reaper => "reclaimed_by_reaper",
            ReclaimPath::Takeover => "reclaimed_by_takeover",
            ReclaimPath::Recovery => "reclaimed_at_open",
            ReclaimPath::ProcessDied => "reclaimed_process_died",
        },
        1,
    )?;
    let worst = p.get(
        tx,
        "UPDATE {s}.leasehold_counters SET value = greatest(value, $1)
         WHERE name = 'worst_detection_delay_us'",
    )?;
    tx.execute(&worst, &[&micros(detection_delay)])?;
    let next = retry::after_failure(record, now, &s.retry, false);
    let state = end_attempt(
        tx,
        p,
        record,
        Outcome::LeaseExpired { path, overdue },
        next,
        now,
    )?;
    Ok(Reclaim {
        job: record.id,
        attempt: record.attempt,
        worker: lease.owner,
        expired_at: lease.expires_at,
        reclaimed_at: now,
        overdue,
        detection_delay,
        path,
        now: state,
    })
}

// ----- the pieces -----

/// Which counter a refused fenced write moves.
#[derive(Copy, Clone)]
enum Refusal {
    Heartbeat,
    Write,
}

/// The fence: the job must be `running` under exactly this attempt. Locks the row.
fn fence(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    refusal: Refusal,
) -> Result<JobRecord> {
    let found = load(tx, p, job)?;
    if let Some(record) = found.as_ref()
        && record.state == JobState::Running
        && record.attempt == at
    {
        return Ok(record.clone());
    }
    let ended_by_holder = match &found {
        Some(record) if record.attempt == at => {
            let st = p.get(
                tx,
                "SELECT outcome FROM {s}.leasehold_runs WHERE job = $1 AND attempt = $2",
            )?;
            match tx.query_opt(&st, &[&key(job), &i64::from(at.0)])? {
                Some(row) => matches!(row.col(0)?, "succeeded" | "failed" | "released"),
                None => false,
            }
        }
        _ => false,
    };
    match refusal {
        Refusal::Heartbeat if ended_by_holder => {}
        Refusal::Heartbeat => bump(tx, p, "leases_lost", 1)?,
        Refusal::Write => bump(tx, p, "fenced_writes_rejected", 1)?,
    }
    Err(LeaseLost {
        job,
        attempt: at,
        found: found.map(|r| (r.attempt, r.state)),
        ended_by_holder,
    }
    .into())
}

/// Takes the holder's last progress into the record its attempt ends with.
fn final_progress(record: &mut JobRecord, progress: Option<u64>, now: StoreTime) {
    if let Some(p) = progress
        && p != record.progress
    {
        record.progress = p;
        record.progress_at = now;
    }
}

/// Ends the current attempt of a running job (locked by the caller): writes its history row
/// with `outcome` and moves the job to `next`. The only place an attempt ends.
fn end_attempt(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    record: &JobRecord,
    outcome: Outcome,
    next: Next,
    now: StoreTime,
) -> Result<JobState> {
    let Some(run) = record.current_run() else {
        return Err(crate::tx::corrupt_running(record));
    };
    let spends = matches!(
        outcome,
        Outcome::Failed(_) | Outcome::LeaseExpired { .. } | Outcome::Stalled
    );
    let (state, run_at) = match next {
        Next::Succeeded => (JobState::Succeeded, None),
        Next::Dead => (JobState::Dead, None),
        Next::Cancelled => (JobState::Cancelled, None),
        Next::Queued(at) => (JobState::Queued, Some(at)),
        Next::RetryWait(at) => (JobState::RetryWait, Some(at)),
    };
    let (kind, error, path, overdue) = outcome_columns(&outcome);
    let insert = p.get(
        tx,
        "INSERT INTO {s}.leasehold_runs
             (job, attempt, worker, claimed_at, ended_at, outcome, error, reclaim_path,
              overdue_us, progress)
         VALUES ($1, $2, $3, {s}.at($4),
                 {s}.at($5), $6, $7, $8, $9, $10)",
    )?;
    tx.execute(
        &insert,
        &[
            &key(record.id),
            &i64::from(run.attempt.0),
            &run.worker,
            &us(run.claimed_at),
            &us(now),
            &kind,
            &error,
            &path,
            &overdue,
            &clamp(record.progress),
        ],
    )?;
    let update = p.get(
        tx,
        "UPDATE {s}.leasehold_jobs
         SET state = $2, failures = failures + $3,
             run_at = coalesce({s}.at($4), run_at),
             finished_at = CASE WHEN $2 IN ('succeeded', 'dead', 'cancelled')
                                THEN {s}.at($5) END,
             lease_owner = NULL, lease_claimed_at = NULL, lease_expires_at = NULL,
             lease_indexed_expiry = NULL, lease_length_us = NULL, stall_timeout_us = NULL,
             progress = $6, progress_at = {s}.at($7),
             last_error = $8, updated_at = {s}.at($5)
         WHERE id = $1",
    )?;
    tx.execute(
        &update,
        &[
            &key(record.id),
            &state.name(),
            &i64::from(spends),
            &run_at.map(us),
            &us(now),
            &clamp(record.progress),
            &us(record.progress_at),
            &record.last_error,
        ],
    )?;
    Ok(state)
}

/// The history row's outcome columns: kind, error, reclaim path, overdue.
fn outcome_columns(
    outcome: &Outcome,
) -> (
    &'static str,
    Option<&str>,
    Option<&'static str>,
    Option<i64>,
) {
    match outcome {
        Outcome::Succeeded => ("succeeded", None, None, None),
        Outcome::Failed(e) => ("failed", Some(e.as_str()), None, None),
        Outcome::Released => ("released", None, None, None),
        Outcome::LeaseExpired { path, overdue } => (
            "lease_expired",
            None,
            Some(path_name(*path)),
            Some(micros(*overdue)),
        ),
        Outcome::Stalled => ("stalled", None, None, None),
        Outcome::Cancelled => ("cancelled", None, None, None),
    }
}

fn path_name(path: ReclaimPath) -> &'static str {
    match path {
        ReclaimPath::Reaper => "reaper",
        ReclaimPath::Takeover => "takeover",
        ReclaimPath::Recovery => "recovery",
        ReclaimPath::ProcessDied => "process_died",
    }
}

/// Tells listening stores on every machine that `queue` has work, when this transaction
/// commits (PostgreSQL folds repeats of one payload within a transaction into one).
pub(crate) fn notify(tx: Tx<'_, '_>, p: &mut Prepared<'_>, queue: &str) -> Result<()> {
    let st = p.get(tx, "SELECT pg_notify($1, $2)")?;
    tx.execute(&st, &[&p.names.channel, &queue])?;
    Ok(())
}

fn bump(tx: Tx<'_, '_>, p: &mut Prepared<'_>, counter: &str, by: i64) -> Result<()> {
    // An upsert: a counter added after a store was made has no row there yet.
    let st = p.get(
        tx,
        "INSERT INTO {s}.leasehold_counters AS c (name, value) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET value = c.value + excluded.value",
    )?;
    tx.execute(&st, &[&counter, &by])?;
    Ok(())
}

const PURGE: &str = "
WITH gone AS (
    DELETE FROM {s}.leasehold_jobs WHERE id IN (
        SELECT id FROM {s}.leasehold_jobs
        WHERE finished_at IS NOT NULL AND finished_at <= {now} - $1::bigint * interval '1 microsecond'
            AND state = ANY($2)
        ORDER BY finished_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED)
    RETURNING id
),
runs AS (DELETE FROM {s}.leasehold_runs WHERE job IN (SELECT id FROM gone))
SELECT count(*) FROM gone";

/// Deletes up to `limit` terminal jobs in `states` that finished at least `older_than` ago,
/// with their history; returns how many. Called in batches, so that a purge of a large
/// backlog holds no lock for long and leaves autovacuum bounded work each time.
pub(crate) fn purge_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    older_than: Duration,
    states: &[JobState],
    limit: usize,
) -> Result<usize> {
    let st = p.get(tx, PURGE)?;
    let states: Vec<&str> = states
        .iter()
        .filter(|s| s.is_terminal())
        .map(|s| s.name())
        .collect();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let n: i64 = tx
        .query_one(&st, &[&micros(older_than), &states, &limit])?
        .col(0)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

const JOB_LOCKED: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {s}.leasehold_jobs WHERE id = $1 FOR UPDATE"
);

/// The job's record, its row locked for the rest of the transaction (for a write).
pub(crate) fn load(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<Option<JobRecord>> {
    let st = p.get(tx, JOB_LOCKED)?;
    job_by(tx, &st, job)
}
