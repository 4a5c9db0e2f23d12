//! The worker pool: give it a handler and it runs jobs under leases, renews them on its own
//! timer, and never commits a result whose lease it no longer holds.
//!
//! Its threads are told on [`WorkerPool`].

mod builder;
mod context;
mod dispatch;
mod ended;
mod give_way;
mod handover;
mod heartbeat;
mod latency;
mod pace;
mod queues;
mod run;
mod stats;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::{Condvar, Mutex};

pub use crate::protocol::AnyWrites;
pub use builder::PoolBuilder;
#[cfg(any(feature = "tokio", feature = "testing"))]
pub(crate) use builder::any;
pub use context::{Interrupted, Interruption, JobContext, JobError, Output};
pub use ended::AttemptEnded;
pub use latency::{JOB_TIME_BOUNDS, LATENCY_BOUNDS, LATENCY_BUCKETS, Latencies};
pub use queues::{MAX_POOL_QUEUES, Queues};
pub use stats::{PoolStats, QueueTally};

use crate::clock::RealDeadline;
use crate::config::LeaseSettings;
use crate::error::{Error, Result};
use crate::ids::{Attempt, JobId, StoreTime};
use crate::job_store::JobStore;
use crate::lease::{Lease, LeaseTerms};
use crate::state::JobState;
pub(crate) use context::AttemptState;
#[cfg(feature = "testing")]
pub(crate) use run::{failure_of_rolled_back_completion, flush_log};
use stats::Counters;

pub(crate) type Handler =
    Arc<dyn Fn(&JobContext) -> std::result::Result<Output<AnyWrites>, JobError> + Send + Sync>;
type Validator = Arc<dyn Fn(&JobContext, &[u8]) -> std::result::Result<(), String> + Send + Sync>;

/// How often [`WorkerPool::wait_idle`] looks at the store again while none of the pool's own
/// jobs ends (for jobs that other pools or processes run, or that are not due yet).
pub(crate) const IDLE_RECHECK: Duration = Duration::from_millis(20);

/// The default time [`WorkerPool::drop`] gives in-flight jobs to finish.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

pub use pace::DEFAULT_WINDOW;

/// The most completions, and the most claims, one of a pool's commits carries unless told
/// otherwise ([`PoolBuilder::max_batch`]): more than a default [`DEFAULT_WINDOW`] refills.
pub const DEFAULT_MAX_BATCH: usize = 1024;

/// How a pool gathers its completions into commits.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Batching {
    /// How long a completion may wait for others to share its commit.
    pub delay: Duration,
    /// The most completions (and claims) in one commit.
    pub max: usize,
}

impl Default for Batching {
    fn default() -> Batching {
        Batching {
            delay: Duration::ZERO,
            max: DEFAULT_MAX_BATCH,
        }
    }
}

/// A running pool of workers for one queue: give it a handler and it runs jobs under leases,
/// renews them on its own timer, and never commits a result whose lease it no longer holds.
///
/// Threads (all named, all joined on shutdown):
/// * one **dispatcher** claims a job whenever a worker is free, and otherwise sleeps until a
///   commit in this process gives the queue work or the next delayed job or lease expiry
///   comes due ([`Store::next_due`](crate::Store::next_due)): no busy polling, and one claimer per pool, so an
///   enqueue wakes one thread rather than a herd;
/// * on a store whose rounds wait on a database server, with more than one worker, one
///   **deliver** thread acknowledges a committed round's completions and hands its claims
///   to the workers while the dispatcher's next round runs;
/// * one **heartbeat** thread renews every in-flight lease in one `heartbeat_batch` write per
///   tick, carrying each job's progress counter, and interrupts jobs whose lease was lost,
///   cancelled or revoked as stalled;
/// * one **watch** thread, which never touches the store's writes, sheds the leases that ran
///   out when the heartbeat itself is stuck (a store gone silent holds the heartbeat and the
///   dispatcher alike);
/// * `concurrency` **workers** run the handler, catch its panics, validate its output and
///   commit through the fence.
///
/// Dropping it shuts it down gracefully (see [`WorkerPool::shutdown`]).
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Mutex<Option<Threads>>,
    shutdown_grace: Duration,
}

