use std::time::Duration;

use leasehold::{Attempt, JobState, NewJob, Outcome, ReclaimPath};

use crate::common::wait_until;
use crate::on_both::{Kind, LEASE, Q, Setup, lease};

crate::on_both::on_both!(
    and protocol;
    reap_moves_expired_jobs_back_to_queued_and_records_lease_expired,
    a_lease_is_reaped_by_the_first_pass_at_or_after_its_expiry,
    a_whole_dead_pool_is_reclaimed_in_bounded_batches,
    a_reap_pass_ends_in_at_most_n_over_batch_plus_one_batches_for_any_mix_of_renewed_and_expired,
    worst_case_detection_delay_is_lease_plus_reaper_interval,
    with_a_retention_a_reap_purges_old_succeeded_and_cancelled_jobs_in_batches_and_keeps_dead_ones,
    the_reaper_thread_reclaims_expired_leases_and_stops_on_request,
    stopping_a_reaper_does_not_wait_out_its_interval,
    each_reaper_pass_is_recorded_with_when_it_ended_and_what_it_did,
    a_reaper_thread_records_its_interval_and_is_late_once_it_misses_two_passes,
);

fn reap_moves_expired_jobs_back_to_queued_and_records_lease_expired(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(3);
    let silent = f.claim_one("silent");
    let alive = f.claim_one("alive");
    f.advance(Duration::from_secs(30));
    f.heartbeat(&alive, 1).unwrap();
    f.advance(Duration::from_secs(31)); // silent's lease expired 1 s ago; alive's has 29 s left

    let report = f.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    let r = &report.reclaimed[0];
    assert_eq!(
        (r.job, r.attempt, r.worker.as_str()),
        (silent.job, Attempt(1), "silent")
    );
    assert_eq!(r.overdue, Duration::from_secs(1));
    assert_eq!(r.detection_delay, LEASE + Duration::from_secs(1));
    assert_eq!(r.job_state, JobState::Queued);

    let job = f.job(silent.job).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Queued);
    assert_eq!(job.failures(), 1, "a lost lease spends retry budget");
    assert_eq!(
        f.history(silent.job).unwrap()[0].outcome(),
        Some(&Outcome::LeaseExpired {
            path: ReclaimPath::Reaper,
            overdue: Duration::from_secs(1)
        })
    );
    assert_eq!(
        f.job(alive.job).unwrap().unwrap().state(),
        JobState::Running
    );
    // the reclaimed job is claimable again at once, ahead of jobs enqueued after it
    assert_eq!(f.claim_one("next").job, ids[0]);
    let counters = f.stats().unwrap().counters;
    assert_eq!(counters.reclaimed_by_reaper, 1);
    assert_eq!(
        counters.worst_detection_delay,
        LEASE + Duration::from_secs(1)
    );
}

fn a_lease_is_reaped_by_the_first_pass_at_or_after_its_expiry(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    f.claim_one("w");
    f.advance(LEASE - Duration::from_nanos(1));
    assert!(f.reap().unwrap().reclaimed.is_empty());
    f.advance(Duration::from_nanos(1));
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
}

fn a_whole_dead_pool_is_reclaimed_in_bounded_batches(kind: Kind) {
    let f = kind.with(Setup::default().reap_batch(100));
    f.enqueue_n(1050);
    while f.claim(Q, "pool", lease()).unwrap().is_some() {}
    f.advance(LEASE);
    let report = f.reap().unwrap();
    assert_eq!(report.reclaimed.len(), 1050);
    assert_eq!((report.batches, report.largest_batch), (11, 100));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 1050);
}

