//! The lease protocol's rules, each a function over a backend, run against the redb store
//! and (where `LEASEHOLD_PG_URL` names a server) the PostgreSQL store twice, with its
//! one-statement shortcuts and without them (the protocol's own steps), all on a manual
//! clock: the same calls must give the same answers, to the nanosecond of store time.
//! Differences between the backends are allowed only where `docs/design.md` ("One protocol,
//! two backends") lists them, and none of these rules is one. (The lease store's own suite,
//! `tests/lease_store`, runs its protocol tests on both backends the same way; these rules
//! are the protocol's summary, each asserted to the nanosecond.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/backends.rs"]
mod backends;
#[path = "support/on_both.rs"]
mod on_both;

use std::time::Duration;

use leasehold::{
    Error, JobState, LeaseTerms, NewJob, Outcome, QueueLimits, ReclaimPath, Renewal, RetryPolicy,
    Schedule, StoreTime,
};
use on_both::{Backend, Kind, LEASE, Q, Setup};

const SEC: u64 = 1_000_000_000;
/// Failed attempts wait exactly this long (no jitter), on both backends.
const BACKOFF: Duration = Duration::from_secs(10);
const REAP_BATCH: usize = 3;

/// A store of `kind` with the rules' settings: backoff without jitter, small reap batches,
/// and (PostgreSQL) every round's completions and claim run at once, in two transactions.
fn conformance(kind: Kind) -> Backend {
    kind.with(
        Setup::default()
            .retry_policy(RetryPolicy::fixed(BACKOFF))
            .reap_batch(REAP_BATCH)
            .side_by_side_from(1),
    )
}

on_both::on_both!(with conformance; and protocol;

    a_claim_takes_the_most_urgent_due_job_and_a_delayed_one_when_its_time_comes,
    an_expired_lease_is_taken_over_on_time_and_every_write_of_the_old_holder_is_refused,
    a_renewal_extends_the_lease_from_now_and_an_expired_lease_is_not_renewed_once_taken,
    the_reaper_takes_back_exactly_the_expired_leases_in_bounded_batches,
    a_failure_backs_off_then_retries_until_the_budget_is_spent,
    a_release_gives_the_job_back_in_its_place_without_spending_budget,
    a_cancel_ends_a_waiting_job_and_tells_a_running_one_at_its_next_renewal,
    a_lease_without_progress_for_its_stall_timeout_is_revoked,
    a_unique_key_dedupes_live_jobs_only_and_blocks_a_retry_while_held,
    a_named_job_is_claimed_only_when_claimable,
    a_batch_of_completions_answers_each_alone,
    a_round_completes_each_alone_and_claims_as_if_the_completions_came_first,
    a_round_whose_batch_refuses_a_job_given_back_still_claims_that_job,
    a_round_whose_batch_refuses_a_job_given_back_at_its_attempt_limit_then_makes_it_dead,
    a_round_whose_only_completion_is_refused_still_claims_its_job_given_back_first,
    a_renewal_after_the_holders_own_end_is_refused_but_not_counted_as_lost,
    stats_count_every_job_by_queue_and_state,
    a_hard_time_limit_caps_the_lease_and_a_renewal_at_the_deadline_ends_the_attempt,
    a_permanent_failure_is_dead_at_once_and_a_snooze_spends_no_budget,
    a_unique_key_kept_after_success_is_given_up_the_instant_its_window_ends,
    a_paused_queue_grants_nothing_and_its_limits_bound_every_claim,
    a_schedule_fires_each_tick_once_at_its_exact_store_time,
);

fn t(b: &Backend) -> u64 {
    b.now().0
}

