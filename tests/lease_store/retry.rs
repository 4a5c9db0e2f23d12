use std::time::Duration;

use leasehold::{
    Error, InputError, JobId, JobState, LeaseTerms, NewJob, Outcome, RetryPolicy, Schedule,
};

use crate::on_both::{Kind, LEASE, Q, Setup, lease};

crate::on_both::on_both!(
    and protocol;
    failure_backs_off_exponentially_then_the_spent_budget_makes_the_job_dead,
    lost_leases_spend_the_budget_too_so_a_job_that_kills_its_worker_dies,
    release_does_not_spend_the_budget_but_still_advances_the_attempt,
    a_released_job_is_claimable_at_once_in_its_old_place,
    retry_is_refused_while_a_live_job_holds_the_unique_key,
    a_permanent_failure_is_dead_at_once_with_budget_left_and_an_operators_retry_revives_it,
    a_permanent_failure_by_a_holder_whose_lease_was_taken_is_refused,
    a_failure_waits_by_the_jobs_policy_else_its_queues_else_the_stores,
    stalls_and_time_outs_wait_by_the_queues_policy_too,
    a_queues_retry_policy_and_a_jobs_outlive_a_reopen,
    an_invalid_retry_policy_is_refused_and_changes_nothing,
    a_schedules_jobs_carry_its_retry_policy,
);

fn no_jitter() -> Setup {
    Setup::default().retry_policy(RetryPolicy::exponential(
        Duration::from_secs(10),
        Duration::from_secs(60),
    ))
}

fn failure_backs_off_exponentially_then_the_spent_budget_makes_the_job_dead(kind: Kind) {
    let f = kind.with(no_jitter());
    let id = f.enqueue(NewJob::new(Q, "flaky").max_attempts(3)).unwrap();

    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "first").unwrap(), JobState::RetryWait);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(
        job.run_at(),
        f.now().saturating_add(Duration::from_secs(10))
    );
    assert_eq!(job.last_error(), Some("first"));
    f.advance(Duration::from_secs(9));
    assert!(
        f.claim(Q, "w", lease()).unwrap().is_none(),
        "still backing off"
    );
    f.advance(Duration::from_secs(1));

    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "second").unwrap(), JobState::RetryWait);
    assert_eq!(
        f.job(id).unwrap().unwrap().run_at(),
        f.now().saturating_add(Duration::from_secs(20))
    );
    f.advance(Duration::from_secs(20));

    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "third").unwrap(), JobState::Dead);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Dead, 3));
    assert_eq!(job.finished_at(), Some(f.now()));
    f.advance(Duration::from_secs(3600));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
}

fn lost_leases_spend_the_budget_too_so_a_job_that_kills_its_worker_dies(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "poison").max_attempts(2)).unwrap();
    f.claim_one("w1");
    f.advance(LEASE);
    assert_eq!(f.reap().unwrap().reclaimed[0].job_state, JobState::Queued);
    f.claim_one("w2");
    f.advance(LEASE);
    // taken over at claim time with its budget spent: dead, and the claimer gets nothing
    assert!(f.claim(Q, "w3", lease()).unwrap().is_none());
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Dead);
}

fn release_does_not_spend_the_budget_but_still_advances_the_attempt(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    for expected_attempt in 1..=5u32 {
        let l = f.claim_one("w");
        assert_eq!(l.attempt.0, expected_attempt);
        f.release(&l).unwrap();
        let job = f.job(id).unwrap().unwrap();
        assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
    }
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "now it counts").unwrap(), JobState::Dead);
    assert_eq!(f.stats().unwrap().counters.released, 5);
}

fn a_released_job_is_claimable_at_once_in_its_old_place(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(3);
    let first = f.claim_one("w");
    assert_eq!(first.job, ids[0]);
    f.release(&first).unwrap();
    assert_eq!(f.claim_one("other").job, ids[0]);
}

fn retry_is_refused_while_a_live_job_holds_the_unique_key(kind: Kind) {
    let f = kind.with(Setup::default().default_max_attempts(1));
    // through a cancelled job
    let first = f.enqueue(NewJob::new(Q, "a").unique_key("k")).unwrap();
    f.cancel(first).unwrap();
    let second = f.enqueue(NewJob::new(Q, "b").unique_key("k")).unwrap();
    assert_ne!(first, second, "a finished job's key is free");
    match f.retry(first) {
        Err(Error::UniqueKeyHeld { job, key, holder }) => {
            assert_eq!((job, key.as_str(), holder), (first, "k", second))
        }
        other => panic!("expected UniqueKeyHeld, got {other:?}"),
    }
    assert_eq!(f.job(first).unwrap().unwrap().state(), JobState::Cancelled);
    // through a dead job, in another queue's key space
    let dead = f
        .enqueue(NewJob::new("other", "c").unique_key("k"))
        .unwrap();
    let l = f.claim("other", "w", lease()).unwrap().unwrap();
    f.fail(&l, "boom").unwrap();
    assert_eq!(f.job(dead).unwrap().unwrap().state(), JobState::Dead);
    let live = f
        .enqueue(NewJob::new("other", "d").unique_key("k"))
        .unwrap();
    assert!(matches!(
        f.retry(dead),
        Err(Error::UniqueKeyHeld { holder, .. }) if holder == live
    ));
    // once the holder has finished, the retry goes through and the key is the retried job's
    f.cancel(second).unwrap();
    f.retry(first).unwrap();
    assert_eq!(
        f.enqueue(NewJob::new(Q, "again").unique_key("k")).unwrap(),
        first
    );
}

