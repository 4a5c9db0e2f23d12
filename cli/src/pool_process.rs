//! `leasehold __pool`: a worker pool in a process of its own on a store that processes share,
//! for the multi-process bench and demo. Reports each handler's start as `started JOB NOW`
//! (store time, which every process of the host reads alike) and holds the store until its
//! stdin closes or it is killed.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{Sharing, Store, WorkerPool};

pub fn run(
    db: PathBuf,
    queue: String,
    workers: usize,
    work: Duration,
    report: bool,
    prefetch: Option<usize>,
    schedule_every: Option<Duration>,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db).sharing(Sharing::MultiProcess).open()?;
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
            let _ = writeln!(out, "started {} {}", ctx.job().0, clock.now().as_nanos());
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
    if let Some(mut scheduler) = scheduler {
        scheduler.stop();
        println!("fired {}", scheduler.metrics().fired());
    }
    Ok(ExitCode::SUCCESS)
}
