//! Deterministic tests of an application's handlers (the `testing` feature).
//!
//! A [`TestStore`] is a real store in a temporary directory whose time moves only when the
//! test moves it. [`TestStore::run_one`] claims one job and runs it through the application's
//! handler on the test's own thread, committing its result as a pool would, so a test can
//! script what a pool's threads make racy: a worker that dies holding a job, one that pauses
//! past its lease while another takes the job over, a process that restarts.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::testing::{TestStore, Verdict};
//! use leasehold::{JobStore, ReadJobs};
//! use leasehold::{JobState, NewJob, Output};
//!
//! # fn main() -> Result<(), leasehold::Error> {
//! let t = TestStore::new()?;
//! let id = t.enqueue(NewJob::new("thumbs", "photo-1.jpg"))?;
//!
//! // A worker claims the job and dies without a word: its lease runs out, the reaper takes
//! // the job back.
//! let dead = t.claim("thumbs", "worker-a", TestStore::LEASE)?.expect("a job");
//! t.expire(&dead)?;
//! assert_eq!(t.reap()?.reclaimed.len(), 1);
//!
//! // The application's handler runs it again, and pauses past its lease meanwhile: another
//! // worker takes the job over, so the late result is refused by the fence.
//! let ran = t.run_one("thumbs", |ctx| {
//!     t.advance(TestStore::LEASE * 2);
//!     t.claim("thumbs", "worker-c", TestStore::LEASE)?;
//!     Ok(Output::new(ctx.payload().to_vec()))
//! })?;
//! assert_eq!(ran.map(|r| r.verdict), Some(Verdict::Fenced));
//!
//! // The dead worker wakes up much later: its completion is refused too.
//! assert!(t.complete(&dead, b"late").unwrap_err().is_lease_lost());
//! assert_eq!(t.job(id)?.map(|j| j.state()), Some(JobState::Running));
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "postgres")]
mod postgres;

use crate::job_store::ReadJobs;
#[cfg(feature = "postgres")]
pub use postgres::TestPgStore;

use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::error::panic_message;
use crate::error::{OpenError, Result};
use crate::ids::StoreTime;
use crate::ids::{Attempt, JobId};
use crate::job::Job;
use crate::job_store::JobStore;
use crate::lease::Lease;
use crate::pool::{AttemptState, JobContext, JobError, Output};
use crate::protocol::End;
use crate::redb_store::Store;
use crate::redb_store::StoreBuilder;
use crate::report::ReapReport;
use crate::rules::Retry;

/// A store in a temporary directory on a [`ManualClock`]; derefs to the [`Store`]. The
/// directory is removed when it is dropped.
pub struct TestStore {
    store: Option<Store>,
    clock: ManualClock,
    dir: PathBuf,
    configure: Box<dyn Fn(StoreBuilder) -> StoreBuilder + Send + Sync>,
}

/// How a job that [`TestStore::run_one`] ran ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The handler's output (and its writes) committed.
    Committed,
    /// The handler returned an error, or its writes or its output were refused; recorded as
    /// the attempt's failure.
    Failed(String),
    /// The handler panicked; recorded as the attempt's failure.
    Panicked(String),
    /// The handler's failure was permanent ([`JobError::permanent`], a payload that does not
    /// decode, an output over the size limit): the job is dead at once.
    FailedPermanently(String),
    /// The lease was gone by the time the result came back: nothing was committed.
    Fenced,
    /// The handler put the job off ([`JobError::snooze`]): it runs again after the delay,
    /// no budget spent.
    Snoozed(std::time::Duration),
}

/// One job run by [`TestStore::run_one`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ran {
    /// The job.
    pub job: JobId,
    /// The attempt the handler ran as.
    pub attempt: Attempt,
    /// How it ended.
    pub verdict: Verdict,
}

impl TestStore {
    /// The lease [`TestStore::run_one`] claims with, and a handy one for tests' own claims.
    pub const LEASE: Duration = Duration::from_secs(60);

    /// The worker id [`TestStore::run_one`] claims as.
    pub const WORKER: &'static str = "test-worker";

    /// A fresh store with the default settings.
    pub fn new() -> Result<TestStore> {
        TestStore::with(|b| b)
    }

