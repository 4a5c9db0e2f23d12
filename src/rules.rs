//! The rule book: every decision of the lease protocol, once, as a pure function of a job's
//! record, the input and the store time it acts at.
//!
//! Nothing here touches redb or SQL. The protocol ([`crate::protocol`], written once over
//! every engine's records) loads (and locks) a record, asks a rule what becomes of it, and
//! has the engine store the answer: the new record, the history record of an attempt that
//! ended, and the counters that move. PostgreSQL's single-statement shortcuts (a claim of
//! many, renewals of many, completions of many: `src/postgres/fast.rs`) compute the same
//! answers in SQL, and the shared test suites hold them to it.
//!
//! The rules:
//! * **New job** ([`new_job`]): checked inputs, `Queued`, due after its delay.
//! * **Fence** ([`fence`]): a write holds only for a job `Running` under the caller's
//!   attempt; a refusal moves one counter (a renewal after the holder's own end moves none).
//! * **Claim order** ([`takes_over`]): an expired lease is taken over before the most urgent
//!   ready job only when it is at least as urgent.
//! * **Grant** ([`grant`]): a new attempt under a lease; a job whose attempt counter is
//!   exhausted is dead instead, never leased with a fence equal to the last.
//! * **Renewal** ([`renew`]): a cancel requested ends the attempt, then a stall does, else the
//!   lease runs its length from now.
//! * **End of an attempt** ([`end`]): which outcomes spend the budget, the next state, the
//!   finish time, the history record. [`complete`], [`fail`], [`release`] and [`expire`]
//!   choose the outcome and the next state ([`after_failure`]); a failure no retry mends
//!   ([`Retry::Never`]) is dead at once.
//! * **Cancel** ([`cancel`]) and **retry** ([`retry`]): an operator's decisions.

use crate::error::{Error, LeaseLost};
use crate::ids::{Attempt, JobId, StoreTime};
use crate::input;
use crate::job::{
    JobRecord, JobState, LeaseRecord, NewJob, Outcome, ReclaimPath, RunRecord, Uniqueness,
};
use crate::lease::LeaseTerms;
use crate::queue::{QueueLimits, QueueRecord};
use crate::report::Reclaim;
use crate::retry::RetryPolicy;
use crate::schedule::{
    CatchUp, JobTemplate, MAX_TICKS_PER_PASS, Schedule, ScheduleRecord, Tick, When,
};
use crate::stats::Counters;

/// Why a job whose attempt counter ran out is dead.
pub(crate) const ATTEMPTS_EXHAUSTED: &str =
    "dead: its attempt counter is exhausted, so no new lease could be fenced apart from the last";

/// What a rule decided about one job: the record to store, the attempt that ended (its
/// history record) if one did, and what the counters gain.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    /// The job's record as it is to be stored.
    pub job: JobRecord,
    /// The record of the attempt that ended here, for history.
    pub ended: Option<RunRecord>,
    /// What the lifetime counters gain.
    pub counts: Counters,
}

// ----- a new job -----

/// The record of a new job `id` enqueued at `now`: its inputs checked (the same refusal on
/// both engines), due once its delay has passed, with the store's default budget unless it
/// has its own.
pub(crate) fn new_job(
    new: &NewJob,
    id: JobId,
    default_max_attempts: u32,
    max_payload: usize,
    now: StoreTime,
) -> Result<JobRecord, Error> {
    input::check_new_job(new, max_payload)?;
    Ok(JobRecord {
        id,
        queue: new.queue.clone(),
        state: JobState::Queued,
        priority: new.priority,
        attempt: Attempt(0),
        failures: 0,
        max_attempts: new.max_attempts.unwrap_or(default_max_attempts),
        unique_key: new.unique_key.clone(),
        created_at: now,
        run_at: now.saturating_add(new.delay),
        lease: None,
        progress: 0,
        progress_at: now,
        cancel_requested: false,
        last_error: None,
        finished_at: None,
        updated_at: now,
        uniqueness: new.uniqueness,
        key_released: false,
        time_limit: new.time_limit,
        metadata: new.metadata.clone(),
    })
}

// ----- unique keys -----

/// Whether `holder` (a job with the unique key an enqueue or a retry asks for) holds it at
/// `now`: while it waits or runs, and after it succeeded for its window ([`Uniqueness`]),
/// unless a newer job has already taken the key after the window.
pub(crate) fn holds_key(holder: &JobRecord, now: StoreTime) -> bool {
    if holder.unique_key.is_none() || holder.key_released {
        return false;
    }
    if !holder.state.is_terminal() {
        return true;
    }
    match (holder.state, holder.uniqueness, holder.finished_at) {
        (JobState::Succeeded, Uniqueness::UntilPurged, _) => true,
        (JobState::Succeeded, Uniqueness::AfterSuccess(window), Some(at)) => {
            now < at.saturating_add(window)
        }
        _ => false,
    }
}

/// Whether `job` keeps its unique key in the index: it may hold it (see [`holds_key`]; a
/// finished one's window is judged when the key is next asked for, since an index entry
/// cannot depend on the time).
pub(crate) fn keeps_key(job: &JobRecord) -> bool {
    job.unique_key.is_some()
        && !job.key_released
        && (!job.state.is_terminal()
            || (job.state == JobState::Succeeded && job.uniqueness != Uniqueness::WhileUnfinished))
}

/// A finished `holder` whose window has run out gives its key up to a newer job.
pub(crate) fn release_key(holder: &JobRecord, now: StoreTime) -> JobRecord {
    let mut released = holder.clone();
    released.key_released = true;
    released.updated_at = now;
    released
}

