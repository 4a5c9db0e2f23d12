//! Groups in groups: a group opened in another is one of its members, and its end is
//! counted there once, as its outcome, in the transaction that ended it.

use leasehold::{Error, GroupId, JobId, JobState, NewGroup, NewJob};

use crate::on_both::{Backend, Kind, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_nested_group_counts_once_in_its_parent_and_the_parents_callback_waits_for_it,
    a_nested_group_that_ends_otherwise_ends_so_in_its_parent,
    cancelling_a_group_cancels_its_nested_groups_and_their_members,
    an_empty_nested_group_ends_in_its_parent_when_it_is_sealed,
    a_group_joins_no_sealed_or_unknown_group_and_nothing_is_written,
    the_stats_count_the_open_groups_and_the_jobs_waiting_for_them,
    a_group_is_purged_once_nothing_refers_to_it_and_gives_up_its_key,
);

fn state(f: &Backend, id: JobId) -> JobState {
    f.job(id).unwrap().unwrap().state()
}

fn counts(f: &Backend, g: GroupId) -> ((u64, u64, u64), Option<JobState>) {
    let group = f.group(g).unwrap().unwrap();
    (group.ended(), group.outcome())
}

/// Claims and completes the next job of `Q`, which must be `id`.
fn complete(f: &Backend, id: JobId) {
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(l.job, id);
    f.complete(&l, b"").unwrap();
}

