//! `/metrics`: the store's counts and lifetime counters, and the counters of the pools the
//! page was given, in the Prometheus (OpenMetrics) text format through `prometheus-client`.
//!
//! The metrics are read from the store at each scrape and registered afresh: the store,
//! not this process, holds the truth (a scrape of `leasehold serve` sees what every process
//! sharing the store did), so there is nothing to keep in step between scrapes.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use leasehold::JobState;
use leasehold::QueueTiming;
use leasehold::{Latencies, PoolStats};
use leasehold::{Stats, WriteMetrics};

/// The content type of the text `render` makes.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

/// What one scrape reports.
pub(crate) struct Scrape<'a> {
    pub stats: &'a Stats,
    pub timings: &'a [(String, QueueTiming)],
    pub schedules: &'a [leasehold::ScheduleInfo],
    pub pools: &'a [(String, PoolStats)],
    pub writes: Option<WriteMetrics>,
    /// How old the counts are (zero: counted for this scrape).
    pub counts_age: std::time::Duration,
    /// The wall clock at the scrape (a cron schedule's tick is a wall-clock time).
    pub wall: std::time::SystemTime,
    /// Each lease's holder process and its state, where processes share a file (empty
    /// elsewhere).
    pub holders: Vec<(leasehold::InstanceId, leasehold::HolderState)>,
    /// The queues whose due work waits with nobody asking for it, as the store says.
    pub unserved: &'a [leasehold::UnservedQueue],
}

/// Each queue's limits as they bind now, and whether anyone serves it: the concurrency
/// limit and how many of its jobs it holds, how many due jobs wait because it is full, and
/// whether its due work has waited [`leasehold::UNSERVED_AFTER`] with no worker asking (as
/// [`leasehold::ReadJobs::unserved_queues`] says).
fn queue_health(registry: &mut Registry, s: &Scrape<'_>) {
    let now = s.stats.now;
    let (limit, at_limit, unserved, per_key) = (
        Family::<Labels, Gauge>::default(),
        Family::<Labels, Gauge>::default(),
        Family::<Labels, Gauge>::default(),
        Family::<Labels, Gauge>::default(),
    );
    let (keys_at_limit, parked) = (
        Family::<Labels, Gauge>::default(),
        Family::<Labels, Gauge>::default(),
    );
    for (queue, counts) in &s.stats.queues {
        let q = vec![("queue", queue.clone())];
        let due = (s.timings.iter().find(|(name, _)| name == queue))
            .and_then(|(_, t)| t.earliest_run_at)
            .filter(|t| *t <= now);
        let waiting = counts.get(JobState::Queued) + counts.get(JobState::RetryWait);
        if let Some(max) = counts.limits.concurrency {
            limit.get_or_create(&q).set(i64::from(max));
            let full = counts.get(JobState::Running) >= u64::from(max);
            let held_back = if full && due.is_some() { waiting } else { 0 };
            at_limit.get_or_create(&q).set(gauge(held_back));
        }
        if let Some(max) = counts.limits.per_key {
            per_key.get_or_create(&q).set(i64::from(max));
        }
        if counts.limits.per_key.is_some() || counts.limits.per_key_rate.is_some() {
            keys_at_limit
                .get_or_create(&q)
                .set(gauge(counts.keys_at_limit));
        }
        if counts.parked > 0 || counts.limits.per_key.is_some() {
            parked.get_or_create(&q).set(gauge(counts.parked));
        }
        let idle = s.unserved.iter().any(|u| u.queue == *queue);
        unserved.get_or_create(&q).set(i64::from(idle));
    }
    registry.register(
        "queue_concurrency_limit",
        "The queue's concurrency limit across every process and machine (absent: none)",
        limit,
    );
    registry.register(
        "queue_waiting_at_limit",
        "Jobs of the queue that wait while it holds as many as its concurrency limit allows",
        at_limit,
    );
    registry.register(
        "queue_per_key_limit",
        "How many jobs of one limit key the queue holds at once, each key apart (absent: none)",
        per_key,
    );
    registry.register(
        "queue_limit_keys_at_limit",
        "The queue's limit keys with no room now, by their per-key limit or rate (absent: no per-key limit)",
        keys_at_limit,
    );
    registry.register(
        "queue_parked_jobs",
        "Waiting jobs of the queue held out of the claim order behind their limit key",
        parked,
    );
    registry.register(
        "queue_unserved",
        "1 if the queue's due work has waited five minutes with no worker asking for it",
        unserved,
    );
}

