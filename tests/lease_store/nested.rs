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
