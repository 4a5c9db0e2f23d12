//! The redb [`Store`] as a worker pool's and a reaper's store (see [`crate::backend`]).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{AnyWrites, Backend, Completion, LeaseBackend};
use crate::error::Result;
use crate::ids::StoreTime;
use crate::job::JobState;
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::rules::Retry;

use super::store::Store;

impl crate::backend::sealed::Sealed for Store {}

impl crate::backend::Engine for Store {
    type Writes = super::app_transaction::RedbWrites;
}

impl From<Store> for Backend {
    fn from(store: Store) -> Backend {
        Backend(Arc::new(store))
    }
}

impl From<&Store> for Backend {
    fn from(store: &Store) -> Backend {
        Backend(Arc::new(store.clone()))
    }
}

impl LeaseBackend for Store {
    fn clock(&self) -> StoreTime {
        Store::now(self)
    }

    fn wake_queue(&self, queue: &str) {
        Store::wake_queue(self, queue)
    }

    fn idle_poll(&self) -> Option<Duration> {
        // In-process commits wake the waiters, and other processes' send a datagram.
        None
    }

    fn another_process_writes(&self) -> bool {
        Store::another_process_writes(self)
    }

    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        Store::next_due(self, queue)
    }

    fn renew_batch(&self, beats: &[(&Lease, u64)]) -> Result<Vec<Result<Renewal>>> {
        let mut results = Store::heartbeat_batch(self, beats);
        // A failed commit answers every entry alike, with the shared group failure.
        match results.first() {
            Some(Err(crate::Error::Group(_))) => Err(results
                .swap_remove(0)
                .err()
                .unwrap_or_else(|| crate::Error::Internal("a failed batch without its error"))),
            _ => Ok(results),
        }
    }

    fn complete_reporting(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
    ) -> Result<()> {
        self.complete_reporting(lease, output, progress)
    }

    fn complete_and_claim_reporting(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        terms: LeaseTerms,
    ) -> Result<Option<Lease>> {
        self.complete_and_claim_reporting(lease, output, progress, terms)
    }

    fn complete_with_writes(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        writes: AnyWrites,
    ) -> Result<()> {
        match writes.take::<super::app_transaction::RedbWrites>() {
            Some(writes) => self.complete_with_reporting(lease, output, progress, writes.0),
            None => Err(crate::error::ConfigError::WritesForAnotherStore {
                given: "writes of another engine's kind",
                store: "a redb store, whose writes are Output::with_writes",
            }
            .into()),
        }
    }

    fn complete_all_then_claim(
        &self,
        done: Vec<Completion>,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        Store::complete_all_then_claim(self, done, queue, worker, terms, n)
    }

    fn fail_reporting(
        &self,
        lease: &Lease,
        error: &str,
        retry: Retry,
        progress: Option<u64>,
    ) -> Result<JobState> {
        self.fail_reporting(lease, error, retry, progress)
    }

    fn release_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<JobState> {
        self.release_reporting(lease, progress)
    }

    fn snooze_reporting(
        &self,
        lease: &Lease,
        delay: std::time::Duration,
        progress: Option<u64>,
    ) -> Result<JobState> {
        let (job, attempt) = (lease.job, lease.attempt);
        self.write(move |tx| crate::protocol::snooze(tx, job, attempt, delay, progress))
    }

    fn time_out_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<JobState> {
        let (job, attempt) = (lease.job, lease.attempt);
        self.write(move |tx| crate::protocol::time_out(tx, job, attempt, progress))
    }

    fn flush(&self) -> Result<()> {
        Store::flush(self)
    }

    fn reap_every(&self, every: Duration) -> Result<crate::ReapReport> {
        Store::reap_every(self, Some(every))
    }
}