/// The parent's callback runs only after its own member and its nested group's member
/// both succeeded; each end is counted once where it belongs.
fn a_nested_group_counts_once_in_its_parent_and_the_parents_callback_waits_for_it(kind: Kind) {
    let f = kind.open();
    let parent = f
        .open_group(NewGroup::new().on_success(NewJob::new("after", "all done")))
        .unwrap();
    let child = f.open_group(NewGroup::new().in_group(parent)).unwrap();
    let direct = f
        .enqueue(NewJob::new(Q, "direct").in_group(parent))
        .unwrap();
    let inner = f.enqueue(NewJob::new(Q, "inner").in_group(child)).unwrap();
    f.seal_group(child).unwrap();
    f.seal_group(parent).unwrap();
    let (p, c) = (
        f.group(parent).unwrap().unwrap(),
        f.group(child).unwrap().unwrap(),
    );
    assert_eq!((p.members(), p.subgroups()), (2, &[child][..]));
    assert_eq!((c.members(), c.parent()), (1, Some(parent)));
    let callback = p.waiters()[0];
    complete(&f, direct);
    assert_eq!(counts(&f, parent), ((1, 0, 0), None));
    assert_eq!(state(&f, callback), JobState::Blocked);
    complete(&f, inner);
    assert_eq!(counts(&f, child), ((1, 0, 0), Some(JobState::Succeeded)));
    assert_eq!(counts(&f, parent), ((2, 0, 0), Some(JobState::Succeeded)));
    assert_eq!(state(&f, callback), JobState::Queued);
    // A member retried after its group ended is counted again nowhere.
    let l = f.claim("after", "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    assert_eq!(counts(&f, parent), ((2, 0, 0), Some(JobState::Succeeded)));
}

/// A nested group one of whose members died ends dead, and its parent counts a dead
/// member: the parent's success callback is cancelled, its completion callback runs.
fn a_nested_group_that_ends_otherwise_ends_so_in_its_parent(kind: Kind) {
    let f = kind.open();
    let outer = NewGroup::new()
        .on_success(NewJob::new("after", "only on success"))
        .on_complete(NewJob::new("after", "in any case"));
    let parent = f.open_group(outer).unwrap();
    let child = f.open_group(NewGroup::new().in_group(parent)).unwrap();
    let inner = f.enqueue(NewJob::new(Q, "inner").in_group(child)).unwrap();
    f.seal_group(child).unwrap();
    f.seal_group(parent).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(l.job, inner);
    f.fail_permanently(&l, "bad input").unwrap();
    assert_eq!(counts(&f, child), ((0, 1, 0), Some(JobState::Dead)));
    assert_eq!(counts(&f, parent), ((0, 1, 0), Some(JobState::Dead)));
    let waiters = f.group(parent).unwrap().unwrap().waiters().to_vec();
    let states: Vec<_> = waiters.iter().map(|w| state(&f, *w)).collect();
    assert!(states.contains(&JobState::Cancelled), "{states:?}");
    assert!(states.contains(&JobState::Queued), "{states:?}");
}

/// Cancelling a group cancels the groups in it, and their members, down the tree; each
/// nested group ends cancelled, and so does the group cancelled.
fn cancelling_a_group_cancels_its_nested_groups_and_their_members(kind: Kind) {
    let f = kind.open();
    let top = f.open_group(NewGroup::new()).unwrap();
    let middle = f.open_group(NewGroup::new().in_group(top)).unwrap();
    let bottom = (f.open_group(
        NewGroup::new()
            .in_group(middle)
            .on_complete(NewJob::new("after", "cb")),
    ))
    .unwrap();
    let deep = f.enqueue(NewJob::new(Q, "deep").in_group(bottom)).unwrap();
    let outside = f.enqueue(NewJob::new(Q, "outside")).unwrap();
    assert!(f.cancel_group(top).unwrap() >= 1);
    assert_eq!(state(&f, deep), JobState::Cancelled);
    assert_eq!(state(&f, outside), JobState::Queued);
    for g in [bottom, middle, top] {
        assert_eq!(
            counts(&f, g),
            ((0, 0, 1), Some(JobState::Cancelled)),
            "group {g}"
        );
    }
    let cb = f.group(bottom).unwrap().unwrap().waiters()[0];
    assert_eq!(state(&f, cb), JobState::Cancelled);
}

/// A nested group with no member ends when it is sealed, and its parent counts it then.
fn an_empty_nested_group_ends_in_its_parent_when_it_is_sealed(kind: Kind) {
    let f = kind.open();
    let parent = f.open_group(NewGroup::new()).unwrap();
    let child = f.open_group(NewGroup::new().in_group(parent)).unwrap();
    f.seal_group(parent).unwrap();
    assert_eq!(
        counts(&f, parent),
        ((0, 0, 0), None),
        "its nested group is open"
    );
    f.seal_group(child).unwrap();
    assert_eq!(counts(&f, parent), ((1, 0, 0), Some(JobState::Succeeded)));
}

/// A group opened in a sealed or unknown group is refused, and no group is made.
fn a_group_joins_no_sealed_or_unknown_group_and_nothing_is_written(kind: Kind) {
    let f = kind.open();
    let sealed = f.open_group(NewGroup::new()).unwrap();
    f.seal_group(sealed).unwrap();
    match f.open_group(NewGroup::new().in_group(sealed)) {
        Err(Error::GroupSealed(g)) => assert_eq!(g, sealed),
        other => panic!("{other:?}"),
    }
    let unknown = GroupId(sealed.0 + 100);
    match f.enqueue_group(NewGroup::new().in_group(unknown), vec![NewJob::new(Q, "m")]) {
        Err(Error::GroupNotFound(g)) => assert_eq!(g, unknown),
        other => panic!("{other:?}"),
    }
    let sealed_now = f.group(sealed).unwrap().unwrap();
    assert_eq!((sealed_now.members(), sealed_now.subgroups()), (0, &[][..]));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
}

/// `(open groups, jobs waiting for them)`, as the store's stats count them.
fn group_gauges(f: &Backend) -> (u64, u64) {
    let stats = f.stats().unwrap();
    (stats.open_groups, stats.waiting_for_groups)
}

/// An operator's view of workflows in flight: the groups that have not ended, however they
/// end (empty and sealed, by their members, cancelled, nested), and the callbacks held for
/// them.
fn the_stats_count_the_open_groups_and_the_jobs_waiting_for_them(kind: Kind) {
    let f = kind.open();
    assert_eq!(group_gauges(&f), (0, 0));
    let parent = f
        .open_group(
            NewGroup::new()
                .on_success(NewJob::new("after", "all done"))
                .on_complete(NewJob::new("after", "either way")),
        )
        .unwrap();
    let child = f.open_group(NewGroup::new().in_group(parent)).unwrap();
    let direct = f
        .enqueue(NewJob::new(Q, "direct").in_group(parent))
        .unwrap();
    let inner = f.enqueue(NewJob::new(Q, "inner").in_group(child)).unwrap();
    let empty = f.open_group(NewGroup::new()).unwrap();
    let doomed = f.open_group(NewGroup::new().on_complete(NewJob::new("after", "x")));
    let doomed = doomed.unwrap();
    assert_eq!(group_gauges(&f), (4, 3));
    f.seal_group(empty).unwrap();
    assert_eq!(
        group_gauges(&f),
        (3, 3),
        "an empty group ends when it is sealed"
    );
    f.cancel_group(doomed).unwrap();
    assert_eq!(group_gauges(&f), (2, 2), "a cancelled group has ended");
    f.seal_group(child).unwrap();
    f.seal_group(parent).unwrap();
    complete(&f, direct);
    assert_eq!(group_gauges(&f), (2, 2), "sealed, with a member to end");
    complete(&f, inner);
    assert_eq!(
        group_gauges(&f),
        (0, 0),
        "the child ended, and with it the parent"
    );
    let check = f.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

/// Runs every job of `queue` claimable now to success.
fn run_all(f: &Backend, queue: &str) {
    while let Some(l) = f.claim(queue, "w", lease()).unwrap() {
        f.complete(&l, b"").unwrap();
    }
}

/// A group's record outlives its members only as long as something refers to it: its
/// members, its callbacks (a running callback reads its group) and the groups in it are
/// purged first; then the group goes with them, and its key makes a new group again. A
/// dead member, which retention keeps, keeps its group.
fn a_group_is_purged_once_nothing_refers_to_it_and_gives_up_its_key(kind: Kind) {
    use std::time::Duration;
    let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
    let ended = [JobState::Succeeded, JobState::Cancelled];
    let f = kind.open();
    let keyed = NewGroup::new().key("batch 42");
    let batch = keyed.clone().on_complete(NewJob::new("after", "callback"));
    let members = vec![NewJob::new(Q, "a"), NewJob::new(Q, "b")];
    let (group, _) = f.enqueue_group(batch, members).unwrap();
    let parent = f.open_group(NewGroup::new()).unwrap();
    let child = f.open_group(NewGroup::new().in_group(parent)).unwrap();
    f.seal_group(child).unwrap();
    f.seal_group(parent).unwrap();
    let kept = f.open_group(NewGroup::new()).unwrap();
    f.enqueue(NewJob::new("doomed", "d").in_group(kept).max_attempts(1))
        .unwrap();
    f.seal_group(kept).unwrap();
    let l = f.claim("doomed", "w", lease()).unwrap().unwrap();
    f.fail(&l, "no").unwrap();
    run_all(&f, Q);
    f.advance(hour);
    f.purge(minute, &ended).unwrap();
    assert!(
        f.group(group).unwrap().is_some(),
        "its callback waits to run"
    );
    assert!(
        f.group(child).unwrap().is_none(),
        "nothing refers to the child"
    );
    assert!(f.group(kept).unwrap().is_some(), "its dead member is kept");
    run_all(&f, "after");
    f.advance(hour);
    f.purge(minute, &ended).unwrap();
    assert!(
        f.group(group).unwrap().is_none(),
        "its members and callback are gone"
    );
    assert!(f.group(parent).unwrap().is_none(), "its child is gone");
    assert!(f.group(kept).unwrap().is_some());
    let again = f.enqueue_group(keyed, vec![NewJob::new(Q, "c")]).unwrap();
    assert_ne!(again.0, group, "the key makes a new group");
    assert_eq!(
        f.enqueue_group(NewGroup::new().key("batch 42"), vec![])
            .unwrap()
            .0,
        again.0
    );
    let check = f.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}