    /// A fresh store with settings of the test's choosing (the clock is always the manual
    /// one); the same settings are used again by [`TestStore::restart`].
    pub fn with(
        configure: impl Fn(StoreBuilder) -> StoreBuilder + Send + Sync + 'static,
    ) -> Result<TestStore> {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-test-{}-{:016x}",
            std::process::id(),
            crate::random::random_u64()
        ));
        std::fs::create_dir(&dir).map_err(|source| OpenError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut t = TestStore {
            store: None,
            clock: ManualClock::new(),
            dir,
            configure: Box::new(configure),
        };
        t.store = Some(t.open()?);
        Ok(t)
    }

    fn open(&self) -> Result<Store> {
        (self.configure)(Store::builder(self.path()).clock(self.clock.clone())).open()
    }

    /// The store file.
    pub fn path(&self) -> PathBuf {
        self.dir.join("store.redb")
    }

    /// The directory the store file is in (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store's clock; clones share its time.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Moves store time forward by `d` and wakes whatever waits for work, as real time
    /// passing would.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.wake_all();
    }

    /// Moves store time just past `lease`'s expiry (as its last renewal left it): its holder
    /// has gone silent for a whole lease.
    pub fn expire(&self, lease: &Lease) -> Result<()> {
        let job = self.job(lease.job)?;
        self.advance(past_expiry(job.as_ref(), lease, self.now()));
        Ok(())
    }

    /// Claims the next job of `queue` as [`TestStore::WORKER`] with [`TestStore::LEASE`],
    /// runs `handler` on it on this thread, and commits the result as a pool does: the output
    /// and its writes through the fence, or the error as the attempt's failure. `None` if no
    /// job was claimable.
    ///
    /// The handler may use the store and this `TestStore` (advance time, claim as another
    /// worker) to script what happens while it works.
    pub fn run_one<H, O>(&self, queue: &str, handler: H) -> Result<Option<Ran>>
    where
        H: FnOnce(&JobContext) -> std::result::Result<O, JobError>,
        O: Into<Output<crate::redb_store::RedbWrites>>,
    {
        match self.claim(queue, TestStore::WORKER, TestStore::LEASE)? {
            Some(lease) => {
                let store = Arc::new(self.store().clone());
                run_claimed::<Store, _, _>(store, lease, handler).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Closes the store and opens it again on the same clock, as a restarted process would;
    /// returns what opening took back (every lease the closed store's workers held). If the
    /// store cannot be opened again, the error is returned and the `TestStore` has no store:
    /// using it afterwards panics.
    pub fn restart(&mut self) -> Result<&ReapReport> {
        self.store = None;
        self.store = Some(self.open()?);
        Ok(self.store().recovered_at_open())
    }

    /// The store.
    pub fn store(&self) -> &Store {
        match &self.store {
            Some(store) => store,
            None => panic!("this TestStore's restart failed: it has no store"),
        }
    }
}

impl Deref for TestStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        self.store()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        self.store = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How far store time must move from `now` to be just past `lease`'s expiry as the job's
/// last renewal left it (`job`, if it still exists).
fn past_expiry(job: Option<&Job>, lease: &Lease, now: StoreTime) -> Duration {
    let expires_at = job
        .and_then(|job| job.lease().map(|l| l.expires_at()))
        .unwrap_or(lease.expires_at);
    expires_at.saturating_since(now) + Duration::from_millis(1)
}

/// Runs `handler` on the claimed `lease` on this thread and commits its result through
/// `store` as a pool does: the output and its writes through the fence, or the error as the
/// attempt's failure.
fn run_claimed<S, H, O>(store: Arc<dyn JobStore>, lease: Lease, handler: H) -> Result<Ran>
where
    S: crate::engine::Engine,
    H: FnOnce(&JobContext) -> std::result::Result<O, JobError>,
    O: Into<Output<S::Writes>>,
{
    let state = AttemptState::new(lease.expires_at);
    let ctx = JobContext::new(lease.clone(), state.clone(), store.clone());
    let ran = catch_unwind(AssertUnwindSafe(|| handler(&ctx)));
    let flight = crate::pool::Flight {
        lease: lease.clone(),
        state,
    };
    crate::pool::flush_log(&*store, &flight);
    let store = &*store;
    let verdict = match ran {
        Ok(Ok(output)) => commit(store, &lease, crate::pool::any::<S>(output.into()))?,
        Ok(Err(e)) => match e.snoozed_for() {
            Some(delay) => match crate::holder::end(store, &lease, End::Snooze(delay), None) {
                Ok(_) => Verdict::Snoozed(delay),
                Err(e) if e.is_lease_lost() => Verdict::Fenced,
                Err(e) => return Err(e),
            },
            None => fail_as(store, &lease, failed(&e), e.retry())?,
        },
        Err(panic) => fail_as(
            store,
            &lease,
            Verdict::Panicked(format!("handler panicked: {}", panic_message(&*panic))),
            Retry::WhileBudgetLasts,
        )?,
    };
    Ok(Ran {
        job: lease.job,
        attempt: lease.attempt,
        verdict,
    })
}

fn commit(
    store: &dyn JobStore,
    lease: &Lease,
    output: Output<crate::pool::AnyWrites>,
) -> Result<Verdict> {
    let Output { bytes, writes } = output;
    let committed = match writes {
        Some(writes) => crate::holder::complete_with_writes(store, lease, &bytes, None, writes),
        None => crate::holder::end(store, lease, End::Complete(bytes), None).map(|_| ()),
    };
    match committed {
        Ok(()) => Ok(Verdict::Committed),
        Err(e) if e.is_lease_lost() => Ok(Verdict::Fenced),
        // Rolled back with the lease still held: the attempt fails, as in a pool (writes that
        // panicked as a handler that panicked).
        Err(crate::error::Error::Application(e)) if e.is::<crate::protocol::WritesPanicked>() => {
            let verdict = Verdict::Panicked(e.to_string());
            fail_as(store, lease, verdict, Retry::WhileBudgetLasts)
        }
        Err(e) => match crate::pool::failure_of_rolled_back_completion(&e) {
            Some(failure) => fail_as(store, lease, failed(&failure), failure.retry()),
            None => Err(e),
        },
    }
}

/// The verdict on a handler's (or its completion's) failure.
fn failed(e: &JobError) -> Verdict {
    match e.is_permanent() {
        true => Verdict::FailedPermanently(e.message().to_owned()),
        false => Verdict::Failed(e.message().to_owned()),
    }
}

/// Records `verdict`'s message as the attempt's failure, retried as `retry` says.
fn fail_as(store: &dyn JobStore, lease: &Lease, verdict: Verdict, retry: Retry) -> Result<Verdict> {
    let message = match &verdict {
        Verdict::Failed(m) | Verdict::Panicked(m) | Verdict::FailedPermanently(m) => m.as_str(),
        Verdict::Committed | Verdict::Fenced | Verdict::Snoozed(_) => "",
    };
    match crate::holder::end(store, lease, End::Fail(message.to_owned(), retry), None) {
        Ok(_) => Ok(verdict),
        Err(e) if e.is_lease_lost() => Ok(Verdict::Fenced),
        Err(e) => Err(e),
    }
}
