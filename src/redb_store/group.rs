//! Group commit: concurrent store operations share one write transaction, and so one fsync.
//!
//! Leader/follower, as RocksDB's write groups and MySQL's binlog group commit do it: every
//! caller queues its operation; whoever finds no leader becomes one, takes everything queued,
//! applies each operation as its own unit inside one transaction, commits once, and hands
//! each caller its own result. An uncontended caller is its own leader at once and never waits
//! for another thread; under contention, the operations that queue up while one fsync runs all
//! share the next.
//!
//! Each operation is its own unit: the protocol checks before it writes, so an operation
//! refused by the fence or its input checks has written nothing, and its neighbours commit.
//! (redb savepoints cannot do this instead: redb refuses a savepoint once the transaction has
//! opened a table, so only the state before the first operation could be restored; see the
//! test `redb_refuses_a_savepoint_between_operations`.)
//! An operation that fails after writing (a storage or corruption error) poisons the shared
//! transaction: it is rolled back, and every operation of the group is applied again in a
//! transaction of its own, so one failure never fails its neighbours.
//!
//! A failed commit is reported to every caller of the group (never dropped); as redb says, it
//! may still have become durable, which every fenced operation tolerates on retry.
//!
//! The other shape weighed, a dedicated writer thread fed by the callers, was measured
//! beside this one and removed (BENCHMARKS.md keeps the figures): it makes every caller wake
//! another thread and be woken back, which costs more than a whole non-durable commit,
//! where leader/follower lets an uncontended caller commit on its own thread.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::redb_store::writing::Tx;

thread_local! {
    /// The groups (by address) whose writer seat this thread holds while it runs an
    /// application's transaction. A store call from inside that transaction would wait for
    /// the seat its own thread holds, forever: it is refused instead.
    static SEATS_HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The most operations one transaction carries; the rest wait for the next leader.
const MAX_GROUP: usize = 1024;

/// One queued operation, its result kept with it.
pub(crate) trait PendingOp: Send {
    /// Applies the operation in `tx`. `false` if it failed after writing, which poisons the
    /// transaction.
    fn apply(&mut self, tx: &mut Tx<'_>) -> bool;
    /// Replaces the result with `e` (the shared transaction failed).
    fn fail(&mut self, e: Error);
    /// Marks the operation finished: its caller may take the result.
    fn finish(&mut self);
}

struct Slot<T> {
    result: Mutex<Option<Result<T>>>,
    done: AtomicBool,
}

struct TypedOp<T, F> {
    f: F,
    slot: Arc<Slot<T>>,
}

impl<T, F> PendingOp for TypedOp<T, F>
where
    T: Send,
    F: FnMut(&mut Tx<'_>) -> Result<T> + Send,
{
    fn apply(&mut self, tx: &mut Tx<'_>) -> bool {
        let writes_before = tx.tally.writes;
        let result = (self.f)(tx);
        let clean = match &result {
            Ok(_) => true,
            Err(e) => e.is_refusal() && tx.tally.writes == writes_before,
        };
        *self.slot.result.lock() = Some(result);
        clean
    }

    fn fail(&mut self, e: Error) {
        *self.slot.result.lock() = Some(Err(e));
    }

    fn finish(&mut self) {
        self.slot.done.store(true, Ordering::Release);
    }
}

/// What runs a group: the store's transaction machinery.
pub(crate) trait Committer {
    /// Applies `ops` in one transaction and commits it (or rolls it back if nothing changed).
    /// `Ok(false)` if an operation poisoned it (rolled back); `Err` if the transaction itself
    /// failed.
    fn commit_group(&self, ops: &mut [Box<dyn PendingOp>]) -> Result<bool>;
}

#[derive(Default)]
pub(crate) struct Group {
    state: Mutex<State>,
    cond: Condvar,
}

#[derive(Default)]
struct State {
    queue: Vec<Box<dyn PendingOp>>,
    leading: bool,
    /// How many operations the last group carried.
    last_group: usize,
}

impl State {
    /// The next group: everything queued, up to [`MAX_GROUP`], oldest first.
    fn take_group(&mut self) -> Vec<Box<dyn PendingOp>> {
        let take = self.queue.len().min(MAX_GROUP);
        self.last_group = take;
        self.queue.drain(..take).collect()
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").finish_non_exhaustive()
    }
}

impl Group {
    /// Whether a group transaction is under way (its leader at work).
    pub(crate) fn leading(&self) -> bool {
        self.state.lock().leading
    }

    /// Runs `op` in the next group transaction and returns its own result.
    pub(crate) fn run<T, F>(&self, committer: &dyn Committer, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        let mut results = self.run_all(committer, vec![f]);
        results
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a group commit lost a result")))
    }

    /// Queues several operations at once, in order, each its own unit, and returns each
    /// one's result: a caller that gathered work from many threads (a pool's completions)
    /// gets them into one transaction without a thread per operation.
    pub(crate) fn run_all<T, F>(&self, committer: &dyn Committer, ops: Vec<F>) -> Vec<Result<T>>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        if self.held_by_this_thread() {
            return ops.iter().map(|_| Err(Error::Reentered)).collect();
        }
        let slots: Vec<Arc<Slot<T>>> = ops
            .iter()
            .map(|_| {
                Arc::new(Slot {
                    result: Mutex::new(None),
                    done: AtomicBool::new(false),
                })
            })
            .collect();
        let mut state = self.state.lock();
        for (f, slot) in ops.into_iter().zip(&slots) {
            state.queue.push(Box::new(TypedOp {
                f,
                slot: slot.clone(),
            }));
        }
        // Operations finish in queue order, so the last one done means all are.
        while let Some(last) = slots.last()
            && !last.done.load(Ordering::Acquire)
        {
            if state.leading {
                self.cond.wait(&mut state);
                continue;
            }
            state.leading = true;
            if state.queue.len() < state.last_group {
                // The previous group was bigger: its callers are likely on their way back
                // with their next operations. Let them queue before committing, once.
                drop(state);
                std::thread::yield_now();
                state = self.state.lock();
            }
            state = self.commit_next(state, |batch| lead(committer, batch));
        }
        drop(state);
        slots
            .iter()
            .map(|slot| {
                slot.result
                    .lock()
                    .take()
                    .unwrap_or_else(|| Err(Error::Internal("a group commit lost a result")))
            })
            .collect()
    }

    /// Takes the next group (the caller leads, `leading` set), commits it with `commit`
    /// outside the lock, then gives up the lead and wakes the waiting callers.
    fn commit_next<'g>(
        &'g self,
        mut state: MutexGuard<'g, State>,
        commit: impl FnOnce(&mut Vec<Box<dyn PendingOp>>),
    ) -> MutexGuard<'g, State> {
        let mut batch = state.take_group();
        drop(state);
        {
            // The application's writes a completion carries run here, on the leader's
            // thread: a store call from them is refused (Reentered) rather than queued
            // behind itself.
            let _seat = Seat::held(self);
            commit(&mut batch);
        }
        let mut state = self.state.lock();
        state.leading = false;
        self.cond.notify_all();
        state
    }

    /// Runs `f` on the caller's thread with the group's writer seat to itself: for
    /// transactions that carry the application's own writes, which are not batched.
    /// [`Error::Reentered`] if this thread holds the seat already (`f` of an outer call is
    /// calling the store).
    pub(crate) fn exclusive<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.held_by_this_thread() {
            return Err(Error::Reentered);
        }
        let mut state = self.state.lock();
        while state.leading {
            self.cond.wait(&mut state);
        }
        state.leading = true;
        drop(state);
        let _release = Release(self);
        let _seat = Seat::held(self);
        f()
    }

    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    fn held_by_this_thread(&self) -> bool {
        SEATS_HELD.with(|held| held.borrow().contains(&self.address()))
    }
}

