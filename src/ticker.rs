//! A named background thread that runs a step on a timer at a fixed rate, stops at once when
//! asked (a message on a channel wakes it, rather than a sleep it must finish) and is always
//! joined: the shape of the reaper. (The scheduler sleeps until its next tick instead: its
//! own loop in `scheduler.rs`.)

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender, bounded};

use crate::clock::RealDeadline;
use crate::error::{Error, Result};

/// A running ticker, stopped and joined by [`Ticker::stop`] or on drop.
#[derive(Debug)]
pub(crate) struct Ticker {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    name: &'static str,
}

impl Ticker {
    /// Starts thread `name`, which runs `step` first after `first`, then every `interval`
    /// after the last was due (fixed rate: a slow step does not stretch the period).
    pub(crate) fn start(
        name: &'static str,
        first: Duration,
        interval: Duration,
        mut step: impl FnMut() + Send + 'static,
    ) -> Result<Ticker> {
        let (stop, stopped) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut due = RealDeadline::after(first);
                loop {
                    match stopped.recv_timeout(due.remaining()) {
                        Err(RecvTimeoutError::Timeout) => {
                            due = due.plus(interval);
                            step();
                        }
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
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
