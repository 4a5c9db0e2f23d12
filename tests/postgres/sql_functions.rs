//! The SQL functions: `add_job`, and the ends and edits asked for in SQL (`complete_job`,
//! `fail_job`, `reschedule_jobs`, `remove_job`), which check in the caller's transaction
//! and leave the rest to the protocol (the crate's `postgres/requests.rs`).

use std::time::Duration;

use leasehold::postgres::PgStore;
use leasehold::postgres::client as postgres;
use leasehold::{JobState, Lease, NewJob, Outcome, Reaper, Renewal, RetryPolicy};
use leasehold::{JobStore, ReadJobs};

use crate::db::{Db, LEASE, Q};

/// Runs `sql` (with `{s}` the test's schema) on the admin connection: its first column, or
/// the database's error (code, message).
fn call<T: for<'a> postgres::types::FromSql<'a>>(
    db: &mut Db,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<T, (String, String)> {
    let sql = sql.replace("{s}", &db.schema);
    db.admin
        .query_one(&sql, params)
        .map(|row| row.try_get(0).unwrap())
        .map_err(|e| {
            let e = e.as_db_error().expect("a database error");
            (e.code().code().to_owned(), e.message().to_owned())
        })
}

/// The holding of `lease` as the SQL functions take it: job, attempt, token.
fn held(lease: &Lease) -> (i64, i32, i64) {
    (
        lease.job.0 as i64,
        lease.attempt.0 as i32,
        lease.token.as_bigint(),
    )
}

/// How long from now until `at`, on the store's clock (zero if past).
fn from_now(store: &PgStore, at: leasehold::StoreTime) -> Duration {
    at.saturating_since(store.now().unwrap())
}

#[test]
fn complete_job_commits_with_the_callers_writes_under_the_fence_and_the_protocol_ends_the_job() {
    let mut db = db!("complete_job");
    let store = db.store();
    db.sql("CREATE TABLE {s}.effects (job bigint NOT NULL)");
    let a = store.enqueue(NewJob::new(Q, "a")).unwrap();
    let waiter = store.enqueue(NewJob::new("after", "b").after(a)).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    let (job, attempt, token) = held(&lease);
    // The caller's write and the end, in one transaction of the caller's.
    let mut tx = db.admin.transaction().unwrap();
    let s = db.schema.clone();
    tx.execute(&format!("INSERT INTO {s}.effects VALUES ($1)"), &[&job])
        .unwrap();
    tx.query_one(
        &format!("SELECT {s}.complete_job($1, $2, $3, 'thumb'::bytea)"),
        &[&job, &attempt, &token],
    )
    .unwrap();
    tx.commit().unwrap();
    // A request no reaper applies is what `check` reports (as if ten minutes had passed).
    db.sql("UPDATE {s}.leasehold_requests SET at = at - interval '11 minutes'");
    let check = store.check().unwrap();
    assert_eq!(
        check.problems,
        [format!(
            "job {a}: a request made in SQL that no reaper has applied in ten minutes (is a Reaper running?)"
        )]
    );
    // Accepted, not yet applied: the lease is held meanwhile, so no takeover comes between.
    let running = store.job(a).unwrap().unwrap();
    assert_eq!(running.state(), JobState::Running);
    let held_for = from_now(&store, running.lease().unwrap().expires_at());
    assert!(held_for > Duration::from_secs(23 * 3600), "{held_for:?}");
    // A second end of the same attempt is refused, and the caller's writes with it.
    let again = call::<i64>(
        &mut db,
        "SELECT {s}.fail_job($1, $2, $3, 'late')",
        &[&job, &attempt, &token],
    );
    let (code, message) = again.unwrap_err();
    assert_eq!(code, "55000");
    assert!(
        message.contains("its end is asked for already"),
        "{message}"
    );
    // The protocol applies it: the job succeeded with its output, what waited is released,
    // the end is kept for followers.
    store.reap().unwrap();
    let done = store.job(a).unwrap().unwrap();
    assert_eq!(done.state(), JobState::Succeeded);
    assert_eq!(store.output(a).unwrap().as_deref(), Some(&b"thumb"[..]));
    assert_eq!(
        store.job(waiter).unwrap().unwrap().state(),
        JobState::Queued
    );
    // (an end is held back while an older transaction is open, which other tests' may be)
    let mut cursor = Default::default();
    let ended_a =
        |e: &leasehold::Ending| matches!(e.of, leasehold::EndOf::Job { id, .. } if id == a);
    crate::db::wait_until("the end kept for followers", || {
        let page = store
            .wait_for_endings(cursor, 10, Duration::from_secs(1))
            .unwrap();
        cursor = page.next;
        page.list.iter().any(ended_a)
    });
    let left: i64 = call(&mut db, "SELECT count(*) FROM {s}.leasehold_requests", &[]).unwrap();
    assert_eq!(left, 0, "an applied request is deleted");
    // A stale holder: its lease was taken over; its end is refused and its writes with it.
    let b = store.enqueue(NewJob::new(Q, "c")).unwrap();
    let stale = store.claim(Q, "w1", LEASE).unwrap().unwrap();
    db.lapse(b);
    let fresh = store.claim(Q, "w2", LEASE).unwrap().unwrap();
    assert_eq!((fresh.job, fresh.attempt.0), (b, 2));
    let (job, attempt, token) = held(&stale);
    let mut tx = db.admin.transaction().unwrap();
    tx.execute(&format!("INSERT INTO {s}.effects VALUES ($1)"), &[&job])
        .unwrap();
    let refused = tx
        .query_one(
            &format!("SELECT {s}.complete_job($1, $2, $3)"),
            &[&job, &attempt, &token],
        )
        .unwrap_err();
    drop(tx);
    let refused = refused.as_db_error().unwrap();
    assert_eq!(refused.code().code(), "55000");
    assert_eq!(
        refused.message(),
        format!("lease lost on job {b} attempt 1: the job is now running at attempt 2")
    );
    // The same attempt with another token (a lease granted twice after a failover).
    let (job, attempt, _) = held(&fresh);
    let (code, _) = call::<i64>(
        &mut db,
        "SELECT {s}.complete_job($1, $2, $3)",
        &[&job, &attempt, &(fresh.token.as_bigint() ^ 1)],
    )
    .unwrap_err();
    assert_eq!(code, "55000");
    let effects: i64 = call(&mut db, "SELECT count(*) FROM {s}.effects", &[]).unwrap();
    assert_eq!(effects, 1, "only the accepted end's write committed");
    // Bad input, with the crate's messages.
    for (sql, says) in [
        (
            "SELECT {s}.complete_job($1, $2, $3, decode(repeat('00', 1048577), 'hex'))",
            "output is 1048577 bytes; the limit is 1048576",
        ),
        (
            "SELECT {s}.fail_job($1, $2, $3, NULL)",
            "a failure needs its error message",
        ),
        (
            "SELECT {s}.fail_job($1, $2, $3, 'x', retry_in => interval '-1 second')",
            "a retry must not wait a negative time",
        ),
        (
            "SELECT {s}.fail_job($1, $2, $3, 'x', interval '1 second', true)",
            "give retry_in or permanently, not both",
        ),
    ] {
        let (code, message) =
            call::<i64>(&mut db, sql, &[&job, &attempt, &fresh.token.as_bigint()]).unwrap_err();
        assert_eq!(code, "22023", "{sql}");
        assert!(message.contains(says), "{sql}: {message}");
    }
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

#[test]
fn fail_job_retries_by_the_policy_add_job_gave_and_a_permanent_failure_is_dead() {
    let mut db = db!("fail_job");
    let store = db.store();
    let add = |db: &mut Db, args: &str| -> leasehold::JobId {
        let id: i64 = call(db, &format!("SELECT {{s}}.add_job('{Q}', {args})"), &[]).unwrap();
        leasehold::JobId(id as u64)
    };
    let fail = |db: &mut Db, lease: &Lease, args: &str| {
        let (job, attempt, token) = held(lease);
        let sql = format!("SELECT {{s}}.fail_job($1, $2, $3, {args})");
        call::<i64>(db, &sql, &[&job, &attempt, &token]).unwrap();
    };
    // Its own policy: the first failure waits the first delay (the store's is zero).
    let delayed = add(
        &mut db,
        "'x'::bytea, max_attempts => 3, retry_delays => ARRAY[interval '1 hour', interval '2 hours']",
    );
    let lease = store.claim_job(delayed, "w", LEASE).unwrap().unwrap();
    fail(&mut db, &lease, "'the remote said no'");
    store.reap().unwrap();
    let job = store.job(delayed).unwrap().unwrap();
    assert_eq!(job.state(), JobState::RetryWait);
    let waits = from_now(&store, job.run_at());
    assert!(
        waits > Duration::from_secs(3500) && waits <= Duration::from_secs(3600),
        "{waits:?}"
    );
    assert_eq!(job.last_error(), Some("the remote said no"));
    assert_eq!(
        store.history(delayed).unwrap()[0].outcome(),
        Some(&Outcome::Failed("the remote said no".into()))
    );
    // The caller's own wait instead of the policy's.
    let soon = add(
        &mut db,
        "'x'::bytea, retry_delays => ARRAY[interval '1 hour']",
    );
    let lease = store.claim_job(soon, "w", LEASE).unwrap().unwrap();
    fail(
        &mut db,
        &lease,
        "'rate limited', retry_in => interval '5 minutes'",
    );
    store.reap().unwrap();
    let waits = from_now(&store, store.job(soon).unwrap().unwrap().run_at());
    assert!(
        waits > Duration::from_secs(280) && waits <= Duration::from_secs(300),
        "{waits:?}"
    );
    // Permanently: dead at once, its budget left unspent.
    let doomed = add(&mut db, "'x'::bytea, max_attempts => 5");
    let lease = store.claim_job(doomed, "w", LEASE).unwrap().unwrap();
    fail(&mut db, &lease, "'bad payload', permanently => true");
    store.reap().unwrap();
    assert_eq!(store.job(doomed).unwrap().unwrap().state(), JobState::Dead);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

/// `add_job`'s retry policy is written as the crate writes one: each shape read back as
/// the policy the crate would make, and each refusal with the crate's message.
#[test]
fn add_job_writes_a_retry_policy_as_the_crate_does() {
    let mut db = db!("add_job retry");
    let store = db.store();
    let secs = Duration::from_secs;
    for (args, policy) in [
        (
            "retry_base => interval '1 second', retry_max => interval '1 hour'",
            RetryPolicy::exponential(secs(1), secs(3600)),
        ),
        (
            "retry_base => interval '1.5 seconds', retry_max => interval '2 days', retry_jitter => 0.2",
            RetryPolicy::exponential(Duration::from_millis(1500), secs(2 * 86400)).jitter(0.2),
        ),
        (
            "retry_delays => ARRAY[interval '0', interval '250 ms', interval '10 minutes', interval '200 days']",
            RetryPolicy::delays([
                Duration::ZERO,
                Duration::from_millis(250),
                secs(600),
                secs(200 * 86400),
            ]),
        ),
        (
            // (each side of each of bincode's varint widths)
            "retry_delays => ARRAY[interval '250 s', interval '251 s', interval '65535 s',
                interval '65536 s', interval '4294967295 s', interval '4294967296 s']",
            RetryPolicy::delays([250, 251, 65535, 65536, 4_294_967_295, 4_294_967_296].map(secs)),
        ),
        (
            "retry_delays => ARRAY[interval '100000 years'], retry_jitter => 1",
            RetryPolicy::delays([secs(100_000 * 31_557_600)]).jitter(1.0),
        ),
    ] {
        let id: i64 = call(
            &mut db,
            &format!("SELECT {{s}}.add_job('{Q}', 'x'::bytea, {args})"),
            &[],
        )
        .unwrap();
        let job = store.job(leasehold::JobId(id as u64)).unwrap().unwrap();
        assert_eq!(job.retry_policy(), Some(&policy), "{args}");
    }
    let before = store.jobs(&Default::default()).unwrap().len();
    for (args, says) in [
        (
            "retry_base => interval '1 second'",
            "needs retry_base and retry_max",
        ),
        (
            "retry_base => interval '1 hour', retry_max => interval '1 second'",
            "retry policy is invalid: max backoff is shorter than base",
        ),
        (
            "retry_delays => ARRAY[]::interval[]",
            "a list of delays needs at least one",
        ),
        (
            "retry_delays => array_fill(interval '1 second', ARRAY[33])",
            "a list of delays may hold at most 32",
        ),
        (
            "retry_delays => ARRAY[interval '-1 second']",
            "a retry delay must not be negative",
        ),
        (
            "retry_delays => ARRAY[interval '1 second'], retry_jitter => 1.5",
            "jitter must be within 0.0..=1.0",
        ),
        ("retry_jitter => 0.1", "retry_jitter needs a retry policy"),
        (
            "retry_base => interval '1 s', retry_max => interval '2 s', retry_delays => ARRAY[interval '1 s']",
            "not both",
        ),
    ] {
        let (code, message) = call::<i64>(
            &mut db,
            &format!("SELECT {{s}}.add_job('{Q}', 'x'::bytea, {args})"),
            &[],
        )
        .unwrap_err();
        assert_eq!(code, "22023", "{args}");
        assert!(message.contains(says), "{args}: {message}");
    }
    assert_eq!(store.jobs(&Default::default()).unwrap().len(), before);
}

#[test]
fn reschedule_jobs_and_remove_job_ask_the_protocol_and_pass_over_what_does_not_wait() {
    let mut db = db!("reschedule and remove");
    let store = db.store();
    let waiting = store.enqueue(NewJob::new(Q, "w")).unwrap();
    let busy = store.enqueue(NewJob::new(Q, "r").priority(-1)).unwrap();
    let lease = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(lease.job, busy);
    let ids = [waiting.0 as i64, busy.0 as i64, 999_999];
    let sql = "SELECT array_agg(j) FROM {s}.reschedule_jobs($1, now() + interval '1 hour', 7) j";
    let asked: Vec<i64> = call(&mut db, sql, &[&&ids[..]]).unwrap();
    assert_eq!(asked, [waiting.0 as i64], "only the waiting job");
    store.reap().unwrap();
    let job = store.job(waiting).unwrap().unwrap();
    assert_eq!(job.priority(), 7);
    let due_in = from_now(&store, job.run_at());
    assert!(
        due_in > Duration::from_secs(3500) && due_in <= Duration::from_secs(3600),
        "{due_in:?}"
    );
    // Removed: a waiting job is cancelled, a running one asked to stop.
    let state: String = call(&mut db, "SELECT {s}.remove_job($1)", &[&(waiting.0 as i64)]).unwrap();
    assert_eq!(state, "queued");
    let state: String = call(&mut db, "SELECT {s}.remove_job($1)", &[&(busy.0 as i64)]).unwrap();
    assert_eq!(state, "running");
    store.reap().unwrap();
    assert_eq!(
        store.job(waiting).unwrap().unwrap().state(),
        JobState::Cancelled
    );
    assert_eq!(store.heartbeat(&lease, 1).unwrap(), Renewal::Cancelled);
    let (code, message) =
        call::<String>(&mut db, "SELECT {s}.remove_job(999999)", &[]).unwrap_err();
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("P0002", "job 999999 does not exist")
    );
    let (code, _) = call::<i64>(
        &mut db,
        "SELECT count(*) FROM {s}.reschedule_jobs($1)",
        &[&&ids[..]],
    )
    .unwrap_err();
    assert_eq!(code, "22023", "nothing to reschedule");
    // A request the protocol refuses when it comes to it is kept with its reason.
    let late = store.enqueue(NewJob::new(Q, "late")).unwrap();
    let late_ids = [late.0 as i64];
    let _: Vec<i64> = call(
        &mut db,
        "SELECT array_agg(j) FROM {s}.reschedule_jobs($1, priority => 3) j",
        &[&&late_ids[..]],
    )
    .unwrap();
    let claimed = store.claim(Q, "w", LEASE).unwrap().unwrap();
    assert_eq!(claimed.job, late);
    store.reap().unwrap();
    let refused: String = call(
        &mut db,
        "SELECT refused FROM {s}.leasehold_requests WHERE job = $1",
        &[&(late.0 as i64)],
    )
    .unwrap();
    assert!(
        refused.contains(&format!("job {late} is running")),
        "{refused}"
    );
    assert_eq!(store.job(late).unwrap().unwrap().priority(), 0);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

/// A reaper whose next pass is an hour away applies the requests made in SQL as soon as
/// its handle's listener hears the `NOTIFY`, more than a batch of them too.
#[test]
fn a_reaper_applies_a_request_made_in_sql_when_its_listener_hears_it() {
    let mut db = db!("requests heard");
    // (a batch of two: the five requests below are more than one wake-up applies)
    let store = db.builder().reap_batch(2).open().unwrap();
    let ids = store
        .enqueue_batch((0..5).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let leases = store.claim_batch(Q, "w", LEASE, 5).unwrap();
    let mut reaper = Reaper::start(store.clone(), Duration::from_secs(3600)).unwrap();
    // (one transaction: their NOTIFYs fold into one wake-up)
    let mut tx = db.admin.transaction().unwrap();
    for lease in &leases {
        let (job, attempt, token) = held(lease);
        let sql = format!(
            "SELECT {}.complete_job($1, $2, $3, 'heard'::bytea)",
            db.schema
        );
        tx.query_one(&sql, &[&job, &attempt, &token]).unwrap();
    }
    tx.commit().unwrap();
    for id in ids {
        let ended = store.wait_for(id, Duration::from_secs(60)).unwrap();
        assert_eq!(
            ended.map(|j| j.state()),
            Some(JobState::Succeeded),
            "job {id} applied before the reaper's pass"
        );
        assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"heard"[..]));
    }
    reaper.stop();
}

#[test]
fn add_job_enqueues_from_sql_as_the_store_does_with_its_refusals_and_unique_keys() {
    let mut db = db!("add_job from SQL");
    let store = db.store();
    let s = db.schema.clone();
    let seen = store.work_generation(Q);
    // The same job from Rust and from SQL: the same record but for ids and times.
    let rust = store
        .enqueue(
            NewJob::new(Q, "p")
                .priority(-2)
                .max_attempts(4)
                .metadata("tenant", "acme"),
        )
        .unwrap();
    let sql: i64 = db
        .admin
        .query_one(
            &format!(
                "SELECT {s}.add_job('{Q}', 'p'::bytea, -2, NULL, 4, NULL, ARRAY['tenant=acme'])"
            ),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    let sql = leasehold::JobId(sql as u64);
    let (a, b) = (
        store.job(rust).unwrap().unwrap(),
        store.job(sql).unwrap().unwrap(),
    );
    let shape = |j: &leasehold::Job| {
        (
            j.queue().to_owned(),
            j.state(),
            j.priority(),
            j.max_attempts(),
            j.attempt(),
            j.metadata().to_vec(),
        )
    };
    assert_eq!(shape(&a), shape(&b));
    assert_eq!(store.payload(sql).unwrap().unwrap(), b"p");
    assert_ne!(
        store.wait_for_work(Q, seen, Duration::from_secs(30)),
        seen,
        "its NOTIFY woke a waiter"
    );
    // A unique key: a live holder (made by Rust) answers the SQL enqueue, and the other way.
    let held = store
        .enqueue(NewJob::new(Q, "k").unique_key("daily"))
        .unwrap();
    let add = |db: &mut crate::db::Db, key: &str| -> i64 {
        let sql = format!("SELECT {s}.add_job('{Q}', 'k'::bytea, unique_key => '{key}')");
        db.admin.query_one(&sql, &[]).unwrap().try_get(0).unwrap()
    };
    assert_eq!(add(&mut db, "daily") as u64, held.0);
    let from_sql = add(&mut db, "weekly");
    assert_eq!(
        store
            .enqueue(NewJob::new(Q, "k").unique_key("weekly"))
            .unwrap()
            .0,
        from_sql as u64
    );
    // A holder that died keeps nothing: a new job.
    store.cancel(held).unwrap();
    assert_ne!(add(&mut db, "daily") as u64, held.0);
    // Each refusal, with the crate's message, and nothing written.
    let before = store.jobs(&Default::default()).unwrap().len();
    for (function, says) in [
        ("add_job('')", "queue name is empty"),
        (
            "add_job('q', max_attempts => 0)",
            "max attempts must be at least 1",
        ),
        (
            "add_job('q', unique_key => '')",
            "unique key must be 1 to 256 bytes",
        ),
        (
            "add_job('q', metadata => ARRAY['novalue'])",
            "metadata novalue",
        ),
        (
            "add_job('q', metadata => ARRAY['k=1', 'k=2'])",
            "given twice",
        ),
        (
            "add_job('q', decode(repeat('00', 1048577), 'hex'))",
            "payload is 1048577 bytes",
        ),
    ] {
        let (code, message) =
            call::<i64>(&mut db, &format!("SELECT {{s}}.{function}"), &[]).unwrap_err();
        assert_eq!(code, "22023", "{function}");
        assert!(message.contains(says), "{function}: {message}");
    }
    assert_eq!(store.jobs(&Default::default()).unwrap().len(), before);
    // A job it made runs like any other.
    let l = store.claim_job(sql, "w", LEASE).unwrap().unwrap();
    store.complete(&l, b"").unwrap();
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

/// `add_job`'s other half: a limit key (the job arrives parked and its key settles as the
/// protocol settles it: by the key's count and by its rate window), a time limit, a
/// uniqueness window and an expiry, each stored as the store stores them, each refusal with
/// the crate's message.
#[test]
fn add_job_takes_a_limit_key_a_time_limit_a_window_and_an_expiry_as_the_store_does() {
    use leasehold::{QueueLimits, Uniqueness};
    let mut db = db!("add_job, the rest");
    let store = db.store();
    let s = db.schema.clone();
    store.declare_queue(Q).unwrap();
    store
        .set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    let add = |db: &mut crate::db::Db, args: &str| -> leasehold::JobId {
        let sql = format!("SELECT {s}.add_job('{Q}', {args})");
        leasehold::JobId(
            db.admin
                .query_one(&sql, &[])
                .unwrap()
                .try_get::<_, i64>(0)
                .unwrap() as u64,
        )
    };
    let a0 = add(&mut db, "'a0'::bytea, limit_key => 't'");
    let a1 = add(&mut db, "'a1'::bytea, limit_key => 't'");
    let a2 = store.enqueue(NewJob::new(Q, "a2").limit_key("t")).unwrap();
    let b0 = add(&mut db, "'b0'::bytea, limit_key => 'u'");
    let counts = |store: &PgStore| {
        let stats = store.stats().unwrap();
        (stats.queues[Q].keys_at_limit, stats.queues[Q].parked)
    };
    assert_eq!(counts(&store), (0, 2), "a1 and a2 wait behind a0");
    let got = store.claim_batch(Q, "w", LEASE, 10).unwrap();
    let ids: Vec<_> = got.iter().map(|l| l.job).collect();
    assert_eq!(ids, [a0, b0], "one of each key");
    assert_eq!(counts(&store), (2, 2));
    for (done, next) in [(0, a1), (1, a2)] {
        let lease = match done {
            0 => got[0].clone(),
            _ => store.claim(Q, "w", LEASE).unwrap().unwrap(),
        };
        store.complete(&lease, b"").unwrap();
        assert_eq!(store.job(next).unwrap().unwrap().state(), JobState::Queued);
        if done == 1 {
            assert_eq!(lease.job, a1);
        }
    }
    assert_eq!(store.claim(Q, "w", LEASE).unwrap().unwrap().job, a2);
    // A rate's spent window: the key has no room, and the job from SQL waits parked.
    let hour = Duration::from_secs(3600);
    store.declare_queue("rated").unwrap();
    store
        .set_queue_limits("rated", QueueLimits::none().per_key_rate(1, hour))
        .unwrap();
    store
        .enqueue(NewJob::new("rated", "r0").limit_key("r"))
        .unwrap();
    let r0 = store.claim("rated", "w", LEASE).unwrap().unwrap();
    store.complete(&r0, b"").unwrap();
    let sql = format!("SELECT {s}.add_job('rated', 'r1'::bytea, limit_key => 'r')");
    db.admin.query_one(&sql, &[]).unwrap();
    assert!(store.claim("rated", "w", LEASE).unwrap().is_none());
    let rated = &store.stats().unwrap().queues["rated"];
    assert_eq!((rated.keys_at_limit, rated.parked), (1, 1));
    // The columns, as the store keeps them.
    let limited = add(&mut db, "'x'::bytea, time_limit => interval '30 seconds'");
    let windowed = add(
        &mut db,
        "'x'::bytea, unique_key => 'w', unique_for => interval '1 hour'",
    );
    let expiring = add(
        &mut db,
        "'x'::bytea, expires_at => now() + interval '1 hour'",
    );
    let job = |id| store.job(id).unwrap().unwrap();
    assert_eq!(job(limited).time_limit(), Some(Duration::from_secs(30)));
    assert_eq!(job(windowed).uniqueness(), Uniqueness::AfterSuccess(hour));
    let left = job(expiring)
        .expires_at()
        .unwrap()
        .saturating_since(store.now().unwrap());
    assert!(left > Duration::from_secs(3000) && left <= hour, "{left:?}");
    // Each refusal, with the crate's message, and nothing written.
    let before = store.jobs(&Default::default()).unwrap().len();
    for (args, says) in [
        (
            "time_limit => interval '0 seconds'",
            "a job's time limit must be greater than zero",
        ),
        (
            "unique_for => interval '1 hour'",
            "a uniqueness window needs a unique key",
        ),
        ("limit_key => ''", "limit key must be 1 to 256 bytes"),
        (
            "run_at => now() + interval '1 hour', expires_at => now() + interval '1 minute'",
            "it could never run",
        ),
    ] {
        let sql = format!("SELECT {{s}}.add_job('{Q}', 'x'::bytea, {args})");
        let (code, message) = call::<i64>(&mut db, &sql, &[]).unwrap_err();
        assert_eq!(code, "22023", "{args}");
        assert!(message.contains(says), "{args}: {message}");
    }
    assert_eq!(store.jobs(&Default::default()).unwrap().len(), before);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}
