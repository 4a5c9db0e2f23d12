//! Plain data: what a job is (its states are `state.rs`'s), and the record of each attempt.
//! No machinery lives here: what moves a job between states is decided in [`crate::rules`]
//! and stored by each engine.

use std::fmt;
use std::time::Duration;

use bincode::{Decode, Encode};

use crate::ids::{Attempt, GroupId, JobId, LeaseToken, StoreTime};
use crate::retry::RetryPolicy;
use crate::state::JobState;
use crate::workflow::{Flow, Need};

/// How long a job's unique key keeps another job with the same key from being enqueued.
///
/// A key always deduplicates while its job waits or runs. Beyond that, a job that
/// *succeeded* may keep its key for a window (as River's `UniqueOpts.ByPeriod` and Oban's
/// `unique: [period: ...]`): "send this report at most once a day". A dead or cancelled job
/// never keeps it: its work was not done, and asking for it again must make a new job.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum Uniqueness {
    /// While the job waits or runs (the default).
    #[default]
    WhileUnfinished,
    /// Also for this long of store time after the job succeeded.
    AfterSuccess(Duration),
    /// Also after the job succeeded, until it is purged.
    UntilPurged,
}

/// The lease a running job is held under, as stored (read through [`JobLease`]).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct LeaseRecord {
    /// The worker that claimed it.
    pub owner: String,
    /// When it was claimed.
    pub claimed_at: StoreTime,
    /// When it expires unless renewed. Compared only against store time.
    pub expires_at: StoreTime,
    /// Where the lease sits in the expiry index: at or before `expires_at`. A renewal moves
    /// only `expires_at`, so it rewrites one record instead of also moving an index entry;
    /// the entry catches up when a reaper pass or a claimer reaches it and finds the lease
    /// renewed. An entry is never later than its lease, so no expiry is ever missed.
    pub indexed_expiry: StoreTime,
    /// The lease length; every renewal extends the lease by this much from the renewal's now.
    pub length: Duration,
    /// A heartbeat finding no progress for this long revokes the lease.
    pub stall_timeout: Option<Duration>,
    /// The attempt's hard time limit ends here: a renewal at or after it ends the attempt
    /// as [`Outcome::TimedOut`] instead of renewing (the claim time plus the job's limit, or
    /// the claimer's).
    pub deadline: Option<StoreTime>,
}

/// A job as stored (without its payload and output, which live apart so that a heartbeat
/// rewrites a few dozen bytes, not the payload). Read through [`Job`].
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct JobRecord {
    /// The job's id.
    pub id: JobId,
    /// The queue it belongs to.
    pub queue: String,
    /// Its state.
    pub state: JobState,
    /// Lower runs first; equal priorities run in `run_at` order, then id order (FIFO).
    pub priority: i32,
    /// How many times it has been claimed; the fencing token of the current or last run.
    pub attempt: Attempt,
    /// How many attempts spent the retry budget (failed, lease expired, stalled). A release
    /// does not count.
    pub failures: u32,
    /// The retry budget: the job is dead once `failures` reaches it.
    pub max_attempts: u32,
    /// The deduplication key it holds while it is not terminal.
    pub unique_key: Option<String>,
    /// When it was enqueued.
    pub created_at: StoreTime,
    /// When a waiting job becomes claimable (enqueue time, end of a delay, or end of a backoff).
    pub run_at: StoreTime,
    /// The lease while it is `Running`.
    pub lease: Option<LeaseRecord>,
    /// The last progress value a heartbeat reported for the current attempt.
    pub progress: u64,
    /// When progress last advanced (or the attempt began).
    pub progress_at: StoreTime,
    /// A cancel was requested while it was running; the holder is told at its next heartbeat.
    pub cancel_requested: bool,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// When it reached a terminal state.
    pub finished_at: Option<StoreTime>,
    /// When the record last changed.
    pub updated_at: StoreTime,
    /// How long its unique key outlives the job (see [`Uniqueness`]).
    pub uniqueness: Uniqueness,
    /// A newer job took its unique key after its window ran out: it holds the key no more.
    pub key_released: bool,
    /// Its own hard time limit per attempt (else the claimer's, if any).
    pub time_limit: Option<Duration>,
    /// Small key/value tags given at enqueue, in the order given.
    pub metadata: Vec<(String, String)>,
    /// What it waits for, its group, whether others wait for it. (After the fields of
    /// format 2, so that the codec reads such a record as one with none: see
    /// `codec::decode_job`.)
    pub flow: Flow,
    /// Its own backoff between failed attempts (else its queue's, else the store's). (After
    /// the fields of format 3, so that the codec reads an older record as one with none.)
    pub retry: Option<RetryPolicy>,
    /// The key its queue's per-key limit counts it under, if it has one. (After the fields
    /// of format 4, so that the codec reads an older record as one without.)
    pub limit: Option<LimitKey>,
    /// The token of its current or last lease (see [`LeaseToken`]), kept after the attempt
    /// ends so that a refused write can be told whether it was its own holder's. (Last, so
    /// that the codec reads an older record as one with [`LeaseToken::NONE`].)
    pub token: LeaseToken,
    /// No attempt starts at or after it: a claim then ends the job as `Expired` instead
    /// ([`crate::NewJob::expires_in`]). (Last, so that the codec reads an older record as
    /// one that never expires.)
    pub expires_at: Option<StoreTime>,
}

