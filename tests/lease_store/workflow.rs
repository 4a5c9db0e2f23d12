//! Jobs that wait for jobs, and groups: released by the end they wait for, in its
//! transaction, never by a fenced-out holder, never twice, never left waiting.

use leasehold::{
    Error, InputError, JobFilter, JobId, JobOrder, JobState, MAX_DEPENDENCIES, NewGroup, NewJob,
    Require, Target,
};

use crate::on_both::{Backend, Kind, LEASE, Q, lease};

crate::on_both::on_both!(
    and protocol;
    a_waiter_is_blocked_until_its_dependency_succeeds_then_claimable,
    a_waiter_of_several_runs_only_after_the_last_and_reads_their_outputs,
    a_dependency_that_dies_cancels_its_waiter_and_names_itself,
    a_waiter_can_accept_a_dead_or_cancelled_dependency,
    a_stale_completion_releases_no_one,
    a_reaped_lease_that_spends_the_last_attempt_cancels_the_waiters,
    a_cancel_cascades_down_a_chain_of_waiters,
    retrying_a_dead_dependency_rearms_the_waiters_it_cancelled,
    a_dependency_already_over_counts_at_enqueue,
    a_dependency_on_an_unknown_job_is_refused_and_nothing_is_written,
    too_many_dependencies_are_refused,
    a_group_runs_its_callback_once_when_the_sealed_groups_last_member_ends,
    the_success_callback_is_cancelled_when_a_member_did_not_succeed,
    a_sealed_group_refuses_members_and_an_open_one_refuses_waiters,
    an_empty_group_ends_when_sealed,
    cancelling_a_group_cancels_its_waiting_members_and_its_callbacks,
    a_retried_member_of_an_open_group_is_counted_once,
    a_member_cannot_have_a_unique_key,
    a_member_whose_dependency_already_died_is_cancelled_and_counted_at_once,
    a_dependency_a_claim_finds_exhausted_dies_and_cancels_its_waiters,
    a_group_runs_every_callback_it_was_given_and_refuses_more_than_its_waiters_allow,
    a_waiter_declared_after_its_group_ended_runs_and_is_listed_among_its_waiters,
    a_groups_listing_names_its_members_alone_in_any_state_and_pages_through_them,
    a_group_key_answers_a_repeated_enqueue_with_the_first_group_and_makes_nothing,
    openings_of_one_group_key_at_once_make_one_group,
);

/// Each `on_complete` and `on_success` adds a callback (a second used to replace the first
/// without a word): all of them run once the group ends, each as its kind says. A group
/// waited for by more than [`leasehold::MAX_GROUP_WAITERS`] jobs is refused whole.
fn a_group_runs_every_callback_it_was_given_and_refuses_more_than_its_waiters_allow(kind: Kind) {
    let f = kind.open();
    let (group, members) = f
        .enqueue_group(
            NewGroup::new()
                .on_complete(NewJob::new("done", "any 1"))
                .on_complete(NewJob::new("done", "any 2"))
                .on_success(NewJob::new("done", "good 1"))
                .on_success(NewJob::new("done", "good 2")),
            vec![NewJob::new(Q, "a"), NewJob::new(Q, "b")],
        )
        .unwrap();
    let waiters = f.group(group).unwrap().unwrap().waiters().to_vec();
    assert_eq!(waiters.len(), 4);
    let first = f.claim_one("w");
    f.complete(&first, b"").unwrap();
    let second = f.claim_one("w");
    f.fail_permanently(&second, "no").unwrap();
    assert_eq!(members.len(), 2);
    let states: Vec<JobState> = waiters.iter().map(|&w| state(&f, w)).collect();
    assert_eq!(
        states,
        [
            JobState::Queued,
            JobState::Queued,
            JobState::Cancelled,
            JobState::Cancelled
        ]
    );
    let mut ran: Vec<String> = std::iter::from_fn(|| f.claim("done", "w", lease()).unwrap())
        .map(|l| String::from_utf8_lossy(&l.payload).into_owned())
        .collect();
    ran.sort();
    assert_eq!(ran, ["any 1", "any 2"]);
    let too_many = (0..=leasehold::MAX_GROUP_WAITERS).fold(NewGroup::new(), |g, i| {
        g.on_complete(NewJob::new("done", format!("{i}")))
    });
    let before = f.stats().unwrap().total(JobState::Blocked);
    assert!(matches!(
        f.open_group(too_many),
        Err(Error::GroupLimit {
            limit: "waiters",
            ..
        })
    ));
    assert_eq!(
        f.stats().unwrap().total(JobState::Blocked),
        before,
        "nothing of the refused group was written"
    );
}

