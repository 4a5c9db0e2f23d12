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
    let queue = "drain";
    let mut left = jobs;
    let start = Instant::now();
    while left > 0 {
        let k = left.min(ENQUEUE_BATCH);
        store.enqueue_batch((0..k).map(|_| NewJob::new(queue, Vec::new())).collect())?;
        left -= k;
    }
    let enqueued = Samples(Vec::new()).row(
        &format!("drain: enqueue {jobs} empty jobs, {ENQUEUE_BATCH} per call ({label})"),
        "durable",
        1,
        start.elapsed(),
        jobs as u64,
    );
    let start = Instant::now();
    let pool = WorkerPool::builder(store.clone(), queue)
        .concurrency(workers)
        .start(|_| Ok(Vec::new()))?;
    while pool.stats().succeeded < jobs as u64 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let succeeded = store
        .stats()?
        .queues
        .get(queue)
        .map_or(0, |c| c.get(JobState::Succeeded));
    if succeeded != jobs as u64 {
        eprintln!("drain: {succeeded} of {jobs} jobs succeeded in the store");
        return Err(Error::Internal("a drain left jobs unfinished"));
    }
    let drained = Samples(Vec::new()).row(
        &format!("drain: {jobs} empty jobs enqueued, then drained ({label})"),
        "durable",
        workers,
        total,
        jobs as u64,
    );
    Ok([enqueued, drained])
}
