//! Plain data describing a store: counts per queue and state, and the lifetime counters.

use std::collections::BTreeMap;
use std::time::Duration;

use bincode::{Decode, Encode};

use crate::ids::StoreTime;
use crate::job::JobState;

/// Lifetime counters, persisted in the store and updated in the same transaction as the
/// event they count (or, for a refused write, in a transaction of their own right after).
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
#[non_exhaustive]
pub struct Counters {
    /// Expired leases taken back by a reaper pass.
    pub reclaimed_by_reaper: u64,
    /// Expired leases taken over by a claimer.
    pub reclaimed_by_takeover: u64,
    /// Leases taken back when the store was opened that no process instance held (granted
    /// by a process that was gone: one writing alone, or before processes shared the store).
    pub reclaimed_at_open: u64,
    /// Leases given back on purpose by their holder.
    pub released: u64,
    /// Heartbeats refused because the lease was lost.
    pub leases_lost: u64,
    /// Completions, failures and releases refused by the fence.
    pub fenced_writes_rejected: u64,
    /// Leases revoked because the job made no progress.
    pub stalled: u64,
    /// The longest time from a lease's last renewal to its reclaim by the reaper or a
    /// takeover: the detection delay, bounded by lease length + reaper interval.
    pub worst_detection_delay: Duration,
    /// Leases taken back because the process holding them died, seen by a process sharing
    /// the store (its instance lock was free), at once or when a process opened the store.
    pub reclaimed_process_died: u64,
}

impl Counters {
    /// The counts by the names the tool and the PostgreSQL store keep them under (the worst
    /// detection delay, a duration, apart).
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("reclaimed_by_reaper", self.reclaimed_by_reaper),
            ("reclaimed_by_takeover", self.reclaimed_by_takeover),
            ("reclaimed_at_open", self.reclaimed_at_open),
            ("reclaimed_process_died", self.reclaimed_process_died),
            ("released", self.released),
            ("leases_lost", self.leases_lost),
            ("fenced_writes_rejected", self.fenced_writes_rejected),
            ("stalled", self.stalled),
        ]
    }
}

/// Jobs of one queue, by state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Count per state; states with no jobs are absent.
    pub by_state: BTreeMap<JobState, u64>,
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
}

impl Stats {
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
