//! The public operations of a [`PgStore`]: the same calls, arguments and answers as
//! [`crate::Store`]'s, each one transaction of [`protocol`].

use super::records::PgRecords;
use super::{PgStore, Prepared};
use super::{fast, read};
use crate::backend::{End, LeaseBackend};
use crate::error::{Error, Result};
use crate::ids::{JobId, StoreTime};
use crate::job::{Job, JobState, NewJob, Run};
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::pool::Output;
use crate::protocol;
use crate::report::ReapReport;
use crate::rules::Retry;
use crate::stats::Stats;

/// The application's side of a leasehold transaction on PostgreSQL: its own SQL and
/// follow-up jobs, committed together with what leasehold writes, or not at all.
pub struct PgTransaction<'t, 'c> {
    tx: &'t mut postgres::Transaction<'c>,
    cache: &'t mut std::collections::HashMap<&'static str, postgres::Statement>,
    store: &'t PgStore,
}

impl<'t, 'c> PgTransaction<'t, 'c> {
    pub(super) fn new(
        tx: &'t mut postgres::Transaction<'c>,
        cache: &'t mut std::collections::HashMap<&'static str, postgres::Statement>,
        store: &'t PgStore,
    ) -> PgTransaction<'t, 'c> {
        PgTransaction { tx, cache, store }
    }

    /// The transaction, for the application's own statements.
    pub fn sql(&mut self) -> &mut postgres::Transaction<'c> {
        self.tx
    }

    /// Enqueues a job in this transaction.
    pub fn enqueue(&mut self, job: NewJob) -> Result<JobId> {
        let mut p = Prepared {
            cache: self.cache,
            names: &self.store.inner.names,
        };
        fast::enqueue(
            &mut PgRecords::new(self.tx, &mut p, self.store.settings()),
            &job,
        )
    }
}

/// The application's SQL, in a completion's PostgreSQL transaction (see
/// [`Output::with_sql`](crate::Output::with_sql)): what an [`Output`] of a pool on a
/// [`PgStore`] carries.
pub struct SqlWrites(
    pub(crate) Box<dyn FnMut(&mut PgTransaction<'_, '_>) -> crate::backend::WritesResult + Send>,
);

impl Output<SqlWrites> {
    /// Output bytes plus the application's SQL and follow-up jobs, run in the completion's
    /// PostgreSQL transaction only if the fence holds: `Output::with_writes` for a pool on
    /// a [`PgStore`].
    ///
    /// A transaction PostgreSQL aborts for a deadlock or serialization failure runs again,
    /// `writes` included (so it may run more than once, and only the last run commits); such
    /// an abort spends no attempt of the job.
    pub fn with_sql<F, E>(bytes: impl Into<Vec<u8>>, mut writes: F) -> Output<SqlWrites>
    where
        F: FnMut(&mut PgTransaction<'_, '_>) -> std::result::Result<(), E> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Output::with(
            bytes,
            SqlWrites(Box::new(move |txn| writes(txn).map_err(Into::into))),
        )
    }
}

impl PgStore {
    /// The schema version this handle's open upgraded the store from, if an older build
    /// made it (which refuses it from now on); `None` if it was current.
    pub fn upgraded_from(&self) -> Option<u32> {
        self.inner.upgraded_from.get().copied()
    }

    /// Store time: the database's clock, in nanoseconds since the Unix epoch (PostgreSQL
    /// keeps microseconds).
    pub fn now(&self) -> Result<StoreTime> {
        self.in_transaction(super::records::now)
    }

    /// Enqueues a job (see [`crate::Store::enqueue`]).
    pub fn enqueue(&self, job: NewJob) -> Result<JobId> {
        let id = self.records(|r| fast::enqueue(r, &job))?;
        self.readied([&job.queue]);
        Ok(id)
    }

    /// Enqueues many jobs in one transaction, all or none.
    pub fn enqueue_batch(&self, jobs: impl IntoIterator<Item = NewJob>) -> Result<Vec<JobId>> {
        let jobs: Vec<NewJob> = jobs.into_iter().collect();
        let ids = self.records(|r| fast::enqueue_batch(r, &jobs))?;
        self.readied(jobs.iter().map(|j| &j.queue));
        Ok(ids)
    }

