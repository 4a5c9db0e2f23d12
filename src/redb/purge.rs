//! Purging finished jobs on redb: a bounded batch at a time along the `finished` index (by
//! finish time), each batch starting just past the last entry the one before looked at.

use redb::ReadableTable;

use crate::batches::Batch;
use crate::error::Result;
use crate::ids::{JobId, StoreTime};
use crate::job::JobState;
use crate::redb_store::index;
use crate::redb_store::writing::{Tx, load};

/// A position in the `finished` index: (finished at, job).
pub(crate) type FinishedKey = (u64, u64);

/// Deletes the terminal jobs in `states` that finished at or before `cutoff`, with their
/// history, looking at up to `limit` of them from the `finished` key `from`; returns the
/// batch (the jobs it deleted, the entries it looked at) and the key the next batch starts
/// from: just past the last entry looked at, so that no entry is looked at twice, kept ones
/// included, even when a full batch ends exactly at the end of the range.
pub(crate) fn purge(
    tx: &mut Tx<'_>,
    from: FinishedKey,
    cutoff: StoreTime,
    states: &[JobState],
    limit: usize,
) -> Result<(Batch<JobId>, FinishedKey)> {
    let mut due = Vec::new();
    let (mut last, mut looked) = (None, 0);
    // Every entry looked at counts against the batch, kept ones too (dead jobs, say), so a
    // batch's work stays bounded.
    for entry in tx
        .tables
        .finished
        .range(from..=(cutoff.0, u64::MAX))?
        .take(limit)
    {
        let key = entry?.0.value();
        (last, looked) = (Some(key), looked + 1);
        let job = load(tx, JobId(key.1))?;
        if states.contains(&job.state) {
            due.push(job);
        }
    }
    for job in &due {
        index::delete(tx, job)?;
    }
    let next = last.map_or(from, just_after);
    let items = due.iter().map(|j| j.id).collect();
    Ok((Batch { items, looked }, next))
}

/// The first `finished` key after `key`.
fn just_after((at, id): FinishedKey) -> FinishedKey {
    match id.checked_add(1) {
        Some(id) => (at, id),
        None => (at.saturating_add(1), 0),
    }
}
