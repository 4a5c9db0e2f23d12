//! Limits per key: at most n of one key's jobs held at once, each key apart.

use std::time::Duration;

use leasehold::{
    Edit, Error, InputError, JobFilter, JobId, JobState, Lease, NewJob, QueueLimits, RetryPolicy,
};

use crate::on_both::{Backend, Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_key_at_its_limit_holds_back_only_its_own_jobs,
    a_keys_jobs_go_in_the_order_they_fall_due_and_priority_orders_the_keys,
    a_delayed_or_backing_off_job_holds_back_no_due_job_of_its_key,
    an_expired_lease_frees_its_keys_slot_by_the_reaper_and_by_takeover,
    a_new_limit_takes_effect_at_once_and_a_lowered_one_at_the_next_claim,
    a_cancelled_or_edited_head_hands_its_place_to_the_next_job_of_its_key,
    a_keyed_job_released_by_its_dependency_or_retried_takes_its_keys_order,
    limits_per_key_outlive_a_reopen,
    a_rate_per_key_allows_so_many_claims_of_each_key_in_any_window,
    a_bad_limit_key_or_per_key_limit_is_refused_and_nothing_is_written,
    a_filter_by_state_finds_a_keys_parked_jobs_and_a_bulk_cancel_takes_them_all,
    an_idle_pool_looks_again_when_a_keys_rate_window_opens_unless_its_queue_has_no_room,
    the_stats_count_the_keys_at_their_limit_and_the_jobs_parked_behind_their_keys,
    the_stats_count_a_key_whose_rate_window_is_spent_as_at_its_limit,
);

/// A job of `key`, its payload naming it.
fn job(key: &str, payload: &str) -> NewJob {
    NewJob::new(Q, payload).limit_key(key)
}

/// The payloads of `leases`, in claim order.
fn payloads(leases: &[Lease]) -> Vec<String> {
    leases
        .iter()
        .map(|l| String::from_utf8_lossy(&l.payload).into_owned())
        .collect()
}

/// The jobs of `Q` in `state`, in id order.
fn jobs_in(f: &Backend, state: JobState) -> Vec<JobId> {
    let filter = JobFilter {
        queue: Some(Q.into()),
        state: Some(state),
        ..JobFilter::default()
    };
    let mut ids: Vec<JobId> = f.jobs(&filter).unwrap().iter().map(|j| j.id()).collect();
    ids.sort();
    ids
}

thread_local! {
    /// The last lease [`claim_all`] took of each job, for [`complete_id`].
    static HELD: std::cell::RefCell<std::collections::HashMap<JobId, Lease>> =
        Default::default();
}

/// Completes the running job `id`'s current attempt, under the lease [`claim_all`] took.
fn complete_id(f: &Backend, id: JobId) {
    let held = HELD.with(|h| h.borrow().get(&id).cloned()).unwrap();
    assert_eq!(f.job(id).unwrap().unwrap().attempt(), held.attempt);
    f.complete(&held, b"").unwrap();
}

/// Claims everything claimable now, by one claim of a big batch.
fn claim_all(f: &Backend, worker: &str) -> Vec<Lease> {
    let leases = f.claim_batch(Q, worker, lease(), 100).unwrap();
    HELD.with(|h| {
        let mut held = h.borrow_mut();
        held.extend(leases.iter().map(|l| (l.job, l.clone())));
    });
    leases
}

fn a_key_at_its_limit_holds_back_only_its_own_jobs(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(2))
        .unwrap();
    for i in 0..5 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
    }
    f.enqueue(job("b", "b0")).unwrap();
    f.enqueue(NewJob::new(Q, "plain")).unwrap();
    f.enqueue(job("b", "b1")).unwrap();
    let first = claim_all(&f, "w");
    // (a1 becomes its key's head as a0 is claimed, in the same claim)
    assert_eq!(payloads(&first), ["a0", "a1", "b0", "plain", "b1"]);
    assert!(claim_all(&f, "w").is_empty(), "each key is at its limit");
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    // an end frees a slot of its own key only
    f.complete(&first[1], b"").unwrap();
    f.enqueue(job("b", "b2")).unwrap();
    assert_eq!(payloads(&claim_all(&f, "w")), ["a2"]);
    f.fail(&first[2], "boom").unwrap();
    let after = claim_all(&f, "w");
    assert_eq!(payloads(&after), ["b2"], "b0 backs off, b2 takes its slot");
    assert_eq!(f.stats().unwrap().total(JobState::Running), 5);
    let b0 = f.job(first[2].job).unwrap().unwrap();
    assert_eq!(b0.limit_key(), Some("b"));
    assert_eq!(b0.state(), JobState::RetryWait);
}

