//! Plain data describing a store: counts per queue and state, and the lifetime counters.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ids::StoreTime;
use crate::state::JobState;

macro_rules! lifetime_counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Lifetime counters, persisted in the store and updated in the same transaction as
        /// the event they count (or, for a refused write, in a transaction of their own right
        /// after). Stored by name on both engines, so a build that counts something new
        /// reads an older store's counters with the new one at zero.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Counters {
            $($(#[$doc])* pub $name: u64,)*
            /// The longest time from a lease's last renewal to its reclaim by the reaper or
            /// a takeover: the detection delay, bounded by lease length + reaper interval.
            pub worst_detection_delay: Duration,
        }

        impl Counters {
            /// The counts by the names the tool and both engines keep them under (the worst
            /// detection delay, a duration, apart).
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }

            /// Sets the count named `name`; `false` for a name this build does not know (a
            /// newer build's counter, kept by it and ignored here).
            pub(crate) fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($name) => self.$name = value,)*
                    _ => return false,
                }
                true
            }

            /// Adds `other`'s counts (and keeps the worse detection delay).
            pub(crate) fn add(&mut self, other: &Counters) {
                $(self.$name = self.$name.saturating_add(other.$name);)*
                self.worst_detection_delay =
                    self.worst_detection_delay.max(other.worst_detection_delay);
            }
        }
    };
}

lifetime_counters! {
    /// Expired leases taken back by a reaper pass.
    reclaimed_by_reaper,
    /// Expired leases taken over by a claimer.
    reclaimed_by_takeover,
    /// Leases taken back when the store was opened that no process instance held (granted
    /// by a process that was gone: one writing alone, or before processes shared the store).
    reclaimed_at_open,
    /// Leases taken back because the process holding them died, seen by a process sharing
    /// the store (its instance lock was free), at once or when a process opened the store.
    reclaimed_process_died,
    /// Leases given back on purpose by their holder.
    released,
    /// Heartbeats refused because the lease was lost.
    leases_lost,
    /// Completions, failures and releases refused by the fence.
    fenced_writes_rejected,
    /// Leases revoked because the job made no progress.
    stalled,
    /// Attempts ended by their hard time limit.
    timed_out,
    /// Attempts whose holder put the job off ("not yet"), no budget spent.
    snoozed,
}

/// Jobs of one queue, by state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Count per state; states with no jobs are absent.
    pub by_state: BTreeMap<JobState, u64>,
    /// When a worker last asked the queue for work or renewed one of its leases, as marked
    /// (at most every half minute per store handle); `None` if none ever has.
    pub served_at: Option<StoreTime>,
    /// Whether the queue is paused (no claim takes its jobs).
    pub paused: bool,
    /// Its limits across every process and machine.
    pub limits: crate::queue::QueueLimits,
    /// The retry policy of its jobs that have none of their own, if it has one.
    pub retry: Option<crate::retry::RetryPolicy>,
    /// Its limit keys with no room now: as many of their jobs run as the per-key limit
    /// allows, or their per-key rate's window is spent. (Only keys with a job running,
    /// waiting or claimed within the window are counted: a key with none has room.)
    pub keys_at_limit: u64,
    /// Its waiting jobs out of the claim order behind their limit key: every waiting job
    /// of a key but its head, and the head too while the key is at its limit. They start
    /// as their keys make room, whatever the queue's own room.
    pub parked: u64,
}

impl QueueCounts {
    /// How many jobs of the queue are in `state`.
    pub fn get(&self, state: JobState) -> u64 {
        self.by_state.get(&state).copied().unwrap_or(0)
    }

    /// How many jobs the queue has in all.
    pub fn total(&self) -> u64 {
        self.by_state.values().sum()
    }
}

/// A snapshot of a store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The store time at which the snapshot was taken.
    pub now: StoreTime,
    /// Counts per queue.
    pub queues: BTreeMap<String, QueueCounts>,
    /// Lifetime counters.
    pub counters: Counters,
    /// The last reaper pass any process made on the store (`None` before the first).
    pub last_reaper_pass: Option<crate::report::ReaperPass>,
    /// Groups that have not ended: open to new members, or sealed with members to end.
    pub open_groups: u64,
    /// Jobs blocked until an open group ends: its callbacks, and any job made to wait for it.
    pub waiting_for_groups: u64,
}

impl Stats {
    /// Adds what `record` says of `queue`: when it was served, whether it is paused, its
    /// limits and retry policy.
    pub(crate) fn note_queue(&mut self, queue: String, record: &crate::queue::QueueRecord) {
        let counts = self.queues.entry(queue).or_default();
        counts.served_at = record.served_at;
        counts.paused = record.paused;
        counts.limits = record.limits;
        counts.retry = record.retry.clone();
    }

    /// Adds `group`, if it has not ended, to the open groups and its waiters to the jobs
    /// waiting for them.
    pub(crate) fn note_group(&mut self, group: &crate::workflow::GroupRecord) {
        if group.finished_at.is_none() {
            self.open_groups += 1;
            self.waiting_for_groups += group.waiters.len() as u64;
        }
    }

    /// How many jobs are in `state` across all queues.
    pub fn total(&self, state: JobState) -> u64 {
        self.queues.values().map(|q| q.get(state)).sum()
    }
}

/// Write activity of one store handle (and its clones) in this process.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteMetrics {
    /// Write transactions committed (each is one commit; durable ones one fsync).
    pub write_transactions: u64,
}
