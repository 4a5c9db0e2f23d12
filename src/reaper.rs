//! The reaper: a named background thread that ticks and calls [`JobStore::reap`].
//!
//! The loop only waits and calls the step; the step ([`JobStore::reap`]) is what tests drive
//! directly on a manual clock. The thread stops when asked (a message on a channel, so it
//! wakes at once instead of finishing a sleep) and is always joined.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::check_reaper_interval;
use crate::engine::Backend;
use crate::error::Result;
use crate::job_store::JobStore;
use crate::ticker::{Tick, Ticker};

/// Counters of a running reaper (relaxed atomics: they are for observation, not control).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ReaperMetrics {
    passes: AtomicU64,
    reclaimed: AtomicU64,
    purged: AtomicU64,
    errors: AtomicU64,
    unserved: AtomicU64,
}

impl ReaperMetrics {
    /// Completed passes (successful or not).
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Leases taken back in all passes.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// Finished jobs deleted under the store's retention in all passes.
    pub fn purged(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }

    /// Passes that failed (the error is logged; the next pass tries again).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Warnings that a queue had work waiting and nobody serving it (see
    /// [`ReadJobs::unserved_queues`](crate::ReadJobs::unserved_queues)), each also a
    /// `tracing` warning.
    pub fn unserved_warnings(&self) -> u64 {
        self.unserved.load(Ordering::Relaxed)
    }
}

/// A running reaper thread. Stopped and joined by [`Reaper::stop`] or on drop.
#[derive(Debug)]
pub struct Reaper {
    ticker: Ticker,
    metrics: Arc<ReaperMetrics>,
}

impl Reaper {
    /// Starts a reaper that runs a pass every `interval` (the default is
    /// [`DEFAULT_REAPER_INTERVAL`](crate::DEFAULT_REAPER_INTERVAL), 15 s). Under eventual
    /// durability each tick also flushes, which bounds how long a commit stays in memory
    /// when the application goes quiet.
    pub fn start(store: impl Into<Backend>, interval: Duration) -> Result<Reaper> {
        check_reaper_interval(interval)?;
        let store = store.into().0;
        let metrics = Arc::new(ReaperMetrics::default());
        let m = metrics.clone();
        let mut watch = UnservedWatch::default();
        // When this reaper last kept its pass's record (see `job_store::reaper_pass`).
        let mut kept = None;
        // Fixed rate: the next pass is due one interval after the last was due, not after
        // it ended, so a slow pass does not stretch the detection bound.
        // Woken between passes to apply what was asked of the store from outside the crate
        // (PostgreSQL's requests made in SQL), where an engine has such asks.
        let woken = store.requests_heard();
        let ticker = Ticker::start("leasehold-reaper", interval, interval, woken, move |why| {
            if why == Tick::Woken {
                if let Err(e) = store.apply_requests() {
                    m.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, "applying the requests made in SQL failed");
                }
                return;
            }
            tick(&*store, interval, &m, &mut kept);
            watch.look(&*store, &m);
        })?;
        Ok(Reaper { ticker, metrics })
    }

    /// The reaper's counters.
    pub fn metrics(&self) -> &ReaperMetrics {
        &self.metrics
    }

    /// Stops the thread and waits for it. Idempotent; a pass in progress finishes first.
    pub fn stop(&mut self) {
        self.ticker.stop();
    }
}

fn tick(
    store: &dyn JobStore,
    every: Duration,
    metrics: &ReaperMetrics,
    kept: &mut Option<crate::ids::StoreTime>,
) {
    match crate::job_store::reaper_pass(store, Some(every), *kept) {
        Ok((report, noted)) => {
            *kept = noted.or(*kept);
            for r in &report.reclaimed {
                tracing::info!(
                    job = %r.job,
                    attempt = %r.attempt,
                    worker = %r.worker,
                    overdue = ?r.overdue,
                    job_state = %r.job_state,
                    "reclaimed an expired lease"
                );
            }
            metrics
                .reclaimed
                .fetch_add(report.reclaimed.len() as u64, Ordering::Relaxed);
            if report.purged > 0 {
                tracing::info!(
                    jobs = report.purged,
                    "purged finished jobs past the retention"
                );
                metrics
                    .purged
                    .fetch_add(report.purged as u64, Ordering::Relaxed);
            }
        }
        Err(e) => {
            metrics.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "reaper pass failed");
        }
    }
    if let Err(e) = store.flush() {
        tracing::error!(error = %e, "reaper flush failed");
    }
    metrics.passes.fetch_add(1, Ordering::Relaxed);
}

/// How often (store time) the reaper looks for queues nobody serves.
const UNSERVED_LOOK_EVERY: Duration = Duration::from_secs(60);

