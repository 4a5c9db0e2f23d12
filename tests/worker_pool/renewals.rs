use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::JobStore;
use leasehold::{Interruption, JobState, NewJob, Outcome};

use crate::common::{Fixture, wait_until};
use crate::on_both::{Kind, LEASE, Q, lease};
use crate::{pool, redb_pool, until_interrupted};

crate::on_both::on_both!(
    a_lost_lease_interrupts_the_handler_and_its_result_is_withheld,
    a_cancel_reaches_the_running_handler_through_its_heartbeat,
    a_job_that_heartbeats_without_progress_is_revoked_as_stalled,
    a_job_that_reports_progress_is_not_stalled,
    when_renewals_fall_behind_the_pool_stops_claiming_and_gives_back_expired_leases,
    a_job_back_in_the_pool_that_lost_it_is_renewed_as_a_new_attempt_beside_the_old,
    with_every_worker_busy_and_renewals_stopped_the_pool_still_sheds_its_expired_lease,
    a_job_claimed_ahead_whose_lease_ran_out_before_a_worker_took_it_is_given_back_unrun,
    when_renewals_stop_jobs_claimed_ahead_are_not_run_though_their_leases_have_not_run_out,
    a_pool_whose_claim_takes_over_its_own_expired_lease_stops_the_older_attempt_as_lost,
    a_handler_past_its_time_limit_is_interrupted_and_its_attempt_ends_timed_out,
    a_time_limit_interrupts_the_handler_at_its_deadline_not_at_the_next_heartbeat,
    a_handler_that_ignores_its_time_limit_commits_nothing_and_its_attempt_ends_timed_out,
);

type Seen = Arc<Mutex<Vec<Interruption>>>;

/// Records how each handler was interrupted.
fn recording() -> (
    Seen,
    impl Fn(&leasehold::JobContext) -> Result<Vec<u8>, leasehold::JobError> + Send + Sync + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = move |ctx: &leasehold::JobContext| {
        let r = until_interrupted(ctx);
        s.lock().unwrap().push(ctx.interruption().unwrap());
        r
    };
    (seen, handler)
}

#[test]
fn a_thousand_in_flight_leases_renew_in_one_write_per_tick() {
    // Eventual durability: a thousand claims need not wait for a thousand fsyncs here.
    let f = Fixture::with(|b| {
        b.sharing(leasehold::Sharing::Exclusive)
            .durability(leasehold::Durability::Eventual {
                flush_every: Duration::from_secs(3600),
            })
    });
    f.enqueue_n(1000);
    let p = redb_pool(&f, "big")
        .concurrency(1000)
        .heartbeat_every(Duration::from_millis(20))
        .start(until_interrupted)
        .unwrap();
    wait_until("1000 jobs in flight", || p.stats().in_flight == 1000);
    // All workers are busy, so nothing but heartbeats writes now.
    let writes_before = f.metrics().write_transactions;
    let batches_before = p.stats().heartbeat_batches;
    wait_until("three more heartbeat ticks", || {
        p.stats().heartbeat_batches >= batches_before + 3
    });
    let batches = p.stats().heartbeat_batches - batches_before;
    let writes = f.metrics().write_transactions - writes_before;
    assert!(
        writes == batches || writes == batches + 1,
        "{writes} writes for {batches} ticks"
    );
    f.advance(LEASE - Duration::from_secs(1));
    wait_until("a tick after the clock moved", || {
        p.stats().heartbeat_batches >= batches_before + batches + 2
    });
    // every lease was renewed from the new now: none has expired a full lease after claim
    f.advance(Duration::from_secs(2));
    assert!(f.reap().unwrap().reclaimed.is_empty());
    assert_eq!(p.shutdown(Duration::ZERO).released, 1000);
}

fn a_lost_lease_interrupts_the_handler_and_its_result_is_withheld(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (seen, handler) = recording();
    // One worker and nothing claimed ahead: with its only slot busy the dispatcher does not
    // look at the pool's health after the resume, so the renewal alone finds the lease
    // lost. (With a free slot, the dispatcher could see the renewals a lease behind on the
    // store clock first and stop the handler as expired: a race this test once lost on a
    // loaded machine.)
    let p = pool(&f, "w")
        .concurrency(1)
        .prefetch(0)
        .start(handler)
        .unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    p.pause();
    f.advance(LEASE);
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
    let other = f.claim(Q, "other", lease()).unwrap().unwrap();
    p.resume();
    wait_until("the handler to stop", || p.stats().in_flight == 0);
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::LeaseLost]);
    assert_eq!((p.stats().leases_lost, p.stats().rejected_writes), (1, 1));
    assert_eq!(
        p.stats().failed,
        0,
        "nothing was recorded for the lost attempt"
    );
    f.complete(&other, b"").unwrap();
    assert_eq!(f.history(id).unwrap().len(), 2);
}

