//! A redb store's write transactions: every one goes through the group commit
//! ([`crate::redb_store::group`]) or, for an application's transaction, runs alone on the
//! caller's thread; each begins at the store's time, chooses its durability, and once
//! committed wakes the waiters of the queues it gave work (in this process and, when
//! processes share the file, the others).

use std::sync::atomic::Ordering;

use redb::WriteTransaction;

use crate::backend::LeaseBackend;
use crate::config::Durability;
use crate::error::Result;
use crate::ids::StoreTime;
use crate::lease::Lease;
use crate::protocol;
use crate::protocol::{Claim, Completion};
use crate::redb_store::app_transaction::RedbWrites;
use crate::redb_store::group::{Committer, PendingOp};
use crate::redb_store::schema;
use crate::redb_store::store::Store;
use crate::redb_store::writing::{Tally, Tx, persist_tally};
use crate::stats::Counters;

impl Store {
    /// For a pool's dispatcher: completes each of `done` (job, attempt, output, last
    /// progress) as its own unit, then makes `claim` (its queues' shares, for its
    /// worker), all queued into the group
    /// together so that they share one commit. One result per completion, then the claim's.
    pub(crate) fn complete_all_then_claim(
        &self,
        done: Vec<Completion>,
        claim: Option<Claim<'_>>,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let count = done.len();
        let mut ops = completions::<Vec<Lease>>(done);
        if let Some(claim) = claim.filter(|c| c.wanted() > 0) {
            let marks = self.marks_due(&mut claim.queues());
            let (plan, worker, terms) = (claim.plan.to_vec(), claim.worker.to_owned(), claim.terms);
            // (a round's claim, after the completions queued before it)
            ops.push(Box::new(move |tx| {
                protocol::round_claim(tx, &plan, &worker, terms, &marks)
            }));
        }
        let mut results = self.inner.group.run_all(self, ops);
        let claimed = match results.len() > count {
            true => results.pop().unwrap_or_else(|| Ok(Vec::new())),
            false => Ok(Vec::new()),
        };
        debug_assert_eq!(results.len(), count);
        (
            results.into_iter().map(|r| r.map(|_| ())).collect(),
            claimed,
        )
    }

    /// Runs a store operation in the next group commit (see [`crate::redb_store::group`]).
    pub(crate) fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        self.inner.group.run(self, f)
    }

    /// Runs an application's transaction alone, on the caller's thread, and commits it if it
    /// succeeds (it may have written its own tables, so it commits even when leasehold's did
    /// not change).
    pub(super) fn write_with_txn<T>(
        &self,
        f: impl for<'t> FnOnce(&mut Tx<'t>, &'t WriteTransaction) -> Result<T>,
    ) -> Result<T> {
        let w = self.begin()?;
        let (result, tally) = {
            let mut tx = Tx::open(&w.txn, w.now, &self.inner.policy)?;
            tx.events = crate::events::Pending::of(&self.inner.hub);
            let result = f(&mut tx, &w.txn);
            if result.is_ok() {
                tx.persist()?;
            }
            (result, (tx.tally, tx.events.take()))
        };
        let (tally, events) = tally;
        match result {
            Ok(value) => {
                self.finish(w, &tally)?;
                self.inner.hub.publish(events);
                Ok(value)
            }
            Err(e) => {
                // The caller's error is the answer; a failure to abort or to count a refusal
                // must not replace it (a LeaseLost must reach the worker as a LeaseLost).
                if let Err(abort) = w.txn.abort() {
                    tracing::error!(error = %abort, "aborting a refused transaction failed");
                }
                if let Err(count) = self.record_refusals(&tally) {
                    tracing::error!(error = %count, "counting a refused write failed");
                }
                Err(e)
            }
        }
    }

    /// A refused fenced write changes nothing, but the refusal is counted: in a transaction
    /// of its own, since the one that was refused is rolled back whole.
    fn record_refusals(&self, tally: &Tally) -> Result<()> {
        let refusals = Tally {
            counters: Counters {
                leases_lost: tally.counters.leases_lost,
                fenced_writes_rejected: tally.counters.fenced_writes_rejected,
                ..Counters::default()
            },
            ..Tally::default()
        };
        if !refusals.counts_anything() {
            return Ok(());
        }
        let w = self.begin()?;
        {
            let mut meta = w.txn.open_table(schema::META)?;
            persist_tally(&mut meta, &refusals)?;
        }
        self.finish(w, &Tally::default())
    }

    /// Begins a write transaction: the one place a commit starts. The clock is read once the
    /// write lock is held, so commits carry non-decreasing times.
    fn begin(&self) -> Result<Writing> {
        let mut txn = self.inner.db.begin_write()?;
        let now = self.now();
        let durable = self.choose_durability(&mut txn, now)?;
        Ok(Writing { txn, now, durable })
    }

    /// Commits it: the one place a commit ends. Counts the write, records whether it was
    /// durable, and wakes the waiters of the queues it gave work and the followers of the
    /// endings if it kept one.
    fn finish(&self, w: Writing, tally: &Tally) -> Result<()> {
        w.txn.commit()?;
        self.inner.writes.fetch_add(1, Ordering::Relaxed);
        self.committed(w.durable, w.now);
        self.readied(&tally.readied);
        if tally.ended {
            self.ended();
        }
        Ok(())
    }

    /// Wakes the followers of the endings: this process's, and, while one of theirs follows,
    /// the other processes' that share the store.
    fn ended(&self) {
        self.inner.notifier.notify_endings();
        if let Some(n) = &self.inner.neighbours
            && self.inner.notifier.followed()
        {
            n.endings_kept();
        }
    }

    /// Wakes the workers waiting for these queues: this process's, and, when processes share
    /// the store, the others'.
    fn readied(&self, queues: &std::collections::BTreeSet<String>) {
        self.inner.notifier.notify(queues);
        if !queues.is_empty()
            && let Some(n) = &self.inner.neighbours
        {
            n.wake_peers();
        }
    }

    fn choose_durability(&self, txn: &mut WriteTransaction, now: StoreTime) -> Result<bool> {
        match self.inner.durability {
            Durability::Immediate => Ok(true),
            Durability::Eventual { flush_every } => {
                let state = self.inner.flush.lock();
                if now.saturating_since(state.last_durable) >= flush_every {
                    Ok(true)
                } else {
                    txn.set_durability(redb::Durability::None)?;
                    Ok(false)
                }
            }
        }
    }

    fn committed(&self, durable: bool, now: StoreTime) {
        if matches!(self.inner.durability, Durability::Immediate) {
            return;
        }
        let mut state = self.inner.flush.lock();
        if durable {
            state.dirty = false;
            state.last_durable = now;
        } else {
            state.dirty = true;
        }
    }
}

