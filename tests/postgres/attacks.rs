//! What attacks on the PostgreSQL engine broke, each defect with its regression test: names
//! and schemas PostgreSQL cannot take, tables altered by hand, backends ended while
//! committing, a role whose default isolation is serializable, deadlocks in the
//! application's SQL, an application that swallows its SQL error, a pool process
//! stopped (`SIGSTOP`) past its leases, keyed claims that deadlock, and a keyed claim that
//! waits for its key's row.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::postgres::client as postgres;
use leasehold::postgres::{PgError, PgStore};
use leasehold::{Error, InputError, JobState, NewJob, Outcome, Output, WorkerPool};
use leasehold::{JobStore, ReadJobs};

use crate::db::{Db, LEASE, PgPool, Q, effects, survive, wait_until};

/// The PostgreSQL error inside `r`, or a panic saying what came instead.
fn pg_error<T: std::fmt::Debug>(r: leasehold::Result<T>) -> PgError {
    match r {
        Err(Error::Postgres(e)) => e,
        other => panic!("expected a PostgreSQL error, got {other:?}"),
    }
}

#[test]
fn system_schemas_are_refused_and_nothing_is_made_in_them() {
    let mut db = db!("system schemas");
    for schema in ["information_schema", "pg_catalog", "pg_toast", "pg_temp_1"] {
        match pg_error(PgStore::builder(&db.url).schema(schema).open()) {
            PgError::SystemSchema(s) => assert_eq!(s, schema),
            other => panic!("{schema}: expected SystemSchema, got {other:?}"),
        }
    }
    let made: i64 = db
        .admin
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE (n.nspname LIKE 'pg\\_%' OR n.nspname = 'information_schema')
               AND c.relname LIKE 'leasehold\\_%'",
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(made, 0, "no leasehold table in a system schema");
    db.sql("SELECT 1"); // the admin connection still works
}

#[test]
fn a_pool_handler_failing_with_a_nul_byte_has_its_failure_recorded() {
    // Once: the failure could not be written (22021), the job stayed running, every attempt
    // ended by its lease running out, and the pool counted no failure.
    let db = db!("nul failure in a pool");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let pool = WorkerPool::builder(store.clone(), Q)
        .lease(Duration::from_secs(30))
        .start(|_ctx| -> Result<Vec<u8>, leasehold::JobError> {
            Err("bad byte \0 in input".into())
        })
        .unwrap();
    wait_until("the job to be dead", || {
        store.job(id).unwrap().unwrap().state() == JobState::Dead
    });
    // The worker counts the failure a moment after the store committed it (once, under
    // load, the count was read in between).
    wait_until("the pool to count the failure", || pool.stats().failed == 1);
    drop(pool);
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(job.last_error(), Some("bad byte \\0 in input"));
    let history = store.history(id).unwrap();
    assert_eq!(history.len(), 1);
    assert!(
        matches!(history[0].outcome(), Some(Outcome::Failed(m)) if m == "bad byte \\0 in input")
    );
    // and the names that reach a text column get the input error, not a database error
    assert!(matches!(
        store.enqueue(NewJob::new("q\0", "x")),
        Err(Error::Input(InputError::NulByte {
            what: "queue name",
            ..
        }))
    ));
    assert!(matches!(
        store.enqueue(NewJob::new(Q, "x").unique_key("\0")),
        Err(Error::Input(InputError::NulByte {
            what: "unique key",
            ..
        }))
    ));
    assert!(matches!(
        store.claim(Q, "w\0", LEASE),
        Err(Error::Input(InputError::NulByte {
            what: "worker id",
            ..
        }))
    ));
    // a read of a queue no job can be in answers nothing
    let filter = leasehold::JobFilter {
        queue: Some("q\0".into()),
        ..Default::default()
    };
    assert!(store.jobs(&filter).unwrap().is_empty());
    assert_eq!(
        store.timing("q\0").unwrap(),
        leasehold::QueueTiming::default()
    );
}

