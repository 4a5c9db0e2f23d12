//! Checkpoints: what an attempt saved for the job's next attempts to resume from, under the
//! attempt's fence, kept until the job is purged.

use std::time::Duration;

use leasehold::{Error, InputError, JobState, NewJob};

use crate::on_both::{Kind, LEASE, Q, Setup};

crate::on_both::on_both!(
    and protocol;
    a_checkpoint_is_read_by_the_next_attempt_after_a_takeover_and_after_a_release,
    a_stale_holders_checkpoint_is_refused_and_the_current_holders_stays,
    an_oversized_checkpoint_is_refused_and_a_checkpoint_goes_with_its_purged_job,
);

fn saved(f: &crate::on_both::Backend, job: leasehold::JobId) -> Option<(u32, Vec<u8>)> {
    let c = f.checkpoint(job).unwrap()?;
    Some((c.attempt().0, c.into_data()))
}

/// The attempt after a takeover (the holder went silent) reads what the first saved; the
/// attempt after a release reads what the second saved; each save replaces the last.
fn a_checkpoint_is_read_by_the_next_attempt_after_a_takeover_and_after_a_release(kind: Kind) {
    let f = kind.open();
    let job = f.enqueue(NewJob::new(Q, "long")).unwrap();
    assert_eq!(saved(&f, job), None);
    let first = f.claim_one("a");
    f.save_checkpoint(&first, b"row 100").unwrap();
    let at = f.now();
    f.save_checkpoint(&first, b"row 300").unwrap();
    let c = f.checkpoint(job).unwrap().unwrap();
    assert!(c.saved_at() >= at, "{c:?}");
    f.advance(LEASE + Duration::from_secs(1));
    let second = f.claim_one("b");
    assert_eq!(second.attempt.0, 2, "a takeover");
    assert_eq!(saved(&f, job), Some((1, b"row 300".to_vec())));
    f.save_checkpoint(&second, b"row 600").unwrap();
    f.release(&second).unwrap();
    let third = f.claim_one("c");
    assert_eq!(saved(&f, job), Some((2, b"row 600".to_vec())));
    f.complete(&third, b"done").unwrap();
    assert_eq!(
        saved(&f, job),
        Some((2, b"row 600".to_vec())),
        "kept with the job"
    );
}

/// A holder whose lease was taken back cannot overwrite what the job's new holder saved:
/// its save is refused as a lost lease and counted as a fenced write.
fn a_stale_holders_checkpoint_is_refused_and_the_current_holders_stays(kind: Kind) {
    let f = kind.open();
    let job = f.enqueue(NewJob::new(Q, "long")).unwrap();
    let stale = f.claim_one("a");
    f.advance(LEASE + Duration::from_secs(1));
    let current = f.claim_one("b");
    f.save_checkpoint(&current, b"new").unwrap();
    let fenced = f.stats().unwrap().counters.fenced_writes_rejected;
    let refused = f.save_checkpoint(&stale, b"old").unwrap_err();
    assert!(refused.is_lease_lost(), "{refused:?}");
    assert_eq!(saved(&f, job), Some((2, b"new".to_vec())));
    assert_eq!(
        f.stats().unwrap().counters.fenced_writes_rejected,
        fenced + 1
    );
    f.complete(&current, b"").unwrap();
    let late = f.save_checkpoint(&current, b"after the end").unwrap_err();
    assert!(
        late.is_lease_lost(),
        "an ended attempt saves nothing: {late:?}"
    );
    assert_eq!(saved(&f, job), Some((2, b"new".to_vec())));
}

/// A checkpoint is no larger than a payload may be; a purged job's checkpoint is gone with
/// it.
fn an_oversized_checkpoint_is_refused_and_a_checkpoint_goes_with_its_purged_job(kind: Kind) {
    let f = kind.with(Setup::default().max_payload(16));
    let job = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let l = f.claim_one("a");
    match f.save_checkpoint(&l, &[7; 17]) {
        Err(Error::Input(InputError::TooLarge {
            what: "checkpoint",
            len: 17,
            max: 16,
        })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(saved(&f, job), None);
    f.save_checkpoint(&l, &[7; 16]).unwrap();
    f.complete(&l, b"").unwrap();
    f.advance(Duration::from_secs(10));
    assert_eq!(
        f.purge(Duration::from_secs(1), &[JobState::Succeeded])
            .unwrap(),
        1
    );
    assert_eq!(saved(&f, job), None);
}
