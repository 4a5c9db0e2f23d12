//! Criterion benchmarks of the lease operations on a real store file.
//!
//! `cargo bench --bench lease_ops`. Durable figures are bounded by the disk's fsync; the
//! eventual-durability figures show the store's own cost.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use leasehold::{Durability, NewJob, Store};

const LEASE: Duration = Duration::from_secs(60);

fn open(durability: Durability) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder(dir.path().join("bench.redb"))
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
            b.iter(|| store.heartbeat_batch(&beats).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = enqueue, claim_complete, heartbeat
}
criterion_main!(benches);
