//! Ends and edits asked for in SQL (`complete_job`, `fail_job`, `reschedule_jobs`,
//! `remove_job`), applied by the protocol.
//!
//! An application that works in its own transactions — a worker in another language, a
//! trigger, a service that commits its results and the job's end together — calls these
//! functions as graphile-worker's are called. They decide in the caller's transaction what
//! must be decided there: the input (with the crate's messages, SQLSTATE 22023), the job
//! (`P0002` if there is none) and, for an end, the fence (`55000`, the crate's "lease
//! lost" message): the job is `running` under exactly that attempt and lease token, before
//! its deadline, and no end was asked for it yet. What they accept commits with the
//! caller's writes or not at all, as a request row (`leasehold_requests`) and a `NOTIFY`.
//!
//! The rest — the job's next state, its retry by its policy, what waits for it, its group,
//! its limit key, its ending and its events — is the protocol's, as for a call from Rust,
//! and is not written a second time in SQL: a store handle applies each request
//! ([`PgStore::apply_requests`]), at once where a [`crate::Reaper`] of a handle with a
//! listener hears the `NOTIFY`, else in its next pass. An accepted end holds its lease for a
//! day meanwhile (no reaper and no claim takes it back; its deadline and stall timeout no
//! longer apply), so the end the caller committed is the one applied, unless the holder
//! ends the attempt itself first. A request the protocol refuses when it comes to it (a job
//! an edit found running, an end its holder beat) is kept with the reason in `refused`,
//! and logged; one applied is deleted.

use std::time::{Duration, SystemTime};

use super::PgStore;
use super::rows::{Col, attempt, id, token};
use super::transaction::PgRecords;
use crate::error::{Error, Result};
use crate::lease::Holding;
use crate::protocol::{self, End};
use crate::rules::Retry;

/// The payload that wakes the reapers of the store's listening handles: a request was made.
/// [`since_13`] spells it in SQL.
pub(crate) const REQUESTS: &str = "\u{1}requests";

/// What version 13 added here, made by a new store and by the upgrade alike: the requests
/// table and the functions that fill it (see the module's doc).
macro_rules! since_13 {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS {s}.leasehold_requests (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job bigint NOT NULL,
    attempt bigint,
    token bigint,
    what text NOT NULL CHECK (what IN ('complete', 'fail', 'reschedule', 'cancel')),
    output bytea,
    error text,
    retry_in_us bigint,
    permanently boolean NOT NULL DEFAULT false,
    run_at timestamptz,
    priority integer,
    at timestamptz NOT NULL,
    refused text
);
CREATE INDEX IF NOT EXISTS leasehold_requests_waiting ON {s}.leasehold_requests (id)
    WHERE refused IS NULL;

-- The fence of an end asked for in SQL (protocol::fence), then the request, its lease held.
CREATE OR REPLACE FUNCTION {s}.request_end(
    p_job bigint, p_attempt bigint, p_token bigint, p_what text, p_output bytea,
    p_error text, p_retry_in_us bigint, p_permanently boolean
) RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz := {s}.clock();
    j record;
    made bigint;
BEGIN
    IF p_job IS NULL OR p_attempt IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'an end needs the job, its attempt and its lease token'
            USING ERRCODE = '22023';
    END IF;
    SELECT jobs.state, jobs.attempt, jobs.lease_token,
           coalesce(jobs.lease_deadline <= t, false) AS late,
           EXISTS (SELECT 1 FROM {s}.leasehold_requests r WHERE r.job = p_job
                   AND r.attempt = p_attempt AND r.refused IS NULL) AS asked
        INTO j FROM {s}.leasehold_jobs jobs WHERE jobs.id = p_job FOR UPDATE OF jobs;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost on job % attempt %: the job no longer exists',
            p_job, p_attempt USING ERRCODE = '55000';
    END IF;
    IF j.state <> 'running' OR j.attempt <> p_attempt OR j.lease_token <> p_token
        OR j.late OR j.asked THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'lease lost on job %s attempt %s: the job is now %s at attempt %s%s',
            p_job, p_attempt, j.state, j.attempt,
            CASE WHEN j.state <> 'running' OR j.attempt <> p_attempt
                      OR j.lease_token <> p_token THEN ''
                 WHEN j.late THEN ' (past its time limit)'
                 ELSE ' (its end is asked for already)' END);
    END IF;
    UPDATE {s}.leasehold_jobs
    SET lease_expires_at = greatest(lease_expires_at, t + interval '1 day'),
        lease_deadline = NULL, stall_timeout_us = NULL, updated_at = t
    WHERE id = p_job;
    INSERT INTO {s}.leasehold_requests
        (job, attempt, token, what, output, error, retry_in_us, permanently, at)
    VALUES (p_job, p_attempt, p_token, p_what, p_output, p_error, p_retry_in_us, p_permanently, t)
    RETURNING id INTO made;
    PERFORM pg_notify('leasehold_{s}', chr(1) || 'requests');
    RETURN made;
END
$fn$;

