//! The lease protocol in SQL, readable in one place: each step is a function over one
//! PostgreSQL transaction, and every time it reads or writes is the database's clock
//! (`clock_timestamp()`, not `now()`, which is the transaction's start), taken
//! once per statement (the `c` CTE) so that a statement sees one
//! instant.
//!
//! What becomes of a job is the rule book's ([`crate::rules`]): the slow paths load a record
//! under its row lock, apply a rule, and store what it decided ([`save`], [`store_end`]).
//! The fast paths, one statement for many rows where that pays (a claim of a batch, renewals
//! of a batch, completions of a batch), compute the same answers in SQL, and the shared
//! suites (model, conformance, lease store) hold them to the rules: a claim takes a job only
//! if it is waiting and due, or running with an expired lease (taken over first); every
//! claim increments `attempt`, and a job whose counter is exhausted is dead instead; a
//! fenced write matches `id AND attempt AND state = 'running'`, and a refusal changes
//! nothing but a counter; an attempt ends with exactly one history row.

use std::time::Duration;

use postgres::Transaction;
use postgres::types::ToSql;

use super::queues::{noted, queue_columns, queue_from, queue_record};
use super::rows::{
    Col, attempt, clamp, id, job_by, job_columns, key, metadata_column, micros, time,
    unique_for_us, us,
};
use super::schema::key_held;
use super::{PgError, Prepared, Settings};
use crate::batches::Batch;
use crate::error::{Error, Result};
use crate::ids::{Attempt, JobId, StoreTime};
use crate::input;
use crate::job::{JobRecord, JobState, NewJob, Outcome, ReclaimPath};
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::queue::QueueRecord;
use crate::report::Reclaim;
use crate::rules::{self, Change, Granted, Renewed, Retry, Write};
use crate::stats::Counters;

pub(crate) type Tx<'a, 'b> = &'a mut Transaction<'b>;

const NOW: &str = "SELECT {s}.us({now})";

/// The store's clock: the database's.
pub(crate) fn now(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<StoreTime> {
    let st = p.get(tx, NOW)?;
    Ok(time(tx.query_one(&st, &[])?.col(0)?))
}

// ----- enqueue -----

const INSERT: &str = concat!(
    "
WITH c AS MATERIALIZED (SELECT {now} AS t)
INSERT INTO {s}.leasehold_jobs
    (queue, state, priority, max_attempts, unique_key, created_at, run_at, progress_at,
     updated_at, payload, time_limit_us, unique_for_us, metadata)
SELECT $1, 'queued', $2, $3, $4, c.t, c.t + $5::bigint * interval '1 microsecond', c.t, c.t, $6,
    $7, $8, $9 FROM c
ON CONFLICT (queue, unique_key) WHERE ",
    key_held!(),
    "
    DO NOTHING
RETURNING id"
);

/// The job the unique index names for a key (it may keep it only by its window).
const KEY_HOLDER: &str = concat!(
    "SELECT id FROM {s}.leasehold_jobs WHERE queue = $1 AND unique_key = $2 AND ",
    key_held!()
);

/// The job that holds `key` in `queue` now ([`rules::holds_key`]), its row locked; a
/// finished one whose window ran out gives the key up here (stored), and is not the answer.
fn key_holder(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    key: &str,
) -> Result<Option<JobRecord>> {
    let st = p.get(tx, KEY_HOLDER)?;
    let Some(row) = tx.query_opt(&st, &[&queue, &key])? else {
        return Ok(None);
    };
    let Some(holder) = load(tx, p, id(row.col(0)?))? else {
        return Ok(None);
    };
    let now = now(tx, p)?;
    if rules::holds_key(&holder, now) {
        return Ok(Some(holder));
    }
    save(tx, p, &rules::release_key(&holder, now))?;
    Ok(None)
}

/// Enqueues a job; with a unique key that another job holds ([`rules::holds_key`]), returns
/// that job instead.
pub(crate) fn enqueue(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    new: &NewJob,
) -> Result<JobId> {
    let (id, made) = insert(tx, p, s, new)?;
    if made {
        notify(tx, p, &new.queue)?;
    }
    Ok(id)
}

/// Plain jobs (no unique key, no metadata) in one statement, their ids given in their
/// order (rows are made, and take their ids from the sequence, in the order of the array).
const INSERT_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
INSERT INTO {s}.leasehold_jobs
    (queue, state, priority, max_attempts, created_at, run_at, progress_at, updated_at,
     payload, time_limit_us)
SELECT r.queue, 'queued', r.priority, r.max_attempts, c.t,
    c.t + r.delay_us * interval '1 microsecond', c.t, c.t, r.payload, r.time_limit_us
FROM c, unnest($1::text[], $2::integer[], $3::bigint[], $4::bigint[], $5::bytea[],
               $6::bigint[]) WITH ORDINALITY
    AS r(queue, priority, max_attempts, delay_us, payload, time_limit_us, n)
ORDER BY r.n
RETURNING id";

/// Enqueues many jobs, all or none (a refused one rolls the transaction back), waking each
/// queue that gained one once. Each run of plain jobs is one statement; a job with a unique
/// key (which may answer with the key's holder) or metadata is inserted alone.
pub(crate) fn enqueue_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    jobs: &[NewJob],
) -> Result<Vec<JobId>> {
    for job in jobs {
        check_new_job(s, job)?;
    }
    let plain = |job: &NewJob| job.unique_key.is_none() && job.metadata.is_empty();
    let mut ids = Vec::with_capacity(jobs.len());
    // Queues that gained a job (not those whose only answer was a key's holder).
    let mut gained = std::collections::BTreeSet::new();
    let mut rest = jobs;
    while let Some(job) = rest.first() {
        let run = rest.iter().take_while(|j| plain(j)).count();
        if run > 1 {
            ids.extend(insert_many(tx, p, s, &rest[..run])?);
            gained.extend(rest[..run].iter().map(|j| j.queue.as_str()));
            rest = &rest[run..];
        } else {
            let (id, made) = insert(tx, p, s, job)?;
            if made {
                gained.insert(job.queue.as_str());
            }
            ids.push(id);
            rest = &rest[1..];
        }
    }
    for queue in gained {
        notify(tx, p, queue)?;
    }
    Ok(ids)
}

