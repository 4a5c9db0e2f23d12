//! Waiting for an end: `wait_for` returns a job once it has ended, `wait_for_group` a group,
//! whichever thread, process or machine ended it. Real threads end the jobs here, so each
//! wait has a generous deadline and no assertion on how long it took.

use std::time::Duration;

use leasehold::{Error, GroupId, JobId, JobState, NewGroup, NewJob};

use crate::on_both::{Kind, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_wait_returns_the_job_as_it_ended_once_another_thread_completes_it,
    a_wait_sees_an_end_that_is_no_attempts_end,
    a_wait_hears_an_end_committed_on_another_machine,
    a_group_wait_returns_the_group_with_its_counts_once_its_last_member_ends,
);

/// Long enough for any loaded machine; a wait that succeeds returns far sooner. One that
/// came back only at its deadline (its last look) did not look again as it should have.
const DEADLINE: Duration = Duration::from_secs(60);
/// A wait that must come back empty: the job is still running.
const SHORT: Duration = Duration::from_millis(20);

/// `wait`'s answer, once it came back well before [`DEADLINE`].
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn before_the_deadline<T>(wait: impl FnOnce() -> T) -> T {
    let began = std::time::Instant::now();
    let answer = wait();
    assert!(
        began.elapsed() < DEADLINE / 2,
        "the wait came back only at its deadline"
    );
    answer
}

/// A running job: no end to return within a short wait. Completed by another thread, it is
/// returned as it ended (its output readable), and at once by a later wait; an unknown job
/// is refused.
fn a_wait_returns_the_job_as_it_ended_once_another_thread_completes_it(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "order 42")).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert!(f.wait_for(id, SHORT).unwrap().is_none(), "it is running");
    let other = f.handle();
    let ended = std::thread::scope(|s| {
        let mine = f.handle();
        let waiter = s.spawn(move || before_the_deadline(|| mine.wait_for(id, DEADLINE)));
        other.complete(&l, b"receipt").unwrap();
        waiter.join().unwrap()
    });
    let job = ended.unwrap().expect("ended within the deadline");
    assert_eq!((job.id(), job.state()), (id, JobState::Succeeded));
    assert_eq!(f.output(id).unwrap().as_deref(), Some(&b"receipt"[..]));
    let again = f.wait_for(id, Duration::ZERO).unwrap();
    assert_eq!(again.map(|j| j.state()), Some(JobState::Succeeded));
    assert!(matches!(
        f.wait_for(JobId(999_999), SHORT),
        Err(Error::JobNotFound(JobId(999_999)))
    ));
}

/// A cancel of a waiting job ends no attempt and tells no event: the wait sees it by
/// reading the record.
fn a_wait_sees_an_end_that_is_no_attempts_end(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "unwanted")).unwrap();
    let other = f.handle();
    let ended = std::thread::scope(|s| {
        let mine = f.handle();
        let waiter = s.spawn(move || before_the_deadline(|| mine.wait_for(id, DEADLINE)));
        other.cancel(id).unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(ended.unwrap().map(|j| j.state()), Some(JobState::Cancelled));
}

/// On PostgreSQL, a machine that ends a job tells the waiting machine nothing: the waiter
/// reads it. (A store of one host has no other machine.)
fn a_wait_hears_an_end_committed_on_another_machine(kind: Kind) {
    let f = kind.open();
    let Some(elsewhere) = f.another_machine() else {
        return;
    };
    let id = f.enqueue(NewJob::new(Q, "remote")).unwrap();
    let ended = std::thread::scope(|s| {
        let mine = f.handle();
        let waiter = s.spawn(move || before_the_deadline(|| mine.wait_for(id, DEADLINE)));
        let l = elsewhere.claim(Q, "far", lease()).unwrap().unwrap();
        elsewhere.fail_permanently(&l, "no such customer").unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(ended.unwrap().map(|j| j.state()), Some(JobState::Dead));
}

/// A group's wait returns once it is sealed and its last member ended, with the counts it
/// ended with; an unknown group is refused.
fn a_group_wait_returns_the_group_with_its_counts_once_its_last_member_ends(kind: Kind) {
    let f = kind.open();
    let made = f
        .enqueue_group(
            NewGroup::new(),
            vec![NewJob::new(Q, "a"), NewJob::new(Q, "b")],
        )
        .unwrap();
    let group = made.0;
    assert!(f.wait_for_group(group, SHORT).unwrap().is_none());
    let other = f.handle();
    let ended = std::thread::scope(|s| {
        let mine = f.handle();
        let waiter = s.spawn(move || before_the_deadline(|| mine.wait_for_group(group, DEADLINE)));
        let first = other.claim(Q, "w", lease()).unwrap().unwrap();
        assert_eq!(first.job, made.1[0]);
        other.complete(&first, b"").unwrap();
        other.cancel(made.1[1]).unwrap();
        waiter.join().unwrap()
    });
    let group_now = ended.unwrap().expect("ended within the deadline");
    assert_eq!(group_now.ended(), (1, 0, 1));
    assert_eq!(group_now.outcome(), Some(JobState::Cancelled));
    assert!(matches!(
        f.wait_for_group(GroupId(999_999), SHORT),
        Err(Error::GroupNotFound(GroupId(999_999)))
    ));
}
