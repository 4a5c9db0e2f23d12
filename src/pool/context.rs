//! What a handler sees and returns: the [`JobContext`] of one attempt, the [`Output`] it
//! commits, and the [`JobError`] it fails with.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::checkpoint::Checkpoint;
use crate::clock::RealDeadline;
use crate::error::Error;
use crate::ids::{Attempt, JobId, StoreTime};
use crate::job_log::LogRecord;
use crate::job_store::JobStore;
use crate::lease::Lease;
use crate::protocol::AnyWrites;
use crate::rules::Retry;
use crate::workflow::{Group, Target};

/// Why a handler is asked to stop. Whatever it returns afterwards is not committed (except
/// where noted): its lease is gone or going.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interruption {
    /// A renewal was refused: the job was taken back (and may be running elsewhere).
    LeaseLost,
    /// The job was cancelled.
    Cancelled,
    /// The store revoked the lease because progress stopped for the stall timeout.
    Stalled,
    /// Renewals failed for half a lease and this lease has expired on the store clock: the
    /// pool gives the job back rather than race a reclaim.
    LeaseExpired,
    /// The pool is shutting down and the grace period ran out; the job was released.
    Shutdown,
    /// The pool was abandoned (a simulated crash): nothing more is written.
    Abandoned,
    /// The attempt ran into its hard time limit ([`crate::NewJob::time_limit`],
    /// [`crate::PoolBuilder::time_limit`]): the pool ends it as timed out.
    TimedOut,
}

impl Interruption {
    fn code(self) -> u8 {
        match self {
            Interruption::LeaseLost => 1,
            Interruption::Cancelled => 2,
            Interruption::Stalled => 3,
            Interruption::LeaseExpired => 4,
            Interruption::Shutdown => 5,
            Interruption::Abandoned => 6,
            Interruption::TimedOut => 7,
        }
    }

    fn from_code(code: u8) -> Option<Interruption> {
        if code == TIMED_OUT_IN_STORE {
            return Some(Interruption::TimedOut);
        }
        [
            Interruption::LeaseLost,
            Interruption::Cancelled,
            Interruption::Stalled,
            Interruption::LeaseExpired,
            Interruption::Shutdown,
            Interruption::Abandoned,
            Interruption::TimedOut,
        ]
        .into_iter()
        .find(|i| i.code() == code)
    }
}

impl fmt::Display for Interruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interruption::LeaseLost => "lease lost",
            Interruption::Cancelled => "cancelled",
            Interruption::Stalled => "stalled",
            Interruption::LeaseExpired => "lease expired while renewals failed",
            Interruption::Shutdown => "pool shutting down",
            Interruption::Abandoned => "pool abandoned",
            Interruption::TimedOut => "ran into its time limit",
        })
    }
}

/// Returned by [`JobContext::checkpoint`] once the job is interrupted; `?` it out of the
/// handler.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("job interrupted: {0}")]
pub struct Interrupted(pub Interruption);

/// The code of [`Interruption::TimedOut`] when a renewal found the deadline passed: the
/// store has ended the attempt already, so the pool writes nothing more for it.
const TIMED_OUT_IN_STORE: u8 = 8;

/// The live state of one attempt, shared by the handler's context and the pool's threads.
#[derive(Debug, Default)]
pub(crate) struct AttemptState {
    progress: AtomicU64,
    interrupted: AtomicU8,
    /// The lease's latest known expiry (store time, nanoseconds).
    expires_at: AtomicU64,
    /// A worker took the job (until then it was claimed ahead, waiting for one).
    started: AtomicBool,
    /// Wakes a handler sleeping in [`JobContext::sleep`] when it is interrupted.
    sleep: Mutex<()>,
    wake: Condvar,
    /// Async handlers awaiting the interruption (the `tokio` feature), under the sleep lock.
    wakers: Mutex<Vec<Waker>>,
    /// The handler's log lines not yet stored (bounded as a stored log is).
    log: Mutex<LogRecord>,
}

impl AttemptState {
    pub(crate) fn new(expires_at: StoreTime) -> Arc<AttemptState> {
        let s = AttemptState::default();
        s.expires_at.store(expires_at.0, Ordering::Relaxed);
        Arc::new(s)
    }

    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Interrupts the attempt; the first reason sticks. Returns whether this call set it.
    pub(crate) fn interrupt(&self, why: Interruption, counter: Option<&AtomicU64>) -> bool {
        self.interrupt_with(why.code(), counter)
    }

