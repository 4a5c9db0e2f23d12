use std::time::Duration;

use crossbeam_channel::bounded;
use leasehold::{JobError, JobState, NewJob, Outcome, Output};
use leasehold::{JobStore, ReadJobs};

use crate::backends::AppWrite;
use crate::common::{Fixture, wait_until};
use crate::on_both::{Kind, LEASE, Q, Setup};
use crate::{pool, redb_pool};

crate::on_both::on_both!(
    a_panicking_handler_fails_its_job_and_the_pool_keeps_working,
    a_handler_error_is_recorded_and_retried,
    an_output_the_validator_refuses_is_not_committed,
    a_handler_commits_its_own_writes_with_the_completion,
    a_handlers_follow_up_job_commits_with_its_completion,
    any_error_a_handler_meets_can_be_returned_with_the_question_mark,
    an_attempt_ends_with_the_handlers_last_progress_even_before_any_heartbeat,
    a_paused_workers_late_commit_is_refused_and_the_other_workers_result_stands,
    a_late_commit_handed_to_the_dispatcher_is_refused_too,
    a_late_commit_with_writes_in_the_dispatchers_round_writes_nothing,
    a_panicking_validator_fails_its_attempt_and_the_pool_keeps_working,
    panicking_writes_fail_their_attempt_and_the_pool_keeps_working,
    a_handlers_permanent_failure_makes_the_job_dead_at_once,
    an_output_over_the_size_limit_fails_its_job_for_good_not_once_per_attempt,
    completions_with_writes_share_a_commit_and_one_whose_writes_fail_fails_alone,
);

fn a_panicking_handler_fails_its_job_and_the_pool_keeps_working(kind: Kind) {
    let f = kind.open();
    let boom = f.enqueue(NewJob::new(Q, "boom").max_attempts(1)).unwrap();
    f.enqueue_n(5);
    let p = pool(&f, "w")
        .concurrency(2)
        .start(|ctx| {
            if ctx.payload() == b"boom" {
                panic!("thumbnail decoder exploded");
            }
            Ok(Vec::new())
        })
        .unwrap();
    wait_until("every job to end", || {
        let s = p.stats();
        s.succeeded + s.panicked == 6
    });
    let job = f.job(boom).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead);
    assert!(
        job.last_error()
            .unwrap()
            .contains("handler panicked: thumbnail decoder exploded")
    );
    assert_eq!((p.stats().panicked, p.stats().succeeded), (1, 5));
}

fn a_handler_error_is_recorded_and_retried(kind: Kind) {
    let f = kind.with(
        Setup::default().retry_policy(leasehold::RetryPolicy::exponential(
            Duration::ZERO,
            Duration::ZERO,
        )),
    );
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(3)).unwrap();
    let p = pool(&f, "w")
        .start(|ctx| {
            if ctx.attempt().0 < 3 {
                Err(JobError::new(format!("try {}", ctx.attempt())))
            } else {
                Ok(b"third time lucky".to_vec())
            }
        })
        .unwrap();
    wait_until("the job to succeed", || p.stats().succeeded == 1);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(p.stats().failed, 2);
    assert_eq!(f.job(id).unwrap().unwrap().last_error(), Some("try #2"));
}

fn an_output_the_validator_refuses_is_not_committed(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let p = pool(&f, "w")
        .validate(|_, out| {
            if out.is_empty() {
                Err("empty thumbnail".into())
            } else {
                Ok(())
            }
        })
        .start(|_| Ok(Vec::new()))
        .unwrap();
    wait_until("the refusal to be recorded", || p.stats().invalid == 1);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Dead);
    assert_eq!(f.output(id).unwrap(), None);
    assert!(
        f.job(id)
            .unwrap()
            .unwrap()
            .last_error()
            .unwrap()
            .contains("empty thumbnail")
    );
}

fn a_paused_workers_late_commit_is_refused_and_the_other_workers_result_stands(kind: Kind) {
    late_commit_is_refused(kind, 1, false);
}

/// With several workers, completions go through the dispatcher's hand-over: the fence holds
/// there too.
fn a_late_commit_handed_to_the_dispatcher_is_refused_too(kind: Kind) {
    late_commit_is_refused(kind, 4, false);
}

