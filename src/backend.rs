//! The store seam: what a worker pool and a reaper ask of a store, so that both run on the
//! redb [`Store`] and (the `postgres` feature) on a [`PgStore`](crate::postgres::PgStore).
//!
//! The seam is drawn at the pool's needs, not at the store's whole API: claims that ride on
//! completions, batched renewals, the ends of an attempt with the holder's last progress, and
//! the waits for work. Each backend keeps its own way of doing them (redb's group commit,
//! PostgreSQL's statements); the rules they apply are the same, and the suites check it.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::ids::{Attempt, JobId, StoreTime};
use crate::job::JobState;
use crate::job_store::JobStore;
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::rules::Retry;

/// What the application's writes return: its own error, whatever it is.
pub(crate) type WritesResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A store a worker pool runs on, and the kind of application writes its completions carry
/// ([`Output`](crate::Output)'s type parameter): redb tables ([`RedbWrites`](crate::RedbWrites))
/// on a [`Store`](crate::Store), SQL (`SqlWrites`) on a `PgStore`, either ([`AnyWrites`],
/// checked when committed) on a [`Backend`]. Implemented by those three alone.
pub trait Engine: Into<Backend> + Send + Sync + 'static + sealed::Sealed {
    /// The application's writes a completion on this engine carries.
    type Writes: Send + 'static;
    /// Writes of this engine's kind as writes of any kind.
    #[doc(hidden)]
    fn any(writes: Self::Writes) -> AnyWrites {
        AnyWrites(Box::new(writes))
    }
}

pub(crate) mod sealed {
    /// Only leasehold's stores are engines.
    pub trait Sealed {}
}

/// Writes of any engine's kind, for a pool on a [`Backend`] chosen at run time: the engine
/// that commits them takes its own kind and refuses another
/// ([`ConfigError::WritesForAnotherStore`](crate::ConfigError)). Made by `into_any` on an
/// [`Output`](crate::Output) of an engine's kind.
pub struct AnyWrites(pub(crate) Box<dyn std::any::Any + Send>);

impl AnyWrites {
    /// The writes, if they are of kind `W`, borrowed (a transaction that runs again runs
    /// them again).
    #[cfg(feature = "postgres")]
    pub(crate) fn as_mut<W: 'static>(&mut self) -> Option<&mut W> {
        if self.0.is::<W>() {
            return self.0.downcast_mut::<W>();
        }
        self.0.downcast_mut::<AnyWrites>().and_then(|w| w.as_mut())
    }

    /// The writes, if they are of kind `W`.
    pub(crate) fn take<W: 'static>(self) -> Option<W> {
        match self.0.downcast::<W>() {
            Ok(w) => Some(*w),
            // (`into_any` of writes already of any kind wraps them once more)
            Err(other) => other.downcast::<AnyWrites>().ok().and_then(|w| w.take()),
        }
    }
}

impl sealed::Sealed for Backend {}

impl Engine for Backend {
    type Writes = AnyWrites;
    fn any(writes: AnyWrites) -> AnyWrites {
        writes
    }
}

/// A completion a pool hands over to be committed with others.
pub(crate) struct Completion {
    pub job: JobId,
    pub attempt: Attempt,
    pub output: Vec<u8>,
    /// The attempt's last progress.
    pub progress: Option<u64>,
    /// The application's writes, committed in the round under the completion's own fence
    /// (a failure of theirs fails this completion alone).
    pub writes: Option<AnyWrites>,
}

/// The application's writes panicked while a round committed them: the attempt fails as
/// a handler's panic does (the engine rolled back what they wrote).
#[derive(Debug)]
pub(crate) struct WritesPanicked(pub String);

impl std::fmt::Display for WritesPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "writes panicked: {}", self.0)
    }
}

impl std::error::Error for WritesPanicked {}

/// The answers of a round: one per completion, in order, then the claim's.
pub(crate) type RoundResults = (Vec<Result<()>>, Result<Vec<Lease>>);

