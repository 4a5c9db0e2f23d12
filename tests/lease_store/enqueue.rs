use std::time::Duration;

use leasehold::{Error, InputError, JobState, NewJob};
use leasehold::{JobStore, ReadJobs};

use crate::common::Fixture;
use crate::on_both::{Kind, Q, Setup, lease};

crate::on_both::on_both!(
    and protocol;
    job_ids_are_never_reused_even_across_reopen,
    a_unique_key_held_by_a_live_job_returns_that_job_and_creates_nothing,
    a_unique_key_survives_retry_wait,
    bad_input_is_refused_with_its_own_error_and_writes_nothing,
    an_oversized_output_is_refused_and_the_lease_still_holds,
    enqueue_batch_is_all_or_nothing,
    a_batch_of_plain_keyed_and_tagged_jobs_answers_each_in_its_order,
    huge_delays_saturate_instead_of_wrapping_into_the_past,
    a_run_time_in_wall_time_becomes_a_wait_on_the_stores_clock_and_a_past_one_runs_now,
    long_error_messages_are_kept_but_cut,
    a_failure_whose_message_holds_a_nul_byte_is_recorded_with_the_byte_shown,
    purge_in_a_store_younger_than_the_age_asked_for_deletes_nothing,
    purge_reaches_old_jobs_behind_any_number_of_kept_ones_in_bounded_batches,
    purge_and_a_reap_with_a_retention_end_for_any_count_batch_and_mix_of_states,
    purge_deletes_old_finished_jobs_of_the_chosen_states_with_their_history,
    retry_requeues_a_dead_job_with_a_fresh_budget_and_keeps_its_history,
    metadata_given_at_enqueue_reads_back_in_its_order_with_a_repeated_key_set_once,
);

fn metadata_given_at_enqueue_reads_back_in_its_order_with_a_repeated_key_set_once(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(
            NewJob::new(Q, "x")
                .metadata("tenant", "acme")
                .metadata("kind", "thumbnail")
                .metadata("tenant", "globex")
                .metadata("note", "a = b, c"),
        )
        .unwrap();
    let job = f.job(id).unwrap().unwrap();
    let pairs: Vec<(&str, &str)> = job
        .metadata()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![
            ("tenant", "globex"),
            ("kind", "thumbnail"),
            ("note", "a = b, c")
        ]
    );
    assert_eq!(job.metadata_value("kind"), Some("thumbnail"));
    assert_eq!(job.metadata_value("absent"), None);
    // kept through the job's life
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    assert_eq!(f.job(id).unwrap().unwrap().metadata(), job.metadata());
    let plain = f.enqueue(NewJob::new(Q, "y")).unwrap();
    assert!(f.job(plain).unwrap().unwrap().metadata().is_empty());
}

fn job_ids_are_never_reused_even_across_reopen(kind: Kind) {
    let mut f = kind.open();
    let a = f.enqueue_n(3);
    f.reopen();
    let b = f.enqueue_n(1);
    assert_eq!(a.iter().map(|j| j.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(b[0].0, 4);
}

fn a_unique_key_held_by_a_live_job_returns_that_job_and_creates_nothing(kind: Kind) {
    let f = kind.open();
    let first = f
        .enqueue(NewJob::new(Q, "a").unique_key("report-2026-11"))
        .unwrap();
    let again = f
        .enqueue(NewJob::new(Q, "b").unique_key("report-2026-11"))
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 1);
    // while running, still held
    let l = f.claim_one("w");
    assert_eq!(
        f.enqueue(NewJob::new(Q, "c").unique_key("report-2026-11"))
            .unwrap(),
        first
    );
    // other queues have their own keys
    let other = f
        .enqueue(NewJob::new("other", "d").unique_key("report-2026-11"))
        .unwrap();
    assert_ne!(other, first);
    // once terminal, the key is free again
    f.complete(&l, b"").unwrap();
    let next = f
        .enqueue(NewJob::new(Q, "e").unique_key("report-2026-11"))
        .unwrap();
    assert_ne!(next, first);
}

fn a_unique_key_survives_retry_wait(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "a").unique_key("k")).unwrap();
    let l = f.claim_one("w");
    f.fail(&l, "again later").unwrap();
    assert_eq!(f.enqueue(NewJob::new(Q, "b").unique_key("k")).unwrap(), id);
}

