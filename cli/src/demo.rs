//! `leasehold demo`: three worker pools on a real store file, in real time, with short leases,
//! telling the lease story as it happens:
//! * a pool killed mid-job: its leases expire and the reaper takes the jobs back, within
//!   lease + reaper interval of their last renewal;
//! * a worker paused past its lease: its job is taken over and completed elsewhere, and when
//!   it wakes its late commit is refused by the fence;
//! * a job that hangs while its heartbeat stays healthy: revoked as stalled;
//! * a pool shut down gracefully: its unfinished jobs released and picked up at once.
//!
//! Each thumbnail saves a checkpoint after each of its steps: a job the killed pool held
//! resumes, in its next attempt, from the step its checkpoint says, not from the start.
//!
//! Every handler commits its effect (a counter per job in the application's own table) in
//! the completion's transaction, so the final table can prove "executed possibly twice,
//! committed exactly once". Exits non-zero if an invariant fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};
use indicatif::{ProgressBar, ProgressStyle};
use leasehold::{
    Error, JobContext, JobError, JobId, JobState, NewJob, Outcome, Output, Reaper, ReclaimPath,
    RedbWrites, Store, StoreTime, WorkerPool,
};
use leasehold::{JobStore, ReadJobs};
use parking_lot::Mutex;
use redb::{ReadableTable, TableDefinition};

use super::demo_report::Report;

const LEASE: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(600);
const REAPER_EVERY: Duration = Duration::from_millis(500);
const STALL: Duration = Duration::from_millis(1500);
const WORK_STEPS: u32 = 6;
const WORK_STEP: Duration = Duration::from_millis(25);
const GRACE: Duration = Duration::from_millis(20);
/// Allowed on top of the detection bound for thread scheduling on a busy machine.
const SCHEDULING_SLACK: Duration = Duration::from_millis(100);
const DEADLINE: Duration = Duration::from_secs(25);

const THUMBS: &str = "thumbnails";
const SPECIAL: &str = "special";
/// The application's own table: how many times each job's effect was committed.
const EFFECTS: TableDefinition<u64, u32> = TableDefinition::new("demo.effects");

pub fn run(json: bool, jobs: usize) -> Result<ExitCode, Error> {
    let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Storage(redb::Error::Io(e)))?;
    let result = Demo::new(&dir.join("demo.redb"), json).and_then(|d| d.story(jobs.max(40)));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// What the handlers share with the narrator.
struct Script {
    executions: Mutex<HashMap<u64, u32>>,
    /// The steps each attempt of a job saved as done: (job, attempt) -> step.
    saved: Mutex<HashMap<(u64, u32), u32>>,
    /// The step each job resumed from, read from its checkpoint (jobs that started afresh
    /// are not here).
    resumed: Mutex<HashMap<u64, u32>>,
    paused_started: Sender<JobId>,
    gate: Receiver<()>,
}

fn handler(
    script: Arc<Script>,
) -> impl Fn(&JobContext) -> Result<Output<RedbWrites>, JobError> + Send + Sync {
    move |ctx| {
        *script.executions.lock().entry(ctx.job().0).or_default() += 1;
        match (ctx.payload(), ctx.attempt().0) {
            (b"pause", 1) => {
                let _ = script.paused_started.send(ctx.job());
                let _ = script.gate.recv(); // stopped here, as a SIGSTOPped process would be
            }
            (b"hang", 1) => loop {
                ctx.sleep(Duration::from_millis(50))?; // alive, renewing, but never progressing
            },
            _ => {
                // Resumes from the last step an attempt before it saved, if any.
                let checkpoint = ctx.last_checkpoint().map_err(JobError::new)?;
                let from = checkpoint.map_or(0, |c| c.data().first().map_or(0, |&s| u32::from(s)));
                if from > 0 {
                    script.resumed.lock().insert(ctx.job().0, from);
                }
                for step in from + 1..=WORK_STEPS {
                    ctx.sleep(WORK_STEP)?;
                    ctx.tick();
                    let done = u8::try_from(step).unwrap_or(u8::MAX);
                    ctx.save_checkpoint(&[done]).map_err(JobError::new)?;
                    let attempt = (ctx.job().0, ctx.attempt().0);
                    script.saved.lock().insert(attempt, step);
                }
            }
        }
        let job = ctx.job().0;
        let output = format!("done by {}", ctx.lease().worker);
        Ok(Output::with_writes(output, move |txn| {
            let mut effects = txn.open_table(EFFECTS)?;
            let n = effects.get(job)?.map(|v| v.value()).unwrap_or(0);
            effects.insert(job, n + 1)?;
            Ok::<(), leasehold::Error>(())
        }))
    }
}

