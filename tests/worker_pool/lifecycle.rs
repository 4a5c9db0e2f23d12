use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::bounded;
use leasehold::{JobState, NewJob, Outcome, ReclaimPath};
use leasehold::{JobStore, ReadJobs};

use crate::common::wait_until;
use crate::on_both::{Kind, LEASE, Q};
use crate::{pool, until_interrupted};

crate::on_both::on_both!(
    a_pool_runs_every_job_once_and_commits_its_output,
    an_enqueue_wakes_an_idle_pool,
    an_abandoned_pools_jobs_are_all_completed_by_a_surviving_pool,
    graceful_shutdown_releases_and_another_pool_starts_without_waiting_for_expiry,
    shutdown_lets_in_flight_jobs_finish_within_the_grace_period,
    dropping_a_pool_shuts_it_down_and_joins_its_threads,
    bad_pool_settings_are_refused,
    jobs_claimed_ahead_are_held_under_renewed_leases_and_released_unrun_at_shutdown,
    a_pool_claims_ahead_only_once_its_jobs_prove_shorter_than_a_commit_and_never_past_its_window,
    many_workers_commit_every_job_exactly_once_through_shared_commits,
    wait_idle_returns_once_every_job_of_the_queue_has_ended,
    on_a_drained_queue_completions_wait_out_the_batch_delay_for_company_and_no_longer,
    a_pool_counts_how_long_each_queues_jobs_waited_since_due_and_ran,
);

fn a_pool_runs_every_job_once_and_commits_its_output(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(50);
    let p = pool(&f, "a")
        .concurrency(4)
        .start(|ctx| Ok(format!("done {}", ctx.job())))
        .unwrap();
    wait_until("all jobs to succeed", || p.stats().succeeded == 50);
    for id in ids {
        assert_eq!(
            f.output(id).unwrap().unwrap(),
            format!("done {id}").into_bytes()
        );
        assert_eq!(f.history(id).unwrap().len(), 1, "ran once");
    }
}

fn an_enqueue_wakes_an_idle_pool(kind: Kind) {
    let f = kind.open();
    // Idle dispatchers look again only every 10 minutes of real time on their own, and
    // the manual clock never moves: only the enqueue's wake-up can start this job.
    let p = f
        .pool(Q.into())
        .lease(Duration::from_secs(3600))
        .heartbeat_every(Duration::from_secs(600))
        .start(|_| Ok(()))
        .unwrap();
    wait_until("the dispatcher to go idle", || p.stats().idle_waits >= 1);
    let id = f.enqueue(NewJob::new(Q, "wake up")).unwrap();
    wait_until("the job to succeed", || {
        f.job(id).unwrap().unwrap().state() == JobState::Succeeded
    });
    drop(p);
}

fn an_abandoned_pools_jobs_are_all_completed_by_a_surviving_pool(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(12);
    let dying = pool(&f, "dying")
        .concurrency(4)
        .start(until_interrupted)
        .unwrap();
    wait_until("the dying pool to hold 4 jobs", || {
        dying.stats().in_flight == 4
    });
    dying.abandon();
    assert_eq!(
        f.stats().unwrap().total(JobState::Running),
        4,
        "nothing released"
    );

    f.advance(LEASE);
    let report = f.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 4);

    let survivor = pool(&f, "survivor")
        .concurrency(3)
        .start(|_| Ok(b"ok".to_vec()))
        .unwrap();
    wait_until("every job to succeed", || {
        f.stats().unwrap().total(JobState::Succeeded) == 12
    });
    let mut reclaimed = 0;
    for id in ids {
        let history = f.history(id).unwrap();
        let last = history.last().unwrap();
        assert_eq!(
            (last.worker(), last.outcome()),
            ("survivor", Some(&Outcome::Succeeded))
        );
        if history.len() == 2 {
            reclaimed += 1;
            assert_eq!(history[0].worker(), "dying");
            assert!(matches!(
                history[0].outcome(),
                Some(&Outcome::LeaseExpired {
                    path: ReclaimPath::Reaper,
                    ..
                })
            ));
        }
    }
    assert_eq!(reclaimed, 4);
    assert_eq!(
        dying.stats().succeeded + dying.stats().rejected_writes,
        0,
        "the dead pool wrote nothing"
    );
    drop(survivor);
}

