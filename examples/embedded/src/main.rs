//! The smallest application that embeds leasehold: one store, one pool, one job.
use std::time::Duration;

use leasehold::{JobState, NewJob, Output, Store, WorkerPool};
use leasehold::{JobStore, ReadJobs};

fn main() -> Result<(), leasehold::Error> {
    let path = std::env::temp_dir().join(format!("leasehold-embedded-{}.redb", std::process::id()));
    let store = Store::open(&path)?;
    let pool = WorkerPool::builder(store.clone(), "thumbnails")
        .concurrency(2)
        .start(|ctx| Ok(Output::new(ctx.payload().to_ascii_uppercase())))?;
    let id = store.enqueue(NewJob::new("thumbnails", b"photo-1.jpg".to_vec()))?;
    pool.wait_idle(Duration::from_secs(10))?;
    println!("{:?}", pool.shutdown(Duration::from_secs(5)));
    let state = store.job(id)?.map(|job| job.state());
    println!("job {id:?}: {state:?}");
    drop(store);
    let _ = std::fs::remove_file(&path);
    assert_eq!(state, Some(JobState::Succeeded));
    Ok(())
}