/// Alters `column` of `leasehold_jobs` to `ty` by hand.
fn alter(db: &mut Db, column: &str, ty: &str) {
    db.sql(&format!(
        "ALTER TABLE {{s}}.leasehold_jobs ALTER COLUMN {column} TYPE {ty} USING {column}::{ty}"
    ));
}

#[test]
fn a_column_altered_by_hand_is_a_typed_error_naming_it_never_a_panic() {
    // Once: `claim` and `job` panicked ("error deserializing column 1") and the tool exited
    // 101; a live handle kept failing with "cached plan must not change result type".
    let mut db = db!("altered columns");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    store.job(id).unwrap(); // its statement is prepared and cached
    for (column, ty, made, reads) in [
        ("attempt", "integer", "int8", ["job", "jobs", "claim"]),
        ("payload", "text", "bytea", ["payload", "claim", "claim"]),
        ("priority", "bigint", "int4", ["job", "jobs", "claim"]),
    ] {
        alter(&mut db, column, ty);
        // the live handle, in each call that reads the column
        for what in reads {
            let result = match what {
                "job" => store.job(id).map(|_| ()),
                "jobs" => store.jobs(&Default::default()).map(|_| ()),
                "payload" => store.payload(id).map(|_| ()),
                _ => store.claim(Q, "w", LEASE).map(|_| ()),
            };
            match pg_error(result) {
                PgError::SchemaAltered { schema, detail } => {
                    assert_eq!(schema.as_deref(), Some(db.schema.as_str()));
                    assert!(detail.contains(column), "{what}: {detail}");
                }
                other => panic!("{column} {what}: expected SchemaAltered, got {other:?}"),
            }
        }
        // a new handle is refused at open, naming the column and both types
        match pg_error(db.builder().open()) {
            PgError::SchemaAltered { detail, .. } => {
                assert!(
                    detail.contains(&format!("leasehold_jobs.{column}")) && detail.contains(made),
                    "{detail}"
                );
            }
            other => panic!("{column}: expected SchemaAltered at open, got {other:?}"),
        }
        alter(&mut db, column, made);
    }
    // put back as it was, the live handle and a new one work again
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Queued);
    let reopened = db.builder().open().unwrap();
    let lease = reopened.claim(Q, "w", LEASE).unwrap().unwrap();
    reopened.complete(&lease, b"").unwrap();
    // a dropped index is named too
    db.sql("DROP INDEX {s}.leasehold_jobs_unique");
    match pg_error(db.builder().open()) {
        PgError::SchemaAltered { detail, .. } => {
            assert!(detail.contains("leasehold_jobs_unique"), "{detail}")
        }
        other => panic!("expected SchemaAltered, got {other:?}"),
    }
    // and, the index put back, a dropped function
    db.sql(
        "CREATE UNIQUE INDEX leasehold_jobs_unique ON {s}.leasehold_jobs (queue, unique_key)
         WHERE unique_key IS NOT NULL;
         DROP FUNCTION {s}.varint",
    );
    match pg_error(db.builder().open()) {
        PgError::SchemaAltered { detail, .. } => {
            assert!(detail.contains("function varint() is missing"), "{detail}")
        }
        other => panic!("expected SchemaAltered, got {other:?}"),
    }
}

#[test]
fn a_statement_prepared_before_a_compatible_alteration_is_prepared_again() {
    let mut db = db!("stale statement");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    store.job(id).unwrap();
    // text to varchar: every value still reads as a string, but the server refuses the
    // statement prepared before ("cached plan must not change result type")
    db.sql("ALTER TABLE {s}.leasehold_jobs ALTER COLUMN queue TYPE varchar(200)");
    for _ in 0..3 {
        assert_eq!(store.job(id).unwrap().unwrap().queue(), Q);
    }
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.complete(&lease, b"done").unwrap();
}

/// A trigger that makes the store's `COMMIT` sleep while `{s}.slow` says so: a deferred
/// constraint trigger runs at commit time, so the backend is ended in the middle of it.
fn slow_commits(db: &mut Db) {
    db.sql(
        "CREATE TABLE {s}.slow (on_ boolean NOT NULL);
         INSERT INTO {s}.slow VALUES (false);
         CREATE FUNCTION {s}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT on_ FROM {s}.slow) THEN PERFORM pg_sleep(20); END IF;
             RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON {s}.leasehold_jobs
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.slow_commit();",
    );
}

