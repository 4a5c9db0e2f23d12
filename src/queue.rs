//! What a store knows of each queue apart from its jobs: whether it is paused, its limits
//! across every process and machine (how many of its jobs may be held at once, how many
//! claimed per period), and when a worker last asked it for work (a claim) or held its jobs
//! (a renewal), so that a queue with work and nobody serving it (a typo in a queue name, a
//! pool that never started) is seen, not silent. What a claim may take of a queue is the
//! rule book's ([`crate::rules::claim_room`]).
//!
//! The mark is written by claims and renewals themselves, in their own transaction, but at
//! most once every [`MARK_EVERY`] of store time per handle and queue: a busy pool's hot
//! path writes nothing extra. A pool claims whenever its queue has work due, so a queue
//! whose work waits while a pool serves it is marked; an idle pool whose queue has nothing
//! due reads its next due time and writes nothing (an idle device's pool wakes as seldom
//! as it can), so the mark then says when it last found work, or renewed a lease.

use std::collections::HashMap;
use std::time::Duration;

use bincode::{Decode, Encode};
use parking_lot::Mutex;

use crate::ids::StoreTime;
use crate::retry::RetryPolicy;

/// How often a handle writes that a queue is served, at most.
pub(crate) const MARK_EVERY: Duration = Duration::from_secs(30);

/// How long a queue's work may wait with no worker asking for it before it counts as
/// unserved ([`UnservedQueue`]). Well above how often a pool marks its queue (every
/// half minute, or its heartbeat interval if that is longer: a pool whose heartbeat is
/// slower than this would be reported falsely).
pub const UNSERVED_AFTER: Duration = Duration::from_secs(5 * 60);

/// A queue's record, as stored on redb (PostgreSQL keeps the same in columns).
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub(crate) struct QueueRecord {
    /// The last time a claim or a renewal of this queue marked it.
    pub served_at: Option<StoreTime>,
    /// No claim takes its jobs while it is paused; running ones finish.
    pub paused: bool,
    /// Its limits.
    pub limits: QueueLimits,
    /// The times of the claims within the rate limit's period, oldest first (empty without
    /// a rate limit).
    pub recent_claims: Vec<StoreTime>,
    /// The backoff of its jobs that have none of their own (else the store's). (Last, so
    /// that the codec reads an older record as one without: `codec::decode_queue`.)
    pub retry: Option<RetryPolicy>,
}

/// Limits on a queue that hold across every process and machine sharing the store, kept
/// by the claims themselves (`JobStore::set_queue_limits`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub struct QueueLimits {
    /// At most this many of the queue's jobs held under a lease at once ("two uploads at a
    /// time on this device"). A lease that expires frees its slot: a claim takes it back.
    pub concurrency: Option<u32>,
    /// At most this many claims in any period of store time.
    pub rate: Option<Rate>,
    /// At most this many of the jobs of one limit key ([`crate::NewJob::limit_key`]: a
    /// tenant, a customer, a device) held at once, each key apart: one key at its limit
    /// holds back no other key's jobs.
    pub per_key: Option<u32>,
    /// At most this many claims of one limit key's jobs in any period of store time, each
    /// key apart.
    pub per_key_rate: Option<Rate>,
}

impl QueueLimits {
    /// No limits.
    pub fn none() -> QueueLimits {
        QueueLimits::default()
    }

    /// At most `n` jobs held at once.
    pub fn concurrency(mut self, n: u32) -> QueueLimits {
        self.concurrency = Some(n);
        self
    }

    /// At most `claims` claims in any `per`.
    pub fn rate(mut self, claims: u32, per: Duration) -> QueueLimits {
        self.rate = Some(Rate { claims, per });
        self
    }

    /// At most `n` jobs of each limit key held at once.
    pub fn per_key(mut self, n: u32) -> QueueLimits {
        self.per_key = Some(n);
        self
    }

    /// At most `claims` claims of each limit key's jobs in any `per`.
    pub fn per_key_rate(mut self, claims: u32, per: Duration) -> QueueLimits {
        self.per_key_rate = Some(Rate { claims, per });
        self
    }

    /// Whether a limit per key is set.
    pub fn is_limited_per_key(&self) -> bool {
        self.per_key.is_some() || self.per_key_rate.is_some()
    }

    /// Whether a queue-wide limit is set (a per-key limit is kept by each key's record).
    pub fn is_limited(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }
}

/// A rate limit: at most `claims` claims in any `per` of store time (a sliding window).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub struct Rate {
    /// How many claims.
    pub claims: u32,
    /// In how long.
    pub per: Duration,
}