/// A job that waits for a group which has already ended runs at once (or is cancelled), as
/// its need asks, and the group lists it among its waiters like any other.
fn a_waiter_declared_after_its_group_ended_runs_and_is_listed_among_its_waiters(kind: Kind) {
    let f = kind.open();
    let (group, _) = f
        .enqueue_group(NewGroup::new(), vec![NewJob::new(Q, "only")])
        .unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    assert!(f.group(group).unwrap().unwrap().finished_at().is_some());
    let late = f
        .enqueue(NewJob::new("after", "late").after_with(Target::Group(group), Require::success()))
        .unwrap();
    assert_eq!(state(&f, late), JobState::Queued);
    assert_eq!(f.group(group).unwrap().unwrap().waiters(), [late]);
}

fn a_dependency_a_claim_finds_exhausted_dies_and_cancels_its_waiters(kind: Kind) {
    let mut f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep")).unwrap();
    let (group, members) = f
        .enqueue_group(
            NewGroup::new().on_complete(NewJob::new("done", "cb")),
            vec![NewJob::new(Q, "member").after(dep)],
        )
        .unwrap();
    let waiter = f.enqueue(NewJob::new("w", "waiter").after(dep)).unwrap();
    // Its attempt counter at the end: the next claim makes it dead rather than lease it.
    f.forge_attempt(dep, u32::MAX);
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    assert_eq!(state(&f, dep), JobState::Dead);
    assert_eq!(
        state(&f, waiter),
        JobState::Cancelled,
        "nothing waits for ever"
    );
    assert_eq!(state(&f, members[0]), JobState::Cancelled);
    let g = f.group(group).unwrap().unwrap();
    assert_eq!(g.ended(), (0, 0, 1));
    assert_eq!(
        state(&f, g.waiters()[0]),
        JobState::Queued,
        "the group ended, as cancelled"
    );
    // The forged record claims attempts it has no history of; the check says so of it alone.
    let problems = f.check().unwrap().problems;
    assert!(problems.iter().all(|p| p.contains("job 1")), "{problems:?}");
    f.close_unchecked();
}

fn a_member_whose_dependency_already_died_is_cancelled_and_counted_at_once(kind: Kind) {
    let f = kind.open();
    let dead = f.enqueue(NewJob::new(Q, "dead")).unwrap();
    f.cancel(dead).unwrap();
    let (group, ids) = f
        .enqueue_group(
            NewGroup::new().on_complete(NewJob::new("done", "cb")),
            vec![
                NewJob::new(Q, "a"),
                NewJob::new(Q, "b").after(dead),
                NewJob::new(Q, "c"),
            ],
        )
        .unwrap();
    assert_eq!(state(&f, ids[1]), JobState::Cancelled);
    let g = f.group(group).unwrap().unwrap();
    assert_eq!((g.members(), g.ended()), (3, (0, 0, 1)));
    assert_eq!(drain(&f).len(), 2);
    let g = f.group(group).unwrap().unwrap();
    assert_eq!(
        (g.ended(), g.outcome()),
        ((2, 0, 1), Some(JobState::Cancelled))
    );
    assert_eq!(state(&f, g.waiters()[0]), JobState::Queued);
}

fn state(f: &Backend, id: JobId) -> JobState {
    f.job(id).unwrap().unwrap().state()
}

/// Claims and completes every claimable job of `Q`, returning the ids in order.
fn drain(f: &Backend) -> Vec<JobId> {
    let mut done = Vec::new();
    while let Some(l) = f.claim(Q, "w", lease()).unwrap() {
        f.complete(&l, format!("out-{}", l.job).as_bytes()).unwrap();
        done.push(l.job);
    }
    done
}

fn a_waiter_is_blocked_until_its_dependency_succeeds_then_claimable(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep")).unwrap();
    let waiter = f.enqueue(NewJob::new(Q, "waiter").after(dep)).unwrap();
    assert_eq!(state(&f, waiter), JobState::Blocked);
    let l = f.claim_one("w");
    assert_eq!(l.job, dep, "the waiter is not claimable");
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
    f.complete(&l, b"").unwrap();
    assert_eq!(state(&f, waiter), JobState::Queued);
    let job = f.job(waiter).unwrap().unwrap();
    assert_eq!(job.needs()[0].on(), Target::Job(dep));
    assert_eq!(job.needs()[0].ended(), Some(JobState::Succeeded));
    assert_eq!(f.claim_one("w").job, waiter);
}

