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

use parking_lot::{Mutex, RwLock};

use crate::backend::{LeaseBackend, ReaperLooks, Step};
use crate::checkpoint::{Checkpoint, CheckpointRecord};
use crate::clock::{Clock, ManualClock, StoreClock};
use crate::endings::{EndCursor, EndRecord, Endings};
use crate::error::{Error, Result};
use crate::ids::{Attempt, GroupId, JobId, StoreTime};
use crate::job::{Job, JobRecord, Outcome, Run, RunRecord};
use crate::job_log::{AttemptLog, LogRecord};
use crate::job_store::{JobStore, ReadJobs};
use crate::notify::Notifier;
use crate::protocol::{HeldSchedule, Inserted, NamedRecords, Records};
use crate::query::{JobFilter, JobOrder, QueueTiming};
use crate::queue::{KeyRecord, QueueRecord, QueueSettings, ServedMarks};
use crate::report::{CheckReport, ReaperPass};
use crate::rules;
use crate::schedule::{ScheduleInfo, ScheduleRecord};
use crate::state::JobState;
use crate::stats::{Counters, Stats};
use crate::workflow::{Group, GroupRecord, Target};

#[cfg(feature = "__internal")]
#[doc(hidden)]
pub use crate::protocol::Policy;
#[cfg(not(feature = "__internal"))]
use crate::protocol::Policy;

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
    hub: crate::events::Hub,
    served: ServedMarks,
}

#[derive(Clone, Debug, Default)]
struct State {
    jobs: BTreeMap<JobId, JobRecord>,
    payloads: BTreeMap<JobId, Vec<u8>>,
    outputs: BTreeMap<JobId, Vec<u8>>,
    runs: BTreeMap<(JobId, Attempt), RunRecord>,
    queues: BTreeMap<String, QueueRecord>,
    keys: BTreeMap<(String, String), KeyRecord>,
    schedules: BTreeMap<String, ScheduleRecord>,
    failures: BTreeMap<String, String>,
    counters: Counters,
    next_id: u64,
    groups: BTreeMap<GroupId, GroupRecord>,
    group_keys: BTreeMap<String, GroupId>,
    checkpoints: BTreeMap<JobId, CheckpointRecord>,
    logs: BTreeMap<(JobId, Attempt), LogRecord>,
    next_group: u64,
    last_pass: Option<ReaperPass>,
    /// Every end, by its number; the number of the last one purged.
    endings: BTreeMap<u64, EndRecord>,
    trimmed: u64,
}

impl State {
    /// Keeps `ending`, if there is one, under the next number.
    fn note(&mut self, ending: Option<EndRecord>) {
        if let Some(ending) = ending {
            let seq = self
                .endings
                .last_key_value()
                .map_or(self.trimmed, |(s, _)| *s)
                + 1;
            self.endings.insert(seq, ending);
        }
    }
}

impl MemoryStore {
    /// A store on `clock` (a [`ManualClock`] in a test) with the default policy.
    pub fn new(clock: impl Clock) -> MemoryStore {
        let state = Arc::new((RwLock::new(State::default()), Mutex::new(())));
        let (clock, _) = StoreClock::resume(Arc::new(clock), None, StoreTime::ZERO);
        MemoryStore::on(state, clock, Policy::default())
    }

