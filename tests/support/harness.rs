//! Drives a store and the reference model with the same operations and reports the first
//! divergence or broken invariant. Shared by the model-based property test and the
//! operation-sequence fuzzer, and run against both backends: the redb `Store` and (with the
//! `postgres` feature and a server) a `PgStore` on a simulated clock.
//!
//! The backends' documented differences, and only those, are allowed for: opening a redb
//! store takes back every lease its closed process held (the file lock proves that process
//! gone), while opening a PostgreSQL store takes nothing (other machines may hold leases), and
//! a process instance's death is a redb notion.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::{
    Durability, Error, JobId, JobState, LeaseTerms, ManualClock, NewJob, Renewal, RetryPolicy,
    Store,
};

use crate::backends::ModelStore;

/// The store under test and how to open it again.
#[allow(dead_code)] // the fuzz replay drives only redb
#[allow(clippy::large_enum_variant)] // one per harness
enum Backing {
    Redb {
        dir: tempfile::TempDir,
        store: Option<Store>,
    },
    Memory(leasehold::memory::MemoryStore),
    #[cfg(feature = "postgres")]
    Postgres {
        builder: leasehold::postgres::PgStoreBuilder,
        store: leasehold::postgres::PgStore,
        admin: leasehold::postgres::client::Client,
        schema: String,
    },
}

impl Backing {
    fn store(&self) -> &dyn ModelStore {
        match self {
            Backing::Redb { store, .. } => store.as_ref().expect("store open"),
            Backing::Memory(store) => store,
            #[cfg(feature = "postgres")]
            Backing::Postgres { store, .. } => store,
        }
    }
}