fn a_keys_jobs_go_in_the_order_they_fall_due_and_priority_orders_the_keys(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    f.enqueue(job("a", "a-low").priority(5)).unwrap();
    f.enqueue(job("a", "a-urgent").priority(-5)).unwrap();
    f.enqueue(job("b", "b-urgent").priority(-5)).unwrap();
    f.enqueue(NewJob::new(Q, "plain").priority(1)).unwrap();
    // a's first job is its head (a key's jobs go in the order they fall due), and it
    // stands among the others by its own priority
    let one = |f: &Backend| payloads(&[f.claim(Q, "w", lease()).unwrap().unwrap()]);
    assert_eq!(one(&f), ["b-urgent"]);
    assert_eq!(one(&f), ["plain"]);
    let a = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(payloads(std::slice::from_ref(&a)), ["a-low"]);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.complete(&a, b"").unwrap();
    assert_eq!(one(&f), ["a-urgent"]);
}

fn a_delayed_or_backing_off_job_holds_back_no_due_job_of_its_key(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    let policy = RetryPolicy::fixed(Duration::from_secs(30));
    f.enqueue(job("a", "a0").retry_policy(policy)).unwrap();
    f.enqueue(job("a", "later").delay(Duration::from_secs(600)))
        .unwrap();
    f.enqueue(job("a", "a1")).unwrap();
    let a0 = f.claim_one("w");
    assert_eq!(payloads(std::slice::from_ref(&a0)), ["a0"]);
    f.fail(&a0, "again").unwrap();
    // a0 waits 30 s, `later` 600 s: a1, due now, goes first
    assert_eq!(payloads(&claim_all(&f, "w")), ["a1"]);
    assert!(claim_all(&f, "w").is_empty());
    let a1 = f.job(JobId(a0.job.0 + 2)).unwrap().unwrap();
    assert_eq!(a1.state(), JobState::Running);
    f.advance(Duration::from_secs(30));
    assert!(claim_all(&f, "w").is_empty(), "a1 holds the key's one slot");
    let running = jobs_in(&f, JobState::Running);
    complete_id(&f, running[0]);
    assert_eq!(payloads(&claim_all(&f, "w")), ["a0"]);
    complete_id(&f, a0.job);
    assert!(claim_all(&f, "w").is_empty(), "later is not due");
    f.advance(Duration::from_secs(600));
    assert_eq!(payloads(&claim_all(&f, "w")), ["later"]);
}

fn an_expired_lease_frees_its_keys_slot_by_the_reaper_and_by_takeover(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    for i in 0..3 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
    }
    let a0 = f.claim_one("gone");
    f.advance(LEASE);
    // the reaper takes it back: a0 goes back to its key's order, first, and is claimed
    f.reap().unwrap();
    let again = f.claim_one("w");
    assert_eq!(again.job, a0.job);
    assert!(f.heartbeat(&a0, 1).unwrap_err().is_lease_lost());
    assert!(claim_all(&f, "w").is_empty());
    // takeover: a claim finds the lease expired and the key's slot free again
    f.advance(LEASE);
    let taken = claim_all(&f, "x");
    assert_eq!(taken.len(), 1, "one slot, taken over");
    assert_eq!(taken[0].job, a0.job);
    assert_eq!(f.stats().unwrap().total(JobState::Running), 1);
    // and a claim by name: the expired job comes back to its key's order as its head, and
    // is granted from there (the store checks clean when the test ends)
    f.advance(LEASE);
    let named = f.claim_job(a0.job, "y", lease()).unwrap();
    assert_eq!(named.map(|l| l.job), Some(a0.job));
    assert!(claim_all(&f, "w").is_empty(), "the key's one slot is held");
}

