//! A store in memory: the lease protocol over plain maps, for an application's tests (a
//! store with no file and no server) and as the proof that an engine is only records. It
//! keeps every rule the other engines keep, in one process; nothing survives the process.
//!
//! Each write transaction works on a copy of the state, kept if it commits: writers take
//! turns, a refusal by the fence keeps only its counter, and any other error leaves the
//! state as it was. Searches scan the maps (a test's store is small), where the other
//! engines keep indexes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::backend::{AnyWrites, LeaseBackend, Step};
use crate::clock::{Clock, ManualClock, StoreClock};
use crate::engine::Backend;
use crate::error::{Error, Result};
use crate::ids::{Attempt, JobId, StoreTime};
use crate::job::{Job, JobRecord, JobState, Outcome, Run, RunRecord};
use crate::job_store::{JobStore, ReadJobs};
use crate::lease::Lease;
use crate::notify::Notifier;
use crate::protocol::{HeldSchedule, Inserted, Policy, Records};
use crate::query::{JobFilter, JobOrder, QueueTiming};
use crate::queue::{QueueRecord, QueueSettings, ServedMarks};
use crate::report::{CheckReport, ReaperPass};
use crate::schedule::{ScheduleInfo, ScheduleRecord};
use crate::stats::{Counters, Stats};

/// A store in memory (see the module's documentation). Clones share the store.
#[derive(Clone, Debug)]
pub struct MemoryStore(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// The state, and the writer's seat (held through a write transaction; reads go on).
    state: Arc<(RwLock<State>, Mutex<()>)>,
    clock: StoreClock,
    policy: Policy,
    notifier: Notifier,
    served: ServedMarks,
}

#[derive(Clone, Debug, Default)]
struct State {
    jobs: BTreeMap<JobId, JobRecord>,
    payloads: BTreeMap<JobId, Vec<u8>>,
    outputs: BTreeMap<JobId, Vec<u8>>,
    runs: BTreeMap<(JobId, Attempt), RunRecord>,
    queues: BTreeMap<String, QueueRecord>,
    schedules: BTreeMap<String, ScheduleRecord>,
    failures: BTreeMap<String, String>,
    counters: Counters,
    next_id: u64,
    last_pass: Option<ReaperPass>,
}

impl MemoryStore {
    /// A store on `clock` (a [`ManualClock`] in a test) with the default policy.
    pub fn new(clock: impl Clock) -> MemoryStore {
        MemoryStore::with_policy(clock, Policy::default())
    }

    /// A store on a manual clock, and the clock.
    pub fn manual() -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new();
        (MemoryStore::new(clock.clone()), clock)
    }

    #[doc(hidden)]
    pub fn configured(
        clock: impl Clock,
        retry: crate::RetryPolicy,
        default_max_attempts: u32,
        max_payload: usize,
        reap_batch: usize,
        retention: Option<Duration>,
    ) -> Result<MemoryStore> {
        let policy = Policy {
            retry,
            default_max_attempts,
            max_payload,
            reap_batch,
            retention,
        };
        policy.check()?;
        Ok(MemoryStore::with_policy(clock, policy))
    }

    fn with_policy(clock: impl Clock, policy: Policy) -> MemoryStore {
        let (clock, _) = StoreClock::resume(Arc::new(clock), None, StoreTime::ZERO);
        let state = State {
            next_id: 1,
            ..State::default()
        };
        MemoryStore(Arc::new(Inner {
            state: Arc::new((RwLock::new(state), Mutex::new(()))),
            clock,
            policy,
            notifier: Notifier::default(),
            served: ServedMarks::default(),
        }))
    }

    /// For the suites: this store's jobs under `other`'s policy, as a process that opens a
    /// store with other settings sees them.
    #[doc(hidden)]
    pub fn with_policy_of(&self, other: &MemoryStore) -> MemoryStore {
        MemoryStore(Arc::new(Inner {
            state: self.0.state.clone(),
            clock: self.0.clock.resumed(),
            policy: other.0.policy.clone(),
            notifier: Notifier::default(),
            served: ServedMarks::default(),
        }))
    }

    /// For the suites: rewrites job `id`'s attempt counter, as a store that ran that many
    /// claims would hold it.
    #[doc(hidden)]
    pub fn forge_attempt(&self, id: JobId, attempt: u32) {
        if let Some(job) = self.0.state.0.write().jobs.get_mut(&id) {
            job.attempt = Attempt(attempt);
        }
    }

    /// [`JobStore::wait_for_work`] for async code (see
    /// [`Store::wait_for_work_async`](crate::Store::wait_for_work_async)).
    #[cfg(feature = "tokio")]
    pub async fn wait_for_work_async(&self, queue: &str, seen: u64, timeout: Duration) -> u64 {
        match crate::asynchronous::changed(&self.0.notifier, queue, seen, timeout).await {
            Some(generation) => generation,
            None => self.work_generation(queue),
        }
    }

    /// For the suites: runs `hold` with the writer's seat taken, as a store that stopped
    /// answering writes (reads go on).
    #[doc(hidden)]
    pub fn hold_writes(&self, hold: impl FnOnce()) {
        let _seat = self.0.state.1.lock();
        hold();
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.0.state.0.read())
    }
}

