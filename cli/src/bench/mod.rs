//! `leasehold bench`: the headline scenarios, each beside raw redb doing the equivalent
//! minimal work in the same run, so every figure is also a ratio against the engine below.
//!
//! Wall time is measured here (and only here in the tool) with `Instant`: these are
//! measurements of the machine, never compared with store time.
#![allow(clippy::disallowed_methods)]

mod drain;
mod group_commit;
mod idle;
mod keyed;
mod measure;
mod page;
mod pg_churn;
mod pg_processes;
mod pool;
mod postgres;
mod processes;
mod raw;
mod scale;
mod seat;
mod weighted;
mod window;
mod workflow;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::{Durability, Error, NewJob, Sharing, Store, StoreBuilder};

use super::format;
use super::format::print_json;
use group_commit::group_commit;
use measure::{Row, timed};
use pool::{PoolShape, end_to_end, wake_latency, write_path_ceiling};
use raw::{RawRates, raw_baselines};
use scale::{claim_at_depth, reap_under_load};

pub(super) use seat::client as seat_client;

pub(super) const LEASE: Duration = Duration::from_secs(60);

/// A bench store with the defaults: durable on a single-writer file, or non-durable on an
/// exclusive one (eventual durability needs it) that flushes less often than any run lasts.
pub(super) fn store(dir: &Path, name: &str, durable: bool) -> Result<Store, Error> {
    store_with(dir, name, durable, |b| b)
}