fn a_new_limit_takes_effect_at_once_and_a_lowered_one_at_the_next_claim(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    for i in 0..4 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
    }
    assert_eq!(claim_all(&f, "w").len(), 1);
    f.set_queue_limits(Q, QueueLimits::none().per_key(3))
        .unwrap();
    assert_eq!(payloads(&claim_all(&f, "w")), ["a1", "a2"]);
    f.set_queue_limits(Q, QueueLimits::none()).unwrap();
    assert_eq!(
        payloads(&claim_all(&f, "w")),
        ["a3"],
        "no limit: all of them"
    );
    for i in 4..6 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
    }
    // lowered below what runs: no claim of the key until it is under the limit
    f.set_queue_limits(Q, QueueLimits::none().per_key(2))
        .unwrap();
    assert!(claim_all(&f, "w").is_empty());
    let running = jobs_in(&f, JobState::Running);
    assert_eq!(running.len(), 4);
    complete_id(&f, running[0]);
    complete_id(&f, running[1]);
    assert!(claim_all(&f, "w").is_empty(), "two still run");
    complete_id(&f, running[2]);
    assert_eq!(payloads(&claim_all(&f, "w")), ["a4"]);
    assert_eq!(f.queue_settings(Q).unwrap().limits.per_key, Some(2));
}

fn a_cancelled_or_edited_head_hands_its_place_to_the_next_job_of_its_key(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    let a0 = f.enqueue(job("a", "a0")).unwrap();
    let a1 = f.enqueue(job("a", "a1")).unwrap();
    f.enqueue(job("a", "a2")).unwrap();
    f.cancel(a0).unwrap();
    f.edit(a1, Edit::new().delay(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(payloads(&claim_all(&f, "w")), ["a2"]);
    // an edit that makes a job due again puts it back at its place
    f.edit(a1, Edit::new().now()).unwrap();
    assert!(claim_all(&f, "w").is_empty(), "a2 holds the slot");
    {
        let running = jobs_in(&f, JobState::Running);
        complete_id(&f, running[0])
    };
    assert_eq!(payloads(&claim_all(&f, "w")), ["a1"]);
}

fn a_keyed_job_released_by_its_dependency_or_retried_takes_its_keys_order(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    let first = f.enqueue(NewJob::new("other", "dep")).unwrap();
    let waiter = f.enqueue(job("a", "waiter").after(first)).unwrap();
    let dead = f.enqueue(job("a", "dies").max_attempts(1)).unwrap();
    assert_eq!(f.job(waiter).unwrap().unwrap().state(), JobState::Blocked);
    let dies = f.claim_one("w");
    assert_eq!(dies.job, dead);
    f.fail(&dies, "for good").unwrap();
    let dep = f.claim("other", "w", lease()).unwrap().unwrap();
    f.complete(&dep, b"").unwrap();
    f.retry(dead).unwrap();
    // the waiter was released before the retry: it goes first, and alone
    assert_eq!(payloads(&claim_all(&f, "w")), ["waiter"]);
    complete_id(&f, waiter);
    assert_eq!(payloads(&claim_all(&f, "w")), ["dies"]);
}

fn limits_per_key_outlive_a_reopen(kind: Kind) {
    let mut f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1).concurrency(10))
        .unwrap();
    for i in 0..3 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
    }
    let a0 = f.claim_one("w");
    f.reopen();
    let settings = f.queue_settings(Q).unwrap();
    assert_eq!(settings.limits.per_key, Some(1));
    assert_eq!(settings.limits.concurrency, Some(10));
    // a reopen of a store no process shares takes every lease back
    let running = jobs_in(&f, JobState::Running);
    if running.is_empty() {
        assert_eq!(payloads(&claim_all(&f, "w")), ["a0"]);
    } else {
        assert_eq!(running, [a0.job]);
        assert!(claim_all(&f, "w").is_empty());
    }
}