fn bad_input_is_refused_with_its_own_error_and_writes_nothing(kind: Kind) {
    let f = kind.with(Setup::default().max_payload(16));
    let before = f.stats().unwrap();
    let cases: Vec<(NewJob, InputError)> = vec![
        (NewJob::new("", "x"), InputError::EmptyQueueName),
        (
            NewJob::new("q".repeat(129), "x"),
            InputError::QueueNameTooLong { len: 129, max: 128 },
        ),
        (
            NewJob::new(Q, vec![0u8; 17]),
            InputError::TooLarge {
                what: "payload",
                len: 17,
                max: 16,
            },
        ),
        (
            NewJob::new(Q, "x").max_attempts(0),
            InputError::ZeroMaxAttempts,
        ),
        (
            NewJob::new(Q, "x").unique_key(""),
            InputError::BadUniqueKey { len: 0, max: 256 },
        ),
        (
            NewJob::new("q\0", "x"),
            InputError::NulByte {
                what: "queue name",
                at: 1,
            },
        ),
        (
            NewJob::new(Q, "x").unique_key("key\0"),
            InputError::NulByte {
                what: "unique key",
                at: 3,
            },
        ),
        (
            NewJob::new(Q, "x").metadata("a=b", "c"),
            InputError::BadMetadataKey {
                key: "a=b".into(),
                max: 64,
            },
        ),
        (
            NewJob::new(Q, "x").metadata("", "c"),
            InputError::BadMetadataKey {
                key: String::new(),
                max: 64,
            },
        ),
        (
            NewJob::new(Q, "x").metadata("k", "v".repeat(257)),
            InputError::MetadataValueTooLong {
                key: "k".into(),
                len: 257,
                max: 256,
            },
        ),
        (
            NewJob::new(Q, "x").metadata("k", "v\0"),
            InputError::NulByte {
                what: "metadata value",
                at: 1,
            },
        ),
        (
            (0..17).fold(NewJob::new(Q, "x"), |j, i| j.metadata(format!("k{i}"), "v")),
            InputError::TooMuchMetadata { count: 17, max: 16 },
        ),
    ];
    for (job, expected) in cases {
        match f.enqueue(job) {
            Err(Error::Input(e)) => assert_eq!(e, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }
    let mut after = f.stats().unwrap();
    after.now = before.now;
    assert_eq!(after, before);
    assert!(matches!(
        f.claim("", "w", lease()),
        Err(Error::Input(InputError::EmptyQueueName))
    ));
    assert!(matches!(
        f.claim(Q, "", lease()),
        Err(Error::Input(InputError::BadWorkerId { .. }))
    ));
    assert!(matches!(
        f.claim(Q, "w", leasehold::LeaseTerms::new(Duration::ZERO)),
        Err(Error::Config(leasehold::ConfigError::ZeroLease))
    ));
    assert!(matches!(
        f.claim("q\0", "w", lease()),
        Err(Error::Input(InputError::NulByte {
            what: "queue name",
            ..
        }))
    ));
    let id = f.enqueue(NewJob::new(Q, "x")).unwrap();
    assert!(matches!(
        f.claim(Q, "w\0", lease()),
        Err(Error::Input(InputError::NulByte {
            what: "worker id",
            ..
        }))
    ));
    assert!(matches!(
        f.claim_job(id, "\0", lease()),
        Err(Error::Input(InputError::NulByte {
            what: "worker id",
            ..
        }))
    ));
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Queued);
}

fn an_oversized_output_is_refused_and_the_lease_still_holds(kind: Kind) {
    let f = kind.with(Setup::default().max_payload(4));
    f.enqueue(NewJob::new(Q, "x")).unwrap();
    let l = f.claim_one("w");
    assert!(matches!(f.complete(&l, b"too long"), Err(Error::Input(_))));
    f.complete(&l, b"ok").unwrap();
}

fn enqueue_batch_is_all_or_nothing(kind: Kind) {
    let f = kind.open();
    let jobs = vec![
        NewJob::new(Q, "a"),
        NewJob::new("", "bad"),
        NewJob::new(Q, "c"),
    ];
    assert!(f.enqueue_batch(jobs).is_err());
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
    assert_eq!(f.enqueue_n(2).len(), 2);
}

/// A batch mixes plain jobs (PostgreSQL inserts each run of them in one statement) with
/// jobs that carry a unique key or metadata (inserted alone): each answer is its own job's,
/// in the batch's order, and a key given twice answers with the job that took it first.
fn a_batch_of_plain_keyed_and_tagged_jobs_answers_each_in_its_order(kind: Kind) {
    let f = kind.open();
    let jobs = vec![
        NewJob::new(Q, "a").priority(3),
        NewJob::new(Q, "b").delay(Duration::from_secs(5)),
        NewJob::new(Q, "keyed").unique_key("k"),
        NewJob::new("other", "c").max_attempts(7),
        NewJob::new(Q, "keyed again").unique_key("k"),
        NewJob::new(Q, "tagged").metadata("tenant", "acme"),
        NewJob::new(Q, "d"),
        NewJob::new(Q, "e").time_limit(Duration::from_secs(9)),
    ];
    let ids = f.enqueue_batch(jobs).unwrap();
    assert_eq!(ids.len(), 8);
    assert_eq!(ids[4], ids[2], "the key's first job answers for it");
    let payload = |i: usize| f.payload(ids[i]).unwrap().unwrap();
    let expected = ["a", "b", "keyed", "c", "keyed", "tagged", "d", "e"];
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(payload(i), want.as_bytes(), "answer {i}");
    }
    let made: Vec<u64> = [0, 1, 2, 3, 5, 6, 7].iter().map(|&i| ids[i].0).collect();
    assert!(
        made.windows(2).all(|w| w[1] == w[0] + 1),
        "dense and in order: {made:?}"
    );
    let job = |i: usize| f.job(ids[i]).unwrap().unwrap();
    let now = f.now();
    assert_eq!(job(0).priority(), 3);
    assert_eq!(job(1).run_at(), now.saturating_add(Duration::from_secs(5)));
    assert_eq!((job(3).queue(), job(3).max_attempts()), ("other", 7));
    assert_eq!(job(5).metadata_value("tenant"), Some("acme"));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 7);
    // the time limit holds: a claim's lease ends at it (five jobs of the queue are due)
    let lease = (0..5)
        .map(|_| f.claim_one("w"))
        .find(|l| l.job == ids[7])
        .unwrap();
    assert_eq!(
        lease.deadline,
        Some(f.now().saturating_add(Duration::from_secs(9)))
    );
}

