use std::time::{Duration, SystemTime};

use leasehold::{CatchUp, Error, InputError, JobFilter, JobState, NewJob, Schedule, Tick};

use crate::on_both::{Backend, Kind, Q, Setup};

use proptest::prelude::*;
use std::sync::Arc;

crate::on_both::on_both!(
    and protocol;
    an_interval_schedule_enqueues_one_job_per_tick_from_its_declaration,
    declaring_again_keeps_the_cursor_and_a_new_interval_starts_over,
    missed_ticks_follow_each_schedules_catch_up_policy,
    a_paused_schedule_fires_nothing_and_is_caught_up_when_it_resumes,
    schedulers_racing_on_one_store_fire_each_tick_once,
    a_cron_schedule_ticks_on_the_wall_clock_of_its_zone,
    bad_schedules_are_refused_and_unknown_names_are_not_found,
    a_declaration_is_checked_as_its_ticks_jobs_will_be_and_options_it_cannot_honour_are_refused,
    a_schedule_that_cannot_fire_is_passed_over_shown_with_its_failure_and_the_others_fire,
    schedulers_that_race_die_and_come_back_enqueue_every_tick_once_as_its_policy_says,
    a_scheduler_asleep_until_its_next_tick_wakes_for_a_schedule_changed_and_for_time_moved,
    a_schedule_reports_the_options_its_jobs_carry,
);

const MINUTE: Duration = Duration::from_secs(60);

/// Some wall-clock time: schedules every interval do not read it.
fn wall() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn fire(f: &Backend) -> usize {
    f.fire_schedules_at(wall()).unwrap().len()
}

fn scheduled(f: &Backend) -> Vec<leasehold::Job> {
    f.jobs(&JobFilter {
        queue: Some(Q.into()),
        ..JobFilter::default()
    })
    .unwrap()
}

fn an_interval_schedule_enqueues_one_job_per_tick_from_its_declaration(kind: Kind) {
    let f = kind.open();
    let declared = f.now();
    let report = NewJob::new(Q, "report")
        .priority(-1)
        .metadata("kind", "daily");
    f.declare_schedule(Schedule::every("report", MINUTE, report))
        .unwrap();
    f.advance(MINUTE - Duration::from_secs(1));
    assert_eq!(fire(&f), 0, "not yet");
    f.advance(Duration::from_secs(1));
    assert_eq!(fire(&f), 1);
    assert_eq!(fire(&f), 0, "a tick fires once");
    let jobs = scheduled(&f);
    assert_eq!(jobs.len(), 1);
    let tick = declared.saturating_add(MINUTE);
    assert_eq!(
        (
            jobs[0].priority(),
            jobs[0].metadata_value("schedule"),
            jobs[0].metadata_value("kind")
        ),
        (-1, Some("report"), Some("daily"))
    );
    assert_eq!(
        jobs[0].unique_key(),
        Some(format!("schedule:report:t{}", tick.0).as_str())
    );
    assert_eq!(f.payload(jobs[0].id()).unwrap().unwrap(), b"report");
    f.advance(MINUTE);
    assert_eq!(fire(&f), 1);
    let info = &f.schedules().unwrap()[0];
    assert_eq!((info.name(), info.queue(), info.fired()), ("report", Q, 2));
    assert_eq!(
        info.next_tick(),
        Tick::Store(tick.saturating_add(MINUTE * 2))
    );
    assert_eq!(
        info.last_fired(),
        Some(Tick::Store(tick.saturating_add(MINUTE)))
    );
}