fn a_permanent_failure_is_dead_at_once_with_budget_left_and_an_operators_retry_revives_it(
    kind: Kind,
) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(25)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(
        f.fail_permanently(&l, "account closed").unwrap(),
        JobState::Dead
    );
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.last_error()),
        (JobState::Dead, 1, Some("account closed"))
    );
    assert_eq!(job.finished_at(), Some(f.now()));
    let history = f.history(id).unwrap();
    assert_eq!(
        history.last().and_then(|r| r.outcome()),
        Some(&Outcome::FailedPermanently("account closed".into()))
    );
    f.advance(Duration::from_secs(3600));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "never retried");
    // the cause fixed, an operator brings it back with a fresh budget
    f.retry(id).unwrap();
    let l = f.claim_one("w");
    assert_eq!(l.job, id);
    f.complete(&l, b"done").unwrap();
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

fn a_permanent_failure_by_a_holder_whose_lease_was_taken_is_refused(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x")).unwrap();
    let first = f.claim_one("w1");
    f.advance(LEASE + Duration::from_secs(1));
    let second = f.claim_one("w2");
    assert_eq!(second.job, id);
    let e = f.fail_permanently(&first, "too late").unwrap_err();
    assert!(e.is_lease_lost(), "{e:?}");
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Running);
    f.complete(&second, b"done").unwrap();
}

const SECOND: Duration = Duration::from_secs(1);

/// How long `id` waits after its lease `l` fails now.
fn wait_after_failing(f: &crate::on_both::Backend, id: JobId, l: &leasehold::Lease) -> Duration {
    assert_eq!(f.fail(l, "e").unwrap(), JobState::RetryWait);
    f.job(id)
        .unwrap()
        .unwrap()
        .run_at()
        .saturating_since(f.now())
}

/// Claims `id` (the only job due in `queue`) once it is due.
fn claim_when_due(f: &crate::on_both::Backend, queue: &str, id: JobId) -> leasehold::Lease {
    let due = f.job(id).unwrap().unwrap().run_at();
    f.advance(due.saturating_since(f.now()));
    let l = f.claim(queue, "w", lease()).unwrap().expect("due");
    assert_eq!(l.job, id);
    l
}

fn a_failure_waits_by_the_jobs_policy_else_its_queues_else_the_stores(kind: Kind) {
    let f = kind.with(no_jitter());
    f.declare_queue(Q).unwrap();
    f.set_queue_retry_policy(Q, Some(RetryPolicy::fixed(30 * SECOND)))
        .unwrap();
    assert_eq!(
        f.queue_settings(Q).unwrap().retry,
        Some(RetryPolicy::fixed(30 * SECOND))
    );
    let by_queue = f.enqueue(NewJob::new(Q, "a")).unwrap();
    let l = f.claim_one("w");
    assert_eq!(wait_after_failing(&f, by_queue, &l), 30 * SECOND);
    let l = claim_when_due(&f, Q, by_queue);
    assert_eq!(wait_after_failing(&f, by_queue, &l), 30 * SECOND, "fixed");

    // The job's own list of delays, walked, then its last repeated.
    let own = RetryPolicy::delays([5 * SECOND, 7 * SECOND]);
    let by_job = f
        .enqueue(NewJob::new("own", "b").retry_policy(own.clone()))
        .unwrap();
    assert_eq!(f.job(by_job).unwrap().unwrap().retry_policy(), Some(&own));
    let mut waits = Vec::new();
    for _ in 0..3 {
        let l = claim_when_due(&f, "own", by_job);
        waits.push(wait_after_failing(&f, by_job, &l));
    }
    assert_eq!(waits, [5 * SECOND, 7 * SECOND, 7 * SECOND]);
    // Over its queue's, too.
    f.set_queue_retry_policy("own", Some(RetryPolicy::fixed(SECOND)))
        .unwrap();
    let l = claim_when_due(&f, "own", by_job);
    assert_eq!(wait_after_failing(&f, by_job, &l), 7 * SECOND);

    // A queue without a policy (or whose policy was lifted) waits by the store's.
    let by_store = f.enqueue(NewJob::new("plain", "c")).unwrap();
    let l = claim_when_due(&f, "plain", by_store);
    assert_eq!(wait_after_failing(&f, by_store, &l), 10 * SECOND);
    f.set_queue_retry_policy(Q, None).unwrap();
    let l = claim_when_due(&f, Q, by_queue);
    assert_eq!(
        wait_after_failing(&f, by_queue, &l),
        40 * SECOND,
        "the store's exponential backoff at the third failure, capped at 60 s"
    );
}

