use std::time::Duration;

use leasehold::{Attempt, Error, JobState, NewJob, Outcome, Renewal};

use crate::backends::AppWrite;
use crate::on_both::{Backend, Kind, LEASE, Q, Setup, lease};

crate::on_both::on_both!(
    and protocol;
    heartbeat_extends_the_lease_by_its_length_from_now,
    heartbeat_without_progress_keeps_the_progress_time,
    heartbeat_by_a_stale_attempt_is_rejected_with_what_was_found,
    complete_fail_and_release_by_a_stale_attempt_change_nothing,
    a_finished_job_refuses_its_own_holder_a_second_time,
    a_late_heartbeat_before_any_reclaim_still_renews,
    heartbeat_batch_renews_many_in_one_call_and_fails_only_stale_entries,
    heartbeat_batch_answers_in_the_callers_order_whatever_the_order_of_the_jobs,
    complete_with_commits_the_application_write_with_the_completion,
    complete_with_rolls_back_the_application_write_when_the_fence_fails,
    complete_with_rolls_back_the_completion_when_the_application_write_fails,
    transactional_enqueue_commits_with_the_application_write_or_not_at_all,
    history_records_each_outcome_once_per_attempt,
    complete_batch_commits_every_held_completion_in_one_commit_and_refuses_a_lost_one_alone,
    a_renewal_after_the_holders_own_end_is_refused_but_not_counted_as_lost,
    a_renewal_after_a_reclaim_is_counted_as_a_lost_lease,
    a_follow_up_job_commits_with_the_completion,
    a_fenced_out_completion_commits_no_follow_up_job,
    a_follow_up_job_that_is_refused_rolls_the_completion_back,
    a_job_whose_attempt_counter_is_exhausted_is_dead_never_leased_with_an_equal_fence,
    a_completion_repeated_within_one_batch_commits_once_and_the_repeat_is_refused,
    a_stale_completion_before_the_live_one_in_a_batch_is_answered_as_if_alone_and_first,
);

/// A job taken from `a` by the reaper and claimed by `b`: returns (stale, live) leases.
fn reclaimed_pair(f: &Backend) -> (leasehold::Lease, leasehold::Lease) {
    f.enqueue_n(1);
    let stale = f.claim_one("a");
    f.advance(LEASE);
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
    let live = f.claim_one("b");
    assert_eq!(live.job, stale.job);
    (stale, live)
}

fn heartbeat_extends_the_lease_by_its_length_from_now(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.advance(Duration::from_secs(20));
    let r = f.heartbeat(&l, 7).unwrap();
    let expected = f.now().saturating_add(LEASE);
    assert_eq!(
        r,
        Renewal::Renewed {
            expires_at: expected
        }
    );
    let job = f.job(l.job).unwrap().unwrap();
    assert_eq!(job.lease().unwrap().expires_at(), expected);
    assert_eq!(job.progress(), 7);
    assert_eq!(job.progress_at(), f.now());
}

fn heartbeat_without_progress_keeps_the_progress_time(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.advance(Duration::from_secs(5));
    f.heartbeat(&l, 3).unwrap();
    let advanced_at = f.now();
    f.advance(Duration::from_secs(5));
    f.heartbeat(&l, 3).unwrap();
    assert_eq!(f.job(l.job).unwrap().unwrap().progress_at(), advanced_at);
}

