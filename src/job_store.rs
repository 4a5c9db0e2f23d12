//! What every store does, the same calls with the same answers on each engine: the
//! contract the redb [`Store`](crate::Store), its read-only [`StoreReader`](crate::StoreReader)
//! (the read side) and the PostgreSQL `PgStore` (the `postgres` feature) keep.
//!
//! A worker pool and a reaper run on it, the `leasehold` tool works through it, and the test
//! suites run every protocol test on both engines through it. An application that means to
//! run on either engine can be written against it too (`&dyn JobStore`). What only one
//! engine has stays on the engine's own type: the application's transaction (redb tables or
//! SQL), a file's processes and writer, PostgreSQL's schema and vacuum.
//!
//! The calls are written here once, over the protocol ([`crate::protocol`]) in an engine's
//! write transactions; an engine's shortcuts are steps of its transaction
//! ([`crate::protocol::Records`]), not calls of its own. Both traits are object-safe. Bring
//! them into scope to call them: `use leasehold::prelude::*`.

use std::time::Duration;

use crate::backend::{LeaseBackend, write};
use crate::checkpoint::Checkpoint;
use crate::endings::{EndCursor, Endings};
use crate::error::{Error, Result};
use crate::ids::{GroupId, JobId, StoreTime};
use crate::job::{Job, Run};
use crate::job_log::AttemptLog;
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::new_job::NewGroup;
use crate::new_job::NewJob;
use crate::protocol;
use crate::protocol::End;
use crate::query::{JobFilter, QueueTiming};
use crate::queue::{QueueLimits, QueueSettings, UnservedQueue};
use crate::report::{BulkReport, CheckReport, ReapReport};
use crate::retry::RetryPolicy;
use crate::rules::Retry;
use crate::schedule::{Schedule, ScheduleInfo};
use crate::state::JobState;
use crate::stats::Stats;
use crate::workflow::Group;

