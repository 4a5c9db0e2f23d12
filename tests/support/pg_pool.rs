//! The `pg-pool` role of the test helper process (`helper_process.rs`): a `WorkerPool` of
//! `--workers` on queue `pp` of the PostgreSQL store at `--url` in `--schema`, under a
//! `--lease-ms` lease renewed every fifth of it, for the partition test of a whole machine.
//!
//! Each handler prints `started <job>`. Jobs with an even id are obedient: they wait for
//! their interruption and print `interrupted <job> <why>`. Odd ones never look: they work
//! until the file `--go` exists, then print `finishing <job>` and return an output whose SQL
//! inserts an `effects` row, which the fence must refuse if the job was taken over. When
//! stdin closes the pool shuts down and prints `stats <rejected writes> <released>`.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::postgres::PgStore;
use leasehold::{Output, WorkerPool};
use parking_lot::Mutex;

pub fn run(
    url: &str,
    schema: &str,
    workers: usize,
    lease: Duration,
    go: &str,
) -> Result<ExitCode, leasehold::Error> {
    let store = PgStore::builder(url)
        .schema(schema)
        .statement_timeout(Duration::from_secs(5))
        .open()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = move |line: String| {
        let mut out = out.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let (effects, go) = (format!("{schema}.effects"), std::path::PathBuf::from(go));
    let pool = WorkerPool::builder(store, "pp")
        .worker_id("cut-off")
        .concurrency(workers)
        .lease(lease)
        .heartbeat_every(lease / 5)
        .start(move |ctx| {
            let job = ctx.job().0;
            say(format!("started {job}"));
            if job % 2 == 0 {
                let why = ctx.sleep(Duration::from_secs(3600));
                say(format!("interrupted {job} {why:?}"));
                why?;
                return Ok(Output::new(b"obedient".to_vec()));
            }
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            say(format!("finishing {job}"));
            let (sql, job) = (
                format!("INSERT INTO {effects} (job) VALUES ($1)"),
                job as i64,
            );
            Ok(Output::with_sql(b"late".to_vec(), move |t| {
                t.sql().execute(&sql, &[&job])?;
                Ok::<(), leasehold::postgres::client::Error>(())
            }))
        })?;
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    // Every handler has been let go by now: wait for their attempts to end.
    #[allow(clippy::disallowed_methods)] // a helper's deadline, not store time
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    #[allow(clippy::disallowed_methods)]
    while pool.stats().in_flight > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = pool.stats();
    pool.shutdown(Duration::from_secs(10));
    let mut out = std::io::stdout();
    let _ = writeln!(out, "stats {} {}", stats.rejected_writes, stats.released);
    let _ = out.flush();
    Ok(ExitCode::SUCCESS)
}
