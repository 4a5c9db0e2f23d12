//! The demo's second act: worker processes that die alone. Three real worker processes (this
//! binary's `__pool`) share one store; one is killed with SIGKILL while it holds jobs, and a
//! surviving process takes them back in milliseconds, because the kernel released the dead
//! process's instance lock, rather than after the lease and a reaper pass.
//!
//! Wall time here is the demo's own measurement, never compared with store time.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{
    DEFAULT_LEASE, DEFAULT_REAPER_INTERVAL, Error, JobFilter, JobState, NewJob, Outcome, Sharing,
    Store,
};
use leasehold::{JobStore, ReadJobs};

use super::helper::Helper;

const QUEUE: &str = "transcode";
const PROCESSES: usize = 3;

/// What the act measured.
pub(super) struct ProcessAct {
    pub jobs: u64,
    pub succeeded: u64,
    /// Jobs with exactly one successful attempt in their history.
    pub committed_once: u64,
    pub killed_pid: u32,
    /// Jobs the killed process held when it died.
    pub held: usize,
    /// From the SIGKILL to every job it held being claimable again.
    pub back_after: Duration,
    /// What the lease path would have taken: the default lease plus the reaper interval.
    pub bound: Duration,
    pub failures: Vec<String>,
}

/// Runs the act in `dir`, narrating through `say`.
pub(super) fn act(
    dir: &Path,
    jobs: usize,
    mut say: impl FnMut(String),
) -> Result<ProcessAct, Error> {
    let path = dir.join("processes.redb");
    let store = Store::builder(&path)
        .sharing(Sharing::MultiProcess)
        .open()?;
    store.enqueue_batch((0..jobs).map(|i| NewJob::new(QUEUE, format!("clip-{i}.mp4"))))?;
    let mut helpers = (0..PROCESSES)
        .map(|_| {
            Helper::start(
                &path,
                &[
                    "__pool",
                    "--queue",
                    QUEUE,
                    "--workers",
                    "2",
                    "--work-ms",
                    "40",
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pids: Vec<String> = helpers.iter().map(|h| h.pid().to_string()).collect();
    say(format!(
        "act 2: {PROCESSES} worker processes (pids {}) share one store file, 2 workers each",
        pids.join(", ")
    ));
    let mut failures = Vec::new();
    let victim = helpers.remove(0);
    let owner = format!("proc-{}", victim.pid());
    let held_by_victim = |store: &Store| -> Result<Vec<u64>, Error> {
        let running = store.jobs(&JobFilter {
            state: Some(JobState::Running),
            ..JobFilter::default()
        })?;
        Ok(running
            .iter()
            .filter(|j| j.lease().as_ref().is_some_and(|l| l.owner() == owner))
            .map(|j| j.id().0)
            .collect())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = held_by_victim(&store)?;
    while held.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        held = held_by_victim(&store)?;
    }
    let killed_pid = victim.pid();
    let mut generation = store.work_generation(QUEUE);
    let killed_at = Instant::now();
    victim.kill();
    while !held_by_victim(&store)?.is_empty() && killed_at.elapsed() < Duration::from_secs(30) {
        generation = store.wait_for_work(QUEUE, generation, Duration::from_millis(50));
    }
    let back_after = killed_at.elapsed();
    let bound = DEFAULT_LEASE + DEFAULT_REAPER_INTERVAL;
    say(format!(
        "process {killed_pid} is killed with SIGKILL holding jobs {held:?}: they are back in the \
         queue {:.1} ms later (its instance lock was released by the kernel), not after the \
         lease + reaper bound of {:.0} s",
        back_after.as_secs_f64() * 1000.0,
        bound.as_secs_f64()
    ));
    if held.is_empty() {
        failures.push("the killed process held no job when it died".into());
    }
    if back_after >= bound {
        failures.push(format!(
            "a dead process's jobs took {back_after:?} to come back"
        ));
    }
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in helpers {
        h.end();
    }
    let stats = store.stats()?;
    let mut committed_once = 0;
    for id in 1..=jobs as u64 {
        let successes = store
            .history(leasehold::JobId(id))?
            .iter()
            .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
            .count();
        if successes == 1 {
            committed_once += 1;
        }
    }
    let act = ProcessAct {
        jobs: jobs as u64,
        succeeded: stats.total(JobState::Succeeded),
        committed_once,
        killed_pid,
        held: held.len(),
        back_after,
        bound,
        failures,
    };
    say(format!(
        "act 2: {} of {} jobs succeeded, {} committed exactly once",
        act.succeeded, act.jobs, act.committed_once
    ));
    Ok(act)
}

impl ProcessAct {
    /// Every invariant the act broke.
    pub(super) fn broken(&self) -> Vec<String> {
        let mut broken = self.failures.clone();
        if self.succeeded != self.jobs || self.committed_once != self.jobs {
            broken.push(format!(
                "act 2: {} of {} jobs succeeded, {} committed exactly once",
                self.succeeded, self.jobs, self.committed_once
            ));
        }
        broken
    }

    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "committed_exactly_once": self.committed_once,
            "killed_pid": self.killed_pid,
            "jobs_held_when_killed": self.held,
            "kill_to_claimable_ms": self.back_after.as_secs_f64() * 1000.0,
            "lease_plus_reaper_bound_ms": self.bound.as_secs_f64() * 1000.0,
        })
    }
}
