use std::time::Duration;

use leasehold::{Error, JobFilter, JobId, JobState, NewJob};

use crate::on_both::{Backend, Kind, Q, Setup, lease};

crate::on_both::on_both!(
    and protocol;
    retry_all_retries_the_dead_jobs_a_filter_names_in_batches_and_lists_the_refused,
    cancel_all_cancels_waiting_flags_running_and_refuses_finished,
    a_listing_filters_by_metadata_age_and_cursor,
    every_listing_agrees_with_the_records_whatever_its_state_queue_order_limit_and_cursor,
    a_filter_pair_no_job_can_carry_matches_nothing_and_a_bulk_cancel_from_it_changes_nothing,
    a_bulk_retry_ends_in_at_most_one_transaction_per_page_for_any_count_page_and_mix,
);

/// The bulk actions' loop, as the purge's and the reaper's: for any number of jobs, page
/// size and mix of jobs the action applies to (dead ones) and refuses (waiting ones), a
/// retry of all of them looks at each once, changes exactly the dead, and takes at most one
/// transaction a page (where the store counts them).
fn a_bulk_retry_ends_in_at_most_one_transaction_per_page_for_any_count_page_and_mix(kind: Kind) {
    for page in [1usize, 2, 3, 4] {
        let f = kind.clone().with(Setup::default().reap_batch(page));
        let mut seed = page as u64 * 31;
        for n in [0usize, 1, 2, 3, 4, 5, 7, 8, 9] {
            let queue = format!("bulk-{n}");
            let mut dead_ones = Vec::new();
            for _ in 0..n {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match (seed >> 33) % 2 {
                    0 => dead_ones.push(dead(&f, &queue, None)),
                    _ => {
                        f.enqueue(NewJob::new(queue.as_str(), "waiting")).unwrap();
                    }
                }
            }
            let before = f.write_transactions();
            let report = f
                .retry_all(&JobFilter {
                    queue: Some(queue.clone()),
                    ..JobFilter::default()
                })
                .unwrap();
            assert_eq!(
                (report.matched, report.changed, report.refused.len()),
                (n, dead_ones.len(), n - dead_ones.len()),
                "page {page}, {n} jobs"
            );
            // (a page whose every job is refused writes nothing, and commits nothing)
            if let (Some(before), Some(after)) = (before, f.write_transactions()) {
                let pages = after - before;
                assert!(
                    pages <= n.div_ceil(page) as u64,
                    "page {page}, {n} jobs: {pages}"
                );
            }
            for id in dead_ones {
                assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Queued);
            }
        }
    }
}

fn a_filter_pair_no_job_can_carry_matches_nothing_and_a_bulk_cancel_from_it_changes_nothing(
    kind: Kind,
) {
    // Stored as `key=value` text, ("k", "a=b=c") once matched the filter ("k=a", "b=c").
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "x").metadata("k", "a=b=c"))
        .unwrap();
    let by = |key: &str, value: &str| JobFilter {
        metadata: vec![(key.to_owned(), value.to_owned())],
        ..JobFilter::default()
    };
    assert_eq!(
        f.jobs(&by("k", "a=b=c")).unwrap().len(),
        1,
        "the pair it carries"
    );
    for filter in [
        by("k=a", "b=c"),
        by("k=a=b", "c"),
        by("k\0", "a=b=c"),
        by("k", "a=b=c\0"),
        by("", "x"),
        JobFilter {
            queue: Some("q\0".into()),
            ..JobFilter::default()
        },
    ] {
        assert!(f.jobs(&filter).unwrap().is_empty(), "{filter:?}");
        let report = f.cancel_all(&filter).unwrap();
        assert_eq!((report.matched, report.changed), (0, 0), "{filter:?}");
    }
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Queued);
}

/// A job that failed its only attempt, tagged with `tenant` if given.
fn dead(f: &Backend, queue: &str, tenant: Option<&str>) -> JobId {
    let mut job = NewJob::new(queue, "x").max_attempts(1);
    if let Some(t) = tenant {
        job = job.metadata("tenant", t);
    }
    let id = f.enqueue(job).unwrap();
    let l = f.claim_job(id, "w", lease()).unwrap().unwrap();
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    id
}

