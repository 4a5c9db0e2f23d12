use std::time::Duration;

use leasehold::{ConfigError, Error, InputError, JobState, LeaseTerms, NewJob, Outcome, Renewal};

use crate::on_both::{Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    an_attempt_past_its_time_limit_is_ended_by_its_next_renewal_as_timed_out,
    the_claimers_limit_applies_to_a_job_without_one_and_a_jobs_own_limit_wins,
    a_holder_silent_past_its_deadline_loses_the_job_at_the_deadline_and_it_ends_timed_out,
    a_claims_takeover_past_the_deadline_ends_the_attempt_timed_out,
    an_end_written_at_or_after_the_deadline_is_refused_and_the_attempt_still_times_out,
    a_holder_that_reports_its_time_out_ends_the_attempt_and_a_late_one_is_fenced,
    a_zero_time_limit_is_refused_for_a_job_and_for_a_claim,
);

const LIMIT: Duration = Duration::from_secs(100);

fn an_attempt_past_its_time_limit_is_ended_by_its_next_renewal_as_timed_out(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "slow").time_limit(LIMIT)).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(l.deadline, Some(l.claimed_at.saturating_add(LIMIT)));
    f.advance(Duration::from_secs(50));
    // renewed from now, but never past the deadline
    assert_eq!(
        f.heartbeat(&l, 1).unwrap(),
        Renewal::Renewed {
            expires_at: l.claimed_at.saturating_add(LIMIT)
        }
    );
    f.advance(Duration::from_secs(50)); // at the deadline
    assert_eq!(f.heartbeat(&l, 2).unwrap(), Renewal::TimedOut);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit: LIMIT })
    );
    assert!(job.last_error().unwrap_or("").contains("timed out"));
    assert_eq!(f.stats().unwrap().counters.timed_out, 1);
    assert!(f.complete(&l, b"too late").unwrap_err().is_lease_lost());
    // the next attempt has a deadline of its own
    f.advance(Duration::from_secs(3600));
    let again = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(again.deadline, Some(again.claimed_at.saturating_add(LIMIT)));
    f.complete(&again, b"in time").unwrap();
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

fn the_claimers_limit_applies_to_a_job_without_one_and_a_jobs_own_limit_wins(kind: Kind) {
    let f = kind.open();
    let plain = f.enqueue(NewJob::new(Q, "plain")).unwrap();
    let own = f
        .enqueue(NewJob::new(Q, "own").time_limit(Duration::from_secs(5)))
        .unwrap();
    let terms = LeaseTerms::new(LEASE).time_limit(Duration::from_secs(20));
    let leases = f.claim_batch(Q, "w", terms, 2).unwrap();
    let deadline = |id| {
        let l = leases.iter().find(|l| l.job == id).unwrap();
        l.deadline.map(|d| d.saturating_since(l.claimed_at))
    };
    assert_eq!(deadline(plain), Some(Duration::from_secs(20)));
    assert_eq!(deadline(own), Some(Duration::from_secs(5)));
    let shown = f.job(own).unwrap().unwrap();
    assert_eq!(shown.time_limit(), Some(Duration::from_secs(5)));
    assert_eq!(
        shown.lease().and_then(|l| l.deadline()),
        leases.iter().find(|l| l.job == own).unwrap().deadline
    );
    // without a limit anywhere there is no deadline
    let free = f.enqueue(NewJob::new(Q, "free")).unwrap();
    let l = f.claim_job(free, "w", lease()).unwrap().unwrap();
    assert_eq!(l.deadline, None);
}

fn a_holder_silent_past_its_deadline_loses_the_job_at_the_deadline_and_it_ends_timed_out(
    kind: Kind,
) {
    let f = kind.open();
    let limit = Duration::from_secs(10);
    let id = f.enqueue(NewJob::new(Q, "x").time_limit(limit)).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap(); // a lease of 60 s
    assert_eq!(l.expires_at, l.claimed_at.saturating_add(limit));
    f.advance(limit);
    let report = f.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    // the attempt ran into its limit: timed out (a failure, retried after a backoff), not a
    // silent holder's expiry
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    assert_eq!(f.stats().unwrap().counters.timed_out, 1);
    assert!(f.heartbeat(&l, 0).unwrap_err().is_lease_lost());
}

fn a_claims_takeover_past_the_deadline_ends_the_attempt_timed_out(kind: Kind) {
    let f = kind.open();
    let limit = Duration::from_secs(10);
    let id = f.enqueue(NewJob::new(Q, "x").time_limit(limit)).unwrap();
    let first = f.claim(Q, "w1", lease()).unwrap().unwrap();
    f.advance(limit);
    // a retry waits out its backoff: the takeover ends the attempt, and the job is not yet
    // claimable again
    assert!(f.claim(Q, "w2", lease()).unwrap().is_none());
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::RetryWait);
    assert!(f.complete(&first, b"late").unwrap_err().is_lease_lost());
}

fn an_end_written_at_or_after_the_deadline_is_refused_and_the_attempt_still_times_out(kind: Kind) {
    let f = kind.open();
    let limit = Duration::from_secs(10);
    let id = f.enqueue(NewJob::new(Q, "x").time_limit(limit)).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    f.advance(limit);
    for refused in [
        f.complete(&l, b"too late").map(|()| JobState::Succeeded),
        f.complete_batch(&[(&l, b"too late".as_slice())])
            .remove(0)
            .map(|()| JobState::Succeeded),
        f.fail(&l, "too late"),
        f.snooze(&l, Duration::from_secs(1)),
        f.release(&l).map(|()| JobState::Queued),
    ] {
        let lost = refused.unwrap_err().lease_lost().cloned().unwrap();
        // found still running at this attempt: the attempt is not the holder's to end
        assert_eq!(lost.found, Some((l.attempt, JobState::Running)));
        assert!(!lost.ended_by_holder);
    }
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Running);
    assert!(f.output(id).unwrap().is_none());
    assert_eq!(f.stats().unwrap().counters.fenced_writes_rejected, 5);
    // the one end its deadline allows
    assert_eq!(f.time_out(&l).unwrap(), JobState::RetryWait);
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
}

fn a_holder_that_reports_its_time_out_ends_the_attempt_and_a_late_one_is_fenced(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "x").time_limit(LIMIT).max_attempts(1))
        .unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    f.advance(LIMIT);
    // the budget of one is spent: dead
    assert_eq!(f.time_out(&l).unwrap(), JobState::Dead);
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit: LIMIT })
    );
    assert!(f.time_out(&l).unwrap_err().is_lease_lost());
    assert_eq!(f.stats().unwrap().counters.timed_out, 1);
}

fn a_zero_time_limit_is_refused_for_a_job_and_for_a_claim(kind: Kind) {
    let f = kind.open();
    assert!(matches!(
        f.enqueue(NewJob::new(Q, "x").time_limit(Duration::ZERO)),
        Err(Error::Input(InputError::ZeroTimeLimit))
    ));
    f.enqueue_n(1);
    let zero = LeaseTerms::new(LEASE).time_limit(Duration::ZERO);
    assert!(matches!(
        f.claim(Q, "w", zero),
        Err(Error::Config(ConfigError::ZeroTimeLimit))
    ));
    assert_eq!(
        f.stats().unwrap().total(JobState::Queued),
        1,
        "nothing changed"
    );
}
