//! The protocol, pools, partitions and kills on a real server.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold::Renewal;
use leasehold::postgres::client as postgres;
use leasehold::postgres::{PgError, PgStore};
use leasehold::{EndCursor, EndOf, Error, JobState, LeaseTerms, NewJob, Outcome, ReclaimPath};
use leasehold::{JobStore, ReadJobs};

use crate::db::{Db, Helper, LEASE, PgPool, Q, effects, effects_per_job, survive, wait_until};
use crate::say;

#[test]
fn a_job_is_enqueued_claimed_and_completed_with_its_history() {
    let db = db!("round trip");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "photo-1.jpg")).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!((lease.job, lease.attempt.0), (id, 1));
    assert_eq!(lease.payload, b"photo-1.jpg");
    assert!(lease.expires_at > lease.claimed_at);
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Running);
    assert!(
        store.claim(Q, "w", LEASE).unwrap().is_none(),
        "nothing else to claim"
    );
    store.complete(&lease, b"thumb").unwrap();
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Succeeded);
    assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"thumb"[..]));
    let history = store.history(id).unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].worker(), history[0].outcome()),
        ("w", Some(&Outcome::Succeeded))
    );
    assert_eq!(store.stats().unwrap().total(JobState::Succeeded), 1);
}

#[test]
fn a_claim_reads_the_jobs_it_takes_not_every_waiting_job_of_the_queue() {
    let mut db = db!("claim reads");
    let store = db.store();
    // A queue as deep as the drain where the claim's plan sorted every waiting job (from
    // about this depth the planner put the index scan on the inner side of the join with
    // the time, whose order it does not keep).
    let mut first = None;
    for chunk in 0..120 {
        let ids = store
            .enqueue_batch((0..500).map(|i| NewJob::new(Q, format!("{chunk}.{i}"))))
            .unwrap();
        first = first.or(ids.first().copied());
    }
    let first = first.unwrap();
    // What the claims read of the ready index, from the server's statistics (which a
    // backend reports at the end of a statement a second after its last report, or 10 s
    // after it went idle): nothing read it before them.
    let read = |db: &mut Db| -> i64 {
        db.admin
            .query_one(
                "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
                 WHERE schemaname = $1 AND indexrelname = 'leasehold_jobs_ready'",
                &[&db.schema],
            )
            .unwrap()
            .try_get(0)
            .unwrap()
    };
    for _ in 0..8 {
        assert_eq!(store.claim_batch(Q, "w", LEASE, 10).unwrap().len(), 10);
    }
    let mut tuples = 0;
    wait_until("the claims' reads in the statistics", || {
        store.job(first).unwrap(); // (by its id: a statement that reads no ready index)
        tuples = read(&mut db);
        tuples > 0
    });
    // The ready index's order serves each claim, which stops at its tenth job (150 entries
    // read for the eight); the plan that sorted read every waiting job each time (479,790).
    assert!(tuples < 2_000, "8 claims of 10 read {tuples} index entries");
}

/// A waiter that read its queue's generation before the handle's listener listened (the
/// first read starts it) is woken once it does: an enqueue committed in between sent its
/// notification to nobody, and was found only by the pools' own looks, or, for a
/// `wait_for_work` caller, at its timeout. (Here nothing is enqueued: the wake-up is the
/// listener's own, and without it the wait would last its minute.)
#[test]
fn a_waiter_from_before_the_listener_listened_is_woken_when_it_does() {
    let db = db!("listen start");
    let store = db.store();
    let seen = store.work_generation(Q);
    let now = store.wait_for_work(Q, seen, Duration::from_secs(60));
    assert_ne!(
        now, seen,
        "woken by the listener's start, not by the timeout"
    );
}

/// A handle closed as its listener starts closes at once. The wake-up a closing handle
/// sends its listener is lost when it goes out before the listener listens; the listener
/// then saw its stop flag only at its next quiet half-minute, and the close waited that
/// long for it (a third of the runs of a test that opened, enqueued and closed). Each round
/// closes a little later after the start, so that some close lands in that window.
#[test]
fn a_handle_closed_as_its_listener_starts_closes_without_waiting_for_it() {
    let db = db!("close as the listener starts");
    for round in 0..30 {
        let store = db.store();
        let (closed, was_closed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            store.work_generation(Q); // (starts the listener)
            std::thread::sleep(Duration::from_micros(200 * round));
            drop(store);
            let _ = closed.send(());
        });
        // Far over a connection's start on a loaded machine, under the half-minute.
        let waited = was_closed.recv_timeout(Duration::from_secs(20));
        assert!(
            waited.is_ok(),
            "round {round}: the close waited for the listener"
        );
    }
}

/// A scheduler on PostgreSQL sleeps until its next tick, and a schedule declared on another
/// machine wakes it (a notification on the store's channel): here its interval is an hour,
/// so a scheduler that only looked every interval would fire nothing.
#[test]
fn a_schedule_declared_on_another_machine_wakes_the_scheduler() {
    let db = db!("schedules across machines");
    let here = db.store();
    let scheduler = leasehold::Scheduler::start(here.clone(), Duration::from_secs(3600)).unwrap();
    // Its first pass, then one more once its listener listens (which wakes it): from then
    // on nothing but a notification wakes it before its next tick.
    wait_until("the scheduler's pass once it listens", || {
        scheduler.metrics().passes() >= 2
    });
    let there = db.store();
    let tick = Duration::from_secs(1); // (the shortest interval a schedule may have)
    there
        .declare_schedule(leasehold::Schedule::every(
            "often",
            tick,
            NewJob::new(Q, "tick"),
        ))
        .unwrap();
    wait_until("this machine's scheduler to fire the tick", || {
        scheduler.metrics().fired() >= 1
    });
    assert!(here.stats().unwrap().total(JobState::Queued) >= 1);
}

