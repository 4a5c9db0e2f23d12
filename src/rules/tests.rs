//! The rules' own tests: each decision on plain records, no engine.

use std::time::Duration;

use super::*;
use crate::ids::{Attempt, JobId, LeaseToken, StoreTime};
use crate::job::{JobRecord, Outcome, ReclaimPath};
use crate::lease::{Holding, LeaseTerms};
use crate::new_job::NewJob;
use crate::retry::RetryPolicy;
use crate::schedule::{CatchUp, MAX_TICKS_PER_PASS, Schedule, Tick};
use crate::state::JobState;
use crate::stats::Counters;

fn queued(id: u64) -> JobRecord {
    new_job(
        &NewJob::new("q", "x").max_attempts(2),
        JobId(id),
        std::time::Duration::ZERO,
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
        LeaseToken(77),
    ) {
        Granted::Lease(job) => job,
        Granted::Exhausted(_) | Granted::Expired(_) => unreachable!("a fresh job runs"),
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
        LeaseToken(78),
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
        Granted::Expired(_) => panic!("expired without an expiry"),
    }
}

#[test]
fn a_job_is_granted_up_to_its_expiry_and_expired_from_then_on_even_with_attempts_spent() {
    let terms = LeaseTerms::new(Duration::from_secs(1));
    let mut job = queued(3);
    job.expires_at = Some(StoreTime(5_000));
    let granted = |job: &JobRecord, at| grant(job, "w", terms, StoreTime(at), LeaseToken(79));
    assert!(matches!(granted(&job, 4_999), Granted::Lease(_)));
    for at in [5_000, 9_000] {
        match granted(&job, at) {
            Granted::Expired(expired) => {
                assert_eq!(expired.state, JobState::Expired);
                assert_eq!(expired.attempt, job.attempt, "no attempt began");
                assert_eq!(expired.finished_at, Some(StoreTime(at)));
            }
            _ => panic!("granted at {at}, past its expiry"),
        }
    }
    // A retry after a failure waits like any other; past the expiry it expires too.
    job.state = JobState::RetryWait;
    job.attempt = Attempt(u32::MAX);
    assert!(matches!(granted(&job, 6_000), Granted::Expired(_)));
    assert!(expired(&job, StoreTime(6_000)).is_some());
    // A running attempt is not cut short by the expiry; a finished job stays as it is.
    for state in [JobState::Running, JobState::Succeeded, JobState::Cancelled] {
        job.state = state;
        assert!(expired(&job, StoreTime(6_000)).is_none(), "{state}");
    }
    job.state = JobState::Blocked;
    assert!(expired(&job, StoreTime(6_000)).is_some());
    assert!(expired(&job, StoreTime(4_000)).is_none());
}

#[test]
fn an_expired_dependency_counts_as_cancelled_for_its_waiters_and_its_group() {
    use crate::workflow::Require;
    assert!(!Require::success().accepts(JobState::Expired));
    assert!(Require::success().or_cancelled().accepts(JobState::Expired));
    assert!(Require::any_end().accepts(JobState::Expired));
    assert!(!Require::success().or_dead().accepts(JobState::Expired));
    let mut group = new_group(crate::ids::GroupId(1), StoreTime(1));
    group.members = 1;
    group.sealed = true;
    let (ended, done) = member_ended(&group, JobState::Expired, StoreTime(2)).unwrap();
    assert!(done);
    assert_eq!(ended.cancelled, 1);
    assert_eq!(ended.outcome(), Some(JobState::Cancelled));
}

#[test]
fn the_fence_counts_a_refused_end_and_a_lost_renewal_but_not_one_after_the_holders_end() {
    let job = running(StoreTime(2_000));
    let held: Result<_, ()> = fence(Some(job.clone()), holding(&job), Write::End, || Ok(false));
    assert_eq!(held.unwrap().unwrap(), job);
    let stale = Holding {
        attempt: Attempt(9),
        ..holding(&job)
    };
    let refused = fence::<()>(Some(job.clone()), stale, Write::End, || Ok(false))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (refused.lost.found, refused.counts.fenced_writes_rejected),
        (Some((job.attempt, JobState::Running)), 1)
    );
    let done = complete(&job, None, StoreTime(2_050)).job;
    let refused = fence::<()>(Some(done.clone()), holding(&done), Write::Heartbeat, || {
        Ok(true)
    })
    .unwrap()
    .unwrap_err();
    assert!(refused.lost.ended_by_holder);
    assert_eq!(
        refused.counts,
        Counters::default(),
        "a renewal after the holder's own end lost nothing"
    );
    let nobody = Holding {
        job: JobId(7),
        attempt: Attempt(1),
        token: LeaseToken(1),
    };
    let gone = fence::<()>(None, nobody, Write::Heartbeat, || Ok(true))
        .unwrap()
        .unwrap_err();
    assert_eq!((gone.lost.found, gone.counts.leases_lost), (None, 1));
}

fn holding(job: &JobRecord) -> Holding {
    Holding {
        job: job.id,
        attempt: job.attempt,
        token: job.token,
    }
}

