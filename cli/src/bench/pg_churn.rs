//! Dead rows under sustained churn on PostgreSQL: a 16-worker pool kept busy for minutes,
//! once keeping every finished job and once with a retention that the reaper purges in
//! batches, sampling the tables as it goes. Every claim and completion of a job row is a new
//! row version (neither can be HOT: both move indexed columns), so a job table churns dead
//! versions at twice the job rate; what matters is whether autovacuum keeps up and whether
//! the table's size stays the size of the live work.
//!
//! Run by name only (`leasehold bench --only churn`): it takes minutes. The curve is printed
//! on stderr, one line per sample; each run also gives a row of its sustained rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::postgres::PgStore;
use leasehold::{Error, NewJob, Reaper, WorkerPool};

use super::measure::{Row, Samples};
use super::postgres::Scratch;

/// How many jobs the producer keeps waiting ahead of the pool.
const BACKLOG: u64 = 2_000;
/// How often the reaper runs (and, with a retention, purges).
const REAP_EVERY: Duration = Duration::from_secs(1);
/// How long finished jobs are kept in the purged run.
const RETENTION: Duration = Duration::from_secs(5);

pub(super) fn rows(url: &str, scale: f64) -> Result<Vec<Row>, Error> {
    let length = Duration::from_secs_f64((120.0 * scale).max(20.0));
    let sample = Duration::from_secs_f64((length.as_secs_f64() / 12.0).max(2.0));
    let mut scratch = Scratch::new(url)?;
    let mut rows = Vec::new();
    for retention in [None, Some(RETENTION)] {
        rows.push(run(&mut scratch, retention, length, sample)?);
    }
    Ok(rows)
}

/// One sample of a table's state.
struct Table {
    live: i64,
    dead: i64,
    bytes: i64,
    /// By autovacuum or by the store's reaper.
    vacuums: i64,
}

fn table(scratch: &mut Scratch, schema: &str, table: &str) -> Result<Table, Error> {
    let row = scratch.admin.query_one(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count,
                pg_total_relation_size(format('%I.%I', schemaname, relname)::regclass)
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
        &[&schema, &table],
    )?;
    Ok(Table {
        live: row.get(0),
        dead: row.get(1),
        vacuums: row.get(2),
        bytes: row.get(3),
    })
}

fn run(
    scratch: &mut Scratch,
    retention: Option<Duration>,
    length: Duration,
    sample: Duration,
) -> Result<Row, Error> {
    let name = match retention {
        None => "churn_kept",
        Some(_) => "churn_purged",
    };
    let schema = format!("{}_{name}", scratch.schema);
    let mut builder = PgStore::builder(&scratch.url).schema(&schema);
    if let Some(keep) = retention {
        builder = builder.retention(keep);
    }
    let store = builder.open()?;
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    let pool = WorkerPool::builder(store.clone(), "churn")
        .concurrency(16)
        .start(move |_| {
            d.fetch_add(1, Ordering::Relaxed);
            Ok(Vec::new())
        })?;
    let reaper = Reaper::start(store.clone(), REAP_EVERY)?;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (store, done, stop) = (store.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(), Error> {
            let mut enqueued = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if enqueued.saturating_sub(done.load(Ordering::Relaxed)) < BACKLOG {
                    store.enqueue_batch((0..500).map(|i| NewJob::new("churn", format!("{i}"))))?;
                    enqueued += 500;
                } else {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            Ok(())
        })
    };
    eprintln!(
        "postgres churn, 16 workers, {}: t s, jobs/s in the window, job table live / dead row \
         versions, job table MB (with indexes), history MB, vacuums of the job table (autovacuum's and the reaper's)",
        match retention {
            None => "every finished job kept".to_owned(),
            Some(keep) => format!("finished jobs purged after {} s", keep.as_secs()),
        }
    );
    let start = Instant::now();
    let (mut last_done, mut last_at) = (0u64, start);
    while start.elapsed() < length {
        std::thread::sleep(sample);
        let now_done = done.load(Ordering::Relaxed);
        let rate = (now_done - last_done) as f64 / last_at.elapsed().as_secs_f64();
        (last_done, last_at) = (now_done, Instant::now());
        let jobs = table(scratch, &schema, "leasehold_jobs")?;
        let runs = table(scratch, &schema, "leasehold_runs")?;
        eprintln!(
            "  {:>5.0} {:>8.0} {:>9} / {:<9} {:>7.1} {:>7.1} {:>3}",
            start.elapsed().as_secs_f64(),
            rate,
            jobs.live,
            jobs.dead,
            jobs.bytes as f64 / 1e6,
            runs.bytes as f64 / 1e6,
            jobs.vacuums,
        );
    }
    stop.store(true, Ordering::Relaxed);
    let produced = producer.join();
    let total = start.elapsed();
    let jobs = done.load(Ordering::Relaxed);
    pool.shutdown(Duration::from_secs(5));
    drop(reaper);
    match produced {
        Ok(result) => result?,
        Err(panic) => std::panic::resume_unwind(panic),
    }
    Ok(Samples(Vec::new()).row(
        match retention {
            None => "PostgreSQL: sustained churn, every finished job kept",
            Some(_) => "PostgreSQL: sustained churn, finished jobs purged after 5 s by the reaper",
        },
        "durable",
        16,
        total,
        jobs,
    ))
}