fn declaring_again_keeps_the_cursor_and_a_new_interval_starts_over(kind: Kind) {
    let f = kind.open();
    let job = || NewJob::new(Q, "x");
    f.declare_schedule(Schedule::every("s", MINUTE, job()))
        .unwrap();
    let first = f.schedules().unwrap()[0].next_tick();
    f.advance(Duration::from_secs(30));
    // every process declares its schedules at start: the same declaration keeps its cursor
    f.declare_schedule(Schedule::every("s", MINUTE, job()))
        .unwrap();
    assert_eq!(f.schedules().unwrap()[0].next_tick(), first);
    // a different one under the same name is refused, and changes nothing (once: the last
    // declaration silently won, so two versions of an application took it from each other)
    for other in [
        Schedule::every("s", MINUTE, NewJob::new(Q, "y")),
        Schedule::every("s", MINUTE * 2, job()),
        Schedule::every("s", MINUTE, job()).catch_up(CatchUp::All),
    ] {
        assert!(matches!(
            f.declare_schedule(other),
            Err(Error::ScheduleConflict(name)) if name == "s"
        ));
    }
    assert_eq!(f.schedules().unwrap()[0].next_tick(), first);
    // one that says replace wins; the same timing keeps its cursor
    f.declare_schedule(Schedule::every("s", MINUTE, NewJob::new(Q, "y")).replace())
        .unwrap();
    assert_eq!(f.schedules().unwrap()[0].next_tick(), first);
    f.advance(Duration::from_secs(30));
    assert_eq!(fire(&f), 1);
    assert_eq!(f.payload(scheduled(&f)[0].id()).unwrap().unwrap(), b"y");
    // a new timing starts over from now
    f.declare_schedule(Schedule::every("s", MINUTE * 10, job()).replace())
        .unwrap();
    assert_eq!(
        f.schedules().unwrap()[0].next_tick(),
        Tick::Store(f.now().saturating_add(MINUTE * 10))
    );
}

fn missed_ticks_follow_each_schedules_catch_up_policy(kind: Kind) {
    let f = kind.open();
    let five = MINUTE * 5;
    for (name, policy) in [
        ("once", CatchUp::Once),
        ("all", CatchUp::All),
        ("skip", CatchUp::Skip),
    ] {
        let job = NewJob::new(Q, name);
        f.declare_schedule(Schedule::every(name, five, job).catch_up(policy))
            .unwrap();
    }
    // 4 ticks pass with no scheduler, and it comes back 90 s after the last one
    f.advance(five * 4 + Duration::from_secs(90));
    assert_eq!(fire(&f), 1 + 4);
    let fired = |name: &str| {
        scheduled(&f)
            .iter()
            .filter(|j| j.metadata_value("schedule") == Some(name))
            .count()
    };
    assert_eq!((fired("once"), fired("all"), fired("skip")), (1, 4, 0));
    let infos = f.schedules().unwrap();
    let info = |name: &str| infos.iter().find(|i| i.name() == name).unwrap();
    assert_eq!((info("once").skipped(), info("skip").skipped()), (3, 4));
    // all three are past now: the next tick is the fifth, for each
    for name in ["once", "all", "skip"] {
        assert_eq!(info(name).next_tick(), info("once").next_tick());
    }
    // on time, every policy fires its tick
    f.advance(Duration::from_secs(210));
    assert_eq!(fire(&f), 3);
}

fn a_paused_schedule_fires_nothing_and_is_caught_up_when_it_resumes(kind: Kind) {
    let f = kind.open();
    let all = Schedule::every("all", MINUTE, NewJob::new(Q, "x")).catch_up(CatchUp::All);
    f.declare_schedule(all.clone()).unwrap();
    f.pause_schedule("all").unwrap();
    assert!(f.schedules().unwrap()[0].paused());
    // declaring it again does not resume it
    f.declare_schedule(all).unwrap();
    f.advance(MINUTE * 3);
    assert_eq!(fire(&f), 0);
    f.resume_schedule("all").unwrap();
    assert_eq!(fire(&f), 3, "its missed ticks, as its policy says");
    assert!(f.remove_schedule("all").unwrap());
    assert!(!f.remove_schedule("all").unwrap());
    f.advance(MINUTE);
    assert_eq!(fire(&f), 0);
    assert_eq!(scheduled(&f).len(), 3, "its jobs stay");
}