/// Runs `write` with every commit of the store slowed, ends the backend that is committing
/// it, and returns what `write` answered.
fn ended_while_committing<T: Send + std::fmt::Debug>(
    db: &mut Db,
    app: &str,
    write: impl FnOnce() -> leasehold::Result<T> + Send,
) -> leasehold::Result<T> {
    db.sql("UPDATE {s}.slow SET on_ = true");
    let answer = std::thread::scope(|s| {
        let writer = s.spawn(write);
        let mut ended = false;
        wait_until("a backend sleeping in COMMIT", || {
            let rows = db
                .admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name = $1 AND wait_event = 'PgSleep'",
                    &[&app],
                )
                .unwrap();
            ended = !rows.is_empty();
            ended || writer.is_finished()
        });
        let answer = writer.join().unwrap();
        assert!(
            ended,
            "the write finished without sleeping in its commit: {answer:?}"
        );
        answer
    });
    db.sql("UPDATE {s}.slow SET on_ = false");
    answer
}

#[test]
fn a_backend_ended_while_committing_leaves_every_write_an_unknown_outcome() {
    // Once: an enqueue ended so returned a plain database error (57P01, "terminating
    // connection due to administrator command") although it may have committed, and an
    // application that retried it made a duplicate.
    let mut db = db!("ended at commit");
    let app = format!("lh_{}", db.schema);
    let store = PgStore::builder(format!("{}?application_name={app}", db.url))
        .schema(&db.schema)
        .open()
        .unwrap();
    slow_commits(&mut db);
    // The server's FATAL message (57P01) is read before the connection closes nearly
    // always; now and then only the close is.
    let mut told = 0;
    let mut unknown = |what: &str, e: Option<Error>| match e {
        Some(Error::Postgres(PgError::OutcomeUnknown(why))) => {
            told += usize::from(why.contains("57P01"));
        }
        other => panic!("{what}: expected OutcomeUnknown, got {other:?}"),
    };
    let ids = store
        .enqueue_batch((0..6).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let e = ended_while_committing(&mut db, &app, || store.enqueue(NewJob::new(Q, "e")));
    unknown("enqueue", e.err());
    let e = ended_while_committing(&mut db, &app, || {
        store.enqueue_batch([NewJob::new(Q, "b1"), NewJob::new(Q, "b2")])
    });
    unknown("enqueue_batch", e.err());
    let e = ended_while_committing(&mut db, &app, || {
        store.transaction(|t| t.enqueue(NewJob::new(Q, "t")))
    });
    unknown("transaction", e.err());
    let e = ended_while_committing(&mut db, &app, || store.claim(Q, "w", LEASE));
    unknown("claim", e.err());
    let leases: Vec<_> = (0..3)
        .map(|_| store.claim(Q, "w", LEASE).unwrap().unwrap())
        .collect();
    let e = ended_while_committing(&mut db, &app, || store.heartbeat(&leases[0], 1));
    unknown("heartbeat", e.err());
    let e = ended_while_committing(&mut db, &app, || store.complete(&leases[0], b"x"));
    unknown("complete", e.err());
    let e = ended_while_committing(&mut db, &app, || {
        store.complete_with(&leases[1], b"x", |_| Ok::<(), postgres::Error>(()))
    });
    unknown("complete_with", e.err());
    let e = ended_while_committing(&mut db, &app, || store.fail(&leases[2], "boom"));
    unknown("fail", e.err());
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    let e = ended_while_committing(&mut db, &app, || store.release(&lease));
    unknown("release", e.err());
    let e = ended_while_committing(&mut db, &app, || store.cancel(ids[5]));
    unknown("cancel", e.err());
    store.cancel(ids[4]).unwrap();
    let e = ended_while_committing(&mut db, &app, || store.retry(ids[4]));
    unknown("retry", e.err());
    assert!(told > 0, "no write saw the server's own reason");
    // every write was rolled back by the ending (the trigger ran before the commit record),
    // and the store goes on with new connections
    assert_eq!(store.stats().unwrap().total(JobState::Succeeded), 0);
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn a_role_whose_default_isolation_is_serializable_runs_pools_as_read_committed() {
    // Once: a pool of six completing with SQL drained only part of 400 jobs in 40 s, and the
    // serialization failures in the application's INSERT spent attempts.
    let mut db = db!("serializable role");
    let role = format!("lh_ser_{}", &db.schema[db.schema.len() - 12..]);
    let database: String = db
        .admin
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .try_get(0)
        .unwrap();
    db.admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             ALTER ROLE {role} SET default_transaction_isolation = 'serializable';
             GRANT CREATE ON DATABASE {database} TO {role};"
        ))
        .unwrap();
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(
        url, db.url,
        "the test's URL names the postgres user: {}",
        db.url
    );
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let store = PgStore::builder(&url).schema(&db.schema).open().unwrap();
        let isolation: String = store
            .transaction(|t| {
                Ok(t.sql()
                    .query_one("SHOW transaction_isolation", &[])?
                    .try_get(0)?)
            })
            .unwrap();
        assert_eq!(isolation, "read committed");
        let table = format!("{}.done", db.schema);
        store
            .transaction(|t| {
                let sql = format!("CREATE TABLE {table} (job bigint PRIMARY KEY)");
                t.sql().batch_execute(&sql)?;
                Ok(())
            })
            .unwrap();
        let ids = store
            .enqueue_batch((0..200).map(|i| NewJob::new(Q, format!("{i}"))))
            .unwrap();
        let pool = WorkerPool::builder(store.clone(), Q)
            .concurrency(6)
            .start(move |ctx| {
                let (job, sql) = (
                    ctx.job().0 as i64,
                    format!("INSERT INTO {table} VALUES ($1)"),
                );
                Ok(Output::with_sql(Vec::new(), move |t| {
                    t.sql().execute(&sql, &[&job])?;
                    Ok::<(), postgres::Error>(())
                }))
            })
            .unwrap();
        assert!(pool.wait_idle(Duration::from_secs(120)).unwrap());
        let stats = pool.stats();
        drop(pool);
        assert_eq!((stats.succeeded, stats.failed), (200, 0), "{stats:?}");
        for id in ids {
            let job = store.job(id).unwrap().unwrap();
            assert_eq!((job.state(), job.failures()), (JobState::Succeeded, 0));
        }
    }));
    db.sql(&format!(
        "DROP SCHEMA IF EXISTS {{s}} CASCADE; REVOKE ALL ON DATABASE {database} FROM {role}; DROP OWNED BY {role}; DROP ROLE {role}"
    ));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_deadlock_in_the_applications_sql_runs_the_completion_again_and_spends_no_attempt() {
    let mut db = db!("deadlock");
    let store = db.store();
    db.sql("CREATE TABLE {s}.rows (k int PRIMARY KEY, v int NOT NULL); INSERT INTO {s}.rows VALUES (1, 0), (2, 0)");
    let ids = store
        .enqueue_batch([NewJob::new(Q, "a"), NewJob::new(Q, "b")])
        .unwrap();
    let leases: Vec<_> = (0..2)
        .map(|_| store.claim(Q, "w", LEASE).unwrap().unwrap())
        .collect();
    let both_hold_one = std::sync::Barrier::new(2);
    let runs = AtomicUsize::new(0);
    let table = format!("{}.rows", db.schema);
    std::thread::scope(|s| {
        for (i, lease) in leases.iter().enumerate() {
            let (store, both_hold_one, runs, table) = (&store, &both_hold_one, &runs, &table);
            s.spawn(move || {
                // each locks its own row, waits for the other to hold its own, then wants
                // the other's: one of the two is chosen as the deadlock's victim
                let (mine, theirs) = if i == 0 { (1, 2) } else { (2, 1) };
                let mut first = true;
                store
                    .complete_with(lease, b"done", |t| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let sql = format!("UPDATE {table} SET v = v + 1 WHERE k = $1");
                        t.sql().execute(&sql, &[&mine])?;
                        if std::mem::take(&mut first) {
                            both_hold_one.wait();
                        }
                        t.sql().execute(&sql, &[&theirs])?;
                        Ok::<(), postgres::Error>(())
                    })
                    .unwrap();
            });
        }
    });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "the victim's writes ran again"
    );
    for id in ids {
        let job = store.job(id).unwrap().unwrap();
        assert_eq!(
            (job.state(), job.attempt().0, job.failures()),
            (JobState::Succeeded, 1, 0)
        );
        assert_eq!(store.history(id).unwrap().len(), 1);
    }
    let sum: i64 = db
        .admin
        .query_one(&format!("SELECT sum(v) FROM {table}"), &[])
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(sum, 4, "each completion's two updates committed once");
}