fn a_cancel_reaches_the_running_handler_through_its_heartbeat(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (seen, handler) = recording();
    let p = pool(&f, "w").start(handler).unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    f.cancel(id).unwrap();
    wait_until("the handler to stop", || p.stats().in_flight == 0);
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::Cancelled]);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
    assert_eq!(p.stats().cancelled, 1);
}

fn a_job_that_heartbeats_without_progress_is_revoked_as_stalled(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "hangs").max_attempts(1)).unwrap();
    let (seen, handler) = recording();
    let p = pool(&f, "w")
        .stall_timeout(Duration::from_secs(90))
        .start(handler)
        .unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    // Move time in steps shorter than the lease; the heartbeat stays healthy throughout.
    for _ in 0..10 {
        let before = p.stats().heartbeat_batches;
        f.advance(Duration::from_secs(15));
        wait_until("a heartbeat", || {
            p.stats().heartbeat_batches > before || p.stats().in_flight == 0
        });
        if p.stats().in_flight == 0 {
            break;
        }
    }
    wait_until("the handler to stop", || p.stats().in_flight == 0);
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::Stalled]);
    assert_eq!(f.history(id).unwrap()[0].outcome(), Some(&Outcome::Stalled));
    assert_eq!(
        f.job(id).unwrap().unwrap().state(),
        JobState::Dead,
        "budget of 1 spent"
    );
    assert_eq!(p.stats().stalled, 1);
}

fn a_job_that_reports_progress_is_not_stalled(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    let p = pool(&f, "w")
        .stall_timeout(Duration::from_secs(90))
        .start(move |ctx| {
            while stop_rx.try_recv().is_err() {
                ctx.tick();
                ctx.checkpoint()?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(b"steady".to_vec())
        })
        .unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    for _ in 0..10 {
        let before = p.stats().heartbeat_batches;
        f.advance(Duration::from_secs(15));
        wait_until("a heartbeat", || p.stats().heartbeat_batches > before + 1);
    }
    stop_tx.send(()).unwrap();
    wait_until("the job to succeed", || {
        f.job(id).unwrap().unwrap().state() == JobState::Succeeded
    });
}

fn when_renewals_fall_behind_the_pool_stops_claiming_and_gives_back_expired_leases(kind: Kind) {
    let f = kind.open();
    let first = f.enqueue_n(1)[0];
    // The heartbeat timer fires only every 50 s of real time: in this test it never does,
    // exactly like a heartbeat thread starved on an overloaded machine.
    let (seen, handler) = recording();
    let p = pool(&f, "w")
        .concurrency(2)
        .heartbeat_every(Duration::from_secs(50))
        .start(handler)
        .unwrap();
    wait_until("the first job to start", || crate::started(&p, 1));
    // A claim round whose look came before the advance and whose claim after it would take
    // the expired lease over (the pool then stops the older attempt as lost, not shed). So
    // the advance waits until the dispatcher found nothing more and sleeps until woken; a
    // PostgreSQL pool also looks every half second, so there the job's row is locked over
    // the advance and such a claim skips it.
    wait_until("the dispatcher to go idle", || p.stats().idle_waits >= 1);
    let locked = f.is_postgres().then(|| f.stall_writes_to(first));
    // No renewal for longer than a whole lease: the lease has run out, and the heartbeat is
    // further behind than the pool tolerates.
    f.advance(LEASE + Duration::from_secs(1));
    let second = f.enqueue(NewJob::new(Q, "second")).unwrap(); // wakes the dispatcher
    wait_until("the handler to be stopped", || {
        !seen.lock().unwrap().is_empty()
    });
    drop(locked);
    wait_until("the pool to shed the expired lease", || {
        p.stats().released == 1
    });
    assert!(p.stats().intake_paused >= 1);
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::LeaseExpired]);
    // given back without spending budget (the pool may already have claimed it again)
    assert_eq!(
        f.history(first).unwrap()[0].outcome(),
        Some(&Outcome::Released)
    );
    assert_eq!(f.job(first).unwrap().unwrap().failures(), 0);
    // With nothing left to renew the pool is healthy again and takes work.
    wait_until("the pool to claim again", || p.stats().claimed >= 2);
    let _ = second;
    p.shutdown(Duration::ZERO);
}

