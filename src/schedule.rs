//! Periodic jobs: what an application declares (a [`Schedule`]), what the store keeps of it
//! (its record, with the cursor of its next tick), and how a cron expression's ticks are
//! found in a named time zone. When a tick fires, and what it enqueues, is the rule book's
//! ([`crate::rules::fire`]).
//!
//! A schedule runs *every interval* of store time, or on a *cron expression* in a named
//! time zone (the `cron` feature). Wall time is read only to find a cron schedule's next
//! tick; every lease and expiry stays on the store clock. Each tick enqueues exactly one
//! job, however many processes or machines run a [`crate::Scheduler`]: the schedule's
//! cursor moves past the tick in the same transaction that enqueues its job, and the job
//! carries the tick's unique key (`schedule:<name>:<tick>`, kept until purged), so a
//! second scheduler finds the tick taken.

use std::time::Duration;

use bincode::{Decode, Encode};

use crate::ids::StoreTime;
use crate::new_job::NewJob;
use crate::retry::RetryPolicy;

/// At most this many ticks are fired for one schedule in one pass ([`CatchUp::All`] after a
/// long downtime): the rest follow in the next passes.
pub const MAX_TICKS_PER_PASS: usize = 1000;

/// How late a tick may fire and still count as on time for [`CatchUp::Skip`].
pub const ON_TIME: Duration = Duration::from_secs(60);

/// The shortest interval a schedule may have. Each tick is a job whose unique key is kept
/// until the job is purged, and a [`crate::Scheduler`] fires about once a second (a
/// second is cron's finest step too): an interval under it would pile up jobs and keys
/// faster than any scheduler fires them, a tick at a time.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The metadata key under which each tick's job carries its schedule's name.
pub(crate) const SCHEDULE_KEY: &str = "schedule";

/// When a schedule ticks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum When {
    /// Every interval of store time, from when it was declared.
    Every(Duration),
    /// On a cron expression (five fields, or six with seconds) in a named time zone
    /// (`"0 3 * * *"`, `"Europe/Berlin"`): wall-clock time, with daylight-saving days
    /// handled as Vixie cron does (a tick in the skipped hour fires right after it; a
    /// fixed-time tick in the repeated hour fires once).
    Cron {
        /// The expression.
        expr: String,
        /// The IANA time zone it is read in.
        zone: String,
    },
}

/// What a schedule does about ticks it missed while no scheduler ran.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum CatchUp {
    /// One job for all the missed ticks, now (the latest tick's).
    #[default]
    Once,
    /// One job for every missed tick (at most [`MAX_TICKS_PER_PASS`] a pass).
    All,
    /// None for missed ticks: only a tick fired within [`ON_TIME`] of its time enqueues.
    Skip,
}

/// A periodic job, as an application declares it ([`crate::JobStore::declare_schedule`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub(crate) name: String,
    pub(crate) job: NewJob,
    pub(crate) when: When,
    pub(crate) catch_up: CatchUp,
    pub(crate) replace: bool,
}

impl Schedule {
    /// A schedule named `name` that enqueues `job` every `interval` of store time, the first
    /// one interval after it is first declared.
    pub fn every(name: impl Into<String>, interval: Duration, job: NewJob) -> Schedule {
        Schedule {
            name: name.into(),
            job,
            when: When::Every(interval),
            catch_up: CatchUp::Once,
            replace: false,
        }
    }

    /// A schedule named `name` that enqueues `job` on the cron expression `expr` read in
    /// the IANA time zone `zone` (`"0 3 * * *"`, `"Europe/Berlin"`: at three every night,
    /// Berlin time). The expression and the zone are checked when it is declared.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron(
        name: impl Into<String>,
        expr: impl Into<String>,
        zone: impl Into<String>,
        job: NewJob,
    ) -> Schedule {
        Schedule {
            name: name.into(),
            job,
            when: When::Cron {
                expr: expr.into(),
                zone: zone.into(),
            },
            catch_up: CatchUp::Once,
            replace: false,
        }
    }

    /// What to do about ticks missed while no scheduler ran (default [`CatchUp::Once`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Schedule {
        self.catch_up = catch_up;
        self
    }

    /// This declaration wins over a different one stored under its name (a new version of
    /// the application changing a schedule's timing, job or catch-up policy). Without it a
    /// different declaration is refused with [`Error::ScheduleConflict`](crate::Error), so
    /// that two versions of an application running at once do not take the schedule from
    /// each other at every start. A declaration that changes nothing is always accepted.
    pub fn replace(mut self) -> Schedule {
        self.replace = true;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Where a schedule's next tick is: on the store clock (every interval) or on the wall
/// clock (cron), in whole seconds since the Unix epoch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum Tick {
    /// A store time.
    Store(StoreTime),
    /// A wall-clock time, seconds since the Unix epoch (UTC).
    Wall(i64),
}

