//! Drain rows: what the peer harness (`../shared/peers/`) does to graphile-worker and
//! pgqueuer, done to leasehold, so the figures can stand side by side: enqueue N empty jobs,
//! 256 per call, then start a pool of W workers and time until every completion is committed.
//!
//! "Committed" is the pool's own `succeeded` count, which moves only once a completion's
//! transaction has committed; the store's counts are checked after the clock stops.

use std::time::{Duration, Instant};

use leasehold::{Engine, Error, JobState, JobStore, NewJob, WorkerPool};

use super::measure::{Row, Samples};

/// Jobs per enqueue call, as in the peer harness.
const ENQUEUE_BATCH: usize = 256;

/// Enqueues `jobs` empty jobs on `store`, then drains them with a pool of `workers`: a row
/// for each half.
pub(super) fn drain<S>(
    label: &str,
    store: S,
    workers: usize,
    jobs: usize,
) -> Result<[Row; 2], Error>
where
    S: Engine + JobStore + Clone,
{
    let enqueued = enqueue(label, &store, jobs)?;
    let name = format!("drain: {jobs} empty jobs enqueued, then drained ({label})");
    let drained = drained(&name, &store, workers, jobs, || {
        WorkerPool::builder(store.clone(), QUEUE)
            .concurrency(workers)
            .start(|_| Ok(Vec::new()))
    })?;
    Ok([enqueued, drained])
}

/// [`drain`] while `follower` (another handle on the same store, or the same) follows every
/// end ([`leasehold::ReadJobs::wait_for_endings`]): the drain's row, once the follower has
/// read every job's end.
pub(super) fn drain_followed<S, F>(
    label: &str,
    store: S,
    follower: F,
    workers: usize,
    jobs: usize,
) -> Result<Row, Error>
where
    S: Engine + JobStore + Clone,
    F: leasehold::ReadJobs + 'static,
{
    let start = store.endings(leasehold::EndCursor::START, usize::MAX)?.next;
    let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let following = std::thread::spawn({
        let read = read.clone();
        move || -> Result<(), Error> {
            let mut at = start;
            while read.load(std::sync::atomic::Ordering::SeqCst) < jobs {
                let page = follower.wait_for_endings(at, 1000, Duration::from_secs(60))?;
                read.fetch_add(page.list.len(), std::sync::atomic::Ordering::SeqCst);
                at = page.next;
            }
            Ok(())
        }
    });
    enqueue(label, &store, jobs)?;
    let name =
        format!("drain: {jobs} empty jobs, drained while a follower reads every end ({label})");
    let row = drained(&name, &store, workers, jobs, || {
        WorkerPool::builder(store.clone(), QUEUE)
            .concurrency(workers)
            .start(|_| Ok(Vec::new()))
    })?;
    // (by now, the pool shut down and the store counted, it has read them all, or nearly)
    match following.join() {
        Ok(followed) => followed?,
        Err(_) => return Err(Error::Internal("the follower panicked")),
    }
    Ok(Row {
        operation: format!("{} (the follower read all {jobs} ends)", row.operation),
        ..row
    })
}

/// What each job of a [`drain_doing`] does besides ending.
#[derive(Clone, Copy, Debug)]
pub(super) enum Doing {
    Nothing,
    /// Writes one line to its attempt's log (it reaches the store with the attempt's end).
    LogsALine,
    /// Saves one checkpoint of 16 bytes (a write transaction of its own).
    SavesACheckpoint,
}

/// [`drain`]'s drain, each job doing `doing`: what a log line or a checkpoint costs a job.
pub(super) fn drain_doing<S>(
    label: &str,
    store: S,
    workers: usize,
    jobs: usize,
    doing: Doing,
) -> Result<Row, Error>
where
    S: Engine + JobStore + Clone,
{
    enqueue(label, &store, jobs)?;
    let what = match doing {
        Doing::Nothing => "nothing else",
        Doing::LogsALine => "each writing a log line",
        Doing::SavesACheckpoint => "each saving a checkpoint",
    };
    let name = format!("drain: {jobs} empty jobs, {what} ({label})");
    drained(&name, &store, workers, jobs, || {
        WorkerPool::builder(store.clone(), QUEUE)
            .concurrency(workers)
            .start(move |ctx| {
                match doing {
                    Doing::Nothing => {}
                    Doing::LogsALine => ctx.log("resized 3 images"),
                    Doing::SavesACheckpoint => ctx.save_checkpoint(&[7; 16])?,
                }
                Ok(Vec::new())
            })
    })
}

/// The application's table a drain with writes fills: a row per job.
const DONE: leasehold::redb::TableDefinition<u64, u64> =
    leasehold::redb::TableDefinition::new("bench.done");

/// [`drain`] on redb where every completion also writes a row of the application's own
/// table in its transaction (`Output::with_writes`): a row for the drain.
pub(super) fn drain_with_writes(
    label: &str,
    store: leasehold::Store,
    workers: usize,
    jobs: usize,
) -> Result<Row, Error> {
    enqueue(label, &store, jobs)?;
    let name =
        format!("drain: {jobs} jobs, each writing a row of the application's, drained ({label})");
    let row = drained(&name, &store, workers, jobs, || {
        WorkerPool::builder(store.clone(), QUEUE)
            .concurrency(workers)
            .start(|ctx| {
                let job = ctx.job().0;
                Ok(leasehold::Output::with_writes(Vec::new(), move |t| {
                    t.open_table(DONE)?.insert(job, 1)?;
                    Ok::<(), Error>(())
                }))
            })
    })?;
    let read = store.begin_read()?;
    let table = read.open_table(DONE).map_err(super::io)?;
    let rows = leasehold::redb::ReadableTableMetadata::len(&table).map_err(super::io)?;
    if rows != jobs as u64 {
        eprintln!("drain with writes: {rows} rows for {jobs} jobs");
        return Err(Error::Internal("a drain's writes did not all commit"));
    }
    Ok(row)
}

pub(super) const QUEUE: &str = "drain";

/// Enqueues `jobs` empty jobs, [`ENQUEUE_BATCH`] per call: a row for it.
pub(super) fn enqueue<S: JobStore>(label: &str, store: &S, jobs: usize) -> Result<Row, Error> {
    let mut left = jobs;
    let start = Instant::now();
    while left > 0 {
        let k = left.min(ENQUEUE_BATCH);
        store.enqueue_batch((0..k).map(|_| NewJob::new(QUEUE, Vec::new())).collect())?;
        left -= k;
    }
    Ok(Samples(Vec::new()).row(
        &format!("drain: enqueue {jobs} empty jobs, {ENQUEUE_BATCH} per call ({label})"),
        "durable",
        1,
        start.elapsed(),
        jobs as u64,
    ))
}

/// Starts a pool with `start` and times it (its start included) until it has committed
/// `jobs` completions, then checks the store agrees: the row `name`. The store holds only
/// the drain's jobs.
pub(super) fn drained<S: JobStore>(
    name: &str,
    store: &S,
    workers: usize,
    jobs: usize,
    start_pool: impl FnOnce() -> Result<WorkerPool, Error>,
) -> Result<Row, Error> {
    let start = Instant::now();
    let pool = start_pool()?;
    while pool.stats().succeeded < jobs as u64 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let succeeded = store.stats()?.total(JobState::Succeeded);
    if succeeded != jobs as u64 {
        eprintln!("drain: {succeeded} of {jobs} jobs succeeded in the store");
        return Err(Error::Internal("a drain left jobs unfinished"));
    }
    Ok(Samples(Vec::new()).row(name, "durable", workers, total, jobs as u64))
}
