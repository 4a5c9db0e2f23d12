//! Jobs that wait for jobs, in the transaction that changes them: a new job's dependencies
//! found and linked, the release that every end of an awaited job makes ([`settle`]), the
//! re-arming a retry makes ([`unsettle`]); groups' own calls are `group.rs`'s. What becomes
//! of each waiter and group is the rule book's ([`crate::rules`]).
//!
//! The release is part of the end that causes it: [`super::attempt::store_end`] (every end
//! of an attempt, past the fence) and a cancel call [`settle`] in their own transaction, so
//! a fenced-out holder's completion never releases anyone, and an end that commits has
//! released its waiters with it.

use super::Records;
use crate::error::{Error, Result};
use crate::ids::{GroupId, JobId, StoreTime};
use crate::job::JobRecord;
use crate::new_job::NewJob;
use crate::rules;
use crate::state::JobState;
use crate::workflow::{GroupRecord, Need, Target};

/// A new job's dependencies as they stand, and the group it joins, checked before anything
/// is written: each dependency exists (a job, or a sealed group; the open group's own
/// callbacks excepted), and the group is open. Returns `job` as it is to be stored
/// ([`rules::waiting`]) and its group with the member added (to store once the job is).
pub(super) fn links(
    r: &mut (impl Records + ?Sized),
    new: &NewJob,
    job: JobRecord,
    callback: bool,
    now: StoreTime,
    held: Option<&GroupRecord>,
) -> Result<(JobRecord, Option<GroupRecord>)> {
    if new.needs.is_empty() && new.group.is_none() {
        return Ok((job, None));
    }
    let mut needs = Vec::with_capacity(new.needs.len());
    let mut to_mark = Vec::new();
    for &(on, require) in &new.needs {
        let ended = match on {
            Target::Job(id) => {
                let dep = r.job(id)?.ok_or(Error::DependencyNotFound(id))?;
                refuse_open_callback(r, &dep)?;
                match dep.state.is_terminal() {
                    true => Some(dep.state),
                    false if !dep.flow.awaited => {
                        to_mark.push(dep);
                        None
                    }
                    false => None,
                }
            }
            Target::Group(g) => {
                let group = r.group(g)?.ok_or(Error::GroupNotFound(g))?;
                if !group.sealed && !callback {
                    return Err(Error::GroupOpen(g));
                }
                group.outcome()
            }
        };
        needs.push(Need { on, require, ended });
    }
    let joined = match (new.group, held) {
        (Some(g), Some(held)) if held.id == g => Some(rules::joined(held)?),
        (Some(g), _) => Some(rules::joined(&r.group(g)?.ok_or(Error::GroupNotFound(g))?)?),
        (None, _) => None,
    };
    for dep in to_mark {
        mark_awaited(r, &dep)?;
    }
    Ok((rules::waiting(job, needs, new.group, now), joined))
}

/// Marks `dep` awaited: its ends go through the protocol and reach what waits for it.
fn mark_awaited(r: &mut (impl Records + ?Sized), dep: &JobRecord) -> Result<()> {
    let mut awaited = dep.clone();
    awaited.flow.awaited = true;
    super::keys::save(r, dep, &awaited).map(drop)
}

/// A job that waits for an open group (one of its callbacks) cannot be waited for until the
/// group is sealed: a member of that group waiting for it would make a cycle.
fn refuse_open_callback(r: &mut (impl Records + ?Sized), dep: &JobRecord) -> Result<()> {
    for need in &dep.flow.needs {
        if let Target::Group(g) = need.on
            && r.group(g)?.is_some_and(|group| !group.sealed)
        {
            return Err(Error::GroupOpen(g));
        }
    }
    Ok(())
}

/// The rest of a new job's links, once it is stored under its id: its group's count, the
/// groups it waits for (each lists it among its waiters, also one that had ended already,
/// whose end the job's need counted at once), and, if it was cancelled at once (a
/// dependency had died), that end.
pub(super) fn linked(
    r: &mut (impl Records + ?Sized),
    job: &JobRecord,
    joined: Option<GroupRecord>,
    callback: bool,
) -> Result<()> {
    if let Some(group) = joined {
        r.save_group(&group)?;
    }
    for need in &job.flow.needs {
        if let Target::Group(g) = need.on {
            let group = r.group(g)?.ok_or(Error::GroupNotFound(g))?;
            r.save_group(&rules::waited_for(&group, job.id, callback)?)?;
        }
    }
    settle(r, job)
}

/// What the end of `job` moves, in the transaction that ends it: its group's count (and the
/// group's own end, once sealed and complete) and every job that waits for it or for that
/// group, each released, cancelled (which is an end in turn) or left blocked by the rule.
/// Nothing for a job that is not terminal or that nothing awaits.
pub(crate) fn settle(r: &mut (impl Records + ?Sized), job: &JobRecord) -> Result<()> {
    if !job.state.is_terminal() || !job.flow.awaited {
        return Ok(());
    }
    walk(r, vec![(Target::Job(job.id), job.state, job.flow.group)])
}

/// [`settle`] for many ends at once (a batch of completions), each already stored: what
/// ended, how, and the group it is a member of. A group counts the batch's ends of its
/// members with one write.
pub(crate) fn settle_all(
    r: &mut (impl Records + ?Sized),
    ended: &[(JobId, JobState, Option<GroupId>)],
) -> Result<()> {
    walk(
        r,
        ended
            .iter()
            .map(|&(id, s, g)| (Target::Job(id), s, g))
            .collect(),
    )
}