/// A pool loses a job (taken over while its heartbeats were held up), the job comes back to
/// it (released by the other holder) and it claims a new attempt while its worker still runs
/// the old one. The two attempts are two flights: the old one ending (refused by the fence)
/// does not end the new one's renewals. (Flights were once keyed by job alone, and the old
/// attempt's end took the new attempt's heartbeat with it.)
fn a_job_back_in_the_pool_that_lost_it_is_renewed_as_a_new_attempt_beside_the_old(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (old_tx, old_rx) = crossbeam_channel::bounded::<()>(0);
    let (new_tx, new_rx) = crossbeam_channel::bounded::<()>(0);
    let p = pool(&f, "w")
        .concurrency(2)
        .start(move |ctx| {
            // Neither handler looks at its interruption: each runs until its gate opens.
            match ctx.attempt().0 {
                1 => old_rx.recv().unwrap(),
                _ => new_rx.recv().unwrap(),
            }
            Ok(format!("attempt {}", ctx.attempt()).into_bytes())
        })
        .unwrap();
    wait_until("the first attempt to start", || crate::started(&p, 1));
    p.pause();
    f.advance(LEASE);
    let other = f
        .claim_job(id, "other", lease())
        .unwrap()
        .expect("takeover");
    p.resume();
    // Its next renewal finds the lease lost (or the pool, its renewals behind, sheds it);
    // either way the job, given back by the other holder, is the pool's to claim again.
    f.release(&other).unwrap();
    wait_until("the pool to claim the job again", || {
        p.stats().in_flight == 2
    });
    old_tx.send(()).unwrap();
    wait_until("the old attempt's completion to be refused", || {
        p.stats().rejected_writes == 1
    });
    // (counted a moment before its worker lets go of it)
    wait_until("the old attempt to let go", || p.stats().in_flight == 1);
    // Its lease is renewed: a whole lease later nothing has expired.
    for _ in 0..2 {
        let before = p.stats().heartbeat_batches;
        f.advance(LEASE / 2);
        wait_until("a renewal after the clock moved", || {
            p.stats().heartbeat_batches >= before + 2
        });
    }
    assert!(f.reap().unwrap().reclaimed.is_empty());
    new_tx.send(()).unwrap();
    wait_until("the new attempt to commit", || p.stats().succeeded == 1);
    assert_eq!(f.output(id).unwrap().unwrap(), b"attempt #3");
    let outcomes: Vec<_> = f
        .history(id)
        .unwrap()
        .iter()
        .map(|r| (r.attempt().0, r.outcome().cloned()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (
                1,
                Some(Outcome::LeaseExpired {
                    path: leasehold::ReclaimPath::Takeover,
                    overdue: Duration::ZERO
                })
            ),
            (2, Some(Outcome::Released)),
            (3, Some(Outcome::Succeeded)),
        ]
    );
}

/// The case of a machine cut off from its database: every worker is busy and the heartbeat
/// is stuck in a renewal that does not return (here the store holds the job's writes).
/// Nobody frees a slot, so the dispatcher must notice while it waits for one: it sheds the
/// lease that ran out (the handler is interrupted, and the job given back once the store
/// answers again) instead of letting its handler work on a job another worker may now hold.
fn with_every_worker_busy_and_renewals_stopped_the_pool_still_sheds_its_expired_lease(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (seen, handler) = recording();
    let p = pool(&f, "w").concurrency(1).start(handler).unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    let stall = f.stall_writes_to(id);
    f.advance(LEASE + Duration::from_secs(1));
    wait_until("the pool to interrupt the handler", || {
        !seen.lock().unwrap().is_empty()
    });
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::LeaseExpired]);
    drop(stall);
    wait_until("the job to be given back", || p.stats().released == 1);
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::Released)
    );
    p.shutdown(Duration::ZERO);
}

type Started = Arc<Mutex<Vec<(leasehold::JobId, u32)>>>;

