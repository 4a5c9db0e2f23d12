//! Expiry: a job no attempt has started by its expiry ends as `Expired`, never runs, and
//! what waits for it learns it as it would learn of a cancel.

use std::time::Duration;

use leasehold::{Error, InputError, JobState, NewJob, QueueLimits, Require, Schedule};

use crate::on_both::{Backend, Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_claim_past_the_expiry_expires_the_job_instead_of_starting_it_and_its_waiter_learns_it,
    a_job_backing_off_past_its_expiry_expires_instead_of_running_again,
    a_running_attempt_runs_to_its_end_past_its_jobs_expiry,
    a_lease_taken_back_past_its_jobs_expiry_ends_the_job_as_expired_in_the_same_pass,
    the_reaper_expires_the_jobs_nobody_claims_queued_and_blocked,
    a_keyed_head_past_its_expiry_hands_its_place_to_the_next_job_of_its_key,
    an_expired_jobs_unique_key_is_free_and_an_operator_retry_runs_it_without_its_expiry,
    an_expiry_a_job_could_never_meet_is_refused_and_nothing_is_written,
    a_schedules_jobs_expire_after_their_tick_when_nobody_starts_them,
);

const SOON: Duration = Duration::from_secs(10);

fn state(f: &Backend, id: leasehold::JobId) -> JobState {
    f.job(id).unwrap().unwrap().state()
}

/// The jobs the events told so far say expired, with their queues, in the order told.
fn told_expired(events: &leasehold::Events) -> Vec<(leasehold::JobId, String)> {
    std::iter::from_fn(|| events.try_next())
        .filter_map(|e| match e {
            leasehold::Event::Expired { job, queue } => Some((job, queue)),
            _ => None,
        })
        .collect()
}

/// A claim at or after the expiry takes the next job instead: the late one is expired (no
/// attempt begun, finished then), and the job that waited for its success is cancelled in
/// the same transaction; one that waited for any end runs.
fn a_claim_past_the_expiry_expires_the_job_instead_of_starting_it_and_its_waiter_learns_it(
    kind: Kind,
) {
    let f = kind.open();
    let events = f.subscribe();
    let late = f.enqueue(NewJob::new(Q, "late").expires_in(SOON)).unwrap();
    let in_time = f
        .enqueue(NewJob::new(Q, "in time").expires_in(SOON * 2))
        .unwrap();
    let plain = f.enqueue(NewJob::new(Q, "plain")).unwrap();
    let needs_success = f.enqueue(NewJob::new("after", "s").after(late)).unwrap();
    let any_end = (f.enqueue(
        NewJob::new("after", "a").after_with(leasehold::Target::Job(late), Require::any_end()),
    ))
    .unwrap();
    let expiry = f.job(late).unwrap().unwrap().expires_at().unwrap();
    assert_eq!(
        expiry,
        f.job(late)
            .unwrap()
            .unwrap()
            .created_at()
            .saturating_add(SOON)
    );
    assert_eq!(f.job(plain).unwrap().unwrap().expires_at(), None);
    f.advance(SOON);
    let claimed = f.claim_batch(Q, "w", lease(), 3).unwrap();
    let ids: Vec<_> = claimed.iter().map(|l| l.job).collect();
    assert_eq!(ids, vec![in_time, plain], "the late job is passed over");
    assert_eq!(told_expired(&events), vec![(late, Q.to_owned())]);
    let job = f.job(late).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Expired);
    assert_eq!(job.attempt().0, 0, "no attempt began");
    assert_eq!(job.finished_at(), Some(f.now()));
    assert!(f.history(late).unwrap().is_empty());
    assert_eq!(state(&f, needs_success), JobState::Cancelled);
    assert!(
        (f.job(needs_success).unwrap().unwrap().last_error().unwrap()).contains("expired"),
        "its error names how the dependency ended"
    );
    assert_eq!(state(&f, any_end), JobState::Queued);
    assert_eq!(f.stats().unwrap().total(JobState::Expired), 1);
    match f.cancel(late) {
        Err(Error::Refused { state, .. }) => assert_eq!(state, JobState::Expired),
        other => panic!("an expired job cancelled: {other:?}"),
    }
}

/// Expiry bounds when an attempt may start: a job that failed and backs off past its
/// expiry is expired by the claim that would have retried it.
fn a_job_backing_off_past_its_expiry_expires_instead_of_running_again(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "flaky").expires_in(SOON).max_attempts(5))
        .unwrap();
    let first = f.claim_one("w");
    assert_eq!(f.fail(&first, "boom").unwrap(), JobState::RetryWait);
    f.advance(Duration::from_secs(3600));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.attempt().0, job.failures()),
        (JobState::Expired, 1, 1)
    );
    assert_eq!(
        job.last_error(),
        Some("boom"),
        "the last failure stays readable"
    );
}