/// The largest rate limit's count: the store keeps the time of each claim in its window.
pub const MAX_RATE_CLAIMS: u32 = 10_000;

/// What the store keeps of one limit key of a queue ([`crate::NewJob::limit_key`]): how
/// many of its jobs run, and which of its waiting jobs stands in the claim order (its
/// *head*; see [`crate::rules::key_head`]). Kept while either is something.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub(crate) struct KeyRecord {
    /// How many of its jobs are `Running`.
    pub running: u32,
    /// Its one waiting job that is not parked, if it has room and a waiting job.
    pub head: Option<crate::ids::JobId>,
    /// The times of its claims within the per-key rate's period, oldest first (empty
    /// without one).
    pub recent: Vec<StoreTime>,
    /// When its rate window has room again, while it has none: until then it has no head,
    /// and a claim of its queue looks at it again then (`Records::gated_keys`).
    pub opens_at: Option<StoreTime>,
}

impl KeyRecord {
    /// Whether the record says nothing, so the store keeps none.
    pub(crate) fn is_empty(&self) -> bool {
        self.running == 0 && self.head.is_none() && self.recent.is_empty()
    }
}

/// A queue's settings as operators see them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSettings {
    /// Whether it is paused.
    pub paused: bool,
    /// Its limits.
    pub limits: QueueLimits,
    /// The backoff of its jobs that have none of their own, if it has one.
    pub retry: Option<RetryPolicy>,
}

impl QueueSettings {
    /// A queue's settings from its record (the defaults for a queue without one).
    pub(crate) fn of(record: Option<QueueRecord>) -> QueueSettings {
        record.map_or_else(QueueSettings::default, |r| QueueSettings {
            paused: r.paused,
            limits: r.limits,
            retry: r.retry,
        })
    }
}

/// A queue with work waiting and nobody asking for it (a paused queue is never one).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnservedQueue {
    /// The queue.
    pub queue: String,
    /// Since when its oldest due job has waited.
    pub waiting_since: StoreTime,
    /// When a worker last asked it for work or renewed one of its leases; `None` if none
    /// ever has.
    pub served_at: Option<StoreTime>,
}

/// Whether a queue whose oldest due job has waited since `waiting_since` and which was last
/// served at `served_at` counts as unserved at `now`.
pub(crate) fn unserved(
    waiting_since: StoreTime,
    served_at: Option<StoreTime>,
    now: StoreTime,
) -> bool {
    now.saturating_since(waiting_since) >= UNSERVED_AFTER
        && served_at.is_none_or(|at| now.saturating_since(at) >= UNSERVED_AFTER)
}

/// The marks one store handle (and its clones) wrote last, by queue: the throttle.
#[derive(Debug, Default)]
pub(crate) struct ServedMarks(Mutex<HashMap<String, StoreTime>>);

impl ServedMarks {
    /// The queues of `queues` whose mark is due at `now` (taken as written: a transaction
    /// that then fails merely leaves the next mark half a minute later).
    pub(crate) fn due<'q>(
        &self,
        queues: impl IntoIterator<Item = &'q str>,
        now: StoreTime,
    ) -> Vec<String> {
        let mut marks = self.0.lock();
        let mut due = Vec::new();
        // (a pool's leases come mostly of one queue: the same name again is not looked up)
        let mut last = None;
        for queue in queues {
            if last.replace(queue) == Some(queue) {
                continue;
            }
            let fresh = marks
                .get(queue)
                .is_some_and(|at| now.saturating_since(*at) < MARK_EVERY);
            if !fresh && !due.iter().any(|q| q == queue) {
                marks.insert(queue.to_owned(), now);
                due.push(queue.to_owned());
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_due_once_per_interval_per_queue() {
        let marks = ServedMarks::default();
        let t = StoreTime(1_000_000_000);
        assert_eq!(marks.due(["a", "b", "a"], t), vec!["a", "b"]);
        assert!(
            marks
                .due(["a"], t.saturating_add(MARK_EVERY / 2))
                .is_empty()
        );
        assert_eq!(marks.due(["a"], t.saturating_add(MARK_EVERY)), vec!["a"]);
    }

    #[test]
    fn a_queue_is_unserved_only_when_its_work_and_its_silence_are_both_old() {
        let now = StoreTime(3_600_000_000_000);
        let old = StoreTime(now.0 - UNSERVED_AFTER.as_nanos() as u64);
        let recent = StoreTime(now.0 - 1);
        assert!(unserved(old, None, now));
        assert!(unserved(old, Some(old), now));
        assert!(!unserved(old, Some(recent), now), "served a moment ago");
        assert!(!unserved(recent, None, now), "its work only just arrived");
    }
}