// ----- queues -----

/// What a claim may take of a queue now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    /// How many of its jobs (`usize::MAX`: no limit).
    pub allowed: usize,
    /// When there is none, when to look again: the end of a rate window, or soon for a full
    /// queue (a holder in another process or machine may finish any moment); `None` while
    /// paused (a resume wakes the waiters).
    pub more_at: Option<StoreTime>,
}

/// How soon a waiting pool looks again at a queue whose concurrency limit is full.
pub(crate) const FULL_QUEUE_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a claim may take at `now` of a queue with `record` (`None`: never paused or
/// limited) and `running` of its jobs held: nothing while it is paused; else what its
/// concurrency limit leaves (the engine takes back its expired leases first, so a lease
/// that ran out holds no slot) and what its rate limit's window leaves.
pub(crate) fn claim_room(record: Option<&QueueRecord>, running: u64, now: StoreTime) -> Room {
    let mut room = Room {
        allowed: usize::MAX,
        more_at: None,
    };
    let Some(record) = record else {
        return room;
    };
    if record.paused {
        room.allowed = 0;
        return room;
    }
    if let Some(limit) = record.limits.concurrency {
        let free = u64::from(limit).saturating_sub(running);
        room.allowed = room
            .allowed
            .min(usize::try_from(free).unwrap_or(usize::MAX));
        if free == 0 {
            room.more_at = Some(now.saturating_add(FULL_QUEUE_LOOK));
        }
    }
    if let Some(rate) = record.limits.rate {
        let in_window: Vec<StoreTime> = record
            .recent_claims
            .iter()
            .copied()
            .filter(|t| t.saturating_add(rate.per) > now)
            .collect();
        let free = (rate.claims as usize).saturating_sub(in_window.len());
        room.allowed = room.allowed.min(free);
        if free == 0 {
            let ends = in_window
                .first()
                .map_or(now, |oldest| oldest.saturating_add(rate.per));
            room.more_at = Some(room.more_at.map_or(ends, |at| at.max(ends)));
        }
    }
    room
}

/// Whether claims of a queue with `record` count its slots or its rate window, so that the
/// claims of every process and machine must take its record one at a time.
pub(crate) fn counts_claims(record: &QueueRecord) -> bool {
    !record.paused && record.limits.is_limited()
}

/// Whether a claim of a queue with `record` takes its expired leases back before it counts
/// the running jobs: with a concurrency limit, a lease that ran out holds no slot, and its
/// holder's late renewal must not take one back from the claim that filled it.
pub(crate) fn takes_back_first(record: &QueueRecord) -> bool {
    !record.paused && record.limits.concurrency.is_some()
}

/// The queue's record once a worker has asked it for work (or renewed one of its leases) at
/// `now`: served then, never earlier than a mark already kept (see [`crate::queue`]).
pub(crate) fn served(record: Option<QueueRecord>, now: StoreTime) -> QueueRecord {
    let mut new = record.unwrap_or_default();
    new.served_at = Some(new.served_at.map_or(now, |at| at.max(now)));
    new
}

/// The queue's record after `n` claims at `now`: with a rate limit, each claim's time is
/// kept while its window lasts.
pub(crate) fn note_claims(record: &QueueRecord, n: usize, now: StoreTime) -> QueueRecord {
    let mut new = record.clone();
    if let Some(rate) = record.limits.rate {
        new.recent_claims
            .retain(|t| t.saturating_add(rate.per) > now);
        new.recent_claims.extend(std::iter::repeat_n(now, n));
    }
    new
}

/// When a waiting pool should look at the queue again, given its room and when its next job
/// (or lease expiry) is due: the room's time while there is no room, else the job's.
pub(crate) fn next_look(room: Room, next_due: Option<StoreTime>) -> Option<StoreTime> {
    match room.allowed {
        0 => room.more_at,
        _ => next_due,
    }
}

/// The record of a queue paused (or resumed).
pub(crate) fn paused(record: Option<&QueueRecord>, paused: bool) -> QueueRecord {
    let mut new = record.cloned().unwrap_or_default();
    new.paused = paused;
    new
}

/// The record of a queue with new limits (checked); the rate window's claims are kept, so
/// a new rate counts the claims already made in its window.
pub(crate) fn limited(
    record: Option<&QueueRecord>,
    limits: QueueLimits,
) -> Result<QueueRecord, Error> {
    input::check_limits(&limits)?;
    let mut new = record.cloned().unwrap_or_default();
    new.limits = limits;
    if limits.rate.is_none() {
        new.recent_claims.clear();
    }
    Ok(new)
}

// ----- schedules -----

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
        let same = old.when == s.when && old.template == template && old.catch_up == s.catch_up;
        if !same && !s.replace {
            return Err(Error::ScheduleConflict(s.name.clone()));
        }
    }
    if let Some(old) = existing.filter(|old| old.when == s.when) {
        let mut kept = old.clone();
        kept.template = template;
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
    })
}

/// The first tick of `when` after `now` / `wall`.
fn first_tick(when: &When, now: StoreTime, wall: i64) -> Result<Tick, Error> {
    Ok(match when {
        When::Every(every) => Tick::Store(now.saturating_add(*every)),
        When::Cron { expr, zone } => {
            Tick::Wall(crate::schedule::cron::next_after(expr, zone, wall)?)
        }
    })
}

