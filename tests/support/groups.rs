//! What a soak of groups through process kills checks at its end, on either engine: each
//! group ended with every member succeeded, and each of its callbacks succeeded exactly once,
//! first claimed no sooner than the group ended.

use leasehold::{GroupId, JobState, Outcome, ReadJobs};

pub fn each_callback_ran_once_after_its_group(
    store: &dyn ReadJobs,
    groups: &[GroupId],
    members: u64,
) {
    for &g in groups {
        let group = store.group(g).unwrap().unwrap();
        assert_eq!(group.ended(), (members, 0, 0), "group {g}");
        assert_eq!(group.outcome(), Some(JobState::Succeeded), "group {g}");
        let ended = group.finished_at().unwrap();
        assert_eq!(group.waiters().len(), 2, "group {g}: its two callbacks");
        for &callback in group.waiters() {
            let history = store.history(callback).unwrap();
            let successes = (history.iter())
                .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
                .count();
            assert_eq!(successes, 1, "callback {callback} of group {g}");
            assert!(
                history[0].claimed_at() >= ended,
                "callback {callback} ran before its group ended"
            );
        }
    }
}
