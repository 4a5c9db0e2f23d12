//! `leasehold bench`: the headline scenarios, each beside raw redb doing the equivalent
//! minimal work in the same run, so every figure is also a ratio against the engine below.
//!
//! Wall time is measured here (and only here in the tool) with `Instant`: these are
//! measurements of the machine, never compared with store time.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::{
    CommitShape, Durability, Error, JobState, NewJob, Sharing, Store, StoreBuilder, WorkerPool,
};
use parking_lot::Mutex;
use redb::{ReadableTable, TableDefinition};
use serde::Serialize;

use super::format;
use super::inspect::print_json;

const RAW: TableDefinition<u64, &[u8]> = TableDefinition::new("raw");
const RAW_INDEX: TableDefinition<(u64, u64), ()> = TableDefinition::new("raw.index");
const LEASE: Duration = Duration::from_secs(60);

#[derive(Serialize)]
struct Row {
    operation: String,
    durability: &'static str,
    concurrency: usize,
    ops_per_sec: f64,
    /// Per-operation latency percentiles, where operations were timed one by one.
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    max_us: Option<f64>,
    /// ops/s divided by raw redb's ops/s for the equivalent work (none for the baselines).
    ratio_to_raw: Option<f64>,
}

struct Samples(Vec<Duration>);

impl Samples {
    fn row(
        mut self,
        operation: &str,
        durability: &'static str,
        concurrency: usize,
        total: Duration,
        ops: u64,
    ) -> Row {
        self.0.sort();
        let pct = |p: f64| {
            if self.0.is_empty() {
                return None;
            }
            let i = ((self.0.len() as f64 * p) as usize).min(self.0.len() - 1);
            Some(self.0[i].as_secs_f64() * 1e6)
        };
        Row {
            operation: operation.into(),
            durability,
            concurrency,
            ops_per_sec: ops as f64 / total.as_secs_f64(),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: self.0.last().map(|d| d.as_secs_f64() * 1e6),
            ratio_to_raw: None,
        }
    }
}

/// Times `n` calls of `op`.
fn timed(
    n: usize,
    mut op: impl FnMut(usize) -> Result<(), Error>,
) -> Result<(Samples, Duration), Error> {
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        op(i)?;
        samples.push(t.elapsed());
    }
    Ok((Samples(samples), start.elapsed()))
}

/// Raw redb's rates (ops/s) for each way of sharing the file: `[exclusive, single-writer]`.
#[derive(Default)]
struct RawRates {
    insert: [f64; 2],
    rmw: [f64; 2],
}

impl RawRates {
    fn at(sharing: Sharing) -> usize {
        match sharing {
            Sharing::Exclusive => 0,
            _ => 1,
        }
    }

    fn set(&mut self, sharing: Sharing, insert: f64, rmw: f64) {
        self.insert[Self::at(sharing)] = insert;
        self.rmw[Self::at(sharing)] = rmw;
    }

    fn insert(&self, sharing: Sharing) -> f64 {
        self.insert[Self::at(sharing)]
    }

    fn rmw(&self, sharing: Sharing) -> f64 {
        self.rmw[Self::at(sharing)]
    }
}