fn retry_all_retries_the_dead_jobs_a_filter_names_in_batches_and_lists_the_refused(kind: Kind) {
    // batches of two, so that five jobs take three transactions
    let f = kind.with(Setup::default().reap_batch(2));
    let acme: Vec<JobId> = (0..3).map(|_| dead(&f, Q, Some("acme"))).collect();
    let globex = dead(&f, Q, Some("globex"));
    let elsewhere = dead(&f, "other", Some("acme"));
    let waiting = f.enqueue(NewJob::new(Q, "waiting")).unwrap();
    let report = f
        .retry_all(&JobFilter {
            queue: Some(Q.into()),
            state: Some(JobState::Dead),
            metadata: vec![("tenant".into(), "acme".into())],
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!((report.matched, report.changed), (3, 3));
    assert!(report.refused.is_empty());
    for id in &acme {
        assert_eq!(f.job(*id).unwrap().unwrap().state(), JobState::Queued);
    }
    assert_eq!(f.job(globex).unwrap().unwrap().state(), JobState::Dead);
    assert_eq!(f.job(elsewhere).unwrap().unwrap().state(), JobState::Dead);
    // A filter that also names jobs a retry does not apply to: they are refused and listed,
    // and nothing of theirs changes.
    let report = f
        .retry_all(&JobFilter {
            queue: Some(Q.into()),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!((report.matched, report.changed), (5, 1));
    let refused: Vec<JobId> = report.refused.iter().map(|(id, _)| *id).collect();
    assert_eq!(refused, vec![acme[0], acme[1], acme[2], waiting]);
    assert!(
        report
            .refused
            .iter()
            .all(|(_, e)| matches!(e, Error::Refused { .. }))
    );
    assert_eq!(f.job(globex).unwrap().unwrap().state(), JobState::Queued);
    // a limit bounds the whole action
    let report = f
        .retry_all(&JobFilter {
            state: Some(JobState::Dead),
            limit: Some(0),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(report.matched, 0);
}

fn cancel_all_cancels_waiting_flags_running_and_refuses_finished(kind: Kind) {
    let f = kind.with(Setup::default().reap_batch(2));
    let waiting = f.enqueue_n(3);
    let running = f.claim_one("w");
    let finished = dead(&f, Q, None);
    let report = f
        .cancel_all(&JobFilter {
            queue: Some(Q.into()),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!((report.matched, report.changed), (4, 3));
    assert_eq!(report.refused.len(), 1);
    assert_eq!(report.refused[0].0, finished);
    for id in &waiting {
        let state = f.job(*id).unwrap().unwrap().state();
        match *id == running.job {
            true => assert_eq!(state, JobState::Running),
            false => assert_eq!(state, JobState::Cancelled),
        }
    }
    assert!(f.job(running.job).unwrap().unwrap().cancel_requested());
    // again: the cancelled ones are left as they are, not counted as changed
    let again = f
        .cancel_all(&JobFilter {
            state: Some(JobState::Cancelled),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!((again.matched, again.changed), (2, 0));
    assert!(again.refused.is_empty());
}

fn a_listing_filters_by_metadata_age_and_cursor(kind: Kind) {
    let f = kind.open();
    let old = f
        .enqueue(
            NewJob::new(Q, "a")
                .metadata("tenant", "acme")
                .metadata("kind", "x"),
        )
        .unwrap();
    f.advance(Duration::from_secs(3600));
    let new = f
        .enqueue(NewJob::new(Q, "b").metadata("tenant", "acme"))
        .unwrap();
    let other = f
        .enqueue(NewJob::new(Q, "c").metadata("tenant", "globex"))
        .unwrap();
    let ids = |filter: JobFilter| -> Vec<JobId> {
        f.jobs(&filter).unwrap().iter().map(|j| j.id()).collect()
    };
    let acme = vec![("tenant".to_owned(), "acme".to_owned())];
    assert_eq!(
        ids(JobFilter {
            metadata: acme.clone(),
            ..JobFilter::default()
        }),
        vec![old, new]
    );
    assert_eq!(
        ids(JobFilter {
            metadata: vec![
                ("tenant".into(), "acme".into()),
                ("kind".into(), "x".into())
            ],
            ..JobFilter::default()
        }),
        vec![old],
        "every pair must match"
    );
    assert_eq!(
        ids(JobFilter {
            unchanged_for: Some(Duration::from_secs(3600)),
            ..JobFilter::default()
        }),
        vec![old]
    );
    assert_eq!(
        ids(JobFilter {
            after: Some(old),
            ..JobFilter::default()
        }),
        vec![new, other]
    );
    assert_eq!(
        ids(JobFilter {
            after: Some(old),
            metadata: acme,
            limit: Some(1),
            ..JobFilter::default()
        }),
        vec![new]
    );
}

/// The listings of running and waiting jobs come from their indexes on redb, the rest from
/// the records (and on PostgreSQL from SQL): each must list exactly what a reading of every
/// record would, in the order asked, for every state, queue, order, limit and cursor.
fn every_listing_agrees_with_the_records_whatever_its_state_queue_order_limit_and_cursor(
    kind: Kind,
) {
    let f = kind.open();
    for i in 0..40u32 {
        let queue = if i % 3 == 0 { "other" } else { Q };
        let job = NewJob::new(queue, "x")
            .priority((i % 4) as i32)
            .max_attempts(1 + i % 2)
            .metadata("tenant", format!("t{}", i % 2));
        f.enqueue(job).unwrap();
    }
    // Claim, end and leave jobs across both queues: running, retry_wait, succeeded, dead,
    // cancelled, queued.
    for (n, queue) in [(14, Q), (6, "other")] {
        for k in 0..n {
            let l = f.claim(queue, "w", lease()).unwrap().unwrap();
            match k % 5 {
                0 => {} // left running
                1 => f.complete(&l, b"").map(|_| ()).unwrap(),
                2 => f.fail(&l, "boom").map(|_| ()).unwrap(),
                3 => f.cancel(l.job).map(|_| ()).unwrap(),
                _ => f.release(&l).unwrap(),
            }
        }
    }
    f.cancel(JobId(40)).unwrap();
    let now = f.now();
    let all = f.jobs(&JobFilter::default()).unwrap();
    assert_eq!(all.len(), 40);
    let states: std::collections::BTreeSet<_> = all.iter().map(|j| j.state()).collect();
    assert!(
        states.len() >= 5,
        "the setup reaches most states: {states:?}"
    );
    let mut state_choices: Vec<Option<JobState>> = JobState::ALL.map(Some).to_vec();
    state_choices.push(None);
    for state in state_choices {
        for queue in [None, Some(Q), Some("other"), Some("none")] {
            for order in [
                leasehold::JobOrder::Oldest,
                leasehold::JobOrder::Newest,
                leasehold::JobOrder::Priority,
            ] {
                for (after, limit) in [(None, None), (None, Some(3)), (Some(JobId(17)), Some(4))] {
                    for tenant in [None, Some("t1")] {
                        let filter = JobFilter {
                            queue: queue.map(str::to_owned),
                            state,
                            order,
                            after,
                            limit,
                            metadata: tenant
                                .map(|t| vec![("tenant".to_owned(), t.to_owned())])
                                .unwrap_or_default(),
                            ..JobFilter::default()
                        };
                        let mut want: Vec<_> = all
                            .iter()
                            .filter(|j| queue.is_none_or(|q| j.queue() == q))
                            .filter(|j| state.is_none_or(|s| j.state() == s))
                            .filter(|j| after.is_none_or(|a| j.id() > a))
                            .filter(|j| {
                                tenant.is_none_or(|t| j.metadata_value("tenant") == Some(t))
                            })
                            .collect();
                        match order {
                            leasehold::JobOrder::Newest => want.reverse(),
                            leasehold::JobOrder::Priority => {
                                want.sort_by_key(|j| (j.priority(), j.run_at(), j.id()))
                            }
                            _ => {}
                        }
                        if let Some(n) = limit {
                            want.truncate(n);
                        }
                        let want: Vec<JobId> = want.iter().map(|j| j.id()).collect();
                        let got: Vec<JobId> =
                            f.jobs(&filter).unwrap().iter().map(|j| j.id()).collect();
                        assert_eq!(got, want, "{filter:?} at {now:?}");
                    }
                }
            }
        }
    }
}
