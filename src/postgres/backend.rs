//! A [`PgStore`] as a worker pool's and a reaper's store (see [`crate::backend`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{PgStore, protocol, read};
use crate::backend::AnyWrites;
use crate::backend::Completion;
use crate::backend::{Backend, LeaseBackend};
use crate::clock::Stopwatch;
use crate::error::{ConfigError, Result};
use crate::ids::{JobId, StoreTime};
use crate::job::JobState;
use crate::lease::{Lease, LeaseTerms, Renewal};
use crate::rules::Retry;

/// How long a reading of the database's clock serves before the next is taken.
const CLOCK_READING_SERVES: Duration = Duration::from_millis(500);

impl crate::backend::sealed::Sealed for PgStore {}

impl crate::backend::Engine for PgStore {
    type Writes = super::store::SqlWrites;
}

impl From<PgStore> for Backend {
    fn from(store: PgStore) -> Backend {
        Backend(std::sync::Arc::new(store))
    }
}

impl From<&PgStore> for Backend {
    fn from(store: &PgStore) -> Backend {
        Backend(std::sync::Arc::new(store.clone()))
    }
}

impl PgStore {
    /// Completes each of `done` as its own unit, then claims (queue, worker, terms, how
    /// many) if asked: a refusal by the fence answers its own completion (writing only its
    /// counter) and the others go on; a failure of the database fails them all.
    ///
    /// One transaction, or, for a round with at least
    /// [`side_by_side_from`](super::PgStoreBuilder::side_by_side_from) jobs in each half, two
    /// at once on two connections: each half of a big round is milliseconds of one
    /// backend's work, and two backends use two cores. The claim then decides as if the
    /// completions had committed first: it waits for them before deciding what they could
    /// change (see [`protocol::claim_batch`]).
    pub(super) fn complete_each_then_claim(
        &self,
        done: &[Completion],
        claim: Option<(&str, &str, LeaseTerms, usize)>,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let from = self.settings().side_by_side_from;
        let Some(claim) = claim.filter(|c| done.len() >= from && c.3 >= from) else {
            return self.complete_each_and_claim(done, claim, None);
        };
        std::thread::scope(|scope| {
            // Dropped when the completions' transaction has ended (or its thread unwound):
            // the claim's `settle` then returns.
            let (committed, settled) = crossbeam_channel::bounded::<()>(0);
            let completing = scope.spawn(move || {
                let _committed = committed;
                self.complete_each_and_claim(done, None, None)
            });
            let settle = || {
                let _ = settled.recv();
            };
            let beside = protocol::Beside {
                jobs: done
                    .iter()
                    .map(|(job, ..)| super::rows::key(*job))
                    .collect(),
                settle: &settle,
            };
            let (_, claimed) = self.complete_each_and_claim(&[], Some(claim), Some(&beside));
            match completing.join() {
                Ok((completed, _)) => (completed, claimed),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// [`PgStore::complete_each_then_claim`] in one transaction, the claim running beside
    /// completions in another if `beside` says so.
    fn complete_each_and_claim(
        &self,
        done: &[Completion],
        claim: Option<(&str, &str, LeaseTerms, usize)>,
        beside: Option<&protocol::Beside<'_>>,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let s = self.settings();
        let marks = match claim {
            Some((queue, ..)) => self.marks_due([queue]),
            None => Vec::new(),
        };
        let outcome = self.in_transaction(|tx, p| {
            // The common case in one statement: every completion whose fence holds. Those it
            // did not complete (refused or too large) go one by one through the single
            // completion, which says why; so do all of a job that appears more than once
            // (a stale attempt beside the live one, a repeat), in their order, since each
            // one's answer depends on the one before.
            let mut times = std::collections::HashMap::new();
            for (job, ..) in done {
                *times.entry(*job).or_insert(0) += 1;
            }
            let batchable =
                |job: &JobId, output: &[u8]| output.len() <= s.max_payload && times[job] == 1;
            let batch: Vec<_> = done
                .iter()
                .filter(|(job, _, output, _)| batchable(job, output))
                .map(|(job, at, output, progress)| (*job, *at, output.as_slice(), *progress))
                .collect();
            let mut completed = match batch.len() {
                0 | 1 => Default::default(),
                _ => protocol::complete_many(tx, p, &batch)?,
            };
            let batched = batch.len() > 1;
            let mut results = Vec::with_capacity(done.len());
            for (job, attempt, output, progress) in done {
                let result = if completed.remove(&(*job, *attempt)) {
                    Ok(())
                } else if batched && batchable(job, output) {
                    // In the statement and not completed by it: the fence says why.
                    protocol::complete_one(tx, p, *job, *attempt, output, *progress)
                } else {
                    protocol::complete(tx, p, s, *job, *attempt, output, *progress)
                };
                match result {
                    Err(e) if !e.is_refusal() => return Err(e),
                    result => results.push(result),
                }
            }
            let claimed = match claim {
                Some((queue, worker, terms, n)) => {
                    let claimed = protocol::claim_batch(tx, p, s, queue, worker, terms, n, beside)?;
                    protocol::mark_served(tx, p, &marks)?;
                    claimed
                }
                None => Vec::new(),
            };
            Ok((results, claimed))
        });
        match outcome {
            Ok((results, claimed)) => (results, Ok(claimed)),
            Err(e) => {
                let each = super::store::shared_by_all(e);
                (done.iter().map(|_| Err(each())).collect(), Err(each()))
            }
        }
    }

    /// Store time for a pool's threads: the database's clock as last read plus the local
    /// time since (read again every half second). While the database cannot be reached the
    /// estimate goes on from the last reading, so a pool can still tell that its leases have
    /// run out; a local clock that runs slow against the database's makes it tell late by
    /// the drift over the outage.
    ///
    /// One thread at a time reads the database, and without holding the others: a reading
    /// may wait long on an unreachable database, and meanwhile a pool's other threads (its
    /// heartbeat judging whether its leases have run out) go on with the estimate.
    fn estimated_now(&self) -> StoreTime {
        // A simulated clock (the conformance tests') is the time itself: it moves only when
        // the test moves it, so no local time may be added to it.
        if let Some(clock) = &self.inner.simulated_clock {
            return super::simulated_time(clock);
        }
        let (estimate, age) = {
            let clock = self.inner.clock.lock();
            (clock.0.saturating_add(clock.1.elapsed()), clock.1.elapsed())
        };
        if age < CLOCK_READING_SERVES
            || self
                .inner
                .reading_clock
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return estimate;
        }
        let read = self.now();
        self.inner.reading_clock.store(false, Ordering::SeqCst);
        match read {
            Ok(now) => {
                *self.inner.clock.lock() = (now, Stopwatch::start());
                now
            }
            Err(_) => estimate,
        }
    }

    /// Starts the `LISTEN` thread if it is not running: a pool is about to wait for work.
    pub(super) fn listening(&self) {
        self.inner.listener.get_or_init(|| {
            if !self.inner.settings.listen {
                return None;
            }
            let started = super::listen::Listener::start(
                self.inner.config.clone(),
                self.inner.names.channel.clone(),
                self.inner.notifier.clone(),
            );
            match started {
                Ok(listener) => Some(listener),
                Err(e) => {
                    tracing::warn!(error = %e, "no wake-up listener; idle pools poll");
                    None
                }
            }
        });
    }

    /// Wakes this process's waiters of `queues`.
    pub(crate) fn readied<'a>(&self, queues: impl IntoIterator<Item = &'a String>) {
        self.inner.notifier.notify(queues);
    }
}

impl PgStore {
    /// The served marks due now for `queues` (see [`crate::queue`]).
    pub(super) fn marks_due<'q>(&self, queues: impl IntoIterator<Item = &'q str>) -> Vec<String> {
        self.inner.served.due(queues, self.estimated_now())
    }
}

impl LeaseBackend for PgStore {
    fn clock(&self) -> StoreTime {
        self.estimated_now()
    }