impl Tick {
    /// The tick's part of its job's unique key.
    /// The tick whose key is the longest any tick has (for checking a declaration as its
    /// ticks' jobs will be).
    pub(crate) const LONGEST: Tick = Tick::Wall(i64::MIN);

    pub(crate) fn key(&self) -> String {
        match self {
            Tick::Store(t) => format!("t{}", t.0),
            Tick::Wall(s) => format!("w{s}"),
        }
    }
}

/// The job a schedule enqueues at each tick, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct JobTemplate {
    pub queue: String,
    pub payload: Vec<u8>,
    pub priority: i32,
    pub max_attempts: Option<u32>,
    pub time_limit: Option<Duration>,
    pub metadata: Vec<(String, String)>,
}

impl JobTemplate {
    pub(crate) fn of(job: &NewJob) -> JobTemplate {
        JobTemplate {
            queue: job.queue.clone(),
            payload: job.payload.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            time_limit: job.time_limit,
            metadata: job.metadata.clone(),
        }
    }

    /// The job of schedule `name`'s `tick`: the template, tagged with the schedule, under the
    /// tick's unique key (kept until purged, so that no tick is enqueued twice).
    pub(crate) fn job(&self, name: &str, tick: Tick) -> NewJob {
        let mut job = NewJob::new(self.queue.clone(), self.payload.clone())
            .priority(self.priority)
            .unique_key(format!("schedule:{name}:{}", tick.key()))
            .unique_until_purged();
        if let Some(m) = self.max_attempts {
            job = job.max_attempts(m);
        }
        if let Some(limit) = self.time_limit {
            job = job.time_limit(limit);
        }
        for (k, v) in &self.metadata {
            job = job.metadata(k.clone(), v.clone());
        }
        job.metadata(SCHEDULE_KEY, name.to_owned())
    }
}

/// A schedule as the store keeps it: its declaration, whether it is paused, and the cursor
/// of its next tick.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct ScheduleRecord {
    pub name: String,
    pub template: JobTemplate,
    pub when: When,
    pub catch_up: CatchUp,
    pub paused: bool,
    /// The next tick not fired yet.
    pub next: Tick,
    /// The last tick that enqueued a job, if any.
    pub last_fired: Option<Tick>,
    /// How many jobs it has enqueued.
    pub fired: u64,
    /// How many ticks it skipped ([`CatchUp::Once`] folds, [`CatchUp::Skip`] drops).
    pub skipped: u64,
    /// Its jobs' own retry policy, the template's. (After the fields of format 3, so that
    /// the codec reads an older record as one without: `codec::decode_schedule`.)
    pub retry: Option<RetryPolicy>,
    /// Its jobs' limit key, the template's. (After the fields of format 4, likewise.)
    pub limit_key: Option<String>,
    /// How long after its enqueue each tick's job expires if not started
    /// ([`NewJob::expires_in`]). (Last, likewise.)
    pub expires: Option<Duration>,
}

impl ScheduleRecord {
    /// The job of its `tick`.
    pub(crate) fn job(&self, tick: Tick) -> NewJob {
        let mut job = self.template.job(&self.name, tick);
        job.retry = self.retry.clone();
        job.limit_key = self.limit_key.clone();
        if let Some(span) = self.expires {
            job = job.expires_in(span);
        }
        job
    }
}

/// A schedule as the store reports it ([`crate::ReadJobs::schedules`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleInfo(pub(crate) ScheduleRecord, pub(crate) Option<String>);

impl ScheduleInfo {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The queue its jobs go to.
    pub fn queue(&self) -> &str {
        &self.0.template.queue
    }

    /// When it ticks.
    pub fn when(&self) -> &When {
        &self.0.when
    }

    /// What it does about missed ticks.
    pub fn catch_up(&self) -> CatchUp {
        self.0.catch_up
    }

    /// Whether it is paused (no tick fires; ticks that pass meanwhile are missed).
    pub fn paused(&self) -> bool {
        self.0.paused
    }

    /// Its next tick.
    pub fn next_tick(&self) -> Tick {
        self.0.next
    }

    /// How long until its next tick, in milliseconds, as of store time `now` (an interval's
    /// tick) and wall-clock time `wall` (a cron tick); negative where the tick has come and
    /// waits for a scheduler to fire it.
    pub fn next_in_ms(&self, now: StoreTime, wall: std::time::SystemTime) -> i64 {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match self.0.next {
            Tick::Store(t) if t >= now => ms(t.saturating_since(now)),
            Tick::Store(t) => -ms(now.saturating_since(t)),
            Tick::Wall(secs) => {
                let wall = wall.duration_since(std::time::UNIX_EPOCH).map_or(0, ms);
                secs.saturating_mul(1000).saturating_sub(wall)
            }
        }
    }

