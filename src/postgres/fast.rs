//! The statements PostgreSQL runs where one statement does for many rows what the
//! protocol's steps do one row at a time. They are why a pool on PostgreSQL outruns peers
//! that spend statements per job. Each is a step the protocol asks for ([`Records`]); the
//! sequence around it (when it may serve, what follows it: events, a key's count, the
//! waiters an end releases) is the protocol's, the same for every engine:
//!
//! | statement | the step | in the protocol |
//! |---|---|---|
//! | [`INSERT`], [`INSERT_MANY`] | [`Records::insert_plain`] | `protocol::enqueue`, `enqueue_batch` |
//! | [`LOOK`] | [`Records::claim_look`] | `protocol::claim_batch` |
//! | [`CLAIM`], [`KEYED_CLAIM`] | [`Records::take_waiting`] (beside a round's completions: `records.rs`) | `protocol::claim_batch` |
//! | [`RENEW_MANY`] | [`Records::renew_fenced`] | `protocol::renew_batch` |
//! | [`COMPLETE_MANY`] | [`Records::complete_fenced`] | `protocol::complete`, `complete_many` |
//! | the served mark | [`Records::mark_served`] | `protocol::mark_served` |
//!
//! and, of the engine alone, a round's row locks ([`LOCK_RUNNING`]), the reaper's note and
//! a purge's batch ([`PURGE`]). Where a statement finds a row it cannot decide for (a
//! refused fence, a cancel, a stall, an expired lease, a key without room), it leaves the
//! row to the protocol's own steps, which say why; the shared suites (model, conformance,
//! lease store) run PostgreSQL with these statements and without them, and hold both to the
//! same answers.
//!
//! Every time a statement reads or writes is the database's clock (`clock_timestamp()`, not
//! `now()`, which is the transaction's start), taken once per statement (the `c` CTE) so
//! that a statement sees one instant.

use std::collections::HashMap;
use std::time::Duration;

use postgres::types::ToSql;

use super::Prepared;
use super::listen::tell_followers;
use super::named::{queue_columns, queue_from};
use super::rows::{
    Col, attempt, clamp, id, key, metadata_column, micros, time, token, token_column,
};
use super::transaction::{PgRecords, Tx};
use crate::batches::Batch;
use crate::error::Result;
use crate::ids::{GroupId, JobId, LeaseToken, StoreTime};
use crate::lease::{Holding, Lease, LeaseTerms};
use crate::new_job::NewJob;
use crate::protocol::{self, ClaimLook, Completed, Records, Taken};
use crate::rules::{self, claim_order_sql, key_order_sql};
use crate::state::JobState;

// ----- enqueue: `Records::insert_plain` -----

/// A plain job in one statement, its times the database's.
const INSERT: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t)
INSERT INTO {s}.leasehold_jobs
    (queue, state, priority, max_attempts, created_at, run_at, progress_at, updated_at,
     payload, time_limit_us, metadata)
SELECT $1, 'queued', $2, $3, c.t, c.t + $4::bigint * interval '1 microsecond', c.t, c.t, $5,
    $6, $7 FROM c
RETURNING id";

/// Plain jobs without metadata in one statement, their ids given in their order (rows are
/// made, and take their ids from the sequence, in the order of the array).
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

/// [`Records::insert_plain`]: each run of jobs without metadata by [`INSERT_MANY`], each
/// other job by [`INSERT`] (an array of metadata arrays would have to be of one length).
pub(crate) fn insert_plain(r: &mut PgRecords<'_, '_, '_>, jobs: &[NewJob]) -> Result<Vec<JobId>> {
    let mut ids = Vec::with_capacity(jobs.len());
    for run in jobs.chunk_by(|a, b| a.metadata.is_empty() && b.metadata.is_empty()) {
        match run {
            [new] => ids.push(insert(r, new)?),
            run => ids.extend(insert_many(r, run)?),
        }
    }
    Ok(ids)
}

/// One job by [`INSERT`].
fn insert(r: &mut PgRecords<'_, '_, '_>, new: &NewJob) -> Result<JobId> {
    let st = r.p.get(r.tx, INSERT)?;
    let budget = i64::from(new.max_attempts.unwrap_or(r.policy().default_max_attempts));
    let params: [&(dyn ToSql + Sync); 7] = [
        &new.queue,
        &new.priority,
        &budget,
        &micros(new.wait()),
        &new.payload,
        &new.time_limit.map(micros),
        &metadata_column(&new.metadata),
    ];
    Ok(id(r.tx.query_one(&st, &params)?.col(0)?))
}