/// Inserts plain jobs (see [`INSERT_MANY`]), returning their ids in order.
fn insert_many(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    jobs: &[NewJob],
) -> Result<Vec<JobId>> {
    let st = p.get(tx, INSERT_MANY)?;
    let queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
    let budgets: Vec<i64> = jobs
        .iter()
        .map(|j| i64::from(j.max_attempts.unwrap_or(s.default_max_attempts)))
        .collect();
    let delays: Vec<i64> = jobs.iter().map(|j| micros(j.delay)).collect();
    let payloads: Vec<&[u8]> = jobs.iter().map(|j| j.payload.as_slice()).collect();
    let limits: Vec<Option<i64>> = jobs.iter().map(|j| j.time_limit.map(micros)).collect();
    let params: [&(dyn ToSql + Sync); 6] =
        [&queues, &priorities, &budgets, &delays, &payloads, &limits];
    let mut ids = tx
        .query(&st, &params)?
        .iter()
        .map(|row| row.col::<i64>(0).map(id))
        .collect::<Result<Vec<JobId>>>()?;
    ids.sort();
    if ids.len() != jobs.len() {
        return Err(Error::Internal("a batch insert made another count of rows"));
    }
    Ok(ids)
}

/// The job `new` makes, or the one that holds its unique key; and whether it was made.
fn insert(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    new: &NewJob,
) -> Result<(JobId, bool)> {
    check_new_job(s, new)?;
    let max_attempts = i64::from(new.max_attempts.unwrap_or(s.default_max_attempts));
    // The job holding the key is the answer. Looked up first rather than left to the
    // INSERT's conflict, which would spend a value of the id sequence for nothing (and
    // could not judge a finished holder's window).
    if let Some(key) = &new.unique_key
        && let Some(holder) = key_holder(tx, p, &new.queue, key)?
    {
        return Ok((holder.id, false));
    }
    let insert = p.get(tx, INSERT)?;
    let delay = micros(new.delay);
    let time_limit = new.time_limit.map(micros);
    let unique_for = unique_for_us(new.uniqueness);
    let metadata = metadata_column(&new.metadata);
    let params: [&(dyn ToSql + Sync); 9] = [
        &new.queue,
        &new.priority,
        &max_attempts,
        &new.unique_key,
        &delay,
        &new.payload,
        &time_limit,
        &unique_for,
        &metadata,
    ];
    if let Some(row) = tx.query_opt(&insert, &params)? {
        return Ok((id(row.col(0)?), true));
    }
    // Another transaction's job took the key meanwhile: that one is the answer.
    let holder = p.get(tx, KEY_HOLDER)?;
    match tx.query_opt(&holder, &[&new.queue, &new.unique_key])? {
        Some(row) => Ok((id(row.col(0)?), false)),
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
ORDER BY priority, run_at, id
LIMIT 1
FOR UPDATE SKIP LOCKED";

const CLAIM: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
picked AS (
    -- The time as a scalar (an InitPlan), not a join with c: the ready index's order then
    -- serves the ORDER BY and the scan stops at the LIMIT. Joined, the rows came out of the
    -- join's inner side, whose order the planner does not keep, and every claim read and
    -- sorted every waiting job of the queue to take a few hundred (the guard test:
    -- suite::a_claim_reads_the_jobs_it_takes_not_every_waiting_job_of_the_queue).
    SELECT id, attempt FROM {s}.leasehold_jobs
    WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND run_at <= (SELECT t FROM c)
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
granted AS (
    UPDATE {s}.leasehold_jobs j
    SET state = 'running', attempt = j.attempt + 1, lease_owner = $3, lease_claimed_at = c.t,
        -- rules::grant: the deadline is the job's own limit or the claimer's; the lease
        -- never runs past it (least() passes over a NULL deadline)
        lease_deadline = c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond',
        lease_expires_at = least(c.t + $4::bigint * interval '1 microsecond',
            c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond'),
        lease_indexed_expiry = least(c.t + $4::bigint * interval '1 microsecond',
            c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond'),
        lease_length_us = $4::bigint, stall_timeout_us = $5::bigint, progress = 0,
        progress_at = c.t, updated_at = c.t
    FROM picked, c
    WHERE j.id = picked.id AND picked.attempt < 4294967295
    RETURNING j.id, j.attempt, {s}.us(c.t) AS t, {s}.us(j.lease_expires_at) AS expires, j.payload,
        j.priority, {s}.us(j.run_at) AS run_at, {s}.us(j.lease_deadline) AS deadline
),
-- rules::grant: a job whose attempt counter is exhausted is dead, never leased again
exhausted AS (
    UPDATE {s}.leasehold_jobs j
    SET state = 'dead', finished_at = c.t, updated_at = c.t, last_error = $6
    FROM picked, c
    WHERE j.id = picked.id AND picked.attempt >= 4294967295
    RETURNING j.id
)
SELECT id, attempt, t, expires, payload, priority, run_at, deadline FROM granted
UNION ALL
SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM exhausted";

/// Claims up to `n` jobs of `queue`, most urgent first, as [`crate::redb_store::protocol::claim_batch`]
/// does: a job is taken if it is waiting and due, or running with an expired lease (taken
/// over), the expired one first when its priority is at least as urgent. While no lease of
/// the queue has expired (nearly always), the whole batch is one statement.
///
/// With `beside`, the claim runs while completions of the same round commit in another
/// transaction, and decides as if they had committed first: before anything they could
/// change is decided (a takeover, a limited queue's room), it waits for them to commit
/// ([`Beside::settle`]). Taking waiting jobs does not depend on them, with one exception: a
/// job being completed that waits in the queue (given back or taken back since), whose
/// completion is to be refused. Asking first which of them wait would put a lookup per
/// completion on the claim's critical path; so the claim takes what it would anyway, under
/// a savepoint, and only if it took one of them rolls back, waits, and claims again.
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
    beside: Option<&Beside<'_>>,
) -> Result<Vec<Lease>> {
    input::check_claim(queue, worker, &terms)?;
    // One statement for the common case: is a lease of the queue expired, is the queue
    // paused or limited? (A queue with neither needs no more.)
    let look = p.get(tx, LOOK)?;
    let row = tx.query_one(&look, &[&queue])?;
    let expired_left = row.col::<Option<i64>>(0)?.is_some();
    let record = queue_from(&row, 1)?;
    let limited = record
        .as_ref()
        .is_some_and(|r| r.paused || r.limits.is_limited());
    // Completions still committing beside this claim, which it has not waited for.
    let mut unsettled = beside.filter(|b| !b.jobs.is_empty());
    if let Some(beside) = beside
        && (expired_left || limited)
    {
        // (each statement from here on sees what committed before it began)
        (beside.settle)();
        unsettled = None;
    }
    let (record, room) = match record {
        Some(r) if r.paused || r.limits.is_limited() => room(tx, p, s, queue)?,
        record => (record, rules::claim_room(None, 0, StoreTime::ZERO)),
    };
    let n = n.min(room.allowed);
    let mut leases = Vec::new();
    // One at a time while expired leases are about, each weighed against the ready jobs.
    while expired_left && leases.len() < n {
        let Some(expired) = first_expired(tx, p, queue)? else {
            break;
        };
        let ready = p.get(tx, FIRST_READY)?;
        let ready = match tx.query_opt(&ready, &[&queue])? {
            Some(r) => Some((r.col::<i64>(0)?, r.col::<i32>(1)?)),
            None => None,
        };
        let job = match ready {
            Some((ready, priority)) if !rules::takes_over(&expired, Some(priority)) => {
                match load(tx, p, id(ready))? {
                    Some(job) => job,
                    None => break,
                }
            }
            _ => {
                let now = now(tx, p)?;
                let (taken, _) = expire(tx, p, s, &expired, ReclaimPath::Takeover, now)?;
                if !rules::claimable(&taken, now) {
                    // out of budget or cancelled (now terminal), or timed out and waiting
                    // out its backoff: the next candidate
                    continue;
                }
                taken
            }
        };
        if let Some(lease) = grant(tx, p, &job, worker, terms)? {
            leases.push(lease);
        }
        // (else its attempt counter was exhausted and it is now dead: the next candidate)
    }
    // Then the rest in one statement, as if the completions beside had committed.
    if unsettled.is_some() {
        tx.batch_execute("SAVEPOINT leasehold_claim")?;
    }
    let before = leases.len();
    let touched = claim_waiting(tx, p, queue, worker, terms, n, &mut leases)?;
    if let Some(beside) = beside {
        (beside.has_taken)();
    }
    if let Some(beside) = unsettled
        && touched.iter().any(|job| beside.jobs.contains(job))
    {
        // It took (or found exhausted) a job whose completion beside it is to be refused:
        // as if that completion came first, it is refused before the job is taken again.
        // Rolling back releases the row, which that completion may be waiting to lock.
        tx.batch_execute("ROLLBACK TO SAVEPOINT leasehold_claim")?;
        leases.truncate(before);
        (beside.settle)();
        claim_waiting(tx, p, queue, worker, terms, n, &mut leases)?;
    }
    noted(tx, p, queue, record, leases.len())?;
    Ok(leases)
}

/// Claims waiting jobs of `queue` with one statement until `leases` holds `n` (or none is
/// left); jobs it found exhausted (and made dead) leave room for as many more. Returns the
/// ids of every job it took or made dead.
fn claim_waiting(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
    leases: &mut Vec<Lease>,
) -> Result<Vec<i64>> {
    let claim = p.get(tx, CLAIM)?;
    let (length, stall) = (micros(terms.length), terms.stall_timeout.map(micros));
    let time_limit = terms.time_limit.map(micros);
    let mut touched = Vec::new();
    while leases.len() < n {
        let limit = i64::try_from(n - leases.len()).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 7] = [
            &queue,
            &limit,
            &worker,
            &length,
            &stall,
            &rules::ATTEMPTS_EXHAUSTED,
            &time_limit,
        ];
        let rows = tx.query(&claim, &params)?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut exhausted = 0;
        for r in &rows {
            touched.push(r.col::<i64>(0)?);
            let Some(at) = r.col::<Option<i64>>(1)? else {
                exhausted += 1;
                continue;
            };
            let order = (r.col::<i32>(5)?, r.col::<i64>(6)?, r.col::<i64>(0)?);
            let lease = Lease {
                job: id(r.col(0)?),
                attempt: attempt(at)?,
                queue: queue.to_owned(),
                worker: worker.to_owned(),
                claimed_at: time(r.col(2)?),
                expires_at: time(r.col(3)?),
                length: terms.length,
                deadline: r.col::<Option<i64>>(7)?.map(time),
                payload: r.col(4)?,
            };
            claimed.push((order, lease));
        }
        claimed.sort_by_key(|(order, _)| *order);
        leases.extend(claimed.into_iter().map(|(_, lease)| lease));
        if exhausted == 0 {
            break;
        }
    }
    Ok(touched)
}

/// Completions committing beside a claim, in a transaction of their own (see
/// [`claim_batch`]).
pub(crate) struct Beside<'a> {
    /// The jobs being completed.
    pub jobs: std::collections::HashSet<i64>,
    /// Says the claim has taken the waiting jobs it takes: until then the completions
    /// lock no row it could take (one refused would be passed over, not taken first).
    pub has_taken: &'a dyn Fn(),
    /// Returns once their transaction has ended (saying first that the claim has taken
    /// what it takes: it waits for them now).
    pub settle: &'a dyn Fn(),
}

/// A claim's first look, in one statement: whether a lease of the queue has expired, and the
/// queue's record (all null without one). It locks nothing: a takeover locks its row when
/// it takes it ([`FIRST_EXPIRED`]), after the claim has settled (see [`claim_batch`]); a
/// lock taken here could be the row a completion committing beside the claim waits for.
///
/// It runs before every claim, so it must stay an index lookup whatever the planner knows
/// of the table (a fresh one, before its first ANALYZE, it knows nothing of): the time is
/// read once (`(SELECT {now})`: a volatile call in the condition could not bound the expiry
/// index's range, so every entry the index holds was visited).
const LOOK: &str = concat!(
    "SELECT (SELECT id FROM {s}.leasehold_jobs
             WHERE queue = $1 AND state = 'running' AND lease_indexed_expiry <= (SELECT {now})
             ORDER BY lease_indexed_expiry
             LIMIT 1), ",
    queue_columns!(),
    " FROM (SELECT 1) one LEFT JOIN {s}.leasehold_queues q ON q.queue = $1"
);

/// What a claim of `queue` may take now ([`rules::claim_room`]), and its record: as on redb,
/// a queue with a concurrency limit has its expired leases taken back first, under the
/// queue's row lock (so that the claims of every machine count its slots one at a time).
fn room(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    queue: &str,
) -> Result<(Option<QueueRecord>, rules::Room)> {
    let mut record = queue_record(tx, p, queue, false)?;
    if record
        .as_ref()
        .is_some_and(|r| !r.paused && r.limits.is_limited())
    {
        record = queue_record(tx, p, queue, true)?;
    }
    let limited = record
        .as_ref()
        .is_some_and(|r| !r.paused && r.limits.concurrency.is_some());
    let now = now(tx, p)?;
    let mut running = 0;
    if limited {
        while let Some(expired) = first_expired(tx, p, queue)? {
            expire(tx, p, s, &expired, ReclaimPath::Takeover, now)?;
        }
        let st = p.get(
            tx,
            "SELECT count(*) FROM {s}.leasehold_jobs WHERE queue = $1 AND state = 'running'",
        )?;
        running = u64::try_from(tx.query_one(&st, &[&queue])?.col::<i64>(0)?).unwrap_or(0);
    }
    let room = rules::claim_room(record.as_ref(), running, now);
    Ok((record, room))
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

/// Starts a new attempt of the waiting `job` (locked) under a lease for `worker`
/// ([`rules::grant`]); a job whose attempt counter is exhausted is dead instead (`None`).
fn grant(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: &JobRecord,
    worker: &str,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    let now = now(tx, p)?;
    if !rules::claimable(job, now) {
        return Ok(None);
    }
    match rules::grant(job, worker, terms, now) {
        Granted::Exhausted(dead) => {
            save(tx, p, &dead)?;
            Ok(None)
        }
        Granted::Lease(new) => {
            save(tx, p, &new)?;
            let st = p.get(tx, "SELECT payload FROM {s}.leasehold_jobs WHERE id = $1")?;
            let payload = tx.query_one(&st, &[&key(new.id)])?.col(0)?;
            let Some(granted) = new.lease.as_ref() else {
                return Err(crate::rules::corrupt_running(&new));
            };
            let (expires_at, deadline) = (granted.expires_at, granted.deadline);
            Ok(Some(Lease {
                job: new.id,
                attempt: new.attempt,
                queue: new.queue,
                worker: worker.to_owned(),
                claimed_at: now,
                expires_at,
                length: terms.length,
                deadline,
                payload,
            }))
        }
    }
}

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
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    let now = now(tx, p)?;
    if !rules::claimable(&record, now) && !rules::lease_expired(&record, now) {
        return Ok(None);
    }
    let (queue_record, room) = room(tx, p, s, &record.queue)?;
    if room.allowed == 0 {
        return Ok(None);
    }
    // (taking back the queue's expired leases may have made this one claimable)
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    let record = match rules::lease_expired(&record, now) {
        true => expire(tx, p, s, &record, ReclaimPath::Takeover, now)?.0,
        false => record,
    };
    if !rules::claimable(&record, now) {
        return Ok(None);
    }
    let lease = grant(tx, p, &record, worker, terms)?;
    noted(
        tx,
        p,
        &record.queue,
        queue_record,
        usize::from(lease.is_some()),
    )?;
    Ok(lease)
}

// ----- heartbeat -----

const RENEW: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
UPDATE {s}.leasehold_jobs j
SET lease_expires_at = greatest(j.lease_expires_at,
        least(c.t + j.lease_length_us * interval '1 microsecond', j.lease_deadline)),
    progress = $3,
    progress_at = CASE WHEN j.progress = $3 THEN j.progress_at ELSE c.t END,
    updated_at = c.t
FROM c
WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running' AND NOT j.cancel_requested
    AND NOT (j.stall_timeout_us IS NOT NULL AND j.progress = $3
             AND c.t - j.progress_at >= j.stall_timeout_us * interval '1 microsecond')
    AND NOT coalesce(j.lease_deadline <= c.t, false)
RETURNING {s}.us(j.lease_expires_at)";

const RENEW_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
r AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS r(id, attempt, progress))
UPDATE {s}.leasehold_jobs j
SET lease_expires_at = greatest(j.lease_expires_at,
        least(c.t + j.lease_length_us * interval '1 microsecond', j.lease_deadline)),
    progress = r.progress,
    progress_at = CASE WHEN j.progress = r.progress THEN j.progress_at ELSE c.t END,
    updated_at = c.t