/// A job's limit key as stored: the key, and whether the job is parked.
///
/// Of a key's waiting jobs at most one, its *head*, stands in the claim order; the others
/// are parked (not in the ready index), and so is the head while the key is at its limit.
/// So a claim passes over a key at its limit at the cost of no index entry at all, however
/// many jobs the key has waiting (see [`crate::rules::key_head`]).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct LimitKey {
    /// The key.
    pub key: String,
    /// Out of the claim order.
    pub parked: bool,
}

impl JobRecord {
    /// The run record of the current attempt while the job runs, as its lease describes it
    /// (history stores an attempt's record only once it ends).
    pub(crate) fn current_run(&self) -> Option<RunRecord> {
        match (&self.state, &self.lease) {
            (JobState::Running, Some(lease)) => Some(RunRecord {
                attempt: self.attempt,
                worker: lease.owner.clone(),
                claimed_at: lease.claimed_at,
                ended_at: None,
                outcome: None,
                progress: self.progress,
            }),
            _ => None,
        }
    }
}

/// How a lease was found expired and taken back.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
#[non_exhaustive]
pub enum ReclaimPath {
    /// A reaper pass found it expired.
    Reaper,
    /// A claimer took the job over at claim time.
    Takeover,
    /// The store was opened with the writer's seat, which proves the lease's holder process
    /// is gone.
    Recovery,
    /// The process that held the lease died while others share the store: its kernel-held
    /// instance lock was released, so a surviving process took back all of its leases at
    /// once, without waiting for them to expire.
    ProcessDied,
}

