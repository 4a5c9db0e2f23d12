//! Scale: claim cost as the queue grows to a million jobs (with the file's size and the
//! memory a process holding it needs), and a whole dead pool's leases reaped while claims go on.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use leasehold::JobStore;
use leasehold::{Error, NewJob};
use parking_lot::Mutex;

use super::measure::{Row, Samples, timed};
use super::{LEASE, store, store_with};

/// Claim cost with `waiting` jobs in the queue (non-durable, so the index walk shows, not the
/// fsync): claim must stay O(log n).
pub(super) fn claim_at_depth(dir: &Path, waiting: usize) -> Result<Row, Error> {
    let store = store(dir, &format!("depth-{waiting}.redb"), false)?;
    let ids: Vec<usize> = (0..waiting).collect();
    for chunk in ids.chunks(10_000) {
        store.enqueue_batch(chunk.iter().map(|i| NewJob::new("deep", format!("{i}"))))?;
    }
    let n = 2_000.min(waiting);
    let (s, total) = timed(n, |_| {
        store
            .claim("deep", "w", LEASE)?
            .ok_or(Error::InUse("ran out of jobs"))
            .map(|_| ())
    })?;
    let path = dir.join(format!("depth-{waiting}.redb"));
    let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let bench_rss = resident_mib(&Resident::This);
    drop(store);
    let alone = |verify| match held_alone(&path, verify) {
        Ok(mib) => format!("{mib} MiB"),
        Err(e) => format!("not measured: {e}"),
    };
    let label = format!(
        "claim with {waiting} jobs waiting (file {} bytes/job; RSS of this process \
         {bench_rss} MiB; of a fresh one holding only the store {}, {} without the checksum \
         pass at open)",
        file / waiting.max(1) as u64,
        alone(true),
        alone(false),
    );
    Ok(s.row(&label, "non-durable", 1, total, n as u64))
}

/// Resident memory of a fresh process that opens the store at `path` and claims from it
/// (this tool's hidden `__child` helper), without the bench's own allocations. With `verify`
/// (the default), the open reads every page to check its checksum, which fills redb's cache.
fn held_alone(path: &Path, verify: bool) -> std::io::Result<u64> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["__child", "--queue", "deep", "--claim", "100", "--db"])
        .arg(path)
        .args(if verify { None } else { Some("--no-verify") })
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut ready = false;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            if line?.starts_with("ready") {
                ready = true;
                break;
            }
        }
    }
    let rss = resident_mib(&Resident::Child(child.id()));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let _ = child.wait();
    match ready {
        true => Ok(rss),
        false => Err(std::io::Error::other("the helper did not open the store")),
    }
}

/// This process's resident memory, from /proc (0 where there is none).
/// Whose resident memory to read.
pub(super) enum Resident {
    This,
    Child(u32),
}

pub(super) fn resident_mib(whose: &Resident) -> u64 {
    let status = match whose {
        Resident::This => "/proc/self/status".to_owned(),
        Resident::Child(pid) => format!("/proc/{pid}/status"),
    };
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// A whole pool's worth of expired leases reaped in batches while a claimer keeps claiming:
/// the claimer's worst wait shows how long a batch holds the writer's seat.
pub(super) fn reap_under_load(dir: &Path, expired: usize) -> Result<Row, Error> {
    let clock = leasehold::ManualClock::new();
    let store = store_with(dir, "reap.redb", false, |b| b.clock(clock.clone()))?;
    let ids: Vec<usize> = (0..expired).collect();
    for chunk in ids.chunks(10_000) {
        store.enqueue_batch(chunk.iter().map(|i| NewJob::new("dead", format!("{i}"))))?;
        store.claim_batch("dead", "dead-pool", LEASE, chunk.len())?;
    }
    store.enqueue_batch((0..100_000).map(|i| NewJob::new("live", format!("{i}"))))?;
    clock.advance(LEASE * 2);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let claimer = {
        let (store, stop, waits) = (store.clone(), stop.clone(), waits.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if store.claim("live", "w", LEASE).is_err() {
                    break;
                }
                waits.lock().push(t.elapsed());
            }
        })
    };
    let start = Instant::now();
    let report = store.reap()?;
    let total = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = claimer.join();
    let samples = std::mem::take(&mut *waits.lock());
    let row = Samples(samples).row(
        &format!(
            "reap {} expired leases in batches of 500; latency = a concurrent claim's",
            report.reclaimed.len()
        ),
        "non-durable",
        1,
        total,
        report.reclaimed.len() as u64,
    );
    Ok(row)
}