fn a_waiter_of_several_runs_only_after_the_last_and_reads_their_outputs(kind: Kind) {
    let f = kind.open();
    let deps: Vec<JobId> = (0..3)
        .map(|i| {
            f.enqueue(NewJob::new("clips", format!("clip-{i}")))
                .unwrap()
        })
        .collect();
    let waiter = deps
        .iter()
        .fold(NewJob::new(Q, "bundle"), |job, &d| job.after(d));
    let waiter = f.enqueue(waiter).unwrap();
    for (i, _) in deps.iter().enumerate() {
        assert_eq!(
            state(&f, waiter),
            JobState::Blocked,
            "before clip {i} ended"
        );
        let l = f.claim("clips", "w", lease()).unwrap().unwrap();
        f.complete(&l, format!("transcoded-{}", l.job).as_bytes())
            .unwrap();
    }
    assert_eq!(state(&f, waiter), JobState::Queued);
    let outputs = f.dependency_outputs(waiter).unwrap();
    let expected: Vec<_> = (deps.iter())
        .map(|&d| (d, Some(format!("transcoded-{d}").into_bytes())))
        .collect();
    assert_eq!(outputs, expected);
    for &dep in &deps {
        assert_eq!(f.waiters(dep).unwrap(), vec![waiter]);
    }
}

fn a_dependency_that_dies_cancels_its_waiter_and_names_itself(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep").max_attempts(1)).unwrap();
    let waiter = f.enqueue(NewJob::new(Q, "w").after(dep)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    let job = f.job(waiter).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Cancelled);
    let why = job.last_error().unwrap();
    assert!(
        why.contains(&format!("job {dep}")) && why.contains("dead"),
        "{why}"
    );
    assert!(job.needs()[0].broken());
    assert!(f.claim(Q, "w", lease()).unwrap().is_none());
}

fn a_waiter_can_accept_a_dead_or_cancelled_dependency(kind: Kind) {
    let f = kind.open();
    let dead = f.enqueue(NewJob::new(Q, "a").max_attempts(1)).unwrap();
    let cancelled = f.enqueue(NewJob::new(Q, "b")).unwrap();
    let either = NewJob::new(Q, "either")
        .after_with(Target::Job(dead), Require::success().or_dead())
        .after_with(Target::Job(cancelled), Require::success().or_cancelled());
    let either = f.enqueue(either).unwrap();
    let strict = f
        .enqueue(
            NewJob::new(Q, "strict")
                .after_with(Target::Job(dead), Require::success().or_cancelled()),
        )
        .unwrap();
    f.cancel(cancelled).unwrap();
    assert_eq!(state(&f, either), JobState::Blocked);
    let l = f.claim_one("w");
    f.fail(&l, "x").unwrap();
    assert_eq!(state(&f, either), JobState::Queued);
    assert_eq!(state(&f, strict), JobState::Cancelled);
}

fn a_stale_completion_releases_no_one(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep")).unwrap();
    let waiter = f.enqueue(NewJob::new(Q, "w").after(dep)).unwrap();
    let stale = f.claim_one("a");
    f.advance(LEASE);
    f.reap().unwrap();
    let fresh = f.claim_one("b");
    assert!(f.complete(&stale, b"late").unwrap_err().is_lease_lost());
    assert_eq!(
        state(&f, waiter),
        JobState::Blocked,
        "a fenced-out end released it"
    );
    f.complete(&fresh, b"").unwrap();
    assert_eq!(state(&f, waiter), JobState::Queued);
}

fn a_reaped_lease_that_spends_the_last_attempt_cancels_the_waiters(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep").max_attempts(1)).unwrap();
    let waiter = f.enqueue(NewJob::new(Q, "w").after(dep)).unwrap();
    let _silent = f.claim_one("a");
    f.advance(LEASE);
    assert_eq!(f.reap().unwrap().reclaimed[0].job_state, JobState::Dead);
    assert_eq!(state(&f, waiter), JobState::Cancelled);
}

