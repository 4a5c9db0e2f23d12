//! The scheduler: a named background thread that fires the store's schedules on a timer
//! ([`JobStore::fire_schedules_at`](crate::JobStore::fire_schedules_at)).
//!
//! Run one in every process that should keep schedules going, as many as you like: each
//! tick enqueues exactly one job whichever comes first (the store decides), so a second
//! scheduler is a spare, not a duplicate. Like the reaper, the loop only waits and calls the
//! step, and the thread stops when asked and is always joined.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::Backend;
use crate::error::{ConfigError, Result};
use crate::job_store::JobStore;
use crate::ticker::Ticker;

/// Counters of a running scheduler (relaxed atomics: for observation).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SchedulerMetrics {
    passes: AtomicU64,
    fired: AtomicU64,
    errors: AtomicU64,
}

impl SchedulerMetrics {
    /// Completed passes.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Jobs this scheduler enqueued (ticks other schedulers fired first are not counted).
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Passes that failed (logged; the next pass tries again).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A running scheduler thread, stopped and joined by [`Scheduler::stop`] or on drop.
#[derive(Debug)]
pub struct Scheduler {
    ticker: Ticker,
    metrics: Arc<SchedulerMetrics>,
}

impl Scheduler {
    /// Starts a scheduler that fires due ticks every `interval` (a second is right for
    /// cron's minutes; a tick fires at most one interval late), the first pass at once.
    pub fn start(store: impl Into<Backend>, interval: Duration) -> Result<Scheduler> {
        if interval.is_zero() {
            return Err(ConfigError::ZeroSchedulerInterval.into());
        }
        let store = store.into().0;
        let metrics = Arc::new(SchedulerMetrics::default());
        let m = metrics.clone();
        let ticker = Ticker::start("leasehold-scheduler", Duration::ZERO, interval, move || {
            pass(&*store, &m)
        })?;
        Ok(Scheduler { ticker, metrics })
    }

    /// The scheduler's counters.
    pub fn metrics(&self) -> &SchedulerMetrics {
        &self.metrics
    }

    /// Stops the thread and waits for it. Idempotent; a pass in progress finishes first.
    pub fn stop(&mut self) {
        self.ticker.stop();
    }
}

fn pass(store: &dyn JobStore, metrics: &SchedulerMetrics) {
    match store.fire_schedules_at(crate::clock::wall_now()) {
        Ok(fired) => {
            for job in &fired {
                tracing::debug!(%job, "a schedule's tick enqueued a job");
            }
            metrics
                .fired
                .fetch_add(fired.len() as u64, Ordering::Relaxed);
        }
        Err(e) => {
            metrics.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "scheduler pass failed");
        }
    }
    metrics.passes.fetch_add(1, Ordering::Relaxed);
}
