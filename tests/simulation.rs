//! Deterministic simulation of worker pools that die.
//!
//! Simulated workers (state machines stepped once per simulated second, not threads) claim,
//! heartbeat, progress and complete jobs on a manual clock, beside a pipelined pool (a window
//! of jobs claimed ahead, completions handed to rounds that commit them with the next claim,
//! one batch of renewals for all it holds), while a fault schedule drawn from
//! the seed crashes workers, pauses them past their lease (they wake and try to commit),
//! stalls jobs (heartbeat alive, no progress), kills the whole pool at once, kills the worker
//! process while a neighbour survives it (its leases taken back at once, as a store shared by
//! processes does when the kernel frees the dead process's lock), and restarts the store; the
//! pipelined pool crashes with completions waiting for their round (never committed: those
//! jobs run again) and pauses past its leases (its round's completions then meet the fence).
//! The work holds groups with callbacks, a group in a group, jobs that expire and jobs
//! that wait for jobs (see
//! `Sim::enqueue_work`). Each seed ends with every job succeeded and committed exactly once
//! (every group's callbacks among them), each waiter first claimed no sooner than what it
//! waited for ended, every reclaim within
//! lease + reaper interval of the holder's last renewal, and every lease of a dead process
//! taken back the moment it died.
//!
//! `LEASEHOLD_SIM_SEEDS=5000` runs more seeds; `LEASEHOLD_SIM_SEED=n` replays one.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/backends.rs"]
#[allow(dead_code)]
mod backends;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use backends::ModelStore;

use leasehold::ReadJobs;
use leasehold::{
    Durability, InstanceId, JobId, JobState, Lease, LeaseTerms, ManualClock, NewGroup, NewJob,
    Outcome, ReclaimPath, Renewal, Store,
};

const LEASE: u64 = 60;
const HEARTBEAT: u64 = 20;
const REAPER: u64 = 15;
const STALL: u64 = 90;
const BATCH: usize = 3;
/// The pipelined pool: its workers, the most it claims ahead, and how often its rounds
/// commit (simulated seconds).
const PIPE_WORKERS: usize = 3;
const PIPE_WINDOW: usize = 4;
const PIPE_ROUND: u64 = 2;
const QUEUE: &str = "sim";
/// A seed that has not finished by then has lost jobs.
const SIM_LIMIT: u64 = 200_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

#[derive(Clone)]
enum Worker {
    Idle,
    Working {
        lease: Lease,
        left: u64,
        progress: u64,
        next_beat: u64,
        stalled: bool,
    },
    Paused {
        lease: Lease,
        left: u64,
        progress: u64,
        until: u64,
    },
    Crashed {
        until: u64,
    },
}

#[derive(Default)]
struct Tally {
    executions: BTreeMap<u64, u32>,
    /// Each job's last checkpoint a save was answered `Ok` for.
    checkpoints: BTreeMap<u64, Vec<u8>>,
    /// Each attempt's log lines a write was answered `Ok` for (the newest kept), and how
    /// many older ones were dropped.
    logs: BTreeMap<(u64, u32), (Vec<String>, u64)>,
    commits: BTreeMap<u64, u32>,
    /// (job, attempt) -> the last time its holder renewed (or claimed) it.
    renewed: BTreeMap<(u64, u32), u64>,
    duplicates: u64,
    pool_deaths: u64,
    restarts: u64,
    /// The worker process died and a surviving one took its leases back.
    process_deaths: u64,
    /// When each process death happened (simulated seconds).
    died_at: BTreeSet<u64>,
    pauses: u64,
    stalls: u64,
    crashes: u64,
    late_commits_refused: u64,
    /// The pipelined pool: rounds committed, crashes with completions waiting for one, and
    /// jobs claimed ahead whose lease ran out before a worker took them.
    rounds: u64,
    pipe_crashes: u64,
    given_back_unrun: u64,
    /// Jobs with an expiry that no attempt started by: ended `Expired`, never run since.
    expired: u64,
}

/// The pipelined pool (see the module's docs).
#[derive(Default)]
struct Pipeline {
    /// Claimed ahead, waiting for a worker; each with its lease's known expiry.
    ahead: Vec<(Lease, leasehold::StoreTime)>,
    /// Running: the lease, its expiry, work left, progress.
    running: Vec<(Lease, leasehold::StoreTime, u64, u64)>,
    /// Finished, waiting for the next round to commit them.
    finished: Vec<Lease>,
    next_beat: u64,
    /// Down (crashed) or frozen (paused) until then.
    crashed_until: Option<u64>,
    paused_until: Option<u64>,
    name: String,
}

impl Pipeline {
    /// Everything it holds a lease for.
    fn held(&self) -> impl Iterator<Item = &Lease> {
        self.ahead
            .iter()
            .map(|(l, _)| l)
            .chain(self.running.iter().map(|(l, ..)| l))
            .chain(self.finished.iter())
    }
}

