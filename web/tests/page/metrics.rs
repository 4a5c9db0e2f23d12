//! `/metrics`, read by a Prometheus text-format parser and compared with the store.

use std::collections::HashMap;
use std::time::Duration;

use std::sync::Arc;

use http::StatusCode;
use leasehold::{JobState, NewJob};

use crate::on_both::{Kind, Q, Setup};
use crate::{get, page_of, text};

crate::on_both::on_both!(
    metrics_parse_and_match_the_stores_counts_and_counters,
    the_reapers_last_pass_is_a_metric_once_one_is_recorded,
    an_embedded_pools_counters_and_commit_latency_are_exported_under_its_name,
    a_schedule_that_cannot_fire_is_on_the_page_and_a_metric_until_it_fires,
    a_queue_at_its_limit_an_unserved_queue_and_a_late_schedule_are_metrics,
    the_processes_holding_leases_of_a_shared_file_are_counted_by_state,
);

fn the_processes_holding_leases_of_a_shared_file_are_counted_by_state(kind: Kind) {
    use leasehold::{HolderState, InstanceId, JobId};
    let f = kind.open();
    // As a file processes share reports its leases' holders (`StoreReader::holders`).
    let held = vec![
        (JobId(1), InstanceId(7), HolderState::Alive),
        (JobId(2), InstanceId(7), HolderState::Alive),
        (JobId(3), InstanceId(8), HolderState::Alive),
        (JobId(4), InstanceId(9), HolderState::Gone),
    ];
    let page = page_of(&f).holders(move || Ok(held.clone())).build();
    let m = scrape(&text(&get(&page, "/metrics")));
    let sample = |name: &str, state: &str| {
        m.get(&(format!("leasehold_{name}"), format!("state={state}")))
            .copied()
    };
    assert_eq!(sample("leases_by_holder_state", "alive"), Some(3.0));
    assert_eq!(sample("processes_holding_leases", "alive"), Some(2.0));
    assert_eq!(sample("leases_by_holder_state", "gone"), Some(1.0));
    assert_eq!(sample("processes_holding_leases", "gone"), Some(1.0));
    assert_eq!(sample("processes_holding_leases", "unknown"), Some(0.0));
    // A store no processes share has no such series.
    let plain = scrape(&text(&get(&page_of(&f).build(), "/metrics")));
    assert!(!plain.keys().any(|(name, _)| name.contains("holder")));
}

