//! An operator's edit of a job that waits: its payload, priority, due time and metadata,
//! never a job that runs, has ended, or was claimed since the attempt the edit names.

use std::time::Duration;

use leasehold::{Attempt, Edit, Error, InputError, JobState, NewJob};

use crate::on_both::{Kind, Q, lease};

crate::on_both::on_both!(
    and protocol;
    an_edit_changes_a_waiting_jobs_payload_priority_due_time_and_metadata,
    promote_runs_a_delayed_or_backing_off_job_now,
    an_edit_of_a_job_that_runs_or_ended_is_refused_and_changes_nothing,
    an_edit_naming_an_attempt_is_refused_once_the_job_was_claimed_since,
    an_edit_with_bad_input_is_refused_and_changes_nothing,
    an_edited_blocked_job_still_waits_for_its_dependency,
);

fn an_edit_changes_a_waiting_jobs_payload_priority_due_time_and_metadata(kind: Kind) {
    let f = kind.open();
    let first = f.enqueue(NewJob::new(Q, "first")).unwrap();
    let second = f
        .enqueue(
            NewJob::new(Q, "draft")
                .metadata("tenant", "acme")
                .metadata("tier", "free"),
        )
        .unwrap();
    let edit = Edit::new()
        .payload("final")
        .priority(-5)
        .metadata("tier", "paid")
        .remove_metadata("tenant")
        .metadata("region", "eu");
    f.edit(second, edit).unwrap();
    let job = f.job(second).unwrap().unwrap();
    assert_eq!(job.priority(), -5);
    let pairs: Vec<(&str, &str)> = (job.metadata().iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(pairs, [("tier", "paid"), ("region", "eu")]);
    let l = f.claim_one("w");
    assert_eq!(l.job, second, "its new priority put it first");
    assert_eq!(l.payload, b"final");
    // A due time moved later keeps it back.
    f.edit(first, Edit::new().delay(Duration::from_secs(30)))
        .unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.advance(Duration::from_secs(30));
    assert_eq!(f.claim_one("w").job, first);
}

fn promote_runs_a_delayed_or_backing_off_job_now(kind: Kind) {
    let f = kind.open();
    let delayed = f
        .enqueue(NewJob::new(Q, "later").delay(Duration::from_secs(3600)))
        .unwrap();
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.edit(delayed, Edit::new().now()).unwrap();
    let l = f.claim_one("w");
    assert_eq!(l.job, delayed);
    assert_eq!(f.fail(&l, "flaky").unwrap(), JobState::RetryWait);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none(), "it backs off");
    f.edit(delayed, Edit::new().now()).unwrap();
    assert_eq!(f.claim_one("w").job, delayed);
}

fn an_edit_of_a_job_that_runs_or_ended_is_refused_and_changes_nothing(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let l = f.claim_one("w");
    let refused = f.edit(id, Edit::new().priority(3));
    assert!(
        matches!(
            refused,
            Err(Error::Refused {
                state: JobState::Running,
                ..
            })
        ),
        "{refused:?}"
    );
    f.complete(&l, b"").unwrap();
    let refused = f.edit(id, Edit::new().payload("x"));
    assert!(matches!(
        refused,
        Err(Error::Refused {
            state: JobState::Succeeded,
            ..
        })
    ));
    assert_eq!(f.job(id).unwrap().unwrap().priority(), 0);
    assert_eq!(f.payload(id).unwrap().unwrap(), b"p");
    assert!(matches!(
        f.edit(leasehold::JobId(999), Edit::new()),
        Err(Error::JobNotFound(_))
    ));
}

fn an_edit_naming_an_attempt_is_refused_once_the_job_was_claimed_since(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let seen = f.job(id).unwrap().unwrap().attempt();
    // Claimed and failed meanwhile: waiting again, but not the job the operator looked at.
    let l = f.claim_one("w");
    f.fail(&l, "x").unwrap();
    let refused = f.edit(id, Edit::new().if_attempt(seen).priority(9));
    assert!(
        matches!(refused, Err(Error::EditConflict { expected, found, .. }) if expected == seen && found == Attempt(1)),
        "{refused:?}"
    );
    assert_eq!(f.job(id).unwrap().unwrap().priority(), 0);
    f.edit(id, Edit::new().if_attempt(Attempt(1)).priority(9))
        .unwrap();
    assert_eq!(f.job(id).unwrap().unwrap().priority(), 9);
}

fn an_edit_with_bad_input_is_refused_and_changes_nothing(kind: Kind) {
    let f = kind.with(crate::on_both::Setup::default().max_payload(8));
    let id = f.enqueue(NewJob::new(Q, "p").metadata("k", "v")).unwrap();
    let big = f.edit(id, Edit::new().payload(vec![0u8; 9]).priority(4));
    assert!(
        matches!(big, Err(Error::Input(InputError::TooLarge { .. }))),
        "{big:?}"
    );
    let bad_key = f.edit(id, Edit::new().metadata("a=b", "c"));
    assert!(matches!(
        bad_key,
        Err(Error::Input(InputError::BadMetadataKey { .. }))
    ));
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.priority(), job.metadata().len()), (0, 1));
}

fn an_edited_blocked_job_still_waits_for_its_dependency(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new("deps", "dep")).unwrap();
    let waiter = f.enqueue(NewJob::new(Q, "w").after(dep)).unwrap();
    f.edit(waiter, Edit::new().now().payload("edited")).unwrap();
    assert_eq!(f.job(waiter).unwrap().unwrap().state(), JobState::Blocked);
    let l = f.claim("deps", "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    assert_eq!(f.claim_one("w").payload, b"edited");
}