struct Threads {
    dispatcher: JoinHandle<()>,
    stop_dispatcher: Sender<()>,
    heartbeat: JoinHandle<()>,
    stop_heartbeat: Sender<()>,
    watch: JoinHandle<()>,
    stop_watch: Sender<()>,
    workers: Vec<JoinHandle<()>>,
}

/// A pool's threads while it starts: if the start fails, dropping this closes the workers'
/// channel, then stops and joins every thread started so far (the last started first).
struct Starting {
    jobs: Option<Sender<Flight>>,
    stoppable: Vec<(Sender<()>, JoinHandle<()>)>,
    workers: Vec<JoinHandle<()>>,
}

impl Starting {
    /// Starts a thread named `name` that runs `f` until told to stop.
    fn stoppable(
        &mut self,
        name: String,
        f: impl FnOnce(Receiver<()>) + Send + 'static,
    ) -> Result<()> {
        let (stop, told) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || f(told));
        self.stoppable
            .push((stop, thread.map_err(Error::ThreadSpawn)?));
        Ok(())
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        self.jobs = None;
        for (stop, thread) in self.stoppable.drain(..).rev() {
            let _ = stop.send(());
            let _ = thread.join();
        }
        join_all(std::mem::take(&mut self.workers));
    }
}

/// What a shutdown did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Jobs in flight when the shutdown began.
    pub in_flight: usize,
    /// Of those, jobs released because the grace period ran out (claimable again at once).
    pub released: usize,
    /// Handlers still running when the shutdown gave up waiting for them (they ignored their
    /// interruption). Their threads are left to finish on their own; nothing they return is
    /// committed, since their leases were released.
    pub stuck_handlers: usize,
}

impl WorkerPool {
    fn spawn(shared: Arc<Shared>, shutdown_grace: Duration) -> Result<WorkerPool> {
        let concurrency = shared.concurrency;
        let name = |what: &str| format!("lh-{}-{what}", shared.label);
        // One token per job the pool may hold: a worker's, or one claimed ahead of workers.
        let room = concurrency.saturating_add(shared.pace.most_ahead());
        let (slot_tx, slot_rx) = bounded::<()>(room);
        for _ in 0..room {
            let _ = slot_tx.send(());
        }
        let (job_tx, job_rx) = unbounded::<Flight>();
        // A thread that cannot be started fails the start, and every thread started so far
        // is stopped and joined first: none is left behind.
        let mut starting = Starting {
            jobs: Some(job_tx),
            stoppable: Vec::new(),
            workers: Vec::new(),
        };
        for i in 0..concurrency {
            let (s, jobs, slots) = (shared.clone(), job_rx.clone(), slot_tx.clone());
            *shared.live_workers.lock() += 1;
            let handle = std::thread::Builder::new()
                .name(name(&format!("w{i}")))
                .spawn(move || run::worker_loop(&s, &jobs, &slots));
            match handle {
                Ok(h) => starting.workers.push(h),
                Err(e) => {
                    *shared.live_workers.lock() -= 1;
                    return Err(Error::ThreadSpawn(e));
                }
            }
        }
        let s = shared.clone();
        starting.stoppable(name("heartbeat"), move |stop| {
            heartbeat::heartbeat_loop(&s, &stop)
        })?;
        let s = shared.clone();
        starting.stoppable(name("watch"), move |stop| heartbeat::watch_loop(&s, &stop))?;
        // The dispatcher owns the workers' channel: it closes when the dispatcher returns.
        let (s, jobs) = (shared.clone(), starting.jobs.take());
        starting.stoppable(name("dispatch"), move |stop| {
            if let Some(jobs) = jobs {
                dispatch::dispatch_loop(&s, &slot_rx, jobs, &stop);
            }
        })?;
        let mut started = std::mem::take(&mut starting.stoppable).into_iter();
        let (Some(heartbeat), Some(watch), Some(dispatcher)) =
            (started.next(), started.next(), started.next())
        else {
            return Err(Error::Internal("a pool started without one of its threads"));
        };
        Ok(WorkerPool {
            shared,
            threads: Mutex::new(Some(Threads {
                dispatcher: dispatcher.1,
                stop_dispatcher: dispatcher.0,
                heartbeat: heartbeat.1,
                stop_heartbeat: heartbeat.0,
                watch: watch.1,
                stop_watch: watch.0,
                workers: std::mem::take(&mut starting.workers),
            })),
            shutdown_grace,
        })
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let in_flight = self.shared.flights.lock().len() as u64;
        let ahead = self.shared.queued.load(Ordering::Relaxed);
        self.shared.counters.snapshot(in_flight, ahead)
    }

