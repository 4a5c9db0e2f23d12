//! What the protocol asks of an engine: a place that loads and saves records inside one
//! write transaction. Each engine implements [`Records`] over its own transaction (redb's
//! tables and indexes, PostgreSQL's rows); nothing here decides what becomes of a job.
//!
//! The contract every implementation keeps:
//! * A record loaded for writing ([`Records::job`], and every job a search returns) is the
//!   transaction's until it ends: no other writer changes it meanwhile (redb has one writer;
//!   PostgreSQL locks the row, and a search passes over rows another transaction holds).
//! * [`Records::save`] keeps every index in step with the record, and notes a queue that
//!   gained a waiting job so its idle workers are woken once the transaction commits.
//! * Time is the store's: [`Records::now`] never runs backwards within a store.

use std::collections::HashMap;

use crate::checkpoint::CheckpointRecord;
use crate::error::Result;
use crate::events::Pending;
use crate::ids::{Attempt, GroupId, JobId, StoreTime};
use crate::job::{JobRecord, Outcome, RunRecord};
use crate::job_log::LogRecord;
use crate::lease::{Holding, Lease, LeaseTerms};
use crate::new_job::NewJob;
use crate::queue::{KeyRecord, QueueLimits, QueueRecord};
use crate::rules;
use crate::schedule::ScheduleRecord;
use crate::state::JobState;
use crate::stats::Counters;
use crate::workflow::{GroupRecord, Target};

use super::Policy;

/// A new job's place, as [`Records::insert`] found it.
pub enum Inserted {
    /// Stored under this id.
    Made(JobId),
    /// Another transaction's job took the unique key meanwhile (only where writers run side
    /// by side): that job is the answer, and nothing was stored.
    KeyTaken(JobId),
}

/// What a claim looks at first ([`Records::claim_look`]). An answer may err towards yes, at
/// the cost of a search, never towards no.
#[derive(Clone, Debug)]
pub(crate) struct ClaimLook {
    /// The queue's record, not held.
    pub record: Option<QueueRecord>,
    /// Whether a lease of the queue may have expired.
    pub expired: bool,
    /// Whether jobs with a limit key may wait in the queue.
    pub keyed: bool,
}

impl ClaimLook {
    /// The queue's `record`, and "maybe" to the rest.
    pub fn maybe(record: Option<QueueRecord>) -> ClaimLook {
        ClaimLook {
            record,
            expired: true,
            keyed: true,
        }
    }
}

/// What one [`Records::take_waiting`] step granted.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// The leases granted, in the claim order.
    pub leases: Vec<Lease>,
    /// The jobs it found with their attempt counter exhausted and made dead, or past their
    /// expiry and expired ([`rules::grant`]), that others await: their ends are still to
    /// settle.
    pub dead: Vec<(JobId, JobState, Option<GroupId>)>,
    /// Every job it found past its expiry and expired, awaited or not: each is told
    /// ([`crate::Event::Expired`]).
    pub expired: Vec<JobId>,
    /// Whether it may have left claimable jobs short of `n` (another step may find more).
    pub more: bool,
}

/// How [`Records::complete_fenced`] stored a completion.
#[derive(Clone, Debug)]
pub(crate) struct Completed {
    /// The attempt it completed.
    pub by: Holding,
    /// The job's queue.
    pub queue: String,
    /// The job's limit key, if it has one.
    pub key: Option<String>,
    /// Whether other jobs await it.
    pub awaited: bool,
    /// The group it is a member of.
    pub group: Option<GroupId>,
}

/// One write transaction of an engine, as the protocol sees it.
///
/// (Public only in name: it is reached through [`crate::JobStore`]'s hidden supertrait,
/// which nothing outside the crate can name or implement, so its records stay the crate's.)
#[allow(private_interfaces)]
pub trait Records: NamedRecords {
    /// The store's policy.
    fn policy(&self) -> &Policy;
    /// Store time now.
    fn now(&mut self) -> Result<StoreTime>;

