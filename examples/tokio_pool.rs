//! A tokio application embedding leasehold: the pool's handler is an `async fn` that awaits
//! I/O (here a timer standing in for an upload) and stops as soon as its job is interrupted;
//! the application's blocking calls into the store (open, wait for the pool to drain, shut
//! down) say so with `block_in_place`.
//!
//! `cargo run --example tokio_pool --features tokio`

use std::time::Duration;

use leasehold::{JobContext, JobError, NewJob, Store, WorkerPool};
use leasehold::{JobStore, ReadJobs};

/// The application's work: an upload that takes a while, abandoned if the lease goes.
async fn upload(ctx: JobContext) -> Result<Vec<u8>, JobError> {
    let photo = String::from_utf8_lossy(ctx.payload()).into_owned();
    for _chunk in 0..4 {
        ctx.sleep_async(Duration::from_millis(5)).await?; // Err once the job is interrupted
        ctx.tick(); // progress, carried by the pool's next heartbeat
    }
    Ok(format!("uploaded {photo}").into_bytes())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("leasehold-tokio-{}.redb", std::process::id()));
    // Opening reads and may repair the file: blocking work, so the runtime is told.
    let store = tokio::task::block_in_place(|| Store::open(&path))?;
    let pool = WorkerPool::builder(store.clone(), "uploads")
        .concurrency(8)
        .start_async(tokio::runtime::Handle::current(), upload)?;

    let seen = store.work_generation("uploads");
    let jobs = (1..=20).map(|i| NewJob::new("uploads", format!("photo-{i}.jpg")));
    let ids = store.enqueue_batch(jobs)?;
    // An async wait for work, as a claim loop of the application's own would use it.
    store
        .wait_for_work_async("uploads", seen, Duration::from_secs(1))
        .await;

    let idle = tokio::task::block_in_place(|| pool.wait_idle(Duration::from_secs(30)))?;
    let report = tokio::task::block_in_place(|| pool.shutdown(Duration::from_secs(5)));
    let output = store.output(ids[0])?.unwrap_or_default();
    println!(
        "idle: {idle}; {} jobs done; first output: {:?}; {report:?}",
        pool.stats().succeeded,
        String::from_utf8_lossy(&output)
    );
    drop(store);
    let _ = std::fs::remove_file(&path);
    Ok(())
}
