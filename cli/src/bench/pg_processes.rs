//! Worker processes on one PostgreSQL database, as worker machines would be: 1 × 16, 2 × 8,
//! 4 × 4 and 8 × 2 processes × workers draining one queue (durable, every completion
//! committed), with each process's share of the jobs. The processes are this binary's
//! hidden `__pool` subcommand, each with its own connections, its own `LISTEN` and its own
//! rounds, contending for the same rows as pools on different machines would.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{Error, JobState, JobStore, NewJob, ReadJobs};

use super::super::helper::Helper;
use super::measure::{Row, Samples};
use super::postgres::Scratch;

/// The shapes: processes × workers, sixteen workers in all.
const SHAPES: [(usize, usize); 4] = [(1, 16), (2, 8), (4, 4), (8, 2)];

/// The rows: one drain of `jobs` empty jobs per shape, the processes started and idle
/// before the jobs arrive in one call (one commit); the rate is jobs over the time from that
/// call until the last one succeeded (as `benches/peers/graphile_processes.js` times its
/// peer, whose one call commits in parts that its workers drain meanwhile).
pub(super) fn rows(url: &str, scale: f64) -> Result<Vec<Row>, Error> {
    let jobs = ((20_000.0 * scale) as usize).max(1000);
    let scratch = Scratch::new(url)?;
    let mut rows = Vec::new();
    for (processes, workers) in SHAPES {
        let name = format!("pp{processes}x{workers}");
        let store = scratch.store(&name)?;
        let sep = if url.contains('?') { '&' } else { '?' };
        let db = format!("{url}{sep}schema={}_{name}", scratch.schema);
        let workers_arg = workers.to_string();
        let args = ["__pool", "--queue", "pp", "--workers", &workers_arg];
        let helpers = (0..processes)
            .map(|_| Helper::start(Path::new(&db), &args))
            .collect::<Result<Vec<_>, _>>()?;
        let start = Instant::now();
        store.enqueue_batch((0..jobs).map(|_| NewJob::new("pp", Vec::new())).collect())?;
        while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let total = start.elapsed();
        // Each process says how many jobs it completed, in how many of its rounds.
        let said: Vec<(u64, u64)> = helpers
            .into_iter()
            .map(|h| {
                let words = h.finish("pool").unwrap_or_default();
                let n = |i: usize| words.get(i).and_then(|w| w.parse().ok()).unwrap_or(0);
                (n(0), n(1))
            })
            .collect();
        let shares: Vec<u64> = said.iter().map(|s| s.0).collect();
        let rounds: u64 = said.iter().map(|s| s.1).sum();
        if shares.iter().sum::<u64>() != jobs as u64 {
            return Err(Error::Internal(
                "the worker processes' counts do not add up to the jobs drained",
            ));
        }
        let mean = jobs as f64 / processes as f64;
        let (least, most) = (
            shares.iter().min().copied().unwrap_or(0) as f64 / mean,
            shares.iter().max().copied().unwrap_or(0) as f64 / mean,
        );
        rows.push(Samples(Vec::new()).row(
            &format!(
                "postgres processes: {jobs} empty jobs, {processes} worker process{} x {workers} workers on one queue (each process {least:.2}-{most:.2} x the mean share; {:.1} completions per round)",
                if processes == 1 { "" } else { "es" },
                jobs as f64 / rounds.max(1) as f64,
            ),
            "durable",
            processes * workers,
            total,
            jobs as u64,
        ));
    }
    Ok(rows)
}