    // ----- jobs -----

    /// The job's record, if it exists, held for writing.
    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>>;
    /// The records of `ids` that exist, held for writing, in id order.
    fn jobs(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            found.extend(self.job(id)?);
        }
        Ok(found)
    }
    /// Stores a new job (its id is the engine's to give: `job.id` is ignored) and its
    /// payload.
    fn insert(&mut self, job: JobRecord, payload: &[u8]) -> Result<Inserted>;
    /// Stores `new` over `old`, every index in step.
    fn save(&mut self, old: &JobRecord, new: &JobRecord) -> Result<()>;
    /// Stores many changes as [`Records::save`] does each (an engine that can, in one
    /// statement): what a dependency's end does to its waiters.
    fn save_all(&mut self, changes: &[(JobRecord, JobRecord)]) -> Result<()> {
        for (old, new) in changes {
            self.save(old, new)?;
        }
        Ok(())
    }
    /// Stores an operator's edit of a waiting job: `new` over `old` as [`Records::save`]
    /// does, with the parts no rule of the protocol changes (its priority, its metadata) and,
    /// if given, a new payload.
    fn edit(&mut self, old: &JobRecord, new: &JobRecord, payload: Option<&[u8]>) -> Result<()>;
    /// Stores a change that moves no index entry: a renewal (its lease's expiry, progress,
    /// `updated_at`; see [`crate::job::LeaseRecord`] for why the expiry entry may lag). An
    /// engine without indexes saves it as any change.
    fn renew(&mut self, renewed: &JobRecord) -> Result<()> {
        self.save(renewed, renewed)
    }
    /// The job's payload.
    fn payload(&mut self, id: JobId) -> Result<Vec<u8>>;
    /// Keeps a succeeded attempt's output (never called with an empty one).
    fn keep_output(&mut self, id: JobId, output: &[u8]) -> Result<()>;
    /// Records an ended attempt (`old` as it ran, `run` as it ended).
    fn record_run(&mut self, old: &JobRecord, run: &RunRecord) -> Result<()>;
    /// How the attempt ended, if its end was recorded (the fence asks why it refuses).
    fn run_outcome(&mut self, id: JobId, attempt: Attempt) -> Result<Option<Outcome>>;
    /// Adds what a rule counted to the store's counters.
    fn count(&mut self, counts: &Counters) -> Result<()>;
    /// Tells `queue`'s waiting workers, once the transaction commits, that it has work.
    fn readied(&mut self, queue: &str) -> Result<()>;
    /// The events this transaction tells the store's subscribers once it commits
    /// ([`super::tell`]; collected only while anyone listens).
    fn events(&mut self) -> &mut Pending;

    // ----- steps an engine may take in fewer statements -----
    //
    // Each is asked for by a sequence of the protocol, which does the same one row at a
    // time where an engine has no such step (the defaults: none) or leaves a row to it. An
    // engine gives one where a statement of its own does for many rows at once what the
    // sequence does for each (PostgreSQL's `fast.rs`); the shared suites run PostgreSQL
    // with its steps and without, and hold every engine to the same answers.

    /// Stores plain new jobs ([`rules::is_plain`], inputs checked) in one step, due after
    /// their delays on the store's clock, and gives their ids in their order; the protocol
    /// then wakes their queues. `None` where the engine has no such step for these jobs:
    /// the protocol enqueues each by its own steps. The default is `None`.
    fn insert_plain(&mut self, _jobs: &[NewJob]) -> Result<Option<Vec<JobId>>> {
        Ok(None)
    }
    /// What a claim of `queue` looks at first ([`super::claim_batch`]). The default reads
    /// the queue's record and answers "maybe" to the rest, which costs a search each later.
    fn claim_look(&mut self, queue: &str) -> Result<ClaimLook> {
        Ok(ClaimLook::maybe(self.queue(queue, false)?))
    }
    /// Grants up to `n` waiting, due jobs of `queue` in one step, as [`super::next_claim`]
    /// would one by one where no lease of the queue has expired, under the queue's `limits`
    /// (as the claim read them) where `keyed` (jobs with a limit key may wait, as
    /// [`Records::claim_look`] found). `None` where the engine has no such step, or cannot
    /// decide for the next job (its key without room, its attempt counter exhausted): the
    /// protocol takes that one by its own steps. The default is `None`.
    fn take_waiting(
        &mut self,
        _queue: &str,
        _worker: &str,
        _terms: LeaseTerms,
        _n: usize,
        _limits: &QueueLimits,
        _keyed: bool,
    ) -> Result<Option<Taken>> {
        Ok(None)
    }
    /// Returns once the completions of this transaction's round that commit beside it (in
    /// another transaction, where an engine runs the two halves of a round at once) have
    /// committed: a claim decides what they could change (a takeover, a limited queue's
    /// room, a key's count) as if they had committed first. The default, for an engine
    /// that commits them first, returns at once.
    fn completions_committed(&mut self) {}
    /// Locks the records of `jobs`, the jobs a round is about to end one by one after its
    /// step ([`super::round`]), in one order for every writer (ids rising), so that two
    /// rounds ending the same jobs cannot each hold one the other waits for. The default,
    /// for an engine whose writers take turns, locks nothing.
    fn lock_ends(&mut self, _jobs: &mut dyn Iterator<Item = JobId>) -> Result<()> {
        Ok(())
    }
    /// A completion of this transaction's round is about to be written by the protocol's
    /// own steps, which hold its job's record: where the round's claim runs beside, in
    /// another transaction, a job given back since could be one the claim takes, and held
    /// here the claim would pass over it, as if the completions had not come first; so the
    /// engine waits until that claim has taken what it takes. The default returns at once.
    fn ending_alone(&mut self) {}
    /// Completes in one step each attempt of `done` (holding, output, progress) whose fence
    /// holds and whose deadline has not passed, writing its record as [`super::complete`]
    /// would, and says how each completed one was stored; the protocol does the rest of
    /// [`super::store_end`] for them ([`super::complete_many`]), and completes the others
    /// by its own steps, which say why each is refused. Each attempt appears once; each
    /// output is within the size limit. The default completes none.
    fn complete_fenced(
        &mut self,
        _done: &[(Holding, &[u8], Option<u64>)],
    ) -> Result<Vec<Completed>> {
        Ok(Vec::new())
    }
    /// Renews in one step each lease of `leases` (holding, progress) whose fence holds and
    /// that is neither cancelled, stalled nor past its deadline, as [`super::heartbeat`]
    /// would, and says when each renewed one now expires; the protocol renews the others
    /// by its own steps, which say why each is refused ([`super::renew_batch`]). The default
    /// renews none.
    fn renew_fenced(&mut self, _leases: &[(Holding, u64)]) -> Result<HashMap<Holding, StoreTime>> {
        Ok(HashMap::new())
    }
    /// [`super::mark_served`] for each of `queues`.
    fn mark_served(&mut self, queues: &[String]) -> Result<()> {
        queues.iter().try_for_each(|q| super::mark_served(self, q))
    }

    // ----- finding jobs -----

    /// The job's record held for writing, or `None` where it does not exist or another
    /// transaction holds it (a key's head moved while a claimer holds it: that claimer
    /// settles the key after it).
    fn try_job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        self.job(id)
    }

    /// Every job of `queue` (of any queue, for `None`) that `keep` keeps, held for writing.
    /// An engine without indexes (the store in memory) implements this one search, and the
    /// searches below answer from it by default: the defaults say what each means. An
    /// engine with indexes answers each of them from its index instead, and not this.
    fn scan(
        &mut self,
        _queue: Option<&str>,
        _keep: &dyn Fn(&JobRecord) -> bool,
    ) -> Result<Vec<JobRecord>> {
        Err(crate::error::Error::Internal(
            "an engine with indexes searches by them",
        ))
    }
    /// The job that holds `key` in `queue` by the unique index, held for writing.
    fn key_holder(&mut self, queue: &str, key: &str) -> Result<Option<JobRecord>> {
        let holds = |j: &JobRecord| j.unique_key.as_deref() == Some(key) && rules::keeps_key(j);
        Ok(self.scan(Some(queue), &holds)?.pop())
    }
    /// The most urgent waiting job of `queue` due at `now` ([`crate::rules`]'s claim order:
    /// priority, then run time, then id), and its priority.
    fn next_ready(&mut self, queue: &str, now: StoreTime) -> Result<Option<(i32, JobId)>> {
        let due = self.scan(Some(queue), &|j| {
            rules::in_claim_order(j) && j.run_at <= now
        })?;
        let first = due.iter().min_by_key(|j| rules::claim_order(j));
        Ok(first.map(|j| (j.priority, j.id)))
    }
    /// The running job of `queue` whose *indexed* expiry is first, at or before `bound` (the
    /// entry may lag a renewal: the caller checks the record).
    fn first_indexed_expiry(&mut self, queue: &str, bound: StoreTime) -> Result<Option<JobId>> {
        let expiring = self.scan(Some(queue), &|j| indexed_by(j, bound).is_some())?;
        Ok(in_expiry_order(expiring).first().copied())
    }
    /// Up to `limit` running jobs of any queue whose indexed expiry is at or before `bound`,
    /// first to expire first.
    fn indexed_expiries(&mut self, bound: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        let expiring = self.scan(None, &|j| indexed_by(j, bound).is_some())?;
        Ok(in_expiry_order(expiring).into_iter().take(limit).collect())
    }
    /// Up to `limit` jobs of any queue that wait past their expiry at `now`
    /// ([`rules::waits_past_expiry`]), first to expire first.
    fn past_expiry(&mut self, now: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        let mut late = self.scan(None, &|j| rules::waits_past_expiry(j, now))?;
        late.sort_by_key(|j| (j.expires_at, j.id));
        Ok(late.into_iter().take(limit).map(|j| j.id).collect())
    }
    /// Whether any job of `queue` is stored, in any state.
    fn has_jobs(&mut self, queue: &str) -> Result<bool> {
        Ok(!self.scan(Some(queue), &|_| true)?.is_empty())
    }
    /// How many jobs of `queue` are running.
    fn running(&mut self, queue: &str) -> Result<u64> {
        let running = self.scan(Some(queue), &|j| j.state == JobState::Running)?;
        Ok(running.len() as u64)
    }
    /// Up to `n` finished jobs in the order they finished (ties by id), from position
    /// `from` on and finished at or before `until`, held for writing.
    fn finished(&mut self, from: Position, until: StoreTime, n: usize) -> Result<Vec<JobRecord>> {
        let at = |j: &JobRecord| Some((j.finished_at?, j.id)).filter(|_| j.state.is_terminal());
        let due = |j: &JobRecord| at(j).is_some_and(|at| at >= from && at.0 <= until);
        let mut done = self.scan(None, &due)?;
        done.sort_by_key(|j| at(j));
        done.truncate(n);
        Ok(done)
    }
    /// The first waiting job of limit key `key` of `queue` in its key's order (run time, then
    /// id), parked or not. Not held: its key's record is.
    fn first_of_key(&mut self, queue: &str, key: &str) -> Result<Option<JobId>> {
        let of_key =
            |j: &JobRecord| j.state.is_waiting() && j.limit.as_ref().is_some_and(|l| l.key == key);
        let waiting = self.scan(Some(queue), &of_key)?;
        Ok(waiting
            .iter()
            .min_by_key(|j| rules::key_order(j))
            .map(|j| j.id))
    }
    /// Deletes a job entirely: its record, every index entry, payload, output, history and
    /// checkpoint.
    fn delete(&mut self, job: &JobRecord) -> Result<()>;
    /// The last checkpoint saved for job `id` ([`crate::JobContext::save_checkpoint`]).
    fn checkpoint(&mut self, id: JobId) -> Result<Option<CheckpointRecord>>;
    /// Keeps `checkpoint` as job `id`'s, in place of the one before (deleted with the job,
    /// by [`Records::delete`]).
    fn save_checkpoint(&mut self, id: JobId, checkpoint: &CheckpointRecord) -> Result<()>;
    /// The log lines attempt `attempt` of job `id` wrote ([`crate::JobContext::log`]).
    fn attempt_log(&mut self, id: JobId, attempt: Attempt) -> Result<Option<LogRecord>>;
    /// Keeps `log` as attempt `attempt` of job `id`'s (deleted with the job).
    fn save_attempt_log(&mut self, id: JobId, attempt: Attempt, log: &LogRecord) -> Result<()>;
    /// [`Records::attempt_log`] of each of `of`, in its order: one step where an engine
    /// reads them in one (a round's completions' last lines).
    fn attempt_logs(&mut self, of: &[(JobId, Attempt)]) -> Result<Vec<Option<LogRecord>>> {
        (of.iter())
            .map(|&(id, attempt)| self.attempt_log(id, attempt))
            .collect()
    }
    /// [`Records::save_attempt_log`] of each of `logs`.
    fn save_attempt_logs(&mut self, logs: &[(JobId, Attempt, LogRecord)]) -> Result<()> {
        for (id, attempt, log) in logs {
            self.save_attempt_log(*id, *attempt, log)?;
        }
        Ok(())
    }

    // ----- jobs that wait for jobs -----

    /// The jobs that wait for any of `ids`, as (the one waited for, the waiter) (by
    /// [`crate::workflow::Flow::needs`], which never change once a job is stored: an engine
    /// with indexes indexes them at insert). A job deleted since may be named; it is then
    /// not found.
    fn waiters(&mut self, ids: &[JobId]) -> Result<Vec<(JobId, JobId)>> {
        let on = |n: &crate::workflow::Need| match n.on {
            Target::Job(dep) if ids.contains(&dep) => Some(dep),
            _ => None,
        };
        let waits = |j: &JobRecord| j.flow.needs.iter().any(|n| on(n).is_some());
        let mut found = Vec::new();
        for waiter in self.scan(None, &waits)? {
            let deps: std::collections::BTreeSet<JobId> =
                waiter.flow.needs.iter().filter_map(on).collect();
            found.extend(deps.into_iter().map(|dep| (dep, waiter.id)));
        }
        Ok(found)
    }
    /// The members of `group` (likewise indexed at insert, where there are indexes).
    fn members(&mut self, group: GroupId) -> Result<Vec<JobId>> {
        let member = |j: &JobRecord| j.flow.group == Some(group);
        Ok(self.scan(None, &member)?.iter().map(|j| j.id).collect())
    }
    /// The record of group `id`, held for writing.
    fn group(&mut self, id: GroupId) -> Result<Option<GroupRecord>>;
    /// Stores a new group (its id is the engine's to give: `group.id` is ignored).
    fn insert_group(&mut self, group: GroupRecord) -> Result<GroupId>;
    /// Stores a group's record.
    fn save_group(&mut self, group: &GroupRecord) -> Result<()>;
    /// The group made with key `key` ([`crate::NewGroup::key`]), if any; the key held for
    /// writing where writers run side by side (two openings of one key are one after the
    /// other).
    fn group_of_key(&mut self, key: &str) -> Result<Option<GroupId>>;
    /// Keeps `key` as the key of the new group `group`.
    fn save_group_key(&mut self, key: &str, group: GroupId) -> Result<()>;
    /// Up to `n` groups that ended, in the order they ended (ties by id), from position
    /// `from` on and ended at or before `until`, held for writing.
    fn ended_groups(
        &mut self,
        from: (StoreTime, GroupId),
        until: StoreTime,
        n: usize,
    ) -> Result<Vec<GroupRecord>>;
    /// Deletes a group's record, its entries in the indexes and its key
    /// ([`GroupRecord::key`]) if the key still names it.
    fn delete_group(&mut self, group: &GroupRecord) -> Result<()>;

    // ----- endings -----

    /// Deletes up to `n` of the oldest endings kept from at or before `cutoff`, and keeps
    /// the cursor of the last one deleted (a reader behind it has a gap); returns how many
    /// records it deleted (on PostgreSQL a record may hold a round's endings).
    fn trim_endings(&mut self, cutoff: StoreTime, n: usize) -> Result<usize>;
}

