//! The pool's `on_ended` hook: told of each end the pool committed, after the commit, with
//! what the store recorded; never of a write the fence refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::bounded;
use leasehold::{AttemptEnded, JobError, JobId, JobState, NewJob, Outcome};
use parking_lot::Mutex;

use crate::common::wait_until;
use crate::on_both::{Kind, LEASE, Q};
use crate::{pool, until_interrupted};

crate::on_both::on_both!(
    each_end_the_pool_commits_is_told_after_its_commit_with_what_the_store_recorded,
    a_completion_the_fence_refuses_is_never_told,
    a_panicking_hook_stops_neither_the_workers_nor_the_commits,
);

/// What a hook saw: the event, and the job's state and last recorded outcome as the store
/// showed them from inside the hook.
type Seen = Arc<Mutex<Vec<(AttemptEnded, JobState, Option<Outcome>)>>>;

fn each_end_the_pool_commits_is_told_after_its_commit_with_what_the_store_recorded(kind: Kind) {
    let f = kind.open();
    let job = |payload: &str| NewJob::new(Q, payload).max_attempts(1);
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(f.enqueue(job("ok")).unwrap());
    }
    let fails = f.enqueue(job("fail")).unwrap();
    let permanent = f
        .enqueue(NewJob::new(Q, "permanent").max_attempts(5))
        .unwrap();
    let snoozes = f.enqueue(job("snooze")).unwrap();
    let held = f.enqueue(job("hold")).unwrap();
    let seen: Seen = Arc::default();
    let (s, store) = (seen.clone(), f.handle());
    let p = pool(&f, "told")
        .concurrency(4)
        .on_ended(move |ended| {
            // Read from inside the hook: a hook called before its commit would see the job
            // still running.
            let job = store.job(ended.job).unwrap().unwrap();
            let last = store
                .history(ended.job)
                .unwrap()
                .last()
                .unwrap()
                .outcome()
                .cloned();
            s.lock().push((ended.clone(), job.state(), last));
        })
        .start(|ctx| match ctx.payload() {
            b"fail" => Err(JobError::new("boom")),
            b"permanent" => Err(JobError::permanent("never")),
            b"snooze" => Err(JobError::snooze(Duration::from_secs(3600))),
            b"hold" => until_interrupted(ctx),
            _ => Ok(b"done".to_vec()),
        })
        .unwrap();
    wait_until("every job but the held one to end", || {
        let stats = p.stats();
        stats.succeeded == 8 && stats.failed == 2 && stats.snoozed == 1 && stats.in_flight == 1
    });
    // The held job is released by the shutdown: that end is told too.
    p.shutdown(Duration::ZERO);
    wait_until("the release to be told", || seen.lock().len() == 12);

    let seen = seen.lock();
    let told = |id: JobId| {
        let told: Vec<_> = seen.iter().filter(|(e, ..)| e.job == id).collect();
        assert_eq!(told.len(), 1, "job {id} told once: {told:?}");
        told[0].clone()
    };
    for (ended, state, last) in seen.iter() {
        assert_eq!(ended.attempt.0, 1, "{ended:?}");
        assert_eq!(*state, ended.state, "told only after the commit: {ended:?}");
        assert_eq!(last.as_ref(), Some(&ended.outcome), "{ended:?}");
    }
    for id in ids {
        let (ended, ..) = told(id);
        assert_eq!(
            (ended.outcome, ended.state),
            (Outcome::Succeeded, JobState::Succeeded)
        );
    }
    let expect = [
        (fails, Outcome::Failed("boom".into()), JobState::Dead),
        (
            permanent,
            Outcome::FailedPermanently("never".into()),
            JobState::Dead,
        ),
        (
            snoozes,
            Outcome::Snoozed {
                delay: Duration::from_secs(3600),
            },
            JobState::Queued,
        ),
        (held, Outcome::Released, JobState::Queued),
    ];
    for (id, outcome, state) in expect {
        let (ended, ..) = told(id);
        assert_eq!((ended.outcome, ended.state), (outcome, state), "job {id}");
    }
}

fn a_completion_the_fence_refuses_is_never_told(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "late")).unwrap();
    let told = Arc::new(AtomicUsize::new(0));
    let (go_tx, go_rx) = bounded::<()>(1);
    let t = told.clone();
    let p = pool(&f, "late")
        .on_ended(move |_| {
            t.fetch_add(1, Ordering::SeqCst);
        })
        // Deaf to its interruption: it finishes when told, with its lease long gone.
        .start(move |_| {
            go_rx.recv().unwrap();
            Ok(b"too late".to_vec())
        })
        .unwrap();
    wait_until("the job to start", || crate::started(&p, 1));
    // Its holder goes silent past its lease (as a paused process would) and another worker
    // takes the job over.
    p.pause();
    f.advance(LEASE + Duration::from_secs(1));
    let taken = f.claim_one("thief");
    assert_eq!((taken.job, taken.attempt.0), (id, 2));
    p.resume();
    go_tx.send(()).unwrap();
    wait_until("the late completion to be refused", || {
        p.stats().rejected_writes == 1
    });
    wait_until("the old attempt to let go", || p.stats().in_flight == 0);
    assert_eq!(
        told.load(Ordering::SeqCst),
        0,
        "a refused write is not an end"
    );
    assert_eq!(p.stats().succeeded, 0);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Running);
}

fn a_panicking_hook_stops_neither_the_workers_nor_the_commits(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(20);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let p = pool(&f, "panicky")
        .concurrency(2)
        .on_ended(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            panic!("the application's hook fails");
        })
        .start(|_| Ok(b"done".to_vec()))
        .unwrap();
    wait_until("every job to succeed", || p.stats().succeeded == 20);
    wait_until("every end to be told", || {
        calls.load(Ordering::SeqCst) == 20
    });
    for id in ids {
        assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
    }
    assert_eq!(p.shutdown(Duration::from_secs(5)).stuck_handlers, 0);
}
