//! Wake-ups across machines: an enqueue's transaction sends `NOTIFY` on the store's channel
//! with the queue's name (delivered when it commits), and each `PgStore` that has a waiting
//! pool keeps one connection that `LISTEN`s and wakes this process's waiters of that queue.
//!
//! A notification is a hint, never the only way work is found: behind a transaction-mode
//! connection pooler `LISTEN` does not work, a listener reconnecting misses what was sent
//! meanwhile, and PostgreSQL drops notifications of a full queue. So a listener that starts
//! listening (first or again) wakes every waiter once, and idle pools also look on their
//! own: once a heartbeat while the listener is connected (as on any engine, for what no
//! notification announces), every 250–500 ms while it is not or where
//! `PgStoreBuilder::listen(false)` turned it off (behind a transaction-mode pooler), both
//! jittered.
//!
//! Followers of the endings ([`crate::ReadJobs::wait_for_endings`]) are told the same way,
//! while one follows: a follower writes until when it follows into `leasehold_meta`
//! (`endings.followed_until`, a minute ahead, again every [`crate::notify::FOLLOW_RENEW`]),
//! and each statement that keeps an ending sends [`ENDINGS`] if that time is still ahead
//! ([`tell_followers`]: a read of one row, in the same statement). So every handle tells,
//! listening or not, and nobody pays a `NOTIFY` while nobody follows.
//!
//! A request made in SQL (`requests.rs`) sends [`super::requests::REQUESTS`], which wakes
//! this handle's reapers to apply it.
//!
//! The thread sleeps until a notification comes: a handle that closes wakes its listener
//! with one of its own ([`LOOK_AGAIN`]), sent on a connection it still has; the same
//! payload, sent when the schedules change, wakes every machine's schedulers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::NoTls;
use postgres::fallible_iterator::FallibleIterator;

use crate::notify::Notifier;

/// The payload that wakes the waiters of every queue (a reaper's pass readies any queue).
pub(crate) const ALL_QUEUES: &str = "*";

/// The payload that tells the store's listeners something other than a queue's work
/// changed (no queue has an empty name): the schedules, so that each wakes its schedulers,
/// or a handle is closing, so that its own listener, asleep until a notification comes,
/// looks at its stop flag and stops at once. The others look and sleep again.
pub(crate) const LOOK_AGAIN: &str = "";

/// Sends [`LOOK_AGAIN`] on `channel` over `client`, delivered when it commits (at once,
/// outside a transaction).
pub(crate) fn look_again(
    client: &mut postgres::Client,
    channel: &str,
) -> Result<(), postgres::Error> {
    client
        .execute("SELECT pg_notify($1, $2)", &[&channel, &LOOK_AGAIN])
        .map(drop)
}

/// The payload that wakes the followers of the endings: a commit kept one. (The control
/// character keeps it apart from queue names in practice; a queue so named would only
/// wake a follower for nothing.) [`tell_followers`] spells it in SQL.
pub(crate) const ENDINGS: &str = "\u{1}endings";

/// A CTE, `told`, that sends [`ENDINGS`] on the store's channel when its transaction
/// commits, if a follower said it follows until a time still ahead (see the module's
/// doc). A statement that keeps endings names it (`(SELECT count(*) FROM told)`), so that
/// it runs once, and only where the statement kept one.
macro_rules! tell_followers {
    () => {
        "told AS (
    SELECT pg_notify('leasehold_{s}', chr(1) || 'endings')
    FROM {s}.leasehold_meta
    WHERE key = 'endings.followed_until'
        AND CASE WHEN key = 'endings.followed_until' THEN value::bigint END > {s}.us({now})
)"
    };
}
pub(crate) use tell_followers;

/// Says that a follower follows for [`crate::notify::FOLLOWED_FOR`] from now (see the
/// module's doc), in microseconds of the store's clock.
pub(crate) const FOLLOWING: &str = "INSERT INTO {s}.leasehold_meta (key, value)
VALUES ('endings.followed_until', ({s}.us({now}) + 60000000)::text)
ON CONFLICT (key) DO UPDATE SET value = excluded.value";

// (the 60000000 above is FOLLOWED_FOR)
const _: () = assert!(crate::notify::FOLLOWED_FOR.as_micros() == 60_000_000);