/// The tick of `when` after `tick`.
fn tick_after(when: &When, tick: Tick) -> Result<Tick, Error> {
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
fn has_come(tick: Tick, now: StoreTime, wall: i64) -> bool {
    match tick {
        Tick::Store(t) => t <= now,
        Tick::Wall(s) => s <= wall,
    }
}

/// How long ago `tick` was at `now` / `wall`.
fn age(tick: Tick, now: StoreTime, wall: i64) -> std::time::Duration {
    match tick {
        Tick::Store(t) => now.saturating_since(t),
        Tick::Wall(s) => std::time::Duration::from_secs(u64::try_from(wall - s).unwrap_or(0)),
    }
}

/// How many ticks one pass steps through for a schedule at most before it jumps to now (a
/// long downtime of a schedule every second).
const STEPS_PER_PASS: usize = 100_000;

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
        let jobs: Vec<NewJob> = ticks
            .into_iter()
            .map(|tick| record.template.job(&record.name, tick))
            .collect();
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

// ----- the fence -----

/// Which kind of fenced write asks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// A renewal: refused, it counts as a lost lease unless its holder had ended the attempt.
    Heartbeat,
    /// An end of the attempt (complete, fail, snooze, release): refused, it counts as a
    /// fenced write. After the attempt's deadline it is refused too ([`before_deadline`]).
    End,
    /// The holder ends the attempt as timed out: the one end its deadline allows.
    TimeOut,
}

/// The fence's verdict on a write by attempt `attempt` of job `id`, given the record found
/// (`None`: no such job), which it hands back when the write holds. `ended_by_holder` is asked only when the job is at that attempt
/// but no longer running: whether its history says its holder completed, failed or
/// released it (a heartbeat tick overlapping the holder's own end lost nothing).
///
/// `Ok` when the write holds; else the refusal to return, and what the counters gain.
pub(crate) fn fence<E>(
    found: Option<JobRecord>,
    id: JobId,
    attempt: Attempt,
    write: Write,
    ended_by_holder: impl FnOnce() -> Result<bool, E>,
) -> Result<Result<JobRecord, Refused>, E> {
    let found = match found {
        Some(job) if job.state == JobState::Running && job.attempt == attempt => {
            return Ok(Ok(job));
        }
        found => found,
    };
    let ended_by_holder = match &found {
        // Only its holder's completion makes a job succeed (an engine may keep no history
        // row of that attempt: the PostgreSQL one keeps it in the job's row).
        Some(job) if job.attempt == attempt && job.state == JobState::Succeeded => true,
        Some(job) if job.attempt == attempt => ended_by_holder()?,
        _ => false,
    };
    let mut counts = Counters::default();
    match write {
        Write::Heartbeat if ended_by_holder => {}
        Write::Heartbeat => counts.leases_lost = 1,
        Write::End | Write::TimeOut => counts.fenced_writes_rejected = 1,
    }
    let lost = LeaseLost {
        job: id,
        attempt,
        found: found.map(|j| (j.attempt, j.state)),
        ended_by_holder,
    };
    Ok(Err(Refused { lost, counts }))
}

/// The deadline's part of the fence, asked of a write the fence let through: an end its
/// holder writes at or after the attempt's deadline (the claim time plus its hard time limit)
/// is refused, found still running. The attempt ran into its limit, and ends as timed out
/// whoever meets it first: its holder's time-out ([`Write::TimeOut`]), a renewal, the reaper
/// or a claim's takeover ([`expire`]); never as its holder says, so a result that came late
/// is never committed.
pub(crate) fn before_deadline(
    job: JobRecord,
    write: Write,
    now: StoreTime,
) -> Result<JobRecord, Refused> {
    if write != Write::End || !past_deadline(job.lease.as_ref(), now) {
        return Ok(job);
    }
    Err(Refused {
        lost: LeaseLost {
            job: job.id,
            attempt: job.attempt,
            found: Some((job.attempt, job.state)),
            ended_by_holder: false,
        },
        counts: Counters {
            fenced_writes_rejected: 1,
            ..Counters::default()
        },
    })
}

/// Whether an attempt under `lease` has run into its hard time limit at `now`.
fn past_deadline(lease: Option<&LeaseRecord>, now: StoreTime) -> bool {
    lease
        .and_then(|l| l.deadline)
        .is_some_and(|deadline| deadline <= now)
}

/// A write the fence refused: the answer, and what the counters gain (the refusal is
/// counted even though the write changes nothing else).
#[derive(Debug)]
pub(crate) struct Refused {
    pub lost: LeaseLost,
    pub counts: Counters,
}

/// Whether an ended attempt's outcome was its holder's own doing (so a renewal that comes
/// after it lost nothing).
pub(crate) fn ended_by_its_holder(outcome: Option<&Outcome>) -> bool {
    matches!(
        outcome,
        Some(
            Outcome::Succeeded
                | Outcome::Failed(_)
                | Outcome::FailedPermanently(_)
                | Outcome::Released
                | Outcome::Snoozed { .. }
        )
    )
}

// ----- claims -----

/// Whether a lease that expired is taken over before the most urgent due waiting job (of
/// priority `ready`, if there is one): when it is at least as urgent. An expired lease is a
/// job that was already due, so at equal priority it goes first.
pub(crate) fn takes_over(expired: &JobRecord, ready: Option<i32>) -> bool {
    ready.is_none_or(|priority| expired.priority <= priority)
}

/// Whether a running job's expiry index entry stands at its lease's real expiry. Only such
/// an entry counts when looking for the lease that expired first: one that lags a renewal
/// (see [`LeaseRecord`]) is caught up and looked at again there, so a renewed lease never
/// goes ahead of one that expired before it.
pub(crate) fn expiry_in_place(job: &JobRecord) -> bool {
    job.lease
        .as_ref()
        .is_some_and(|l| l.indexed_expiry == l.expires_at)
}