    /// Claims the most urgent claimable job of `queue` (see [`crate::Store::claim`]).
    pub fn claim(
        &self,
        queue: &str,
        worker: &str,
        terms: impl Into<LeaseTerms>,
    ) -> Result<Option<Lease>> {
        Ok(self.claim_batch(queue, worker, terms, 1)?.pop())
    }

    /// Claims up to `n` jobs of `queue` in one transaction, most urgent first.
    pub fn claim_batch(
        &self,
        queue: &str,
        worker: &str,
        terms: impl Into<LeaseTerms>,
        n: usize,
    ) -> Result<Vec<Lease>> {
        let terms = terms.into();
        let marks = self.marks_due(&mut [queue].into_iter());
        self.records(|r| {
            let claimed = fast::claim_batch(r, queue, worker, terms, n, None)?;
            fast::mark_served(r, &marks)?;
            Ok(claimed)
        })
    }

    /// Claims one named job if it is claimable now (see [`crate::Store::claim_job`]).
    pub fn claim_job(
        &self,
        job: JobId,
        worker: &str,
        terms: impl Into<LeaseTerms>,
    ) -> Result<Option<Lease>> {
        let terms = terms.into();
        self.records(|r| protocol::claim_job(r, job, worker, terms))
    }

    /// Completes the attempt and claims the next job of the same queue for the same worker
    /// in one transaction (see [`crate::Store::complete_and_claim`]): a lost lease claims
    /// nothing, and bad lease terms are refused before anything is written.
    pub fn complete_and_claim(
        &self,
        lease: &Lease,
        output: &[u8],
        terms: impl Into<LeaseTerms>,
    ) -> Result<Option<Lease>> {
        LeaseBackend::complete_and_claim_reporting(self, lease, output, None, terms.into())
    }

    /// Completes many attempts in one transaction, each with its own answer (see
    /// [`crate::Store::complete_batch`]).
    pub fn complete_batch(&self, done: &[(&Lease, &[u8])]) -> Vec<Result<()>> {
        let mut done = crate::backend::completions(done);
        self.complete_each_then_claim(&mut done, None).0
    }

    /// Completes each of `done` and claims up to `n` jobs of `queue` for `worker` (see
    /// [`crate::Store::complete_batch_and_claim`]): one transaction, or for a big round two
    /// at once ([`PgStoreBuilder::side_by_side_from`](super::PgStoreBuilder::side_by_side_from)),
    /// the claim deciding as if the completions had committed first.
    pub fn complete_batch_and_claim(
        &self,
        done: &[(&Lease, &[u8])],
        queue: &str,
        worker: &str,
        terms: impl Into<LeaseTerms>,
        n: usize,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        crate::backend::round(self, done, (queue, worker, terms.into(), n))
    }

    /// Renews the lease (see [`crate::Store::heartbeat`]).
    pub fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<Renewal> {
        let mut answers = LeaseBackend::renew_batch(self, &[(lease, progress)])?;
        answers
            .pop()
            .unwrap_or(Err(Error::Internal("a renewal without its answer")))
    }

    /// Renews many leases with one statement; one answer per lease, in order.
    pub fn heartbeat_batch(&self, beats: &[(&Lease, u64)]) -> Vec<Result<Renewal>> {
        match LeaseBackend::renew_batch(self, beats) {
            Ok(answers) => answers,
            Err(e) => {
                let each = shared_by_all(e);
                beats.iter().map(|_| Err(each())).collect()
            }
        }
    }

    /// Completes the attempt (see [`crate::Store::complete`]).
    pub fn complete(&self, lease: &Lease, output: &[u8]) -> Result<()> {
        self.end(lease, End::Complete(output.to_vec()), None)
            .map(|_| ())
    }

