//! The public operations of a [`PgStore`]: the same calls, arguments and answers as
//! [`crate::Store`]'s, each one transaction of [`protocol`].

use super::transaction::PgRecords;
use super::{PgStore, Prepared};
use super::{fast, read};
use crate::backend::LeaseBackend;
use crate::error::{Error, Result};
use crate::ids::{JobId, StoreTime};
use crate::job::{Job, Run};
use crate::job_store::{JobStore, ReadJobs};
use crate::lease::Lease;
use crate::new_job::NewJob;
use crate::pool::Output;
use crate::protocol;
use crate::state::JobState;
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
        self.store
            .enqueue_on(self.tx, self.cache, &[job])
            .map(|ids| ids[0])
    }
}

/// The application's SQL, in a completion's PostgreSQL transaction (see
/// [`Output::with_sql`](crate::Output::with_sql)): what an [`Output`] of a pool on a
/// [`PgStore`] carries.
pub struct SqlWrites(
    pub(crate) Box<dyn FnMut(&mut PgTransaction<'_, '_>) -> crate::protocol::WritesResult + Send>,
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
        let mut told = Vec::new();
        let done = self.in_transaction(|tx, p| {
            let mut r = PgRecords::new(tx, p, s);
            r.events = crate::events::Pending::of(&self.inner.hub);
            let end = protocol::complete(&mut r, lease.holding(), output, progress);
            if end.is_err() {
                return r.counted(end);
            }
            told = r.events.take();
            let counts = r.take_counts();
            let written = writes(&mut PgTransaction::new(tx, p.cache, self));
            applied(tx, written.map_err(application_error))?;
            super::transaction::write_counts(tx, p, &counts)
        });
        done?;
        self.inner.hub.publish(told);
        Ok(())
    }

    /// Enqueues a job inside the application's own transaction, on a connection of its own
    /// (River's `InsertTx`): committed with the application's writes when it commits, gone
    /// if it rolls back. The same checks and answers as [`JobStore::enqueue`] (unique keys,
    /// dependencies, groups); the store's `NOTIFY` goes with the commit, so pools on every
    /// machine wake for it then. The schema must be this store's, made by it.
    ///
    /// On an error (a refused input included) the application's transaction is aborted, as
    /// a failed statement of its own would abort it: its later statements fail, and its
    /// `COMMIT` rolls back, so no write of the application's commits without its job. (A
    /// savepoint taken before the call lets the application roll back to it and go on.)
    pub fn enqueue_in(&self, tx: &mut postgres::Transaction<'_>, job: NewJob) -> Result<JobId> {
        let mut cache = std::collections::HashMap::new();
        self.enqueue_on(tx, &mut cache, &[job]).map(|ids| ids[0])
    }

    /// [`PgStore::enqueue_in`] for many jobs, as [`JobStore::enqueue_batch`]: all of them or,
    /// on an error, none (the application's transaction is then aborted, as any failed
    /// statement aborts it).
    pub fn enqueue_batch_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let mut cache = std::collections::HashMap::new();
        self.enqueue_on(tx, &mut cache, &jobs)
    }

    /// Enqueues `jobs` in `tx`, its statements prepared in `cache`.
    fn enqueue_on(
        &self,
        tx: &mut postgres::Transaction<'_>,
        cache: &mut std::collections::HashMap<&'static str, postgres::Statement>,
        jobs: &[NewJob],
    ) -> Result<Vec<JobId>> {
        let mut p = Prepared {
            cache,
            names: &self.inner.names,
            ended: false,
        };
        let mut r = PgRecords::new(tx, &mut p, self.settings());
        let made = match jobs {
            [job] => protocol::enqueue(&mut r, job).map(|id| vec![id]),
            jobs => protocol::enqueue_batch(&mut r, jobs),
        };
        let made = r.counted(made);
        if made.is_err() {
            // A refusal found before any statement (a bad input), or after some of the batch
            // were written (a sealed group): either way the transaction must not commit
            // without the jobs, so it is aborted as a failed statement aborts it. (One that
            // a statement failed is aborted already, and refuses this one too.)
            let _ = tx.batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION 'leasehold refused an enqueue in this transaction'; END $$",
            );
        }
        made
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

impl ReadJobs for PgStore {
    /// Store time: the database's clock, in nanoseconds since the Unix epoch (PostgreSQL
    /// keeps microseconds).
    fn now(&self) -> Result<StoreTime> {
        // (one statement outside a transaction: one round trip)
        self.alone(super::transaction::now)
    }

    /// The job, if it exists.
    fn job(&self, job: JobId) -> Result<Option<Job>> {
        self.in_transaction(|tx, p| read::job(tx, p, job))
            .map(|record| record.map(Job))
    }

    /// The job's run history, oldest first.
    fn history(&self, job: JobId) -> Result<Vec<Run>> {
        self.in_transaction(|tx, p| read::history(tx, p, job))
            .map(|runs| runs.into_iter().map(Run).collect())
    }