fn stalls_and_time_outs_wait_by_the_queues_policy_too(kind: Kind) {
    let f = kind.with(no_jitter());
    f.declare_queue(Q).unwrap();
    f.set_queue_retry_policy(Q, Some(RetryPolicy::fixed(30 * SECOND)))
        .unwrap();
    let stalls = f.enqueue(NewJob::new(Q, "stalls")).unwrap();
    let terms = LeaseTerms::new(LEASE).stall_timeout(2 * SECOND);
    let l = f.claim(Q, "w", terms).unwrap().unwrap();
    f.advance(3 * SECOND);
    assert_eq!(f.heartbeat(&l, 0).unwrap(), leasehold::Renewal::Stalled);
    let job = f.job(stalls).unwrap().unwrap();
    assert_eq!(job.state(), JobState::RetryWait);
    assert_eq!(job.run_at().saturating_since(f.now()), 30 * SECOND);

    let slow = f
        .enqueue(NewJob::new("slow", "t").time_limit(2 * SECOND))
        .unwrap();
    f.set_queue_retry_policy("slow", Some(RetryPolicy::fixed(50 * SECOND)))
        .unwrap();
    let l = f.claim("slow", "w", lease()).unwrap().unwrap();
    f.advance(3 * SECOND);
    assert_eq!(f.heartbeat(&l, 1).unwrap(), leasehold::Renewal::TimedOut);
    let job = f.job(slow).unwrap().unwrap();
    assert_eq!(job.state(), JobState::RetryWait);
    assert_eq!(job.run_at().saturating_since(f.now()), 50 * SECOND);
}

fn a_queues_retry_policy_and_a_jobs_outlive_a_reopen(kind: Kind) {
    let mut f = kind.with(no_jitter());
    f.declare_queue(Q).unwrap();
    let policy = RetryPolicy::exponential(SECOND, 8 * SECOND).jitter(0.25);
    f.set_queue_retry_policy(Q, Some(policy.clone())).unwrap();
    let own = RetryPolicy::delays([SECOND, 2 * SECOND, 3 * SECOND]);
    let id = f
        .enqueue(NewJob::new(Q, "x").retry_policy(own.clone()))
        .unwrap();
    f.reopen();
    assert_eq!(f.queue_settings(Q).unwrap().retry, Some(policy));
    assert_eq!(f.job(id).unwrap().unwrap().retry_policy(), Some(&own));
    let l = f.claim_one("w");
    assert_eq!(wait_after_failing(&f, id, &l), SECOND);
}

fn an_invalid_retry_policy_is_refused_and_changes_nothing(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    let kept = RetryPolicy::fixed(SECOND);
    f.set_queue_retry_policy(Q, Some(kept.clone())).unwrap();
    let bad = [
        RetryPolicy::exponential(10 * SECOND, SECOND),
        RetryPolicy::delays([]),
        RetryPolicy::delays(vec![SECOND; leasehold::MAX_RETRY_DELAYS + 1]),
        RetryPolicy::fixed(SECOND).jitter(-0.5),
    ];
    for policy in bad {
        let refused = f.set_queue_retry_policy(Q, Some(policy.clone()));
        assert!(
            matches!(refused, Err(Error::Input(InputError::RetryPolicy(_)))),
            "{policy}: {refused:?}"
        );
        let refused = f.enqueue(NewJob::new(Q, "x").retry_policy(policy.clone()));
        assert!(
            matches!(refused, Err(Error::Input(InputError::RetryPolicy(_)))),
            "{policy}: {refused:?}"
        );
    }
    assert_eq!(f.queue_settings(Q).unwrap().retry, Some(kept));
    assert!(
        f.claim(Q, "w", lease()).unwrap().is_none(),
        "nothing enqueued"
    );
}

fn a_schedules_jobs_carry_its_retry_policy(kind: Kind) {
    let f = kind.with(no_jitter());
    let policy = RetryPolicy::fixed(3 * SECOND);
    let job = NewJob::new(Q, "tick").retry_policy(policy.clone());
    f.declare_schedule(Schedule::every("s", 60 * SECOND, job))
        .unwrap();
    // Declared again with another policy, it conflicts as any change of its job would.
    let other = NewJob::new(Q, "tick").retry_policy(RetryPolicy::fixed(SECOND));
    assert!(matches!(
        f.declare_schedule(Schedule::every("s", 60 * SECOND, other)),
        Err(Error::ScheduleConflict(_))
    ));
    f.advance(60 * SECOND);
    let wall = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let fired = f.fire_schedules_at(wall).unwrap();
    assert_eq!(fired.len(), 1);
    assert_eq!(
        f.job(fired[0]).unwrap().unwrap().retry_policy(),
        Some(&policy)
    );
    let l = f.claim_one("w");
    assert_eq!(wait_after_failing(&f, fired[0], &l), 3 * SECOND);
}
