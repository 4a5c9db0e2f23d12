//! How many jobs a pool claims ahead of its free workers.
//!
//! A worker that finishes a job hands its result to the dispatcher (which commits it with
//! the others finished meanwhile) and goes on to the next job claimed ahead, if there is
//! one, or waits for the next claim to commit. For long jobs that wait is nothing; for
//! short ones it is most of a worker's time, and claiming ahead (a job waiting, under a
//! renewed lease, for the next free worker) removes it: a lone worker of short jobs then
//! never waits on a commit, and each commit carries many completions. But a job claimed
//! ahead is held from other pools while it waits, so the pool claims ahead only as many
//! jobs as its workers finish during two commits: a claim decided now lands when its commit
//! ends, and must last the workers until the next one lands. That is
//! `2 × concurrency × commit time / job time`, measured as it runs, at most the window
//! ([`DEFAULT_WINDOW`] unless set). Pools of long jobs then claim nothing ahead, and a
//! claimed-ahead job waits about two commits.
//!
//! And never more than the workers start within a quarter of a lease: commits slow down
//! under load, which by the rule above would claim more ahead, which makes each renewal
//! larger and the commits slower still. Pools with short leases (hundreds of
//! milliseconds) then held more than they could start before a faltering renewal let the
//! leases run out, took each other's jobs over, and spent the jobs' budgets without
//! running them. The cap also bounds what a killed pool leaves under leases nobody renews.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How many commits' worth of jobs the pool holds ahead (see the module's docs): two, chosen
/// with `leasehold bench --only end-to-end` (the figures are in BENCHMARKS.md).
const ROUNDS: u128 = 2;

/// The share of a lease within which the workers reach every job claimed ahead: a quarter.
const LEASE_SHARE: u128 = 4;

/// The most jobs a pool claims ahead of its workers unless told otherwise
/// ([`crate::PoolBuilder::window`]): enough for a lone worker of empty jobs to fill each
/// commit with hundreds of completions and claims; the cost is that a pool that dies leaves
/// that many jobs under leases nobody renews (measured in BENCHMARKS.md).
pub const DEFAULT_WINDOW: usize = 512;

/// What the application asked for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Prefetch {
    /// As many as the workers finish during two commits, at most `window`.
    Auto { window: usize },
    /// Exactly this many (0: none).
    Fixed(usize),
}

pub(crate) struct Pace {
    prefetch: Prefetch,
    concurrency: usize,
    lease: Duration,
    /// Moving averages, in nanoseconds (0: nothing measured yet).
    job_ns: AtomicU64,
    commit_ns: AtomicU64,
}

impl Pace {
    pub(crate) fn new(prefetch: Prefetch, concurrency: usize, lease: Duration) -> Pace {
        Pace {
            prefetch,
            concurrency,
            lease,
            job_ns: AtomicU64::new(0),
            commit_ns: AtomicU64::new(0),
        }
    }

    /// The most jobs the pool may ever hold ahead of its workers.
    pub(crate) fn most_ahead(&self) -> usize {
        match self.prefetch {
            Prefetch::Fixed(n) | Prefetch::Auto { window: n } => n,
        }
    }

