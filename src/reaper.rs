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
use crate::ticker::Ticker;

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
        // Fixed rate: the next pass is due one interval after the last was due, not after
        // it ended, so a slow pass does not stretch the detection bound.
        let ticker = Ticker::start("leasehold-reaper", interval, interval, move || {
            tick(&*store, interval, &m);
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

fn tick(store: &dyn JobStore, every: Duration, metrics: &ReaperMetrics) {
    match store.reap_every(Some(every)) {
        Ok(report) => {
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
    looked: Option<crate::StoreTime>,
    warned: std::collections::HashMap<String, crate::StoreTime>,
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
                .is_some_and(|at| now.saturating_since(*at) < crate::UNSERVED_AFTER);
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
