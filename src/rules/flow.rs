//! Jobs that wait for jobs ([`crate::workflow`]): where a waiting job stands as its
//! dependencies end, and how a group counts its members' ends.

use super::attempt::finish;
use crate::endings::{EndOf, EndRecord};
use crate::error::Error;
use crate::ids::{GroupId, JobId, StoreTime};
use crate::job::JobRecord;
use crate::new_job::NewGroup;
use crate::state::JobState;
use crate::workflow::{
    GroupRecord, MAX_GROUP_MEMBERS, MAX_GROUP_WAITERS, MAX_SUBGROUPS, Need, Target,
};

/// A new job's record with its dependencies as they stand (`needs`, each found, those over
/// already marked with how they ended) and its group: blocked while one is open, cancelled
/// at once if one ended otherwise than required, else as it was.
pub(crate) fn waiting(
    mut job: JobRecord,
    needs: Vec<Need>,
    group: Option<GroupId>,
    now: StoreTime,
) -> JobRecord {
    job.flow.needs = needs;
    job.flow.group = group;
    job.flow.awaited = group.is_some();
    if !job.flow.needs.is_empty() {
        job.state = JobState::Blocked;
        stand(&mut job, now);
    }
    job
}

/// Moves a blocked `job` on as its needs stand: cancelled (its error naming the first
/// dependency that ended otherwise than required), still blocked while one is open, or
/// queued, due at its own run time or now, whichever is later.
fn stand(job: &mut JobRecord, now: StoreTime) {
    if let Some(broken) = job.flow.needs.iter().find(|n| n.broken()) {
        let state = broken.ended.map_or("", JobState::name);
        job.last_error = Some(format!("a dependency died: {} ended {state}", broken.on));
        finish(job, JobState::Cancelled, now);
    } else if job.flow.needs.iter().all(Need::met) {
        job.state = JobState::Queued;
        job.run_at = job.run_at.max(now);
    }
    job.updated_at = now;
}

/// `waiter` once `target` ended in `state`: released, cancelled or still blocked; `None`
/// if that changes nothing (it no longer waits, or saw this end already). Each end is seen
/// once, so no waiter is released twice.
pub(crate) fn dependency_ended(
    waiter: &JobRecord,
    target: Target,
    state: JobState,
    now: StoreTime,
) -> Option<JobRecord> {
    if waiter.state != JobState::Blocked {
        return None;
    }
    let mut new = waiter.clone();
    let mut saw = false;
    for need in new.flow.needs.iter_mut() {
        if need.on == target && need.ended.is_none() {
            need.ended = Some(state);
            saw = true;
        }
    }
    saw.then(|| {
        stand(&mut new, now);
        new
    })
}

/// `waiter`, cancelled because `target` ended otherwise than required, once `target` runs
/// again (an operator retried it): blocked again with its needs as they stand now (`fresh`,
/// each looked up anew: a dependency that ended while it was cancelled is seen). `None` if
/// `target` is not why it was cancelled, or if another dependency still is.
pub(crate) fn rearmed(
    waiter: &JobRecord,
    target: Target,
    fresh: Vec<Need>,
    now: StoreTime,
) -> Option<JobRecord> {
    let cancelled_by = |n: &Need| n.on == target && n.broken();
    if waiter.state != JobState::Cancelled || !waiter.flow.needs.iter().any(cancelled_by) {
        return None;
    }
    let mut new = waiter.clone();
    new.flow.needs = fresh;
    new.state = JobState::Blocked;
    new.finished_at = None;
    new.last_error = None;
    stand(&mut new, now);
    (new.state != JobState::Cancelled).then_some(new)
}

// ----- groups -----

/// A new, open group.
/// The ending `group`'s save writes, if it ends there: it was open (`was_open`) and has
/// ended now ([`crate::endings`]).
pub(crate) fn group_ending(was_open: bool, group: &GroupRecord) -> Option<EndRecord> {
    let at = group.finished_at.filter(|_| was_open)?;
    Some(EndRecord {
        of: EndOf::Group(group.id),
        state: group.outcome()?,
        at,
    })
}

/// Whether retention may delete `group` at `cutoff`: it ended at or before the cutoff, and
/// nothing refers to it any more (`referred`: a member, a job that waited for it, a group in
/// it is still stored; each is purged first, a dead member never by retention). Its record is
/// what its members' pages, its callbacks' `ctx.group()` and its key answer from.
pub(crate) fn purgeable_group(group: &GroupRecord, cutoff: StoreTime, referred: bool) -> bool {
    group.finished_at.is_some_and(|at| at <= cutoff) && !referred
}

