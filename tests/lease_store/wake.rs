use std::time::Duration;

use leasehold::JobStore;
use leasehold::{NewJob, StoreTime};

use crate::common::Fixture;
use crate::on_both::{Kind, LEASE, Q};

crate::on_both::on_both!(
    and protocol;
    an_enqueue_wakes_a_waiter_of_its_queue,
    work_that_arrived_before_the_wait_is_not_missed,
    releases_and_reclaims_wake_waiters_too,
);

fn an_enqueue_wakes_a_waiter_of_its_queue(kind: Kind) {
    let f = kind.open();
    let store = f.handle();
    let seen = f.work_generation(Q);
    let waiter = std::thread::spawn(move || store.wait_for_work(Q, seen, Duration::from_secs(60)));
    f.enqueue_n(1);
    let now = waiter.join().unwrap();
    assert_ne!(now, seen, "woken by the enqueue, not by the 60 s timeout");
}

fn work_that_arrived_before_the_wait_is_not_missed(kind: Kind) {
    let f = kind.open();
    let seen = f.work_generation(Q);
    f.enqueue_n(1);
    // returns at once: the generation moved before the wait began
    assert_ne!(f.wait_for_work(Q, seen, Duration::from_secs(60)), seen);
}

#[test]
fn other_queues_do_not_move_a_queues_generation_but_wake_all_does() {
    let f = Fixture::new();
    let seen = f.work_generation(Q);
    f.enqueue(NewJob::new("other", "x")).unwrap();
    assert_eq!(f.work_generation(Q), seen);
    f.wake_all();
    assert_ne!(f.work_generation(Q), seen);
}

fn releases_and_reclaims_wake_waiters_too(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let a = f.claim_one("a");
    f.claim_one("b");
    let seen = f.work_generation(Q);
    f.release(&a).unwrap();
    let after_release = f.work_generation(Q);
    assert_ne!(after_release, seen);
    f.advance(LEASE);
    f.reap().unwrap();
    assert_ne!(f.work_generation(Q), after_release);
}

#[test]
fn next_due_names_the_earliest_delayed_job_or_lease_expiry() {
    let f = Fixture::new();
    assert_eq!(f.next_due(Q).unwrap(), None);
    f.enqueue(
        NewJob::new(Q, "late")
            .priority(-5)
            .delay(Duration::from_secs(50)),
    )
    .unwrap();
    f.enqueue(NewJob::new(Q, "later").delay(Duration::from_secs(90)))
        .unwrap();
    assert_eq!(f.next_due(Q).unwrap(), Some(StoreTime(50_000_000_000)));
    f.enqueue(NewJob::new(Q, "now")).unwrap();
    f.claim_one("w"); // takes "now"; its lease expires at 60 s
    f.advance(Duration::from_secs(50));
    f.claim_one("w"); // takes "late"; its lease expires at 110 s
    assert_eq!(f.next_due(Q).unwrap(), Some(StoreTime(60_000_000_000)));
}