fn heartbeat_by_a_stale_attempt_is_rejected_with_what_was_found(kind: Kind) {
    let f = kind.open();
    let (stale, live) = reclaimed_pair(&f);
    let before = f.job(live.job).unwrap();
    match f.heartbeat(&stale, 99) {
        Err(Error::LeaseLost(lost)) => {
            assert_eq!(lost.job, stale.job);
            assert_eq!(lost.attempt, Attempt(1));
            assert_eq!(lost.found, Some((Attempt(2), JobState::Running)));
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(f.job(live.job).unwrap(), before, "nothing changed");
    assert_eq!(f.stats().unwrap().counters.leases_lost, 1);
}

fn complete_fail_and_release_by_a_stale_attempt_change_nothing(kind: Kind) {
    let f = kind.open();
    let (stale, live) = reclaimed_pair(&f);
    let job_before = f.job(live.job).unwrap();
    let history_before = f.history(live.job).unwrap();
    let stats_before = f.stats().unwrap();

    assert!(
        f.complete(&stale, b"stale output")
            .unwrap_err()
            .is_lease_lost()
    );
    assert!(f.fail(&stale, "stale failure").unwrap_err().is_lease_lost());
    assert!(f.release(&stale).unwrap_err().is_lease_lost());

    assert_eq!(f.job(live.job).unwrap(), job_before);
    assert_eq!(f.history(live.job).unwrap(), history_before);
    assert_eq!(f.output(live.job).unwrap(), None);
    let stats = f.stats().unwrap();
    assert_eq!(stats.queues, stats_before.queues);
    assert_eq!(stats.counters.fenced_writes_rejected, 3);
    // the live holder is unaffected
    f.complete(&live, b"live output").unwrap();
    assert_eq!(
        f.output(live.job).unwrap().as_deref(),
        Some(&b"live output"[..])
    );
}

fn a_finished_job_refuses_its_own_holder_a_second_time(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.complete(&l, b"once").unwrap();
    let err = f.complete(&l, b"twice").unwrap_err();
    match err {
        Error::LeaseLost(lost) => assert_eq!(lost.found, Some((Attempt(1), JobState::Succeeded))),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(f.output(l.job).unwrap().as_deref(), Some(&b"once"[..]));
}

fn a_late_heartbeat_before_any_reclaim_still_renews(kind: Kind) {
    // Expired but not yet reclaimed: the lease is still the holder's (nobody else has it).
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.advance(LEASE + Duration::from_secs(5));
    assert!(matches!(
        f.heartbeat(&l, 1).unwrap(),
        Renewal::Renewed { .. }
    ));
    assert_eq!(f.reap().unwrap().reclaimed.len(), 0);
}

fn heartbeat_batch_renews_many_in_one_call_and_fails_only_stale_entries(kind: Kind) {
    let f = kind.open();
    let (stale, live) = reclaimed_pair(&f);
    f.enqueue_n(3);
    let others: Vec<_> = (0..3).map(|_| f.claim_one("b")).collect();
    let mut beats = vec![(&stale, 1), (&live, 2)];
    beats.extend(others.iter().map(|l| (l, 5)));
    let results = f.heartbeat_batch(&beats);
    assert_eq!(results.len(), 5);
    assert!(results[0].as_ref().unwrap_err().is_lease_lost());
    for r in &results[1..] {
        assert!(matches!(r, Ok(Renewal::Renewed { .. })));
    }
    assert_eq!(f.job(live.job).unwrap().unwrap().progress(), 2);
    assert_eq!(f.stats().unwrap().counters.leases_lost, 1);
}

fn heartbeat_batch_answers_in_the_callers_order_whatever_the_order_of_the_jobs(kind: Kind) {
    let f = kind.open();
    let (stale, live) = reclaimed_pair(&f);
    f.enqueue_n(3);
    let others: Vec<_> = (0..3).map(|_| f.claim_one("b")).collect();
    // Highest job first, the stale lease last, each with its own progress.
    let mut beats: Vec<_> = others.iter().rev().zip([7, 8, 9]).collect();
    beats.push((&live, 2));
    beats.push((&stale, 1));
    let results = f.heartbeat_batch(&beats);
    assert_eq!(results.len(), 5);
    assert!(
        results[..4]
            .iter()
            .all(|r| matches!(r, Ok(Renewal::Renewed { .. })))
    );
    assert!(results[4].as_ref().unwrap_err().is_lease_lost());
    for (lease, progress) in &beats[..4] {
        assert_eq!(f.job(lease.job).unwrap().unwrap().progress(), *progress);
    }
}

fn complete_with_commits_the_application_write_with_the_completion(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.complete_with_app(&l, b"ok", &AppWrite::new("photo-1", 42))
        .unwrap();
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(f.app_value("photo-1"), Some(42));
}

fn complete_with_rolls_back_the_application_write_when_the_fence_fails(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    let (stale, live) = reclaimed_pair(&f);
    let app = AppWrite::new("photo-1", 1);
    let err = f.complete_with_app(&stale, b"stale", &app).unwrap_err();
    assert!(err.is_lease_lost());
    assert!(!app.ran.get(), "the application's write never ran");
    assert_eq!(f.app_value("photo-1"), None);
    assert_eq!(f.job(live.job).unwrap().unwrap().state(), JobState::Running);
}

fn complete_with_rolls_back_the_completion_when_the_application_write_fails(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    f.enqueue_n(1);
    let l = f.claim_one("w");
    let app = AppWrite {
        then_fail: true,
        ..AppWrite::new("photo-1", 7)
    };
    let err = f.complete_with_app(&l, b"ok", &app).unwrap_err();
    match err {
        Error::Application(e) => assert_eq!(e.to_string(), AppWrite::FAILURE),
        other => panic!("expected the application's error, got {other:?}"),
    }
    assert_eq!(f.app_value("photo-1"), None);
    let job = f.job(l.job).unwrap().unwrap();
    assert_eq!(
        job.state(),
        JobState::Running,
        "the completion rolled back too"
    );
    assert!(f.history(l.job).unwrap()[0].outcome().is_none());
    f.complete(&l, b"second try").unwrap();
}

fn transactional_enqueue_commits_with_the_application_write_or_not_at_all(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    let id = f
        .transaction_app(&AppWrite {
            follow_up: Some(NewJob::new(Q, "ship order-1")),
            ..AppWrite::new("order-1", 1)
        })
        .unwrap()
        .expect("the job's id");
    assert_eq!(f.app_value("order-1"), Some(1));
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Queued);

    let err = f
        .transaction_app(&AppWrite {
            follow_up: Some(NewJob::new(Q, "ship order-2")),
            then_fail: true,
            ..AppWrite::new("order-2", 2)
        })
        .unwrap_err();
    assert!(matches!(err, Error::Application(_)), "{err:?}");
    assert_eq!(f.app_value("order-2"), None);
    assert_eq!(
        f.stats().unwrap().total(JobState::Queued),
        1,
        "the second job rolled back"
    );
}

fn history_records_each_outcome_once_per_attempt(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let l1 = f.claim_one("a");
    f.fail(&l1, "boom").unwrap();
    f.advance(Duration::from_secs(10));
    let l2 = f.claim_one("b");
    f.release(&l2).unwrap();
    let l3 = f.claim_one("c");
    f.heartbeat(&l3, 9).unwrap();
    f.complete(&l3, b"").unwrap();
    let outcomes: Vec<_> = f
        .history(id)
        .unwrap()
        .into_iter()
        .map(|r| {
            let outcome = r.outcome().cloned().unwrap();
            (r.attempt().0, r.worker().to_owned(), outcome, r.progress())
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (1, "a".into(), Outcome::Failed("boom".into()), 0),
            (2, "b".into(), Outcome::Released, 0),
            (3, "c".into(), Outcome::Succeeded, 9),
        ]
    );
}

fn complete_batch_commits_every_held_completion_in_one_commit_and_refuses_a_lost_one_alone(
    kind: Kind,
) {
    let f = kind.with(Setup::default().max_payload(16));
    let ids = f.enqueue_n(4);
    let leases = f.claim_batch(Q, "w", lease(), 4).unwrap();
    // The middle job's lease is lost: it expires and another worker takes it over.
    f.advance(LEASE);
    let taken = f
        .claim_job(ids[1], "other", lease())
        .unwrap()
        .expect("takeover");
    let writes = f.write_transactions();
    let results = f.complete_batch(&[
        (&leases[0], b"a".as_slice()),
        (&leases[1], b"b".as_slice()),
        (&leases[2], b"c".as_slice()),
        (&leases[3], [0u8; 17].as_slice()),
    ]);
    assert_eq!(f.write_transactions(), writes.map(|w| w + 1), "one commit");
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(results[1].as_ref().unwrap_err().is_lease_lost());
    assert!(
        matches!(results[3], Err(Error::Input(_))),
        "an output over the limit is refused alone: {results:?}"
    );
    assert_eq!(f.job(ids[3]).unwrap().unwrap().state(), JobState::Running);
    for (i, output) in [(0, b"a"), (2, b"c")] {
        assert_eq!(f.job(ids[i]).unwrap().unwrap().state(), JobState::Succeeded);
        assert_eq!(f.output(ids[i]).unwrap().unwrap(), output);
    }
    let held = f.job(ids[1]).unwrap().unwrap();
    assert_eq!(
        (held.state(), held.attempt()),
        (JobState::Running, taken.attempt)
    );
    assert!(f.output(ids[1]).unwrap().is_none());
}

fn a_renewal_after_the_holders_own_end_is_refused_but_not_counted_as_lost(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(3);
    let done = f.claim_one("w");
    let failed = f.claim_one("w");
    let released = f.claim_one("w");
    f.complete(&done, b"ok").unwrap();
    f.fail(&failed, "no").unwrap();
    f.release(&released).unwrap();
    for lease in [&done, &failed, &released] {
        let lost = f.heartbeat(lease, 1).unwrap_err();
        let lost = lost.lease_lost().expect("refused by the fence");
        assert!(lost.ended_by_holder, "{lost}");
    }
    // a completion retried after its first commit landed is refused the same way
    let again = f.complete(&done, b"ok").unwrap_err();
    assert!(again.lease_lost().unwrap().ended_by_holder);
    let counters = f.stats().unwrap().counters;
    assert_eq!(counters.leases_lost, 0, "no renewal found a lost lease");
    assert_eq!(counters.fenced_writes_rejected, 1, "the refused completion");
}

fn a_renewal_after_a_reclaim_is_counted_as_a_lost_lease(kind: Kind) {
    let f = kind.open();
    let (stale, _live) = reclaimed_pair(&f);
    let lost = f.heartbeat(&stale, 1).unwrap_err();
    assert!(!lost.lease_lost().unwrap().ended_by_holder);
    // the attempt the reaper ended is not the holder's own end, even once nobody holds it
    f.enqueue_n(1);
    let l = f.claim_one("x");
    f.advance(LEASE);
    f.reap().unwrap();
    assert!(
        !f.heartbeat(&l, 1)
            .unwrap_err()
            .lease_lost()
            .unwrap()
            .ended_by_holder
    );
    assert_eq!(f.stats().unwrap().counters.leases_lost, 2);
}

fn a_follow_up_job_commits_with_the_completion(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    f.enqueue_n(1);
    let l = f.claim_one("w");
    let next = f
        .complete_with_app(
            &l,
            b"thumbnail",
            &AppWrite {
                follow_up: Some(NewJob::new("upload", "photo-1")),
                ..AppWrite::new("photo-1", 1)
            },
        )
        .unwrap()
        .expect("the follow-up was enqueued");
    assert_eq!(f.job(next).unwrap().unwrap().state(), JobState::Queued);
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Succeeded);
    assert_eq!(f.app_value("photo-1"), Some(1));
}

fn a_fenced_out_completion_commits_no_follow_up_job(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    let (stale, live) = reclaimed_pair(&f);
    let upload = || AppWrite {
        follow_up: Some(NewJob::new("upload", "photo-1")),
        ..AppWrite::new("photo-1", 1)
    };
    let err = f.complete_with_app(&stale, b"late", &upload()).unwrap_err();
    assert!(err.is_lease_lost());
    assert!(
        !f.stats().unwrap().queues.contains_key("upload"),
        "no follow-up job exists"
    );
    // the live holder's follow-up does commit, once
    f.complete_with_app(&live, b"ok", &upload()).unwrap();
    assert_eq!(f.stats().unwrap().queues["upload"].total(), 1);
}

fn a_follow_up_job_that_is_refused_rolls_the_completion_back(kind: Kind) {
    let f = kind.open();
    if !f.has_application_tables() {
        return; // (what commits with a completion is the application's tables' to hold)
    }
    f.enqueue_n(1);
    let l = f.claim_one("w");
    let err = f
        .complete_with_app(
            &l,
            b"ok",
            &AppWrite {
                follow_up: Some(NewJob::new("", "no queue")),
                ..AppWrite::new("photo-1", 1)
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::Input(_)), "{err:?}");
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Running);
    assert_eq!(f.app_value("photo-1"), None);
}

