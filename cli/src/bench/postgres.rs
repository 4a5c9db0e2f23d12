//! The PostgreSQL store beside a bare claim loop on the same database: durable end to end at
//! 1 and 16 workers, the hand-written `SKIP LOCKED` loop doing the same transitions as the
//! floor, a thousand renewals in one statement, and a claim among a million waiting rows.
//!
//! Runs where `LEASEHOLD_PG_URL` names a server; each run works in a schema of its own,
//! dropped at its end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::postgres::client::{Client, NoTls};
use leasehold::postgres::{PgError, PgStore};
use leasehold::{Error, JobState, NewJob, WorkerPool};
use leasehold::{JobStore, ReadJobs};

use super::LEASE;
use super::measure::{Row, Samples, timed};

/// A schema of the bench's own on the server, dropped when the bench is done.
pub(super) struct Scratch {
    pub(super) url: String,
    pub(super) schema: String,
    pub(super) admin: Client,
}

impl Scratch {
    pub(super) fn new(url: &str) -> Result<Scratch, Error> {
        let admin = Client::connect(url, NoTls).map_err(|e| PgError::Connect(e.to_string()))?;
        Ok(Scratch {
            url: url.to_owned(),
            schema: format!("lh_bench_{}", std::process::id()),
            admin,
        })
    }

    pub(super) fn store(&self, name: &str) -> Result<PgStore, Error> {
        self.store_with(name, |b| b)
    }

    /// [`Scratch::store`], its builder first passed through `with`.
    pub(super) fn store_with(
        &self,
        name: &str,
        with: impl FnOnce(leasehold::postgres::PgStoreBuilder) -> leasehold::postgres::PgStoreBuilder,
    ) -> Result<PgStore, Error> {
        with(PgStore::builder(&self.url).schema(format!("{}_{name}", self.schema))).open()
    }

    pub(super) fn sql(&mut self, sql: &str) -> Result<(), Error> {
        Ok(self
            .admin
            .batch_execute(&sql.replace("{s}", &self.schema))?)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let schemas: Vec<String> = self
            .admin
            .query(
                "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1",
                &[&format!("{}%", self.schema)],
            )
            .map(|rows| rows.iter().map(|r| r.get(0)).collect())
            .unwrap_or_default();
        for schema in schemas {
            let _ = self
                .admin
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
        }
    }
}

pub(super) fn rows(url: &str, scale: f64) -> Result<Vec<Row>, Error> {
    let n = |base: usize| ((base as f64 * scale) as usize).max(50);
    let mut scratch = Scratch::new(url)?;
    let mut rows = Vec::new();
    for workers in [1, 16] {
        rows.push(end_to_end(
            &scratch,
            workers,
            n(if workers == 1 { 1_000 } else { 8_000 }),
        )?);
    }
    churn(&mut scratch, "e2e16")?;
    rows.push(bare_loop(&mut scratch, 16, n(8_000))?);
    rows.extend(renewals(&mut scratch)?);
    rows.push(wake_across_handles(&scratch, 200)?);
    for waiting in [1_000, n(1_000_000)] {
        rows.push(claim_at_depth(&mut scratch, waiting)?);
    }
    Ok(rows)
}

/// A pool of `workers` on a PgStore: every job enqueued, claimed, completed (durable: every
/// commit is PostgreSQL's, which syncs its WAL at commit).
fn end_to_end(scratch: &Scratch, workers: usize, jobs: usize) -> Result<Row, Error> {
    let store = scratch.store(&format!("e2e{workers}"))?;
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    let start = Instant::now();
    let pool = WorkerPool::builder(store.clone(), "e2e")
        .concurrency(workers)
        .start(move |_| {
            d.fetch_add(1, Ordering::Relaxed);
            Ok(Vec::new())
        })?;
    super::enqueue_numbered(&store, "e2e", jobs, 256)?;
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    Ok(Samples(Vec::new()).row(
        "PostgreSQL: end to end, enqueue -> claim -> complete, pool",
        "durable",
        workers,
        total,
        jobs as u64,
    ))
}