pub(crate) fn new_group(id: GroupId, now: StoreTime) -> GroupRecord {
    GroupRecord {
        id,
        created_at: now,
        sealed: false,
        finished_at: None,
        members: 0,
        succeeded: 0,
        dead: 0,
        cancelled: 0,
        waiters: Vec::new(),
        parent: None,
        subgroups: Vec::new(),
        key: None,
    }
}

/// `group` with one member more; refused once it is sealed or full.
pub(crate) fn joined(group: &GroupRecord) -> Result<GroupRecord, Error> {
    if group.sealed {
        return Err(Error::GroupSealed(group.id));
    }
    if group.members >= MAX_GROUP_MEMBERS {
        return Err(Error::GroupLimit {
            group: group.id,
            limit: "members",
            max: MAX_GROUP_MEMBERS,
        });
    }
    let mut new = group.clone();
    new.members += 1;
    Ok(new)
}

/// `parent` with the new group `child` as one member more; refused once it is sealed or
/// full (of members, or of groups).
pub(crate) fn joined_by_group(parent: &GroupRecord, child: GroupId) -> Result<GroupRecord, Error> {
    let mut new = joined(parent)?;
    if new.subgroups.len() >= MAX_SUBGROUPS {
        return Err(Error::GroupLimit {
            group: parent.id,
            limit: "subgroups",
            max: MAX_SUBGROUPS as u64,
        });
    }
    new.subgroups.push(child);
    Ok(new)
}

/// `group` with `waiter` waiting for it. Only a sealed group can be waited for, but by the
/// callbacks [`JobStore::open_group`](crate::JobStore::open_group) makes with it
/// (`callback`): a member added later could otherwise wait for a job that waits for its own
/// group, and the group would never end.
pub(crate) fn waited_for(
    group: &GroupRecord,
    waiter: JobId,
    callback: bool,
) -> Result<GroupRecord, Error> {
    if !group.sealed && !callback {
        return Err(Error::GroupOpen(group.id));
    }
    if group.waiters.len() >= MAX_GROUP_WAITERS {
        return Err(Error::GroupLimit {
            group: group.id,
            limit: "waiters",
            max: MAX_GROUP_WAITERS as u64,
        });
    }
    let mut new = group.clone();
    new.waiters.push(waiter);
    Ok(new)
}

/// `group` once a member ended in `state`, and whether the group ended with it. A group
/// that ended counts no more: its callbacks ran on the counts it ended with.
pub(crate) fn member_ended(
    group: &GroupRecord,
    state: JobState,
    now: StoreTime,
) -> Option<(GroupRecord, bool)> {
    if group.finished_at.is_some() {
        return None;
    }
    let mut new = group.clone();
    match state {
        JobState::Succeeded => new.succeeded += 1,
        JobState::Dead => new.dead += 1,
        // (to its group an expired member is a cancelled one)
        JobState::Cancelled | JobState::Expired => new.cancelled += 1,
        _ => return None,
    }
    let ended = ends(&mut new, now);
    Some((new, ended))
}

/// `group` once a member that ended in `state` runs again (retried, or re-armed): no
/// longer counted, unless the group ended already.
pub(crate) fn member_back(group: &GroupRecord, state: JobState) -> Option<GroupRecord> {
    if group.finished_at.is_some() {
        return None;
    }
    let mut new = group.clone();
    let count = match state {
        JobState::Succeeded => &mut new.succeeded,
        JobState::Dead => &mut new.dead,
        JobState::Cancelled | JobState::Expired => &mut new.cancelled,
        _ => return None,
    };
    *count = count.checked_sub(1)?;
    Some(new)
}

/// `group` sealed (no member may join any more), and whether it ended with it (every
/// member had ended already, or it has none).
pub(crate) fn sealed(group: &GroupRecord, now: StoreTime) -> (GroupRecord, bool) {
    let mut new = group.clone();
    new.sealed = true;
    let ended = ends(&mut new, now);
    (new, ended)
}

/// Ends `group` if it is sealed and every member has ended; whether it did.
fn ends(group: &mut GroupRecord, now: StoreTime) -> bool {
    let ends = group.sealed && group.finished_at.is_none() && group.ended() == group.members;
    if ends {
        group.finished_at = Some(now);
    }
    ends
}

/// Refuses callbacks that would join a group (a callback is no group's member).
pub(crate) fn check_callbacks(new: &NewGroup) -> Result<(), Error> {
    for job in new.on_complete.iter().chain(&new.on_success) {
        if job.group.is_some() {
            return Err(Error::Input(crate::error::InputError::CallbackInGroup));
        }
    }
    Ok(())
}