/// How often the listener thread looks at its stop flag when nothing wakes it. A closing
/// handle wakes it with [`LOOK_AGAIN`]; this only bounds how long a thread lingers whose
/// wake-up could not be sent (the handle had no connection left to send it on). It looked
/// five times a second once, which was most of what an idle process on PostgreSQL woke for;
/// each look wakes the thread about three times (the client's timer wheel wakes it at its
/// coarse slot, then at finer ones), so a look every 30 s costs about 0.1 a second.
const STOP_CHECK: Duration = Duration::from_secs(30);

/// The channel of the store in `schema`.
pub(crate) fn channel(schema: &str) -> String {
    format!("leasehold_{schema}")
}

/// The listener thread of one `PgStore`, stopped by [`Listener::stop`] (or, dropped, asked
/// to stop and left to end at its next look at the flag).
pub(crate) struct Listener {
    stop: Arc<AtomicBool>,
    /// Whether the thread is connected and listening now.
    listening: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub(crate) fn start(
        config: postgres::Config,
        channel: String,
        notifier: Arc<Notifier>,
        requests: crossbeam_channel::Sender<()>,
    ) -> std::io::Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let listening = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("leasehold-listen".into())
            .spawn({
                let (stop, listening) = (stop.clone(), listening.clone());
                move || listen(&config, &channel, &notifier, &requests, &stop, &listening)
            })?;
        Ok(Listener {
            stop,
            listening,
            thread: Some(thread),
        })
    }

    /// Whether the thread is connected and listening now: other machines' enqueues wake
    /// this process's pools, which then need look for work on their own only seldom.
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }
}

impl Listener {
    /// Stops the thread: `wake` sends [`LOOK_AGAIN`] on the channel it listens on (`true`
    /// if it was sent). Woken, the thread is waited for: it hears the wake-up if it listened
    /// before it was sent, and sees the flag as soon as it listens otherwise. Not woken, it
    /// is left to end by itself within [`STOP_CHECK`], rather than a handle's close waiting
    /// that long.
    pub(crate) fn stop(mut self, wake: impl FnOnce() -> bool) {
        self.stop.store(true, Ordering::SeqCst);
        if wake()
            && let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn listen(
    config: &postgres::Config,
    channel: &str,
    notifier: &Notifier,
    requests: &crossbeam_channel::Sender<()>,
    stop: &AtomicBool,
    listening: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        listening.store(false, Ordering::SeqCst);
        let mut client = match config.connect(NoTls) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(error = %e, "the wake-up listener cannot connect; idle pools poll");
                wait_or_stop(stop, Duration::from_secs(1));
                continue;
            }
        };
        if let Err(e) = client.batch_execute(&format!("LISTEN {channel}")) {
            tracing::warn!(error = %e, "LISTEN failed; idle pools poll");
            wait_or_stop(stop, Duration::from_secs(1));
            continue;
        }
        listening.store(true, Ordering::SeqCst);
        // A handle that closed before this connection listened sent its wake-up to nobody
        // (`Listener::stop` sets the flag first, then sends it): the flag says so now, and
        // what is sent from here on is heard.
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // What was sent before this listener listened is lost, at its start too (a waiter
        // that read its generation before, and an enqueue that committed in between): everyone
        // looks once, schedulers and followers too.
        notifier.notify_all();
        notifier.notify_schedules();
        notifier.notify_endings();
        let _ = requests.try_send(());
        let mut notifications = client.notifications();
        loop {
            // Notifications until a quiet STOP_CHECK, then a look at the stop flag.
            let mut it = notifications.timeout_iter(STOP_CHECK);
            let quiet = loop {
                match it.next() {
                    Ok(Some(n)) if n.payload() == LOOK_AGAIN => {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        notifier.notify_schedules();
                    }
                    Ok(Some(n)) if n.payload() == ALL_QUEUES => notifier.notify_all(),
                    Ok(Some(n)) if n.payload() == ENDINGS => notifier.notify_endings(),
                    Ok(Some(n)) if n.payload() == super::requests::REQUESTS => {
                        // (full: a wake-up is pending already)
                        let _ = requests.try_send(());
                    }
                    Ok(Some(n)) => notifier.notify([&n.payload().to_owned()]),
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            match quiet {
                Ok(()) if stop.load(Ordering::SeqCst) => return,
                Ok(()) => {}
                Err(e) => {
                    listening.store(false, Ordering::SeqCst);
                    tracing::warn!(error = %e, "the wake-up listener lost its connection");
                    break;
                }
            }
        }
    }
}

fn wait_or_stop(stop: &AtomicBool, d: Duration) {
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < d && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(step);
        waited += step;
    }
}