/// What churn left in a job table: dead row versions against live ones, how many updates
/// were HOT, and whether autovacuum has been by. Reported on stderr: a state, not a rate.
fn churn(scratch: &mut Scratch, name: &str) -> Result<(), Error> {
    // The store's connections are gone with its pool; their counts reach the statistics
    // as they exit.
    std::thread::sleep(Duration::from_millis(500));
    let row = scratch.admin.query_one(
        "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'leasehold_jobs'",
        &[&format!("{}_{name}", scratch.schema)],
    )?;
    let (live, dead, upd, hot, vacuums): (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    eprintln!(
        "postgres: after the 16-worker run, the job table holds {live} live and {dead} dead row \
         versions; {hot} of {upd} updates were HOT; autovacuum ran {vacuums} time(s)"
    );
    Ok(())
}

/// The floor: `threads` hand-written loops, each claiming one job with `FOR UPDATE SKIP
/// LOCKED` in a CTE (attempt + 1, a lease) and completing it fenced on id and attempt with a
/// history row, two transactions per job: the transitions leasehold makes, without leasehold.
fn bare_loop(scratch: &mut Scratch, threads: usize, jobs: usize) -> Result<Row, Error> {
    scratch.sql(
        "CREATE SCHEMA {s}_bare;
         CREATE TABLE {s}_bare.jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             queue text NOT NULL, state text NOT NULL, priority int NOT NULL DEFAULT 0,
             attempt bigint NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
             owner text, expires_at timestamptz, finished_at timestamptz, payload bytea,
             output bytea);
         CREATE INDEX ON {s}_bare.jobs (queue, priority, run_at, id) WHERE state = 'queued';
         CREATE TABLE {s}_bare.runs (job bigint, attempt bigint, outcome text,
             ended_at timestamptz, PRIMARY KEY (job, attempt));",
    )?;
    let insert = format!(
        "INSERT INTO {}_bare.jobs (queue, state, payload)
         SELECT 'q', 'queued', convert_to(g::text, 'UTF8') FROM generate_series(1, $1::bigint) g",
        scratch.schema
    );
    scratch.admin.execute(&insert, &[&(jobs as i64)])?;
    let claim = format!(
        "WITH picked AS (SELECT id FROM {s}_bare.jobs WHERE queue = 'q' AND state = 'queued'
             AND run_at <= clock_timestamp() ORDER BY priority, run_at, id LIMIT 1
             FOR UPDATE SKIP LOCKED)
         UPDATE {s}_bare.jobs j SET state = 'running', attempt = j.attempt + 1, owner = $1,
             expires_at = clock_timestamp() + interval '60 seconds'
         FROM picked WHERE j.id = picked.id RETURNING j.id, j.attempt, j.payload",
        s = scratch.schema
    );
    let complete = format!(
        "WITH done AS (UPDATE {s}_bare.jobs SET state = 'succeeded',
             finished_at = clock_timestamp(), output = '', owner = NULL, expires_at = NULL
             WHERE id = $1 AND attempt = $2 AND state = 'running' RETURNING id, attempt)
         INSERT INTO {s}_bare.runs SELECT id, attempt, 'succeeded', clock_timestamp() FROM done",
        s = scratch.schema
    );
    let start = Instant::now();
    let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (url, claim, complete) = (&scratch.url, &claim, &complete);
                s.spawn(move || -> Result<(), Error> {
                    let mut c =
                        Client::connect(url, NoTls).map_err(|e| PgError::Connect(e.to_string()))?;
                    let claim = c.prepare(claim)?;
                    let complete = c.prepare(complete)?;
                    let worker = format!("bare-{t}");
                    while let Some(row) = c.query_opt(&claim, &[&worker])? {
                        let (id, attempt): (i64, i64) = (row.get(0), row.get(1));
                        assert_eq!(c.execute(&complete, &[&id, &attempt])?, 1);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Ok(())))
            .collect()
    });
    let total = start.elapsed();
    results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    Ok(Samples(Vec::new()).row(
        "PostgreSQL: bare SKIP LOCKED loop, claim + fenced complete with history (the floor)",
        "durable",
        threads,
        total,
        jobs as u64,
    ))
}