fn a_claim_takes_the_most_urgent_due_job_and_a_delayed_one_when_its_time_comes(b: Backend) {
    let late = b.enqueue(NewJob::new(Q, "late").priority(5)).unwrap();
    let first = b.enqueue(NewJob::new(Q, "first")).unwrap();
    let second = b.enqueue(NewJob::new(Q, "second")).unwrap();
    let delayed = b
        .enqueue(
            NewJob::new(Q, "delayed")
                .priority(-9)
                .delay(Duration::from_secs(30)),
        )
        .unwrap();
    let order: Vec<_> = b
        .claim_batch(Q, "w", LeaseTerms::new(LEASE), 10)
        .unwrap()
        .iter()
        .map(|l| l.job)
        .collect();
    assert_eq!(order, vec![first, second, late], "priority, then first in");
    b.clock.advance(Duration::from_secs(30));
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!((l.job, l.claimed_at.0), (delayed, 30 * SEC));
    assert_eq!(l.expires_at.0, 90 * SEC);
}

fn an_expired_lease_is_taken_over_on_time_and_every_write_of_the_old_holder_is_refused(b: Backend) {
    let id = b.enqueue(NewJob::new(Q, "x")).unwrap();
    let old = b.claim(Q, "a", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.clock.advance(LEASE - Duration::from_nanos(1000));
    assert!(
        b.claim(Q, "b", LeaseTerms::new(LEASE)).unwrap().is_none(),
        "not yet"
    );
    b.clock.advance(Duration::from_secs(4));
    let new = b.claim(Q, "b", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!((new.job, new.attempt.0), (id, 2));
    let lost = b.heartbeat(&old, 1).unwrap_err();
    let l = lost.lease_lost().unwrap();
    assert_eq!(
        (l.found, l.ended_by_holder),
        (Some((new.attempt, JobState::Running)), false)
    );
    assert!(b.complete(&old, b"late").unwrap_err().is_lease_lost());
    assert!(b.fail(&old, "late").unwrap_err().is_lease_lost());
    assert!(b.release(&old).unwrap_err().is_lease_lost());
    let history = b.history(id).unwrap();
    assert_eq!(
        history[0].outcome(),
        Some(&Outcome::LeaseExpired {
            path: ReclaimPath::Takeover,
            overdue: Duration::from_secs(4) - Duration::from_nanos(1000),
        })
    );
    assert_eq!(history[1].worker(), "b");
    let c = b.stats().unwrap().counters;
    assert_eq!(
        (
            c.reclaimed_by_takeover,
            c.leases_lost,
            c.fenced_writes_rejected
        ),
        (1, 1, 3)
    );
    assert_eq!(
        c.worst_detection_delay,
        LEASE + Duration::from_secs(4) - Duration::from_nanos(1000)
    );
    assert_eq!(b.job(id).unwrap().unwrap().failures(), 1);
}

fn a_renewal_extends_the_lease_from_now_and_an_expired_lease_is_not_renewed_once_taken(b: Backend) {
    let id = b.enqueue(NewJob::new(Q, "x")).unwrap();
    let l = b.claim(Q, "a", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.clock.advance(Duration::from_secs(20));
    assert_eq!(
        b.heartbeat(&l, 7).unwrap(),
        Renewal::Renewed {
            expires_at: StoreTime(80 * SEC)
        }
    );
    let job = b.job(id).unwrap().unwrap();
    assert_eq!((job.progress(), job.progress_at().0), (7, 20 * SEC));
    b.clock.advance(Duration::from_secs(61));
    let taken = b.claim(Q, "b", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(taken.attempt.0, 2);
    assert_eq!(b.history(id).unwrap()[0].progress(), 7);
}

fn the_reaper_takes_back_exactly_the_expired_leases_in_bounded_batches(b: Backend) {
    let ids = b
        .enqueue_batch((0..8).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    let short = b
        .claim_batch(Q, "w", LeaseTerms::new(Duration::from_secs(10)), 7)
        .unwrap();
    let long = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.clock.advance(Duration::from_secs(5));
    b.heartbeat(&short[0], 1).unwrap(); // renewed: now expires at 15 s
    b.clock.advance(Duration::from_secs(6)); // 11 s: six short leases have run out
    let report = b.reap().unwrap();
    let mut taken: Vec<_> = report.reclaimed.iter().map(|r| r.job).collect();
    taken.sort();
    assert_eq!(taken, ids[1..7].to_vec());
    assert!(
        report.largest_batch <= REAP_BATCH && report.batches >= 2,
        "{report:?}"
    );
    assert!(
        report
            .reclaimed
            .iter()
            .all(|r| r.path == ReclaimPath::Reaper
                && r.overdue == Duration::from_secs(1)
                && r.job_state == JobState::Queued)
    );
    assert_eq!(
        b.job(short[0].job).unwrap().unwrap().state(),
        JobState::Running
    );
    assert_eq!(b.job(long.job).unwrap().unwrap().state(), JobState::Running);
    assert!(b.reap().unwrap().reclaimed.is_empty());
    assert_eq!(b.stats().unwrap().counters.reclaimed_by_reaper, 6);
}

fn a_failure_backs_off_then_retries_until_the_budget_is_spent(b: Backend) {
    let id = b.enqueue(NewJob::new(Q, "x").max_attempts(2)).unwrap();
    let first = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(b.fail(&first, "boom").unwrap(), JobState::RetryWait);
    assert_eq!(b.job(id).unwrap().unwrap().run_at().0, 10 * SEC);
    b.clock.advance(BACKOFF - Duration::from_secs(1));
    assert!(b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().is_none());
    b.clock.advance(Duration::from_secs(1));
    let second = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(b.fail(&second, "again").unwrap(), JobState::Dead);
    let job = b.job(id).unwrap().unwrap();
    assert_eq!(
        (
            job.failures(),
            job.last_error(),
            job.finished_at().map(|t| t.0)
        ),
        (2, Some("again"), Some(10 * SEC))
    );
    b.retry(id).unwrap();
    assert_eq!(
        b.claim(Q, "w", LeaseTerms::new(LEASE))
            .unwrap()
            .unwrap()
            .attempt
            .0,
        3
    );
}

fn a_release_gives_the_job_back_in_its_place_without_spending_budget(b: Backend) {
    let first = b.enqueue(NewJob::new(Q, "first")).unwrap();
    b.clock.advance(Duration::from_secs(1));
    let second = b.enqueue(NewJob::new(Q, "second")).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(l.job, first);
    b.release(&l).unwrap();
    let job = b.job(first).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.run_at().0),
        (JobState::Queued, 0, 0)
    );
    // still ahead of the job enqueued after it
    assert_eq!(
        b.claim(Q, "w", LeaseTerms::new(LEASE))
            .unwrap()
            .unwrap()
            .job,
        first
    );
    let _ = second;
    assert_eq!(b.stats().unwrap().counters.released, 1);
}

fn a_cancel_ends_a_waiting_job_and_tells_a_running_one_at_its_next_renewal(b: Backend) {
    let waiting = b.enqueue(NewJob::new(Q, "a").priority(1)).unwrap();
    let running = b.enqueue(NewJob::new(Q, "b")).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(l.job, running);
    assert_eq!(b.cancel(waiting).unwrap(), JobState::Cancelled);
    assert_eq!(b.cancel(running).unwrap(), JobState::Running);
    assert!(b.job(running).unwrap().unwrap().cancel_requested());
    assert_eq!(b.heartbeat(&l, 0).unwrap(), Renewal::Cancelled);
    assert_eq!(
        b.job(running).unwrap().unwrap().state(),
        JobState::Cancelled
    );
    assert_eq!(
        b.history(running).unwrap()[0].outcome(),
        Some(&Outcome::Cancelled)
    );
    assert!(b.complete(&l, b"").unwrap_err().is_lease_lost());
    assert_eq!(
        b.cancel(waiting).unwrap(),
        JobState::Cancelled,
        "idempotent"
    );
}

fn a_lease_without_progress_for_its_stall_timeout_is_revoked(b: Backend) {
    let id = b.enqueue(NewJob::new(Q, "x")).unwrap();
    let terms = LeaseTerms::new(LEASE).stall_timeout(Duration::from_secs(30));
    let l = b.claim(Q, "w", terms).unwrap().unwrap();
    b.clock.advance(Duration::from_secs(20));
    assert!(matches!(
        b.heartbeat(&l, 1).unwrap(),
        Renewal::Renewed { .. }
    ));
    b.clock.advance(Duration::from_secs(29));
    assert!(
        matches!(b.heartbeat(&l, 1).unwrap(), Renewal::Renewed { .. }),
        "29 s still"
    );
    b.clock.advance(Duration::from_secs(1));
    assert_eq!(b.heartbeat(&l, 1).unwrap(), Renewal::Stalled);
    let job = b.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.run_at().0),
        (JobState::RetryWait, 1, t(&b) + 10 * SEC)
    );
    assert_eq!(b.stats().unwrap().counters.stalled, 1);
}

fn a_unique_key_dedupes_live_jobs_only_and_blocks_a_retry_while_held(b: Backend) {
    let first = b
        .enqueue(NewJob::new(Q, "a").unique_key("k").max_attempts(1))
        .unwrap();
    assert_eq!(
        b.enqueue(NewJob::new(Q, "b").unique_key("k")).unwrap(),
        first
    );
    let other_queue = b
        .enqueue(NewJob::new("other", "c").unique_key("k"))
        .unwrap();
    assert_ne!(other_queue, first, "keys are per queue");
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.fail(&l, "x").unwrap(); // dead: the key is free
    let second = b.enqueue(NewJob::new(Q, "d").unique_key("k")).unwrap();
    assert_eq!(
        second.0,
        other_queue.0 + 1,
        "ids are dense when nothing rolls back"
    );
    assert!(matches!(
        b.retry(first),
        Err(Error::UniqueKeyHeld { holder, .. }) if holder == second
    ));
}

fn a_named_job_is_claimed_only_when_claimable(b: Backend) {
    let id = b
        .enqueue(NewJob::new(Q, "x").delay(Duration::from_secs(5)))
        .unwrap();
    let terms = LeaseTerms::new(LEASE);
    assert!(b.claim_job(id, "w", terms).unwrap().is_none(), "not due");
    b.clock.advance(Duration::from_secs(5));
    let l = b.claim_job(id, "w", terms).unwrap().unwrap();
    assert!(b.claim_job(id, "v", terms).unwrap().is_none(), "held");
    b.clock.advance(LEASE);
    let taken = b.claim_job(id, "v", terms).unwrap().unwrap();
    assert_eq!(taken.attempt.0, l.attempt.0 + 1);
    assert!(matches!(
        b.claim_job(leasehold::JobId(999), "v", terms),
        Err(Error::JobNotFound(_))
    ));
}

fn a_batch_of_completions_answers_each_alone(b: Backend) {
    let ids = b
        .enqueue_batch((0..3).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    let mut leases = b.claim_batch(Q, "w", LeaseTerms::new(LEASE), 2).unwrap();
    b.advance(Duration::from_secs(1));
    leases.push(b.claim(Q, "v", LeaseTerms::new(LEASE)).unwrap().unwrap());
    b.complete(&leases[1], b"first").unwrap(); // the second one will be a stale repeat
    b.advance(Duration::from_secs(1));
    // Not in the jobs' order: each answer is still its own.
    let answers = b.complete_batch(&[
        (&leases[2], b"c".as_slice()),
        (&leases[1], b"again".as_slice()),
        (&leases[0], b"a".as_slice()),
    ]);
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    let refused = answers[1].as_ref().unwrap_err().lease_lost().unwrap();
    assert!(refused.ended_by_holder);
    assert_eq!(b.output(ids[1]).unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(b.output(ids[2]).unwrap().as_deref(), Some(&b"c"[..]));
    assert_eq!(b.stats().unwrap().counters.fenced_writes_rejected, 1);
    // Each history row names its own attempt's holder and claim, ended at the batch's time.
    for (i, lease) in [(0, &leases[0]), (2, &leases[2])] {
        let history = b.history(ids[i]).unwrap();
        let run = &history[0];
        assert_eq!(
            (
                run.worker(),
                run.claimed_at(),
                run.ended_at(),
                run.outcome()
            ),
            (
                lease.worker.as_str(),
                lease.claimed_at,
                Some(
                    lease
                        .claimed_at
                        .saturating_add(Duration::from_secs(if i == 0 { 2 } else { 1 }))
                ),
                Some(&Outcome::Succeeded)
            ),
            "job {i}"
        );
    }
}

/// A pool's round: its completions, then a claim. Two of the completions are of leases that
/// ran out unnoticed (nobody took them: the fence holds, so they complete), one is a stale
/// repeat (refused). The claim must not take over the leases its own round completes: it
/// takes the one waiting job, at the round's store time.
fn a_round_completes_each_alone_and_claims_as_if_the_completions_came_first(b: Backend) {
    let ids = b
        .enqueue_batch((0..4).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    let leases = b.claim_batch(Q, "w", LeaseTerms::new(LEASE), 3).unwrap();
    b.complete(&leases[1], b"first").unwrap();
    b.advance(LEASE);
    let done = [
        (&leases[0], b"a".as_slice()),
        (&leases[1], b"again".as_slice()),
        (&leases[2], b"c".as_slice()),
    ];
    let (completed, claimed) = b.complete_batch_and_claim(&done, Q, "v", LeaseTerms::new(LEASE), 3);
    assert!(
        completed[0].is_ok() && completed[2].is_ok(),
        "{completed:?}"
    );
    assert!(
        completed[1]
            .as_ref()
            .unwrap_err()
            .lease_lost()
            .unwrap()
            .ended_by_holder
    );
    let claimed = claimed.unwrap();
    let got: Vec<_> = claimed.iter().map(|l| (l.job, l.attempt.0)).collect();
    assert_eq!(got, vec![(ids[3], 1)]);
    assert_eq!(claimed[0].expires_at.0, t(&b) + 60 * SEC);
    assert_eq!(b.output(ids[0]).unwrap().as_deref(), Some(&b"a"[..]));
    assert_eq!(b.output(ids[2]).unwrap().as_deref(), Some(&b"c"[..]));
    let c = b.stats().unwrap().counters;
    assert_eq!((c.fenced_writes_rejected, c.reclaimed_by_takeover), (1, 0));
    // Bad claim input writes nothing: the completions are refused with it.
    let fresh = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap();
    assert!(fresh.is_none());
    let (completed, claimed) =
        b.complete_batch_and_claim(&[(&claimed[0], b"x")], "", "v", LeaseTerms::new(LEASE), 1);
    assert!(claimed.is_err() && completed[0].is_err());
    assert_eq!(
        b.job(ids[3]).unwrap().unwrap().state(),
        leasehold::JobState::Running
    );
}

/// A round whose batch of completions holds a stale one, of a job its holder gave back and
/// that waits in the queue: the claim beside it still takes that job first, as if the
/// completions had committed first, and the stale completion alone is refused. (No lease
/// has expired, so on PostgreSQL only finding the job among those being completed makes
/// the claim wait for them to commit before it decides.)
fn a_round_whose_batch_refuses_a_job_given_back_still_claims_that_job(b: Backend) {
    let ids = b
        .enqueue_batch((0..4).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    let leases = b.claim_batch(Q, "w", LeaseTerms::new(LEASE), 3).unwrap();
    b.release(&leases[0]).unwrap();
    let done = [
        (&leases[0], b"a".as_slice()),
        (&leases[1], b"b".as_slice()),
        (&leases[2], b"c".as_slice()),
    ];
    let (completed, claimed) = b.complete_batch_and_claim(&done, Q, "v", LeaseTerms::new(LEASE), 2);
    assert!(
        completed[1].is_ok() && completed[2].is_ok(),
        "{completed:?}"
    );
    assert!(
        completed[0]
            .as_ref()
            .unwrap_err()
            .lease_lost()
            .unwrap()
            .ended_by_holder
    );
    let got: Vec<_> = claimed
        .unwrap()
        .iter()
        .map(|l| (l.job, l.attempt.0))
        .collect();
    assert_eq!(got, vec![(ids[0], 2), (ids[3], 1)]);
    assert_eq!(b.output(ids[1]).unwrap().as_deref(), Some(&b"b"[..]));
    assert_eq!(b.output(ids[0]).unwrap(), None);
    assert_eq!(b.stats().unwrap().counters.fenced_writes_rejected, 1);
}

/// As above, but the job given back is at its attempt limit: the claim beside the batch
/// makes it dead rather than taking it, and the stale completion is refused finding it
/// waiting, as if the completions had committed first (on PostgreSQL, a claim that made one
/// of the round's jobs dead rolls back, waits for them, and claims again).
fn a_round_whose_batch_refuses_a_job_given_back_at_its_attempt_limit_then_makes_it_dead(
    mut b: Backend,
) {
    let ids = b
        .enqueue_batch((0..3).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    b.forge_attempt(ids[0], u32::MAX - 1);
    let leases = b.claim_batch(Q, "w", LeaseTerms::new(LEASE), 2).unwrap();
    assert_eq!(leases[0].attempt.0, u32::MAX);
    b.release(&leases[0]).unwrap();
    let done = [(&leases[0], b"a".as_slice()), (&leases[1], b"b".as_slice())];
    let (completed, claimed) = b.complete_batch_and_claim(&done, Q, "v", LeaseTerms::new(LEASE), 2);
    assert!(completed[1].is_ok(), "{completed:?}");
    let refused = completed[0].as_ref().unwrap_err().lease_lost().unwrap();
    assert_eq!(
        (refused.found, refused.ended_by_holder),
        (Some((leases[0].attempt, JobState::Queued)), true),
        "{refused:?}"
    );
    let got: Vec<_> = claimed
        .unwrap()
        .iter()
        .map(|l| (l.job, l.attempt.0))
        .collect();
    assert_eq!(got, vec![(ids[2], 1)]);
    assert_eq!(b.job(ids[0]).unwrap().unwrap().state(), JobState::Dead);
    assert_eq!(b.output(ids[0]).unwrap(), None);
    assert_eq!(b.stats().unwrap().counters.fenced_writes_rejected, 1);
    b.close_unchecked();
}

/// A round whose one completion (written alone, not in the batch statement) is refused, its
/// job given back since, beside a claim of one from that job's queue: the claim takes that
/// job, the most urgent, as if the completion had come first. (On PostgreSQL the refusal
/// locks the job's row; taken before the claim has taken its jobs, the claim would pass
/// over it to the next. Whichever transaction is first is a race, so it runs many times.)
fn a_round_whose_only_completion_is_refused_still_claims_its_job_given_back_first(b: Backend) {
    for round in 0..25 {
        let q = format!("given-back-{round}");
        let first = b.enqueue(NewJob::new(&q, "first")).unwrap();
        let next = b.enqueue(NewJob::new(&q, "next")).unwrap();
        let stale = b.claim(&q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
        b.release(&stale).unwrap();
        let done = [(&stale, b"a".as_slice())];
        let (completed, claimed) =
            b.complete_batch_and_claim(&done, &q, "v", LeaseTerms::new(LEASE), 1);
        assert!(completed[0].as_ref().unwrap_err().lease_lost().is_some());
        let got: Vec<_> = claimed
            .unwrap()
            .iter()
            .map(|l| (l.job, l.attempt.0))
            .collect();
        assert_eq!(
            got,
            vec![(first, 2)],
            "round {round}; {next:?} waits behind it"
        );
    }
    assert_eq!(b.stats().unwrap().counters.fenced_writes_rejected, 25);
}

fn a_renewal_after_the_holders_own_end_is_refused_but_not_counted_as_lost(b: Backend) {
    b.enqueue(NewJob::new(Q, "x")).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.complete(&l, b"").unwrap();
    let refused = b.heartbeat(&l, 1).unwrap_err();
    assert!(refused.lease_lost().unwrap().ended_by_holder);
    let c = b.stats().unwrap().counters;
    assert_eq!((c.leases_lost, c.fenced_writes_rejected), (0, 0));
}

fn stats_count_every_job_by_queue_and_state(b: Backend) {
    b.enqueue_batch((0..4).map(|i| NewJob::new(Q, format!("{i}"))).collect())
        .unwrap();
    b.enqueue(NewJob::new("other", "x").delay(Duration::from_secs(60)))
        .unwrap();
    let leases = b.claim_batch(Q, "w", LeaseTerms::new(LEASE), 3).unwrap();
    b.complete(&leases[0], b"").unwrap();
    b.fail(&leases[1], "x").unwrap();
    let stats = b.stats().unwrap();
    let q = &stats.queues[Q];
    assert_eq!(
        [
            JobState::Queued,
            JobState::Running,
            JobState::RetryWait,
            JobState::Succeeded
        ]
        .map(|s| q.get(s)),
        [1, 1, 1, 1]
    );
    assert_eq!(stats.queues["other"].get(JobState::Queued), 1);
    assert_eq!(stats.now, b.now());
}

fn a_hard_time_limit_caps_the_lease_and_a_renewal_at_the_deadline_ends_the_attempt(b: Backend) {
    let limit = Duration::from_secs(30);
    let id = b.enqueue(NewJob::new(Q, "x").time_limit(limit)).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(
        (l.expires_at.0, l.deadline.map(|d| d.0)),
        (30 * SEC, Some(30 * SEC))
    );
    b.clock.advance(Duration::from_secs(20));
    assert_eq!(
        b.heartbeat(&l, 1).unwrap(),
        Renewal::Renewed {
            expires_at: StoreTime(30 * SEC)
        }
    );
    b.clock.advance(Duration::from_nanos(10 * SEC - 1));
    assert!(matches!(
        b.heartbeat(&l, 2).unwrap(),
        Renewal::Renewed { .. }
    ));
    b.clock.advance(Duration::from_nanos(1));
    assert_eq!(b.heartbeat(&l, 3).unwrap(), Renewal::TimedOut);
    let job = b.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.run_at().0),
        (JobState::RetryWait, 1, 40 * SEC)
    );
    assert_eq!(
        b.history(id).unwrap()[0].outcome(),
        Some(&Outcome::TimedOut { limit })
    );
    assert_eq!(b.stats().unwrap().counters.timed_out, 1);
}

fn a_permanent_failure_is_dead_at_once_and_a_snooze_spends_no_budget(b: Backend) {
    let doomed = b.enqueue(NewJob::new(Q, "a").max_attempts(5)).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    assert_eq!(b.fail_permanently(&l, "gone").unwrap(), JobState::Dead);
    let job = b.job(doomed).unwrap().unwrap();
    assert_eq!(
        (job.failures(), job.finished_at().map(|t| t.0)),
        (1, Some(0))
    );
    let later = b.enqueue(NewJob::new(Q, "b")).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.clock.advance(Duration::from_secs(5));
    assert_eq!(
        b.snooze(&l, Duration::from_secs(7)).unwrap(),
        JobState::Queued
    );
    let job = b.job(later).unwrap().unwrap();
    assert_eq!((job.failures(), job.run_at().0), (0, 12 * SEC));
    assert_eq!(
        b.history(later).unwrap()[0].outcome(),
        Some(&Outcome::Snoozed {
            delay: Duration::from_secs(7)
        })
    );
    b.clock.advance(Duration::from_nanos(7 * SEC - 1));
    assert!(b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().is_none());
    b.clock.advance(Duration::from_nanos(1));
    assert_eq!(
        b.claim(Q, "w", LeaseTerms::new(LEASE))
            .unwrap()
            .unwrap()
            .job,
        later
    );
    assert_eq!(b.stats().unwrap().counters.snoozed, 1);
}

fn a_unique_key_kept_after_success_is_given_up_the_instant_its_window_ends(b: Backend) {
    let kept = || {
        NewJob::new(Q, "r")
            .unique_key("k")
            .unique_for(Duration::from_secs(100))
    };
    let first = b.enqueue(kept()).unwrap();
    let l = b.claim(Q, "w", LeaseTerms::new(LEASE)).unwrap().unwrap();
    b.complete(&l, b"").unwrap();
    b.clock.advance(Duration::from_nanos(100 * SEC - 1));
    assert_eq!(b.enqueue(kept()).unwrap(), first);
    b.clock.advance(Duration::from_nanos(1));
    let second = b.enqueue(kept()).unwrap();
    assert_ne!(second, first);
    assert_eq!(b.enqueue(kept()).unwrap(), second);
}

fn a_paused_queue_grants_nothing_and_its_limits_bound_every_claim(b: Backend) {
    b.enqueue_n(6);
    // (leases that outlast the test: none frees its slot by running out)
    let terms = LeaseTerms::new(Duration::from_secs(3600));
    b.pause_queue(Q).unwrap();
    assert!(b.claim_batch(Q, "w", terms, 5).unwrap().is_empty());
    b.resume_queue(Q).unwrap();
    b.set_queue_limits(
        Q,
        QueueLimits::none()
            .concurrency(2)
            .rate(3, Duration::from_secs(60)),
    )
    .unwrap();
    let two = b.claim_batch(Q, "w", terms, 5).unwrap();
    assert_eq!(two.len(), 2, "the concurrency limit");
    b.complete(&two[0], b"").unwrap();
    let third = b.claim_batch(Q, "w", terms, 5).unwrap();
    assert_eq!(third.len(), 1);
    b.complete(&two[1], b"").unwrap();
    assert!(
        b.claim_batch(Q, "w", terms, 5).unwrap().is_empty(),
        "three claims in the window: the rate limit"
    );
    b.clock.advance(Duration::from_nanos(60 * SEC - 1));
    assert!(b.claim_batch(Q, "w", terms, 5).unwrap().is_empty());
    b.clock.advance(Duration::from_nanos(1));
    assert_eq!(
        b.claim_batch(Q, "w", terms, 5).unwrap().len(),
        1,
        "one slot free"
    );
}

fn a_schedule_fires_each_tick_once_at_its_exact_store_time(b: Backend) {
    let wall = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let every = Duration::from_secs(10);
    b.declare_schedule(Schedule::every("s", every, NewJob::new(Q, "tick")))
        .unwrap();
    b.clock.advance(Duration::from_nanos(10 * SEC - 1));
    assert!(b.fire_schedules_at(wall).unwrap().is_empty());
    b.clock.advance(Duration::from_nanos(1));
    let fired = b.fire_schedules_at(wall).unwrap();
    assert_eq!(fired.len(), 1);
    assert!(b.fire_schedules_at(wall).unwrap().is_empty());
    let job = b.job(fired[0]).unwrap().unwrap();
    assert_eq!(
        (job.unique_key(), job.created_at().0),
        (Some(format!("schedule:s:t{}", 10 * SEC).as_str()), 10 * SEC)
    );
    b.clock.advance(Duration::from_secs(25));
    assert_eq!(
        b.fire_schedules_at(wall).unwrap().len(),
        1,
        "two missed, one job"
    );
    let info = &b.schedules().unwrap()[0];
    assert_eq!(
        (info.fired(), info.skipped(), info.next_tick()),
        (2, 1, leasehold::Tick::Store(StoreTime(40 * SEC)))
    );
}
