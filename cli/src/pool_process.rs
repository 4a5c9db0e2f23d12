//! `leasehold __pool`: a worker pool in a process of its own on a store that processes share
//! (a redb file, or a PostgreSQL database named by URL), for the multi-process bench and
//! demo. Reports each handler's start as `started JOB NOW`
//! (store time, which every process of the host reads alike) and holds the store until its
//! stdin closes or it is killed.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::{Sharing, Store, WorkerPool};

/// What the process runs.
pub struct Settings {
    pub queue: String,
    pub workers: usize,
    /// How long each job takes.
    pub work: Duration,
    /// Report each handler's start on stdout.
    pub report: bool,
    pub prefetch: Option<usize>,
    /// Declare a schedule of the queue ticking this often, and run a scheduler.
    pub schedule_every: Option<Duration>,
    /// Run a reaper this often, as an application beside its pools does.
    pub reap_every: Option<Duration>,
}

pub fn run(db: PathBuf, settings: Settings) -> Result<ExitCode, leasehold::Error> {
    match crate::target::postgres_url(&db) {
        // Worker processes on one database, as worker machines would be: the bench's
        // `postgres-processes`.
        Some(url) => {
            let store = crate::target::open_postgres(url, false)?;
            serve(store, settings, || 0)
        }
        None => {
            let store = Store::builder(db).sharing(Sharing::MultiProcess).open()?;
            let metrics = store.clone();
            serve(store, settings, move || {
                metrics.metrics().write_transactions
            })
        }
    }
}

/// Runs the pool (and the reaper and scheduler asked for) until stdin closes, then says
/// what it did: jobs, the rounds that committed them, and `writes`, the write transactions
/// the process committed where the engine counts them.
fn serve<S>(
    store: S,
    settings: Settings,
    writes: impl Fn() -> u64,
) -> Result<ExitCode, leasehold::Error>
where
    S: leasehold::Engine + JobStore + Clone + Send + Sync + 'static,
{
    let Settings {
        queue,
        workers,
        work,
        report,
        prefetch,
        schedule_every,
        reap_every,
    } = settings;
    let _reaper = match reap_every {
        Some(every) => Some(leasehold::Reaper::start(store.clone(), every)?),
        None => None,
    };
    // Every process declares the schedule and runs a scheduler: the store fires each tick once.
    let scheduler = match schedule_every {
        Some(every) => {
            let job = leasehold::NewJob::new(queue.clone(), "tick");
            store.declare_schedule(leasehold::Schedule::every("tick", every, job))?;
            Some(leasehold::Scheduler::start(
                store.clone(),
                Duration::from_millis(20),
            )?)
        }
        None => None,
    };
    let clock = store.clone();
    let mut builder = WorkerPool::builder(store, &queue)
        .concurrency(workers)
        .worker_id(format!("proc-{}", std::process::id()));
    if let Some(n) = prefetch {
        builder = builder.prefetch(n);
    }
    let pool = builder.start(move |ctx| {
        if report {
            let mut out = std::io::stdout().lock();
            let now = clock.now().map_or(0, |t| t.as_nanos());
            let _ = writeln!(out, "started {} {now}", ctx.job().0);
            let _ = out.flush();
        }
        if !work.is_zero() {
            ctx.sleep(work)?;
        }
        Ok(Vec::new())
    })?;
    println!("ready {}", pool.worker_id());
    let _ = std::io::stdout().flush();
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).unwrap_or(0) > 0 {
        sink.clear();
    }
    pool.shutdown(Duration::from_secs(5));
    let stats = pool.stats();
    println!(
        "pool {} {} {}",
        stats.succeeded,
        stats.completion_commits,
        writes()
    );
    if let Some(mut scheduler) = scheduler {
        scheduler.stop();
        println!("fired {}", scheduler.metrics().fired());
    }
    Ok(ExitCode::SUCCESS)
}