/// Jobs without metadata by [`INSERT_MANY`], their ids in their order.
fn insert_many(r: &mut PgRecords<'_, '_, '_>, jobs: &[NewJob]) -> Result<Vec<JobId>> {
    let st = r.p.get(r.tx, INSERT_MANY)?;
    let default_budget = r.policy().default_max_attempts;
    let queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
    let budgets: Vec<i64> = jobs
        .iter()
        .map(|j| i64::from(j.max_attempts.unwrap_or(default_budget)))
        .collect();
    let delays: Vec<i64> = jobs.iter().map(|j| micros(j.wait())).collect();
    let payloads: Vec<&[u8]> = jobs.iter().map(|j| j.payload.as_slice()).collect();
    let limits: Vec<Option<i64>> = jobs.iter().map(|j| j.time_limit.map(micros)).collect();
    let params: [&(dyn ToSql + Sync); 6] =
        [&queues, &priorities, &budgets, &delays, &payloads, &limits];
    let mut ids =
        r.tx.query(&st, &params)?
            .iter()
            .map(|row| row.col::<i64>(0).map(id))
            .collect::<Result<Vec<JobId>>>()?;
    ids.sort();
    Ok(ids)
}

// ----- claim -----

/// [`crate::rules::grant`] as the `SET` of an `UPDATE` of the jobs table aliased `j`, at the
/// time `c.t`: `$3` the worker, `$4` the lease's length and `$5` its stall timeout (in
/// microseconds), `$7` the claimer's time limit, `$8` the lease's token. (The caller's
/// `WHERE` leaves out a job whose attempt counter is exhausted.)
macro_rules! grant_sql {
    () => {
        "SET state = 'running', attempt = j.attempt + 1, lease_token = $8, lease_owner = $3,
        lease_claimed_at = c.t,
        -- rules::grant: the deadline is the job's own limit or the claimer's; the lease
        -- never runs past it (least() passes over a NULL deadline)
        lease_deadline = c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond',
        lease_expires_at = least(c.t + $4::bigint * interval '1 microsecond',
            c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond'),
        lease_indexed_expiry = least(c.t + $4::bigint * interval '1 microsecond',
            c.t + coalesce(j.time_limit_us, $7::bigint) * interval '1 microsecond'),
        lease_length_us = $4::bigint, stall_timeout_us = $5::bigint, progress = 0,
        progress_at = c.t, updated_at = c.t"
    };
}

/// What a grant returns ([`claim_waiting`] reads it): id, attempt, the time of the claim,
/// the expiry, the payload, and the job's place in the claim order, its deadline.
macro_rules! granted_sql {
    () => {
        "RETURNING j.id, j.attempt, {s}.us(c.t) AS t, {s}.us(j.lease_expires_at) AS expires,
        j.payload, j.priority, {s}.us(j.run_at) AS run_at, {s}.us(j.lease_deadline) AS deadline"
    };
}

const CLAIM: &str = concat!(
    "
WITH c AS MATERIALIZED (SELECT {now} AS t),
picked AS (
    -- The time as a scalar (an InitPlan), not a join with c: the ready index's order then
    -- serves the ORDER BY and the scan stops at the LIMIT. Joined, the rows came out of the
    -- join's inner side, whose order the planner does not keep, and every claim read and
    -- sorted every waiting job of the queue to take a few hundred (the guard test:
    -- suite::a_claim_reads_the_jobs_it_takes_not_every_waiting_job_of_the_queue).
    -- (A job with a limit key is the protocol's: LOOK sends a queue with one waiting there,
    -- and one that arrives meanwhile is passed over here.)
    SELECT id, attempt, coalesce(expires_at <= (SELECT t FROM c), false) AS late
    FROM {s}.leasehold_jobs
    WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND NOT parked
        AND run_at <= (SELECT t FROM c) AND limit_key IS NULL
    ORDER BY ",
    claim_order_sql!(),
    "
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
granted AS (
    UPDATE {s}.leasehold_jobs j
    ",
    grant_sql!(),
    "
    FROM picked, c
    WHERE j.id = picked.id AND picked.attempt < 4294967295 AND NOT picked.late
    ",
    granted_sql!(),
    "
),
-- rules::grant: a job whose attempt counter is exhausted is dead, never leased again
exhausted AS (
    UPDATE {s}.leasehold_jobs j
    SET state = 'dead', finished_at = c.t, updated_at = c.t, last_error = $6
    FROM picked, c
    WHERE j.id = picked.id AND picked.attempt >= 4294967295 AND NOT picked.late
    RETURNING j.id, j.awaited, j.grp, 'dead' AS state
),
-- rules::grant: a job past its expiry is expired, never started
expired AS (
    UPDATE {s}.leasehold_jobs j
    SET state = 'expired', finished_at = c.t, updated_at = c.t
    FROM picked, c
    WHERE j.id = picked.id AND picked.late
    RETURNING j.id, j.awaited, j.grp, 'expired' AS state
),
-- each end kept, in this transaction (`crate::endings`)
noted AS (
    INSERT INTO {s}.leasehold_endings (job, queue, state, at)
    SELECT e.id, $1, e.state, c.t
    FROM (SELECT id, state FROM exhausted UNION ALL SELECT id, state FROM expired) e, c
)
SELECT id, attempt, t, expires, payload, priority, run_at, deadline, NULL::boolean, NULL::bigint,
    NULL::text
FROM granted
UNION ALL
SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, awaited, grp, state FROM exhausted
UNION ALL
SELECT id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, awaited, grp, state FROM expired"
);

/// [`CLAIM`] for a queue where jobs with a limit key wait: what [`protocol::next_claim`] and
/// [`protocol::keys`]' `has_room` and `settle` do for a key's head, in one statement.
///
/// It takes the most urgent claimable jobs up to and including the first with a key (taking
/// that one may make the next job of its key the head, which a claim one at a time would
/// meet before the rest), and only if each of them is one it can decide for: the keyed one
/// is its key's head, its key has room under the queue's per-key limit, no attempt counter
/// is exhausted, no expiry has come. Then it grants them, counts the key's new running job, makes the first of
/// the key's waiting jobs in the key's order its head while the key has room (left headless
/// if another transaction holds that job, as `settle` leaves it), and unparks that head.
/// Otherwise it grants nothing and says so (`blocked`): the protocol's own steps take the
/// next job, and say why. (A queue with a per-key rate is the protocol's: its window.) `$6`
/// is the queue's per-key limit, as the claim read it with the queue's record; `$9` the
/// channel of the store's notifications.
const KEYED_CLAIM: &str = concat!(
    "
WITH c AS MATERIALIZED (SELECT {now} AS t),
picked AS MATERIALIZED (
    SELECT id, attempt, limit_key, priority, run_at,
        coalesce(expires_at <= (SELECT t FROM c), false) AS late
    FROM {s}.leasehold_jobs
    WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND NOT parked
        AND run_at <= (SELECT t FROM c)
    ORDER BY ",
    claim_order_sql!(),
    "
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
-- those a claim of one job at a time takes first: up to the first with a key
first AS MATERIALIZED (
    SELECT * FROM picked a WHERE NOT EXISTS (
        SELECT 1 FROM picked b WHERE b.limit_key IS NOT NULL
            AND (b.priority, b.run_at, b.id) < (a.priority, a.run_at, a.id))
),
-- its key's record, held: one key's claims and ends count its running jobs one at a time
key_row AS MATERIALIZED (
    -- (the key as a scalar, so that it bounds the index scan: the first job has one at most)
    SELECT k.key, k.running, k.head FROM {s}.leasehold_limit_keys k
    WHERE k.queue = $1 AND k.key = (SELECT limit_key FROM first WHERE limit_key IS NOT NULL)
    FOR UPDATE
),
keyed AS MATERIALIZED (
    SELECT f.id, f.limit_key AS key,
        -- rules::key_has_room, now and with the job it starts
        coalesce(k.head = f.id AND ($6::integer IS NULL OR k.running < $6::integer), false) AS ok,
        coalesce($6::integer IS NULL OR k.running + 1 < $6::integer, false) AS room_after
    FROM first f LEFT JOIN key_row k ON k.key = f.limit_key
    WHERE f.limit_key IS NOT NULL
),
go AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT 1 FROM keyed WHERE NOT ok)
        AND NOT EXISTS (SELECT 1 FROM first WHERE attempt >= 4294967295 OR late) AS ok
),
-- rules::key_head: the first of the key's waiting jobs in the key's order, if it can be held
head AS MATERIALIZED (
    SELECT j.id, j.parked FROM {s}.leasehold_jobs j
    WHERE (SELECT ok FROM go) AND j.id = (
        -- (scalars again: the key's index serves the order and the scan stops at one)
        SELECT n.id FROM {s}.leasehold_jobs n
        WHERE (SELECT room_after FROM keyed) AND n.queue = $1
            AND n.limit_key = (SELECT key FROM keyed)
            AND n.state IN ('queued', 'retry_wait') AND n.id <> (SELECT id FROM keyed)
        ORDER BY ",
    key_order_sql!(),
    "
        LIMIT 1)
    FOR UPDATE SKIP LOCKED
),
granted AS (
    UPDATE {s}.leasehold_jobs j
    ",
    grant_sql!(),
    "
    FROM first f, c
    WHERE j.id = f.id AND (SELECT ok FROM go)
    ",
    granted_sql!(),
    "
),
unparked AS (
    UPDATE {s}.leasehold_jobs j SET parked = false FROM head h
    WHERE j.id = h.id AND h.parked
    RETURNING j.id
),
counted AS (
    UPDATE {s}.leasehold_limit_keys k
    SET running = k.running + 1, head = (SELECT id FROM head), recent = '{}', opens_at = NULL
    FROM keyed kd
    WHERE k.queue = $1 AND k.key = kd.key AND (SELECT ok FROM go)
    RETURNING k.key
),
-- the head it unparked readies the queue: its idle workers are woken (`Records::readied`)
told AS (SELECT pg_notify($9, $1) FROM unparked)
SELECT id, attempt, t, expires, payload, priority, run_at, deadline,
    (SELECT count(*) FROM told) > 0 AS readied, false AS blocked
FROM granted
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true FROM go WHERE NOT ok"
);

/// [`Records::claim_look`] in one statement ([`LOOK`]).
pub(crate) fn claim_look(r: &mut PgRecords<'_, '_, '_>, queue: &str) -> Result<ClaimLook> {
    let look = r.p.get(r.tx, LOOK)?;
    let row = r.tx.query_one(&look, &[&queue])?;
    Ok(ClaimLook {
        expired: row.col::<Option<i64>>(0)?.is_some(),
        record: queue_from(&row, 1)?,
        keyed: row.col::<bool>(1 + super::named::QUEUE_COLUMNS)?,
    })
}

/// One [`KEYED_CLAIM`] for up to `n` jobs of `queue`, under the queue's per-key limit:
/// `None` where it could not decide for the most urgent job ([`protocol::next_claim`] takes
/// it, and says why).
pub(crate) fn claim_keyed(
    r: &mut PgRecords<'_, '_, '_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
    per_key: Option<u32>,
) -> Result<Option<Taken>> {
    let claim = r.p.get(r.tx, KEYED_CLAIM)?;
    let g = Grant::of(terms);
    let limit = i64::try_from(n).unwrap_or(i64::MAX);
    let per_key = per_key.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    let channel = &r.p.names.channel;
    let params: [&(dyn ToSql + Sync); 9] = [
        &queue,
        &limit,
        &worker,
        &g.length,
        &g.stall,
        &per_key,
        &g.time_limit,
        &g.token_column,
        channel,
    ];
    // (it may have waited for a key's row)
    r.waited();
    let rows = r.tx.query(&claim, &params)?;
    if rows.first().map(|row| row.col::<bool>(9)).transpose()? == Some(true) {
        return Ok(None);
    }
    for row in &rows {
        if row.col::<Option<bool>>(8)? == Some(true) {
            r.notified_by_statement(queue);
        }
    }
    let leases = g.leases(rows.iter(), queue, worker)?;
    // (a keyed claim decides for no late job: it leaves one to the protocol's steps)
    Ok(Some(Taken {
        more: !leases.is_empty(),
        leases,
        dead: Vec::new(),
        expired: Vec::new(),
    }))
}

/// What a grant's statement writes of a claimer's terms (in microseconds), and the token of
/// its leases: one for the leases of a statement, since a token tells a lease from another
/// granted for the same attempt of the same job, which no statement grants twice.
struct Grant {
    terms: LeaseTerms,
    length: i64,
    stall: Option<i64>,
    time_limit: Option<i64>,
    token: LeaseToken,
    token_column: i64,
}

impl Grant {
    fn of(terms: LeaseTerms) -> Grant {
        let token = LeaseToken::fresh();
        Grant {
            terms,
            length: micros(terms.length),
            stall: terms.stall_timeout.map(micros),
            time_limit: terms.time_limit.map(micros),
            token,
            token_column: super::rows::token_column(token),
        }
    }

    /// The leases of the rows it granted ([`granted_sql`]), in the claim order.
    fn leases<'r>(
        &self,
        rows: impl Iterator<Item = &'r postgres::Row>,
        queue: &str,
        worker: &str,
    ) -> Result<Vec<Lease>> {
        let mut claimed = rows
            .map(|row| {
                let order = (row.col::<i32>(5)?, row.col::<i64>(6)?, row.col::<i64>(0)?);
                Ok((order, granted(row, queue, worker, self.token, self.terms)?))
            })
            .collect::<Result<Vec<_>>>()?;
        claimed.sort_by_key(|(order, _)| *order);
        Ok(claimed.into_iter().map(|(_, lease)| lease).collect())
    }
}

/// The lease of a row [`granted_sql`] returned.
fn granted(
    row: &postgres::Row,
    queue: &str,
    worker: &str,
    token: LeaseToken,
    terms: LeaseTerms,
) -> Result<Lease> {
    Ok(Lease {
        job: id(row.col(0)?),
        attempt: attempt(row.col(1)?)?,
        token,
        queue: queue.to_owned(),
        worker: worker.to_owned(),
        claimed_at: time(row.col(2)?),
        due_at: time(row.col(6)?),
        expires_at: time(row.col(3)?),
        length: terms.length,
        deadline: row.col::<Option<i64>>(7)?.map(time),
        payload: row.col(4)?,
    })
}

/// Tells the followers of the endings, if one follows ([`tell_followers`]), when the
/// transaction commits: for a statement that kept endings without telling them.
const TELL_FOLLOWERS: &str = concat!("WITH ", tell_followers!(), " SELECT count(*) FROM told");

/// One [`CLAIM`] of up to `n` waiting jobs of `queue`. Jobs it found exhausted (and made
/// dead) or past their expiry (and expired) leave room for as many more: it then says there
/// may be more. Returns what it
/// took, and the ids of every job it took or made dead.
pub(crate) fn claim_waiting(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    worker: &str,
    terms: LeaseTerms,
    n: usize,
) -> Result<(Taken, Vec<i64>)> {
    let claim = p.get(tx, CLAIM)?;
    let g = Grant::of(terms);
    let limit = i64::try_from(n).unwrap_or(i64::MAX);
    let params: [&(dyn ToSql + Sync); 8] = [
        &queue,
        &limit,
        &worker,
        &g.length,
        &g.stall,
        &rules::ATTEMPTS_EXHAUSTED,
        &g.time_limit,
        &g.token_column,
    ];
    let rows = tx.query(&claim, &params)?;
    let (mut taken, mut touched) = (Taken::default(), Vec::with_capacity(rows.len()));
    let mut granted = Vec::with_capacity(rows.len());
    for row in &rows {
        touched.push(row.col::<i64>(0)?);
        if row.col::<Option<i64>>(1)?.is_some() {
            granted.push(row);
            continue;
        }
        taken.more = true;
        if !p.ended {
            // (the claim's statement does not tell: ending jobs is seldom what it does)
            let tell = p.get(tx, TELL_FOLLOWERS)?;
            tx.query(&tell, &[])?;
        }
        p.ended = true;
        let state = match row.col::<Option<&str>>(10)? {
            Some("expired") => JobState::Expired,
            _ => JobState::Dead,
        };
        if state == JobState::Expired {
            taken.expired.push(id(row.col(0)?));
        }
        if row.col::<Option<bool>>(8)? == Some(true) {
            let group = row.col::<Option<i64>>(9)?;
            let group = group.map(|g| GroupId(u64::try_from(g).unwrap_or(0)));
            taken.dead.push((id(row.col(0)?), state, group));
        }
    }
    taken.leases = g.leases(granted.into_iter(), queue, worker)?;
    Ok((taken, touched))
}

/// A claim's first look, in one statement: whether a lease of the queue has expired, the
/// queue's record (all null without one), and whether jobs with a limit key wait in it. It
/// locks nothing: a takeover locks its row when it takes it ([`FIRST_EXPIRED`]), after the
/// claim has waited for the completions beside it (see `PgRecords::beside`); a
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
    ", EXISTS (SELECT 1 FROM {s}.leasehold_jobs
              WHERE queue = $1 AND limit_key IS NOT NULL AND state IN ('queued', 'retry_wait'))
     FROM (SELECT 1) one LEFT JOIN {s}.leasehold_queues q ON q.queue = $1"
);