fn a_cancel_cascades_down_a_chain_of_waiters(kind: Kind) {
    let f = kind.open();
    let a = f.enqueue(NewJob::new(Q, "a")).unwrap();
    let b = f.enqueue(NewJob::new(Q, "b").after(a)).unwrap();
    let c = f.enqueue(NewJob::new(Q, "c").after(b)).unwrap();
    let tolerant = f
        .enqueue(NewJob::new(Q, "d").after_with(Target::Job(c), Require::any_end()))
        .unwrap();
    f.cancel(a).unwrap();
    assert_eq!(state(&f, b), JobState::Cancelled);
    assert_eq!(state(&f, c), JobState::Cancelled);
    assert_eq!(state(&f, tolerant), JobState::Queued, "it accepts any end");
}

fn retrying_a_dead_dependency_rearms_the_waiters_it_cancelled(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "dep").max_attempts(1)).unwrap();
    let other = f.enqueue(NewJob::new("other", "other")).unwrap();
    let waiter = f
        .enqueue(NewJob::new("w", "w").after(dep).after(other))
        .unwrap();
    let next = f.enqueue(NewJob::new("w", "next").after(waiter)).unwrap();
    let l = f.claim_one("a");
    f.fail(&l, "x").unwrap();
    assert_eq!(state(&f, waiter), JobState::Cancelled);
    assert_eq!(state(&f, next), JobState::Cancelled);
    // `other` succeeds while the waiter is cancelled: the re-armed waiter sees it.
    let o = f.claim("other", "a", lease()).unwrap().unwrap();
    f.complete(&o, b"").unwrap();
    f.retry(dep).unwrap();
    assert_eq!(state(&f, waiter), JobState::Blocked);
    assert_eq!(
        state(&f, next),
        JobState::Blocked,
        "re-armed down the chain"
    );
    assert_eq!(f.job(waiter).unwrap().unwrap().last_error(), None);
    let l = f.claim_one("a");
    f.complete(&l, b"").unwrap();
    assert_eq!(state(&f, waiter), JobState::Queued);
}

fn a_dependency_already_over_counts_at_enqueue(kind: Kind) {
    let f = kind.open();
    let done = f.enqueue(NewJob::new(Q, "done")).unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    let dead = f.enqueue(NewJob::new(Q, "dead")).unwrap();
    f.cancel(dead).unwrap();
    let ready = f.enqueue(NewJob::new(Q, "r").after(done)).unwrap();
    assert_eq!(state(&f, ready), JobState::Queued);
    let doomed = f
        .enqueue(NewJob::new(Q, "d").after(done).after(dead))
        .unwrap();
    assert_eq!(
        state(&f, doomed),
        JobState::Cancelled,
        "never waits for ever"
    );
    assert_eq!(drain(&f), vec![ready]);
}

fn a_dependency_on_an_unknown_job_is_refused_and_nothing_is_written(kind: Kind) {
    let f = kind.open();
    let real = f.enqueue(NewJob::new(Q, "real")).unwrap();
    let unknown = JobId(real.0 + 1000);
    let refused = f.enqueue(NewJob::new(Q, "w").after(real).after(unknown));
    assert!(matches!(refused, Err(Error::DependencyNotFound(id)) if id == unknown));
    assert_eq!(f.jobs(&Default::default()).unwrap().len(), 1);
    // Nor a group that does not exist.
    let refused = f.enqueue(NewJob::new(Q, "m").in_group(leasehold::GroupId(77)));
    assert!(matches!(refused, Err(Error::GroupNotFound(_))));
}

fn too_many_dependencies_are_refused(kind: Kind) {
    let f = kind.open();
    let dep = f.enqueue(NewJob::new(Q, "d")).unwrap();
    let many = (0..=MAX_DEPENDENCIES).fold(NewJob::new(Q, "w"), |j, _| j.after(dep));
    assert!(matches!(
        f.enqueue(many),
        Err(Error::Input(InputError::TooManyDependencies { .. }))
    ));
}