    /// The leases being worked on now, by job id.
    pub fn in_flight(&self) -> Vec<Lease> {
        let mut leases: Vec<Lease> = self
            .shared
            .flights
            .lock()
            .values()
            .map(|f| f.lease.clone())
            .collect();
        leases.sort_by_key(|l| l.job);
        leases
    }

    /// Waits until the pool's queues are drained, or `timeout` passes; returns whether they
    /// were.
    ///
    /// Drained means the pool holds nothing and no job of its queues is queued (delayed ones
    /// included), waiting out a retry backoff, or running anywhere (another pool, another
    /// process): every job of the queue has ended. The wait wakes as each of this pool's
    /// jobs ends, and looks again every 20 ms for what happens elsewhere.
    pub fn wait_idle(&self, timeout: Duration) -> Result<bool> {
        let deadline = RealDeadline::after(timeout);
        loop {
            if self.shared.flights.lock().is_empty() && self.queue_drained()? {
                return Ok(true);
            }
            if deadline.passed() {
                return Ok(false);
            }
            let mut flights = self.shared.flights.lock();
            let wait = deadline.remaining().min(IDLE_RECHECK);
            let _ = self.shared.flights_changed.wait_for(&mut flights, wait);
        }
    }

    fn queue_drained(&self) -> Result<bool> {
        let stats = self.shared.store.stats()?;
        Ok(self.shared.queues.names().all(|queue| {
            stats.queues.get(queue).is_none_or(|counts| {
                counts.get(JobState::Queued)
                    + counts.get(JobState::RetryWait)
                    + counts.get(JobState::Running)
                    == 0
            })
        }))
    }

    /// The id this pool's leases are held under.
    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// Stops claiming, lets in-flight jobs finish for up to `grace`, then interrupts the rest
    /// and releases their leases so they are claimable at once instead of waiting out their
    /// lease. Idempotent: a second call (or the drop) does nothing more.
    pub fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let Some(threads) = self.threads.lock().take() else {
            return ShutdownReport::default();
        };
        let shared = &self.shared;
        shared.set_phase(Phase::Draining);
        let _ = threads.stop_dispatcher.send(());
        shared.store.wake_all();
        join(threads.dispatcher, "dispatcher");

