//! Waiting for an end: looking again until a job has ended, or a group has, from any
//! process ([`crate::ReadJobs::wait_for`], [`crate::ReadJobs::wait_for_group`], which say
//! what they look for).
//!
//! The store's records are the truth, so a wait reads them: at once, then after pauses that
//! double from [`FIRST_PAUSE`] to [`WAIT_MAX_PAUSE`]. An end committed by any process or
//! machine, an attempt's or not (a cancel, an expiry), is so seen within [`WAIT_MAX_PAUSE`]
//! of its commit. There is no notice to lose, only a record to read: a waiter cannot miss an
//! end. (It subscribes to nothing: a subscriber would make every transaction of its store
//! build events, and be woken by each, for the one end it waits for.)

use std::time::Duration;

use crate::clock::RealDeadline;
use crate::error::Result;

/// The first pause between two looks of a wait.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The longest pause between two reads of a wait ([`crate::ReadJobs::wait_for`]): the most
/// after its commit that an end is seen.
pub const WAIT_MAX_PAUSE: Duration = Duration::from_millis(200);

/// Looks until `look` finds what it waits for or `timeout` passes (`None`, after a last
/// look at the deadline).
pub(crate) fn until<T>(
    timeout: Duration,
    mut look: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = RealDeadline::after(timeout);
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        std::thread::sleep(pause.min(deadline.remaining()));
        if deadline.passed() {
            return look();
        }
        pause = (pause * 2).min(WAIT_MAX_PAUSE);
    }
}