fn a_queue_at_its_limit_an_unserved_queue_and_a_late_schedule_are_metrics(kind: Kind) {
    let f = kind.open();
    let limits = leasehold::QueueLimits::none().concurrency(1).per_key(3);
    f.enqueue_n(3);
    f.set_queue_limits(Q, limits).unwrap();
    let hour = leasehold::LeaseTerms::new(Duration::from_secs(3600));
    let held = f.claim(Q, "w", hour).unwrap().unwrap();
    for tenant in ["t", "t"] {
        f.enqueue(NewJob::new(Q, "k").limit_key(tenant)).unwrap();
    }
    f.enqueue(NewJob::new("forgotten", "x")).unwrap();
    let every = Duration::from_secs(10);
    let tick = leasehold::Schedule::every("tick", every, NewJob::new("ticks", "t"));
    f.declare_schedule(tick).unwrap();
    let page = page_of(&f).build();
    let sample = |m: &HashMap<(String, String), f64>, name: &str, labels: &str| {
        m.get(&(format!("leasehold_{name}"), labels.to_owned()))
            .copied()
    };
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(sample(&m, "queue_concurrency_limit", "queue=q"), Some(1.0));
    assert_eq!(sample(&m, "queue_per_key_limit", "queue=q"), Some(3.0));
    assert_eq!(sample(&m, "queue_waiting_at_limit", "queue=q"), Some(4.0));
    assert_eq!(sample(&m, "queue_parked_jobs", "queue=q"), Some(1.0));
    assert_eq!(
        sample(&m, "queue_limit_keys_at_limit", "queue=q"),
        Some(0.0)
    );
    assert_eq!(sample(&m, "queue_parked_jobs", "queue=forgotten"), None);
    assert_eq!(sample(&m, "groups_open", ""), Some(0.0));
    let callback = leasehold::NewGroup::new().on_complete(NewJob::new("after", "x"));
    let group = f.open_group(callback).unwrap();
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(sample(&m, "groups_open", ""), Some(1.0));
    assert_eq!(sample(&m, "groups_waiting_jobs", ""), Some(1.0));
    f.seal_group(group).unwrap();
    assert_eq!(
        sample(&m, "queue_concurrency_limit", "queue=forgotten"),
        None
    );
    assert_eq!(
        sample(&m, "queue_unserved", "queue=forgotten"),
        Some(0.0),
        "not yet"
    );
    assert_eq!(
        sample(&m, "schedule_lag_seconds", "schedule=tick"),
        Some(0.0)
    );
    // Six minutes on: nobody asked for `forgotten`; `q`'s holder renewed (which marks it
    // served); the schedule's tick has waited 350 s past its time.
    f.advance(Duration::from_secs(360));
    f.heartbeat(&held, 1).unwrap();
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(sample(&m, "queue_unserved", "queue=forgotten"), Some(1.0));
    assert_eq!(sample(&m, "queue_unserved", "queue=q"), Some(0.0));
    let lag = sample(&m, "schedule_lag_seconds", "schedule=tick").unwrap();
    assert!((349.0..=351.0).contains(&lag), "{lag}");
    // Fired, it is on time again; the limit freed, nothing waits at it.
    f.fire_schedules().unwrap();
    f.complete(&held, b"").unwrap();
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(
        sample(&m, "schedule_lag_seconds", "schedule=tick"),
        Some(0.0)
    );
    assert_eq!(sample(&m, "queue_waiting_at_limit", "queue=q"), Some(0.0));
}

