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
use crate::rules::{self, Firing};
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
    // Declared anew, it is checked anew: a failure it had is the next pass's to find.
    note_schedule_failure(tx, p, schedule.name(), None)
}

/// Fires every schedule whose tick has come ([`rules::firing`]), each row locked and its
/// cursor moved in the transaction that enqueues its ticks' jobs; a row another machine's
/// scheduler holds is passed over (that one fires it). A schedule that cannot fire (its
/// record unreadable, its ticks refused: found before any statement of its own runs) is
/// passed over with its failure kept beside it, and the others fire. Returns the jobs
/// enqueued.
pub(crate) fn fire_schedules(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    s: &Settings,
    wall: i64,
) -> Result<Vec<JobId>> {
    let st = p.get(
        tx,
        "SELECT s.name, s.record, m.value FROM {s}.leasehold_schedules s
         LEFT JOIN {s}.leasehold_meta m ON m.key = $1 || s.name
         WHERE octet_length(s.record) > 0 ORDER BY s.name FOR UPDATE OF s SKIP LOCKED",
    )?;
    let prefix = rules::schedule_failure_key("");
    let records = tx
        .query(&st, &[&prefix])?
        .iter()
        .map(|row| {
            let name: String = row.col(0)?;
            let record = decode_schedule(&name, row.col(1)?);
            Ok((name, record, row.col::<Option<String>>(2)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let now = now(tx, p)?;
    let mut enqueued = Vec::new();
    for (name, record, kept) in records {
        let failure = match rules::firing(record, now, wall, s.max_payload) {
            Firing::Fire { jobs, save } => {
                for job in &jobs {
                    enqueued.push(enqueue(tx, p, s, job)?);
                }
                if let Some(new) = save {
                    save_schedule(tx, p, &new)?;
                }
                None
            }
            Firing::Failed(why) => {
                tracing::warn!(schedule = %name, error = %why, "a schedule could not fire; the others did");
                Some(why)
            }
        };
        if failure != kept {
            note_schedule_failure(tx, p, &name, failure.as_deref())?;
        }
    }
    Ok(enqueued)
}

/// Keeps schedule `name`'s failure beside it in the meta table (`None`: it has none).
fn note_schedule_failure(
    tx: Tx<'_, '_>,
    p: &mut Prepared<'_>,
    name: &str,
    failure: Option<&str>,
) -> Result<()> {
    let key = rules::schedule_failure_key(name);
    match failure {
        Some(failure) => {
            let st = p.get(
                tx,
                "INSERT INTO {s}.leasehold_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value
                 WHERE {s}.leasehold_meta.value IS DISTINCT FROM excluded.value",
            )?;
            tx.execute(&st, &[&key, &failure])?
        }
        None => {
            let st = p.get(tx, "DELETE FROM {s}.leasehold_meta WHERE key = $1")?;
            tx.execute(&st, &[&key])?
        }
    };
    Ok(())
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
    let removed = tx.execute(&st, &[&name])? > 0;
    note_schedule_failure(tx, p, name, None)?;
    Ok(removed)
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