/// One write transaction: a copy of the state, and the queues it readied.
struct Tx<'s> {
    s: State,
    now: StoreTime,
    policy: &'s Policy,
    readied: BTreeSet<String>,
}

impl Records for Tx<'_> {
    fn policy(&self) -> &Policy {
        self.policy
    }
    fn now(&mut self) -> Result<StoreTime> {
        Ok(self.now)
    }
    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        Ok(self.s.jobs.get(&id).cloned())
    }
    fn insert(&mut self, job: JobRecord, payload: &[u8]) -> Result<Inserted> {
        let id = JobId(self.s.next_id);
        self.s.next_id += 1;
        self.readied.insert(job.queue.clone());
        self.s.jobs.insert(id, JobRecord { id, ..job });
        self.s.payloads.insert(id, payload.to_vec());
        Ok(Inserted::Made(id))
    }
    fn save(&mut self, old: &JobRecord, new: &JobRecord) -> Result<()> {
        let moved = (old.state.is_waiting(), old.run_at, old.priority);
        if new.state.is_waiting() && moved != (true, new.run_at, new.priority) {
            self.readied.insert(new.queue.clone());
        }
        self.s.jobs.insert(new.id, new.clone());
        Ok(())
    }
    fn renew(&mut self, renewed: &JobRecord) -> Result<()> {
        self.s.jobs.insert(renewed.id, renewed.clone());
        Ok(())
    }
    fn payload(&mut self, id: JobId) -> Result<Vec<u8>> {
        let payload = self.s.payloads.get(&id).cloned();
        payload.ok_or_else(|| Error::Corrupt(format!("job {id} has no payload")))
    }
    fn keep_output(&mut self, id: JobId, output: &[u8]) -> Result<()> {
        self.s.outputs.insert(id, output.to_vec());
        Ok(())
    }
    fn record_run(&mut self, old: &JobRecord, run: &RunRecord) -> Result<()> {
        self.s.runs.insert((old.id, old.attempt), run.clone());
        Ok(())
    }
    fn run_outcome(&mut self, id: JobId, attempt: Attempt) -> Result<Option<Outcome>> {
        Ok(self
            .s
            .runs
            .get(&(id, attempt))
            .and_then(|r| r.outcome.clone()))
    }
    fn count(&mut self, counts: &Counters) -> Result<()> {
        self.s.counters.add(counts);
        Ok(())
    }
    fn readied(&mut self, queue: &str) -> Result<()> {
        self.readied.insert(queue.to_owned());
        Ok(())
    }
    fn key_holder(&mut self, queue: &str, key: &str) -> Result<Option<JobRecord>> {
        let holds = |j: &&JobRecord| {
            j.queue == queue && j.unique_key.as_deref() == Some(key) && crate::rules::keeps_key(j)
        };
        Ok(self.s.jobs.values().find(holds).cloned())
    }
    fn next_ready(&mut self, queue: &str, now: StoreTime) -> Result<Option<(i32, JobId)>> {
        let due = self
            .s
            .jobs
            .values()
            .filter(|j| j.queue == queue && j.state.is_waiting());
        let first = due
            .filter(|j| j.run_at <= now)
            .min_by_key(|j| (j.priority, j.run_at, j.id));
        Ok(first.map(|j| (j.priority, j.id)))
    }
    fn first_indexed_expiry(&mut self, queue: &str, bound: StoreTime) -> Result<Option<JobId>> {
        Ok(expiries(&self.s, Some(queue), bound).first().copied())
    }
    fn indexed_expiries(&mut self, bound: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        let mut ids = expiries(&self.s, None, bound);
        ids.truncate(limit);
        Ok(ids)
    }
    fn running(&mut self, queue: &str) -> Result<u64> {
        let running = self.s.jobs.values().filter(|j| j.queue == queue);
        Ok(running.filter(|j| j.state == JobState::Running).count() as u64)
    }
    fn finished(
        &mut self,
        from: (StoreTime, JobId),
        cutoff: StoreTime,
        limit: usize,
    ) -> Result<Vec<JobRecord>> {
        let mut done: Vec<_> = (self.s.jobs.values())
            .filter(|j| j.state.is_terminal())
            .filter_map(|j| Some(((j.finished_at?, j.id), j)))
            .filter(|(at, _)| *at >= from && at.0 <= cutoff)
            .collect();
        done.sort_by_key(|(at, _)| *at);
        Ok(done
            .into_iter()
            .take(limit)
            .map(|(_, j)| j.clone())
            .collect())
    }
    fn delete(&mut self, job: &JobRecord) -> Result<()> {
        self.s.jobs.remove(&job.id);
        self.s.payloads.remove(&job.id);
        self.s.outputs.remove(&job.id);
        self.s.runs.retain(|(id, _), _| *id != job.id);
        Ok(())
    }
    fn queue(&mut self, queue: &str, _lock: bool) -> Result<Option<QueueRecord>> {
        Ok(self.s.queues.get(queue).cloned())
    }
    fn save_queue(&mut self, queue: &str, record: &QueueRecord) -> Result<()> {
        self.s.queues.insert(queue.to_owned(), record.clone());
        Ok(())
    }
    fn schedules(&mut self) -> Result<Vec<HeldSchedule>> {
        let failure = |name: &String| self.s.failures.get(name).cloned();
        let all = self.s.schedules.iter();
        Ok(all
            .map(|(n, r)| (n.clone(), Ok(r.clone()), failure(n)))
            .collect())
    }
    fn schedule(&mut self, name: &str) -> Result<Option<ScheduleRecord>> {
        Ok(self.s.schedules.get(name).cloned())
    }
    fn save_schedule(&mut self, record: &ScheduleRecord) -> Result<()> {
        self.s.schedules.insert(record.name.clone(), record.clone());
        Ok(())
    }
    fn remove_schedule(&mut self, name: &str) -> Result<bool> {
        Ok(self.s.schedules.remove(name).is_some())
    }
    fn note_schedule_failure(&mut self, name: &str, failure: Option<&str>) -> Result<()> {
        match failure {
            Some(why) => self.s.failures.insert(name.to_owned(), why.to_owned()),
            None => self.s.failures.remove(name),
        };
        Ok(())
    }
}

