//! leasehold's side of the per-job cost table beside graphile-worker (see run.sh): enqueue
//! N empty jobs (256 per call) on PostgreSQL, as `leasehold bench --only drain-postgres`
//! does, snapshot the server's counters (snap.py), drain them with a pool of W workers, close
//! the store, wait for the server's statistics to be flushed, snapshot again.
//! Usage: LEASEHOLD_PG_URL=... cargo run --release -- N W SCHEMA
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::postgres::PgStore;
use leasehold::{NewJob, WorkerPool};

fn snap(label: &str) {
    let snap = concat!(env!("CARGO_MANIFEST_DIR"), "/snap.py");
    let db = std::env::var("SNAP_DB").unwrap_or_else(|_| "test".into());
    Command::new("python3")
        .args([snap, label, &db])
        .status()
        .unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (n, w, schema) = (
        args[1].parse::<usize>().unwrap(),
        args[2].parse::<usize>().unwrap(),
        &args[3],
    );
    let url = std::env::var("LEASEHOLD_PG_URL").unwrap();
    let store = PgStore::builder(&url)
        .schema(schema.clone())
        .open()
        .unwrap();
    let mut left = n;
    while left > 0 {
        let k = left.min(256);
        store
            .enqueue_batch((0..k).map(|_| NewJob::new("drain", Vec::new())))
            .unwrap();
        left -= k;
    }
    std::thread::sleep(Duration::from_millis(11_000));
    snap("before");
    let start = Instant::now();
    let pool = WorkerPool::builder(store.clone(), "drain")
        .concurrency(w)
        .start(|_| Ok(Vec::new()))
        .unwrap();
    while pool.stats().succeeded < n as u64 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let took = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    drop(store);
    std::thread::sleep(Duration::from_millis(11_000));
    snap("after");
    println!(
        "RESULT system=leasehold workers={w} n={n} drain_jobs_s={:.0}",
        n as f64 / took.as_secs_f64()
    );
}