/// The read side of a store: what an operator's tools ask.
pub trait ReadJobs: Send + Sync {
    /// Store time: the clock every expiry is written and compared on.
    fn now(&self) -> Result<StoreTime>;
    /// The job, if it exists.
    fn job(&self, job: JobId) -> Result<Option<Job>>;
    /// The job's attempts, oldest first (a running one last).
    fn history(&self, job: JobId) -> Result<Vec<Run>>;
    /// The job's payload.
    fn payload(&self, job: JobId) -> Result<Option<Vec<u8>>>;
    /// A succeeded job's output (`None` for none or an empty one).
    fn output(&self, job: JobId) -> Result<Option<Vec<u8>>>;
    /// The group, if it exists: its members' counts, whether it is sealed, how it ended.
    fn group(&self, group: GroupId) -> Result<Option<Group>>;
    /// The jobs that wait (or waited) for `job`, oldest first. A job purged since is not
    /// named.
    fn waiters(&self, job: JobId) -> Result<Vec<JobId>>;
    /// The outputs of the jobs `job` waits for, in the order it names them (BullMQ's
    /// `getChildrenValues`): what a handler that gathers its dependencies' results reads.
    /// `None` for a dependency with no output (not succeeded, or an empty one, or purged).
    fn dependency_outputs(&self, job: JobId) -> Result<Vec<(JobId, Option<Vec<u8>>)>> {
        let Some(found) = self.job(job)? else {
            return Err(Error::JobNotFound(job));
        };
        let mut outputs = Vec::new();
        for need in found.needs() {
            if let crate::workflow::Target::Job(dep) = need.on() {
                outputs.push((dep, self.output(dep)?));
            }
        }
        Ok(outputs)
    }
    /// Waits until `job` has ended (succeeded, dead, cancelled or expired) and returns it as
    /// it ended, or `None` if `timeout` passes first: "is order 42's job done?" from a web
    /// process, whichever process or machine runs it. Its output is
    /// [`ReadJobs::output`]'s. A job that does not exist is [`Error::JobNotFound`]; one
    /// that ended already is returned at once.
    ///
    /// The wait reads the job's record: at once, and again at pauses that grow to
    /// [`WAIT_MAX_PAUSE`](crate::WAIT_MAX_PAUSE) (200 ms), so an end committed by any
    /// process or machine is seen within that of its commit. It holds no lock, writes
    /// nothing and subscribes to nothing.
    fn wait_for(&self, job: JobId, timeout: Duration) -> Result<Option<Job>> {
        crate::wait_end::until(timeout, || {
            let found = self.job(job)?.ok_or(Error::JobNotFound(job))?;
            Ok(found.state().is_terminal().then_some(found))
        })
    }
    /// Waits until `group` has ended (sealed, and every member ended) and returns it as it
    /// ended, with its members' counts and its [`Group::outcome`], or `None` if `timeout`
    /// passes first; a group that does not exist is [`Error::GroupNotFound`]. Its record
    /// is read at pauses that grow to [`WAIT_MAX_PAUSE`](crate::WAIT_MAX_PAUSE), as
    /// [`ReadJobs::wait_for`] reads a job's.
    fn wait_for_group(&self, group: GroupId, timeout: Duration) -> Result<Option<Group>> {
        crate::wait_end::until(timeout, || {
            let found = self.group(group)?.ok_or(Error::GroupNotFound(group))?;
            Ok(found.finished_at().is_some().then_some(found))
        })
    }
    /// The last checkpoint saved for `job` ([`JobStore::save_checkpoint`]), if any: what
    /// its next attempt resumes from.
    fn checkpoint(&self, job: JobId) -> Result<Option<Checkpoint>>;
    /// The log lines each attempt of `job` wrote ([`JobStore::log`],
    /// [`JobContext::log`](crate::JobContext::log)), oldest attempt first; an attempt that
    /// wrote none is not listed.
    fn logs(&self, job: JobId) -> Result<Vec<AttemptLog>>;
    /// The ends kept after `after` ([`EndCursor::START`] for all), oldest first, at most
    /// `limit`: every job that came to an end and every group that ended, committed by any
    /// process or machine of the store, in the order they committed. Read on from
    /// [`Endings::next`]; a cursor kept across restarts reads what ended meanwhile (see
    /// docs/events.md for the order on PostgreSQL and what retention takes).
    fn endings(&self, after: EndCursor, limit: usize) -> Result<Endings>;
    /// [`ReadJobs::endings`], waiting until there is one after `after` or `timeout` passes
    /// (an empty page, its [`Endings::next`] still `after`): what a follower of every end
    /// calls in a loop, carrying the cursor on.
    ///
    /// A store handle reads at once, then again when a commit kept an ending: its own
    /// process's at once, and, while a follower waits, another process's of a shared file
    /// or another machine's of a database by a hint that commit sends (a datagram,
    /// `NOTIFY`). Hints cost the writers only while somebody follows, and a lost one
    /// delays a follower by [`FOLLOW_LOOK`](crate::FOLLOW_LOOK) (30 s) at most: an idle
    /// follower reads once in that. A read-only [`StoreReader`](crate::StoreReader) reads
    /// at pauses that grow to [`WAIT_MAX_PAUSE`](crate::WAIT_MAX_PAUSE), as
    /// [`ReadJobs::wait_for`] does.
    fn wait_for_endings(
        &self,
        after: EndCursor,
        limit: usize,
        timeout: Duration,
    ) -> Result<Endings> {
        crate::wait_end::follow(|a, n| self.endings(a, n), None, after, limit, timeout)
    }
    /// The jobs `filter` asks for, in its order.
    fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>>;
    /// When things fall due in `queue`.
    fn timing(&self, queue: &str) -> Result<QueueTiming>;
    /// Counts per queue and state, and the lifetime counters.
    fn stats(&self) -> Result<Stats>;
    /// The queues whose due work has waited [`crate::UNSERVED_AFTER`] or more with no worker
    /// asking for it that long (a typo in a queue name, a pool that never started).
    fn unserved_queues(&self) -> Result<Vec<UnservedQueue>> {
        let stats = self.stats()?;
        let mut unserved = Vec::new();
        for (queue, counts) in &stats.queues {
            // (a paused queue is left alone on purpose)
            if counts.paused || counts.get(JobState::Queued) + counts.get(JobState::RetryWait) == 0
            {
                continue;
            }
            let due = self.timing(queue)?.earliest_run_at;
            let Some(waiting_since) = due.filter(|t| *t <= stats.now) else {
                continue;
            };
            if crate::queue::unserved(waiting_since, counts.served_at, stats.now) {
                unserved.push(UnservedQueue {
                    queue: queue.clone(),
                    waiting_since,
                    served_at: counts.served_at,
                });
            }
        }
        Ok(unserved)
    }
    /// A queue's settings: whether it is paused, and its limits.
    fn queue_settings(&self, queue: &str) -> Result<QueueSettings>;
    /// Every schedule, by name.
    fn schedules(&self) -> Result<Vec<ScheduleInfo>>;
    /// The integrity check.
    fn check(&self) -> Result<CheckReport>;
    /// Whether store time counts from the Unix epoch (a database's clock, shown to a person
    /// as a date) rather than from the store's own start (a file's, shown as `t+…`).
    fn time_is_wall_clock(&self) -> bool {
        false
    }
}