FROM c, r
WHERE j.id = r.id AND j.attempt = r.attempt AND j.state = 'running' AND NOT j.cancel_requested
    AND NOT (j.stall_timeout_us IS NOT NULL AND j.progress = r.progress
             AND c.t - j.progress_at >= j.stall_timeout_us * interval '1 microsecond')
    AND NOT coalesce(j.lease_deadline <= c.t, false)
RETURNING j.id, j.attempt, {s}.us(j.lease_expires_at)";

/// Renews the lease by its length from now (up to the attempt's deadline) if the caller
/// still holds it, storing progress; a cancel requested meanwhile, a stall or the deadline
/// ends the attempt instead and says so.
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
    // In id order, as a batch of completions locks its rows (see [`COMPLETE_MANY`]): a
    // pool renews the jobs it is also completing.
    let mut sorted = leases.to_vec();
    sorted.sort_by_key(|l| l.0);
    let ids: Vec<i64> = sorted.iter().map(|l| key(l.0)).collect();
    let attempts: Vec<i64> = sorted.iter().map(|l| i64::from(l.1.0)).collect();
    let progress: Vec<i64> = sorted.iter().map(|l| clamp(l.2)).collect();
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
/// fence. A lease the fence finds held and the rule renews (which the statement would have
/// renewed: the row cannot change between the two under its lock) is renewed here.
fn not_renewed(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    progress: u64,
) -> Result<Renewal> {
    let record = fence(tx, p, job, at, Write::Heartbeat)?;
    let now = now(tx, p)?;
    match rules::renew(&record, progress, now, &s.retry) {
        Renewed::Cancelled(change) => {
            store_end(tx, p, &record, change)?;
            Ok(Renewal::Cancelled)
        }
        Renewed::Stalled(change) => {
            store_end(tx, p, &record, change)?;
            Ok(Renewal::Stalled)
        }
        Renewed::TimedOut(change) => {
            store_end(tx, p, &record, change)?;
            Ok(Renewal::TimedOut)
        }
        Renewed::Lease(renewed) => {
            let Some(expires_at) = renewed.lease.as_ref().map(|l| l.expires_at) else {
                return Err(crate::rules::corrupt_running(&record));
            };
            save(tx, p, &renewed)?;
            Ok(Renewal::Renewed { expires_at })
        }
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
        true => complete_one(tx, p, job, at, output, progress),
        false => Ok(()),
    }
}