/// The fence refuses a late completion inside the dispatcher's round before its writes run:
/// neither its row nor its follow-up job is written.
fn a_late_commit_with_writes_in_the_dispatchers_round_writes_nothing(kind: Kind) {
    late_commit_is_refused(kind, 4, true);
}

fn late_commit_is_refused(kind: Kind, concurrency: usize, with_writes: bool) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (gate_tx, gate_rx) = bounded::<()>(0);
    let store = f.handle();
    let paused = pool(&f, "paused")
        .concurrency(concurrency)
        .start(move |_| {
            gate_rx.recv().unwrap(); // the "pause": this worker stops here
            let output = b"from the paused worker".to_vec();
            Ok(match with_writes {
                true => store.app_output(
                    output,
                    AppWrite {
                        follow_up: Some(NewJob::new("upload", "late")),
                        ..AppWrite::new("late", 1)
                    },
                ),
                false => Output::<leasehold::AnyWrites>::new(output),
            })
        })
        .unwrap();
    wait_until("the job to start", || crate::started(&paused, 1));
    paused.pause(); // and its heartbeats stop with it

    f.advance(LEASE);
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
    let other = pool(&f, "other")
        .start(|_| Ok(b"from the live worker".to_vec()))
        .unwrap();
    wait_until("the other worker to commit", || {
        f.job(id).unwrap().unwrap().state() == JobState::Succeeded
    });

    gate_tx.send(()).unwrap(); // the paused worker wakes and tries to commit
    wait_until("the late commit to be refused", || {
        paused.stats().rejected_writes == 1
    });
    assert_eq!(f.output(id).unwrap().unwrap(), b"from the live worker");
    assert_eq!(f.stats().unwrap().counters.fenced_writes_rejected, 1);
    let history = f.history(id).unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[1].worker(), "other");
    assert_eq!(
        f.app_value("late"),
        None,
        "the refused completion's writes never ran"
    );
    assert!(!f.stats().unwrap().queues.contains_key("upload"));
    drop(other);
}

fn a_handler_commits_its_own_writes_with_the_completion(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    let ids = f.enqueue_n(3);
    let store = f.handle();
    let p = pool(&f, "w")
        .start(move |ctx| {
            let key = format!("sent {}", ctx.job());
            Ok(store.app_output(b"sent".to_vec(), AppWrite::new(key, ctx.job().0)))
        })
        .unwrap();
    wait_until("all jobs to succeed", || {
        f.stats().unwrap().total(JobState::Succeeded) == 3
    });
    for id in ids {
        assert_eq!(f.app_value(&format!("sent {id}")), Some(id.0));
    }
    drop(p);
}

fn a_handlers_follow_up_job_commits_with_its_completion(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    let ids = f.enqueue_n(3);
    let store = f.handle();
    let p = pool(&f, "w")
        .start(move |ctx| {
            let upload = AppWrite {
                follow_up: Some(NewJob::new("upload", ctx.job().to_string())),
                ..AppWrite::new(format!("thumbnail {}", ctx.job()), 1)
            };
            Ok(store.app_output(b"thumbnail".to_vec(), upload))
        })
        .unwrap();
    wait_until("all jobs to succeed", || {
        f.stats().unwrap().total(JobState::Succeeded) == 3
    });
    drop(p);
    let uploads = f.stats().unwrap().queues["upload"].get(JobState::Queued);
    assert_eq!(uploads, ids.len() as u64);
}

#[test]
fn writes_that_call_the_store_fail_the_attempt_at_once_and_shutdown_returns() {
    let f = Fixture::new();
    let id = f.enqueue_n(1)[0];
    let store = (*f).clone();
    let p = redb_pool(&f, "w")
        .start(move |_ctx| {
            let store = store.clone();
            Ok(Output::with_writes(b"x".to_vec(), move |_t| {
                store.enqueue(NewJob::new("upload", "the wrong way"))?;
                Ok::<(), leasehold::Error>(())
            }))
        })
        .unwrap();
    wait_until("the attempt to fail", || p.stats().failed == 1);
    let report = p.shutdown(Duration::from_secs(5));
    assert_eq!(report.stuck_handlers, 0);
    // running it again would meet the same error: dead at once, not retried
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Dead, 1));
    assert!(
        job.last_error()
            .unwrap_or("")
            .contains("inside its own transaction"),
        "{:?}",
        job.last_error()
    );
}