fn a_bad_limit_key_or_per_key_limit_is_refused_and_nothing_is_written(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    assert!(matches!(
        f.enqueue(job("", "x")),
        Err(Error::Input(InputError::BadLimitKey { len: 0, .. }))
    ));
    assert!(matches!(
        f.enqueue(job(&"k".repeat(257), "x")),
        Err(Error::Input(InputError::BadLimitKey { len: 257, .. }))
    ));
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().per_key(0)),
        Err(Error::Input(InputError::ZeroConcurrency))
    ));
    assert_eq!(f.queue_settings(Q).unwrap().limits, QueueLimits::none());
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
}

/// A store whose queue allows each key `claims` claims in any `per`.
fn rated(kind: Kind, claims: u32, per: Duration) -> Backend {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key_rate(claims, per))
        .unwrap();
    f
}

fn a_rate_per_key_allows_so_many_claims_of_each_key_in_any_window(kind: Kind) {
    let minute = Duration::from_secs(60);
    let f = rated(kind, 2, minute);
    for i in 0..4 {
        f.enqueue(job("a", &format!("a{i}"))).unwrap();
        f.enqueue(job("b", &format!("b{i}"))).unwrap();
    }
    f.enqueue(NewJob::new(Q, "plain")).unwrap();
    let first = claim_all(&f, "w");
    assert_eq!(payloads(&first), ["a0", "b0", "a1", "b1", "plain"]);
    for lease in &first {
        f.complete(lease, b"").unwrap();
    }
    // nothing runs, but each key's window is spent
    assert!(claim_all(&f, "w").is_empty());
    f.advance(Duration::from_secs(59));
    assert!(claim_all(&f, "w").is_empty());
    f.advance(Duration::from_secs(1));
    let second = claim_all(&f, "w");
    assert_eq!(payloads(&second), ["a2", "b2", "a3", "b3"]);
    // a rate and a count at once, each key apart; lifting the rate opens every key at once
    f.enqueue(job("a", "a4")).unwrap();
    f.enqueue(job("a", "a5")).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key_rate(2, minute).per_key(3))
        .unwrap();
    f.advance(Duration::from_secs(30));
    assert!(claim_all(&f, "w").is_empty(), "a's window is spent");
    f.set_queue_limits(Q, QueueLimits::none().per_key(3))
        .unwrap();
    assert_eq!(payloads(&claim_all(&f, "w")), ["a4"], "a runs 2 of 3");
    assert_eq!(
        f.queue_settings(Q).unwrap().limits,
        QueueLimits::none().per_key(3)
    );
    assert!(matches!(
        f.set_queue_limits(Q, QueueLimits::none().per_key_rate(0, minute)),
        Err(Error::Input(InputError::BadRate { .. }))
    ));
}

