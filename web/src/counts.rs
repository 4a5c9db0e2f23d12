//! The store's counts as the page shows them: fresh when counting is cheap, and never
//! waited for when it is not.
//!
//! A count is everything the overview and `/metrics` read of the whole store: the counts by
//! queue and state, each queue's timing (its oldest waiting job, its nearest and most overdue
//! lease) and the queues nobody serves. A redb store keeps its counts in an index (a read of
//! a few keys); a PostgreSQL store counts its rows, which takes time in proportion to them,
//! and right after heavy churn its oldest waiting job is found past the index entries of
//! every row updated since the last vacuum (BENCHMARKS.md has the figures). So the page
//! times each count, and a count that took long is not repeated on the request path: the page answers with the
//! last one (saying how old it is) while one background thread counts again. It counts at
//! most once per ten times a count takes, and never more than once per `fresh_for`, so an
//! open page spends at most a tenth of the database's time on counting, however many
//! browsers and scrapers ask.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Stopwatch;
use leasehold::QueueTiming;
use leasehold::ReadJobs;
use leasehold::Result;
use leasehold::Stats;
use leasehold::UnservedQueue;

/// A count that took at least this long is refreshed in the background.
const SLOW: Duration = Duration::from_millis(20);

struct Counted {
    reading: Reading,
    took: Duration,
    /// Since it was taken (the page's own cost on the host's clock, not store time).
    at: Stopwatch,
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
    /// The background count's thread, joined before the next starts and when the page
    /// goes (it holds the page only weakly, so the page can go while it counts).
    background: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Counts {
    fn drop(&mut self) {
        if let Some(thread) = self.background.get_mut().take()
            && thread.thread().id() != std::thread::current().id()
            && thread.join().is_err()
        {
            tracing::error!("the status page's counting thread panicked");
        }
    }
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
            background: Mutex::new(None),
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
        let start = Stopwatch::start();
        let reading = Reading::of(store)?;
        self.keep(reading.clone(), start.elapsed());
        Ok(reading)
    }

    fn keep(&self, reading: Reading, took: Duration) {
        *self.last.lock() = Some(Counted {
            reading,
            took,
            at: Stopwatch::start(),
        });
    }

    fn count_in_background(self: &Arc<Self>, store: &Arc<dyn ReadJobs>) {
        if self.counting.swap(true, Ordering::AcqRel) {
            return; // one count at a time
        }
        let mut background = self.background.lock();
        if let Some(done) = background.take() {
            let _ = done.join(); // the last count's, ended (`counting` was clear)
        }
        let (counts, store): (Weak<Counts>, _) = (Arc::downgrade(self), store.clone());
        let spawned = std::thread::Builder::new()
            .name("leasehold-page-counts".into())
            .spawn(move || {
                let start = Stopwatch::start();
                let counted = Reading::of(store.as_ref());
                let Some(counts) = counts.upgrade() else {
                    return; // the page went meanwhile
                };
                match counted {
                    Ok(reading) => counts.keep(reading, start.elapsed()),
                    Err(e) => {
                        tracing::warn!(error = %e, "the status page could not count the store's jobs");
                    }
                }
                counts.counting.store(false, Ordering::Release);
            });
        match spawned {
            Ok(thread) => *background = Some(thread),
            Err(_) => self.counting.store(false, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use leasehold::CheckReport;
    use leasehold::JobFilter;
    use leasehold::QueueSettings;
    use leasehold::ScheduleInfo;
    use leasehold::{Job, Run};
    use leasehold::{JobId, StoreTime};

    /// A store whose count takes a while, and that says how many counts it finished.
    struct Slow {
        store: leasehold::Store,
        counted: AtomicU64,
    }

    impl ReadJobs for Slow {
        fn now(&self) -> Result<StoreTime> {
            Ok(self.store.now())
        }
        fn job(&self, job: JobId) -> Result<Option<Job>> {
            self.store.job(job)
        }
        fn history(&self, job: JobId) -> Result<Vec<Run>> {
            self.store.history(job)
        }
        fn payload(&self, job: JobId) -> Result<Option<Vec<u8>>> {
            self.store.payload(job)
        }
        fn output(&self, job: JobId) -> Result<Option<Vec<u8>>> {
            self.store.output(job)
        }
        fn logs(&self, job: JobId) -> Result<Vec<leasehold::AttemptLog>> {
            self.store.logs(job)
        }
        fn endings(&self, after: leasehold::EndCursor, n: usize) -> Result<leasehold::Endings> {
            self.store.endings(after, n)
        }
        fn checkpoint(&self, job: JobId) -> Result<Option<leasehold::Checkpoint>> {
            self.store.checkpoint(job)
        }
        fn group(&self, group: leasehold::GroupId) -> Result<Option<leasehold::Group>> {
            self.store.group(group)
        }
        fn waiters(&self, job: JobId) -> Result<Vec<JobId>> {
            self.store.waiters(job)
        }
        fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
            self.store.jobs(filter)
        }
        fn timing(&self, queue: &str) -> Result<QueueTiming> {
            self.store.timing(queue)
        }
        fn stats(&self) -> Result<Stats> {
            std::thread::sleep(SLOW * 5);
            let stats = self.store.stats();
            self.counted.fetch_add(1, Ordering::SeqCst);
            stats
        }
        fn unserved_queues(&self) -> Result<Vec<UnservedQueue>> {
            self.store.unserved_queues()
        }
        fn queue_settings(&self, queue: &str) -> Result<QueueSettings> {
            self.store.queue_settings(queue)
        }
        fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
            self.store.schedules()
        }
        fn check(&self) -> Result<CheckReport> {
            self.store.check()
        }
    }

    #[test]
    fn a_slow_count_is_repeated_in_the_background_and_its_thread_is_joined_when_the_page_goes() {
        let dir = tempfile::tempdir().unwrap();
        let slow = Arc::new(Slow {
            store: leasehold::Store::open(dir.path().join("s.redb")).unwrap(),
            counted: AtomicU64::new(0),
        });
        let store: Arc<dyn ReadJobs> = slow.clone();
        let counts = Counts::new(Duration::from_nanos(1));
        assert!(
            counts.get(&store).unwrap().age.is_zero(),
            "the first is counted now"
        );
        // stale after ten times its own length (the page's own cost, on the host's clock)
        let stale = Stopwatch::start();
        while stale.elapsed() < SLOW * 50 {
            std::thread::sleep(SLOW);
        }
        let answer = counts.get(&store).unwrap();
        assert!(
            !answer.age.is_zero(),
            "the last count answers while one runs apart"
        );
        drop(counts); // the page goes while its counting thread runs: it is waited for
        assert_eq!(
            slow.counted.load(Ordering::SeqCst),
            2,
            "joined, not left behind"
        );
    }
}