/// Whether `job` runs under a lease that has expired at `now`.
pub(crate) fn lease_expired(job: &JobRecord, now: StoreTime) -> bool {
    job.state == JobState::Running && job.lease.as_ref().is_some_and(|l| l.expires_at <= now)
}

/// Whether a waiting `job` may be claimed at `now`.
pub(crate) fn claimable(job: &JobRecord, now: StoreTime) -> bool {
    job.state.is_waiting() && job.run_at <= now
}

/// What a grant made of a waiting job.
pub(crate) enum Granted {
    /// A new attempt under a lease.
    Lease(JobRecord),
    /// Its attempt counter is exhausted: no fence could tell a new attempt from the last, so
    /// it is dead instead, with the reason as its last error.
    Exhausted(JobRecord),
}

/// Starts a new attempt of the waiting `job` under a lease for `worker` at `now`.
pub(crate) fn grant(job: &JobRecord, worker: &str, terms: LeaseTerms, now: StoreTime) -> Granted {
    let Some(attempt) = job.attempt.next() else {
        let mut dead = job.clone();
        finish(&mut dead, JobState::Dead, now);
        dead.last_error = Some(ATTEMPTS_EXHAUSTED.to_owned());
        return Granted::Exhausted(dead);
    };
    let deadline = job
        .time_limit
        .or(terms.time_limit)
        .map(|limit| now.saturating_add(limit));
    let expires_at = capped(now.saturating_add(terms.length), deadline);
    let mut new = job.clone();
    new.state = JobState::Running;
    new.attempt = attempt;
    new.lease = Some(LeaseRecord {
        owner: worker.to_owned(),
        claimed_at: now,
        expires_at,
        indexed_expiry: expires_at,
        length: terms.length,
        stall_timeout: terms.stall_timeout,
        deadline,
    });
    new.progress = 0;
    new.progress_at = now;
    new.updated_at = now;
    Granted::Lease(new)
}

/// A lease's expiry, never past the attempt's deadline: a holder that goes silent after the
/// deadline loses the job then, not a lease later.
fn capped(expires_at: StoreTime, deadline: Option<StoreTime>) -> StoreTime {
    deadline.map_or(expires_at, |d| expires_at.min(d))
}

// ----- renewals -----

/// What a renewal made of a held lease.
pub(crate) enum Renewed {
    /// Renewed: the lease runs its length from now (never shortened).
    Lease(JobRecord),
    /// A cancel was requested: the attempt ends here, cancelled.
    Cancelled(Change),
    /// No progress for the lease's stall timeout: the attempt ends here, stalled.
    Stalled(Change),
    /// The attempt's deadline has come: it ends here, timed out.
    TimedOut(Change),
}

/// Renews the lease of the held `job` at `now`, recording `progress`. A cancel requested
/// meanwhile comes first, then a stall (progress unchanged for the stall timeout), then the
/// attempt's hard time limit; else the lease runs its length from now, up to the deadline.
pub(crate) fn renew(
    job: &JobRecord,
    progress: u64,
    now: StoreTime,
    retry: &RetryPolicy,
) -> Renewed {
    if job.cancel_requested {
        return Renewed::Cancelled(end(job, Outcome::Cancelled, Next::Cancelled, now));
    }
    let stalled = job
        .lease
        .as_ref()
        .and_then(|l| l.stall_timeout)
        .is_some_and(|limit| {
            progress == job.progress && now.saturating_since(job.progress_at) >= limit
        });
    if stalled {
        let next = after_failure(job, now, retry, true);
        let mut change = end(job, Outcome::Stalled, next, now);
        change.counts.stalled = 1;
        return Renewed::Stalled(change);
    }
    if past_deadline(job.lease.as_ref(), now) {
        return Renewed::TimedOut(time_out(job, None, now, retry));
    }
    let mut new = job.clone();
    if let Some(lease) = new.lease.as_mut() {
        let renewed = capped(now.saturating_add(lease.length), lease.deadline);
        lease.expires_at = lease.expires_at.max(renewed);
    }
    if progress != new.progress {
        new.progress = progress;
        new.progress_at = now;
    }
    new.updated_at = now;
    Renewed::Lease(new)
}

// ----- the end of an attempt -----

/// Where an ended attempt sends its job.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Succeeded,
    Queued(StoreTime),
    RetryWait(StoreTime),
    Dead,
    Cancelled,
}

/// Whether an attempt that ended so spends the job's retry budget: a failure, a lease taken
/// back, a stall. A success, a release and a cancel do not.
pub(crate) fn spends_budget(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Failed(_)
            | Outcome::FailedPermanently(_)
            | Outcome::LeaseExpired { .. }
            | Outcome::Stalled
            | Outcome::TimedOut { .. }
    )
}

/// Where a failed (or expired, or stalled) attempt sends its job at `now`: one more failure
/// against its budget, and a backoff only for failures the holder reported (an expired lease
/// has already waited out the lease, and the holder most likely died rather than the job). A
/// cancel requested meanwhile wins.
pub(crate) fn after_failure(
    job: &JobRecord,
    now: StoreTime,
    policy: &RetryPolicy,
    backoff: bool,
) -> Next {
    let failures = job.failures.saturating_add(1);
    if job.cancel_requested {
        Next::Cancelled
    } else if failures >= job.max_attempts {
        Next::Dead
    } else if backoff {
        let seed = crate::retry::splitmix64(job.id.0 ^ (u64::from(job.attempt.0) << 40));
        Next::RetryWait(now.saturating_add(policy.backoff(failures, seed)))
    } else {
        Next::Queued(job.run_at)
    }
}

