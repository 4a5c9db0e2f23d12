//! The [`Store`]: a handle on one store file that runs the lease protocol in redb write
//! transactions at the store's own time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use redb::{Database, ReadableDatabase};

use crate::batches::Batch;
use crate::clock::StoreClock;
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::ids::StoreTime;
use crate::job::ReclaimPath;
use crate::job_store::JobStore;
use crate::lease::Lease;
use crate::notify::Notifier;
use crate::protocol;
use crate::queue::ServedMarks;
use crate::redb_store::app_transaction::Transaction;
use crate::redb_store::group::Group;
use crate::redb_store::neighbours::Neighbours;
use crate::redb_store::reading;
use crate::redb_store::snapshots::Snapshots as _;
use crate::redb_store::started::{self, StartedTable};
use crate::redb_store::writing::{Policy, Tx};
use crate::report::{ReapReport, Reclaim};
use crate::stats::WriteMetrics;

/// A handle on a leasehold store. Cheap to clone; clones share one open file.
#[derive(Debug)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    /// An application's handle, counted in [`Inner::handles`], rather than one the store's
    /// own threads (writer, watcher) make for a moment from their weak reference.
    pub(crate) counted: bool,
}

impl Clone for Store {
    fn clone(&self) -> Store {
        if self.counted {
            self.inner.handles.fetch_add(1, Ordering::Relaxed);
        }
        Store {
            inner: self.inner.clone(),
            counted: self.counted,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(super) db: Database,
    clock: StoreClock,
    path: PathBuf,
    pub(super) durability: Durability,
    pub(super) policy: Policy,
    pub(super) flush: Mutex<FlushState>,
    pub(crate) notifier: Notifier,
    /// The subscribers to this handle's events.
    pub(crate) hub: crate::events::Hub,
    pub(super) writes: AtomicU64,
    /// The application's handles alive: the last one to go gives back this process's leases
    /// (see `Drop for Store`), whatever the store's own threads still hold for a moment.
    pub(crate) handles: AtomicUsize,
    pub(super) group: Arc<Group>,
    /// What opening the store took back (see [`Store::recovered_at_open`]).
    recovered: std::sync::OnceLock<ReapReport>,
    /// The schema version opening upgraded the store from (see [`Store::upgraded_from`]).
    pub(crate) upgraded_from: std::sync::OnceLock<u32>,
    /// The other processes, when several share the store.
    pub(crate) neighbours: Option<Neighbours>,
    /// When this handle last marked each queue served (see [`crate::queue`]).
    pub(super) served: ServedMarks,
    /// This process's table of how far its pools' leases got (a store on a file; see
    /// [`crate::redb_store::started`]).
    pub(crate) started: std::sync::OnceLock<StartedTable>,
}

#[derive(Debug, Default)]
pub(super) struct FlushState {
    pub(super) last_durable: StoreTime,
    pub(super) dirty: bool,
}

impl Store {
    pub(crate) fn from_parts(
        db: Database,
        clock: StoreClock,
        path: PathBuf,
        durability: Durability,
        policy: Policy,
        neighbours: Option<Neighbours>,
    ) -> Result<Store> {
        let store = Store {
            inner: Arc::new(Inner {
                db,
                clock,
                path,
                durability,
                policy,
                flush: Mutex::new(FlushState::default()),
                notifier: Notifier::default(),
                hub: Default::default(),
                writes: AtomicU64::new(0),
                handles: AtomicUsize::new(1),
                group: Arc::new(Group::default()),
                recovered: std::sync::OnceLock::new(),
                upgraded_from: std::sync::OnceLock::new(),
                neighbours,
                served: ServedMarks::default(),
                started: std::sync::OnceLock::new(),
            }),
            counted: true,
        };
        Ok(store)
    }

    /// A handle for one of the store's own threads, made from its weak reference for as
    /// long as one task takes: not counted as the application's, so dropping it never closes
    /// this process's share of the store.
    pub(crate) fn borrowed(inner: Arc<Inner>) -> Store {
        Store {
            inner,
            counted: false,
        }
    }

    /// Takes back the leases whose holder's process is gone: at open. Alone on the file (the
    /// writer's seat proves it), that is every running lease; shared by processes, only those
    /// of processes that are provably dead (their instance lock is free), never a neighbour's.
    /// `table`: where the last process alone on the file kept its table of started jobs.
    pub(crate) fn recover(&self, table: Option<&Path>) -> Result<&ReapReport> {
        let report = match &self.inner.neighbours {
            None => {
                let stages = table.map(started::read).unwrap_or_default();
                self.in_batches(move |tx, batch| {
                    protocol::reap_batch(tx, batch, ReclaimPath::Recovery, &stages)
                })?
            }
            Some(n) => self.reclaim_orphans(n.instance())?,
        };
        Ok(self.inner.recovered.get_or_init(|| report))
    }

    /// The schema version this handle's open upgraded the store from, if the store was
    /// written by an older build (which refuses it from now on); `None` if it was current.
    pub fn upgraded_from(&self) -> Option<u32> {
        self.inner.upgraded_from.get().copied()
    }

    /// The leases opening the store took back: those a process that is gone left running
    /// (empty if there were none, or with [`StoreBuilder::recover_on_open`] off).
    ///
    /// [`StoreBuilder::recover_on_open`]: crate::StoreBuilder::recover_on_open
    pub fn recovered_at_open(&self) -> &ReapReport {
        static NONE: ReapReport = ReapReport {
            reclaimed: Vec::new(),
            batches: 0,
            largest_batch: 0,
            purged: 0,
            expired: Vec::new(),
            vacuum_started: Vec::new(),
        };
        self.inner.recovered.get().unwrap_or(&NONE)
    }

    /// The store's current time. Every expiry is compared against this, inside the store.
    pub fn now(&self) -> StoreTime {
        self.inner.clock.now()
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The next store time at which something in `queue` may become claimable without any
    /// commit: the earliest `run_at` of a waiting job, or the earliest lease expiry as the
    /// index holds it (which may be earlier than the real one, never later). `None` if nothing
    /// is scheduled.
    pub fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        let now = self.now();
        self.reading("the queue's schedule", |read| {
            reading::next_look(read, queue, now)
        })
    }

    /// Counters of this handle's write activity (relaxed atomics; process-local).
    pub fn metrics(&self) -> WriteMetrics {
        WriteMetrics {
            write_transactions: self.inner.writes.load(Ordering::Relaxed),
        }
    }

    /// Whether another process holds the file's writer lock now (always `false` unless
    /// processes share the store). Asking takes the lock if it is free and lets it go at
    /// once. A write of this process's own group does not count: what this process queues
    /// joins it.
    pub(crate) fn another_process_writes(&self) -> bool {
        self.inner.neighbours.is_some()
            && !self.inner.group.leading()
            && matches!(
                self.inner.db.try_begin_write(),
                Err(redb::TransactionError::WouldBlock)
            )
    }

    /// Completes the job and, in the same transaction, runs `f`: the application's own
    /// writes ([`Transaction::open_table`]) and follow-up jobs ([`Transaction::enqueue`]),
    /// committed together with the completion only if the fence holds. If the lease was lost,
    /// `f` is not called and nothing is written; if `f` fails, nothing is written either
    /// (its error comes back as is when it is a leasehold [`Error`], else as
    /// [`Error::Application`]). This gives exactly-once effects on local state to a job that
    /// may run more than once. As in [`Store::transaction`], `f` uses the [`Transaction`],
    /// not this store.
    pub fn complete_with<F, E>(&self, lease: &Lease, output: &[u8], f: F) -> Result<()>
    where
        F: FnOnce(&mut Transaction<'_, '_>) -> std::result::Result<(), E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.complete_with_progress(lease, output, None, f)
    }

    /// [`Store::complete_with`], recording the attempt's last progress.
    pub(crate) fn complete_with_progress<F, E>(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        f: F,
    ) -> Result<()>
    where
        F: FnOnce(&mut Transaction<'_, '_>) -> std::result::Result<(), E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.transaction(|t| {
            t.end_with_success(lease, output, progress)?;
            f(t).map_err(|e| Error::from_application(e.into()))
        })
    }