    /// A store on a manual clock, and the clock.
    pub fn manual() -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new();
        (MemoryStore::new(clock.clone()), clock)
    }

    /// For the suites: this store's jobs under `policy` (checked), as a process that opens
    /// a store with other settings sees them.
    #[cfg(feature = "__internal")]
    #[doc(hidden)]
    pub fn with_policy(&self, policy: Policy) -> Result<MemoryStore> {
        policy.check()?;
        Ok(MemoryStore::on(
            self.0.state.clone(),
            self.0.clock.resumed(),
            policy,
        ))
    }

    fn on(
        state: Arc<(RwLock<State>, Mutex<()>)>,
        clock: StoreClock,
        policy: Policy,
    ) -> MemoryStore {
        MemoryStore(Arc::new(Inner {
            state,
            clock,
            policy,
            notifier: Notifier::default(),
            hub: Default::default(),
            served: ServedMarks::default(),
        }))
    }

    /// For the suites: runs `hold` with the writer's seat taken, as a store that stopped
    /// answering writes (reads go on).
    #[cfg(feature = "__internal")]
    #[doc(hidden)]
    pub fn hold_writes(&self, hold: impl FnOnce()) {
        let _seat = self.0.state.1.lock();
        hold();
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.0.state.0.read())
    }
}

/// One write transaction: a copy of the state, the queues it readied, its events.
struct Tx<'s> {
    s: State,
    now: StoreTime,
    policy: &'s Policy,
    readied: BTreeSet<String>,
    events: crate::events::Pending,
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
        self.s.next_id += 1;
        let id = JobId(self.s.next_id);
        if rules::readies(None, &job) {
            self.readied.insert(job.queue.clone());
        }
        let job = JobRecord { id, ..job };
        self.s.note(rules::job_ending(None, &job));
        self.s.jobs.insert(id, job);
        self.s.payloads.insert(id, payload.to_vec());
        Ok(Inserted::Made(id))
    }
    fn save(&mut self, old: &JobRecord, new: &JobRecord) -> Result<()> {
        if rules::readies(Some(old), new) {
            self.readied.insert(new.queue.clone());
        }
        self.s.note(rules::job_ending(Some(old), new));
        self.s.jobs.insert(new.id, new.clone());
        Ok(())
    }
    fn edit(&mut self, old: &JobRecord, new: &JobRecord, payload: Option<&[u8]>) -> Result<()> {
        if let Some(payload) = payload {
            self.s.payloads.insert(new.id, payload.to_vec());
        }
        self.save(old, new)
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
        let run = self.s.runs.get(&(id, attempt));
        Ok(run.and_then(|r| r.outcome.clone()))
    }
    fn count(&mut self, counts: &Counters) -> Result<()> {
        self.s.counters.add(counts);
        Ok(())
    }
    fn readied(&mut self, queue: &str) -> Result<()> {
        self.readied.insert(queue.to_owned());
        Ok(())
    }
    fn events(&mut self) -> &mut crate::events::Pending {
        &mut self.events
    }
    fn scan(
        &mut self,
        queue: Option<&str>,
        keep: &dyn Fn(&JobRecord) -> bool,
    ) -> Result<Vec<JobRecord>> {
        let of_queue = |j: &&JobRecord| queue.is_none_or(|q| j.queue == q) && keep(j);
        Ok(self.s.jobs.values().filter(of_queue).cloned().collect())
    }
    fn delete(&mut self, job: &JobRecord) -> Result<()> {
        self.s.jobs.remove(&job.id);
        self.s.payloads.remove(&job.id);
        self.s.outputs.remove(&job.id);
        self.s.runs.retain(|(id, _), _| *id != job.id);
        self.s.checkpoints.remove(&job.id);
        self.s.logs.retain(|(id, _), _| *id != job.id);
        Ok(())
    }
    fn attempt_log(&mut self, id: JobId, attempt: Attempt) -> Result<Option<LogRecord>> {
        Ok(self.s.logs.get(&(id, attempt)).cloned())
    }
    fn save_attempt_log(&mut self, id: JobId, attempt: Attempt, log: &LogRecord) -> Result<()> {
        self.s.logs.insert((id, attempt), log.clone());
        Ok(())
    }
    fn checkpoint(&mut self, id: JobId) -> Result<Option<CheckpointRecord>> {
        Ok(self.s.checkpoints.get(&id).cloned())
    }
    fn save_checkpoint(&mut self, id: JobId, checkpoint: &CheckpointRecord) -> Result<()> {
        self.s.checkpoints.insert(id, checkpoint.clone());
        Ok(())
    }
    fn group(&mut self, id: GroupId) -> Result<Option<GroupRecord>> {
        Ok(self.s.groups.get(&id).cloned())
    }
    fn insert_group(&mut self, group: GroupRecord) -> Result<GroupId> {
        self.s.next_group += 1;
        let id = GroupId(self.s.next_group);
        self.s.groups.insert(id, GroupRecord { id, ..group });
        Ok(id)
    }
    fn save_group(&mut self, group: &GroupRecord) -> Result<()> {
        let old = self.s.groups.insert(group.id, group.clone());
        let was_open = old.is_none_or(|g| g.finished_at.is_none());
        self.s.note(rules::group_ending(was_open, group));
        Ok(())
    }
    fn group_of_key(&mut self, key: &str) -> Result<Option<GroupId>> {
        Ok(self.s.group_keys.get(key).copied())
    }
    fn save_group_key(&mut self, key: &str, group: GroupId) -> Result<()> {
        self.s.group_keys.insert(key.to_owned(), group);
        Ok(())
    }
    fn ended_groups(
        &mut self,
        from: (StoreTime, GroupId),
        until: StoreTime,
        n: usize,
    ) -> Result<Vec<GroupRecord>> {
        let at = |g: &GroupRecord| Some((g.finished_at?, g.id)).filter(|a| a.0 <= until);
        let mut ended: Vec<_> = (self.s.groups.values())
            .filter(|g| at(g).is_some_and(|a| a >= from))
            .cloned()
            .collect();
        ended.sort_by_key(|g| at(g));
        ended.truncate(n);
        Ok(ended)
    }
    fn trim_endings(&mut self, cutoff: StoreTime, n: usize) -> Result<usize> {
        let old = |(seq, e): (&u64, &EndRecord)| (e.at <= cutoff).then_some(*seq);
        let doomed: Vec<u64> = self.s.endings.iter().map_while(old).take(n).collect();
        for seq in &doomed {
            self.s.endings.remove(seq);
            self.s.trimmed = *seq;
        }
        Ok(doomed.len())
    }
    fn delete_group(&mut self, group: &GroupRecord) -> Result<()> {
        self.s.groups.remove(&group.id);
        let key = group.key.as_deref().unwrap_or_default();
        if self.s.group_keys.get(key) == Some(&group.id) {
            self.s.group_keys.remove(key);
        }
        Ok(())
    }
}

