//! Rows and values: a job row read back as its record, a history row's outcome written and
//! read, and the conversions between store
//! types and the values PostgreSQL keeps (microseconds, signed integers).

use std::time::Duration;

use postgres::types::FromSql;

use super::PgError;
use crate::error::{Error, Result};
use crate::ids::{Attempt, JobId, LeaseToken, StoreTime};
use crate::job::{JobRecord, LeaseRecord, Outcome, ReclaimPath, Uniqueness};
use crate::state::JobState;

/// A column of a row read as the type leasehold made it with: every value read goes through
/// here, never `Row::get` (which panics), so a table whose column was altered by hand is a
/// typed error that names the column ([`PgError::SchemaAltered`]), not a crash of the
/// application or the tool.
pub(crate) trait Col {
    /// Column `i` as a `T`.
    fn col<'a, T: FromSql<'a>>(&'a self, i: usize) -> Result<T>;
}

impl Col for postgres::Row {
    fn col<'a, T: FromSql<'a>>(&'a self, i: usize) -> Result<T> {
        self.try_get(i).map_err(|e| {
            let column = self
                .columns()
                .get(i)
                .map_or_else(|| format!("column {i}"), |c| format!("column {}", c.name()));
            let found = self
                .columns()
                .get(i)
                .map_or_else(String::new, |c| format!(" (found {})", c.type_()));
            let detail = match std::error::Error::source(&e) {
                Some(why) => format!(
                    "{column} cannot be read as {}{found}: {why}",
                    std::any::type_name::<T>()
                ),
                None => format!("{column} cannot be read{found}: {e}"),
            };
            Error::Postgres(PgError::SchemaAltered {
                schema: None,
                detail,
            })
        })
    }
}

/// The columns [`record`] reads, in its order, for every statement that reads a whole job.
macro_rules! job_columns {
    () => {
        "id, queue, state, priority, attempt, failures, max_attempts, unique_key,
    {s}.us(created_at), {s}.us(run_at), lease_owner, {s}.us(lease_claimed_at),
    {s}.us(lease_expires_at), {s}.us(lease_indexed_expiry), lease_length_us, stall_timeout_us,
    progress, {s}.us(progress_at), cancel_requested, last_error, {s}.us(finished_at),
    {s}.us(updated_at), {s}.us(lease_deadline), time_limit_us, unique_for_us, key_released,
    metadata, flow, retry, limit_key, parked, lease_token, {s}.us(expires_at)"
    };
}
pub(crate) use job_columns;

/// The record of job `id` by `statement`, a select of [`job_columns`] by id (with or without
/// a row lock).
pub(crate) fn job_by(
    tx: &mut postgres::Transaction<'_>,
    statement: &postgres::Statement,
    id: JobId,
) -> Result<Option<JobRecord>> {
    tx.query_opt(statement, &[&key(id)])?
        .map(|row| record(&row))
        .transpose()
}

/// A row of [`job_columns`] as the job's record.
pub(crate) fn record(row: &postgres::Row) -> Result<JobRecord> {
    let state: &str = row.col(2)?;
    let state = JobState::ALL
        .into_iter()
        .find(|s| s.name() == state)
        .ok_or_else(|| Error::Corrupt(format!("unknown job state {state:?}")))?;
    let lease = match row.col::<Option<String>>(10)? {
        None => None,
        Some(owner) => Some(LeaseRecord {
            owner,
            claimed_at: time(row.col::<Option<i64>>(11)?.unwrap_or(0)),
            expires_at: time(row.col::<Option<i64>>(12)?.unwrap_or(0)),
            indexed_expiry: time(row.col::<Option<i64>>(13)?.unwrap_or(0)),
            length: duration(row.col::<Option<i64>>(14)?.unwrap_or(0)),
            stall_timeout: row.col::<Option<i64>>(15)?.map(duration),
            deadline: row.col::<Option<i64>>(22)?.map(time),
        }),
    };
    Ok(JobRecord {
        id: id(row.col(0)?),
        queue: row.col(1)?,
        state,
        priority: row.col(3)?,
        attempt: attempt(row.col(4)?)?,
        failures: u32::try_from(row.col::<i64>(5)?).unwrap_or(u32::MAX),
        max_attempts: u32::try_from(row.col::<i64>(6)?).unwrap_or(u32::MAX),
        unique_key: row.col(7)?,
        created_at: time(row.col(8)?),
        run_at: time(row.col(9)?),
        lease,
        progress: u64::try_from(row.col::<i64>(16)?).unwrap_or(0),
        progress_at: time(row.col(17)?),
        cancel_requested: row.col(18)?,
        last_error: row.col(19)?,
        finished_at: row.col::<Option<i64>>(20)?.map(time),
        updated_at: time(row.col(21)?),
        time_limit: row.col::<Option<i64>>(23)?.map(duration),
        uniqueness: uniqueness(row.col(24)?),
        key_released: row.col(25)?,
        metadata: row
            .col::<Vec<String>>(26)?
            .into_iter()
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (pair, String::new()),
            })
            .collect(),
        flow: match row.col::<Option<&[u8]>>(27)? {
            None => Default::default(),
            Some(bytes) => crate::codec::decode(bytes).map_err(|e| {
                Error::Corrupt(format!(
                    "what job {} waits for: {e}",
                    row.col::<i64>(0).unwrap_or(0)
                ))
            })?,
        },
        retry: retry_column(row, 28, || {
            format!("job {}", row.col::<i64>(0).unwrap_or(0))
        })?,
        limit: row
            .col::<Option<String>>(29)?
            .map(|key| {
                Ok::<_, Error>(crate::job::LimitKey {
                    key,
                    parked: row.col(30)?,
                })
            })
            .transpose()?,
        token: token(row.col(31)?),
        expires_at: row.col::<Option<i64>>(32)?.map(time),
    })
}