fn a_group_runs_its_callback_once_when_the_sealed_groups_last_member_ends(kind: Kind) {
    let f = kind.open();
    let group = f
        .open_group(NewGroup::new().on_complete(NewJob::new("done", "bundle")))
        .unwrap();
    let callback = f.group(group).unwrap().unwrap().waiters()[0];
    assert_eq!(state(&f, callback), JobState::Blocked);
    let members: Vec<JobId> = (0..4)
        .map(|i| {
            f.enqueue(NewJob::new(Q, format!("m{i}")).in_group(group))
                .unwrap()
        })
        .collect();
    let first = f.claim_one("w");
    f.complete(&first, b"").unwrap();
    let second = f.claim_one("w");
    f.fail_permanently(&second, "bad clip").unwrap();
    f.seal_group(group).unwrap();
    assert_eq!(
        state(&f, callback),
        JobState::Blocked,
        "two members still run"
    );
    assert_eq!(drain(&f).len(), 2);
    assert_eq!(state(&f, callback), JobState::Queued);
    let g = f.group(group).unwrap().unwrap();
    assert_eq!((g.members(), g.ended()), (4, (3, 1, 0)));
    assert_eq!(g.outcome(), Some(JobState::Dead));
    assert!(
        members
            .iter()
            .all(|&m| f.job(m).unwrap().unwrap().group() == Some(group))
    );
    let l = f.claim("done", "w", lease()).unwrap().unwrap();
    assert_eq!(l.job, callback);
    f.complete(&l, b"").unwrap();
    assert!(
        f.claim("done", "w", lease()).unwrap().is_none(),
        "exactly once"
    );
}

fn the_success_callback_is_cancelled_when_a_member_did_not_succeed(kind: Kind) {
    let f = kind.open();
    let (group, ids) = f
        .enqueue_group(
            NewGroup::new()
                .on_complete(NewJob::new("done", "any"))
                .on_success(NewJob::new("done", "all good")),
            vec![NewJob::new(Q, "a"), NewJob::new(Q, "b")],
        )
        .unwrap();
    f.cancel(ids[0]).unwrap();
    drain(&f);
    let waiters = f.group(group).unwrap().unwrap().waiters().to_vec();
    assert_eq!(state(&f, waiters[0]), JobState::Queued);
    assert_eq!(state(&f, waiters[1]), JobState::Cancelled);
    // All good this time: both callbacks run.
    let (group, _) = f
        .enqueue_group(
            NewGroup::new()
                .on_complete(NewJob::new("done", "any"))
                .on_success(NewJob::new("done", "all good")),
            vec![NewJob::new(Q, "c")],
        )
        .unwrap();
    drain(&f);
    let g = f.group(group).unwrap().unwrap();
    assert_eq!(g.outcome(), Some(JobState::Succeeded));
    for &w in g.waiters() {
        assert_eq!(state(&f, w), JobState::Queued);
    }
}

fn a_sealed_group_refuses_members_and_an_open_one_refuses_waiters(kind: Kind) {
    let f = kind.open();
    let group = f
        .open_group(NewGroup::new().on_complete(NewJob::new("done", "cb")))
        .unwrap();
    let callback = f.group(group).unwrap().unwrap().waiters()[0];
    let member = f.enqueue(NewJob::new(Q, "m").in_group(group)).unwrap();
    // While open, nothing but its callbacks waits for it, or for them: a member waiting for
    // the callback would wait for its own group.
    let refused = f.enqueue(NewJob::new(Q, "x").in_group(group).after(callback));
    assert!(matches!(refused, Err(Error::GroupOpen(g)) if g == group));
    let refused =
        f.enqueue(NewJob::new(Q, "y").after_with(Target::Group(group), Require::any_end()));
    assert!(matches!(refused, Err(Error::GroupOpen(_))));
    f.seal_group(group).unwrap();
    let late = f.enqueue(NewJob::new(Q, "late").in_group(group));
    assert!(matches!(late, Err(Error::GroupSealed(g)) if g == group));
    // Sealed, it may be waited for.
    let after = f
        .enqueue(NewJob::new("after", "z").after_with(Target::Group(group), Require::success()))
        .unwrap();
    let l = f.claim_one("w");
    assert_eq!(l.job, member);
    f.complete(&l, b"").unwrap();
    assert_eq!(state(&f, after), JobState::Queued);
    assert_eq!(state(&f, callback), JobState::Queued);
}

fn an_empty_group_ends_when_sealed(kind: Kind) {
    let f = kind.open();
    let (group, ids) = f
        .enqueue_group(
            NewGroup::new().on_success(NewJob::new("done", "cb")),
            vec![],
        )
        .unwrap();
    assert!(ids.is_empty());
    let g = f.group(group).unwrap().unwrap();
    assert!(g.finished_at().is_some());
    assert_eq!(state(&f, g.waiters()[0]), JobState::Queued);
}