/// The expiry passing while an attempt runs changes nothing for it: its renewals and its
/// completion hold.
fn a_running_attempt_runs_to_its_end_past_its_jobs_expiry(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "long").expires_in(SOON)).unwrap();
    let l = f.claim_one("w");
    f.advance(SOON + Duration::from_secs(1));
    assert!(matches!(
        f.heartbeat(&l, 1).unwrap(),
        leasehold::Renewal::Renewed { .. }
    ));
    assert_eq!(f.reap().unwrap().expired, vec![]);
    f.complete(&l, b"done").unwrap();
    assert_eq!(state(&f, id), JobState::Succeeded);
}

/// A lease the reaper takes back after its job's expiry puts the job back to wait past it:
/// the same pass ends it as expired (a pass's first look, taken before its reclaims, found
/// no job waiting past its expiry), and the next pass finds nothing.
fn a_lease_taken_back_past_its_jobs_expiry_ends_the_job_as_expired_in_the_same_pass(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "lost").expires_in(SOON)).unwrap();
    let l = f.claim_one("w");
    f.advance(LEASE.max(SOON) + Duration::from_secs(1));
    let report = f.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 1, "the lease is taken back");
    assert_eq!(
        report.expired,
        vec![id],
        "and its job expired in the same pass"
    );
    assert_eq!(state(&f, id), JobState::Expired);
    let beat = f.heartbeat(&l, 1);
    assert!(
        !matches!(beat, Ok(leasehold::Renewal::Renewed { .. })),
        "the lost holder's heartbeat is refused: {beat:?}"
    );
    let again = f.reap().unwrap();
    assert!(again.reclaimed.is_empty() && again.expired.is_empty());
}

/// Jobs nobody claims (a paused queue's, one blocked on a dependency that is still
/// running) are expired by the reaper, first to expire first, in batches; a second pass
/// finds none.
fn the_reaper_expires_the_jobs_nobody_claims_queued_and_blocked(kind: Kind) {
    let f = kind.with(crate::on_both::Setup::default().reap_batch(2));
    let blocker = f.enqueue(NewJob::new("other", "blocker")).unwrap();
    f.declare_queue(Q).unwrap();
    f.pause_queue(Q).unwrap();
    let paused: Vec<_> = (1..=3u64)
        .map(|i| {
            let job = NewJob::new(Q, "paused").expires_in(SOON + Duration::from_secs(4 - i));
            f.enqueue(job).unwrap()
        })
        .collect();
    let blocked = f
        .enqueue(
            NewJob::new("after", "blocked")
                .after(blocker)
                .expires_in(SOON),
        )
        .unwrap();
    let waiter = f
        .enqueue(NewJob::new("after", "w").after(paused[0]))
        .unwrap();
    let keeps = f
        .enqueue(NewJob::new(Q, "keeps").expires_in(SOON * 9))
        .unwrap();
    let holder = f.claim("other", "w", lease()).unwrap().unwrap();
    assert_eq!(holder.job, blocker);
    let events = f.subscribe();
    f.advance(SOON / 2);
    assert_eq!(f.reap().unwrap().expired, vec![], "none is due yet");
    f.advance(SOON);
    f.heartbeat(&holder, 1).unwrap();
    let report = f.reap().unwrap();
    assert_eq!(
        report.expired,
        vec![blocked, paused[2], paused[1], paused[0]],
        "first to expire first"
    );
    let told: Vec<_> = told_expired(&events)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(told, report.expired, "each told once, in order");
    for id in paused.iter().chain([&blocked]) {
        assert_eq!(state(&f, *id), JobState::Expired, "job {id}");
    }
    assert_eq!(state(&f, waiter), JobState::Cancelled);
    assert_eq!(state(&f, keeps), JobState::Queued);
    assert_eq!(f.reap().unwrap().expired, vec![]);
    f.resume_queue(Q).unwrap();
    assert_eq!(f.claim_one("w").job, keeps);
    f.complete(&holder, b"").unwrap();
    assert_eq!(
        state(&f, blocked),
        JobState::Expired,
        "its dependency's end changes nothing"
    );
}