impl NamedRecords for Tx<'_> {
    fn queue(&mut self, queue: &str, _lock: bool) -> Result<Option<QueueRecord>> {
        Ok(self.s.queues.get(queue).cloned())
    }
    fn save_queue(&mut self, queue: &str, record: &QueueRecord) -> Result<()> {
        self.s.queues.insert(queue.to_owned(), record.clone());
        Ok(())
    }
    fn limit_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRecord>> {
        Ok(self
            .s
            .keys
            .get(&(queue.to_owned(), key.to_owned()))
            .cloned())
    }
    fn save_limit_key(&mut self, queue: &str, key: &str, record: Option<&KeyRecord>) -> Result<()> {
        let at = (queue.to_owned(), key.to_owned());
        match record {
            Some(record) => self.s.keys.insert(at, record.clone()),
            None => self.s.keys.remove(&at),
        };
        Ok(())
    }
    fn gated_keys(&mut self, queue: &str, now: StoreTime) -> Result<Vec<String>> {
        let of_queue = self.s.keys.iter().filter(|((q, _), _)| q == queue);
        let open = of_queue.filter(|(_, k)| k.opens_at.is_some_and(|at| at <= now));
        Ok(open.map(|((_, key), _)| key.clone()).collect())
    }
    fn limit_keys(&mut self, queue: &str) -> Result<Vec<String>> {
        let of_queue = self.s.keys.keys().filter(|(q, _)| q == queue);
        Ok(of_queue.map(|(_, key)| key.clone()).collect())
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

/// The jobs of `queue` in `state`, or in the claim order (waiting, not parked) for `None`.
fn of<'s>(
    s: &'s State,
    queue: &'s str,
    state: Option<JobState>,
) -> impl Iterator<Item = &'s JobRecord> {
    let state_is = move |j: &JobRecord| state.map_or(rules::in_claim_order(j), |s| j.state == s);
    s.jobs
        .values()
        .filter(move |j| j.queue == queue && state_is(j))
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
    fn checkpoint(&self, id: JobId) -> Result<Option<Checkpoint>> {
        Ok(self.read(|s| s.checkpoints.get(&id).cloned().map(Checkpoint)))
    }
    fn logs(&self, id: JobId) -> Result<Vec<AttemptLog>> {
        Ok(self.read(|s| {
            let of_job = s.logs.range((id, Attempt(0))..=(id, Attempt(u32::MAX)));
            let each = of_job.map(|(&(_, attempt), record)| AttemptLog {
                attempt,
                record: record.clone(),
            });
            each.collect()
        }))
    }
    fn group(&self, id: GroupId) -> Result<Option<Group>> {
        Ok(self.read(|s| s.groups.get(&id).cloned().map(Group)))
    }
    fn endings(&self, after: EndCursor, limit: usize) -> Result<Endings> {
        Ok(self.read(|s| {
            let kept = s.endings.range(after.seq.saturating_add(1)..).take(limit);
            let at = |seq: u64| EndCursor { tx: 0, seq };
            let list = kept.map(|(seq, e)| e.clone().ending_at(at(*seq))).collect();
            crate::endings::page(after, list, at(s.trimmed))
        }))
    }
    fn wait_for_endings(
        &self,
        after: EndCursor,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<Endings> {
        // (one process: its commits are all there is to hear)
        let hints = crate::wait_end::Hints {
            notifier: &self.0.notifier,
            announce: &|| false,
        };
        crate::wait_end::follow(
            |a, n| self.endings(a, n),
            Some(hints),
            after,
            limit,
            timeout,
        )
    }
    fn waiters(&self, id: JobId) -> Result<Vec<JobId>> {
        let waits = |j: &&JobRecord| j.flow.needs.iter().any(|n| n.on == Target::Job(id));
        Ok(self.read(|s| s.jobs.values().filter(waits).map(|j| j.id).collect()))
    }
    fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let now = self.0.clock.now();
        let mut admitted: Vec<JobRecord> = self.read(|s| {
            let admitted = s.jobs.values().filter(|j| filter.admits(j, now));
            admitted.cloned().collect()
        });
        if filter.order == JobOrder::Newest {
            admitted.reverse();
        }
        Ok(filter.arrange(admitted))
    }
    fn timing(&self, queue: &str) -> Result<QueueTiming> {
        let now = self.0.clock.now();
        Ok(self.read(|s| {
            let running = of(s, queue, Some(JobState::Running));
            let expiries: Vec<_> = running
                .filter_map(|j| Some(j.lease.as_ref()?.expires_at))
                .collect();
            QueueTiming {
                earliest_run_at: of(s, queue, None).map(|j| j.run_at).min(),
                earliest_expiry: expiries.iter().copied().min(),
                next_expiry: expiries.into_iter().filter(|at| *at >= now).min(),
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
                stats.note_queue(queue.clone(), record);
            }
            let keys = s.keys.iter().map(|((q, _), k)| (q.clone(), k.clone()));
            let keyed = s
                .jobs
                .values()
                .filter(|j| j.limit.is_some() && j.state.is_waiting());
            let keyed = keyed.map(|j| (j.queue.clone(), 1));
            rules::count_keys(&mut stats, keys, keyed);
            s.groups.values().for_each(|g| stats.note_group(g));
            stats
        }))
    }
    fn queue_settings(&self, queue: &str) -> Result<QueueSettings> {
        Ok(QueueSettings::of(
            self.read(|s| s.queues.get(queue).cloned()),
        ))
    }
    fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        Ok(self.read(|s| {
            let failure = |name: &String| s.failures.get(name).cloned();
            let all = s.schedules.iter();
            all.map(|(n, r)| ScheduleInfo(r.clone(), failure(n)))
                .collect()
        }))
    }
    /// What must hold of every stored job (`rules::check_job`); a store in memory
    /// has no index to compare.
    fn check(&self) -> Result<CheckReport> {
        Ok(self.read(|s| {
            let mut problems = Vec::new();
            for j in s.jobs.values() {
                let runs = s.runs.range((j.id, Attempt(0))..=(j.id, Attempt(u32::MAX)));
                let runs: Vec<_> = runs.map(|((_, a), r)| (a.0, r.clone())).collect();
                crate::rules::check_job(j, &runs, &mut problems);
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
            events: crate::events::Pending::of(&self.0.hub),
        };
        let last_ending = tx.s.endings.keys().next_back().copied();
        let answer = step(&mut tx);
        let ended = answer.is_ok() && tx.s.endings.keys().next_back().copied() != last_ending;
        let mut state = self.0.state.0.write();
        match &answer {
            Ok(_) => *state = tx.s,
            // A refusal wrote nothing but its counter.
            Err(e) if e.is_refusal() => state.counters = tx.s.counters,
            Err(_) => return answer,
        }
        drop(state);
        self.0.notifier.notify(&tx.readied);
        if ended {
            self.0.notifier.notify_endings();
        }
        if answer.is_ok() {
            self.0.hub.publish(tx.events.take());
        }
        answer
    }
    fn policy(&self) -> &Policy {
        &self.0.policy
    }
    fn clock(&self) -> StoreTime {
        self.0.clock.now()
    }
    fn notifier(&self) -> &Notifier {
        &self.0.notifier
    }
    fn hears_schedule_changes(&self) -> bool {
        true
    }
    fn hub(&self) -> &crate::events::Hub {
        &self.0.hub
    }
    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        let now = self.0.clock.now();
        Ok(self.read(|s| {
            let record = s.queues.get(queue);
            let waiting = of(s, queue, None).map(|j| j.run_at).min();
            let running = of(s, queue, Some(JobState::Running));
            let expiries: Vec<_> = running
                .filter_map(|j| Some(j.lease.as_ref()?.indexed_expiry))
                .collect();
            let (running, expiry) = (expiries.len() as u64, expiries.into_iter().min());
            let gates = s.keys.iter().filter(|((q, _), _)| q == queue);
            let gate = gates.filter_map(|(_, k)| k.opens_at).min();
            crate::rules::next_look(record, running, now, waiting, expiry, gate)
        }))
    }
    fn marks_due(&self, queues: &mut dyn Iterator<Item = &str>) -> Vec<String> {
        self.0.served.due(queues, self.0.clock.now())
    }
    fn reaper_looks(&self) -> Result<ReaperLooks> {
        let now = self.0.clock.now();
        let expired = |j: &JobRecord| {
            j.state == JobState::Running
                && j.lease.as_ref().is_some_and(|l| l.indexed_expiry <= now)
        };
        let late = |j: &JobRecord| crate::rules::waits_past_expiry(j, now);
        let (leases_expired, past_expiry) =
            self.read(|s| (s.jobs.values().any(expired), s.jobs.values().any(late)));
        Ok(ReaperLooks {
            now,
            leases_expired,
            past_expiry,
        })
    }
    fn note_reaper_pass(&self, pass: &ReaperPass) -> Result<()> {
        self.0.state.0.write().last_pass = Some(pass.clone());
        Ok(())
    }
}

impl JobStore for MemoryStore {}

// None: a store in memory has no tables of the application's.
crate::engine::engine!(MemoryStore, std::convert::Infallible);

crate::conveniences::conveniences!(MemoryStore);
