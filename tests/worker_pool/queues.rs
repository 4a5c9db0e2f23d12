use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::bounded;
use leasehold::{JobError, JobState, NewJob, Outcome, QueueLimits};

use crate::common::wait_until;
use crate::on_both::{Kind, Q};
use crate::pool;

crate::on_both::on_both!(
    a_handler_that_snoozes_its_job_runs_it_again_after_the_delay_without_spending_budget,
    a_failure_that_asks_to_be_retried_in_a_while_waits_that_long_and_spends_budget,
    pools_stop_claiming_a_paused_queue_and_take_it_up_again_when_it_resumes,
    a_concurrency_limit_holds_across_two_pools_at_every_moment,
);

fn a_handler_that_snoozes_its_job_runs_it_again_after_the_delay_without_spending_budget(
    kind: Kind,
) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "busy").max_attempts(1)).unwrap();
    let p = pool(&f, "w")
        .start(|ctx| match ctx.attempt().0 {
            1 => Err(JobError::snooze(Duration::from_secs(30))),
            _ => Ok(b"done".to_vec()),
        })
        .unwrap();
    wait_until("the snooze", || p.stats().snoozed == 1);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
    f.advance(Duration::from_secs(30));
    f.wake_all();
    wait_until("the second attempt", || p.stats().succeeded == 1);
    let outcomes: Vec<_> = f
        .history(id)
        .unwrap()
        .iter()
        .map(|r| r.outcome().cloned())
        .collect();
    assert_eq!(
        outcomes,
        vec![
            Some(Outcome::Snoozed {
                delay: Duration::from_secs(30)
            }),
            Some(Outcome::Succeeded)
        ]
    );
    p.shutdown(Duration::ZERO);
}

/// `JobError::retry_in(d)`: a failure (budget spent, `Failed` in the history) whose retry
/// waits `d`, not the store's backoff; the last of the budget makes the job dead as ever.
fn a_failure_that_asks_to_be_retried_in_a_while_waits_that_long_and_spends_budget(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "rate limited").max_attempts(2))
        .unwrap();
    let wait = Duration::from_secs(600);
    let p = pool(&f, "w")
        .start(move |_| Err::<Vec<u8>, _>(JobError::permanent("429").retry_in(wait)))
        .unwrap();
    wait_until("the first failure", || p.stats().failed == 1);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    let ended = f.history(id).unwrap()[0].ended_at().unwrap();
    assert_eq!(
        job.run_at(),
        ended.saturating_add(wait),
        "its own wait, not the backoff"
    );
    f.advance(wait);
    f.wake_all();
    wait_until("the second failure", || p.stats().failed == 2);
    wait_until("the job to be dead", || {
        f.job(id).unwrap().unwrap().state() == JobState::Dead
    });
    let failed = |o: Option<&Outcome>| matches!(o, Some(Outcome::Failed(m)) if m == "429");
    assert!(f.history(id).unwrap().iter().all(|r| failed(r.outcome())));
    p.shutdown(Duration::ZERO);
}

fn pools_stop_claiming_a_paused_queue_and_take_it_up_again_when_it_resumes(kind: Kind) {
    let f = kind.open();
    f.pause_queue(Q).unwrap();
    f.enqueue_n(3);
    let p = pool(&f, "w")
        .concurrency(2)
        .start(|_| Ok(Vec::new()))
        .unwrap();
    // the pool looks (it claims at start and whenever it wakes) and takes nothing
    wait_until("the pool to find nothing to claim", || {
        p.stats().idle_waits >= 2
    });
    assert_eq!(p.stats().claimed, 0);
    f.resume_queue(Q).unwrap();
    wait_until("the jobs to run", || p.stats().succeeded == 3);
    p.shutdown(Duration::ZERO);
}

/// Two pools of three workers each on a queue limited to two jobs at once: every handler
/// counts itself in and out, and the count never passes two.
fn a_concurrency_limit_holds_across_two_pools_at_every_moment(kind: Kind) {
    let f = kind.open();
    f.set_queue_limits(Q, QueueLimits::none().concurrency(2))
        .unwrap();
    f.enqueue_n(12);
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = bounded::<()>(0);
    let start = |name: &str| {
        let (now, most, release) = (now.clone(), most.clone(), release_rx.clone());
        pool(&f, name)
            .concurrency(3)
            .start(move |_| {
                let held = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(held, Ordering::SeqCst);
                let _ = release.recv_timeout(Duration::from_secs(30));
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(Vec::new())
            })
            .unwrap()
    };
    let (a, b) = (start("a"), start("b"));
    let done = || a.stats().succeeded + b.stats().succeeded;
    for finished in 1..=12u64 {
        wait_until("two handlers to hold jobs", || {
            now.load(Ordering::SeqCst) == 2 || done() + 2 > 12
        });
        release_tx.send(()).unwrap();
        wait_until("a job to finish", || done() >= finished);
    }
    assert_eq!(most.load(Ordering::SeqCst), 2);
    assert_eq!(f.stats().unwrap().total(JobState::Succeeded), 12);
    a.shutdown(Duration::ZERO);
    b.shutdown(Duration::ZERO);
}
