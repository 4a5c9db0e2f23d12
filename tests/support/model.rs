//! A reference model of the lease protocol: a plain in-memory struct, written from the
//! specification (README and issue), not from the store's code. The model-based tests and the
//! operation fuzzer run every operation against both and compare.

use std::collections::BTreeMap;

use leasehold::{JobState, Outcome, ReclaimPath};

pub const SEC: u64 = 1_000_000_000;
/// The retry policy both sides use: 5 s doubling to 20 s, no jitter.
pub const BACKOFF_BASE: u64 = 5 * SEC;
pub const BACKOFF_MAX: u64 = 20 * SEC;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MLease {
    pub owner: String,
    pub expires_at: u64,
    pub length: u64,
    pub stall: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MJob {
    pub queue: String,
    pub priority: i32,
    pub run_at: u64,
    pub state: JobState,
    pub attempt: u32,
    pub failures: u32,
    pub max_attempts: u32,
    pub unique: Option<String>,
    pub lease: Option<MLease>,
    pub cancel_requested: bool,
    pub progress: u64,
    pub progress_at: u64,
    /// What it waits for.
    pub needs: Vec<MNeed>,
    /// The group it is a member of.
    pub group: Option<u64>,
    /// Its own backoff, if it was given one.
    pub backoff: Option<MBackoff>,
    /// Its limit key, if it was given one.
    pub key: Option<String>,
    /// No attempt starts at or after it.
    pub expires_at: Option<u64>,
    /// When it last came to an end (terminal), while it stays there.
    pub finished_at: Option<u64>,
}

/// A retry policy without jitter, as the README states it: the `n`-th failure waits
/// `min(max, base * 2^(n-1))`, or the same every time, or the `n`-th of a list (its last
/// once past it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MBackoff {
    Exponential(u64, u64),
    Fixed(u64),
    Delays(Vec<u64>),
}

impl MBackoff {
    fn wait(&self, failures: u32) -> u64 {
        let n = failures.max(1) - 1;
        match self {
            MBackoff::Exponential(base, max) => base.saturating_mul(1u64 << n.min(40)).min(*max),
            MBackoff::Fixed(wait) => *wait,
            MBackoff::Delays(list) => *list.get(n as usize).or(list.last()).unwrap_or(&0),
        }
    }
}

/// What a job waits for: a job's end, or a group's (sealed, and every member ended).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MTarget {
    Job(u64),
    Group(u64),
}

/// One dependency: its target, which ends besides success it accepts, how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MNeed {
    pub on: MTarget,
    pub dead_ok: bool,
    pub cancelled_ok: bool,
    pub ended: Option<JobState>,
}

impl MNeed {
    fn accepts(&self, s: JobState) -> bool {
        match s {
            JobState::Succeeded => true,
            JobState::Dead => self.dead_ok,
            // (an expired job never ran: to its waiters, it was cancelled)
            JobState::Cancelled | JobState::Expired => self.cancelled_ok,
            _ => false,
        }
    }
    fn broken(&self) -> bool {
        self.ended.is_some_and(|s| !self.accepts(s))
    }
    fn met(&self) -> bool {
        self.ended.is_some_and(|s| self.accepts(s))
    }
}

/// A group: members join until it is sealed; it ends when sealed with every member ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MGroup {
    pub sealed: bool,
    pub done: bool,
    pub members: u64,
    /// Members ended: succeeded, dead, cancelled.
    pub ended: (u64, u64, u64),
    /// What waits for it, callbacks first.
    pub waiters: Vec<u64>,
    /// The group it is a member of, and the groups that are its members.
    pub parent: Option<u64>,
    pub subgroups: Vec<u64>,
    /// When it ended.
    pub ended_at: Option<u64>,
}

impl MGroup {
    /// How it ended: succeeded if every member did, dead if any died, else cancelled.
    pub fn outcome(&self) -> Option<JobState> {
        self.done.then_some(match self.ended {
            (_, 0, 0) => JobState::Succeeded,
            (_, 0, _) => JobState::Cancelled,
            _ => JobState::Dead,
        })
    }
}