fn cancelling_a_group_cancels_its_waiting_members_and_its_callbacks(kind: Kind) {
    let f = kind.open();
    let (group, ids) = f
        .enqueue_group(
            NewGroup::new().on_complete(NewJob::new("done", "cb")),
            (0..3).map(|i| NewJob::new(Q, format!("m{i}"))).collect(),
        )
        .unwrap();
    let running = f.claim_one("w");
    assert_eq!(
        f.cancel_group(group).unwrap(),
        4,
        "a callback, two waiting, one flagged"
    );
    let callback = f.group(group).unwrap().unwrap().waiters()[0];
    assert_eq!(state(&f, callback), JobState::Cancelled);
    assert_eq!(state(&f, ids[1]), JobState::Cancelled);
    assert!(f.job(running.job).unwrap().unwrap().cancel_requested());
    assert_eq!(
        f.heartbeat(&running, 1).unwrap(),
        leasehold::Renewal::Cancelled
    );
    let g = f.group(group).unwrap().unwrap();
    assert_eq!(g.outcome(), Some(JobState::Cancelled));
    assert_eq!(state(&f, callback), JobState::Cancelled, "it never ran");
}

fn a_retried_member_of_an_open_group_is_counted_once(kind: Kind) {
    let f = kind.open();
    let group = f
        .open_group(NewGroup::new().on_complete(NewJob::new("done", "cb")))
        .unwrap();
    let member = f
        .enqueue(NewJob::new(Q, "m").max_attempts(1).in_group(group))
        .unwrap();
    let l = f.claim_one("w");
    f.fail(&l, "x").unwrap();
    assert_eq!(f.group(group).unwrap().unwrap().ended(), (0, 1, 0));
    f.retry(member).unwrap();
    assert_eq!(f.group(group).unwrap().unwrap().ended(), (0, 0, 0));
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    f.seal_group(group).unwrap();
    let g = f.group(group).unwrap().unwrap();
    assert_eq!(
        (g.ended(), g.outcome()),
        ((1, 0, 0), Some(JobState::Succeeded))
    );
}

fn a_member_cannot_have_a_unique_key(kind: Kind) {
    let f = kind.open();
    let group = f.open_group(NewGroup::new()).unwrap();
    assert!(matches!(
        f.enqueue(NewJob::new(Q, "m").unique_key("k").in_group(group)),
        Err(Error::Input(InputError::MemberWithUniqueKey))
    ));
}

/// `JobFilter::group` lists a group's members, whatever their state or queue, with the
/// filter's other conditions and its cursor: not the group's callbacks, not another
/// group's members, not a job outside any group.
fn a_groups_listing_names_its_members_alone_in_any_state_and_pages_through_them(kind: Kind) {
    let f = kind.open();
    let callback = NewJob::new("done", "cb");
    let (group, members) = f
        .enqueue_group(
            NewGroup::new().on_complete(callback),
            vec![
                NewJob::new(Q, "a"),
                NewJob::new("other", "b"),
                NewJob::new(Q, "c"),
            ],
        )
        .unwrap();
    let (_, strangers) = f
        .enqueue_group(NewGroup::new(), vec![NewJob::new(Q, "x")])
        .unwrap();
    let alone = f.enqueue(NewJob::new(Q, "alone")).unwrap();
    let l = f.claim("other", "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    let ids = |filter: JobFilter| -> Vec<JobId> {
        f.jobs(&filter).unwrap().iter().map(|j| j.id()).collect()
    };
    let of_group = JobFilter {
        group: Some(group),
        ..JobFilter::default()
    };
    assert_eq!(ids(of_group.clone()), members);
    assert!(!members.contains(&alone) && !members.contains(&strangers[0]));
    let succeeded = JobFilter {
        state: Some(JobState::Succeeded),
        ..of_group.clone()
    };
    assert_eq!(ids(succeeded), vec![members[1]]);
    let waiting = JobFilter {
        state: Some(JobState::Queued),
        queue: Some(Q.into()),
        ..of_group.clone()
    };
    assert_eq!(ids(waiting), vec![members[0], members[2]]);
    let newest = JobFilter {
        order: JobOrder::Newest,
        limit: Some(1),
        ..of_group.clone()
    };
    assert_eq!(ids(newest), vec![members[2]]);
    let page = JobFilter {
        after: Some(members[0]),
        limit: Some(1),
        ..of_group
    };
    assert_eq!(ids(page), vec![members[1]]);
    let unknown = JobFilter {
        group: Some(leasehold::GroupId(group.0 + 100)),
        ..JobFilter::default()
    };
    assert!(ids(unknown).is_empty());
}

