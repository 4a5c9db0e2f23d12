//! The `pg-worker` role of the test helper process (`helper_process.rs`): worker threads on a
//! PostgreSQL store that claim, renew and complete, each completion inserting an effect row
//! in the same transaction, and report every commit on stdout only *after* it returned. The
//! test kills it with SIGKILL at a random moment and checks what survived.
//!
//! Pooled (`--pool`), a `WorkerPool` does the same work: jobs claimed ahead, completions and
//! their effect rows committed in batches (each under its own fence) with the claims that
//! refill the workers, and its `on_ended` hook reporting each commit, after it.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::postgres::PgStore;
use leasehold::{Output, WorkerPool};
use parking_lot::Mutex;

pub fn run(
    url: &str,
    schema: &str,
    threads: usize,
    lease: Duration,
    pooled: bool,
    connections: usize,
) -> Result<ExitCode, leasehold::Error> {
    let store = PgStore::builder(url)
        .schema(schema)
        .connections(connections)
        .open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let effects = format!("{schema}.effects");
    if pooled {
        return run_pool(store, out, effects, threads, lease);
    }
    let handles: Vec<_> = (0..threads.max(1))
        .map(|i| {
            let (store, out, effects) = (store.clone(), out.clone(), effects.clone());
            std::thread::spawn(move || work(&store, &out, &effects, i, lease))
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    Ok(ExitCode::SUCCESS)
}

fn run_pool(
    store: PgStore,
    out: Arc<Mutex<std::io::Stdout>>,
    effects: String,
    threads: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let _pool = WorkerPool::builder(store, "kills")
        .worker_id(format!("pg-pooled-{}", std::process::id()))
        .concurrency(threads.max(1))
        .lease(lease)
        .heartbeat_every(lease / 4)
        .on_ended(move |ended| {
            if ended.outcome == leasehold::Outcome::Succeeded {
                let mut out = out.lock();
                let _ = writeln!(out, "committed {}", ended.job.0);
                let _ = out.flush();
            }
        })
        .start(move |ctx| {
            let job = ctx.job().0;
            let steps = job.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 62;
            for _ in 0..steps {
                ctx.sleep(Duration::from_millis(2))?;
                ctx.tick();
            }
            let (sql, job) = (
                format!("INSERT INTO {effects} (job) VALUES ($1)"),
                job as i64,
            );
            Ok(Output::with_sql(b"done".to_vec(), move |t| {
                t.sql().execute(&sql, &[&job])?;
                Ok::<(), leasehold::postgres::client::Error>(())
            }))
        })?;
    // Works until killed.
    loop {
        std::thread::park();
    }
}

fn work(store: &PgStore, out: &Mutex<std::io::Stdout>, effects: &str, i: usize, lease: Duration) {
    let worker = format!("pg-killable-{}-{i}", std::process::id());
    let mut seed = std::process::id() as u64 * 31 + i as u64;
    loop {
        let claimed = match store.claim("kills", &worker, lease) {
            Ok(Some(l)) => l,
            Ok(None) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                let _ = writeln!(out.lock(), "error {e}");
                return;
            }
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        for step in 0..(seed >> 62) {
            std::thread::sleep(Duration::from_millis(2));
            if store.heartbeat(&claimed, step).is_err() {
                break;
            }
        }
        let job = claimed.job.0 as i64;
        let sql = format!("INSERT INTO {effects} (job) VALUES ($1)");
        let committed = store.complete_with(&claimed, b"done", |t| {
            t.sql().execute(&sql, &[&job])?;
            Ok::<(), leasehold::postgres::client::Error>(())
        });
        if committed.is_ok() {
            let mut out = out.lock();
            let _ = writeln!(out, "committed {job}");
            let _ = out.flush();
        }
    }
}