fn any_error_a_handler_meets_can_be_returned_with_the_question_mark(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0]; // its payload, "job 0", is not a number
    let p = pool(&f, "w")
        .start(|ctx| {
            let text = std::str::from_utf8(ctx.payload())?;
            let n: u64 = text.parse()?;
            Ok(n.to_string().into_bytes())
        })
        .unwrap();
    wait_until("the attempt to fail", || p.stats().failed == 1);
    drop(p);
    let error = f.job(id).unwrap().unwrap().last_error().unwrap().to_owned();
    assert!(error.contains("invalid digit"), "{error}");
}

fn an_attempt_ends_with_the_handlers_last_progress_even_before_any_heartbeat(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let p = pool(&f, "w")
        // no heartbeat comes during these short jobs: only the end can carry the progress
        .heartbeat_every(LEASE / 2)
        .start(|ctx| {
            ctx.progress(7);
            if ctx.payload() == b"job 1" {
                return Err("gave up after step 7".into());
            }
            Ok(b"done".to_vec())
        })
        .unwrap();
    wait_until("both jobs to end", || {
        let s = p.stats();
        s.succeeded + s.failed == 2
    });
    drop(p);
    for id in ids {
        let history = f.history(id).unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].progress(), 7, "{:?}", history[0]);
    }
}

/// A panic in the validator or in the writes closure is contained like a handler's: the
/// attempt fails with the message, the worker slot comes back, and after shutdown nothing is
/// left running (it used to stay running, its lease renewed for nobody).
fn a_panicking_callback_fails_the_attempt(kind: Kind, validator_panics: bool) {
    let f = kind.open();
    if !validator_panics && !f.has_application_tables() {
        return; // (panicking writes are the application's tables' to run)
    }
    let boom = f.enqueue(NewJob::new(Q, "boom").max_attempts(1)).unwrap();
    f.enqueue_n(5);
    let mut builder = pool(&f, "w").concurrency(1);
    if validator_panics {
        builder = builder.validate(|ctx, _| {
            if ctx.payload() == b"boom" {
                panic!("validator exploded");
            }
            Ok(())
        });
    }
    let store = f.handle();
    let p = builder
        .start(move |ctx| {
            let boom = !validator_panics && ctx.payload() == b"boom";
            let write = AppWrite {
                then_panic: boom,
                ..AppWrite::new("sent", 0)
            };
            Ok(store.app_output(b"ok".to_vec(), write))
        })
        .unwrap();
    // one worker: the five others can only run if the slot came back. An end is counted a
    // moment before its worker lets go of the job, so both are waited for (once only the
    // count was, and on a busy machine the shutdown below found the last job still held).
    wait_until("every job to end and the pool to hold nothing", || {
        let s = p.stats();
        s.succeeded + s.panicked == 6 && s.in_flight == 0
    });
    let report = p.shutdown(Duration::from_secs(5));
    assert_eq!(report.in_flight, 0);
    let job = f.job(boom).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead);
    let want = if validator_panics {
        "validator panicked: validator exploded"
    } else {
        "writes panicked: writes exploded"
    };
    assert!(job.last_error().unwrap().contains(want), "{job:?}");
    assert_eq!(f.stats().unwrap().total(JobState::Running), 0);
}

fn a_panicking_validator_fails_its_attempt_and_the_pool_keeps_working(kind: Kind) {
    a_panicking_callback_fails_the_attempt(kind, true);
}

fn panicking_writes_fail_their_attempt_and_the_pool_keeps_working(kind: Kind) {
    a_panicking_callback_fails_the_attempt(kind, false);
}

fn a_handlers_permanent_failure_makes_the_job_dead_at_once(kind: Kind) {
    let f = kind.open();
    let gone = f
        .enqueue(NewJob::new(Q, "deleted user").max_attempts(25))
        .unwrap();
    let fine = f.enqueue(NewJob::new(Q, "user").max_attempts(25)).unwrap();
    let p = pool(&f, "w")
        .start(|ctx| match ctx.payload() {
            b"deleted user" => Err(JobError::permanent("user 42 no longer exists")),
            _ => Ok(b"sent".to_vec()),
        })
        .unwrap();
    wait_until("both jobs to end", || {
        let s = p.stats();
        s.succeeded + s.failed == 2
    });
    drop(p);
    let job = f.job(gone).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.attempt().0),
        (JobState::Dead, 1, 1)
    );
    let history = f.history(gone).unwrap();
    assert_eq!(
        history[0].outcome(),
        Some(&Outcome::FailedPermanently(
            "user 42 no longer exists".into()
        ))
    );
    assert_eq!(f.job(fine).unwrap().unwrap().state(), JobState::Succeeded);
}