/// An enqueue retried after its answer was lost gets the first group, its members and
/// callbacks as first made, and writes nothing; so does an `open_group` of the key, also
/// after the group ended. A bad key is refused before anything is written.
fn a_group_key_answers_a_repeated_enqueue_with_the_first_group_and_makes_nothing(kind: Kind) {
    let f = kind.open();
    let order = || {
        NewGroup::new()
            .key("order-42")
            .on_success(NewJob::new("done", "cb"))
    };
    let (group, members) = f
        .enqueue_group(order(), vec![NewJob::new(Q, "a"), NewJob::new(Q, "b")])
        .unwrap();
    let jobs = || f.jobs(&JobFilter::default()).unwrap().len();
    assert_eq!(jobs(), 3, "two members and a callback");
    let again = f
        .enqueue_group(order(), vec![NewJob::new(Q, "other")])
        .unwrap();
    assert_eq!(again, (group, members.clone()));
    assert_eq!(jobs(), 3, "nothing made");
    let g = f.group(group).unwrap().unwrap();
    assert_eq!((g.members(), g.waiters().len()), (2, 1));
    assert_eq!(f.open_group(order()).unwrap(), group);
    let other = f.open_group(NewGroup::new().key("order-43")).unwrap();
    assert_ne!(other, group);
    while let Some(l) = f.claim(Q, "w", lease()).unwrap() {
        f.complete(&l, b"").unwrap();
    }
    assert_eq!(
        f.group(group).unwrap().unwrap().outcome(),
        Some(JobState::Succeeded)
    );
    assert_eq!(f.enqueue_group(order(), vec![]).unwrap(), (group, members));
    let refused = |key: &str| {
        let members = vec![NewJob::new(Q, "x")];
        match f.enqueue_group(NewGroup::new().key(key), members) {
            Err(Error::Input(e)) => e,
            other => panic!("{key:?}: {other:?}"),
        }
    };
    assert!(matches!(
        refused(""),
        InputError::BadGroupKey { len: 0, .. }
    ));
    assert!(matches!(
        refused(&"k".repeat(257)),
        InputError::BadGroupKey { len: 257, .. }
    ));
    assert!(matches!(
        refused("a\0b"),
        InputError::NulByte {
            what: "group key",
            ..
        }
    ));
    assert_eq!(jobs(), 3, "nothing written by a refusal");
}

/// Threads opening one key at once (on PostgreSQL, each with a handle of its own) get one
/// group between them, with one set of members: in each of many rounds, all started
/// together.
fn openings_of_one_group_key_at_once_make_one_group(kind: Kind) {
    let f = kind.open();
    const THREADS: usize = 6;
    const ROUNDS: usize = 25;
    let start = std::sync::Barrier::new(THREADS);
    let answers: Vec<Vec<_>> = std::thread::scope(|s| {
        let each: Vec<_> = (0..THREADS)
            .map(|i| {
                // (on PostgreSQL, each as another machine: a handle of its own)
                let store = f.another_machine().unwrap_or_else(|| f.handle());
                let start = &start;
                s.spawn(move || {
                    (0..ROUNDS)
                        .map(|round| {
                            let members = vec![NewJob::new(Q, format!("{round} from {i}"))];
                            let group = NewGroup::new().key(format!("batch-{round}"));
                            start.wait();
                            // (a failure answered, not unwrapped: the others wait at the
                            // barrier for this thread's next round)
                            store
                                .enqueue_group(group, members)
                                .map_err(|e| e.to_string())
                        })
                        .collect()
                })
            })
            .collect();
        each.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for round in 0..ROUNDS {
        let first = answers[0][round].as_ref().unwrap();
        assert!(
            answers.iter().all(|a| a[round].as_ref() == Ok(first)),
            "round {round}: {:?}",
            answers.iter().map(|a| &a[round]).collect::<Vec<_>>()
        );
    }
    assert_eq!(f.jobs(&JobFilter::default()).unwrap().len(), ROUNDS);
}