#[cfg(feature = "postgres")]
impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Postgres { admin, schema, .. } = self {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

use crate::model::{self, MErr, MRenewal, Model, SEC};

pub const QUEUES: [&str; 2] = ["alpha", "beta"];
pub const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
/// A small reap batch, so reaping a handful of leases already takes several transactions.
pub const REAP_BATCH: usize = 2;

#[derive(Clone, Debug)]
pub enum Op {
    Enqueue {
        queue: u8,
        priority: i8,
        delay_s: u8,
        max_attempts: Option<u8>,
        unique: Option<u8>,
        /// What it waits for: (job or group number, kind): bit 2 a group, bits 0-1 what it
        /// accepts besides success (nothing, dead, cancelled, any end).
        after: Vec<(u16, u8)>,
        /// The group it joins, by number.
        group: Option<u8>,
        /// Its own retry policy ([`backoff`]).
        backoff: Option<u8>,
        /// Its limit key, `t{limit % 3}`.
        limit: Option<u8>,
        /// Its expiry, `expires % 8` tens of seconds after its enqueue (refused where it is
        /// delayed as long or longer).
        expires: Option<u8>,
    },
    /// Sets (or lifts) a queue's retry policy ([`backoff`]).
    Backoff {
        queue: u8,
        policy: Option<u8>,
    },
    /// An operator's edit: a new priority (`priority % 3`), due now if `promote`, naming the
    /// attempt last seen (`stale`: the one before it) if `fenced`.
    Edit {
        job: u16,
        priority: Option<i8>,
        promote: bool,
        fenced: bool,
        stale: bool,
    },
    /// Opens a group with callbacks: `callbacks % 4` says which (on completion, on success).
    OpenGroup {
        callbacks: u8,
        /// The group it joins, by number.
        parent: Option<u8>,
    },
    SealGroup {
        group: u8,
    },
    CancelGroup {
        group: u8,
    },
    Claim {
        queue: u8,
        worker: u8,
        lease_s: u8,
        stall_s: Option<u8>,
    },
    /// A claim over several queues (`JobStore::claim_queues`): each `(queue, count % 3)`.
    ClaimQueues {
        plan: Vec<(u8, u8)>,
        worker: u8,
        lease_s: u8,
    },
    ClaimJob {
        job: u16,
        worker: u8,
        lease_s: u8,
    },
    /// Up to `n % 4 + 1` jobs in one transaction: the same as that many claims at one instant.
    ClaimBatch {
        queue: u8,
        worker: u8,
        lease_s: u8,
        n: u8,
    },
    Heartbeat {
        lease: u16,
        progress: bool,
    },
    Complete {
        lease: u16,
    },
    /// A checkpoint of one byte saved under a lease, then read back.
    SaveCheckpoint {
        lease: u16,
        data: u8,
    },
    /// Two leases (perhaps the same one twice) completed in one commit.
    CompleteBatch {
        leases: (u16, u16),
    },
    /// A pool's round: two leases completed and up to `n % 4 + 1` jobs claimed, as if the
    /// completions came first (on PostgreSQL the two halves run at once in the harness).
    Round {
        leases: (u16, u16),
        queue: u8,
        worker: u8,
        lease_s: u8,
        n: u8,
    },
    /// A failure, retried while the budget lasts or (`permanent`) never.
    Fail {
        lease: u16,
        permanent: bool,
    },
    Release {
        lease: u16,
    },
    Cancel {
        job: u16,
    },
    /// An operator's retry of a dead or cancelled job.
    Retry {
        job: u16,
    },
    /// The holder puts its job off ("not yet").
    Snooze {
        lease: u16,
        secs: u8,
    },
    /// An operator pauses or resumes a queue.
    Pause {
        queue: u8,
        pause: bool,
    },
    /// An operator sets a queue's limits: at most `concurrency % 3 + 1` held at once, at
    /// most `rate % 3 + 1` claims per 30 s.
    Limit {
        queue: u8,
        concurrency: Option<u8>,
        rate: Option<u8>,
        /// At most `per_key % 2 + 1` of one limit key's jobs held at once.
        per_key: Option<u8>,
        /// At most `key_rate % 2 + 1` claims of one limit key's jobs per 30 s.
        key_rate: Option<u8>,
    },
    Advance {
        secs: u16,
    },
    Reap,
    /// A purge of the jobs in the states `states` names (bits: succeeded, dead, cancelled,
    /// expired) that finished `older_than_s % 300` seconds ago or more, and of the groups
    /// nothing then refers to.
    Purge {
        older_than_s: u16,
        states: u8,
    },
    Reopen,
    /// The process that holds every lease dies, and a survivor takes them back at once.
    ProcessDies,
}

/// The process instance every lease of the harness is granted to.
const HOLDER: leasehold::InstanceId = leasehold::InstanceId(7);

pub struct Harness {
    backing: Backing,
    clock: ManualClock,
    pub model: Model,
    /// Every lease ever granted, stale ones included: (job, attempt, lease as returned).
    leases: Vec<leasehold::Lease>,
    /// The progress each lease reported last.
    progress: BTreeMap<(u64, u32), u64>,
    /// Each job's attempt as last seen, to prove attempts only grow.
    attempts: BTreeMap<u64, u32>,
    /// Where the harness has read the store's endings to, and how many of the model's.
    read_to: (leasehold::EndCursor, usize),
}

fn builder(path: &std::path::Path, clock: &ManualClock) -> leasehold::StoreBuilder {
    Store::builder(path)
        .clock(clock.clone())
        .sharing(leasehold::Sharing::Exclusive)
        .durability(Durability::Eventual {
            flush_every: Duration::from_secs(1 << 30),
        })
        .retry_policy(RetryPolicy::exponential(
            Duration::from_nanos(model::BACKOFF_BASE),
            Duration::from_nanos(model::BACKOFF_MAX),
        ))
        .default_max_attempts(model::DEFAULT_MAX_ATTEMPTS)
        .reap_batch(REAP_BATCH)
        .verify_on_open(false)
        .simulated_instance(HOLDER)
}

impl Harness {
    /// Declares `queue` to the store, as an application does before it sets the controls
    /// of a queue that may have no job yet (the store refuses a queue it does not know; the
    /// model knows every queue).
    fn declared(&self, queue: &str) -> Result<(), String> {
        self.store()
            .declare_queue(queue)
            .map_err(|e| format!("declare {queue}: {e}"))
    }

    pub fn new() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = ManualClock::new();
        let store = builder(&dir.path().join("model.redb"), &clock)
            .open()
            .expect("open");
        Harness {
            backing: Backing::Redb {
                dir,
                store: Some(store),
            },
            clock,
            model: Model::new(),
            leases: Vec::new(),
            progress: BTreeMap::new(),
            attempts: BTreeMap::new(),
            read_to: (leasehold::EndCursor::START, 0),
        }
    }

    /// A harness on a store in memory, on the harness's simulated clock.
    #[allow(dead_code)] // the fuzz replay drives only redb
    pub fn memory() -> Harness {
        let clock = ManualClock::new();
        let store = leasehold::memory::MemoryStore::new(clock.clone())
            .with_policy(memory_policy())
            .expect("a store in memory");
        Harness {
            backing: Backing::Memory(store),
            clock,
            model: Model::new(),
            leases: Vec::new(),
            progress: BTreeMap::new(),
            attempts: BTreeMap::new(),
            read_to: (leasehold::EndCursor::START, 0),
        }
    }

    /// A harness on a PostgreSQL store in a schema of its own at `url`, on the harness's
    /// simulated clock; with `shortcuts` false, the store takes none of its one-statement
    /// shortcuts (the protocol's own steps only).
    #[cfg(feature = "postgres")]
    #[allow(dead_code)] // the fuzz replay drives only redb
    pub fn postgres(url: &str, schema: &str, shortcuts: bool) -> Harness {
        let clock = ManualClock::new();
        let builder = leasehold::postgres::PgStore::builder(url)
            .schema(schema)
            .simulated_clock(clock.clone())
            .shortcuts(shortcuts)
            .retry_policy(RetryPolicy::exponential(
                Duration::from_nanos(model::BACKOFF_BASE),
                Duration::from_nanos(model::BACKOFF_MAX),
            ))
            .default_max_attempts(model::DEFAULT_MAX_ATTEMPTS)
            .reap_batch(REAP_BATCH)
            // every round's completions and claim at once, in two transactions
            .side_by_side_from(1);
        let admin =
            leasehold::postgres::client::Client::connect(url, leasehold::postgres::client::NoTls)
                .expect("connect as admin");
        let store = builder.clone().open().expect("open the PostgreSQL store");
        Harness {
            backing: Backing::Postgres {
                builder,
                store,
                admin,
                schema: schema.to_owned(),
            },
            clock,
            model: Model::new(),
            leases: Vec::new(),
            progress: BTreeMap::new(),
            attempts: BTreeMap::new(),
            read_to: (leasehold::EndCursor::START, 0),
        }
    }

    fn store(&self) -> &dyn ModelStore {
        self.backing.store()
    }

    fn job_id(&self, n: u16) -> u64 {
        // Mostly existing jobs, sometimes one that does not exist.
        let known = self.model.next_id;
        u64::from(n) % (known + 1)
    }

    fn group_id(&self, n: u16) -> u64 {
        // Mostly existing groups, sometimes one that does not exist.
        u64::from(n) % (self.model.groups_made + 2)
    }

    fn lease(&self, n: u16) -> Option<leasehold::Lease> {
        if self.leases.is_empty() {
            return None;
        }
        Some(self.leases[usize::from(n) % self.leases.len()].clone())
    }

    /// Applies every op to both sides, comparing after each (and, after a reap, that no
    /// expired lease is left); the first divergence, with its step.
    pub fn run(&mut self, ops: &[Op]) -> Result<(), String> {
        for (i, op) in ops.iter().enumerate() {
            let before: BTreeMap<String, u64> = QUEUES
                .iter()
                .map(|q| (q.to_string(), self.model.running(q)))
                .collect();
            let step = self
                .apply(op)
                .and_then(|()| self.check())
                .and_then(|()| self.within_limits(&before))
                .and_then(|()| {
                    if matches!(op, Op::Reap) {
                        self.no_expired_lease_left()
                    } else {
                        Ok(())
                    }
                });
            if let Err(why) = step {
                return Err(format!("step {i} {op:?}: {why}"));
            }
        }
        Ok(())
    }

    /// Applies `op` to both sides and compares their answers.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Enqueue {
                queue,
                priority,
                delay_s,
                max_attempts,
                unique,
                after,
                group,
                backoff: own,
                limit,
                expires,
            } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let key = unique.map(|u| format!("k{}", u % 3));
                let delay = u64::from(*delay_s % 4) * 10 * SEC;
                let max = max_attempts.map(|m| u32::from(m % 4));
                let mut job = NewJob::new(q, b"payload".to_vec())
                    .priority(i32::from(*priority % 3))
                    .delay(Duration::from_nanos(delay));
                if let Some(m) = max {
                    job = job.max_attempts(m);
                }
                if let Some(k) = &key {
                    job = job.unique_key(k);
                }
                let mut needs = Vec::new();
                for &(n, kind) in after {
                    let (dead_ok, cancelled_ok) = (kind & 1 == 1, kind & 2 == 2);
                    let on = match kind & 4 {
                        0 => model::MTarget::Job(self.job_id(n)),
                        _ => model::MTarget::Group(self.group_id(n)),
                    };
                    let mut require = leasehold::Require::success();
                    if dead_ok {
                        require = require.or_dead();
                    }
                    if cancelled_ok {
                        require = require.or_cancelled();
                    }
                    job = job.after_with(
                        match on {
                            model::MTarget::Job(id) => leasehold::Target::Job(JobId(id)),
                            model::MTarget::Group(g) => {
                                leasehold::Target::Group(leasehold::GroupId(g))
                            }
                        },
                        require,
                    );
                    needs.push((on, dead_ok, cancelled_ok));
                }
                let group = group.map(|g| self.group_id(u16::from(g)));
                if let Some(g) = group {
                    job = job.in_group(leasehold::GroupId(g));
                }
                let own = own.map(backoff);
                if let Some((policy, _)) = &own {
                    job = job.retry_policy(policy.clone());
                }
                let limit_key = limit.map(|l| format!("t{}", l % 3));
                if let Some(k) = &limit_key {
                    job = job.limit_key(k.as_str());
                }
                let expiry = expires.map(|e| u64::from(e % 8) * 10 * SEC);
                if let Some(e) = expiry {
                    job = job.expires_in(Duration::from_nanos(e));
                }
                let got = self.store().enqueue(job).map(|id| id.0).map_err(err);
                let made = self.model.next_id;
                let want = match expiry {
                    Some(e) if delay > 0 && e <= delay => Err(MErr::Input),
                    _ => self.model.enqueue_waiting(
                        q,
                        i32::from(*priority % 3),
                        delay,
                        max,
                        key.as_deref(),
                        &needs,
                        group,
                        false,
                    ),
                };
                if let (Ok(id), Some(e)) = (&want, expiry)
                    && *id == made
                {
                    let now = self.model.now;
                    self.model.jobs.get_mut(id).expect("made").expires_at = Some(now + e);
                }
                if let (Ok(id), Some((_, policy))) = (&want, own)
                    && *id == made
                {
                    self.model.jobs.get_mut(id).expect("made").backoff = Some(policy);
                }
                if let Ok(id) = &want
                    && *id == made
                {
                    self.model.jobs.get_mut(id).expect("made").key = limit_key;
                }
                same("enqueue", got, want)
            }
            Op::Backoff { queue, policy } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let policy = policy.map(backoff);
                // (an application declares the queues whose controls it sets: see `declared`)
                self.declared(q)?;
                self.store()
                    .set_queue_retry_policy(q, policy.as_ref().map(|(p, _)| p.clone()))
                    .map_err(|e| format!("backoff: {e}"))?;
                self.model.set_backoff(q, policy.map(|(_, m)| m));
                Ok(())
            }
            Op::Edit {
                job,
                priority,
                promote,
                fenced,
                stale,
            } => {
                let id = self.job_id(*job);
                let priority = priority.map(|p| i32::from(p % 3));
                let seen = self.model.jobs.get(&id).map_or(0, |j| j.attempt);
                let if_attempt = fenced.then(|| match stale {
                    true => seen.saturating_sub(1),
                    false => seen,
                });
                let mut edit = leasehold::Edit::new();
                if let Some(p) = priority {
                    edit = edit.priority(p);
                }
                if *promote {
                    edit = edit.now();
                }
                if let Some(a) = if_attempt {
                    edit = edit.if_attempt(leasehold::Attempt(a));
                }
                let got = self.store().edit(JobId(id), edit).map_err(err);
                let want = self.model.edit(id, priority, *promote, if_attempt);
                same("edit", got, want)
            }
            Op::OpenGroup { callbacks, parent } => {
                let (complete, success) = (callbacks & 1 == 1, callbacks & 2 == 2);
                let q = QUEUES[usize::from(*callbacks >> 2) % QUEUES.len()];
                // (the top bits: a key of three, or none)
                let key = (*callbacks >> 6 != 0).then(|| format!("key-{}", callbacks >> 6));
                let mut new = leasehold::NewGroup::new();
                if let Some(key) = &key {
                    new = new.key(key);
                }
                if complete {
                    new = new.on_complete(NewJob::new(q, b"on complete".to_vec()));
                }
                if success {
                    new = new.on_success(NewJob::new(q, b"on success".to_vec()));
                }
                let parent = parent.map(|p| self.group_id(u16::from(p)));
                if let Some(p) = parent {
                    new = new.in_group(leasehold::GroupId(p));
                }
                let got = self.store().open_group(new).map(|g| g.0).map_err(err);
                let want = (self.model).open_group(complete, success, q, key.as_deref(), parent);
                same("open group", got, want)
            }
            Op::SealGroup { group } => {
                let g = self.group_id(u16::from(*group));
                let got = (self.store().seal_group(leasehold::GroupId(g))).map_err(err);
                same("seal group", got, self.model.seal_group(g))
            }
            Op::CancelGroup { group } => {
                let g = self.group_id(u16::from(*group));
                let got = (self.store().cancel_group(leasehold::GroupId(g))).map_err(err);
                same("cancel group", got, self.model.cancel_group(g))
            }
            Op::Claim {
                queue,
                worker,
                lease_s,
                stall_s,
            } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let w = WORKERS[usize::from(*worker) % WORKERS.len()];
                let length = lease_len(*lease_s);
                let stall = stall_s.map(|s| u64::from(s % 3 + 1) * 30 * SEC);
                let mut terms = LeaseTerms::new(Duration::from_nanos(length));
                if let Some(s) = stall {
                    terms = terms.stall_timeout(Duration::from_nanos(s));
                }
                let got = self
                    .store()
                    .claim(q, w, terms)
                    .map_err(|e| format!("claim: {e}"))?;
                let want = self.model.claim(q, w, length, stall);
                self.granted("claim", got, want)
            }
            Op::ClaimBatch {
                queue,
                worker,
                lease_s,
                n,
            } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let w = WORKERS[usize::from(*worker) % WORKERS.len()];
                let length = lease_len(*lease_s);
                let n = usize::from(*n % 4) + 1;
                let got = self
                    .store()
                    .claim_batch(q, w, LeaseTerms::new(Duration::from_nanos(length)), n)
                    .map_err(|e| format!("claim_batch: {e}"))?;
                self.granted_batch("claim_batch", got, (q, w, length, n))
            }
            Op::ClaimQueues {
                plan,
                worker,
                lease_s,
            } => {
                let plan: Vec<(&str, usize)> = (plan.iter())
                    .map(|&(q, n)| (QUEUES[usize::from(q) % QUEUES.len()], usize::from(n % 3)))
                    .collect();
                let w = WORKERS[usize::from(*worker) % WORKERS.len()];
                let length = lease_len(*lease_s);
                let got = self
                    .store()
                    .claim_queues(&plan, w, LeaseTerms::new(Duration::from_nanos(length)))
                    .map_err(|e| format!("claim_queues: {e}"))?;
                let got_keys: Vec<_> = got.iter().map(|l| (l.job.0, l.attempt.0)).collect();
                let want = self.model.claim_queues(&plan, w, length);
                if got_keys != want {
                    return Err(format!(
                        "claim_queues {plan:?}: store granted {got_keys:?}, model {want:?}"
                    ));
                }
                self.leases.extend(got);
                Ok(())
            }
            Op::ClaimJob {
                job,
                worker,
                lease_s,
            } => {
                let id = self.job_id(*job);
                let w = WORKERS[usize::from(*worker) % WORKERS.len()];
                let length = lease_len(*lease_s);
                let got = self
                    .store()
                    .claim_job(JobId(id), w, LeaseTerms::new(Duration::from_nanos(length)))
                    .map_err(err);
                let want = self.model.claim_job(id, w, length, None);
                match (got, want) {
                    (Ok(g), Ok(w)) => self.granted("claim_job", g, w),
                    (got, want) => same(
                        "claim_job",
                        got.map(|l| l.map(|l| (l.job.0, l.attempt.0))),
                        want,
                    ),
                }
            }
            Op::Heartbeat { lease, progress } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let key = (l.job.0, l.attempt.0);
                let p = self.progress.get(&key).copied().unwrap_or(0) + u64::from(*progress);
                self.progress.insert(key, p);
                let got = self.store().heartbeat(&l, p).map_err(err).map(|r| match r {
                    Renewal::Renewed { expires_at } => MRenewal::Renewed(expires_at.0),
                    Renewal::Cancelled => MRenewal::Cancelled,
                    Renewal::Stalled => MRenewal::Stalled,
                    Renewal::TimedOut => MRenewal::TimedOut,
                    other => panic!("a renewal the model does not know: {other:?}"),
                });
                let want = self.model.heartbeat(l.job.0, l.attempt.0, p);
                same("heartbeat", got, want)
            }
            Op::SaveCheckpoint { lease, data } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let got = self.store().save_checkpoint(&l, &[*data]).map_err(err);
                let want = self.model.save_checkpoint(l.job.0, l.attempt.0, *data);
                same("save checkpoint", got, want)?;
                let read = self.store().checkpoint(l.job).map_err(err);
                let got = read.map(|c| c.map(|c| (c.attempt().0, c.into_data())));
                let want = Ok(self.model.checkpoints.get(&l.job.0).cloned());
                same("checkpoint", got, want)
            }
            Op::Complete { lease } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let got = self.store().complete(&l, b"out").map_err(err);
                let want = self.model.complete(l.job.0, l.attempt.0);
                same("complete", got, want)
            }
            Op::CompleteBatch { leases } => {
                let (Some(a), Some(b)) = (self.lease(leases.0), self.lease(leases.1)) else {
                    return Ok(());
                };
                let got = self
                    .store()
                    .complete_batch(&[(&a, b"out".as_slice()), (&b, b"out".as_slice())]);
                for (l, got) in [&a, &b].into_iter().zip(got) {
                    let want = self.model.complete(l.job.0, l.attempt.0);
                    same("complete_batch", got.map_err(err), want)?;
                }
                Ok(())
            }
            Op::Round {
                leases,
                queue,
                worker,
                lease_s,
                n,
            } => {
                let (Some(a), Some(b)) = (self.lease(leases.0), self.lease(leases.1)) else {
                    return Ok(());
                };
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let w = WORKERS[usize::from(*worker) % WORKERS.len()];
                let length = lease_len(*lease_s);
                let n = usize::from(*n % 4) + 1;
                let terms = LeaseTerms::new(Duration::from_nanos(length));
                let done = [(&a, b"out".as_slice()), (&b, b"out".as_slice())];
                let (completed, claimed) =
                    self.store().complete_batch_and_claim(&done, q, w, terms, n);
                for (l, got) in [&a, &b].into_iter().zip(completed) {
                    let want = self.model.complete(l.job.0, l.attempt.0);
                    same("round: complete", got.map_err(err), want)?;
                }
                let got = claimed.map_err(|e| format!("round: claim: {e}"))?;
                self.granted_batch("round: claim", got, (q, w, length, n))
            }
            Op::Fail { lease, permanent } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let got = match permanent {
                    true => self.store().fail_permanently(&l, "boom"),
                    false => self.store().fail(&l, "boom"),
                };
                let want = self.model.fail(l.job.0, l.attempt.0, "boom", *permanent);
                same("fail", got.map_err(err), want)
            }
            Op::Release { lease } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let got = self.store().release(&l).map_err(err);
                let want = self.model.release(l.job.0, l.attempt.0).map(|_| ());
                same("release", got, want)
            }
            Op::Cancel { job } => {
                let id = self.job_id(*job);
                let got = self.store().cancel(JobId(id)).map_err(err);
                let want = self.model.cancel(id);
                same("cancel", got, want)
            }
            Op::Retry { job } => {
                let id = self.job_id(*job);
                let got = self.store().retry(JobId(id)).map_err(err);
                let want = self.model.retry(id);
                same("retry", got, want)
            }
            Op::Snooze { lease, secs } => {
                let Some(l) = self.lease(*lease) else {
                    return Ok(());
                };
                let delay = u64::from(*secs % 60) * SEC;
                let got = self
                    .store()
                    .snooze(&l, Duration::from_nanos(delay))
                    .map_err(err);
                let want = self.model.snooze(l.job.0, l.attempt.0, delay);
                same("snooze", got, want)
            }
            Op::Pause { queue, pause } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                self.declared(q)?;
                match pause {
                    true => self.store().pause_queue(q),
                    false => self.store().resume_queue(q),
                }
                .map_err(|e| format!("pause: {e}"))?;
                self.model.pause(q, *pause);
                Ok(())
            }
            Op::Limit {
                queue,
                concurrency,
                rate,
                per_key,
                key_rate,
            } => {
                let q = QUEUES[usize::from(*queue) % QUEUES.len()];
                let concurrency = concurrency.map(|c| u32::from(c % 3) + 1);
                let rate = rate.map(|r| (u32::from(r % 3) + 1, 30 * SEC));
                let mut limits = leasehold::QueueLimits::none();
                if let Some(c) = concurrency {
                    limits = limits.concurrency(c);
                }
                if let Some((claims, per)) = rate {
                    limits = limits.rate(claims, Duration::from_nanos(per));
                }
                let per_key = per_key.map(|p| u32::from(p % 2) + 1);
                if let Some(n) = per_key {
                    limits = limits.per_key(n);
                }
                let key_rate = key_rate.map(|r| (u32::from(r % 2) + 1, 30 * SEC));
                if let Some((claims, per)) = key_rate {
                    limits = limits.per_key_rate(claims, Duration::from_nanos(per));
                }
                self.declared(q)?;
                self.store()
                    .set_queue_limits(q, limits)
                    .map_err(|e| format!("limit: {e}"))?;
                self.model.limit(q, concurrency, rate, per_key, key_rate);
                Ok(())
            }
            Op::Advance { secs } => {
                let d = u64::from(*secs % 200) * SEC;
                self.clock.advance(Duration::from_nanos(d));
                self.model.now += d;
                Ok(())
            }
            Op::Purge {
                older_than_s,
                states,
            } => {
                let older_than = u64::from(*older_than_s % 300) * SEC;
                let all = [
                    JobState::Succeeded,
                    JobState::Dead,
                    JobState::Cancelled,
                    JobState::Expired,
                ];
                let states: Vec<JobState> = (all.iter().enumerate())
                    .filter(|(i, _)| states & (1 << i) != 0)
                    .map(|(_, s)| *s)
                    .collect();
                let groups: Vec<u64> = self.model.groups.keys().copied().collect();
                let got = (self.store())
                    .purge(Duration::from_nanos(older_than), &states)
                    .map_err(|e| format!("purge: {e}"))?;
                same(
                    "purge",
                    Ok::<_, MErr>(got),
                    Ok(self.model.purge(older_than, &states)),
                )?;
                for g in groups {
                    let stored = (self.store().group(leasehold::GroupId(g)))
                        .map_err(|e| format!("group: {e}"))?
                        .is_some();
                    if stored != self.model.groups.contains_key(&g) {
                        return Err(format!("group {g}: stored {stored} after the purge"));
                    }
                }
                Ok(())
            }
            Op::Reap => {
                let report = self.store().reap().map_err(|e| format!("reap: {e}"))?;
                for (i, r) in report.reclaimed.iter().enumerate() {
                    if i / REAP_BATCH >= report.batches {
                        return Err("a reap batch exceeded the configured size".into());
                    }
                    let _ = r;
                }
                let mut got: Vec<u64> = report.reclaimed.iter().map(|r| r.job.0).collect();
                got.sort_unstable();
                let want = self.model.reap();
                same("reap", Ok::<_, MErr>(got), Ok(want))?;
                let got: Vec<u64> = report.expired.iter().map(|id| id.0).collect();
                let want = self.model.expire_waiting();
                same("reap's expiries", Ok::<_, MErr>(got), Ok(want))
            }
            Op::ProcessDies => {
                let Backing::Redb {
                    store: Some(store), ..
                } = &self.backing
                else {
                    return Ok(()); // a redb notion: other stores have no process instances
                };
                let got = store
                    .reclaim_dead_instance(HOLDER)
                    .map_err(|e| format!("process death: {e}"))?;
                let want = self.model.process_died();
                if got != want.len() {
                    return Err(format!(
                        "process death: store took back {got}, model {want:?}"
                    ));
                }
                Ok(())
            }
            Op::Reopen => match &mut self.backing {
                Backing::Redb { dir, store } => {
                    *store = None;
                    let reopened = builder(&dir.path().join("model.redb"), &self.clock)
                        .open()
                        .map_err(|e| format!("reopen: {e}"))?;
                    *store = Some(reopened);
                    self.model.reopen();
                    Ok(())
                }
                // A new handle takes nothing back: other machines may hold the leases.
                Backing::Memory(store) => {
                    *store = store
                        .with_policy(memory_policy())
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
                #[cfg(feature = "postgres")]
                Backing::Postgres { builder, store, .. } => {
                    *store = builder.clone().open().map_err(|e| format!("reopen: {e}"))?;
                    Ok(())
                }
            },
        }
    }

    /// Compares a batch the store granted with up to `n` claims of the model (queue,
    /// worker, lease length, n), and keeps the leases.
    fn granted_batch(
        &mut self,
        what: &str,
        got: Vec<leasehold::Lease>,
        (queue, worker, length, n): (&str, &str, u64, usize),
    ) -> Result<(), String> {
        let got_keys: Vec<_> = got.iter().map(|l| (l.job.0, l.attempt.0)).collect();
        let want: Vec<_> = (0..n)
            .map_while(|_| self.model.claim(queue, worker, length, None))
            .collect();
        if got_keys != want {
            return Err(format!(
                "{what}: store granted {got_keys:?}, model {want:?}"
            ));
        }
        self.leases.extend(got);
        Ok(())
    }

    fn granted(
        &mut self,
        what: &str,
        got: Option<leasehold::Lease>,
        want: Option<(u64, u32)>,
    ) -> Result<(), String> {
        let got_key = got.as_ref().map(|l| (l.job.0, l.attempt.0));
        if got_key != want {
            return Err(format!("{what}: store granted {got_key:?}, model {want:?}"));
        }
        if let Some(l) = got {
            self.leases.push(l);
        }
        Ok(())
    }

    /// Compares every job, its history and the counters, and checks the invariants.
    pub fn check(&mut self) -> Result<(), String> {
        let store = self.backing.store();
        let now = store.now().expect("store time").0;
        if now != self.model.now {
            return Err(format!("store time {now} != model time {}", self.model.now));
        }
        let report = store.check().map_err(|e| format!("check: {e}"))?;
        if !report.is_clean() {
            return Err(format!("check: {:?}", report.problems));
        }
        // The ends since the last step: the same, each once (in one step, in either order).
        let mut want = self.model.endings[self.read_to.1..].to_vec();
        let (mut got, mut at) = (Vec::new(), self.read_to.0);
        // (On PostgreSQL an ending is read once every older transaction on the server has
        // ended, which another test's may not have yet: a generous deadline. Elsewhere what
        // committed is read at once.)
        #[cfg(feature = "postgres")]
        let wait = matches!(self.backing, Backing::Postgres { .. });
        #[cfg(not(feature = "postgres"))]
        let wait = false;
        let wait = Duration::from_secs(if wait { 60 } else { 0 });
        #[allow(clippy::disallowed_methods)]
        let deadline = std::time::Instant::now() + wait;
        loop {
            let page = store
                .endings(at, 1000)
                .map_err(|e| format!("endings: {e}"))?;
            if page.gap {
                return Err(format!("endings after {at}: a gap"));
            }
            at = page.next;
            got.extend(page.list.iter().map(|e| {
                let of = match &e.of {
                    leasehold::EndOf::Job { id, .. } => model::MTarget::Job(id.0),
                    leasehold::EndOf::Group(g) => model::MTarget::Group(g.0),
                    _ => model::MTarget::Job(u64::MAX),
                };
                (of, e.state)
            }));
            #[allow(clippy::disallowed_methods)]
            if got.len() >= want.len() || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::yield_now();
        }
        got.sort();
        want.sort();
        if got != want {
            return Err(format!("endings: store {got:?}, model {want:?}"));
        }
        self.read_to = (at, self.model.endings.len());
        let stats = store.stats().map_err(|e| format!("stats: {e}"))?;
        let total: u64 = stats.queues.values().map(|q| q.total()).sum();
        if total != self.model.jobs.len() as u64 {
            return Err(format!(
                "store has {total} jobs, model {}",
                self.model.jobs.len()
            ));
        }
        for (id, m) in &self.model.jobs {
            let Some(job) = store.job(JobId(*id)).map_err(|e| e.to_string())? else {
                return Err(format!("job {id} disappeared"));
            };
            let lease = job.lease().map(|l| (l.owner(), l.expires_at().0));
            let want_lease = m.lease.as_ref().map(|l| (l.owner.as_str(), l.expires_at));
            let got = (
                job.state(),
                job.attempt().0,
                job.failures(),
                lease,
                job.cancel_requested(),
                job.expires_at().map(|t| t.0),
            );
            let want = (
                m.state,
                m.attempt,
                m.failures,
                want_lease,
                m.cancel_requested,
                m.expires_at,
            );
            if got != want {
                return Err(format!("job {id}: store {got:?}, model {want:?}"));
            }
            if model::waiting(m.state) && job.run_at().0 != m.run_at {
                return Err(format!(
                    "job {id}: run_at {} != {}",
                    job.run_at().0,
                    m.run_at
                ));
            }
            // Nothing waits for ever: a blocked job waits for something not over yet, and
            // every need it saw end, it saw end as it accepts (else it would be cancelled).
            if job.state() == JobState::Blocked {
                let mut open = false;
                for need in job.needs() {
                    if need.broken() {
                        return Err(format!("job {id} is blocked on a broken need {need:?}"));
                    }
                    open |= match need.on() {
                        leasehold::Target::Job(dep) => store
                            .job(dep)
                            .map_err(|e| e.to_string())?
                            .is_some_and(|d| !model::terminal(d.state())),
                        leasehold::Target::Group(g) => store
                            .group(g)
                            .map_err(|e| e.to_string())?
                            .is_some_and(|g| g.finished_at().is_none()),
                        other => {
                            return Err(format!("a target the harness does not know: {other:?}"));
                        }
                    } && need.ended().is_none();
                }
                if !open {
                    return Err(format!("job {id} is blocked with nothing left to wait for"));
                }
            }
            let prev = self.attempts.insert(*id, m.attempt).unwrap_or(0);
            if m.attempt < prev {
                return Err(format!(
                    "job {id}: attempt went from {prev} back to {}",
                    m.attempt
                ));
            }
            // history: one record per attempt, ended for every attempt but a running one
            let history = store.history(JobId(*id)).map_err(|e| e.to_string())?;
            if history.len() != m.attempt as usize {
                return Err(format!(
                    "job {id}: {} runs for {} attempts",
                    history.len(),
                    m.attempt
                ));
            }
            for run in &history {
                let (worker, outcome) = &self.model.runs[&(*id, run.attempt().0)];
                if (run.worker(), run.outcome()) != (worker.as_str(), outcome.as_ref()) {
                    return Err(format!(
                        "job {id} attempt {}: store {:?}/{:?}, model {worker:?}/{outcome:?}",
                        run.attempt(),
                        run.worker(),
                        run.outcome()
                    ));
                }
            }
            // a reaped store holds no lease that expired before the last reap... checked by
            // comparing with the model, whose reap takes every expired lease.
        }
        let c = &stats.counters;
        let got = (
            c.reclaimed_by_reaper,
            c.reclaimed_by_takeover,
            c.reclaimed_at_open,
            c.reclaimed_process_died,
            c.released,
            c.leases_lost,
            c.fenced_writes_rejected,
            c.stalled,
            c.snoozed,
            c.worst_detection_delay.as_nanos() as u64,
        );
        let m = &self.model.counters;
        let want = (
            m.reaper,
            m.takeover,
            m.at_open,
            m.process_died,
            m.released,
            m.leases_lost,
            m.fenced,
            m.stalled,
            m.snoozed,
            m.worst_detection,
        );
        if got != want {
            return Err(format!("counters: store {got:?}, model {want:?}"));
        }
        let open = self.model.groups.values().filter(|g| !g.done);
        let want = open.fold((0, 0), |(n, w), g| (n + 1, w + g.waiters.len() as u64));
        if (stats.open_groups, stats.waiting_for_groups) != want {
            return Err(format!(
                "open groups and their waiters: store {:?}, model {want:?}",
                (stats.open_groups, stats.waiting_for_groups)
            ));
        }
        for (g, m) in &self.model.groups {
            let Some(group) = store
                .group(leasehold::GroupId(*g))
                .map_err(|e| format!("group: {e}"))?
            else {
                return Err(format!("group {g} disappeared"));
            };
            let got = (
                group.is_sealed(),
                group.finished_at().is_some(),
                group.members(),
                group.ended(),
                group.waiters().iter().map(|w| w.0).collect::<Vec<_>>(),
                group.parent().map(|p| p.0),
                group.subgroups().iter().map(|s| s.0).collect::<Vec<_>>(),
            );
            let want = (
                m.sealed,
                m.done,
                m.members,
                m.ended,
                m.waiters.clone(),
                m.parent,
                m.subgroups.clone(),
            );
            if got != want {
                return Err(format!("group {g}: store {got:?}, model {want:?}"));
            }
        }
        for q in QUEUES {
            let settings = store
                .queue_settings(q)
                .map_err(|e| format!("queue settings: {e}"))?;
            let m = self.model.queues.get(q).cloned().unwrap_or_default();
            let got = (
                settings.paused,
                settings.limits.concurrency,
                settings
                    .limits
                    .rate
                    .map(|r| (r.claims, r.per.as_nanos() as u64)),
            );
            if got != (m.paused, m.concurrency, m.rate) {
                return Err(format!("queue {q}: store {got:?}, model {m:?}"));
            }
        }
        Ok(())
    }

    /// After a claim: no claim took a queue past its concurrency limit (the limit holds at
    /// every instant, but for a limit lowered below what already ran).
    fn within_limits(&self, before: &BTreeMap<String, u64>) -> Result<(), String> {
        for q in QUEUES {
            let Some(limit) = self.model.queues.get(q).and_then(|m| m.concurrency) else {
                continue;
            };
            let (was, now) = (before[q], self.model.running(q));
            if now > was && now > u64::from(limit) {
                return Err(format!(
                    "queue {q}: a claim took it to {now} running, past its limit of {limit}"
                ));
            }
        }
        Ok(())
    }

    /// After a reap: no running lease has expired (the invariant "every lease that expired
    /// at t is reclaimed by the first reap at or after t").
    pub fn no_expired_lease_left(&self) -> Result<(), String> {
        for (id, j) in &self.model.jobs {
            if j.state == JobState::Running
                && j.lease
                    .as_ref()
                    .is_some_and(|l| l.expires_at <= self.model.now)
            {
                return Err(format!("job {id}'s expired lease survived a reap"));
            }
        }
        Ok(())
    }
}