#[test]
fn concurrent_claimers_never_both_win_a_job() {
    let db = db!("claim race");
    let store = db.store();
    let ids = store
        .enqueue_batch((0..200).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let claimed: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|w| {
                let store = store.clone();
                s.spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(l) = store
                        .claim_batch(Q, &format!("w{w}"), LEASE, 3)
                        .unwrap()
                        .pop()
                    {
                        mine.push(l.job.0);
                        // the batch may have claimed more: complete them all
                        let _ = store.complete(&l, b"");
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // every job was claimed by exactly one claimer, or left claimed by a batch's extras
    let all: Vec<u64> = claimed.into_iter().flatten().collect();
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "a job was claimed twice");
    let stats = store.stats().unwrap();
    assert_eq!(
        stats.total(JobState::Succeeded) + stats.total(JobState::Running),
        ids.len() as u64
    );
    for id in ids {
        let job = store.job(id).unwrap().unwrap();
        assert_eq!(job.attempt().0, 1, "job {id} was claimed more than once");
    }
}

/// Limits per key across connections: eight claimers (each claim on a connection of its
/// own) share five tenants at two jobs each. Each counts a job from after its claim
/// committed to before its completion, so the count never exceeds what the store holds; no
/// claim fails (the key's row orders them; none deadlocks), and every job runs once.
#[test]
fn claimers_on_many_connections_keep_each_tenants_limit_and_run_every_job_once() {
    use std::collections::BTreeMap;
    let db = db!("keyed race");
    let store = db.store();
    store.declare_queue(Q).unwrap();
    (store.set_queue_limits(Q, leasehold::QueueLimits::none().per_key(2))).unwrap();
    let jobs = 300u64;
    let batch = (0..jobs).map(|i| {
        let tenant = format!("tenant-{}", i % 5);
        NewJob::new(Q, tenant.clone()).limit_key(tenant)
    });
    store.enqueue_batch(batch).unwrap();
    let counts = parking_lot::Mutex::new((BTreeMap::<String, usize>::new(), BTreeMap::new()));
    std::thread::scope(|s| {
        for w in 0..8 {
            let (store, counts) = (store.clone(), &counts);
            s.spawn(move || {
                loop {
                    let got = store.claim_batch(Q, &format!("w{w}"), LEASE, 2).unwrap();
                    if got.is_empty() {
                        if store.stats().unwrap().total(JobState::Succeeded) == jobs {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    for lease in &got {
                        let tenant = String::from_utf8_lossy(&lease.payload).into_owned();
                        let mut c = counts.lock();
                        let now = {
                            let n = c.0.entry(tenant.clone()).or_default();
                            *n += 1;
                            *n
                        };
                        let most = c.1.entry(tenant).or_default();
                        *most = now.max(*most);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    for lease in &got {
                        let tenant = String::from_utf8_lossy(&lease.payload).into_owned();
                        *counts.lock().0.get_mut(&tenant).unwrap() -= 1;
                        store.complete(lease, b"").unwrap();
                    }
                }
            });
        }
    });
    let most = counts.into_inner().1;
    assert_eq!(most.len(), 5);
    assert!(
        most.values().all(|m| *m <= 2),
        "a tenant above its limit: {most:?}"
    );
    assert!(
        most.values().any(|m| *m == 2),
        "no tenant reached its limit: {most:?}"
    );
    for id in 1..=jobs {
        let job = store.job(leasehold::JobId(id)).unwrap().unwrap();
        assert_eq!(
            (job.state(), job.attempt().0),
            (JobState::Succeeded, 1),
            "job {id}"
        );
    }
}

#[test]
fn a_claim_takes_the_most_urgent_job_and_skips_delayed_ones() {
    let db = db!("urgency");
    let store = db.store();
    let late = store.enqueue(NewJob::new(Q, "late").priority(5)).unwrap();
    let urgent = store
        .enqueue(NewJob::new(Q, "urgent").priority(-1))
        .unwrap();
    let delayed = store
        .enqueue(
            NewJob::new(Q, "delayed")
                .priority(-9)
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let order: Vec<_> = store
        .claim_batch(Q, "w", LEASE, 10)
        .unwrap()
        .iter()
        .map(|l| l.job)
        .collect();
    assert_eq!(order, vec![urgent, late]);
    assert_eq!(
        store.job(delayed).unwrap().unwrap().state(),
        JobState::Queued
    );
}

#[test]
fn an_expired_lease_is_taken_over_and_the_old_holder_is_fenced() {
    let mut db = db!("takeover");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let old = store.claim(Q, "a", LEASE).unwrap().unwrap();
    assert!(matches!(
        store.heartbeat(&old, 1).unwrap(),
        Renewal::Renewed { .. }
    ));
    db.lapse(id);
    let new = store.claim(Q, "b", LEASE).unwrap().unwrap();
    assert_eq!((new.job, new.attempt.0), (id, 2));
    let lost = store.heartbeat(&old, 2).unwrap_err();
    assert!(lost.is_lease_lost(), "{lost}");
    assert!(store.complete(&old, b"late").unwrap_err().is_lease_lost());
    assert!(store.fail(&old, "late").unwrap_err().is_lease_lost());
    let history = store.history(id).unwrap();
    assert!(matches!(
        history[0].outcome(),
        Some(Outcome::LeaseExpired {
            path: ReclaimPath::Takeover,
            ..
        })
    ));
    assert_eq!(history[0].progress(), 1, "the renewal's progress is kept");
    store.complete(&new, b"").unwrap();
    let c = store.stats().unwrap().counters;
    assert_eq!(
        (
            c.reclaimed_by_takeover,
            c.leases_lost,
            c.fenced_writes_rejected
        ),
        (1, 1, 2)
    );
    assert_eq!(store.job(id).unwrap().unwrap().failures(), 1);
}

#[test]
fn the_reaper_takes_back_expired_leases_in_bounded_batches_and_leaves_renewed_ones() {
    let mut db = db!("reaper");
    let store = db.builder().reap_batch(3).open().unwrap();
    let ids = store
        .enqueue_batch((0..10).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let leases = store.claim_batch(Q, "w", LEASE, 10).unwrap();
    assert_eq!(leases.len(), 10);
    for id in &ids[..8] {
        db.lapse(*id);
    }
    // job 9's index entry is in the past but its lease was renewed: caught up, not taken
    db.sql(&format!(
    "UPDATE {{s}}.leasehold_jobs SET lease_indexed_expiry = clock_timestamp() - interval '1 second' WHERE id = {}",
    ids[8].0
));
    let report = store.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 8);
    assert!(
        report.largest_batch <= 3 && report.batches >= 3,
        "{report:?}"
    );
    assert!(
        report
            .reclaimed
            .iter()
            .all(|r| r.path == ReclaimPath::Reaper)
    );
    assert_eq!(
        store.job(ids[8]).unwrap().unwrap().state(),
        JobState::Running
    );
    assert_eq!(
        store.job(ids[0]).unwrap().unwrap().state(),
        JobState::Queued
    );
    assert!(
        store.reap().unwrap().reclaimed.is_empty(),
        "nothing left to take"
    );
    assert_eq!(store.stats().unwrap().counters.reclaimed_by_reaper, 8);
}

#[test]
fn a_failed_job_is_retried_while_its_budget_lasts_then_dead() {
    let db = db!("retries");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x").max_attempts(2)).unwrap();
    let first = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(store.fail(&first, "boom").unwrap(), JobState::RetryWait);
    let second = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(second.attempt.0, 2);
    assert_eq!(store.fail(&second, "boom again").unwrap(), JobState::Dead);
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.last_error()),
        (JobState::Dead, 2, Some("boom again"))
    );
    store.retry(id).unwrap();
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Queued);
    assert_eq!(store.claim(Q, "w", LEASE).unwrap().unwrap().attempt.0, 3);
}

#[test]
fn a_release_gives_the_job_back_without_spending_budget() {
    let db = db!("release");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.release(&l).unwrap();
    let job = store.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
    assert!(store.release(&l).unwrap_err().is_lease_lost());
    assert_eq!(store.stats().unwrap().counters.released, 1);
}

#[test]
fn a_cancel_ends_a_waiting_job_at_once_and_a_running_one_at_its_next_heartbeat() {
    let db = db!("cancel");
    let store = db.store();
    let waiting = store.enqueue(NewJob::new(Q, "a")).unwrap();
    let running = store.enqueue(NewJob::new(Q, "b").priority(-1)).unwrap();
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(l.job, running);
    assert_eq!(store.cancel(waiting).unwrap(), JobState::Cancelled);
    assert_eq!(store.cancel(running).unwrap(), JobState::Running);
    assert_eq!(store.heartbeat(&l, 0).unwrap(), Renewal::Cancelled);
    assert_eq!(
        store.job(running).unwrap().unwrap().state(),
        JobState::Cancelled
    );
    assert!(store.complete(&l, b"").unwrap_err().is_lease_lost());
    store.enqueue(NewJob::new(Q, "c")).unwrap();
    let done = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.complete(&done, b"").unwrap();
    assert!(matches!(
        store.cancel(done.job),
        Err(Error::Refused {
            state: JobState::Succeeded,
            ..
        })
    ));
}

#[test]
fn a_job_that_makes_no_progress_for_its_stall_timeout_loses_its_lease() {
    let mut db = db!("stall");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let terms = LeaseTerms::new(LEASE).stall_timeout(Duration::from_secs(30));
    let l = store.claim(Q, "w", terms).unwrap().unwrap();
    assert!(matches!(
        store.heartbeat(&l, 0).unwrap(),
        Renewal::Renewed { .. }
    ));
    db.sql(&format!(
    "UPDATE {{s}}.leasehold_jobs SET progress_at = clock_timestamp() - interval '31 seconds' WHERE id = {}",
    id.0
));
    assert_eq!(store.heartbeat(&l, 0).unwrap(), Renewal::Stalled);
    let job = store.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::RetryWait, 1));
    assert_eq!(
        store.history(id).unwrap()[0].outcome(),
        Some(&Outcome::Stalled)
    );
    assert_eq!(store.stats().unwrap().counters.stalled, 1);
}

#[test]
fn a_unique_key_deduplicates_live_jobs_and_blocks_a_retry_while_held() {
    let db = db!("unique keys");
    let store = db.store();
    let first = store
        .enqueue(NewJob::new(Q, "a").unique_key("k").max_attempts(1))
        .unwrap();
    let again = store.enqueue(NewJob::new(Q, "b").unique_key("k")).unwrap();
    assert_eq!(first, again);
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.fail(&l, "x").unwrap(); // dead: the key is free
    let second = store.enqueue(NewJob::new(Q, "c").unique_key("k")).unwrap();
    assert_ne!(second, first);
    assert!(matches!(
        store.retry(first),
        Err(Error::UniqueKeyHeld { holder, .. }) if holder == second
    ));
}

#[test]
fn application_writes_commit_with_the_completion_and_not_after_the_fence_refused_it() {
    let mut db = db!("complete_with");
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.sent (job bigint PRIMARY KEY, body text)");
    let store = db.store();
    let table = format!("{}.sent", db.schema);
    let id = store.enqueue(NewJob::new(Q, "hello")).unwrap();
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store
        .complete_with(&l, b"ok", |t| {
            t.sql().execute(
                &format!("INSERT INTO {table} VALUES ($1, 'hello')"),
                &[&(id.0 as i64)],
            )?;
            t.enqueue(NewJob::new("follow-up", "next"))?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .unwrap();
    let count = |db: &mut Db| -> i64 {
        db.admin
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .unwrap()
            .try_get(0)
            .unwrap()
    };
    assert_eq!(count(&mut db), 1);
    assert_eq!(store.stats().unwrap().queues["follow-up"].total(), 1);

    // a holder whose lease was taken over commits nothing of its own
    let id2 = store.enqueue(NewJob::new(Q, "again")).unwrap();
    let stale = store.claim(Q, "a", LEASE).unwrap().unwrap();
    db.lapse(id2);
    let _taker = store.claim(Q, "b", LEASE).unwrap().unwrap();
    let refused = store.complete_with(&stale, b"late", |t| {
        t.sql()
            .execute(&format!("INSERT INTO {table} VALUES (999, 'late')"), &[])?;
        Ok::<(), postgres::Error>(())
    });
    assert!(refused.unwrap_err().is_lease_lost());
    assert_eq!(count(&mut db), 1);

    // an application error rolls the completion back; the lease holds
    let l3 = store.claim(Q, "b", LEASE).unwrap();
    assert!(l3.is_none(), "job 2 is held by b");
    let id3 = store.enqueue(NewJob::new(Q, "third")).unwrap();
    let l3 = store.claim(Q, "c", LEASE).unwrap().unwrap();
    assert_eq!(l3.job, id3);
    let failed = store.complete_with(&l3, b"", |_t| Err("disk full"));
    assert!(matches!(failed, Err(Error::Application(_))));
    assert_eq!(store.job(id3).unwrap().unwrap().state(), JobState::Running);
}

#[test]
fn a_thousand_leases_renew_in_one_statement_each_with_its_own_answer() {
    let mut db = db!("heartbeat batch");
    let store = db.store();
    store
        .enqueue_batch((0..1000).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let leases = store.claim_batch(Q, "w", LEASE, 1000).unwrap();
    assert_eq!(leases.len(), 1000);
    db.lapse(leases[7].job);
    let _taker = store.claim(Q, "other", LEASE).unwrap().unwrap();
    let beats: Vec<_> = leases.iter().map(|l| (l, 3)).collect();
    let answers = store.heartbeat_batch(&beats);
    assert_eq!(answers.len(), 1000);
    for (i, answer) in answers.iter().enumerate() {
        match i {
            7 => assert!(answer.as_ref().unwrap_err().is_lease_lost()),
            _ => assert!(
                matches!(answer, Ok(Renewal::Renewed { .. })),
                "{i}: {answer:?}"
            ),
        }
    }
}

#[test]
fn hostile_databases_and_settings_get_their_own_errors_and_are_left_as_they_were() {
    let mut db = db!("hostile");
    let pg = |r: leasehold::Result<PgStore>| match r {
        Err(Error::Postgres(e)) => e,
        other => panic!("expected a PostgreSQL error, got {other:?}"),
    };
    assert!(matches!(
        pg(PgStore::open("postgres://no such host:::/")),
        PgError::BadUrl(_)
    ));
    assert!(matches!(
        pg(PgStore::builder(&db.url)
            .schema("Robert'); DROP TABLE x;--")
            .open()),
        PgError::BadSchemaName(_)
    ));
    assert!(matches!(
        pg(PgStore::open(
            "postgres://postgres@127.0.0.1:1/test?connect_timeout=5"
        )),
        PgError::Connect(_)
    ));
    // a schema with a table of leasehold's name that is not leasehold's
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.leasehold_jobs (x int); INSERT INTO {s}.leasehold_jobs VALUES (1)");
    assert!(matches!(
        pg(db.builder().open()),
        PgError::NotALeaseholdSchema { .. }
    ));
    let rows: i64 = db
        .admin
        .query_one(
            &format!("SELECT count(*) FROM {}.leasehold_jobs", db.schema),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(rows, 1, "the foreign table was left as it was");
    db.sql("DROP TABLE {s}.leasehold_jobs");
    // a schema made by a newer leasehold
    drop(db.store());
    db.sql("UPDATE {s}.leasehold_meta SET value = '99' WHERE key = 'schema_version'");
    assert!(matches!(
        pg(db.builder().open()),
        PgError::NewerSchema { found: 99, .. }
    ));
}

#[test]
fn a_job_that_succeeded_before_the_upgrade_to_version_3_keeps_its_history_and_one_after_it_too() {
    let mut db = db!("upgrade from 2");
    let store = db.store();
    let before = store.enqueue(NewJob::new(Q, "before")).unwrap();
    let lease = store.claim(Q, "old", LEASE).unwrap().unwrap();
    store.complete(&lease, b"").unwrap();
    drop(store);
    // What a version 2 build made and left: no columns of the last attempt, and the
    // succeeded attempt's history row.
    db.sql(
        "INSERT INTO {s}.leasehold_runs (job, attempt, worker, claimed_at, ended_at, outcome, progress)
         SELECT id, attempt, last_worker, last_claimed_at, finished_at, 'succeeded', progress
         FROM {s}.leasehold_jobs;
         ALTER TABLE {s}.leasehold_jobs DROP COLUMN last_worker, DROP COLUMN last_claimed_at;
         UPDATE {s}.leasehold_meta SET value = '2' WHERE key = 'schema_version'",
    );
    let store = db.builder().open().unwrap();
    assert_eq!(store.upgraded_from(), Some(2));
    let after = store.enqueue(NewJob::new(Q, "after")).unwrap();
    let lease = store.claim(Q, "new", LEASE).unwrap().unwrap();
    store.heartbeat(&lease, 5).unwrap();
    store.complete(&lease, b"").unwrap();
    for (job, worker, progress) in [(before, "old", 0), (after, "new", 5)] {
        let history = store.history(job).unwrap();
        assert_eq!(history.len(), 1, "job {job}: {history:?}");
        let run = &history[0];
        let finished = store.job(job).unwrap().unwrap().finished_at();
        assert_eq!(
            (run.attempt().0, run.worker(), run.outcome(), run.progress()),
            (1, worker, Some(&Outcome::Succeeded), progress),
            "job {job}"
        );
        assert_eq!(run.ended_at(), finished, "job {job}");
    }
    let report = store.check().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn opening_an_older_schema_upgrades_it_and_says_so_once_and_a_readers_open_leaves_it() {
    let mut db = db!("upgrade");
    let id = db
        .store()
        .enqueue(NewJob::new(Q, "x").unique_key("k"))
        .unwrap();
    // What a version 1 build made: no columns of time limits, windows or metadata, and the
    // unique index over live jobs only.
    db.sql(
        "ALTER TABLE {s}.leasehold_jobs DROP COLUMN lease_deadline, DROP COLUMN time_limit_us,
             DROP COLUMN unique_for_us, DROP COLUMN key_released, DROP COLUMN metadata,
             DROP COLUMN last_worker, DROP COLUMN last_claimed_at;
         ALTER TABLE {s}.leasehold_runs DROP COLUMN time_limit_us;
         CREATE UNIQUE INDEX leasehold_jobs_unique ON {s}.leasehold_jobs (queue, unique_key)
             WHERE unique_key IS NOT NULL AND state IN ('queued', 'running', 'retry_wait');
         UPDATE {s}.leasehold_meta SET value = '1' WHERE key = 'schema_version'",
    );
    let version = |db: &mut crate::db::Db| -> String {
        db.admin
            .query_one(
                &format!(
                    "SELECT value FROM {}.leasehold_meta WHERE key = 'schema_version'",
                    db.schema
                ),
                &[],
            )
            .unwrap()
            .try_get(0)
            .unwrap()
    };
    // a reader (the tool's read commands) is refused, naming the remedy, and changes nothing
    let e = db.builder().create_if_missing(false).open().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Postgres(PgError::OlderSchema {
                found: 1,
                supported: leasehold::postgres::SCHEMA_VERSION,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("open it once for writing"), "{e}");
    assert_eq!(version(&mut db), "1");
    // a writer's open upgrades it, and says so once
    let store = db.builder().open().unwrap();
    assert_eq!(store.upgraded_from(), Some(1));
    assert_eq!(
        version(&mut db),
        leasehold::postgres::SCHEMA_VERSION.to_string()
    );
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.unique_key()),
        (JobState::Queued, Some("k"))
    );
    assert_eq!(job.uniqueness(), leasehold::Uniqueness::WhileUnfinished);
    // the old job keeps its key under the new index, and the new columns work
    assert_eq!(
        store
            .enqueue(NewJob::new(Q, "again").unique_key("k"))
            .unwrap(),
        id
    );
    let tagged = store
        .enqueue(NewJob::new(Q, "y").metadata("tenant", "7"))
        .unwrap();
    assert_eq!(
        store.job(tagged).unwrap().unwrap().metadata_value("tenant"),
        Some("7")
    );
    drop(store);
    assert_eq!(db.builder().open().unwrap().upgraded_from(), None);
}

/// Each job's SQL commits once, with its completion; and the completions of a pool of short
/// jobs share their transactions (each row records the one it committed in), under a fence
/// each, rather than take one commit per job.
#[test]
fn a_pool_on_postgres_runs_every_job_once_with_its_sql_in_the_completion() {
    let mut db = db!("pool");
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.done (job bigint NOT NULL, xid bigint NOT NULL)");
    let store = db.store();
    let table = format!("{}.done", db.schema);
    let ids = store
        .enqueue_batch((0..200).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let pool = leasehold::WorkerPool::builder(store.clone(), Q)
        .concurrency(4)
        .start(move |ctx| {
            let (job, table) = (ctx.job().0 as i64, table.clone());
            Ok(leasehold::Output::with_sql(
                ctx.payload().to_vec(),
                move |t| {
                    let sql = format!("INSERT INTO {table} VALUES ($1, txid_current())");
                    t.sql().execute(&sql, &[&job])?;
                    Ok::<(), postgres::Error>(())
                },
            ))
        })
        .unwrap();
    assert!(pool.wait_idle(Duration::from_secs(60)).unwrap());
    drop(pool);
    for id in &ids {
        assert_eq!(
            store.job(*id).unwrap().unwrap().state(),
            JobState::Succeeded
        );
    }
    let per_job: Vec<(i64, i64)> = db
        .admin
        .query(
            &format!("SELECT job, count(*) FROM {}.done GROUP BY job", db.schema),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.try_get(0).unwrap(), r.try_get(1).unwrap()))
        .collect();
    assert_eq!(per_job.len(), ids.len());
    assert!(
        per_job.iter().all(|(_, n)| *n == 1),
        "a job's SQL committed twice"
    );
    let transactions: i64 = db
        .admin
        .query_one(
            &format!("SELECT count(DISTINCT xid) FROM {}.done", db.schema),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert!(
        transactions < 200,
        "{transactions} transactions for 200 completions"
    );
}

#[test]
fn a_pool_whose_lease_is_taken_over_stops_its_handler_and_commits_nothing() {
    let mut db = db!("pool takeover");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let pool = leasehold::WorkerPool::builder(store.clone(), Q)
        .lease(LEASE)
        .heartbeat_every(Duration::from_millis(20))
        .start(move |ctx| {
            let stopped = ctx.sleep(Duration::from_secs(3600));
            let _ = tx.send(stopped);
            stopped?;
            Ok(b"too late".to_vec())
        })
        .unwrap();
    // (started, not only claimed: a job interrupted before its worker takes it is not run)
    wait_until("the job to run", || {
        let stats = pool.stats();
        stats.in_flight == 1 && stats.claimed_ahead == 0
    });
    // The pool renews every 20 ms, and a renewal between the lapse and the claim puts the
    // expiry back in the future (once a flaky failure on a loaded machine): lapse and claim
    // again until a claim falls between two renewals.
    let mut taker = None;
    wait_until("a claim to take the lapsed lease over", || {
        db.lapse(id);
        taker = store.claim(Q, "other", LEASE).unwrap();
        taker.is_some()
    });
    let taker = taker.unwrap();
    assert_eq!(taker.attempt.0, 2);
    let stopped = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(
        stopped,
        Err(leasehold::Interrupted(leasehold::Interruption::LeaseLost))
    );
    drop(pool);
    store.complete(&taker, b"mine").unwrap();
    assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"mine"[..]));
}

#[test]
fn a_reaper_thread_on_postgres_takes_back_an_expired_lease() {
    let mut db = db!("reaper thread");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    store.claim(Q, "silent", LEASE).unwrap().unwrap();
    db.lapse(id);
    let reaper = leasehold::Reaper::start(store.clone(), Duration::from_millis(20)).unwrap();
    // (the pass counts what it took back once it is over: after its commit is seen)
    wait_until("the reaper to take the lease back and count it", || {
        reaper.metrics().reclaimed() >= 1
    });
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Queued);
}

/// On a pool typed by its store (`WorkerPool::builder(pg_store, ..)`) redb writes do not
/// compile (the `compile_fail` example of `Output`); a pool on a `Backend` chosen at run time
/// takes either kind, and refuses the wrong one when it commits.
#[test]
fn a_pool_on_postgres_refuses_redb_writes_and_fails_the_attempt_saying_why() {
    let db = db!("wrong writes");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let pool = leasehold::WorkerPool::builder(leasehold::Backend::from(store.clone()), Q)
        .start(|_ctx| {
            Ok(
                leasehold::Output::with_writes(Vec::new(), |_txn| Ok::<(), leasehold::Error>(()))
                    .into_any(),
            )
        })
        .unwrap();
    wait_until("the attempt to fail", || pool.stats().failed == 1);
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead);
    assert!(
        job.last_error().unwrap().contains("Output::with_sql"),
        "{:?}",
        job.last_error()
    );
}

#[test]
fn an_enqueue_through_one_handle_wakes_a_waiter_of_another_by_notify() {
    let db = db!("notify");
    // two handles: two machines, each with its own connections and its own waiters
    let (here, there) = (db.store(), db.store());
    // the listener starts with the first look; wait until it hears anything at all
    wait_until("the listener to hear an enqueue", || {
        let seen = here.work_generation(Q);
        there.enqueue(NewJob::new(Q, "probe")).unwrap();
        here.wait_for_work(Q, seen, Duration::from_millis(200)) != seen
    });
    // another queue's enqueue, then this queue's: notifications arrive in commit order,
    // so once this queue's has woken the waiter, the other's has been heard too
    let (seen, seen_other) = (here.work_generation(Q), here.work_generation("other"));
    there.enqueue(NewJob::new("other", "x")).unwrap();
    there.enqueue(NewJob::new(Q, "x")).unwrap();
    wait_until("the enqueue on another handle to wake the waiter", || {
        here.wait_for_work(Q, seen, Duration::from_secs(1)) != seen
    });
    assert!(
        here.work_generation("other") > seen_other,
        "the other queue's was heard"
    );
}

/// Where `LISTEN` hears nothing (behind a transaction-mode pooler), an idle pool still
/// finds another machine's work by polling: here a handle with its listener turned off.
#[test]
fn without_listen_an_idle_pool_finds_another_handles_enqueue_by_polling() {
    let mut db = db!("no listen");
    let deaf = db.builder().listen(false).open().unwrap();
    let there = db.store();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    let pool = leasehold::WorkerPool::builder(deaf.clone(), Q)
        .start(move |_| {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Vec::new())
        })
        .unwrap();
    wait_until("the pool to go idle", || pool.stats().idle_waits >= 1);
    for i in 0..3 {
        there.enqueue(NewJob::new(Q, format!("{i}"))).unwrap();
    }
    wait_until("the polling pool to run the other handle's jobs", || {
        there.stats().unwrap().total(JobState::Succeeded) == 3
    });
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
    // No connection of the deaf handle listens; one of a handle with the listener on
    // (the same query finds it) does once its pool waits for work.
    let listeners = |db: &mut Db| -> i64 {
        db.admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
                &[&format!("LISTEN leasehold_{}", db.schema)],
            )
            .unwrap()
            .try_get(0)
            .unwrap()
    };
    assert_eq!(listeners(&mut db), 0);
    let hearing = leasehold::WorkerPool::builder(there.clone(), Q)
        .start(|_| Ok(Vec::new()))
        .unwrap();
    wait_until("the other handle's listener", || listeners(&mut db) == 1);
    drop(hearing);
    drop(pool);
}