/// `run_at` takes a wall-clock time and turns it, at enqueue, into a wait on the store's
/// clock (here a manual one, which only the test moves): due an hour of store time later,
/// whatever the wall clock does meanwhile; a time already past is due at once. A later
/// `delay` replaces it, as it replaces a delay.
fn a_run_time_in_wall_time_becomes_a_wait_on_the_stores_clock_and_a_past_one_runs_now(kind: Kind) {
    let f = kind.open();
    let hour = Duration::from_secs(3600);
    #[allow(clippy::disallowed_methods)] // a wall-clock time is what run_at takes
    let wall = std::time::SystemTime::now();
    let ids = f
        .enqueue_batch(vec![
            NewJob::new(Q, "later").run_at(wall + hour),
            NewJob::new(Q, "past").run_at(wall - hour),
            NewJob::new(Q, "delay wins")
                .run_at(wall + hour)
                .delay(Duration::from_secs(1)),
        ])
        .unwrap();
    let later = f
        .enqueue(NewJob::new(Q, "alone").run_at(wall + hour))
        .unwrap();
    let now = f.now();
    let run_at = |id| f.job(id).unwrap().unwrap().run_at();
    for id in [ids[0], later] {
        // What the wall clock moved between the test's reading and the enqueue's, at most.
        let waited = run_at(id).saturating_since(now);
        assert!(
            waited <= hour && waited > hour - Duration::from_secs(60),
            "{waited:?}"
        );
    }
    assert_eq!(run_at(ids[1]), now, "a time past runs now");
    assert_eq!(run_at(ids[2]), now.saturating_add(Duration::from_secs(1)));
    assert_eq!(f.claim_one("w").job, ids[1]);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "the rest wait");
    f.advance(hour);
    assert!(
        f.claim(Q, "w", lease()).unwrap().is_some(),
        "due after an hour of store time"
    );
}

