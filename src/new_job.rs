//! What an application hands the store to enqueue: a job's payload, queue and options,
//! built step by step, and a group to open with its callbacks. The rule that turns it into a stored record is
//! [`crate::rules::new_job`].

use std::time::Duration;

use crate::ids::{GroupId, JobId};
use crate::job::Uniqueness;
use crate::retry::RetryPolicy;
use crate::workflow::{Require, Target};

/// A job to enqueue. Built with [`NewJob::new`] and the builder methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    pub(crate) queue: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) priority: i32,
    pub(crate) delay: Duration,
    /// A wall-clock time to run at instead of `delay` (see [`NewJob::run_at`]).
    pub(crate) at: Option<std::time::SystemTime>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) unique_key: Option<String>,
    pub(crate) uniqueness: Uniqueness,
    pub(crate) time_limit: Option<Duration>,
    pub(crate) metadata: Vec<(String, String)>,
    /// What it waits for.
    pub(crate) needs: Vec<(Target, Require)>,
    /// The group it joins.
    pub(crate) group: Option<GroupId>,
    /// Its own backoff.
    pub(crate) retry: Option<RetryPolicy>,
    /// The key its queue's per-key limit counts it under.
    pub(crate) limit_key: Option<String>,
    /// When it expires if not started by then (see [`NewJob::expires_in`]).
    pub(crate) expires: Option<Expiry>,
}

/// A job's expiry as given: a span from its enqueue, or a wall-clock time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    In(Duration),
    At(std::time::SystemTime),
}

impl NewJob {
    /// A job for `queue` carrying `payload`, priority 0, no delay, the store's default
    /// retry budget.
    pub fn new(queue: impl Into<String>, payload: impl Into<Vec<u8>>) -> NewJob {
        NewJob {
            queue: queue.into(),
            payload: payload.into(),
            priority: 0,
            delay: Duration::ZERO,
            at: None,
            max_attempts: None,
            unique_key: None,
            uniqueness: Uniqueness::WhileUnfinished,
            time_limit: None,
            metadata: Vec::new(),
            needs: Vec::new(),
            group: None,
            retry: None,
            limit_key: None,
            expires: None,
        }
    }

    /// Lower runs first (as in beanstalkd and River); equal priorities run first in, first out.
    pub fn priority(mut self, priority: i32) -> NewJob {
        self.priority = priority;
        self
    }

    /// Not claimable until this much store time has passed. Replaces a
    /// [`NewJob::run_at`].
    pub fn delay(mut self, delay: Duration) -> NewJob {
        self.delay = delay;
        self.at = None;
        self
    }

    /// Not claimable before `when`, a wall-clock time (Sidekiq's `perform_at`, River's
    /// `ScheduledAt`); a time already past runs now. Replaces a [`NewJob::delay`].
    ///
    /// The store compares only store time, never wall clocks (see [`crate::Clock`]), so
    /// `when` is converted once, at enqueue: the job waits `when` minus the host's wall
    /// clock then, measured on the store's clock. A later step of the wall clock (NTP, an
    /// operator) does not move it; a store whose clock is a [`crate::ManualClock`] waits that
    /// long of its own time.
    pub fn run_at(mut self, when: std::time::SystemTime) -> NewJob {
        self.at = Some(when);
        self.delay = Duration::ZERO;
        self
    }

    /// How long the job waits from an enqueue now: its delay, or what is left until its
    /// wall-clock time (none once past).
    pub(crate) fn wait(&self) -> Duration {
        match self.at {
            Some(when) => (when.duration_since(crate::clock::wall_now())).unwrap_or_default(),
            None => self.delay,
        }
    }