fn graceful_shutdown_releases_and_another_pool_starts_without_waiting_for_expiry(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (started_tx, started_rx) = bounded::<()>(1);
    let first = pool(&f, "first")
        .start(move |ctx| {
            let _ = started_tx.send(());
            until_interrupted(ctx)
        })
        .unwrap();
    // Its handler running, not merely claimed: an unstarted job is given back by its worker,
    // not by the shutdown's release (a loaded machine can leave it unstarted a while).
    started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let report = first.shutdown(Duration::from_millis(20));
    assert_eq!(
        (report.in_flight, report.released, report.stuck_handlers),
        (1, 1, 0)
    );
    assert_eq!(
        first.shutdown(Duration::ZERO),
        Default::default(),
        "idempotent"
    );
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::Released)
    );

    // the store clock has not moved: the job is claimable only because it was released
    let second = pool(&f, "second")
        .start(|_| Ok(b"second".to_vec()))
        .unwrap();
    wait_until("the second pool to finish it", || {
        f.job(id).unwrap().unwrap().state() == JobState::Succeeded
    });
    assert_eq!(f.output(id).unwrap().unwrap(), b"second");
    drop(second);
}

fn shutdown_lets_in_flight_jobs_finish_within_the_grace_period(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (gate_tx, gate_rx) = bounded::<()>(0);
    let (started_tx, started_rx) = bounded::<()>(1);
    let p = pool(&f, "w")
        .start(move |_| {
            let _ = started_tx.send(());
            gate_rx.recv().unwrap();
            Ok(b"finished".to_vec())
        })
        .unwrap();
    // The handler itself must be running: a job only claimed (in flight, not yet started by
    // a worker, as a loaded machine leaves it a while) is given back by the shutdown instead.
    started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    // Open the gate only once the shutdown has begun, which wakes the store's waiters (and
    // nothing else here bumps the queue's generation: no enqueue, no release).
    let generation = f.work_generation(Q);
    let store = f.handle();
    let opener = std::thread::spawn(move || {
        wait_until("the shutdown to begin", || {
            store.work_generation(Q) != generation
        });
        gate_tx.send(()).unwrap()
    });
    let report = p.shutdown(Duration::from_secs(30));
    opener.join().unwrap();
    // The handler was still blocked when the shutdown began; whether it finished before the
    // shutdown counted its flights (after joining the dispatcher) is a race, so in_flight may
    // be 0 or 1. What matters: nothing was released, and the result was committed.
    assert!(report.in_flight <= 1);
    assert_eq!(report.released, 0);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

fn dropping_a_pool_shuts_it_down_and_joins_its_threads(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let p = pool(&f, "w")
        .concurrency(2)
        .shutdown_grace(Duration::from_millis(10))
        .start(move |ctx| {
            s.fetch_add(1, Ordering::SeqCst);
            until_interrupted(ctx)
        })
        .unwrap();
    wait_until("both jobs to start", || started.load(Ordering::SeqCst) == 2);
    drop(p);
    let stats = f.stats().unwrap();
    assert_eq!(stats.total(JobState::Queued), 2, "released, not failed");
    assert_eq!(stats.counters.released, 2);
}

fn bad_pool_settings_are_refused(kind: Kind) {
    let f = kind.open();
    let err = |b: leasehold::PoolBuilder| b.start(|_| Ok(())).err().unwrap();
    assert!(matches!(
        err(pool(&f, "w").concurrency(0)),
        leasehold::Error::Config(leasehold::ConfigError::ZeroConcurrency)
    ));
    assert!(matches!(
        err(pool(&f, "w").heartbeat_every(LEASE)),
        leasehold::Error::Config(leasehold::ConfigError::HeartbeatNotShorterThanLease { .. })
    ));
    assert!(matches!(
        err(f.pool("".into())),
        leasehold::Error::Input(leasehold::InputError::EmptyQueueName)
    ));
    assert!(matches!(
        err(pool(&f, "w").window(0)),
        leasehold::Error::Config(leasehold::ConfigError::ZeroWindow)
    ));
    assert!(matches!(
        err(pool(&f, "w").max_batch(0)),
        leasehold::Error::Config(leasehold::ConfigError::ZeroMaxBatch)
    ));
    // (the pool's heartbeat is a few milliseconds here)
    assert!(matches!(
        err(pool(&f, "w").batch_delay(Duration::from_secs(1))),
        leasehold::Error::Config(leasehold::ConfigError::BatchDelayNotShorterThanHeartbeat { .. })
    ));
    assert!(matches!(
        err(pool(&f, "w")
            .heartbeat_every(Duration::from_secs(1))
            .batch_delay(LEASE * 2)),
        leasehold::Error::Config(leasehold::ConfigError::BatchDelayNotShorterThanHeartbeat { .. })
    ));
}

#[test]
fn a_delayed_job_is_picked_up_when_due_not_at_the_next_poll() {
    // The host clock here: the job falls due 200 ms after enqueue. The idle dispatcher's
    // longest sleep is its heartbeat interval, 10 minutes; only waking at the job's due time
    // (next_due) can run it within the 30 s the wait allows.
    let dir = tempfile::tempdir().unwrap();
    let store = leasehold::Store::open(dir.path().join("real-clock.redb")).unwrap();
    let p = leasehold::WorkerPool::builder(store.clone(), Q)
        .lease(Duration::from_secs(3600))
        .heartbeat_every(Duration::from_secs(600))
        .start(|_| Ok(()))
        .unwrap();
    let id = store
        .enqueue(NewJob::new(Q, "later").delay(Duration::from_millis(200)))
        .unwrap();
    wait_until("the delayed job to run", || {
        store.job(id).unwrap().unwrap().state() == JobState::Succeeded
    });
    drop(p);
}

fn jobs_claimed_ahead_are_held_under_renewed_leases_and_released_unrun_at_shutdown(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(4);
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let p = pool(&f, "w")
        .prefetch(3)
        .start(move |ctx| {
            s.fetch_add(1, Ordering::SeqCst);
            until_interrupted(ctx)
        })
        .unwrap();
    // (The one handler may start a while after its job is claimed on a loaded machine.)
    wait_until("one job running and three claimed ahead", || {
        p.stats().in_flight == 4 && started.load(Ordering::SeqCst) == 1
    });
    assert_eq!(f.stats().unwrap().total(JobState::Running), 4);

    // Claimed-ahead jobs are renewed like running ones: none lapses while it waits, over a
    // whole lease of store time. The clock moves in steps shorter than the pool's health
    // limit (half a lease): a single jump past it looks to the pool like a heartbeat that
    // stalled that long, and a pool that cannot renew rightly gives back what it has not
    // started, if it checks before its next renewal lands.
    for _ in 0..3 {
        f.advance(LEASE / 3);
        let now = f.now();
        // The manual clock stands still between steps: a lease expiring a whole lease after
        // `now` was renewed after this step.
        wait_until("every lease to be renewed after the clock moved", || {
            ids.iter().all(|&id| {
                let job = f.job(id).unwrap().unwrap();
                job.lease()
                    .is_some_and(|l| l.expires_at() >= now.saturating_add(LEASE))
            })
        });
    }
    assert_eq!(p.stats().shed, 0, "renewals kept up: nothing was shed");

    let report = p.shutdown(Duration::ZERO);
    assert_eq!(report.in_flight, 4);
    // Released by the shutdown or, for one its release had not reached yet, by the worker
    // that found it unstarted (with no grace that worker may still be at it on return).
    wait_until("every job to be released", || p.stats().released == 4);
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "nothing claimed ahead ran"
    );
    for id in ids {
        let job = f.job(id).unwrap().unwrap();
        assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
        assert_eq!(
            f.history(id).unwrap()[0].outcome(),
            Some(&Outcome::Released)
        );
    }
}