        let in_flight = shared.flights.lock().len();
        let deadline = RealDeadline::after(grace);
        {
            let mut flights = shared.flights.lock();
            while !flights.is_empty() && !deadline.passed() {
                let _ = shared
                    .flights_changed
                    .wait_for(&mut flights, deadline.remaining());
            }
        }
        let leftover: Vec<Flight> = shared.flights.lock().values().cloned().collect();
        let mut released = 0;
        for flight in &leftover {
            flight.state.interrupt(Interruption::Shutdown, None);
            match run::release(shared, flight) {
                Ok(()) => {
                    released += 1;
                    tracing::info!(job = %flight.lease.job, "released at shutdown");
                }
                Err(e) if e.is_lease_lost() => {} // it finished (or was taken) meanwhile
                Err(e) => tracing::warn!(job = %flight.lease.job, error = %e, "release failed"),
            }
        }
        let _ = threads.stop_heartbeat.send(());
        let _ = threads.stop_watch.send(());
        join(threads.heartbeat, "heartbeat");
        join(threads.watch, "watch");
        let stuck_handlers = self.join_workers(threads.workers, grace);
        shared.set_phase(Phase::Stopped);
        ShutdownReport {
            in_flight,
            released,
            stuck_handlers,
        }
    }

    /// Walks away as a killed process would: stops heartbeats and claims, interrupts every
    /// handler, and writes nothing more: no release, no completion. The jobs' leases lapse
    /// and are reclaimed by the reaper or a takeover. For tests and demonstrations.
    pub fn abandon(&self) {
        let Some(threads) = self.threads.lock().take() else {
            return;
        };
        let shared = &self.shared;
        shared.set_phase(Phase::Abandoned);
        for flight in shared.flights.lock().values() {
            flight.state.interrupt(Interruption::Abandoned, None);
        }
        let _ = threads.stop_dispatcher.send(());
        let _ = threads.stop_heartbeat.send(());
        let _ = threads.stop_watch.send(());
        shared.store.wake_all();
        join(threads.dispatcher, "dispatcher");
        join(threads.heartbeat, "heartbeat");
        join(threads.watch, "watch");
        let _ = self.join_workers(threads.workers, self.shutdown_grace);
    }

    /// Freezes the pool as a stopped (`SIGSTOP`ped) process would be: no renewals, no
    /// claims, no health checks, until [`resume`](WorkerPool::resume). Handlers keep running
    /// (code cannot be frozen from outside), so a test's handler blocks by itself. For tests
    /// and demonstrations of a worker that wakes after its lease was taken.
    ///
    /// When it returns, no renewal or claim is in progress and none starts until `resume`.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        // Wait out a tick and a claim already under way, so that neither lands after the
        // pause (a claim that began before it could take over the pool's own expired lease).
        drop(self.shared.beating.lock());
        drop(self.shared.claiming.lock());
    }

    /// Unfreezes a paused pool.
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
        self.shared.store.wake_all();
    }

    /// Waits for worker threads to exit (their job channel is closed), for up to `grace`;
    /// returns how many were still running a handler and were left behind.
    fn join_workers(&self, workers: Vec<JoinHandle<()>>, grace: Duration) -> usize {
        let deadline = RealDeadline::after(grace);
        let stuck = {
            let mut live = self.shared.live_workers.lock();
            while *live > 0 && !deadline.passed() {
                let _ = self
                    .shared
                    .workers_exited
                    .wait_for(&mut live, deadline.remaining());
            }
            *live
        };
        // A worker that signalled its exit is past its last handler, though its thread may
        // not have returned yet (on a loaded machine that takes a while): joining it cannot
        // hang. Only the ones still counted live are stuck; their threads are left behind.
        for w in workers {
            if stuck == 0 || w.is_finished() {
                join(w, "worker");
            }
        }
        if stuck > 0 {
            tracing::error!(
                stuck,
                "handlers ignored their interruption; their threads are left to finish"
            );
        }
        stuck
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shutdown(self.shutdown_grace);
    }
}

fn join(handle: JoinHandle<()>, what: &str) {
    if handle.join().is_err() {
        tracing::error!("the pool's {what} thread panicked");
    }
}

#[derive(Copy, Clone, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Running = 0,
    Draining = 1,
    Stopped = 2,
    Abandoned = 3,
}

/// One job being worked on: its lease and the live state its handler and the heartbeat share.
#[derive(Clone)]
pub(crate) struct Flight {
    pub lease: Lease,
    pub state: Arc<AttemptState>,
}

