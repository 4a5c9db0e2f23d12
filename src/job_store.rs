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
//! Both traits are object-safe: lease terms are [`LeaseTerms`] here, where the stores' own
//! methods also take a bare [`Duration`].

use std::time::Duration;

use crate::error::Result;
use crate::ids::{JobId, StoreTime};
use crate::job::{Job, JobState, NewJob, Run};
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::query::{JobFilter, QueueTiming};
use crate::queue::{QueueLimits, QueueSettings, UnservedQueue};
use crate::report::{BulkReport, CheckReport, ReapReport};
use crate::schedule::{Schedule, ScheduleInfo};
use crate::stats::Stats;

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
    /// The jobs `filter` asks for, in its order.
    fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>>;
    /// When things fall due in `queue`.
    fn timing(&self, queue: &str) -> Result<QueueTiming>;
    /// Counts per queue and state, and the lifetime counters.
    fn stats(&self) -> Result<Stats>;
    /// The queues whose due work has waited [`crate::UNSERVED_AFTER`] or more with no worker
    /// asking for it that long (a typo in a queue name, a pool that never started).
    fn unserved_queues(&self) -> Result<Vec<UnservedQueue>>;
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

/// A store: the lease protocol's calls, and the read side.
pub trait JobStore: ReadJobs {
    /// Enqueues a job; with a unique key that a live job holds, returns that job instead.
    fn enqueue(&self, job: NewJob) -> Result<JobId>;
    /// Enqueues many jobs, all or none.
    fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>>;
    /// Claims the most urgent claimable job of `queue` under a lease for `worker`.
    fn claim(&self, queue: &str, worker: &str, terms: LeaseTerms) -> Result<Option<Lease>>;
    /// Claims up to `n` jobs of `queue`, most urgent first, in one transaction.
    fn claim_batch(
        &self,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> Result<Vec<Lease>>;
    /// Claims one named job if it is claimable now.
    fn claim_job(&self, job: JobId, worker: &str, terms: LeaseTerms) -> Result<Option<Lease>>;
    /// Renews a lease, recording progress.
    fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<Renewal>;
    /// Renews many leases at once; one answer per lease, in order.
    fn heartbeat_batch(&self, beats: &[(&Lease, u64)]) -> Vec<Result<Renewal>>;
    /// Completes the attempt.
    fn complete(&self, lease: &Lease, output: &[u8]) -> Result<()>;
    /// Completes many attempts at once, each with its own answer.
    fn complete_batch(&self, done: &[(&Lease, &[u8])]) -> Vec<Result<()>>;
    /// Completes the attempt and claims the same worker's next job of its queue, at once.
    fn complete_and_claim(
        &self,
        lease: &Lease,
        output: &[u8],
        terms: LeaseTerms,
    ) -> Result<Option<Lease>>;
    /// Completes each of `done` as its own unit and claims up to `n` jobs of `queue` for
    /// `worker`, as if the completions committed first: what a pipelined worker does between
    /// batches, and what a worker pool's dispatcher does. One answer per completion, in
    /// order, then the claim's.
    fn complete_batch_and_claim(
        &self,
        done: &[(&Lease, &[u8])],
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>);
    /// Fails the attempt: retried after a backoff while its budget lasts, else dead.
    fn fail(&self, lease: &Lease, error: &str) -> Result<JobState>;
    /// Fails the attempt for good: dead at once, whatever budget is left.
    fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<JobState>;
    /// Ends the attempt as timed out (its hard time limit passed): retried after a backoff
    /// while its budget lasts, else dead.
    fn time_out(&self, lease: &Lease) -> Result<JobState>;
    /// Puts the job off by `delay` ("not yet"): the attempt ends, no budget spent, and the
    /// job waits until `delay` from now.
    fn snooze(&self, lease: &Lease, delay: Duration) -> Result<JobState>;
    /// Gives the job back on purpose: claimable at once, no budget spent.
    fn release(&self, lease: &Lease) -> Result<()>;
    /// Cancels a job (a running one at its holder's next heartbeat).
    fn cancel(&self, job: JobId) -> Result<JobState>;
    /// Puts a dead or cancelled job back in its queue with a fresh budget.
    fn retry(&self, job: JobId) -> Result<()>;
    /// Retries every dead or cancelled job `filter` names, in bounded batches; the others
    /// are refused and listed.
    fn retry_all(&self, filter: &JobFilter) -> Result<BulkReport>;
    /// Cancels every job `filter` names, in bounded batches; finished ones are refused.
    fn cancel_all(&self, filter: &JobFilter) -> Result<BulkReport>;
    /// Pauses a queue: no claim of any process or machine takes its jobs until it resumes.
    fn pause_queue(&self, queue: &str) -> Result<()>;
    /// Resumes a paused queue.
    fn resume_queue(&self, queue: &str) -> Result<()>;
    /// Sets a queue's limits across every process and machine.
    fn set_queue_limits(&self, queue: &str, limits: QueueLimits) -> Result<()>;
    /// Declares a periodic job (new, or as it was but for its job and catch-up).
    fn declare_schedule(&self, schedule: Schedule) -> Result<()>;
    /// Fires every schedule whose tick has come by store time and by `wall` (cron).
    fn fire_schedules_at(&self, wall: std::time::SystemTime) -> Result<Vec<JobId>>;
    /// Pauses a schedule.
    fn pause_schedule(&self, name: &str) -> Result<()>;
    /// Resumes a paused schedule.
    fn resume_schedule(&self, name: &str) -> Result<()>;
    /// Removes a schedule; `false` if there was none.
    fn remove_schedule(&self, name: &str) -> Result<bool>;
    /// One reaper pass: takes back expired leases (and applies retention).
    fn reap(&self) -> Result<ReapReport>;
    /// Deletes finished jobs in `states` older than `older_than`, with their history.
    fn purge(&self, older_than: Duration, states: &[JobState]) -> Result<usize>;
    /// The wake-up generation of `queue`: pass it to [`JobStore::wait_for_work`].
    fn work_generation(&self, queue: &str) -> u64;
    /// Waits until a commit gives `queue` work, or `timeout` passes.
    fn wait_for_work(&self, queue: &str, seen: u64, timeout: Duration) -> u64;
    /// Wakes every waiter of [`JobStore::wait_for_work`] in this process.
    fn wake_all(&self);
}

/// The read side as the type's own methods give it, for each store type.
macro_rules! read_jobs {
    ($store:ty, $now:expr $(, wall_clock = $wall:expr)?) => {
        impl $crate::job_store::ReadJobs for $store {
            fn now(&self) -> $crate::Result<$crate::StoreTime> {
                $now(self)
            }
            fn job(&self, job: $crate::JobId) -> $crate::Result<Option<$crate::Job>> {
                <$store>::job(self, job)
            }
            fn history(&self, job: $crate::JobId) -> $crate::Result<Vec<$crate::Run>> {
                <$store>::history(self, job)
            }
            fn payload(&self, job: $crate::JobId) -> $crate::Result<Option<Vec<u8>>> {
                <$store>::payload(self, job)
            }
            fn output(&self, job: $crate::JobId) -> $crate::Result<Option<Vec<u8>>> {
                <$store>::output(self, job)
            }
            fn jobs(&self, filter: &$crate::JobFilter) -> $crate::Result<Vec<$crate::Job>> {
                <$store>::jobs(self, filter)
            }
            fn timing(&self, queue: &str) -> $crate::Result<$crate::QueueTiming> {
                <$store>::timing(self, queue)
            }
            fn stats(&self) -> $crate::Result<$crate::Stats> {
                <$store>::stats(self)
            }
            fn unserved_queues(&self) -> $crate::Result<Vec<$crate::UnservedQueue>> {
                <$store>::unserved_queues(self)
            }
            fn queue_settings(&self, queue: &str) -> $crate::Result<$crate::QueueSettings> {
                <$store>::queue_settings(self, queue)
            }
            fn schedules(&self) -> $crate::Result<Vec<$crate::ScheduleInfo>> {
                <$store>::schedules(self)
            }
            fn check(&self) -> $crate::Result<$crate::CheckReport> {
                <$store>::check(self)
            }
            $(
                fn time_is_wall_clock(&self) -> bool {
                    $wall
                }
            )?
        }
    };
}
pub(crate) use read_jobs;

/// The protocol's calls as the type's own methods give them, for each store type.
macro_rules! job_store {
    ($store:ty) => {
        impl $crate::job_store::JobStore for $store {
            fn enqueue(&self, job: $crate::NewJob) -> $crate::Result<$crate::JobId> {
                <$store>::enqueue(self, job)
            }
            fn enqueue_batch(
                &self,
                jobs: Vec<$crate::NewJob>,
            ) -> $crate::Result<Vec<$crate::JobId>> {
                <$store>::enqueue_batch(self, jobs)
            }
            fn claim(
                &self,
                queue: &str,
                worker: &str,
                terms: $crate::LeaseTerms,
            ) -> $crate::Result<Option<$crate::Lease>> {
                <$store>::claim(self, queue, worker, terms)
            }
            fn claim_batch(
                &self,
                queue: &str,
                worker: &str,
                terms: $crate::LeaseTerms,
                n: usize,
            ) -> $crate::Result<Vec<$crate::Lease>> {
                <$store>::claim_batch(self, queue, worker, terms, n)
            }
            fn claim_job(
                &self,
                job: $crate::JobId,
                worker: &str,
                terms: $crate::LeaseTerms,
            ) -> $crate::Result<Option<$crate::Lease>> {
                <$store>::claim_job(self, job, worker, terms)
            }
            fn heartbeat(
                &self,
                lease: &$crate::Lease,
                progress: u64,
            ) -> $crate::Result<$crate::Renewal> {
                <$store>::heartbeat(self, lease, progress)
            }
            fn heartbeat_batch(
                &self,
                beats: &[(&$crate::Lease, u64)],
            ) -> Vec<$crate::Result<$crate::Renewal>> {
                <$store>::heartbeat_batch(self, beats)
            }
            fn complete(&self, lease: &$crate::Lease, output: &[u8]) -> $crate::Result<()> {
                <$store>::complete(self, lease, output)
            }
            fn complete_batch(&self, done: &[(&$crate::Lease, &[u8])]) -> Vec<$crate::Result<()>> {
                <$store>::complete_batch(self, done)
            }
            fn complete_and_claim(
                &self,
                lease: &$crate::Lease,
                output: &[u8],
                terms: $crate::LeaseTerms,
            ) -> $crate::Result<Option<$crate::Lease>> {
                <$store>::complete_and_claim(self, lease, output, terms)
            }
            fn complete_batch_and_claim(
                &self,
                done: &[(&$crate::Lease, &[u8])],
                queue: &str,
                worker: &str,
                terms: $crate::LeaseTerms,
                n: usize,
            ) -> (Vec<$crate::Result<()>>, $crate::Result<Vec<$crate::Lease>>) {
                <$store>::complete_batch_and_claim(self, done, queue, worker, terms, n)
            }
            fn fail(&self, lease: &$crate::Lease, error: &str) -> $crate::Result<$crate::JobState> {
                <$store>::fail(self, lease, error)
            }
            fn fail_permanently(
                &self,
                lease: &$crate::Lease,
                error: &str,
            ) -> $crate::Result<$crate::JobState> {
                <$store>::fail_permanently(self, lease, error)
            }
            fn time_out(&self, lease: &$crate::Lease) -> $crate::Result<$crate::JobState> {
                <$store>::time_out(self, lease)
            }
            fn snooze(
                &self,
                lease: &$crate::Lease,
                delay: std::time::Duration,
            ) -> $crate::Result<$crate::JobState> {
                <$store>::snooze(self, lease, delay)
            }
            fn release(&self, lease: &$crate::Lease) -> $crate::Result<()> {
                <$store>::release(self, lease)
            }
            fn cancel(&self, job: $crate::JobId) -> $crate::Result<$crate::JobState> {
                <$store>::cancel(self, job)
            }
            fn retry(&self, job: $crate::JobId) -> $crate::Result<()> {
                <$store>::retry(self, job)
            }
            fn retry_all(&self, filter: &$crate::JobFilter) -> $crate::Result<$crate::BulkReport> {
                <$store>::retry_all(self, filter)
            }
            fn cancel_all(&self, filter: &$crate::JobFilter) -> $crate::Result<$crate::BulkReport> {
                <$store>::cancel_all(self, filter)
            }
            fn pause_queue(&self, queue: &str) -> $crate::Result<()> {
                <$store>::pause_queue(self, queue)
            }
            fn resume_queue(&self, queue: &str) -> $crate::Result<()> {
                <$store>::resume_queue(self, queue)
            }
            fn set_queue_limits(
                &self,
                queue: &str,
                limits: $crate::QueueLimits,
            ) -> $crate::Result<()> {
                <$store>::set_queue_limits(self, queue, limits)
            }
            fn declare_schedule(&self, schedule: $crate::Schedule) -> $crate::Result<()> {
                <$store>::declare_schedule(self, schedule)
            }
            fn fire_schedules_at(
                &self,
                wall: std::time::SystemTime,
            ) -> $crate::Result<Vec<$crate::JobId>> {
                <$store>::fire_schedules_at(self, wall)
            }
            fn pause_schedule(&self, name: &str) -> $crate::Result<()> {
                <$store>::pause_schedule(self, name)
            }
            fn resume_schedule(&self, name: &str) -> $crate::Result<()> {
                <$store>::resume_schedule(self, name)
            }
            fn remove_schedule(&self, name: &str) -> $crate::Result<bool> {
                <$store>::remove_schedule(self, name)
            }
            fn reap(&self) -> $crate::Result<$crate::ReapReport> {
                <$store>::reap(self)
            }
            fn purge(
                &self,
                older_than: std::time::Duration,
                states: &[$crate::JobState],
            ) -> $crate::Result<usize> {
                <$store>::purge(self, older_than, states)
            }
            fn work_generation(&self, queue: &str) -> u64 {
                <$store>::work_generation(self, queue)
            }
            fn wait_for_work(&self, queue: &str, seen: u64, timeout: std::time::Duration) -> u64 {
                <$store>::wait_for_work(self, queue, seen, timeout)
            }
            fn wake_all(&self) {
                <$store>::wake_all(self)
            }
        }
    };
}
pub(crate) use job_store;