/// Four threads fire the same store's schedules at once while time moves: every tick of
/// every schedule is enqueued exactly once (on PostgreSQL each through its own connection).
fn schedulers_racing_on_one_store_fire_each_tick_once(kind: Kind) {
    let f = kind.open();
    for n in 0..3 {
        let job = NewJob::new(Q, format!("s{n}"));
        let every = Duration::from_secs(10 + n);
        f.declare_schedule(Schedule::every(format!("s{n}"), every, job).catch_up(CatchUp::All))
            .unwrap();
    }
    let start = f.now();
    let store = f.handle();
    let mut fired = 0;
    for _ in 0..20 {
        f.advance(Duration::from_secs(7));
        fired += std::thread::scope(|scope| {
            let racers: Vec<_> = (0..4)
                .map(|_| {
                    let store = store.clone();
                    scope.spawn(move || store.fire_schedules_at(wall()).unwrap().len())
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).sum::<usize>()
        });
    }
    let elapsed = f.now().saturating_since(start).as_secs();
    let ticks: u64 = (0..3).map(|n| elapsed / (10 + n)).sum();
    let jobs = scheduled(&f);
    assert_eq!((fired, jobs.len()), (ticks as usize, ticks as usize));
    let mut keys: Vec<_> = jobs
        .iter()
        .map(|j| j.unique_key().unwrap().to_owned())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), jobs.len(), "no tick twice");
    assert!(jobs.iter().all(|j| j.state() == JobState::Queued));
}

fn a_cron_schedule_ticks_on_the_wall_clock_of_its_zone(kind: Kind) {
    let f = kind.open();
    // Declared now: its first tick is the next 03:00 in Berlin after the wall clock's now.
    f.declare_schedule(Schedule::cron(
        "nightly",
        "0 3 * * *",
        "Europe/Berlin",
        NewJob::new(Q, "x"),
    ))
    .unwrap();
    let Tick::Wall(first) = f.schedules().unwrap()[0].next_tick() else {
        panic!("a cron schedule's tick is on the wall clock");
    };
    let at = |s: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(s as u64);
    assert!(f.fire_schedules_at(at(first - 1)).unwrap().is_empty());
    assert_eq!(f.fire_schedules_at(at(first)).unwrap().len(), 1);
    // a day later the next; it is 03:00 Berlin time, whatever the offset that day
    let Tick::Wall(second) = f.schedules().unwrap()[0].next_tick() else {
        panic!("a wall tick");
    };
    assert!([23, 24, 25].contains(&((second - first) / 3600)));
    assert_eq!(f.fire_schedules_at(at(second + 30)).unwrap().len(), 1);
    let job = &scheduled(&f)[1];
    assert_eq!(
        job.unique_key(),
        Some(format!("schedule:nightly:w{second}").as_str())
    );
}

