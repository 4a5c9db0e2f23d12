//! A named background thread that runs a step on a timer at a fixed rate, stops at once when
//! asked (a message on a channel wakes it, rather than a sleep it must finish) and is always
//! joined: the shape of the reaper. (The scheduler sleeps until its next tick instead: its
//! own loop in `scheduler.rs`.)

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::clock::RealDeadline;
use crate::error::{Error, Result};

/// A running ticker, stopped and joined by [`Ticker::stop`] or on drop.
#[derive(Debug)]
pub(crate) struct Ticker {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    name: &'static str,
}

/// Why a ticker's step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Its time came.
    Due,
    /// Its wake-up channel said so, between two ticks (which it does not move).
    Woken,
}

impl Ticker {
    /// Starts thread `name`, which runs `step` first after `first`, then every `interval`
    /// after the last was due (fixed rate: a slow step does not stretch the period), and
    /// also whenever `woken` (if any) receives.
    pub(crate) fn start(
        name: &'static str,
        first: Duration,
        interval: Duration,
        woken: Option<Receiver<()>>,
        mut step: impl FnMut(Tick) + Send + 'static,
    ) -> Result<Ticker> {
        let (stop, stopped) = bounded::<()>(1);
        // (a channel nothing sends on, where there is none to wake it)
        let mut woken = woken.unwrap_or_else(crossbeam_channel::never);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut due = RealDeadline::after(first);
                loop {
                    crossbeam_channel::select! {
                        recv(stopped) -> _ => return,
                        recv(woken) -> got => match got {
                            Ok(()) => {
                                step(Tick::Woken);
                                // (wake-ups that keep coming do not hold back a tick: a
                                // `select` takes its `default` only when nothing is ready)
                                if due.passed() {
                                    due = due.plus(interval);
                                    step(Tick::Due);
                                }
                            }
                            // (its sender is gone: nothing will wake it again)
                            Err(_) => woken = crossbeam_channel::never(),
                        },
                        default(due.remaining()) => {
                            due = due.plus(interval);
                            step(Tick::Due);
                        }
                    }
                }
            })
            .map_err(Error::ThreadSpawn)?;
        Ok(Ticker {
            stop: Some(stop),
            thread: Some(thread),
            name,
        })
    }

    /// Stops the thread and waits for it. Idempotent; a step in progress finishes first.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(thread = self.name, "a background thread panicked");
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use super::{Tick, Ticker};

    /// Waits for `cond` with a generous deadline (real threads and timers run).
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = crate::clock::RealDeadline::after(Duration::from_secs(60));
        while !cond() {
            assert!(!deadline.passed(), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn wake_ups_that_never_stop_do_not_hold_back_a_tick() {
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let (wakes, ticks) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (w, t) = (wakes.clone(), ticks.clone());
        let mut ticker = Ticker::start(
            "test-ticker",
            Duration::from_millis(20),
            Duration::from_millis(20),
            Some(woken),
            move |why| match why {
                Tick::Woken => {
                    // (a step's work, during which the next wake-up arrives)
                    std::thread::sleep(Duration::from_millis(2));
                    w.fetch_add(1, Ordering::SeqCst);
                }
                Tick::Due => drop(t.fetch_add(1, Ordering::SeqCst)),
            },
        )
        .unwrap();
        // A waker that keeps the channel full: the ticker always finds a wake-up ready.
        let stop = Arc::new(AtomicBool::new(false));
        let waker = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::SeqCst) {
                    let _ = wake.send_timeout((), Duration::from_millis(10));
                }
            }
        });
        // 300 woken steps take 600 ms at least (each sleeps 2 ms): thirty ticks came due
        // meanwhile, and each woken step runs one that is due.
        eventually("woken steps", || wakes.load(Ordering::SeqCst) >= 300);
        let ticked = ticks.load(Ordering::SeqCst);
        assert!(ticked >= 3, "{ticked} ticks among 300 wake-ups");
        stop.store(true, Ordering::SeqCst);
        waker.join().unwrap();
        ticker.stop();
    }
}