/// The pid of the server backend of a connection of this test's schema that waits for a
/// lock, once there is one.
fn waiting_backend(db: &mut Db) -> i32 {
    let mut pid = None;
    let like = format!("%{}%", db.schema);
    wait_until("a statement to wait for the row lock", || {
        pid = db
            .admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                 WHERE query LIKE $1 AND wait_event_type = 'Lock' LIMIT 1",
                &[&like],
            )
            .unwrap()
            .map(|r| r.try_get(0).unwrap());
        pid.is_some()
    });
    pid.unwrap()
}

#[test]
fn a_connection_killed_mid_statement_is_a_typed_error_and_loses_nothing() {
    let mut db = db!("killed backend");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    // hold the job's row, so that the completion waits inside its statement
    let locker = format!(
        "SELECT 1 FROM {}.leasehold_jobs WHERE id = $1 FOR UPDATE",
        db.schema
    );
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let mut held = holder.transaction().unwrap();
    held.execute(&locker, &[&(id.0 as i64)]).unwrap();
    let completing = std::thread::scope(|s| {
        let waiting = s.spawn(|| store.complete(&lease, b"done"));
        let pid = waiting_backend(&mut db);
        db.admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap();
        waiting.join().unwrap()
    });
    held.rollback().unwrap();
    match completing {
        Err(Error::Postgres(_)) => {}
        other => panic!("expected a PostgreSQL error, got {other:?}"),
    }
    // nothing was applied; the next call reconnects and the lease still holds
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Running);
    store.complete(&lease, b"done").unwrap();
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Succeeded);
}

