//! A queue's own record in SQL (pause, limits, the recent claims a rate counts), one row per
//! queue that has one, locked while a claim of a limited queue counts its free slots so that
//! two claims never count the same one. What the record says is the rule book's
//! ([`rules::claim_room`], [`rules::paused`], [`rules::limited`]).

use super::Prepared;
use super::protocol::{Tx, notify, now};
use super::rows::{Col, micros, time, us};
use crate::error::Result;
use crate::input;
use crate::queue::QueueRecord;
use crate::rules;

/// The columns of a queue's record, in the order [`queue_from`] reads them.
macro_rules! queue_columns {
    () => {
        "{s}.us(q.served_at), q.paused, q.concurrency, q.rate_claims, q.rate_per_us,
         q.recent_claims"
    };
}
const QUEUE_RECORD: &str = concat!(
    "SELECT ",
    queue_columns!(),
    " FROM {s}.leasehold_queues q WHERE q.queue = $1"
);
const QUEUE_RECORD_LOCKED: &str = concat!(
    "SELECT ",
    queue_columns!(),
    " FROM {s}.leasehold_queues q WHERE q.queue = $1 FOR UPDATE"
);
pub(crate) use queue_columns;

/// The record of `queue`, if it has one; its row locked with `lock` (which serializes the
/// claims of a limited queue, so that two never count the same free slot).
pub(crate) fn queue_record(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    lock: bool,
) -> Result<Option<QueueRecord>> {
    let st = p.get(
        tx,
        if lock {
            QUEUE_RECORD_LOCKED
        } else {
            QUEUE_RECORD
        },
    )?;
    match tx.query_opt(&st, &[&queue])? {
        Some(row) => queue_from(&row, 0),
        None => Ok(None),
    }
}

/// The queue's record in `row`'s [`queue_columns`] from column `at` on; `None` where they
/// are null (a queue without a record, left-joined).
pub(crate) fn queue_from(row: &postgres::Row, at: usize) -> Result<Option<QueueRecord>> {
    let Some(paused) = row.col::<Option<bool>>(at + 1)? else {
        return Ok(None);
    };
    let rate = match (
        row.col::<Option<i32>>(at + 3)?,
        row.col::<Option<i64>>(at + 4)?,
    ) {
        (Some(claims), Some(per)) => Some(crate::queue::Rate {
            claims: u32::try_from(claims).unwrap_or(0),
            per: super::rows::duration(per),
        }),
        _ => None,
    };
    Ok(Some(QueueRecord {
        served_at: row.col::<Option<i64>>(at)?.map(time),
        paused,
        limits: crate::queue::QueueLimits {
            concurrency: row
                .col::<Option<i32>>(at + 2)?
                .map(|n| u32::try_from(n).unwrap_or(0)),
            rate,
        },
        recent_claims: row
            .col::<Option<Vec<i64>>>(at + 5)?
            .unwrap_or_default()
            .into_iter()
            .map(time)
            .collect(),
    }))
}

/// Keeps `claimed` claims of `queue` in its rate window, if it has a rate limit.
pub(crate) fn noted(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    record: Option<QueueRecord>,
    claimed: usize,
) -> Result<()> {
    let Some(record) = record.filter(|r| claimed > 0 && r.limits.rate.is_some()) else {
        return Ok(());
    };
    let now = now(tx, p)?;
    let new = rules::note_claims(&record, claimed, now);
    save_queue(tx, p, queue, &new)
}

/// Stores a queue's record (its served mark apart, which [`mark_served`] keeps).
fn save_queue(tx: Tx<'_, '_>, p: &mut Prepared<'_>, queue: &str, r: &QueueRecord) -> Result<()> {
    let st = p.get(
        tx,
        "INSERT INTO {s}.leasehold_queues AS q
             (queue, paused, concurrency, rate_claims, rate_per_us, recent_claims)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused,
             concurrency = excluded.concurrency, rate_claims = excluded.rate_claims,
             rate_per_us = excluded.rate_per_us, recent_claims = excluded.recent_claims",
    )?;
    let concurrency = r
        .limits
        .concurrency
        .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    let rate_claims = r
        .limits
        .rate
        .map(|x| i32::try_from(x.claims).unwrap_or(i32::MAX));
    let rate_per = r.limits.rate.map(|x| micros(x.per));
    let recent: Vec<i64> = r.recent_claims.iter().map(|t| us(*t)).collect();
    tx.execute(
        &st,
        &[
            &queue,
            &r.paused,
            &concurrency,
            &rate_claims,
            &rate_per,
            &recent,
        ],
    )?;
    Ok(())
}

/// Pauses (or resumes) `queue` ([`rules::paused`]); a resume wakes waiting workers on every
/// machine.
pub(crate) fn pause_queue(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    pause: bool,
) -> Result<()> {
    input::check_queue(queue)?;
    let record = queue_record(tx, p, queue, true)?;
    save_queue(tx, p, queue, &rules::paused(record.as_ref(), pause))?;
    if !pause {
        notify(tx, p, queue)?;
    }
    Ok(())
}

/// Sets `queue`'s limits ([`rules::limited`]), waking its waiters on every machine.
pub(crate) fn set_queue_limits(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    queue: &str,
    limits: crate::queue::QueueLimits,
) -> Result<()> {
    input::check_queue(queue)?;
    let record = queue_record(tx, p, queue, true)?;
    save_queue(tx, p, queue, &rules::limited(record.as_ref(), limits)?)?;
    notify(tx, p, queue)
}
