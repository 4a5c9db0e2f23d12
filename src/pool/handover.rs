//! Completions handed from workers to the dispatcher, so that a pool with many workers commits
//! them together with the claims that refill those workers: one transaction (one fsync) for
//! everything that finished while the previous one committed, and no worker waiting on a
//! commit of its own.
//!
//! A handed-over job stays in flight (and renewed) until its completion commits. Once the
//! dispatcher stops, the hand-over is closed and workers commit their own completions again.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{Flight, Shared};

/// A finished job whose completion the dispatcher is to commit.
pub(crate) struct Handed {
    pub flight: Flight,
    pub output: Vec<u8>,
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
            state.done.push(handed);
        }
        if self.idle.load(Ordering::SeqCst) {
            shared.store.wake_queue(&shared.queue);
        }
        None
    }

    /// Everything handed over so far.
    pub(crate) fn take(&self) -> Vec<Handed> {
        std::mem::take(&mut self.state.lock().done)
    }

    /// Whether completions wait to be committed.
    pub(crate) fn pending(&self) -> bool {
        !self.state.lock().done.is_empty()
    }

    /// Closes the hand-over (workers commit their own from now on) and returns what is left.
    pub(crate) fn close(&self) -> Vec<Handed> {
        let mut state = self.state.lock();
        state.closed = true;
        std::mem::take(&mut state.done)
    }

    /// Marks the dispatcher as about to sleep (or awake again). A dispatcher that sets this
    /// must look at [`Handover::pending`] before it sleeps: a worker that handed over before
    /// the flag was set did not wake it.
    pub(crate) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::SeqCst);
    }
}