/// A round as a pool's dispatcher makes it, for the stores' `complete_batch_and_claim`:
/// the claim's input checked before anything is written (a refusal answers every part, as
/// on both engines a whole round would fail), then [`LeaseBackend::complete_all_then_claim`].
pub(crate) fn round(
    store: &dyn LeaseBackend,
    done: &[(&Lease, &[u8])],
    claim: (&str, &str, LeaseTerms, usize),
) -> RoundResults {
    let (queue, worker, terms, n) = claim;
    if let Err(e) = crate::input::check_claim(queue, worker, &terms) {
        let each = || match &e {
            crate::Error::Input(i) => crate::Error::Input(i.clone()),
            crate::Error::Config(c) => crate::Error::Config(c.clone()),
            _ => crate::Error::Internal("a claim's check failed otherwise"),
        };
        return (done.iter().map(|_| Err(each())).collect(), Err(each()));
    }
    store.complete_all_then_claim(completions(done), queue, worker, terms, n)
}

/// Completions as the application gives them to a store: no progress, no writes.
pub(crate) fn completions(done: &[(&Lease, &[u8])]) -> Vec<Completion> {
    done.iter()
        .map(|(lease, output)| Completion {
            job: lease.job,
            attempt: lease.attempt,
            output: output.to_vec(),
            progress: None,
            writes: None,
        })
        .collect()
}

/// What a pool's threads and a reaper call: the contract every store keeps ([`JobStore`]),
/// and the few things only a pool needs on top of it (the holder's last progress carried by
/// an attempt's end, completions handed over in batches, a clock that never fails).
pub(crate) trait LeaseBackend: JobStore + 'static {
    /// Store time. Never fails: a backend that cannot read its clock now estimates it from
    /// its last reading (a pool must judge its leases while the store is unreachable).
    fn clock(&self) -> StoreTime;
    fn wake_queue(&self, queue: &str);
    /// How often an idle pool looks for work no wake-up announced (another machine's
    /// enqueue, say): `None` where every commit that readies work wakes the waiters.
    fn idle_poll(&self) -> Option<Duration>;
    /// Whether another process is writing the store now, so that a write begun now would
    /// queue behind its transaction (a redb file processes share): a pool's round then gives
    /// way ([`crate::pool`]'s `give_way`). `false` where writers do not take turns.
    fn another_process_writes(&self) -> bool {
        false
    }
    /// Whether a round's time is mostly spent waiting for a database server, so that a pool
    /// delivers one round's answers while the next runs (see [`crate::pool`]'s `dispatch`).
    /// `false` where a round's work is the pool's own process's: a thread delivering beside
    /// it only takes cores from it.
    fn rounds_wait_on_a_server(&self) -> bool {
        false
    }
    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>>;
    /// One answer per lease, or the error that failed the whole batch (nothing renewed).
    fn renew_batch(&self, beats: &[(&Lease, u64)]) -> Result<Vec<Result<Renewal>>>;
    /// Completes the attempt, recording the holder's last progress with it.
    fn complete_reporting(&self, lease: &Lease, output: &[u8], progress: Option<u64>)
    -> Result<()>;
    fn complete_and_claim_reporting(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        terms: LeaseTerms,
    ) -> Result<Option<Lease>>;
    fn complete_with_writes(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        writes: AnyWrites,
    ) -> Result<()>;
    fn complete_all_then_claim(
        &self,
        done: Vec<Completion>,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> RoundResults;
    fn fail_reporting(
        &self,
        lease: &Lease,
        error: &str,
        retry: Retry,
        progress: Option<u64>,
    ) -> Result<JobState>;
    /// Gives the job back ([`crate::JobStore::release`]); returns its state after (`Queued`,
    /// or `Cancelled` if a cancel was requested meanwhile).
    fn release_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<JobState>;
    /// Ends the attempt as timed out: its handler ran into the attempt's hard time limit.
    fn time_out_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<JobState>;
    /// Puts the job off by `delay` ([`crate::JobStore::snooze`]).
    fn snooze_reporting(
        &self,
        lease: &Lease,
        delay: Duration,
        progress: Option<u64>,
    ) -> Result<JobState>;
    /// Makes what was committed durable (redb's eventual durability); a no-op elsewhere.
    fn flush(&self) -> Result<()>;
    /// A reaper thread's pass ([`JobStore::reap`]), recorded with how often it runs.
    fn reap_every(&self, every: Duration) -> Result<crate::ReapReport>;
}

/// A store a [`WorkerPool`](crate::WorkerPool) or a [`Reaper`](crate::Reaper) runs on: made
/// from a [`Store`](crate::Store) or, with the `postgres` feature, a
/// `PgStore` (`leasehold::postgres`), by `.into()` (the pool's and the reaper's
/// constructors take either).
#[derive(Clone)]
pub struct Backend(pub(crate) Arc<dyn LeaseBackend>);

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backend")
    }
}