/// A store: the lease protocol's calls, and the read side. Implemented by leasehold's
/// stores alone (the redb [`Store`](crate::Store), the PostgreSQL `PgStore`).
pub trait JobStore: ReadJobs + LeaseBackend {
    /// Enqueues a job and returns its id (or, for a unique key a live job holds, that job's).
    fn enqueue(&self, job: NewJob) -> Result<JobId> {
        write(self, move |r| protocol::enqueue(r, &job))
    }

    /// Enqueues many jobs in one transaction: all of them or, on any error, none.
    fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        write(self, move |r| protocol::enqueue_batch(r, &jobs))
    }

    /// Opens a group of jobs ([`NewGroup`]) with its callbacks, each a job that waits for
    /// the group's end: add members with [`NewJob::in_group`], then
    /// [`JobStore::seal_group`]. The group ends (and its callbacks become claimable, each
    /// exactly once) when it is sealed and every member has ended; the end that completes
    /// it releases them in its own transaction.
    /// With a key ([`NewGroup::key`]), a group the key already names is answered instead,
    /// and nothing is made.
    fn open_group(&self, group: NewGroup) -> Result<GroupId> {
        write(self, move |r| match protocol::keyed_group(r, &group)? {
            Some(made) => Ok(made),
            None => protocol::open_group(r, &group),
        })
    }

    /// Seals a group: no job joins it any more. A sealed group whose members have all ended
    /// ends at once.
    fn seal_group(&self, group: GroupId) -> Result<()> {
        write(self, move |r| protocol::seal_group(r, group))
    }

    /// Opens a group, adds `members` and seals it, all in one transaction (or nothing, on
    /// any error): the group's id and its members' ids, in order. With a key
    /// ([`NewGroup::key`]), a group the key already names is answered instead (its id and
    /// its members' ids, oldest first), and nothing is made.
    fn enqueue_group(
        &self,
        group: NewGroup,
        members: Vec<NewJob>,
    ) -> Result<(GroupId, Vec<JobId>)> {
        write(self, move |r| {
            if let Some(made) = protocol::keyed_group(r, &group)? {
                return Ok((made, r.members(made)?));
            }
            let id = protocol::open_group(r, &group)?;
            let ids = protocol::enqueue_members(r, id, &members)?;
            protocol::seal_group(r, id)?;
            Ok((id, ids))
        })
    }

    /// Cancels a group: its callbacks never run, it is sealed, and each member not yet
    /// ended is cancelled (at once if waiting, at its next heartbeat if running). Returns
    /// how many jobs were cancelled or flagged.
    fn cancel_group(&self, group: GroupId) -> Result<usize> {
        write(self, move |r| protocol::cancel_group(r, group))
    }

    /// Claims the most urgent claimable job of `queue` for `worker` under a lease of
    /// `terms`: a waiting job that is due, or a running one whose lease has expired (taken
    /// over, with a `LeaseExpired` record for the attempt that lost it). One atomic write:
    /// two claimers can never both win. `None` if nothing is claimable.
    fn claim(&self, queue: &str, worker: &str, terms: LeaseTerms) -> Result<Option<Lease>> {
        Ok(self.claim_batch(queue, worker, terms, 1)?.pop())
    }

    /// Claims up to `n` jobs of `queue` in one transaction (one commit), most urgent first:
    /// for pools that run many jobs at once.
    fn claim_batch(
        &self,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> Result<Vec<Lease>> {
        let marks = self.marks_due(&mut std::iter::once(queue));
        let (queue, worker) = (queue.to_owned(), worker.to_owned());
        write(self, move |r| {
            let claimed = protocol::claim_batch(r, &queue, &worker, terms, n)?;
            r.mark_served(&marks)?;
            Ok(claimed)
        })
    }

    /// Claims from several queues in one transaction: up to each queue's count of `plan`,
    /// in order, then what one could not give (empty, paused, at its limit) from the others
    /// that gave all of theirs, in the same order. The claim a pool over several queues
    /// makes each round ([`crate::Queues`]), for claim loops of an application's own.
    fn claim_queues(
        &self,
        plan: &[(&str, usize)],
        worker: &str,
        terms: LeaseTerms,
    ) -> Result<Vec<Lease>> {
        let plan: Vec<(String, usize)> = plan.iter().map(|(q, n)| ((*q).to_owned(), *n)).collect();
        let claim = crate::protocol::Claim {
            plan: &plan,
            worker,
            terms,
        };
        crate::holder::round(self, &[], claim).1
    }

    /// Claims one named job if it is claimable now: waiting and due, or running with an
    /// expired lease.
    fn claim_job(&self, job: JobId, worker: &str, terms: LeaseTerms) -> Result<Option<Lease>> {
        let worker = worker.to_owned();
        write(self, move |r| protocol::claim_job(r, job, &worker, terms))
    }

    /// Renews `lease` by its length from now and records `progress`, if it is still held.
    /// [`Error::LeaseLost`] means stop working and commit nothing.
    fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<Renewal> {
        let mut answers = crate::holder::renew(self, &[(lease, progress)], Vec::new())?;
        answers
            .pop()
            .unwrap_or(Err(Error::Internal("a renewal without its answer")))
    }

    /// Saves `data` as the checkpoint of `lease`'s attempt, for the job's next attempts to
    /// resume from ([`ReadJobs::checkpoint`]; a handler's
    /// [`JobContext::save_checkpoint`](crate::JobContext::save_checkpoint)), in place of the
    /// last one. Fenced like the attempt's end: [`Error::LeaseLost`] once the lease is lost
    /// (what the job's current holder saved stays). At most `max_payload` bytes. Committed
    /// when this returns, durably as the store's other writes are.
    fn save_checkpoint(&self, lease: &Lease, data: &[u8]) -> Result<()> {
        let (by, data) = (lease.holding(), data.to_vec());
        write(self, move |r| protocol::save_checkpoint(r, by, &data))
    }

    /// Appends `lines` to the log of `lease`'s attempt, at once, in one write transaction
    /// (a pool's handler writes with [`JobContext::log`](crate::JobContext::log), whose
    /// lines ride with the heartbeats). Bounded per attempt as that log is. A holder whose
    /// lease was lost still writes to its own attempt's log; nothing is written for a job
    /// that is gone.
    fn log(&self, lease: &Lease, lines: &[&str]) -> Result<()> {
        let now = self.clock();
        let mut record = crate::job_log::LogRecord::default();
        let cut: Vec<_> = lines.iter().map(|l| crate::job_log::line(now, l)).collect();
        record.append(&cut);
        let by = lease.holding();
        write(self, move |r| protocol::append_log(r, by, &record))
    }

    /// Renews many leases in one transaction; one answer per lease, in order. A lost lease
    /// fails only its own entry; if the commit itself fails, every entry says so.
    fn heartbeat_batch(&self, beats: &[(&Lease, u64)]) -> Vec<Result<Renewal>> {
        match crate::holder::renew(self, beats, Vec::new()) {
            Ok(answers) => answers,
            Err(e) => {
                let each = crate::error::shared_by_all(e);
                beats.iter().map(|_| Err(each())).collect()
            }
        }
    }

    /// Completes the attempt held by `lease` with `output`, if the lease still holds.
    fn complete(&self, lease: &Lease, output: &[u8]) -> Result<()> {
        crate::holder::end(self, lease, End::Complete(output.to_vec()), None).map(|_| ())
    }

    /// Completes many attempts in one commit, each its own unit: a completion that is
    /// refused (its lease was lost) or whose output is too large fails only its own entry.
    /// One answer per entry, in order; if the commit itself fails, every entry says so.
    fn complete_batch(&self, done: &[(&Lease, &[u8])]) -> Vec<Result<()>> {
        self.complete_all_then_claim(crate::holder::completions(done), None)
            .0
    }

    /// Completes the attempt held by `lease` and, in the same transaction, claims the next
    /// job of its queue for the same worker under `terms`: one commit where a worker that
    /// goes straight on to its next job would otherwise make two. If the completion is
    /// refused (the lease is lost), nothing is claimed and the error is the refusal.
    fn complete_and_claim(
        &self,
        lease: &Lease,
        output: &[u8],
        terms: LeaseTerms,
    ) -> Result<Option<Lease>> {
        crate::holder::complete_then_claim(self, lease, output, None, terms)
    }

    /// Completes each of `done` as its own unit and, in the same commit, claims up to `n`
    /// jobs of `queue` for `worker` under `terms`: what a pipelined worker of the
    /// application's own does between batches (a worker pool's dispatcher does the same).
    /// The claim decides as if the completions came first. One answer per completion, in
    /// order, then the claim's; bad claim input answers every part, and nothing is written.
    fn complete_batch_and_claim(
        &self,
        done: &[(&Lease, &[u8])],
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let plan = [(queue.to_owned(), n)];
        let claim = crate::protocol::Claim {
            plan: &plan,
            worker,
            terms,
        };
        crate::holder::round(self, done, claim)
    }

    /// Fails the attempt held by `lease`: the job waits out a backoff and runs again while
    /// its retry budget lasts, else it is dead. Returns the job's new state.
    fn fail(&self, lease: &Lease, error: &str) -> Result<JobState> {
        let fail = End::Fail(error.to_owned(), Retry::WhileBudgetLasts);
        crate::holder::end(self, lease, fail, None)
    }

    /// Fails the attempt held by `lease` with a failure that running the job again cannot
    /// mend (a payload this build will never read, a request the remote side refuses for
    /// good): the job is dead at once, whatever budget it had left, with
    /// [`Outcome::FailedPermanently`](crate::Outcome::FailedPermanently) in its history
    /// (cancelled instead, if a cancel was requested meanwhile). [`JobStore::retry`] brings it
    /// back once something changed. Returns the job's new state.
    fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<JobState> {
        crate::holder::end(self, lease, End::Fail(error.to_owned(), Retry::Never), None)
    }

    /// Ends the attempt held by `lease` as timed out
    /// ([`Outcome::TimedOut`](crate::Outcome::TimedOut)): for a claim loop that keeps its
    /// job's hard time limit itself ([`Lease::deadline`]; a pool does it for its handlers).
    /// Retried after a backoff while the budget lasts, else dead. Returns the job's new state.
    fn time_out(&self, lease: &Lease) -> Result<JobState> {
        crate::holder::end(self, lease, End::TimeOut, None)
    }

    /// Puts the job held by `lease` off by `delay` ("not yet": a remote side asked to be
    /// called back later, a resource is busy): the attempt ends as
    /// [`Outcome::Snoozed`](crate::Outcome::Snoozed) with no retry budget spent, and the job
    /// is claimable again `delay` from now, behind jobs that were due earlier. A cancel
    /// requested meanwhile wins. Returns the job's new state.
    fn snooze(&self, lease: &Lease, delay: Duration) -> Result<JobState> {
        crate::holder::end(self, lease, End::Snooze(delay), None)
    }

    /// Gives the job back (graceful shutdown): claimable at once, no retry budget spent.
    fn release(&self, lease: &Lease) -> Result<()> {
        crate::holder::end(self, lease, End::Release, None).map(|_| ())
    }

    /// Cancels a job. A waiting job is cancelled at once; a running one is flagged, its
    /// holder is told at its next heartbeat, and it ends cancelled (also if the holder fails
    /// or releases it, or dies). A holder that completes before its next heartbeat has done
    /// the work: the job then succeeds, since its effects are already committed. Returns the
    /// job's state: `Cancelled`, or `Running` for a flagged one.
    fn cancel(&self, job: JobId) -> Result<JobState> {
        write(self, move |r| {
            protocol::cancel(r, job).map(|(state, _)| state)
        })
    }

    /// Edits a job that waits (queued, backing off or blocked): its payload, priority, due
    /// time or metadata ([`crate::Edit`]; `Edit::new().now()` runs a delayed job now).
    /// Refused ([`Error::Refused`]) for a job that runs or has ended, and
    /// ([`Error::EditConflict`]) for one claimed since the attempt the edit names: an edit
    /// never touches a job that ran meanwhile.
    fn edit(&self, job: JobId, edit: crate::edit::Edit) -> Result<()> {
        write(self, move |r| protocol::edit(r, job, &edit))
    }

    /// Puts a dead, cancelled or expired job back in the queue with a fresh retry budget (and
    /// no expiry); its history is kept. Refused for jobs in any other state, and ([`Error::UniqueKeyHeld`]) while a
    /// live job that took the job's unique key after it finished still holds it.
    fn retry(&self, job: JobId) -> Result<()> {
        write(self, move |r| protocol::retry(r, job))
    }

    /// Retries every job `filter` names that is dead, cancelled or expired (an operator's bulk
    /// action: "everything that died in queue `uploads` in the last hour"), in transactions
    /// of at most the reap batch each, oldest first (the filter's order is not used; its
    /// limit bounds the whole action). Jobs in other states, and those whose unique key
    /// another job holds, are refused, each listed in the report; nothing of theirs changes.
    fn retry_all(&self, filter: &JobFilter) -> Result<BulkReport> {
        bulk(self, filter, |r, id| protocol::retry(r, id).map(|()| true))
    }

    /// Cancels every job `filter` names (waiting ones at once, running ones at their next
    /// heartbeat), in batches as [`JobStore::retry_all`] does. Finished jobs are refused (a
    /// cancelled one is left as it is, and not counted as changed).
    fn cancel_all(&self, filter: &JobFilter) -> Result<BulkReport> {
        bulk(self, filter, |r, id| {
            protocol::cancel(r, id).map(|(_, changed)| changed)
        })
    }

    /// Makes `queue` known to the store with no settings, so that an application may set its
    /// controls before its first job is enqueued; a queue already known is left as it is.
    /// The controls below refuse a queue the store does not know ([`Error::QueueNotFound`]),
    /// so that a mistyped name makes no new queue.
    fn declare_queue(&self, queue: &str) -> Result<()> {
        let queue = queue.to_owned();
        write(self, move |r| protocol::declare_queue(r, &queue))
    }

    /// Pauses `queue`: from the next claim on, in every process and machine, no claim takes
    /// its jobs (running jobs finish, and are renewed, completed and reaped as ever).
    /// Recorded in the store, so it outlasts the process that paused it. A queue the store
    /// does not know is refused ([`Error::QueueNotFound`]; see
    /// [`JobStore::declare_queue`]).
    fn pause_queue(&self, queue: &str) -> Result<()> {
        let queue = queue.to_owned();
        write(self, move |r| protocol::pause_queue(r, &queue, true))
    }

    /// Resumes a paused `queue`, waking its idle workers.
    fn resume_queue(&self, queue: &str) -> Result<()> {
        let queue = queue.to_owned();
        write(self, move |r| protocol::pause_queue(r, &queue, false))
    }

    /// Sets `queue`'s limits, which every claim of every process and machine keeps
    /// ([`QueueLimits`]): at most so many of its jobs held at once, at most so many claims
    /// per period. `QueueLimits::none()` lifts them. A queue the store does not know is
    /// refused ([`Error::QueueNotFound`]): declare it first ([`JobStore::declare_queue`]).
    fn set_queue_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        let queue = queue.to_owned();
        write(self, move |r| protocol::set_queue_limits(r, &queue, limits))
    }

    /// Sets the retry policy of `queue`'s jobs that have none of their own
    /// ([`crate::NewJob::retry_policy`]): each of their failures from now on, in every
    /// process and machine, waits by it; `None` leaves them the store's
    /// ([`crate::StoreBuilder::retry_policy`]). An invalid policy is an input error; a queue
    /// the store does not know is refused ([`Error::QueueNotFound`]).
    fn set_queue_retry_policy(&self, queue: &str, policy: Option<RetryPolicy>) -> Result<()> {
        let queue = queue.to_owned();
        write(self, move |r| {
            protocol::set_queue_retry_policy(r, &queue, policy.clone())
        })
    }

    /// Declares a periodic job ([`Schedule`]): new, or (every process declares its
    /// schedules at start) as it was, keeping its cursor, unless its timing changed. A
    /// [`Scheduler`](crate::Scheduler) fires its ticks.
    fn declare_schedule(&self, schedule: Schedule) -> Result<()> {
        let wall = crate::clock::wall_seconds(crate::clock::wall_now());
        write(self, move |r| {
            protocol::declare_schedule(r, &schedule, wall)
        })?;
        self.schedules_changed();
        Ok(())
    }

    /// Fires every schedule whose tick has come, at the wall clock's time now (see
    /// [`JobStore::fire_schedules_at`]).
    fn fire_schedules(&self) -> Result<Vec<JobId>> {
        self.fire_schedules_at(crate::clock::wall_now())
    }

    /// Fires every schedule whose tick has come by store time (every interval) and by `wall`
    /// (cron), each tick's job enqueued once however many processes fire (the cursor moves
    /// in the same transaction); missed ticks as each schedule's catch-up policy says.
    /// Returns the jobs enqueued. A [`Scheduler`](crate::Scheduler) calls it on a timer.
    fn fire_schedules_at(&self, wall: std::time::SystemTime) -> Result<Vec<JobId>> {
        let wall = crate::clock::wall_seconds(wall);
        write(self, move |r| protocol::fire_schedules(r, wall)).map(|fired| fired.jobs)
    }

    /// Pauses a schedule: none of its ticks fire until it resumes (those that pass meanwhile
    /// are missed ticks then, handled by its catch-up policy).
    fn pause_schedule(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        write(self, move |r| protocol::pause_schedule(r, &name, true))?;
        self.schedules_changed();
        Ok(())
    }

    /// Resumes a paused schedule.
    fn resume_schedule(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        write(self, move |r| protocol::pause_schedule(r, &name, false))?;
        self.schedules_changed();
        Ok(())
    }

    /// Removes a schedule (its jobs already enqueued stay); `false` if there was none.
    fn remove_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        let removed = write(self, move |r| protocol::remove_schedule(r, &name))?;
        self.schedules_changed();
        Ok(removed)
    }

    /// One reaper pass: takes back every lease that expired at or before now, in
    /// transactions of at most the configured batch; ends as expired the waiting jobs past
    /// their expiry ([`crate::NewJob::expires_in`]); then, with a retention set, purges the
    /// succeeded, cancelled and expired jobs that outlived it, in batches too. The pass is recorded
    /// as the store's last ([`Stats::last_reaper_pass`]).
    fn reap(&self) -> Result<ReapReport> {
        reaper_pass(self, None, None).map(|(report, _)| report)
    }

    /// Deletes terminal jobs in `states` (succeeded, dead, cancelled, expired) that finished
    /// at least `older_than` ago on the store clock, with their payloads, outputs, history,
    /// checkpoints and logs, in batches like the reaper; then the groups that ended as long
    /// ago and that nothing stored refers to any more (no member, no job that waited for
    /// them, no group in them), with their keys; then the endings kept from as long ago
    /// ([`ReadJobs::endings`]). Their ids are never reused. Returns how many jobs were
    /// deleted.
    fn purge(&self, older_than: Duration, states: &[JobState]) -> Result<usize> {
        let (now, batch) = (self.clock(), self.policy().reap_batch);
        let start = (StoreTime::ZERO, JobId(0));
        let purged =
            protocol::purge_in_batches(now, older_than, batch, start, |from, cutoff, limit| {
                let states = states.to_vec();
                write(self, move |r| {
                    protocol::purge(r, from, cutoff, &states, limit)
                })
            })?;
        purge_groups(self, now, older_than)?;
        trim_endings(self, now, older_than)?;
        Ok(purged)
    }

    /// The queue's wake-up generation. Read it *before* looking for work, then pass it to
    /// [`JobStore::wait_for_work`], so that work arriving in between is not missed.
    fn work_generation(&self, queue: &str) -> u64 {
        self.notifier().generation(queue)
    }

    /// Blocks until a commit gives `queue` a waiting job (an enqueue, a release, a reclaim, a
    /// retry), [`JobStore::wake_all`] is called, or `timeout` passes. Returns the new
    /// generation. Commits this handle cannot hear of do not wake it: bound `timeout` (by
    /// the queue's next due time, say) to notice those. A redb store hears its own process's
    /// commits; a `PgStore` every machine's (by `LISTEN`), as hints.
    fn wait_for_work(&self, queue: &str, seen: u64, timeout: Duration) -> u64 {
        self.notifier().wait(queue, seen, timeout)
    }

    /// [`JobStore::wait_for_work`] for several queues: blocks until a commit gives one of
    /// them a waiting job, [`JobStore::wake_all`] is called, or `timeout` passes. `seen` has
    /// each queue's generation as read before looking for work.
    fn wait_for_any_work(&self, seen: &[(&str, u64)], timeout: Duration) {
        self.notifier().wait_any(seen, timeout)
    }

    /// [`JobStore::wait_for_work`] for async code: resolves when a commit gives `queue` work,
    /// [`JobStore::wake_all`] is called, or `timeout` passes, with the generation then. Read
    /// the generation before looking for work ([`JobStore::work_generation`]), so that a
    /// wake-up in between is not lost.
    #[cfg(feature = "tokio")]
    fn wait_for_work_async<'a>(
        &'a self,
        queue: &'a str,
        seen: u64,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = u64> + Send + 'a>> {
        Box::pin(async move {
            match self.notifier().changed(queue, seen, timeout).await {
                Some(generation) => generation,
                None => self.work_generation(queue),
            }
        })
    }

    /// Subscribes to what this store handle (and its clones) commits from now on: jobs
    /// claimed, attempts ended with their outcome (a reclaim with its path), schedules fired,
    /// claims held back by a limit, queues paused and resumed ([`crate::Event`]). Each
    /// process hears its own commits; see [`crate::Events`] for what a slow reader loses.
    fn subscribe(&self) -> crate::events::Events {
        self.hub().subscribe()
    }

    /// Wakes every waiter of [`JobStore::wait_for_work`], and a
    /// [`Scheduler`](crate::Scheduler) asleep until its next tick: for time that moved
    /// without a commit, such as a [`ManualClock`](crate::ManualClock) advanced by a test.
    fn wake_all(&self) {
        self.notifier().notify_all();
        self.notifier().notify_schedules();
    }
}

