//! Index maintenance, in one place so no operation can forget it.
//!
//! Every index entry is a pure function of a job record ([`entries`]). Writing a record goes
//! through [`save`], which removes the entries of the old version and adds those of the new
//! one; [`crate::ReadJobs::check`] recomputes the same function to prove the indexes match.

use crate::codec;
use crate::error::Result;
use crate::job::JobRecord;
use crate::redb_store::writing::{Tables, Tx};
use crate::state::JobState;

/// The index entries one job record implies, borrowing the record's strings (this runs twice
/// on every write, so it allocates nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entries<'a> {
    /// The job these entries belong to.
    pub id: u64,
    /// `ready`: (queue, priority, run_at, job) while waiting.
    pub ready: Option<(&'a str, i32, u64, u64)>,
    /// `expiry`: (queue, expires_at, job) while running.
    pub expiry: Option<(&'a str, u64, u64)>,
    /// `unique`: (queue, key) while not terminal, and after success for a window
    /// ([`crate::rules::keeps_key`]).
    pub unique: Option<(&'a str, &'a str)>,
    /// `finished`: (finished_at, job) once terminal.
    pub finished: Option<(u64, u64)>,
    /// `keyed`: (queue, limit key, run_at, job) while waiting with a limit key.
    pub keyed: Option<(&'a str, &'a str, u64, u64)>,
    /// `counts`: the (queue, state) this job is counted under.
    pub count: (&'a str, u8),
    /// `expiring`: (expires_at, job) while waiting or blocked with an expiry.
    pub expiring: Option<(u64, u64)>,
}

/// The entries `job` implies.
pub(crate) fn entries(job: &JobRecord) -> Entries<'_> {
    let id = job.id.0;
    let q = job.queue.as_str();
    // (the two orders' keys, as the rules name them)
    let (priority, run_at, _) = crate::rules::claim_order(job);
    let (key_run_at, _) = crate::rules::key_order(job);
    Entries {
        id,
        ready: crate::rules::in_claim_order(job).then_some((q, priority, run_at.0, id)),
        expiry: match (&job.state, &job.lease) {
            (JobState::Running, Some(l)) => Some((q, l.indexed_expiry.0, id)),
            _ => None,
        },
        unique: match &job.unique_key {
            Some(k) if crate::rules::keeps_key(job) => Some((q, k.as_str())),
            _ => None,
        },
        finished: match job.finished_at {
            Some(t) if job.state.is_terminal() => Some((t.0, id)),
            _ => None,
        },
        count: (q, job.state.code()),
        keyed: match &job.limit {
            Some(l) if job.state.is_waiting() => Some((q, l.key.as_str(), key_run_at.0, id)),
            _ => None,
        },
        expiring: match job.expires_at {
            Some(at) if job.state.is_waiting() || job.state == JobState::Blocked => {
                Some((at.0, id))
            }
            _ => None,
        },
    }
}

/// Writes `new` (replacing `old`, if the job existed) with all of its index entries, and
/// notes a queue that gained a claimable-soon job so the store can wake its waiting workers.
pub(crate) fn save(tx: &mut Tx<'_>, old: Option<&JobRecord>, new: &JobRecord) -> Result<()> {
    let after = entries(new);
    let before = old.map(entries);
    if after.ready.is_some()
        && before.as_ref().is_none_or(|b| b.ready != after.ready)
        && !tx.tally.readied.contains(&new.queue)
    {
        tx.tally.readied.insert(new.queue.clone());
    }
    if before.as_ref().is_none_or(|b| b.count != after.count) {
        if let Some(b) = &before {
            tx.tally.count(b.count, -1);
        }
        tx.tally.count(after.count, 1);
    }
    if let Some(before) = &before {
        remove_entries(&mut tx.tables, before, Some(&after))?;
    }
    add_entries(&mut tx.tables, &after, before.as_ref())?;
    if let Some(ending) = crate::rules::job_ending(old, new) {
        tx.tables.note_ending(&ending)?;
    }
    rewrite(tx, new)
}

/// Rewrites a job record whose change leaves every index entry as it was: for a renewal,
/// which touches only fields no entry is computed from (`lease.expires_at`, progress,
/// `updated_at`; see [`entries`]). Skips the copy of the old record and the comparison
/// [`save`] needs, which a heartbeat batch of a thousand leases pays a thousand times.
/// [`crate::ReadJobs::check`] would find an entry this left behind.
pub(crate) fn rewrite(tx: &mut Tx<'_>, job: &JobRecord) -> Result<()> {
    tx.tally.writes += 1;
    tx.tables
        .jobs
        .insert(job.id.0, codec::encode(job).as_slice())?;
    Ok(())
}

/// Deletes a job entirely: its record, every index entry, its payload, output and history.
pub(crate) fn delete(tx: &mut Tx<'_>, job: &JobRecord) -> Result<()> {
    tx.tally.writes += 1;
    let e = entries(job);
    remove_entries(&mut tx.tables, &e, None)?;
    tx.tally.count(e.count, -1);
    let id = job.id.0;
    tx.tables.jobs.remove(id)?;
    tx.tables.payloads.remove(id)?;
    tx.tables.outputs.remove(id)?;
    for attempt in 1..=job.attempt.0 {
        tx.tables.history.remove((id, attempt))?;
    }
    Ok(())
}

/// Removes the entries in `before` that `after` (the job's next version; `None` when it is
/// deleted) does not also have.
fn remove_entries(t: &mut Tables<'_>, before: &Entries, after: Option<&Entries>) -> Result<()> {
    let gone = |same: fn(&Entries, &Entries) -> bool| after.is_none_or(|a| !same(before, a));
    if let Some((q, p, r, id)) = &before.ready
        && gone(|b, a| b.ready == a.ready)
    {
        t.ready.remove((*q, *p, *r, *id))?;
    }
    if let Some((q, e, id)) = &before.expiry
        && gone(|b, a| b.expiry == a.expiry)
    {
        t.expiry.remove((*q, *e, *id))?;
    }
    if let Some((q, k)) = &before.unique
        && gone(|b, a| b.unique == a.unique)
    {
        t.unique.remove((*q, *k))?;
    }
    if let Some(key) = before.finished
        && gone(|b, a| b.finished == a.finished)
    {
        t.finished.remove(key)?;
    }
    if let Some(key) = before.keyed
        && gone(|b, a| b.keyed == a.keyed)
    {
        t.keyed()?.remove(key)?;
    }
    if let Some(key) = before.expiring
        && gone(|b, a| b.expiring == a.expiring)
    {
        t.expiring()?.remove(key)?;
    }
    Ok(())
}

/// Adds the entries in `after` that `before` (if the job existed) did not already have.
fn add_entries(t: &mut Tables<'_>, after: &Entries, before: Option<&Entries>) -> Result<()> {
    let new = |same: fn(&Entries, &Entries) -> bool| before.is_none_or(|b| !same(b, after));
    if let Some((q, p, r, id)) = &after.ready
        && new(|b, a| b.ready == a.ready)
    {
        t.ready.insert((*q, *p, *r, *id), ())?;
    }
    if let Some((q, e, id)) = &after.expiry
        && new(|b, a| b.expiry == a.expiry)
    {
        t.expiry.insert((*q, *e, *id), ())?;
    }
    if let Some((q, k)) = &after.unique
        && new(|b, a| b.unique == a.unique)
    {
        t.unique.insert((*q, *k), after.id)?;
    }
    if let Some(key) = after.finished
        && new(|b, a| b.finished == a.finished)
    {
        t.finished.insert(key, ())?;
    }
    if let Some(key) = after.keyed
        && new(|b, a| b.keyed == a.keyed)
    {
        t.keyed()?.insert(key, ())?;
    }
    if let Some(key) = after.expiring
        && new(|b, a| b.expiring == a.expiring)
    {
        t.expiring()?.insert(key, ())?;
    }
    Ok(())
}