/// The reaper's loop, as the purge's (`enqueue::purge_and_a_reap_with_a_retention_...`): for
/// any number of leases, batch size and mix of renewed ones (whose index entries the pass
/// looks at and moves on) and expired ones (which it takes back), a pass takes back exactly
/// the expired, in at most ⌈n / batch⌉ + 1 batches.
fn a_reap_pass_ends_in_at_most_n_over_batch_plus_one_batches_for_any_mix_of_renewed_and_expired(
    kind: Kind,
) {
    for batch in [1usize, 2, 3, 5] {
        let f = kind.clone().with(Setup::default().reap_batch(batch));
        let mut seed = batch as u64;
        for n in [0usize, 1, 2, 3, 4, 5, 6, 7, 10] {
            f.enqueue_n(n);
            let leases: Vec<_> = (0..n).map(|_| f.claim_one("pool")).collect();
            f.advance(LEASE / 2);
            let mut expired = Vec::new();
            for l in &leases {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match (seed >> 33) % 2 {
                    0 => {
                        f.heartbeat(l, 1).unwrap(); // its index entry is now early
                    }
                    _ => expired.push(l.job),
                }
            }
            f.advance(LEASE / 2);
            let report = f.reap().unwrap();
            let mut reclaimed: Vec<_> = report.reclaimed.iter().map(|r| r.job).collect();
            reclaimed.sort();
            assert_eq!(reclaimed, expired, "batch {batch}, {n} leases");
            assert!(
                report.batches <= n.div_ceil(batch) + 1,
                "batch {batch}, {n} leases: {} batches",
                report.batches
            );
            // what is left runs to its end: the next pass takes back the renewed ones
            f.advance(LEASE);
            assert_eq!(f.reap().unwrap().reclaimed.len(), n - expired.len());
            for _ in 0..n {
                let l = f.claim_one("w");
                f.complete(&l, b"").unwrap();
            }
        }
    }
}

/// The bound: a holder that renewed at `t` and then died is reclaimed by `t + lease +
/// reaper interval` at the latest, whatever the phase of the reaper's ticks. Walks a reaper
/// ticking every 15 s over deaths at many phases on the manual clock and checks every
/// detection delay is within the bound and that the worst case comes within a step of it.
fn worst_case_detection_delay_is_lease_plus_reaper_interval(kind: Kind) {
    let f = kind.open();
    let reaper_every = Duration::from_secs(15);
    let step = Duration::from_millis(500);
    let bound = LEASE + reaper_every;
    let mut worst = Duration::ZERO;
    for phase in 0..30u32 {
        f.enqueue_n(1);
        let l = f.claim_one("w");
        // the holder renews once, at a phase offset from the reaper's ticks, then dies
        f.advance(step * phase);
        f.heartbeat(&l, 1).unwrap();
        let last_renewal = f.now();
        let mut reclaimed = None;
        while reclaimed.is_none() {
            let elapsed = f.clock.elapsed().as_nanos();
            let tick = reaper_every.as_nanos();
            let next_tick = (elapsed / tick + 1) * tick;
            f.clock.set(Duration::from_nanos(next_tick as u64));
            reclaimed = f.reap().unwrap().reclaimed.into_iter().next();
        }
        let r = reclaimed.unwrap();
        let delay = f.now().saturating_since(last_renewal);
        assert_eq!(delay, r.detection_delay);
        assert!(delay <= bound, "phase {phase}: {delay:?} > {bound:?}");
        worst = worst.max(delay);
        let again = f.claim_one("w");
        f.complete(&again, b"").unwrap();
    }
    assert!(
        worst >= bound - step,
        "worst {worst:?} should approach the bound {bound:?}"
    );
    assert_eq!(f.stats().unwrap().counters.worst_detection_delay, worst);
}

fn the_reaper_thread_reclaims_expired_leases_and_stops_on_request(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let l = f.claim_one("silent");
    f.advance(LEASE);
    let mut reaper = f.start_reaper(Duration::from_millis(5)).unwrap();
    wait_until("the reaper to reclaim", || {
        reaper.metrics().reclaimed() == 1
    });
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Queued);
    reaper.stop();
    reaper.stop(); // idempotent
    let passes = reaper.metrics().passes();
    assert!(passes >= 1);
}