/// A key's head that expires gives its place to the key's next job, as a cancelled head
/// does: the key's count and order stay whole.
fn a_keyed_head_past_its_expiry_hands_its_place_to_the_next_job_of_its_key(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    let first = f.enqueue(NewJob::new(Q, "1").limit_key("k")).unwrap();
    let late = (f.enqueue(NewJob::new(Q, "2").limit_key("k").expires_in(SOON))).unwrap();
    let third = f.enqueue(NewJob::new(Q, "3").limit_key("k")).unwrap();
    let held = f.claim_one("w");
    assert_eq!(held.job, first);
    f.advance(SOON);
    f.complete(&held, b"").unwrap();
    let next = f.claim_one("w");
    assert_eq!(
        next.job, third,
        "the late head is expired, the next job of its key runs"
    );
    assert_eq!(state(&f, late), JobState::Expired);
    assert!(
        f.claim(Q, "w", lease()).unwrap().is_none(),
        "the key is at its limit"
    );
    // the reaper path: a late job parked behind a running one
    let parked = (f.enqueue(NewJob::new(Q, "4").limit_key("k").expires_in(SOON))).unwrap();
    let after = f.enqueue(NewJob::new(Q, "5").limit_key("k")).unwrap();
    f.advance(SOON);
    f.heartbeat(&next, 1).unwrap();
    assert_eq!(f.reap().unwrap().expired, vec![parked]);
    f.complete(&next, b"").unwrap();
    assert_eq!(f.claim_one("w").job, after);
}

/// An expired job holds its unique key no more; an operator's retry puts it back without
/// its expiry, and it runs.
fn an_expired_jobs_unique_key_is_free_and_an_operator_retry_runs_it_without_its_expiry(kind: Kind) {
    let f = kind.open();
    let once = |payload: &str| NewJob::new(Q, payload).unique_key("daily").expires_in(SOON);
    let late = f.enqueue(once("first")).unwrap();
    assert_eq!(f.enqueue(once("again")).unwrap(), late, "the key is held");
    f.advance(SOON + LEASE);
    assert_eq!(f.reap().unwrap().expired, vec![late]);
    let fresh = f.enqueue(once("fresh")).unwrap();
    assert_ne!(fresh, late, "an expired job's key is free");
    f.cancel(fresh).unwrap();
    f.retry(late).unwrap();
    let job = f.job(late).unwrap().unwrap();
    assert_eq!((job.state(), job.expires_at()), (JobState::Queued, None));
    f.advance(SOON * 100);
    let l = f.claim_one("w");
    assert_eq!(l.job, late);
    f.complete(&l, b"").unwrap();
}

/// A delayed job due at or after its expiry could never run: refused, as is a schedule's
/// job that would expire at one wall-clock time, and nothing is stored.
fn an_expiry_a_job_could_never_meet_is_refused_and_nothing_is_written(kind: Kind) {
    let f = kind.open();
    for (delay, expires) in [(SOON, SOON / 2), (SOON, SOON)] {
        let job = NewJob::new(Q, "x").delay(delay).expires_in(expires);
        match f.enqueue(job) {
            Err(Error::Input(InputError::ExpiresBeforeDue { due, expires: e })) => {
                assert_eq!((due, e), (delay, expires));
            }
            other => panic!("{other:?}"),
        }
    }
    let at = NewJob::new(Q, "t").expires_at(std::time::SystemTime::UNIX_EPOCH);
    let every = Schedule::every("tick", Duration::from_secs(60), at);
    assert!(matches!(
        f.declare_schedule(every),
        Err(Error::Input(InputError::ScheduleJobOption(_)))
    ));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
    // An expiry already past is accepted: the job never runs.
    let past = NewJob::new(Q, "past").expires_at(std::time::SystemTime::UNIX_EPOCH);
    let id = f.enqueue(past).unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert_eq!(state(&f, id), JobState::Expired);
}

/// A schedule's job may expire: each tick's job expires that long after its tick's enqueue.
/// The expiry is part of the declaration: another one is a conflict unless it replaces.
fn a_schedules_jobs_expire_after_their_tick_when_nobody_starts_them(kind: Kind) {
    let f = kind.open();
    let minute = Duration::from_secs(60);
    let tick_job = || NewJob::new(Q, "price update").expires_in(SOON);
    f.declare_schedule(Schedule::every("prices", minute, tick_job()))
        .unwrap();
    f.declare_schedule(Schedule::every("prices", minute, tick_job()))
        .unwrap();
    let other = Schedule::every("prices", minute, NewJob::new(Q, "price update"));
    assert!(matches!(
        f.declare_schedule(other),
        Err(Error::ScheduleConflict(_))
    ));
    let wall = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    f.advance(minute);
    let fired = f.fire_schedules_at(wall).unwrap();
    assert_eq!(fired.len(), 1);
    let job = f.job(fired[0]).unwrap().unwrap();
    assert_eq!(job.expires_at(), Some(f.now().saturating_add(SOON)));
    f.advance(SOON);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "too late");
    assert_eq!(state(&f, job.id()), JobState::Expired);
    f.advance(minute - SOON);
    let fired = f.fire_schedules_at(wall).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(l.job, fired[0], "the next tick's job runs in time");
}