/// This thread's mark that it holds a group's writer seat (see [`SEATS_HELD`]), taken off
/// when dropped, also if the holder unwinds.
struct Seat(usize);

impl Seat {
    fn held(group: &Group) -> Seat {
        let address = group.address();
        SEATS_HELD.with(|held| held.borrow_mut().push(address));
        Seat(address)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        SEATS_HELD.with(|held| held.borrow_mut().retain(|&a| a != self.0));
    }
}

/// Gives up the leader's seat, also if the holder unwinds.
struct Release<'a>(&'a Group);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.state.lock().leading = false;
        self.0.cond.notify_all();
    }
}

/// Commits a batch, and on poison re-runs each operation alone; every operation ends finished.
fn lead(committer: &dyn Committer, batch: &mut [Box<dyn PendingOp>]) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        match committer.commit_group(batch) {
            Ok(true) => {}
            Ok(false) => {
                // Poisoned and rolled back: each one alone, so only the culprit fails.
                for op in batch.iter_mut() {
                    if let Err(e) = committer.commit_group(std::slice::from_mut(op)) {
                        op.fail(e);
                    }
                }
            }
            Err(e) => {
                let shared = Arc::new(e);
                for op in batch.iter_mut() {
                    op.fail(Error::Group(shared.clone()));
                }
            }
        }
    }));
    if outcome.is_err() {
        let shared = Arc::new(Error::Panicked);
        for op in batch.iter_mut() {
            op.fail(Error::Group(shared.clone()));
        }
    }
    for op in batch.iter_mut() {
        op.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::JobId;
    use crossbeam_channel::{Receiver, Sender, bounded};

    /// Why each operation is checked before it writes instead of being wrapped in a savepoint:
    /// redb takes a savepoint only before the transaction touches a table. If this starts to
    /// pass, per-operation savepoints become possible and worth measuring against the checks.
    #[test]
    fn redb_refuses_a_savepoint_between_operations() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("sp.redb")).unwrap();
        let table: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
        let txn = db.begin_write().unwrap();
        assert!(txn.ephemeral_savepoint().is_ok(), "before any operation");
        assert!(
            txn.ephemeral_savepoint().is_ok(),
            "and again, nothing written yet"
        );
        txn.open_table(table).unwrap().insert(1, 1).unwrap();
        assert!(matches!(
            txn.ephemeral_savepoint(),
            Err(redb::SavepointError::InvalidSavepoint)
        ));
    }

    /// A committer that records group sizes, can hold its first group until told, and
    /// answers each operation with an error carrying the group's number (no real store).
    struct Mock {
        sizes: Mutex<Vec<usize>>,
        hold_first: Option<(Sender<()>, Receiver<()>)>,
        verdict: fn(usize) -> Result<bool>,
    }

    impl Committer for Mock {
        fn commit_group(&self, ops: &mut [Box<dyn PendingOp>]) -> Result<bool> {
            let n = {
                let mut sizes = self.sizes.lock();
                sizes.push(ops.len());
                sizes.len()
            };
            if n == 1
                && let Some((started, release)) = &self.hold_first
            {
                let _ = started.send(());
                let _ = release.recv();
            }
            let verdict = (self.verdict)(ops.len());
            if verdict.is_ok() {
                for op in ops.iter_mut() {
                    op.fail(Error::JobNotFound(JobId(n as u64)));
                }
            }
            verdict
        }
    }

    impl Mock {
        fn new(
            hold_first: Option<(Sender<()>, Receiver<()>)>,
            verdict: fn(usize) -> Result<bool>,
        ) -> Mock {
            Mock {
                sizes: Mutex::new(Vec::new()),
                hold_first,
                verdict,
            }
        }
    }

    fn call(group: &Group, mock: &Mock) -> Result<()> {
        group.run(mock, |_tx| Ok(()))
    }

    #[test]
    fn callers_that_queue_behind_a_commit_share_the_next_one() {
        let (started_tx, started_rx) = bounded(1);
        let (release_tx, release_rx) = bounded(1);
        let mock = Mock::new(Some((started_tx, release_rx)), |_| Ok(true));
        let group = Group::default();
        std::thread::scope(|s| {
            let first = s.spawn(|| call(&group, &mock));
            started_rx.recv().unwrap(); // the first caller leads, and its commit is held
            let followers: Vec<_> = (0..4).map(|_| s.spawn(|| call(&group, &mock))).collect();
            // wait until all four are queued behind the held commit
            while group.state.lock().queue.len() < 4 {
                std::thread::yield_now();
            }
            release_tx.send(()).unwrap();
            let first = first.join().unwrap();
            assert!(matches!(first, Err(Error::JobNotFound(JobId(1)))));
            for f in followers {
                // each gets its own result, from the second (shared) group
                assert!(matches!(
                    f.join().unwrap(),
                    Err(Error::JobNotFound(JobId(2)))
                ));
            }
        });
        assert_eq!(*mock.sizes.lock(), vec![1, 4]);
    }

    #[test]
    fn an_uncontended_caller_leads_its_own_group_at_once() {
        let mock = Mock::new(None, |_| Ok(true));
        let group = Group::default();
        for _ in 0..3 {
            let _ = call(&group, &mock);
        }
        assert_eq!(*mock.sizes.lock(), vec![1, 1, 1]);
    }

    #[test]
    fn operations_queued_together_share_one_commit_and_keep_their_own_results() {
        let mock = Mock::new(None, |_| Ok(true));
        let group = Group::default();
        let results = group.run_all(&mock, (0..3).map(|_| |_: &mut Tx<'_>| Ok(())).collect());
        assert_eq!(results.len(), 3);
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(Error::JobNotFound(JobId(1)))))
        );
        assert_eq!(*mock.sizes.lock(), vec![3]);
    }

    #[test]
    fn a_poisoned_group_is_rerun_one_operation_at_a_time() {
        let (started_tx, started_rx) = bounded(1);
        let (release_tx, release_rx) = bounded(1);
        // a group of more than one is poisoned; alone, each operation commits
        let mock = Mock::new(Some((started_tx, release_rx)), |n| Ok(n == 1));
        let group = Group::default();
        std::thread::scope(|s| {
            let first = s.spawn(|| call(&group, &mock));
            started_rx.recv().unwrap();
            let followers: Vec<_> = (0..3).map(|_| s.spawn(|| call(&group, &mock))).collect();
            while group.state.lock().queue.len() < 3 {
                std::thread::yield_now();
            }
            release_tx.send(()).unwrap();
            let _ = first.join().unwrap();
            for f in followers {
                assert!(matches!(f.join().unwrap(), Err(Error::JobNotFound(_))));
            }
        });
        assert_eq!(*mock.sizes.lock(), vec![1, 3, 1, 1, 1]);
    }

    #[test]
    fn a_failed_commit_is_reported_to_every_caller_of_the_group() {
        let mock = Mock::new(None, |_| Err(Error::InUse("the disk is on fire")));
        let group = Group::default();
        match call(&group, &mock) {
            Err(Error::Group(e)) => assert!(matches!(*e, Error::InUse(_))),
            other => panic!("expected the shared failure, got {other:?}"),
        }
    }
}
