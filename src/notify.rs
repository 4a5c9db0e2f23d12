//! Waking idle workers: a generation counter per queue and one condition variable.
//!
//! A commit that gives a queue a waiting job bumps that queue's generation and wakes the
//! waiters; a waiter compares the generation with the one it saw before it last looked for
//! work, so a wake-up between its look and its wait is never lost. Async waiters (the `tokio`
//! feature) leave a [`Waker`] under the same lock instead of sleeping on the condition.
//!
//! The scheduler waits apart, on a generation of its own and its own condition: a change of
//! a schedule through this handle wakes it, and the commits that wake workers do not.
//!
//! Followers of the store's endings ([`crate::ReadJobs::wait_for_endings`]) wait apart too,
//! on the endings' generation: a commit that kept an ending moves it, here or, told by a
//! hint, in another process. Whether another process of a shared file follows is kept here
//! as well ([`Notifier::note_followed`]): a commit that kept an ending hints the other
//! processes only while one does, so that nobody pays for hints nobody waits for. (On
//! PostgreSQL the store itself keeps it: see `postgres/listen.rs`.)

use std::collections::HashMap;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::clock::RealDeadline;

/// How long a follower's announcement holds: a commit that keeps an ending hints the other
/// processes for this long after a follower last said it follows. A follower says it again
/// at least every [`FOLLOW_RENEW`].
pub(crate) const FOLLOWED_FOR: Duration = Duration::from_secs(60);

/// How often a follower that goes on waiting says again that it follows.
pub(crate) const FOLLOW_RENEW: Duration = Duration::from_secs(20);

#[derive(Debug, Default)]
pub struct Notifier {
    state: Mutex<Generations>,
    cond: Condvar,
    /// Where the scheduler waits for [`Notifier::notify_schedules`].
    schedules_cond: Condvar,
    /// Where followers of the endings wait for [`Notifier::notify_endings`].
    endings_cond: Condvar,
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
    /// Bumped by a commit that kept an ending (this process's, or another's by its hint).
    endings: u64,
    /// Until when a follower of the endings, here or in another process, asked for hints
    /// (`None`: none ever did).
    followed_until: Option<RealDeadline>,
    /// When a follower here may say again that it follows ([`Notifier::announce_due`]),
    /// and until when what it said holds.
    announce_after: Option<RealDeadline>,
    follows_until: Option<RealDeadline>,
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

    /// The endings' generation; read it before reading the endings, then pass it to
    /// [`Notifier::wait_endings`].
    pub(crate) fn endings_generation(&self) -> u64 {
        self.state.lock().endings
    }

    /// Wakes the followers of the endings: a commit kept one.
    pub(crate) fn notify_endings(&self) {
        self.state.lock().endings += 1;
        self.endings_cond.notify_all();
    }

    /// Waits until the endings' generation differs from `seen` or `timeout` passes; `true`
    /// if it moved.
    pub(crate) fn wait_endings(&self, seen: u64, timeout: Duration) -> bool {
        let mut state = self.state.lock();
        if state.endings == seen {
            let _ = self.endings_cond.wait_for(&mut state, timeout);
        }
        state.endings != seen
    }

    /// A follower of the endings, here or in another process, asks for hints for
    /// [`FOLLOWED_FOR`] from now.
    pub(crate) fn note_followed(&self) {
        self.state.lock().followed_until = Some(RealDeadline::after(FOLLOWED_FOR));
    }

    /// Whether a follower here should say (again) to the other processes that it follows:
    /// the first time, and [`FOLLOW_RENEW`] after the last time, which this counts as said.
    /// `Some(true)` if what was said last has lapsed (or nothing was): the others may not
    /// know of a follower now, and the commits they make before they hear it send no hint.
    pub(crate) fn announce_due(&self) -> Option<bool> {
        let mut state = self.state.lock();
        if (state.announce_after.as_ref()).is_some_and(|after| !after.passed()) {
            return None;
        }
        let lapsed = (state.follows_until.as_ref()).is_none_or(RealDeadline::passed);
        state.announce_after = Some(RealDeadline::after(FOLLOW_RENEW));
        state.follows_until = Some(RealDeadline::after(FOLLOWED_FOR));
        Some(lapsed)
    }

    /// Whether a follower here said it follows within [`FOLLOWED_FOR`]: a process that
    /// joins, or a listener that connects, is told again.
    pub(crate) fn follows_here(&self) -> bool {
        (self.state.lock().follows_until.as_ref()).is_some_and(|until| !until.passed())
    }

    /// Whether a follower asked for hints within [`FOLLOWED_FOR`]: a commit that kept an
    /// ending then tells the other processes.
    pub(crate) fn followed(&self) -> bool {
        (self.state.lock().followed_until.as_ref()).is_some_and(|until| !until.passed())
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