impl fmt::Display for ReclaimPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReclaimPath::Reaper => "reaper",
            ReclaimPath::Takeover => "takeover",
            ReclaimPath::Recovery => "recovery at open (holder's process ended)",
            ReclaimPath::ProcessDied => "holder process died",
        })
    }
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[non_exhaustive]
pub enum Outcome {
    /// The holder completed the job.
    Succeeded,
    /// The holder reported a failure.
    Failed(String),
    /// The holder gave the job back on purpose (graceful shutdown); no retry budget spent.
    Released,
    /// The holder went silent and the lease was taken back.
    LeaseExpired {
        /// Which path took it back.
        path: ReclaimPath,
        /// How long after the expiry it was taken back (the detection delay beyond the lease).
        overdue: Duration,
    },
    /// The holder kept renewing but reported no progress for too long.
    Stalled,
    /// The job was cancelled while this attempt ran.
    Cancelled,
    /// The holder reported a failure that running the job again cannot mend (its own
    /// [`JobError::permanent`](crate::JobError::permanent), a payload that does not decode,
    /// an output over the size limit): the job is dead at once, whatever budget it had left.
    /// (After the others, so that records written before it decode unchanged.)
    FailedPermanently(String),
    /// The attempt ran into its hard time limit and was ended; one unit of retry budget
    /// spent, retried after a backoff like a failure.
    TimedOut {
        /// The limit it ran into.
        limit: Duration,
    },
    /// The holder asked for the job to run again later ("not yet": River's `JobSnooze`,
    /// Oban's `{:snooze, n}`); no retry budget spent.
    Snoozed {
        /// How long the job was put off.
        delay: Duration,
    },
    /// The holder's process died with the job claimed ahead, before any handler started
    /// it (the process logged each start; this one was not among them): the job went back
    /// to its old place with no retry budget spent. A process that crash-loops on one job
    /// thus spends that job's budget alone, not that of every job it held beside it.
    NeverStarted {
        /// Which path took the lease back: at open, or from a dead neighbour.
        path: ReclaimPath,
    },
    /// The holder's process died after the handler returned, before its result was
    /// committed, and with no code of the application's running for this job (another job
    /// was in its handler, or none): the job went back to its old place to run again with
    /// no retry budget spent.
    ResultLost {
        /// Which path took the lease back: at open, or from a dead neighbour.
        path: ReclaimPath,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Succeeded => f.write_str("succeeded"),
            Outcome::Failed(e) => write!(f, "failed: {e}"),
            Outcome::Released => f.write_str("released"),
            Outcome::LeaseExpired {
                path: ReclaimPath::Recovery,
                ..
            } => f.write_str("lease taken back at open (its holder's process had ended)"),
            Outcome::LeaseExpired {
                path: ReclaimPath::ProcessDied,
                ..
            } => f.write_str("lease taken back: its holder process died"),
            Outcome::LeaseExpired { path, overdue } => write!(
                f,
                "lease expired; taken back by the {} {:.3}s after expiry",
                match path {
                    ReclaimPath::Takeover => "next claimer",
                    _ => "reaper",
                },
                overdue.as_secs_f64()
            ),
            Outcome::Stalled => f.write_str("stalled"),
            Outcome::Cancelled => f.write_str("cancelled"),
            Outcome::FailedPermanently(e) => write!(f, "failed permanently, not retried: {e}"),
            Outcome::TimedOut { limit } => {
                write!(
                    f,
                    "timed out: ran into its limit of {:.3}s",
                    limit.as_secs_f64()
                )
            }
            Outcome::Snoozed { delay } => write!(f, "snoozed for {:.3}s", delay.as_secs_f64()),
            Outcome::NeverStarted { .. } => {
                f.write_str("never started: its holder's process died with it claimed ahead")
            }
            Outcome::ResultLost { .. } => f.write_str(
                "result lost: its holder's process died after the handler returned, before the commit",
            ),
        }
    }
}

/// The record of one attempt (one claim) of a job, as stored. Read through [`Run`].
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct RunRecord {
    /// Which attempt.
    pub attempt: Attempt,
    /// The worker that held it.
    pub worker: String,
    /// When it was claimed.
    pub claimed_at: StoreTime,
    /// When it ended; `None` while it runs.
    pub ended_at: Option<StoreTime>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<Outcome>,
    /// The last progress value reported during the attempt.
    pub progress: u64,
}

/// A job as read from the store: a snapshot of its record at the moment of the read. It is
/// read through methods, not fields, so that the stored format can change without changing
/// this API.
#[derive(Clone, PartialEq, Eq)]
pub struct Job(pub(crate) JobRecord);