/// A refused or impossible operation reports, in terms both sides can produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MErr {
    /// What the fence found, and whether the attempt was ended by its own holder.
    LeaseLost(Option<(u32, JobState)>, bool),
    NotFound,
    Refused(JobState),
    /// A retry refused: this live job holds the retried job's unique key.
    KeyHeld(u64),
    Input,
    DependencyNotFound(u64),
    GroupNotFound(u64),
    GroupSealed(u64),
    GroupOpen(u64),
    /// An edit that named an attempt the job has moved past.
    EditConflict,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MRenewal {
    Renewed(u64),
    Cancelled,
    Stalled,
    TimedOut,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MCounters {
    pub reaper: u64,
    pub takeover: u64,
    pub at_open: u64,
    pub process_died: u64,
    pub released: u64,
    pub leases_lost: u64,
    pub fenced: u64,
    pub stalled: u64,
    pub snoozed: u64,
    pub worst_detection: u64,
}

/// What the model knows of a queue beside its jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MQueue {
    pub paused: bool,
    pub concurrency: Option<u32>,
    /// (claims, per)
    pub rate: Option<(u32, u64)>,
    /// The claims of the rate window, their times.
    pub recent: Vec<u64>,
    /// The backoff of its jobs that have none of their own.
    pub backoff: Option<MBackoff>,
    /// At most this many of one limit key's jobs held at once.
    pub per_key: Option<u32>,
    /// (claims, per) of one limit key's jobs.
    pub per_key_rate: Option<(u32, u64)>,
    /// Each limit key's claims while its queue has a rate per key, their times.
    pub key_claims: BTreeMap<String, Vec<u64>>,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub now: u64,
    pub next_id: u64,
    pub jobs: BTreeMap<u64, MJob>,
    /// (job, attempt) -> (worker, outcome once ended)
    pub runs: BTreeMap<(u64, u32), (String, Option<Outcome>)>,
    pub counters: MCounters,
    pub queues: BTreeMap<String, MQueue>,
    pub groups: BTreeMap<u64, MGroup>,
    /// The key each keyed group was made with.
    pub group_keys: BTreeMap<String, u64>,
    /// Each job's last checkpoint: the attempt that saved it, its bytes.
    pub checkpoints: BTreeMap<u64, (u32, Vec<u8>)>,
    /// Every end, as the store keeps them (`ReadJobs::endings`): what ended, and how.
    pub endings: Vec<(MTarget, JobState)>,
    /// How many groups were ever opened: the last group's id.
    pub groups_made: u64,
}

impl Model {
    pub fn new() -> Model {
        Model {
            next_id: 1,
            ..Model::default()
        }
    }

