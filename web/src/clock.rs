//! The page's own time: how long a sign-in session or a count has lasted, and the wall
//! clock a cron schedule's next tick is shown against. Never store time, and never
//! compared with it (the store's clock is the store's: `ReadJobs::now`).

use std::time::{Duration, Instant, SystemTime};

/// Real time since it started, for expiries the page keeps itself.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)] // the page's own time, not store time
    pub(crate) fn start() -> Stopwatch {
        Stopwatch(Instant::now())
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// The wall clock now.
#[allow(clippy::disallowed_methods)] // a cron tick is a wall-clock time
pub(crate) fn wall_now() -> SystemTime {
    SystemTime::now()
}
