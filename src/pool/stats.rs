//! A pool's counters: relaxed atomics while it runs, a plain snapshot for readers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

macro_rules! pool_counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// What a worker pool has done since it started.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct PoolStats {
            $($(#[$doc])* pub $name: u64,)*
            /// Jobs claimed and completed, by queue (of a pool over several queues, each
            /// one's share; [`crate::Queues`]).
            pub queues: std::collections::BTreeMap<String, QueueTally>,
            /// Jobs the pool holds now: running, or claimed and waiting for a worker.
            pub in_flight: u64,
            /// Of those, jobs claimed ahead of a free worker and not started yet (see
            /// [`crate::PoolBuilder::window`]): a job counts here until its worker has
            /// checked that its lease still holds and begun it.
            pub claimed_ahead: u64,
            /// How long the pool's commits that end attempts took (see
            /// [`Latencies`](crate::Latencies)).
            pub commit_latency: super::latency::Latencies,
        }

        impl PoolStats {
            /// The counts by name (`in_flight` and `claimed_ahead`, which are levels and not
            /// counts, and the commit latency apart): what the status page's metrics export.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }

        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            pub(crate) commit_latency: super::latency::LatencyRecorder,
            /// Each queue's counts and times.
            by_queue: Vec<QueueCounters>,
        }

        impl Counters {
            pub(crate) fn snapshot(&self, in_flight: u64, claimed_ahead: u64) -> PoolStats {
                PoolStats {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    in_flight,
                    claimed_ahead: claimed_ahead.min(in_flight),
                    commit_latency: self.commit_latency.snapshot(),
                    queues: (self.by_queue.iter())
                        .map(|q| {
                            let tally = QueueTally {
                                claimed: q.claimed.load(Ordering::Relaxed),
                                succeeded: q.succeeded.load(Ordering::Relaxed),
                                wait: q.wait.snapshot(),
                                run: q.run.snapshot(),
                            };
                            (q.queue.clone(), tally)
                        })
                        .collect(),
                }
            }
        }
    };
}

pool_counters! {
    /// Jobs claimed.
    claimed,
    /// Jobs completed (committed).
    succeeded,
    /// Commits of the pool's dispatcher that carried completions: `succeeded` over this is
    /// about how many completions share a commit (a worker commits its own when its output
    /// carries writes the engine cannot batch, or the pool is stopping).
    completion_commits,
    /// Attempts failed by their handler (committed as failures).
    failed,
    /// Handlers that panicked (failed with the panic message).
    panicked,
    /// Outputs the validator refused (failed).
    invalid,
    /// Jobs given back: at shutdown, or when their lease expired while renewals failed.
    released,
    /// Jobs stopped because the pool's renewals fell behind: a lease that ran out on the
    /// store clock, or a job claimed ahead that no worker had started (never run, no longer
    /// renewed, given back when a worker reaches it); and jobs claimed ahead whose lease had
    /// run out when a worker took them.
    shed,
    /// Leases found lost by a renewal.
    leases_lost,
    /// Leases revoked for making no progress.
    stalled,
    /// Attempts ended by their hard time limit.
    timed_out,
    /// Jobs their handler put off ([`crate::JobError::snooze`]).
    snoozed,
    /// Jobs cancelled while running.
    cancelled,
    /// Results not committed because the lease was gone: refused by the fence, or withheld
    /// because a renewal had already found the lease lost.
    rejected_writes,
    /// Heartbeat batches committed (one write transaction each).
    heartbeat_batches,
    /// Heartbeat batches that failed.
    heartbeat_failures,
    /// Claims that failed with an error.
    claim_errors,
    /// Times the dispatcher declined to claim because renewals were behind.
    intake_paused,
    /// Times the dispatcher found no work and went to sleep.
    idle_waits,
    /// Times the dispatcher put a round off, a millisecond at a time, because another
    /// process was writing the store (a redb file processes share: the round then carries
    /// what finished meanwhile; README, "Several processes").
    gave_way,
}

/// What a pool did with one of its queues.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueTally {
    /// Jobs of the queue claimed.
    pub claimed: u64,
    /// Jobs of the queue completed (committed).
    pub succeeded: u64,
    /// How long each job the pool started had waited: from when it was due (its run-at) to
    /// when a worker started it, in store time ([`JOB_TIME_BOUNDS`](crate::JOB_TIME_BOUNDS)).
    pub wait: super::latency::Latencies,
    /// How long each handler the pool ran took, on the host's clock, whatever it returned
    /// ([`JOB_TIME_BOUNDS`](crate::JOB_TIME_BOUNDS)).
    pub run: super::latency::Latencies,
}

/// One queue's counts and times, as the pool keeps them.
#[derive(Debug)]
pub(crate) struct QueueCounters {
    queue: String,
    claimed: AtomicU64,
    succeeded: AtomicU64,
    wait: super::latency::LatencyRecorder,
    run: super::latency::LatencyRecorder,
}

impl Counters {
    /// Counters for a pool of `queues`.
    pub(crate) fn for_queues<'q>(queues: impl Iterator<Item = &'q str>) -> Counters {
        let jobs = || super::latency::LatencyRecorder::with(&super::latency::JOB_TIME_BOUNDS);
        Counters {
            by_queue: queues
                .map(|q| QueueCounters {
                    queue: q.to_owned(),
                    claimed: AtomicU64::new(0),
                    succeeded: AtomicU64::new(0),
                    wait: jobs(),
                    run: jobs(),
                })
                .collect(),
            ..Counters::default()
        }
    }

    fn of(&self, queue: &str) -> Option<&QueueCounters> {
        self.by_queue.iter().find(|q| q.queue == queue)
    }

    /// Counts a job of `queue` claimed.
    pub(crate) fn claimed_of(&self, queue: &str) {
        bump(&self.claimed);
        if let Some(q) = self.of(queue) {
            bump(&q.claimed);
        }
    }

    /// Counts a job of `queue` completed.
    pub(crate) fn succeeded_of(&self, queue: &str) {
        bump(&self.succeeded);
        if let Some(q) = self.of(queue) {
            bump(&q.succeeded);
        }
    }

    /// Notes how long a job of `queue` waited before it started, and how long it ran.
    pub(crate) fn ran_of(&self, queue: &str, waited: Duration, ran: Duration) {
        if let Some(q) = self.of(queue) {
            q.wait.observe(waited);
            q.run.observe(ran);
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
