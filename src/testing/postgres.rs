//! [`TestPgStore`]: a [`PgStore`] on a manual clock, in a schema of its own on a test
//! database, for handlers whose writes are SQL (`Output::with_sql`), which a redb
//! [`TestStore`](super::TestStore) cannot commit.

use std::ops::Deref;
use std::time::Duration;

use super::{Ran, past_expiry, run_claimed};
use crate::clock::ManualClock;
use crate::error::Result;
use crate::lease::Lease;
use crate::pool::{JobContext, JobError, Output};
use crate::postgres::{PgStore, PgStoreBuilder};
use crate::{job_store::JobStore, job_store::ReadJobs};

/// A [`PgStore`] whose statements read store time from a [`ManualClock`] instead of the
/// database's, in a schema made for it (`leasehold_test_<process>_<random>`) and dropped with
/// it. Derefs to the [`PgStore`]; the application's own tables live where its SQL puts them.
///
/// ```no_run
/// use leasehold::testing::{TestPgStore, Verdict};
/// use leasehold::{JobStore, ReadJobs};
/// use leasehold::{NewJob, Output};
///
/// # fn main() -> Result<(), leasehold::Error> {
/// let t = TestPgStore::new("postgres://postgres@127.0.0.1:5432/test")?;
/// t.enqueue(NewJob::new("mail", "welcome"))?;
/// let ran = t.run_one("mail", |_ctx| {
///     Ok(Output::with_sql(b"sent".to_vec(), |tx| {
///         tx.sql().execute("SELECT 1", &[])?;
///         Ok::<(), leasehold::postgres::client::Error>(())
///     }))
/// })?;
/// assert_eq!(ran.map(|r| r.verdict), Some(Verdict::Committed));
/// # Ok(())
/// # }
/// ```
pub struct TestPgStore {
    store: PgStore,
    clock: ManualClock,
}

impl TestPgStore {
    /// A fresh store on the database at `url` with the default settings.
    pub fn new(url: &str) -> Result<TestPgStore> {
        TestPgStore::with(url, |b| b)
    }

    /// A fresh store with settings of the test's choosing; the schema and the clock are
    /// always the test store's own (set after `configure`).
    pub fn with(
        url: &str,
        configure: impl FnOnce(PgStoreBuilder) -> PgStoreBuilder,
    ) -> Result<TestPgStore> {
        let clock = ManualClock::new();
        let schema = format!(
            "leasehold_test_{}_{:016x}",
            std::process::id(),
            crate::random::random_u64()
        );
        let store = configure(PgStore::builder(url))
            .schema(schema)
            .with_simulated_clock(clock.clone())
            .open()?;
        Ok(TestPgStore { store, clock })
    }

    /// The store's clock; clones share its time.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Moves store time forward by `d` and wakes this process's waiters for work.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.store.wake_all();
    }

    /// Moves store time just past `lease`'s expiry (as its last renewal left it).
    pub fn expire(&self, lease: &Lease) -> Result<()> {
        let job = self.store.job(lease.job)?;
        self.advance(past_expiry(job.as_ref(), lease, self.store.now()?));
        Ok(())
    }

    /// Claims the next job of `queue` as [`super::TestStore::WORKER`] with
    /// [`super::TestStore::LEASE`], runs `handler` on it on this thread and commits the
    /// result as a pool does (see [`super::TestStore::run_one`]). `None` if no job was
    /// claimable.
    pub fn run_one<H, O>(&self, queue: &str, handler: H) -> Result<Option<Ran>>
    where
        H: FnOnce(&JobContext) -> std::result::Result<O, JobError>,
        O: Into<Output<crate::postgres::SqlWrites>>,
    {
        let worker = super::TestStore::WORKER;
        match self.store.claim(queue, worker, super::TestStore::LEASE)? {
            Some(lease) => {
                let store = std::sync::Arc::new(self.store.clone());
                run_claimed::<PgStore, _, _>(store, lease, handler).map(Some)
            }
            None => Ok(None),
        }
    }
}

impl Deref for TestPgStore {
    type Target = PgStore;

    fn deref(&self) -> &PgStore {
        &self.store
    }
}

impl Drop for TestPgStore {
    fn drop(&mut self) {
        let schema = self.store.schema().to_owned();
        let dropped = self.store.transaction(|t| {
            t.sql()
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
            Ok(())
        });
        if let Err(e) = dropped {
            tracing::warn!(schema, error = %e, "could not drop a test store's schema");
        }
    }
}
