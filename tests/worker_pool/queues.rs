use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::bounded;
use leasehold::{JobError, JobState, NewJob, Outcome, QueueLimits, Queues};

use crate::common::wait_until;
use crate::on_both::{Kind, Q};
use crate::pool;

crate::on_both::on_both!(
    a_handler_that_snoozes_its_job_runs_it_again_after_the_delay_without_spending_budget,
    a_failure_that_asks_to_be_retried_in_a_while_waits_that_long_and_spends_budget,
    pools_stop_claiming_a_paused_queue_and_take_it_up_again_when_it_resumes,
    a_concurrency_limit_holds_across_two_pools_at_every_moment,
    one_pool_over_weighted_queues_takes_each_by_its_weight_then_what_is_left,
    a_paused_queues_share_goes_to_the_other_queues_of_the_pool,
    strict_queues_take_a_later_queue_only_when_the_earlier_have_none,
    a_pools_queues_are_checked_before_it_starts,
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
    f.declare_queue(Q).unwrap();
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
    f.declare_queue(Q).unwrap();
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

/// The queue of each job a pool's handler started, in order.
fn recording(
    log: &Arc<parking_lot::Mutex<Vec<String>>>,
) -> impl Fn(&leasehold::JobContext) -> Result<Vec<u8>, JobError> + Send + Sync + 'static {
    let log = log.clone();
    move |ctx| {
        log.lock().push(ctx.queue().to_owned());
        Ok(Vec::new())
    }
}

fn one_pool_over_weighted_queues_takes_each_by_its_weight_then_what_is_left(kind: Kind) {
    let f = kind.open();
    for _ in 0..40 {
        f.enqueue(NewJob::new("heavy", "h")).unwrap();
        f.enqueue(NewJob::new("light", "l")).unwrap();
    }
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    // one job a round: the weights share the rounds, not only each round
    let p = crate::settings(f.pool(Queues::weighted([("heavy", 3), ("light", 1)])), "w")
        .prefetch(0)
        .start(recording(&log))
        .unwrap();
    wait_until("every job to run", || p.stats().succeeded == 80);
    let log = log.lock().clone();
    let heavy = log[..20].iter().filter(|q| *q == "heavy").count();
    assert!((14..=16).contains(&heavy), "3:1 of the first 20: {log:?}");
    // once heavy is drained, light has every round
    let last_heavy = log.iter().rposition(|q| q == "heavy").unwrap();
    assert!(last_heavy < 60, "{log:?}");
    let stats = p.stats();
    for queue in ["heavy", "light"] {
        let tally = stats.queues[queue];
        assert_eq!((tally.claimed, tally.succeeded), (40, 40), "{queue}");
    }
    p.shutdown(Duration::ZERO);
}

fn a_paused_queues_share_goes_to_the_other_queues_of_the_pool(kind: Kind) {
    let f = kind.open();
    f.declare_queue("a").unwrap();
    f.pause_queue("a").unwrap();
    for _ in 0..10 {
        f.enqueue(NewJob::new("a", "x")).unwrap();
        f.enqueue(NewJob::new("b", "x")).unwrap();
    }
    let p = crate::settings(f.pool(Queues::weighted([("a", 5), ("b", 1)])), "w")
        .concurrency(2)
        .start(|_| Ok(Vec::new()))
        .unwrap();
    wait_until("b's jobs to run", || p.stats().queues["b"].succeeded == 10);
    assert_eq!(p.stats().queues["a"].claimed, 0);
    assert_eq!(f.stats().unwrap().queues["a"].get(JobState::Queued), 10);
    f.resume_queue("a").unwrap();
    wait_until("a's jobs to run once resumed", || {
        p.stats().queues["a"].succeeded == 10
    });
    assert!(p.wait_idle(Duration::from_secs(30)).unwrap());
    p.shutdown(Duration::ZERO);
}

fn strict_queues_take_a_later_queue_only_when_the_earlier_have_none(kind: Kind) {
    let f = kind.open();
    for _ in 0..5 {
        f.enqueue(NewJob::new("normal", "n")).unwrap();
    }
    for _ in 0..5 {
        f.enqueue(NewJob::new("urgent", "u")).unwrap();
    }
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (gate_tx, gate_rx) = bounded::<()>(0);
    let record = recording(&log);
    let p = crate::settings(f.pool(Queues::strict(["urgent", "normal"])), "w")
        .prefetch(0)
        .start(move |ctx| {
            let out = record(ctx);
            if ctx.queue() == "normal" {
                let _ = gate_rx.recv_timeout(Duration::from_secs(30));
            }
            out
        })
        .unwrap();
    // urgent first, though enqueued last; then a normal one, held at the gate
    wait_until("the first normal job to start", || {
        p.stats().queues["normal"].claimed == 1
    });
    // an urgent job that comes now is the next one taken
    f.enqueue(NewJob::new("urgent", "u")).unwrap();
    gate_tx.send(()).unwrap();
    wait_until("the late urgent job", || {
        p.stats().queues["urgent"].succeeded == 6
    });
    for _ in 0..4 {
        gate_tx.send(()).unwrap();
    }
    wait_until("every job", || p.stats().succeeded == 11);
    let log = log.lock().clone();
    let firsts: Vec<&str> = log.iter().map(String::as_str).collect();
    assert_eq!(firsts[..5], ["urgent"; 5], "{log:?}");
    assert_eq!(firsts[5..7], ["normal", "urgent"], "{log:?}");
    assert_eq!(firsts[7..], ["normal"; 4], "{log:?}");
    p.shutdown(Duration::ZERO);
}

fn a_pools_queues_are_checked_before_it_starts(kind: Kind) {
    let f = kind.open();
    for (queues, why) in [
        (Queues::weighted([("a", 1), ("a", 2)]), "named twice"),
        (Queues::weighted([("a", 0)]), "weight"),
        (Queues::strict(Vec::<String>::new()), "1 to 64"),
    ] {
        let refused = f.pool(queues).start(|_| Ok(Vec::new()));
        match refused {
            Err(leasehold::Error::Config(e)) => assert!(e.to_string().contains(why), "{e}"),
            other => panic!("{why}: {:?}", other.map(|_| ())),
        }
    }
    assert!(matches!(
        f.pool(Queues::strict(["ok", ""])).start(|_| Ok(Vec::new())),
        Err(leasehold::Error::Input(_))
    ));
}