/// Raw redb on a file shared as `sharing`: one small insert per durable commit (the engine's
/// floor for any write), and a read-modify-write of a record plus an index update per commit
/// (what a claim or a completion minimally is).
fn raw_baselines(
    dir: &Path,
    sharing: Sharing,
    n: usize,
    payload: &[u8],
) -> Result<(Row, Row), Error> {
    let (file, mode) = match sharing {
        Sharing::Exclusive => ("exclusive", redb::ConcurrencyMode::ExclusiveWriter),
        _ => ("single-writer", redb::ConcurrencyMode::SingleWriter),
    };
    let db = redb::Builder::new()
        .set_concurrency_mode(mode)
        .create(dir.join(format!("raw-{file}.redb")))
        .map_err(io)?;
    let (s, total) = timed(n, |i| {
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(RAW)
            .map_err(io)?
            .insert(i as u64, payload)
            .map_err(io)?;
        txn.commit().map_err(io)
    })?;
    let insert = s.row(
        &format!("raw redb: insert, one per commit ({file} file)"),
        "durable",
        1,
        total,
        n as u64,
    );
    let (s, total) = timed(n, |i| {
        let txn = db.begin_write().map_err(io)?;
        {
            let mut t = txn.open_table(RAW).map_err(io)?;
            let v = t
                .get(i as u64)
                .map_err(io)?
                .map(|g| g.value().to_vec())
                .unwrap_or_default();
            t.insert(i as u64, v.as_slice()).map_err(io)?;
            let mut idx = txn.open_table(RAW_INDEX).map_err(io)?;
            idx.remove((i as u64, 0)).map_err(io)?;
            idx.insert((i as u64, 1), ()).map_err(io)?;
        }
        txn.commit().map_err(io)
    })?;
    let rmw = s.row(
        &format!("raw redb: read-modify-write + index, one per commit ({file} file)"),
        "durable",
        1,
        total,
        n as u64,
    );
    Ok((insert, rmw))
}

/// A bench store with the defaults: durable on a single-writer file, or non-durable on an
/// exclusive one (eventual durability needs it) that flushes less often than any run lasts.
fn store(dir: &Path, name: &str, durable: bool) -> Result<Store, Error> {
    store_with(dir, name, durable, |b| b)
}

/// [`store`], with more settings applied last.
fn store_with(
    dir: &Path,
    name: &str,
    durable: bool,
    configure: impl FnOnce(StoreBuilder) -> StoreBuilder,
) -> Result<Store, Error> {
    let b = Store::builder(dir.join(name));
    let b = if durable {
        b
    } else {
        b.sharing(Sharing::Exclusive)
            .durability(Durability::Eventual {
                flush_every: Duration::from_secs(3600),
            })
    };
    configure(b).open()
}

fn io(e: impl Into<redb::Error>) -> Error {
    Error::Storage(e.into())
}

pub fn run(json: bool, scale: f64, only: Option<&str>) -> Result<ExitCode, Error> {
    let dir = std::env::temp_dir().join(format!("leasehold-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Storage(redb::Error::Io(e)))?;
    let result = scenarios(&dir, scale, only);
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result?;
    if json {
        print_json(&rows);
    } else {
        let mut t = format::Table::new(&[
            "operation",
            "durability",
            "conc",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "max µs",
            "vs raw redb",
        ]);
        for r in &rows {
            t.row(vec![
                r.operation.clone(),
                r.durability.into(),
                r.concurrency.to_string(),
                format!("{:.0}", r.ops_per_sec),
                r.p50_us
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "-".into()),
                r.p99_us
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "-".into()),
                r.max_us
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "-".into()),
                match r.ratio_to_raw {
                    Some(x) => format!("{x:.2}x"),
                    None if r.operation.starts_with("raw redb") => "baseline".into(),
                    None => "-".into(),
                },
            ]);
        }
        println!("{}", t.render());
    }
    Ok(ExitCode::SUCCESS)
}

