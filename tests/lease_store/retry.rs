use std::time::Duration;

use leasehold::{Error, JobState, NewJob, Outcome, RetryPolicy};

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
);

fn no_jitter() -> Setup {
    Setup::default().retry_policy(RetryPolicy {
        base: Duration::from_secs(10),
        max: Duration::from_secs(60),
        jitter: 0.0,
    })
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