/// Ends the current attempt of the running `job` at `now` with `outcome`, moving it to
/// `next`: the budget spent where the outcome spends it, the lease gone, a terminal state's
/// finish time, and the attempt's history record.
pub(crate) fn end(job: &JobRecord, outcome: Outcome, next: Next, now: StoreTime) -> Change {
    let mut new = job.clone();
    if spends_budget(&outcome) {
        new.failures = new.failures.saturating_add(1);
    }
    new.lease = None;
    new.updated_at = now;
    match next {
        Next::Succeeded => finish(&mut new, JobState::Succeeded, now),
        Next::Dead => finish(&mut new, JobState::Dead, now),
        Next::Cancelled => finish(&mut new, JobState::Cancelled, now),
        Next::Queued(run_at) => {
            new.state = JobState::Queued;
            new.run_at = run_at;
        }
        Next::RetryWait(run_at) => {
            new.state = JobState::RetryWait;
            new.run_at = run_at;
        }
    }
    let ended = job.current_run().map(|mut run| {
        run.ended_at = Some(now);
        run.outcome = Some(outcome);
        run
    });
    Change {
        job: new,
        ended,
        counts: Counters::default(),
    }
}

fn finish(job: &mut JobRecord, state: JobState, now: StoreTime) {
    job.state = state;
    job.finished_at = Some(now);
    job.updated_at = now;
}

/// Takes the holder's last progress (carried by its end) into the record: a short job ends
/// before any heartbeat carried its progress, and its history would always show 0.
fn with_final_progress(job: &JobRecord, progress: Option<u64>, now: StoreTime) -> JobRecord {
    let mut job = job.clone();
    if let Some(p) = progress
        && p != job.progress
    {
        job.progress = p;
        job.progress_at = now;
    }
    job
}

/// The holder completed the attempt: the job succeeded.
pub(crate) fn complete(job: &JobRecord, progress: Option<u64>, now: StoreTime) -> Change {
    let job = with_final_progress(job, progress, now);
    end(&job, Outcome::Succeeded, Next::Succeeded, now)
}

/// Whether a failure may be retried.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// After a backoff, while the job's budget lasts (most failures: a timeout, a refused
    /// connection, a bug the next build fixes).
    WhileBudgetLasts,
    /// Never: running the job again would meet the same failure (a payload that does not
    /// decode, an output over the size limit, the handler's own word).
    Never,
}

/// The holder failed the attempt with `error`: retried after a backoff while the budget
/// lasts, else dead; dead at once if the failure is one no retry mends (a cancel requested
/// meanwhile still wins). Either way one failure is counted. The message is stored as
/// [`input::error_message`] cleans it.
pub(crate) fn fail(
    job: &JobRecord,
    error: &str,
    retry: Retry,
    progress: Option<u64>,
    now: StoreTime,
    policy: &RetryPolicy,
) -> Change {
    let mut job = with_final_progress(job, progress, now);
    job.last_error = Some(input::error_message(error));
    let next = match retry {
        Retry::WhileBudgetLasts => after_failure(&job, now, policy, true),
        Retry::Never => match job.cancel_requested {
            true => Next::Cancelled,
            false => Next::Dead,
        },
    };
    end(&job, failure_outcome(error, retry), next, now)
}

/// What a failure with `error` records in the history: the message as
/// [`input::error_message`] cleans it, permanent where no retry mends it.
pub(crate) fn failure_outcome(error: &str, retry: Retry) -> Outcome {
    let message = input::error_message(error);
    match retry {
        Retry::WhileBudgetLasts => Outcome::Failed(message),
        Retry::Never => Outcome::FailedPermanently(message),
    }
}

/// What a time-out of an attempt claimed at `claimed_at` records: the limit it ran into.
pub(crate) fn time_out_outcome(claimed_at: StoreTime, deadline: Option<StoreTime>) -> Outcome {
    let limit = deadline.map(|d| d.saturating_since(claimed_at));
    Outcome::TimedOut {
        limit: limit.unwrap_or_default(),
    }
}

/// The attempt ran into its hard time limit at `now` (its holder says so, or a renewal found
/// the deadline passed): `TimedOut`, one failure against the budget, retried after a
/// backoff while it lasts, counted.
pub(crate) fn time_out(
    job: &JobRecord,
    progress: Option<u64>,
    now: StoreTime,
    policy: &RetryPolicy,
) -> Change {
    let mut job = with_final_progress(job, progress, now);
    let outcome = match &job.lease {
        Some(l) => time_out_outcome(l.claimed_at, l.deadline),
        None => time_out_outcome(now, None),
    };
    job.last_error = Some(outcome.to_string());
    let next = after_failure(&job, now, policy, true);
    let mut change = end(&job, outcome, next, now);
    change.counts.timed_out = 1;
    change
}

/// The holder put the job off by `delay` ("not yet"): the attempt ends as `Snoozed`, no
/// budget spent, and the job waits until `delay` from now (cancelled instead, if a cancel was
/// requested meanwhile). Counted.
pub(crate) fn snooze(
    job: &JobRecord,
    delay: std::time::Duration,
    progress: Option<u64>,
    now: StoreTime,
) -> Change {
    let job = with_final_progress(job, progress, now);
    let next = match job.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(now.saturating_add(delay)),
    };
    let mut change = end(&job, Outcome::Snoozed { delay }, next, now);
    change.counts.snoozed = 1;
    change
}