fn an_output_over_the_size_limit_fails_its_job_for_good_not_once_per_attempt(kind: Kind) {
    let f = kind.with(Setup::default().max_payload(64));
    let big = f.enqueue(NewJob::new(Q, "big").max_attempts(25)).unwrap();
    let small = f.enqueue(NewJob::new(Q, "small").max_attempts(25)).unwrap();
    let p = pool(&f, "w")
        .concurrency(2)
        .start(|ctx| match ctx.payload() {
            b"big" => Ok(vec![7u8; 65]),
            _ => Ok(vec![7u8; 64]),
        })
        .unwrap();
    wait_until("both jobs to end", || {
        let s = p.stats();
        s.succeeded + s.failed == 2
    });
    drop(p);
    let job = f.job(big).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Dead, 1));
    let error = job.last_error().unwrap_or_default();
    assert!(error.contains("output") && error.contains("65"), "{error}");
    assert!(matches!(
        f.history(big).unwrap()[0].outcome(),
        Some(Outcome::FailedPermanently(_))
    ));
    assert_eq!(f.job(small).unwrap().unwrap().state(), JobState::Succeeded);
}

/// Completions carrying the application's writes commit in the dispatcher's round, many in
/// one transaction, each under its own fence: one whose writes fail (after writing) fails
/// alone, and what the others wrote (their follow-up jobs too) commits exactly once.
fn completions_with_writes_share_a_commit_and_one_whose_writes_fail_fails_alone(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    for payload in ["a", "bad", "c"] {
        f.enqueue(NewJob::new(Q, payload).max_attempts(1)).unwrap();
    }
    let store = f.handle();
    let go = std::sync::Arc::new(std::sync::Barrier::new(4));
    let release = go.clone();
    // A batch of three and a delay longer than the three take to finish: once the spare
    // fourth worker's claim has found the queue drained (a free worker's claim would not
    // wait), the round waits for all three completions and commits them together.
    let p = pool(&f, "w")
        .concurrency(4)
        .heartbeat_every(Duration::from_secs(30))
        .batch_delay(Duration::from_secs(2))
        .max_batch(3)
        .start(move |ctx| {
            go.wait();
            let payload = String::from_utf8_lossy(ctx.payload()).into_owned();
            let write = AppWrite {
                follow_up: Some(NewJob::new("upload", payload.clone())),
                then_fail: payload == "bad",
                ..AppWrite::new(format!("sent {payload}"), ctx.job().0)
            };
            Ok(store.app_output(b"sent".to_vec(), write))
        })
        .unwrap();
    wait_until("three jobs running and the queue found empty", || {
        crate::started(&p, 3) && p.stats().idle_waits > 0
    });
    release.wait();
    wait_until("every job to end", || {
        let s = p.stats();
        s.succeeded + s.failed == 3 && s.in_flight == 0
    });
    let stats = p.stats();
    assert_eq!((stats.succeeded, stats.failed), (2, 1));
    // On redb the round waits for all three; a PostgreSQL pool also looks for other
    // machines' work every few hundred ms, and such a look commits what it holds.
    assert!(
        stats.completion_commits < 3,
        "completions shared the dispatcher's round: {} commits",
        stats.completion_commits
    );
    assert!(f.app_value("sent a").is_some() && f.app_value("sent c").is_some());
    assert_eq!(
        f.app_value("sent bad"),
        None,
        "the failed writes rolled back"
    );
    let counts = f.stats().unwrap();
    assert_eq!(
        counts.queues["upload"].get(JobState::Queued),
        2,
        "one follow-up per succeeded job, though their round ran again"
    );
    let bad = f
        .jobs(&leasehold::JobFilter {
            state: Some(JobState::Dead),
            ..leasehold::JobFilter::default()
        })
        .unwrap();
    assert_eq!(bad.len(), 1);
    assert_eq!(f.payload(bad[0].id()).unwrap().unwrap(), b"bad");
    assert!(
        bad[0].last_error().unwrap().contains(AppWrite::FAILURE),
        "{:?}",
        bad[0].last_error()
    );
    drop(p);
}
