//! The read side, as functions over a transaction: jobs, history, counts, schedule, the
//! integrity check. Reads take no row locks (a claim's `SKIP LOCKED` would pass over a job
//! an operator is only looking at).

use std::time::Duration;

use postgres::Transaction;

use super::named::queue_columns;
use super::rows::{Col, attempt, job_by, job_columns, key, outcome_from, record, time};
use super::{Prepared, transaction::now};
use crate::endings::{EndCursor, EndOf, EndRecord, Endings};
use crate::error::{Error, Result};
use crate::ids::GroupId;
use crate::ids::{JobId, StoreTime};
use crate::job::{JobRecord, RunRecord};
use crate::rules::claim_order_sql;
use crate::state::JobState;
use crate::stats::{Counters, Stats};

type Tx<'a, 'b> = &'a mut Transaction<'b>;

const JOB: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {s}.leasehold_jobs WHERE id = $1"
);

/// The job's record as it is now.
pub(crate) fn job(tx: Tx<'_, '_>, p: &mut Prepared<'_>, id: JobId) -> Result<Option<JobRecord>> {
    let st = p.get(tx, JOB)?;
    job_by(tx, &st, id)
}

const LIST: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {s}.leasehold_jobs
WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2)
    AND metadata @> $4::text[]
    AND ($5::bigint IS NULL OR updated_at <= {now} - $5::bigint * interval '1 microsecond')
    AND ($6::bigint IS NULL OR id > $6) AND ($7::bigint IS NULL OR grp = $7)"
);

/// Jobs matching `filter`, in its order (for operators and tools).
pub(crate) fn list(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    filter: &crate::query::JobFilter,
) -> Result<Vec<JobRecord>> {
    use crate::query::JobOrder;
    let order = match filter.order {
        JobOrder::Oldest => " ORDER BY id",
        JobOrder::Newest => " ORDER BY id DESC",
        JobOrder::Priority => concat!(" ORDER BY ", claim_order_sql!()),
        JobOrder::Updated => " ORDER BY updated_at DESC, id DESC",
    };
    let limit = filter
        .limit
        .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX));
    // Running and waiting jobs have partial indexes (`leasehold_jobs_expiry`, `_ready`):
    // their ids are taken from the index first, or the planner, expecting matches to be
    // spread evenly, walks the primary key in order and filters every finished row on the
    // way (1.7 s on a million bloated rows, against 24 ms this way).
    let narrow = match filter.state {
        Some(JobState::Running) => {
            " AND id = ANY(ARRAY(SELECT id FROM {s}.leasehold_jobs WHERE state = 'running' \
             AND ($1::text IS NULL OR queue = $1)))"
        }
        Some(JobState::Queued | JobState::RetryWait) => {
            // (parked jobs, out of the ready index, all have a limit key: its index has them)
            " AND id = ANY(ARRAY(SELECT id FROM {s}.leasehold_jobs \
             WHERE state IN ('queued', 'retry_wait') AND NOT parked \
             AND ($1::text IS NULL OR queue = $1)) || ARRAY(SELECT id FROM {s}.leasehold_jobs \
             WHERE state IN ('queued', 'retry_wait') AND limit_key IS NOT NULL \
             AND ($1::text IS NULL OR queue = $1)))"
        }
        _ => "",
    };
    if !narrow.is_empty() {
        // A bitmap scan of the partial index visits every entry a row left behind when it
        // stopped running or waiting (one per job that ran, until a vacuum) and marks none
        // of them dead, so every listing pays for them again; the planner chooses one before
        // autovacuum's first pass, when it has no statistics. A plain index scan marks them
        // as it passes: the first listing pays, the next do not.
        let off = p.get(tx, "SET LOCAL enable_bitmapscan = off")?;
        tx.execute(&off, &[])?;
    }
    let sql = format!(
        "{}{}{order} LIMIT $3",
        p.names.sql(LIST),
        p.names.sql(narrow)
    );
    let state = filter.state.map(|s| s.name());
    let metadata = super::rows::metadata_column(&filter.metadata);
    let unchanged = filter.unchanged_for.map(super::rows::micros);
    let after = filter.after.map(super::rows::key);
    let group = filter.group.map(|g| i64::try_from(g.0).unwrap_or(i64::MAX));
    let rows = tx.query(
        &sql,
        &[
            &filter.queue,
            &state,
            &limit,
            &metadata,
            &unchanged,
            &after,
            &group,
        ],
    )?;
    let mut jobs = Vec::with_capacity(rows.len());
    for row in &rows {
        match record(row) {
            Ok(job) => jobs.push(job),
            Err(e) => {
                crate::query::unreadable(row.col::<i64>(0).map_or(0, |id| id.unsigned_abs()), e)?
            }
        }
    }
    Ok(jobs)
}