/// The running jobs (of `queue`, or of all) whose indexed expiry is at or before `bound`, in
/// the order an expiry index holds them.
fn expiries(s: &State, queue: Option<&str>, bound: StoreTime) -> Vec<JobId> {
    let mut found: Vec<_> = (s.jobs.values())
        .filter(|j| j.state == JobState::Running && queue.is_none_or(|q| j.queue == q))
        .filter_map(|j| Some((j.lease.as_ref()?.indexed_expiry, j.id)))
        .filter(|(at, _)| *at <= bound)
        .collect();
    found.sort();
    found.into_iter().map(|(_, id)| id).collect()
}

/// The earliest run time of a waiting job of `queue`.
fn earliest_run_at(s: &State, queue: &str) -> Option<StoreTime> {
    let waiting = s
        .jobs
        .values()
        .filter(|j| j.queue == queue && j.state.is_waiting());
    waiting.map(|j| j.run_at).min()
}

impl ReadJobs for MemoryStore {
    fn now(&self) -> Result<StoreTime> {
        Ok(self.0.clock.now())
    }
    fn job(&self, id: JobId) -> Result<Option<Job>> {
        Ok(self.read(|s| s.jobs.get(&id).cloned().map(Job)))
    }
    fn history(&self, id: JobId) -> Result<Vec<Run>> {
        Ok(self.read(|s| {
            let ended = s.runs.range((id, Attempt(0))..=(id, Attempt(u32::MAX)));
            let mut runs: Vec<_> = ended.map(|(_, r)| Run(r.clone())).collect();
            runs.extend(s.jobs.get(&id).and_then(JobRecord::current_run).map(Run));
            runs
        }))
    }
    fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        Ok(self.read(|s| s.payloads.get(&id).cloned()))
    }
    fn output(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        Ok(self.read(|s| s.outputs.get(&id).cloned()))
    }
    fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let now = self.0.clock.now();
        let mut out: Vec<JobRecord> = self.read(|s| {
            let admitted = s.jobs.values().filter(|j| filter.admits(j, now));
            admitted.cloned().collect()
        });
        match filter.order {
            JobOrder::Oldest => {}
            JobOrder::Newest => out.reverse(),
            JobOrder::Priority => out.sort_by_key(|j| (j.priority, j.run_at, j.id)),
            JobOrder::Updated => out.sort_by_key(|j| std::cmp::Reverse((j.updated_at, j.id))),
        }
        out.truncate(filter.limit.unwrap_or(usize::MAX));
        Ok(out.into_iter().map(Job).collect())
    }
    fn timing(&self, queue: &str) -> Result<QueueTiming> {
        let now = self.0.clock.now();
        Ok(self.read(|s| {
            let expiries: Vec<_> = (s.jobs.values())
                .filter(|j| j.queue == queue && j.state == JobState::Running)
                .filter_map(|j| j.lease.as_ref().map(|l| l.indexed_expiry))
                .collect();
            QueueTiming {
                earliest_run_at: earliest_run_at(s, queue),
                earliest_expiry: expiries.iter().copied().min(),
                next_expiry: expiries.into_iter().filter(|at| *at > now).min(),
            }
        }))
    }
    fn stats(&self) -> Result<Stats> {
        let now = self.0.clock.now();
        Ok(self.read(|s| {
            let mut stats = Stats {
                now,
                counters: s.counters.clone(),
                last_reaper_pass: s.last_pass.clone(),
                ..Stats::default()
            };
            for j in s.jobs.values() {
                let counts = stats.queues.entry(j.queue.clone()).or_default();
                *counts.by_state.entry(j.state).or_default() += 1;
            }
            for (queue, record) in &s.queues {
                let counts = stats.queues.entry(queue.clone()).or_default();
                counts.served_at = record.served_at;
                counts.paused = record.paused;
                counts.limits = record.limits;
            }
            stats
        }))
    }
    fn queue_settings(&self, queue: &str) -> Result<QueueSettings> {
        let record = self.read(|s| s.queues.get(queue).cloned());
        Ok(
            record.map_or_else(QueueSettings::default, |r| QueueSettings {
                paused: r.paused,
                limits: r.limits,
            }),
        )
    }
    fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        Ok(self.read(|s| {
            let failure = |name: &String| s.failures.get(name).cloned();
            let all = s.schedules.iter();
            all.map(|(n, r)| ScheduleInfo(r.clone(), failure(n)))
                .collect()
        }))
    }
    /// A running job has a lease and no other has, and history has one record per ended
    /// attempt.
    fn check(&self) -> Result<CheckReport> {
        Ok(self.read(|s| {
            let mut problems = Vec::new();
            for j in s.jobs.values() {
                let running = j.state == JobState::Running;
                if running != j.lease.is_some() {
                    let state = j.state.name();
                    problems.push(format!(
                        "job {} is {state} with a lease: {}",
                        j.id, !running
                    ));
                }
                let ended = u64::from(j.attempt.0) - u64::from(running);
                let runs = s.runs.range((j.id, Attempt(0))..=(j.id, Attempt(u32::MAX)));
                let recorded = runs.count() as u64;
                if recorded != ended {
                    problems.push(format!(
                        "job {} has history of {recorded} of its {ended} ended attempts",
                        j.id
                    ));
                }
            }
            let jobs = s.jobs.len() as u64;
            CheckReport { jobs, problems }
        }))
    }
}

