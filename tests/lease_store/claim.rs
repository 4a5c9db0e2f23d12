use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use leasehold::{Attempt, JobState, NewJob, Outcome, ReclaimPath};

use crate::on_both::{Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    only_one_of_many_racing_claimers_wins_a_job,
    racing_claimers_take_every_job_exactly_once,
    lower_priority_number_runs_first_and_fifo_within_a_priority,
    the_claim_order_is_priority_then_run_time_then_id,
    delayed_job_is_invisible_until_due_even_to_claim_job,
    a_delayed_urgent_job_does_not_hide_due_jobs_of_lower_urgency,
    queues_are_separate,
    expired_lease_is_taken_over_at_claim_with_a_history_record,
    claim_job_takes_over_an_expired_lease,
    claim_carries_the_payload_and_fencing_token,
    claim_batch_takes_the_most_urgent_jobs_in_one_commit,
    complete_and_claim_commits_the_result_and_takes_the_next_job_in_one_commit,
    complete_and_claim_with_a_lost_lease_claims_nothing,
    expired_leases_are_taken_over_in_the_order_they_really_expired,
    complete_and_claim_with_bad_lease_terms_is_refused_and_writes_nothing,
);

fn only_one_of_many_racing_claimers_wins_a_job(kind: Kind) {
    let f = kind.open();
    for round in 0..20 {
        let id = f.enqueue(NewJob::new(Q, format!("r{round}"))).unwrap();
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let winners: Vec<leasehold::Lease> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let store = f.handle();
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        // half race on the named job, half on the queue
                        if t % 2 == 0 {
                            store.claim_job(id, &format!("w{t}"), lease()).unwrap()
                        } else {
                            store.claim(Q, &format!("w{t}"), lease()).unwrap()
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        let job = f.job(id).unwrap().unwrap();
        assert_eq!(job.state(), JobState::Running);
        assert_eq!(job.attempt(), Attempt(1));
        assert_eq!(job.lease().unwrap().owner(), winners[0].worker);
        assert!(f.claim_job(id, "late", lease()).unwrap().is_none());
        f.complete(&winners[0], b"").unwrap();
    }
}

fn racing_claimers_take_every_job_exactly_once(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(400);
    let taken: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let store = f.handle();
                s.spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(l) = store.claim(Q, &format!("w{t}"), lease()).unwrap() {
                        mine.push(l.job.0);
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<u64> = taken.into_iter().flatten().collect();
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(all.len(), ids.len(), "no job claimed twice");
    assert_eq!(distinct.len(), ids.len(), "every job claimed");
}

fn lower_priority_number_runs_first_and_fifo_within_a_priority(kind: Kind) {
    let f = kind.open();
    let low1 = f.enqueue(NewJob::new(Q, "low1").priority(5)).unwrap();
    f.advance(Duration::from_millis(1));
    let high1 = f.enqueue(NewJob::new(Q, "high1").priority(-3)).unwrap();
    f.advance(Duration::from_millis(1));
    let low2 = f.enqueue(NewJob::new(Q, "low2").priority(5)).unwrap();
    f.advance(Duration::from_millis(1));
    let high2 = f.enqueue(NewJob::new(Q, "high2").priority(-3)).unwrap();
    let order: Vec<_> = (0..4).map(|_| f.claim_one("w").job).collect();
    assert_eq!(order, vec![high1, high2, low1, low2]);
}

/// The claim order (the rule book's `claim_order`, each engine's ready index and SQL): the
/// lowest priority number, then the earliest run time, then the oldest id, where a job
/// enqueued first is due later than one enqueued after it.
fn the_claim_order_is_priority_then_run_time_then_id(kind: Kind) {
    let f = kind.open();
    let later = Duration::from_secs(10);
    let first_due_last = f
        .enqueue(NewJob::new(Q, "a").priority(1).delay(later))
        .unwrap();
    let due_now = f.enqueue(NewJob::new(Q, "b").priority(1)).unwrap();
    let soon = Duration::from_secs(5);
    let urgent_due_soon = f
        .enqueue(NewJob::new(Q, "c").priority(0).delay(soon))
        .unwrap();
    let due_now_too = f.enqueue(NewJob::new(Q, "d").priority(1)).unwrap();
    f.advance(later);
    let order: Vec<_> = (0..4).map(|_| f.claim_one("w").job).collect();
    assert_eq!(
        order,
        vec![urgent_due_soon, due_now, due_now_too, first_due_last]
    );
}

fn delayed_job_is_invisible_until_due_even_to_claim_job(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "later").delay(Duration::from_secs(30)))
        .unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert!(f.claim_job(id, "w", lease()).unwrap().is_none());
    f.advance(Duration::from_secs(29));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.advance(Duration::from_secs(1));
    assert_eq!(f.claim_one("w").job, id);
}

fn a_delayed_urgent_job_does_not_hide_due_jobs_of_lower_urgency(kind: Kind) {
    let f = kind.open();
    f.enqueue(
        NewJob::new(Q, "urgent later")
            .priority(-10)
            .delay(Duration::from_secs(60)),
    )
    .unwrap();
    let now = f.enqueue(NewJob::new(Q, "normal now")).unwrap();
    assert_eq!(f.claim_one("w").job, now);
}

fn queues_are_separate(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new("other", "x")).unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert!(f.claim("other", "w", lease()).unwrap().is_some());
}

