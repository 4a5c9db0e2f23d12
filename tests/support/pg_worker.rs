//! The `pg-worker` role of the test helper process (`helper_process.rs`): worker threads on a
//! PostgreSQL store that claim, renew and complete, each completion inserting an effect row
//! in the same transaction, and report every commit on stdout only *after* it returned. The
//! test kills it with SIGKILL at a random moment and checks what survived.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::postgres::PgStore;
use parking_lot::Mutex;

pub fn run(
    url: &str,
    schema: &str,
    threads: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let store = PgStore::builder(url).schema(schema).open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let effects = format!("{schema}.effects");
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