const TIMING: &str = "
SELECT
    (SELECT {s}.us(min(run_at)) FROM {s}.leasehold_jobs
     WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND NOT parked),
    (SELECT {s}.us(min(lease_expires_at)) FROM {s}.leasehold_jobs
     WHERE queue = $1 AND state = 'running'),
    (SELECT {s}.us(min(lease_expires_at)) FROM {s}.leasehold_jobs
     WHERE queue = $1 AND state = 'running' AND lease_expires_at > {now})";

/// When things fall due in `queue`.
pub(crate) fn timing(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
) -> Result<crate::query::QueueTiming> {
    let st = p.get(tx, TIMING)?;
    let row = tx.query_one(&st, &[&queue])?;
    let at = |i: usize| -> Result<Option<StoreTime>> { Ok(row.col::<Option<i64>>(i)?.map(time)) };
    Ok(crate::query::QueueTiming {
        earliest_run_at: at(0)?,
        earliest_expiry: at(1)?,
        next_expiry: at(2)?,
    })
}

/// What must hold between the columns and the history of every job, as SQL that returns
/// one row per violation.
const CHECKS: [(&str, &str); 7] = [
    (
        "a running job without a whole lease",
        "SELECT id FROM {s}.leasehold_jobs WHERE state = 'running' AND (lease_owner IS NULL
         OR lease_claimed_at IS NULL OR lease_expires_at IS NULL OR lease_length_us IS NULL
         OR lease_indexed_expiry IS NULL OR lease_indexed_expiry > lease_expires_at)",
    ),
    (
        "a job that is not running but holds a lease",
        "SELECT id FROM {s}.leasehold_jobs WHERE state <> 'running'
         AND (lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL)",
    ),
    (
        "a finished job without a finish time, or an unfinished one with one",
        "SELECT id FROM {s}.leasehold_jobs
         WHERE (state IN ('succeeded', 'dead', 'cancelled', 'expired')) <> (finished_at IS NOT NULL)",
    ),
    (
        "a last attempt kept in the row of a job that did not succeed, or kept by halves",
        "SELECT id FROM {s}.leasehold_jobs
         WHERE (last_worker IS NOT NULL OR last_claimed_at IS NOT NULL)
           AND (state <> 'succeeded' OR last_worker IS NULL OR last_claimed_at IS NULL)",
    ),
    (
        "history that does not have one record per ended attempt",
        "SELECT j.id FROM {s}.leasehold_jobs j
         LEFT JOIN (SELECT job, count(*) AS n, max(attempt) AS top FROM {s}.leasehold_runs
                    GROUP BY job) r ON r.job = j.id
         WHERE coalesce(r.n, 0) + CASE WHEN j.last_worker IS NOT NULL THEN 1 ELSE 0 END
               <> j.attempt - CASE WHEN j.state = 'running' THEN 1 ELSE 0 END
            OR coalesce(r.top, 0) > j.attempt - CASE WHEN j.last_worker IS NOT NULL THEN 1 ELSE 0 END",
    ),
    (
        "history of a job that does not exist",
        "SELECT DISTINCT r.job FROM {s}.leasehold_runs r
         LEFT JOIN {s}.leasehold_jobs j ON j.id = r.job WHERE j.id IS NULL",
    ),
    (
        // (`requests.rs`: a reaper applies them at once where it listens, else at its pass)
        "a request made in SQL that no reaper has applied in ten minutes (is a Reaper running?)",
        "SELECT DISTINCT job FROM {s}.leasehold_requests
         WHERE refused IS NULL AND at < {now} - interval '10 minutes'",
    ),
];