impl LeaseBackend for MemoryStore {
    fn write_step(&self, mut step: Step) -> Result<Box<dyn std::any::Any + Send>> {
        let _seat = self.0.state.1.lock();
        let now = self.0.clock.now();
        let policy = &self.0.policy;
        let mut tx = Tx {
            s: self.0.state.0.read().clone(),
            now,
            policy,
            readied: BTreeSet::new(),
        };
        let answer = step(&mut tx);
        let mut state = self.0.state.0.write();
        match &answer {
            Ok(_) => *state = tx.s,
            // A refusal wrote nothing but its counter.
            Err(e) if e.is_refusal() => state.counters = tx.s.counters,
            Err(_) => return answer,
        }
        drop(state);
        self.0.notifier.notify(&tx.readied);
        answer
    }
    fn policy(&self) -> &Policy {
        &self.0.policy
    }
    fn clock(&self) -> StoreTime {
        self.0.clock.now()
    }
    fn wake_queue(&self, queue: &str) {
        self.0.notifier.notify([&queue.to_owned()]);
    }
    fn idle_poll(&self) -> Option<Duration> {
        None
    }
    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        let now = self.0.clock.now();
        Ok(self.read(|s| {
            let expiry = expiries(s, Some(queue), StoreTime(u64::MAX))
                .first()
                .copied();
            let expiry =
                expiry.and_then(|id| Some(s.jobs.get(&id)?.lease.as_ref()?.indexed_expiry));
            let due = [earliest_run_at(s, queue), expiry]
                .into_iter()
                .flatten()
                .min();
            let Some(record) = s.queues.get(queue) else {
                return due;
            };
            let running = s
                .jobs
                .values()
                .filter(|j| j.queue == queue && j.state == JobState::Running);
            let room = crate::rules::claim_room(Some(record), running.count() as u64, now);
            crate::rules::next_look(room, due)
        }))
    }
    fn marks_due(&self, queues: &mut dyn Iterator<Item = &str>) -> Vec<String> {
        self.0.served.due(queues, self.0.clock.now())
    }
    fn complete_with_writes(
        &self,
        _: &Lease,
        _: &[u8],
        _: Option<u64>,
        _: AnyWrites,
    ) -> Result<()> {
        Err(crate::ConfigError::WritesForAnotherStore {
            given: "an application's writes",
            store: "a store in memory, which has no tables of the application's",
        }
        .into())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn note_reaper_pass(&self, pass: &ReaperPass) -> Result<()> {
        self.0.state.0.write().last_pass = Some(pass.clone());
        Ok(())
    }
}

impl JobStore for MemoryStore {
    fn work_generation(&self, queue: &str) -> u64 {
        self.0.notifier.generation(queue)
    }
    fn wait_for_work(&self, queue: &str, seen: u64, timeout: Duration) -> u64 {
        self.0.notifier.wait(queue, seen, timeout)
    }
    fn wake_all(&self) {
        self.0.notifier.notify_all();
    }
}

impl crate::engine::sealed::Sealed for MemoryStore {}

impl crate::engine::Engine for MemoryStore {
    /// None: a store in memory has no tables of the application's.
    type Writes = std::convert::Infallible;
}

impl From<MemoryStore> for Backend {
    fn from(store: MemoryStore) -> Backend {
        Backend(Arc::new(store))
    }
}