fn lease_len(s: u8) -> u64 {
    if s.is_multiple_of(2) {
        60 * SEC
    } else {
        10 * SEC
    }
}

fn err(e: Error) -> MErr {
    match e {
        Error::LeaseLost(l) => MErr::LeaseLost(l.found.map(|(a, s)| (a.0, s)), l.ended_by_holder),
        Error::JobNotFound(_) => MErr::NotFound,
        Error::Refused { state, .. } => MErr::Refused(state),
        Error::UniqueKeyHeld { holder, .. } => MErr::KeyHeld(holder.0),
        Error::Input(_) | Error::Config(_) => MErr::Input,
        Error::DependencyNotFound(id) => MErr::DependencyNotFound(id.0),
        Error::GroupNotFound(g) => MErr::GroupNotFound(g.0),
        Error::GroupSealed(g) => MErr::GroupSealed(g.0),
        Error::GroupOpen(g) => MErr::GroupOpen(g.0),
        Error::EditConflict { .. } => MErr::EditConflict,
        other => panic!("unexpected store error: {other}"),
    }
}

fn same<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: Result<T, MErr>,
    want: Result<T, MErr>,
) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: store {got:?}, model {want:?}"))
    }
}

/// The model's policy, for a store in memory.
fn memory_policy() -> leasehold::memory::Policy {
    leasehold::memory::Policy {
        retry: RetryPolicy::exponential(
            Duration::from_nanos(model::BACKOFF_BASE),
            Duration::from_nanos(model::BACKOFF_MAX),
        ),
        default_max_attempts: model::DEFAULT_MAX_ATTEMPTS,
        reap_batch: REAP_BATCH,
        ..Default::default()
    }
}

/// The retry policy numbered `code`, as the store takes it and as the model states it.
pub fn backoff(code: u8) -> (leasehold::RetryPolicy, model::MBackoff) {
    use leasehold::RetryPolicy;
    let s = |n: u64| Duration::from_nanos(n * SEC);
    match code % 3 {
        0 => (RetryPolicy::fixed(s(3)), model::MBackoff::Fixed(3 * SEC)),
        1 => (
            RetryPolicy::delays([s(1), s(40)]),
            model::MBackoff::Delays(vec![SEC, 40 * SEC]),
        ),
        _ => (
            RetryPolicy::exponential(s(2), s(30)),
            model::MBackoff::Exponential(2 * SEC, 30 * SEC),
        ),
    }
}