    /// The last tick that enqueued a job.
    pub fn last_fired(&self) -> Option<Tick> {
        self.0.last_fired
    }

    /// How many jobs it has enqueued.
    pub fn fired(&self) -> u64 {
        self.0.fired
    }

    /// How many ticks it let pass without a job of their own (folded into one by
    /// [`CatchUp::Once`], dropped by [`CatchUp::Skip`]).
    pub fn skipped(&self) -> u64 {
        self.0.skipped
    }

    /// Why the last scheduler pass could not fire it, if it could not: kept until a pass
    /// fires it or it is declared again or removed (the other schedules fire meanwhile).
    pub fn failure(&self) -> Option<&str> {
        self.1.as_deref()
    }

    /// Its jobs' priority.
    pub fn priority(&self) -> i32 {
        self.0.template.priority
    }

    /// Its jobs' attempt budget, if they have their own (else the store's).
    pub fn max_attempts(&self) -> Option<u32> {
        self.0.template.max_attempts
    }

    /// Its jobs' time limit per attempt, if they have one.
    pub fn time_limit(&self) -> Option<Duration> {
        self.0.template.time_limit
    }

    /// Its jobs' own retry policy, if they have one (else their queue's, else the store's).
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.0.retry.as_ref()
    }

    /// Its jobs' limit key, if they have one.
    pub fn limit_key(&self) -> Option<&str> {
        self.0.limit_key.as_deref()
    }

    /// How long after its tick each job expires if no attempt started it
    /// ([`NewJob::expires_in`]), if it does.
    pub fn expires_in(&self) -> Option<Duration> {
        self.0.expires
    }

    /// Its jobs' metadata (besides the schedule's name, which each job also carries).
    pub fn metadata(&self) -> &[(String, String)] {
        &self.0.template.metadata
    }
}

/// A cron expression's ticks in its zone (the `cron` feature): the first strictly after
/// `after`, and the last at or before `at`.
#[cfg(feature = "cron")]
pub(crate) mod cron {
    use std::str::FromStr;

    use crate::error::InputError;

    fn parse(expr: &str, zone: &str) -> Result<(croner::Cron, jiff::tz::TimeZone), InputError> {
        let cron = croner::Cron::from_str(expr).map_err(|e| InputError::BadCron {
            expr: expr.to_owned(),
            why: e.to_string(),
        })?;
        let tz = jiff::tz::TimeZone::get(zone).map_err(|e| InputError::BadTimeZone {
            zone: zone.to_owned(),
            why: e.to_string(),
        })?;
        Ok((cron, tz))
    }

    fn at(second: i64, tz: &jiff::tz::TimeZone) -> Result<jiff::Zoned, InputError> {
        jiff::Timestamp::from_second(second)
            .map(|t| t.to_zoned(tz.clone()))
            .map_err(|e| InputError::BadCron {
                expr: String::new(),
                why: e.to_string(),
            })
    }

    /// Checks an expression and its zone.
    pub(crate) fn check(expr: &str, zone: &str) -> Result<(), InputError> {
        parse(expr, zone).map(|_| ())
    }

    /// The first tick strictly after `after` (seconds since the epoch).
    pub(crate) fn next_after(expr: &str, zone: &str, after: i64) -> Result<i64, InputError> {
        let (cron, tz) = parse(expr, zone)?;
        let next = cron
            .find_next_occurrence(&at(after, &tz)?, false)
            .map_err(|e| InputError::BadCron {
                expr: expr.to_owned(),
                why: match e {
                    croner::errors::CronError::TimeSearchLimitExceeded => {
                        "no date matches it, so it would never fire (a day no month has, \
                         such as the 30th of February?)"
                            .to_owned()
                    }
                    e => e.to_string(),
                },
            })?;
        Ok(next.timestamp().as_second())
    }
}

#[cfg(not(feature = "cron"))]
pub(crate) mod cron {
    use crate::error::InputError;

    fn missing(expr: &str) -> InputError {
        InputError::BadCron {
            expr: expr.to_owned(),
            why: "this build of leasehold has no cron support (the `cron` feature)".into(),
        }
    }

    pub(crate) fn check(expr: &str, _zone: &str) -> Result<(), InputError> {
        Err(missing(expr))
    }

    pub(crate) fn next_after(expr: &str, _zone: &str, _after: i64) -> Result<i64, InputError> {
        Err(missing(expr))
    }
}