#[test]
fn a_statement_stuck_past_the_timeout_fails_typed_and_changes_nothing() {
    let mut db = db!("statement timeout");
    let store = db
        .builder()
        .statement_timeout(Duration::from_millis(300))
        .open()
        .unwrap();
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    let locker = format!(
        "SELECT 1 FROM {}.leasehold_jobs WHERE id = $1 FOR UPDATE",
        db.schema
    );
    let mut held = db.admin.transaction().unwrap();
    held.execute(&locker, &[&(id.0 as i64)]).unwrap();
    let stuck = store.complete(&lease, b"done");
    held.rollback().unwrap();
    match stuck {
        Err(Error::Postgres(PgError::Database {
            code: Some(code), ..
        })) => {
            assert_eq!(code, "57014", "query_canceled")
        }
        other => panic!("expected a cancelled statement, got {other:?}"),
    }
    assert_eq!(store.job(id).unwrap().unwrap().state(), JobState::Running);
    store.complete(&lease, b"done").unwrap();
}

#[test]
fn a_role_without_rights_is_refused_with_permission_denied() {
    let mut db = db!("no rights");
    let role = format!("{}_norights", db.schema);
    db.sql(&format!("CREATE ROLE {role} LOGIN"));
    db.sql(&format!("REVOKE CREATE ON DATABASE test FROM {role}"));
    let url = match db.url.rsplit_once('@') {
        Some((_, host)) => format!("postgres://{role}@{host}"),
        None => panic!("LEASEHOLD_PG_URL has no user@host: {}", db.url),
    };
    let refused = PgStore::builder(&url).schema(&db.schema).open();
    db.sql(&format!("DROP ROLE {role}"));
    match refused {
        Err(Error::Postgres(PgError::PermissionDenied(why))) => {
            assert!(why.contains("permission denied"), "{why}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

/// Waits until `done` holds of the store's counts; past a generous deadline (a loaded CI
/// machine runs the helper processes slowly), fails naming what is left and who holds it:
/// a bare timeout tells nothing.
fn wait_for_unfinished(
    store: &PgStore,
    what: &str,
    mut done: impl FnMut(&leasehold::Stats) -> bool,
) {
    #[allow(clippy::disallowed_methods)] // a test deadline, not store time
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let stats = store.stats().unwrap();
        if done(&stats) {
            return;
        }
        #[allow(clippy::disallowed_methods)]
        if std::time::Instant::now() > deadline {
            let now = store.now().unwrap();
            let left: Vec<String> = [
                JobState::Running,
                JobState::Queued,
                JobState::RetryWait,
                JobState::Blocked,
                JobState::Dead,
                JobState::Cancelled,
            ]
            .into_iter()
            .flat_map(|state| {
                let filter = leasehold::JobFilter {
                    state: Some(state),
                    limit: Some(5),
                    ..Default::default()
                };
                store.jobs(&filter).unwrap()
            })
            .map(|job| {
                let lease = job.lease().map(|l| {
                    let left = l.expires_at().as_nanos() as i128 - now.as_nanos() as i128;
                    format!("held by {} for {} ms more", l.owner(), left / 1_000_000)
                });
                // How its last attempts ended, and how long each held it.
                let history = store.history(job.id()).unwrap_or_default();
                let last: Vec<String> = (history.iter().rev().take(3))
                    .map(|run| {
                        let held = run.ended_at().map(|end| {
                            (end.as_nanos() as i128 - run.claimed_at().as_nanos() as i128)
                                / 1_000_000
                        });
                        format!("{} {:?} after {held:?} ms", run.worker(), run.outcome())
                    })
                    .collect();
                format!(
                    "job {} {:?} attempt {} failures {} run at +{} ms {:?} needs {:?}; last runs {last:?}",
                    job.id(),
                    job.state(),
                    job.attempt(),
                    job.failures(),
                    (job.run_at().as_nanos() as i128 - now.as_nanos() as i128) / 1_000_000,
                    lease,
                    job.needs(),
                )
            })
            .collect();
            panic!("timed out waiting for {what}: {stats:?}; {left:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kills() -> usize {
    std::env::var("LEASEHOLD_PG_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

/// Enqueues `n` jobs of the queue the `pg-worker` helpers drain.
pub(crate) fn enqueue_kills(store: &PgStore, n: u64) {
    // (attempts enough for a machine loaded by other tests, where a worker may be starved
    // past many short leases: these tests are about effects committed once, not the limit)
    let jobs = (0..n).map(|i| NewJob::new("kills", format!("{i}")).max_attempts(1_000));
    store.enqueue_batch(jobs).unwrap();
}

/// A `pg-worker` helper process and the commits it has reported.
pub(crate) struct PgWorker {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl PgWorker {
    /// `pooled`: a `WorkerPool` (claims ahead, batched completions) rather than claim loops.
    fn start(db: &Db, lease_ms: u64, pooled: bool) -> PgWorker {
        PgWorker::start_at(&db.url, &db.schema, lease_ms, pooled)
    }

    /// [`PgWorker::start`] on the store in `schema` of the database at `url`.
    pub(crate) fn start_at(url: &str, schema: &str, lease_ms: u64, pooled: bool) -> PgWorker {
        PgWorker::start_with(url, schema, lease_ms, pooled, &[])
    }

    /// [`PgWorker::start_at`] with more of the helper's flags.
    fn start_with(url: &str, schema: &str, lease_ms: u64, pooled: bool, more: &[&str]) -> PgWorker {
        let lease_ms = lease_ms.to_string();
        let mut args = vec![
            "--url",
            url,
            "--schema",
            schema,
            "--threads",
            "2",
            "--lease-ms",
            &lease_ms,
        ];
        if pooled {
            args.push("--pool");
        }
        args.extend(more);
        let mut child = super::helper_process::command("pg-worker", args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = super::helper_process::stdout_lines(&mut child);
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        PgWorker { child, lines }
    }

    /// Adds the commits it reported within `wait` to `committed`.
    pub(crate) fn take_reported(&mut self, committed: &mut Vec<i64>, wait: Duration) {
        let lines = self.lines.recv_timeout(wait).into_iter();
        for line in lines.chain(self.lines.try_iter().collect::<Vec<_>>()) {
            record(&line, committed);
        }
    }

    /// SIGKILL after up to `after` more reported lines (or a short wait); returns the
    /// commits it reported before it died (those had returned).
    fn kill_after(mut self, after: usize, committed: &mut Vec<i64>) {
        for _ in 0..after {
            match self.lines.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => record(&line, committed),
                Err(_) => break,
            }
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        // what it wrote before death is still in the pipe
        std::thread::sleep(Duration::from_millis(20));
        for line in self.lines.try_iter() {
            record(&line, committed);
        }
    }
}

impl Drop for PgWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of a pg-worker: a commit it reported.
fn record(line: &str, committed: &mut Vec<i64>) {
    match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["committed", id] => committed.push(id.parse().unwrap()),
        _ => panic!("pg-worker said: {line}"),
    }
}

/// The server's count of connections now for each `application_name` that is `like` (an
/// SQL `LIKE` pattern: `_` one character).
fn connections_named(db: &mut Db, like: &str) -> Vec<i64> {
    (db.admin)
        .query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1
             GROUP BY application_name",
            &[&like],
        )
        .unwrap()
        .iter()
        .map(|row| row.try_get(0).unwrap())
        .collect()
}

/// The connections each worker process's handle may hold ([`leasehold::postgres::PgStoreBuilder::connections`]):
/// a pool of two workers' rounds, renewals, reads of its jobs and clock readings share them.
const CONNECTIONS: usize = 3;

/// What an operator sizes `max_connections` by: eight worker processes of two workers each,
/// on handles bound to [`CONNECTIONS`], draining one queue with the effect rows of the kill
/// soak, never hold more than that bound and their `LISTEN` connection each (counted by the
/// server, by their `application_name`), and commit every job's effect once. (Unbound, a
/// pool of two was seen holding 6 at once on a loaded machine, its leases lapsing: its
/// round's completion, a renewal, two reads of jobs, `LISTEN` and a clock reading.)
#[test]
fn eight_worker_processes_of_two_stay_within_the_connections_their_handles_are_given() {
    let mut db = db!("connections");
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.effects (job bigint NOT NULL)");
    let store = db.store();
    let jobs = 2000;
    enqueue_kills(&store, jobs);
    let tag = format!("{}_c", db.schema);
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}application_name={tag}", db.url);
    // Each process under a name of its own, so that each one's count is seen; 2 s leases,
    // which lapse on a loaded machine: the bound holds all the same.
    let bound = CONNECTIONS.to_string();
    let workers: Vec<PgWorker> = (0..8)
        .map(|i| {
            let more = ["--connections", bound.as_str()];
            PgWorker::start_with(&format!("{url}{i}"), &db.schema, 2_000, true, &more)
        })
        .collect();
    let (mut most, mut most_one) = (0, 0);
    #[allow(clippy::disallowed_methods)] // a test deadline, not store time
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while store.stats().unwrap().total(JobState::Succeeded) < jobs {
        let each = connections_named(&mut db, &format!("{tag}_"));
        most = most.max(each.iter().sum());
        most_one = most_one.max(each.into_iter().max().unwrap_or(0));
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        assert!(!late, "the drain did not end");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(workers);
    println!(
        "8 worker processes x 2 workers held at most {most} connections at once, one process at most {most_one}"
    );
    assert!(most >= 8, "each process holds one at least: {most}");
    // (its LISTEN connection besides the bound)
    let each = CONNECTIONS as i64 + 1;
    assert!(
        most_one <= each,
        "a process held {most_one} connections, more than {each}"
    );
    let (rows, distinct): (i64, i64) = {
        let row = db
            .admin
            .query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT job) FROM {}.effects",
                    db.schema
                ),
                &[],
            )
            .unwrap();
        (row.try_get(0).unwrap(), row.try_get(1).unwrap())
    };
    assert_eq!((rows, distinct), (jobs as i64, jobs as i64));
}

/// A handle bound to two connections, shared by a pool of sixteen whose rounds would run
/// their halves on two connections at once, and by two application threads reading the
/// store beside it: the server never counts more than the two and the `LISTEN` connection,
/// no round waits for ever on a second connection another holds, and every job ends once.
#[test]
fn a_handle_bound_to_two_connections_serves_a_pool_and_readers_beside_it_within_them() {
    let mut db = db!("two connections");
    let tag = format!("{}_two", db.schema);
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let store = PgStore::builder(format!("{}{sep}application_name={tag}", db.url))
        .schema(&db.schema)
        .connections(2)
        .side_by_side_from(2)
        .open()
        .unwrap();
    let jobs = 3000;
    store
        .enqueue_batch((0..jobs).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let most = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut reads = 0u64;
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        store.stats().unwrap();
                        reads += 1;
                        // (now and then all of them rest, and a round finds both free)
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    reads
                })
            })
            .collect();
        let pool = leasehold::WorkerPool::builder(store.clone(), Q)
            .concurrency(16)
            .start(|ctx| Ok(ctx.payload().to_vec()))
            .unwrap();
        let mut most = 0;
        wait_until("the jobs to end", || {
            most = most.max(connections_named(&mut db, &tag).iter().sum());
            store.stats().unwrap().total(JobState::Succeeded) == jobs
        });
        drop(pool);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        for r in readers {
            assert!(r.join().unwrap() > 0, "a reader read");
        }
        most
    });
    say(&format!(
        "a pool of 16 and 2 readers on a handle of 2 connections: the server counted at most {most}"
    ));
    assert!(most >= 2, "the handle held its connections: {most}");
    assert!(most <= 3, "two and LISTEN, not {most}");
}

