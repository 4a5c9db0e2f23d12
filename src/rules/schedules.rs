//! Periodic jobs: a declaration checked and kept, and the ticks that fire.

use crate::error::Error;
use crate::ids::StoreTime;
use crate::input;
use crate::new_job::NewJob;
use crate::schedule::{
    CatchUp, JobTemplate, MAX_TICKS_PER_PASS, Schedule, ScheduleRecord, Tick, When,
};

/// The record of schedule `s` declared at `now` (store time) and `wall` (seconds since the
/// epoch), its inputs checked. Every process declares its schedules when it starts, so a
/// declaration that changes nothing keeps the record as it is. One that differs (timing,
/// job, catch-up policy) is refused unless it says [`Schedule::replace`]: then, if the
/// timing is unchanged it keeps the cursor, pause and counts and takes the new job and
/// policy, and a new timing ticks first one interval (or the expression's next tick) from
/// now, as a new schedule does.
pub(crate) fn declare(
    existing: Option<&ScheduleRecord>,
    s: &Schedule,
    max_payload: usize,
    now: StoreTime,
    wall: i64,
) -> Result<ScheduleRecord, Error> {
    input::check_schedule(s, max_payload)?;
    let template = JobTemplate::of(&s.job);
    if let Some(old) = existing {
        let same = old.when == s.when
            && old.template == template
            && old.retry == s.job.retry
            && old.limit_key == s.job.limit_key
            && old.expires == s.job.expiry()
            && old.catch_up == s.catch_up;
        if !same && !s.replace {
            return Err(Error::ScheduleConflict(s.name.clone()));
        }
    }
    if let Some(old) = existing.filter(|old| old.when == s.when) {
        let mut kept = old.clone();
        kept.template = template;
        kept.retry = s.job.retry.clone();
        kept.limit_key = s.job.limit_key.clone();
        kept.expires = s.job.expiry();
        kept.catch_up = s.catch_up;
        return Ok(kept);
    }
    let next = first_tick(&s.when, now, wall)?;
    Ok(ScheduleRecord {
        name: s.name.clone(),
        template,
        when: s.when.clone(),
        catch_up: s.catch_up,
        paused: existing.is_some_and(|old| old.paused),
        next,
        last_fired: existing.and_then(|old| old.last_fired),
        fired: existing.map_or(0, |old| old.fired),
        skipped: existing.map_or(0, |old| old.skipped),
        retry: s.job.retry.clone(),
        limit_key: s.job.limit_key.clone(),
        expires: s.job.expiry(),
    })
}

/// The first tick of `when` after `now` / `wall`.
pub(super) fn first_tick(when: &When, now: StoreTime, wall: i64) -> Result<Tick, Error> {
    Ok(match when {
        When::Every(every) => Tick::Store(now.saturating_add(*every)),
        When::Cron { expr, zone } => {
            Tick::Wall(crate::schedule::cron::next_after(expr, zone, wall)?)
        }
    })
}

/// The tick of `when` after `tick`.
pub(super) fn tick_after(when: &When, tick: Tick) -> Result<Tick, Error> {
    Ok(match (when, tick) {
        (When::Every(every), Tick::Store(t)) => Tick::Store(t.saturating_add(*every)),
        (When::Cron { expr, zone }, Tick::Wall(s)) => {
            Tick::Wall(crate::schedule::cron::next_after(expr, zone, s)?)
        }
        // A cursor of the other kind than the timing: a record no build writes.
        (when, tick) => {
            return Err(Error::Corrupt(format!(
                "a schedule timed {when:?} has its next tick at {tick:?}"
            )));
        }
    })
}

/// Whether `tick` has come at `now` / `wall`.
pub(super) fn has_come(tick: Tick, now: StoreTime, wall: i64) -> bool {
    match tick {
        Tick::Store(t) => t <= now,
        Tick::Wall(s) => s <= wall,
    }
}

/// How long ago `tick` was at `now` / `wall`.
pub(super) fn age(tick: Tick, now: StoreTime, wall: i64) -> std::time::Duration {
    match tick {
        Tick::Store(t) => now.saturating_since(t),
        Tick::Wall(s) => std::time::Duration::from_secs(u64::try_from(wall - s).unwrap_or(0)),
    }
}

