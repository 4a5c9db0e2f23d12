//! The `worker` role of the test helper process (`helper_process.rs`). Opens a store, runs worker
//! threads that claim, renew, and complete jobs, each completion committing an effect row in
//! the same transaction, and reports every commit on stdout only *after* it returned. The
//! test kills it with SIGKILL at a random moment and checks what survived.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::Store;
use leasehold::redb::{ReadableTable, TableDefinition};
use parking_lot::Mutex;

/// The application's table in kill tests: job id -> how many times its effect was committed.
pub const EFFECTS: TableDefinition<u64, u32> = TableDefinition::new("test.effects");

pub fn run(
    db: PathBuf,
    queue: String,
    threads: usize,
    lease: Duration,
    sharing: leasehold::Sharing,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db).sharing(sharing).open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    report(&out, &format!("now {}", store.now().as_nanos()));
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

fn report(out: &Mutex<std::io::Stdout>, line: &str) {
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