fn a_pool_claims_ahead_only_once_its_jobs_prove_shorter_than_a_commit_and_never_past_its_window(
    kind: Kind,
) {
    // Jobs that block from the start: nothing is known about their length, so nothing is
    // claimed ahead of the four workers.
    let f = kind.clone().open();
    f.enqueue_n(10);
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let p = pool(&f, "w")
        .concurrency(4)
        .start(move |ctx| {
            s.fetch_add(1, Ordering::SeqCst);
            until_interrupted(ctx)
        })
        .unwrap();
    wait_until("four jobs running", || started.load(Ordering::SeqCst) == 4);
    assert_eq!((p.stats().in_flight, p.stats().claimed_ahead), (4, 0));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 6);
    p.shutdown(Duration::ZERO);

    // Eight instant jobs, then blocking ones: once jobs are known to take less than a
    // commit, jobs are claimed ahead to wait for the workers, never more than the window
    // (how many exactly depends on measured times, which a loaded machine may stretch).
    let f = kind.open();
    f.enqueue_n(100);
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let p = pool(&f, "w")
        .concurrency(4)
        .window(20)
        .start(move |ctx| {
            if s.fetch_add(1, Ordering::SeqCst) < 8 {
                return Ok(Vec::new());
            }
            until_interrupted(ctx)
        })
        .unwrap();
    // Once every worker is blocked and the last claim round has been handed out, nothing
    // more is claimed and the figures hold still.
    wait_until(
        "four running and some claimed ahead, all handed out",
        || {
            let stats = p.stats();
            started.load(Ordering::SeqCst) == 12
                && stats.claimed_ahead > 0
                && stats.in_flight == 4 + stats.claimed_ahead
                && f.stats().unwrap().total(JobState::Running) == stats.in_flight
        },
    );
    let stats = p.stats();
    assert!(stats.claimed_ahead <= 20, "the window at most: {stats:?}");
    let held = stats.in_flight;
    let report = p.shutdown(Duration::ZERO);
    // A claim round may still land between that look and the shutdown (a loaded machine
    // stretches the measured times): never fewer, never past the window.
    let at_shutdown = report.in_flight as u64;
    assert!(
        (held..=4 + 20).contains(&at_shutdown),
        "{at_shutdown} in flight at shutdown, {held} before"
    );
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 100 - 8);
    assert_eq!(
        started.load(Ordering::SeqCst),
        12,
        "nothing claimed ahead ran"
    );
}

