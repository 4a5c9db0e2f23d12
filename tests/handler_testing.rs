//! `leasehold::testing`, used as an application's own tests would use it: one job at a time
//! through a handler on the test's thread, with deaths, pauses and restarts scripted on the
//! manual clock.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use leasehold::redb::TableDefinition;
use leasehold::testing::{TestStore, Verdict};
use leasehold::{JobError, JobState, NewJob, Outcome, Output, ReclaimPath, RedbWrites};
use leasehold::{JobStore, ReadJobs};

const Q: &str = "thumbs";
const SENT: TableDefinition<u64, &str> = TableDefinition::new("app.sent");

/// The application's handler under test: records what it sent in its own table, committed
/// with the completion.
fn send(ctx: &leasehold::JobContext) -> Result<Output<RedbWrites>, JobError> {
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
        .run_one(Q, |_ctx| -> Result<Output<RedbWrites>, JobError> {
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
fn writes_that_panic_are_the_attempts_panic_and_nothing_of_theirs_is_kept() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "x")).unwrap();
    let ran = t
        .run_one(Q, |_ctx| -> Result<Output<RedbWrites>, JobError> {
            Ok(Output::with_writes(
                "out",
                |txn| -> Result<(), leasehold::Error> {
                    txn.open_table(SENT)?.insert(1, "half")?;
                    panic!("disk full")
                },
            ))
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        ran.verdict,
        Verdict::Panicked("writes panicked: disk full".into())
    );
    let job = t.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.last_error()),
        (JobState::RetryWait, Some("writes panicked: disk full"))
    );
    assert_eq!(t.output(id).unwrap(), None);
    assert_eq!(
        sent(&t, leasehold::JobId(1)),
        None,
        "the writes rolled back"
    );
}

#[test]
fn a_permanent_failure_is_its_own_verdict_and_the_job_is_dead_at_once() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "to a closed account")).unwrap();
    let ran = t
        .run_one(Q, |_ctx| -> Result<Output<RedbWrites>, JobError> {
            Err(JobError::permanent("account closed"))
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        ran.verdict,
        Verdict::FailedPermanently("account closed".into())
    );
    let job = t.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Dead, 1));
    assert_eq!(
        t.history(id).unwrap()[0].outcome(),
        Some(&Outcome::FailedPermanently("account closed".into()))
    );
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

/// The same, for handlers whose writes are SQL: `TestPgStore` on the database
/// `LEASEHOLD_PG_URL` names (skipped, saying so once, where none is set).
mod on_postgres {
    use leasehold::testing::{TestPgStore, TestStore, Verdict};
    use leasehold::{JobError, JobState, JobStore, NewJob, Output, ReadJobs};

    const Q: &str = "mail";

