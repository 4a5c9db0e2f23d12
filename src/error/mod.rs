//! Errors, one enum per surface, wrapped (not re-listed) by the crate's [`Error`]: plain
//! data, at the bottom of the crate (they name no engine's machinery).

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "postgres")]
pub use self::postgres::PgError;

use std::path::PathBuf;
use std::time::Duration;

use crate::ids::{Attempt, GroupId, JobId};
use crate::state::JobState;

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An argument (queue name, payload, key, ...) is not acceptable; nothing was written.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The fence refused the write: the caller no longer holds the lease. Nothing changed.
    /// Stop working on the job and commit nothing.
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    /// No job has this id.
    #[error("job {0} does not exist")]
    JobNotFound(JobId),
    /// No schedule of this name.
    #[error("no schedule named {0:?}")]
    ScheduleNotFound(String),
    /// A queue's controls (pause, resume, limits, retry policy) named a queue the store does
    /// not know: no job of it is stored and it has no settings. A typo would otherwise make
    /// a new queue and leave the meant one as it was. Nothing was written; an application
    /// that sets a queue's controls before its first job declares it first
    /// ([`crate::JobStore::declare_queue`]).
    #[error(
        "no job has used queue {0:?} and it has no settings: is the name right? (declare it          first to set a new queue's controls)"
    )]
    QueueNotFound(String),
    /// A job was to wait for a job that does not exist (never enqueued, or purged). Nothing
    /// was written.
    #[error("job {0} does not exist, so nothing can wait for it")]
    DependencyNotFound(JobId),
    /// No group has this id.
    #[error("group {0} does not exist")]
    GroupNotFound(GroupId),
    /// A job was to join a group that is sealed (or was cancelled, or ended). Nothing was
    /// written.
    #[error("group {0} is sealed: no job can join it any more")]
    GroupSealed(GroupId),
    /// A job was to wait for a group that is still open, or for one of its callbacks: until
    /// it is sealed only its callbacks wait for it (a member could otherwise wait for what
    /// waits for its own group, which would then never end). Nothing was written.
    #[error(
        "group {0} is still open: only its callbacks wait for it (or for them) until it is sealed"
    )]
    GroupOpen(GroupId),
    /// A group reached one of its limits ([`crate::MAX_GROUP_MEMBERS`],
    /// [`crate::MAX_SUBGROUPS`], [`crate::MAX_GROUP_WAITERS`]). Nothing was written.
    #[error("group {group} has its most {limit} ({max})")]
    GroupLimit {
        /// The group.
        group: GroupId,
        /// "members", "waiters" or "subgroups".
        limit: &'static str,
        /// The limit.
        max: u64,
    },
    /// A schedule of this name is declared with another timing, job or catch-up policy.
    /// Nothing changed: the declaration that should win says
    /// [`Schedule::replace`](crate::Schedule::replace) (a new version of the application),
    /// or the old one is removed first.
    #[error(
        "schedule {0:?} is declared already, with another timing, job or catch-up policy: declare it with .replace() for this one to win, or remove it first"
    )]
    ScheduleConflict(String),
    /// The job is in a state in which the operation does not apply; nothing changed.
    #[error("job {job} is {state}: cannot {action}")]
    Refused {
        /// The job.
        job: JobId,
        /// Its state.
        state: JobState,
        /// What was refused.
        action: &'static str,
    },
    /// An edit named the attempt the caller last saw ([`crate::Edit::if_attempt`]), and the
    /// job has been claimed since: nothing changed.
    #[error(
        "job {job} was claimed since the edit was made (attempt {found}, not {expected}): nothing changed"
    )]
    EditConflict {
        /// The job.
        job: JobId,
        /// The attempt the edit expected.
        expected: Attempt,
        /// The job's attempt now.
        found: Attempt,
    },
    /// A dead or cancelled job cannot be retried: a live job has taken its unique key since.
    /// Nothing changed.
    #[error("job {job} cannot be retried: job {holder} now holds its unique key {key:?}")]
    UniqueKeyHeld {
        /// The job to retry.
        job: JobId,
        /// Its unique key.
        key: String,
        /// The live job that holds the key.
        holder: JobId,
    },
    /// The store was called from inside one of its own transactions (a
    /// [`Store::transaction`](crate::Store::transaction) or
    /// [`Store::complete_with`](crate::Store::complete_with) closure, or a pool's
    /// `Output::with_writes`). That transaction holds the writer's seat until the closure
    /// returns, so the call could only wait for itself: use the
    /// [`Transaction`](crate::Transaction) the closure was given instead. Nothing was written.
    #[error(
        "the store was called from inside its own transaction; use the Transaction the closure was given"
    )]
    Reentered,
    /// A store operation panicked inside a shared commit (a bug, or the storage engine on
    /// a damaged page): that transaction was rolled back, nothing of it was written, and the
    /// store goes on.
    #[error("a store operation panicked; its transaction was rolled back")]
    Panicked,
    /// A thread the store or a pool needs could not be started (the process is out of
    /// threads or memory). Nothing was written.
    #[error("could not start a thread: {0}")]
    ThreadSpawn(#[source] std::io::Error),
    /// The operation needs the store to itself, and other handles are alive.
    #[error("store in use: {0}")]
    InUse(&'static str),
    /// A stored record could not be decoded: the file was altered or damaged.
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    /// Something leasehold's own code promises did not hold: a bug in leasehold, not a
    /// damaged store (please report it). The operation wrote nothing it could not undo.
    #[error("leasehold broke its own invariant ({0}); this is a bug, please report it")]
    Internal(&'static str),
    /// The storage engine failed (I/O error, closed database, ...). Nothing was committed.
    #[error("storage error: {0}")]
    Storage(#[from] redb::Error),
    /// The commit itself failed. As redb documents, a commit that returns an error may still
    /// have become durable: treat the outcome as unknown and make the retry idempotent (every
    /// fenced operation is: a retried complete of an attempt that did commit gets `LeaseLost`,
    /// and `job()` shows the truth).
    #[error("commit failed (it may or may not have become durable): {0}")]
    Commit(#[source] redb::CommitError),
    /// The shared transaction this operation was committed in (see group commit in
    /// [`Store`](crate::Store)) failed; the error is shared by every operation of the group.
    /// As for [`Error::Commit`], a failed commit may still have become durable.
    #[error("{0}")]
    Group(std::sync::Arc<Error>),
    /// The application's own write inside a leasehold transaction failed; the whole
    /// transaction was rolled back.
    #[error("application write failed: {0}")]
    Application(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A PostgreSQL store's failure (the `postgres` feature).
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    Postgres(#[from] PgError),
}

impl Error {
    /// Whether this is a lost lease (the fence refused a write).
    pub fn is_lease_lost(&self) -> bool {
        self.lease_lost().is_some()
    }

    /// The fence's refusal, if this is one (also inside a shared group's failure).
    pub fn lease_lost(&self) -> Option<&LeaseLost> {
        match self {
            Error::LeaseLost(l) => Some(l),
            Error::Group(e) => e.lease_lost(),
            _ => None,
        }
    }

    /// An error returned by the application's code inside a leasehold transaction: a
    /// leasehold error it passed on (`?` on [`Transaction::enqueue`](crate::Transaction),
    /// say) stays what it is; anything else is [`Error::Application`].
    pub(crate) fn from_application(e: Box<dyn std::error::Error + Send + Sync>) -> Error {
        match e.downcast::<Error>() {
            Ok(ours) => *ours,
            Err(theirs) => Error::Application(theirs),
        }
    }

    /// Whether the database aborted the transaction for a conflict that running it again
    /// may not meet (a PostgreSQL serialization failure or deadlock, after the store's own
    /// retries): nothing of it was committed, and it says nothing about the job.
    pub fn is_transient(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => e.is_transient(),
            Error::Group(e) => e.is_transient(),
            _ => false,
        }
    }

    /// Whether the store refused the operation before writing anything (a lost lease, a bad
    /// argument, an unknown job, a state the operation does not apply to), as opposed to a
    /// failure of the storage underneath.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::LeaseLost(_)
                | Error::Input(_)
                | Error::Config(_)
                | Error::JobNotFound(_)
                | Error::ScheduleNotFound(_)
                | Error::QueueNotFound(_)
                | Error::ScheduleConflict(_)
                | Error::DependencyNotFound(_)
                | Error::EditConflict { .. }
                | Error::GroupNotFound(_)
                | Error::GroupSealed(_)
                | Error::GroupOpen(_)
                | Error::GroupLimit { .. }
                | Error::Refused { .. }
                | Error::UniqueKeyHeld { .. }
                | Error::InUse(_)
                | Error::Reentered
        )
    }
}

macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Storage(redb::Error::from(e))
            }
        }
    )*};
}
storage_from!(
    redb::StorageError,
    redb::TransactionError,
    redb::TableError,
    redb::SetDurabilityError,
    redb::CompactionError
);

