//! The database's clock between readings, as this process's pools read it: the last reading
//! plus the local time since. Reading the server's clock is a statement, so a handle reads
//! it at most every half second and estimates in between (`backend.rs`).
//!
//! An estimate never runs back, though readings may: a reading is the server's time when
//! its statement ran, stored when the answer came back, so the estimate it replaces (the
//! older reading plus the round trip) may be ahead of it by that much; and two threads'
//! readings may be stored in the opposite order to the one they were taken in. A pool's
//! timers, deadlines and health check take store time as never running back (the brief's
//! "one clock"), so an estimate is held at the latest one given.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Stopwatch;
use crate::ids::StoreTime;

/// The last reading of the database's clock, and the latest estimate given.
pub(super) struct ClockEstimate {
    reading: Mutex<(StoreTime, Stopwatch)>,
    given: AtomicU64,
    /// A thread is reading the database's clock (the others use the estimate meanwhile).
    reading_now: AtomicBool,
}

impl ClockEstimate {
    /// An estimate from a reading of `now`.
    pub(super) fn new(now: StoreTime) -> ClockEstimate {
        ClockEstimate {
            reading: Mutex::new((now, Stopwatch::start())),
            given: AtomicU64::new(0),
            reading_now: AtomicBool::new(false),
        }
    }

    /// The server's clock read `now`: estimates start from it (never going back).
    pub(super) fn read(&self, now: StoreTime) {
        *self.reading.lock() = (now, Stopwatch::start());
    }

    /// Whether the calling thread is the one to read the database's clock now, the others
    /// going on with the estimate meanwhile; it says [`ClockEstimate::done_reading`] after.
    pub(super) fn begin_reading(&self) -> bool {
        (self.reading_now)
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The reading begun is over (made or not).
    pub(super) fn done_reading(&self) {
        self.reading_now.store(false, Ordering::SeqCst);
    }

    /// The estimate now, and the age of the reading it comes from.
    pub(super) fn now(&self) -> (StoreTime, Duration) {
        let (estimate, age) = {
            let reading = self.reading.lock();
            let age = reading.1.elapsed();
            (reading.0.saturating_add(age), age)
        };
        let before = self.given.fetch_max(estimate.0, Ordering::SeqCst);
        (StoreTime(before.max(estimate.0)), age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_never_runs_back_when_an_older_reading_is_stored_after_a_newer_one() {
        let second = |s: u64| StoreTime(s * 1_000_000_000);
        let clock = ClockEstimate::new(second(100));
        clock.read(second(200));
        let (first, _) = clock.now();
        assert!(first >= second(200));
        // A thread's reading taken before the last one, stored after it.
        clock.read(second(150));
        let (then, age) = clock.now();
        assert!(then >= first, "{then:?} < {first:?}");
        assert!(
            age < Duration::from_secs(60),
            "the age is the new reading's"
        );
        // Time goes on from the reading once it passes what was given.
        clock.read(second(300));
        assert!(clock.now().0 >= second(300));
    }
}