fn scenarios(dir: &Path, scale: f64, only: Option<&str>) -> Result<Vec<Row>, Error> {
    let want = |group: &str| only.is_none_or(|o| group.contains(o));
    // Three times the base counts at scale 1: about half a minute, steadier figures.
    let n = |base: usize| ((base as f64 * scale * 3.0) as usize).max(10);
    let mut rows = Vec::new();
    let payload = vec![7u8; 100];

    // The raw baselines: needed by every group that reports a ratio.
    // One pair per way of sharing the file: redb commits a file other processes may read
    // (single-writer, leasehold's default) in two phases, an exclusive one in one, so each
    // leasehold row is compared with raw redb sharing its file the same way.
    let mut raw = RawRates::default();
    if ["raw", "enqueue", "claim-complete", "heartbeat"]
        .iter()
        .any(|g| want(g))
    {
        for sharing in [Sharing::Exclusive, Sharing::SingleWriter] {
            let (insert, rmw) = raw_baselines(dir, sharing, n(2000), &payload)?;
            raw.set(sharing, insert.ops_per_sec, rmw.ops_per_sec);
            rows.push(insert);
            rows.push(rmw);
        }
    }

    if want("enqueue") {
        for (sharing, name) in [
            (Sharing::SingleWriter, "single-writer"),
            (Sharing::Exclusive, "exclusive"),
        ] {
            let s_ = store_with(dir, &format!("enq-{name}.redb"), true, |b| {
                b.sharing(sharing)
            })?;
            let (s, total) = timed(n(2000), |_| {
                s_.enqueue(NewJob::new("q", payload.clone())).map(|_| ())
            })?;
            let mut row = s.row(
                &format!("enqueue ({name} file)"),
                "durable",
                1,
                total,
                n(2000) as u64,
            );
            row.ratio_to_raw = Some(row.ops_per_sec / raw.insert(sharing));
            rows.push(row);
        }
    }

    if want("claim-complete") {
        // Sequential claim + complete: two commits per job, against two raw read-modify-writes
        // on a file shared the same way.
        let jobs = n(1000);
        for (sharing, name) in [
            (Sharing::Exclusive, "exclusive"),
            (Sharing::SingleWriter, "single-writer"),
        ] {
            let s_ = store_with(dir, &format!("cc-{name}.redb"), true, |b| {
                b.sharing(sharing)
            })?;
            s_.enqueue_batch((0..jobs).map(|_| NewJob::new("q", payload.clone())))?;
            let (s, total) = timed(jobs, |_| {
                let l = s_
                    .claim("q", "w", LEASE)?
                    .ok_or(Error::InUse("ran out of jobs"))?;
                s_.complete(&l, b"")
            })?;
            let label = format!("claim + complete, sequential ({name} file)");
            let mut row = s.row(&label, "durable", 1, total, jobs as u64);
            row.ratio_to_raw = Some(row.ops_per_sec / (raw.rmw(sharing) / 2.0));
            rows.push(row);
        }
    }

    if want("heartbeat") {
        let s_ = store(dir, "hb.redb", true)?;
        // Heartbeats: one lease per call, and 1,000 leases in one call.
        s_.enqueue_batch((0..1000).map(|_| NewJob::new("hb", payload.clone())))?;
        let leases: Vec<_> = (0..1000)
            .map(|_| {
                s_.claim("hb", "w", LEASE)
                    .map(|l| l.ok_or(Error::InUse("ran out of jobs")))
            })
            .collect::<Result<Result<_, _>, _>>()??;
        let (s, total) = timed(n(500), |i| {
            s_.heartbeat(&leases[i % 1000], i as u64).map(|_| ())
        })?;
        let mut row = s.row(
            "heartbeat, 1 lease per commit",
            "durable",
            1,
            total,
            n(500) as u64,
        );
        row.ratio_to_raw = Some(row.ops_per_sec / raw.rmw(Sharing::SingleWriter));
        rows.push(row);
        // In no particular order, as a pool's leases come (7919 is prime to 1,000, so this
        // visits each lease once).
        let beats: Vec<_> = (0..1000)
            .map(|i| (&leases[i * 7919 % 1000], 1u64))
            .collect();
        let (s, total) = timed(n(50), |_| s_.heartbeat_batch(&beats).map(|_| ()))?;
        rows.push(s.row(
            "heartbeat, batch of 1,000 leases per commit",
            "durable",
            1,
            total,
            n(50) as u64,
        ));
        drop(s_);
    }

    // End to end through worker pools: one worker, sixteen, and sixteen with jobs claimed
    // ahead; durable on the default single-writer file and on an exclusive one.
    if want("end-to-end-durable") {
        let pools = [
            (1, None, Sharing::SingleWriter),
            (16, Some(0), Sharing::SingleWriter),
            (16, None, Sharing::SingleWriter),
            (16, Some(32), Sharing::SingleWriter),
            (16, None, Sharing::Exclusive),
        ];
        for (workers, prefetch, sharing) in pools {
            let pool = PoolShape {
                workers,
                prefetch,
                sharing,
            };
            rows.push(end_to_end(dir, true, pool, n(600) * workers.min(4))?);
        }
    }
    if want("end-to-end-non-durable") {
        rows.push(write_path_ceiling(dir, n(4000))?);
        for (workers, prefetch) in [(1, None), (16, Some(0)), (16, None), (16, Some(32))] {
            let pool = PoolShape {
                workers,
                prefetch,
                sharing: Sharing::Exclusive,
            };
            rows.push(end_to_end(dir, false, pool, n(4000))?);
        }
    }
    // The two group-commit shapes the throughput issue asked to weigh, same work, same run.
    if want("commit-shape") {
        for durable in [true, false] {
            for threads in [1usize, 16] {
                for shape in [CommitShape::LeaderFollower, CommitShape::WriterThread] {
                    let calls = if durable { n(600) } else { n(3000) };
                    rows.push(commit_shape(dir, durable, shape, threads, calls)?);
                }
            }
        }
    }
    if want("wake") {
        rows.push(wake_latency(dir, n(300))?);
    }
    // Scale: claim at 1 k, 100 k and 1 M waiting jobs; a whole dead pool of 100 k leases.
    let sized = |base: usize| ((base as f64 * scale) as usize).max(100);
    if want("depth") {
        for waiting in [1_000, sized(100_000), sized(1_000_000)] {
            rows.push(claim_at_depth(dir, waiting)?);
        }
    }
    if want("reap") {
        rows.push(reap_under_load(dir, sized(100_000))?);
    }
    Ok(rows)
}