/// Of a key's waiting jobs only its head stands in the claim order; the others are parked.
/// A listing or a bulk action by state finds them all the same: an operator's "cancel every
/// waiting job of the queue" leaves none of a tenant's backlog behind.
fn a_filter_by_state_finds_a_keys_parked_jobs_and_a_bulk_cancel_takes_them_all(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(1))
        .unwrap();
    for key in ["a", "b", "c"] {
        for i in 0..10 {
            f.enqueue(job(key, &format!("{key}{i}"))).unwrap();
        }
    }
    f.enqueue(NewJob::new(Q, "plain")).unwrap();
    f.enqueue(NewJob::new("other", "elsewhere").limit_key("a"))
        .unwrap();
    let running = f.claim_batch(Q, "w", lease(), 2).unwrap();
    assert_eq!(running.len(), 2);
    assert_eq!(f.stats().unwrap().queues[Q].get(JobState::Queued), 29);
    assert_eq!(
        jobs_in(&f, JobState::Queued).len(),
        29,
        "every waiting job is listed"
    );
    let everywhere = JobFilter {
        state: Some(JobState::Queued),
        ..JobFilter::default()
    };
    assert_eq!(f.jobs(&everywhere).unwrap().len(), 30);
    let report = f
        .cancel_all(&JobFilter {
            queue: Some(Q.into()),
            state: Some(JobState::Queued),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!((report.matched, report.changed), (29, 29));
    assert!(jobs_in(&f, JobState::Queued).is_empty());
    assert_eq!(f.stats().unwrap().queues[Q].get(JobState::Queued), 0);
    for lease in &running {
        f.complete(lease, b"").unwrap();
    }
    assert!(
        claim_all(&f, "w").is_empty(),
        "nothing of the backlog is left to run"
    );
    assert!(f.claim("other", "w", lease()).unwrap().is_some());
}

fn an_idle_pool_looks_again_when_a_keys_rate_window_opens_unless_its_queue_has_no_room(kind: Kind) {
    let window = Duration::from_secs(30);
    let f = rated(kind, 1, window);
    f.enqueue(job("a", "a0")).unwrap();
    f.enqueue(job("a", "a1")).unwrap();
    let a0 = f.claim(Q, "w", lease()).unwrap().unwrap();
    let now = a0.claimed_at;
    // a1 waits for its key's window (30 s), before a0's lease runs out (60 s)
    let due = leasehold::__private::next_due(&*f, Q).unwrap();
    assert_eq!(due, Some(now.saturating_add(window)));
    // a paused queue has no room whatever its keys' windows say: nothing to look for
    f.pause_queue(Q).unwrap();
    assert_eq!(leasehold::__private::next_due(&*f, Q).unwrap(), None);
}

/// `(keys at their limit, parked jobs)` of `Q`, as the store's stats count them.
fn key_gauges(f: &Backend) -> (u64, u64) {
    let stats = f.stats().unwrap();
    let q = &stats.queues[Q];
    (q.keys_at_limit, q.parked)
}

/// What an operator reads to see tenants held back: keys with no room (by their count or
/// their rate window) and the waiting jobs behind their keys, which no claim sees.
fn the_stats_count_the_keys_at_their_limit_and_the_jobs_parked_behind_their_keys(kind: Kind) {
    let f = kind.open();
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, QueueLimits::none().per_key(2))
        .unwrap();
    for (key, n) in [("a", 5), ("b", 1), ("c", 3)] {
        for i in 0..n {
            f.enqueue(job(key, &format!("{key}{i}"))).unwrap();
        }
    }
    f.enqueue(NewJob::new(Q, "plain")).unwrap();
    assert_eq!(
        key_gauges(&f),
        (0, 6),
        "every key has room; all but its head wait parked"
    );
    let running = claim_all(&f, "w");
    assert_eq!(payloads(&running), ["a0", "a1", "b0", "c0", "c1", "plain"]);
    assert_eq!(
        key_gauges(&f),
        (2, 4),
        "a and c run two each: a3 a4 a2 and c2 wait"
    );
    complete_id(&f, running[0].job);
    assert_eq!(
        key_gauges(&f),
        (1, 3),
        "a has room, a2 its head; a3 a4 and c2 wait"
    );
    let blocked = f.stats().unwrap();
    assert_eq!(
        blocked.queues[Q].get(JobState::Queued),
        4,
        "parked jobs are queued jobs"
    );
}

/// A rate's spent window holds a key at its limit with nothing of it running.
fn the_stats_count_a_key_whose_rate_window_is_spent_as_at_its_limit(kind: Kind) {
    let minute = Duration::from_secs(60);
    let f = rated(kind, 1, minute);
    f.enqueue(job("r", "r0")).unwrap();
    f.enqueue(job("r", "r1")).unwrap();
    let first = claim_all(&f, "w");
    f.complete(&first[0], b"").unwrap();
    assert_eq!(key_gauges(&f), (1, 1));
    f.advance(minute);
    assert_eq!(key_gauges(&f).0, 0, "its window has room again");
    assert_eq!(payloads(&claim_all(&f, "w")), ["r1"]);
    assert_eq!(key_gauges(&f), (1, 0));
}
