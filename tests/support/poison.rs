//! The `poison` role of the test helper process (`helper_process.rs`): a worker pool whose
//! handler aborts the whole process on the job whose payload is `poison`, as a job that runs
//! the process out of memory or crashes a native library does. Every other job succeeds.
//! Exits 0 once the queue is drained (the poison job dead), and dies by `abort` before that.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{JobContext, JobError, RetryPolicy, Sharing, Store, WorkerPool};

pub fn run(
    db: PathBuf,
    queue: String,
    workers: usize,
    sharing: Sharing,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db)
        .sharing(sharing)
        // Backoffs a restart outlasts (the crash loop's job is not due before the others
        // are done), short enough that 25 crashes take a test's time.
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(200),
            Duration::from_millis(300),
        ))
        .open()?;
    let pool = WorkerPool::builder(store, queue)
        .concurrency(workers)
        .window(leasehold::DEFAULT_WINDOW)
        .start(|ctx: &JobContext| {
            if ctx.payload() == b"poison" {
                std::process::abort();
            }
            Ok::<_, JobError>(Vec::new())
        })?;
    pool.wait_idle(Duration::from_secs(120))?;
    Ok(ExitCode::SUCCESS)
}
