//! Periodic jobs in SQL: each schedule is a row holding its record, locked while a step
//! reads and rewrites it, so that of several machines firing at once one fires each tick
//! (the others pass the locked row over). What a schedule does is the rule book's
//! ([`rules::declare`], [`rules::fire`]); the ticks' jobs are enqueued in the same
//! transaction that moves the schedule's cursor.

use super::protocol::{Tx, enqueue, now};
use super::rows::Col;
use super::{Prepared, Settings};
use crate::error::{Error, Result};
use crate::ids::JobId;
use crate::rules;
use crate::schedule::{Schedule, ScheduleRecord};

/// Declares a schedule ([`rules::declare`]), its row locked (two processes declaring it at
/// once are one after the other).
pub(crate) fn declare_schedule(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    schedule: &Schedule,
    wall: i64,
) -> Result<()> {
    let st = p.get(
        tx,
        "INSERT INTO {s}.leasehold_schedules (name, record) VALUES ($1, '') ON CONFLICT DO NOTHING",
    )?;
    tx.execute(&st, &[&schedule.name()])?;
    let existing = schedule_record(tx, p, schedule.name())?;
    let now = now(tx, p)?;
    let record = rules::declare(existing.as_ref(), schedule, s.max_payload, now, wall)?;
    if existing.as_ref() != Some(&record) {
        save_schedule(tx, p, &record)?;
    }
    Ok(())
}

/// Fires every schedule whose tick has come ([`rules::fire`]), each row locked and its
/// cursor moved in the transaction that enqueues its ticks' jobs; a row another machine's
/// scheduler holds is passed over (that one fires it). Returns the jobs enqueued.
pub(crate) fn fire_schedules(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    wall: i64,
) -> Result<Vec<JobId>> {
    let st = p.get(
        tx,
        "SELECT name, record FROM {s}.leasehold_schedules
         WHERE octet_length(record) > 0 ORDER BY name FOR UPDATE SKIP LOCKED",
    )?;
    let records = tx
        .query(&st, &[])?
        .iter()
        .map(|row| decode_schedule(row.col(0)?, row.col(1)?))
        .collect::<Result<Vec<_>>>()?;
    let now = now(tx, p)?;
    let mut enqueued = Vec::new();
    for record in records {
        let (ticks, new) = rules::fire(&record, now, wall)?;
        for tick in ticks {
            enqueued.push(enqueue(tx, p, s, &record.template.job(&record.name, tick))?);
        }
        if new != record {
            save_schedule(tx, p, &new)?;
        }
    }
    Ok(enqueued)
}

/// Pauses (or resumes) a schedule.
pub(crate) fn pause_schedule(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    name: &str,
    paused: bool,
) -> Result<()> {
    let mut record =
        schedule_record(tx, p, name)?.ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))?;
    if record.paused != paused {
        record.paused = paused;
        save_schedule(tx, p, &record)?;
    }
    Ok(())
}

/// Removes a schedule; `false` if there was none.
pub(crate) fn remove_schedule(tx: Tx<'_, '_>, p: &mut Prepared<'_>, name: &str) -> Result<bool> {
    let st = p.get(tx, "DELETE FROM {s}.leasehold_schedules WHERE name = $1")?;
    Ok(tx.execute(&st, &[&name])? > 0)
}

/// The record of schedule `name`, its row locked.
fn schedule_record(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    name: &str,
) -> Result<Option<ScheduleRecord>> {
    let st = p.get(
        tx,
        "SELECT record FROM {s}.leasehold_schedules
         WHERE name = $1 AND octet_length(record) > 0 FOR UPDATE",
    )?;
    match tx.query_opt(&st, &[&name])? {
        Some(row) => decode_schedule(name, row.col(0)?).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn decode_schedule(name: &str, bytes: &[u8]) -> Result<ScheduleRecord> {
    crate::codec::decode(bytes).map_err(|e| Error::Corrupt(format!("schedule {name:?}: {e}")))
}

fn save_schedule(tx: Tx<'_, '_>, p: &mut Prepared<'_>, record: &ScheduleRecord) -> Result<()> {
    let st = p.get(
        tx,
        "UPDATE {s}.leasehold_schedules SET record = $2 WHERE name = $1",
    )?;
    let bytes = crate::codec::encode(record);
    tx.execute(&st, &[&record.name, &bytes])?;
    Ok(())
}
