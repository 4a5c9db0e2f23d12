use std::time::Duration;

use leasehold::{NewJob, UNSERVED_AFTER};

use crate::common::wait_until;
use crate::on_both::{Kind, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_queue_whose_work_waits_with_nobody_asking_is_unserved_until_a_claim_asks,
    a_claim_that_finds_nothing_still_marks_its_queue_at_most_every_half_minute,
    renewals_keep_a_busy_queue_served_while_its_other_work_waits,
    the_reaper_warns_once_of_a_queue_nobody_serves,
);

fn a_queue_whose_work_waits_with_nobody_asking_is_unserved_until_a_claim_asks(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new("uplaods", "a")).unwrap(); // the typo
    f.enqueue(NewJob::new("uplaods", "b")).unwrap();
    f.enqueue(NewJob::new("later", "c").delay(UNSERVED_AFTER * 2))
        .unwrap();
    assert!(
        f.unserved_queues().unwrap().is_empty(),
        "not for a while yet"
    );
    let enqueued = f.now();
    f.advance(UNSERVED_AFTER);
    let unserved = f.unserved_queues().unwrap();
    assert_eq!(unserved.len(), 1, "{unserved:?}");
    assert_eq!(unserved[0].queue, "uplaods");
    assert_eq!(unserved[0].waiting_since, enqueued);
    assert_eq!(unserved[0].served_at, None);
    // A paused queue is left alone on purpose: not reported.
    f.pause_queue("uplaods").unwrap();
    assert!(f.unserved_queues().unwrap().is_empty());
    f.resume_queue("uplaods").unwrap();
    // A worker asks: served now, though one job still waits.
    let l = f.claim("uplaods", "w", lease()).unwrap().unwrap();
    let asked = f.now();
    assert!(f.unserved_queues().unwrap().is_empty());
    assert_eq!(f.stats().unwrap().queues["uplaods"].served_at, Some(asked));
    f.complete(&l, b"").unwrap();
    // Nobody asks again for as long: unserved again, last served then.
    f.advance(UNSERVED_AFTER);
    let unserved = f.unserved_queues().unwrap();
    assert_eq!(unserved.len(), 1, "{unserved:?}");
    assert_eq!(unserved[0].served_at, Some(asked));
}

fn a_claim_that_finds_nothing_still_marks_its_queue_at_most_every_half_minute(kind: Kind) {
    let f = kind.open();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    let first = f.now();
    assert_eq!(f.stats().unwrap().queues[Q].served_at, Some(first));
    f.advance(Duration::from_secs(10));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert_eq!(
        f.stats().unwrap().queues[Q].served_at,
        Some(first),
        "a mark is written at most every half minute"
    );
    f.advance(Duration::from_secs(20));
    assert!(f.claim_batch(Q, "w", lease(), 4).unwrap().is_empty());
    assert_eq!(f.stats().unwrap().queues[Q].served_at, Some(f.now()));
}

fn renewals_keep_a_busy_queue_served_while_its_other_work_waits(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let l = f.claim_one("w");
    for _ in 0..20 {
        f.advance(Duration::from_secs(20));
        f.heartbeat(&l, 0).unwrap();
    }
    // The second job has waited 400 s, but the worker that holds the first is still there.
    assert!(f.unserved_queues().unwrap().is_empty());
    let served = f.stats().unwrap().queues[Q].served_at.unwrap();
    assert!(f.now().saturating_since(served) < Duration::from_secs(40));
}

fn the_reaper_warns_once_of_a_queue_nobody_serves(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new("uplaods", "a")).unwrap();
    f.advance(UNSERVED_AFTER);
    let reaper = f.start_reaper(Duration::from_millis(5)).unwrap();
    wait_until("the reaper to warn", || {
        reaper.metrics().unserved_warnings() == 1
    });
    // more passes, and not one warning more within the interval of warnings
    let passes = reaper.metrics().passes();
    wait_until("more passes", || reaper.metrics().passes() >= passes + 5);
    f.advance(Duration::from_secs(120));
    let passes = reaper.metrics().passes();
    wait_until("more passes", || reaper.metrics().passes() >= passes + 5);
    assert_eq!(reaper.metrics().unserved_warnings(), 1);
    // still unserved an interval later: warned again
    f.advance(UNSERVED_AFTER);
    wait_until("the second warning", || {
        reaper.metrics().unserved_warnings() == 2
    });
}