fn huge_delays_saturate_instead_of_wrapping_into_the_past(kind: Kind) {
    let f = kind.open();
    f.enqueue(NewJob::new(Q, "never").delay(Duration::MAX))
        .unwrap();
    f.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
}

fn long_error_messages_are_kept_but_cut(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let l = f.claim_one("w");
    f.fail(&l, &"é".repeat(20_000)).unwrap();
    let err = f.job(id).unwrap().unwrap().last_error().unwrap().to_owned();
    assert!(err.len() < 17_000 && err.ends_with("bytes cut)"));
}

fn a_failure_whose_message_holds_a_nul_byte_is_recorded_with_the_byte_shown(kind: Kind) {
    // PostgreSQL's text cannot hold a NUL byte: such a failure once could not be recorded
    // there at all, and the job ran until its leases spent its budget.
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(2)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(
        f.fail(&l, "bad byte \0 in input").unwrap(),
        JobState::RetryWait
    );
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(job.last_error(), Some("bad byte \\0 in input"));
    assert_eq!(job.failures(), 1);
    let history = f.history(id).unwrap();
    assert_eq!(
        history[0].outcome(),
        Some(&leasehold::Outcome::Failed("bad byte \\0 in input".into()))
    );
}

fn purge_in_a_store_younger_than_the_age_asked_for_deletes_nothing(kind: Kind) {
    // Store time starts at zero here; a cutoff saturated to zero once took the jobs that
    // finished at that first instant.
    let f = kind.open();
    let ids = f.enqueue_n(1);
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    f.advance(Duration::from_secs(60));
    let n = f
        .purge(Duration::from_secs(3600), &[JobState::Succeeded])
        .unwrap();
    assert_eq!(n, 0);
    assert!(f.job(ids[0]).unwrap().is_some());
}

fn purge_reaches_old_jobs_behind_any_number_of_kept_ones_in_bounded_batches(kind: Kind) {
    // Five dead jobs finish first, then three succeed: batches of two must walk past the
    // dead ones (kept) to reach the succeeded ones.
    let f = kind.with(Setup::default().reap_batch(2).default_max_attempts(1));
    let ids = f.enqueue_n(8);
    for _ in 0..5 {
        let l = f.claim_one("w");
        assert_eq!(f.fail(&l, "x").unwrap(), JobState::Dead);
        f.advance(Duration::from_secs(1));
    }
    for _ in 0..3 {
        let l = f.claim_one("w");
        f.complete(&l, b"").unwrap();
    }
    f.advance(Duration::from_secs(3600));
    let n = f
        .purge(Duration::from_secs(600), &[JobState::Succeeded])
        .unwrap();
    assert_eq!(n, 3);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(f.job(*id).unwrap().is_some(), i < 5, "job {i}");
    }
}