// ----- locks -----

/// The running rows of `jobs`, locked in the order of their ids ("Locked in id order",
/// below).
const LOCK_RUNNING: &str = "SELECT id FROM {s}.leasehold_jobs
WHERE id = ANY($1) AND (state = 'running') IS TRUE ORDER BY id FOR UPDATE";

/// Locks the rows of `jobs` that are running, in the order of their ids, for a transaction
/// that then writes them in another order: a round's completions one by one (each with
/// the application's writes, in the order the workers finished). Two rounds, or a round
/// and a heartbeat's renewals, that met two rows the other way round deadlocked. Only
/// running rows: a completion's row is running unless its lease was lost, and a waiting
/// row is one a claim beside this transaction may be about to take.
pub(crate) fn lock_running(
    r: &mut PgRecords<'_, '_, '_>,
    jobs: &mut dyn Iterator<Item = JobId>,
) -> Result<()> {
    let mut ids: Vec<i64> = jobs.map(key).collect();
    ids.sort_unstable();
    ids.dedup();
    let st = r.p.get(r.tx, LOCK_RUNNING)?;
    r.waited();
    r.tx.execute(&st, &[&ids])?;
    Ok(())
}

// ----- heartbeat -----

// Found by id, never by the index of running jobs. A statement that finds rows by id
// (`id = ANY($1)`) and asks that they be running writes `(state = 'running') IS TRUE`, which
// the planner cannot match to the predicate of `leasehold_jobs_expiry` (`WHERE state =
// 'running'`): with `state = 'running'` it read that whole index beside the primary key's
// entries and intersected the two (a `BitmapAnd`), every running job's entry and every dead
// one a drain leaves until vacuum, in every completion and renewal.