/// [`store`], with more settings applied last.
pub(super) fn store_with(
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

pub(super) fn io(e: impl Into<redb::Error>) -> Error {
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
                // (a tenth where it is small: an idle process's wake-ups a second)
                match r.ops_per_sec {
                    x if x < 10.0 => format!("{x:.1}"),
                    x => format!("{x:.0}"),
                },
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
        let (s, total) = timed(n(50), |_| {
            s_.heartbeat_batch(&beats)
                .into_iter()
                .try_for_each(|r| r.map(|_| ()))
        })?;
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
    // Group commit: one job a call from 1 and 16 threads, how many calls a commit carries.
    if want("group-commit") {
        for durable in [true, false] {
            for threads in [1usize, 16] {
                let calls = if durable { n(600) } else { n(3000) };
                rows.push(group_commit(dir, durable, threads, calls)?);
            }
        }
    }
    if want("wake") {
        rows.push(wake_latency(dir, n(300))?);
    }
    // What waiting costs: the wake-ups of an idle pool, reaper, scheduler and follower.
    if want("idle") {
        // (a minute at full scale: longer than the slowest idle timer, a pool's look once a
        // heartbeat (20 s) and the PostgreSQL listener's check every 30 s, so each is counted)
        let window = Duration::from_secs_f64((60.0 * scale).clamp(1.0, 60.0));
        let file = store(dir, "idle.redb", true)?;
        rows.push(idle::idle_wakeups(
            "redb, single-writer file",
            std::sync::Arc::new(file),
            window,
        )?);
        let shared = store_with(dir, "idle-shared.redb", true, |b| {
            b.sharing(Sharing::MultiProcess)
        })?;
        rows.push(idle::idle_wakeups(
            "redb, shared file",
            std::sync::Arc::new(shared),
            window,
        )?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                let store = scratch.store("idle")?;
                rows.push(idle::idle_wakeups(
                    "PostgreSQL",
                    std::sync::Arc::new(store),
                    window,
                )?);
            }
            Err(_) => eprintln!("idle: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // Several processes on one store: 4 x 4 and 8 x 2 against 1 x 16 in the same run, the time from
    // a worker process's death to its jobs being claimable, and wake-ups across processes.
    if want("processes") {
        let jobs = n(600) * 4;
        let one = PoolShape {
            workers: 16,
            prefetch: None,
            sharing: Sharing::SingleWriter,
        };
        rows.push(end_to_end(dir, true, one, jobs)?);
        rows.push(processes::one_process_shared(dir, 16, jobs)?);
        // The same producer for both: this process enqueues, worker processes drain.
        rows.push(processes::processes_end_to_end(dir, 1, 16, None, jobs)?);
        rows.push(processes::processes_end_to_end(dir, 4, 4, None, jobs)?);
        rows.push(processes::processes_end_to_end(dir, 4, 4, Some(16), jobs)?);
        rows.push(processes::processes_end_to_end(dir, 8, 2, None, jobs)?);
        rows.push(seat::seat_end_to_end(dir, 4, 4, jobs)?);
        // The drain alone (no producer process competing for commits), both ways.
        let burst = n(10_000) * 2;
        rows.push(processes::burst(dir, 0, 16, burst, Sharing::SingleWriter)?);
        rows.push(processes::burst(dir, 0, 16, burst, Sharing::MultiProcess)?);
        rows.push(processes::burst(dir, 4, 4, burst, Sharing::MultiProcess)?);
        rows.push(processes::burst(dir, 8, 2, burst, Sharing::MultiProcess)?);
        rows.push(processes::kill_to_claimable(dir, n(34).max(100), 4)?);
        rows.push(processes::cross_process_wake(dir, n(100))?);
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
    // What the peer harness does (../shared/peers/): enqueue, then drain, 1 and 16 workers,
    // on a durable single-writer file and (where a server is named) on PostgreSQL.
    let drained = n(2000);
    if want("drain-redb") {
        for workers in [1, 16] {
            let name = format!("drain-{workers}.redb");
            let store = store(dir, &name, true)?;
            rows.extend(drain::drain(
                "redb, single-writer file",
                store,
                workers,
                drained,
            )?);
        }
    }
    // What following every end costs a drain: the same drain without and with a follower
    // (on PostgreSQL on another handle, as another machine's; on redb on the writer's
    // handle, the one process that writes a single-writer file), interleaved.
    if want("drain-followed") {
        for workers in [1, 16] {
            let plain = store(dir, &format!("drain-unfollowed-{workers}.redb"), true)?;
            let [_, row] = drain::drain("redb, single-writer file", plain, workers, drained)?;
            rows.push(row);
            let followed = store(dir, &format!("drain-followed-{workers}.redb"), true)?;
            rows.push(drain::drain_followed(
                "redb, single-writer file",
                followed.clone(),
                followed,
                workers,
                drained,
            )?);
        }
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                for workers in [1, 16] {
                    let plain = scratch.store(&format!("unfollowed{workers}"))?;
                    let [_, row] = drain::drain("PostgreSQL", plain, workers, drained)?;
                    rows.push(row);
                    let name = format!("followed{workers}");
                    let (store, follower) = (scratch.store(&name)?, scratch.store(&name)?);
                    rows.push(drain::drain_followed(
                        "PostgreSQL, the follower on another handle",
                        store,
                        follower,
                        workers,
                        drained,
                    )?);
                }
            }
            Err(_) => eprintln!("drain-followed: PostgreSQL not run (set LEASEHOLD_PG_URL)"),
        }
    }
    // What a log line and a checkpoint cost a job: the same drain, each job doing nothing
    // else, writing a line, saving a checkpoint, one after the other.
    if want("drain-attempt-writes") {
        use drain::Doing;
        let doings = [Doing::Nothing, Doing::LogsALine, Doing::SavesACheckpoint];
        for workers in [1, 16] {
            for (i, doing) in doings.into_iter().enumerate() {
                let file = store(dir, &format!("drain-doing-{workers}-{i}.redb"), true)?;
                let label = "redb, single-writer file";
                rows.push(drain::drain_doing(label, file, workers, drained, doing)?);
            }
        }
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                for workers in [1, 16] {
                    for (i, doing) in doings.into_iter().enumerate() {
                        let store = scratch.store(&format!("doing{workers}_{i}"))?;
                        rows.push(drain::drain_doing(
                            "PostgreSQL",
                            store,
                            workers,
                            drained,
                            doing,
                        )?);
                    }
                }
            }
            Err(_) => eprintln!("drain-attempt-writes: PostgreSQL not run (set LEASEHOLD_PG_URL)"),
        }
    }
    if want("drain-writes-redb") {
        for workers in [1, 16] {
            let name = format!("drain-writes-{workers}.redb");
            let store = store(dir, &name, true)?;
            rows.push(drain::drain_with_writes(
                "redb, single-writer file",
                store,
                workers,
                drained,
            )?);
        }
    }
    if want("drain-postgres") {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                for workers in [1, 16] {
                    let store = scratch.store(&format!("drain{workers}"))?;
                    rows.extend(drain::drain("PostgreSQL", store, workers, drained)?);
                }
                // Three times as deep: a claim whose cost grows with the waiting jobs (as
                // one that sorted them all did until the work of 2026-12-04 (69bf12f)) shows here first.
                let store = scratch.store("draindeep")?;
                rows.extend(drain::drain("PostgreSQL", store, 16, 3 * drained)?);
                // What running a round's two halves (its completions, the claim that
                // refills its workers) side by side on two connections buys: the same
                // drains with the halves one after the other in one transaction.
                for workers in [1, 16] {
                    let name = format!("drainserial{workers}");
                    let store = scratch.store_with(&name, |b| b.side_by_side_from(usize::MAX))?;
                    let label = "PostgreSQL, a round's halves one after the other";
                    let [_, drain] = drain::drain(label, store, workers, drained)?;
                    rows.push(drain);
                }
            }
            Err(_) => eprintln!("drain-postgres: not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // What an end asked for in SQL costs, beside one from Rust.
    if want("sql-ends") {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let mut scratch = postgres::Scratch::new(&url)?;
                rows.extend(postgres::sql_ends(&mut scratch, n(300))?);
            }
            Err(_) => eprintln!("sql-ends: not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // What waiting costs: a fan-in of 10,000 members to one callback, and jobs released by
    // their dependencies' completions, beside plain jobs, with 16 workers.
    if want("workflow") {
        let jobs = ((10_000.0 * scale) as usize).max(100);
        let open = |name: &str| store(dir, &format!("{name}.redb"), true);
        rows.extend(workflow::rows("redb", open, jobs, 16)?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                rows.extend(workflow::rows(
                    "PostgreSQL",
                    |n| scratch.store(n),
                    jobs,
                    16,
                )?);
            }
            Err(_) => eprintln!("workflow: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // A pool over four weighted queues against a pool over one, with 16 workers.
    if want("weighted") {
        let jobs = ((20_000.0 * scale) as usize).max(100);
        let open = |name: &str| store(dir, &format!("{name}.redb"), true);
        rows.extend(weighted::rows("redb", open, jobs, 16)?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                rows.extend(weighted::rows(
                    "PostgreSQL",
                    |n| scratch.store(n),
                    jobs,
                    16,
                )?);
            }
            Err(_) => eprintln!("weighted: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // Limits per key: a claim with 999 of 1,000 tenants at their limit against one with none.
    if want("keyed") {
        let claims = ((2_000.0 * scale) as usize).max(100);
        let tenants = ((1_000.0 * scale) as usize).clamp(20, 1_000);
        // (redb not durable as well: without a flush per claim, what the index costs shows)
        let open = |name: &str| store(dir, &format!("{name}.redb"), false);
        rows.extend(keyed::rows(
            "redb",
            "non-durable",
            open,
            claims * 5,
            tenants,
        )?);
        let open = |name: &str| store(dir, &format!("{name}-durable.redb"), true);
        rows.extend(keyed::rows("redb", "durable", open, claims, tenants)?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                let open = |n: &str| scratch.store(n);
                rows.extend(keyed::rows("PostgreSQL", "durable", open, claims, tenants)?);
            }
            Err(_) => eprintln!("keyed: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // What the window and the batch delay trade (speed against what a dead pool leaves).
    if want("window") {
        let open = |name: &str| store(dir, &format!("{name}.redb"), true);
        rows.extend(window::rows("redb", open, n(2000))?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                rows.extend(window::rows(
                    "PostgreSQL",
                    |name| scratch.store(name),
                    n(2000),
                )?);
            }
            Err(_) => eprintln!("window: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // What the batch delay buys where work trickles in.
    if want("trickle") {
        let open = |name: &str| store(dir, &format!("{name}.redb"), true);
        let every = Duration::from_micros(500);
        rows.extend(window::trickle_rows("redb", open, n(1000), every)?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let scratch = postgres::Scratch::new(&url)?;
                let open = |name: &str| scratch.store(name);
                rows.extend(window::trickle_rows("PostgreSQL", open, n(1000), every)?);
            }
            Err(_) => eprintln!("trickle: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    // Worker processes on one database, as worker machines would be: only when named in
    // full (it starts thirty processes).
    if only == Some("postgres-processes") {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => rows.extend(pg_processes::rows(&url, scale)?),
            Err(_) => eprintln!("postgres-processes: not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    if want("postgres") && only != Some("postgres-processes") {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => rows.extend(postgres::rows(&url, scale)?),
            Err(_) => eprintln!("postgres: not run (set LEASEHOLD_PG_URL to a server to run it)"),
        }
    }
    // The status page on a million jobs, and its cost to workers beside it: only when asked
    // for by name (filling the store takes minutes).
    if only == Some("page") {
        let jobs = ((1_000_000.0 * scale) as usize).max(1000);
        let (rounds, drained) = (n(20), n(2000));
        let file = store(dir, "page.redb", false)?;
        rows.extend(page::filled_pages("redb", &file, jobs, rounds)?);
        drop(file);
        let live = store(dir, "page-drain.redb", true)?;
        rows.extend(page::cost_to_workers("redb", &live, drained)?);
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => {
                let mut scratch = postgres::Scratch::new(&url)?;
                let db = scratch.store("page")?;
                rows.extend(page::filled_pages("PostgreSQL", &db, jobs, rounds)?);
                // Right after a million jobs ran through, every index holds the entries of
                // rows since updated until a vacuum: the same pages once one has run.
                scratch.sql("VACUUM (ANALYZE) {s}_page.leasehold_jobs")?;
                let label = format!("PostgreSQL, {jobs} jobs, after VACUUM");
                rows.push(page::count(&label, &db, rounds)?);
                rows.extend(page::pages(&label, &page::view(&db), rounds)?);
                let live = scratch.store("pagedrain")?;
                rows.extend(page::cost_to_workers("PostgreSQL", &live, drained)?);
            }
            Err(_) => eprintln!("page: PostgreSQL not run (set LEASEHOLD_PG_URL to a server)"),
        }
    }
    if only == Some("churn") {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => rows.extend(pg_churn::rows(&url, scale)?),
            Err(_) => eprintln!("churn: not run (set LEASEHOLD_PG_URL to a server to run it)"),
        }
    }
    Ok(rows)
}

/// Enqueues `jobs` numbered jobs of `queue` (payload: the number), `per_call` in each batch:
/// the backlog an end-to-end scenario drains.
fn enqueue_numbered(
    store: &dyn JobStore,
    queue: &str,
    jobs: usize,
    per_call: usize,
) -> Result<(), Error> {
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(per_call) {
        let batch = chunk.iter().map(|i| NewJob::new(queue, format!("{i}")));
        store.enqueue_batch(batch.collect())?;
    }
    Ok(())
}