    /// How many jobs to hold ahead now.
    pub(crate) fn ahead(&self) -> usize {
        let Prefetch::Auto { .. } = self.prefetch else {
            return self.most_ahead();
        };
        let job = self.job_ns.load(Ordering::Relaxed);
        let commit = self.commit_ns.load(Ordering::Relaxed);
        if job == 0 {
            // Nothing has run yet: claim nothing ahead until jobs are known to be short.
            return 0;
        }
        let workers = self.concurrency as u128;
        let finishing =
            (ROUNDS * workers * u128::from(commit) + u128::from(job) / 2) / u128::from(job);
        let within_lease = workers * self.lease.as_nanos() / LEASE_SHARE / u128::from(job);
        let ahead = finishing.min(within_lease);
        usize::try_from(ahead).map_or(self.most_ahead(), |n| n.min(self.most_ahead()))
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
    /// The default lease: long enough never to be the limit in these tests.
    const LONG: Duration = Duration::from_secs(60);
    const AUTO: Prefetch = Prefetch::Auto {
        window: DEFAULT_WINDOW,
    };

    #[test]
    fn short_jobs_are_claimed_ahead_as_many_as_finish_during_two_commits() {
        let pace = Pace::new(AUTO, 16, LONG);
        assert_eq!(pace.ahead(), 0, "nothing known yet");
        pace.committed(MS);
        pace.job_ran(4 * MS);
        assert_eq!(pace.ahead(), 8, "two commits: 2 x 16 workers x 1 ms / 4 ms");
        let tiny = Pace::new(AUTO, 16, LONG);
        tiny.committed(MS);
        tiny.job_ran(Duration::from_micros(100));
        assert_eq!(tiny.ahead(), 320, "2 x 16 x 1 ms / 100 us");
        let lone = Pace::new(AUTO, 1, LONG);
        lone.committed(MS);
        lone.job_ran(Duration::from_micros(10));
        assert_eq!(lone.ahead(), 200, "a lone worker too: 2 x 1 ms / 10 us");
    }

    #[test]
    fn however_short_the_jobs_no_more_than_the_window_is_claimed_ahead() {
        let pace = Pace::new(AUTO, 16, LONG);
        pace.committed(MS);
        pace.job_ran(Duration::from_micros(1));
        assert_eq!((pace.most_ahead(), pace.ahead()), (512, 512));
        let narrow = Pace::new(Prefetch::Auto { window: 3 }, 1, LONG);
        narrow.committed(MS);
        narrow.job_ran(Duration::from_micros(1));
        assert_eq!((narrow.most_ahead(), narrow.ahead()), (3, 3));
    }

    #[test]
    fn long_jobs_claim_nothing_ahead_even_for_a_lone_worker() {
        let pace = Pace::new(AUTO, 16, LONG);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(10));
        assert_eq!(pace.ahead(), 0);
        let lone = Pace::new(AUTO, 1, LONG);
        lone.committed(MS);
        lone.job_ran(Duration::from_millis(10));
        assert_eq!(lone.ahead(), 0, "2 x 1 ms / 10 ms rounds to none");
    }

    #[test]
    fn no_more_is_claimed_ahead_than_the_workers_start_within_a_quarter_lease() {
        // Commits slowed to 50 ms under load: two commits' worth of 3 ms jobs for 2 workers
        // would be 67 held ahead; a 300 ms lease lets them start 2 x 75 ms / 3 ms = 50.
        let short = Pace::new(AUTO, 2, Duration::from_millis(300));
        short.committed(50 * MS);
        short.job_ran(3 * MS);
        assert_eq!(short.ahead(), 50);
        let long = Pace::new(AUTO, 2, LONG);
        long.committed(50 * MS);
        long.job_ran(3 * MS);
        assert_eq!(long.ahead(), 67, "the lease is no limit here");
    }

    #[test]
    fn a_fixed_setting_is_kept_whatever_the_jobs_take() {
        let pace = Pace::new(Prefetch::Fixed(5), 16, LONG);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(10));
        assert_eq!((pace.most_ahead(), pace.ahead()), (5, 5));
    }

    #[test]
    fn the_average_follows_a_change_in_job_length() {
        let pace = Pace::new(AUTO, 8, LONG);
        pace.committed(MS);
        pace.job_ran(Duration::from_secs(1));
        assert_eq!(pace.ahead(), 0);
        // (a weight of 1/8 forgets the second within 200 samples)
        for _ in 0..200 {
            pace.job_ran(Duration::from_micros(100));
        }
        assert_eq!(pace.ahead(), 160, "2 x 8 x 1 ms / 100 us");
    }
}