// Locked in id order. The statements that write many jobs by id (RENEW_MANY,
// COMPLETE_MANY) lock their rows first, in a `locked` CTE, in the order of the ids. An
// `UPDATE ... FROM unnest(...)` locks rows in the order its plan meets them, which the
// planner chooses: the partial index of running jobs, in the order of their lease expiry
// (which renewals change), or the ids passed. A pool's heartbeat renews the leases of jobs
// its own round is completing, on another connection: two orders, and each pair of such
// statements that met two rows the other way round deadlocked, costing both a second of
// PostgreSQL's `deadlock_timeout` and the round a retry (489 times in one run of the
// PostgreSQL suite). In one order, no statement holds a row another waits for while it
// waits for one the other holds. It costs a second probe of each row's key.

const RENEW_MANY: &str = "
WITH c AS MATERIALIZED (SELECT {now} AS t),
r AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
      AS r(id, attempt, token, progress)),
-- (the rows locked in the order of their ids first: see above; running ones only, as
-- COMPLETE_MANY's)
locked AS MATERIALIZED (
    SELECT id FROM {s}.leasehold_jobs WHERE id = ANY($1) AND (state = 'running') IS TRUE
    ORDER BY id FOR UPDATE
)
UPDATE {s}.leasehold_jobs j
SET lease_expires_at = greatest(j.lease_expires_at,
        least(c.t + j.lease_length_us * interval '1 microsecond', j.lease_deadline)),
    progress = r.progress,
    progress_at = CASE WHEN j.progress = r.progress THEN j.progress_at ELSE c.t END,
    updated_at = c.t
FROM c, r, locked
WHERE j.id = r.id AND j.id = locked.id AND j.attempt = r.attempt AND j.lease_token = r.token
    AND (j.state = 'running') IS TRUE AND NOT j.cancel_requested
    AND NOT (j.stall_timeout_us IS NOT NULL AND j.progress = r.progress
             AND c.t - j.progress_at >= j.stall_timeout_us * interval '1 microsecond')
    AND NOT coalesce(j.lease_deadline <= c.t, false)
RETURNING j.id, j.attempt, j.lease_token, {s}.us(j.lease_expires_at)";

/// [`Records::renew_fenced`] in one statement ([`RENEW_MANY`]).
pub(crate) fn renew_fenced(
    r: &mut PgRecords<'_, '_, '_>,
    leases: &[(Holding, u64)],
) -> Result<HashMap<Holding, StoreTime>> {
    if !r.shortcuts() {
        return Ok(HashMap::new());
    }
    let renew = r.p.get(r.tx, RENEW_MANY)?;
    // (a pool renews the jobs it is also completing: in id order, as completions)
    let mut sorted = leases.to_vec();
    let [ids, attempts, tokens] = in_id_order(&mut sorted, |l| l.0);
    let progress: Vec<i64> = sorted.iter().map(|l| clamp(l.1)).collect();
    // Keyed by job, attempt and token: a batch may hold a stale lease beside the live one
    // of the same job, and only the live one was renewed.
    r.tx.query(&renew, &[&ids, &attempts, &tokens, &progress])?
        .iter()
        .map(|row| Ok((holding(row)?, time(row.col(3)?))))
        .collect()
}

/// Sorts `items` by their jobs' ids, for a statement that locks their rows in that order
/// ("Locked in id order", above), and gives their holdings' columns: ids, attempts, tokens.
fn in_id_order<T>(items: &mut [T], by: impl Fn(&T) -> Holding) -> [Vec<i64>; 3] {
    items.sort_by_key(|item| by(item).job);
    let column =
        |f: &dyn Fn(Holding) -> i64| -> Vec<i64> { items.iter().map(|item| f(by(item))).collect() };
    [
        column(&|h| key(h.job)),
        column(&|h| i64::from(h.attempt.0)),
        column(&|h| token_column(h.token)),
    ]
}

/// The holding a statement returned first: its job's id, attempt and lease token.
fn holding(row: &postgres::Row) -> Result<Holding> {
    Ok(Holding {
        job: id(row.col(0)?),
        attempt: attempt(row.col(1)?)?,
        token: token(row.col(2)?),
    })
}

// ----- ends of an attempt -----

/// Completes attempts whose fence holds, in one statement: updates each row under the fence
/// (`id AND attempt AND lease_token AND state = 'running'`), which locks it and ends the attempt, moving its
/// holder and claim time from the lease to the row's last attempt (`last_worker`,
/// `last_claimed_at`: the history of a succeeded job reads its last attempt there, and no
/// history row is written; see `MIGRATE_FROM_2` in the schema).
///
/// The rows are locked in the order of their ids first ("Locked in id order", above).
const COMPLETE_MANY: &str = concat!(
    "
WITH c AS MATERIALIZED (SELECT {now} AS t),
-- (running rows only: a waiting one, of a lease given back, is one a claim beside this
-- statement may be about to take, and locked here it would be passed over)
locked AS MATERIALIZED (
    SELECT id FROM {s}.leasehold_jobs WHERE id = ANY($1) AND (state = 'running') IS TRUE
    ORDER BY id FOR UPDATE
),
done AS (
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
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bytea[], $5::bigint[])
         AS r(id, attempt, token, output, progress),
     c, locked
WHERE j.id = r.id AND j.id = locked.id AND j.attempt = r.attempt AND j.lease_token = r.token
    AND (j.state = 'running') IS TRUE
    -- rules::before_deadline: an attempt past its deadline is left to the one-by-one path,
    -- which refuses the completion
    AND NOT coalesce(j.lease_deadline <= c.t, false)
RETURNING j.id, j.attempt, j.lease_token, j.awaited, j.grp, j.queue, j.limit_key
),
-- each end kept, in this transaction (`crate::endings`): in rows of up to 500, in the
-- order of the jobs' ids, of one queue or of each job's (`since_14` in the schema)
ended AS (
    SELECT count(*) AS n, array_agg(id ORDER BY id) AS jobs,
        CASE WHEN min(queue) = max(queue) THEN min(queue) END AS queue,
        CASE WHEN min(queue) <> max(queue) THEN array_agg(queue ORDER BY id) END AS queues
    FROM (SELECT id, queue, (row_number() OVER (ORDER BY id) - 1) / 500 AS part FROM done) d
    GROUP BY part
),
noted AS (
    INSERT INTO {s}.leasehold_endings (n, jobs, queue, queues, state, at)
    SELECT e.n, e.jobs, e.queue, e.queues, 'succeeded', c.t FROM ended e, c
    ORDER BY e.jobs[1]
),
-- the followers of the endings told when it commits, if one follows (`listen.rs`); run
-- once, and only if a row was completed
",
    tell_followers!(),
    "
SELECT id, attempt, lease_token, awaited, grp, queue, limit_key, (SELECT count(*) FROM told)
FROM done"
);

