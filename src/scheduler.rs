//! The scheduler: a named background thread that fires the store's schedules when their
//! ticks come ([`JobStore::fire_schedules_at`](crate::JobStore::fire_schedules_at)).
//!
//! Run one in every process that should keep schedules going, as many as you like: each
//! tick enqueues exactly one job whichever comes first (the store decides), so a second
//! scheduler is a spare, not a duplicate. Between passes the thread sleeps until the next
//! tick is due, or a schedule changes anywhere (each engine tells every handle's scheduler:
//! see [`Scheduler::start`]): an idle process on a battery pays nothing for a schedule that
//! fires once an hour. The thread stops when asked and is always joined.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::RealDeadline;
use crate::engine::Backend;
use crate::error::{ConfigError, Error, Result};
use crate::job_store::JobStore;
use crate::protocol;
use crate::schedule::Tick;

/// The longest a scheduler sleeps while it hears every change of the schedules: a cron tick
/// is timed by the wall clock, which an operator or NTP may set meanwhile, and a wake-up
/// from another process may be lost (a full socket), so it looks at least this often.
const LONGEST_SLEEP: Duration = Duration::from_secs(60);

/// Past its tick by this much, a scheduler wakes: the wall clock it compares with may run a
/// hair behind the one it sleeps on.
const MARGIN: Duration = Duration::from_millis(1);

/// Counters of a running scheduler (relaxed atomics: for observation).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SchedulerMetrics {
    passes: AtomicU64,
    fired: AtomicU64,
    errors: AtomicU64,
}

impl SchedulerMetrics {
    /// Completed passes.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Jobs this scheduler enqueued (ticks other schedulers fired first are not counted).
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Passes that failed (logged; the next pass tries again).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A running scheduler thread, stopped and joined by [`Scheduler::stop`] or on drop.
#[derive(Debug)]
pub struct Scheduler {
    store: Backend,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    metrics: Arc<SchedulerMetrics>,
}

impl Scheduler {
    /// Starts a scheduler, its first pass at once. It fires each tick when it comes and
    /// sleeps in between: until the next tick, or until a schedule is declared, paused,
    /// resumed or removed through any handle of the store (another process of a shared
    /// redb file tells it by a datagram, another machine on PostgreSQL by a notification),
    /// or [`JobStore::wake_all`] is called. `interval` is how often it looks while it may
    /// miss such a change (on PostgreSQL, while its `LISTEN` connection is down: a schedule
    /// declared elsewhere then fires its first tick at most one interval late; a second is
    /// right for cron's minutes), and the wait before trying again after a failed pass.
    pub fn start(store: impl Into<Backend>, interval: Duration) -> Result<Scheduler> {
        if interval.is_zero() {
            return Err(ConfigError::ZeroSchedulerInterval.into());
        }
        let store = store.into();
        let metrics = Arc::new(SchedulerMetrics::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("leasehold-scheduler".into())
            .spawn({
                let (store, stopping, metrics) =
                    (store.0.clone(), stopping.clone(), metrics.clone());
                move || run(&*store, interval, &stopping, &metrics)
            })
            .map_err(Error::ThreadSpawn)?;
        Ok(Scheduler {
            store,
            stopping,
            thread: Some(thread),
            metrics,
        })
    }

    /// The scheduler's counters.
    pub fn metrics(&self) -> &SchedulerMetrics {
        &self.metrics
    }

    /// Stops the thread and waits for it. Idempotent; a pass in progress finishes first.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.store.0.notifier().notify_schedules();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the scheduler thread panicked");
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The scheduler's loop: a pass, then a sleep until the next tick (or a change, or at most
/// `interval` where changes may go unheard), until it is stopped.
fn run(
    store: &dyn JobStore,
    interval: Duration,
    stopping: &AtomicBool,
    metrics: &SchedulerMetrics,
) {
    let notifier = store.notifier();
    // A tick found due right after a pass is fired by one more pass at once (it came
    // between the pass's reading of the clock and ours); found due again after that, it
    // cannot fire for now, and waits an interval like a failed pass.
    let mut behind = false;
    while !stopping.load(Ordering::SeqCst) {
        let seen = notifier.schedules_generation();
        let longest = if store.hears_schedule_changes() {
            LONGEST_SLEEP.max(interval)
        } else {
            interval
        };
        let wait = match pass(store, metrics) {
            Some(Some(next)) => match until(store, next) {
                due if due.is_zero() && !behind => {
                    behind = true;
                    continue;
                }
                due if due.is_zero() => interval,
                due => {
                    behind = false;
                    due.min(longest) + MARGIN
                }
            },
            Some(None) => longest,
            None => interval,
        };
        notifier.wait_schedules(seen, &RealDeadline::after(wait));
    }
}

/// How long until `tick`, by the store's clock (an interval's tick) or the wall clock (a
/// cron tick); zero where it has come.
fn until(store: &dyn JobStore, tick: Tick) -> Duration {
    match tick {
        Tick::Store(at) => at.saturating_since(store.clock()),
        Tick::Wall(secs) => {
            let wall = crate::clock::wall_now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Duration::from_secs(u64::try_from(secs).unwrap_or(0)).saturating_sub(wall)
        }
    }
}

/// One pass, in one transaction: `Some` with the soonest tick left (`None` for none) if it
/// succeeded.
fn pass(store: &dyn JobStore, metrics: &SchedulerMetrics) -> Option<Option<Tick>> {
    let wall = crate::clock::wall_seconds(crate::clock::wall_now());
    let fired = crate::backend::write(store, move |r| protocol::fire_schedules(r, wall));
    metrics.passes.fetch_add(1, Ordering::Relaxed);
    match fired {
        Ok(fired) => {
            for job in &fired.jobs {
                tracing::debug!(%job, "a schedule's tick enqueued a job");
            }
            metrics
                .fired
                .fetch_add(fired.jobs.len() as u64, Ordering::Relaxed);
            Some(fired.next)
        }
        Err(e) => {
            metrics.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "scheduler pass failed");
            None
        }
    }
}