    /// An enqueue that waits for `after` (target, accepts dead, accepts cancelled) and joins
    /// `group`; `callback` for a group's own callback, which alone may wait for it while open.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_waiting(
        &mut self,
        queue: &str,
        priority: i32,
        delay: u64,
        max_attempts: Option<u32>,
        unique: Option<&str>,
        after: &[(MTarget, bool, bool)],
        group: Option<u64>,
        callback: bool,
    ) -> Result<u64, MErr> {
        let max_attempts = max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if queue.is_empty() || max_attempts == 0 || unique == Some("") {
            return Err(MErr::Input);
        }
        if group.is_some() && unique.is_some() {
            return Err(MErr::Input);
        }
        if let Some(key) = unique {
            let holder = self.jobs.iter().find(|(_, j)| {
                j.queue == queue && j.unique.as_deref() == Some(key) && !terminal(j.state)
            });
            if let Some((id, _)) = holder {
                return Ok(*id);
            }
        }
        // Each dependency must exist; an open group is waited for only by its callbacks, and
        // a job that waits for an open group (a callback) by no one.
        let mut needs = Vec::new();
        for &(on, dead_ok, cancelled_ok) in after {
            let ended = match on {
                MTarget::Job(dep) => {
                    let d = self.jobs.get(&dep).ok_or(MErr::DependencyNotFound(dep))?;
                    for n in &d.needs {
                        if let MTarget::Group(g) = n.on
                            && self.groups.get(&g).is_some_and(|g| !g.sealed)
                        {
                            return Err(MErr::GroupOpen(g));
                        }
                    }
                    Some(d.state).filter(|s| terminal(*s))
                }
                MTarget::Group(g) => {
                    let grp = self.groups.get(&g).ok_or(MErr::GroupNotFound(g))?;
                    if !grp.sealed && !callback {
                        return Err(MErr::GroupOpen(g));
                    }
                    grp.outcome()
                }
            };
            needs.push(MNeed {
                on,
                dead_ok,
                cancelled_ok,
                ended,
            });
        }
        if let Some(g) = group {
            let grp = self.groups.get(&g).ok_or(MErr::GroupNotFound(g))?;
            if grp.sealed {
                return Err(MErr::GroupSealed(g));
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.jobs.insert(
            id,
            MJob {
                queue: queue.to_owned(),
                priority,
                run_at: self.now.saturating_add(delay),
                state: JobState::Queued,
                attempt: 0,
                failures: 0,
                max_attempts,
                unique: unique.map(str::to_owned),
                lease: None,
                cancel_requested: false,
                progress: 0,
                progress_at: self.now,
                needs: needs.clone(),
                group,
                backoff: None,
                key: None,
                expires_at: None,
                finished_at: None,
            },
        );
        if let Some(g) = group {
            self.groups.get_mut(&g).expect("checked").members += 1;
        }
        // (a group lists every job that waits for it, one declared after it ended too)
        for n in &needs {
            if let MTarget::Group(g) = n.on {
                self.groups.get_mut(&g).expect("checked").waiters.push(id);
            }
        }
        if !needs.is_empty() {
            self.jobs.get_mut(&id).expect("made").state = JobState::Blocked;
            self.stand(id);
        }
        Ok(id)
    }

    /// A blocked job as its needs stand: cancelled if one ended otherwise than it accepts,
    /// queued (due at its run time or now) once every one ended as it accepts.
    fn stand(&mut self, id: u64) {
        let now = self.now;
        let job = self.jobs.get_mut(&id).expect("job");
        if job.needs.iter().any(MNeed::broken) {
            job.state = JobState::Cancelled;
            self.ended(MTarget::Job(id));
        } else if job.needs.iter().all(MNeed::met) {
            job.state = JobState::Queued;
            job.run_at = job.run_at.max(now);
        }
    }

    /// `target` has just ended (a job reached a terminal state, or a group ended): its
    /// group counts it, and each blocked job waiting for it sees how.
    fn ended(&mut self, target: MTarget) {
        if let MTarget::Job(id) = target {
            self.jobs.get_mut(&id).expect("ended job").finished_at = Some(self.now);
        }
        let how = match target {
            MTarget::Job(id) => self.jobs[&id].state,
            MTarget::Group(g) => self.groups[&g].outcome().expect("ended"),
        };
        self.endings.push((target, how));
        // (a job's group, or the group a group is in, counts the end as a member's)
        let (state, group) = match target {
            MTarget::Job(id) => (self.jobs[&id].state, self.jobs[&id].group),
            MTarget::Group(g) => (
                self.groups[&g].outcome().expect("ended"),
                self.groups[&g].parent,
            ),
        };
        if let Some(g) = group {
            let grp = self.groups.get_mut(&g).expect("group");
            if !grp.done {
                match state {
                    JobState::Succeeded => grp.ended.0 += 1,
                    JobState::Dead => grp.ended.1 += 1,
                    _ => grp.ended.2 += 1,
                }
                self.group_maybe_done(g);
            }
        }
        let waiters: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Blocked)
            .filter(|(_, j)| j.needs.iter().any(|n| n.on == target && n.ended.is_none()))
            .map(|(id, _)| *id)
            .collect();
        for w in waiters {
            if self.jobs[&w].state != JobState::Blocked {
                continue;
            }
            for n in &mut self.jobs.get_mut(&w).expect("waiter").needs {
                if n.on == target && n.ended.is_none() {
                    n.ended = Some(state);
                }
            }
            self.stand(w);
        }
    }

    fn group_maybe_done(&mut self, g: u64) {
        let grp = self.groups.get_mut(&g).expect("group");
        let (a, b, c) = grp.ended;
        if grp.sealed && !grp.done && a + b + c == grp.members {
            grp.done = true;
            grp.ended_at = Some(self.now);
            self.ended(MTarget::Group(g));
        }
    }

    /// Job `id` runs again after it had ended as `was` (an operator's retry, or a re-arm):
    /// its open group counts it no more, and the waiters its end cancelled wait again.
    fn back(&mut self, id: u64, was: JobState) {
        if let Some(g) = self.jobs[&id].group {
            let grp = self.groups.get_mut(&g).expect("group");
            if !grp.done {
                match was {
                    JobState::Succeeded => grp.ended.0 -= 1,
                    JobState::Dead => grp.ended.1 -= 1,
                    _ => grp.ended.2 -= 1,
                }
            }
        }
        let cancelled_by: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Cancelled)
            .filter(|(_, j)| {
                j.needs
                    .iter()
                    .any(|n| n.on == MTarget::Job(id) && n.broken())
            })
            .map(|(w, _)| *w)
            .collect();
        for w in cancelled_by {
            let mut fresh = self.jobs[&w].needs.clone();
            for n in &mut fresh {
                n.ended = match n.on {
                    MTarget::Job(d) => self.jobs.get(&d).map(|j| j.state).filter(|s| terminal(*s)),
                    MTarget::Group(g) => self.groups.get(&g).and_then(MGroup::outcome),
                };
            }
            if fresh.iter().any(MNeed::broken) {
                continue;
            }
            let job = self.jobs.get_mut(&w).expect("waiter");
            job.needs = fresh;
            job.state = JobState::Blocked;
            job.finished_at = None;
            self.stand(w);
            self.back(w, JobState::Cancelled);
        }
    }

    /// Opens a group with callbacks (on completion: any end; on success), each waiting for it,
    /// as a member of `parent` if given (which must be open). Answers the group `key`
    /// already names instead (making nothing).
    pub fn open_group(
        &mut self,
        on_complete: bool,
        on_success: bool,
        queue: &str,
        key: Option<&str>,
        parent: Option<u64>,
    ) -> Result<u64, MErr> {
        if let Some(&made) = key.and_then(|k| self.group_keys.get(k)) {
            return Ok(made);
        }
        if let Some(p) = parent {
            let grp = self.groups.get(&p).ok_or(MErr::GroupNotFound(p))?;
            if grp.sealed {
                return Err(MErr::GroupSealed(p));
            }
        }
        // (ids are never reused, also once a purge took a group)
        self.groups_made += 1;
        let g = self.groups_made;
        if let Some(p) = parent {
            let grp = self.groups.get_mut(&p).expect("checked");
            grp.members += 1;
            grp.subgroups.push(g);
        }
        self.groups.insert(
            g,
            MGroup {
                parent,
                ..MGroup::default()
            },
        );
        if let Some(key) = key {
            self.group_keys.insert(key.to_owned(), g);
        }
        for (wanted, any) in [(on_complete, true), (on_success, false)] {
            if wanted {
                let after = [(MTarget::Group(g), any, any)];
                self.enqueue_waiting(queue, 0, 0, None, None, &after, None, true)
                    .expect("a callback is enqueued");
            }
        }
        Ok(g)
    }

    pub fn seal_group(&mut self, g: u64) -> Result<(), MErr> {
        let grp = self.groups.get_mut(&g).ok_or(MErr::GroupNotFound(g))?;
        if !grp.sealed {
            grp.sealed = true;
            self.group_maybe_done(g);
        }
        Ok(())
    }

    /// Cancels a group: its blocked waiters, then sealed, then each member not ended.
    pub fn cancel_group(&mut self, g: u64) -> Result<usize, MErr> {
        let grp = self.groups.get(&g).ok_or(MErr::GroupNotFound(g))?;
        let mut changed = 0;
        for w in grp.waiters.clone() {
            // (a waiter that ended and was purged is no longer there)
            if self
                .jobs
                .get(&w)
                .is_some_and(|j| j.state == JobState::Blocked)
            {
                self.cancel(w)?;
                changed += 1;
            }
        }
        self.seal_group(g)?;
        let members: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.group == Some(g))
            .map(|(id, _)| *id)
            .collect();
        for m in members {
            if !terminal(self.jobs[&m].state) {
                self.cancel(m)?;
                changed += 1;
            }
        }
        for sub in self.groups[&g].subgroups.clone() {
            changed += self.cancel_group(sub)?;
        }
        Ok(changed)
    }

    /// Whether a claim of `queue` may take a job now: not while it is paused, not past its
    /// limits. A queue with a concurrency limit has its expired leases taken back first (a
    /// lease that ran out holds no slot).
    fn room(&mut self, queue: &str) -> bool {
        let Some(q) = self.queues.get(queue).cloned() else {
            return true;
        };
        if q.paused {
            return false;
        }
        let now = self.now;
        if let Some(limit) = q.concurrency {
            let expired: Vec<u64> = self
                .jobs
                .iter()
                .filter(|(_, j)| j.queue == queue && expired(j, now))
                .map(|(id, _)| *id)
                .collect();
            for id in expired {
                self.expire(id, ReclaimPath::Takeover);
            }
            if self.running(queue) >= u64::from(limit) {
                return false;
            }
        }
        if let Some((claims, per)) = q.rate
            && q.recent.iter().filter(|t| **t + per > now).count() >= claims as usize
        {
            return false;
        }
        true
    }

    /// Whether waiting job `id` stands in the claim order, as the README states it: one
    /// without a limit key always; one with a key if its key has room (fewer of its jobs
    /// running than the queue's per-key limit) and it is the first of its key's waiting jobs
    /// by run time, then id.
    fn stands(&self, id: u64, job: &MJob) -> bool {
        let Some(key) = &job.key else {
            return true;
        };
        let first = self
            .jobs
            .iter()
            .filter(|(_, j)| {
                j.queue == job.queue && j.key.as_ref() == Some(key) && waiting(j.state)
            })
            .min_by_key(|(id, j)| (j.run_at, **id));
        first.is_some_and(|(first, _)| *first == id) && self.key_has_room(job)
    }

    /// Whether one more of `job`'s key's jobs may run (one without a key always may).
    fn key_has_room(&self, job: &MJob) -> bool {
        let Some(key) = &job.key else {
            return true;
        };
        let q = self.queues.get(&job.queue).cloned().unwrap_or_default();
        let running = self
            .jobs
            .values()
            .filter(|j| j.queue == job.queue && j.key.as_ref() == Some(key))
            .filter(|j| j.state == JobState::Running)
            .count();
        let now = self.now;
        let in_window = |&(claims, per): &(u32, u64)| {
            let times = q.key_claims.get(key).map_or(&[][..], |t| &t[..]);
            times.iter().filter(|t| **t + per > now).count() < claims as usize
        };
        q.per_key.is_none_or(|n| running < n as usize)
            && q.per_key_rate.as_ref().is_none_or(in_window)
    }

    /// How many of `queue`'s jobs run now.
    pub fn running(&self, queue: &str) -> u64 {
        self.jobs
            .values()
            .filter(|j| j.queue == queue && j.state == JobState::Running)
            .count() as u64
    }

    /// A claim of `queue` granted: kept in its rate window.
    fn noted(&mut self, queue: &str) {
        let now = self.now;
        if let Some(q) = self.queues.get_mut(queue)
            && let Some((_, per)) = q.rate
        {
            q.recent.retain(|t| *t + per > now);
            q.recent.push(now);
        }
    }

    pub fn pause(&mut self, queue: &str, paused: bool) {
        self.queues.entry(queue.to_owned()).or_default().paused = paused;
    }

    /// A claim over several queues, as the README states it: each queue up to its count,
    /// in order; then what some could not give, from those that gave all of theirs (or
    /// were asked none), in the same order.
    pub fn claim_queues(
        &mut self,
        plan: &[(&str, usize)],
        worker: &str,
        length: u64,
    ) -> Vec<(u64, u32)> {
        let mut granted = Vec::new();
        let (mut short, mut open) = (0, Vec::new());
        for &(queue, count) in plan {
            let got: Vec<_> = (0..count)
                .map_while(|_| self.claim(queue, worker, length, None))
                .collect();
            short += count - got.len();
            if got.len() == count {
                open.push(queue);
            }
            granted.extend(got);
        }
        for queue in open {
            while short > 0 {
                match self.claim(queue, worker, length, None) {
                    Some(lease) => {
                        granted.push(lease);
                        short -= 1;
                    }
                    None => break,
                }
            }
        }
        granted
    }

    pub fn set_backoff(&mut self, queue: &str, backoff: Option<MBackoff>) {
        self.queues.entry(queue.to_owned()).or_default().backoff = backoff;
    }

    pub fn limit(
        &mut self,
        queue: &str,
        concurrency: Option<u32>,
        rate: Option<(u32, u64)>,
        per_key: Option<u32>,
        per_key_rate: Option<(u32, u64)>,
    ) {
        let q = self.queues.entry(queue.to_owned()).or_default();
        q.per_key = per_key;
        q.per_key_rate = per_key_rate;
        if per_key_rate.is_none() {
            q.key_claims.clear();
        }
        q.concurrency = concurrency;
        q.rate = rate;
        if rate.is_none() {
            q.recent.clear();
        }
    }

    pub fn claim(
        &mut self,
        queue: &str,
        worker: &str,
        length: u64,
        stall: Option<u64>,
    ) -> Option<(u64, u32)> {
        if !self.room(queue) {
            return None;
        }
        let granted = self.claim_one(queue, worker, length, stall);
        if granted.is_some() {
            self.noted(queue);
        }
        granted
    }

    fn claim_one(
        &mut self,
        queue: &str,
        worker: &str,
        length: u64,
        stall: Option<u64>,
    ) -> Option<(u64, u32)> {
        loop {
            let now = self.now;
            let ready = self
                .jobs
                .iter()
                .filter(|(_, j)| j.queue == queue && waiting(j.state) && j.run_at <= now)
                .filter(|(id, j)| self.stands(**id, j))
                .min_by_key(|(id, j)| (j.priority, j.run_at, **id))
                .map(|(id, j)| (*id, j.priority));
            let expired = self
                .jobs
                .iter()
                .filter(|(_, j)| j.queue == queue && expired(j, now))
                .min_by_key(|(id, j)| (j.lease.as_ref().map(|l| l.expires_at), **id))
                .map(|(id, j)| (*id, j.priority));
            let (id, takeover) = match (ready, expired) {
                (None, None) => return None,
                (Some((id, _)), None) => (id, false),
                (None, Some((id, _))) => (id, true),
                (Some((r, rp)), Some((e, ep))) => {
                    if ep <= rp {
                        (e, true)
                    } else {
                        (r, false)
                    }
                }
            };
            if takeover {
                self.expire(id, ReclaimPath::Takeover);
                // (one with a limit key is back in its key's order: the next look decides)
                if !waiting(self.jobs[&id].state) || self.jobs[&id].key.is_some() {
                    continue;
                }
            }
            if self.expire_unstarted(id) {
                continue;
            }
            return Some(self.grant(id, worker, length, stall));
        }
    }

    pub fn claim_job(
        &mut self,
        id: u64,
        worker: &str,
        length: u64,
        stall: Option<u64>,
    ) -> Result<Option<(u64, u32)>, MErr> {
        let job = self.jobs.get(&id).ok_or(MErr::NotFound)?;
        let now = self.now;
        let claimable = |j: &MJob| waiting(j.state) && j.run_at <= now;
        if !claimable(job) && !expired(job, now) {
            return Ok(None);
        }
        let queue = job.queue.clone();
        if !self.room(&queue) {
            return Ok(None);
        }
        if expired(&self.jobs[&id], now) {
            self.expire(id, ReclaimPath::Takeover);
        }
        if !claimable(&self.jobs[&id]) || !self.key_has_room(&self.jobs[&id]) {
            return Ok(None);
        }
        if self.expire_unstarted(id) {
            return Ok(None);
        }
        self.noted(&queue);
        Ok(Some(self.grant(id, worker, length, stall)))
    }

    /// The holder puts its job off by `delay`: no budget spent.
    pub fn snooze(&mut self, id: u64, attempt: u32, delay: u64) -> Result<JobState, MErr> {
        self.fence(id, attempt, false)?;
        self.counters.snoozed += 1;
        let (state, run_at) = match self.jobs[&id].cancel_requested {
            true => (JobState::Cancelled, None),
            false => (JobState::Queued, Some(self.now.saturating_add(delay))),
        };
        self.end(
            id,
            Outcome::Snoozed {
                delay: std::time::Duration::from_nanos(delay),
            },
            state,
            run_at,
        );
        Ok(state)
    }

    pub fn heartbeat(&mut self, id: u64, attempt: u32, progress: u64) -> Result<MRenewal, MErr> {
        self.fence(id, attempt, true)?;
        let now = self.now;
        let job = self.jobs.get_mut(&id).expect("fenced job exists");
        if job.cancel_requested {
            self.end(id, Outcome::Cancelled, JobState::Cancelled, None);
            return Ok(MRenewal::Cancelled);
        }
        let lease = job.lease.clone().expect("running job has a lease");
        if let Some(stall) = lease.stall
            && progress == job.progress
            && now.saturating_sub(job.progress_at) >= stall
        {
            self.counters.stalled += 1;
            let (state, run_at) = self.after_failure(id, true);
            self.end(id, Outcome::Stalled, state, run_at);
            return Ok(MRenewal::Stalled);
        }
        let expires_at = lease.expires_at.max(now.saturating_add(lease.length));
        job.lease.as_mut().expect("lease").expires_at = expires_at;
        if progress != job.progress {
            job.progress = progress;
            job.progress_at = now;
        }
        Ok(MRenewal::Renewed(expires_at))
    }

    /// A checkpoint saved under the attempt's fence, as its end is.
    pub fn save_checkpoint(&mut self, id: u64, attempt: u32, data: u8) -> Result<(), MErr> {
        self.fence(id, attempt, false)?;
        self.checkpoints.insert(id, (attempt, vec![data]));
        Ok(())
    }

    pub fn complete(&mut self, id: u64, attempt: u32) -> Result<(), MErr> {
        self.fence(id, attempt, false)?;
        self.end(id, Outcome::Succeeded, JobState::Succeeded, None);
        Ok(())
    }

    pub fn fail(
        &mut self,
        id: u64,
        attempt: u32,
        error: &str,
        permanent: bool,
    ) -> Result<JobState, MErr> {
        self.fence(id, attempt, false)?;
        if permanent {
            // dead at once, one failure counted; a cancel requested meanwhile wins
            let state = match self.jobs[&id].cancel_requested {
                true => JobState::Cancelled,
                false => JobState::Dead,
            };
            self.end(
                id,
                Outcome::FailedPermanently(error.to_owned()),
                state,
                None,
            );
            return Ok(state);
        }
        let (state, run_at) = self.after_failure(id, true);
        self.end(id, Outcome::Failed(error.to_owned()), state, run_at);
        Ok(state)
    }

    pub fn release(&mut self, id: u64, attempt: u32) -> Result<JobState, MErr> {
        self.fence(id, attempt, false)?;
        self.counters.released += 1;
        let job = &self.jobs[&id];
        let (state, run_at) = if job.cancel_requested {
            (JobState::Cancelled, None)
        } else {
            (JobState::Queued, Some(job.run_at))
        };
        self.end(id, Outcome::Released, state, run_at);
        Ok(state)
    }

    pub fn cancel(&mut self, id: u64) -> Result<JobState, MErr> {
        let job = self.jobs.get_mut(&id).ok_or(MErr::NotFound)?;
        match job.state {
            JobState::Queued | JobState::RetryWait | JobState::Blocked => {
                job.state = JobState::Cancelled;
                self.ended(MTarget::Job(id));
                Ok(JobState::Cancelled)
            }
            JobState::Running => {
                job.cancel_requested = true;
                Ok(JobState::Running)
            }
            JobState::Cancelled => Ok(JobState::Cancelled),
            s => Err(MErr::Refused(s)),
        }
    }

    /// An operator's edit of a job that waits: a new priority, and due now if `promote`;
    /// refused for a job that runs or ended, or one claimed since `if_attempt`.
    pub fn edit(
        &mut self,
        id: u64,
        priority: Option<i32>,
        promote: bool,
        if_attempt: Option<u32>,
    ) -> Result<(), MErr> {
        let now = self.now;
        let job = self.jobs.get_mut(&id).ok_or(MErr::NotFound)?;
        if if_attempt.is_some_and(|a| a != job.attempt) {
            return Err(MErr::EditConflict);
        }
        if !(waiting(job.state) || job.state == JobState::Blocked) {
            return Err(MErr::Refused(job.state));
        }
        if let Some(p) = priority {
            job.priority = p;
        }
        if promote {
            job.run_at = now;
        }
        Ok(())
    }

    /// An operator's retry: a dead or cancelled job queued again with a fresh budget, unless a
    /// live job has taken its unique key meanwhile (two live jobs never hold one key).
    pub fn retry(&mut self, id: u64) -> Result<(), MErr> {
        let job = self.jobs.get(&id).ok_or(MErr::NotFound)?;
        if !matches!(
            job.state,
            JobState::Dead | JobState::Cancelled | JobState::Expired
        ) {
            return Err(MErr::Refused(job.state));
        }
        if let Some(key) = &job.unique {
            let holder = self.jobs.iter().find(|(_, j)| {
                j.queue == job.queue && j.unique.as_ref() == Some(key) && !terminal(j.state)
            });
            if let Some((holder, _)) = holder {
                return Err(MErr::KeyHeld(*holder));
            }
        }
        let now = self.now;
        let job = self.jobs.get_mut(&id).expect("checked above");
        let was = job.state;
        job.state = JobState::Queued;
        job.failures = 0;
        job.cancel_requested = false;
        job.expires_at = None;
        job.finished_at = None;
        job.run_at = now;
        self.back(id, was);
        Ok(())
    }

    /// Deletes the jobs in `states` that finished at least `older_than` ago, then the groups
    /// that ended as long ago and that nothing left refers to (a member, a job that waited for
    /// it, a group in it), in the order they ended, each with its key. Returns how many jobs.
    pub fn purge(&mut self, older_than: u64, states: &[JobState]) -> usize {
        let Some(cutoff) = self.now.checked_sub(older_than) else {
            return 0;
        };
        let old = |j: &MJob| j.finished_at.is_some_and(|at| at <= cutoff);
        let doomed: Vec<u64> = (self.jobs.iter())
            .filter(|(_, j)| terminal(j.state) && states.contains(&j.state) && old(j))
            .map(|(id, _)| *id)
            .collect();
        for id in &doomed {
            self.jobs.remove(id);
            self.runs.retain(|(job, _), _| job != id);
            self.checkpoints.remove(id);
        }
        let mut ended: Vec<(u64, u64)> = (self.groups.iter())
            .filter_map(|(g, grp)| Some((grp.ended_at.filter(|at| *at <= cutoff)?, *g)))
            .collect();
        ended.sort_unstable();
        for (_, g) in ended {
            let grp = &self.groups[&g];
            let referred = self.jobs.values().any(|j| j.group == Some(g))
                || grp.waiters.iter().any(|w| self.jobs.contains_key(w))
                || grp.subgroups.iter().any(|s| self.groups.contains_key(s));
            if !referred {
                self.groups.remove(&g);
                self.group_keys.retain(|_, held| *held != g);
            }
        }
        doomed.len()
    }

    /// Ends job `id` as expired if it waits (or is blocked) past its expiry: whether it did.
    fn expire_unstarted(&mut self, id: u64) -> bool {
        let now = self.now;
        let job = self.jobs.get_mut(&id).expect("job");
        let waits = waiting(job.state) || job.state == JobState::Blocked;
        if !waits || job.expires_at.is_none_or(|at| at > now) {
            return false;
        }
        job.state = JobState::Expired;
        self.ended(MTarget::Job(id));
        true
    }

    /// The reaper's second step: every job that waits past its expiry, expired, first to
    /// expire first (one a former one's end cancelled is passed over). Returns them in order.
    pub fn expire_waiting(&mut self) -> Vec<u64> {
        let mut due: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(id, j)| Some((j.expires_at?, *id)))
            .collect();
        due.sort_unstable();
        (due.into_iter())
            .filter(|&(_, id)| self.expire_unstarted(id))
            .map(|(_, id)| id)
            .collect()
    }

    /// Every lease expired at or before now, taken back. Returns the job ids, sorted.
    pub fn reap(&mut self) -> Vec<u64> {
        let now = self.now;
        let due: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| expired(j, now))
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            self.expire(*id, ReclaimPath::Reaper);
        }
        due
    }

    /// The process that holds every lease dies: a survivor takes them all back at once.
    pub fn process_died(&mut self) -> Vec<u64> {
        self.expire_every_lease(ReclaimPath::ProcessDied)
    }

    /// Reopening the store takes back every running lease (its holder's process is gone).
    pub fn reopen(&mut self) -> Vec<u64> {
        self.expire_every_lease(ReclaimPath::Recovery)
    }

    fn expire_every_lease(&mut self, path: ReclaimPath) -> Vec<u64> {
        let running: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Running)
            .map(|(id, _)| *id)
            .collect();
        for id in &running {
            self.expire(*id, path);
        }
        running
    }

    // ----- the pieces -----

    fn fence(&mut self, id: u64, attempt: u32, heartbeat: bool) -> Result<(), MErr> {
        match self.jobs.get(&id) {
            Some(j) if j.state == JobState::Running && j.attempt == attempt => Ok(()),
            other => {
                // An attempt its own holder ended (completed, failed, released) lost nothing:
                // a late renewal of that holder is refused but not counted as a lost lease.
                let by_holder = other.is_some_and(|j| j.attempt == attempt)
                    && matches!(
                        self.runs.get(&(id, attempt)),
                        Some((
                            _,
                            Some(
                                Outcome::Succeeded
                                    | Outcome::Failed(_)
                                    | Outcome::FailedPermanently(_)
                                    | Outcome::Released
                                    | Outcome::Snoozed { .. }
                            )
                        ))
                    );
                if !heartbeat {
                    self.counters.fenced += 1;
                } else if !by_holder {
                    self.counters.leases_lost += 1;
                }
                Err(MErr::LeaseLost(
                    other.map(|j| (j.attempt, j.state)),
                    by_holder,
                ))
            }
        }
    }

    fn grant(&mut self, id: u64, worker: &str, length: u64, stall: Option<u64>) -> (u64, u32) {
        let now = self.now;
        let job = self.jobs.get_mut(&id).expect("granted job exists");
        if let Some(key) = &job.key
            && let Some(q) = self.queues.get_mut(&job.queue)
            && q.per_key_rate.is_some()
        {
            q.key_claims.entry(key.clone()).or_default().push(now);
        }
        job.state = JobState::Running;
        job.attempt += 1;
        job.lease = Some(MLease {
            owner: worker.to_owned(),
            expires_at: now.saturating_add(length),
            length,
            stall,
        });
        job.progress = 0;
        job.progress_at = now;
        self.runs
            .insert((id, job.attempt), (worker.to_owned(), None));
        (id, job.attempt)
    }

    fn expire(&mut self, id: u64, path: ReclaimPath) {
        let now = self.now;
        let lease = self.jobs[&id]
            .lease
            .clone()
            .expect("expired job has a lease");
        let overdue = now.saturating_sub(lease.expires_at);
        match path {
            ReclaimPath::Reaper => self.counters.reaper += 1,
            ReclaimPath::Takeover => self.counters.takeover += 1,
            ReclaimPath::Recovery => self.counters.at_open += 1,
            ReclaimPath::ProcessDied => self.counters.process_died += 1,
            other => panic!("a reclaim path the model does not know: {other:?}"),
        }
        if matches!(path, ReclaimPath::Reaper | ReclaimPath::Takeover) {
            self.counters.worst_detection =
                self.counters.worst_detection.max(lease.length + overdue);
        }
        let (state, run_at) = self.after_failure(id, false);
        let outcome = Outcome::LeaseExpired {
            path,
            overdue: std::time::Duration::from_nanos(overdue),
        };
        self.end(id, outcome, state, run_at);
    }

    /// Where a failed, expired or stalled attempt sends its job.
    fn after_failure(&self, id: u64, backoff: bool) -> (JobState, Option<u64>) {
        let job = &self.jobs[&id];
        let failures = job.failures + 1;
        if job.cancel_requested {
            (JobState::Cancelled, None)
        } else if failures >= job.max_attempts {
            (JobState::Dead, None)
        } else if backoff {
            let of_queue = self.queues.get(&job.queue).and_then(|q| q.backoff.as_ref());
            let policy = (job.backoff.as_ref()).or(of_queue);
            let wait = match policy {
                Some(policy) => policy.wait(failures),
                None => MBackoff::Exponential(BACKOFF_BASE, BACKOFF_MAX).wait(failures),
            };
            (JobState::RetryWait, Some(self.now + wait))
        } else {
            (JobState::Queued, Some(job.run_at))
        }
    }

    fn end(&mut self, id: u64, outcome: Outcome, state: JobState, run_at: Option<u64>) {
        let job = self.jobs.get_mut(&id).expect("ended job exists");
        if matches!(
            outcome,
            Outcome::Failed(_)
                | Outcome::FailedPermanently(_)
                | Outcome::LeaseExpired { .. }
                | Outcome::Stalled
        ) {
            job.failures += 1;
        }
        job.state = state;
        job.lease = None;
        if let Some(r) = run_at {
            job.run_at = r;
        }
        if let Some(run) = self.runs.get_mut(&(id, job.attempt)) {
            run.1 = Some(outcome);
        }
        if terminal(state) {
            self.ended(MTarget::Job(id));
        }
    }
}

pub fn waiting(s: JobState) -> bool {
    matches!(s, JobState::Queued | JobState::RetryWait)
}

pub fn terminal(s: JobState) -> bool {
    matches!(
        s,
        JobState::Succeeded | JobState::Dead | JobState::Cancelled | JobState::Expired
    )
}

fn expired(j: &MJob, now: u64) -> bool {
    j.state == JobState::Running && j.lease.as_ref().is_some_and(|l| l.expires_at <= now)
}
