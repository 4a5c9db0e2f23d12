//! `leasehold::testing`, used as an application's own tests would use it: one job at a time
//! through a handler on the test's thread, with deaths, pauses and restarts scripted on the
//! manual clock.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use leasehold::redb::TableDefinition;
use leasehold::testing::{TestStore, Verdict};
use leasehold::{JobError, JobState, NewJob, Outcome, Output, ReclaimPath};

const Q: &str = "thumbs";
const SENT: TableDefinition<u64, &str> = TableDefinition::new("app.sent");

/// The application's handler under test: records what it sent in its own table, committed
/// with the completion.
fn send(ctx: &leasehold::JobContext) -> Result<Output, JobError> {
    let text = String::from_utf8(ctx.payload().to_vec())?;
    if text.is_empty() {
        return Err(JobError::new("nothing to send"));
    }
    let job = ctx.job().0;
    Ok(Output::with_writes(text.clone(), move |txn| {
        txn.open_table(SENT)?.insert(job, text.as_str())?;
        Ok::<(), leasehold::Error>(())
    }))
}

fn sent(t: &TestStore, job: leasehold::JobId) -> Option<String> {
    let read = t.begin_read().unwrap();
    let table = read.open_table(SENT).ok()?;
    table.get(job.0).unwrap().map(|v| v.value().to_owned())
}

#[test]
fn a_job_run_through_the_handler_commits_its_output_and_its_writes_together() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "hello")).unwrap();
    let ran = t.run_one(Q, send).unwrap().unwrap();
    assert_eq!((ran.job, ran.verdict), (id, Verdict::Committed));
    assert_eq!(t.output(id).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(sent(&t, id).as_deref(), Some("hello"));
    assert!(t.run_one(Q, send).unwrap().is_none(), "the queue is empty");
}

#[test]
fn a_handler_error_or_panic_is_recorded_as_the_attempts_failure() {
    let t = TestStore::new().unwrap();
    let empty = t.enqueue(NewJob::new(Q, "")).unwrap();
    let ran = t.run_one(Q, send).unwrap().unwrap();
    assert_eq!(ran.verdict, Verdict::Failed("nothing to send".into()));
    let job = t.job(empty).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.last_error()),
        (JobState::RetryWait, Some("nothing to send"))
    );

    t.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let ran = t
        .run_one(Q, |_ctx| -> Result<Output, JobError> {
            panic!("codec bug")
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        ran.verdict,
        Verdict::Panicked("handler panicked: codec bug".into())
    );
    assert_eq!(t.job(ran.job).unwrap().unwrap().state(), JobState::Dead);
}

#[test]
fn a_worker_paused_past_its_lease_commits_nothing_once_another_took_the_job_over() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "hello")).unwrap();
    let ran = t
        .run_one(Q, |ctx| {
            t.advance(TestStore::LEASE * 2); // a GC pause, a stopped VM
            let other = t.claim(Q, "worker-b", TestStore::LEASE)?.unwrap();
            assert_eq!(other.attempt.0, ctx.attempt().0 + 1);
            send(ctx)
        })
        .unwrap()
        .unwrap();
    assert_eq!(ran.verdict, Verdict::Fenced);
    assert_eq!(sent(&t, id), None, "the late writes were not committed");
    assert_eq!(t.job(id).unwrap().unwrap().state(), JobState::Running);
}

#[test]
fn a_dead_workers_job_is_taken_back_after_its_lease_and_runs_again() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "hello")).unwrap();
    let dead = t.claim(Q, "worker-a", TestStore::LEASE).unwrap().unwrap();
    assert!(
        t.reap().unwrap().reclaimed.is_empty(),
        "not before its lease ends"
    );
    t.expire(&dead).unwrap();
    assert_eq!(t.reap().unwrap().reclaimed.len(), 1);
    let ran = t.run_one(Q, send).unwrap().unwrap();
    assert_eq!((ran.attempt.0, ran.verdict), (2, Verdict::Committed));
    let history = t.history(id).unwrap();
    assert!(matches!(
        history[0].outcome(),
        Some(Outcome::LeaseExpired {
            path: ReclaimPath::Reaper,
            ..
        })
    ));
    assert!(t.complete(&dead, b"late").unwrap_err().is_lease_lost());
}

#[test]
fn a_restart_takes_back_what_the_old_process_held_and_the_directory_goes_with_the_store() {
    let mut t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "hello")).unwrap();
    t.claim(Q, "worker-a", TestStore::LEASE).unwrap().unwrap();
    let recovered = t.restart().unwrap();
    assert_eq!(recovered.reclaimed.len(), 1);
    assert_eq!(t.job(id).unwrap().unwrap().state(), JobState::Queued);
    let dir = t.dir().to_owned();
    assert!(dir.exists());
    drop(t);
    assert!(!dir.exists());
}