    fn wake_queue(&self, queue: &str) {
        self.inner.notifier.notify([&queue.to_owned()]);
    }

    fn idle_poll(&self) -> Option<Duration> {
        // Other machines' enqueues wake nobody here: poll, with jitter so that many idle
        // pools do not look in step.
        let jitter = crate::clock::random_u64() % 250;
        Some(Duration::from_millis(250 + jitter))
    }

    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        if super::store::no_queue_has(queue) {
            return Ok(None);
        }
        self.in_transaction(|tx, p| read::next_due(tx, p, queue))
    }

    fn renew_batch(&self, beats: &[(&Lease, u64)]) -> Result<Vec<Result<Renewal>>> {
        let leases: Vec<_> = beats
            .iter()
            .map(|(l, progress)| (l.job, l.attempt, *progress))
            .collect();
        let marks = self.marks_due(beats.iter().map(|(l, _)| l.queue.as_str()));
        self.in_transaction(|tx, p| {
            let renewed = protocol::heartbeat_batch(tx, p, self.settings(), &leases)?;
            protocol::mark_served(tx, p, &marks)?;
            Ok(renewed)
        })
    }

    fn complete_reporting(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
    ) -> Result<()> {
        self.in_transaction(|tx, p| {
            protocol::complete(
                tx,
                p,
                self.settings(),
                lease.job,
                lease.attempt,
                output,
                progress,
            )
        })
    }

