//! The store's counts as the page shows them: fresh when counting is cheap, and never
//! waited for when it is not.
//!
//! A count is everything the overview and `/metrics` read of the whole store: the counts by
//! queue and state, each queue's timing (its oldest waiting job, its nearest and most overdue
//! lease) and the queues nobody serves. A redb store keeps its counts in an index (a read of
//! a few keys); a PostgreSQL store counts its rows (about 0.3 s for a million jobs here),
//! and right after heavy churn its oldest waiting job is found past the index entries of
//! every row updated since the last vacuum (above a second for a million). So the page
//! times each count, and a count that took long is not repeated on the request path: the page answers with the
//! last one (saying how old it is) while one background thread counts again. It counts at
//! most once per ten times a count takes, and never more than once per `fresh_for`, so an
//! open page spends at most a tenth of the database's time on counting, however many
//! browsers and scrapers ask.

#![allow(clippy::disallowed_methods)] // the page's own cost on the host's clock, not store time

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::Result;
use crate::job_store::ReadJobs;
use crate::query::QueueTiming;
use crate::queue::UnservedQueue;
use crate::stats::Stats;

/// A count that took at least this long is refreshed in the background.
const SLOW: Duration = Duration::from_millis(20);

struct Counted {
    reading: Reading,
    took: Duration,
    at: Instant,
}

/// What one count read of the store.
#[derive(Clone)]
pub(crate) struct Reading {
    pub stats: Stats,
    /// Each queue's timing, in the order of `stats.queues`.
    pub timings: Vec<(String, QueueTiming)>,
    pub unserved: Vec<UnservedQueue>,
}

impl Reading {
    fn of(store: &dyn ReadJobs) -> Result<Reading> {
        let stats = store.stats()?;
        let timings = stats
            .queues
            .keys()
            .map(|queue| Ok((queue.clone(), store.timing(queue)?)))
            .collect::<Result<_>>()?;
        let unserved = store.unserved_queues()?;
        Ok(Reading {
            stats,
            timings,
            unserved,
        })
    }

    /// The timing of `queue` (a queue counted has one).
    pub(crate) fn timing(&self, queue: &str) -> QueueTiming {
        self.timings
            .iter()
            .find(|(name, _)| name == queue)
            .map(|(_, t)| *t)
            .unwrap_or_default()
    }
}

pub(crate) struct Counts {
    last: Mutex<Option<Counted>>,
    counting: AtomicBool,
    fresh_for: Duration,
}

/// The counts a page shows, and how long ago they were taken (zero: just now).
pub(crate) struct Snapshot {
    pub reading: Reading,
    pub age: Duration,
}

impl Counts {
    pub(crate) fn new(fresh_for: Duration) -> Arc<Counts> {
        Arc::new(Counts {
            last: Mutex::new(None),
            counting: AtomicBool::new(false),
            fresh_for,
        })
    }

    /// The counts: the last ones while they are fresh; new ones, counted now if counting is
    /// cheap (or there are none yet), else in the background while the last ones answer.
    pub(crate) fn get(self: &Arc<Self>, store: &Arc<dyn ReadJobs>) -> Result<Snapshot> {
        if !self.fresh_for.is_zero() {
            let last = self.last.lock();
            if let Some(c) = last.as_ref() {
                let age = c.at.elapsed();
                let stale_after = self.fresh_for.max(c.took * 10);
                if age < stale_after {
                    return Ok(Snapshot {
                        reading: c.reading.clone(),
                        age,
                    });
                }
                if c.took >= SLOW {
                    self.count_in_background(store);
                    return Ok(Snapshot {
                        reading: c.reading.clone(),
                        age,
                    });
                }
            }
        }
        let reading = self.count(store.as_ref())?;
        Ok(Snapshot {
            reading,
            age: Duration::ZERO,
        })
    }

    fn count(&self, store: &dyn ReadJobs) -> Result<Reading> {
        let start = Instant::now();
        let reading = Reading::of(store)?;
        *self.last.lock() = Some(Counted {
            reading: reading.clone(),
            took: start.elapsed(),
            at: Instant::now(),
        });
        Ok(reading)
    }

    fn count_in_background(self: &Arc<Self>, store: &Arc<dyn ReadJobs>) {
        if self.counting.swap(true, Ordering::AcqRel) {
            return; // one count at a time
        }
        let (counts, store) = (self.clone(), store.clone());
        let spawned = std::thread::Builder::new()
            .name("leasehold-page-counts".into())
            .spawn(move || {
                if let Err(e) = counts.count(store.as_ref()) {
                    tracing::warn!(error = %e, "the status page could not count the store's jobs");
                }
                counts.counting.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.counting.store(false, Ordering::Release);
        }
    }
}