/// The store a simulation runs on, and how to open it again.
#[allow(clippy::large_enum_variant)] // one per simulation
enum Backing {
    Redb {
        dir: tempfile::TempDir,
        store: Option<Store>,
    },
    Postgres {
        builder: leasehold::postgres::PgStoreBuilder,
        store: leasehold::postgres::PgStore,
        admin: leasehold::postgres::client::Client,
        schema: String,
    },
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Postgres { admin, schema, .. } = self {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

struct Sim {
    rng: Rng,
    backing: Backing,
    clock: ManualClock,
    t: u64,
    workers: Vec<(String, Worker)>,
    pipe: Pipeline,
    generation: u32,
    /// The process instance the workers' leases are granted to; a new one after each death.
    instance: u64,
    tally: Tally,
    /// Each group's key and what its enqueue answered.
    keyed: Vec<(String, (leasehold::GroupId, Vec<JobId>))>,
}

fn open(dir: &tempfile::TempDir, clock: &ManualClock, instance: u64) -> Store {
    Store::builder(dir.path().join("sim.redb"))
        .clock(clock.clone())
        .simulated_instance(InstanceId(instance))
        .sharing(leasehold::Sharing::Exclusive)
        .durability(Durability::Eventual {
            flush_every: Duration::from_secs(1 << 30),
        })
        .default_max_attempts(1000)
        .reap_batch(BATCH)
        .verify_on_open(false)
        .open()
        .unwrap()
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let store = open(&dir, &clock, 1);
        let backing = Backing::Redb {
            dir,
            store: Some(store),
        };
        Sim::on(seed, backing, clock)
    }

    /// A simulation on the PostgreSQL store at `url`, in a schema of its own, on the
    /// simulation's clock.
    fn postgres(seed: u64, url: &str) -> Sim {
        let clock = ManualClock::new();
        let schema = format!("lh_sim_{}_{seed}", std::process::id());
        let builder = leasehold::postgres::PgStore::builder(url)
            .schema(&schema)
            .simulated_clock(clock.clone())
            .default_max_attempts(1000)
            .reap_batch(BATCH)
            // the pipelined pool's rounds run their two halves at once
            .side_by_side_from(1);
        let mut admin =
            leasehold::postgres::client::Client::connect(url, leasehold::postgres::client::NoTls)
                .unwrap();
        admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        let store = builder.clone().open().unwrap();
        let backing = Backing::Postgres {
            builder,
            store,
            admin,
            schema,
        };
        Sim::on(seed, backing, clock)
    }

    fn on(seed: u64, backing: Backing, clock: ManualClock) -> Sim {
        let mut rng = Rng(seed);
        let n = 3 + rng.below(6) as usize;
        let workers = (0..n).map(|i| (format!("w{i}.0"), Worker::Idle)).collect();
        Sim {
            rng,
            backing,
            clock,
            t: 0,
            workers,
            pipe: Pipeline {
                name: "pipe.0".into(),
                ..Pipeline::default()
            },
            generation: 0,
            instance: 1,
            tally: Tally::default(),
            keyed: Vec::new(),
        }
    }

    fn store(&self) -> &dyn ModelStore {
        match &self.backing {
            Backing::Redb { store, .. } => store.as_ref().unwrap(),
            Backing::Postgres { store, .. } => store,
        }
    }

    /// Opens the store again as a restarted process would: a redb file takes back what the
    /// closed process held (as `instance` from now on), a PostgreSQL handle takes nothing.
    fn reopen(&mut self) {
        match &mut self.backing {
            Backing::Redb { dir, store } => {
                *store = None;
                *store = Some(open(dir, &self.clock, self.instance));
            }
            Backing::Postgres { builder, store, .. } => {
                *store = builder.clone().open().unwrap();
            }
        }
    }

    fn run(&mut self) -> Result<(), String> {
        let jobs = self.enqueue_work()?;
        while self.t < SIM_LIMIT {
            self.t += 1;
            self.clock.advance(Duration::from_secs(1));
            self.faults()?;
            for i in 0..self.workers.len() {
                self.step(i)?;
            }
            self.step_pipeline()?;
            if self.t.is_multiple_of(REAPER) {
                self.reap()?;
            }
            if self.t.is_multiple_of(REAPER) {
                let stats = self.store().stats().map_err(|e| e.to_string())?;
                let ended = stats.total(JobState::Succeeded) + stats.total(JobState::Expired);
                if ended == jobs {
                    self.tally.expired = stats.total(JobState::Expired);
                    return self.verify(jobs);
                }
            }
        }
        Err(format!(
            "jobs still unfinished after {SIM_LIMIT} simulated seconds"
        ))
    }

    /// The seed's work: plain jobs, then groups of members (some waiting for a plain job)
    /// each with both callbacks, and a chain of jobs each waiting for the one before.
    /// Returns how many jobs there are; every one must succeed once, waiters only after
    /// what they wait for.
    fn enqueue_work(&mut self) -> Result<u64, String> {
        let plain = 20 + self.rng.below(40);
        // Every seventh plain job expires if not started within 30 s to 5 min: nothing waits
        // for one (what waits picks among the others, `lasting`), so each ends succeeded or
        // expired, never both.
        let expiries: Vec<Option<Duration>> = (0..plain)
            .map(|i| (i % 7 == 6).then(|| Duration::from_secs(30 + self.rng.below(270))))
            .collect();
        let lasting = |pick: u64| JobId(1 + pick - u64::from(pick % 7 == 6));
        // one or two of a tenant's jobs at once, for the jobs that have a tenant
        let per_key = 1 + self.rng.below(2) as u32;
        let limits = leasehold::QueueLimits::none().per_key(per_key);
        (self.store().declare_queue(QUEUE)).map_err(|e| e.to_string())?;
        (self.store().set_queue_limits(QUEUE, limits)).map_err(|e| e.to_string())?;
        self.store()
            .enqueue_batch(
                (0..plain)
                    .map(|i| {
                        let job = NewJob::new(QUEUE, format!("{i}"));
                        // every third with a backoff of its own, over the store's
                        let job = match i % 3 {
                            0 => job.retry_policy(leasehold::RetryPolicy::delays([
                                Duration::from_millis(300),
                                Duration::from_secs(2),
                            ])),
                            _ => job,
                        };
                        let job = match expiries[i as usize] {
                            Some(span) => job.expires_in(span),
                            None => job,
                        };
                        // two of every five of one of four tenants
                        match i % 5 {
                            1 | 3 => job.limit_key(format!("tenant-{}", i % 4)),
                            _ => job,
                        }
                    })
                    .collect(),
            )
            .map_err(|e| e.to_string())?;
        for g in 0..1 + self.rng.below(3) {
            let members = (0..2 + self.rng.below(8))
                .map(|i| {
                    let job = NewJob::new(QUEUE, format!("g{g}-{i}"));
                    match self.rng.chance(300) {
                        true => job.after(lasting(self.rng.below(plain))),
                        false => job,
                    }
                })
                .collect();
            let key = format!("order-{g}");
            let callbacks = NewGroup::new()
                .key(&key)
                .on_complete(NewJob::new(QUEUE, format!("g{g} complete")))
                .on_success(NewJob::new(QUEUE, format!("g{g} succeeded")));
            let made =
                (self.store().enqueue_group(callbacks, members)).map_err(|e| e.to_string())?;
            self.keyed.push((key, made));
        }
        // A group in a group: the outer group's callback runs once the inner group's
        // members have all succeeded (its end counted once in the outer group).
        let outer = NewGroup::new().on_success(NewJob::new(QUEUE, "outer succeeded"));
        let outer = self.store().open_group(outer).map_err(|e| e.to_string())?;
        let inner = (0..1 + self.rng.below(4))
            .map(|i| NewJob::new(QUEUE, format!("inner-{i}")))
            .collect();
        (self
            .store()
            .enqueue_group(NewGroup::new().in_group(outer), inner))
        .map_err(|e| e.to_string())?;
        (self.store().seal_group(outer)).map_err(|e| e.to_string())?;
        let mut prev = lasting(self.rng.below(plain));
        for i in 0..self.rng.below(5) {
            let job = NewJob::new(QUEUE, format!("chain-{i}")).after(prev);
            prev = self.store().enqueue(job).map_err(|e| e.to_string())?;
        }
        let stats = self.store().stats().map_err(|e| e.to_string())?;
        Ok(stats.queues.values().map(|q| q.total()).sum())
    }

    /// The application, restarted, enqueues its groups again, not knowing whether its
    /// first enqueues committed: each key answers its first group and makes nothing (a job
    /// made would never let the run's count of succeeded jobs match).
    fn enqueue_groups_again(&mut self) -> Result<(), String> {
        for (key, made) in &self.keyed {
            let again = NewGroup::new()
                .key(key)
                .on_complete(NewJob::new(QUEUE, "a second callback"));
            let members = vec![NewJob::new(QUEUE, "a second member")];
            match self.store().enqueue_group(again, members) {
                Ok(answer) if answer == *made => {}
                other => {
                    return Err(format!(
                        "group {key} enqueued again: {other:?}, first {made:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    fn faults(&mut self) -> Result<(), String> {
        let t = self.t;
        if self.rng.chance(2) {
            // the whole pool dies at once: every lease lapses together
            self.tally.pool_deaths += 1;
            for (_, w) in &mut self.workers {
                *w = Worker::Crashed { until: t + 30 };
            }
            self.crash_pipeline(t + 30);
            return Ok(());
        }
        if self.rng.chance(2) {
            // the worker process dies and a neighbour survives it: the kernel frees the dead
            // process's lock and the survivor takes back every lease it held, at once; the
            // workers come back later as a new process instance (a redb notion: on
            // PostgreSQL the dead process's leases lapse, as a whole pool's do)
            let Backing::Redb {
                store: Some(redb), ..
            } = &self.backing
            else {
                self.tally.pool_deaths += 1;
                for (_, w) in &mut self.workers {
                    *w = Worker::Crashed { until: t + 30 };
                }
                self.crash_pipeline(t + 30);
                return Ok(());
            };
            self.tally.process_deaths += 1;
            self.tally.died_at.insert(t);
            let running = |store: &Store| store.stats().unwrap().total(JobState::Running);
            let held = running(redb);
            let taken = redb
                .reclaim_dead_instance(InstanceId(self.instance))
                .unwrap();
            // every running lease was the dead process's: all of them back, none left
            let left = running(redb);
            if (taken as u64, left) != (held, 0) {
                return Err(format!(
                    "process death at {t} s: {held} leases held, {taken} taken back, {left} left running"
                ));
            }
            self.instance += 1;
            self.reopen();
            for (_, w) in &mut self.workers {
                *w = Worker::Crashed { until: t + 30 };
            }
            self.crash_pipeline(t + 30);
            return Ok(());
        }
        if self.rng.chance(1) {
            // the process restarts: the store is reopened and every worker starts afresh
            self.tally.restarts += 1;
            self.reopen();
            self.enqueue_groups_again()?;
            for (_, w) in &mut self.workers {
                *w = Worker::Idle;
            }
            self.crash_pipeline(t);
            return Ok(());
        }
        if self.rng.chance(3) {
            // the pipelined pool alone crashes, completions waiting for their round
            if !self.pipe.finished.is_empty() {
                self.tally.pipe_crashes += 1;
            }
            self.crash_pipeline(t + 30);
            return Ok(());
        }
        if self.rng.chance(3) && self.pipe.paused_until.is_none() {
            // the pipelined pool is frozen past its leases, then wakes and goes on
            self.tally.pauses += 1;
            self.pipe.paused_until = Some(t + LEASE + 1 + self.rng.below(60));
            return Ok(());
        }
        let i = self.rng.below(self.workers.len() as u64) as usize;
        let roll = self.rng.below(1000);
        let w = &mut self.workers[i].1;
        if let Worker::Working {
            lease,
            left,
            progress,
            stalled,
            ..
        } = w
        {
            if roll < 4 {
                self.tally.crashes += 1;
                *w = Worker::Crashed { until: t + 100 };
            } else if roll < 8 {
                self.tally.pauses += 1;
                let until = t + LEASE + 1 + self.rng.below(90);
                *w = Worker::Paused {
                    lease: lease.clone(),
                    left: *left,
                    progress: *progress,
                    until,
                };
            } else if roll < 11 && !*stalled {
                self.tally.stalls += 1;
                *stalled = true;
            }
        }
        Ok(())
    }

    fn step(&mut self, i: usize) -> Result<(), String> {
        let t = self.t;
        let state = self.workers[i].1.clone();
        let next = match state {
            Worker::Crashed { until } if t >= until => {
                // a replacement worker with a new identity
                self.generation += 1;
                self.workers[i].0 = format!("w{i}.{}", self.generation);
                Worker::Idle
            }
            Worker::Crashed { .. } => return Ok(()),
            Worker::Paused {
                lease,
                left,
                progress,
                until,
            } if t >= until => {
                if self.rng.chance(500) {
                    // it wakes with its work done and tries to commit at once
                    self.finish(&lease)?;
                    Worker::Idle
                } else {
                    // it wakes and renews first (or finds its lease lost)
                    Worker::Working {
                        lease,
                        left,
                        progress,
                        next_beat: t,
                        stalled: false,
                    }
                }
            }
            Worker::Paused { .. } => return Ok(()),
            Worker::Idle => {
                if !t.is_multiple_of(3) {
                    return Ok(());
                }
                let terms = LeaseTerms::new(Duration::from_secs(LEASE))
                    .stall_timeout(Duration::from_secs(STALL));
                let worker = self.workers[i].0.clone();
                match self
                    .store()
                    .claim(QUEUE, &worker, terms)
                    .map_err(|e| e.to_string())?
                {
                    None => return Ok(()),
                    Some(lease) => {
                        let job = lease.job.0;
                        // what its predecessors saved, through every crash and restart
                        let found = (self.store().checkpoint(lease.job))
                            .map_err(|e| e.to_string())?
                            .map(|c| c.into_data());
                        if found.as_ref() != self.tally.checkpoints.get(&job) {
                            return Err(format!(
                                "job {job}'s checkpoint is {found:?}, last saved {:?}",
                                self.tally.checkpoints.get(&job)
                            ));
                        }
                        self.logs_kept(lease.job)?;
                        let runs = self.tally.executions.entry(job).or_default();
                        *runs += 1;
                        if *runs == 2 {
                            self.tally.duplicates += 1;
                        }
                        self.tally.renewed.insert((job, lease.attempt.0), t);
                        Worker::Working {
                            lease,
                            left: 1 + self.rng.below(150),
                            progress: 0,
                            next_beat: t + HEARTBEAT,
                            stalled: false,
                        }
                    }
                }
            }
            Worker::Working {
                lease,
                mut left,
                mut progress,
                mut next_beat,
                stalled,
            } => {
                if !stalled {
                    left = left.saturating_sub(1);
                    progress += 1;
                }
                if left == 0 {
                    self.finish(&lease)?;
                    Worker::Idle
                } else if t >= next_beat && !self.checkpoint(&lease, progress)? {
                    Worker::Idle // its lease is gone (a paused holder that woke)
                } else if t >= next_beat {
                    match self.store().heartbeat(&lease, progress) {
                        Ok(Renewal::Renewed { .. }) => {
                            self.tally.renewed.insert((lease.job.0, lease.attempt.0), t);
                            next_beat = t + HEARTBEAT;
                            Worker::Working {
                                lease,
                                left,
                                progress,
                                next_beat,
                                stalled,
                            }
                        }
                        // cancelled, stalled, timed out: the attempt is over
                        Ok(_) => Worker::Idle,
                        Err(e) if e.is_lease_lost() => Worker::Idle,
                        Err(e) => return Err(format!("heartbeat: {e}")),
                    }
                } else {
                    Worker::Working {
                        lease,
                        left,
                        progress,
                        next_beat,
                        stalled,
                    }
                }
            }
        };
        self.workers[i].1 = next;
        Ok(())
    }

    /// Saves the attempt's progress as its checkpoint, as a handler would at each beat:
    /// `false` if the fence refused it. A save answered `Ok` is the holder's: the job runs
    /// under its attempt.
    fn checkpoint(&mut self, lease: &Lease, progress: u64) -> Result<bool, String> {
        // a line of its log first: a holder whose lease is gone still writes its own
        let line = format!("beat at {progress}");
        (self.store().log(lease, &[&line])).map_err(|e| format!("log: {e}"))?;
        let (lines, dropped) = (self.tally.logs)
            .entry((lease.job.0, lease.attempt.0))
            .or_default();
        lines.push(line);
        if lines.len() > leasehold::MAX_LOG_LINES {
            lines.remove(0);
            *dropped += 1;
        }
        let data = format!("{}:{progress}", lease.attempt.0).into_bytes();
        match self.store().save_checkpoint(lease, &data) {
            Ok(()) => {
                let job = (self.store().job(lease.job))
                    .map_err(|e| e.to_string())?
                    .ok_or("a checkpointed job is gone")?;
                if (job.state(), job.attempt()) != (JobState::Running, lease.attempt) {
                    return Err(format!(
                        "job {} saved a checkpoint under attempt {} while {} at {}",
                        lease.job,
                        lease.attempt,
                        job.state(),
                        job.attempt()
                    ));
                }
                self.tally.checkpoints.insert(lease.job.0, data);
                Ok(true)
            }
            Err(e) if e.is_lease_lost() => Ok(false),
            Err(e) => Err(format!("save checkpoint: {e}")),
        }
    }

    /// Every line of `job`'s attempts' logs a write was answered `Ok` for is there, through
    /// every crash and restart, each attempt's apart.
    fn logs_kept(&self, job: JobId) -> Result<(), String> {
        let stored = self.store().logs(job).map_err(|e| e.to_string())?;
        let stored: BTreeMap<u32, (Vec<String>, u64)> = (stored.iter())
            .map(|l| {
                let lines = l.lines().map(|(_, t)| t.to_owned()).collect();
                (l.attempt().0, (lines, l.dropped()))
            })
            .collect();
        let written: BTreeMap<u32, (Vec<String>, u64)> = (self.tally.logs.iter())
            .filter(|((j, _), _)| *j == job.0)
            .map(|((_, attempt), log)| (*attempt, log.clone()))
            .collect();
        match stored == written {
            true => Ok(()),
            false => Err(format!(
                "job {job}'s logs are {stored:?}, written {written:?}"
            )),
        }
    }

    /// The pipelined pool dies: what it held is lost, its waiting completions never
    /// committed; it comes back at `until` as a new worker.
    fn crash_pipeline(&mut self, until: u64) {
        let generation = self.generation + 1;
        self.generation = generation;
        self.pipe = Pipeline {
            name: format!("pipe.{generation}"),
            crashed_until: Some(until),
            ..Pipeline::default()
        };
    }

    fn step_pipeline(&mut self) -> Result<(), String> {
        let t = self.t;
        if self.pipe.crashed_until.is_some_and(|u| t < u) {
            return Ok(());
        }
        self.pipe.crashed_until = None;
        match self.pipe.paused_until {
            Some(u) if t < u => return Ok(()),
            Some(_) => {
                self.pipe.paused_until = None;
                // It wakes and renews at once, or (its heartbeat thread starved) its workers
                // go on first and find the leases of what waited in the window run out.
                self.pipe.next_beat = match self.rng.chance(500) {
                    true => t,
                    false => t + HEARTBEAT,
                };
            }
            None => {}
        }
        if t >= self.pipe.next_beat {
            self.renew_pipeline()?;
            self.pipe.next_beat = t + HEARTBEAT;
        }
        // The workers: a finished job is handed over; a free worker takes the next job
        // claimed ahead, unless its lease ran out while it waited (given back, not run).
        let mut running = std::mem::take(&mut self.pipe.running);
        for job in &mut running {
            job.2 = job.2.saturating_sub(1);
            job.3 += 1;
        }
        let (done, mut running): (Vec<_>, Vec<_>) = running.into_iter().partition(|j| j.2 == 0);
        self.pipe.finished.extend(done.into_iter().map(|j| j.0));
        let now = self.store().now().map_err(|e| e.to_string())?;
        while running.len() < PIPE_WORKERS && !self.pipe.ahead.is_empty() {
            let (lease, expires) = self.pipe.ahead.remove(0);
            if expires <= now {
                self.tally.given_back_unrun += 1;
                match self.store().release(&lease) {
                    Ok(()) => {}
                    Err(e) if e.is_lease_lost() => self.tally.late_commits_refused += 1,
                    Err(e) => return Err(format!("release: {e}")),
                }
                continue;
            }
            let runs = self.tally.executions.entry(lease.job.0).or_default();
            *runs += 1;
            if *runs == 2 {
                self.tally.duplicates += 1;
            }
            let left = 1 + self.rng.below(10);
            running.push((lease, expires, left, 0));
        }
        self.pipe.running = running;
        if t.is_multiple_of(PIPE_ROUND) {
            self.round()?;
        }
        Ok(())
    }

    /// One batch of renewals for every lease the pipelined pool holds; lost ones are let
    /// go (a finished one stays: its completion meets the fence at the round).
    fn renew_pipeline(&mut self) -> Result<(), String> {
        let t = self.t;
        let pipe = &self.pipe;
        let progress = |lease: &Lease| {
            pipe.running
                .iter()
                .find(|j| j.0.job == lease.job && j.0.attempt == lease.attempt)
                .map_or(0, |j| j.3)
        };
        let held: Vec<Lease> = pipe.held().cloned().collect();
        if held.is_empty() {
            return Ok(());
        }
        let beats: Vec<(&Lease, u64)> = held.iter().map(|l| (l, progress(l))).collect();
        let answers = self.store().heartbeat_batch(&beats);
        let mut live = std::collections::BTreeMap::new();
        for (lease, answer) in held.iter().zip(answers) {
            match answer {
                Ok(Renewal::Renewed { expires_at }) => {
                    self.tally.renewed.insert((lease.job.0, lease.attempt.0), t);
                    live.insert((lease.job, lease.attempt), expires_at);
                }
                Ok(_) => {}
                Err(e) if e.is_lease_lost() => {}
                Err(e) => return Err(format!("heartbeat_batch: {e}")),
            }
        }
        let key = |l: &Lease| (l.job, l.attempt);
        self.pipe.ahead = std::mem::take(&mut self.pipe.ahead)
            .into_iter()
            .filter_map(|(l, _)| live.get(&key(&l)).map(|&e| (l, e)))
            .collect();
        self.pipe.running = std::mem::take(&mut self.pipe.running)
            .into_iter()
            .filter_map(|(l, _, left, p)| live.get(&key(&l)).map(|&e| (l, e, left, p)))
            .collect();
        Ok(())
    }

    /// A round: every finished job's completion, and a claim that fills the window.
    fn round(&mut self) -> Result<(), String> {
        let t = self.t;
        let want = (PIPE_WINDOW + PIPE_WORKERS)
            .saturating_sub(self.pipe.ahead.len() + self.pipe.running.len());
        if self.pipe.finished.is_empty() && want == 0 {
            return Ok(());
        }
        let finished = std::mem::take(&mut self.pipe.finished);
        let done: Vec<(&Lease, &[u8])> = finished.iter().map(|l| (l, b"done".as_slice())).collect();
        let terms =
            LeaseTerms::new(Duration::from_secs(LEASE)).stall_timeout(Duration::from_secs(STALL));
        let (completed, claimed) = self.store().complete_batch_and_claim(
            &done,
            QUEUE,
            &self.pipe.name,
            terms,
            want.max(1),
        );
        self.tally.rounds += 1;
        for (lease, answer) in finished.iter().zip(completed) {
            match answer {
                Ok(()) => *self.tally.commits.entry(lease.job.0).or_default() += 1,
                Err(e) if e.is_lease_lost() => self.tally.late_commits_refused += 1,
                Err(e) => return Err(format!("round: complete: {e}")),
            }
        }
        for lease in claimed.map_err(|e| format!("round: claim: {e}"))? {
            self.tally.renewed.insert((lease.job.0, lease.attempt.0), t);
            let expires = lease.expires_at;
            self.pipe.ahead.push((lease, expires));
        }
        Ok(())
    }

    fn finish(&mut self, lease: &Lease) -> Result<(), String> {
        match self.store().complete(lease, b"done") {
            Ok(()) => {
                *self.tally.commits.entry(lease.job.0).or_default() += 1;
                Ok(())
            }
            Err(e) if e.is_lease_lost() => {
                self.tally.late_commits_refused += 1;
                Ok(())
            }
            Err(e) => Err(format!("complete: {e}")),
        }
    }

    /// A waiter was first claimed no sooner than what it waits for ended (a group: sealed,
    /// every member ended), and each group's callbacks saw every member succeed.
    fn waited(&self, id: JobId, history: &[leasehold::Run]) -> Result<(), String> {
        let store = self.store();
        let job = store
            .job(id)
            .map_err(|e| e.to_string())?
            .ok_or("job gone")?;
        let first_claim = history.first().ok_or("a job that never ran")?.claimed_at();
        for need in job.needs() {
            let ended = match need.on() {
                leasehold::Target::Job(dep) => store
                    .job(dep)
                    .map_err(|e| e.to_string())?
                    .and_then(|d| d.finished_at()),
                leasehold::Target::Group(g) => {
                    let group = store
                        .group(g)
                        .map_err(|e| e.to_string())?
                        .ok_or("no group")?;
                    if group.ended() != (group.members(), 0, 0) {
                        return Err(format!("group {g} ended as {:?}", group.ended()));
                    }
                    group.finished_at()
                }
                other => return Err(format!("a target the simulation does not know: {other:?}")),
            };
            match ended {
                Some(at) if at <= first_claim => {}
                _ => {
                    return Err(format!(
                        "job {id} was claimed at {first_claim} before {:?} ended ({ended:?})",
                        need.on()
                    ));
                }
            }
        }
        Ok(())
    }

    fn reap(&mut self) -> Result<(), String> {
        let report = self.store().reap().map_err(|e| e.to_string())?;
        if report.largest_batch > BATCH {
            return Err(format!(
                "a reap batch took {} leases; the limit is {BATCH}",
                report.largest_batch
            ));
        }
        if report.reclaimed.len() > BATCH && report.batches < report.reclaimed.len().div_ceil(BATCH)
        {
            return Err("a mass reclaim was not split into batches".into());
        }
        Ok(())
    }

    fn verify(&self, jobs: u64) -> Result<(), String> {
        let store = self.store();
        let check = store.check().map_err(|e| e.to_string())?;
        if !check.is_clean() {
            return Err(format!("check: {:?}", check.problems));
        }
        let bound = LEASE + REAPER;
        for id in 1..=jobs {
            let commits = self.tally.commits.get(&id).copied().unwrap_or(0);
            let history = store.history(JobId(id)).map_err(|e| e.to_string())?;
            let job = store.job(JobId(id)).map_err(|e| e.to_string())?;
            let job = job.ok_or_else(|| format!("job {id} is gone"))?;
            // No attempt starts at or after the job's expiry, whatever crashed.
            if let Some(expiry) = job.expires_at()
                && let Some(late) = history.iter().find(|r| r.claimed_at() >= expiry)
            {
                return Err(format!(
                    "job {id} attempt {} started at {} past its expiry {expiry}",
                    late.attempt(),
                    late.claimed_at()
                ));
            }
            if job.state() == JobState::Expired {
                if commits != 0
                    || job
                        .finished_at()
                        .is_none_or(|at| Some(at) < job.expires_at())
                {
                    return Err(format!(
                        "job {id} expired at {:?} (expiry {:?}) with {commits} commits",
                        job.finished_at(),
                        job.expires_at()
                    ));
                }
                continue;
            }
            if commits != 1 {
                return Err(format!("job {id} was committed {commits} times"));
            }
            self.waited(JobId(id), &history)?;
            let succeeded = history
                .iter()
                .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
                .count();
            if succeeded != 1 {
                return Err(format!(
                    "job {id} has {succeeded} successful runs in its history"
                ));
            }
            for run in &history {
                if let Some(Outcome::LeaseExpired { path, .. }) = run.outcome() {
                    if *path == ReclaimPath::Recovery {
                        continue; // taken back at reopen: not a detection
                    }
                    let ended = run.ended_at().unwrap().as_nanos() / 1_000_000_000;
                    if *path == ReclaimPath::ProcessDied && !self.tally.died_at.contains(&ended) {
                        return Err(format!(
                            "job {id} attempt {} taken back by {path} at {ended} s; process deaths at {:?}",
                            run.attempt(),
                            self.tally.died_at
                        ));
                    }
                    let renewed = self.tally.renewed[&(id, run.attempt().0)];
                    let delay = ended - renewed;
                    if delay > bound {
                        return Err(format!(
                            "job {id} attempt {} reclaimed {delay} s after its last renewal (bound {bound} s)",
                            run.attempt()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[test]
fn pools_that_crash_pause_stall_and_restart_still_commit_every_job_exactly_once() {
    let seeds = seeds("LEASEHOLD_SIM_SEEDS", 500);
    let totals = simulate(&seeds, Sim::new, "");
    eprintln!("{}", totals.summary(seeds.len()));
    if seeds.len() >= 100 {
        assert!(totals.duplicates > 0 && totals.pool_deaths > 0 && totals.restarts > 0);
        assert!(totals.process_deaths > 0);
        assert!(totals.pauses > 0 && totals.stalls > 0 && totals.late_commits_refused > 0);
        assert!(totals.rounds > 0 && totals.pipe_crashes > 0 && totals.given_back_unrun > 0);
    }
}

/// The same simulation on the PostgreSQL store, where `LEASEHOLD_PG_URL` names a server: a
/// few seeds in `cargo test` (each is thousands of transactions), more with
/// `LEASEHOLD_PG_SIM_SEEDS`. A process death is a whole pool's there (its leases lapse).
#[test]
fn pools_on_postgres_that_crash_pause_stall_and_restart_still_commit_every_job_exactly_once() {
    let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
        return; // the PostgreSQL suite says once that it did not run
    };
    let seeds = seeds("LEASEHOLD_PG_SIM_SEEDS", 5);
    let totals = simulate(
        &seeds,
        |seed| Sim::postgres(seed, &url),
        "LEASEHOLD_PG_URL=... ",
    );
    eprintln!("PostgreSQL: {}", totals.summary(seeds.len()));
}

fn seeds(var: &str, default: u64) -> Vec<u64> {
    match std::env::var("LEASEHOLD_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("LEASEHOLD_SIM_SEED is a number")],
        Err(_) => {
            let n = std::env::var(var)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default);
            (0..n).collect()
        }
    }
}

/// Runs every seed on a simulation `make` builds; panics with a replay line on the first
/// that fails. Seeds are independent, so they run on a thread per core: the simulation is
/// CPU-bound and would otherwise be the longest test of the suite.
fn simulate(seeds: &[u64], make: impl Fn(u64) -> Sim + Sync, replay: &str) -> Tally {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    let chunk = seeds.len().div_ceil(threads).max(1);
    let parts: Vec<Tally> = std::thread::scope(|scope| {
        let runs: Vec<_> = seeds
            .chunks(chunk)
            .map(|seeds| scope.spawn(|| run_seeds(seeds, &make, replay)))
            .collect();
        runs.into_iter()
            .map(|run| run.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut totals = Tally::default();
    for t in &parts {
        totals.add(t);
    }
    totals
}

fn run_seeds(seeds: &[u64], make: &impl Fn(u64) -> Sim, replay: &str) -> Tally {
    let mut totals = Tally::default();
    for seed in seeds {
        let mut sim = make(*seed);
        if let Err(why) = sim.run() {
            panic!(
                "seed {seed}: {why}\nreplay: {replay}LEASEHOLD_SIM_SEED={seed} cargo test --test simulation"
            );
        }
        totals.add(&sim.tally);
    }
    totals
}

impl Tally {
    /// Adds another run's counts to these.
    fn add(&mut self, t: &Tally) {
        self.duplicates += t.duplicates;
        self.pool_deaths += t.pool_deaths;
        self.restarts += t.restarts;
        self.process_deaths += t.process_deaths;
        self.pauses += t.pauses;
        self.stalls += t.stalls;
        self.crashes += t.crashes;
        self.late_commits_refused += t.late_commits_refused;
        self.rounds += t.rounds;
        self.pipe_crashes += t.pipe_crashes;
        self.given_back_unrun += t.given_back_unrun;
        self.expired += t.expired;
    }

    fn summary(&self, seeds: usize) -> String {
        format!(
            "{seeds} seeds: {} crashes, {} pauses, {} stalls, {} pool deaths, {} process deaths, {} restarts; a pipelined pool's {} rounds, {} crashes with completions waiting, {} jobs claimed ahead given back unrun; {} jobs expired unstarted; {} jobs ran twice, {} late commits refused, 0 duplicate commits",
            self.crashes,
            self.pauses,
            self.stalls,
            self.pool_deaths,
            self.process_deaths,
            self.restarts,
            self.rounds,
            self.pipe_crashes,
            self.given_back_unrun,
            self.expired,
            self.duplicates,
            self.late_commits_refused
        )
    }
}