/// A handler that records each attempt it starts and holds `first`'s until `gate` opens.
fn gated(
    first: leasehold::JobId,
    gate: crossbeam_channel::Receiver<()>,
) -> (
    Started,
    impl Fn(&leasehold::JobContext) -> Result<Vec<u8>, leasehold::JobError> + Send + Sync + 'static,
) {
    let started: Started = Arc::default();
    let s = started.clone();
    let handler = move |ctx: &leasehold::JobContext| {
        s.lock().unwrap().push((ctx.job(), ctx.attempt().0));
        if ctx.job() == first {
            gate.recv().unwrap();
        }
        Ok(Vec::new())
    };
    (started, handler)
}

/// A job claimed ahead waits for a worker under a lease only the heartbeat renews. Here the
/// heartbeat never ticks and the lease runs out while the job waits: another pool may hold
/// it by now, so the worker that reaches it does not run it but gives it back.
fn a_job_claimed_ahead_whose_lease_ran_out_before_a_worker_took_it_is_given_back_unrun(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    let (started, handler) = gated(ids[0], gate_rx);
    let p = pool(&f, "w")
        .prefetch(1)
        .heartbeat_every(Duration::from_secs(50))
        .start(handler)
        .unwrap();
    wait_until("one job running and one claimed ahead", || {
        p.stats().in_flight == 2 && started.lock().unwrap().len() == 1
    });
    f.advance(LEASE + Duration::from_secs(1));
    gate_tx.send(()).unwrap();
    wait_until("the job claimed ahead to be given back", || {
        p.stats().released == 1
    });
    // (the first job's expired lease may be counted shed too: its completion, handed over,
    // still commits, since nobody took the job)
    assert!(p.stats().shed >= 1);
    assert!(
        !started.lock().unwrap().contains(&(ids[1], 1)),
        "its first attempt never ran"
    );
    let second = f.job(ids[1]).unwrap().unwrap();
    assert_eq!(second.failures(), 0);
    assert_eq!(
        f.history(ids[1]).unwrap()[0].outcome(),
        Some(&Outcome::Released)
    );
    p.shutdown(Duration::ZERO);
}

/// Renewals stop (the heartbeat is stuck in a write the store holds) for longer than the
/// pool tolerates, while no lease has run out yet. The running job goes on (its lease still
/// holds), but the jobs claimed ahead are not run: a pool that cannot renew should not start
/// work, and its renewals no longer cover them.
fn when_renewals_stop_jobs_claimed_ahead_are_not_run_though_their_leases_have_not_run_out(
    kind: Kind,
) {
    let f = kind.open();
    let ids = f.enqueue_n(3);
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    let (started, handler) = gated(ids[0], gate_rx);
    let p = pool(&f, "w").prefetch(2).start(handler).unwrap();
    wait_until("one job running and two claimed ahead", || {
        p.stats().in_flight == 3 && started.lock().unwrap().len() == 1
    });
    let stall = f.stall_writes_to(ids[0]);
    // Past the pool's tolerance (half a lease), short of the lease.
    f.advance(LEASE / 2 + Duration::from_secs(1));
    wait_until("the jobs claimed ahead to be shed", || p.stats().shed == 2);
    drop(stall);
    gate_tx.send(()).unwrap();
    wait_until(
        "the first job to succeed and the others to be given back",
        || {
            let stats = p.stats();
            stats.succeeded >= 1 && stats.released == 2
        },
    );
    assert_eq!(
        f.history(ids[0]).unwrap()[0].outcome(),
        Some(&Outcome::Succeeded),
        "the running job's lease held: it was not stopped"
    );
    for &id in &ids[1..] {
        assert!(!started.lock().unwrap().contains(&(id, 1)));
        assert_eq!(
            f.history(id).unwrap()[0].outcome(),
            Some(&Outcome::Released)
        );
    }
    p.shutdown(Duration::ZERO);
}

/// A claim round that looks while the pool's renewals still count as healthy and claims the
/// instant its own lease runs out takes that job over as a new attempt (here exactly at the
/// expiry, where both hold). The older attempt is lost for certain then: its handler is
/// stopped at once, not left running the same job beside the new attempt until a renewal
/// finds out (the heartbeat here never ticks).
fn a_pool_whose_claim_takes_over_its_own_expired_lease_stops_the_older_attempt_as_lost(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (seen, handler) = recording();
    let p = pool(&f, "w")
        .concurrency(2)
        .heartbeat_every(Duration::from_secs(50))
        .start(handler)
        .unwrap();
    wait_until("the first attempt to start", || crate::started(&p, 1));
    wait_until("the dispatcher to go idle", || p.stats().idle_waits >= 1);
    f.advance(LEASE);
    // less urgent than the expired lease, which goes first; its enqueue wakes the dispatcher
    f.enqueue(NewJob::new(Q, "later").priority(5)).unwrap();
    wait_until("the older attempt to be stopped", || {
        !seen.lock().unwrap().is_empty()
    });
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::LeaseLost]);
    assert_eq!(p.stats().leases_lost, 1);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.attempt().0), (JobState::Running, 2));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::LeaseExpired {
            path: leasehold::ReclaimPath::Takeover,
            overdue: Duration::ZERO
        })
    );
    p.shutdown(Duration::ZERO);
}

