//! How many jobs a pool claims ahead of its free workers.
//!
//! A worker that finishes a job hands its result to the dispatcher and waits for the next
//! claim to commit. For long jobs that wait is nothing; for short ones it is most of a
//! worker's time, and claiming ahead (a job waiting, under a renewed lease, for the next
//! free worker) removes it. But a job claimed ahead is held from other pools while it waits,
//! so the pool claims ahead only as many jobs as its workers finish during two commits: a
//! claim decided now lands when its commit ends, and must last the workers until the next
//! one lands. That is `2 × concurrency × commit time / job time`, measured as it runs, at
//! most two per worker. Pools of long jobs then claim nothing ahead, and a claimed-ahead job
//! waits about two commits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How many commits' worth of jobs the pool holds ahead (see the module's docs): two, chosen
/// with `leasehold bench --only end-to-end` (the figures are in BENCHMARKS.md).
const ROUNDS: u128 = 2;

/// What the application asked for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Prefetch {
    /// As many as the workers finish during two commits, at most two per worker.
    Auto,
    /// Exactly this many (0: none).
    Fixed(usize),
}

pub(crate) struct Pace {
    prefetch: Prefetch,
    concurrency: usize,
    /// Moving averages, in nanoseconds (0: nothing measured yet).
    job_ns: AtomicU64,
    commit_ns: AtomicU64,
}

impl Pace {
    pub(crate) fn new(prefetch: Prefetch, concurrency: usize) -> Pace {
        Pace {
            prefetch,
            concurrency,
            job_ns: AtomicU64::new(0),
            commit_ns: AtomicU64::new(0),
        }
    }

    /// The most jobs the pool may ever hold ahead of its workers.
    pub(crate) fn most_ahead(&self) -> usize {
        match self.prefetch {
            Prefetch::Fixed(n) => n,
            // A lone worker claims its next job in the commit of its last one already.
            Prefetch::Auto if self.concurrency == 1 => 0,
            Prefetch::Auto => self.concurrency * ROUNDS as usize,
        }
    }

    /// How many jobs to hold ahead now.
    pub(crate) fn ahead(&self) -> usize {
        let Prefetch::Auto = self.prefetch else {
            return self.most_ahead();
        };
        let job = self.job_ns.load(Ordering::Relaxed);
        let commit = self.commit_ns.load(Ordering::Relaxed);
        if job == 0 {
            // Nothing has run yet: claim nothing ahead until jobs are known to be short.
            return 0;
        }
        let finishing = (ROUNDS * self.concurrency as u128 * u128::from(commit)
            + u128::from(job) / 2)
            / u128::from(job);
        usize::try_from(finishing).map_or(self.most_ahead(), |n| n.min(self.most_ahead()))
    }

    /// A handler ran for `d`.
    pub(crate) fn job_ran(&self, d: Duration) {
        average(&self.job_ns, d);
    }

    /// A dispatcher's commit round took `d`.
    pub(crate) fn committed(&self, d: Duration) {
        average(&self.commit_ns, d);
    }
}

/// Folds `sample` into a moving average weighted 1/8 (the first sample stands alone). The
/// load and store are not one atomic step: two workers finishing at once may lose a sample,
/// which a moving average does not notice.
fn average(cell: &AtomicU64, sample: Duration) {
    let sample = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX).max(1);
    let old = cell.load(Ordering::Relaxed);
    let new = if old == 0 {
        sample
    } else {
        old - old / 8 + sample / 8
    };
    cell.store(new, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn short_jobs_are_claimed_ahead_as_many_as_finish_during_two_commits() {
        let pace = Pace::new(Prefetch::Auto, 16);
        assert_eq!(pace.ahead(), 0, "nothing known yet");
        pace.committed(MS);
        pace.job_ran(4 * MS);
        assert_eq!(pace.ahead(), 8, "two commits: 2 x 16 workers x 1 ms / 4 ms");
        let tiny = Pace::new(Prefetch::Auto, 16);
        tiny.committed(MS);
        tiny.job_ran(Duration::from_micros(10));
        assert_eq!(tiny.ahead(), 32, "at most two per worker");
    }

    #[test]
    fn long_jobs_and_lone_workers_claim_nothing_ahead() {
        let pace = Pace::new(Prefetch::Auto, 16);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(10));
        assert_eq!(pace.ahead(), 0);
        let lone = Pace::new(Prefetch::Auto, 1);
        lone.committed(MS);
        lone.job_ran(Duration::from_micros(1));
        assert_eq!((lone.most_ahead(), lone.ahead()), (0, 0));
    }

    #[test]
    fn a_fixed_setting_is_kept_whatever_the_jobs_take() {
        let pace = Pace::new(Prefetch::Fixed(5), 16);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(10));
        assert_eq!((pace.most_ahead(), pace.ahead()), (5, 5));
    }

    #[test]
    fn the_average_follows_a_change_in_job_length() {
        let pace = Pace::new(Prefetch::Auto, 8);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(1));
        assert_eq!(pace.ahead(), 0);
        for _ in 0..64 {
            pace.job_ran(Duration::from_micros(100));
        }
        assert_eq!(pace.ahead(), 16);
    }
}