    fn complete_and_claim_reporting(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        terms: LeaseTerms,
    ) -> Result<Option<Lease>> {
        let s = self.settings();
        let marks = self.marks_due([lease.queue.as_str()]);
        self.in_transaction(|tx, p| {
            protocol::complete(tx, p, s, lease.job, lease.attempt, output, progress)?;
            let claimed =
                protocol::claim_batch(tx, p, s, &lease.queue, &lease.worker, terms, 1, None)?;
            protocol::mark_served(tx, p, &marks)?;
            Ok(claimed.into_iter().next())
        })
    }

    fn complete_with_writes(
        &self,
        lease: &Lease,
        output: &[u8],
        progress: Option<u64>,
        writes: AnyWrites,
    ) -> Result<()> {
        let Some(writes) = writes.take::<super::store::SqlWrites>() else {
            return Err(ConfigError::WritesForAnotherStore {
                given: "writes of another engine's kind",
                store: "PostgreSQL, whose writes are Output::with_sql",
            }
            .into());
        };
        self.complete_then(lease, output, progress, writes.0)
    }

    fn complete_all_then_claim(
        &self,
        done: Vec<Completion>,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let claim = (n > 0).then_some((queue, worker, terms, n));
        self.complete_each_then_claim(&done, claim)
    }

    fn fail_reporting(
        &self,
        lease: &Lease,
        error: &str,
        retry: Retry,
        progress: Option<u64>,
    ) -> Result<JobState> {
        let state = self.in_transaction(|tx, p| {
            protocol::fail(
                tx,
                p,
                self.settings(),
                lease.job,
                lease.attempt,
                error,
                retry,
                progress,
            )
        })?;
        if state == JobState::RetryWait {
            self.readied([&lease.queue]);
        }
        Ok(state)
    }

    fn release_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<()> {
        self.in_transaction(|tx, p| protocol::release(tx, p, lease.job, lease.attempt, progress))?;
        self.readied([&lease.queue]);
        Ok(())
    }

    fn snooze_reporting(
        &self,
        lease: &Lease,
        delay: Duration,
        progress: Option<u64>,
    ) -> Result<JobState> {
        let (job, at) = (lease.job, lease.attempt);
        let state =
            self.in_transaction(|tx, p| protocol::snooze(tx, p, job, at, delay, progress))?;
        self.readied([&lease.queue]);
        Ok(state)
    }

    fn time_out_reporting(&self, lease: &Lease, progress: Option<u64>) -> Result<JobState> {
        let (job, at) = (lease.job, lease.attempt);
        let state = self.in_transaction(|tx, p| {
            protocol::time_out(tx, p, self.settings(), job, at, progress)
        })?;
        if state == JobState::RetryWait {
            self.readied([&lease.queue]);
        }
        Ok(state)
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
