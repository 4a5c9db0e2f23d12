//! What happened in a store, told to an application that subscribes
//! ([`crate::JobStore::subscribe`]): jobs claimed, attempts ended with their outcome (a
//! reclaim with its path), jobs expired unstarted, schedules fired, claims held back by a
//! queue's limit, queues paused and resumed.
//!
//! Each store handle tells what its own process committed, after the commit (a transaction
//! rolled back tells nothing), in commit order. What other processes and machines commit
//! reaches their own subscribers; the fleet as a whole is the store's counters and
//! `/metrics`. Cheap when nobody listens: a transaction asks one atomic whether anyone does
//! before it builds an event. A subscriber that falls behind by more than
//! [`EVENTS_BUFFER`] events loses the newest ones (counted in [`Events::dropped`]): the
//! store never waits for a listener.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::ids::{Attempt, JobId};
use crate::job::{Outcome, ReclaimPath};
use crate::state::JobState;

/// How many events a subscriber may leave unread before newer ones are dropped.
pub const EVENTS_BUFFER: usize = 10_000;

/// One thing a store handle committed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A job was claimed: a new attempt under a lease.
    Claimed {
        /// The job.
        job: JobId,
        /// The attempt it began.
        attempt: Attempt,
        /// Its queue.
        queue: String,
        /// The claimer.
        worker: String,
    },
    /// An attempt ended: completed, failed, released, snoozed, timed out, stalled,
    /// cancelled, or taken back ([`Event::reclaim_path`]).
    Ended {
        /// The job.
        job: JobId,
        /// The attempt that ended.
        attempt: Attempt,
        /// Its queue.
        queue: String,
        /// How the attempt ended, as its history records it.
        outcome: Outcome,
        /// The job's state after.
        state: JobState,
    },
    /// A schedule's tick enqueued its job.
    ScheduleFired {
        /// The schedule.
        schedule: String,
        /// The job its tick enqueued.
        job: JobId,
    },
    /// A claim took fewer jobs of a queue than it asked for, or none, because of the
    /// queue's limits (its concurrency, its rate).
    LimitReached {
        /// The queue.
        queue: String,
    },
    /// A job no attempt had started by its expiry ended as
    /// [`JobState::Expired`](crate::JobState::Expired), at the claim that would have started
    /// it or at a reaper's pass ([`crate::NewJob::expires_in`]). (No attempt ended: what
    /// [`Event::Ended`] tells is an attempt's end.)
    Expired {
        /// The job.
        job: JobId,
        /// Its queue.
        queue: String,
    },
    /// A queue was paused (`paused`), or resumed.
    QueuePaused {
        /// The queue.
        queue: String,
        /// Paused, or resumed.
        paused: bool,
    },
}

impl Event {
    /// The path that took a lease back, for an attempt that ended so: the reaper, a claim's
    /// takeover, a process found dead.
    pub fn reclaim_path(&self) -> Option<ReclaimPath> {
        match self {
            Event::Ended {
                outcome:
                    Outcome::LeaseExpired { path, .. }
                    | Outcome::NeverStarted { path }
                    | Outcome::ResultLost { path },
                ..
            } => Some(*path),
            _ => None,
        }
    }
}

/// A subscription: the events of one store handle (and its clones) from the moment it was
/// made. Dropping it ends it.
#[derive(Debug)]
pub struct Events {
    events: Receiver<Event>,
    dropped: Arc<AtomicU64>,
}

impl Events {
    /// The next event, waiting up to `timeout` for one.
    pub fn next_within(&self, timeout: Duration) -> Option<Event> {
        self.events.recv_timeout(timeout).ok()
    }

    /// The next event if one is there.
    pub fn try_next(&self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// How many events this subscription lost because it fell [`EVENTS_BUFFER`] behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Iterator for Events {
    type Item = Event;

    /// Waits for the next event; `None` once the store is gone.
    fn next(&mut self) -> Option<Event> {
        self.events.recv().ok()
    }
}

/// A store handle's subscribers. (Public only in name, as the notifier: reached through the
/// hidden supertrait of [`crate::JobStore`].)
#[derive(Debug, Default)]
pub struct Hub {
    subscribers: Mutex<Vec<(Sender<Event>, Arc<AtomicU64>)>>,
    listening: AtomicUsize,
}

impl Hub {
    /// Whether anyone listens: a transaction that is not told builds no event.
    pub(crate) fn listened(&self) -> bool {
        self.listening.load(Ordering::Relaxed) > 0
    }

    /// A new subscription.
    pub(crate) fn subscribe(&self) -> Events {
        let (tx, rx) = crossbeam_channel::bounded(EVENTS_BUFFER);
        let dropped = Arc::new(AtomicU64::new(0));
        let mut subscribers = self.subscribers.lock();
        subscribers.push((tx, dropped.clone()));
        self.listening.store(subscribers.len(), Ordering::Relaxed);
        Events {
            events: rx,
            dropped,
        }
    }

    /// Tells every subscriber the events of a commit, in order; forgets the gone ones.
    pub(crate) fn publish(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|(tx, dropped)| {
            for event in &events {
                match tx.try_send(event.clone()) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            true
        });
        self.listening.store(subscribers.len(), Ordering::Relaxed);
    }
}

/// A transaction's events, kept only while someone listens. (Public only in name, as the
/// hub.)
#[derive(Debug, Default)]
pub struct Pending(Option<Vec<Event>>);

impl Pending {
    /// For a transaction that begins now: collecting if `hub` has listeners.
    pub(crate) fn of(hub: &Hub) -> Pending {
        Pending(hub.listened().then(Vec::new))
    }

    /// Whether events are collected.
    pub(crate) fn wanted(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn push(&mut self, event: Event) {
        if let Some(events) = &mut self.0 {
            events.push(event);
        }
    }

    /// An empty one that collects if this one does: for a savepoint's part, kept only if
    /// it is ([`Pending::append`]).
    #[cfg(feature = "postgres")]
    pub(crate) fn alike(&self) -> Pending {
        Pending(self.0.as_ref().map(|_| Vec::new()))
    }

    /// Adds a savepoint's events that were kept.
    #[cfg(feature = "postgres")]
    pub(crate) fn append(&mut self, mut kept: Pending) {
        if let (Some(events), Some(more)) = (&mut self.0, kept.0.take()) {
            events.extend(more);
        }
    }

    /// The events collected, for publishing after the commit.
    pub(crate) fn take(&mut self) -> Vec<Event> {
        self.0.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paused(queue: &str) -> Event {
        Event::QueuePaused {
            queue: queue.into(),
            paused: true,
        }
    }

    #[test]
    fn nobody_listening_collects_nothing_and_a_full_subscriber_loses_the_newest() {
        let hub = Hub::default();
        assert!(!Pending::of(&hub).wanted());
        let events = hub.subscribe();
        assert!(Pending::of(&hub).wanted());
        hub.publish(
            (0..EVENTS_BUFFER + 3)
                .map(|i| paused(&i.to_string()))
                .collect(),
        );
        assert_eq!(events.dropped(), 3);
        assert_eq!(events.try_next(), Some(paused("0")));
        drop(events);
        hub.publish(vec![paused("a")]);
        assert!(!hub.listened(), "a dropped subscription is forgotten");
    }
}
