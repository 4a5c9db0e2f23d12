//! The `worker` role of the test helper process (`helper_process.rs`). Opens a store, runs worker
//! threads that claim, renew, and complete jobs, each completion committing an effect row in
//! the same transaction, and reports every commit on stdout only *after* it returned. The
//! test kills it with SIGKILL at a random moment and checks what survived.
//!
//! Pooled (`--pool`), a `WorkerPool` does the same work the way an application's would:
//! jobs claimed ahead, completions handed to its dispatcher and committed in batches with
//! the claims that refill the workers. Odd jobs commit an effect row with their completion
//! (on redb in a transaction of their own), even ones an output alone (in the batches); the
//! pool's `on_ended` hook reports each commit, which it calls only after the commit.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::redb::{ReadableTable, TableDefinition};
use leasehold::{Output, Store, WorkerPool};
use parking_lot::Mutex;

/// The application's table in kill tests: job id -> how many times its effect was committed.
pub const EFFECTS: TableDefinition<u64, u32> = TableDefinition::new("test.effects");

pub fn run(
    db: PathBuf,
    queue: String,
    threads: usize,
    lease: Duration,
    sharing: leasehold::Sharing,
    pooled: bool,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db).sharing(sharing).open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    report(&out, &format!("now {}", store.now().as_nanos()));
    if pooled {
        return run_pool(store, out, queue, threads, lease);
    }
    let handles: Vec<_> = (0..threads.max(1))
        .map(|i| {
            let (store, out, queue) = (store.clone(), out.clone(), queue.clone());
            std::thread::spawn(move || work(&store, &out, &queue, i, lease))
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    Ok(ExitCode::SUCCESS)
}

fn run_pool(
    store: Store,
    out: Arc<Mutex<std::io::Stdout>>,
    queue: String,
    threads: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let told = store.clone();
    let _pool = WorkerPool::builder(store, queue)
        .worker_id(format!("pooled-{}", std::process::id()))
        .concurrency(threads.max(1))
        .lease(lease)
        .heartbeat_every(lease / 4)
        .on_ended(move |ended| {
            if ended.outcome == leasehold::Outcome::Succeeded {
                let now = told.now().as_nanos();
                report(&out, &format!("committed {} {now}", ended.job.0));
            }
        })
        .start(|ctx| {
            let job = ctx.job().0;
            // Some jobs take a few milliseconds, most none: the pool claims ahead of its
            // workers only for jobs shorter than a commit.
            let steps = job.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 62;
            for _ in 0..steps {
                ctx.sleep(Duration::from_millis(2))?;
                ctx.tick();
            }
            if job % 2 == 0 {
                return Ok(Output::new(b"done".to_vec()));
            }
            Ok(Output::with_writes(b"done".to_vec(), move |txn| {
                let mut effects = txn.open_table(EFFECTS)?;
                let n = effects.get(job)?.map(|v| v.value()).unwrap_or(0);
                effects.insert(job, n + 1)?;
                Ok::<(), leasehold::Error>(())
            }))
        })?;
    // Works until killed.
    loop {
        std::thread::park();
    }
}

/// Writes `line` to the test's pipe at once (the test reads each as it comes).
pub fn report(out: &Mutex<std::io::Stdout>, line: &str) {
    let mut out = out.lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn work(store: &Store, out: &Mutex<std::io::Stdout>, queue: &str, i: usize, lease: Duration) {
    let worker = format!("killable-{}-{i}", std::process::id());
    let mut seed = std::process::id() as u64 * 31 + i as u64;
    loop {
        let claimed = match store.claim(queue, &worker, lease) {
            Ok(Some(l)) => l,
            Ok(None) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                report(out, &format!("error {e}"));
                return;
            }
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        for step in 0..(seed >> 60) {
            std::thread::sleep(Duration::from_millis(2));
            if store.heartbeat(&claimed, step).is_err() {
                break;
            }
        }
        let job = claimed.job.0;
        let committed = store.complete_with(&claimed, b"done", |txn| {
            let mut effects = txn.open_table(EFFECTS)?;
            let n = effects.get(job)?.map(|v| v.value()).unwrap_or(0);
            effects.insert(job, n + 1)?;
            Ok::<(), leasehold::Error>(())
        });
        if committed.is_ok() {
            report(out, &format!("committed {job} {}", store.now().as_nanos()));
        }
    }
}
