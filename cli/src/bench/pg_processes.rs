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
        let db = url_of(url, &scratch.schema)(&name);
        let workers_arg = workers.to_string();
        let args = ["__pool", "--queue", "pp", "--workers", &workers_arg];
        let helpers = (0..processes)
            .map(|_| Helper::start(Path::new(&db), &args))
            .collect::<Result<Vec<_>, _>>()?;
        let start = Instant::now();
        store.enqueue_batch((0..jobs).map(|_| NewJob::new("pp", Vec::new())))?;
        // (each look counts the table's jobs by state: looked at every 20 ms, so that the
        // bench's own reading costs the server little beside the workers)
        while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
            std::thread::sleep(Duration::from_millis(20));
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
    rows.push(wake_latency(&scratch, &url_of(url, &scratch.schema), 200)?);
    Ok(rows)
}

/// The URL of the bench's store named `name` (in schema `{schema}_{name}`), for the helper
/// processes.
fn url_of(url: &str, schema: &str) -> impl Fn(&str) -> String {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    move |name| {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}schema={schema}_{name}")
    }
}

/// Enqueue here to a claim by one of four idle worker processes of four workers, one job at
/// a time, on store time (the database's clock: the job's creation and its attempt's claim,
/// as the history has them): the wake-up across processes (`NOTIFY`, `LISTEN`) and the
/// claim's round.
fn wake_latency(
    scratch: &Scratch,
    url_of: &impl Fn(&str) -> String,
    n: usize,
) -> Result<Row, Error> {
    let store = scratch.store("pplatency")?;
    let db = url_of("pplatency");
    let args = ["__pool", "--queue", "pp", "--workers", "4"];
    let helpers = (0..4)
        .map(|_| Helper::start(Path::new(&db), &args))
        .collect::<Result<Vec<_>, _>>()?;
    let mut samples = Vec::with_capacity(n);
    let begin = Instant::now();
    for i in 0..n {
        let id = store.enqueue(NewJob::new("pp", format!("{i}")))?;
        while store.stats()?.total(JobState::Succeeded) < (i + 1) as u64 {
            std::thread::sleep(Duration::from_micros(500));
        }
        let job = store.job(id)?.ok_or(Error::JobNotFound(id))?;
        let runs = store.history(id)?;
        let claimed = runs.first().ok_or(Error::JobNotFound(id))?.claimed_at();
        samples.push(claimed.saturating_since(job.created_at()));
        // every pool idle again before the next
        std::thread::sleep(Duration::from_millis(5));
    }
    let total = begin.elapsed();
    helpers.into_iter().for_each(Helper::end);
    Ok(Samples(samples).row(
        "postgres processes: enqueue -> claim by one of 4 idle worker processes x 4 workers (latency, store time)",
        "durable",
        16,
        total,
        n as u64,
    ))
}