/// The records an engine keeps by name beside its jobs, in the same transaction: each
/// queue's controls, each limit key's count, each schedule.
#[allow(private_interfaces)]
pub trait NamedRecords {
    /// The record of `queue`, if it has one; `lock` holds it for writing where writers run
    /// side by side (claims of a limited queue count its free slots one at a time).
    fn queue(&mut self, queue: &str, lock: bool) -> Result<Option<QueueRecord>>;
    /// Stores the record of `queue`.
    fn save_queue(&mut self, queue: &str, record: &QueueRecord) -> Result<()>;
    /// The record of limit key `key` of `queue`, held for writing (the claims and ends of
    /// one key's jobs count its running jobs one at a time).
    fn limit_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRecord>>;
    /// Stores the record of limit key `key` of `queue` (`None`: removes it).
    fn save_limit_key(&mut self, queue: &str, key: &str, record: Option<&KeyRecord>) -> Result<()>;
    /// The limit keys of `queue` that have a record.
    fn limit_keys(&mut self, queue: &str) -> Result<Vec<String>>;
    /// The limit keys of `queue` whose rate window has room again at `now`
    /// ([`KeyRecord::opens_at`] at or before it).
    fn gated_keys(&mut self, queue: &str, now: StoreTime) -> Result<Vec<String>>;
    /// Every schedule whose record this transaction can hold (where several machines fire at
    /// once, one held by another is passed over: that one fires it), each with the failure
    /// kept beside it.
    fn schedules(&mut self) -> Result<Vec<HeldSchedule>>;
    /// The record of schedule `name`, held for writing (two declaring it at once are one
    /// after the other).
    fn schedule(&mut self, name: &str) -> Result<Option<ScheduleRecord>>;
    /// Stores a schedule's record.
    fn save_schedule(&mut self, record: &ScheduleRecord) -> Result<()>;
    /// Removes schedule `name`; `false` if there was none.
    fn remove_schedule(&mut self, name: &str) -> Result<bool>;
    /// Keeps the failure of schedule `name` beside it (`None`: it has none), writing only a
    /// change.
    fn note_schedule_failure(&mut self, name: &str, failure: Option<&str>) -> Result<()>;
}

/// Where a finished job stands in the order jobs finished: its finish time, then its id.
pub type Position = (StoreTime, JobId);

/// A schedule as [`Records::schedules`] finds it: its name, its record (or why it cannot be
/// read), and the failure kept beside it.
pub type HeldSchedule = (String, Result<ScheduleRecord>, Option<String>);

/// Where a running job's lease stands in an expiry index, if at or before `bound`.
fn indexed_by(job: &JobRecord, bound: StoreTime) -> Option<StoreTime> {
    let lease = job
        .lease
        .as_ref()
        .filter(|_| job.state == JobState::Running)?;
    Some(lease.indexed_expiry).filter(|at| *at <= bound)
}

/// The ids of running `jobs` in the order an expiry index holds them.
fn in_expiry_order(jobs: Vec<JobRecord>) -> Vec<JobId> {
    let mut entries: Vec<_> = jobs
        .iter()
        .map(|j| (indexed_by(j, StoreTime(u64::MAX)), j.id))
        .collect();
    entries.sort();
    entries.into_iter().map(|(_, id)| id).collect()
}