/// A job whose attempt counter is exhausted (four billion claims) is never leased again with
/// an equal fence: it is dead, with the reason, on both engines (once PostgreSQL's claims
/// passed it over and left it waiting forever; the rule book decides it once now).
fn a_job_whose_attempt_counter_is_exhausted_is_dead_never_leased_with_an_equal_fence(kind: Kind) {
    let mut f = kind.with(Setup::default().default_max_attempts(u32::MAX));
    let id = f.enqueue_n(1)[0];
    f.forge_attempt(id, u32::MAX - 1);
    let last = f.claim_one("a");
    assert_eq!(last.attempt, Attempt(u32::MAX));
    f.advance(LEASE);
    // the takeover would need attempt u32::MAX + 1: nobody gets the job
    assert!(f.claim(Q, "b", lease()).unwrap().is_none());
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(job.attempt(), Attempt(u32::MAX));
    assert_eq!(job.state(), JobState::Dead);
    assert!(
        job.last_error()
            .unwrap()
            .contains("attempt counter is exhausted")
    );
    // the last holder's late completion is refused: nobody holds attempt u32::MAX now
    assert!(f.complete(&last, b"late").unwrap_err().is_lease_lost());
    // a waiting job at the limit is made dead by the claim that reaches it, which moves on
    let other = f.enqueue_n(2);
    f.forge_attempt(other[0], u32::MAX);
    let next = f.claim_one("c");
    assert_eq!(next.job, other[1]);
    assert_eq!(f.job(other[0]).unwrap().unwrap().state(), JobState::Dead);
    assert!(f.claim_job(other[0], "c", lease()).unwrap().is_none());
    // and one named by a claim of it alone
    let named = f.enqueue_n(1)[0];
    f.forge_attempt(named, u32::MAX);
    assert!(f.claim_job(named, "c", lease()).unwrap().is_none());
    assert_eq!(f.job(named).unwrap().unwrap().state(), JobState::Dead);
    // The forged records claim attempts that have no history; the check says exactly that,
    // of those two jobs and no other.
    let problems = f.check().unwrap().problems;
    let job_of = |p: &str| {
        p.split(|c: char| !c.is_ascii_digit())
            .find(|n| !n.is_empty())
            .and_then(|n| n.parse::<u64>().ok())
    };
    assert!(!problems.is_empty());
    assert!(
        problems.iter().all(|p| p.contains("history")
            && [Some(id.0), Some(other[0].0), Some(named.0)].contains(&job_of(p))),
        "{problems:?}"
    );
    f.close_unchecked(); // its final check would fail on the forgery
}