/// [`Records::complete_fenced`] in one statement ([`COMPLETE_MANY`]).
pub(crate) fn complete_fenced(
    r: &mut PgRecords<'_, '_, '_>,
    done: &[(Holding, &[u8], Option<u64>)],
) -> Result<Vec<Completed>> {
    if !r.shortcuts() {
        return Ok(Vec::new());
    }
    let st = r.p.get(r.tx, COMPLETE_MANY)?;
    let mut done = done.to_vec();
    let [ids, attempts, tokens] = in_id_order(&mut done, |d| d.0);
    let outputs: Vec<&[u8]> = done.iter().map(|d| d.1).collect();
    let progress: Vec<Option<i64>> = done.iter().map(|d| d.2.map(clamp)).collect();
    let rows =
        r.tx.query(&st, &[&ids, &attempts, &tokens, &outputs, &progress])?;
    r.p.ended |= !rows.is_empty();
    rows.iter()
        .map(|row| {
            Ok(Completed {
                by: holding(row)?,
                awaited: row.col(3)?,
                queue: row.col(5)?,
                key: row.col(6)?,
                group: row
                    .col::<Option<i64>>(4)?
                    .map(|g| GroupId(u64::try_from(g).unwrap_or(0))),
            })
        })
        .collect()
}

/// Marks `queues` as served now: a worker asked them for work or renewed one of their
/// leases (see [`crate::queue`]).
pub(crate) fn mark_served(r: &mut PgRecords<'_, '_, '_>, queues: &[String]) -> Result<()> {
    if queues.is_empty() {
        return Ok(());
    }
    if !r.shortcuts() {
        for queue in queues {
            protocol::mark_served(r, queue)?;
        }
        return Ok(());
    }
    let st = r.p.get(
        r.tx,
        "INSERT INTO {s}.leasehold_queues AS q (queue, served_at)
         SELECT unnest($1::text[]), {now}
         ON CONFLICT (queue) DO UPDATE
         SET served_at = greatest(q.served_at, excluded.served_at)",
    )?;
    r.tx.execute(&st, &[&queues])?;
    Ok(())
}