fn purge_and_a_reap_with_a_retention_end_for_any_count_batch_and_mix_of_states(kind: Kind) {
    // A full batch that ends exactly at the end of what is due once made the next batch
    // start again where it had, for ever (2 jobs, batches of 2). Every count of finished
    // jobs, batch size and mix of kept and deleted ones must end, with the right jobs gone:
    // by a purge, and by the reaper's pass that purges past the retention.
    for batch in 1..=4 {
        for by_reap in [false, true] {
            let setup = Setup::default()
                .reap_batch(batch)
                .default_max_attempts(1)
                .retention(Duration::from_secs(1));
            let f = kind.clone().with(setup);
            let mut ended: Vec<(leasehold::JobId, JobState)> = Vec::new();
            let mut seed = batch as u64 * 7919 + u64::from(by_reap);
            for n in 0..=9usize {
                for _ in 0..n {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let id = f.enqueue_n(1)[0];
                    let state = match (seed >> 33) % 3 {
                        0 => {
                            f.complete(&f.claim_one("w"), b"").unwrap();
                            JobState::Succeeded
                        }
                        1 => f.fail(&f.claim_one("w"), "x").unwrap(),
                        _ => f.cancel(id).unwrap(),
                    };
                    ended.push((id, state));
                }
                f.advance(Duration::from_secs(2));
                let states = match (by_reap, n % 2) {
                    (true, _) => vec![JobState::Succeeded, JobState::Cancelled],
                    (false, 0) => vec![JobState::Dead],
                    (false, _) => vec![JobState::Succeeded, JobState::Cancelled],
                };
                let h = f.handle();
                let asked = states.clone();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let purged = match by_reap {
                        true => h.reap().map(|r| r.purged),
                        false => h.purge(Duration::ZERO, &asked),
                    };
                    let _ = tx.send(purged);
                });
                let purged = rx
                    .recv_timeout(Duration::from_secs(60))
                    .unwrap_or_else(|_| panic!("batch {batch}, {n} jobs: the pass never ended"))
                    .unwrap();
                let (gone, kept): (Vec<_>, Vec<_>) =
                    ended.into_iter().partition(|(_, s)| states.contains(s));
                assert_eq!(purged, gone.len(), "batch {batch}, {n} jobs");
                for (id, _) in &gone {
                    assert!(f.job(*id).unwrap().is_none(), "batch {batch}: {id} purged");
                }
                for (id, state) in &kept {
                    assert_eq!(f.job(*id).unwrap().unwrap().state(), *state, "{id} kept");
                }
                ended = kept;
            }
        }
    }
}

fn purge_deletes_old_finished_jobs_of_the_chosen_states_with_their_history(kind: Kind) {
    let f = kind.with(Setup::default().reap_batch(3));
    let ids = f.enqueue_n(10);
    for _ in 0..6 {
        let l = f.claim_one("w");
        f.complete(&l, b"out").unwrap();
    }
    let l = f.claim_one("w");
    f.cancel(l.job).unwrap();
    f.fail(&l, "x").unwrap(); // ends cancelled
    f.advance(Duration::from_secs(3600));
    let young = f.claim_one("w");
    f.complete(&young, b"").unwrap(); // finished just now: too young to purge
    // only succeeded jobs, older than 10 minutes
    let n = f
        .purge(Duration::from_secs(600), &[JobState::Succeeded])
        .unwrap();
    assert_eq!(n, 6);
    assert!(f.job(ids[0]).unwrap().is_none());
    assert!(f.history(ids[0]).unwrap().is_empty());
    assert!(f.output(ids[0]).unwrap().is_none());
    assert_eq!(
        f.job(young.job).unwrap().unwrap().state(),
        JobState::Succeeded
    );
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Cancelled);
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 2);
    // ids are never reused after a purge
    let next = f.enqueue_n(1)[0];
    assert_eq!(next.0, 11);
}

fn retry_requeues_a_dead_job_with_a_fresh_budget_and_keeps_its_history(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    f.retry(id).unwrap();
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.failures(), job.finished_at()),
        (JobState::Queued, 0, None)
    );
    let again = f.claim_one("w");
    assert_eq!(again.attempt.0, 2);
    assert!(matches!(
        f.retry(id),
        Err(Error::Refused {
            state: JobState::Running,
            ..
        })
    ));
    f.complete(&again, b"").unwrap();
    assert_eq!(f.history(id).unwrap().len(), 2);
    assert!(matches!(
        f.retry(leasehold::JobId(77)),
        Err(Error::JobNotFound(_))
    ));
}

#[test]
fn compact_needs_the_only_handle() {
    let mut f = Fixture::new();
    f.enqueue_n(100);
    f.purge(Duration::ZERO, &[JobState::Queued]).unwrap(); // nothing terminal: purges none
    f.close();
    let mut store = leasehold::Store::open(f.path()).unwrap();
    let clone = store.clone();
    assert!(matches!(store.compact(), Err(Error::InUse(_))));
    drop(clone);
    store.compact().unwrap();
    assert!(store.check().unwrap().is_clean());
}