pub(crate) fn render(s: &Scrape<'_>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("leasehold");
    let now = s.stats.now;

    let jobs = Family::<Labels, Gauge>::default();
    let paused = Family::<Labels, Gauge>::default();
    let oldest = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let overdue = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for (queue, counts) in &s.stats.queues {
        for state in JobState::ALL {
            let labels = vec![("queue", queue.clone()), ("state", state.name().to_owned())];
            jobs.get_or_create(&labels).set(gauge(counts.get(state)));
        }
        let q = vec![("queue", queue.clone())];
        paused.get_or_create(&q).set(i64::from(counts.paused));
        if let Some((_, t)) = s.timings.iter().find(|(name, _)| name == queue) {
            let waited = t.earliest_run_at.filter(|t| *t <= now);
            oldest
                .get_or_create(&q)
                .set(waited.map_or(0.0, |t| now.saturating_since(t).as_secs_f64()));
            let late = t.earliest_expiry.filter(|t| *t < now);
            overdue
                .get_or_create(&q)
                .set(late.map_or(0.0, |t| now.saturating_since(t).as_secs_f64()));
        }
    }
    registry.register("jobs", "Jobs by queue and state", jobs);
    registry.register("queue_paused", "1 if the queue is paused", paused);
    queue_health(&mut registry, s);
    registry.register(
        "queue_oldest_waiting_seconds",
        "How long the queue's oldest due job has waited (0: none waits)",
        oldest,
    );
    registry.register(
        "queue_most_overdue_lease_seconds",
        "How long past its expiry the queue's most overdue lease is (0: none; a reaper keeps it below its interval)",
        overdue,
    );

    if !s.holders.is_empty() {
        let (leases, processes) = (
            Family::<Labels, Gauge>::default(),
            Family::<Labels, Gauge>::default(),
        );
        for state in [
            leasehold::HolderState::Alive,
            leasehold::HolderState::Gone,
            leasehold::HolderState::Unknown,
        ] {
            let held: Vec<_> = s.holders.iter().filter(|(_, h)| *h == state).collect();
            let distinct: std::collections::BTreeSet<_> = held.iter().map(|(i, _)| i).collect();
            let labels = vec![("state", state.name().to_owned())];
            leases.get_or_create(&labels).set(gauge(held.len() as u64));
            processes
                .get_or_create(&labels)
                .set(gauge(distinct.len() as u64));
        }
        registry.register(
            "leases_by_holder_state",
            "Leases held, by their holder process's state where processes share a file: alive, \
             gone (its leases are taken back at the next look), unknown (its leases expire)",
            leases,
        );
        registry.register(
            "processes_holding_leases",
            "Processes sharing the file that hold leases, by state",
            processes,
        );
    }

    let c = &s.stats.counters;
    let reclaims = Family::<Labels, Counter>::default();
    for (path, n) in [
        ("reaper", c.reclaimed_by_reaper),
        ("takeover", c.reclaimed_by_takeover),
        ("process_died", c.reclaimed_process_died),
        ("at_open", c.reclaimed_at_open),
    ] {
        reclaims
            .get_or_create(&vec![("path", path.to_owned())])
            .inc_by(n);
    }
    registry.register(
        "reclaims",
        "Expired or orphaned leases taken back, by path",
        reclaims,
    );
    for (name, help, n) in [
        (
            "released",
            "Leases given back on purpose by their holder",
            c.released,
        ),
        (
            "leases_lost",
            "Heartbeats refused because the lease was lost",
            c.leases_lost,
        ),
        (
            "fenced_writes_rejected",
            "Completions, failures and releases refused by the fence",
            c.fenced_writes_rejected,
        ),
        (
            "stalled",
            "Leases revoked because the job made no progress",
            c.stalled,
        ),
        (
            "timed_out",
            "Attempts ended by their hard time limit",
            c.timed_out,
        ),
        ("snoozed", "Attempts put off by their holder", c.snoozed),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(n);
        registry.register(name, help, counter);
    }
    value(
        &mut registry,
        "worst_detection_delay_seconds",
        "The longest time from a lease's last renewal to its reclaim",
        c.worst_detection_delay.as_secs_f64(),
    );
    value(
        &mut registry,
        "groups_open",
        "Groups that have not ended: open to new members, or with members still to end",
        s.stats.open_groups as f64,
    );
    value(
        &mut registry,
        "groups_waiting_jobs",
        "Jobs blocked until an open group ends (its callbacks)",
        s.stats.waiting_for_groups as f64,
    );

    if let Some(pass) = &s.stats.last_reaper_pass {
        for (name, help, v) in [
            (
                "reaper_last_pass_age_seconds",
                "How long ago the last reaper pass on the store ended (by any process)",
                pass.age(now).as_secs_f64(),
            ),
            (
                "reaper_last_pass_duration_seconds",
                "How long the last reaper pass took",
                pass.took.as_secs_f64(),
            ),
            (
                "reaper_last_pass_reclaimed",
                "Leases the last reaper pass took back",
                pass.reclaimed as f64,
            ),
            (
                "reaper_late",
                "1 if the reaper that made the last pass has missed two passes since",
                f64::from(u8::from(pass.late(now))),
            ),
        ] {
            value(&mut registry, name, help, v);
        }
        if let Some(every) = pass.every {
            value(
                &mut registry,
                "reaper_interval_seconds",
                "How often the reaper that made the last pass runs",
                every.as_secs_f64(),
            );
        }
    }

    if !s.schedules.is_empty() {
        let failing = Family::<Labels, Gauge>::default();
        let lag = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for schedule in s.schedules {
            let labels = vec![("schedule", schedule.name().to_owned())];
            failing
                .get_or_create(&labels)
                .set(i64::from(schedule.failure().is_some()));
            let late_ms = -schedule.next_in_ms(now, s.wall).min(0);
            lag.get_or_create(&labels).set(late_ms as f64 / 1000.0);
        }
        registry.register(
            "schedule_lag_seconds",
            "How long the schedule's due tick has waited for a scheduler to fire it (0: not due)",
            lag,
        );
        registry.register(
            "schedule_failing",
            "1 if the last scheduler pass could not fire the schedule (the others fire; the \
             reason is on the status page and in `leasehold schedules`)",
            failing,
        );
    }

    value(
        &mut registry,
        "counts_age_seconds",
        "How old the job counts of this scrape are (a slow count is repeated in the background)",
        s.counts_age.as_secs_f64(),
    );

    if let Some(w) = s.writes {
        let commits = Counter::<u64>::default();
        commits.inc_by(w.write_transactions);
        registry.register(
            "store_write_transactions",
            "Write transactions this process committed to the store",
            commits,
        );
    }

    if !s.pools.is_empty() {
        let sub = registry.sub_registry_with_prefix("pool");
        let mut names: Vec<&'static str> = Vec::new();
        let mut families: Vec<Family<Labels, Counter>> = Vec::new();
        let in_flight = Family::<Labels, Gauge>::default();
        let ahead = Family::<Labels, Gauge>::default();
        for (pool, stats) in s.pools {
            let labels = vec![("pool", pool.clone())];
            for (i, (name, n)) in stats.named().into_iter().enumerate() {
                if names.len() <= i {
                    names.push(name);
                    families.push(Family::default());
                }
                families[i].get_or_create(&labels).inc_by(n);
            }
            in_flight.get_or_create(&labels).set(gauge(stats.in_flight));
            ahead.get_or_create(&labels).set(gauge(stats.claimed_ahead));
        }
        for (name, family) in names.into_iter().zip(families) {
            sub.register(name, format!("Pool counter {name} (see PoolStats)"), family);
        }
        let latency = Family::<Labels, Histogram>::default();
        for (pool, stats) in s.pools {
            *latency
                .get_or_create(&vec![("pool", pool.clone())])
                .0
                .lock() = stats.commit_latency;
        }
        sub.register(
            "commit_latency_seconds",
            "How long the pool's commits that end attempts take (a round of completions is one)",
            latency,
        );
        let (claimed, succeeded) = (
            Family::<Labels, Counter>::default(),
            Family::<Labels, Counter>::default(),
        );
        let (wait, run) = (
            Family::<Labels, Histogram>::default(),
            Family::<Labels, Histogram>::default(),
        );
        for (pool, stats) in s.pools {
            for (queue, tally) in &stats.queues {
                let labels = vec![("pool", pool.clone()), ("queue", queue.clone())];
                claimed.get_or_create(&labels).inc_by(tally.claimed);
                succeeded.get_or_create(&labels).inc_by(tally.succeeded);
                *wait.get_or_create(&labels).0.lock() = tally.wait;
                *run.get_or_create(&labels).0.lock() = tally.run;
            }
        }
        sub.register(
            "queue_claimed",
            "Jobs of the queue the pool claimed",
            claimed,
        );
        sub.register(
            "queue_succeeded",
            "Jobs of the queue the pool completed",
            succeeded,
        );
        sub.register(
            "job_wait_seconds",
            "How long the queue's jobs the pool started had waited since they were due (store time)",
            wait,
        );
        sub.register(
            "job_run_seconds",
            "How long the pool's handlers of the queue's jobs ran",
            run,
        );
        sub.register("in_flight", "Jobs the pool holds now", in_flight);
        sub.register("claimed_ahead", "Jobs claimed ahead and not started", ahead);
    }

    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// A pool's histogram (its commit latencies, its jobs' waits and runs) as a Prometheus
/// histogram: the pool keeps the buckets, this only encodes them.
#[derive(Clone, Debug, Default)]
struct Histogram(Arc<Mutex<Latencies>>);

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let l = *self.0.lock();
        let bounds = l.bounds.iter().map(|b| b.as_secs_f64());
        let buckets: Vec<(f64, u64)> = bounds.chain([f64::INFINITY]).zip(l.buckets).collect();
        encoder.encode_histogram::<NoLabelSet>(l.sum.as_secs_f64(), l.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Registers a gauge that holds `v` (seconds, mostly): one value, read at this scrape.
fn value(registry: &mut Registry, name: &str, help: &str, v: f64) {
    let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    g.set(v);
    registry.register(name, help, g);
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