/// What the pool's threads share.
pub(crate) struct Shared {
    pub store: Arc<dyn JobStore>,
    /// The queues it serves.
    pub queues: Queues,
    /// What it goes by in its threads' names and its logs: its queues' names, joined.
    pub label: String,
    pub worker_id: String,
    pub settings: LeaseSettings,
    pub terms: LeaseTerms,
    pub handler: Handler,
    pub validator: Option<Validator>,
    /// Told of each end this pool committed ([`PoolBuilder::on_ended`]).
    pub(crate) on_ended: Option<ended::Hook>,
    /// The attempts in flight, by job and attempt: a pool may hold a job's new attempt
    /// while its worker still runs the old one (taken over after the lease ran out).
    pub flights: Mutex<HashMap<(JobId, Attempt), Flight>>,
    /// Signalled when a flight ends or a worker exits.
    pub flights_changed: Condvar,
    phase: AtomicU8,
    paused: AtomicBool,
    /// Held by the heartbeat thread for the length of a tick.
    pub(crate) beating: Mutex<()>,
    /// Held for the length of a claim (see [`Shared::claim_permit`]).
    claiming: Mutex<()>,
    /// Store time of the last successful renewal batch (or of the first claim after an idle
    /// spell): the heartbeat's health.
    last_renewal: AtomicU64,
    /// When the heartbeat last began a tick, on a clock of the pool's own (real time since
    /// it started): a heartbeat stuck in a tick, or whose timer is late, stops moving it.
    pub(crate) heartbeat_clock: crate::clock::Stopwatch,
    last_tick: AtomicU64,
    pub counters: Counters,
    /// Completions workers handed to the dispatcher.
    pub(crate) handover: handover::Handover,
    concurrency: usize,
    /// How many jobs to claim ahead of free workers.
    pub(crate) pace: pace::Pace,
    /// How completions are gathered into commits.
    pub(crate) batch: Batching,
    /// Jobs claimed and queued for a worker, not yet started.
    pub(crate) queued: AtomicU64,
    live_workers: Mutex<usize>,
    workers_exited: Condvar,
    /// Wakes the pool's timer when an attempt with a deadline starts, so that it sleeps no
    /// longer than until that deadline (a timer asleep until the next heartbeat would let
    /// the handler run past its limit).
    pub(crate) deadline_added: (Sender<()>, crossbeam_channel::Receiver<()>),
}