fn bad_schedules_are_refused_and_unknown_names_are_not_found(kind: Kind) {
    let f = kind.open();
    let job = || NewJob::new(Q, "x");
    let refused = |s: Schedule| match f.declare_schedule(s) {
        Err(Error::Input(e)) => e,
        other => panic!("expected an input error, got {other:?}"),
    };
    assert_eq!(
        refused(Schedule::every("s", Duration::ZERO, job())),
        InputError::ZeroInterval
    );
    assert!(matches!(
        refused(Schedule::every("", MINUTE, job())),
        InputError::BadScheduleName { len: 0, .. }
    ));
    assert!(matches!(
        refused(Schedule::every("s", MINUTE, NewJob::new("", "x"))),
        InputError::EmptyQueueName
    ));
    assert!(matches!(
        refused(Schedule::cron("c", "61 * * * *", "Europe/Berlin", job())),
        InputError::BadCron { .. }
    ));
    assert!(matches!(
        refused(Schedule::cron("c", "0 3 * * *", "Mars/Olympus_Mons", job())),
        InputError::BadTimeZone { .. }
    ));
    // an expression no date matches says so (once: "CronScheduler time search limit
    // exceeded")
    match refused(Schedule::cron("c", "0 0 30 2 *", "Europe/Berlin", job())) {
        InputError::BadCron { why, .. } => assert!(why.contains("never fire"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(f.schedules().unwrap().is_empty(), "nothing was declared");
    assert!(matches!(
        f.pause_schedule("nope"),
        Err(Error::ScheduleNotFound(name)) if name == "nope"
    ));
}

fn a_declaration_is_checked_as_its_ticks_jobs_will_be_and_options_it_cannot_honour_are_refused(
    kind: Kind,
) {
    let f = kind.open();
    let refused = |s: Schedule| match f.declare_schedule(s) {
        Err(Error::Input(e)) => e,
        other => panic!("expected an input error, got {other:?}"),
    };
    // sixteen pairs are a job's limit; each tick's job carries a seventeenth, `schedule`
    let full = (0..16).fold(NewJob::new(Q, "x"), |j, i| j.metadata(format!("k{i}"), "v"));
    assert!(matches!(
        refused(Schedule::every("full", MINUTE, full)),
        InputError::TooMuchMetadata { count: 17, max: 16 }
    ));
    for job in [
        NewJob::new(Q, "x").metadata("schedule", "mine"),
        NewJob::new(Q, "x").unique_key("k"),
        NewJob::new(Q, "x").delay(MINUTE),
    ] {
        assert!(matches!(
            refused(Schedule::every("s", MINUTE, job)),
            InputError::ScheduleJobOption(_)
        ));
    }
    assert_eq!(
        refused(Schedule::every(
            "s",
            Duration::from_millis(1),
            NewJob::new(Q, "x")
        )),
        InputError::IntervalTooShort {
            every: Duration::from_millis(1),
            min: leasehold::MIN_INTERVAL
        }
    );
    assert!(f.schedules().unwrap().is_empty(), "nothing was declared");
    f.declare_schedule(Schedule::every(
        "s",
        leasehold::MIN_INTERVAL,
        NewJob::new(Q, "x"),
    ))
    .unwrap();
}

fn a_schedule_that_cannot_fire_is_passed_over_shown_with_its_failure_and_the_others_fire(
    kind: Kind,
) {
    // Declared by a process whose payloads may be large; fired by one whose may not: the big
    // schedule's ticks are refused, and its sibling fires all the same.
    let mut f = kind.with(Setup::default().max_payload(4096));
    f.declare_schedule(Schedule::every(
        "big",
        MINUTE,
        NewJob::new(Q, vec![7u8; 2048]),
    ))
    .unwrap();
    f.declare_schedule(Schedule::every("small", MINUTE, NewJob::new(Q, "x")))
        .unwrap();
    f.reopen_with(Setup::default().max_payload(1024));
    f.advance(MINUTE);
    assert_eq!(fire(&f), 1, "the sibling fired");
    let big = shown(&f, "big");
    assert!(
        big.failure().unwrap().contains("payload"),
        "{:?}",
        big.failure()
    );
    assert_eq!(big.fired(), 0);
    assert_eq!(shown(&f, "small").failure(), None);
    f.advance(MINUTE);
    assert_eq!(fire(&f), 1, "and again");
    // a process that can take its payload fires it, and the failure is gone
    f.reopen_with(Setup::default().max_payload(4096));
    assert_eq!(fire(&f), 1, "the big one's latest tick");
    assert_eq!(shown(&f, "big").failure(), None);
    assert_eq!(shown(&f, "big").fired(), 1);
    // declaring again clears a failure too, and removing a schedule removes its failure
    f.reopen_with(Setup::default().max_payload(1024));
    f.advance(MINUTE);
    fire(&f);
    assert!(shown(&f, "big").failure().is_some());
    f.declare_schedule(Schedule::every("big", MINUTE, NewJob::new(Q, "now small")).replace())
        .unwrap();
    assert_eq!(shown(&f, "big").failure(), None);
    f.advance(MINUTE);
    assert_eq!(fire(&f), 2);
    assert!(f.remove_schedule("big").unwrap());
}

fn shown(f: &Backend, name: &str) -> leasehold::ScheduleInfo {
    f.schedules()
        .unwrap()
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap()
}

/// What a property run does: time passes, a scheduler fires, a scheduler's process dies (on
/// redb the one process of them all, whose store is opened again), a dead one comes back.
#[derive(Clone, Debug)]
enum Step {
    Advance(u16),
    Fire(u8),
    Die(u8),
    Revive(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u16..400).prop_map(Step::Advance),
        6 => any::<u8>().prop_map(Step::Fire),
        1 => any::<u8>().prop_map(Step::Die),
        2 => any::<u8>().prop_map(Step::Revive),
    ]
}

/// The three schedules of the property: (name, interval in seconds, policy). Skip's
/// interval is longer than ON_TIME, so that a late pass drops its tick.
const RACED: [(&str, u64, CatchUp); 3] = [
    ("all", 50, CatchUp::All),
    ("once", 70, CatchUp::Once),
    ("skip", 90, CatchUp::Skip),
];

/// K = 3 schedulers over simulated time, racing (each pass of each live one fires what has
/// come), dying and coming back: every tick of every schedule is enqueued at most once, and
/// exactly as its catch-up policy says given the moments some scheduler fired: All, every
/// tick up to the last pass; Once, the latest tick at each pass; Skip, the latest tick at
/// each pass that came within ON_TIME of it, and no other.
fn schedulers_that_race_die_and_come_back_enqueue_every_tick_once_as_its_policy_says(kind: Kind) {
    let cases = match kind {
        Kind::Redb | Kind::Memory => 48,
        Kind::Postgres(_) | Kind::PostgresProtocol(_) => 12,
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&proptest::collection::vec(step(), 1..60), |steps| {
        race(kind.clone(), &steps).map_err(TestCaseError::fail)
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

fn race(kind: Kind, steps: &[Step]) -> Result<(), String> {
    let mut f = kind.open();
    let t0 = f.now();
    for (name, secs, policy) in RACED {
        let every = Duration::from_secs(secs);
        let job = NewJob::new(Q, name);
        f.declare_schedule(Schedule::every(name, every, job).catch_up(policy))
            .map_err(|e| e.to_string())?;
    }
    // Each scheduler's handle: a machine of its own on PostgreSQL, the one store on redb.
    let own = |f: &Backend| f.another_machine().unwrap_or_else(|| f.handle());
    let mut schedulers: Vec<Option<Arc<dyn crate::backends::ModelStore>>> =
        (0..3).map(|_| Some(own(&f))).collect();
    let mut passes = Vec::new();
    for step in steps {
        match *step {
            Step::Advance(secs) => f.advance(Duration::from_secs(u64::from(secs))),
            Step::Fire(k) => {
                if let Some(s) = &schedulers[usize::from(k % 3)] {
                    s.fire_schedules_at(wall()).map_err(|e| e.to_string())?;
                    passes.push(f.now());
                }
            }
            Step::Die(k) => match f.is_postgres() {
                true => schedulers[usize::from(k % 3)] = None,
                // the process of every scheduler dies: its store is opened again
                false => {
                    schedulers.iter_mut().for_each(|s| *s = None);
                    f.reopen();
                    schedulers = (0..3).map(|_| Some(own(&f))).collect();
                }
            },
            Step::Revive(k) => {
                let s = &mut schedulers[usize::from(k % 3)];
                if s.is_none() {
                    *s = Some(own(&f));
                }
            }
        }
    }
    drop(schedulers);
    let jobs = scheduled(&f);
    let mut keys: Vec<&str> = jobs.iter().filter_map(|j| j.unique_key()).collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() != jobs.len() {
        return Err(format!(
            "{} jobs for {} distinct ticks",
            jobs.len(),
            keys.len()
        ));
    }
    for (name, secs, policy) in RACED {
        let every = secs * 1_000_000_000;
        let tick = |k: u64| t0.0 + k * every;
        // The latest tick at or before `t`, if one has come.
        let latest = |t: leasehold::StoreTime| {
            let k = (t.0 - t0.0) / every;
            (k >= 1).then(|| tick(k))
        };
        let mut fired: Vec<u64> = jobs
            .iter()
            .filter(|j| j.metadata_value("schedule") == Some(name))
            .map(|j| {
                let key = j.unique_key().unwrap_or_default();
                key.rsplit(":t")
                    .next()
                    .unwrap_or_default()
                    .parse()
                    .unwrap_or(0)
            })
            .collect();
        fired.sort_unstable();
        let mut want: Vec<u64> = match policy {
            CatchUp::All => {
                let last = passes
                    .last()
                    .map_or(0, |p: &leasehold::StoreTime| (p.0 - t0.0) / every);
                (1..=last).map(tick).collect()
            }
            CatchUp::Once => passes.iter().filter_map(|p| latest(*p)).collect(),
            CatchUp::Skip => passes
                .iter()
                .filter_map(|p| latest(*p).filter(|t| p.0 - t < 60_000_000_000))
                .collect(),
            other => {
                return Err(format!(
                    "a catch-up policy the test does not know: {other:?}"
                ));
            }
        };
        want.sort_unstable();
        want.dedup();
        if fired != want {
            return Err(format!(
                "schedule {name} ({policy:?}): fired {fired:?}, the passes {passes:?} call for {want:?}"
            ));
        }
    }
    Ok(())
}

/// A scheduler sleeps until its next tick, not a pass every interval; it wakes when a
/// schedule changes through its handle and when time moves (here a manual clock, advanced
/// with `wake_all`), and fires then. Its interval is an hour: a scheduler that passed only
/// every interval would fire nothing here.
fn a_scheduler_asleep_until_its_next_tick_wakes_for_a_schedule_changed_and_for_time_moved(
    kind: Kind,
) {
    let f = kind.open();
    let hour = Duration::from_secs(3600);
    let scheduler = f.handle().start_scheduler(hour).unwrap();
    crate::common::wait_until("the first pass", || scheduler.metrics().passes() >= 1);
    let passes = scheduler.metrics().passes();
    f.declare_schedule(Schedule::every("report", MINUTE, NewJob::new(Q, "report")))
        .unwrap();
    crate::common::wait_until("a pass after the declaration", || {
        scheduler.metrics().passes() > passes
    });
    assert_eq!(
        scheduler.metrics().fired(),
        0,
        "its first tick is a minute away"
    );
    f.advance(MINUTE);
    f.wake_all();
    crate::common::wait_until("the tick to fire", || scheduler.metrics().fired() == 1);
    assert_eq!(scheduled(&f).len(), 1);
    // Paused, then resumed a minute late: the resumption wakes it, and the missed tick
    // fires as the schedule's catch-up says (one job for the ticks missed).
    f.pause_schedule("report").unwrap();
    let passes = scheduler.metrics().passes();
    f.advance(MINUTE);
    f.wake_all();
    crate::common::wait_until("a pass after the clock moved", || {
        scheduler.metrics().passes() > passes
    });
    assert_eq!(scheduler.metrics().fired(), 1, "paused");
    f.resume_schedule("report").unwrap();
    crate::common::wait_until("the missed tick to fire", || {
        scheduler.metrics().fired() == 2
    });
    assert_eq!(scheduled(&f).len(), 2);
    drop(scheduler);
}

/// What an operator asks of a schedule besides its timing: what its jobs will carry, as
/// declared (none where none was given).
fn a_schedule_reports_the_options_its_jobs_carry(kind: Kind) {
    let f = kind.open();
    let minute = Duration::from_secs(60);
    let retry = leasehold::RetryPolicy::fixed(Duration::from_secs(5));
    let job = NewJob::new(Q, "report")
        .priority(-2)
        .max_attempts(3)
        .time_limit(minute)
        .retry_policy(retry.clone())
        .limit_key("tenant-7")
        .expires_in(minute * 5)
        .metadata("team", "ops");
    f.declare_schedule(Schedule::every("full", minute, job))
        .unwrap();
    f.declare_schedule(Schedule::every("bare", minute, NewJob::new(Q, "x")))
        .unwrap();
    let listed = f.schedules().unwrap();
    let of = |name: &str| listed.iter().find(|s| s.name() == name).unwrap();
    let full = of("full");
    assert_eq!(
        (full.priority(), full.max_attempts(), full.time_limit()),
        (-2, Some(3), Some(minute))
    );
    assert_eq!(full.retry_policy(), Some(&retry));
    assert_eq!(full.limit_key(), Some("tenant-7"));
    assert_eq!(full.expires_in(), Some(minute * 5));
    assert_eq!(full.metadata(), [("team".to_owned(), "ops".to_owned())]);
    let bare = of("bare");
    assert_eq!(
        (bare.priority(), bare.max_attempts(), bare.time_limit()),
        (0, None, None)
    );
    assert_eq!(
        (bare.retry_policy(), bare.limit_key(), bare.expires_in()),
        (None, None, None)
    );
    assert!(bare.metadata().is_empty());
}