/// From an enqueue through one handle (another machine) to the start of its handler in an
/// idle pool on a second handle: the `NOTIFY` from the enqueue's transaction, heard by the
/// second handle's `LISTEN` connection, wakes the pool's dispatcher.
fn wake_across_handles(scratch: &Scratch, n: usize) -> Result<Row, Error> {
    let here = scratch.store("wake")?;
    let there = scratch.store("wake")?;
    let started: Arc<parking_lot::Mutex<Vec<Instant>>> = Arc::default();
    let s = started.clone();
    let pool = WorkerPool::builder(here.clone(), "wake").start(move |_| {
        s.lock().push(Instant::now());
        Ok(Vec::new())
    })?;
    // The listener starts with the pool's first look for work: wait until it hears one.
    there.enqueue(NewJob::new("wake", "warm-up"))?;
    while started.lock().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut samples = Vec::with_capacity(n);
    let begin = Instant::now();
    for i in 0..n {
        let before = started.lock().len();
        let t = Instant::now();
        there.enqueue(NewJob::new("wake", format!("{i}")))?;
        while started.lock().len() == before {
            std::thread::sleep(Duration::from_micros(50));
        }
        let at = started.lock()[before];
        samples.push(at.duration_since(t));
        while there.stats()?.total(JobState::Succeeded) < (i + 2) as u64 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let total = begin.elapsed();
    pool.shutdown(Duration::from_secs(5));
    Ok(Samples(samples).row(
        "PostgreSQL: enqueue on one handle -> handler start in an idle pool of another (LISTEN/NOTIFY)",
        "durable",
        1,
        total,
        n as u64,
    ))
}

/// A thousand leases renewed in one statement, against one lease renewed alone; and how many
/// of the table's updates PostgreSQL could make HOT (in place, no index touched), which is
/// what keeps a heartbeat-heavy table from bloating its indexes.
fn renewals(scratch: &mut Scratch) -> Result<Vec<Row>, Error> {
    let store = scratch.store("beat")?;
    store.enqueue_batch((0..1000).map(|i| NewJob::new("b", format!("{i}"))))?;
    let leases = store.claim_batch("b", "w", LEASE, 1000)?;
    let beats: Vec<_> = leases.iter().map(|l| (l, 1)).collect();
    let rounds = 30;
    let (batch, total) = timed(rounds, |i| {
        let beats: Vec<_> = beats.iter().map(|(l, _)| (*l, i as u64)).collect();
        match store
            .heartbeat_batch(&beats)
            .into_iter()
            .find_map(Result::err)
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })?;
    let batch_row = batch.row(
        "PostgreSQL: heartbeat of 1,000 leases in one statement",
        "durable",
        1,
        total,
        rounds as u64,
    );
    let (one, total) = timed(300, |i| store.heartbeat(&leases[0], i as u64).map(|_| ()))?;
    let one_row = one.row(
        "PostgreSQL: heartbeat of one lease",
        "durable",
        1,
        total,
        300,
    );
    // A backend reports its counts to the statistics when it exits, if not before.
    drop(leases);
    drop(store);
    std::thread::sleep(Duration::from_millis(500));
    let row = scratch.admin.query_one(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
         WHERE schemaname = $1 AND relname = 'leasehold_jobs'",
        &[&format!("{}_beat", scratch.schema)],
    )?;
    let (updates, hot): (i64, i64) = (row.get(0), row.get(1));
    eprintln!(
        "postgres: {hot} of {updates} updates of the renewal bench's job table were HOT ({:.0} %)",
        100.0 * hot as f64 / updates.max(1) as f64
    );
    Ok(vec![batch_row, one_row])
}

/// Claim latency among `waiting` due jobs (filled by SQL, for speed), claims completed as
/// they go so the depth stays.
fn claim_at_depth(scratch: &mut Scratch, waiting: usize) -> Result<Row, Error> {
    let store = scratch.store(&format!("depth{waiting}"))?;
    store.enqueue(NewJob::new("d", "first"))?;
    scratch.sql(&format!(
        "INSERT INTO {{s}}_depth{waiting}.leasehold_jobs
             (queue, state, priority, max_attempts, created_at, run_at, progress_at, updated_at,
              payload)
         SELECT 'd', 'queued', 0, 25, clock_timestamp(), clock_timestamp(), clock_timestamp(),
             clock_timestamp(), convert_to(g::text, 'UTF8')
         FROM generate_series(1, {waiting}) g;
         ANALYZE {{s}}_depth{waiting}.leasehold_jobs;"
    ))?;
    let (s, total) = timed(300, |_| {
        let lease = store
            .claim("d", "w", LEASE)?
            .ok_or(Error::Corrupt("empty".into()))?;
        store.complete(&lease, b"")
    })?;
    Ok(s.row(
        &format!("PostgreSQL: claim + complete among {waiting} waiting jobs"),
        "durable",
        1,
        total,
        300,
    ))
}

/// What an end asked for in SQL costs (`complete_job`, applied by the protocol in a
/// reaper's transaction: see the PostgreSQL guide): the call alone (its fence, its request
/// row, its `NOTIFY`), and the call until the job has ended, a reaper woken by the
/// `NOTIFY` (its next pass an hour away); beside a completion from Rust, one per call.
pub(super) fn sql_ends(scratch: &mut Scratch, n: usize) -> Result<Vec<Row>, Error> {
    let store = scratch.store("sqlends")?;
    let schema = format!("{}_sqlends", scratch.schema);
    store.enqueue_batch((0..=3 * n).map(|i| NewJob::new("s", format!("{i}"))))?;
    let leases = store.claim_batch("s", "w", LEASE, 3 * n + 1)?;
    if leases.len() <= 3 * n {
        return Err(Error::InUse("the SQL ends' jobs were not all claimed"));
    }
    let complete = format!("SELECT {schema}.complete_job($1, $2, $3)");
    let mut call = |lease: &leasehold::Lease| -> Result<(), Error> {
        let args = (
            lease.job.0 as i64,
            lease.attempt.0 as i32,
            lease.token.as_bigint(),
        );
        scratch
            .admin
            .query_one(&complete, &[&args.0, &args.1, &args.2])
            .map(drop)
            .map_err(Error::from)
    };
    // The calls alone, no reaper: their requests wait (applied below, by the reaper).
    let (accepted, total) = timed(n, |i| call(&leases[i]))?;
    let mut rows = vec![accepted.row(
        "PostgreSQL: complete_job in SQL, accepted (one per transaction)",
        "durable",
        1,
        total,
        n as u64,
    )];
    let mut reaper = leasehold::Reaper::start(store.clone(), Duration::from_secs(3600))?;
    let mut applied = |lease: &leasehold::Lease| -> Result<(), Error> {
        call(lease)?;
        // (read every 100 µs rather than by `wait_for`, whose pauses grow to 200 ms: the
        // time measured is the application's, not the wait's)
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.job(lease.job)?.map(|j| j.state()) != Some(JobState::Succeeded) {
            if Instant::now() > deadline {
                return Err(Error::InUse("a completion asked in SQL was not applied"));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    };
    // (the first, untimed: the reaper's listener connects and the requests before it
    // listened are applied)
    applied(&leases[3 * n])?;
    let (applied, total) = timed(n, |i| applied(&leases[n + i]))?;
    reaper.stop();
    rows.push(applied.row(
        "PostgreSQL: complete_job in SQL until the job has ended (a reaper woken)",
        "durable",
        1,
        total,
        n as u64,
    ));
    let (rust, total) = timed(n, |i| store.complete(&leases[2 * n + i], b""))?;
    rows.push(rust.row(
        "PostgreSQL: complete from Rust, one per call",
        "durable",
        1,
        total,
        n as u64,
    ));
    Ok(rows)
}