/// A reaper's pass ([`JobStore::reap`]) by a reaper that runs `every` (`None`: a pass called
/// directly), which last kept its record at `kept`. The record ([`crate::ReaperPass`]) is
/// kept, and its time returned, unless the pass had nothing to do and the last one kept is
/// younger than an interval and a half: an idle reaper then writes every other pass (what
/// shows it alive, [`crate::ReaperPass::late`], allows three intervals), and an idle store's
/// pass, which reads rather than commits a transaction that takes nothing, mostly writes
/// nothing at all.
pub(crate) fn reaper_pass(
    store: &(impl JobStore + ?Sized),
    every: Option<Duration>,
    kept: Option<StoreTime>,
) -> Result<(ReapReport, Option<StoreTime>)> {
    let looks = store.reaper_looks()?;
    let began = looks.now;
    let mut report = match looks.leases_expired {
        true => ReapReport::from(crate::batches::run(store.policy().reap_batch, |limit| {
            write(store, move |r| {
                protocol::reap_batch(
                    r,
                    limit,
                    crate::job::ReclaimPath::Reaper,
                    &Default::default(),
                )
            })
        })?),
        false => ReapReport::default(),
    };
    // (a lease taken back may have put its job back to wait past its expiry: it is ended
    // in this pass, as when the look came after the reclaims)
    if looks.past_expiry || !report.reclaimed.is_empty() {
        let batch = store.policy().reap_batch;
        let pass = crate::batches::run(batch, |limit| {
            write(store, move |r| protocol::expire_waiting(r, limit))
        })?;
        report.expired = pass.items;
    }
    if let Some(keep) = store.policy().retention {
        let ended = [JobState::Succeeded, JobState::Cancelled, JobState::Expired];
        report.purged = store.purge(keep, &ended)?;
    }
    store.after_reap(&mut report)?;
    let ended = store.clock();
    let idle = !report.changed_jobs() && report.vacuum_started.is_empty();
    let recent = |every: Duration, kept: StoreTime| ended.saturating_since(kept) < every * 3 / 2;
    if idle
        && every
            .zip(kept)
            .is_some_and(|(every, kept)| recent(every, kept))
    {
        return Ok((report, None));
    }
    store.note_reaper_pass(&crate::report::ReaperPass::of(&report, began, ended, every))?;
    Ok((report, Some(ended)))
}

