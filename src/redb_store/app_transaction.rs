//! A leasehold write transaction that the application shares: enqueue or complete jobs and
//! write the application's own tables, all committed together or not at all.

use redb::{Key, Table, TableDefinition, TableHandle, Value, WriteTransaction};

use crate::error::{InputError, Result};
use crate::ids::{JobId, StoreTime};
use crate::lease::Lease;
use crate::new_job::NewJob;
use crate::pool::Output;
use crate::protocol::{self, End};
use crate::redb_store::writing::Tx;
use crate::rules::Retry;
use crate::state::JobState;

/// The prefix of the store's own table names in the file; the application's tables live
/// beside them under any other name.
pub const RESERVED_TABLE_PREFIX: &str = "leasehold.";

/// One write transaction, opened by [`Store::transaction`](crate::Store::transaction).
///
/// The fenced operations here behave exactly as the store's own; if one fails (a lost
/// lease, say) and the closure returns the error, the application's writes are rolled back
/// with everything else.
pub struct Transaction<'a, 't> {
    tx: &'a mut Tx<'t>,
    txn: &'t WriteTransaction,
}

impl<'a, 't> Transaction<'a, 't> {
    pub(crate) fn new(tx: &'a mut Tx<'t>, txn: &'t WriteTransaction) -> Self {
        Transaction { tx, txn }
    }

    /// The store time this transaction acts at.
    pub fn now(&self) -> StoreTime {
        self.tx.now
    }

    /// The underlying redb transaction, for the application's own tables. Tables whose names
    /// start with `leasehold.` are the store's: they are open already and must not be touched.
    pub fn redb(&self) -> &'t WriteTransaction {
        self.txn
    }

    /// Opens (creating it if needed) one of the application's own tables in this transaction.
    /// Names starting with [`RESERVED_TABLE_PREFIX`] are the store's and are refused.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        table: TableDefinition<'_, K, V>,
    ) -> Result<Table<'t, K, V>> {
        if table.name().starts_with(RESERVED_TABLE_PREFIX) {
            return Err(InputError::ReservedTableName(table.name().to_owned()).into());
        }
        Ok(self.txn.open_table(table).map_err(redb::Error::from)?)
    }

    /// Enqueues a job in this transaction (see [`JobStore::enqueue`](crate::JobStore::enqueue)).
    pub fn enqueue(&mut self, job: NewJob) -> Result<JobId> {
        protocol::enqueue(self.tx, &job)
    }

    /// Completes a job in this transaction, if its lease still holds.
    pub fn complete(&mut self, lease: &Lease, output: &[u8]) -> Result<()> {
        self.end_with_success(lease, output, None)
    }

    /// [`Transaction::complete`], recording the attempt's last progress.
    pub(crate) fn end_with_success(
        &mut self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
    ) -> Result<()> {
        protocol::complete(self.tx, lease.holding(), output, progress)
    }

    /// Fails an attempt in this transaction, if its lease still holds.
    pub fn fail(&mut self, lease: &Lease, error: &str) -> Result<JobState> {
        let fail = End::Fail(error.to_owned(), Retry::WhileBudgetLasts);
        protocol::end(self.tx, lease.holding(), &fail, None)
    }

    /// Fails an attempt for good in this transaction, if its lease still holds (see
    /// [`JobStore::fail_permanently`](crate::JobStore::fail_permanently)).
    pub fn fail_permanently(&mut self, lease: &Lease, error: &str) -> Result<JobState> {
        let fail = End::Fail(error.to_owned(), Retry::Never);
        protocol::end(self.tx, lease.holding(), &fail, None)
    }
}

/// The application's writes to its own redb tables, in a completion's transaction (see
/// [`Output::with_writes`]): what an [`Output`] of a pool on a [`Store`](crate::Store)
/// carries.
pub struct RedbWrites(
    pub(crate) Box<dyn FnMut(&mut Transaction<'_, '_>) -> crate::protocol::WritesResult + Send>,
);

impl RedbWrites {
    /// Completes the attempt in `tx` and runs the writes after it, only if the fence held:
    /// one unit of a group commit. A panic in the writes is their failure (the group rolls
    /// the transaction back and runs its other operations again without them).
    pub(crate) fn complete(
        &mut self,
        tx: &mut Tx<'_>,
        by: crate::lease::Holding,
        output: &[u8],
        progress: Option<u64>,
    ) -> Result<()> {
        protocol::complete(tx, by, output, progress)?;
        let txn = tx.tables.txn();
        let writes = &mut self.0;
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            writes(&mut Transaction::new(tx, txn))
        }));
        match ran {
            Ok(written) => written.map_err(crate::error::Error::from_application),
            Err(panic) => {
                let message = crate::error::panic_message(&*panic);
                let panicked = crate::protocol::WritesPanicked(message);
                Err(crate::error::Error::Application(Box::new(panicked)))
            }
        }
    }
}

impl Output<RedbWrites> {
    /// Output bytes plus the application's writes, committed with the completion or not at
    /// all (see [`Store::complete_with`](crate::Store::complete_with)): its own tables
    /// ([`Transaction::open_table`]) and follow-up jobs ([`Transaction::enqueue`]). `writes`
    /// runs only if the fence holds, inside the completion's transaction, so it must use the
    /// [`Transaction`] and not the store (which refuses it with
    /// [`Error::Reentered`](crate::Error::Reentered)). If it fails, the completion rolls
    /// back and the attempt fails with its error.
    ///
    /// A pool commits many completions in one transaction. Where one of them fails after
    /// writing (its writes return an error, or panic), that transaction is rolled back and
    /// each completion of it runs again in a transaction of its own, `writes` included: so
    /// `writes` may run more than once, and only the last run commits (as
    /// `Output::with_sql`'s on PostgreSQL).
    pub fn with_writes<F, E>(bytes: impl Into<Vec<u8>>, mut writes: F) -> Output<RedbWrites>
    where
        F: FnMut(&mut Transaction<'_, '_>) -> std::result::Result<(), E> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Output::with(
            bytes,
            RedbWrites(Box::new(move |txn| writes(txn).map_err(Into::into))),
        )
    }
}
