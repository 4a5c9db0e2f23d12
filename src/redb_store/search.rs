//! Finding work in the indexes: the most urgent due job of a queue, the lease that expired
//! first, and the queues that have leases at all. Each is a few seeks, never a scan of jobs.

use redb::ReadableTable;

use crate::error::Result;
use crate::ids::{JobId, StoreTime};
use crate::state::JobState;

/// The first entry of `queue` in an expiry index, a writer's or a reader's, at or before
/// `bound`: the indexed expiry and its job.
pub(crate) fn first_expiry_entry(
    expiry: &impl ReadableTable<(&'static str, u64, u64), ()>,
    queue: &str,
    bound: u64,
) -> Result<Option<(StoreTime, JobId)>> {
    let first = expiry
        .range((queue, 0u64, 0u64)..=(queue, bound, u64::MAX))?
        .next()
        .transpose()?
        .map(|(key, _)| {
            let (_, at, id) = key.value();
            (StoreTime(at), JobId(id))
        });
    Ok(first)
}

/// The first due waiting job of the lowest priority: skips a priority whose earliest job is
/// not yet due (all of its jobs are later) with one seek.
pub(crate) fn next_ready(
    ready: &impl ReadableTable<(&'static str, i32, u64, u64), ()>,
    queue: &str,
    now: StoreTime,
) -> Result<Option<(i32, JobId)>> {
    let mut due = None;
    first_of_each_priority(ready, queue, |priority, run_at, id| {
        if run_at <= now.0 {
            due = Some((priority, JobId(id)));
        }
        due.is_none()
    })?;
    Ok(due)
}

/// Visits the first `ready` entry of each priority of `queue`, lowest priority first, one
/// seek each (the first entry of a priority has its earliest `run_at`), while `visit`
/// returns `true`. Works on a writer's index or a reader's.
pub(crate) fn first_of_each_priority(
    ready: &impl ReadableTable<(&'static str, i32, u64, u64), ()>,
    queue: &str,
    mut visit: impl FnMut(i32, u64, u64) -> bool,
) -> Result<()> {
    let mut from = i32::MIN;
    loop {
        let mut range =
            ready.range((queue, from, 0u64, 0u64)..=(queue, i32::MAX, u64::MAX, u64::MAX))?;
        let Some(entry) = range.next() else {
            return Ok(());
        };
        let (_, priority, run_at, id) = entry?.0.value();
        if !visit(priority, run_at, id) {
            return Ok(());
        }
        match priority.checked_add(1) {
            Some(p) => from = p,
            None => return Ok(()),
        }
    }
}

/// Queues that have running jobs, from the `counts` index (no scan of jobs).
pub(crate) fn running_queues(
    counts: &impl ReadableTable<(&'static str, u8), u64>,
) -> Result<Vec<String>> {
    let mut queues = Vec::new();
    for entry in counts.iter()? {
        let (key, _) = entry?;
        let (queue, state) = key.value();
        if state == JobState::Running.code() {
            queues.push(queue.to_owned());
        }
    }
    Ok(queues)
}