impl From<redb::CommitError> for Error {
    fn from(e: redb::CommitError) -> Error {
        Error::Commit(e)
    }
}

/// Why a store could not be opened. Each case leaves the file untouched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The file exists but is not a leasehold store (not a redb file, or a redb file that
    /// leasehold did not create).
    #[error("{path} is not a leasehold store ({detail})")]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The store was written by a newer leasehold whose format this version cannot read.
    #[error(
        "{path} has schema version {found}, newer than the {supported} this leasehold reads; upgrade leasehold"
    )]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// The file's schema version.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The file is a leasehold store but is damaged.
    #[error("{path} is corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Another process (or another handle in this one) holds the writer's seat, or, for a
    /// read-only open, holds the file exclusively.
    #[error("{path} {}", describe_holder(*.pid))]
    Locked {
        /// The file.
        path: PathBuf,
        /// The writer's process id, where it could be read from the store.
        pid: Option<u32>,
    },
    /// Processes sharing a store prove they are alive with file locks, and this filesystem
    /// does not keep them (some network filesystems): sharing it between processes is not
    /// safe there.
    #[error(
        "{path}: file locks do not work here ({detail}); processes cannot share a store on this filesystem"
    )]
    NoWorkingLocks {
        /// The directory of process instances.
        path: PathBuf,
        /// What the test found.
        detail: String,
    },
    /// The store is open in another sharing mode by another process (one process in
    /// [`Sharing::MultiProcess`](crate::Sharing::MultiProcess) and another in single-writer
    /// or exclusive sharing cannot share a file).
    #[error(
        "{path} is shared by several processes (Sharing::MultiProcess); open it with the same Sharing to join them"
    )]
    IncompatibleSharing {
        /// The file.
        path: PathBuf,
    },
    /// Processes that share a store register in a directory beside it, `<store>.procs`, and
    /// something other than a directory is in its place. Nothing was created: move it away
    /// (the directory belongs to the store; leasehold makes it).
    #[error(
        "{path} must be the directory in which the processes sharing the store register, and it is not a directory: move it away; leasehold makes the directory itself"
    )]
    ProcessDirectoryTaken {
        /// The path where the directory belongs.
        path: PathBuf,
    },
    /// The file could not be read or created.
    #[error("cannot open {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A lease must last some time.
    #[error("lease length must be greater than zero")]
    ZeroLease,
    /// A lease so long that a dead holder would go unnoticed for more than a week.
    #[error("lease {lease:?} is longer than the {max:?} limit")]
    LeaseTooLong {
        /// The lease asked for.
        lease: Duration,
        /// The limit.
        max: Duration,
    },
    /// Heartbeats must come more often than the lease lasts, or every lease lapses.
    #[error("heartbeat interval {heartbeat:?} must be shorter than the lease {lease:?}")]
    HeartbeatNotShorterThanLease {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },
    /// A stall timeout of zero would revoke every lease at its first heartbeat.
    #[error("stall timeout must be greater than zero")]
    ZeroStallTimeout,
    /// A time limit of zero would end every attempt as it began.
    #[error("time limit must be greater than zero")]
    ZeroTimeLimit,
    /// A heartbeat interval of zero would spin.
    #[error("heartbeat interval must be greater than zero")]
    ZeroHeartbeat,
    /// A scheduler interval of zero would spin.
    #[error("scheduler interval must be greater than zero")]
    ZeroSchedulerInterval,
    /// A reaper interval of zero would spin.
    #[error("reaper interval must be greater than zero")]
    ZeroReaperInterval,
    /// A pool must run at least one job at a time.
    #[error("concurrency must be at least 1")]
    ZeroConcurrency,
    /// A pool's queues ([`crate::Queues`]): none, too many, one named twice, or a weight
    /// of zero.
    #[error("a pool's queues: {0}")]
    PoolQueues(&'static str),
    /// A pool's window bounds how many jobs it claims ahead; one of zero would be a pool that
    /// never claims ahead, which `prefetch(0)` says plainly.
    #[error("window must be at least 1 (prefetch(0) claims nothing ahead)")]
    ZeroWindow,
    /// A pool's batch must carry at least one completion or claim.
    #[error("a pool's largest batch must be at least 1")]
    ZeroMaxBatch,
    /// A completion that waits for its batch as long as a heartbeat interval holds its lease
    /// through a renewal for nothing, and a dead pool loses what it kept waiting.
    #[error("batch delay {delay:?} must be shorter than the heartbeat interval {heartbeat:?}")]
    BatchDelayNotShorterThanHeartbeat {
        /// The batch delay.
        delay: Duration,
        /// The heartbeat interval.
        heartbeat: Duration,
    },
    /// A reap batch must reclaim at least one lease.
    #[error("reap batch size must be at least 1")]
    ZeroBatch,
    /// The default retry budget must allow one attempt.
    #[error("max attempts must be at least 1")]
    ZeroMaxAttempts,
    /// The retry backoff is inverted or its jitter is out of range.
    #[error("retry policy is invalid: {0}")]
    RetryPolicy(&'static str),
    /// Processes share a store through its file (and the instance files beside it), so a
    /// custom storage backend cannot be shared.
    #[error("Sharing::MultiProcess needs a store file, not a custom backend")]
    MultiProcessNeedsAFile,
    /// Non-durable commits exist only in one process's memory, so redb refuses them when
    /// processes share a store.
    #[error("eventual durability is not available when processes share the store")]
    EventualDurabilityShared,
    /// A pool's handler returned writes for another kind of store than the pool runs on
    /// (`Output::with_writes` is redb's, `Output::with_sql` PostgreSQL's).
    #[error("the handler's writes are {given}, but the pool runs on {store}")]
    WritesForAnotherStore {
        /// What the handler gave.
        given: &'static str,
        /// The store the pool runs on, and what its writes are.
        store: &'static str,
    },
}

/// An argument that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Queue names are how workers find work; an empty one is always a mistake.
    #[error("queue name is empty")]
    EmptyQueueName,
    /// Queue names appear in every index key, so they are kept short.
    #[error("queue name is {len} bytes; the limit is {max}")]
    QueueNameTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A payload or output larger than the store's limit.
    #[error("{what} is {len} bytes; the limit is {max}")]
    TooLarge {
        /// "payload", "output", "checkpoint" or "error message".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A unique key must be non-empty and short.
    #[error("unique key must be 1 to {max} bytes, got {len}")]
    BadUniqueKey {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A delayed job that would expire before (or as) it is due could never run.
    #[error(
        "the job would expire {expires:?} after its enqueue, not after it is due ({due:?}): it could never run"
    )]
    ExpiresBeforeDue {
        /// How long after its enqueue it is due.
        due: std::time::Duration,
        /// How long after its enqueue it would expire.
        expires: std::time::Duration,
    },
    /// An ending's cursor is `TX.SEQ` ([`crate::EndCursor`]'s `Display`).
    #[error("{0:?} is not an ending's cursor (TX.SEQ, as one was written)")]
    BadEndCursor(String),
    /// A group key must be non-empty and short.
    #[error("group key must be 1 to {max} bytes, got {len}")]
    BadGroupKey {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A limit key must be non-empty and short.
    #[error("limit key must be 1 to {max} bytes, got {len}")]
    BadLimitKey {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A job must be allowed at least one attempt.
    #[error("max attempts must be at least 1")]
    ZeroMaxAttempts,
    /// A job's or a queue's retry policy is inverted, empty, too long, or its jitter is out
    /// of range.
    #[error("retry policy is invalid: {0}")]
    RetryPolicy(&'static str),
    /// More dependencies than one job may have.
    #[error("a job may wait for at most {max} jobs and groups, got {given}")]
    TooManyDependencies {
        /// How many were given.
        given: usize,
        /// The limit, [`crate::MAX_DEPENDENCIES`].
        max: usize,
    },
    /// A group's member with a unique key: an enqueue its key answered with another job
    /// would join nothing, and the group would end without the work it names.
    #[error("a group's member cannot have a unique key")]
    MemberWithUniqueKey,
    /// A group's callback that would join a group: callbacks are no group's members.
    #[error("a group's callback cannot join a group")]
    CallbackInGroup,
    /// A value could not be encoded as JSON, or a payload decoded from it (the `serde`
    /// feature). The message is serde_json's.
    #[cfg(feature = "serde")]
    #[error("JSON: {0}")]
    Json(String),
    /// Tables whose names start with `leasehold.` belong to the store.
    #[error("table name {0:?} is reserved for the store (prefix \"leasehold.\")")]
    ReservedTableName(String),
    /// A name or key holds a NUL byte, which no stored text may hold (PostgreSQL's text
    /// cannot, and a name must mean the same on both engines).
    #[error("{what} holds a NUL byte (at byte {at})")]
    NulByte {
        /// "queue name", "worker id" or "unique key".
        what: &'static str,
        /// Where the first one is.
        at: usize,
    },
    /// A worker id identifies the holder in history; it must be non-empty and short.
    #[error("worker id must be 1 to {max} bytes, got {len}")]
    BadWorkerId {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A job's time limit of zero would end its every attempt as it began.
    #[error("a job's time limit must be greater than zero")]
    ZeroTimeLimit,
    /// A schedule's name identifies it in the store and in its jobs' unique keys.
    #[error("schedule name must be 1 to {max} bytes, got {len}")]
    BadScheduleName {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A schedule every zero seconds would enqueue without end.
    #[error("a schedule's interval must be greater than zero")]
    ZeroInterval,
    /// A schedule's interval under [`crate::schedule::MIN_INTERVAL`]: each tick is a job
    /// whose unique key is kept until purged, and a scheduler fires about once a second.
    #[error("a schedule's interval of {every:?} is shorter than the {min:?} minimum")]
    IntervalTooShort {
        /// The interval asked for.
        every: std::time::Duration,
        /// The shortest allowed.
        min: std::time::Duration,
    },
    /// A schedule's job asks for what a schedule cannot honour: its own unique key or
    /// window (each tick's job is kept unique by the tick), a delay (it runs at its tick), an
    /// expiry at a wall-clock time (each tick's job expires `expires_in` after its tick), or
    /// the metadata key `schedule` (each tick's job carries its schedule's name under it).
    #[error("a schedule's job cannot have {0}")]
    ScheduleJobOption(&'static str),
    /// A cron expression that does not parse (or a build without the `cron` feature).
    #[error("cron expression {expr:?}: {why}")]
    BadCron {
        /// The expression.
        expr: String,
        /// Why.
        why: String,
    },
    /// A time zone the zone database does not know.
    #[error("time zone {zone:?}: {why}")]
    BadTimeZone {
        /// The zone.
        zone: String,
        /// Why.
        why: String,
    },
    /// A concurrency limit of zero would hold every job forever: pause the queue instead.
    #[error("a concurrency limit must be at least 1 (pause the queue to stop its claims)")]
    ZeroConcurrency,
    /// A rate limit counts 1 to `max` claims in a period longer than zero.
    #[error(
        "a rate limit of {claims} claims per {per:?}: it must be 1 to {max} claims per a period longer than zero"
    )]
    BadRate {
        /// The claims asked for.
        claims: u32,
        /// The period asked for.
        per: std::time::Duration,
        /// The most claims a window holds.
        max: u32,
    },
    /// A uniqueness window ([`crate::NewJob::unique_for`]) without a unique key to keep.
    #[error("a uniqueness window needs a unique key")]
    WindowWithoutKey,
    /// A metadata key must be 1 to 64 bytes without `=` (the tool's filters read `key=value`).
    #[error("metadata key {key:?} must be 1 to {max} bytes without '='")]
    BadMetadataKey {
        /// The key.
        key: String,
        /// The limit.
        max: usize,
    },
    /// A metadata value is a tag, not a payload.
    #[error("metadata value of {key:?} is {len} bytes; the limit is {max}")]
    MetadataValueTooLong {
        /// Its key.
        key: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Metadata is a few tags, not a document.
    #[error("{count} metadata pairs; the limit is {max}")]
    TooMuchMetadata {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// The fence refused a write: the job is no longer `Running` under the caller's attempt.
/// Carries what the store found instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease lost on job {job} attempt {attempt}: {}", describe_found(.found, *.ended_by_holder))]
#[non_exhaustive]
pub struct LeaseLost {
    /// The job the caller thought it held.
    pub job: JobId,
    /// The attempt the caller holds.
    pub attempt: Attempt,
    /// The job's current attempt and state; `None` if the job no longer exists.
    pub found: Option<(Attempt, JobState)>,
    /// The attempt was ended by its own holder (completed, failed or released): nothing was
    /// lost, the write came after the holder's own end (a heartbeat tick overlapping a
    /// completion, or a retried completion whose first commit did land). A renewal refused so
    /// is not counted as a lost lease.
    pub ended_by_holder: bool,
}

fn describe_holder(pid: Option<u32>) -> String {
    match pid {
        Some(p) if p == std::process::id() => "is already open in this process; clone that Store \
             (clones share one file) instead of opening it again"
            .to_owned(),
        Some(p) => format!(
            "is being written by another process (pid {p}); only one writer may hold it \
             (processes that all open it with Sharing::MultiProcess write it together)"
        ),
        None => "is being written by another process; only one writer may hold it \
                 (processes that all open it with Sharing::MultiProcess write it together)"
            .to_owned(),
    }
}

fn describe_found(found: &Option<(Attempt, JobState)>, ended_by_holder: bool) -> String {
    match found {
        Some((a, s)) if ended_by_holder => {
            format!("the holder already ended attempt {a}; the job is now {s}")
        }
        Some((a, s)) => format!("the job is now {s} at attempt {a}"),
        None => "the job no longer exists".to_owned(),
    }
}

/// Shorthand for results of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A panic's message, for reports (its payload is a `&str` or a `String` when made by
/// `panic!`).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// The error that failed a whole batch, to answer each of its entries with: a
/// PostgreSQL error as itself (it clones), any other shared as [`Error::Group`].
pub(crate) fn shared_by_all(e: Error) -> impl Fn() -> Error {
    let shared = match e {
        Error::Group(shared) => Error::Group(shared),
        #[cfg(feature = "postgres")]
        Error::Postgres(pg) => Error::Postgres(pg),
        other => Error::Group(std::sync::Arc::new(other)),
    };
    move || match &shared {
        #[cfg(feature = "postgres")]
        Error::Postgres(pg) => Error::Postgres(pg.clone()),
        Error::Group(group) => Error::Group(group.clone()),
        _ => Error::Internal("a batch's shared error of another kind"),
    }
}