fn a_completion_repeated_within_one_batch_commits_once_and_the_repeat_is_refused(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(3);
    let leases = f.claim_batch(Q, "w", lease(), 3).unwrap();
    let results = f.complete_batch(&[
        (&leases[0], b"first".as_slice()),
        (&leases[1], b"b".as_slice()),
        (&leases[0], b"again".as_slice()),
        (&leases[2], b"c".as_slice()),
    ]);
    assert!(results[0].is_ok() && results[1].is_ok() && results[3].is_ok());
    let repeat = results[2].as_ref().unwrap_err().lease_lost().unwrap();
    assert!(repeat.ended_by_holder, "{repeat}");
    assert_eq!(f.output(ids[0]).unwrap().unwrap(), b"first");
    for id in &ids {
        assert_eq!(f.history(*id).unwrap().len(), 1, "one history row each");
    }
    assert_eq!(f.stats().unwrap().counters.fenced_writes_rejected, 1);
}

/// Found by the model against PostgreSQL, whose batch completed the live attempt before
/// answering the stale one: each completion of a batch answers as if it came alone, in the
/// batch's order, so the stale one, first, finds the live attempt still running.
fn a_stale_completion_before_the_live_one_in_a_batch_is_answered_as_if_alone_and_first(kind: Kind) {
    let f = kind.open();
    let (stale, live) = reclaimed_pair(&f);
    let other = {
        f.enqueue_n(1);
        f.claim_one("b")
    };
    let results = f.complete_batch(&[
        (&stale, b"stale".as_slice()),
        (&other, b"other".as_slice()),
        (&live, b"live".as_slice()),
    ]);
    let refused = results[0].as_ref().unwrap_err().lease_lost().unwrap();
    assert_eq!(refused.found, Some((live.attempt, JobState::Running)));
    assert!(!refused.ended_by_holder);
    assert!(results[1].is_ok() && results[2].is_ok(), "{results:?}");
    assert_eq!(f.output(live.job).unwrap().unwrap(), b"live");
}