fn stopping_a_reaper_does_not_wait_out_its_interval(kind: Kind) {
    // With an hour-long interval, a sleep-based loop would hang this test; the channel wakes it.
    let f = kind.open();
    let reaper = f.start_reaper(Duration::from_secs(3600)).unwrap();
    drop(reaper); // Drop stops and joins
    assert!(
        f.start_reaper(Duration::ZERO).is_err(),
        "zero interval refused"
    );
}

fn each_reaper_pass_is_recorded_with_when_it_ended_and_what_it_did(kind: Kind) {
    let f = kind.open();
    assert_eq!(f.stats().unwrap().last_reaper_pass, None, "no pass yet");
    f.enqueue_n(3);
    f.claim_one("a");
    f.claim_one("b");
    f.advance(LEASE);
    f.reap().unwrap();
    let at = f.now();
    let pass = f
        .stats()
        .unwrap()
        .last_reaper_pass
        .expect("the pass is recorded");
    assert_eq!(
        (pass.at, pass.reclaimed, pass.purged, pass.every),
        (at, 2, 0, None)
    );
    assert_eq!(pass.took, Duration::ZERO, "the manual clock stood still");

    // a later pass replaces it, though it found nothing
    f.advance(Duration::from_secs(7));
    f.reap().unwrap();
    let later = f.stats().unwrap().last_reaper_pass.unwrap();
    assert_eq!((later.at, later.reclaimed), (f.now(), 0));
    assert_eq!(later.age(f.now()), Duration::ZERO);
    f.advance(Duration::from_secs(3600));
    assert_eq!(later.age(f.now()), Duration::from_secs(3600));
    assert!(
        !later.late(f.now()),
        "a pass called directly has no interval to miss"
    );
}

fn a_reaper_thread_records_its_interval_and_is_late_once_it_misses_two_passes(kind: Kind) {
    let f = kind.open();
    let every = Duration::from_millis(5);
    let mut reaper = f.start_reaper(every).unwrap();
    wait_until("the reaper thread to record a pass", || {
        f.stats()
            .unwrap()
            .last_reaper_pass
            .is_some_and(|p| p.every == Some(every))
    });
    reaper.stop();
    // the store's clock is the manual one: it stands until the test moves it
    let pass = f.stats().unwrap().last_reaper_pass.unwrap();
    assert!(!pass.late(f.now()));
    f.advance(every * 3);
    assert!(
        !pass.late(f.now()),
        "two missed passes are not yet three intervals"
    );
    f.advance(Duration::from_micros(1)); // PostgreSQL's clock counts microseconds
    assert!(pass.late(f.now()));
}

fn with_a_retention_a_reap_purges_old_succeeded_and_cancelled_jobs_in_batches_and_keeps_dead_ones(
    kind: Kind,
) {
    const HOUR: Duration = Duration::from_secs(3600);
    let f = kind.with(Setup::default().retention(HOUR).reap_batch(2));
    let ids = f.enqueue_n(5);
    for _ in 0..4 {
        let l = f.claim_one("w");
        f.complete(&l, b"done").unwrap();
    }
    f.cancel(ids[4]).unwrap();
    let doomed = f.enqueue(NewJob::new(Q, "d").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);

    f.advance(HOUR / 2);
    let late = f.enqueue(NewJob::new(Q, "late")).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"late").unwrap();
    assert_eq!(
        f.reap().unwrap().purged,
        0,
        "nothing has outlived the hour yet"
    );

    f.advance(HOUR / 2 + Duration::from_secs(60));
    let writes = f.write_transactions();
    let report = f.reap().unwrap();
    assert_eq!(report.purged, 5, "four succeeded and one cancelled");
    assert!(
        f.write_transactions() >= writes.map(|w| w + 3),
        "five jobs in batches of two"
    );
    for &id in &ids {
        assert!(f.job(id).unwrap().is_none());
        assert!(f.history(id).unwrap().is_empty());
        assert!(f.output(id).unwrap().is_none());
    }
    assert_eq!(f.job(doomed).unwrap().unwrap().state(), JobState::Dead);
    assert_eq!(f.job(late).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(f.reap().unwrap().purged, 0);
}