fn many_workers_commit_every_job_exactly_once_through_shared_commits(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(300);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let writes_before = f.write_transactions();
    // Heartbeats would add commits of their own: none ticks during this test.
    let p = pool(&f, "w")
        .lease(Duration::from_secs(3600))
        .heartbeat_every(Duration::from_secs(600))
        .concurrency(8)
        .prefetch(8)
        .start(move |ctx| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(format!("done {}", ctx.job()))
        })
        .unwrap();
    wait_until("all jobs to succeed", || {
        f.stats().unwrap().total(JobState::Succeeded) == 300
    });
    drop(p);
    assert_eq!(runs.load(Ordering::SeqCst), 300);
    for id in ids {
        assert_eq!(
            f.output(id).unwrap().unwrap(),
            format!("done {id}").into_bytes()
        );
        assert_eq!(f.history(id).unwrap().len(), 1, "ran once");
    }
    // At most one commit per job: every completion shares its commit with a claim (and,
    // under load, with other completions), where claiming and completing apart would take
    // one commit per job for the completions plus the claims' own.
    if let (Some(before), Some(after)) = (writes_before, f.write_transactions()) {
        let writes = after - before;
        assert!(writes <= 300, "{writes} commits for 300 jobs");
    }
}

fn wait_idle_returns_once_every_job_of_the_queue_has_ended(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(20);
    let later = f
        .enqueue(NewJob::new(Q, "later").delay(Duration::from_secs(10)))
        .unwrap();
    let p = pool(&f, "w").concurrency(4).start(|_| Ok(())).unwrap();
    wait_until("the due jobs to succeed", || p.stats().succeeded == 20);
    // the delayed job still waits (store time stands still here): not drained
    assert!(!p.wait_idle(Duration::from_millis(50)).unwrap());
    f.advance(Duration::from_secs(10));
    f.wake_all();
    assert!(p.wait_idle(Duration::from_secs(30)).unwrap());
    assert_eq!(f.job(later).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(f.stats().unwrap().total(JobState::Succeeded), 21);
}

fn on_a_drained_queue_completions_wait_out_the_batch_delay_for_company_and_no_longer(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
    let returned = Arc::new(AtomicUsize::new(0));
    let r = returned.clone();
    // A delay far longer than any stall between two lines of this test, and a batch of two.
    let p = pool(&f, "w")
        .concurrency(3)
        .heartbeat_every(Duration::from_secs(30))
        .batch_delay(Duration::from_secs(10))
        .max_batch(2)
        .start(move |_| {
            go_rx.recv().unwrap();
            r.fetch_add(1, Ordering::SeqCst);
            Ok(b"done".to_vec())
        })
        .unwrap();
    // Both jobs run, and the third worker's claim has found the queue drained.
    wait_until("both jobs running and the queue found empty", || {
        crate::started(&p, 2) && p.stats().idle_waits > 0
    });
    go_tx.send(()).unwrap();
    wait_until("the first handler to return", || {
        returned.load(Ordering::SeqCst) == 1
    });
    // With no claim worth making, its completion waits for company rather than commit alone.
    let stats = p.stats();
    assert_eq!(
        (stats.succeeded, stats.completion_commits),
        (0, 0),
        "committed alone"
    );
    go_tx.send(()).unwrap();
    // The second fills the batch: both commit at once, together.
    wait_until("both to commit", || p.stats().succeeded == 2);
    assert_eq!(p.stats().completion_commits, 1, "they shared one commit");
    drop(p);

    // Alone, a completion commits once the delay has passed: it never waits for company
    // that does not come.
    let id = f.enqueue(NewJob::new(Q, "alone")).unwrap();
    let p = pool(&f, "w")
        .concurrency(2)
        .heartbeat_every(Duration::from_secs(1))
        .batch_delay(Duration::from_millis(300))
        .start(|_| Ok(b"done".to_vec()))
        .unwrap();
    // (The pool counts its commit a moment after the store has it: wait for the count, which
    // stays 0 if the completion never went through the dispatcher's round.)
    wait_until("the lone job's commit to be counted", || {
        let stats = p.stats();
        (stats.succeeded, stats.completion_commits) == (1, 1)
    });
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

/// The wait is store time from when a job was due (not when it was enqueued) to its start;
/// the run, each handler's time.
fn a_pool_counts_how_long_each_queues_jobs_waited_since_due_and_ran(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new(Q, "due at once")).unwrap();
    f.enqueue(NewJob::new(Q, "due in 3 s").delay(Duration::from_secs(3)))
        .unwrap();
    f.advance(Duration::from_secs(7));
    let p = pool(&f, "a").start(|_| Ok(())).unwrap();
    wait_until("both jobs to succeed", || p.stats().succeeded == 2);
    let tally = p.stats().queues[Q];
    let bucket = |bound: Duration| {
        let i = leasehold::JOB_TIME_BOUNDS
            .iter()
            .position(|b| *b == bound)
            .unwrap();
        tally.wait.buckets[i]
    };
    assert_eq!(
        bucket(Duration::from_secs(10)),
        1,
        "7 s since enqueued and due: {tally:?}"
    );
    assert_eq!(
        bucket(Duration::from_secs(5)),
        1,
        "4 s since due: {tally:?}"
    );
    assert_eq!(tally.wait.sum, Duration::from_secs(11));
    assert_eq!(tally.run.count(), 2);
}