    /// Completes the attempt and runs `f`, the application's own statements and follow-up
    /// jobs, in the same transaction: all of it commits only if the fence holds (`f` runs
    /// only then), and an error from `f` rolls all of it back ([`Error::Application`]).
    ///
    /// PostgreSQL may abort a transaction for a deadlock (or, where the application asks
    /// for it, a serialization failure), in leasehold's statements or in `f`'s: the whole
    /// transaction then runs again, `f` included, so `f` may run more than once; nothing of
    /// a run that was aborted is kept. Such an abort is never the job's failure.
    pub fn complete_with<F, E>(&self, lease: &Lease, output: &[u8], mut f: F) -> Result<()>
    where
        F: FnMut(&mut PgTransaction<'_, '_>) -> std::result::Result<(), E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.complete_then(lease, output, None, |t| f(t).map_err(Into::into))
    }

    /// Completes the attempt and, only if the fence held, runs the application's `writes`
    /// in the same transaction; their error rolls all of it back. Run again from the start
    /// when PostgreSQL aborts the transaction for a deadlock or serialization failure.
    pub(super) fn complete_then(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        mut writes: impl FnMut(
            &mut PgTransaction<'_, '_>,
        )
            -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>,
    ) -> Result<()> {
        let s = self.settings();
        self.in_transaction(|tx, p| {
            fast::complete(
                &mut PgRecords::new(tx, p, s),
                lease.job,
                lease.attempt,
                output,
                progress,
            )?;
            let written = writes(&mut PgTransaction::new(tx, p.cache, self));
            applied(tx, written.map_err(application_error))
        })
    }

    /// Runs `f` in one transaction with the application's own statements and enqueues
    /// (see [`crate::Store::transaction`]). As for [`PgStore::complete_with`], a transaction
    /// PostgreSQL aborts for a deadlock or serialization failure runs again, `f` included.
    pub fn transaction<T>(
        &self,
        mut f: impl FnMut(&mut PgTransaction<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        self.in_transaction(|tx, p| {
            let value = f(&mut PgTransaction {
                tx,
                cache: p.cache,
                store: self,
            });
            applied(tx, value.map_err(|e| application_error(Box::new(e))))
        })
    }

    /// Fails the attempt (see [`crate::Store::fail`]).
    pub fn fail(&self, lease: &Lease, error: &str) -> Result<JobState> {
        self.end(
            lease,
            End::Fail(error.to_owned(), Retry::WhileBudgetLasts),
            None,
        )
    }

    /// Fails the attempt for good: dead at once (see [`crate::Store::fail_permanently`]).
    pub fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<JobState> {
        self.end(lease, End::Fail(error.to_owned(), Retry::Never), None)
    }

    /// Puts the job off by `delay` (see [`crate::Store::snooze`]).
    pub fn snooze(&self, lease: &Lease, delay: std::time::Duration) -> Result<JobState> {
        self.end(lease, End::Snooze(delay), None)
    }

    /// Ends the attempt as timed out (see [`crate::Store::time_out`]).
    pub fn time_out(&self, lease: &Lease) -> Result<JobState> {
        self.end(lease, End::TimeOut, None)
    }

    /// Gives the job back on purpose (see [`crate::Store::release`]).
    pub fn release(&self, lease: &Lease) -> Result<()> {
        self.end(lease, End::Release, None).map(|_| ())
    }

    /// Cancels a job (see [`crate::Store::cancel`]).
    pub fn cancel(&self, job: JobId) -> Result<JobState> {
        self.records(|r| protocol::cancel(r, job))
            .map(|(state, _)| state)
    }

    /// Retries every dead or cancelled job `filter` names (see [`crate::Store::retry_all`]).
    pub fn retry_all(&self, filter: &crate::query::JobFilter) -> Result<crate::BulkReport> {
        self.bulk(filter, |r, id| protocol::retry(r, id).map(|()| true))
    }

    /// Cancels every job `filter` names (see [`crate::Store::cancel_all`]).
    pub fn cancel_all(&self, filter: &crate::query::JobFilter) -> Result<crate::BulkReport> {
        self.bulk(filter, |r, id| {
            protocol::cancel(r, id).map(|(_, changed)| changed)
        })
    }

    /// `act` on every job `filter` names, a page of them per transaction (see
    /// [`crate::batches::bulk`]).
    fn bulk(
        &self,
        filter: &crate::query::JobFilter,
        act: fn(&mut PgRecords<'_, '_, '_>, JobId) -> Result<bool>,
    ) -> Result<crate::BulkReport> {
        crate::batches::bulk(
            filter,
            self.settings().policy.reap_batch,
            |f| self.jobs(f),
            |ids| {
                self.records(|r| {
                    crate::batches::answers(ids.iter().map(|&id| act(r, id)).collect::<Vec<_>>())
                })
            },
        )
    }

    /// Puts a dead or cancelled job back in the queue (see [`crate::Store::retry`]).
    pub fn retry(&self, job: JobId) -> Result<()> {
        self.records(|r| protocol::retry(r, job))
    }

    /// One reaper pass: takes back every expired lease, in transactions of at most the reap
    /// batch each; then, with a retention set ([`super::PgStoreBuilder::retention`]), purges
    /// the succeeded and cancelled jobs that outlived it, in batches too; then starts a
    /// vacuum of a table whose dead row versions passed the threshold
    /// ([`super::PgStoreBuilder::vacuum_when_dead`]).
    pub fn reap(&self) -> Result<ReapReport> {
        self.reap_every(None)
    }

    /// A reaper pass, recorded as the store's last ([`crate::Stats::last_reaper_pass`]) with
    /// how often its reaper runs (`None` for one called directly).
    pub(crate) fn reap_every(&self, every: Option<std::time::Duration>) -> Result<ReapReport> {
        let began = self.now()?;
        let mut report = self.reclaim_expired()?;
        if let Some(keep) = self.settings().policy.retention {
            report.purged = self.purge(keep, &[JobState::Succeeded, JobState::Cancelled])?;
        }
        report.vacuum_started = self.vacuum_if_needed()?;
        self.in_transaction(|tx, p| fast::note_reaper_pass(tx, p, &report, began, every))?;
        Ok(report)
    }

    /// Takes back every expired lease in batches (see [`crate::batches`]).
    fn reclaim_expired(&self) -> Result<ReapReport> {
        let pass = crate::batches::run(self.reap_batch(), |limit| {
            let batch =
                self.records(|r| protocol::reap_batch(r, limit, crate::ReclaimPath::Reaper))?;
            if !batch.items.is_empty() {
                self.inner.notifier.notify_all();
            }
            Ok::<_, Error>(batch)
        })?;
        Ok(pass.into())
    }

    /// The job, if it exists.
    pub fn job(&self, job: JobId) -> Result<Option<Job>> {
        self.in_transaction(|tx, p| read::job(tx, p, job))
            .map(|record| record.map(Job))
    }

    /// The job's run history, oldest first.
    pub fn history(&self, job: JobId) -> Result<Vec<Run>> {
        self.in_transaction(|tx, p| read::history(tx, p, job))
            .map(|runs| runs.into_iter().map(Run).collect())
    }

    /// The job's payload.
    pub fn payload(&self, job: JobId) -> Result<Option<Vec<u8>>> {
        self.in_transaction(|tx, p| read::bytes(tx, p, job, false))
    }

    /// A succeeded job's output (`None` for none or an empty one).
    pub fn output(&self, job: JobId) -> Result<Option<Vec<u8>>> {
        self.in_transaction(|tx, p| read::bytes(tx, p, job, true))
    }

    /// The wake-up generation of `queue`: pass it to [`PgStore::wait_for_work`] after looking
    /// for work. The first call starts this handle's `LISTEN` connection.
    pub fn work_generation(&self, queue: &str) -> u64 {
        self.listening();
        self.inner.notifier.generation(queue)
    }

    /// Blocks until a commit on any machine gives `queue` work (announced by `NOTIFY` from
    /// its transaction, or by this handle's own commits), or `timeout` passes; returns the
    /// generation then. Notifications are hints: bound `timeout` and look for work anyway.
    pub fn wait_for_work(&self, queue: &str, seen: u64, timeout: std::time::Duration) -> u64 {
        self.inner.notifier.wait(queue, seen, timeout)
    }

    /// [`PgStore::wait_for_work`] for async code: resolves when a commit here or (heard by
    /// `LISTEN`) on another machine gives `queue` work, [`PgStore::wake_all`] is called, or
    /// `timeout` passes, with the generation then (see [`crate::Store::wait_for_work_async`]).
    #[cfg(feature = "tokio")]
    pub async fn wait_for_work_async(
        &self,
        queue: &str,
        seen: u64,
        timeout: std::time::Duration,
    ) -> u64 {
        match crate::asynchronous::changed(&self.inner.notifier, queue, seen, timeout).await {
            Some(generation) => generation,
            None => self.work_generation(queue),
        }
    }

    /// Wakes every waiter of [`PgStore::wait_for_work`] in this process (see
    /// [`crate::Store::wake_all`]).
    pub fn wake_all(&self) {
        self.inner.notifier.notify_all();
    }

    /// Jobs matching `filter` (for operators and tools).
    pub fn jobs(&self, filter: &crate::query::JobFilter) -> Result<Vec<Job>> {
        if !filter.can_match() {
            return Ok(Vec::new());
        }
        self.in_transaction(|tx, p| read::list(tx, p, filter))
            .map(|records| records.into_iter().map(Job).collect())
    }

    /// When things fall due in `queue`.
    pub fn timing(&self, queue: &str) -> Result<crate::query::QueueTiming> {
        if no_queue_has(queue) {
            return Ok(crate::query::QueueTiming::default());
        }
        self.in_transaction(|tx, p| read::timing(tx, p, queue))
    }

    /// Proves the rows agree with each other: every running job has a whole lease and no
    /// other job has one, finish times match states, and history has one row per ended
    /// attempt (the indexes are PostgreSQL's to keep).
    pub fn check(&self) -> Result<crate::report::CheckReport> {
        self.in_transaction(read::check)
    }

    /// Deletes terminal jobs in `states` that finished at least `older_than` ago, with their
    /// history, in transactions of at most the reap batch; returns how many.
    pub fn purge(&self, older_than: std::time::Duration, states: &[JobState]) -> Result<usize> {
        if !self.settings().shortcuts {
            let (now, batch) = (self.now()?, self.reap_batch());
            return protocol::purge_in_batches(now, older_than, batch, |from, cutoff, limit| {
                self.records(|r| protocol::purge(r, from, cutoff, states, limit))
            });
        }
        let pass = crate::batches::run(self.reap_batch(), |limit| {
            self.in_transaction(|tx, p| fast::purge_batch(tx, p, older_than, states, limit))
        })?;
        Ok(pass.items.len())
    }

    /// Counts per queue and state, and the lifetime counters.
    pub fn stats(&self) -> Result<Stats> {
        self.in_transaction(read::stats)
    }

    /// Declares a periodic job (see [`crate::Store::declare_schedule`]).
    pub fn declare_schedule(&self, schedule: crate::Schedule) -> Result<()> {
        let wall = crate::clock::wall_seconds(crate::clock::wall_now());
        self.records(|r| protocol::declare_schedule(r, &schedule, wall))
    }

    /// Fires every schedule whose tick has come, at the wall clock's time now.
    pub fn fire_schedules(&self) -> Result<Vec<JobId>> {
        self.fire_schedules_at(crate::clock::wall_now())
    }

    /// Fires every schedule whose tick has come (see [`crate::Store::fire_schedules_at`]).
    pub fn fire_schedules_at(&self, wall: std::time::SystemTime) -> Result<Vec<JobId>> {
        let wall = crate::clock::wall_seconds(wall);
        self.records(|r| protocol::fire_schedules(r, wall))
    }

    /// Pauses a schedule (see [`crate::Store::pause_schedule`]).
    pub fn pause_schedule(&self, name: &str) -> Result<()> {
        self.records(|r| protocol::pause_schedule(r, name, true))
    }

    /// Resumes a paused schedule.
    pub fn resume_schedule(&self, name: &str) -> Result<()> {
        self.records(|r| protocol::pause_schedule(r, name, false))
    }

    /// Removes a schedule; `false` if there was none.
    pub fn remove_schedule(&self, name: &str) -> Result<bool> {
        self.records(|r| protocol::remove_schedule(r, name))
    }

    /// Every schedule, by name.
    pub fn schedules(&self) -> Result<Vec<crate::ScheduleInfo>> {
        self.in_transaction(read::schedules)
    }

    /// Pauses `queue` on every machine (see [`crate::Store::pause_queue`]).
    pub fn pause_queue(&self, queue: &str) -> Result<()> {
        self.records(|r| protocol::pause_queue(r, queue, true))
    }

    /// Resumes a paused `queue` (see [`crate::Store::resume_queue`]).
    pub fn resume_queue(&self, queue: &str) -> Result<()> {
        self.records(|r| protocol::pause_queue(r, queue, false))?;
        self.readied([&queue.to_owned()]);
        Ok(())
    }

    /// Sets `queue`'s limits on every machine (see [`crate::Store::set_queue_limits`]).
    pub fn set_queue_limits(&self, queue: &str, limits: crate::QueueLimits) -> Result<()> {
        self.records(|r| protocol::set_queue_limits(r, queue, limits))?;
        self.readied([&queue.to_owned()]);
        Ok(())
    }

    /// `queue`'s settings (see [`crate::Store::queue_settings`]).
    pub fn queue_settings(&self, queue: &str) -> Result<crate::QueueSettings> {
        if no_queue_has(queue) {
            return Ok(crate::QueueSettings::default());
        }
        self.in_transaction(|tx, p| read::queue_settings(tx, p, queue))
    }

    /// The queues with due work and nobody serving them (see
    /// [`ReadJobs::unserved_queues`](crate::ReadJobs::unserved_queues)).
    pub fn unserved_queues(&self) -> Result<Vec<crate::UnservedQueue>> {
        self.in_transaction(read::unserved_queues)
    }
}

/// A name no queue can have (one with a NUL byte, which enqueue refuses): a read of it
/// answers "nothing" without asking the database, whose text cannot hold the byte, just as
/// the redb store answers.
pub(super) fn no_queue_has(queue: &str) -> bool {
    queue.contains('\0')
}

/// The application's error, as the store reports it: a deadlock or serialization failure
/// anywhere in it is the transaction's (run again), anything else the application's.
pub(super) fn application_error(e: Box<dyn std::error::Error + Send + Sync>) -> Error {
    match super::error::transient_cause(&*e) {
        Some(transient) => Error::Postgres(transient),
        None => Error::from_application(e),
    }
}

/// What the application's code returned, checked against the transaction it ran in: code
/// that caught an SQL error and went on returns `Ok` from a transaction PostgreSQL has
/// aborted, whose `COMMIT` would quietly roll everything back, the completion included. One
/// statement tells (an aborted transaction refuses every statement).
pub(super) fn applied<T>(tx: &mut postgres::Transaction<'_>, value: Result<T>) -> Result<T> {
    let value = value?;
    match tx.batch_execute("SELECT") {
        Ok(()) => Ok(value),
        Err(e) if e.code() == Some(&postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION) => {
            Err(Error::Application(
                "the application's SQL failed and its error was not returned; the transaction \
                 was aborted, so nothing of it was committed"
                    .into(),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// The failure of a batch whose transaction failed as a whole, for each of its members: the
/// same database error, or (not being one to clone) the shared failure of the group.
pub(super) fn shared_by_all(e: Error) -> impl Fn() -> Error {
    let shared = match e {
        Error::Postgres(pg) => Ok(pg),
        other => Err(std::sync::Arc::new(other)),
    };
    move || match &shared {
        Ok(pg) => Error::Postgres(pg.clone()),
        Err(group) => Error::Group(group.clone()),
    }
}

crate::job_store::read_jobs!(PgStore, PgStore::now, wall_clock = true);
crate::job_store::job_store!(PgStore);