/// What ended, how, and the group it was a member of.
type Ended = (Target, JobState, Option<GroupId>);

/// Settles each end in `ended` and every end it causes in turn, a round at a time: each
/// group counts a round's ends of its members with one write, and the jobs waiting for a
/// round's jobs are found with one search.
pub(super) fn walk(r: &mut (impl Records + ?Sized), mut ended: Vec<Ended>) -> Result<()> {
    let now = r.now()?;
    while !ended.is_empty() {
        let round = std::mem::take(&mut ended);
        let mut counted: std::collections::BTreeMap<GroupId, Vec<JobState>> = Default::default();
        for &(_, state, group) in &round {
            if let Some(g) = group {
                counted.entry(g).or_default().push(state);
            }
        }
        for (g, states) in counted {
            let Some(mut group) = r.group(g)? else {
                continue;
            };
            let (mut changed, mut over) = (false, false);
            for state in states {
                if let Some((next, ends)) = rules::member_ended(&group, state, now) {
                    (group, changed, over) = (next, true, over || ends);
                }
            }
            if changed {
                r.save_group(&group)?;
            }
            if let (true, Some(outcome)) = (over, group.outcome()) {
                // (a group that is a member of another ends as one of its members there)
                ended.push((Target::Group(g), outcome, group.parent));
            }
        }
        let found = waiting_for(r, &round)?;
        // Every waiter of the round loaded at once (held for writing), then each moved on
        // (one that waits for two of the round's ends sees both), then stored at once.
        let mut ids: Vec<JobId> = found.iter().map(|&(_, _, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        let loaded = r.jobs(&ids)?;
        let mut waiters: std::collections::BTreeMap<JobId, (JobRecord, JobRecord)> = (loaded
            .into_iter())
        .map(|j| (j.id, (j.clone(), j)))
        .collect();
        let mut moved = std::collections::BTreeSet::new();
        for (target, state, id) in found {
            let Some((_, waiter)) = waiters.get_mut(&id) else {
                continue;
            };
            let Some(new) = rules::dependency_ended(waiter, target, state, now) else {
                continue;
            };
            if new.state.is_terminal() && new.flow.awaited {
                ended.push((Target::Job(new.id), new.state, new.flow.group));
            }
            *waiter = new;
            moved.insert(id);
        }
        // Stored at once, each as it stands after the round.
        let changes: Vec<(JobRecord, JobRecord)> = (waiters.into_iter())
            .filter(|(id, _)| moved.contains(id))
            .map(|(_, change)| change)
            .collect();
        super::keys::save_all(r, &changes)?;
    }
    Ok(())
}

/// Every job that waits for what `round` ended: (what, how it ended, the waiter).
fn waiting_for(
    r: &mut (impl Records + ?Sized),
    round: &[Ended],
) -> Result<Vec<(Target, JobState, JobId)>> {
    let mut how = std::collections::HashMap::new();
    let mut found = Vec::new();
    for &(target, state, _) in round {
        match target {
            Target::Job(id) => {
                how.insert(id, state);
            }
            Target::Group(g) => {
                let waiters = r.group(g)?.map(|g| g.waiters).unwrap_or_default();
                found.extend(waiters.into_iter().map(|w| (target, state, w)));
            }
        }
    }
    if !how.is_empty() {
        let jobs: Vec<JobId> = how.keys().copied().collect();
        for (dep, waiter) in r.waiters(&jobs)? {
            if let Some(&state) = how.get(&dep) {
                found.push((Target::Job(dep), state, waiter));
            }
        }
    }
    Ok(found)
}

/// What a job's return from `was` (dead or cancelled) to the queue moves: its group counts
/// it no more (unless the group ended), and the waiters its end had cancelled wait again,
/// with theirs in turn ([`rules::rearmed`]). A job a waiter waits for again is marked
/// awaited, so that its next end reaches the waiter: a waiter made after it had ended did
/// not mark it (see [`links`]). The same transaction as the retry.
pub(crate) fn unsettle(
    r: &mut (impl Records + ?Sized),
    job: &JobRecord,
    was: JobState,
) -> Result<()> {
    let now = r.now()?;
    let mut back = vec![(job.id, was, job.flow.group)];
    while let Some((id, was, group)) = back.pop() {
        if let Some(g) = group
            && let Some(group) = r.group(g)?
            && let Some(uncounted) = rules::member_back(&group, was)
        {
            r.save_group(&uncounted)?;
        }
        for (_, waiter_id) in r.waiters(&[id])? {
            let Some(waiter) = r.job(waiter_id)? else {
                continue;
            };
            let fresh = standing(r, &waiter)?;
            let Some(new) = rules::rearmed(&waiter, Target::Job(id), fresh, now) else {
                continue;
            };
            super::keys::save(r, &waiter, &new)?;
            back.push((new.id, waiter.state, new.flow.group));
            if let Some(dep) = r.job(id)?.filter(|d| !d.flow.awaited) {
                mark_awaited(r, &dep)?;
            }
        }
    }
    Ok(())
}

/// `waiter`'s needs as they stand now, each looked up anew.
fn standing(r: &mut (impl Records + ?Sized), waiter: &JobRecord) -> Result<Vec<Need>> {
    let mut fresh = waiter.flow.needs.clone();
    for need in &mut fresh {
        need.ended = match need.on {
            Target::Job(id) => r.job(id)?.map(|j| j.state).filter(|s| s.is_terminal()),
            Target::Group(g) => r.group(g)?.and_then(|g| g.outcome()),
        };
    }
    Ok(fresh)
}
