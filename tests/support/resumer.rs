//! The `resumer` role of the test helper process (`helper_process.rs`): a pool of workers on
//! a shared file whose jobs each take [`STEPS`] steps, saving a checkpoint after each and
//! resuming from the last one saved. It reports on stdout, each line only after what it
//! says has happened:
//! - `start JOB ATTEMPT STEP`: an attempt began at `STEP`, read from the last checkpoint
//!   (0 without one);
//! - `saved JOB ATTEMPT STEP`: a checkpoint of `STEP` steps done was committed;
//! - `committed JOB`: the job's completion was committed.
//!
//! The test kills it with SIGKILL at random moments and checks that every attempt began
//! where the last committed checkpoint left off.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{Output, Store, WorkerPool};
use parking_lot::Mutex;

use super::worker::report;

/// How many steps a job takes.
pub const STEPS: u64 = 12;

/// How long a step takes: a job runs about a quarter of a second, so that a kill finds
/// jobs mid-way.
const STEP: Duration = Duration::from_millis(20);

pub fn run(
    db: PathBuf,
    queue: String,
    workers: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db)
        .sharing(leasehold::Sharing::MultiProcess)
        .open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let told = out.clone();
    let _pool = WorkerPool::builder(store, queue)
        .worker_id(format!("resumer-{}", std::process::id()))
        .concurrency(workers.max(1))
        .lease(lease)
        .heartbeat_every(lease / 4)
        .on_ended(move |ended| {
            if ended.outcome == leasehold::Outcome::Succeeded {
                report(&told, &format!("committed {}", ended.job.0));
            }
        })
        .start(move |ctx| {
            let (job, attempt) = (ctx.job().0, ctx.attempt().0);
            let from = match ctx.last_checkpoint()? {
                Some(c) => u64::from_le_bytes(c.data().try_into().unwrap_or([0; 8])),
                None => 0,
            };
            report(&out, &format!("start {job} {attempt} {from}"));
            for step in from..STEPS {
                ctx.sleep(STEP)?;
                ctx.save_checkpoint(&(step + 1).to_le_bytes())?;
                report(&out, &format!("saved {job} {attempt} {}", step + 1));
            }
            Ok(Output::new(b"done".to_vec()))
        })?;
    // Works until killed.
    loop {
        std::thread::park();
    }
}