/// The completion one job at a time: the fence says why the statement did not complete it
/// (and counts the refusal), and where it holds after all, [`rules::complete`] ends it.
pub(crate) fn complete_one(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    output: &[u8],
    progress: Option<u64>,
) -> Result<()> {
    let record = fence(tx, p, job, at, Write::End)?;
    let now = now(tx, p)?;
    let change = rules::complete(&record, progress, now);
    store_end(tx, p, &record, change)?;
    let st = p.get(
        tx,
        "UPDATE {s}.leasehold_jobs SET output = CASE WHEN octet_length($2::bytea) > 0 THEN $2::bytea END
         WHERE id = $1",
    )?;
    tx.execute(&st, &[&key(job), &output])?;
    Ok(())
}

/// Completes attempts whose fence holds, in one statement: updates each row under the fence
/// (`id AND attempt AND state = 'running'`), which locks it and ends the attempt, moving its
/// holder and claim time from the lease to the row's last attempt (`last_worker`,
/// `last_claimed_at`: the history of a succeeded job reads its last attempt there, and no
/// history row is written; see `MIGRATE_FROM_2` in the schema).
///
/// It touches each row once, found by key (locking the rows first in a CTE made the planner
/// hash every running job of the table and touch each row twice). The rows come in the
/// order of the ids passed, which [`complete_many`] sorts, and are locked in it, so that
/// two batches lock overlapping rows alike.
const COMPLETE_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
UPDATE {s}.leasehold_jobs j
SET state = 'succeeded', finished_at = c.t, updated_at = c.t,
    output = CASE WHEN octet_length(r.output) > 0 THEN r.output END,
    progress = coalesce(r.progress, j.progress),
    progress_at = CASE WHEN r.progress IS NOT NULL AND r.progress <> j.progress
                       THEN c.t ELSE j.progress_at END,
    last_worker = j.lease_owner, last_claimed_at = j.lease_claimed_at,
    lease_owner = NULL, lease_claimed_at = NULL, lease_expires_at = NULL,
    lease_indexed_expiry = NULL, lease_length_us = NULL, stall_timeout_us = NULL,
    lease_deadline = NULL
FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::bigint[]) AS r(id, attempt, output, progress),
     c
WHERE j.id = r.id AND j.attempt = r.attempt AND j.state = 'running'
    -- rules::before_deadline: an attempt past its deadline is left to the one-by-one path,
    -- which refuses the completion
    AND NOT coalesce(j.lease_deadline <= c.t, false)
RETURNING j.id, j.attempt";

/// Completes many attempts with one statement where their fences hold; returns those it
/// completed. The caller completes the others one by one, which says why each was refused.
/// Each attempt may appear once; its output must be within the size limit.
pub(crate) fn complete_many(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    done: &[(JobId, Attempt, &[u8], Option<u64>)],
) -> Result<std::collections::HashSet<(JobId, Attempt)>> {
    let st = p.get(tx, COMPLETE_MANY)?;
    let mut done = done.to_vec();
    done.sort_by_key(|d| d.0);
    let ids: Vec<i64> = done.iter().map(|d| key(d.0)).collect();
    let attempts: Vec<i64> = done.iter().map(|d| i64::from(d.1.0)).collect();
    let outputs: Vec<&[u8]> = done.iter().map(|d| d.2).collect();
    let progress: Vec<Option<i64>> = done.iter().map(|d| d.3.map(clamp)).collect();
    tx.query(&st, &[&ids, &attempts, &outputs, &progress])?
        .iter()
        .map(|row| Ok((id(row.col(0)?), attempt(row.col(1)?)?)))
        .collect()
}

