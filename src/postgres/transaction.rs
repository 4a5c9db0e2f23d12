//! One transaction of a [`super::PgStore`], as the protocol and the shortcuts see it: the
//! transaction, its prepared statements, and what it gathers until it commits (the queues
//! it readied, its events, its store time). `records.rs` makes it the protocol's records;
//! `fast.rs` runs its own statements on it.

use std::collections::BTreeSet;

use postgres::Transaction;

use super::rows::{Col, time};
use super::{Prepared, Settings};
use crate::error::Result;
use crate::ids::StoreTime;

pub(crate) type Tx<'a, 'b> = &'a mut Transaction<'b>;

const NOW: &str = "SELECT {s}.us({now})";

/// The store's clock: the database's.
pub(crate) fn now(tx: Tx<'_, '_>, p: &mut Prepared<'_>) -> Result<StoreTime> {
    let st = p.get(tx, NOW)?;
    Ok(time(tx.query_one(&st, &[])?.col(0)?))
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
        }
    }

    /// The queues this transaction readied (and notified).
    pub(crate) fn readied_queues(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.notified)
    }

    /// Whether the one-statement shortcuts of `fast.rs` are taken.
    pub(crate) fn shortcuts(&self) -> bool {
        self.settings.shortcuts
    }

    /// Forgets the store time read so far: a row lock was just taken, which may have waited
    /// for another transaction.
    pub(super) fn waited(&mut self) {
        self.now = None;
    }

    pub(super) fn get(&mut self, template: &'static str) -> Result<postgres::Statement> {
        self.p.get(self.tx, template)
    }
}
