//! `leasehold bench --only page`: the status page on a store of a million jobs (how long each
//! page takes, p50 and p99, through `StatusPage::handle` as a server calls it), and what a
//! page open and reloading every second costs a pool draining jobs beside it.
//!
//! The store's shape is a device that has run for a while: most jobs succeeded, some dead,
//! some waiting, a few running; every job tagged with one of a hundred tenants.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Engine, Error, JobStore, NewJob, ReadJobs, WorkerPool};
use leasehold_web::StatusPage;

use super::LEASE;
use super::measure::{Row, Samples};

/// Jobs per write while the store is filled.
const CHUNK: usize = 10_000;

/// Fills `store` with `jobs` jobs: 0.5 % dead, 0.5 % waiting, 50 running, the rest succeeded.
pub(super) fn fill<S: JobStore>(store: &S, jobs: usize) -> Result<(), Error> {
    let dead = jobs / 200;
    let waiting = jobs / 200;
    let running = 50.min(jobs / 10);
    let finished = jobs - waiting - running;
    let mut made = 0;
    while made < jobs {
        let k = CHUNK.min(jobs - made);
        let batch = (made..made + k)
            .map(|i| NewJob::new("work", vec![1u8; 64]).metadata("tenant", format!("t{}", i % 100)))
            .collect();
        store.enqueue_batch(batch)?;
        made += k;
    }
    // Claimed and ended oldest first, so the waiting and running jobs are the newest.
    let mut ended = 0;
    while ended < finished {
        let k = CHUNK.min(finished - ended);
        let leases = store.claim_batch("work", "filler", leasehold::LeaseTerms::new(LEASE), k)?;
        let (fail, done) = leases.split_at(leases.len().min(dead.saturating_sub(ended)));
        for l in fail {
            store.fail_permanently(l, "bench: a failure")?;
        }
        let pairs: Vec<(&leasehold::Lease, &[u8])> = done.iter().map(|l| (l, &b""[..])).collect();
        for r in store.complete_batch(&pairs) {
            r?;
        }
        ended += k;
    }
    store.claim_batch(
        "work",
        "bench-worker",
        leasehold::LeaseTerms::new(LEASE),
        running,
    )?;
    Ok(())
}

/// A read-only page over `store`, as `leasehold serve` makes one.
pub(super) fn view<S: ReadJobs + Clone + 'static>(store: &S) -> StatusPage {
    StatusPage::builder(Arc::new(store.clone())).build()
}

/// `store` filled with `jobs` jobs (see [`fill`]), then its pages timed: the rows of
/// [`pages`], labelled with the engine and, on PostgreSQL, as taken before autovacuum.
pub(super) fn filled_pages<S>(
    engine: &str,
    store: &S,
    jobs: usize,
    rounds: usize,
) -> Result<Vec<Row>, Error>
where
    S: JobStore + Engine + Clone + 'static,
{
    let start = Instant::now();
    fill(store, jobs)?;
    eprintln!(
        "page: filled the {engine} store with {jobs} jobs in {:.0?}",
        start.elapsed()
    );
    let label = match engine {
        "PostgreSQL" => format!("{engine}, {jobs} jobs, before autovacuum"),
        _ => format!("{engine}, {jobs} jobs"),
    };
    let mut rows = vec![count(&label, store, rounds)?];
    rows.extend(pages(&label, &view(store), rounds)?);
    Ok(rows)
}

/// One count of the whole store as the page takes it (the counts by queue and state, each
/// queue's timing, the queues nobody serves), `rounds` times: what every request of the
/// overview and `/metrics` would cost without the page's kept count and its background
/// thread, which repeat a count that took 20 ms or more at most once per ten times it takes.
pub(super) fn count<S: ReadJobs>(label: &str, store: &S, rounds: usize) -> Result<Row, Error> {
    let mut samples = Vec::with_capacity(rounds);
    let start = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let stats = store.stats()?;
        for queue in stats.queues.keys() {
            store.timing(queue)?;
        }
        store.unserved_queues()?;
        samples.push(t.elapsed());
    }
    Ok(Samples(samples).row(
        &format!("status page: one count of the store, as each request would take without the kept count ({label})"),
        "-",
        1,
        start.elapsed(),
        rounds as u64,
    ))
}

/// Each page `rounds` times (after one unmeasured request): a row per page.
pub(super) fn pages(label: &str, page: &StatusPage, rounds: usize) -> Result<Vec<Row>, Error> {
    let some_job = "/jobs/1"; // the first job: it failed, so it has a history
    let paths = [
        ("overview", "/?refresh=0"),
        ("job list, first page", "/jobs"),
        ("job list, dead", "/jobs?state=dead"),
        (
            "job list, waiting of one tenant",
            "/jobs?state=queued&meta=tenant%3Dt7",
        ),
        ("job list, newest", "/jobs?order=newest"),
        ("one job", some_job),
        ("/metrics", "/metrics"),
    ];
    let mut rows = Vec::new();
    for (name, path) in paths {
        let request = http::Request::builder()
            .uri(path)
            .body(Vec::new())
            .map_err(|_| Error::Internal("a bench request"))?;
        let status = page.handle(&request).status();
        if !status.is_success() {
            eprintln!("page bench: {path} answered {status}");
            return Err(Error::Internal("a page failed in the bench"));
        }
        let mut samples = Vec::with_capacity(rounds);
        let start = Instant::now();
        for _ in 0..rounds {
            let t = Instant::now();
            let _ = page.handle(&request);
            samples.push(t.elapsed());
        }
        rows.push(Samples(samples).row(
            &format!("status page: {name} ({label})"),
            "-",
            1,
            start.elapsed(),
            rounds as u64,
        ));
    }
    Ok(rows)
}

/// A pool of four workers draining `jobs` empty jobs, alone and with a page reloading its
/// overview every second beside it, interleaved twice: jobs per second, a row each.
pub(super) fn cost_to_workers<S>(label: &str, store: &S, jobs: usize) -> Result<Vec<Row>, Error>
where
    S: Engine + JobStore + ReadJobs + Clone + 'static,
{
    [false, true, false, true]
        .into_iter()
        .map(|watched| drain_beside_a_page(label, store, 4, jobs, watched))
        .collect()
}

fn drain_beside_a_page<S>(
    label: &str,
    store: &S,
    workers: usize,
    jobs: usize,
    watched: bool,
) -> Result<Row, Error>
where
    S: Engine + JobStore + ReadJobs + Clone + 'static,
{
    let queue = if watched { "watched" } else { "unwatched" };
    let mut left = jobs;
    while left > 0 {
        let k = left.min(1000);
        store.enqueue_batch((0..k).map(|_| NewJob::new(queue, Vec::new())).collect())?;
        left -= k;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watched.then(|| {
        let page = view(store);
        let stop = stop.clone();
        std::thread::spawn(move || {
            let request = http::Request::builder()
                .uri("/?refresh=0")
                .body(Vec::new())
                .unwrap_or_default();
            while !stop.load(Ordering::Relaxed) {
                let _ = page.handle(&request);
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    });
    let start = Instant::now();
    let pool = WorkerPool::builder(store.clone(), queue)
        .concurrency(workers)
        .start(|_| Ok(Vec::new()))?;
    while pool.stats().succeeded < jobs as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    Ok(Samples(Vec::new()).row(
        &format!(
            "drain {workers} workers, {} ({label})",
            if watched {
                "page reloading every 1 s"
            } else {
                "no page"
            }
        ),
        "durable",
        workers,
        total,
        jobs as u64,
    ))
}