/// Deletes the groups that ended at least `older_than` before `now` and that nothing
/// stored refers to any more ([`protocol::purge_groups`]), in batches. Returns how many.
pub(crate) fn purge_groups(
    store: &(impl JobStore + ?Sized),
    now: StoreTime,
    older_than: Duration,
) -> Result<usize> {
    let (batch, start) = (store.policy().reap_batch, (StoreTime::ZERO, GroupId(0)));
    protocol::purge_in_batches(now, older_than, batch, start, |from, cutoff, limit| {
        write(store, move |r| {
            protocol::purge_groups(r, from, cutoff, limit)
        })
    })
}

/// Deletes the endings kept from at least `older_than` before `now`
/// ([`crate::ReadJobs::endings`]), oldest first, in batches. Returns how many.
pub(crate) fn trim_endings(
    store: &(impl JobStore + ?Sized),
    now: StoreTime,
    older_than: Duration,
) -> Result<usize> {
    let (batch, start) = (store.policy().reap_batch, (StoreTime::ZERO, ()));
    protocol::purge_in_batches(now, older_than, batch, start, |from, cutoff, limit| {
        write(store, move |r| {
            let trimmed = r.trim_endings(cutoff, limit)?;
            let items = vec![(); trimmed];
            Ok((
                crate::batches::Batch {
                    items,
                    looked: trimmed,
                },
                from,
            ))
        })
    })
}

/// `act` on every job `filter` names, a page of them per transaction (see
/// [`crate::batches::bulk`]).
fn bulk(
    store: &(impl JobStore + ?Sized),
    filter: &JobFilter,
    act: fn(&mut dyn protocol::Records, JobId) -> Result<bool>,
) -> Result<BulkReport> {
    crate::batches::bulk(
        filter,
        store.policy().reap_batch,
        |f| store.jobs(f),
        |ids| {
            write(store, move |r| {
                crate::batches::answers(ids.iter().map(|&id| act(r, id)).collect::<Vec<_>>())
            })
        },
    )
}
