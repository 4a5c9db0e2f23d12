//! Plain data of jobs that wait for jobs: a job's dependencies ([`crate::NewJob::after`]) and
//! groups of jobs with callbacks that run once every member has ended ([`crate::NewGroup`]). What
//! releases a waiting job is decided in [`crate::rules`] and done by the protocol in the
//! same transaction as the end that releases it.
//!
//! A waiting job is [`JobState::Blocked`]. It becomes `Queued` when each of its dependencies
//! has ended as it requires ([`Require`]), or `Cancelled` (its error naming the dependency)
//! as soon as one ended otherwise: nothing waits for ever. A group counts its members' ends;
//! once it is sealed and every member has ended it *ends* itself, as `Succeeded` when every
//! member succeeded and otherwise as `Dead` (some member died) or `Cancelled`, and its
//! callbacks are jobs that wait for it like for any other dependency.
//!
//! Cycles cannot be made: a job can only wait for jobs and groups that exist when it is
//! enqueued, and its dependencies never change afterwards, so every edge points from a
//! newer job to an older one (or to a group made before it).

use std::fmt;

use bincode::{Decode, Encode};

use crate::ids::{GroupId, JobId, StoreTime};
use crate::state::JobState;

/// The most dependencies one job may have.
pub const MAX_DEPENDENCIES: usize = 64;
/// The most members one group may have.
pub const MAX_GROUP_MEMBERS: u64 = 100_000;
/// The most jobs that may wait for one group (its callbacks among them).
pub const MAX_GROUP_WAITERS: usize = 64;
/// The most groups that may be members of one group ([`crate::NewGroup::in_group`]).
pub const MAX_SUBGROUPS: usize = 1_000;

/// How a dependency must end for its waiter to run. Success always counts; a dependency
/// that ends otherwise, unless accepted here, cancels the waiter. (Oban's `ignore_discarded`
/// and `ignore_cancelled`.)
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Encode, Decode)]
pub struct Require {
    dead: bool,
    cancelled: bool,
}

impl Require {
    /// Only success (the default).
    pub fn success() -> Require {
        Require::default()
    }

    /// Any end: succeeded, dead or cancelled ("when it is over, whatever happened").
    pub fn any_end() -> Require {
        Require {
            dead: true,
            cancelled: true,
        }
    }

    /// Also accepts a dependency that died (its retry budget spent, or failed permanently).
    pub fn or_dead(mut self) -> Require {
        self.dead = true;
        self
    }

    /// Also accepts a dependency that was cancelled (or expired: see
    /// [`JobState::Expired`]).
    pub fn or_cancelled(mut self) -> Require {
        self.cancelled = true;
        self
    }

    /// Whether a dependency that ended in `state` lets the waiter run.
    pub fn accepts(self, state: JobState) -> bool {
        match state {
            JobState::Succeeded => true,
            JobState::Dead => self.dead,
            // (an expired job never ran: to what waits for it, it was cancelled)
            JobState::Cancelled | JobState::Expired => self.cancelled,
            _ => false,
        }
    }
}

impl fmt::Display for Require {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.dead, self.cancelled) {
            (false, false) => "success",
            (true, false) => "success or death",
            (false, true) => "success or cancel",
            (true, true) => "any end",
        })
    }
}

/// What a job waits for: another job, or a group's end.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum Target {
    /// A job.
    Job(JobId),
    /// A group: it ends once it is sealed and every member has ended.
    Group(GroupId),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Job(id) => write!(f, "job {id}"),
            Target::Group(id) => write!(f, "group {id}"),
        }
    }
}

/// One dependency of a job, as stored and read ([`crate::Job::needs`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Need {
    pub(crate) on: Target,
    pub(crate) require: Require,
    /// How it ended; `None` while it has not.
    pub(crate) ended: Option<JobState>,
}

impl Need {
    /// What is waited for.
    pub fn on(&self) -> Target {
        self.on
    }

    /// How it must end.
    pub fn require(&self) -> Require {
        self.require
    }

    /// How it ended, once it has (as seen by the waiter: a dependency retried afterwards is
    /// seen anew only by the waiters it cancelled, which the retry re-arms).
    pub fn ended(&self) -> Option<JobState> {
        self.ended
    }

    /// Whether it ended as required.
    pub fn met(&self) -> bool {
        self.ended.is_some_and(|s| self.require.accepts(s))
    }

    /// Whether it ended otherwise than required.
    pub fn broken(&self) -> bool {
        self.ended.is_some_and(|s| !self.require.accepts(s))
    }

