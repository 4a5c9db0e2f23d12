//! Finding work in the indexes: the most urgent due job of a queue, the lease that expired
//! first, and the queues that have leases at all. Each is a few seeks, never a scan of jobs.

use redb::ReadableTable;

use crate::error::Result;
use crate::ids::{JobId, StoreTime};
use crate::job::{JobRecord, JobState};
use crate::redb_store::index;
use crate::redb_store::writing::Tx;

/// The job of `queue` whose index entry says its lease expires first, at or before `bound`.
/// The entry may lag a renewal (see [`crate::job::LeaseRecord`]), so callers check the record.
pub(crate) fn first_indexed_expiry(tx: &Tx<'_>, queue: &str, bound: u64) -> Result<Option<JobId>> {
    Ok(first_expiry_entry(&tx.tables.expiry, queue, bound)?.map(|(_, id)| id))
}

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

pub(crate) fn lease_expired(job: &JobRecord, now: StoreTime) -> bool {
    job.state == JobState::Running && job.lease.as_ref().is_some_and(|l| l.expires_at <= now)
}

/// The first due waiting job of the lowest priority: skips a priority whose earliest job is
/// not yet due (all of its jobs are later) with one seek.
pub(crate) fn next_ready(tx: &Tx<'_>, queue: &str) -> Result<Option<(i32, JobId)>> {
    let mut due = None;
    first_of_each_priority(&tx.tables.ready, queue, |priority, run_at, id| {
        if run_at <= tx.now.0 {
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

/// The running job of `queue` whose lease expired first, if any has: by the real expiry,
/// ties by job id. Entries that lag a renewal are caught up on the way (and looked at again
/// in their real place), so a renewed lease never jumps ahead of one that expired before it.
pub(crate) fn next_expired(tx: &mut Tx<'_>, queue: &str) -> Result<Option<JobId>> {
    loop {
        let Some(id) = first_indexed_expiry(tx, queue, tx.now.0)? else {
            return Ok(None);
        };
        let job = crate::redb_store::writing::load(tx, id)?;
        let in_place = job
            .lease
            .as_ref()
            .is_some_and(|l| l.indexed_expiry == l.expires_at);
        if in_place && lease_expired(&job, tx.now) {
            return Ok(Some(id));
        }
        catch_up(tx, job)?;
    }
}

/// Moves a renewed lease's index entry to its real expiry (see [`crate::job::LeaseRecord`]).
pub(crate) fn catch_up(tx: &mut Tx<'_>, job: JobRecord) -> Result<()> {
    let mut moved = job.clone();
    match moved.lease.as_mut() {
        Some(lease) => lease.indexed_expiry = lease.expires_at,
        None => return Err(crate::rules::corrupt_running(&job)),
    }
    index::save(tx, Some(&job), &moved)
}

/// Queues that have running jobs, from the `counts` index (no scan of jobs).
pub(crate) fn running_queues(tx: &Tx<'_>) -> Result<Vec<String>> {
    let mut queues = Vec::new();
    for entry in tx.tables.counts.iter()? {
        let (key, _) = entry?;
        let (queue, state) = key.value();
        if state == JobState::Running.code() {
            queues.push(queue.to_owned());
        }
    }
    Ok(queues)
}
