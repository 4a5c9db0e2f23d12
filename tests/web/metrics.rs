//! `/metrics`, read by a Prometheus text-format parser and compared with the store.

use std::collections::HashMap;
use std::time::Duration;

use http::StatusCode;
use leasehold::{JobState, NewJob};

use crate::on_both::{Kind, Q};
use crate::{get, page_of, text};

crate::on_both::on_both!(metrics_parse_and_match_the_stores_counts_and_counters,);

/// The samples of a scrape by metric name and labels (sorted `k=v` joined by commas).
fn scrape(body: &str) -> HashMap<(String, String), f64> {
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("the text format parses");
    parsed
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<String> =
                s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                other => panic!("unexpected {other:?}"),
            };
            ((s.metric, labels.join(",")), value)
        })
        .collect()
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
