//! Configuring a [`WorkerPool`]: its settings, their defaults, and the checks that refuse
//! nonsense before any thread starts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::context::{JobContext, JobError, Output};
use super::pace::{DEFAULT_WINDOW, Pace, Prefetch};
use super::queues::Queues;
use super::stats::Counters;
use super::{
    Batching, DEFAULT_SHUTDOWN_GRACE, Handler, Phase, Shared, Validator, WorkerPool, handover,
};
use crate::config::LeaseSettings;
use crate::engine::{Backend, Engine};
use crate::error::{ConfigError, Result};
use crate::input;
use crate::lease::LeaseTerms;
use crate::protocol::AnyWrites;

impl WorkerPool {
    /// A builder for a pool that works `queues` of `store`: a queue's name, or several
    /// ([`Queues::weighted`], [`Queues::strict`]) sharing its workers and its window. `store`
    /// is a [`Store`](crate::Store), a `PgStore`, or a [`Backend`] of either. Its handler's
    /// [`Output`] carries writes of that store's kind (see [`Output`]).
    pub fn builder<S: Engine>(store: S, queues: impl Into<Queues>) -> PoolBuilder<S> {
        PoolBuilder {
            engine: std::marker::PhantomData,
            store: store.into(),
            queues: queues.into(),
            worker_id: None,
            concurrency: 1,
            prefetch: Prefetch::Auto {
                window: DEFAULT_WINDOW,
            },
            batch: Batching::default(),
            lease: crate::config::DEFAULT_LEASE,
            heartbeat: None,
            stall_timeout: None,
            time_limit: None,
            validator: None,
            on_ended: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// Configures a [`WorkerPool`]; see [`WorkerPool::builder`]. `S` is the store's kind, which
/// decides the kind of writes its handler's outputs carry.
pub struct PoolBuilder<S: Engine = Backend> {
    engine: std::marker::PhantomData<fn() -> S>,
    store: Backend,
    queues: Queues,
    worker_id: Option<String>,
    concurrency: usize,
    prefetch: Prefetch,
    batch: Batching,
    lease: Duration,
    heartbeat: Option<Duration>,
    stall_timeout: Option<Duration>,
    time_limit: Option<Duration>,
    validator: Option<Validator>,
    on_ended: Option<super::ended::Hook>,
    shutdown_grace: Duration,
}

impl<S: Engine> PoolBuilder<S> {
    /// The id recorded as the holder of this pool's leases. Default: `host-pid-random`.
    pub fn worker_id(mut self, id: impl Into<String>) -> PoolBuilder<S> {
        self.worker_id = Some(id.into());
        self
    }

    /// How many jobs run at once. Default: 1.
    pub fn concurrency(mut self, n: usize) -> PoolBuilder<S> {
        self.concurrency = n;
        self
    }

    /// The most jobs the pool claims ahead of its free workers. Default:
    /// [`DEFAULT_WINDOW`](crate::DEFAULT_WINDOW). Within it, the pool claims ahead as many
    /// jobs as its workers finish during two commits (a claim lands a commit after it is
    /// decided and must last until the next lands), measured as it runs: none for jobs
    /// longer than a commit, the whole window for jobs of microseconds. A lone worker of
    /// short jobs then goes from job to job while the dispatcher commits its completions and
    /// claims in batches.
    ///
    /// A claimed-ahead job waits, under a renewed lease, for a worker: it is held from other
    /// pools while it waits, its stall timeout (if any) runs from its claim, and if the pool
    /// dies it waits out its lease before another pool takes it (the process-death path of a
    /// shared redb store takes it back at once). At shutdown, and when the pool's renewals
    /// fall behind, jobs claimed ahead are given back, not run; one whose lease ran out
    /// before a worker took it is not run either. A window of 0 is refused
    /// ([`ConfigError::ZeroWindow`]): [`prefetch(0)`](PoolBuilder::prefetch) claims nothing
    /// ahead.
    pub fn window(mut self, n: usize) -> PoolBuilder<S> {
        self.prefetch = Prefetch::Auto { window: n };
        self
    }

    /// Claims exactly `n` jobs ahead of free workers, however long the jobs take (0: none,
    /// each worker waits for the claim of its next job), instead of pacing within the
    /// [`window`](PoolBuilder::window).
    pub fn prefetch(mut self, n: usize) -> PoolBuilder<S> {
        self.prefetch = Prefetch::Fixed(n);
        self
    }

    /// How long a finished job's completion may wait for others to share its commit, when
    /// no claim is due to carry it. Default: none: a completion is committed with whatever
    /// else finished while the previous commit ran (under load that is a batch by itself),
    /// together with the claim that refills its worker.
    ///
    /// A claim is not due while the pool is paused, while its free slots are held back, or
    /// once a claim has found the queue drained (until one finds work again): then the
    /// completions of jobs finishing one by one wait up to the delay, or until
    /// [`max_batch`](PoolBuilder::max_batch) of them are there, and commit together. The
    /// price: that much latency for each, that much for new work arriving meanwhile (its
    /// claim rides the same commit), and that much more work run twice if the pool dies with
    /// completions waiting (they were never committed). Must be shorter than the heartbeat
    /// interval ([`ConfigError::BatchDelayNotShorterThanHeartbeat`]).
    pub fn batch_delay(mut self, delay: Duration) -> PoolBuilder<S> {
        self.batch.delay = delay;
        self
    }

    /// The most completions, and the most claims, one commit of the pool carries. Default:
    /// [`DEFAULT_MAX_BATCH`](crate::DEFAULT_MAX_BATCH). Must be at least 1
    /// ([`ConfigError::ZeroMaxBatch`]).
    pub fn max_batch(mut self, n: usize) -> PoolBuilder<S> {
        self.batch.max = n;
        self
    }

    /// The lease length. Default: 60 s.
    pub fn lease(mut self, lease: Duration) -> PoolBuilder<S> {
        self.lease = lease;
        self
    }

    /// How often leases are renewed. Default: a third of the lease. Must be shorter than it.
    pub fn heartbeat_every(mut self, every: Duration) -> PoolBuilder<S> {
        self.heartbeat = Some(every);
        self
    }

    /// A job whose progress counter does not move for this long is stuck, not alive: the
    /// store revokes its lease (outcome `Stalled`) and the handler is interrupted.
    pub fn stall_timeout(mut self, timeout: Duration) -> PoolBuilder<S> {
        self.stall_timeout = Some(timeout);
        self
    }

    /// A hard limit on each attempt of a job that has no limit of its own
    /// ([`crate::NewJob::time_limit`]): at the limit the handler is interrupted
    /// ([`crate::Interruption::TimedOut`]) and the attempt ends as
    /// [`Outcome::TimedOut`](crate::Outcome::TimedOut), retried after a backoff while its
    /// budget lasts. Nothing the handler returns afterwards is committed; a handler that
    /// does not return is ended in the store by its next renewal, and the lease never
    /// outlasts the limit, so a pool that died is no obstacle either.
    pub fn time_limit(mut self, limit: Duration) -> PoolBuilder<S> {
        self.time_limit = Some(limit);
        self
    }

    /// Checks each output before it is committed. A lease detects silence, not wrong
    /// answers; a refused output fails the attempt (and is retried by the retry policy).
    pub fn validate<V>(mut self, validator: V) -> PoolBuilder<S>
    where
        V: Fn(&JobContext, &[u8]) -> std::result::Result<(), String> + Send + Sync + 'static,
    {
        self.validator = Some(Arc::new(validator));
        self
    }

    /// Calls `hook` after each end of an attempt that this pool wrote has committed: a
    /// completion (also one committed in a batch by another thread, which is why a handler
    /// cannot know this itself), a failure, a snooze, a time-out, a release. Never before the
    /// commit, never for a write the fence refused, never for an end the store decided
    /// alone (a cancel or stall found by a renewal, a lease taken over). It runs on the thread
    /// that committed (a worker, or the pool's dispatcher, whose next commit waits for it):
    /// keep it short, hand anything slow to a channel. A panic in it is logged and ignored.
    ///
    /// Use it to answer a caller only once its job's result is durable.
    pub fn on_ended<F>(mut self, hook: F) -> PoolBuilder<S>
    where
        F: Fn(&super::AttemptEnded) + Send + Sync + 'static,
    {
        self.on_ended = Some(Arc::new(hook));
        self
    }

    /// How long dropping the pool lets in-flight jobs finish. Default: 10 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> PoolBuilder<S> {
        self.shutdown_grace = grace;
        self
    }

    /// Starts the pool with `handler`.
    pub fn start<H, O>(self, handler: H) -> Result<WorkerPool>
    where
        H: Fn(&JobContext) -> std::result::Result<O, JobError> + Send + Sync + 'static,
        O: Into<Output<S::Writes>>,
    {
        let handler: Handler = Arc::new(move |ctx| handler(ctx).map(|o| any::<S>(o.into())));
        self.start_handler(handler)
    }

    /// Starts the pool with a handler already in the pool's own form.
    pub(crate) fn start_handler(self, handler: Handler) -> Result<WorkerPool> {
        self.queues.check()?;
        if self.concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency.into());
        }
        let settings = match self.heartbeat {
            Some(every) => LeaseSettings::new(self.lease, every)?,
            None => LeaseSettings::with_lease(self.lease)?,
        };
        if self.prefetch == (Prefetch::Auto { window: 0 }) {
            return Err(ConfigError::ZeroWindow.into());
        }
        if self.batch.max == 0 {
            return Err(ConfigError::ZeroMaxBatch.into());
        }
        if self.batch.delay >= settings.heartbeat() {
            return Err(ConfigError::BatchDelayNotShorterThanHeartbeat {
                delay: self.batch.delay,
                heartbeat: settings.heartbeat(),
            }
            .into());
        }
        let mut terms = LeaseTerms::new(settings.lease());
        if let Some(stall) = self.stall_timeout {
            terms = terms.stall_timeout(stall);
        }
        if let Some(limit) = self.time_limit {
            terms = terms.time_limit(limit);
        }
        crate::config::check_terms(&terms)?;
        let worker_id = match self.worker_id {
            Some(id) => id,
            None => default_worker_id(),
        };
        input::check_worker(&worker_id)?;
        let shared = Arc::new(Shared {
            store: self.store.0,
            label: self.queues.label(),
            counters: Counters::for_queues(self.queues.names()),
            queues: self.queues,
            worker_id,
            settings,
            terms,
            handler,
            validator: self.validator,
            on_ended: self.on_ended,
            flights: Mutex::new(HashMap::new()),
            flights_changed: Condvar::new(),
            phase: AtomicU8::new(Phase::Running as u8),
            paused: AtomicBool::new(false),
            beating: Mutex::new(()),
            claiming: Mutex::new(()),
            last_renewal: AtomicU64::new(0),
            heartbeat_clock: crate::clock::Stopwatch::start(),
            last_tick: AtomicU64::new(0),
            handover: handover::Handover::default(),
            concurrency: self.concurrency,
            pace: Pace::new(self.prefetch, self.concurrency, settings.lease()),
            batch: self.batch,
            queued: AtomicU64::new(0),
            live_workers: Mutex::new(0),
            workers_exited: Condvar::new(),
            deadline_added: crossbeam_channel::bounded(1),
        });
        WorkerPool::spawn(shared, self.shutdown_grace)
    }
}

/// An output of an engine's kind as the pool's own form.
pub(crate) fn any<S: Engine>(output: Output<S::Writes>) -> Output<AnyWrites> {
    Output {
        bytes: output.bytes,
        writes: output.writes.map(S::any),
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_owned());
    let suffix = crate::random::random_u64() & 0xFFFF;
    format!("{host}-{}-{suffix:04x}", std::process::id())
}