/// Claim cost with `waiting` jobs in the queue (non-durable, so the index walk shows, not the
/// fsync): claim must stay O(log n).
fn claim_at_depth(dir: &Path, waiting: usize) -> Result<Row, Error> {
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

/// A whole pool's worth of expired leases reaped in batches while a claimer keeps claiming:
/// the claimer's worst wait shows how long a batch holds the writer's seat.
fn reap_under_load(dir: &Path, expired: usize) -> Result<Row, Error> {
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

/// `threads` threads each enqueueing `calls` jobs one call at a time, through one group
/// commit shape: every call's latency, and the total rate.
fn commit_shape(
    dir: &Path,
    durable: bool,
    shape: CommitShape,
    threads: usize,
    calls: usize,
) -> Result<Row, Error> {
    let name = format!("shape-{durable}-{shape:?}-{threads}.redb");
    let store = store_with(dir, &name, durable, |b| {
        b.sharing(Sharing::Exclusive).commit_shape(shape)
    })?;
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<Duration>, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let store = &store;
                s.spawn(move || {
                    (0..calls)
                        .map(|i| {
                            let t = Instant::now();
                            store.enqueue(NewJob::new("q", format!("{i}")))?;
                            Ok(t.elapsed())
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(Error::InUse("a bench thread panicked")))
            })
            .collect()
    });
    let total = start.elapsed();
    let mut samples = Vec::new();
    for t in per_thread {
        samples.extend(t?);
    }
    let commits = store.metrics().write_transactions.max(1);
    let label = format!(
        "enqueue, one job per call, {} ({:.1} calls/commit)",
        match shape {
            CommitShape::LeaderFollower => "leader/follower group commit",
            CommitShape::WriterThread => "writer-thread group commit",
        },
        (threads * calls) as f64 / commits as f64
    );
    Ok(Samples(samples).row(
        &label,
        if durable { "durable" } else { "non-durable" },
        threads,
        total,
        (threads * calls) as u64,
    ))
}

/// A worker pool's shape for the end-to-end scenarios.
struct PoolShape {
    workers: usize,
    /// `None`: the pool's default (claims ahead what one commit's wait covers).
    prefetch: Option<usize>,
    sharing: Sharing,
}

fn end_to_end(dir: &Path, durable: bool, shape: PoolShape, jobs: usize) -> Result<Row, Error> {
    let PoolShape {
        workers,
        prefetch,
        sharing,
    } = shape;
    let name = format!("e2e-{durable}-{workers}-{prefetch:?}-{sharing:?}.redb");
    let store = store_with(dir, &name, durable, |b| b.sharing(sharing))?;
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    let start = Instant::now();
    let mut builder = WorkerPool::builder(store.clone(), "e2e").concurrency(workers);
    if let Some(n) = prefetch {
        builder = builder.prefetch(n);
    }
    let pool = builder.start(move |_| {
        d.fetch_add(1, Ordering::Relaxed);
        Ok(Vec::new())
    })?;
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(64) {
        store.enqueue_batch(chunk.iter().map(|i| NewJob::new("e2e", format!("{i}"))))?;
    }
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let total = start.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let commits = store.metrics().write_transactions.max(1);
    let file = match sharing {
        Sharing::Exclusive => "exclusive file",
        _ => "single-writer file",
    };
    let ahead = match prefetch {
        None => String::new(),
        Some(0) => ", nothing claimed ahead".to_owned(),
        Some(n) => format!(", {n} claimed ahead"),
    };
    Ok(Samples(Vec::new()).row(
        &format!(
            "end to end: enqueue -> claim -> complete, pool ({file}{ahead}; {:.1} jobs/commit)",
            jobs as f64 / commits as f64
        ),
        if durable { "durable" } else { "non-durable" },
        workers,
        total,
        jobs as u64,
    ))
}

/// The store alone on one thread, no pool, non-durable: enqueue, claim and complete in batches
/// of 32 (three commits per 32 jobs). What a non-durable pool's end-to-end rate is bounded by:
/// every write goes through the one write transaction, so no pool moves jobs faster. (Durable,
/// the bound is the fsync instead, which a pool shares among more jobs than this.)
fn write_path_ceiling(dir: &Path, jobs: usize) -> Result<Row, Error> {
    const BATCH: usize = 32;
    let store = store(dir, "ceiling.redb", false)?;
    let start = Instant::now();
    let mut moved = 0;
    while moved < jobs {
        store.enqueue_batch((0..BATCH).map(|i| NewJob::new("ceiling", format!("{i}"))))?;
        let leases = store.claim_batch("ceiling", "w", LEASE, BATCH)?;
        let done: Vec<_> = leases.iter().map(|l| (l, [].as_slice())).collect();
        for result in store.complete_batch(&done) {
            result?;
        }
        moved += leases.len();
    }
    Ok(Samples(Vec::new()).row(
        &format!(
            "store alone, no pool: enqueue, claim, complete {BATCH} per commit (exclusive file)"
        ),
        "non-durable",
        1,
        start.elapsed(),
        moved as u64,
    ))
}

/// Enqueue-to-handler-start latency in one process: an idle pool woken by each enqueue.
fn wake_latency(dir: &Path, n: usize) -> Result<Row, Error> {
    let store = store(dir, "wake.redb", false)?;
    let started: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(Vec::new()));
    let s = started.clone();
    let pool = WorkerPool::builder(store.clone(), "wake").start(move |_| {
        s.lock().push(Instant::now());
        Ok(Vec::new())
    })?;
    let mut samples = Vec::with_capacity(n);
    let begin = Instant::now();
    for i in 0..n {
        let before = started.lock().len();
        let t = Instant::now();
        store.enqueue(NewJob::new("wake", format!("{i}")))?;
        while started.lock().len() == before {
            std::hint::spin_loop();
        }
        let at = started.lock()[before];
        samples.push(at.duration_since(t));
        // let the completion commit before the next enqueue
        while store.stats()?.total(JobState::Succeeded) < (i + 1) as u64 {
            std::thread::yield_now();
        }
    }
    let total = begin.elapsed();
    pool.shutdown(Duration::from_secs(5));
    Ok(Samples(samples).row(
        "enqueue-to-handler-start (latency; ops/s = sequential round trips)",
        "non-durable",
        1,
        total,
        n as u64,
    ))
}

/// This process's resident memory, from /proc (0 where there is none).
/// Whose resident memory to read.
enum Resident {
    This,
    Child(u32),
}

fn resident_mib(whose: &Resident) -> u64 {
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
