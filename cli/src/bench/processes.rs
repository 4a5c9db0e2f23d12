//! Several processes on one store (`Sharing::MultiProcess`): throughput of worker processes
//! beside one process with as many workers, the time from a worker process's SIGKILL to its
//! jobs being claimable again, and the time from an enqueue in one process to a handler's
//! start in another.
//!
//! The helper processes are this binary's hidden `__pool` and `__child` subcommands.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{Error, JobState, NewJob, Sharing, Store};
use leasehold::{JobStore, ReadJobs};

use super::super::helper::Helper;
use super::measure::{Row, Samples};
use super::pool::{PoolShape, end_to_end};

fn shared(path: &Path) -> Result<Store, Error> {
    Store::builder(path).sharing(Sharing::MultiProcess).open()
}

/// Durable end to end: `processes` worker processes of `workers` each, all jobs enqueued
/// first by this process; the rate is jobs over the time until the last one succeeded.
pub(super) fn processes_end_to_end(
    dir: &Path,
    processes: usize,
    workers: usize,
    prefetch: Option<usize>,
    jobs: usize,
) -> Result<Row, Error> {
    let path = dir.join(format!("procs-{processes}x{workers}-{prefetch:?}.redb"));
    let store = shared(&path)?;
    let workers_arg = workers.to_string();
    let prefetch_arg = prefetch.map(|n| n.to_string());
    let mut args = vec!["__pool", "--queue", "e2e", "--workers", &workers_arg];
    if let Some(n) = &prefetch_arg {
        args.extend(["--prefetch", n]);
    }
    let helpers = (0..processes)
        .map(|_| Helper::start(&path, &args))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    super::enqueue_numbered(&store, "e2e", jobs, 64)?;
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let total = start.elapsed();
    // Each process says how many jobs it completed in how many write transactions.
    let (mut done, mut commits) = (0u64, 0u64);
    for h in helpers {
        if let Some(words) = h.finish("pool") {
            let n = |i: usize| {
                words
                    .get(i)
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            done += n(0);
            commits += n(2);
        }
    }
    // The enqueues are this process's own commits, of 64 jobs each.
    let enqueues = jobs.div_ceil(64) as u64;
    Ok(Samples(Vec::new()).row(
        &format!(
            "end to end: {processes} worker process{} x {workers} workers (shared file{}; {:.1} jobs/commit)",
            if processes == 1 { "" } else { "es" },
            match prefetch {
                Some(n) => format!(", {n} claimed ahead each"),
                None => String::new(),
            },
            done as f64 / (commits + enqueues).max(1) as f64
        ),
        "durable",
        processes * workers,
        total,
        jobs as u64,
    ))
}

/// The drain alone, without a producer competing for commits: `processes` worker processes
/// of `workers` each (or, with `processes` 0, one pool of `workers` in this process) wait on
/// an empty shared file; `jobs` jobs arrive in one commit; the rate is jobs over the time
/// from that commit until the last one succeeded. In [`processes_end_to_end`] the producer
/// is a process of its own, whose every enqueue is a commit (an fsync) among the pools'
/// while one process's enqueues ride its pool's commits: there the producer is the bound.
pub(super) fn burst(
    dir: &Path,
    processes: usize,
    workers: usize,
    jobs: usize,
    sharing: Sharing,
) -> Result<Row, Error> {
    let path = dir.join(format!("burst-{processes}x{workers}-{sharing:?}.redb"));
    let store = Store::builder(&path).sharing(sharing).open()?;
    let workers_arg = workers.to_string();
    let args = ["__pool", "--queue", "burst", "--workers", &workers_arg];
    let helpers = (0..processes)
        .map(|_| Helper::start(&path, &args))
        .collect::<Result<Vec<_>, _>>()?;
    let pool = match processes {
        0 => Some(
            leasehold::WorkerPool::builder(store.clone(), "burst")
                .concurrency(workers)
                .start(|_| Ok(Vec::new()))?,
        ),
        _ => None,
    };
    let batch: Vec<NewJob> = (0..jobs)
        .map(|i| NewJob::new("burst", format!("{i}")))
        .collect();
    let start = Instant::now();
    store.enqueue_batch(batch)?;
    let enqueued = start.elapsed();
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let total = start.elapsed();
    if let Some(pool) = pool {
        pool.shutdown(Duration::from_secs(5));
    }
    for h in helpers {
        h.end();
    }
    let who = match processes {
        0 => format!("1 process x {workers} workers"),
        n => format!("{n} worker processes x {workers} workers"),
    };
    let file = match sharing {
        Sharing::MultiProcess => "shared file",
        _ => "single-writer file",
    };
    Ok(Samples(Vec::new()).row(
        &format!(
            "burst: {jobs} jobs enqueued in one commit ({} ms), drained by {who} ({file})",
            enqueued.as_millis()
        ),
        "durable",
        processes.max(1) * workers,
        total,
        jobs as u64,
    ))
}

/// One process with `workers` workers on a store opened shared, for the same comparison.
pub(super) fn one_process_shared(dir: &Path, workers: usize, jobs: usize) -> Result<Row, Error> {
    let shape = PoolShape {
        workers,
        prefetch: None,
        sharing: Sharing::MultiProcess,
    };
    end_to_end(dir, true, shape, jobs)
}

/// SIGKILL of a process holding `held` leases (an hour long) to those jobs being claimable
/// again, seen by a surviving process, over `kills` kills.
pub(super) fn kill_to_claimable(dir: &Path, kills: usize, held: usize) -> Result<Row, Error> {
    let path = dir.join("kills.redb");
    let store = shared(&path)?;
    let mut samples = Vec::with_capacity(kills);
    let begin = Instant::now();
    for _ in 0..kills {
        store.enqueue_batch((0..held).map(|i| NewJob::new("k", format!("{i}"))))?;
        let held_arg = held.to_string();
        let victim = Helper::start(
            &path,
            &[
                "__child",
                "--shared",
                "--queue",
                "k",
                "--claim",
                &held_arg,
                "--lease-ms",
                "3600000",
            ],
        )?;
        let seen = store.work_generation("k");
        let t = Instant::now();
        victim.kill();
        let mut generation = seen;
        while store
            .stats()?
            .queues
            .get("k")
            .map_or(0, |q| q.get(JobState::Running))
            > 0
        {
            generation = store.wait_for_work("k", generation, Duration::from_secs(5));
            if t.elapsed() > Duration::from_secs(30) {
                return Err(Error::InUse("a dead process's leases did not come back"));
            }
        }
        samples.push(t.elapsed());
        // leave the queue empty for the next round
        for lease in store.claim_batch("k", "bench", Duration::from_secs(60), held)? {
            store.complete(&lease, b"")?;
        }
    }
    let total = begin.elapsed();
    Ok(Samples(samples).row(
        &format!(
            "SIGKILL of a worker process -> its {held} jobs claimable again (latency; ops/s = kills/s)"
        ),
        "durable",
        1,
        total,
        kills as u64,
    ))
}

/// Enqueue here to a handler's start in an idle pool of another process, on store time
/// (which both read from the same host clock).
pub(super) fn cross_process_wake(dir: &Path, n: usize) -> Result<Row, Error> {
    let path = dir.join("xwake.redb");
    let store = shared(&path)?;
    let mut pool = Helper::start(
        &path,
        &["__pool", "--queue", "w", "--workers", "1", "--report"],
    )?;
    let mut samples = Vec::with_capacity(n);
    let begin = Instant::now();
    for i in 0..n {
        let t0 = store.now();
        store.enqueue(NewJob::new("w", format!("{i}")))?;
        let words = pool.until("started")?;
        let started = words
            .get(1)
            .and_then(|w| w.parse::<u64>().ok())
            .ok_or(Error::InUse("a malformed report"))?;
        samples.push(Duration::from_nanos(started.saturating_sub(t0.as_nanos())));
        // let the pool finish and go idle before the next enqueue
        while store.stats()?.total(JobState::Succeeded) < (i + 1) as u64 {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let total = begin.elapsed();
    pool.end();
    Ok(Samples(samples).row(
        "enqueue in one process -> handler start in another (latency; idle pool)",
        "durable",
        1,
        total,
        n as u64,
    ))
}