    fn store() -> Option<TestPgStore> {
        let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "TestPgStore's tests did not run: LEASEHOLD_PG_URL is not set"
                );
            });
            return None;
        };
        let t = TestPgStore::new(&url).unwrap();
        let schema = t.schema().to_owned();
        t.transaction(|tx| {
            tx.sql().batch_execute(&format!(
                "CREATE TABLE {schema}.sent (job bigint PRIMARY KEY, text text NOT NULL)"
            ))?;
            Ok(())
        })
        .unwrap();
        Some(t)
    }

    /// The application's handler under test, SQL version.
    fn send(
        schema: String,
    ) -> impl FnOnce(&leasehold::JobContext) -> Result<Output<leasehold::postgres::SqlWrites>, JobError>
    {
        move |ctx| {
            let text = String::from_utf8(ctx.payload().to_vec())?;
            let job = i64::try_from(ctx.job().0)?;
            Ok(Output::with_sql(text.clone(), move |tx| {
                tx.sql().execute(
                    &format!("INSERT INTO {schema}.sent (job, text) VALUES ($1, $2)"),
                    &[&job, &text],
                )?;
                Ok::<(), leasehold::postgres::client::Error>(())
            }))
        }
    }

    fn sent(t: &TestPgStore) -> Vec<(i64, String)> {
        let select = format!("SELECT job, text FROM {}.sent ORDER BY job", t.schema());
        t.transaction(|tx| Ok(tx.sql().query(&select, &[])?))
            .unwrap()
            .iter()
            .map(|row| (row.try_get(0).unwrap(), row.try_get(1).unwrap()))
            .collect()
    }

    #[test]
    fn a_handlers_sql_commits_with_its_output_and_a_fenced_ones_does_not() {
        let Some(t) = store() else { return };
        let schema = t.schema().to_owned();
        let id = t.enqueue(NewJob::new(Q, "hello")).unwrap();
        let ran = t.run_one(Q, send(schema.clone())).unwrap().unwrap();
        assert_eq!((ran.job, ran.verdict), (id, Verdict::Committed));
        assert_eq!(sent(&t), vec![(1, "hello".to_owned())]);

        // A handler paused past its lease while another worker takes the job over: its
        // completion is fenced, and its SQL rolled back with it.
        let late = t.enqueue(NewJob::new(Q, "late")).unwrap();
        let ran = t
            .run_one(Q, |ctx| {
                t.advance(TestStore::LEASE * 2);
                t.claim(Q, "other", TestStore::LEASE).unwrap().unwrap();
                send(schema.clone())(ctx)
            })
            .unwrap()
            .unwrap();
        assert_eq!((ran.job, ran.verdict), (late, Verdict::Fenced));
        assert_eq!(sent(&t).len(), 1, "the late SQL rolled back");
        assert_eq!(t.job(late).unwrap().unwrap().attempt().0, 2);
    }

    #[test]
    fn expire_moves_the_test_clock_just_past_a_lease_and_the_reaper_takes_it_back() {
        let Some(t) = store() else { return };
        let id = t.enqueue(NewJob::new(Q, "x")).unwrap();
        let lease = t.claim(Q, "silent", TestStore::LEASE).unwrap().unwrap();
        t.advance(TestStore::LEASE / 2);
        t.heartbeat(&lease, 1).unwrap();
        t.expire(&lease).unwrap();
        let report = t.reap().unwrap();
        assert_eq!(report.reclaimed.len(), 1);
        assert_eq!(
            report.reclaimed[0].overdue,
            std::time::Duration::from_millis(1)
        );
        assert_eq!(t.job(id).unwrap().unwrap().state(), JobState::Queued);
    }

    #[test]
    fn a_test_stores_schema_is_dropped_with_it() {
        let Some(t) = store() else { return };
        let url = std::env::var("LEASEHOLD_PG_URL").unwrap();
        let schema = t.schema().to_owned();
        drop(t);
        let mut admin =
            leasehold::postgres::client::Client::connect(&url, leasehold::postgres::client::NoTls)
                .unwrap();
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                &[&schema],
            )
            .unwrap()
            .try_get(0)
            .unwrap();
        assert_eq!(left, 0);
    }
}

#[test]
fn a_failure_that_asks_for_its_own_wait_is_retried_after_it_not_the_backoff() {
    let t = TestStore::new().unwrap();
    let id = t.enqueue(NewJob::new(Q, "x")).unwrap();
    let wait = std::time::Duration::from_secs(900);
    let ran = t
        .run_one(Q, move |_ctx| -> Result<Output<RedbWrites>, JobError> {
            Err(JobError::new("slow down").retry_in(wait))
        })
        .unwrap()
        .unwrap();
    assert_eq!(ran.verdict, Verdict::Failed("slow down".into()));
    let job = t.job(id).unwrap().unwrap();
    let ended = t.history(id).unwrap()[0].ended_at().unwrap();
    assert_eq!(job.state(), JobState::RetryWait);
    assert_eq!(job.run_at(), ended.saturating_add(wait));
}