/// A store that lost its last commits (a failover to a standby that had not seen them)
/// grants the same attempt number again: the first holder's lease, whose token differs, is
/// refused while the job runs under the second, and is not told that the second's end was
/// its own.
#[test]
fn the_fence_refuses_a_lease_of_the_same_attempt_granted_under_another_token() {
    let regranted = running(StoreTime(3_000));
    let first = Holding {
        token: LeaseToken(76),
        ..holding(&regranted)
    };
    assert_eq!(first.attempt, regranted.attempt);
    for write in [Write::Heartbeat, Write::End, Write::TimeOut] {
        let refused = fence::<()>(Some(regranted.clone()), first, write, || Ok(true))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            refused.lost.found,
            Some((regranted.attempt, JobState::Running))
        );
    }
    let ended = complete(&regranted, None, StoreTime(3_050)).job;
    let refused = fence::<()>(Some(ended.clone()), first, Write::End, || Ok(true))
        .unwrap()
        .unwrap_err();
    assert!(
        !refused.lost.ended_by_holder,
        "the end was the other lease's"
    );
    assert_eq!(refused.counts.fenced_writes_rejected, 1);
    let holder = fence::<()>(Some(ended), holding(&regranted), Write::Heartbeat, || {
        Ok(true)
    });
    assert!(holder.unwrap().unwrap_err().lost.ended_by_holder);
}

#[test]
fn a_dead_holders_table_spares_what_was_not_in_a_handler_and_makes_the_suspect_wait_a_backoff() {
    let policy = RetryPolicy::default();
    let job = running(StoreTime(2_000));
    let now = StoreTime(5_000);
    let take = |path, stage| {
        let backoff = || Ok::<_, ()>(policy.clone());
        expire(&job, path, stage, now, backoff).unwrap().unwrap().0
    };
    for (stage, outcome) in [
        (
            Stage::NotStarted,
            Outcome::NeverStarted {
                path: ReclaimPath::ProcessDied,
            },
        ),
        (
            Stage::Returned,
            Outcome::ResultLost {
                path: ReclaimPath::ProcessDied,
            },
        ),
    ] {
        let spared = take(ReclaimPath::ProcessDied, stage);
        assert_eq!(spared.job.failures, 0, "{stage:?}: no budget spent");
        assert_eq!(
            (spared.job.state, spared.job.run_at),
            (JobState::Queued, job.run_at)
        );
        assert_eq!(spared.ended.unwrap().outcome, Some(outcome));
    }
    let suspect = take(ReclaimPath::Recovery, Stage::InHandler);
    assert_eq!(
        suspect.job.failures, 1,
        "in its handler: it may be what killed it"
    );
    assert_eq!(suspect.job.state, JobState::RetryWait, "after a backoff");
    assert!(suspect.job.run_at > now);
    let unknown = take(ReclaimPath::Recovery, Stage::Unknown);
    assert_eq!((unknown.job.failures, unknown.job.run_at), (1, job.run_at));
    // A silent holder may be alive: what a log says is not asked.
    let silent = take(ReclaimPath::Reaper, Stage::NotStarted);
    assert_eq!(silent.job.failures, 1);
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
    let (expired, reclaim) = expire(
        &job,
        ReclaimPath::Reaper,
        Stage::Unknown,
        StoreTime(2_200),
        || Err("a lease that waited out its length asks for no backoff"),
    )
    .unwrap()
    .unwrap();
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
    let policy = || Ok::<_, ()>(RetryPolicy::default());
    // Only an end that waits out a backoff asks for the policy (its queue's record).
    let unasked = || Err::<RetryPolicy, _>(());
    let mut job = running(StoreTime(0));
    job.lease.as_mut().unwrap().stall_timeout = Some(Duration::from_nanos(10));
    assert!(matches!(
        renew(&job, 0, StoreTime(20), policy),
        Ok(Renewed::Stalled(_))
    ));
    assert!(matches!(
        renew(&job, 1, StoreTime(20), unasked),
        Ok(Renewed::Lease(_))
    ));
    job.cancel_requested = true;
    assert!(matches!(
        renew(&job, 0, StoreTime(20), unasked),
        Ok(Renewed::Cancelled(_))
    ));
}

#[test]
fn a_failure_waits_by_the_jobs_policy_else_its_queues_else_the_stores() {
    let store = RetryPolicy::fixed(Duration::from_nanos(1_000));
    let of_queue = crate::queue::QueueRecord {
        retry: Some(RetryPolicy::fixed(Duration::from_nanos(2_000))),
        ..Default::default()
    };
    let bare = crate::queue::QueueRecord::default();
    let mut job = running(StoreTime(0));
    let wait = |job: &JobRecord, queue: Option<&crate::queue::QueueRecord>| {
        let policy = backoff_policy(job, queue, &store);
        let failed = fail(
            job,
            "e",
            Retry::WhileBudgetLasts,
            None,
            StoreTime(10),
            &policy,
        );
        failed.job.run_at.0 - 10
    };
    assert_eq!(wait(&job, None), 1_000);
    assert_eq!(wait(&job, Some(&bare)), 1_000);
    assert_eq!(wait(&job, Some(&of_queue)), 2_000);
    job.retry = Some(RetryPolicy::delays([Duration::from_nanos(3_000)]));
    assert_eq!(wait(&job, Some(&of_queue)), 3_000);
    // A handler's own wait still wins over every policy.
    let policy = backoff_policy(&job, Some(&of_queue), &store);
    let after = Retry::After(Duration::from_nanos(5));
    let failed = fail(&job, "e", after, None, StoreTime(10), &policy);
    assert_eq!(failed.job.run_at, StoreTime(15));
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
