//! The demo's third act: a periodic job and a limit, across processes. Two worker processes
//! (this binary's `__pool`) share one store; each declares the same schedule (a tick every
//! half second) and runs a scheduler, and both serve a queue limited to two jobs at once.
//! Every tick is enqueued exactly once, whichever process's scheduler comes first, and the
//! two processes' six workers never hold more than two of the queue's jobs at any moment
//! (read back from the jobs' histories, on the store clock both processes share).
//!
//! Wall time here is the demo's own pacing, never compared with store time.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use leasehold::{Error, JobFilter, JobState, QueueLimits, Sharing, Store};
use leasehold::{JobStore, ReadJobs};

use super::helper::Helper;

const QUEUE: &str = "uploads";
const LIMIT: u32 = 2;
const TICK_MS: u64 = 1000;
/// Each tick's job works this long: longer than two ticks, so the limit holds some back.
const WORK_MS: u64 = 2500;
const RUN: Duration = Duration::from_secs(6);

/// What the act measured.
pub(super) struct ScheduleAct {
    /// Jobs the schedule enqueued.
    pub jobs: usize,
    /// Distinct ticks among them.
    pub ticks: usize,
    /// How many each process's scheduler fired.
    pub fired_by: Vec<u64>,
    /// The most of the queue's jobs held at once, across both processes.
    pub most_at_once: usize,
    pub limit: u32,
    pub failures: Vec<String>,
}

/// Runs the act in `dir`, narrating through `say`.
pub(super) fn act(dir: &Path, mut say: impl FnMut(String)) -> Result<ScheduleAct, Error> {
    let path = dir.join("schedules.redb");
    let store = Store::builder(&path)
        .sharing(Sharing::MultiProcess)
        .open()?;
    // (the queue is set up before its first job: declared, so the store knows it)
    store.declare_queue(QUEUE)?;
    store.set_queue_limits(QUEUE, QueueLimits::none().concurrency(LIMIT))?;
    let (tick, work) = (TICK_MS.to_string(), WORK_MS.to_string());
    let helpers = (0..2)
        .map(|_| {
            Helper::start(
                &path,
                &[
                    "__pool",
                    "--queue",
                    QUEUE,
                    "--workers",
                    "3",
                    "--work-ms",
                    &work,
                    "--schedule-every-ms",
                    &tick,
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pids: Vec<String> = helpers.iter().map(|h| h.pid().to_string()).collect();
    say(format!(
        "act 3: 2 processes (pids {}) each declare a schedule ticking every {TICK_MS} ms and \
         run a scheduler; queue {QUEUE} is limited to {LIMIT} jobs at once across them \
         (3 workers each, jobs of {WORK_MS} ms)",
        pids.join(", ")
    ));
    std::thread::sleep(RUN);
    let fired_by: Vec<u64> = helpers
        .into_iter()
        .map(|h| {
            h.finish("fired")
                .and_then(|words| words.first()?.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    let jobs = store.jobs(&JobFilter {
        queue: Some(QUEUE.into()),
        ..JobFilter::default()
    })?;
    let ticks: BTreeSet<&str> = jobs.iter().filter_map(|j| j.unique_key()).collect();
    // Every attempt's lease, as history records it: when it was claimed, and when it ended
    // (a running one has not).
    let mut edges = Vec::new();
    for job in &jobs {
        for run in store.history(job.id())? {
            edges.push((run.claimed_at(), 1i64));
            if let Some(ended) = run.ended_at() {
                edges.push((ended, -1));
            }
        }
    }
    // (an end at the instant of a claim comes first: that slot was free)
    edges.sort();
    let (mut held, mut most_at_once) = (0i64, 0i64);
    for (_, step) in edges {
        held += step;
        most_at_once = most_at_once.max(held);
    }
    let mut failures = Vec::new();
    if ticks.len() != jobs.len() {
        failures.push(format!(
            "act 3: {} jobs for {} distinct ticks",
            jobs.len(),
            ticks.len()
        ));
    }
    if jobs.len() < 4 {
        failures.push(format!("act 3: only {} ticks fired in {RUN:?}", jobs.len()));
    }
    if most_at_once > i64::from(LIMIT) {
        failures.push(format!(
            "act 3: {most_at_once} of the queue's jobs were held at once, past its limit of {LIMIT}"
        ));
    }
    let succeeded = jobs
        .iter()
        .filter(|j| j.state() == JobState::Succeeded)
        .count();
    say(format!(
        "act 3: {} ticks enqueued {} jobs, each tick once (the schedulers fired {} and {}); \
         at most {most_at_once} held at once against a limit of {LIMIT}; {succeeded} done, the \
         rest waited their turn",
        ticks.len(),
        jobs.len(),
        fired_by.first().copied().unwrap_or(0),
        fired_by.get(1).copied().unwrap_or(0),
    ));
    Ok(ScheduleAct {
        jobs: jobs.len(),
        ticks: ticks.len(),
        fired_by,
        most_at_once: usize::try_from(most_at_once).unwrap_or(0),
        limit: LIMIT,
        failures,
    })
}

impl ScheduleAct {
    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "jobs": self.jobs,
            "distinct_ticks": self.ticks,
            "fired_by_each_scheduler": self.fired_by,
            "most_held_at_once": self.most_at_once,
            "limit": self.limit,
        })
    }
}