/// A store file put back from a backup has lost its last commits, as a PostgreSQL standby
/// promoted before it received them has: the same attempt number is granted again. A lease
/// granted in the lost history is refused (its token is not the job's), heartbeat and
/// completion alike, and the lease granted again holds.
#[test]
fn a_lease_from_a_history_the_store_lost_is_refused_though_its_attempt_is_granted_again() {
    use leasehold::{JobStore, ReadJobs, Store};
    let dir = tempfile::tempdir().unwrap();
    let (path, backup) = (dir.path().join("s.redb"), dir.path().join("backup.redb"));
    let id = {
        let store = Store::open(&path).unwrap();
        store.enqueue(NewJob::new(Q, "x")).unwrap()
    };
    std::fs::copy(&path, &backup).unwrap();
    let lost = {
        let store = Store::open(&path).unwrap();
        store.claim(Q, "a", LEASE).unwrap().unwrap()
    };
    std::fs::copy(&backup, &path).unwrap();
    let store = Store::open(&path).unwrap();
    let again = store.claim(Q, "b", LEASE).unwrap().unwrap();
    assert_eq!((again.job, again.attempt), (lost.job, lost.attempt));
    assert!(store.heartbeat(&lost, 1).unwrap_err().is_lease_lost());
    let refused = store.complete(&lost, b"a").unwrap_err();
    assert!(
        matches!(&refused, Error::LeaseLost(l) if !l.ended_by_holder),
        "{refused:?}"
    );
    store.complete(&again, b"b").unwrap();
    assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"b"[..]));
    assert!(store.check().unwrap().is_clean());
}