/// The holder gave the job back on purpose: claimable at once in its old place, no budget
/// spent (cancelled instead, if a cancel was requested meanwhile).
pub(crate) fn release(job: &JobRecord, progress: Option<u64>, now: StoreTime) -> Change {
    let job = with_final_progress(job, progress, now);
    let next = match job.cancel_requested {
        true => Next::Cancelled,
        false => Next::Queued(job.run_at),
    };
    let mut change = end(&job, Outcome::Released, next, now);
    change.counts.released = 1;
    change
}

/// Takes back the lease of the running `job` at `now` on `path`: records `LeaseExpired`
/// (how long after its expiry), or `TimedOut` past the attempt's deadline, spends the
/// budget, and counts the reclaim by its path. The
/// detection delay (lease length plus overdue) is recorded for the paths that detect a
/// silent holder (the reaper, a takeover); a death the kernel reported or a recovery at open
/// says nothing about it. `None` for a record that is not running under a lease.
pub(crate) fn expire(
    job: &JobRecord,
    path: ReclaimPath,
    now: StoreTime,
    retry: &RetryPolicy,
) -> Option<(Change, Reclaim)> {
    let lease = job
        .lease
        .as_ref()
        .filter(|_| job.state == JobState::Running)?;
    let overdue = now.saturating_since(lease.expires_at);
    let detection_delay = lease.length + overdue;
    let mut change = match past_deadline(Some(lease), now) {
        // Past its deadline the attempt ran into its hard time limit, whoever finds it: it
        // ends timed out (retried after a backoff), not as a silent holder's.
        true => time_out(job, None, now, retry),
        false => {
            let next = after_failure(job, now, retry, false);
            end(job, Outcome::LeaseExpired { path, overdue }, next, now)
        }
    };
    let counts = &mut change.counts;
    match path {
        ReclaimPath::Reaper => counts.reclaimed_by_reaper = 1,
        ReclaimPath::Takeover => counts.reclaimed_by_takeover = 1,
        ReclaimPath::Recovery => counts.reclaimed_at_open = 1,
        ReclaimPath::ProcessDied => counts.reclaimed_process_died = 1,
    }
    if matches!(path, ReclaimPath::Reaper | ReclaimPath::Takeover) {
        counts.worst_detection_delay = detection_delay;
    }
    let reclaim = Reclaim {
        job: job.id,
        attempt: job.attempt,
        worker: lease.owner.clone(),
        expired_at: lease.expires_at,
        reclaimed_at: now,
        overdue,
        detection_delay,
        path,
        job_state: change.job.state,
    };
    Some((change, reclaim))
}

// ----- an operator's decisions -----

/// Cancels `job` at `now`: a waiting one at once; a running one is flagged, and its holder
/// learns of it at its next heartbeat (or its attempt's end). Returns the record to store
/// (`None`: nothing changes) and the state to answer with; a finished job is refused.
pub(crate) fn cancel(
    job: &JobRecord,
    now: StoreTime,
) -> Result<(Option<JobRecord>, JobState), Error> {
    match job.state {
        JobState::Queued | JobState::RetryWait => {
            let mut new = job.clone();
            finish(&mut new, JobState::Cancelled, now);
            Ok((Some(new), JobState::Cancelled))
        }
        JobState::Running => {
            let mut new = job.clone();
            new.cancel_requested = true;
            new.updated_at = now;
            Ok((Some(new), JobState::Running))
        }
        JobState::Cancelled => Ok((None, JobState::Cancelled)),
        state @ (JobState::Succeeded | JobState::Dead) => Err(Error::Refused {
            job: job.id,
            state,
            action: "cancel",
        }),
    }
}

/// Puts a dead or cancelled `job` back in its queue at `now` with a fresh budget (an
/// operator's decision); its history is kept and its next claim is a new attempt.
/// `key_holder` is the job the index names for its unique key, if another: while it holds
/// the key ([`holds_key`]) the retry is refused rather than make two jobs hold one key (the
/// key is what the application deduplicates by, and the holder already does the work it
/// names); a holder whose window ran out gives it up (the second record returned, to store).
pub(crate) fn retry(
    job: &JobRecord,
    key_holder: Option<&JobRecord>,
    now: StoreTime,
) -> Result<(JobRecord, Option<JobRecord>), Error> {
    if !matches!(job.state, JobState::Dead | JobState::Cancelled) {
        return Err(Error::Refused {
            job: job.id,
            state: job.state,
            action: "retry (only dead or cancelled jobs are retried)",
        });
    }
    let mut released = None;
    if let (Some(key), Some(holder)) = (&job.unique_key, key_holder)
        && holder.id != job.id
    {
        if holds_key(holder, now) {
            return Err(Error::UniqueKeyHeld {
                job: job.id,
                key: key.clone(),
                holder: holder.id,
            });
        }
        released = Some(release_key(holder, now));
    }
    let mut new = job.clone();
    new.state = JobState::Queued;
    new.failures = 0;
    new.cancel_requested = false;
    new.finished_at = None;
    new.key_released = false;
    new.run_at = now;
    new.updated_at = now;
    Ok((new, released))
}