    /// Compacts the file, returning freed space to the filesystem (after a large purge, say).
    /// Needs this to be the only handle on the store: clones, readers in this process and
    /// running pools or reapers must be gone, and no other process may share the file (a
    /// store shared by processes is compacted by one that opens it alone, with
    /// [`Sharing::SingleWriter`](crate::Sharing), once the others have stopped). Returns
    /// whether anything was compacted.
    pub fn compact(&mut self) -> Result<bool> {
        if self.inner.neighbours.is_some() {
            return Err(Error::InUse(
                "compact needs the store to itself, and it is open for sharing between \
                 processes: stop the other processes, then compact from one that opens the \
                 store alone (Sharing::SingleWriter)",
            ));
        }
        let inner = Arc::get_mut(&mut self.inner).ok_or(Error::InUse(
            "compact needs the only handle on the store; other handles in this process \
             (clones, pools, reapers, readers) are alive",
        ))?;
        Ok(inner.db.compact()?)
    }

    /// Takes back leases in transactions of at most the configured batch each (see
    /// [`crate::batches`]), until `step` (one batch) comes back short.
    pub(crate) fn in_batches<F>(&self, step: F) -> Result<ReapReport>
    where
        F: Fn(&mut Tx<'_>, usize) -> Result<Batch<Reclaim>> + Clone + Send + 'static,
    {
        let pass = crate::batches::run(self.inner.policy.rules.reap_batch, |limit| {
            let step = step.clone();
            self.write(move |tx| step(tx, limit))
        })?;
        Ok(pass.into())
    }

    /// Runs `f` in one write transaction, committed only if it returns `Ok`: enqueue jobs
    /// together with the application's own writes, or complete a job together with them.
    ///
    /// Inside `f`, use the [`Transaction`]'s methods, never this store's: the transaction
    /// holds the writer's seat until `f` returns, so a writing store call from `f` (on this
    /// thread) is refused with [`Error::Reentered`] rather than wait for itself. Reads
    /// (`job`, `stats`, ...) are allowed and see the last commit, not `f`'s writes.
    pub fn transaction<T>(
        &self,
        f: impl FnOnce(&mut Transaction<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        // The application's closure borrows from its caller and may write its own tables, so
        // it runs alone, on the caller's thread, with the writer's seat to itself.
        self.inner
            .group
            .exclusive(|| self.write_with_txn(|tx, txn| f(&mut Transaction::new(tx, txn))))
    }

    /// Makes every commit so far durable (a no-op under [`Durability::Immediate`]).
    pub fn flush(&self) -> Result<()> {
        if !self.inner.flush.lock().dirty {
            return Ok(());
        }
        self.inner.group.exclusive(|| {
            // The flush state is not held across begin_write: a committing writer takes it.
            let txn = self.inner.db.begin_write()?;
            txn.commit()?;
            let mut state = self.inner.flush.lock();
            state.dirty = false;
            state.last_durable = self.now();
            Ok(())
        })
    }

    /// A read snapshot of the whole file, for the application's own tables (written with
    /// [`Store::transaction`] or [`Store::complete_with`]).
    pub fn begin_read(&self) -> Result<redb::ReadTransaction> {
        Ok(self.inner.db.begin_read()?)
    }

    /// The redb database underneath, for tests that write what another build would have.
    #[cfg(test)]
    pub(crate) fn db(&self) -> &Database {
        &self.inner.db
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(n) = &self.neighbours {
            n.stop();
        }
        if self.flush.get_mut().dirty {
            let flushed = self
                .db
                .begin_write()
                .map_err(Error::from)
                .and_then(|txn| txn.commit().map_err(Error::from));
            if let Err(e) = flushed {
                tracing::error!(error = %e, "final flush of the store failed");
            }
        }
    }
}

impl crate::redb_store::snapshots::Snapshots for Store {
    fn snapshot(&self) -> Result<redb::ReadTransaction> {
        Ok(self.inner.db.begin_read()?)
    }
    fn store_time(&self) -> StoreTime {
        self.now()
    }
    /// Woken by this process's commits that keep an ending, and, when processes share the
    /// store, by the others' (each told by a datagram that a follower here follows).
    fn follow_endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::endings::Endings> {
        let notifier = &self.inner.notifier;
        let announce = || match &self.inner.neighbours {
            Some(n) => notifier.announce_due().inspect(|_| n.following()) == Some(true),
            None => false,
        };
        let hints = crate::wait_end::Hints {
            notifier,
            announce: &announce,
        };
        crate::wait_end::follow(
            |a, n| crate::job_store::ReadJobs::endings(self, a, n),
            Some(hints),
            after,
            limit,
            timeout,
        )
    }
}

impl JobStore for Store {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::{
        ids::JobId, job_store::JobStore, lease::LeaseTerms, new_job::NewJob, state::JobState,
    };

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The purge's batches, driven as `JobStore::purge` drives them: whatever the number
        /// of finished jobs, the batch size and which of them the states asked for keep,
        /// the pass ends after at most ⌈n / batch⌉ + 1 batches and looks at each entry once.
        #[test]
        fn a_purge_pass_looks_at_each_finished_entry_once_in_at_most_n_over_batch_plus_one_batches(
            kept in proptest::collection::vec(any::<bool>(), 0..24),
            batch in 1usize..6,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let clock = crate::clock::ManualClock::new();
            let store = Store::builder(dir.path().join("s.redb"))
                .clock(clock.clone())
                .default_max_attempts(1)
                .open()
                .unwrap();
            for &keep in &kept {
                let id = store.enqueue(NewJob::new("q", "x")).unwrap();
                match keep {
                    true => { store.cancel(id).unwrap(); }
                    false => {
                        let lease = store.claim("q", "w", LeaseTerms::new(Duration::from_secs(9))).unwrap().unwrap();
                        store.fail(&lease, "x").unwrap();
                    }
                }
            }
            clock.advance(Duration::from_secs(1));
            let (mut from, mut batches, mut looked) = ((StoreTime::ZERO, JobId(0)), 0usize, 0usize);
            let cutoff = store.now();
            let pass = crate::batches::run(batch, |limit| {
                let (b, next) = store.write(move |tx| {
                    protocol::purge(tx, from, cutoff, &[JobState::Dead], limit)
                })?;
                (from, batches, looked) = (next, batches + 1, looked + b.looked);
                prop_assert!(batches <= kept.len().div_ceil(batch) + 1, "{batches} batches");
                Ok(b)
            })?;
            prop_assert_eq!(looked, kept.len());
            prop_assert_eq!(pass.items.len(), kept.iter().filter(|k| !**k).count());
        }
    }
}

crate::conveniences::conveniences!(Store);
