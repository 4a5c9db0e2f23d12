//! What the window and the batch delay trade: a lone worker's drain rate against what a pool
//! leaves behind when it dies mid-drain (`WorkerPool::abandon`, as a killed process would):
//! leases it held (jobs nobody can run until those leases run out, or at once where a
//! shared redb store sees the process die), and jobs it ran whose completions were never
//! committed (they run again). And what the batch delay buys where jobs arrive one by one
//! on a drained queue: completions per commit, against the latency from enqueue to commit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasehold::{Engine, Error, JobId, JobState, JobStore, NewJob, PoolBuilder, WorkerPool};

use super::measure::{Row, Samples};

/// The settings compared.
const SHAPES: [(&str, Shape); 4] = [
    ("nothing claimed ahead", Shape::Prefetch(0)),
    ("window 32", Shape::Window(32, Duration::ZERO)),
    (
        "window 512 (the default)",
        Shape::Window(512, Duration::ZERO),
    ),
    (
        "window 512, batch delay 2 ms",
        Shape::Window(512, Duration::from_millis(2)),
    ),
];

#[derive(Copy, Clone)]
enum Shape {
    Prefetch(usize),
    Window(usize, Duration),
}

impl Shape {
    fn apply<S: Engine>(self, b: PoolBuilder<S>) -> PoolBuilder<S> {
        match self {
            Shape::Prefetch(n) => b.prefetch(n),
            Shape::Window(n, delay) => b.window(n).batch_delay(delay),
        }
    }
}

/// One row per shape, each on a fresh store from `open`.
pub(super) fn rows<S>(
    label: &str,
    open: impl Fn(&str) -> Result<S, Error>,
    jobs: usize,
) -> Result<Vec<Row>, Error>
where
    S: Engine + JobStore + Clone,
{
    let mut rows = Vec::new();
    for (i, (name, shape)) in SHAPES.into_iter().enumerate() {
        let store = open(&format!("window{i}"))?;
        let took = drain(&store, shape, jobs)?;
        let (held, uncommitted) = abandon_mid_drain(&open(&format!("window{i}a"))?, shape, jobs)?;
        rows.push(Samples(Vec::new()).row(
            &format!(
                "{name} ({label}): drain, 1 worker; a pool abandoned mid-drain left {held} \
                 leases held, {uncommitted} jobs run but not committed"
            ),
            "durable",
            1,
            took,
            jobs as u64,
        ));
    }
    Ok(rows)
}

fn enqueue<S: JobStore>(store: &S, jobs: usize) -> Result<(), Error> {
    let mut left = jobs;
    while left > 0 {
        let k = left.min(256);
        store.enqueue_batch((0..k).map(|_| NewJob::new("w", Vec::new())).collect())?;
        left -= k;
    }
    Ok(())
}

fn drain<S: Engine + JobStore + Clone>(
    store: &S,
    shape: Shape,
    jobs: usize,
) -> Result<Duration, Error> {
    enqueue(store, jobs)?;
    let start = Instant::now();
    let pool = shape
        .apply(WorkerPool::builder(store.clone(), "w"))
        .start(|_| Ok(Vec::new()))?;
    while pool.stats().succeeded < jobs as u64 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let took = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    Ok(took)
}

/// Starts a pool on `jobs` jobs, abandons it once half have run, and counts what it left.
fn abandon_mid_drain<S: Engine + JobStore + Clone>(
    store: &S,
    shape: Shape,
    jobs: usize,
) -> Result<(u64, u64), Error> {
    enqueue(store, jobs)?;
    let ran = Arc::new(AtomicU64::new(0));
    let r = ran.clone();
    let pool = shape
        .apply(WorkerPool::builder(store.clone(), "w"))
        .start(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(Vec::new())
        })?;
    while ran.load(Ordering::SeqCst) < jobs as u64 / 2 {
        std::thread::yield_now();
    }
    pool.abandon();
    let stats = store.stats()?;
    let held = stats.total(JobState::Running);
    let committed = stats.total(JobState::Succeeded);
    Ok((held, ran.load(Ordering::SeqCst).saturating_sub(committed)))
}

/// The batch delays compared on a trickle.
const TRICKLE_DELAYS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(2),
    Duration::from_millis(10),
];

/// One row per batch delay: `jobs` enqueued one at a time (a commit each, one every
/// `every` at most) to a pool of four workers whose jobs take a millisecond, each row
/// timing enqueue to committed completion (as the pool's `on_ended` hook hears of it) and
/// saying how many completions shared a commit.
pub(super) fn trickle_rows<S>(
    label: &str,
    open: impl Fn(&str) -> Result<S, Error>,
    jobs: usize,
    every: Duration,
) -> Result<Vec<Row>, Error>
where
    S: Engine + JobStore + Clone,
{
    let mut rows = Vec::new();
    for (i, delay) in TRICKLE_DELAYS.into_iter().enumerate() {
        let store = open(&format!("trickle{i}"))?;
        // When each job's end was heard of; matched with its enqueue afterwards, so that the
        // hook (on the pool's dispatcher) never waits for the producer.
        let done: Arc<Mutex<HashMap<JobId, Instant>>> = Arc::default();
        let d = done.clone();
        let pool = WorkerPool::builder(store.clone(), "t")
            .concurrency(4)
            .batch_delay(delay)
            .on_ended(move |ended| {
                lock(&d).insert(ended.job, Instant::now());
            })
            .start(|_| {
                std::thread::sleep(Duration::from_millis(1));
                Ok(Vec::new())
            })?;
        let start = Instant::now();
        let mut enqueued = Vec::with_capacity(jobs);
        for _ in 0..jobs {
            let at = Instant::now();
            enqueued.push((store.enqueue(NewJob::new("t", Vec::new()))?, at));
            std::thread::sleep((at + every).saturating_duration_since(Instant::now()));
        }
        while pool.stats().succeeded < jobs as u64 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = start.elapsed();
        let stats = pool.stats();
        pool.shutdown(Duration::from_secs(5));
        let per_commit = stats.succeeded as f64 / stats.completion_commits.max(1) as f64;
        let done = lock(&done);
        let samples = enqueued
            .iter()
            .filter_map(|(id, at)| Some(done.get(id)?.saturating_duration_since(*at)))
            .collect();
        rows.push(Samples(samples).row(
            &format!(
                "trickle ({label}), batch delay {delay:?}: enqueue to committed completion, \
                 4 workers of 1 ms jobs, one enqueue every {every:?}; {per_commit:.1} \
                 completions per commit"
            ),
            "durable",
            4,
            took,
            jobs as u64,
        ));
    }
    Ok(rows)
}

/// A lock whose holder cannot panic while holding it (a map insert, a push).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
