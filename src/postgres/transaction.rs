//! One transaction of a [`super::PgStore`], as the protocol and the shortcuts see it: the
//! transaction, its prepared statements, and what it gathers until it commits (the queues
//! it readied, its events, its store time), and, for a round's claim, the completions
//! committing beside it in another transaction ([`Beside`]). `records.rs` makes it the
//! protocol's records; `fast.rs` runs its own statements on it.

use std::collections::BTreeSet;

use postgres::Transaction;

use super::rows::{Col, clamp, micros, time};
use super::{Prepared, Settings};
use crate::error::Result;
use crate::ids::StoreTime;

pub(crate) type Tx<'a, 'b> = &'a mut Transaction<'b>;

const NOW: &str = "SELECT {s}.us({now})";

/// The store's clock: the database's (in a transaction or alone).
pub(crate) fn now(c: &mut impl postgres::GenericClient, p: &mut Prepared<'_>) -> Result<StoreTime> {
    let st = p.get(c, NOW)?;
    Ok(time(c.query_one(&st, &[])?.col(0)?))
}

/// Tells listening stores on every machine that `queue` has work, when this transaction
/// commits (PostgreSQL folds repeats of one payload within a transaction into one).
pub(crate) fn notify(tx: Tx<'_, '_>, p: &mut Prepared<'_>, queue: &str) -> Result<()> {
    let st = p.get(tx, "SELECT pg_notify($1, $2)")?;
    tx.execute(&st, &[&p.names.channel, &queue])?;
    Ok(())
}

/// One transaction of a [`super::PgStore`], as the protocol sees it.
pub(crate) struct PgRecords<'a, 'b, 'c> {
    pub tx: &'a mut Transaction<'b>,
    pub p: &'a mut Prepared<'c>,
    pub(super) settings: &'a Settings,
    /// Queues already notified in this transaction.
    pub(super) notified: BTreeSet<String>,
    /// Its store time, read when a step first asks and kept until the transaction takes a
    /// row lock it may have waited for ([`PgRecords::waited`]): the steps between two locks
    /// decide at one time (each reading is a round trip), and none decides at a time read
    /// before a wait.
    pub(super) now: Option<StoreTime>,
    /// Its events, for the subscribers once it commits.
    pub events: crate::events::Pending,
    /// What its steps counted, written by [`PgRecords::write_counts`] just before it
    /// commits: a counter's row is one every writer of the store updates, so it is locked
    /// last and for the shortest time. Taken mid-transaction, between two job rows, it
    /// made one round's completions deadlock with another's (each holding a job row the
    /// other wanted, one of them also the counter).
    pub(super) counts: crate::stats::Counters,
    /// The completions of this transaction's round committing beside it, in another
    /// transaction, until it has waited for them
    /// ([`crate::protocol::Records::completions_committed`]).
    pub(super) beside: Option<std::sync::Arc<Beside>>,
    /// The claim of this transaction's round committing beside it, in another transaction,
    /// until it has taken what it takes ([`crate::protocol::Records::ending_alone`]).
    pub(super) claim_beside: Option<crossbeam_channel::Receiver<()>>,
}