/// The error for a running job found without its lease.
pub(crate) fn corrupt_running(job: &JobRecord) -> Error {
    Error::Corrupt(format!("job {} is running without a lease", job.id))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn queued(id: u64) -> JobRecord {
        new_job(
            &NewJob::new("q", "x").max_attempts(2),
            JobId(id),
            25,
            1024,
            StoreTime(1_000),
        )
        .unwrap()
    }

    fn running(at: StoreTime) -> JobRecord {
        match grant(
            &queued(1),
            "w",
            LeaseTerms::new(Duration::from_nanos(100)),
            at,
        ) {
            Granted::Lease(job) => job,
            Granted::Exhausted(_) => unreachable!("a fresh job has attempts left"),
        }
    }

    #[test]
    fn a_grant_increments_the_attempt_and_an_exhausted_counter_makes_the_job_dead() {
        let job = running(StoreTime(2_000));
        assert_eq!((job.state, job.attempt), (JobState::Running, Attempt(1)));
        let mut worn = queued(2);
        worn.attempt = Attempt(u32::MAX);
        match grant(
            &worn,
            "w",
            LeaseTerms::new(Duration::from_secs(1)),
            StoreTime(5),
        ) {
            Granted::Exhausted(dead) => {
                assert_eq!(
                    (dead.state, dead.attempt),
                    (JobState::Dead, Attempt(u32::MAX))
                );
                assert_eq!(dead.finished_at, Some(StoreTime(5)));
                assert_eq!(dead.last_error.as_deref(), Some(ATTEMPTS_EXHAUSTED));
            }
            Granted::Lease(_) => panic!("leased with a fence equal to the last"),
        }
    }

    #[test]
    fn the_fence_counts_a_refused_end_and_a_lost_renewal_but_not_one_after_the_holders_end() {
        let job = running(StoreTime(2_000));
        let held: Result<_, ()> = fence(Some(job.clone()), job.id, job.attempt, Write::End, || {
            Ok(false)
        });
        assert_eq!(held.unwrap().unwrap(), job);
        let refused = fence::<()>(Some(job.clone()), job.id, Attempt(9), Write::End, || {
            Ok(false)
        })
        .unwrap()
        .unwrap_err();
        assert_eq!(
            (refused.lost.found, refused.counts.fenced_writes_rejected),
            (Some((job.attempt, JobState::Running)), 1)
        );
        let done = complete(&job, None, StoreTime(2_050)).job;
        let refused = fence::<()>(
            Some(done.clone()),
            done.id,
            done.attempt,
            Write::Heartbeat,
            || Ok(true),
        )
        .unwrap()
        .unwrap_err();
        assert!(refused.lost.ended_by_holder);
        assert_eq!(
            refused.counts,
            Counters::default(),
            "a renewal after the holder's own end lost nothing"
        );
        let gone = fence::<()>(None, JobId(7), Attempt(1), Write::Heartbeat, || Ok(true))
            .unwrap()
            .unwrap_err();
        assert_eq!((gone.lost.found, gone.counts.leases_lost), (None, 1));
    }

    #[test]
    fn the_end_of_an_attempt_spends_the_budget_only_for_failures_expiries_and_stalls() {
        let policy = RetryPolicy::default();
        let job = running(StoreTime(2_000));
        let now = StoreTime(2_050);
        assert_eq!(complete(&job, Some(3), now).job.failures, 0);
        assert_eq!(release(&job, None, now).job.failures, 0);
        let failed = fail(&job, "boom", Retry::WhileBudgetLasts, None, now, &policy);
        assert_eq!(
            (failed.job.failures, failed.job.state),
            (1, JobState::RetryWait)
        );
        let (expired, reclaim) =
            expire(&job, ReclaimPath::Reaper, StoreTime(2_200), &policy).unwrap();
        assert_eq!(
            (expired.job.failures, expired.job.state),
            (1, JobState::Queued)
        );
        assert_eq!(reclaim.overdue, Duration::from_nanos(100));
        assert_eq!(
            expired.counts.worst_detection_delay,
            Duration::from_nanos(200)
        );
        // the second spend of a budget of two is death
        let mut again = job.clone();
        again.failures = 1;
        assert_eq!(
            fail(&again, "boom", Retry::WhileBudgetLasts, None, now, &policy)
                .job
                .state,
            JobState::Dead
        );
    }

    #[test]
    fn a_permanent_failure_is_dead_at_once_with_budget_left_unless_a_cancel_came_first() {
        let policy = RetryPolicy::default();
        let mut job = running(StoreTime(2_000));
        job.max_attempts = 25;
        let now = StoreTime(2_050);
        let failed = fail(&job, "no such user", Retry::Never, None, now, &policy);
        assert_eq!(
            (
                failed.job.state,
                failed.job.failures,
                failed.job.finished_at
            ),
            (JobState::Dead, 1, Some(now))
        );
        assert_eq!(
            failed.ended.unwrap().outcome,
            Some(Outcome::FailedPermanently("no such user".into()))
        );
        assert_eq!(failed.job.last_error.as_deref(), Some("no such user"));
        job.cancel_requested = true;
        let cancelled = fail(&job, "no such user", Retry::Never, None, now, &policy);
        assert_eq!(cancelled.job.state, JobState::Cancelled);
    }

    #[test]
    fn a_renewal_ends_a_cancelled_attempt_before_a_stalled_one_before_renewing() {
        let policy = RetryPolicy::default();
        let mut job = running(StoreTime(0));
        job.lease.as_mut().unwrap().stall_timeout = Some(Duration::from_nanos(10));
        assert!(matches!(
            renew(&job, 0, StoreTime(20), &policy),
            Renewed::Stalled(_)
        ));
        assert!(matches!(
            renew(&job, 1, StoreTime(20), &policy),
            Renewed::Lease(_)
        ));
        job.cancel_requested = true;
        assert!(matches!(
            renew(&job, 0, StoreTime(20), &policy),
            Renewed::Cancelled(_)
        ));
    }

    #[test]
    fn an_expired_lease_goes_first_only_when_at_least_as_urgent() {
        let job = running(StoreTime(0));
        assert!(takes_over(&job, None));
        assert!(takes_over(&job, Some(job.priority)));
        assert!(!takes_over(&job, Some(job.priority - 1)));
    }

    /// The wall ticks a cron schedule declared at `from` fires, one pass per tick, up to
    /// `until` (seconds since the epoch), rendered in `zone` as "YYYY-MM-DD HH:MM+OFFSET".
    #[cfg(feature = "cron")]
    fn cron_ticks(expr: &str, zone: &str, from: i64, until: i64) -> Vec<String> {
        let s = Schedule::cron("c", expr, zone, NewJob::new("q", "x")).catch_up(CatchUp::All);
        let mut record = declare(None, &s, 1024, StoreTime(0), from).unwrap();
        let mut fired = Vec::new();
        while let Tick::Wall(next) = record.next {
            if next > until {
                break;
            }
            let (ticks, new) = fire(&record, StoreTime(0), next).unwrap();
            record = new;
            for tick in ticks {
                let Tick::Wall(at) = tick else { unreachable!() };
                let zoned = jiff::Timestamp::from_second(at)
                    .unwrap()
                    .in_tz(zone)
                    .unwrap();
                fired.push(zoned.strftime("%Y-%m-%d %H:%M%:z").to_string());
            }
        }
        fired
    }

    #[cfg(feature = "cron")]
    #[test]
    fn a_cron_tick_in_the_hour_a_spring_day_skips_fires_right_after_it() {
        // Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST
        let from = 1_774_659_600; // 2026-03-28 01:00 UTC (02:00 CET)
        let until = 1_774_836_000; // 2026-03-30 02:00 UTC
        assert_eq!(
            cron_ticks("30 2 * * *", "Europe/Berlin", from, until),
            vec![
                "2026-03-28 02:30+01:00",
                "2026-03-29 03:00+02:00",
                "2026-03-30 02:30+02:00"
            ]
        );
    }

    #[cfg(feature = "cron")]
    #[test]
    fn in_the_hour_an_autumn_day_repeats_a_fixed_tick_fires_once_and_a_stepped_one_twice() {
        // Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET
        let from = 1_792_836_000; // 2026-10-24 12:00 CEST
        let until = 1_792_900_800; // 2026-10-25 04:00 UTC (05:00 CET)
        assert_eq!(
            cron_ticks("30 2 * * *", "Europe/Berlin", from, until),
            vec!["2026-10-25 02:30+02:00"]
        );
        let half_hours = cron_ticks("*/30 1-3 * * *", "Europe/Berlin", from, until);
        assert_eq!(
            half_hours,
            vec![
                "2026-10-25 01:00+02:00",
                "2026-10-25 01:30+02:00",
                "2026-10-25 02:00+02:00",
                "2026-10-25 02:30+02:00",
                "2026-10-25 02:00+01:00",
                "2026-10-25 02:30+01:00",
                "2026-10-25 03:00+01:00",
                "2026-10-25 03:30+01:00",
            ]
        );
    }

    #[test]
    fn a_schedule_fires_each_due_tick_once_and_its_policy_decides_the_missed_ones() {
        let every = Duration::from_secs(10);
        let make = |policy| {
            let s = Schedule::every("s", every, NewJob::new("q", "x")).catch_up(policy);
            declare(None, &s, 1024, StoreTime(0), 0).unwrap()
        };
        let at = |secs: u64| StoreTime(secs * 1_000_000_000);
        // on time: one tick each pass, whatever the policy
        for policy in [CatchUp::Once, CatchUp::All, CatchUp::Skip] {
            let (ticks, r) = fire(&make(policy), at(10), 0).unwrap();
            assert_eq!(ticks, vec![Tick::Store(at(10))], "{policy:?}");
            assert_eq!((r.next, r.fired, r.skipped), (Tick::Store(at(20)), 1, 0));
            assert!(
                fire(&r, at(19), 0).unwrap().0.is_empty(),
                "a tick fires once"
            );
        }
        // 100 s late: ten ticks have come
        let (all, r) = fire(&make(CatchUp::All), at(100), 0).unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!((r.next, r.skipped), (Tick::Store(at(110)), 0));
        let (once, r) = fire(&make(CatchUp::Once), at(100), 0).unwrap();
        assert_eq!((once, r.skipped), (vec![Tick::Store(at(100))], 9));
        // a tick fired within ON_TIME of its time is on time, for Skip too
        let (skip, r) = fire(&make(CatchUp::Skip), at(105), 0).unwrap();
        assert_eq!((skip, r.skipped), (vec![Tick::Store(at(100))], 9));
        // ...but a tick more than ON_TIME late is dropped
        let two_minutes = Schedule::every("s", Duration::from_secs(120), NewJob::new("q", "x"))
            .catch_up(CatchUp::Skip);
        let late = declare(None, &two_minutes, 1024, StoreTime(0), 0).unwrap();
        let (skip, r) = fire(&late, at(3 * 120 + 90), 0).unwrap();
        assert_eq!((skip.len(), r.skipped), (0, 3));
        // All fires at most MAX_TICKS_PER_PASS a pass, the rest in the next
        let (first, r) = fire(&make(CatchUp::All), at(20_000), 0).unwrap();
        assert_eq!(first.len(), MAX_TICKS_PER_PASS);
        let (second, _) = fire(&r, at(20_000), 0).unwrap();
        assert_eq!(second.len(), 1000);
        assert_eq!(second[0], Tick::Store(at(10 * 1001)));
        // a paused schedule fires nothing and keeps its cursor
        let mut paused = make(CatchUp::All);
        paused.paused = true;
        let (none, r) = fire(&paused, at(100), 0).unwrap();
        assert!(none.is_empty());
        assert_eq!(r.next, Tick::Store(at(10)));
    }
}
