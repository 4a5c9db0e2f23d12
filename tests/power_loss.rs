//! Power loss and I/O errors, through a storage backend of our own (as redb's own
//! crash-consistency test does):
//! * every image that was durable at a sync point of a workload opens, passes `check()`, and
//!   holds every commit acknowledged before that sync (also with the next header write torn
//!   onto it);
//! * a write or sync that fails at any point returns an error, panics nothing, and the store
//!   reopens clean with no acknowledged commit lost.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{JobId, JobState, LeaseTerms, ManualClock, NewJob, Store, StoreBuilder};
use leasehold::{JobStore, ReadJobs};
use redb::StorageBackend;

#[derive(Debug, Default)]
struct Disk {
    live: Vec<u8>,
    /// The image after each completed sync.
    snapshots: Vec<Vec<u8>>,
    /// For each snapshot, the first write to the header page that followed it.
    header_after: Vec<Option<(u64, Vec<u8>)>>,
    /// Counts writes, syncs and resizes; the one numbered `fail_at` fails.
    ops: u64,
    fail_at: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct TestDisk(Arc<Mutex<Disk>>);

impl TestDisk {
    fn from_image(image: &[u8]) -> TestDisk {
        let d = TestDisk::default();
        d.0.lock().unwrap().live = image.to_vec();
        d
    }
    fn failing_at(op: u64) -> TestDisk {
        let d = TestDisk::default();
        d.0.lock().unwrap().fail_at = Some(op);
        d
    }
    fn syncs(&self) -> usize {
        self.0.lock().unwrap().snapshots.len()
    }
    fn step(&self, d: &mut Disk) -> std::io::Result<()> {
        d.ops += 1;
        if d.fail_at == Some(d.ops) {
            return Err(std::io::Error::other("injected I/O error"));
        }
        Ok(())
    }
}

impl StorageBackend for TestDisk {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.lock().unwrap().live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let d = self.0.lock().unwrap();
        let start = offset as usize;
        let end = start + out.len();
        if end > d.live.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        out.copy_from_slice(&d.live[start..end]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut d = self.0.lock().unwrap();
        self.step(&mut d)?;
        d.live.resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let mut d = self.0.lock().unwrap();
        self.step(&mut d)?;
        let image = d.live.clone();
        d.snapshots.push(image);
        d.header_after.push(None);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut d = self.0.lock().unwrap();
        self.step(&mut d)?;
        if offset < 4096
            && let Some(slot @ None) = d.header_after.last_mut()
        {
            *slot = Some((offset, data.to_vec()));
        }
        let end = offset as usize + data.len();
        if end > d.live.len() {
            d.live.resize(end, 0);
        }
        d.live[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
}

/// What the workload had acknowledged, and after how many syncs.
#[derive(Clone, Debug)]
enum Fact {
    Exists(JobId),
    Succeeded(JobId),
    AttemptAtLeast(JobId, u32),
}

fn builder(backend: TestDisk, clock: &ManualClock) -> StoreBuilder {
    Store::with_backend(backend).clock(clock.clone())
}

/// A workload of every kind of commit. Stops at the first error (an injected fault).
fn workload(
    store: &Store,
    disk: &TestDisk,
    clock: &ManualClock,
    facts: &mut Vec<(usize, Fact)>,
) -> leasehold::Result<()> {
    let mut ack = |f: Fact| facts.push((disk.syncs(), f));
    for round in 0..6u32 {
        let ids = store
            .enqueue_batch((0..4).map(|i| NewJob::new("q", vec![round as u8; 100 + i * 50])))?;
        for id in &ids {
            ack(Fact::Exists(*id));
        }
        let mut leases = Vec::new();
        for _ in 0..3 {
            if let Some(l) = store.claim("q", "w", LeaseTerms::new(Duration::from_secs(60)))? {
                ack(Fact::AttemptAtLeast(l.job, l.attempt.0));
                leases.push(l);
            }
        }
        clock.advance(Duration::from_secs(20));
        let beats: Vec<_> = leases.iter().map(|l| (l, 1u64)).collect();
        for r in store.heartbeat_batch(&beats) {
            r?;
        }
        if let Some(l) = leases.first() {
            store.complete(l, b"done")?;
            ack(Fact::Succeeded(l.job));
        }
        if let Some(l) = leases.get(1) {
            store.fail(l, "try again")?;
        }
        if round % 2 == 1 {
            clock.advance(Duration::from_secs(61));
            store.reap()?;
        }
    }
    Ok(())
}

fn verify(image: &[u8], facts: &[(usize, Fact)], durable_syncs: usize, what: &str) {
    let clock = ManualClock::new();
    let store = builder(TestDisk::from_image(image), &clock)
        .open()
        .unwrap_or_else(|e| panic!("{what}: the image does not open: {e}"));
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{what}: {:?}", check.problems);
    for (synced, fact) in facts {
        if *synced > durable_syncs {
            continue;
        }
        let job = |id: JobId| {
            store
                .job(id)
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: acknowledged job {id} lost"))
        };
        match fact {
            Fact::Exists(id) => {
                job(*id);
            }
            Fact::Succeeded(id) => {
                assert_eq!(job(*id).state(), JobState::Succeeded, "{what}: job {id}")
            }
            Fact::AttemptAtLeast(id, a) => assert!(job(*id).attempt().0 >= *a, "{what}: job {id}"),
        }
    }
}

#[test]
fn every_image_durable_at_a_sync_point_opens_clean_with_every_acknowledged_commit() {
    let disk = TestDisk::default();
    let clock = ManualClock::new();
    let store = builder(disk.clone(), &clock).open().unwrap();
    // Creating a store in a backend is not crash-atomic (redb writes its magic number last);
    // for files leasehold builds a new store under a temporary name and links it into
    // place. So the images checked here start once the store exists.
    let created = disk.syncs();
    let mut facts = Vec::new();
    workload(&store, &disk, &clock, &mut facts).unwrap();
    drop(store);
    let d = disk.0.lock().unwrap();
    let mut torn = 0;
    for (k, image) in d.snapshots.iter().enumerate().skip(created) {
        verify(image, &facts, k + 1, &format!("sync point {}", k + 1));
        // The next header write may reach the disk without the data it points to.
        if let Some((offset, bytes)) = &d.header_after[k] {
            let mut image = image.clone();
            let end = *offset as usize + bytes.len();
            if end <= image.len() {
                image[*offset as usize..end].copy_from_slice(bytes);
                verify(
                    &image,
                    &facts,
                    k + 1,
                    &format!("sync point {} + torn header", k + 1),
                );
                torn += 1;
            }
        }
    }
    eprintln!(
        "{} sync points ({torn} with a torn header write) verified against {} acknowledged facts",
        d.snapshots.len() - created,
        facts.len()
    );
    assert!(d.snapshots.len() - created > 20);
}

#[test]
fn an_io_error_at_any_point_is_reported_and_loses_no_acknowledged_commit() {
    // Count the backend operations of a clean run, then fail each one in turn.
    let clean = TestDisk::default();
    let clock = ManualClock::new();
    let store = builder(clean.clone(), &clock).open().unwrap();
    workload(&store, &clean, &clock, &mut Vec::new()).unwrap();
    drop(store);
    let total_ops = clean.0.lock().unwrap().ops;
    let step = (total_ops / 300).max(1);
    let mut injected = 0;
    let mut failed_at_open = 0;
    let mut in_close = 0;
    for fail_at in (1..=total_ops).step_by(step as usize) {
        let disk = TestDisk::failing_at(fail_at);
        let clock = ManualClock::new();
        let mut facts = Vec::new();
        match builder(disk.clone(), &clock).open() {
            Ok(store) => {
                let result = workload(&store, &disk, &clock, &mut facts);
                let ops_done = disk.0.lock().unwrap().ops;
                // The fault is reported, unless it lies beyond the workload (in the close).
                assert!(
                    result.is_err() || ops_done < fail_at,
                    "fault {fail_at} was swallowed"
                );
                if result.is_ok() {
                    in_close += 1;
                }
                drop(store);
            }
            Err(_) => {
                // Reported as an error, not a panic; nothing was acknowledged. Whatever the
                // creation left, after a restart or a power loss, opens as a store.
                failed_at_open += 1;
                injected += 1;
                let d = disk.0.lock().unwrap();
                for (image, when) in [
                    (Some(&d.live), "restart"),
                    (d.snapshots.last(), "power loss"),
                ] {
                    let Some(image) = image else { continue };
                    let reopened = builder(TestDisk::from_image(image), &ManualClock::new()).open();
                    assert!(
                        reopened.is_ok(),
                        "fault {fail_at} during open, {when}: the image does not open: {:?}",
                        reopened.err()
                    );
                }
                continue;
            }
        }
        injected += 1;
        let d = disk.0.lock().unwrap();
        // The process restarts (the page cache survived) ...
        if !d.live.is_empty() {
            verify(
                &d.live,
                &facts,
                usize::MAX,
                &format!("fault {fail_at}, restart"),
            );
        }
        // ... or the power went out (only the last synced image survived).
        if let Some(image) = d.snapshots.last() {
            verify(
                image,
                &facts,
                d.snapshots.len(),
                &format!("fault {fail_at}, power loss"),
            );
        }
    }
    eprintln!(
        "{injected} I/O faults injected over {total_ops} backend operations ({failed_at_open} during open, {in_close} in the final close); every one during work reported, none lost a commit"
    );
    assert!(injected > 100);
}