/// The store called from inside `PgStore::transaction`'s closure needs a second connection
/// while the first is held: on a handle of one it is refused at once, saying so, rather
/// than waiting out the statement timeout for itself; on a handle of two it runs.
#[test]
fn a_call_inside_a_transaction_on_a_handle_of_one_connection_is_refused_saying_why() {
    let db = db!("nested call");
    let bound = |n| {
        // (a short timeout: without the check, the call would wait this long for itself)
        (db.builder().connections(n))
            .statement_timeout(Duration::from_secs(2))
            .open()
            .unwrap()
    };
    let store = bound(1);
    let beside = store.clone();
    let refused = store.transaction(|_t| beside.stats().map(drop));
    let why = format!("{:?}", refused.expect_err("refused"));
    assert!(why.contains("inside of"), "{why}");
    let store = bound(2);
    let beside = store.clone();
    store.transaction(|_t| beside.stats().map(drop)).unwrap();
}

/// Connections refused because the server holds as many as it may (here a role's
/// `CONNECTION LIMIT`, not the server's settings): a typed error, and a pool that meets it
/// retries and loses nothing.
#[test]
fn connections_refused_for_want_of_room_are_a_typed_error_and_a_pool_loses_nothing() {
    let mut db = db!("too many connections");
    let role = format!("{}_few", db.schema);
    db.sql(&format!(
        "CREATE ROLE {role} LOGIN CONNECTION LIMIT 2; GRANT CREATE ON DATABASE test TO {role}"
    ));
    let url = match db.url.rsplit_once('@') {
        Some((_, host)) => format!("postgres://{role}@{host}"),
        None => panic!("LEASEHOLD_PG_URL has no user@host: {}", db.url),
    };
    let schema = format!("{}_own", db.schema);
    let admin_url = db.url.clone();
    let outcome = std::panic::catch_unwind(|| {
        let store = PgStore::builder(&url).schema(&schema).open().unwrap();
        // Every connection the role may have held (the store keeps one idle): a store that
        // opens now is refused, typed.
        let hold: Vec<_> = (0..3)
            .map_while(|_| postgres::Client::connect(&url, postgres::NoTls).ok())
            .collect();
        assert!(!hold.is_empty());
        match PgStore::builder(&url).schema(&schema).open() {
            Err(Error::Postgres(PgError::TooManyConnections(why))) => {
                assert!(why.contains("too many connections"), "{why}")
            }
            other => panic!("expected TooManyConnections, got {:?}", other.map(|_| ())),
        }
        drop(hold);
        let jobs = 300;
        store
            .enqueue_batch((0..jobs).map(|i| NewJob::new(Q, format!("{i}"))))
            .unwrap();
        // The store's idle connection ended by the server, and every connection the role
        // may have held elsewhere: the pool's first rounds are refused, typed, and counted.
        let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                &[&role],
            )
            .unwrap();
        wait_until("the store's connection to end", || {
            let n: i64 = (admin.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                &[&role],
            ))
            .unwrap()
            .try_get(0)
            .unwrap();
            n == 0
        });
        let hold: Vec<_> = (0..2)
            .map(|_| postgres::Client::connect(&url, postgres::NoTls).unwrap())
            .collect();
        let pool = leasehold::WorkerPool::builder(store.clone(), Q)
            .concurrency(4)
            .lease(Duration::from_secs(2))
            .start(|_| Ok(Vec::new()))
            .unwrap();
        wait_until("the pool's rounds to be refused", || {
            pool.stats().claim_errors >= 2
        });
        let succeeded = |admin: &mut postgres::Client| -> i64 {
            (admin.query_one(
                &format!("SELECT count(*) FROM {schema}.leasehold_jobs WHERE state = 'succeeded'"),
                &[],
            ))
            .unwrap()
            .try_get(0)
            .unwrap()
        };
        assert_eq!(succeeded(&mut admin), 0);
        // Room again: the pool carries on by itself, and every job ends once.
        drop(hold);
        wait_until("every job to succeed", || succeeded(&mut admin) == jobs);
        // (the pool counts a round's completions once its commit has returned to it)
        wait_until("the pool to count them", || {
            pool.stats().succeeded == jobs as u64
        });
        let stats = pool.stats();
        println!(
            "a pool of 4 with no connection to spare: {} rounds refused, then all {jobs} jobs",
            stats.claim_errors
        );
        assert_eq!(stats.succeeded, jobs as u64);
        drop(pool);
        let check = store.check().unwrap();
        assert!(check.is_clean(), "{:?}", check.problems);
    });
    db.sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    db.sql(&format!(
        "REVOKE CREATE ON DATABASE test FROM {role}; DROP ROLE {role}"
    ));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn an_enqueue_in_the_applications_own_transaction_commits_with_it_or_not_at_all() {
    let mut db = db!("enqueue in the application's transaction");
    let store = db.store();
    db.sql("CREATE TABLE {s}.orders (id bigint PRIMARY KEY)");
    let (schema, url) = (db.schema.clone(), db.url.clone());
    let mut app = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // Rolled back: neither the application's row nor the job.
    {
        let mut tx = app.transaction().unwrap();
        tx.execute(&format!("INSERT INTO {schema}.orders VALUES (1)"), &[])
            .unwrap();
        store
            .enqueue_in(&mut tx, NewJob::new(Q, "ship order 1"))
            .unwrap();
        tx.rollback().unwrap();
    }
    assert!(store.jobs(&Default::default()).unwrap().is_empty());
    // Committed: both, and a waiter of the queue is woken by the commit.
    let seen = store.work_generation(Q);
    let mut tx = app.transaction().unwrap();
    tx.execute(&format!("INSERT INTO {schema}.orders VALUES (2)"), &[])
        .unwrap();
    let id = store
        .enqueue_in(&mut tx, NewJob::new(Q, "ship order 2"))
        .unwrap();
    let ids = store
        .enqueue_batch_in(
            &mut tx,
            vec![
                NewJob::new(Q, "a").unique_key("k"),
                NewJob::new(Q, "b").unique_key("k"),
            ],
        )
        .unwrap();
    assert_eq!(ids[0], ids[1], "a unique key answers as in any enqueue");
    let waiter = NewJob::new(Q, "after").after(id);
    let after = store.enqueue_in(&mut tx, waiter).unwrap();
    assert!(
        store.job(id).unwrap().is_none(),
        "not visible before the commit"
    );
    tx.commit().unwrap();
    assert_ne!(store.wait_for_work(Q, seen, Duration::from_secs(30)), seen);
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(
        (l.job, l.payload.as_slice()),
        (id, b"ship order 2".as_slice())
    );
    store.complete(&l, b"").unwrap();
    assert_eq!(store.job(after).unwrap().unwrap().state(), JobState::Queued);
    // A refused enqueue is the application's transaction's error too: it is aborted, so the
    // application's row does not commit without its job.
    let mut tx = app.transaction().unwrap();
    tx.execute(&format!("INSERT INTO {schema}.orders VALUES (3)"), &[])
        .unwrap();
    let refused = store.enqueue_in(&mut tx, NewJob::new("", "no queue"));
    assert!(matches!(refused, Err(Error::Input(_))), "{refused:?}");
    let after = tx.execute(&format!("INSERT INTO {schema}.orders VALUES (4)"), &[]);
    assert!(
        after
            .as_ref()
            .is_err_and(|e| e.code().is_some_and(|c| c.code() == "25P02")),
        "the transaction is aborted: {after:?}"
    );
    let _ = tx.commit();
    let orders: i64 = app
        .query_one(&format!("SELECT count(*) FROM {schema}.orders"), &[])
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(orders, 1, "only order 2, committed with its job");
    // A batch refused part way (its last job names a sealed group) writes none of it.
    let sealed = store.open_group(leasehold::NewGroup::new()).unwrap();
    store.seal_group(sealed).unwrap();
    let before = store.stats().unwrap().total(JobState::Queued);
    let mut tx = app.transaction().unwrap();
    let refused = store.enqueue_batch_in(
        &mut tx,
        vec![
            NewJob::new(Q, "first"),
            NewJob::new(Q, "late").in_group(sealed),
        ],
    );
    assert!(refused.is_err(), "{refused:?}");
    let _ = tx.commit();
    assert_eq!(store.stats().unwrap().total(JobState::Queued), before);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

#[test]
fn groups_through_worker_kills_on_postgres_run_every_member_once_and_each_callback_once() {
    const GROUPS: usize = 20;
    const MEMBERS: usize = 50;
    let mut db = db!("groups through kills");
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.effects (job bigint NOT NULL)");
    let store = db.store();
    let mut started = 0usize;
    let mut start = || {
        started += 1;
        PgWorker::start(&db, 300, started.is_multiple_of(2))
    };
    let mut workers: Vec<PgWorker> = (0..4).map(|_| start()).collect();
    let (mut committed, mut groups, mut plain) = (Vec::new(), Vec::new(), 0);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let kills = kills().clamp(30, 40);
    // (attempts enough for a loaded machine, as `enqueue_kills` gives)
    let job = |name: String| NewJob::new("kills", name).max_attempts(1_000);
    for kill in 0..kills {
        // A group before each of the first kills (members, group ends and callbacks in
        // flight as they land), then plain jobs so that the last kills too find work.
        if groups.len() < GROUPS {
            let callbacks = leasehold::NewGroup::new()
                .on_complete(job(format!("group {kill} complete")))
                .on_success(job(format!("group {kill} succeeded")));
            let members = (0..MEMBERS)
                .map(|i| job(format!("group {kill} member {i}")))
                .collect();
            groups.push(store.enqueue_group(callbacks, members).unwrap().0);
        } else {
            let more = (0..40).map(|i| job(format!("plain {i}")));
            store.enqueue_batch(more).unwrap();
            plain += 40;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let victim = workers.swap_remove((rng % workers.len() as u64) as usize);
        victim.kill_after(1 + (rng >> 8) as usize % 6, &mut committed);
        workers.push(start());
    }
    let jobs = (GROUPS * (MEMBERS + 2)) as u64 + plain;
    wait_for_unfinished(&store, "every member and callback to succeed", |stats| {
        // What the workers say as they go: a worker that stopped says why here.
        for w in &mut workers {
            w.take_reported(&mut committed, Duration::ZERO);
        }
        stats.total(JobState::Succeeded) == jobs
    });
    for w in workers.drain(..) {
        w.kill_after(0, &mut committed);
    }
    let per_job = effects_per_job(&mut db);
    assert_eq!(per_job.len() as u64, jobs, "every job has its effect");
    let twice: Vec<_> = per_job.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "effects committed more than once: {twice:?}"
    );
    crate::groups::each_callback_ran_once_after_its_group(&store, &groups, MEMBERS as u64);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    say(&format!(
        "{kills} SIGKILLs of worker processes on PostgreSQL through {GROUPS} groups of \
         {MEMBERS}: {jobs} jobs (callbacks included), each effect committed once, every \
         callback after its group's last member; {} commits reported",
        committed.len()
    ));
}

#[test]
fn worker_processes_on_postgres_killed_at_random_lose_nothing_and_commit_each_job_once() {
    let mut db = db!("process kills");
    db.sql("CREATE SCHEMA {s}; CREATE TABLE {s}.effects (job bigint NOT NULL)");
    let store = db.store();
    // (a job claimed ahead by processes killed one after another is taken back each time:
    // its budget of attempts is not what this tests)
    let job = |name: String| NewJob::new("kills", name).max_attempts(1_000);
    let ids = store
        .enqueue_batch((0..2000).map(|i| job(format!("{i}"))))
        .unwrap();
    let lease_ms = 300;
    // Half of the processes are worker pools (claims ahead, completions and their effect
    // rows committed in batches), half claim loops.
    let mut started = 0usize;
    let mut start = || {
        started += 1;
        PgWorker::start(&db, lease_ms, started.is_multiple_of(2))
    };
    let mut workers: Vec<PgWorker> = (0..4).map(|_| start()).collect();
    // A fleet's follower of every end, on a handle of its own (another machine's, as far as
    // the workers can tell), through the kills; it stops once it has read as many ends as
    // jobs succeeded, or a minute after it was told how many.
    let ends_to_read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let follower = std::thread::spawn({
        let (store, to_read) = (db.store(), ends_to_read.clone());
        move || {
            let mut read = Vec::new();
            let mut at = EndCursor::START;
            let mut told_at = None;
            while (read.len() as u64) < to_read.load(std::sync::atomic::Ordering::SeqCst) {
                let page = store
                    .wait_for_endings(at, 1000, Duration::from_secs(1))
                    .unwrap();
                assert!(!page.gap, "nothing is purged here");
                read.extend(page.list.iter().map(|e| (e.of.clone(), e.state)));
                at = page.next;
                if to_read.load(std::sync::atomic::Ordering::SeqCst) != u64::MAX {
                    #[allow(clippy::disallowed_methods)] // a test deadline, not store time
                    let told = *told_at.get_or_insert_with(std::time::Instant::now);
                    if told.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                }
            }
            read
        }
    });
    let mut committed = Vec::new();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let kills = kills();
    for _ in 0..kills {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let victim = workers.swap_remove((rng % workers.len() as u64) as usize);
        victim.kill_after((rng >> 8) as usize % 6, &mut committed);
        workers.push(start());
        // some jobs must remain for the next kill to land mid-work
        if store.stats().unwrap().total(JobState::Succeeded) as usize >= ids.len() {
            store
                .enqueue_batch((0..20).map(|i| job(format!("more {i}"))))
                .unwrap();
        }
    }
    // the survivors finish everything, the dead ones' jobs once their leases run out
    let unfinished = || {
        let stats = store.stats().unwrap();
        stats.total(JobState::Queued)
            + stats.total(JobState::Running)
            + stats.total(JobState::RetryWait)
    };
    wait_for_unfinished(&store, "every job to succeed", |_| unfinished() == 0);
    for w in workers.drain(..) {
        w.kill_after(0, &mut committed);
    }
    let per_job = effects_per_job(&mut db);
    let all = store.stats().unwrap().total(JobState::Succeeded);
    assert_eq!(
        per_job.len() as u64,
        all,
        "every succeeded job has its effect"
    );
    assert!(
        per_job.values().all(|n| *n == 1),
        "a job's effect was committed twice: {:?}",
        per_job.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    for id in &committed {
        assert_eq!(
            per_job.get(id),
            Some(&1),
            "reported commit of job {id} is missing"
        );
    }
    assert_eq!(store.stats().unwrap().total(JobState::Dead), 0);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    let (mut by_pools, mut most_attempts) = (0, 0);
    for &job in per_job.keys() {
        let history = store.history(leasehold::JobId(job as u64)).unwrap();
        let successes: Vec<_> = history
            .iter()
            .filter(|run| run.outcome() == Some(&leasehold::Outcome::Succeeded))
            .collect();
        assert_eq!(
            successes.len(),
            1,
            "job {job} succeeded {} times",
            successes.len()
        );
        by_pools += usize::from(successes[0].worker().starts_with("pg-pooled-"));
        most_attempts = most_attempts.max(history.len());
    }
    assert!(by_pools > 0, "no worker pool committed a job");
    // The follower read each job's end once, as it happened, and nothing else.
    ends_to_read.store(all, std::sync::atomic::Ordering::SeqCst);
    let read = follower.join().unwrap();
    let mut ended: BTreeSet<u64> = BTreeSet::new();
    for (of, state) in &read {
        let EndOf::Job { id, .. } = of else {
            panic!("an end of {of:?}")
        };
        assert_eq!(*state, JobState::Succeeded, "job {id}");
        assert!(ended.insert(id.0), "job {id}'s end was read twice");
    }
    let succeeded: BTreeSet<u64> = per_job.keys().map(|j| *j as u64).collect();
    assert_eq!(
        ended, succeeded,
        "the follower read every end, and only those"
    );
    say(&format!(
        "{kills} SIGKILLs of worker processes on PostgreSQL: {all} jobs, each committed once \
         ({by_pools} by worker pools, at most {most_attempts} attempts for one job); {} commits \
         reported by the workers; a follower on another handle read each job's end once",
        committed.len()
    ));
}

#[test]
fn check_is_clean_after_every_kind_of_end_and_names_a_broken_row() {
    let mut db = db!("check");
    let store = db.store();
    let ids = store
        .enqueue_batch((0..5).map(|i| NewJob::new(Q, format!("{i}")).max_attempts(1)))
        .unwrap();
    let leases = store.claim_batch(Q, "w", LEASE, 4).unwrap();
    store.complete(&leases[0], b"").unwrap();
    store.fail(&leases[1], "x").unwrap();
    store.release(&leases[2]).unwrap();
    db.lapse(leases[3].job);
    store.reap().unwrap();
    store.cancel(ids[4]).unwrap();
    let report = store.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.jobs, 5);
    // a running job whose lease was lost to a bad hand-written UPDATE
    let l = store.claim(Q, "w", LEASE).unwrap().unwrap();
    db.sql(&format!(
        "UPDATE {{s}}.leasehold_jobs SET lease_owner = NULL WHERE id = {}",
        l.job.0
    ));
    let report = store.check().unwrap();
    assert_eq!(
        report.problems,
        vec![format!(
            "job {}: a running job without a whole lease",
            l.job
        )]
    );
}

#[test]
fn purge_deletes_old_finished_jobs_with_their_history_in_batches() {
    let mut db = db!("purge");
    let store = db.builder().reap_batch(3).open().unwrap();
    store
        .enqueue_batch((0..10).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    for l in store.claim_batch(Q, "w", LEASE, 8).unwrap() {
        store.complete(&l, b"").unwrap();
    }
    assert_eq!(
        store
            .purge(Duration::from_secs(3600), &[JobState::Succeeded])
            .unwrap(),
        0,
        "none is an hour old"
    );
    db.sql("UPDATE {s}.leasehold_jobs SET finished_at = finished_at - interval '2 hours'");
    assert_eq!(
        store
            .purge(Duration::from_secs(3600), &[JobState::Succeeded])
            .unwrap(),
        8
    );
    let runs: i64 = db
        .admin
        .query_one(
            &format!("SELECT count(*) FROM {}.leasehold_runs", db.schema),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(runs, 0, "their history went with them");
    assert_eq!(store.stats().unwrap().total(JobState::Queued), 2);
    assert!(store.check().unwrap().is_clean());
}

/// The job table's dead row versions and its vacuums, by PostgreSQL's statistics.
fn dead_and_vacuums(db: &mut Db) -> (i64, i64) {
    let row = db
        .admin
        .query_one(
            "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname = 'leasehold_jobs'",
            &[&db.schema],
        )
        .unwrap();
    (row.try_get(0).unwrap(), row.try_get(1).unwrap())
}

/// Churn: `n` jobs enqueued, claimed and completed, two dead row versions each.
fn churn(store: &PgStore, n: usize) {
    store
        .enqueue_batch((0..n).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    for l in store.claim_batch(Q, "w", LEASE, n).unwrap() {
        store.complete(&l, b"").unwrap();
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // a test deadline: statistics arrive when they do
fn a_reaper_pass_vacuums_a_table_whose_dead_rows_passed_the_threshold_not_again_at_once() {
    let mut db = db!("vacuum");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let until = |what: &str| {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Left to autovacuum: dead versions pile up past any threshold, and no pass vacuums.
    let off = db.builder().vacuum_when_dead(None).open().unwrap();
    churn(&off, 300);
    while dead_and_vacuums(&mut db).0 < 300 {
        // (a statement of the churning handle's makes its backend report the statistics,
        // a second after its last report; idle, it reports them 10 s after)
        off.stats().unwrap();
        until("the statistics to count the dead versions");
    }
    assert!(off.reap().unwrap().vacuum_started.is_empty());
    assert!(!off.vacuum_running());
    drop(off);
    // With a threshold of 100 (and a fifth of the live rows), a pass starts a vacuum.
    let store = db.builder().vacuum_when_dead(Some(100)).open().unwrap();
    let started = loop {
        let report = store.reap().unwrap();
        if !report.vacuum_started.is_empty() {
            break report.vacuum_started;
        }
        until("a pass to see the dead versions");
    };
    assert!(
        started.contains(&"leasehold_jobs".to_owned()),
        "{started:?}"
    );
    while store.vacuum_running() {
        until("the vacuum to end");
    }
    while dead_and_vacuums(&mut db).1 == 0 {
        until("the statistics to count the vacuum");
    }
    // (How many dead versions it removed depends on the other tests: a vacuum cannot
    // remove what a transaction still open elsewhere may see.) Whatever is left, the
    // next pass, right after, starts no other vacuum.
    assert!(store.reap().unwrap().vacuum_started.is_empty());
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn a_pool_whose_renewals_stall_on_a_slow_database_sheds_its_expired_lease_and_recovers() {
    let db = db!("slow database");
    let store = db
        .builder()
        .statement_timeout(Duration::from_millis(300))
        .open()
        .unwrap();
    let first = store.enqueue(NewJob::new(Q, "block")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let pool = leasehold::WorkerPool::builder(store.clone(), Q)
        .concurrency(2)
        .lease(Duration::from_secs(2))
        .heartbeat_every(Duration::from_millis(100))
        .start(move |ctx| {
            if ctx.payload() == b"block" && ctx.attempt().0 == 1 {
                let stopped = ctx.sleep(Duration::from_secs(3600));
                let _ = tx.send(stopped);
                stopped?;
            }
            Ok(Vec::new())
        })
        .unwrap();
    wait_until("the first job to run", || {
        let stats = pool.stats();
        stats.in_flight == 1 && stats.claimed_ahead == 0
    });
    // The database turns slow for this job's row: every renewal of it waits for a lock
    // until the statement timeout cancels it.
    let locker = format!(
        "SELECT 1 FROM {}.leasehold_jobs WHERE id = $1 FOR UPDATE",
        db.schema
    );
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let mut held = holder.transaction().unwrap();
    held.execute(&locker, &[&(first.0 as i64)]).unwrap();
    let second = store.enqueue(NewJob::new(Q, "quick")).unwrap();
    let stopped = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(
        stopped,
        Err(leasehold::Interrupted(
            leasehold::Interruption::LeaseExpired
        ))
    );
    let stats = pool.stats();
    assert!(stats.heartbeat_failures >= 1, "{stats:?}");
    assert!(
        stats.intake_paused >= 1,
        "claims stopped while renewals failed: {stats:?}"
    );
    // the database recovers: the expired job is run again and the other one too
    held.rollback().unwrap();
    wait_until("both jobs to succeed", || {
        [first, second]
            .iter()
            .all(|id| store.job(*id).unwrap().unwrap().state() == JobState::Succeeded)
    });
    drop(pool);
    assert!(store.check().unwrap().is_clean());
}

/// A network namespace joined to this one by a veth pair, so that a process inside
/// reaches the database only over a link the test can cut. Removed when dropped.
struct Partitionable {
    ns: String,
    host_link: String,
    host_ip: String,
}

impl Partitionable {
    /// `None` where namespaces cannot be made (not root, no `ip`).
    fn new() -> Option<Partitionable> {
        // Unique per test of this process (they run in parallel), within one octet.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 4;
        let n = std::process::id() % 50 * 4 + k + 20;
        let (ns, host_link, ns_link) = (format!("lhns{n}"), format!("lhh{n}"), format!("lhn{n}"));
        let (host_ip, ns_ip) = (format!("10.77.{n}.1"), format!("10.77.{n}.2"));
        let ip = |args: &[&str]| {
            std::process::Command::new("ip")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let _ = ip(&["netns", "del", &ns]);
        let _ = ip(&["link", "del", &host_link]);
        let made = ip(&["netns", "add", &ns])
            && ip(&[
                "link", "add", &host_link, "type", "veth", "peer", "name", &ns_link,
            ])
            && ip(&["link", "set", &ns_link, "netns", &ns])
            && ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &host_link])
            && ip(&["link", "set", &host_link, "up"])
            && ip(&[
                "netns",
                "exec",
                &ns,
                "ip",
                "addr",
                "add",
                &format!("{ns_ip}/24"),
                "dev",
                &ns_link,
            ])
            && ip(&["netns", "exec", &ns, "ip", "link", "set", &ns_link, "up"])
            && ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        let net = Partitionable {
            ns,
            host_link,
            host_ip,
        };
        made.then_some(net)
    }

    /// The database as the namespace sees it: through the veth, relayed to the server.
    fn url_of(&self, db: &Db) -> String {
        let config: postgres::Config = db.url.parse().unwrap();
        let server = match (config.get_hosts().first(), config.get_ports().first()) {
            (Some(postgres::config::Host::Tcp(h)), Some(p)) => format!("{h}:{p}"),
            _ => panic!("LEASEHOLD_PG_URL must name a TCP host and port: {}", db.url),
        };
        let port = relay(&self.host_ip, server);
        let user = config.get_user().unwrap_or("postgres");
        let dbname = config.get_dbname().unwrap_or("test");
        format!("postgres://{user}@{}:{port}/{dbname}", self.host_ip)
    }

    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let ok = std::process::Command::new("ip")
            .args(["link", "set", &self.host_link, state])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip link set {state}");
    }
}

impl Drop for Partitionable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_link])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Relays TCP connections from `ip`:(a free port) to `target`; returns the port.
fn relay(ip: &str, target: String) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for inbound in listener.incoming().map_while(Result::ok) {
            let Ok(outbound) = std::net::TcpStream::connect(&target) else {
                continue;
            };
            let (mut a, mut b) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            let (mut c, mut d) = (inbound, outbound);
            std::thread::spawn(move || std::io::copy(&mut a, &mut b));
            std::thread::spawn(move || std::io::copy(&mut d, &mut c));
        }
    });
    port
}

#[test]
fn a_worker_cut_off_from_the_database_past_its_lease_loses_its_job_and_its_late_writes() {
    use std::io::Write;
    let db = db!("partition");
    let Some(net) = Partitionable::new() else {
        say("the partition test did not run: network namespaces cannot be made here");
        return;
    };
    let url = net.url_of(&db);
    let store = db.store();
    let id = store.enqueue(NewJob::new("p", "x")).unwrap();
    let mut worker = Helper(
        super::helper_process::command_under(
            &["ip", "netns", "exec", &net.ns],
            "pg-holder",
            ["--url", &url, "--schema", &db.schema, "--lease-ms", "1500"],
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut said = super::helper_process::stdout_lines(&mut worker);
    let claimed = said.next().unwrap().unwrap();
    assert_eq!(claimed, format!("claimed {id} 1"));
    let mut stdin = worker.stdin.take().unwrap();
    let mut ask = |what: &str| -> String {
        writeln!(stdin, "{what}").unwrap();
        stdin.flush().unwrap();
        said.next().unwrap().unwrap()
    };
    assert_eq!(ask("beat"), "beat ok", "renews while connected");

    // cut off: its lease runs out on the database's clock and the job is taken over
    net.link(false);
    let mut taker = None;
    wait_until("the lapsed lease to be taken over", || {
        taker = store.claim("p", "survivor", LEASE).unwrap();
        taker.is_some()
    });
    let taker = taker.unwrap();
    assert_eq!(taker.attempt.0, 2);
    store.complete(&taker, b"mine").unwrap();

    // reconnected: whatever the cut-off worker writes now is refused by the fence
    net.link(true);
    for what in ["beat", "complete"] {
        let mut answer = ask(what);
        let mut tries = 0;
        while answer.contains(" error ") && tries < 20 {
            std::thread::sleep(Duration::from_millis(250));
            answer = ask(what);
            tries += 1;
        }
        assert_eq!(answer, format!("{what} lost"));
    }
    drop(stdin);
    let _ = worker.wait();
    let job = store.job(id).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Succeeded);
    assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"mine"[..]));
    let history = store.history(id).unwrap();
    assert!(matches!(
        history[0].outcome(),
        Some(Outcome::LeaseExpired {
            path: ReclaimPath::Takeover,
            ..
        })
    ));
    assert_eq!(
        (history[1].worker(), history[1].outcome()),
        ("survivor", Some(&Outcome::Succeeded))
    );
}

/// A whole worker machine cut off: a pool of four, every worker busy, loses its database
/// past its leases. It stops the handlers that listen for it by itself (its renewals
/// hang on the silent connection, so its dispatcher must notice), a survivor outside
/// takes every job over and commits it, and once the link is back the handlers that never
/// listened finish and try to commit with their SQL: every such write is refused, and each
/// job's effect exists exactly once, the survivor's.
#[test]
fn a_whole_pool_cut_off_past_its_leases_stops_its_handlers_and_its_late_writes_are_refused() {
    let mut db = db!("pool partition");
    let Some(net) = Partitionable::new() else {
        say("the pool partition test did not run: network namespaces cannot be made here");
        return;
    };
    let url = net.url_of(&db);
    let store = db.store();
    db.sql("CREATE TABLE {s}.effects (job bigint NOT NULL, who text NOT NULL)");
    let ids: BTreeSet<u64> = store
        .enqueue_batch((0..4).map(|i| NewJob::new("pp", format!("{i}"))))
        .unwrap()
        .iter()
        .map(|id| id.0)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let mut pool = PgPool::start(&["ip", "netns", "exec", &net.ns], &url, &db, 2000, 4, &go);
    let started: BTreeSet<u64> = (0..4)
        .map(|_| pool.next_line("started ").parse().unwrap())
        .collect();
    assert_eq!(started, ids);

    net.link(false);
    // the pool stops its obedient handlers itself once their leases run out
    let stopped: BTreeSet<u64> = (0..2)
        .map(|_| {
            let line = pool.next_line("interrupted ");
            assert!(line.ends_with("Err(Interrupted(LeaseExpired))"), "{line}");
            line.split(' ').next().unwrap().parse().unwrap()
        })
        .collect();
    assert!(stopped.iter().all(|id| id % 2 == 0), "{stopped:?}");
    // meanwhile a survivor takes every job over and commits it with its effect
    let mut taken = BTreeSet::new();
    wait_until("the survivor to take every job over", || {
        survive(&store, &db.schema, &mut taken);
        taken.len() == 4
    });

    // reconnected: the handlers that never listened finish now, and their SQL is refused
    net.link(true);
    std::fs::write(&go, b"").unwrap();
    for _ in 0..2 {
        pool.next_line("finishing ");
    }
    drop(pool.process.stdin.take());
    let stats = pool.next_line("stats ");
    let _ = pool.process.wait();
    let rejected: u64 = stats.split(' ').next().unwrap().parse().unwrap();
    assert!(rejected >= 2, "both late completions refused: {stats}");
    let effects = effects(&mut db);
    assert_eq!(
        effects,
        ids.iter()
            .map(|id| (*id as i64, "survivor".to_owned()))
            .collect::<Vec<_>>(),
        "one effect per job, the survivor's"
    );
    for id in &ids {
        let history = store.history(leasehold::JobId(*id)).unwrap();
        assert_eq!(history.len(), 2, "job {id}: {history:?}");
        assert_eq!(history[1].worker(), "survivor");
        assert_eq!(history[1].outcome(), Some(&Outcome::Succeeded));
    }
    assert!(store.check().unwrap().is_clean());
}

/// Two pools on one queue: each round completes its jobs one by one (each brings the
/// application's writes), in the order the workers finished, while each pool's heartbeat
/// renews the same jobs' leases in one statement on another connection. Every one of them
/// locks the rows in the order of their ids, so none deadlocks: PostgreSQL broke such a
/// deadlock after a second (its `deadlock_timeout`) and the round ran again, long enough
/// for short leases to run out. The server counts the deadlocks it broke per database, so
/// the test has a database of its own.
#[test]
fn rounds_and_renewals_of_pools_on_one_queue_never_deadlock() {
    let mut db = db!("no deadlocks");
    let name = format!("{}_dl", db.schema);
    db.sql(&format!("CREATE DATABASE {name}"));
    let url = match db.url.split_once('?') {
        Some((base, params)) => format!("{}/{name}?{params}", base.rsplit_once('/').unwrap().0),
        None => format!("{}/{name}", db.url.rsplit_once('/').unwrap().0),
    };
    let jobs = 3000;
    {
        let store = PgStore::builder(&url).open().unwrap();
        let mut app = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        app.batch_execute("CREATE TABLE effects (job bigint NOT NULL)")
            .unwrap();
        store
            .enqueue_batch((0..jobs).map(|i| NewJob::new(Q, format!("{i}"))))
            .unwrap();
        let pools: Vec<_> = (0..2)
            .map(|_| {
                leasehold::WorkerPool::builder(store.clone(), Q)
                    .concurrency(8)
                    .lease(Duration::from_secs(30))
                    .heartbeat_every(Duration::from_millis(5))
                    .start(|ctx| {
                        let job = ctx.job().0 as i64;
                        // Workers finish out of the order they started in.
                        std::thread::sleep(Duration::from_micros((job as u64 * 7919) % 3000));
                        Ok(leasehold::Output::with_sql(Vec::new(), move |t| {
                            t.sql()
                                .execute("INSERT INTO effects (job) VALUES ($1)", &[&job])?;
                            Ok::<(), postgres::Error>(())
                        }))
                    })
                    .unwrap()
            })
            .collect();
        wait_until("every job to succeed", || {
            store.stats().unwrap().total(JobState::Succeeded) == jobs
        });
        for pool in pools {
            pool.shutdown(Duration::from_secs(10));
        }
    }
    // A backend's counts reach the server's when it exits.
    let backends = |db: &mut Db| -> i64 {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1";
        db.admin
            .query_one(sql, &[&name])
            .unwrap()
            .try_get(0)
            .unwrap()
    };
    wait_until("the test's connections to end", || backends(&mut db) == 0);
    db.admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .unwrap();
    let deadlocks: i64 = (db.admin)
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = $1",
            &[&name],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    db.sql(&format!("DROP DATABASE {name}"));
    assert_eq!(
        deadlocks, 0,
        "deadlocks PostgreSQL broke among {jobs} jobs' rounds"
    );
}

/// An end committed while an older transaction is open anywhere on the server is held back
/// (read once that one ends, so that none is passed over), and the page says so; a follower
/// gets it once the transaction ends.
#[test]
fn an_end_behind_an_open_transaction_is_held_back_and_the_page_says_so() {
    let db = db!("held back");
    let store = db.store();
    let id = store.enqueue(NewJob::new(Q, "late news")).unwrap();
    let mut other = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let mut open = other.transaction().unwrap();
    // (an id of its own: the horizon stays at it until it ends)
    open.query_one("SELECT pg_current_xact_id()", &[]).unwrap();
    store.cancel(id).unwrap();
    let page = store.endings(EndCursor::START, 10).unwrap();
    assert!(page.list.is_empty(), "{page:?}");
    assert!(page.held_back, "the page did not say an end waits");
    let page = std::thread::scope(|s| {
        let follower =
            s.spawn(|| store.wait_for_endings(EndCursor::START, 10, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(300));
        open.commit().unwrap();
        follower.join().unwrap().unwrap()
    });
    let ended: Vec<_> = page.list.iter().map(|e| e.of.clone()).collect();
    assert_eq!(
        ended,
        [EndOf::Job {
            id,
            queue: Q.into()
        }]
    );
}

/// `n` empty jobs enqueued and drained by a pool of eight, whose rounds complete many at
/// once; their ids.
fn drained_by_eight(store: &PgStore, n: usize) -> Vec<leasehold::JobId> {
    let ids = store
        .enqueue_batch((0..n).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let pool = leasehold::WorkerPool::builder(store.clone(), Q)
        .concurrency(8)
        .start(|_| Ok(Vec::new()))
        .unwrap();
    assert!(pool.wait_idle(Duration::from_secs(120)).unwrap());
    ids
}

/// A pool's round completes many jobs in one statement, which keeps their endings in one row
/// (schema 14): a reader still reads each of them once, in order, from any cursor, one
/// standing in the middle of a row included; and a purge that takes the rows tells a reader
/// behind their last ending that it missed some.
#[test]
fn endings_a_round_keeps_together_are_read_one_by_one_from_a_cursor_inside_them() {
    let mut db = db!("endings of a round");
    let store = db.store();
    let ids = drained_by_eight(&store, 400);
    // The widest row: how many it holds, and its first job.
    let row = db
        .admin
        .query_one(
            &format!(
                "SELECT coalesce(n, 1), jobs[1] FROM {}.leasehold_endings
                 ORDER BY n DESC NULLS LAST LIMIT 1",
                db.schema
            ),
            &[],
        )
        .unwrap();
    let (widest, first): (i32, Option<i64>) = (row.try_get(0).unwrap(), row.try_get(1).unwrap());
    assert!(
        widest > 1,
        "no round of eight workers draining 400 jobs completed two together"
    );
    // (behind the server's horizon, an ending may wait for another test's transaction)
    let (mut whole, mut at) = (Vec::new(), EndCursor::START);
    wait_until("every ending read", || {
        let page = store.endings(at, 1000).unwrap();
        at = page.next;
        whole.extend(page.list);
        whole.len() >= ids.len()
    });
    let (mut by_sevens, mut at) = (Vec::new(), EndCursor::START);
    while by_sevens.len() < whole.len() {
        let page = store.endings(at, 7).unwrap();
        assert!(!page.list.is_empty() && page.list.len() <= 7, "{page:?}");
        at = page.next;
        by_sevens.extend(page.list);
    }
    assert_eq!(by_sevens, whole, "pages of seven read what one page reads");
    let jobs: Vec<_> = whole
        .iter()
        .map(|e| match &e.of {
            EndOf::Job { id, queue } if queue == Q => *id,
            other => panic!("an ending of {other:?}"),
        })
        .collect();
    assert_eq!(jobs.len(), ids.len(), "an ending read twice, or one missed");
    assert_eq!(
        jobs.iter().copied().collect::<BTreeSet<_>>(),
        ids.iter().copied().collect::<BTreeSet<_>>(),
        "every job's ending"
    );
    assert!(whole.windows(2).all(|w| w[0].cursor < w[1].cursor));
    assert!(whole.iter().all(|e| e.state == JobState::Succeeded));
    // From the first ending of the widest row: the rest of the row, then what follows.
    let first = leasehold::JobId(first.expect("a wide row's jobs") as u64);
    let inside = jobs
        .iter()
        .position(|j| *j == first)
        .expect("its ending read");
    let rest = store.endings(whole[inside].cursor, 1000).unwrap();
    assert_eq!(rest.list, whole[inside + 1..]);
    // Purged: a reader short of the last ending missed it, one at it did not (the last row
    // holds more than one ending when the drain's last round completed more than one).
    store.purge(Duration::ZERO, &[JobState::Succeeded]).unwrap();
    let n = whole.len();
    assert!(store.endings(whole[n - 2].cursor, 10).unwrap().gap);
    let caught_up = store.endings(whole[n - 1].cursor, 10).unwrap();
    assert!(!caught_up.gap && caught_up.list.is_empty(), "{caught_up:?}");
}

/// A store of version 13 keeps each ending in a row of its own, numbered by the row; the
/// upgrade to 14 keeps them and their numbers, a cursor a reader kept among them reads on,
/// and the endings written since, a round's in one row, follow them once each.
#[test]
fn endings_kept_before_the_upgrade_to_rows_of_many_read_on_with_those_after_it() {
    let mut db = db!("endings upgrade");
    let store = db.store();
    let old = store
        .enqueue_batch((0..3).map(|_| NewJob::new(Q, "old")))
        .unwrap();
    for id in &old {
        store.cancel(*id).unwrap();
    }
    drop(store);
    // What a version 13 build made: a row per ending, none of the columns of rows of many.
    db.sql(
        "ALTER TABLE {s}.leasehold_endings DROP COLUMN n, DROP COLUMN jobs, DROP COLUMN queues;
         DROP FUNCTION {s}.ending_seq;
         DROP FUNCTION {s}.ending_last;
         UPDATE {s}.leasehold_meta SET value = '13' WHERE key = 'schema_version'",
    );
    // A reader of version 13 that had read the first of them kept its cursor: TX.SEQ.
    let kept: String = db
        .admin
        .query_one(
            &format!(
                "SELECT xid::text || '.' || seq FROM {}.leasehold_endings
                 ORDER BY xid, seq LIMIT 1",
                db.schema
            ),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    let store = db.builder().open().unwrap();
    assert_eq!(store.upgraded_from(), Some(13));
    let new = drained_by_eight(&store, 200);
    let (mut read, mut at) = (Vec::new(), kept.parse::<EndCursor>().unwrap());
    wait_until("every ending read", || {
        let page = store.endings(at, 3).unwrap();
        assert!(!page.gap);
        at = page.next;
        read.extend(page.list);
        read.len() >= old.len() - 1 + new.len()
    });
    let ended: Vec<_> = read
        .iter()
        .map(|e| match &e.of {
            EndOf::Job { id, .. } => (*id, e.state),
            other => panic!("an ending of {other:?}"),
        })
        .collect();
    let want_old: Vec<_> = old[1..]
        .iter()
        .map(|id| (*id, JobState::Cancelled))
        .collect();
    assert_eq!(
        ended[..old.len() - 1],
        want_old,
        "the old endings after the cursor first, in order"
    );
    let mut after: Vec<_> = ended[old.len() - 1..].to_vec();
    after.sort();
    let want_new: Vec<_> = new.iter().map(|id| (*id, JobState::Succeeded)).collect();
    assert_eq!(after, want_new, "each new ending once");
    assert!(read.windows(2).all(|w| w[0].cursor < w[1].cursor));
    let report = store.check().unwrap();
    assert!(report.is_clean(), "{report:?}");
}