/// A write transaction between [`Store::begin`] and [`Store::finish`]: the store time it
/// writes at and whether its commit is durable.
struct Writing {
    txn: WriteTransaction,
    now: StoreTime,
    durable: bool,
}

/// An operation queued into a group commit, returning `T`.
type Op<T> = Box<dyn FnMut(&mut Tx<'_>) -> Result<T> + Send>;

/// One group operation per completion, each a round of its own ([`protocol::round`]); `T`
/// is the result type of the group they join (a completion returns its default). A
/// completion that carries the application's writes runs them after its fence held; if
/// they fail, having written, the group runs every operation again alone (see
/// [`crate::redb_store::group`]), so only that completion fails.
fn completions<T: Default + Send + 'static>(done: Vec<Completion>) -> Vec<Op<T>> {
    done.into_iter()
        .map(|mut c| -> Op<T> {
            Box::new(move |tx| {
                let one = std::slice::from_mut(&mut c);
                let (mut answer, _) = protocol::round(tx, one, None, &[], &mut writes)?;
                let answer = answer.pop();
                answer.unwrap_or(Err(crate::error::Error::Internal("a round lost an answer")))?;
                Ok(T::default())
            })
        })
        .collect()
}

/// The application's writes to its redb tables, after the completion in `tx`
/// ([`RedbWrites::complete`]); writes of another engine's kind are refused.
fn writes(
    tx: &mut Tx<'_>,
    by: crate::lease::Holding,
    output: &[u8],
    progress: Option<u64>,
    writes: &mut crate::protocol::AnyWrites,
) -> Result<()> {
    match writes.as_mut::<RedbWrites>() {
        Some(writes) => writes.complete(tx, by, output, progress),
        None => Err(crate::error::ConfigError::WritesForAnotherStore {
            given: "writes of another engine's kind",
            store: "a redb store, whose writes are Output::with_writes",
        }
        .into()),
    }
}

impl Committer for Store {
    fn commit_group(&self, ops: &mut [Box<dyn PendingOp>]) -> Result<bool> {
        let w = self.begin()?;
        let (tally, events) = {
            let mut tx = Tx::open(&w.txn, w.now, &self.inner.policy)?;
            tx.events = crate::events::Pending::of(&self.inner.hub);
            for op in ops.iter_mut() {
                if !op.apply(&mut tx) {
                    drop(tx);
                    w.txn.abort()?;
                    return Ok(false);
                }
            }
            if tx.tally.changed() {
                tx.persist()?;
            }
            (tx.tally, tx.events.take())
        };
        if !tally.changed() {
            // Nothing written (a claim that found nothing, a refusal counted nowhere): no fsync.
            // (What it told, a claim held back by a limit, still happened.)
            w.txn.abort()?;
            self.inner.hub.publish(events);
            return Ok(true);
        }
        self.finish(w, &tally)?;
        self.inner.hub.publish(events);
        Ok(true)
    }
}