/// The `leasehold_meta` key of the last reaper pass.
pub(crate) const REAPER_PASS: &str = "reaper.last_pass";

/// Keeps `pass` as the store's last reaper pass (the crate's codec, hex in the meta table's
/// text).
pub(crate) fn note_reaper_pass(
    c: &mut impl postgres::GenericClient,
    p: &mut Prepared<'_>,
    pass: &crate::report::ReaperPass,
) -> Result<()> {
    let st = p.get(
        c,
        "INSERT INTO {s}.leasehold_meta (key, value) VALUES ($1, encode($2, 'hex'))
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?;
    c.execute(&st, &[&REAPER_PASS, &crate::codec::encode(pass)])?;
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
runs AS (DELETE FROM {s}.leasehold_runs WHERE job IN (SELECT id FROM gone)),
-- Records::delete: what waited for a finished job goes with it (its end released or
-- cancelled every waiter already). A purged waiter's own entries stay until its
-- dependencies are purged: a lookup by waiter has no index, and a waiter not found is
-- passed over.
waits AS (DELETE FROM {s}.leasehold_waits WHERE job IN (SELECT id FROM gone)),
checkpoints AS (DELETE FROM {s}.leasehold_checkpoints WHERE job IN (SELECT id FROM gone)),
logs AS (DELETE FROM {s}.leasehold_logs WHERE job IN (SELECT id FROM gone)),
-- (a request of a finished job was applied or refused: the refused ones go with it)
requests AS (DELETE FROM {s}.leasehold_requests WHERE job IN (SELECT id FROM gone))
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
