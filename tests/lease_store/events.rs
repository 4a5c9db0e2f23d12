use std::time::{Duration, SystemTime};

use leasehold::{Event, Events, JobState, NewJob, Outcome, QueueLimits, ReclaimPath, Schedule};

use crate::on_both::{Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_subscriber_hears_each_claim_and_end_once_it_has_committed,
    a_reclaim_is_told_as_an_end_with_its_path,
    schedules_fired_limits_reached_and_pauses_are_told,
    a_write_the_fence_refused_tells_nothing,
);

/// Everything told so far, in order.
fn told(events: &Events) -> Vec<Event> {
    std::iter::from_fn(|| events.try_next()).collect()
}

fn ended(job: leasehold::JobId, attempt: u32, outcome: Outcome, state: JobState) -> Event {
    Event::Ended {
        job,
        attempt: leasehold::Attempt(attempt),
        queue: Q.into(),
        outcome,
        state,
    }
}

fn claimed(l: &leasehold::Lease) -> Event {
    Event::Claimed {
        job: l.job,
        attempt: l.attempt,
        queue: l.queue.clone(),
        worker: l.worker.clone(),
    }
}

fn a_subscriber_hears_each_claim_and_end_once_it_has_committed(kind: Kind) {
    let f = kind.open();
    let events = f.subscribe();
    let ids = f.enqueue_n(3);
    assert_eq!(told(&events), [], "an enqueue is not an event");
    let a = f.claim_one("w");
    let b = f.claim_one("w");
    assert_eq!(told(&events), [claimed(&a), claimed(&b)]);
    f.complete(&a, b"").unwrap();
    f.fail(&b, "boom").unwrap();
    assert_eq!(
        told(&events),
        [
            ended(ids[0], 1, Outcome::Succeeded, JobState::Succeeded),
            ended(
                ids[1],
                1,
                Outcome::Failed("boom".into()),
                JobState::RetryWait
            ),
        ]
    );
    // a pool's round: its completion, then its claim
    let c = f.claim_one("w");
    told(&events);
    let round = f.complete_batch_and_claim(&[(&c, b"")], Q, "w", lease(), 2);
    assert!(round.0.iter().all(Result::is_ok));
    let mut want = vec![ended(ids[2], 1, Outcome::Succeeded, JobState::Succeeded)];
    want.extend(round.1.unwrap().iter().map(claimed));
    assert_eq!(told(&events), want);
    // a second subscriber hears from its start; a dropped one is forgotten
    let late = f.subscribe();
    drop(events);
    f.enqueue(NewJob::new(Q, "x")).unwrap();
    let d = f.claim_one("w");
    assert_eq!(told(&late), [claimed(&d)]);
    assert_eq!(late.dropped(), 0);
}

fn a_reclaim_is_told_as_an_end_with_its_path(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x")).unwrap();
    let events = f.subscribe();
    let l = f.claim_one("w");
    f.advance(LEASE + Duration::from_secs(1));
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
    let all = told(&events);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0], claimed(&l));
    assert_eq!(all[1].reclaim_path(), Some(ReclaimPath::Reaper));
    assert!(matches!(
        &all[1],
        Event::Ended { job, state: JobState::Queued, .. } if *job == id
    ));
    // taken over at claim time: the end, then the new claim
    let l = f.claim_one("w");
    f.advance(LEASE + Duration::from_secs(1));
    told(&events);
    let taken = f.claim_one("w2");
    let all = told(&events);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].reclaim_path(), Some(ReclaimPath::Takeover));
    assert!(matches!(&all[0], Event::Ended { attempt, .. } if *attempt == l.attempt));
    assert_eq!(all[1], claimed(&taken));
}

fn schedules_fired_limits_reached_and_pauses_are_told(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    let events = f.subscribe();
    let every = Duration::from_secs(60);
    f.declare_schedule(Schedule::every("tick", every, NewJob::new("ticks", "t")))
        .unwrap();
    f.advance(every);
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let fired = f.fire_schedules_at(wall).unwrap();
    assert_eq!(
        told(&events),
        [Event::ScheduleFired {
            schedule: "tick".into(),
            job: fired[0],
        }]
    );
    f.set_queue_limits(Q, QueueLimits::none().concurrency(1))
        .unwrap();
    f.enqueue_n(2);
    let got = f.claim_batch(Q, "w", lease(), 2).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        told(&events),
        [Event::LimitReached { queue: Q.into() }, claimed(&got[0]),]
    );
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert_eq!(told(&events), [Event::LimitReached { queue: Q.into() }]);
    f.pause_queue(Q).unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.resume_queue(Q).unwrap();
    let paused = |paused| Event::QueuePaused {
        queue: Q.into(),
        paused,
    };
    assert_eq!(
        told(&events),
        [paused(true), paused(false)],
        "a paused queue's claim reached no limit"
    );
}

fn a_write_the_fence_refused_tells_nothing(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let stale = f.claim_one("w");
    f.advance(LEASE + Duration::from_secs(1));
    let fresh = f.claim_one("w2");
    let events = f.subscribe();
    assert!(f.complete(&stale, b"").unwrap_err().is_lease_lost());
    assert!(f.heartbeat(&stale, 1).is_err());
    assert_eq!(told(&events), []);
    f.complete(&fresh, b"").unwrap();
    assert_eq!(told(&events).len(), 1);
}