-- protocol::complete, asked for in SQL: the request's id
CREATE OR REPLACE FUNCTION {s}.complete_job(
    job_id bigint, attempt integer, lease_token bigint, output bytea DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $fn$
BEGIN
    IF octet_length(coalesce(complete_job.output, '\x')) > 1048576 THEN
        RAISE EXCEPTION 'output is % bytes; the limit is 1048576',
            octet_length(complete_job.output) USING ERRCODE = '22023';
    END IF;
    RETURN {s}.request_end(complete_job.job_id, complete_job.attempt, complete_job.lease_token,
        'complete', complete_job.output, NULL, NULL, false);
END
$fn$;

-- protocol::end with End::Fail, asked for in SQL: retried by the job's retry policy while
-- its budget lasts (or after retry_in), dead at once if permanently; the request's id
CREATE OR REPLACE FUNCTION {s}.fail_job(
    job_id bigint, attempt integer, lease_token bigint, error_message text,
    retry_in interval DEFAULT NULL, permanently boolean DEFAULT false
) RETURNS bigint LANGUAGE plpgsql AS $fn$
BEGIN
    IF fail_job.error_message IS NULL THEN
        RAISE EXCEPTION 'a failure needs its error message' USING ERRCODE = '22023';
    ELSIF fail_job.retry_in < interval '0' THEN
        RAISE EXCEPTION 'a retry must not wait a negative time, got %', fail_job.retry_in
            USING ERRCODE = '22023';
    ELSIF fail_job.retry_in IS NOT NULL AND coalesce(fail_job.permanently, false) THEN
        RAISE EXCEPTION 'a permanent failure is never retried: give retry_in or permanently, not both'
            USING ERRCODE = '22023';
    END IF;
    RETURN {s}.request_end(fail_job.job_id, fail_job.attempt, fail_job.lease_token, 'fail',
        NULL, fail_job.error_message,
        floor(extract(epoch FROM fail_job.retry_in) * 1000000)::bigint,
        coalesce(fail_job.permanently, false));
END
$fn$;

-- protocol::edit of each waiting job of job_ids: its due time, its priority; the ids of the
-- jobs it asked for (those that do not exist or do not wait are passed over, as
-- graphile-worker's reschedule_jobs passes over locked ones)
CREATE OR REPLACE FUNCTION {s}.reschedule_jobs(
    job_ids bigint[], run_at timestamptz DEFAULT NULL, priority integer DEFAULT NULL
) RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz := {s}.clock();
BEGIN
    IF reschedule_jobs.run_at IS NULL AND reschedule_jobs.priority IS NULL THEN
        RAISE EXCEPTION 'a reschedule needs run_at, priority or both' USING ERRCODE = '22023';
    ELSIF reschedule_jobs.run_at IS NOT NULL AND NOT isfinite(reschedule_jobs.run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite time, got %', reschedule_jobs.run_at
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH asked AS (
        INSERT INTO {s}.leasehold_requests (job, what, run_at, priority, at)
        SELECT j.id, 'reschedule', reschedule_jobs.run_at, reschedule_jobs.priority, t
        FROM {s}.leasehold_jobs j
        WHERE j.id = ANY(reschedule_jobs.job_ids)
            AND j.state IN ('queued', 'retry_wait', 'blocked')
        ORDER BY j.id
        RETURNING job
    )
    SELECT job FROM asked;
    IF FOUND THEN
        PERFORM pg_notify('leasehold_{s}', chr(1) || 'requests');
    END IF;
END
$fn$;

-- protocol::cancel, asked for in SQL: a waiting job ends as cancelled, a running one is
-- asked to stop (its holder learns at its next heartbeat); the job's state now
CREATE OR REPLACE FUNCTION {s}.remove_job(job_id bigint) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz := {s}.clock();
    found_state text;
BEGIN
    SELECT state INTO found_state FROM {s}.leasehold_jobs WHERE id = remove_job.job_id
        FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', remove_job.job_id USING ERRCODE = 'P0002';
    END IF;
    IF found_state IN ('queued', 'retry_wait', 'blocked', 'running') THEN
        INSERT INTO {s}.leasehold_requests (job, what, at)
            VALUES (remove_job.job_id, 'cancel', t);
        PERFORM pg_notify('leasehold_{s}', chr(1) || 'requests');
    END IF;
    RETURN found_state;
END
$fn$;
"#
    };
}
pub(crate) use since_13;

/// The oldest request not yet applied nor refused, locked (another handle applying
/// requests passes over it).
const TAKE: &str = "
SELECT id, job, attempt, token, what, output, error, retry_in_us, permanently,
    {s}.us(run_at), priority
FROM {s}.leasehold_requests WHERE refused IS NULL
ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";

const APPLIED: &str = "DELETE FROM {s}.leasehold_requests WHERE id = $1";

const REFUSED: &str = "UPDATE {s}.leasehold_requests SET refused = $2 WHERE id = $1";

/// A request as its row says.
enum Request {
    Complete(Holding, Vec<u8>),
    Fail(Holding, String, Retry),
    Reschedule(crate::ids::JobId, crate::edit::Edit),
    Cancel(crate::ids::JobId),
}

/// What became of one request.
enum Applied {
    None,
    Done,
    Refused(Error),
}

impl PgStore {
    /// Applies the requests made in SQL (see the module's doc), each in a transaction of
    /// its own, oldest first, up to the reap batch (a full batch wakes this handle's reaper
    /// again for the rest); returns how many it applied or refused. Looks first, in one
    /// statement: what a reaper's pass asks, idle or not.
    pub(crate) fn apply_requests(&self) -> Result<usize> {
        // (one statement where none waits, as an idle reaper's pass would have it: no
        // transaction)
        let st = "SELECT EXISTS (SELECT 1 FROM {s}.leasehold_requests WHERE refused IS NULL)";
        let waiting = self.alone(|c, p| {
            let st = p.get(c, st)?;
            c.query_one(&st, &[])?.col::<bool>(0)
        })?;
        match waiting {
            true => self.apply_waiting_requests(),
            false => Ok(0),
        }
    }

    /// [`PgStore::apply_requests`] without the look: for a reaper woken because a request
    /// was made (its `NOTIFY`), which would find one.
    pub(crate) fn apply_waiting_requests(&self) -> Result<usize> {
        let mut applied = 0;
        while applied < self.settings().policy.reap_batch {
            match self.records(apply_one)? {
                Applied::None => break,
                Applied::Done => {}
                Applied::Refused(why) => {
                    tracing::warn!(error = %why, "a request made in SQL was refused");
                }
            }
            applied += 1;
        }
        if applied == self.settings().policy.reap_batch {
            // (more may wait: a reaper woken by this comes back for them after what it is
            // due to do, rather than hold its pass back)
            let _ = self.inner.requests.0.try_send(());
        }
        Ok(applied)
    }
}

/// Takes the oldest request and applies it by the protocol, in this transaction: deleted
/// if it was applied, kept with its reason if the protocol refused it.
fn apply_one(r: &mut PgRecords<'_, '_, '_>) -> Result<Applied> {
    let take = r.p.get(r.tx, TAKE)?;
    let Some(row) = r.tx.query_opt(&take, &[])? else {
        return Ok(Applied::None);
    };
    let request_id: i64 = row.col(0)?;
    let answer = match request(&row)? {
        Request::Complete(by, output) => protocol::complete(r, by, &output, None),
        Request::Fail(by, error, retry) => {
            protocol::end(r, by, &End::Fail(error, retry), None).map(drop)
        }
        Request::Reschedule(job, edit) => protocol::edit(r, job, &edit),
        Request::Cancel(job) => protocol::cancel(r, job).map(drop),
    };
    match answer {
        Ok(()) => {
            let st = r.p.get(r.tx, APPLIED)?;
            r.tx.execute(&st, &[&request_id])?;
            Ok(Applied::Done)
        }
        // (a refusal wrote nothing: the transaction commits the reason; any other failure
        // rolls it back, and the request is tried again as it was)
        Err(e) if e.is_refusal() => {
            let st = r.p.get(r.tx, REFUSED)?;
            r.tx.execute(&st, &[&request_id, &e.to_string()])?;
            Ok(Applied::Refused(e))
        }
        Err(e) => Err(e),
    }
}

/// The request of a row of [`TAKE`].
fn request(row: &postgres::Row) -> Result<Request> {
    let job = id(row.col(1)?);
    let holding = || -> Result<Holding> {
        let (a, t): (Option<i64>, Option<i64>) = (row.col(2)?, row.col(3)?);
        let (Some(a), Some(t)) = (a, t) else {
            return Err(Error::Corrupt(format!(
                "the request of an end of job {job} names no attempt"
            )));
        };
        Ok(Holding {
            job,
            attempt: attempt(a)?,
            token: token(t),
        })
    };
    let what: String = row.col(4)?;
    Ok(match what.as_str() {
        "complete" => {
            let output: Option<Vec<u8>> = row.col(5)?;
            Request::Complete(holding()?, output.unwrap_or_default())
        }
        "fail" => {
            let error: Option<String> = row.col(6)?;
            let retry_in: Option<i64> = row.col(7)?;
            let retry = match (row.col::<bool>(8)?, retry_in) {
                (true, _) => Retry::Never,
                (false, Some(us)) => {
                    Retry::After(Duration::from_micros(u64::try_from(us).unwrap_or(0)))
                }
                (false, None) => Retry::WhileBudgetLasts,
            };
            Request::Fail(holding()?, error.unwrap_or_default(), retry)
        }
        "reschedule" => {
            let mut edit = crate::edit::Edit::new();
            if let Some(us) = row.col::<Option<i64>>(9)? {
                let micros = Duration::from_micros(u64::try_from(us).unwrap_or(0));
                edit = edit.run_at(SystemTime::UNIX_EPOCH + micros);
            }
            if let Some(priority) = row.col::<Option<i32>>(10)? {
                edit = edit.priority(priority);
            }
            Request::Reschedule(job, edit)
        }
        "cancel" => Request::Cancel(job),
        other => {
            return Err(Error::Corrupt(format!(
                "a request of job {job} asks for {other:?}, which this build does not know"
            )));
        }
    })
}
