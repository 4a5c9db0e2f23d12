use std::time::Duration;

use leasehold::{Error, InputError, JobState, NewJob, Outcome, QueueLimits, QueueSettings};

use crate::on_both::{Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_paused_queue_grants_no_claim_until_it_resumes_and_its_running_jobs_finish,
    a_concurrency_limit_holds_across_claims_and_an_expired_lease_frees_its_slot,
    a_late_renewal_cannot_take_back_a_slot_a_claim_filled,
    a_rate_limit_allows_so_many_claims_in_any_window,
    limits_that_make_no_sense_are_refused_and_none_lifts_them,
    a_snoozed_job_waits_out_its_delay_without_spending_budget,
    a_queues_controls_refuse_a_queue_the_store_does_not_know_until_it_is_declared,
);

/// Pause, resume, limits and a retry policy on a name no job has used and that has no
/// settings are refused and write nothing (a typo would make a new queue and leave the
/// meant one as it was); a queue with a job, or declared, is known, and declaring it again
/// keeps its settings.
fn a_queues_controls_refuse_a_queue_the_store_does_not_know_until_it_is_declared(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new(Q, "x")).unwrap();
    let typo = "qq";
    let refusals = [
        f.pause_queue(typo),
        f.resume_queue(typo),
        f.set_queue_limits(typo, QueueLimits::none().concurrency(1)),
        f.set_queue_retry_policy(typo, Some(leasehold::RetryPolicy::fixed(LEASE))),
    ];
    for refused in refusals {
        assert!(
            matches!(&refused, Err(Error::QueueNotFound(q)) if q == typo),
            "{refused:?}"
        );
    }
    assert!(
        !f.stats().unwrap().queues.contains_key(typo),
        "nothing was made"
    );
    // a queue with a job is known; a declared one too, and declaring keeps its settings
    f.pause_queue(Q).unwrap();
    f.declare_queue("later").unwrap();
    f.set_queue_limits("later", QueueLimits::none().concurrency(2))
        .unwrap();
    f.declare_queue("later").unwrap();
    assert_eq!(
        f.queue_settings("later").unwrap().limits.concurrency,
        Some(2)
    );
    assert!(f.queue_settings(Q).unwrap().paused);
    assert!(matches!(
        f.declare_queue(""),
        Err(Error::Input(InputError::EmptyQueueName))
    ));
}

fn a_paused_queue_grants_no_claim_until_it_resumes_and_its_running_jobs_finish(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(3);
    let running = f.claim_one("w");
    f.pause_queue(Q).unwrap();
    let settings = f.queue_settings(Q).unwrap();
    assert!(settings.paused);
    assert_eq!(settings.limits, QueueLimits::none());
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert!(f.claim_batch(Q, "w", lease(), 5).unwrap().is_empty());
    assert!(f.claim_job(ids[2], "w", lease()).unwrap().is_none());
    // the running job goes on: renewed and completed as ever
    f.advance(Duration::from_secs(10));
    f.heartbeat(&running, 1).unwrap();
    f.complete(&running, b"done").unwrap();
    assert!(f.stats().unwrap().queues[Q].paused);
    // other queues are not paused
    f.enqueue(NewJob::new("other", "x")).unwrap();
    assert!(f.claim("other", "w", lease()).unwrap().is_some());
    f.resume_queue(Q).unwrap();
    assert!(!f.queue_settings(Q).unwrap().paused);
    assert_eq!(f.claim_batch(Q, "w", lease(), 5).unwrap().len(), 2);
}

fn a_concurrency_limit_holds_across_claims_and_an_expired_lease_frees_its_slot(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(5);
    f.set_queue_limits(Q, QueueLimits::none().concurrency(2))
        .unwrap();
    let first = f.claim_batch(Q, "a", lease(), 5).unwrap();
    assert_eq!(first.len(), 2, "at most two held at once");
    assert!(f.claim(Q, "b", lease()).unwrap().is_none());
    // a finished job frees its slot
    f.complete(&first[0], b"").unwrap();
    let third = f.claim_batch(Q, "b", lease(), 5).unwrap();
    assert_eq!(third.len(), 1);
    // a lease that ran out frees its slot: the claim takes it back first
    f.advance(LEASE);
    let after = f.claim_batch(Q, "c", lease(), 5).unwrap();
    assert_eq!(after.len(), 2);
    let running = f.stats().unwrap().total(JobState::Running);
    assert_eq!(running, 2);
    let expired = f.history(first[1].job).unwrap();
    assert!(matches!(
        expired[0].outcome(),
        Some(Outcome::LeaseExpired { .. })
    ));
}