/// The pool's own timer (its heartbeat thread) interrupts a handler at its job's deadline,
/// and the worker ends the attempt as timed out; the next attempt runs in time.
fn a_handler_past_its_time_limit_is_interrupted_and_its_attempt_ends_timed_out(kind: Kind) {
    let f = kind.open();
    let limit = Duration::from_secs(10);
    let id = f.enqueue(NewJob::new(Q, "slow").time_limit(limit)).unwrap();
    let (seen, handler) = recording();
    let p = pool(&f, "w").start(handler).unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    f.advance(limit);
    // (a renewal past the deadline ends the attempt in the store a moment before the
    // interrupted handler records what it saw: both are waited for)
    wait_until("the attempt to end and the handler to see why", || {
        f.job(id).unwrap().unwrap().state() != JobState::Running && !seen.lock().unwrap().is_empty()
    });
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::TimedOut]);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    assert_eq!(p.stats().timed_out, 1);
    assert_eq!(f.stats().unwrap().counters.timed_out, 1);
    p.shutdown(Duration::ZERO);
}

/// The pool's timer sleeps until the next heartbeat or the nearest deadline; a job that
/// starts while it sleeps brings the deadline nearer, and the timer must wake for it: with
/// an hour's lease (a heartbeat every 20 minutes), a 300 ms limit still stops the handler
/// at 300 ms.
fn a_time_limit_interrupts_the_handler_at_its_deadline_not_at_the_next_heartbeat(kind: Kind) {
    let f = kind.open();
    let limit = Duration::from_millis(300);
    let (seen, handler) = recording();
    let p = f
        .pool(Q.into())
        .worker_id("w")
        .lease(Duration::from_secs(3600))
        .start(handler)
        .unwrap();
    // The pool's timer has gone to sleep with nothing in flight before the job comes.
    wait_until("the pool to find no work", || p.stats().idle_waits > 0);
    let id = f.enqueue(NewJob::new(Q, "slow").time_limit(limit)).unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    f.advance(limit);
    wait_until("the attempt to end at its deadline", || {
        f.job(id).unwrap().unwrap().state() != JobState::Running && !seen.lock().unwrap().is_empty()
    });
    assert_eq!(*seen.lock().unwrap(), vec![Interruption::TimedOut]);
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    p.shutdown(Duration::ZERO);
}

/// A handler that never looks at its interruption: the pool ends its attempt in the store
/// at the deadline, timed out, while the handler still runs (no reaper here), and its
/// result, when it comes, is withheld. (Its lease stops at the deadline too: had the pool
/// died meanwhile, the job would be back then, not a lease later.)
fn a_handler_that_ignores_its_time_limit_commits_nothing_and_its_attempt_ends_timed_out(
    kind: Kind,
) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    let p = pool(&f, "w")
        .time_limit(Duration::from_secs(30))
        .start(move |_ctx| {
            gate_rx.recv().unwrap();
            Ok(b"late".to_vec())
        })
        .unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    let claimed = f.job(id).unwrap().unwrap();
    let lease = claimed.lease().unwrap();
    assert_eq!(
        lease.deadline(),
        Some(lease.claimed_at().saturating_add(Duration::from_secs(30)))
    );
    f.advance(Duration::from_secs(30));
    wait_until("the pool to see the deadline", || p.stats().timed_out == 1);
    wait_until(
        "the attempt to end in the store, the handler still in it",
        || f.job(id).unwrap().unwrap().state() != JobState::Running,
    );
    assert_eq!(p.stats().in_flight, 1, "the handler has not returned");
    gate_tx.send(()).unwrap();
    wait_until("the worker to let go", || p.stats().in_flight == 0);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut {
            limit: Duration::from_secs(30)
        })
    );
    assert_eq!(f.output(id).unwrap(), None);
    p.shutdown(Duration::ZERO);
}
