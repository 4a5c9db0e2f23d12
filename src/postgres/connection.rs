//! One connection of a [`super::PgStore`]: opened with the store's session settings, its
//! server's timeline read (`timeline.rs` judges it), and the warnings the server sends on it
//! heard, so that a commit the server only warned about is not taken for a success.
//!
//! PostgreSQL answers a `COMMIT` whose wait for a synchronous standby was cancelled (by
//! `pg_cancel_backend`, an operator, a watchdog that cancels "stuck" queries) with success
//! and a WARNING: the transaction committed locally and may not have reached the standby,
//! so a failover can lose it. The client hands such a notice to a callback, not to the
//! caller; this module keeps a count per connection, and a commit during which the count
//! moved is answered [`PgError::OutcomeUnknown`]: never acknowledged as durable.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use postgres::error::{DbError, Severity};
use postgres::{Client, NoTls, SimpleQueryMessage, Statement, Transaction};

use super::PgError;
use crate::error::Result;

/// The server's timeline, or `NULL` on a server in recovery (a standby, which accepts no
/// write). The timeline is the first eight hex digits of the current WAL file's name: the
/// one reading of it a role without special rights may make.
pub(super) const TIMELINE: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL
    ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END";

/// One connection and what the store keeps with it.
pub(super) struct Connection {
    pub client: Client,
    /// The statements prepared on it, by the template they were made from.
    pub prepared: HashMap<&'static str, Statement>,
    /// The handle's statements epoch when `prepared` was begun.
    pub epoch: u64,
    /// Its server's timeline when last read; `None` while the server was in recovery.
    pub timeline: Option<u32>,
    /// The warnings its server sent.
    pub warnings: Arc<Warnings>,
}

impl Connection {
    /// A new connection with the store's session settings: a statement timeout, and the
    /// isolation level the protocol is written for. Every statement of the protocol
    /// re-checks its predicate on the rows it locks, which is what READ COMMITTED gives; a
    /// role or database whose default is SERIALIZABLE would abort claims and completions
    /// for conflicts that are none (and the application's SQL with them).
    pub(super) fn open(
        config: &postgres::Config,
        statement_timeout: Duration,
        epoch: u64,
    ) -> Result<Connection> {
        let warnings = Arc::new(Warnings::default());
        let mut config = config.clone();
        let heard = Arc::clone(&warnings);
        config.notice_callback(move |notice| heard.hear(&notice));
        let mut client = config.connect(NoTls).map_err(PgError::connect)?;
        let timeout = statement_timeout.as_millis().max(1);
        let answers = client
            .simple_query(&format!(
                "SET statement_timeout = {timeout};
                 SET default_transaction_isolation = 'read committed';
                 {TIMELINE}"
            ))
            .map_err(PgError::from)?;
        let timeline = answers.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row.get(0).and_then(|t| t.parse().ok())),
            _ => None,
        });
        Ok(Connection {
            client,
            prepared: HashMap::new(),
            epoch,
            timeline: timeline.flatten(),
            warnings,
        })
    }

    /// Reads its server's timeline again (a server in recovery may have been promoted).
    pub(super) fn read_timeline(&mut self) -> Result<Option<u32>> {
        let row = self
            .client
            .query_one(TIMELINE, &[])
            .map_err(PgError::from)?;
        let timeline: Option<i64> = row.try_get(0).map_err(PgError::from)?;
        self.timeline = timeline.and_then(|t| u32::try_from(t).ok());
        Ok(self.timeline)
    }
}

/// The warnings one connection's server sent: how many, and the last one's words.
#[derive(Default)]
pub(super) struct Warnings {
    count: AtomicU64,
    last: Mutex<String>,
}

impl Warnings {
    /// A notice the server sent (the client's callback, on the thread that runs the
    /// statement): a WARNING is counted; every notice goes to `tracing`, as the client's
    /// own callback would have logged it.
    fn hear(&self, notice: &DbError) {
        let said = match notice.detail() {
            Some(detail) => format!("{} ({detail})", notice.message()),
            None => notice.message().to_owned(),
        };
        match notice.parsed_severity() {
            Some(Severity::Warning) => {
                tracing::warn!(code = notice.code().code(), "PostgreSQL warned: {said}");
                *self.last.lock() = said;
                self.count.fetch_add(1, Ordering::SeqCst);
            }
            _ => tracing::debug!(
                severity = notice.severity(),
                code = notice.code().code(),
                "PostgreSQL said: {said}"
            ),
        }
    }
}

/// Commits `tx` on a connection whose server sends its warnings to `warnings`. A commit the
/// server answered with a warning is [`PgError::OutcomeUnknown`]: the one such warning a
/// `COMMIT` gives is a cancelled wait for the synchronous standby (committed here, maybe not
/// there), and anything else a commit warns about is no better known.
pub(super) fn commit(tx: Transaction<'_>, warnings: &Warnings) -> Result<()> {
    let before = warnings.count.load(Ordering::SeqCst);
    tx.commit().map_err(PgError::at_commit)?;
    if warnings.count.load(Ordering::SeqCst) == before {
        return Ok(());
    }
    let said = warnings.last.lock().clone();
    Err(PgError::OutcomeUnknown(format!("the server committed locally and warned: {said}")).into())
}