/// Fails the attempt: retried after a backoff while the budget lasts (or never), else dead.
#[allow(clippy::too_many_arguments)] // the fenced write's coordinates and what it records
pub(crate) fn fail(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    error: &str,
    retry: Retry,
    progress: Option<u64>,
) -> Result<JobState> {
    let record = fence(tx, p, job, at, Write::End)?;
    let now = now(tx, p)?;
    let change = rules::fail(&record, error, retry, progress, now, &s.retry);
    Ok(store_end(tx, p, &record, change)?.state)
}

/// Ends the attempt as timed out: its holder found it past its hard time limit.
pub(crate) fn time_out(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    job: JobId,
    at: Attempt,
    progress: Option<u64>,
) -> Result<JobState> {
    let record = fence(tx, p, job, at, Write::TimeOut)?;
    let now = now(tx, p)?;
    let change = rules::time_out(&record, progress, now, &s.retry);
    Ok(store_end(tx, p, &record, change)?.state)
}

/// Puts the job off by `delay`: the attempt ends, no budget spent ([`rules::snooze`]).
pub(crate) fn snooze(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    delay: Duration,
    progress: Option<u64>,
) -> Result<JobState> {
    let record = fence(tx, p, job, at, Write::End)?;
    let now = now(tx, p)?;
    let change = rules::snooze(&record, delay, progress, now);
    Ok(store_end(tx, p, &record, change)?.state)
}

/// Gives the job back on purpose: claimable at once, in its old place, no budget spent.
pub(crate) fn release(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    progress: Option<u64>,
) -> Result<JobState> {
    let record = fence(tx, p, job, at, Write::End)?;
    let now = now(tx, p)?;
    let change = rules::release(&record, progress, now);
    notify(tx, p, &record.queue)?;
    Ok(store_end(tx, p, &record, change)?.state)
}