/// The integrity check: every rule of [`CHECKS`], one problem per job that breaks one.
pub(crate) fn check(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<crate::report::CheckReport> {
    let jobs: i64 = tx
        .query_one(&p.names.sql("SELECT count(*) FROM {s}.leasehold_jobs"), &[])?
        .col(0)?;
    let mut problems = Vec::new();
    for (rule, sql) in CHECKS {
        for row in tx.query(&p.names.sql(sql), &[])? {
            problems.push(format!("job {}: {rule}", row.col::<i64>(0)?));
        }
    }
    Ok(crate::report::CheckReport {
        jobs: u64::try_from(jobs).unwrap_or(0),
        problems,
    })
}

/// A reaper's look at the start of its pass (`$1`: the store's schema): the store's time,
/// whether some lease of any queue expired by it as indexed, whether some job waits past
/// its expiry (`leasehold_jobs_expiring` serves it), and the live and dead row versions of
/// the two tables the store vacuums (`vacuum.rs`), in one statement: an idle reaper's pass
/// is this and nothing else, and each statement wakes its thread.
const REAPER_LOOKS: &str = concat!(
    "
WITH c AS MATERIALIZED (SELECT {now} AS t),
tables (name, live, dead) AS MATERIALIZED (",
    super::vacuum::dead_rows!(),
    ")
SELECT {s}.us(c.t),
       EXISTS (SELECT 1 FROM {s}.leasehold_jobs
               WHERE state = 'running' AND lease_indexed_expiry <= c.t),
       EXISTS (SELECT 1 FROM {s}.leasehold_jobs
               WHERE expires_at <= c.t AND expires_at IS NOT NULL
                   AND state IN ('queued', 'retry_wait', 'blocked')),
       ARRAY(SELECT name FROM tables ORDER BY name),
       ARRAY(SELECT live FROM tables ORDER BY name),
       ARRAY(SELECT dead FROM tables ORDER BY name)
FROM c"
);

/// [`REAPER_LOOKS`]: what a reaper's pass has to do, and the dead row versions of each
/// table the store vacuums (name, live, dead).
pub(crate) fn reaper_looks(
    c: &mut impl postgres::GenericClient,
    p: &mut Prepared<'_>,
) -> Result<(crate::backend::ReaperLooks, super::vacuum::DeadRows)> {
    let st = p.get(c, REAPER_LOOKS)?;
    let row = c.query_one(&st, &[&p.names.schema])?;
    let looks = crate::backend::ReaperLooks {
        now: time(row.col(0)?),
        leases_expired: row.col(1)?,
        past_expiry: row.col(2)?,
    };
    let (names, live, dead): (Vec<String>, Vec<i64>, Vec<i64>) =
        (row.col(3)?, row.col(4)?, row.col(5)?);
    let tables = (names.into_iter().zip(live).zip(dead))
        .map(|((name, live), dead)| (name, live, dead))
        .collect();
    Ok((looks, tables))
}

/// [`next_due`]'s one statement: the earliest due time, the store's time, the queue's record
/// (its columns null where it has none: left-joined) and, where it has one, how many of its
/// jobs run (which its limits count).
const NEXT_DUE: &str = concat!(
    "
SELECT {s}.us(least(
    (SELECT min(run_at) FROM {s}.leasehold_jobs
     WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND NOT parked),
    (SELECT min(lease_indexed_expiry) FROM {s}.leasehold_jobs
     WHERE queue = $1 AND state = 'running'))),
    {s}.us({now}),
    CASE WHEN q.queue IS NULL THEN 0
         ELSE (SELECT count(*) FROM {s}.leasehold_jobs WHERE queue = $1 AND state = 'running')
    END,
    {s}.us((SELECT min(opens_at) FROM {s}.leasehold_limit_keys
            WHERE queue = $1 AND opens_at IS NOT NULL)),
    ",
    queue_columns!(),
    "
FROM (SELECT 1) AS one LEFT JOIN {s}.leasehold_queues q ON q.queue = $1"
);

/// The next time something in `queue` may become claimable without a commit: the earliest
/// due time of a waiting job or expiry (as indexed: at or before the real one) of a lease,
/// or the first time a limit key's rate window opens again; while the queue has no room,
/// when it may have some ([`crate::rules::next_look`]). The statement reads its inputs:
/// the earlier of the first two times, the store's time, the running jobs (only where the
/// queue has a record, whose limits may count them), the earliest key gate, the queue's
/// record.
///
/// With the store's time it was read at. One statement, so that it can run outside a
/// transaction ([`super::PgStore`]'s `alone`): an idle pool asks it after each look.
pub(crate) fn next_due(
    c: &mut impl postgres::GenericClient,
    p: &mut Prepared<'_>,
    queue: &str,
) -> Result<(Option<StoreTime>, StoreTime)> {
    let st = p.get(c, NEXT_DUE)?;
    let row = c.query_one(&st, &[&queue])?;
    let due = row.col::<Option<i64>>(0)?.map(time);
    let now = time(row.col(1)?);
    let running = u64::try_from(row.col::<i64>(2)?).unwrap_or(0);
    let gate = row.col::<Option<i64>>(3)?.map(time);
    let record = super::named::queue_from(&row, 4)?;
    let next = crate::rules::next_look(record.as_ref(), running, now, due, None, gate);
    Ok((next, now))
}

/// Every schedule, by name.
pub(crate) fn schedules(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
) -> Result<Vec<crate::schedule::ScheduleInfo>> {
    let st = p.get(
        tx,
        "SELECT s.name, s.record, m.value FROM {s}.leasehold_schedules s
         LEFT JOIN {s}.leasehold_meta m ON m.key = $1 || s.name
         WHERE octet_length(s.record) > 0 ORDER BY s.name",
    )?;
    let prefix = crate::rules::schedule_failure_key("");
    tx.query(&st, &[&prefix])?
        .iter()
        .map(|row| {
            let record = super::named::decode_schedule(row.col(0)?, row.col(1)?)?;
            Ok(crate::schedule::ScheduleInfo(record, row.col(2)?))
        })
        .collect()
}

/// Every attempt of the job, oldest first: the ended ones from history, the last one of a
/// job that succeeded from its row where the completion kept it there (ended when the job
/// finished, with the job's progress), and a running one from the job's lease.
pub(crate) fn history(tx: Tx<'_, '_>, p: &mut Prepared<'_>, job: JobId) -> Result<Vec<RunRecord>> {
    let st = p.get(
        tx,
        "SELECT attempt, worker, {s}.us(claimed_at), {s}.us(ended_at), outcome, error,
             reclaim_path, overdue_us, progress, time_limit_us, snoozed_for_us
         FROM {s}.leasehold_runs WHERE job = $1
         UNION ALL
         SELECT attempt, last_worker, {s}.us(last_claimed_at), {s}.us(finished_at), 'succeeded',
             NULL, NULL, NULL, progress, NULL, NULL
         FROM {s}.leasehold_jobs
         WHERE id = $1 AND state = 'succeeded' AND last_worker IS NOT NULL
         ORDER BY attempt",
    )?;
    let mut runs = Vec::new();
    for row in tx.query(&st, &[&key(job)])? {
        let outcome = outcome_from(&row)?;
        runs.push(RunRecord {
            attempt: attempt(row.col(0)?)?,
            worker: row.col(1)?,
            claimed_at: time(row.col(2)?),
            ended_at: Some(time(row.col(3)?)),
            outcome: Some(outcome),
            progress: u64::try_from(row.col::<i64>(8)?).unwrap_or(0),
        });
    }
    if let Some(running) = self::job(tx, p, job)?.and_then(|j| j.current_run()) {
        runs.push(running);
    }
    Ok(runs)
}

/// Counts per queue and state, and the lifetime counters.
pub(crate) fn stats(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<Stats> {
    let now = now(tx, p)?;
    let mut stats = Stats {
        now,
        ..Stats::default()
    };
    let counts = p.get(
        tx,
        "SELECT queue, state, count(*) FROM {s}.leasehold_jobs GROUP BY queue, state",
    )?;
    for row in tx.query(&counts, &[])? {
        let state: &str = row.col(1)?;
        if let Some(state) = JobState::ALL.into_iter().find(|s| s.name() == state) {
            let queue: String = row.col(0)?;
            let n = u64::try_from(row.col::<i64>(2)?).unwrap_or(0);
            stats
                .queues
                .entry(queue)
                .or_default()
                .by_state
                .insert(state, n);
        }
    }
    let queues = p.get(tx, "SELECT queue FROM {s}.leasehold_queues")?;
    let names: Vec<String> = tx
        .query(&queues, &[])?
        .iter()
        .map(|row| row.col(0))
        .collect::<Result<_>>()?;
    for name in names {
        if let Some(record) = super::named::queue_record(tx, p, &name, false)? {
            stats.note_queue(name, &record);
        }
    }
    let keys = p.get(
        tx,
        "SELECT queue, running, head, recent, {s}.us(opens_at) FROM {s}.leasehold_limit_keys",
    )?;
    let keys = (tx.query(&keys, &[])?.iter())
        .map(|row| Ok((row.col::<String>(0)?, super::named::key_record(row, 1)?)))
        .collect::<Result<Vec<_>>>()?;
    // (the predicate of `leasehold_jobs_keyed`, so the count reads that index alone)
    let keyed = p.get(
        tx,
        "SELECT queue, count(*) FROM {s}.leasehold_jobs
         WHERE state IN ('queued', 'retry_wait') AND limit_key IS NOT NULL GROUP BY queue",
    )?;
    let keyed = (tx.query(&keyed, &[])?.iter())
        .map(|row| {
            Ok((
                row.col::<String>(0)?,
                u64::try_from(row.col::<i64>(1)?).unwrap_or(0),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    crate::rules::count_keys(&mut stats, keys, keyed);
    let open = p.get(
        tx,
        "SELECT id, record FROM {s}.leasehold_groups WHERE ended_at IS NULL",
    )?;
    for row in tx.query(&open, &[])? {
        let id: i64 = row.col(0)?;
        let group: Option<crate::workflow::GroupRecord> =
            crate::codec::decode_stored(Some(row.col::<&[u8]>(1)?), || {
                format!("the record of group {id}")
            })?;
        group.inspect(|g| stats.note_group(g));
    }
    let counters = p.get(tx, "SELECT name, value FROM {s}.leasehold_counters")?;
    let mut c = Counters::default();
    for row in tx.query(&counters, &[])? {
        let value = u64::try_from(row.col::<i64>(1)?).unwrap_or(0);
        match row.col::<&str>(0)? {
            "worst_detection_delay_us" => c.worst_detection_delay = Duration::from_micros(value),
            name => {
                c.set(name, value);
            }
        }
    }
    stats.counters = c;
    let pass = p.get(
        tx,
        "SELECT decode(value, 'hex') FROM {s}.leasehold_meta WHERE key = $1",
    )?;
    if let Some(row) = tx.query_opt(&pass, &[&super::fast::REAPER_PASS])? {
        let bytes: Vec<u8> = row.col(0)?;
        stats.last_reaper_pass = Some(
            crate::codec::decode(&bytes)
                .map_err(|e| Error::Corrupt(format!("the last reaper pass: {e}")))?,
        );
    }
    Ok(stats)
}

/// The queues whose due work has waited [`crate::UNSERVED_AFTER`] with nobody serving them.
pub(crate) fn unserved_queues(
    c: &mut impl postgres::GenericClient,
    p: &mut Prepared<'_>,
) -> Result<Vec<crate::queue::UnservedQueue>> {
    let st = p.get(
        c,
        "SELECT w.queue, {s}.us(w.since), {s}.us(q.served_at)
         FROM (SELECT queue, min(run_at) AS since FROM {s}.leasehold_jobs
               WHERE state IN ('queued', 'retry_wait') AND NOT parked
                 AND run_at <= {now} - $1::bigint * interval '1 microsecond'
               GROUP BY queue) w
         LEFT JOIN {s}.leasehold_queues q ON q.queue = w.queue
         WHERE NOT coalesce(q.paused, false)
           AND (q.served_at IS NULL
                OR q.served_at <= {now} - $1::bigint * interval '1 microsecond')
         ORDER BY w.queue",
    )?;
    c.query(&st, &[&super::rows::micros(crate::queue::UNSERVED_AFTER)])?
        .iter()
        .map(|row| {
            Ok(crate::queue::UnservedQueue {
                queue: row.col(0)?,
                waiting_since: time(row.col(1)?),
                served_at: row.col::<Option<i64>>(2)?.map(time),
            })
        })
        .collect()
}

/// The job's payload or output.
pub(crate) fn bytes(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    job: JobId,
    output: bool,
) -> Result<Option<Vec<u8>>> {
    let st = match output {
        true => p.get(tx, "SELECT output FROM {s}.leasehold_jobs WHERE id = $1")?,
        false => p.get(tx, "SELECT payload FROM {s}.leasehold_jobs WHERE id = $1")?,
    };
    match tx.query_opt(&st, &[&key(job)])? {
        Some(row) => row.col(0),
        None => Ok(None),
    }
}

/// Job `job`'s attempts' logs, oldest attempt first.
pub(crate) fn logs(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    job: JobId,
) -> Result<Vec<crate::job_log::AttemptLog>> {
    let st = p.get(
        tx,
        "SELECT attempt, record FROM {s}.leasehold_logs WHERE job = $1 ORDER BY attempt",
    )?;
    let mut found = Vec::new();
    for row in tx.query(&st, &[&key(job)])? {
        let attempt = attempt(row.col(0)?)?;
        let what = || format!("the log of job {job} attempt {attempt}");
        if let Some(record) = crate::codec::decode_stored(Some(row.col(1)?), what)? {
            found.push(crate::job_log::AttemptLog { attempt, record });
        }
    }
    Ok(found)
}

/// Job `job`'s last checkpoint.
pub(crate) fn checkpoint(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    job: JobId,
) -> Result<Option<crate::checkpoint::Checkpoint>> {
    let st = p.get(
        tx,
        "SELECT record FROM {s}.leasehold_checkpoints WHERE job = $1",
    )?;
    let found = tx.query_opt(&st, &[&key(job)])?;
    let bytes = found.as_ref().map(|row| row.col::<&[u8]>(0)).transpose()?;
    let record = crate::codec::decode_stored(bytes, || format!("the checkpoint of job {job}"))?;
    Ok(record.map(crate::checkpoint::Checkpoint))
}

/// A group's record.
pub(crate) fn group(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    group: crate::ids::GroupId,
) -> Result<Option<crate::workflow::Group>> {
    let st = p.get(tx, "SELECT record FROM {s}.leasehold_groups WHERE id = $1")?;
    let id = i64::try_from(group.0).unwrap_or(i64::MAX);
    let found = tx.query_opt(&st, &[&id])?;
    let bytes = found.as_ref().map(|row| row.col::<&[u8]>(0)).transpose()?;
    let record = crate::codec::decode_stored(bytes, || format!("the record of group {group}"))?;
    Ok(record.map(crate::workflow::Group))
}

/// The jobs that wait for `job` and still exist, oldest first.
pub(crate) fn waiters(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    job: JobId,
) -> Result<Vec<JobId>> {
    let st = p.get(
        tx,
        "SELECT w.waiter FROM {s}.leasehold_waits w
         JOIN {s}.leasehold_jobs j ON j.id = w.waiter
         WHERE w.job = $1 ORDER BY w.waiter",
    )?;
    (tx.query(&st, &[&key(job)])?.iter())
        .map(|row| Ok(super::rows::id(row.col(0)?)))
        .collect()
}

/// The cursor of the last ending retention purged (the start if none was).
pub(crate) fn endings_trimmed(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<EndCursor> {
    let st = p.get(
        tx,
        "SELECT value FROM {s}.leasehold_meta WHERE key = 'endings.trimmed'",
    )?;
    match tx.query_opt(&st, &[])? {
        Some(row) => (row.col::<&str>(0)?.parse())
            .map_err(|e| Error::Corrupt(format!("the last purged ending: {e}"))),
        None => Ok(EndCursor::START),
    }
}

/// A cursor's number within its transaction, as the table keeps it.
fn seq_of(at: EndCursor) -> i64 {
    i64::try_from(at.seq).unwrap_or(i64::MAX)
}

/// The endings after `after`, at most `limit`, of transactions older than every one still
/// running (the snapshot's horizon): a transaction that has not committed yet may hold an
/// ending with a smaller id than one already committed, which a reader must not pass. A
/// row may hold many endings (`since_14` in the schema), and a cursor may stand inside one:
/// the rows that may hold an ending after it, then their endings after it.
/// One statement, outside a transaction (a follower reads once in a while, idle: each round
/// trip wakes its thread): the page, then a last row with the last purged ending and whether
/// ends committed after the cursor wait behind the horizon (from it on, by the index).
pub(crate) fn endings(
    c: &mut impl postgres::GenericClient,
    p: &mut Prepared<'_>,
    after: EndCursor,
    limit: usize,
) -> Result<Endings> {
    let st = p.get(
        c,
        "SELECT xid::text::bigint, seq, job, grp, queue, state, {s}.us(at), NULL, NULL
         FROM (SELECT r.xid, {s}.ending_seq(r.seq, r.n, i) AS seq,
                   coalesce(r.jobs[i + 1], r.job) AS job, r.grp,
                   coalesce(r.queues[i + 1], r.queue) AS queue, r.state, r.at
               FROM (SELECT * FROM {s}.leasehold_endings
                     WHERE xid >= $1::text::xid8
                         AND (xid > $1::text::xid8
                              OR {s}.ending_last(seq, n) > $2)
                         AND xid < pg_snapshot_xmin(pg_current_snapshot())
                     ORDER BY xid, seq
                     LIMIT $3) r,
                   generate_series(0, coalesce(r.n, 1) - 1) AS i
               WHERE (r.xid, {s}.ending_seq(r.seq, r.n, i)) > ($1::text::xid8, $2)
               ORDER BY r.xid, 2
               LIMIT $3) page
         UNION ALL
         SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
             (SELECT value FROM {s}.leasehold_meta WHERE key = 'endings.trimmed'),
             EXISTS (SELECT 1 FROM {s}.leasehold_endings
                     WHERE xid >= pg_snapshot_xmin(pg_current_snapshot())
                         AND (xid, seq) > ($1::text::xid8, $2))",
    )?;
    let n = i64::try_from(limit).unwrap_or(i64::MAX);
    let (mut list, mut trimmed, mut held_back) = (Vec::new(), EndCursor::START, false);
    for row in c.query(&st, &[&after.tx.to_string(), &seq_of(after), &n])? {
        let Some(xid) = row.col::<Option<i64>>(0)? else {
            if let Some(kept) = row.col::<Option<&str>>(7)? {
                trimmed = (kept.parse())
                    .map_err(|e| Error::Corrupt(format!("the last purged ending: {e}")))?;
            }
            held_back = row.col::<Option<bool>>(8)?.unwrap_or(false);
            continue;
        };
        let of = match (row.col::<Option<i64>>(2)?, row.col::<Option<i64>>(3)?) {
            (Some(job), _) => EndOf::Job {
                id: super::rows::id(job),
                queue: row.col::<Option<String>>(4)?.unwrap_or_default(),
            },
            (None, Some(group)) => EndOf::Group(GroupId(u64::try_from(group).unwrap_or(0))),
            (None, None) => return Err(Error::Corrupt("an ending of nothing".into())),
        };
        let name: &str = row.col(5)?;
        let state = JobState::ALL.into_iter().find(|s| s.name() == name);
        let state = state.ok_or_else(|| Error::Corrupt(format!("an ending as {name:?}")))?;
        let record = EndRecord {
            of,
            state,
            at: time(row.col(6)?),
        };
        list.push(record.ending_at(EndCursor::from_parts(xid, row.col(1)?)));
    }
    // (a union's parts come in their order in practice, not by promise)
    list.sort_by_key(|e| e.cursor);
    let mut page = crate::endings::page(after, list, trimmed);
    // (where the page is full, what follows it is the next page's)
    page.held_back = held_back && page.list.len() < limit;
    Ok(page)
}
