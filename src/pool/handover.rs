//! Completions handed from workers to the dispatcher, so that a pool with many workers commits
//! them together with the claims that refill those workers: one transaction (one fsync) for
//! everything that finished while the previous one committed, and no worker waiting on a
//! commit of its own.
//!
//! A handed-over job stays in flight (and renewed) until its completion commits. Once the
//! dispatcher stops, the hand-over is closed and workers commit their own completions again.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{Batching, Flight, Shared};
use crate::clock::Stopwatch;

/// A finished job whose completion the dispatcher is to commit.
pub(crate) struct Handed {
    pub flight: Flight,
    pub output: Vec<u8>,
    /// The application's writes, committed in the round under this completion's fence.
    pub writes: Option<crate::protocol::AnyWrites>,
}

#[derive(Default)]
pub(crate) struct Handover {
    state: Mutex<State>,
    /// Set while the dispatcher sleeps waiting for work: a worker that hands over a
    /// completion then wakes it.
    idle: AtomicBool,
}

#[derive(Default)]
struct State {
    closed: bool,
    done: Vec<Handed>,
    /// Since the oldest of `done` was handed over.
    oldest: Option<Stopwatch>,
}

impl Handover {
    /// Hands a finished job over for the dispatcher to commit. Gives it back if the
    /// hand-over is closed (the dispatcher has stopped): the caller then commits it.
    pub(crate) fn hand_over(&self, shared: &Shared, handed: Handed) -> Option<Handed> {
        {
            let mut state = self.state.lock();
            if state.closed {
                return Some(handed);
            }
            if state.done.is_empty() {
                state.oldest = Some(Stopwatch::start());
            }
            state.done.push(handed);
        }
        if self.idle.load(Ordering::SeqCst) {
            shared.wake_dispatcher();
        }
        None
    }

    /// The oldest `max` of what was handed over (the rest keep their place, and their age).
    pub(crate) fn take(&self, max: usize) -> Vec<Handed> {
        let mut state = self.state.lock();
        let at = max.min(state.done.len());
        let rest = state.done.split_off(at);
        let taken = std::mem::replace(&mut state.done, rest);
        if state.done.is_empty() {
            state.oldest = None;
        }
        taken
    }

    /// How much longer what was handed over may wait for more to share its commit (`None`:
    /// nothing waits, or it is to be committed now: the oldest has waited the delay, or a
    /// whole batch is there).
    pub(crate) fn may_wait(&self, batch: Batching) -> Option<std::time::Duration> {
        let state = self.state.lock();
        let waited = state.oldest.as_ref()?.elapsed();
        (state.done.len() < batch.max && waited < batch.delay).then(|| batch.delay - waited)
    }

    /// Whether completions wait to be committed.
    pub(crate) fn pending(&self) -> bool {
        !self.state.lock().done.is_empty()
    }

    /// Closes the hand-over (workers commit their own from now on) and returns what is left.
    pub(crate) fn close(&self) -> Vec<Handed> {
        let mut state = self.state.lock();
        state.closed = true;
        state.oldest = None;
        std::mem::take(&mut state.done)
    }

    /// Marks the dispatcher as about to sleep (or awake again). A dispatcher that sets this
    /// must look at [`Handover::pending`] before it sleeps: a worker that handed over before
    /// the flag was set did not wake it.
    pub(crate) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::SeqCst);
    }
}