    /// Interrupts the attempt as timed out, which a renewal found and the store has ended
    /// already (see [`AttemptState::ended_in_store`]).
    pub(crate) fn interrupt_timed_out_in_store(&self, counter: Option<&AtomicU64>) -> bool {
        self.interrupt_with(TIMED_OUT_IN_STORE, counter)
    }

    /// Whether the store itself ended the attempt that timed out (a renewal past the
    /// deadline), rather than the pool's timer noticing first.
    pub(crate) fn ended_in_store(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst) == TIMED_OUT_IN_STORE
    }

    fn interrupt_with(&self, code: u8, counter: Option<&AtomicU64>) -> bool {
        // Under the sleep lock: a handler between its check and its wait is not missed, and
        // of two interrupters exactly one is first.
        let _guard = self.sleep.lock();
        if self.interrupted.load(Ordering::SeqCst) != 0 {
            return false;
        }
        // Counted before the handler can see it: once it sees the interruption its attempt
        // may end at once, and whoever sees the attempt end must see it counted.
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        self.interrupted.store(code, Ordering::SeqCst);
        self.wake.notify_all();
        std::mem::take(&mut *self.wakers.lock())
            .into_iter()
            .for_each(Waker::wake);
        true
    }

    /// Ready with the interruption once there is one, otherwise pending with `cx`'s waker
    /// left for [`AttemptState::interrupt`].
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn poll_interrupted(&self, cx: &mut Context<'_>) -> Poll<Interruption> {
        // The check under the sleep lock, as `interrupt` wakes under it: none is missed.
        let _guard = self.sleep.lock();
        if let Some(why) = self.interruption() {
            return Poll::Ready(why);
        }
        let mut wakers = self.wakers.lock();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    pub(crate) fn interruption(&self) -> Option<Interruption> {
        Interruption::from_code(self.interrupted.load(Ordering::SeqCst))
    }

    /// A worker takes the job: from now on it is run, not given back unstarted.
    pub(crate) fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    pub(crate) fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    pub(crate) fn expires_at(&self) -> StoreTime {
        StoreTime(self.expires_at.load(Ordering::Relaxed))
    }

    pub(crate) fn renewed(&self, expires_at: StoreTime) {
        self.expires_at.store(expires_at.0, Ordering::Relaxed);
    }

    /// The log lines written since the last call, if any.
    pub(crate) fn take_log(&self) -> Option<LogRecord> {
        let log = std::mem::take(&mut *self.log.lock());
        (!log.lines.is_empty() || log.dropped > 0).then_some(log)
    }

    /// Lines taken that could not be stored: back before any written since.
    pub(crate) fn give_back_log(&self, mut older: LogRecord) {
        let mut log = self.log.lock();
        older.merge(&log);
        *log = older;
    }
}

