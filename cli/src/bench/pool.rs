//! Worker pools end to end (enqueue, claim, complete), the store alone as the ceiling they are
//! read against, and the latency from an enqueue to its handler's start.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, JobState, NewJob, Sharing, WorkerPool};
use leasehold::{JobStore, ReadJobs};
use parking_lot::Mutex;

use super::measure::{Row, Samples};
use super::{LEASE, store, store_with};

/// A worker pool's shape for the end-to-end scenarios.
pub(super) struct PoolShape {
    pub(super) workers: usize,
    /// `None`: the pool's default (claims ahead what two commits' wait covers).
    pub(super) prefetch: Option<usize>,
    pub(super) sharing: Sharing,
}

pub(super) fn end_to_end(
    dir: &Path,
    durable: bool,
    shape: PoolShape,
    jobs: usize,
) -> Result<Row, Error> {
    let PoolShape {
        workers,
        prefetch,
        sharing,
    } = shape;
    let name = format!("e2e-{durable}-{workers}-{prefetch:?}-{sharing:?}.redb");
    let store = store_with(dir, &name, durable, |b| b.sharing(sharing))?;
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    let start = Instant::now();
    let mut builder = WorkerPool::builder(store.clone(), "e2e").concurrency(workers);
    if let Some(n) = prefetch {
        builder = builder.prefetch(n);
    }
    let pool = builder.start(move |_| {
        d.fetch_add(1, Ordering::Relaxed);
        Ok(Vec::new())
    })?;
    super::enqueue_numbered(&store, "e2e", jobs, 64)?;
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let commits = store.metrics().write_transactions.max(1);
    let file = match sharing {
        Sharing::Exclusive => "exclusive file",
        Sharing::MultiProcess => "shared file, 1 process",
        _ => "single-writer file",
    };
    let ahead = match prefetch {
        None => String::new(),
        Some(0) => ", nothing claimed ahead".to_owned(),
        Some(n) => format!(", {n} claimed ahead"),
    };
    Ok(Samples(Vec::new()).row(
        &format!(
            "end to end: enqueue -> claim -> complete, pool ({file}{ahead}; {:.1} jobs/commit)",
            jobs as f64 / commits as f64
        ),
        if durable { "durable" } else { "non-durable" },
        workers,
        total,
        jobs as u64,
    ))
}

/// The store alone on one thread, no pool, non-durable: enqueue, claim and complete in batches
/// of 32 (three commits per 32 jobs). What a non-durable pool's end-to-end rate is bounded by:
/// every write goes through the one write transaction, so no pool moves jobs faster. (Durable,
/// the bound is the fsync instead, which a pool shares among more jobs than this.)
pub(super) fn write_path_ceiling(dir: &Path, jobs: usize) -> Result<Row, Error> {
    const BATCH: usize = 32;
    let store = store(dir, "ceiling.redb", false)?;
    let start = Instant::now();
    let mut moved = 0;
    while moved < jobs {
        store.enqueue_batch((0..BATCH).map(|i| NewJob::new("ceiling", format!("{i}"))))?;
        let leases = store.claim_batch("ceiling", "w", LEASE, BATCH)?;
        let done: Vec<_> = leases.iter().map(|l| (l, [].as_slice())).collect();
        for result in store.complete_batch(&done) {
            result?;
        }
        moved += leases.len();
    }
    Ok(Samples(Vec::new()).row(
        &format!(
            "store alone, no pool: enqueue, claim, complete {BATCH} per commit (exclusive file)"
        ),
        "non-durable",
        1,
        start.elapsed(),
        moved as u64,
    ))
}

/// Enqueue-to-handler-start latency in one process: an idle pool woken by each enqueue.
pub(super) fn wake_latency(dir: &Path, n: usize) -> Result<Row, Error> {
    let store = store(dir, "wake.redb", false)?;
    let started: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(Vec::new()));
    let s = started.clone();
    let pool = WorkerPool::builder(store.clone(), "wake").start(move |_| {
        s.lock().push(Instant::now());
        Ok(Vec::new())
    })?;
    let mut samples = Vec::with_capacity(n);
    let begin = Instant::now();
    for i in 0..n {
        let before = started.lock().len();
        let t = Instant::now();
        store.enqueue(NewJob::new("wake", format!("{i}")))?;
        while started.lock().len() == before {
            std::hint::spin_loop();
        }
        let at = started.lock()[before];
        samples.push(at.duration_since(t));
        // let the completion commit before the next enqueue
        while store.stats()?.total(JobState::Succeeded) < (i + 1) as u64 {
            std::thread::yield_now();
        }
    }
    let total = begin.elapsed();
    pool.shutdown(Duration::from_secs(5));
    Ok(Samples(samples).row(
        "enqueue-to-handler-start (latency; ops/s = sequential round trips)",
        "non-durable",
        1,
        total,
        n as u64,
    ))
}