/// The samples of a scrape by metric name and labels (sorted `k=v` joined by commas).
fn scrape(body: &str) -> HashMap<(String, String), f64> {
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("the text format parses");
    let mut samples = HashMap::new();
    for s in parsed.samples {
        let labels = |extra: Option<String>| {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.extend(extra);
            labels.sort();
            labels.join(",")
        };
        match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => {
                samples.insert((s.metric.clone(), labels(None)), *v);
            }
            // A histogram's buckets, as `<name>_bucket` with their `le` label.
            prometheus_parse::Value::Histogram(buckets) => {
                for b in buckets {
                    let le = Some(format!("le={}", b.less_than));
                    samples.insert((format!("{}_bucket", s.metric), labels(le)), b.count);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    samples
}

fn metrics_parse_and_match_the_stores_counts_and_counters(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(4);
    f.enqueue(NewJob::new("mail", "m")).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    // A lease that expires and is reaped, a heartbeat of the lost lease, and a fenced write.
    let lost = f.claim_one("w");
    f.advance(crate::on_both::LEASE + Duration::from_secs(1));
    f.reap().unwrap();
    assert!(f.heartbeat(&lost, 1).is_err());
    assert!(f.complete(&lost, b"late").is_err());
    let page = page_of(&f).build();
    let r = get(&page, "/metrics");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics-text")
    );
    let m = scrape(&text(&r));
    let stats = f.stats().unwrap();
    for (queue, counts) in &stats.queues {
        for state in JobState::ALL {
            let key = (
                "leasehold_jobs".to_owned(),
                format!("queue={queue},state={state}"),
            );
            assert_eq!(m.get(&key), Some(&(counts.get(state) as f64)), "{key:?}");
        }
    }
    let c = &stats.counters;
    assert_eq!(c.reclaimed_by_reaper, 1, "the setup reaped one lease");
    for (path, n) in [
        ("reaper", c.reclaimed_by_reaper),
        ("takeover", c.reclaimed_by_takeover),
        ("process_died", c.reclaimed_process_died),
        ("at_open", c.reclaimed_at_open),
    ] {
        let key = (
            "leasehold_reclaims_total".to_owned(),
            format!("path={path}"),
        );
        assert_eq!(m.get(&key), Some(&(n as f64)), "{key:?}");
    }
    for (name, n) in [
        ("leasehold_leases_lost_total", c.leases_lost),
        (
            "leasehold_fenced_writes_rejected_total",
            c.fenced_writes_rejected,
        ),
        ("leasehold_released_total", c.released),
        ("leasehold_stalled_total", c.stalled),
    ] {
        assert_eq!(
            m.get(&(name.to_owned(), String::new())),
            Some(&(n as f64)),
            "{name}"
        );
    }
    assert!(c.leases_lost >= 1 && c.fenced_writes_rejected >= 1);
    let waited = m[&(
        "leasehold_queue_oldest_waiting_seconds".to_owned(),
        format!("queue={Q}"),
    )];
    assert!(
        waited >= 61.0,
        "the oldest job has waited the lease and a second: {waited}"
    );
    assert_eq!(
        m[&("leasehold_queue_paused".to_owned(), format!("queue={Q}"))],
        0.0
    );
}

fn the_reapers_last_pass_is_a_metric_once_one_is_recorded(kind: Kind) {
    let f = kind.open();
    let page = page_of(&f).build();
    let none = scrape(&text(&get(&page, "/metrics")));
    assert!(
        !none
            .keys()
            .any(|(name, _)| name.starts_with("leasehold_reaper")),
        "no pass, no reaper metrics: {none:?}"
    );
    f.enqueue_n(3);
    f.claim_one("a");
    f.claim_one("b");
    f.advance(crate::on_both::LEASE);
    f.reap().unwrap();
    f.advance(Duration::from_secs(4));
    let m = scrape(&text(&get(&page, "/metrics")));
    let value = |name: &str| m.get(&(name.to_owned(), String::new())).copied();
    assert_eq!(value("leasehold_reaper_last_pass_age_seconds"), Some(4.0));
    assert_eq!(value("leasehold_reaper_last_pass_reclaimed"), Some(2.0));
    assert_eq!(
        value("leasehold_reaper_last_pass_duration_seconds"),
        Some(0.0)
    );
    assert_eq!(value("leasehold_reaper_late"), Some(0.0));
    assert_eq!(
        value("leasehold_reaper_interval_seconds"),
        None,
        "a pass called directly has no interval"
    );
}

fn an_embedded_pools_counters_and_commit_latency_are_exported_under_its_name(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(20);
    let pool = Arc::new(f.pool(Q.into()).concurrency(4).start(|_| Ok(())).unwrap());
    // The pool's own count, which moves just after its commit lands (the store's states
    // move with the commit): what the page exports.
    crate::wait_until("the pool to count every job finished", || {
        pool.stats().succeeded == 20
    });
    assert!(
        ids.iter()
            .all(|id| f.job(*id).unwrap().unwrap().state() == JobState::Succeeded)
    );
    let stats_of = pool.clone();
    let page = page_of(&f).pool("mail", move || stats_of.stats()).build();
    // An idle pool still counts (its dispatcher looks for work now and then): each counter
    // exported lies between the pool's counts just before and just after the scrape.
    let before = pool.stats();
    let m = scrape(&text(&get(&page, "/metrics")));
    let stats = pool.stats();
    let value = |name: &str| m.get(&(name.to_owned(), "pool=mail".to_owned())).copied();
    assert_eq!(stats.succeeded, 20);
    for ((name, low), (_, high)) in before.named().into_iter().zip(stats.named()) {
        let got = value(&format!("leasehold_pool_{name}_total"));
        assert!(
            got.is_some_and(|v| (low as f64..=high as f64).contains(&v)),
            "{name}: {got:?}, counted {low}..={high}"
        );
    }
    // and by queue
    let of_queue = |name: &str| {
        m.get(&(name.to_owned(), format!("pool=mail,queue={Q}")))
            .copied()
    };
    assert_eq!(of_queue("leasehold_pool_queue_succeeded_total"), Some(20.0));
    assert_eq!(
        of_queue("leasehold_pool_queue_claimed_total"),
        Some(stats.queues[Q].claimed as f64)
    );
    let latency = stats.commit_latency;
    assert!(
        (1..=20).contains(&latency.count()),
        "one observation per commit that ended attempts: {latency:?}"
    );
    assert_eq!(
        value("leasehold_pool_commit_latency_seconds_count"),
        Some(latency.count() as f64)
    );
    let sum = value("leasehold_pool_commit_latency_seconds_sum").unwrap();
    assert!((sum - latency.sum.as_secs_f64()).abs() < 1e-9, "{sum}");
    let bucket = |le: &str| {
        m.get(&(
            "leasehold_pool_commit_latency_seconds_bucket".to_owned(),
            format!("le={le},pool=mail"),
        ))
        .copied()
    };
    assert_eq!(bucket("inf"), Some(latency.count() as f64), "{m:?}");
    // each queue's jobs: how long they waited since due (the manual clock stood still: no
    // wait at all) and how long they ran
    let tally = stats.queues[Q];
    assert_eq!((tally.wait.count(), tally.run.count()), (20, 20));
    let job_bucket = |name: &str, le: &str| {
        m.get(&(name.to_owned(), format!("le={le},pool=mail,queue={Q}")))
            .copied()
    };
    assert_eq!(
        job_bucket("leasehold_pool_job_wait_seconds_bucket", "0.001"),
        Some(20.0)
    );
    assert_eq!(
        job_bucket("leasehold_pool_job_run_seconds_bucket", "inf"),
        Some(20.0)
    );
    assert_eq!(
        of_queue("leasehold_pool_job_run_seconds_count"),
        Some(20.0),
        "{m:?}"
    );
    let within_10ms: u64 = latency.buckets[..8].iter().sum();
    assert_eq!(
        bucket("0.01"),
        Some(within_10ms as f64),
        "cumulative buckets"
    );
}

fn a_schedule_that_cannot_fire_is_on_the_page_and_a_metric_until_it_fires(kind: Kind) {
    let minute = Duration::from_secs(60);
    let mut f = kind.with(Setup::default().max_payload(4096));
    for (name, payload) in [("big<1>", vec![7u8; 2048]), ("small", b"x".to_vec())] {
        f.declare_schedule(leasehold::Schedule::every(
            name,
            minute,
            NewJob::new(Q, payload),
        ))
        .unwrap();
    }
    // a process whose payloads may not be that large runs the scheduler
    f.reopen_with(Setup::default().max_payload(1024));
    f.advance(minute);
    f.fire_schedules_at(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    let page = page_of(&f).build();
    let failing = |m: &HashMap<(String, String), f64>, name: &str| {
        m.get(&(
            "leasehold_schedule_failing".to_owned(),
            format!("schedule={name}"),
        ))
        .copied()
    };
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(failing(&m, "big<1>"), Some(1.0));
    assert_eq!(failing(&m, "small"), Some(0.0));
    let html = text(&get(&page, "/"));
    let shown = &html[html
        .find("id=\"schedule-failure\"")
        .expect("the failure shown")..];
    assert!(shown.contains("big&lt;1&gt;"), "{shown}");
    assert!(shown.contains("payload"), "{shown}");
    // declared again with a payload it can take, it fires, and the failure is gone
    f.declare_schedule(leasehold::Schedule::every("big<1>", minute, NewJob::new(Q, "x")).replace())
        .unwrap();
    f.advance(minute);
    f.fire_schedules_at(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    let m = scrape(&text(&get(&page, "/metrics")));
    assert_eq!(failing(&m, "big<1>"), Some(0.0));
    assert!(!text(&get(&page, "/")).contains("schedule-failure"));
}