#[test]
fn an_sql_error_the_application_swallowed_does_not_commit_as_a_quiet_rollback() {
    // An aborted transaction's COMMIT is a ROLLBACK without an error: the completion would
    // have been reported done and never written.
    let db = db!("swallowed error");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    let answer = store.complete_with(&lease, b"done", |t| {
        let _ = t.sql().execute("SELECT 1 / 0", &[]);
        Ok::<(), postgres::Error>(())
    });
    assert!(matches!(answer, Err(Error::Application(_))), "{answer:?}");
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Running);
    store
        .complete_with(&lease, b"done", |_| Ok::<(), postgres::Error>(()))
        .unwrap();
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

/// Issue 38: a job's time limit waited for the pool's next heartbeat. A pool in a process
/// of its own on a 10-minute lease (a heartbeat every 2 minutes) runs a job limited to
/// 300 ms whose handler waits an hour for its interruption: the attempt ends timed out at
/// its deadline, long before the next heartbeat could have ended it.
#[test]
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn a_pool_process_stops_a_job_at_its_time_limit_not_at_its_next_heartbeat() {
    let mut db = db!("time limit across processes");
    let store = db.store();
    db.sql("CREATE TABLE {s}.effects (job bigint NOT NULL, who text NOT NULL)");
    // (the helper's handlers of even jobs wait for their interruption: job 1 goes elsewhere)
    store.enqueue(NewJob::new("elsewhere", "odd")).unwrap();
    let limit = Duration::from_millis(300);
    let id = store
        .enqueue(NewJob::new("pp", "slow").time_limit(limit))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut pool = PgPool::start(&[], &db.url, &db, 600_000, 1, &dir.path().join("go"));
    assert_eq!(pool.next_line("started "), id.0.to_string());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while store.job(id).unwrap().unwrap().state() == JobState::Running {
        assert!(
            std::time::Instant::now() < deadline,
            "still running a minute on"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let why = pool.next_line("interrupted ");
    assert!(why.contains("TimedOut"), "{why}");
    assert_eq!(
        store.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    drop(pool.process.stdin.take());
    let _ = pool.process.wait();
}

#[test]
fn a_stopped_pool_process_past_its_leases_is_taken_over_and_its_late_writes_are_counted() {
    let mut db = db!("stopped pool");
    let store = db.store();
    db.sql("CREATE TABLE {s}.effects (job bigint NOT NULL, who text NOT NULL)");
    let ids: BTreeSet<u64> = store
        .enqueue_batch((0..2).map(|i| NewJob::new("pp", format!("{i}"))))
        .unwrap()
        .iter()
        .map(|id| id.0)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let mut pool = PgPool::start(&[], &db.url, &db, 1000, 2, &go);
    let started: BTreeSet<u64> = (0..2)
        .map(|_| pool.next_line("started ").parse().unwrap())
        .collect();
    assert_eq!(started, ids);
    let before = store.stats().unwrap().counters;
    let pid = libc::pid_t::try_from(pool.process.id()).unwrap();
    // SAFETY: kill(2) with a pid this test started and still owns; no memory is touched.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // its leases run out on the database's clock while it is stopped; a survivor takes them
    let mut taken = BTreeSet::new();
    wait_until("the survivor to take both jobs over", || {
        survive(&store, &db.schema, &mut taken);
        taken.len() == 2
    });
    // woken, the stopped handlers finish and try to commit: refused, and counted
    std::fs::write(&go, b"").unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    pool.next_line("finishing ");
    drop(pool.process.stdin.take());
    let stats = pool.next_line("stats ");
    let _ = pool.process.wait();
    let after = store.stats().unwrap().counters;
    assert_eq!(
        after.reclaimed_by_takeover - before.reclaimed_by_takeover,
        2,
        "both leases taken over at claim"
    );
    // Woken, each of the pool's two attempts writes late: its end, refused by the fence, or
    // first its renewal, refused, after which the pool withholds the end. Which comes
    // first is the scheduler's choice (on a loaded machine the heartbeat's overdue timer
    // often wins); either way the store counts a refusal for each.
    let refused = (after.fenced_writes_rejected - before.fenced_writes_rejected)
        + (after.leases_lost - before.leases_lost);
    assert!(
        refused >= 2,
        "each late writer refused and counted: {before:?} -> {after:?}"
    );
    let rejected: u64 = stats.split(' ').next().unwrap().parse().unwrap();
    assert!(
        rejected >= 1,
        "the pool counted its refused or withheld results: {stats}"
    );
    let effects = effects(&mut db);
    assert_eq!(
        effects,
        ids.iter()
            .map(|id| (*id as i64, "survivor".to_owned()))
            .collect::<Vec<_>>(),
        "one effect per job, the survivor's"
    );
}

/// The command that restarts the server, for the one test that restarts it.
fn restart_command() -> Option<String> {
    let command = std::env::var("LEASEHOLD_PG_RESTART").ok();
    if command.is_none() {
        crate::say("the restart test did not run: LEASEHOLD_PG_RESTART is not set");
    }
    command
}

/// Run alone (a restart ends every other test's connections), where the server may be
/// restarted: `LEASEHOLD_PG_RESTART='pg_ctlcluster 15 main restart -m immediate' cargo test
/// --all-features --test postgres -- --ignored --exact attacks::a_restart_…`.
#[test]
#[ignore = "restarts the server: run alone, with LEASEHOLD_PG_RESTART set"]
fn a_restart_mid_transaction_rolls_it_back_and_a_working_pool_goes_on_with_each_effect_once() {
    let Some(restart) = restart_command() else {
        return;
    };
    let mut db = db!("restart");
    let store = db.store();
    db.sql("CREATE TABLE {s}.effects (job bigint NOT NULL, who text NOT NULL)");
    let ids = store
        .enqueue_batch((0..300).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let table = format!("{}.effects", db.schema);
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = done.clone();
    let pool = WorkerPool::builder(store.clone(), Q)
        .concurrency(4)
        .lease(Duration::from_secs(2))
        .start(move |ctx| {
            std::thread::sleep(Duration::from_millis(20));
            counted.fetch_add(1, Ordering::Relaxed);
            let (job, sql) = (
                ctx.job().0 as i64,
                format!("INSERT INTO {table} VALUES ($1, 'pool')"),
            );
            Ok(Output::with_sql(Vec::new(), move |t| {
                t.sql().execute(&sql, &[&job])?;
                Ok::<(), postgres::Error>(())
            }))
        })
        .unwrap();
    wait_until("the pool to be under way", || {
        done.load(Ordering::Relaxed) >= 50
    });
    // A transaction that enqueued, then waits in the server when it restarts.
    let answer = std::thread::scope(|s| {
        let open = s.spawn(|| {
            store.transaction(|t| {
                t.enqueue(NewJob::new("in-flight", "x"))?;
                t.sql().batch_execute("SELECT pg_sleep(30)")?;
                Ok(())
            })
        });
        wait_until("the transaction sleeping in the server", || {
            let rows = db
                .admin
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                    &[],
                )
                .unwrap();
            !rows.is_empty()
        });
        let status = std::process::Command::new("sh")
            .args(["-c", &restart])
            .status()
            .unwrap();
        assert!(status.success(), "{restart}: {status}");
        open.join().unwrap()
    });
    let e = answer.expect_err("a transaction the restart ended");
    assert!(matches!(e, Error::Postgres(_)), "{e:?}");
    crate::say(&format!("the transaction the restart ended: {e}"));
    // the pool goes on by itself: every job once, every effect once
    assert!(pool.wait_idle(Duration::from_secs(120)).unwrap());
    let stats = pool.stats();
    drop(pool);
    crate::say(&format!("the pool across the restart: {stats:?}"));
    wait_until(
        "the admin connection back",
        || match postgres::Client::connect(&db.url, postgres::NoTls) {
            Ok(c) => {
                db.admin = c;
                true
            }
            Err(_) => false,
        },
    );
    for id in &ids {
        assert_eq!(
            store.job(*id).unwrap().unwrap().state(),
            JobState::Succeeded
        );
    }
    let effects = effects(&mut db);
    assert_eq!(
        effects,
        ids.iter()
            .map(|id| (id.0 as i64, "pool".to_owned()))
            .collect::<Vec<_>>(),
        "one effect per job"
    );
    // and what the ended transaction enqueued is not there
    let in_flight = store
        .jobs(&leasehold::JobFilter {
            queue: Some("in-flight".into()),
            ..Default::default()
        })
        .unwrap();
    assert!(in_flight.is_empty(), "{in_flight:?}");
    assert!(store.check().unwrap().is_clean());
}

/// Claims of a keyed queue that deadlock (forced here: a trigger on the limit keys' table
/// raises SQLSTATE 40P01 for its first 12 writes) fail whole rounds after five tries each.
/// The pool claims again milliseconds later, not a heartbeat later: with an hour's lease
/// (a heartbeat every 20 minutes) every job still runs, once.
#[test]
fn a_keyed_pool_whose_claims_deadlock_claims_again_soon_not_a_heartbeat_later() {
    let mut db = db!("keyed_deadlocks");
    let store = db.store();
    store.declare_queue(Q).unwrap();
    store
        .set_queue_limits(Q, leasehold::QueueLimits::none().per_key(2))
        .unwrap();
    let jobs: Vec<NewJob> = (0..20)
        .map(|i| NewJob::new(Q, format!("{i}")).limit_key(format!("tenant-{}", i % 4)))
        .collect();
    store.enqueue_batch(jobs).unwrap();
    db.sql(
        "CREATE SEQUENCE {s}.forced;
         CREATE FUNCTION {s}.deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('{s}.forced') <= 12 THEN
                 RAISE EXCEPTION 'deadlock forced by the test' USING ERRCODE = '40P01';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER deadlock BEFORE INSERT OR UPDATE ON {s}.leasehold_limit_keys
             FOR EACH ROW EXECUTE FUNCTION {s}.deadlock();",
    );
    let ran = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let pool = WorkerPool::builder(store.clone(), Q)
        .concurrency(4)
        .lease(Duration::from_secs(3600))
        .start(move |_ctx| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(Output::new(Vec::new()))
        })
        .unwrap();
    wait_until("every job to succeed", || {
        store.stats().unwrap().total(JobState::Succeeded) == 20
    });
    let stats = pool.stats();
    pool.shutdown(Duration::from_secs(10));
    assert!(stats.claim_errors >= 2, "rounds failed whole: {stats:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 20, "each job ran once");
}

/// A keyed claim that waits for its key's row (another transaction holds it) decides at a
/// time read after the wait: its lease's claim time is not before the lock was let go, and
/// it is the very instant the key's rate window records. So a history audited against the
/// rate shows the times the rate was judged at.
#[test]
fn a_keyed_claim_that_waited_for_its_key_is_dated_after_the_wait_and_its_window_records_that_instant()
 {
    let mut db = db!("keyed_claim_time");
    let store = db.store();
    let limits = leasehold::QueueLimits::none().per_key_rate(2, Duration::from_secs(3600));
    store.declare_queue(Q).unwrap();
    store.set_queue_limits(Q, limits).unwrap();
    let id = store
        .enqueue(NewJob::new(Q, "x").limit_key("tenant"))
        .unwrap();
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    let keys = format!("{}.leasehold_limit_keys", db.schema);
    let held = tx
        .execute(
            &format!("SELECT 1 FROM {keys} WHERE key = 'tenant' FOR UPDATE"),
            &[],
        )
        .unwrap();
    assert_eq!(held, 1, "the key has its record while its job waits");
    let claiming = {
        let store = store.clone();
        std::thread::spawn(move || store.claim(Q, "w", LEASE))
    };
    wait_until("the claim to wait for the key's row", || {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND query LIKE '%leasehold_limit_keys%'";
        db.admin
            .query_one(sql, &[])
            .unwrap()
            .try_get::<_, i64>(0)
            .unwrap()
            == 1
    });
    let released: i64 = tx
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint",
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    tx.rollback().unwrap();
    let lease = claiming.join().unwrap().unwrap().unwrap();
    assert_eq!(lease.job, id);
    let claimed_us = (lease.claimed_at.as_nanos() / 1000) as i64;
    assert!(
        claimed_us >= released,
        "the claim is dated {claimed_us}, before the lock it waited for was let go at {released}"
    );
    let recorded: Vec<i64> = db
        .admin
        .query_one(
            &format!("SELECT recent FROM {keys} WHERE key = 'tenant'"),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(
        recorded,
        vec![claimed_us],
        "the rate window keeps the claim's own instant"
    );
    assert_eq!(
        store
            .job(id)
            .unwrap()
            .unwrap()
            .lease()
            .unwrap()
            .claimed_at(),
        lease.claimed_at
    );
}

/// A row with `run_at = 'infinity'` (which `add_job` let in before it refused it) reads,
/// lists and cancels like any other; a row damaged by hand (its `flow` bytes no record) is
/// left out of a listing, which lists the rest; and `add_job` now refuses `infinity`.
#[test]
fn a_row_with_an_infinite_time_is_read_listed_and_cancelled_and_a_damaged_row_is_left_out() {
    let mut db = db!("unreadable_rows");
    let store = db.store();
    let far = store.enqueue(NewJob::new(Q, "far")).unwrap();
    let damaged = store.enqueue(NewJob::new(Q, "damaged")).unwrap();
    let plain = store.enqueue(NewJob::new(Q, "plain")).unwrap();
    db.sql(&format!(
        "UPDATE {{s}}.leasehold_jobs SET run_at = 'infinity' WHERE id = {far}"
    ));
    db.sql(&format!(
        "UPDATE {{s}}.leasehold_jobs SET flow = '\\x0102' WHERE id = {damaged}"
    ));
    let job = store.job(far).unwrap().unwrap();
    let century = Duration::from_secs(100 * 365 * 86_400);
    assert!(job.run_at() > store.now().unwrap().saturating_add(century));
    let queued = leasehold::JobFilter {
        queue: Some(Q.into()),
        ..leasehold::JobFilter::default()
    };
    let listed: Vec<_> = store
        .jobs(&queued)
        .unwrap()
        .iter()
        .map(|j| j.id())
        .collect();
    assert_eq!(
        listed,
        [far, plain],
        "the damaged row is left out, the rest listed"
    );
    assert_eq!(store.cancel(far).unwrap(), JobState::Cancelled);
    let run_at: String = db
        .admin
        .query_one(
            &format!(
                "SELECT run_at::text FROM {}.leasehold_jobs WHERE id = $1",
                db.schema
            ),
            &[&(far.0 as i64)],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(run_at, "infinity", "written back as it was");
    let refused = db.admin.query_one(
        &format!("SELECT {}.add_job('q', run_at => 'infinity')", db.schema),
        &[],
    );
    let refused = refused.unwrap_err();
    assert!(
        refused.to_string().contains("finite") || format!("{refused:?}").contains("finite"),
        "{refused:?}"
    );
}