struct Demo {
    store: Store,
    t0: StoreTime,
    json: bool,
    bar: ProgressBar,
    events: Vec<(u64, String)>,
    failures: Vec<String>,
}

impl Demo {
    fn new(path: &std::path::Path, json: bool) -> Result<Demo, Error> {
        let store = Store::builder(path)
            .retry_policy(
                leasehold::RetryPolicy::exponential(
                    Duration::from_millis(100),
                    Duration::from_secs(1),
                )
                .jitter(0.2),
            )
            .open()?;
        let bar = if json {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} jobs committed {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Ok(Demo {
            t0: store.now(),
            store,
            json,
            bar,
            events: Vec::new(),
            failures: Vec::new(),
        })
    }

    /// Says where the killed pool's jobs resumed: each from the last step its killed attempt
    /// saved, in the attempt after it.
    fn resumed(&mut self, killed: &[leasehold::Lease], script: &Script) {
        let mut told = Vec::new();
        for l in killed {
            let left = script.saved.lock().get(&(l.job.0, l.attempt.0)).copied();
            let resumed = script.resumed.lock().get(&l.job.0).copied();
            match (left, resumed) {
                (Some(left), Some(at)) if left == at => {
                    told.push(format!("job {} at step {at} of {WORK_STEPS}", l.job));
                }
                (None, None) => told.push(format!("job {} from the start (no step saved)", l.job)),
                (left, resumed) => self.fail(format!(
                    "job {}: edge-a's attempt saved step {left:?}, the next resumed at {resumed:?}",
                    l.job
                )),
            }
        }
        if !told.is_empty() {
            self.say(format!(
                "edge-a's jobs resumed from their checkpoints: {}",
                told.join(", ")
            ));
        }
    }

    fn elapsed(&self) -> Duration {
        self.store.now().saturating_since(self.t0)
    }

    fn say(&mut self, text: String) {
        let ms = self.elapsed().as_millis() as u64;
        let line = format!("{:>7.3}s  {text}", ms as f64 / 1000.0);
        if self.json {
        } else if self.bar.is_hidden() {
            println!("{line}"); // not a terminal: no bar to print around
        } else {
            self.bar.println(line);
        }
        self.events.push((ms, text));
    }

    fn fail(&mut self, text: String) {
        self.say(format!("INVARIANT FAILED: {text}"));
        self.failures.push(text);
    }

    /// Polls (a UI refresh, not a timing assertion) until `cond` holds or the demo's deadline.
    fn wait(&mut self, what: &str, mut cond: impl FnMut(&mut Demo) -> bool) -> bool {
        while !cond(self) {
            if self.elapsed() > DEADLINE {
                self.fail(format!("timed out waiting for {what}"));
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    fn pool(
        &self,
        queue: &str,
        id: &str,
        n: usize,
        script: &Arc<Script>,
    ) -> Result<WorkerPool, Error> {
        WorkerPool::builder(self.store.clone(), queue)
            .worker_id(id)
            .concurrency(n)
            .lease(LEASE)
            .heartbeat_every(HEARTBEAT)
            .stall_timeout(STALL)
            .shutdown_grace(Duration::from_secs(5))
            .start(handler(script.clone()))
    }

    fn story(mut self, jobs: usize) -> Result<ExitCode, Error> {
        if !self.json {
            println!("leasehold demo: three worker pools on a real store file, in real time");
            println!(
                "lease {LEASE:?}, heartbeat every {HEARTBEAT:?}, reaper every {REAPER_EVERY:?}, stall timeout {STALL:?}\n"
            );
        }
        let store = self.store.clone();
        store.enqueue_batch((0..jobs).map(|i| NewJob::new(THUMBS, format!("photo-{i}.jpg"))))?;
        let paused_job = store.enqueue(NewJob::new(SPECIAL, "pause").priority(-10))?;
        let hung_job = store.enqueue(NewJob::new(SPECIAL, "hang"))?;
        let total = jobs as u64 + 2;
        self.bar.set_length(total);
        self.say(format!("enqueued {jobs} thumbnails and 2 special jobs"));
        let reaper = Reaper::start(store.clone(), REAPER_EVERY)?;

        let (paused_tx, paused_rx) = bounded(1);
        let (gate_tx, gate_rx) = bounded::<()>(1);
        let script = Arc::new(Script {
            executions: Mutex::new(HashMap::new()),
            saved: Mutex::new(HashMap::new()),
            resumed: Mutex::new(HashMap::new()),
            paused_started: paused_tx,
            gate: gate_rx,
        });

        // The worker that will be paused past its lease.
        let sleeper = self.pool(SPECIAL, "edge-paused", 1, &script)?;
        match paused_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(job) => {
                sleeper.pause();
                self.say(format!(
                    "edge-paused claimed job {job} and is paused (no heartbeats, no progress)"
                ));
            }
            Err(_) => self.fail("edge-paused never started its job".into()),
        }

        let a = self.pool(THUMBS, "edge-a", 4, &script)?;
        let b = self.pool(THUMBS, "edge-b", 4, &script)?;
        let c = self.pool(THUMBS, "edge-c", 4, &script)?;
        let special = self.pool(SPECIAL, "edge-special", 2, &script)?;
        self.say("started pools edge-a, edge-b, edge-c (4 workers each) and edge-special".into());

        // Kill edge-a mid-job.
        self.wait("edge-a to hold 4 jobs", |_| a.stats().in_flight == 4);
        std::thread::sleep(WORK_STEP * 2);
        let killed = a.in_flight();
        a.abandon();
        let mut expiries = BTreeMap::new();
        for l in &killed {
            if let Some(expires_at) = store
                .job(l.job)?
                .and_then(|j| j.lease().map(|lease| lease.expires_at()))
            {
                expiries.insert(l.job, expires_at);
            }
        }
        let list = killed
            .iter()
            .map(|l| l.job.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.say(format!(
            "edge-a is killed mid-job holding jobs {list}: no release, no more heartbeats"
        ));

        // Let edge-b work a while, then shut it down gracefully.
        self.wait("edge-b to be busy", |d| {
            d.elapsed() > Duration::from_millis(1200)
        });
        let b_held = b.in_flight();
        let report = b.shutdown(GRACE);
        self.say(format!(
            "edge-b shuts down with {} jobs in flight and a {GRACE:?} grace: {} finished, {} released",
            report.in_flight,
            report.in_flight - report.released,
            report.released
        ));

        let mut watch = Watch {
            expiries,
            pending_kills: killed.iter().map(|l| l.job).collect(),
            pending_releases: b_held.iter().map(|l| l.job).collect(),
            paused_job,
            hung_job,
            gate: gate_tx.clone(),
            gate_open: false,
            fence_seen: false,
            stall_seen: false,
            worst_kill_delay: Duration::ZERO,
        };
        let done = self.wait("every job to be committed", |d| {
            let Ok(stats) = d.store.stats() else {
                return false;
            };
            let succeeded = stats.total(JobState::Succeeded);
            d.bar.set_position(succeeded);
            watch.kills(d);
            watch.releases(d);
            watch.paused(d, &sleeper);
            watch.stall(d);
            succeeded == total && watch.all_seen()
        });
        let worst_kill_delay = watch.worst_kill_delay;
        self.resumed(&killed, &script);
        if done {
            self.bar.finish();
        } else {
            self.bar.abandon();
        }
        let _ = gate_tx.try_send(());
        for pool in [&c, &special, &sleeper] {
            pool.resume();
            pool.shutdown(Duration::from_secs(5));
        }
        drop(reaper);
        let dir = match self.store.path().parent() {
            Some(d) => d.to_owned(),
            None => std::path::PathBuf::from("."),
        };
        let act = super::demo_processes::act(&dir, 60, |line| self.say(line))?;
        let schedules = super::demo_schedules::act(&dir, |line| self.say(line))?;
        let workflow = super::demo_workflow::act(&dir, |line| self.say(line))?;
        self.summary(
            &script,
            &[&a, &b, &c, &special, &sleeper],
            worst_kill_delay,
            (act, schedules, workflow),
        )
    }

    fn summary(
        mut self,
        script: &Script,
        pools: &[&WorkerPool],
        worst_kill_delay: Duration,
        (processes, schedules, workflow): (
            super::demo_processes::ProcessAct,
            super::demo_schedules::ScheduleAct,
            super::demo_workflow::WorkflowAct,
        ),
    ) -> Result<ExitCode, Error> {
        let stats = self.store.stats()?;
        let (mut committed_once, mut duplicate_commits) = (0u64, 0u64);
        {
            let read = self.store.begin_read()?;
            let effects = read.open_table(EFFECTS).map_err(redb::Error::from)?;
            for entry in effects.iter().map_err(redb::Error::from)? {
                let n = entry.map_err(redb::Error::from)?.1.value();
                if n == 1 {
                    committed_once += 1;
                } else {
                    duplicate_commits += 1;
                }
            }
        }
        let ran_twice = script
            .executions
            .lock()
            .values()
            .filter(|n| **n > 1)
            .count() as u64;
        let worst_detection_delay = stats.counters.worst_detection_delay.max(worst_kill_delay);
        let report = Report {
            enqueued: stats.queues.values().map(|q| q.total()).sum(),
            succeeded: stats.total(JobState::Succeeded),
            committed_once,
            duplicate_commits,
            ran_twice,
            counters: stats.counters,
            rejected: pools.iter().map(|p| p.stats().rejected_writes).sum(),
            worst_detection_delay,
            bound: LEASE + REAPER_EVERY,
            slack: SCHEDULING_SLACK,
            check_problems: self.store.check()?.problems,
            elapsed: self.elapsed(),
            processes,
            schedules,
            workflow,
        };
        for broken in report.broken() {
            self.fail(broken);
        }
        report.print(self.json, &self.failures, &self.events);
        Ok(if self.failures.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

/// What the narrator is waiting to see, and what it has seen.
struct Watch {
    expiries: BTreeMap<JobId, StoreTime>,
    pending_kills: BTreeSet<JobId>,
    pending_releases: BTreeSet<JobId>,
    paused_job: JobId,
    hung_job: JobId,
    gate: Sender<()>,
    gate_open: bool,
    fence_seen: bool,
    stall_seen: bool,
    worst_kill_delay: Duration,
}

impl Watch {
    fn all_seen(&self) -> bool {
        self.pending_kills.is_empty()
            && self.pending_releases.is_empty()
            && self.fence_seen
            && self.stall_seen
    }

    /// The killed pool's jobs: when their leases expired and how they came back.
    fn kills(&mut self, d: &mut Demo) {
        let bound = LEASE + REAPER_EVERY;
        for job in self.pending_kills.clone() {
            let Ok(history) = d.store.history(job) else {
                continue;
            };
            let Some(Outcome::LeaseExpired { path, overdue }) =
                history.first().and_then(|r| r.outcome().cloned())
            else {
                continue;
            };
            self.pending_kills.remove(&job);
            // The lease was last renewed one lease length before it expired.
            let delay = LEASE + overdue;
            self.worst_kill_delay = self.worst_kill_delay.max(delay);
            let expired = self.expiries.get(&job).map(|t| t.saturating_since(d.t0));
            let how = match path {
                ReclaimPath::Reaper => "reclaimed by the reaper",
                ReclaimPath::Takeover => "taken over by a claimer",
                ReclaimPath::Recovery => "recovered at open",
                ReclaimPath::ProcessDied => "taken back when its process died",
                _ => "taken back",
            };
            d.say(format!(
                "job {job}: edge-a's lease expired at {}; {how} {} later: detection delay {} (bound {})",
                secs(expired.unwrap_or_default()),
                secs(overdue),
                secs(delay),
                secs(bound)
            ));
            if delay > bound + SCHEDULING_SLACK {
                d.fail(format!(
                    "job {job} detection delay {delay:?} over the bound {bound:?}"
                ));
            }
        }
    }

    /// The gracefully stopped pool's released jobs: how soon someone else took them.
    fn releases(&mut self, d: &mut Demo) {
        for job in self.pending_releases.clone() {
            let Ok(history) = d.store.history(job) else {
                continue;
            };
            match history
                .iter()
                .position(|r| r.outcome() == Some(&Outcome::Released))
            {
                Some(i) if history.len() > i + 1 => {
                    self.pending_releases.remove(&job);
                    let next = &history[i + 1];
                    let released_at = history[i].ended_at().unwrap_or(next.claimed_at());
                    d.say(format!(
                        "job {job}: released by edge-b, picked up by {} {} later (no wait for its lease)",
                        next.worker(),
                        secs(next.claimed_at().saturating_since(released_at))
                    ));
                }
                None if history
                    .iter()
                    .any(|r| r.outcome() == Some(&Outcome::Succeeded)) =>
                {
                    self.pending_releases.remove(&job); // it finished within the grace
                }
                _ => {}
            }
        }
    }

    /// The paused worker: once its job is done elsewhere, wake it and watch the fence.
    fn paused(&mut self, d: &mut Demo, sleeper: &WorkerPool) {
        let job = self.paused_job;
        let succeeded = matches!(d.store.job(job), Ok(Some(j)) if j.state() == JobState::Succeeded);
        if !self.gate_open && succeeded {
            let history = d.store.history(job).unwrap_or_default();
            if let (Some(first), Some(last)) = (history.first(), history.last()) {
                let how = first
                    .outcome()
                    .as_ref()
                    .map(|o| o.to_string())
                    .unwrap_or_default();
                d.say(format!(
                    "job {job}: taken from the paused edge-paused ({how}) and completed by {}",
                    last.worker()
                ));
            }
            let _ = self.gate.send(());
            self.gate_open = true;
            d.say(format!(
                "edge-paused wakes up and tries to commit job {job} attempt #1"
            ));
        }
        if self.gate_open && !self.fence_seen && sleeper.stats().rejected_writes >= 1 {
            self.fence_seen = true;
            sleeper.resume();
            let attempt = d.store.job(job).ok().flatten().map_or(0, |j| j.attempt().0);
            d.say(format!(
                "  -> refused by the fence: job {job} is at attempt #{attempt}; the live worker's result stands"
            ));
        }
    }

    /// The hung job: caught as stalled while its heartbeat stayed healthy.
    fn stall(&mut self, d: &mut Demo) {
        if self.stall_seen {
            return;
        }
        let history = d.store.history(self.hung_job).unwrap_or_default();
        if let Some(run) = history
            .iter()
            .find(|r| r.outcome() == Some(&Outcome::Stalled))
        {
            self.stall_seen = true;
            d.say(format!(
                "job {}: {} kept renewing but made no progress for {}: revoked as stalled (retried later)",
                self.hung_job,
                run.worker(),
                secs(STALL)
            ));
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