/// How many ticks one pass steps through for a schedule at most before it jumps to now (a
/// long downtime of a schedule every second).
pub(super) const STEPS_PER_PASS: usize = 100_000;

/// What firing `record` at `now` / `wall` does: the ticks whose jobs to enqueue, oldest
/// first, and the record with its cursor past every tick that has come (or, for
/// [`CatchUp::All`], past the ticks fired, at most [`MAX_TICKS_PER_PASS`] a pass). A paused
/// schedule fires nothing and keeps its cursor: when it resumes, the ticks that passed are
/// missed ticks, handled by its catch-up policy. Missed ticks: [`CatchUp::Once`] fires the
/// latest of them, [`CatchUp::All`] each, [`CatchUp::Skip`] only one fired within
/// [`ON_TIME`](crate::schedule::ON_TIME) of its time.
pub(crate) fn fire(
    record: &ScheduleRecord,
    now: StoreTime,
    wall: i64,
) -> Result<(Vec<Tick>, ScheduleRecord), Error> {
    let mut new = record.clone();
    if record.paused || !has_come(record.next, now, wall) {
        return Ok((Vec::new(), new));
    }
    let mut fired = Vec::new();
    let mut cursor = record.next;
    let mut latest = None;
    let mut passed = 0u64;
    let mut steps = 0;
    while has_come(cursor, now, wall) {
        if record.catch_up == CatchUp::All {
            if fired.len() == MAX_TICKS_PER_PASS {
                break;
            }
            fired.push(cursor);
        } else {
            passed += 1;
            latest = Some(cursor);
        }
        steps += 1;
        if steps == STEPS_PER_PASS && record.catch_up != CatchUp::All {
            // Not every tick of a long downtime is looked at: the rest are missed too.
            cursor = first_tick(&record.when, now, wall)?;
            break;
        }
        cursor = tick_after(&record.when, cursor)?;
    }
    if let Some(latest) = latest {
        let on_time = age(latest, now, wall) < crate::schedule::ON_TIME;
        if record.catch_up == CatchUp::Once || on_time {
            fired.push(latest);
            passed -= 1;
        }
    }
    new.next = cursor;
    new.skipped += passed;
    new.fired += fired.len() as u64;
    if let Some(last) = fired.last() {
        new.last_fired = Some(*last);
    }
    Ok((fired, new))
}

/// What one schedule comes to in a scheduler's pass.
pub(crate) enum Firing {
    /// The jobs of its ticks that have come, to enqueue, and its record to save (`None`:
    /// unchanged).
    Fire {
        jobs: Vec<NewJob>,
        save: Option<Box<ScheduleRecord>>,
    },
    /// Why it cannot fire (its record unreadable, a tick's job refused), as it is kept beside
    /// it ([`schedule_failure_key`]) until a pass fires it. The pass leaves the schedule as
    /// it was and goes on with the others.
    Failed(String),
}

/// Firing schedule `record` (as its engine read it) at `now` / `wall` ([`fire`]), every
/// tick's job checked as an enqueue checks it, before anything is written.
pub(crate) fn firing(
    record: Result<ScheduleRecord, Error>,
    now: StoreTime,
    wall: i64,
    max_payload: usize,
) -> Firing {
    let planned = record.and_then(|record| {
        let (ticks, new) = fire(&record, now, wall)?;
        let jobs: Vec<NewJob> = ticks.into_iter().map(|tick| record.job(tick)).collect();
        for job in &jobs {
            input::check_new_job(job, max_payload)?;
        }
        Ok((jobs, (new != record).then(|| Box::new(new))))
    });
    match planned {
        Ok((jobs, save)) => Firing::Fire { jobs, save },
        Err(e) => Firing::Failed(input::error_message(&e.to_string())),
    }
}

/// Where a store keeps the last failure of schedule `name` (a key of its meta table, as
/// the reaper's last pass is): written when a pass could not fire it, removed when one
/// does, when it is declared again and when it is removed.
pub(crate) fn schedule_failure_key(name: &str) -> String {
    format!("schedule.failure:{name}")
}
