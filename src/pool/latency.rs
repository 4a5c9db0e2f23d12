//! How long a pool's commits take, and how long its jobs wait and run: histograms of fixed
//! buckets, kept in relaxed atomics while the pool runs and read as plain data
//! ([`Latencies`]) with its other counters.
//!
//! Timed on the host's clock: it measures this process's wait for the store, not store time.
//! A commit that ends attempts (a round of completions, a completion or failure committed by
//! its worker) is one observation, however many jobs it carries: the figure an operator
//! compares with the store's write latency, and the one that grows first when the disk or
//! the database falls behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How many buckets a histogram has: one per bound, and one for what exceeds them all.
pub const LATENCY_BUCKETS: usize = 16;

/// The buckets' upper bounds: from 50 µs (a commit that needs no fsync) to 10 s.
pub const LATENCY_BOUNDS: [Duration; LATENCY_BUCKETS - 1] = [
    Duration::from_micros(50),
    Duration::from_micros(100),
    Duration::from_micros(250),
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(1000),
    Duration::from_millis(2500),
    Duration::from_secs(10),
];

/// The buckets' upper bounds for how long a job waits and runs
/// ([`QueueTally::wait`](crate::QueueTally::wait), [`QueueTally::run`](crate::QueueTally::run)):
/// from 1 ms to 5 minutes.
pub const JOB_TIME_BOUNDS: [Duration; LATENCY_BUCKETS - 1] = [
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(300),
];

/// A histogram of latencies, read from a running pool.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Latencies {
    /// Observations per bucket, not cumulative: bucket `i` holds those at most
    /// `bounds[i]` and above the bound before it; the last bucket holds those above every
    /// bound.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// All observations together.
    pub sum: Duration,
    /// The buckets' upper bounds: [`LATENCY_BOUNDS`] for commits, [`JOB_TIME_BOUNDS`] for
    /// jobs.
    pub bounds: &'static [Duration; LATENCY_BUCKETS - 1],
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            buckets: [0; LATENCY_BUCKETS],
            sum: Duration::ZERO,
            bounds: &LATENCY_BOUNDS,
        }
    }
}

impl Latencies {
    /// How many observations there are.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound of the bucket that holds the `q` quantile (`0.0..=1.0`): the
    /// latency that no more than `1 - q` of the observations exceed, rounded up to a
    /// bucket's bound. `None` without observations; `Duration::MAX` where it lies above
    /// every bound.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(self.bounds.get(i).copied().unwrap_or(Duration::MAX));
            }
        }
        Some(Duration::MAX)
    }
}

/// The running histogram.
#[derive(Debug)]
pub(crate) struct LatencyRecorder {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_ns: AtomicU64,
    bounds: &'static [Duration; LATENCY_BUCKETS - 1],
}

impl Default for LatencyRecorder {
    /// A commits' histogram ([`LATENCY_BOUNDS`]).
    fn default() -> LatencyRecorder {
        LatencyRecorder::with(&LATENCY_BOUNDS)
    }
}

impl LatencyRecorder {
    /// A histogram of these bounds.
    pub(crate) fn with(bounds: &'static [Duration; LATENCY_BUCKETS - 1]) -> LatencyRecorder {
        LatencyRecorder {
            buckets: Default::default(),
            sum_ns: AtomicU64::new(0),
            bounds,
        }
    }

    pub(crate) fn observe(&self, took: Duration) {
        let i = self.bounds.partition_point(|bound| *bound < took);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Runs `commit` and records how long it took.
    pub(crate) fn time<T>(&self, commit: impl FnOnce() -> T) -> T {
        // (the host's clock: how long a commit waited, not store time)
        let start = crate::clock::Stopwatch::start();
        let result = commit();
        self.observe(start.elapsed());
        result
    }

    pub(crate) fn snapshot(&self) -> Latencies {
        Latencies {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum: Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed)),
            bounds: self.bounds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_latency_lands_in_the_first_bucket_whose_bound_holds_it() {
        let r = LatencyRecorder::default();
        for us in [10, 50, 51, 900, 1000, 20_000_000] {
            r.observe(Duration::from_micros(us));
        }
        let l = r.snapshot();
        assert_eq!(l.count(), 6);
        assert_eq!(l.buckets[0], 2, "10 µs and exactly 50 µs");
        assert_eq!(l.buckets[1], 1, "51 µs");
        assert_eq!(l.buckets[4], 2, "900 µs and exactly 1 ms");
        assert_eq!(
            l.buckets[LATENCY_BUCKETS - 1],
            1,
            "20 s is above every bound"
        );
        assert_eq!(
            l.sum,
            Duration::from_micros(10 + 50 + 51 + 900 + 1000 + 20_000_000)
        );
    }

    #[test]
    fn a_quantile_is_the_bound_of_the_bucket_that_reaches_its_rank() {
        let r = LatencyRecorder::default();
        assert_eq!(r.snapshot().quantile(0.5), None);
        for _ in 0..99 {
            r.observe(Duration::from_micros(80));
        }
        r.observe(Duration::from_millis(40));
        let l = r.snapshot();
        assert_eq!(l.quantile(0.5), Some(Duration::from_micros(100)));
        assert_eq!(l.quantile(0.99), Some(Duration::from_micros(100)));
        assert_eq!(l.quantile(1.0), Some(Duration::from_millis(50)));
        r.observe(Duration::from_secs(60));
        assert_eq!(r.snapshot().quantile(1.0), Some(Duration::MAX));
    }
}