/// The reaper's look for queues with work waiting and nobody serving them: once a minute of
/// store time, and a warning per queue at most once per [`crate::UNSERVED_AFTER`].
#[derive(Default)]
struct UnservedWatch {
    looked: Option<crate::ids::StoreTime>,
    warned: std::collections::HashMap<String, crate::ids::StoreTime>,
}

impl UnservedWatch {
    fn look(&mut self, store: &dyn JobStore, metrics: &ReaperMetrics) {
        let now = store.clock();
        if self
            .looked
            .is_some_and(|at| now.saturating_since(at) < UNSERVED_LOOK_EVERY)
        {
            return;
        }
        self.looked = Some(now);
        let unserved = match store.unserved_queues() {
            Ok(unserved) => unserved,
            Err(e) => {
                tracing::warn!(error = %e, "looking for queues nobody serves failed");
                return;
            }
        };
        self.warned
            .retain(|q, _| unserved.iter().any(|u| u.queue == *q));
        for u in unserved {
            let recently = self
                .warned
                .get(&u.queue)
                .is_some_and(|at| now.saturating_since(*at) < crate::queue::UNSERVED_AFTER);
            if recently {
                continue;
            }
            metrics.unserved.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                queue = %u.queue,
                waiting_for = ?now.saturating_since(u.waiting_since),
                served_ago = ?u.served_at.map(|at| now.saturating_since(at)),
                "a queue has work waiting and no worker has asked for it (a typo in a queue name, or a pool that is not running?)"
            );
            self.warned.insert(u.queue, now);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use crate::job_store::reaper_pass;
    use crate::{
        job_store::JobStore, job_store::ReadJobs, lease::LeaseTerms, new_job::NewJob,
        redb_store::Store,
    };

    /// An idle reaper keeps its pass's record every other pass, never so seldom that it looks
    /// late; a pass that takes a lease back is recorded at once.
    #[test]
    fn an_idle_reaper_records_every_other_pass_and_a_busy_one_each() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock::ManualClock::new();
        let store = Store::builder(dir.path().join("r.redb"))
            .clock(clock.clone())
            .open()
            .unwrap();
        let every = Duration::from_secs(15);
        let writes = || store.metrics().write_transactions;
        let (_, mut kept) = reaper_pass(&store, Some(every), None).unwrap();
        assert!(kept.is_some(), "a reaper's first pass is recorded");
        let before = writes();
        let mut recorded = 0;
        for _ in 0..6 {
            clock.advance(every);
            let (report, noted) = reaper_pass(&store, Some(every), kept).unwrap();
            assert!(report.reclaimed.is_empty());
            if noted.is_some() {
                recorded += 1;
                kept = noted;
            }
            let last = store.stats().unwrap().last_reaper_pass.unwrap();
            assert!(!last.late(store.now()), "an idle reaper looked late");
        }
        assert_eq!(recorded, 3, "every other idle pass is recorded");
        assert_eq!(
            writes() - before,
            3,
            "the idle passes committed their records only"
        );

        store.enqueue(NewJob::new("q", "x")).unwrap();
        store
            .claim("q", "w", LeaseTerms::new(Duration::from_secs(1)))
            .unwrap()
            .unwrap();
        clock.advance(Duration::from_secs(2));
        let (report, noted) = reaper_pass(&store, Some(every), kept).unwrap();
        assert_eq!(report.reclaimed.len(), 1);
        assert_eq!(
            noted,
            Some(store.now()),
            "a pass that took a lease back is recorded, however recent the last record"
        );
    }

    /// A pass over a store where no lease has expired reads, and writes nothing: it ends
    /// while the store answers no write (it took the writer's seat for a transaction that
    /// took nothing once).
    #[test]
    fn a_pass_with_no_expired_lease_takes_no_write_transaction() {
        let (store, clock) = crate::memory::MemoryStore::manual();
        store.enqueue(NewJob::new("q", "x")).unwrap();
        store
            .claim("q", "w", LeaseTerms::new(Duration::from_secs(60)))
            .unwrap()
            .unwrap();
        let every = Duration::from_secs(15);
        let (_, kept) = reaper_pass(&store, Some(every), None).unwrap();
        clock.advance(every);
        let (done, ended) = crossbeam_channel::bounded(1);
        store.hold_writes(|| {
            let store = store.clone();
            std::thread::spawn(move || {
                let _ = done.send(
                    reaper_pass(&store, Some(every), kept).map(|(r, n)| (r.reclaimed.len(), n)),
                );
            });
            let pass = ended.recv_timeout(Duration::from_secs(20));
            assert!(
                matches!(pass, Ok(Ok((0, None)))),
                "the pass did not end without the writer's seat: {pass:?}"
            );
        });
    }
}