fn a_late_renewal_cannot_take_back_a_slot_a_claim_filled(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    f.set_queue_limits(Q, QueueLimits::none().concurrency(1))
        .unwrap();
    let slow = f.claim_one("slow");
    f.advance(LEASE + Duration::from_secs(1));
    // the slot is free again; the claim that fills it takes the expired lease back first
    let next = f.claim(Q, "fast", lease()).unwrap().unwrap();
    assert!(f.heartbeat(&slow, 1).unwrap_err().is_lease_lost());
    assert_eq!(f.stats().unwrap().total(JobState::Running), 1);
    f.complete(&next, b"").unwrap();
}

fn a_rate_limit_allows_so_many_claims_in_any_window(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(10);
    let minute = Duration::from_secs(60);
    f.set_queue_limits(Q, QueueLimits::none().rate(3, minute))
        .unwrap();
    assert_eq!(f.claim_batch(Q, "w", lease(), 10).unwrap().len(), 3);
    f.advance(Duration::from_secs(30));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "window spent");
    f.advance(Duration::from_secs(30)); // the first three leave the window
    let two = f.claim_batch(Q, "w", lease(), 2).unwrap();
    assert_eq!(two.len(), 2);
    f.advance(Duration::from_secs(59));
    assert_eq!(f.claim_batch(Q, "w", lease(), 10).unwrap().len(), 1);
    f.advance(Duration::from_secs(1));
    assert_eq!(f.claim_batch(Q, "w", lease(), 10).unwrap().len(), 2);
    assert_eq!(
        f.stats().unwrap().queues[Q].limits,
        QueueLimits::none().rate(3, minute)
    );
}

fn limits_that_make_no_sense_are_refused_and_none_lifts_them(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().concurrency(0)),
        Err(Error::Input(InputError::ZeroConcurrency))
    ));
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().rate(0, Duration::from_secs(1))),
        Err(Error::Input(InputError::BadRate { .. }))
    ));
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().rate(5, Duration::ZERO)),
        Err(Error::Input(InputError::BadRate { .. }))
    ));
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().rate(10_001, Duration::from_secs(1))),
        Err(Error::Input(InputError::BadRate { .. }))
    ));
    assert!(matches!(
        f.pause_queue(""),
        Err(Error::Input(InputError::EmptyQueueName))
    ));
    assert_eq!(
        f.queue_settings(Q).unwrap(),
        QueueSettings::default(),
        "nothing changed"
    );
    f.enqueue_n(3);
    f.set_queue_limits(Q, QueueLimits::none().concurrency(1))
        .unwrap();
    assert_eq!(f.claim_batch(Q, "w", lease(), 3).unwrap().len(), 1);
    f.set_queue_limits(Q, QueueLimits::none()).unwrap();
    assert_eq!(f.claim_batch(Q, "w", lease(), 3).unwrap().len(), 2);
}

fn a_snoozed_job_waits_out_its_delay_without_spending_budget(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    f.advance(Duration::from_secs(5));
    assert_eq!(
        f.snooze(&l, Duration::from_secs(30)).unwrap(),
        JobState::Queued
    );
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
    assert_eq!(
        job.run_at(),
        f.now().saturating_add(Duration::from_secs(30))
    );
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::Snoozed {
            delay: Duration::from_secs(30)
        })
    );
    assert_eq!(f.stats().unwrap().counters.snoozed, 1);
    assert!(
        f.snooze(&l, Duration::from_secs(1))
            .unwrap_err()
            .is_lease_lost()
    );
    f.advance(Duration::from_secs(29));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "not yet");
    f.advance(Duration::from_secs(1));
    // a budget of one is not spent by a snooze: the next attempt may still fail once
    let again = f.claim_one("w");
    assert_eq!(again.attempt.0, 2);
    assert_eq!(f.fail(&again, "boom").unwrap(), JobState::Dead);
}