impl<'a, 'b, 'c> PgRecords<'a, 'b, 'c> {
    pub(crate) fn new(
        tx: &'a mut Transaction<'b>,
        p: &'a mut Prepared<'c>,
        settings: &'a Settings,
    ) -> PgRecords<'a, 'b, 'c> {
        PgRecords {
            tx,
            p,
            settings,
            notified: BTreeSet::new(),
            now: None,
            events: Default::default(),
            counts: Default::default(),
            beside: None,
            claim_beside: None,
        }
    }

    /// `answer`, after writing what this transaction's steps counted
    /// ([`PgRecords::counts`]) where the transaction is to commit: on success, and on a
    /// refusal by the fence, which commits its counter alone. The last statement before
    /// the commit.
    pub(crate) fn counted<T>(&mut self, answer: Result<T>) -> Result<T> {
        let counts = std::mem::take(&mut self.counts);
        match answer {
            Ok(value) => write_counts(self.tx, self.p, &counts).map(|()| value),
            Err(e) if e.is_lease_lost() => write_counts(self.tx, self.p, &counts).and(Err(e)),
            Err(e) => Err(e),
        }
    }

    /// Takes what this transaction's steps counted, for a caller that writes them later
    /// ([`write_counts`]) or adds them to an enclosing transaction's.
    pub(crate) fn take_counts(&mut self) -> crate::stats::Counters {
        std::mem::take(&mut self.counts)
    }

    /// The queues this transaction readied (and notified).
    pub(crate) fn readied_queues(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.notified)
    }

    /// Whether the one-statement shortcuts of `fast.rs` are taken.
    pub(crate) fn shortcuts(&self) -> bool {
        self.settings.shortcuts
    }

    /// Notes that a statement of its own (one of `fast.rs`) already notified `queue`'s
    /// waiters in this transaction, as [`crate::protocol::Records::readied`] would have.
    pub(super) fn notified_by_statement(&mut self, queue: &str) {
        self.notified.insert(queue.to_owned());
    }

    /// Forgets the store time read so far: a row lock was just taken, which may have waited
    /// for another transaction.
    pub(super) fn waited(&mut self) {
        self.now = None;
    }

    pub(super) fn get(&mut self, template: &'static str) -> Result<postgres::Statement> {
        self.p.get(self.tx, template)
    }

    /// The job ids `template` selects with a time bound (`$1`) and a limit (`$2`).
    pub(super) fn ids_by(
        &mut self,
        template: &'static str,
        bound: crate::ids::StoreTime,
        limit: usize,
    ) -> Result<Vec<crate::ids::JobId>> {
        let st = self.get(template)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        (self
            .tx
            .query(&st, &[&super::rows::us(bound), &limit])?
            .iter())
        .map(|r| Ok(super::rows::id(r.col(0)?)))
        .collect()
    }
}

/// Completions committing beside a claim, in a transaction of their own (see
/// `Records::take_waiting` in `records.rs`), as the claim's transaction sees them.
pub(crate) struct Beside {
    /// The jobs being completed.
    pub jobs: std::collections::HashSet<i64>,
    /// Dropped when the claim has taken the waiting jobs it takes: until then the
    /// completions lock no row it could take (one refused would be passed over, not taken
    /// first).
    pub taking: parking_lot::Mutex<Option<crossbeam_channel::Sender<()>>>,
    /// Disconnected when the completions' transaction has ended.
    pub committed: crossbeam_channel::Receiver<()>,
}

impl Beside {
    /// Says the claim has taken the waiting jobs it takes.
    pub(crate) fn has_taken(&self) {
        drop(self.taking.lock().take());
    }

    /// Returns once the completions' transaction has ended (saying first that the claim has
    /// taken what it takes: it waits for them now).
    pub(crate) fn settle(&self) {
        self.has_taken();
        let _ = self.committed.recv();
    }
}

/// Adds `counts` to the store's counters: one statement, the rows in the order of their
/// names, so that two transactions writing several counters take their locks in one order.
pub(crate) fn write_counts(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    counts: &crate::stats::Counters,
) -> Result<()> {
    let mut named: Vec<(&str, i64)> = (counts.named().into_iter())
        .filter(|(_, by)| *by > 0)
        .map(|(name, by)| (name, clamp(by)))
        .collect();
    if !named.is_empty() {
        named.sort_unstable();
        let (names, by): (Vec<&str>, Vec<i64>) = named.into_iter().unzip();
        // An upsert: a counter added after a store was made has no row there yet.
        let st = p.get(
            tx,
            "INSERT INTO {s}.leasehold_counters AS c (name, value)
             SELECT * FROM unnest($1::text[], $2::bigint[]) ORDER BY 1
             ON CONFLICT (name) DO UPDATE SET value = c.value + excluded.value",
        )?;
        tx.execute(&st, &[&names, &by])?;
    }
    if !counts.worst_detection_delay.is_zero() {
        let worst = p.get(
            tx,
            "UPDATE {s}.leasehold_counters SET value = greatest(value, $1)
             WHERE name = 'worst_detection_delay_us'",
        )?;
        tx.execute(&worst, &[&micros(counts.worst_detection_delay)])?;
    }
    Ok(())
}