/// Cancels a job: a waiting one at once; a running one is flagged, and its holder learns of
/// it at its next heartbeat. Returns its state and whether anything changed.
pub(crate) fn cancel(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<(JobState, bool)> {
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    let now = now(tx, p)?;
    let (new, answer) = rules::cancel(&record, now)?;
    let changed = new.is_some();
    if let Some(new) = new {
        save(tx, p, &new)?;
    }
    Ok((answer, changed))
}

/// Puts a dead or cancelled job back in the queue with a fresh budget; refused while a live
/// job holds its unique key.
pub(crate) fn retry(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<()> {
    let record = load(tx, p, job)?.ok_or(Error::JobNotFound(job))?;
    // A finished holder whose window ran out has given the key up by now.
    let holder = match &record.unique_key {
        Some(k) => key_holder(tx, p, &record.queue, k)?,
        None => None,
    };
    let now = now(tx, p)?;
    let (new, _) = rules::retry(&record, holder.as_ref(), now)?;
    save(tx, p, &new)?;
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
pub(crate) fn reap_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    limit: usize,
) -> Result<Batch<Reclaim>> {
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
    Ok(Batch {
        items: reclaimed,
        looked,
    })
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
        if rules::lease_expired(&record, now) {
            reclaimed.push(expire(tx, p, s, &record, path, now)?.1);
        } else if record.state == JobState::Running {
            tx.execute(&catch_up, &[&row_id])?;
        }
    }
    Ok(reclaimed)
}

/// Takes back the lease of a running job ([`rules::expire`]): records `LeaseExpired` and
/// moves the job on; returns its new record and the reclaim.
fn expire(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    record: &JobRecord,
    path: ReclaimPath,
    now: StoreTime,
) -> Result<(JobRecord, Reclaim)> {
    let Some((change, reclaim)) = rules::expire(record, path, now, &s.retry) else {
        return Err(crate::rules::corrupt_running(record));
    };
    let new = store_end(tx, p, record, change)?;
    Ok((new, reclaim))
}

/// Marks `queues` as served now: a worker asked them for work or renewed one of their
/// leases (see [`crate::queue`]).
pub(crate) fn mark_served(tx: Tx<'_, '_>, p: &mut Prepared<'_>, queues: &[String]) -> Result<()> {
    if queues.is_empty() {
        return Ok(());
    }
    let st = p.get(
        tx,
        "INSERT INTO {s}.leasehold_queues AS q (queue, served_at)
         SELECT unnest($1::text[]), {now}
         ON CONFLICT (queue) DO UPDATE
         SET served_at = greatest(q.served_at, excluded.served_at)",
    )?;
    tx.execute(&st, &[&queues])?;
    Ok(())
}

// ----- the pieces -----

/// The fence ([`rules::fence`]): the job must be `running` under exactly this attempt. Locks
/// the row; a refusal changes nothing but its counter.
fn fence(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    at: Attempt,
    write: Write,
) -> Result<JobRecord> {
    let found = load(tx, p, job)?;
    let verdict = rules::fence(found, job, at, write, || {
        let st = p.get(
            tx,
            "SELECT outcome FROM {s}.leasehold_runs WHERE job = $1 AND attempt = $2",
        )?;
        let outcome = match tx.query_opt(&st, &[&key(job), &i64::from(at.0)])? {
            Some(row) => match row.col::<&str>(0)? {
                "succeeded" => Some(Outcome::Succeeded),
                "failed" => Some(Outcome::Failed(String::new())),
                "failed_permanently" => Some(Outcome::FailedPermanently(String::new())),
                "released" => Some(Outcome::Released),
                "snoozed" => Some(Outcome::Snoozed {
                    delay: Duration::ZERO,
                }),
                _ => None,
            },
            None => None,
        };
        Ok::<_, Error>(rules::ended_by_its_holder(outcome.as_ref()))
    })?;
    let verdict = match verdict {
        // (the time is read only for an attempt that has a deadline)
        Ok(record) if record.lease.as_ref().is_some_and(|l| l.deadline.is_some()) => {
            rules::before_deadline(record, write, now(tx, p)?)
        }
        verdict => verdict,
    };
    match verdict {
        Ok(record) => Ok(record),
        Err(refused) => {
            bump_all(tx, p, &refused.counts)?;
            Err(refused.lost.into())
        }
    }
}

/// The columns a rule may change, set from a record (the rest are a job's for life).
const SAVE: &str = "
UPDATE {s}.leasehold_jobs
SET state = $2, attempt = $3, failures = $4, run_at = {s}.at($5), lease_owner = $6,
    lease_claimed_at = {s}.at($7), lease_expires_at = {s}.at($8),
    lease_indexed_expiry = {s}.at($9), lease_length_us = $10, stall_timeout_us = $11,
    progress = $12, progress_at = {s}.at($13), cancel_requested = $14, last_error = $15,
    finished_at = {s}.at($16), updated_at = {s}.at($17), lease_deadline = {s}.at($18),
    key_released = $19
WHERE id = $1";

/// Stores a record a rule decided.
fn save(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: &JobRecord) -> Result<()> {
    let st = p.get(tx, SAVE)?;
    let lease = job.lease.as_ref();
    let params: [&(dyn ToSql + Sync); 19] = [
        &key(job.id),
        &job.state.name(),
        &i64::from(job.attempt.0),
        &i64::from(job.failures),
        &us(job.run_at),
        &lease.map(|l| l.owner.as_str()),
        &lease.map(|l| us(l.claimed_at)),
        &lease.map(|l| us(l.expires_at)),
        &lease.map(|l| us(l.indexed_expiry)),
        &lease.map(|l| micros(l.length)),
        &lease.and_then(|l| l.stall_timeout).map(micros),
        &clamp(job.progress),
        &us(job.progress_at),
        &job.cancel_requested,
        &job.last_error,
        &job.finished_at.map(us),
        &us(job.updated_at),
        &lease.and_then(|l| l.deadline).map(us),
        &job.key_released,
    ];
    tx.execute(&st, &params)?;
    Ok(())
}

/// Stores the end of an attempt a rule decided: the job moved on, the counters, and its
/// history row (a success's is kept in the job's row instead, as the batch completion keeps
/// it). The only place an attempt ends on the slow paths.
fn store_end(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    old: &JobRecord,
    change: Change,
) -> Result<JobRecord> {
    let Some(run) = &change.ended else {
        return Err(crate::rules::corrupt_running(old));
    };
    let Some(outcome) = &run.outcome else {
        return Err(crate::rules::corrupt_running(old));
    };
    save(tx, p, &change.job)?;
    bump_all(tx, p, &change.counts)?;
    if *outcome == Outcome::Succeeded {
        // Kept in the job's row, as the batch completion keeps it ([`COMPLETE_MANY`]): it
        // ended when the job finished, with the job's progress.
        let keep = p.get(
            tx,
            "UPDATE {s}.leasehold_jobs SET last_worker = $2, last_claimed_at = {s}.at($3)
             WHERE id = $1",
        )?;
        tx.execute(&keep, &[&key(old.id), &run.worker, &us(run.claimed_at)])?;
        return Ok(change.job);
    }
    let (kind, error, path, overdue) = outcome_columns(outcome);
    let (limit, snoozed_for) = match outcome {
        Outcome::TimedOut { limit } => (Some(micros(*limit)), None),
        Outcome::Snoozed { delay } => (None, Some(micros(*delay))),
        _ => (None, None),
    };
    let insert = p.get(
        tx,
        "INSERT INTO {s}.leasehold_runs
             (job, attempt, worker, claimed_at, ended_at, outcome, error, reclaim_path,
              overdue_us, progress, time_limit_us, snoozed_for_us)
         VALUES ($1, $2, $3, {s}.at($4), {s}.at($5), $6, $7, $8, $9, $10, $11, $12)",
    )?;
    let ended_at = run.ended_at.unwrap_or(change.job.updated_at);
    tx.execute(
        &insert,
        &[
            &key(old.id),
            &i64::from(run.attempt.0),
            &run.worker,
            &us(run.claimed_at),
            &us(ended_at),
            &kind,
            &error,
            &path,
            &overdue,
            &clamp(run.progress),
            &limit,
            &snoozed_for,
        ],
    )?;
    Ok(change.job)
}

/// Adds what a rule counted to the stored counters.
fn bump_all(tx: Tx<'_, '_>, p: &mut Prepared<'_>, c: &Counters) -> Result<()> {
    for (name, by) in c.named() {
        if by > 0 {
            bump(tx, p, name, clamp(by))?;
        }
    }
    if !c.worst_detection_delay.is_zero() {
        let worst = p.get(
            tx,
            "UPDATE {s}.leasehold_counters SET value = greatest(value, $1)
             WHERE name = 'worst_detection_delay_us'",
        )?;
        tx.execute(&worst, &[&micros(c.worst_detection_delay)])?;
    }
    Ok(())
}

/// The history row's outcome columns: kind, error, reclaim path, overdue (a time limit has
/// its own column, `time_limit_us`).
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
        Outcome::FailedPermanently(e) => ("failed_permanently", Some(e.as_str()), None, None),
        Outcome::TimedOut { .. } => ("timed_out", None, None, None),
        Outcome::Snoozed { .. } => ("snoozed", None, None, None),
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

/// The `leasehold_meta` key of the last reaper pass.
pub(crate) const REAPER_PASS: &str = "reaper.last_pass";

/// Records the reaper pass that began at `began` and did `report` as the store's last (the
/// crate's codec, hex in the meta table's text).
pub(crate) fn note_reaper_pass(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    report: &crate::ReapReport,
    began: StoreTime,
    every: Option<Duration>,
) -> Result<()> {
    let pass = crate::ReaperPass::of(report, began, now(tx, p)?, every);
    let st = p.get(
        tx,
        "INSERT INTO {s}.leasehold_meta (key, value) VALUES ($1, encode($2, 'hex'))
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?;
    tx.execute(&st, &[&REAPER_PASS, &crate::codec::encode(&pass)])?;
    Ok(())
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
SELECT id FROM gone";

/// Deletes up to `limit` terminal jobs in `states` that finished at least `older_than` ago,
/// with their history (looking at no other row). Called in batches, so that a purge of a
/// large backlog holds no lock for long and leaves autovacuum bounded work each time.
pub(crate) fn purge_batch(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    older_than: Duration,
    states: &[JobState],
    limit: usize,
) -> Result<Batch<JobId>> {
    let st = p.get(tx, PURGE)?;
    let states: Vec<&str> = states
        .iter()
        .filter(|s| s.is_terminal())
        .map(|s| s.name())
        .collect();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let gone = tx
        .query(&st, &[&micros(older_than), &states, &limit])?
        .iter()
        .map(|row| Ok(id(row.col(0)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Batch {
        looked: gone.len(),
        items: gone,
    })
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