impl Job {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.0.id
    }

    /// The queue it belongs to.
    pub fn queue(&self) -> &str {
        &self.0.queue
    }

    /// Its state.
    pub fn state(&self) -> JobState {
        self.0.state
    }

    /// Lower runs first; equal priorities run in `run_at` order, then id order (FIFO).
    pub fn priority(&self) -> i32 {
        self.0.priority
    }

    /// How many times it has been claimed: the fencing token of the current or last run.
    pub fn attempt(&self) -> Attempt {
        self.0.attempt
    }

    /// How many attempts spent the retry budget (failed, lease expired, stalled). A release
    /// does not count.
    pub fn failures(&self) -> u32 {
        self.0.failures
    }

    /// The retry budget: the job is dead once [`Job::failures`] reaches it.
    pub fn max_attempts(&self) -> u32 {
        self.0.max_attempts
    }

    /// Its deduplication key: held while it is not terminal, and after it succeeded for
    /// as long as its [`Uniqueness`] says.
    pub fn unique_key(&self) -> Option<&str> {
        self.0.unique_key.as_deref()
    }

    /// How long its unique key outlives it.
    pub fn uniqueness(&self) -> Uniqueness {
        self.0.uniqueness
    }

    /// Its own hard time limit per attempt, if it was given one at enqueue.
    pub fn time_limit(&self) -> Option<Duration> {
        self.0.time_limit
    }

    /// When it expires if no attempt has started by then, on the store's clock
    /// ([`crate::NewJob::expires_in`]); `None` if it never does.
    pub fn expires_at(&self) -> Option<StoreTime> {
        self.0.expires_at
    }

    /// Its own backoff between failed attempts, if it was given one at enqueue (else its
    /// queue's applies, else the store's).
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.0.retry.as_ref()
    }

    /// The key its queue's per-key limit counts it under, if it was given one.
    pub fn limit_key(&self) -> Option<&str> {
        self.0.limit.as_ref().map(|l| l.key.as_str())
    }

    /// Its metadata: the key/value tags given at enqueue, in the order given.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.0.metadata
    }

    /// The value of metadata key `key`, if it has one.
    pub fn metadata_value(&self, key: &str) -> Option<&str> {
        self.0
            .metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// When it was enqueued.
    pub fn created_at(&self) -> StoreTime {
        self.0.created_at
    }

    /// When a waiting job becomes claimable (enqueue time, end of a delay, or end of a backoff).
    pub fn run_at(&self) -> StoreTime {
        self.0.run_at
    }

    /// The lease it is held under while it is [`JobState::Running`].
    pub fn lease(&self) -> Option<JobLease<'_>> {
        self.0.lease.as_ref().map(JobLease)
    }

    /// The last progress value a heartbeat reported for the current attempt.
    pub fn progress(&self) -> u64 {
        self.0.progress
    }

    /// When progress last advanced (or the attempt began).
    pub fn progress_at(&self) -> StoreTime {
        self.0.progress_at
    }

    /// A cancel was requested while it ran; the holder is told at its next heartbeat.
    pub fn cancel_requested(&self) -> bool {
        self.0.cancel_requested
    }

    /// The error of the last failed attempt.
    pub fn last_error(&self) -> Option<&str> {
        self.0.last_error.as_deref()
    }

    /// When it reached a terminal state.
    pub fn finished_at(&self) -> Option<StoreTime> {
        self.0.finished_at
    }

    /// When the record last changed.
    pub fn updated_at(&self) -> StoreTime {
        self.0.updated_at
    }

    /// What it waits for (or waited for), each with how it must end and how it ended.
    pub fn needs(&self) -> &[Need] {
        &self.0.flow.needs
    }

    /// The group it is a member of.
    pub fn group(&self) -> Option<GroupId> {
        self.0.flow.group
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The lease a running job is held under, as [`Job::lease`] reads it.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct JobLease<'a>(&'a LeaseRecord);

impl<'a> JobLease<'a> {
    /// The worker that claimed it.
    pub fn owner(&self) -> &'a str {
        &self.0.owner
    }

    /// When it was claimed.
    pub fn claimed_at(&self) -> StoreTime {
        self.0.claimed_at
    }

    /// When it expires unless renewed, on the store's clock (compare with [`crate::Store::now`]).
    pub fn expires_at(&self) -> StoreTime {
        self.0.expires_at
    }

    /// The lease length: every renewal extends the lease by this much from the renewal's now.
    pub fn length(&self) -> Duration {
        self.0.length
    }

    /// A heartbeat finding no progress for this long revokes the lease.
    pub fn stall_timeout(&self) -> Option<Duration> {
        self.0.stall_timeout
    }

    /// When the attempt's hard time limit ends it, if it has one.
    pub fn deadline(&self) -> Option<StoreTime> {
        self.0.deadline
    }
}

impl fmt::Debug for JobLease<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One attempt (one claim) of a job, as [`crate::ReadJobs::history`] reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct Run(pub(crate) RunRecord);

impl Run {
    /// Which attempt.
    pub fn attempt(&self) -> Attempt {
        self.0.attempt
    }

    /// The worker that held it.
    pub fn worker(&self) -> &str {
        &self.0.worker
    }

    /// When it was claimed.
    pub fn claimed_at(&self) -> StoreTime {
        self.0.claimed_at
    }

    /// When it ended; `None` while it runs.
    pub fn ended_at(&self) -> Option<StoreTime> {
        self.0.ended_at
    }

    /// How it ended; `None` while it runs.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.0.outcome.as_ref()
    }

    /// The last progress value reported during the attempt.
    pub fn progress(&self) -> u64 {
        self.0.progress
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