    /// The job's payload.
    fn payload(&self, job: JobId) -> Result<Option<Vec<u8>>> {
        self.in_transaction(|tx, p| read::bytes(tx, p, job, false))
    }

    /// A succeeded job's output (`None` for none or an empty one).
    fn output(&self, job: JobId) -> Result<Option<Vec<u8>>> {
        self.in_transaction(|tx, p| read::bytes(tx, p, job, true))
    }

    fn logs(&self, job: JobId) -> Result<Vec<crate::job_log::AttemptLog>> {
        self.in_transaction(|tx, p| read::logs(tx, p, job))
    }

    fn endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
    ) -> Result<crate::endings::Endings> {
        self.alone(|c, p| read::endings(c, p, after, limit))
    }

    fn wait_for_endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::endings::Endings> {
        let hints = crate::wait_end::Hints {
            notifier: &self.inner.notifier,
            announce: &|| self.announce_following(),
        };
        crate::wait_end::follow(
            |a, n| self.endings(a, n),
            Some(hints),
            after,
            limit,
            timeout,
        )
    }

    fn checkpoint(&self, job: JobId) -> Result<Option<crate::checkpoint::Checkpoint>> {
        self.in_transaction(|tx, p| read::checkpoint(tx, p, job))
    }

    fn group(&self, group: crate::ids::GroupId) -> Result<Option<crate::workflow::Group>> {
        self.in_transaction(|tx, p| read::group(tx, p, group))
    }

    fn waiters(&self, job: JobId) -> Result<Vec<JobId>> {
        self.in_transaction(|tx, p| read::waiters(tx, p, job))
    }

    /// Jobs matching `filter` (for operators and tools).
    fn jobs(&self, filter: &crate::query::JobFilter) -> Result<Vec<Job>> {
        if !filter.can_match() {
            return Ok(Vec::new());
        }
        self.in_transaction(|tx, p| read::list(tx, p, filter))
            .map(|records| records.into_iter().map(Job).collect())
    }

    /// When things fall due in `queue`.
    fn timing(&self, queue: &str) -> Result<crate::query::QueueTiming> {
        if no_queue_has(queue) {
            return Ok(crate::query::QueueTiming::default());
        }
        self.in_transaction(|tx, p| read::timing(tx, p, queue))
    }

    /// Proves the rows agree with each other: every running job has a whole lease and no
    /// other job has one, finish times match states, and history has one row per ended
    /// attempt (the indexes are PostgreSQL's to keep).
    fn check(&self) -> Result<crate::report::CheckReport> {
        self.in_transaction(read::check)
    }

    /// Counts per queue and state, and the lifetime counters.
    fn stats(&self) -> Result<Stats> {
        self.in_transaction(read::stats)
    }

    /// Every schedule, by name.
    fn schedules(&self) -> Result<Vec<crate::schedule::ScheduleInfo>> {
        self.in_transaction(read::schedules)
    }

    /// `queue`'s settings (see [`crate::ReadJobs::queue_settings`]).
    fn queue_settings(&self, queue: &str) -> Result<crate::queue::QueueSettings> {
        if no_queue_has(queue) {
            return Ok(crate::queue::QueueSettings::default());
        }
        self.in_transaction(|tx, p| {
            let record = super::named::queue_record(tx, p, queue, false)?;
            Ok(crate::queue::QueueSettings::of(record))
        })
    }

    /// The queues with due work and nobody serving them (see
    /// [`ReadJobs::unserved_queues`](crate::ReadJobs::unserved_queues)).
    fn unserved_queues(&self) -> Result<Vec<crate::queue::UnservedQueue>> {
        // (one statement: a reaper asks it once a minute, idle or not)
        self.alone(read::unserved_queues)
    }

    fn time_is_wall_clock(&self) -> bool {
        true
    }
}

/// Its purge in one statement per batch; its other shortcuts are steps of its transaction
/// (`records.rs`).
impl JobStore for PgStore {
    /// One statement per batch (`fast.rs`).
    fn purge(&self, older_than: std::time::Duration, states: &[JobState]) -> Result<usize> {
        let (now, batch) = (self.now()?, self.policy().reap_batch);
        let purged = match self.settings().shortcuts {
            false => {
                let start = (StoreTime::ZERO, JobId(0));
                protocol::purge_in_batches(now, older_than, batch, start, |from, cutoff, n| {
                    self.records(|r| protocol::purge(r, from, cutoff, states, n))
                })?
            }
            true => {
                let pass = crate::batches::run(batch, |limit| {
                    self.in_transaction(|tx, p| fast::purge_batch(tx, p, older_than, states, limit))
                })?;
                pass.items.len()
            }
        };
        crate::job_store::purge_groups(self, now, older_than)?;
        crate::job_store::trim_endings(self, now, older_than)?;
        Ok(purged)
    }

    /// Starts this handle's `LISTEN` connection, if it has none yet: commits on other
    /// machines wake its waiters from then on.
    fn work_generation(&self, queue: &str) -> u64 {
        self.start_listening();
        self.inner.notifier.generation(queue)
    }
}

crate::conveniences::conveniences!(PgStore);
