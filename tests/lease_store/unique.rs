use std::time::Duration;

use leasehold::{Error, InputError, JobState, NewJob, Uniqueness};

use crate::on_both::{Kind, Q};

crate::on_both::on_both!(
    and protocol;
    a_key_kept_for_a_window_after_success_dedupes_within_it_and_is_free_after,
    a_key_kept_until_purged_dedupes_until_its_job_is_purged,
    a_dead_or_cancelled_job_keeps_no_key_whatever_its_window,
    a_retry_waits_for_a_succeeded_holders_window_to_run_out,
    a_window_without_a_key_is_refused,
);

const DAY: Duration = Duration::from_secs(24 * 3600);

fn daily(payload: &str) -> NewJob {
    NewJob::new(Q, payload)
        .unique_key("report-2026-12-02")
        .unique_for(DAY)
}

fn a_key_kept_for_a_window_after_success_dedupes_within_it_and_is_free_after(kind: Kind) {
    let f = kind.open();
    let first = f.enqueue(daily("a")).unwrap();
    assert_eq!(
        f.job(first).unwrap().unwrap().uniqueness(),
        Uniqueness::AfterSuccess(DAY)
    );
    let l = f.claim_one("w");
    f.complete(&l, b"sent").unwrap();
    f.advance(DAY - Duration::from_secs(1));
    assert_eq!(f.enqueue(daily("b")).unwrap(), first, "within the window");
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
    f.advance(Duration::from_secs(1));
    let second = f.enqueue(daily("c")).unwrap();
    assert_ne!(second, first, "the window has run out");
    assert_eq!(
        f.enqueue(daily("d")).unwrap(),
        second,
        "the new job holds it"
    );
    // the old job is as it was, but for the key it gave up
    let old = f.job(first).unwrap().unwrap();
    assert_eq!(
        (old.state(), old.unique_key()),
        (JobState::Succeeded, Some("report-2026-12-02"))
    );
    // a plain key (no window) is free as soon as its job succeeds
    let plain = f
        .enqueue(NewJob::new("other", "x").unique_key("k"))
        .unwrap();
    let l = f
        .claim("other", "w", crate::on_both::lease())
        .unwrap()
        .unwrap();
    f.complete(&l, b"").unwrap();
    assert_ne!(
        f.enqueue(NewJob::new("other", "y").unique_key("k"))
            .unwrap(),
        plain
    );
}

fn a_key_kept_until_purged_dedupes_until_its_job_is_purged(kind: Kind) {
    let f = kind.open();
    let once = || {
        NewJob::new(Q, "import")
            .unique_key("import-v1")
            .unique_until_purged()
    };
    let first = f.enqueue(once()).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    f.advance(DAY * 365);
    assert_eq!(f.enqueue(once()).unwrap(), first);
    assert_eq!(
        f.purge(Duration::from_secs(1), &[JobState::Succeeded])
            .unwrap(),
        1
    );
    assert_ne!(f.enqueue(once()).unwrap(), first, "purged, the key is free");
}

fn a_dead_or_cancelled_job_keeps_no_key_whatever_its_window(kind: Kind) {
    let f = kind.open();
    let doomed = f.enqueue(daily("a").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    let next = f.enqueue(daily("b")).unwrap();
    assert_ne!(
        next, doomed,
        "its work was not done: asking again makes a job"
    );
    assert_eq!(f.cancel(next).unwrap(), JobState::Cancelled);
    assert_ne!(f.enqueue(daily("c")).unwrap(), next);
}

fn a_retry_waits_for_a_succeeded_holders_window_to_run_out(kind: Kind) {
    let f = kind.open();
    let dead = f.enqueue(daily("a").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    f.fail(&l, "boom").unwrap();
    let done = f.enqueue(daily("b")).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    match f.retry(dead) {
        Err(Error::UniqueKeyHeld { holder, .. }) => assert_eq!(holder, done),
        other => panic!("expected the key held by the succeeded job, got {other:?}"),
    }
    f.advance(DAY);
    f.retry(dead).unwrap();
    assert_eq!(f.job(dead).unwrap().unwrap().state(), JobState::Queued);
    assert_eq!(
        f.enqueue(daily("c")).unwrap(),
        dead,
        "the retried job holds it"
    );
}

fn a_window_without_a_key_is_refused(kind: Kind) {
    let f = kind.open();
    assert!(matches!(
        f.enqueue(NewJob::new(Q, "x").unique_for(DAY)),
        Err(Error::Input(InputError::WindowWithoutKey))
    ));
    assert!(matches!(
        f.enqueue(NewJob::new(Q, "x").unique_until_purged()),
        Err(Error::Input(InputError::WindowWithoutKey))
    ));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
}