/// A lease's token as the `lease_token` column keeps it (a `bigint`: the same 64 bits).
pub(crate) fn token_column(token: LeaseToken) -> i64 {
    token.as_bigint()
}

/// The `lease_token` column's value as the token.
pub(crate) fn token(column: i64) -> LeaseToken {
    LeaseToken(u64::from_ne_bytes(column.to_ne_bytes()))
}

/// A job's part in workflows as the `flow` column keeps it: `NULL` for none.
pub(crate) fn flow_column(flow: &crate::workflow::Flow) -> Option<Vec<u8>> {
    (*flow != crate::workflow::Flow::default()).then(|| crate::codec::encode(flow))
}

/// `unique_for_us` as it reads: `NULL` while unfinished, `-1` until purged, else the window.
pub(crate) fn uniqueness(us: Option<i64>) -> Uniqueness {
    match us {
        None => Uniqueness::WhileUnfinished,
        Some(-1) => Uniqueness::UntilPurged,
        Some(us) => Uniqueness::AfterSuccess(duration(us)),
    }
}

/// A [`Uniqueness`] as `unique_for_us` keeps it.
pub(crate) fn unique_for_us(u: Uniqueness) -> Option<i64> {
    match u {
        Uniqueness::WhileUnfinished => None,
        Uniqueness::UntilPurged => Some(-1),
        Uniqueness::AfterSuccess(window) => Some(micros(window)),
    }
}

