//! The demo's final report: the figures that prove the lease story held (or did not), the
//! invariants they must meet, and their printing as a table or as JSON.

use std::time::Duration;

use leasehold::Counters;

use super::demo_processes::ProcessAct;
use super::demo_schedules::ScheduleAct;
use super::demo_workflow::WorkflowAct;

/// What the demo measured once every pool had stopped.
pub(super) struct Report {
    pub enqueued: u64,
    pub succeeded: u64,
    /// Jobs whose effect (a counter in the application's own table) was committed once.
    pub committed_once: u64,
    /// Jobs whose effect was committed more than once: must be none.
    pub duplicate_commits: u64,
    /// Jobs whose handler ran more than once: expected, since failures were injected.
    pub ran_twice: u64,
    pub counters: Counters,
    /// Results the pools withheld or had refused by the fence.
    pub rejected: u64,
    pub worst_detection_delay: Duration,
    /// Lease plus reaper interval.
    pub bound: Duration,
    /// Scheduling slack allowed on top of the bound (real threads on a busy machine).
    pub slack: Duration,
    /// The integrity check's problems (none if clean).
    pub check_problems: Vec<String>,
    pub elapsed: Duration,
    /// The second act: worker processes that die alone.
    pub processes: ProcessAct,
    /// The third act: a periodic job and a limit across processes.
    pub schedules: ScheduleAct,
    /// The fourth act: jobs that wait for jobs, through process kills.
    pub workflow: WorkflowAct,
}

impl Report {
    /// Every invariant the figures break, each as a sentence.
    pub fn broken(&self) -> Vec<String> {
        let mut broken = Vec::new();
        if self.committed_once != self.enqueued {
            broken.push(format!(
                "{} jobs committed exactly once, {} enqueued",
                self.committed_once, self.enqueued
            ));
        }
        if self.duplicate_commits != 0 {
            broken.push(format!(
                "{} jobs committed more than once",
                self.duplicate_commits
            ));
        }
        if self.succeeded != self.enqueued {
            broken.push(format!(
                "{} of {} jobs succeeded",
                self.succeeded, self.enqueued
            ));
        }
        if self.ran_twice == 0 {
            broken.push("no job ran twice: the failures were not exercised".into());
        }
        if self.worst_detection_delay > self.bound + self.slack {
            broken.push(format!(
                "worst detection delay {:?} over the bound {:?}",
                self.worst_detection_delay, self.bound
            ));
        }
        if !self.check_problems.is_empty() {
            broken.push(format!("integrity check: {:?}", self.check_problems));
        }
        broken.extend(self.processes.broken());
        broken.extend(self.schedules.failures.iter().cloned());
        broken.extend(self.workflow.broken());
        broken
    }

    /// Prints the report: JSON with the failures and the narrated events, or a table.
    pub fn print(&self, json: bool, failures: &[String], events: &[(u64, String)]) {
        let held = failures.is_empty();
        let c = &self.counters;
        let clean = self.check_problems.is_empty();
        if json {
            let report = serde_json::json!({
                "jobs_enqueued": self.enqueued,
                "succeeded": self.succeeded,
                "committed_exactly_once": self.committed_once,
                "executions_ran_more_than_once": self.ran_twice,
                "duplicate_commits": self.duplicate_commits,
                "reclaims": {
                    "reaper": c.reclaimed_by_reaper,
                    "takeover": c.reclaimed_by_takeover,
                    "release": c.released,
                    "at_open": c.reclaimed_at_open,
                    "process_died": c.reclaimed_process_died,
                },
                "stalled": c.stalled,
                "fenced_writes_rejected": c.fenced_writes_rejected,
                "results_withheld_or_refused": self.rejected,
                "worst_detection_delay_ms": self.worst_detection_delay.as_secs_f64() * 1000.0,
                "detection_bound_ms": self.bound.as_secs_f64() * 1000.0,
                "elapsed_ms": self.elapsed.as_secs_f64() * 1000.0,
                "integrity_check_clean": clean,
                "processes": self.processes.json(),
                "schedules": self.schedules.json(),
                "workflow": self.workflow.json(),
                "invariants_held": held,
                "failures": failures,
                "events": events.iter().map(|(ms, text)| serde_json::json!({"t_ms": ms, "text": text})).collect::<Vec<_>>(),
            });
            println!("{report:#}");
            return;
        }
        let rows: Vec<(&str, String, String)> = vec![
            ("jobs enqueued", self.enqueued.to_string(), String::new()),
            ("succeeded", self.succeeded.to_string(), String::new()),
            (
                "committed exactly once",
                self.committed_once.to_string(),
                "must equal enqueued".into(),
            ),
            (
                "executions that ran more than once",
                self.ran_twice.to_string(),
                "expected > 0".into(),
            ),
            (
                "duplicate commits",
                self.duplicate_commits.to_string(),
                "must be 0".into(),
            ),
            (
                "reclaims: reaper / takeover / release",
                format!(
                    "{} / {} / {}",
                    c.reclaimed_by_reaper, c.reclaimed_by_takeover, c.released
                ),
                String::new(),
            ),
            (
                "stalled leases revoked",
                c.stalled.to_string(),
                String::new(),
            ),
            (
                "writes refused by the fence",
                c.fenced_writes_rejected.to_string(),
                "late commits, releases of jobs no longer held".into(),
            ),
            (
                "worst detection delay",
                format!("{:.3}s", self.worst_detection_delay.as_secs_f64()),
                format!(
                    "bound: lease + reaper interval = {:.3}s",
                    self.bound.as_secs_f64()
                ),
            ),
            (
                "integrity check",
                if clean { "clean" } else { "FAILED" }.into(),
                String::new(),
            ),
            (
                "act 2: worker process killed -> jobs back",
                format!("{:.1}ms", self.processes.back_after.as_secs_f64() * 1000.0),
                format!(
                    "{} jobs it held; the lease path: {:.0}s",
                    self.processes.held,
                    self.processes.bound.as_secs_f64()
                ),
            ),
            (
                "act 2: committed exactly once",
                format!("{}/{}", self.processes.committed_once, self.processes.jobs),
                "must be all".into(),
            ),
            (
                "act 3: ticks, each enqueued once",
                format!("{}/{}", self.schedules.ticks, self.schedules.jobs),
                format!("two schedulers fired {:?}", self.schedules.fired_by),
            ),
            (
                "act 3: most held at once",
                self.schedules.most_at_once.to_string(),
                format!("limit across both processes: {}", self.schedules.limit),
            ),
            (
                "act 4: clips transcoded exactly once",
                format!("{}/{}", self.workflow.clips_once, self.workflow.clips),
                format!(
                    "each after its capture, through {} process kills",
                    self.workflow.killed
                ),
            ),
            (
                "act 4: bundles uploaded exactly once",
                format!("{}/{}", self.workflow.uploads_once, self.workflow.captures),
                "each after its capture's last clip".into(),
            ),
            (
                "elapsed",
                format!("{:.1}s", self.elapsed.as_secs_f64()),
                String::new(),
            ),
        ];
        println!();
        for (name, value, note) in rows {
            println!("  {name:<38} {value:>12}  {note}");
        }
        println!(
            "\n{}",
            if held {
                "all invariants held"
            } else {
                "INVARIANTS FAILED"
            }
        );
    }
}