fn expired_lease_is_taken_over_at_claim_with_a_history_record(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let first = f.claim_one("dead-worker");
    f.advance(LEASE - Duration::from_secs(1));
    assert!(
        f.claim(Q, "w2", lease()).unwrap().is_none(),
        "lease still live"
    );
    f.advance(Duration::from_secs(4));
    let second = f.claim_one("w2");
    assert_eq!(second.job, id);
    assert_eq!(second.attempt, Attempt(2));
    let history = f.history(id).unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].worker(), "dead-worker");
    assert_eq!(
        history[0].outcome(),
        Some(&Outcome::LeaseExpired {
            path: ReclaimPath::Takeover,
            overdue: Duration::from_secs(3)
        })
    );
    assert_eq!(history[1].outcome(), None);
    assert!(f.heartbeat(&first, 1).unwrap_err().is_lease_lost());
    assert_eq!(f.stats().unwrap().counters.reclaimed_by_takeover, 1);
}

fn claim_job_takes_over_an_expired_lease(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    f.claim_one("a");
    f.advance(LEASE);
    let l = f
        .claim_job(id, "b", lease())
        .unwrap()
        .expect("expired lease is claimable");
    assert_eq!(l.attempt, Attempt(2));
}

fn claim_carries_the_payload_and_fencing_token(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, b"\x00\xffbytes".to_vec()))
        .unwrap();
    let l = f.claim_one("w");
    assert_eq!(l.job, id);
    assert_eq!(l.payload, b"\x00\xffbytes");
    assert_eq!(l.attempt, Attempt(1));
    assert_eq!(l.expires_at, f.now().saturating_add(LEASE));
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(job.lease().unwrap().owner(), "w");
}

fn claim_batch_takes_the_most_urgent_jobs_in_one_commit(kind: Kind) {
    let f = kind.open();
    let low = f.enqueue(NewJob::new(Q, "low").priority(9)).unwrap();
    let ids = f.enqueue_n(5);
    let writes = f.write_transactions();
    let leases = f.claim_batch(Q, "w", lease(), 4).unwrap();
    assert_eq!(f.write_transactions(), writes.map(|w| w + 1));
    let got: Vec<_> = leases.iter().map(|l| l.job).collect();
    assert_eq!(got, ids[..4].to_vec());
    let rest = f.claim_batch(Q, "w", lease(), 10).unwrap();
    assert_eq!(
        rest.iter().map(|l| l.job).collect::<Vec<_>>(),
        vec![ids[4], low]
    );
    assert!(f.claim_batch(Q, "w", lease(), 10).unwrap().is_empty());
}

fn complete_and_claim_commits_the_result_and_takes_the_next_job_in_one_commit(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let first = f.claim_one("w");
    let writes = f.write_transactions();
    let next = f
        .complete_and_claim(&first, b"one", lease())
        .unwrap()
        .expect("the second job");
    assert_eq!(f.write_transactions(), writes.map(|w| w + 1));
    assert_eq!((next.job, next.worker.as_str()), (ids[1], "w"));
    assert_eq!(f.job(ids[0]).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(f.output(ids[0]).unwrap().unwrap(), b"one");
    // Nothing left to claim: the completion still commits.
    assert!(
        f.complete_and_claim(&next, b"two", lease())
            .unwrap()
            .is_none()
    );
    assert_eq!(f.job(ids[1]).unwrap().unwrap().state(), JobState::Succeeded);
}

fn complete_and_claim_with_a_lost_lease_claims_nothing(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let stale = f.claim_one("w");
    f.advance(LEASE);
    let taken = f
        .claim_job(ids[0], "other", lease())
        .unwrap()
        .expect("takeover");
    let err = f.complete_and_claim(&stale, b"late", lease()).unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(
        f.job(ids[1]).unwrap().unwrap().state(),
        JobState::Queued,
        "not claimed"
    );
    assert_eq!(f.job(ids[0]).unwrap().unwrap().attempt(), taken.attempt);
    assert!(f.output(ids[0]).unwrap().is_none());
}

fn expired_leases_are_taken_over_in_the_order_they_really_expired(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let renewed = f.claim_one("a"); // expires at LEASE...
    f.advance(LEASE / 4);
    let first_to_lapse = f.claim_one("b"); // ...this one at 1.25 LEASE
    f.advance(LEASE / 4);
    f.heartbeat(&renewed, 1).unwrap(); // now at 1.5 LEASE, its index entry still at LEASE
    f.advance(LEASE * 2);
    let taken = f.claim_one("c");
    assert_eq!((taken.job, first_to_lapse.job), (ids[1], ids[1]));
    assert_eq!(f.claim_one("c").job, renewed.job);
}

fn complete_and_claim_with_bad_lease_terms_is_refused_and_writes_nothing(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let held = f.claim_one("w");
    let writes = f.write_transactions();
    let err = f
        .complete_and_claim(&held, b"done", leasehold::LeaseTerms::new(Duration::ZERO))
        .unwrap_err();
    assert!(matches!(err, leasehold::Error::Config(_)), "{err:?}");
    assert_eq!(f.write_transactions(), writes, "no commit at all");
    assert_eq!(f.job(ids[0]).unwrap().unwrap().state(), JobState::Running);
    assert_eq!(f.job(ids[1]).unwrap().unwrap().state(), JobState::Queued);
}
