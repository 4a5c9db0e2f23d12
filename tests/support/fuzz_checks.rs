//! The checks behind the fuzz targets, shared with `tests/fuzz_regressions.rs` so that every
//! corpus entry and crash reproducer is replayed by a plain `cargo test` on stable.

use leasehold::Store;
use leasehold::{JobStore, ReadJobs};

use crate::harness::{Harness, Op};

/// Decoding arbitrary bytes as any stored record returns an error or a value, never panics.
pub fn decode_record(data: &[u8]) {
    leasehold::__private::decode_stored_records(data);
}

/// Opening arbitrary bytes as a store file returns a store or an error, never panics.
pub fn open_file(data: &[u8]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fuzzed.redb");
    std::fs::write(&path, data).expect("write");
    if let Ok(store) = Store::builder(&path).cache_size(1 << 20).open() {
        // A file that opens must be usable: the check and a write either work or fail cleanly.
        let _ = store.check();
        let _ = store.stats();
        let _ = store.enqueue(leasehold::NewJob::new("q", b"x".to_vec()));
        let _ = store.claim("q", "w", std::time::Duration::from_secs(1));
    }
}

/// Decodes bytes into operations, runs them against the store and the model, and panics on
/// the first divergence or broken invariant.
pub fn op_sequence(data: &[u8]) {
    let ops = decode_ops(data);
    if ops.is_empty() {
        return;
    }
    if let Err(why) = Harness::new().run(&ops) {
        panic!("{why}\nops: {ops:?}");
    }
}

fn decode_ops(data: &[u8]) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut b = data.iter().copied();
    let mut next = move || b.next();
    while let Some(kind) = next() {
        let mut byte = || next().unwrap_or(0);
        // The operations added later are the top of the byte range, so that the corpus
        // written before them still decodes mostly as it did.
        let op = match kind {
            240..=244 => Op::Snooze {
                lease: u16::from(byte()),
                secs: byte(),
            },
            245..=249 => Op::Pause {
                queue: byte(),
                pause: byte() % 2 == 0,
            },
            250..=251 => Op::Limit {
                queue: byte(),
                concurrency: Some(byte()).filter(|c| c % 3 != 0),
                rate: Some(byte()).filter(|r| r % 3 == 0),
                // (from the byte already read, so that older inputs read as they did)
                per_key: Some(kind).filter(|k| *k == 250),
                key_rate: Some(kind).filter(|k| *k == 251),
            },
            252 => Op::Enqueue {
                queue: byte(),
                priority: byte() as i8,
                delay_s: byte(),
                max_attempts: Some(byte()).filter(|m| m % 2 == 0),
                unique: None,
                after: (0..byte() % 3)
                    .map(|_| (u16::from(byte()), byte()))
                    .collect(),
                group: Some(byte()).filter(|g| g % 2 == 0),
                backoff: None,
                limit: None,
                expires: None,
            },
            253 => Op::OpenGroup {
                callbacks: byte(),
                parent: None,
            },
            254 => Op::SealGroup { group: byte() },
            255 => Op::CancelGroup { group: byte() },
            kind => match kind % 16 {
                0..=2 => Op::Enqueue {
                    queue: byte(),
                    priority: byte() as i8,
                    delay_s: byte(),
                    max_attempts: Some(byte()).filter(|m| m % 2 == 0),
                    unique: Some(byte()).filter(|u| u % 3 == 0),
                    after: Vec::new(),
                    group: None,
                    backoff: None,
                    limit: Some(kind / 16).filter(|k| k % 3 != 0),
                    expires: None,
                },
                3..=5 => Op::Claim {
                    queue: byte(),
                    worker: byte(),
                    lease_s: byte(),
                    stall_s: Some(byte()).filter(|s| s % 4 == 0),
                },
                6 => Op::ClaimJob {
                    job: u16::from(byte()),
                    worker: byte(),
                    lease_s: byte(),
                },
                7 | 8 => Op::Heartbeat {
                    lease: u16::from(byte()),
                    progress: byte() % 2 == 0,
                },
                9 => Op::Complete {
                    lease: u16::from(byte()),
                },
                10 => Op::Fail {
                    lease: u16::from(byte()),
                    permanent: byte() % 4 == 0,
                },
                11 => Op::Release {
                    lease: u16::from(byte()),
                },
                12 => Op::Cancel {
                    job: u16::from(byte()),
                },
                13 => Op::Advance {
                    secs: u16::from(byte()),
                },
                14 => Op::Reap,
                _ => Op::Reopen,
            },
        };
        ops.push(op);
        if ops.len() >= 64 {
            break;
        }
    }
    ops
}