/// One attempt of one job, as its handler sees it.
///
/// Report progress with [`progress`](JobContext::progress) or [`tick`](JobContext::tick):
/// the pool's heartbeat carries it to the store, where a job whose progress stops for the
/// stall timeout loses its lease. Check [`checkpoint`](JobContext::checkpoint) between
/// steps: once the lease is lost nothing the handler returns will be committed, so further
/// work is wasted.
///
/// A handler in a workflow reads what it needs through it, with no store handle of its
/// own: [`dependency_outputs`](JobContext::dependency_outputs) for the results of the jobs it
/// waits for, [`group`](JobContext::group) for its group (a member's, or the group a
/// callback waits for).
#[derive(Clone)]
pub struct JobContext {
    lease: Lease,
    state: Arc<AttemptState>,
    store: Arc<dyn JobStore>,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("lease", &self.lease)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    pub(crate) fn new(
        lease: Lease,
        state: Arc<AttemptState>,
        store: Arc<dyn JobStore>,
    ) -> JobContext {
        JobContext {
            lease,
            state,
            store,
        }
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn attempt_state(&self) -> &AttemptState {
        &self.state
    }

    /// The job's id.
    pub fn job(&self) -> JobId {
        self.lease.job
    }

    /// This attempt (the fencing token of this execution).
    pub fn attempt(&self) -> Attempt {
        self.lease.attempt
    }

    /// The job's payload.
    pub fn payload(&self) -> &[u8] {
        &self.lease.payload
    }

    /// The job's queue.
    pub fn queue(&self) -> &str {
        &self.lease.queue
    }

    /// The lease this attempt runs under, as granted.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The outputs of the jobs this job waits for ([`crate::NewJob::after`]), in the order
    /// it names them, read from the store now: `None` for one with no output (not
    /// succeeded, an empty output, or purged). A group it waits for is not among them: its
    /// members are listed by [`crate::JobFilter::group`]. The same as
    /// [`ReadJobs::dependency_outputs`](crate::ReadJobs::dependency_outputs) of this job.
    pub fn dependency_outputs(&self) -> crate::error::Result<Vec<(JobId, Option<Vec<u8>>)>> {
        self.store.dependency_outputs(self.lease.job)
    }

    /// This job's group, read from the store now: the group it is a member of
    /// ([`crate::NewGroup`]), or, for a job that waits for a group (a callback), the first
    /// group it waits for; `None` for neither. A callback reads there how its group ended
    /// ([`Group::outcome`], [`Group::ended`]).
    pub fn group(&self) -> crate::error::Result<Option<Group>> {
        let Some(job) = self.store.job(self.lease.job)? else {
            return Err(Error::JobNotFound(self.lease.job));
        };
        let awaited = job.needs().iter().find_map(|n| match n.on() {
            Target::Group(g) => Some(g),
            _ => None,
        });
        match job.group().or(awaited) {
            Some(group) => self.store.group(group),
            None => Ok(None),
        }
    }

    /// Saves `data` as this job's checkpoint, for its next attempts to resume from
    /// ([`last_checkpoint`](JobContext::last_checkpoint)) if this one dies, hangs or is
    /// taken back before it ends: a cursor, an offset, the last item done. Committed when
    /// this returns, as the store's other writes are (one write transaction each: save as
    /// often as losing the work since is worth).
    ///
    /// Fenced like the attempt's end: once this attempt's lease is lost, `Err` with
    /// [`Error::LeaseLost`] (and what the job's new holder saved stays); stop then, as at an
    /// interruption. At most the store's `max_payload` bytes.
    pub fn save_checkpoint(&self, data: &[u8]) -> crate::error::Result<()> {
        self.store.save_checkpoint(&self.lease, data)
    }

    /// The last checkpoint saved for this job, read from the store now: by an attempt
    /// before this one (resume from it), by this one, or `None` if none was saved. Its
    /// [`attempt`](Checkpoint::attempt) says which.
    pub fn last_checkpoint(&self) -> crate::error::Result<Option<Checkpoint>> {
        self.store.checkpoint(self.lease.job)
    }

    /// Writes a line to this attempt's log, kept with the job ([`crate::ReadJobs::logs`],
    /// `leasehold show`, the status page's job view): what the handler did, for the operator
    /// who finds the job later. Costs no write of its own: the lines reach the store with
    /// the pool's next heartbeat, and the last ones with the attempt's end (in the
    /// transaction of its completion; just before a failure, a snooze or a release). The newest
    /// [`MAX_LOG_LINES`](crate::MAX_LOG_LINES) of an attempt are kept, each cut to
    /// [`MAX_LOG_LINE`](crate::MAX_LOG_LINE) bytes; the older ones are counted as dropped.
    pub fn log(&self, line: impl AsRef<str>) {
        let line = crate::job_log::line(self.store.clock(), line.as_ref());
        self.state.log.lock().append(&[line]);
    }

    /// Sets the progress counter (any change counts as progress).
    pub fn progress(&self, value: u64) {
        self.state.progress.store(value, Ordering::Relaxed);
    }

    /// Adds one to the progress counter.
    pub fn tick(&self) {
        self.state.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the handler has been asked to stop.
    pub fn is_interrupted(&self) -> bool {
        self.state.interruption().is_some()
    }

    /// Why the handler has been asked to stop, if it has.
    pub fn interruption(&self) -> Option<Interruption> {
        self.state.interruption()
    }

    /// Sleeps for up to `d` of real time, returning early with `Err` if the job is
    /// interrupted meanwhile. For handlers that wait (on a backoff, a device, a poll), so a
    /// lost lease stops them at once rather than after the wait.
    pub fn sleep(&self, d: Duration) -> Result<(), Interrupted> {
        let deadline = RealDeadline::after(d);
        let mut guard = self.state.sleep.lock();
        loop {
            self.checkpoint()?;
            if deadline.passed() {
                return Ok(());
            }
            let _ = self.state.wake.wait_for(&mut guard, deadline.remaining());
        }
    }

    /// `Err` once the handler has been asked to stop.
    pub fn checkpoint(&self) -> Result<(), Interrupted> {
        match self.state.interruption() {
            Some(why) => Err(Interrupted(why)),
            None => Ok(()),
        }
    }
}

/// What a successful handler commits: its output bytes and, optionally, the application's
/// own writes, applied in the completion's transaction only if the fence holds.
///
/// The writes are of one engine's kind, and `W` says which: `Output::with_writes` makes an
/// `Output<RedbWrites>` (redb tables), `Output::with_sql` an `Output<SqlWrites>`
/// (PostgreSQL; the `postgres` feature). A pool on a [`Store`](crate::Store) takes the first,
/// a pool on a `PgStore` the second, so handing a pool the other engine's writes does not
/// compile. A pool on a [`Backend`](crate::Backend) (either engine, chosen at run time) takes
/// `Output<AnyWrites>` (`into_any`), and refuses writes of the wrong kind when it commits
/// them ([`ConfigError::WritesForAnotherStore`](crate::ConfigError)). A handler that only
/// returns bytes (`Output::new`, or bytes, a `String` or `()`) fits every pool.
///
/// ```compile_fail
/// # fn main() -> Result<(), leasehold::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// let store = leasehold::Store::open(dir.path().join("jobs.redb"))?;
/// leasehold::WorkerPool::builder(store, "q").start(|_ctx| {
///     // SQL for a pool on a redb file: a type error, not a failure at run time
///     Ok(leasehold::Output::with_sql(b"x".to_vec(), |_t| Ok::<(), leasehold::Error>(())))
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct Output<W> {
    pub(crate) bytes: Vec<u8>,
    pub(crate) writes: Option<W>,
}

impl<W> Output<W> {
    /// Output bytes alone.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Output<W> {
        Output {
            bytes: bytes.into(),
            writes: None,
        }
    }

    /// Output bytes plus `writes`, for an engine's own constructors.
    pub(crate) fn with(bytes: impl Into<Vec<u8>>, writes: W) -> Output<W> {
        Output {
            bytes: bytes.into(),
            writes: Some(writes),
        }
    }

    /// The same output for a pool on a [`Backend`](crate::Backend) of either engine.
    pub fn into_any(self) -> Output<AnyWrites>
    where
        W: Send + 'static,
    {
        Output {
            bytes: self.bytes,
            writes: self.writes.map(|w| AnyWrites(Box::new(w))),
        }
    }
}

impl<W> fmt::Debug for Output<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Output")
            .field("bytes", &self.bytes.len())
            .field("writes", &self.writes.is_some())
            .finish()
    }
}