    /// Discards the job if no attempt of it has started `span` of store time after its
    /// enqueue (Sidekiq's `expires_in`): for work that is worthless late, such as a
    /// notification about a sale that ended. A claim after that ends it as
    /// [`JobState::Expired`](crate::JobState::Expired) instead of running it, and the reaper
    /// ends the ones nobody claims (a paused queue's, a blocked one's) within its interval.
    ///
    /// Expiry bounds when an attempt may *start*: an attempt that started before it runs to
    /// its end, and a job that failed and waits out a backoff past its expiry expires
    /// instead of being retried. What waits for an expired job, and its group, count it as
    /// cancelled. An operator's retry of an expired job puts it back without an expiry.
    /// A delayed job must expire after it is due ([`crate::InputError::ExpiresBeforeDue`]).
    /// A schedule's job may have one: each tick's job expires `span` after its tick's
    /// enqueue. Replaces a [`NewJob::expires_at`].
    pub fn expires_in(mut self, span: Duration) -> NewJob {
        self.expires = Some(Expiry::In(span));
        self
    }

    /// [`NewJob::expires_in`] at a wall-clock time, converted once at enqueue as
    /// [`NewJob::run_at`] is (a time already past expires the job at once: it never runs).
    /// Replaces a [`NewJob::expires_in`].
    pub fn expires_at(mut self, when: std::time::SystemTime) -> NewJob {
        self.expires = Some(Expiry::At(when));
        self
    }

    /// How long after an enqueue now the job expires, if it does.
    pub(crate) fn expiry(&self) -> Option<Duration> {
        self.expires.map(|e| match e {
            Expiry::In(span) => span,
            Expiry::At(when) => (when.duration_since(crate::clock::wall_now())).unwrap_or_default(),
        })
    }

    /// The retry budget: how many attempts may fail (or lose their lease) before the job is
    /// dead. Must be at least 1.
    pub fn max_attempts(mut self, max_attempts: u32) -> NewJob {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Deduplicate: while a job of this queue holding `key` is not terminal, enqueueing
    /// another with the same key returns the existing job's id and creates nothing. With
    /// [`NewJob::unique_for`] or [`NewJob::unique_until_purged`] a job that succeeded keeps
    /// the key longer.
    pub fn unique_key(mut self, key: impl Into<String>) -> NewJob {
        self.unique_key = Some(key.into());
        self
    }

    /// Its unique key also deduplicates for `window` of store time after the job succeeded
    /// (River's `ByPeriod`, Oban's `period`): an enqueue with the key within the window
    /// returns the finished job. A job that died or was cancelled keeps nothing. Needs
    /// [`NewJob::unique_key`].
    pub fn unique_for(mut self, window: Duration) -> NewJob {
        self.uniqueness = Uniqueness::AfterSuccess(window);
        self
    }

    /// Its unique key also deduplicates after the job succeeded, until it is purged ("this
    /// import runs once, ever"). Needs [`NewJob::unique_key`].
    pub fn unique_until_purged(mut self) -> NewJob {
        self.uniqueness = Uniqueness::UntilPurged;
        self
    }

    /// A hard limit on each attempt's running time: at `limit` after its claim (store time)
    /// the attempt is ended as [`crate::Outcome::TimedOut`] (budget spent, retried after a backoff
    /// while it lasts). A pool interrupts the handler ([`crate::Interruption::TimedOut`])
    /// at the limit and records it; if the handler does not return, its next renewal ends
    /// the attempt in the store, and nothing it returns afterwards is committed. Overrides
    /// the claimer's limit ([`crate::LeaseTerms::time_limit`]).
    pub fn time_limit(mut self, limit: Duration) -> NewJob {
        self.time_limit = Some(limit);
        self
    }

    /// Its own backoff between failed attempts (River's `NextRetry`, Oban's `backoff/1`),
    /// over its queue's ([`crate::JobStore::set_queue_retry_policy`]) and the store's. A
    /// handler's [`crate::JobError::retry_in`] still names the wait of one failure itself.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> NewJob {
        self.retry = Some(policy);
        self
    }

    /// Counts the job under `key` for its queue's per-key limit
    /// ([`crate::QueueLimits::per_key`]): "at most two jobs of one tenant at once". A key's
    /// jobs run in the order they fall due (run time, then id); priority orders them among
    /// other keys' jobs and jobs without a key. A key is 1 to 256 bytes, without NUL.
    pub fn limit_key(mut self, key: impl Into<String>) -> NewJob {
        self.limit_key = Some(key.into());
        self
    }