    /// How it stands, as the tool and the status page say it: "not ended yet", "ended
    /// succeeded: met", "ended dead: not what it required".
    pub fn standing(&self) -> String {
        match self.ended {
            None => "not ended yet".to_owned(),
            Some(state) if self.met() => format!("ended {state}: met"),
            Some(state) => format!("ended {state}: not what it required"),
        }
    }
}

/// A job's part in workflows, as stored in its record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Flow {
    /// What it waits for, in the order given.
    pub needs: Vec<Need>,
    /// The group it is a member of.
    pub group: Option<GroupId>,
    /// Whether its end moves others: a job waits for it, or it is a group's member. An end
    /// of a job that is not awaited has nothing to release, and an engine's shortcut may
    /// take it; an awaited one's end goes through the protocol.
    pub awaited: bool,
}

/// A group as stored.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct GroupRecord {
    pub id: GroupId,
    pub created_at: StoreTime,
    /// No member may be added any more (sealed, or cancelled).
    pub sealed: bool,
    /// When it ended: sealed, and every member ended.
    pub finished_at: Option<StoreTime>,
    /// Members added.
    pub members: u64,
    /// Members ended, by how.
    pub succeeded: u64,
    pub dead: u64,
    pub cancelled: u64,
    /// The jobs that wait for it (its callbacks among them).
    pub waiters: Vec<JobId>,
    /// The group it is a member of ([`crate::NewGroup::in_group`]): its end is a member's
    /// end there. (After the fields of format 6, so that the codec reads an older record as
    /// one in no group.)
    pub parent: Option<GroupId>,
    /// The groups that are its members, in the order they joined.
    pub subgroups: Vec<GroupId>,
    /// The key it was made with ([`crate::NewGroup::key`]), given up with the record when
    /// retention purges it. (After the fields of format 7, so that the codec reads an older
    /// record as one without a key; the upgrade to format 8 fills it in.)
    pub key: Option<String>,
}

impl GroupRecord {
    /// How many members have ended.
    pub(crate) fn ended(&self) -> u64 {
        self.succeeded + self.dead + self.cancelled
    }

    /// How the group ended, once it has: succeeded if every member did (an empty group
    /// too), dead if any member died, cancelled otherwise.
    pub(crate) fn outcome(&self) -> Option<JobState> {
        self.finished_at?;
        Some(match (self.dead, self.cancelled) {
            (0, 0) => JobState::Succeeded,
            (0, _) => JobState::Cancelled,
            _ => JobState::Dead,
        })
    }
}

/// A group as read from the store ([`crate::ReadJobs::group`]): a snapshot.
#[derive(Clone, PartialEq, Eq)]
pub struct Group(pub(crate) GroupRecord);

impl Group {
    /// Its id.
    pub fn id(&self) -> GroupId {
        self.0.id
    }
    /// When it was opened.
    pub fn created_at(&self) -> StoreTime {
        self.0.created_at
    }
    /// Whether members may still be added.
    pub fn is_sealed(&self) -> bool {
        self.0.sealed
    }
    /// When it ended (sealed and every member ended), if it has.
    pub fn finished_at(&self) -> Option<StoreTime> {
        self.0.finished_at
    }
    /// How it ended, once it has: `Succeeded` if every member succeeded, `Dead` if any
    /// member died, else `Cancelled`.
    pub fn outcome(&self) -> Option<JobState> {
        self.0.outcome()
    }
    /// How many members it has.
    pub fn members(&self) -> u64 {
        self.0.members
    }
    /// How many members ended, and how: succeeded, dead, cancelled. Counted as each member
    /// ends; frozen once the group ends (a member retried afterwards is not counted again).
    pub fn ended(&self) -> (u64, u64, u64) {
        (self.0.succeeded, self.0.dead, self.0.cancelled)
    }
    /// The jobs that wait for it, its callbacks first.
    pub fn waiters(&self) -> &[JobId] {
        &self.0.waiters
    }
    /// The group it is a member of, if it was opened in one ([`crate::NewGroup::in_group`]).
    pub fn parent(&self) -> Option<GroupId> {
        self.0.parent
    }
    /// The groups that are its members (each counted in [`Group::members`] and, once it
    /// ended, in [`Group::ended`] by its [`Group::outcome`]), in the order they joined.
    pub fn subgroups(&self) -> &[GroupId] {
        &self.0.subgroups
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
