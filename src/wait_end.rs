//! Waiting for an end: until a job has ended, or a group has, from any process
//! ([`crate::ReadJobs::wait_for`], [`crate::ReadJobs::wait_for_group`]).
//!
//! The store's records are the truth, so a wait reads them: at once, then after pauses that
//! double from [`FIRST_PAUSE`] to [`WAIT_MAX_PAUSE`], and (on a store that writes, which
//! has this process's events) at once when this process ends an attempt of the job. An
//! end committed by another process or machine, or one that is no attempt's end (a cancel,
//! an expiry), is so seen within [`WAIT_MAX_PAUSE`] of its commit. There is no notice to
//! lose, only a record to read: a waiter cannot miss an end.

use std::time::Duration;

use crate::clock::RealDeadline;

use crate::error::{Error, Result};
use crate::events::{Event, Hub};
use crate::ids::{GroupId, JobId};
use crate::job::Job;
use crate::job_store::ReadJobs;
use crate::workflow::Group;

/// The first pause between two looks of a wait.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The longest pause between two reads of a wait ([`crate::ReadJobs::wait_for`]): the most
/// after its commit that an end is seen.
pub const WAIT_MAX_PAUSE: Duration = Duration::from_millis(200);

/// [`crate::ReadJobs::wait_for`], hearing `hub`'s events where the store has them.
pub(crate) fn job(
    store: &(impl ReadJobs + ?Sized),
    hub: Option<&Hub>,
    id: JobId,
    timeout: Duration,
) -> Result<Option<Job>> {
    let hears = |e: &Event| match e {
        Event::Ended { job, state, .. } => *job == id && state.is_terminal(),
        Event::Expired { job, .. } => *job == id,
        _ => false,
    };
    until(hub, timeout, hears, || {
        let found = store.job(id)?.ok_or(Error::JobNotFound(id))?;
        Ok(found.state().is_terminal().then_some(found))
    })
}

/// [`crate::ReadJobs::wait_for_group`]. (No event tells a member's group: the group's
/// record is read at the pauses.)
pub(crate) fn group(
    store: &(impl ReadJobs + ?Sized),
    id: GroupId,
    timeout: Duration,
) -> Result<Option<Group>> {
    until(
        None,
        timeout,
        |_| false,
        || {
            let found = store.group(id)?.ok_or(Error::GroupNotFound(id))?;
            Ok(found.finished_at().is_some().then_some(found))
        },
    )
}

/// Looks until `look` finds what it waits for or `timeout` passes (`None`, after a last
/// look at the deadline). Of `hub`'s events, those `hears` names are a reason to look at
/// once.
fn until<T>(
    hub: Option<&Hub>,
    timeout: Duration,
    hears: impl Fn(&Event) -> bool,
    mut look: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = RealDeadline::after(timeout);
    // (subscribed before the first look: an end committed in between is heard)
    let events = hub.map(Hub::subscribe);
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        let next_look = RealDeadline::after(pause.min(deadline.remaining()));
        while !next_look.passed() {
            let left = next_look.remaining();
            let Some(events) = &events else {
                std::thread::sleep(left);
                break;
            };
            match events.next_within(left) {
                Some(event) if hears(&event) => break,
                Some(_) => continue,
                None => break,
            }
        }
        if deadline.passed() {
            return look();
        }
        pause = (pause * 2).min(WAIT_MAX_PAUSE);
    }
}
