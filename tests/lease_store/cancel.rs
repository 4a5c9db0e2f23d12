use leasehold::{Error, JobState, NewJob, Outcome, Renewal};

use crate::on_both::{Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    cancelling_a_waiting_job_takes_effect_at_once,
    a_cancelled_running_job_tells_its_holder_at_the_next_heartbeat,
    a_cancelled_running_job_that_fails_or_is_released_ends_cancelled_not_retried,
    a_cancelled_job_whose_holder_died_is_not_retried,
    finished_jobs_cannot_be_cancelled_and_unknown_ids_are_reported,
);

fn cancelling_a_waiting_job_takes_effect_at_once(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    assert_eq!(f.cancel(id).unwrap(), JobState::Cancelled);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert_eq!(f.cancel(id).unwrap(), JobState::Cancelled, "idempotent");
}

fn a_cancelled_running_job_tells_its_holder_at_the_next_heartbeat(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let l = f.claim_one("w");
    assert_eq!(f.cancel(id).unwrap(), JobState::Running);
    assert!(f.job(id).unwrap().unwrap().cancel_requested());
    assert_eq!(f.heartbeat(&l, 1).unwrap(), Renewal::Cancelled);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
    assert_eq!(
        f.history(id).unwrap()[0].outcome(),
        Some(&Outcome::Cancelled)
    );
    assert!(f.complete(&l, b"too late").unwrap_err().is_lease_lost());
}

fn a_cancelled_running_job_that_fails_or_is_released_ends_cancelled_not_retried(kind: Kind) {
    let f = kind.open();
    let ids = f.enqueue_n(2);
    let a = f.claim_one("w");
    let b = f.claim_one("w");
    f.cancel(ids[0]).unwrap();
    f.cancel(ids[1]).unwrap();
    assert_eq!(f.fail(&a, "x").unwrap(), JobState::Cancelled);
    f.release(&b).unwrap();
    assert_eq!(f.job(ids[1]).unwrap().unwrap().state(), JobState::Cancelled);
}

fn a_cancelled_job_whose_holder_died_is_not_retried(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    f.claim_one("w");
    f.cancel(id).unwrap();
    f.advance(LEASE);
    assert_eq!(
        f.reap().unwrap().reclaimed[0].job_state,
        JobState::Cancelled
    );
}

fn finished_jobs_cannot_be_cancelled_and_unknown_ids_are_reported(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "x")).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    assert!(matches!(
        f.cancel(id),
        Err(Error::Refused {
            state: JobState::Succeeded,
            ..
        })
    ));
    assert!(matches!(
        f.cancel(leasehold::JobId(999)),
        Err(Error::JobNotFound(_))
    ));
    assert!(matches!(
        f.claim_job(leasehold::JobId(999), "w", lease()),
        Err(Error::JobNotFound(_))
    ));
}