impl Shared {
    /// Tells the application's hook, if any, that `lease`'s attempt ended in the store with
    /// `outcome`, leaving the job in `state`. Called only after the write committed.
    pub(crate) fn ended(&self, lease: &Lease, outcome: crate::job::Outcome, state: JobState) {
        ended::tell(self.on_ended.as_ref(), lease, outcome, state);
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::SeqCst);
    }

    pub(crate) fn running(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == Phase::Running as u8
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == Phase::Abandoned as u8
    }

    /// Wakes the dispatcher if it waits for work: it waits on every queue of the pool, so
    /// waking the first does.
    pub(crate) fn wake_dispatcher(&self) {
        if let Some(first) = self.queues.names().next() {
            self.store.wake_queue(first);
        }
    }

    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Counts and records a lease just claimed (by the dispatcher or a worker) as a new
    /// flight; a pool that had none starts its health clock now.
    pub(crate) fn claimed(&self, lease: Lease) -> Flight {
        self.counters.claimed_of(&lease.queue);
        tracing::debug!(job = %lease.job, attempt = %lease.attempt, "claimed");
        let flight = Flight {
            state: AttemptState::new(lease.expires_at),
            lease,
        };
        let mut flights = self.flights.lock();
        if flights.is_empty() {
            // Dated from the claim, as renewals are from before they were made.
            self.renewed_at(flight.lease.claimed_at);
        }
        // A claim may take over this pool's own lease that ran out (a claim round whose look
        // came just before the expiry): the older attempt is lost for certain now, so its
        // handler stops at once instead of running beside the new attempt until a renewal
        // finds out. (Only a job claimed before can have one: the look is off the usual path.)
        let retried = flight.lease.attempt.0 > 1;
        for (&(job, attempt), older) in flights.iter().filter(|_| retried) {
            if job == flight.lease.job
                && attempt < flight.lease.attempt
                && older
                    .state
                    .interrupt(Interruption::LeaseLost, Some(&self.counters.leases_lost))
            {
                tracing::warn!(%job, %attempt, "this pool's own expired lease was taken over by its claim; interrupting the older attempt");
            }
        }
        flights.insert((flight.lease.job, flight.lease.attempt), flight.clone());
        if flight.lease.deadline.is_some() {
            // Full means the timer has a wake-up waiting already.
            let _ = self.deadline_added.0.try_send(());
        }
        flight
    }

    /// Whether the pool takes new work now: running, not paused, and its renewals keeping up
    /// (an overloaded pool that keeps claiming piles up false reclaims).
    fn may_claim(&self) -> bool {
        self.running() && !self.paused() && self.renewals_healthy(self.store.clock())
    }

    /// The right to claim now, held for the length of the claim's transaction so that
    /// [`WorkerPool::pause`] can wait one out; `None` when the pool may not claim.
    pub(crate) fn claim_permit(&self) -> Option<parking_lot::MutexGuard<'_, ()>> {
        let permit = self.claiming.lock();
        self.may_claim().then_some(permit)
    }

    pub(crate) fn finish(&self, attempt: (JobId, Attempt)) {
        self.store.ended(attempt.0, attempt.1);
        self.flights.lock().remove(&attempt);
        self.flights_changed.notify_all();
    }

    pub(crate) fn worker_exited(&self) {
        *self.live_workers.lock() -= 1;
        self.workers_exited.notify_all();
    }

    /// The heartbeat begins a tick.
    pub(crate) fn ticking(&self) {
        let at = u64::try_from(self.heartbeat_clock.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_tick.store(at, Ordering::SeqCst);
    }

    /// Whether the heartbeat is overdue: no tick begun for a whole interval and a second more
    /// (at least half an interval more for slow ones): stuck in a store call that does not
    /// return, or its thread starved. A renewal under load may take long; one stuck for a
    /// second past its time while the leases run out is treated as gone.
    pub(crate) fn heartbeat_overdue(&self) -> bool {
        self.until_heartbeat_overdue().is_zero()
    }

    /// How long until the heartbeat is overdue if it begins no tick meanwhile; zero once it
    /// is.
    pub(crate) fn until_heartbeat_overdue(&self) -> Duration {
        let since = self
            .heartbeat_clock
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.last_tick.load(Ordering::SeqCst)));
        let beat = self.settings.heartbeat();
        let grace = beat + (beat / 2).max(Duration::from_secs(1));
        // (overdue once `since` is past the grace, not at it)
        (grace + Duration::from_nanos(1)).saturating_sub(since)
    }

    pub(crate) fn renewed_at(&self, now: StoreTime) {
        self.last_renewal.store(now.0, Ordering::SeqCst);
    }

    /// How long renewals may fail before the pool stops taking work: half a lease, but never
    /// less than one and a half heartbeat intervals (a slow heartbeat setting is not a fault).
    fn health_limit(&self) -> Duration {
        let lease = self.settings.lease();
        let hb = self.settings.heartbeat();
        (lease / 2).max(hb + hb / 2).min(lease)
    }

    /// Renewals are behind: a lease that has run out on the store clock may be taken any
    /// moment. Stop its handler rather than race the reclaim; its worker gives it back. Jobs
    /// claimed ahead that no worker has started are given back too, whatever their leases:
    /// a pool that cannot renew should not hold work another pool could do. Called by the
    /// heartbeat after a failed batch, by the dispatcher before it claims, and by the watch
    /// when it finds the heartbeat stuck (a stuck heartbeat cannot notice by itself).
    pub(crate) fn shed_expired(&self, now: StoreTime) {
        for flight in self.flights.lock().values() {
            let expired = flight.state.expires_at() <= now;
            if (expired || !flight.state.started())
                && flight
                    .state
                    .interrupt(Interruption::LeaseExpired, Some(&self.counters.shed))
            {
                tracing::warn!(job = %flight.lease.job, expired, "renewals are behind; interrupting");
            }
        }
    }

    /// Whether renewals are keeping up. An idle pool is healthy.
    pub(crate) fn renewals_healthy(&self, now: StoreTime) -> bool {
        if self.flights.lock().is_empty() {
            return true;
        }
        let last = StoreTime(self.last_renewal.load(Ordering::SeqCst));
        now.saturating_since(last) <= self.health_limit()
    }
}

/// Waits for threads that are ending (their channel closed or their stop sent).
fn join_all(threads: Vec<std::thread::JoinHandle<()>>) {
    for t in threads {
        let _ = t.join();
    }
}
