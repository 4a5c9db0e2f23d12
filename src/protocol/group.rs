//! Groups, in the transaction that changes them: opened with their callbacks, members
//! enqueued, sealed, cancelled. A member's end is counted by [`super::flow::settle`], as
//! every end of a job that something waits for is.

use super::Records;
use super::flow::walk;
use super::operate::{after, enqueue_as};
use crate::batches::Batch;
use crate::error::{Error, Result};
use crate::ids::{GroupId, JobId, StoreTime};
use crate::new_job::NewGroup;
use crate::new_job::NewJob;
use crate::rules;
use crate::state::JobState;
use crate::workflow::{GroupRecord, Target};

/// The group `new`'s key already names, if it has a key and one does ([`NewGroup::key`]):
/// opening it again makes nothing. The key is held until the transaction ends, so two
/// openings of one key are one after the other.
pub(crate) fn keyed_group(
    r: &mut (impl Records + ?Sized),
    new: &NewGroup,
) -> Result<Option<GroupId>> {
    match &new.key {
        Some(key) => {
            crate::input::check_group_key(key)?;
            r.group_of_key(key)
        }
        None => Ok(None),
    }
}

/// Opens a group with its callbacks, each a job blocked until the group ends
/// ([`NewGroup`]), keeps its key, and makes it a member of its parent group if it has one.
/// Returns the group's id. (A keyed group is looked up first: [`keyed_group`].)
pub(crate) fn open_group(r: &mut (impl Records + ?Sized), new: &NewGroup) -> Result<GroupId> {
    rules::check_callbacks(new)?;
    let max_payload = r.policy().max_payload;
    let any_end = new.on_complete.iter().map(|job| (job, true));
    let callbacks: Vec<(&NewJob, bool)> = any_end
        .chain(new.on_success.iter().map(|job| (job, false)))
        .collect();
    for (job, _) in &callbacks {
        crate::input::check_new_job(job, max_payload)?;
    }
    let parent = match new.parent {
        Some(p) => Some(r.group(p)?.ok_or(Error::GroupNotFound(p))?),
        None => None,
    };
    if let Some(parent) = &parent {
        // Refused before anything is made (an engine's id sequence keeps no gap for it).
        rules::joined_by_group(parent, GroupId(0))?;
    }
    let now = r.now()?;
    let mut record = rules::new_group(GroupId(0), now);
    record.parent = new.parent;
    record.key = new.key.clone();
    let id = r.insert_group(record)?;
    if let Some(parent) = parent {
        r.save_group(&rules::joined_by_group(&parent, id)?)?;
    }
    if let Some(key) = &new.key {
        r.save_group_key(key, id)?;
    }
    for (job, any_end) in callbacks {
        let require = match any_end {
            true => crate::workflow::Require::any_end(),
            false => crate::workflow::Require::success(),
        };
        let callback = job.clone().after_with(Target::Group(id), require);
        enqueue_as(r, &callback, true, None)?;
    }
    Ok(id)
}

/// Enqueues `members` into the open group `id`, its record read and written once for all
/// of them (each member is enqueued as [`super::enqueue`] would, with its group set).
pub(crate) fn enqueue_members(
    r: &mut (impl Records + ?Sized),
    id: GroupId,
    members: &[NewJob],
) -> Result<Vec<JobId>> {
    let mut group = r.group(id)?.ok_or(Error::GroupNotFound(id))?;
    let mut ids = Vec::with_capacity(members.len());
    for member in members {
        let member = NewJob {
            group: Some(id),
            ..member.clone()
        };
        ids.push(enqueue_as(r, &member, false, Some(&mut group))?);
    }
    r.save_group(&group)?;
    Ok(ids)
}

/// Seals a group: no job joins it any more, and it ends once every member has (at once,
/// if every one has). Sealing a sealed group changes nothing.
pub(crate) fn seal_group(r: &mut (impl Records + ?Sized), id: GroupId) -> Result<()> {
    let group = r.group(id)?.ok_or(Error::GroupNotFound(id))?;
    if group.sealed {
        return Ok(());
    }
    let (sealed, over) = rules::sealed(&group, r.now()?);
    r.save_group(&sealed)?;
    match (over, sealed.outcome()) {
        (true, Some(outcome)) => walk(r, vec![(Target::Group(id), outcome, sealed.parent)]),
        _ => Ok(()),
    }
}

/// Cancels a group: its callbacks (and whatever waits for it) cancelled first, so that none
/// runs; then sealed; then every member not yet ended cancelled (waiting ones at once,
/// running ones at their next heartbeat, as [`super::cancel`] does), and every group that
/// is its member cancelled the same way, and theirs in turn. Returns how many jobs it
/// cancelled or flagged.
pub(crate) fn cancel_group(r: &mut (impl Records + ?Sized), id: GroupId) -> Result<usize> {
    let mut changed = 0;
    let mut groups = vec![id];
    while let Some(id) = groups.pop() {
        let group = r.group(id)?.ok_or(Error::GroupNotFound(id))?;
        for &waiter in &group.waiters {
            if r.job(waiter)?.is_some_and(|j| j.state == JobState::Blocked) {
                changed += usize::from(super::cancel(r, waiter)?.1);
            }
        }
        seal_group(r, id)?;
        for member in r.members(id)? {
            if r.job(member)?.is_some_and(|j| !j.state.is_terminal()) {
                changed += usize::from(super::cancel(r, member)?.1);
            }
        }
        groups.extend(group.subgroups.iter().rev());
    }
    Ok(changed)
}

/// Deletes the groups that ended at or before `cutoff` and that nothing refers to any more
/// ([`rules::purgeable_group`]), looking at up to `limit` ended groups from position `from`
/// on; returns the batch (the groups it deleted, the groups it looked at) and the position
/// the next batch starts from, just past the last one looked at.
pub(crate) fn purge_groups(
    r: &mut (impl Records + ?Sized),
    from: (StoreTime, GroupId),
    cutoff: StoreTime,
    limit: usize,
) -> Result<(Batch<GroupId>, (StoreTime, GroupId))> {
    let ended = r.ended_groups(from, cutoff, limit)?;
    let next = (ended.last())
        .and_then(|g| Some(after(g.finished_at?, g.id.0, GroupId)))
        .unwrap_or(from);
    let mut items = Vec::new();
    for group in &ended {
        if rules::purgeable_group(group, cutoff, referred(r, group)?) {
            r.delete_group(group)?;
            items.push(group.id);
        }
    }
    let looked = ended.len();
    Ok((Batch { items, looked }, next))
}

/// Whether anything stored still refers to `group`: a member, a job that waits or waited
/// for it, a group in it.
fn referred(r: &mut (impl Records + ?Sized), group: &GroupRecord) -> Result<bool> {
    if !r.members(group.id)?.is_empty() {
        return Ok(true);
    }
    for &waiter in &group.waiters {
        if r.job(waiter)?.is_some() {
            return Ok(true);
        }
    }
    for &sub in &group.subgroups {
        if r.group(sub)?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}