impl<W> From<Vec<u8>> for Output<W> {
    fn from(bytes: Vec<u8>) -> Output<W> {
        Output::new(bytes)
    }
}

impl<W> From<&[u8]> for Output<W> {
    fn from(bytes: &[u8]) -> Output<W> {
        Output::new(bytes)
    }
}

impl<W> From<String> for Output<W> {
    fn from(text: String) -> Output<W> {
        Output::new(text)
    }
}

impl<W> From<()> for Output<W> {
    fn from((): ()) -> Output<W> {
        Output::new(Vec::new())
    }
}

/// A handler's failure: recorded as the attempt's error, and the job is retried after a
/// backoff while its budget lasts, unless the failure is permanent: then the job is dead at
/// once, with [`Outcome::FailedPermanently`](crate::Outcome::FailedPermanently) in its
/// history.
///
/// A failure is permanent when the handler says so ([`JobError::permanent`]: a request the
/// remote side refuses for good, a record that no longer exists) or when it is one running
/// the job again would meet again: a payload that is not the JSON the handler asked for
/// (`JobContext::json`, the `serde` feature), and any leasehold error that says the input is bad
/// ([`Error::Input`](crate::Error::Input)), that the store was called from inside its own
/// transaction ([`Error::Reentered`](crate::Error::Reentered)) or that a setting is wrong
/// ([`Error::Config`](crate::Error::Config)), passed on with `?`. The same holds for a
/// completion refused for those reasons (an output over the size limit, a follow-up job
/// with an empty queue name). An operator's `retry` brings a dead job back once the cause
/// is fixed (a build that reads the payload, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    message: String,
    retry: Retry,
    /// "Not yet": put the job off by this much instead of failing it.
    snooze: Option<Duration>,
}