/// Metadata as the `metadata` column keeps it: `key=value` (a key holds no `=`).
pub(crate) fn metadata_column(pairs: &[(String, String)]) -> Vec<String> {
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub(crate) fn key(job: JobId) -> i64 {
    i64::try_from(job.0).unwrap_or(i64::MAX)
}

pub(crate) fn id(v: i64) -> JobId {
    JobId(u64::try_from(v).unwrap_or(0))
}

pub(crate) fn attempt(v: i64) -> Result<Attempt> {
    u32::try_from(v)
        .map(Attempt)
        .map_err(|_| Error::Corrupt(format!("attempt {v} is out of range")))
}

/// Store time from the database's microseconds since the Unix epoch.
pub(crate) fn time(us: i64) -> StoreTime {
    StoreTime(u64::try_from(us).unwrap_or(0).saturating_mul(1000))
}

pub(crate) fn us(t: StoreTime) -> i64 {
    i64::try_from(t.0 / 1000).unwrap_or(i64::MAX)
}

pub(crate) fn duration(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

pub(crate) fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The longest span store time has (`u64::MAX` nanoseconds, some 584 years), in
/// microseconds: longer durations saturate to it, as store time saturates on redb.
const STORE_SPAN_US: u64 = u64::MAX / 1000;

/// Microseconds as PostgreSQL counts an interval, from a duration, saturated at the span of
/// store time (a larger interval added to a timestamp would be out of PostgreSQL's range).
pub(crate) fn micros(d: Duration) -> i64 {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    clamp(us.min(STORE_SPAN_US))
}

/// A retry policy's column (`retry`, as the codec encodes it; `NULL` for none) at `at`;
/// `whose` names its job or queue where the bytes do not decode.
pub(crate) fn retry_column(
    row: &postgres::Row,
    at: usize,
    whose: impl Fn() -> String,
) -> Result<Option<crate::retry::RetryPolicy>> {
    match row.col::<Option<&[u8]>>(at)? {
        None => Ok(None),
        Some(bytes) => crate::codec::decode(bytes)
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("the retry policy of {}: {e}", whose()))),
    }
}

/// An ended attempt's outcome from a history row as `read::history` selects it (kind in
/// column 4, error 5, reclaim path 6, overdue 7, time limit 9, snooze 10): the reverse of
/// [`outcome_columns`].
pub(crate) fn outcome_from(row: &postgres::Row) -> Result<Outcome> {
    Ok(match row.col::<&str>(4)? {
        "succeeded" => Outcome::Succeeded,
        "failed" => Outcome::Failed(row.col::<Option<String>>(5)?.unwrap_or_default()),
        "released" => Outcome::Released,
        "stalled" => Outcome::Stalled,
        "cancelled" => Outcome::Cancelled,
        "failed_permanently" => {
            Outcome::FailedPermanently(row.col::<Option<String>>(5)?.unwrap_or_default())
        }
        "timed_out" => Outcome::TimedOut {
            limit: duration(row.col::<Option<i64>>(9)?.unwrap_or(0)),
        },
        "snoozed" => Outcome::Snoozed {
            delay: duration(row.col::<Option<i64>>(10)?.unwrap_or(0)),
        },
        "lease_expired" => Outcome::LeaseExpired {
            path: reclaim_path(row.col::<Option<&str>>(6)?)?,
            overdue: duration(row.col::<Option<i64>>(7)?.unwrap_or(0)),
        },
        "never_started" => Outcome::NeverStarted {
            path: reclaim_path(row.col::<Option<&str>>(6)?)?,
        },
        "result_lost" => Outcome::ResultLost {
            path: reclaim_path(row.col::<Option<&str>>(6)?)?,
        },
        other => return Err(Error::Corrupt(format!("unknown outcome {other:?}"))),
    })
}

/// A reclaim path as the history stores it.
fn reclaim_path(name: Option<&str>) -> Result<ReclaimPath> {
    Ok(match name {
        Some("reaper") => ReclaimPath::Reaper,
        Some("takeover") => ReclaimPath::Takeover,
        Some("recovery") => ReclaimPath::Recovery,
        Some("process_died") => ReclaimPath::ProcessDied,
        other => return Err(Error::Corrupt(format!("unknown reclaim path {other:?}"))),
    })
}

/// The history row's outcome columns: kind, error, reclaim path, overdue (a time limit has
/// its own column, `time_limit_us`).
pub(crate) fn outcome_columns(
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
        Outcome::NeverStarted { path } => ("never_started", None, Some(path_name(*path)), None),
        Outcome::ResultLost { path } => ("result_lost", None, Some(path_name(*path)), None),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_longer_than_store_time_spans_saturates_at_that_span() {
        assert_eq!(micros(Duration::from_secs(1)), 1_000_000);
        let span = micros(Duration::from_nanos(u64::MAX));
        assert_eq!(micros(Duration::MAX), span);
        assert_eq!(micros(Duration::from_secs(1000 * 365 * 24 * 3600)), span);
        // not i64::MAX microseconds, an interval PostgreSQL refuses ("interval out of range")
        assert_eq!(span, i64::try_from(u64::MAX / 1000).unwrap());
    }
}