    /// Tags the job with `key` = `value`, shown by the tool and usable as a filter
    /// ([`crate::JobFilter::metadata`]). A key given twice keeps its last value. Keys are
    /// non-empty, at most 64 bytes, without `=`; values at most 256 bytes; at most 16 pairs.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> NewJob {
        let (key, value) = (key.into(), value.into());
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(pair) => pair.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Waits for job `dependency` to succeed: the job is [`crate::JobState::Blocked`] until then,
    /// and cancelled (its error naming the dependency) if the dependency dies or is
    /// cancelled. The dependency must exist (enqueued earlier, or earlier in the same
    /// transaction): so no cycle can be made. At most [`crate::MAX_DEPENDENCIES`].
    pub fn after(self, dependency: JobId) -> NewJob {
        self.after_with(Target::Job(dependency), Require::success())
    }

    /// Waits for `target` (a job, or a group's end) to end as `require` says.
    pub fn after_with(mut self, target: Target, require: Require) -> NewJob {
        self.needs.push((target, require));
        self
    }

    /// Joins `group` ([`crate::JobStore::open_group`]), which must not be sealed yet: its
    /// callbacks run once every member has ended. A member cannot have a unique key (an
    /// enqueue its key answers would join nothing).
    pub fn in_group(mut self, group: GroupId) -> NewJob {
        self.group = Some(group);
        self
    }
}

/// A group to open ([`crate::JobStore::open_group`]): jobs added to it with
/// [`NewJob::in_group`] until it is sealed, and callbacks that run once, when the sealed
/// group's every member has ended (Sidekiq's batch callbacks, Celery's chord). A group may
/// have several callbacks of each kind, each a job of its own; at most
/// [`crate::MAX_GROUP_WAITERS`] jobs wait for one group in all. A group may itself be a
/// member of a group ([`NewGroup::in_group`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewGroup {
    pub(crate) on_complete: Vec<NewJob>,
    pub(crate) on_success: Vec<NewJob>,
    pub(crate) key: Option<String>,
    pub(crate) parent: Option<GroupId>,
}

impl NewGroup {
    /// A group with no callback.
    pub fn new() -> NewGroup {
        NewGroup::default()
    }

    /// Adds a job that runs once every member has ended, however (its handler reads the
    /// counts with [`crate::ReadJobs::group`]). Each call adds one more.
    pub fn on_complete(mut self, job: NewJob) -> NewGroup {
        self.on_complete.push(job);
        self
    }

    /// Adds a job that runs once every member has succeeded; cancelled instead if any did
    /// not. Each call adds one more.
    pub fn on_success(mut self, job: NewJob) -> NewGroup {
        self.on_success.push(job);
        self
    }

    /// The group's key, which makes opening it idempotent: while a group made with `key`
    /// exists (a group's record is kept after it ends), opening another with the same key
    /// makes nothing and answers the first one: [`crate::JobStore::open_group`] its id,
    /// [`crate::JobStore::enqueue_group`] its id and its members' ids. An application that
    /// retries an enqueue whose answer it lost (a timeout, a crash, a dropped connection)
    /// gets one group, not two. The first group stands as it was made: the callbacks and
    /// members of a later call are not compared with it. 1 to 256 bytes, no NUL.
    pub fn key(mut self, key: impl Into<String>) -> NewGroup {
        self.key = Some(key.into());
        self
    }

    /// Opens the group as a member of `parent`, which must not be sealed yet (Sidekiq's
    /// child batches, BullMQ's nested flows): `parent` counts it as one member, and once
    /// this group ends, counts that end as its [`Group::outcome`](crate::Group::outcome)
    /// (succeeded if every member of it did, dead if one died, else cancelled), exactly
    /// once, in the transaction that ended it. So `parent`'s callbacks run only after every
    /// nested group has ended too. Cancelling `parent` cancels this group as well. At most
    /// [`crate::MAX_SUBGROUPS`] groups join one group.
    pub fn in_group(mut self, parent: GroupId) -> NewGroup {
        self.parent = Some(parent);
        self
    }
}
