//! Waking idle workers: a generation counter per queue and one condition variable.
//!
//! A commit that gives a queue a waiting job bumps that queue's generation and wakes the
//! waiters; a waiter compares the generation with the one it saw before it last looked for
//! work, so a wake-up between its look and its wait is never lost. Async waiters (the `tokio`
//! feature) leave a [`Waker`] under the same lock instead of sleeping on the condition.
//!
//! The scheduler waits apart, on a generation of its own and its own condition: a change of
//! a schedule through this handle wakes it, and the commits that wake workers do not.

use std::collections::HashMap;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
pub struct Notifier {
    state: Mutex<Generations>,
    cond: Condvar,
    /// Where the scheduler waits for [`Notifier::notify_schedules`].
    schedules_cond: Condvar,
}

#[derive(Debug, Default)]
struct Generations {
    /// Bumped by a wake-up of every queue.
    all: u64,
    per_queue: HashMap<String, u64>,
    /// Bumped by a change of a schedule (and by whatever wakes everything).
    schedules: u64,
    /// Async waiters, woken (and forgotten) by every wake-up; each looks at its own queue's
    /// generation and leaves its waker again if nothing changed for it.
    wakers: Vec<Waker>,
}

impl Generations {
    fn of(&self, queue: &str) -> u64 {
        self.all + self.per_queue.get(queue).copied().unwrap_or(0)
    }
}

impl Notifier {
    /// The queue's current generation; pass it to [`Notifier::wait`] after looking for work.
    pub(crate) fn generation(&self, queue: &str) -> u64 {
        self.state.lock().of(queue)
    }

    /// Wakes the waiters of these queues.
    pub(crate) fn notify<'a>(&self, queues: impl IntoIterator<Item = &'a String>) {
        let mut state = self.state.lock();
        let mut any = false;
        for q in queues {
            *state.per_queue.entry(q.clone()).or_default() += 1;
            any = true;
        }
        if any {
            self.wake(state);
        }
    }

    /// The schedules' generation; pass it to [`Notifier::wait_schedules`] after looking at
    /// them.
    pub(crate) fn schedules_generation(&self) -> u64 {
        self.state.lock().schedules
    }

    /// Wakes the scheduler: a schedule changed (or time moved, or it is asked to stop).
    pub(crate) fn notify_schedules(&self) {
        self.state.lock().schedules += 1;
        self.schedules_cond.notify_all();
    }

    /// Waits until the schedules' generation differs from `seen` or `deadline` passes.
    pub(crate) fn wait_schedules(&self, seen: u64, deadline: &crate::clock::RealDeadline) {
        let mut state = self.state.lock();
        while state.schedules == seen && !deadline.passed() {
            let _ = self
                .schedules_cond
                .wait_for(&mut state, deadline.remaining());
        }
    }

    /// Wakes every waiter (time moved in a way no commit shows, e.g. a manual clock).
    pub(crate) fn notify_all(&self) {
        let mut state = self.state.lock();
        state.all += 1;
        self.wake(state);
    }

    /// Wakes the blocked waiters and the async ones (outside the lock: a waker may run the
    /// waiting task at once, and it takes the lock to look).
    fn wake(&self, mut state: parking_lot::MutexGuard<'_, Generations>) {
        self.cond.notify_all();
        let wakers = std::mem::take(&mut state.wakers);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// [`Notifier::wait`] as a future: the generation of `queue` once it moves past `seen`,
    /// or `None` after `timeout` (no thread, no polling: the notifier keeps the wakers).
    #[cfg(feature = "tokio")]
    pub(crate) async fn changed(&self, queue: &str, seen: u64, timeout: Duration) -> Option<u64> {
        let changed = std::future::poll_fn(|cx| self.poll_changed(queue, seen, cx));
        tokio::time::timeout(timeout, changed).await.ok()
    }

    /// Ready with the generation once it differs from `seen`, otherwise pending with `cx`'s
    /// waker left for the next wake-up.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    fn poll_changed(&self, queue: &str, seen: u64, cx: &mut Context<'_>) -> Poll<u64> {
        let mut state = self.state.lock();
        let now = state.of(queue);
        if now != seen {
            return Poll::Ready(now);
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Waits until the generation of one of the queues of `seen` differs from the one given
    /// beside it, or `timeout` passes.
    pub(crate) fn wait_any(&self, seen: &[(&str, u64)], timeout: Duration) {
        let mut state = self.state.lock();
        if seen.iter().all(|(queue, g)| state.of(queue) == *g) {
            let _ = self.cond.wait_for(&mut state, timeout);
        }
    }

    /// Waits until the queue's generation differs from `seen` or `timeout` passes. Returns
    /// the generation now.
    pub(crate) fn wait(&self, queue: &str, seen: u64, timeout: Duration) -> u64 {
        let mut state = self.state.lock();
        if state.of(queue) == seen {
            // One wait, not a loop: spurious and foreign wake-ups cost the caller one look
            // for work, and the caller recomputes its timeout anyway.
            let _ = self.cond.wait_for(&mut state, timeout);
        }
        state.of(queue)
    }
}
