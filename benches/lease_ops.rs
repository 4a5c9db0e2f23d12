//! Criterion benchmarks of the lease operations on a real store file.
//!
//! `cargo bench -p leasehold-benches`. Durable figures are bounded by the disk's fsync; the
//! eventual-durability figures show the store's own cost.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use leasehold::{Durability, NewJob, Store};
use leasehold::{JobStore, ReadJobs};

const LEASE: Duration = Duration::from_secs(60);

fn open(durability: Durability) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    // (eventual durability needs the file to itself)
    let sharing = match durability {
        Durability::Immediate => leasehold::Sharing::SingleWriter,
        _ => leasehold::Sharing::Exclusive,
    };
    let store = Store::builder(dir.path().join("bench.redb"))
        .sharing(sharing)
        .durability(durability)
        .open()
        .unwrap();
    (dir, store)
}

fn modes() -> [(&'static str, Durability); 2] {
    [
        ("durable", Durability::Immediate),
        (
            "eventual",
            Durability::Eventual {
                flush_every: Duration::from_secs(3600),
            },
        ),
    ]
}

fn enqueue(c: &mut Criterion) {
    let mut g = c.benchmark_group("enqueue");
    for (name, durability) in modes() {
        let (_dir, store) = open(durability);
        g.bench_function(name, |b| {
            b.iter(|| store.enqueue(NewJob::new("q", &b"payload"[..])).unwrap())
        });
    }
    g.finish();
}

fn claim_complete(c: &mut Criterion) {
    let mut g = c.benchmark_group("claim+complete");
    for (name, durability) in modes() {
        let (_dir, store) = open(durability);
        g.bench_function(name, |b| {
            b.iter_batched(
                || store.enqueue(NewJob::new("q", &b"payload"[..])).unwrap(),
                |_| {
                    let l = store.claim("q", "w", LEASE).unwrap().unwrap();
                    store.complete(&l, b"").unwrap();
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn heartbeat(c: &mut Criterion) {
    let mut g = c.benchmark_group("heartbeat");
    for (name, durability) in modes() {
        let (_dir, store) = open(durability);
        store
            .enqueue_batch((0..1000).map(|i| NewJob::new("q", format!("{i}"))))
            .unwrap();
        let leases: Vec<_> = (0..1000)
            .map(|_| store.claim("q", "w", LEASE).unwrap().unwrap())
            .collect();
        g.bench_function(format!("{name}/single"), |b| {
            b.iter(|| store.heartbeat(&leases[0], 1).unwrap())
        });
        let beats: Vec<_> = leases.iter().map(|l| (l, 1u64)).collect();
        g.bench_function(format!("{name}/batch_of_1000"), |b| {
            b.iter(|| store.heartbeat_batch(&beats))
        });
    }
    g.finish();
}

/// Reaping a whole dead pool: 10,000 expired leases in batches of 500 (non-durable, so the
/// figure is the store's work, not the disk's).
fn reap(c: &mut Criterion) {
    let mut g = c.benchmark_group("reap");
    g.sample_size(10);
    // A whole pool of 100 k leases died: the reaper takes them all back, in bounded batches.
    g.bench_function("100k_expired", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let clock = leasehold::ManualClock::new();
                let store = Store::builder(dir.path().join("reap.redb"))
                    .clock(clock.clone())
                    .sharing(leasehold::Sharing::Exclusive)
                    .durability(Durability::Eventual {
                        flush_every: Duration::from_secs(3600),
                    })
                    .open()
                    .unwrap();
                store
                    .enqueue_batch((0..100_000).map(|i| NewJob::new("q", format!("{i}"))))
                    .unwrap();
                store.claim_batch("q", "dead", LEASE, 100_000).unwrap();
                clock.advance(LEASE * 2);
                (dir, store)
            },
            |(_dir, store)| assert_eq!(store.reap().unwrap().reclaimed.len(), 100_000),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Enqueue, claim and complete 2,000 jobs through a worker pool.
fn end_to_end(c: &mut Criterion) {
    let mut g = c.benchmark_group("end_to_end_2000_jobs");
    g.sample_size(10);
    for (name, durability) in modes() {
        for workers in [1usize, 16] {
            g.bench_function(format!("{name}/{workers}_workers"), |b| {
                b.iter_batched(
                    || open(durability),
                    |(_dir, store)| {
                        let pool = leasehold::WorkerPool::builder(store.clone(), "e2e")
                            .concurrency(workers)
                            .start(|_| Ok(Vec::new()))
                            .unwrap();
                        for chunk in 0..(2000 / 100) {
                            store
                                .enqueue_batch(
                                    (0..100).map(|i| NewJob::new("e2e", format!("{chunk}-{i}"))),
                                )
                                .unwrap();
                        }
                        while store.stats().unwrap().total(leasehold::JobState::Succeeded) < 2000 {
                            std::thread::yield_now();
                        }
                        pool.shutdown(Duration::from_secs(5));
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = enqueue, claim_complete, heartbeat, reap, end_to_end
}
criterion_main!(benches);