impl JobError {
    /// A failure described by `message`, retried while the job's budget lasts.
    pub fn new(message: impl fmt::Display) -> JobError {
        JobError {
            message: message.to_string(),
            retry: Retry::WhileBudgetLasts,
            snooze: None,
        }
    }

    /// Not a failure: "not yet, try again in `delay`" (River's `JobSnooze`, Oban's
    /// `{:snooze, n}`). The attempt ends as [`Outcome::Snoozed`](crate::Outcome::Snoozed)
    /// with no retry budget spent, and the job runs again once `delay` has passed (store
    /// time). For a remote side that asked to be called back later, or a resource that is
    /// busy: `return Err(JobError::snooze(Duration::from_secs(30)))`.
    pub fn snooze(delay: Duration) -> JobError {
        JobError {
            message: format!("snoozed for {:.3}s", delay.as_secs_f64()),
            retry: Retry::WhileBudgetLasts,
            snooze: Some(delay),
        }
    }

    /// Retry the job after `wait` instead of the store's backoff (a rate limit that resets
    /// in a minute, a remote's `Retry-After`): still a failure, one unit of budget spent,
    /// and dead once the budget is gone, as any failure (River's `NextRetry`, Sidekiq's
    /// `retry_in`). Makes a [`JobError::permanent`] retryable again:
    /// `Err(JobError::new("rate limited").retry_in(Duration::from_secs(60)))`.
    pub fn retry_in(mut self, wait: Duration) -> JobError {
        self.retry = Retry::After(wait);
        self
    }

    /// The wait this failure asked for before a retry ([`JobError::retry_in`]), if any.
    pub fn retry_wait(&self) -> Option<Duration> {
        match self.retry {
            Retry::After(wait) => Some(wait),
            _ => None,
        }
    }

    /// How long the handler put its job off, if this is a snooze ([`JobError::snooze`]).
    pub fn snoozed_for(&self) -> Option<Duration> {
        self.snooze
    }

    /// A failure no retry mends, described by `message`: the job is dead at once, whatever
    /// budget it had left (as Sidekiq's dead set, Oban's `{:discard, reason}`, River's
    /// `JobCancel`).
    pub fn permanent(message: impl fmt::Display) -> JobError {
        JobError {
            message: message.to_string(),
            retry: Retry::Never,
            snooze: None,
        }
    }

    /// The description.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the failure is permanent (the job is not retried).
    pub fn is_permanent(&self) -> bool {
        self.retry == Retry::Never
    }

    pub(crate) fn retry(&self) -> Retry {
        self.retry
    }
}

/// Whether `e`, met while running or committing a job, would be met again by running the
/// job again: bad input, a call to the store from inside its own transaction, a wrong
/// setting. (A failure of the storage, the network or the application's own writes may
/// pass: those are retried.)
pub(crate) fn no_retry_mends(e: &Error) -> bool {
    matches!(e, Error::Input(_) | Error::Reentered | Error::Config(_))
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Any error converts (anything that converts into a `Box<dyn Error + Send + Sync>`: every
/// `Send + Sync` error type, boxed errors, `String` and `&str`), so `?` works in a handler on
/// whatever it calls; the message is the error and its sources
/// (`cannot upload: connection refused`). Like `anyhow::Error`, `JobError` is therefore not
/// itself a `std::error::Error` (that would make this conversion overlap `From<T> for T`).
impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for JobError {
    fn from(e: E) -> JobError {
        let e: Box<dyn std::error::Error + Send + Sync> = e.into();
        let retry = match e.downcast_ref::<Error>() {
            Some(ours) if no_retry_mends(ours) => Retry::Never,
            _ => Retry::WhileBudgetLasts,
        };
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        JobError {
            message,
            retry,
            snooze: None,
        }
    }
}
