//! The `tenants` role of the test helper process (`helper_process.rs`): a worker pool on a
//! store shared by processes, whose handler writes to a log file of its own, from outside
//! the library, when it starts and ends each job: `start <job> <attempt> <tenant> <pid>`,
//! `end …`. Each line is one `write` to a file opened for appending, so the lines of every
//! process land whole and in one order. The job's payload names its tenant (its limit key).
//! Works until killed.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{JobContext, JobError, Sharing, Store, WorkerPool};

pub fn run(
    db: PathBuf,
    queue: String,
    workers: usize,
    lease: Duration,
    log: PathBuf,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db).sharing(Sharing::MultiProcess).open()?;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .expect("the handlers' log");
    let pid = std::process::id();
    let _pool = WorkerPool::builder(store, queue)
        .worker_id(format!("tenants-{pid}"))
        .concurrency(workers)
        .lease(lease)
        .heartbeat_every(lease / 4)
        .start(move |ctx: &JobContext| {
            let tenant = String::from_utf8_lossy(ctx.payload()).into_owned();
            let (job, attempt) = (ctx.job().0, ctx.attempt().0);
            let line = |what: &str| format!("{what} {job} {attempt} {tenant} {pid}\n");
            (&file)
                .write_all(line("start").as_bytes())
                .map_err(|e| JobError::new(e.to_string()))?;
            // 1 to 4 ms of work, so that a tenant's jobs overlap.
            ctx.sleep(Duration::from_millis(1 + job % 4))?;
            (&file)
                .write_all(line("end").as_bytes())
                .map_err(|e| JobError::new(e.to_string()))?;
            Ok::<_, JobError>(Vec::new())
        })?;
    loop {
        std::thread::park();
    }
}
