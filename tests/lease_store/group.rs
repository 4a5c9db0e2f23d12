use std::sync::atomic::{AtomicU64, Ordering};

use leasehold::{JobState, Outcome};
use leasehold::{JobStore, ReadJobs};

use crate::common::{Fixture, LEASE, Q};

/// Many threads at once, each operation its own unit inside shared commits: fresh claims,
/// completions, failures and stale completions that the fence must refuse, interleaved.
#[test]
fn concurrent_operations_in_shared_commits_each_get_their_own_answer() {
    operations_get_their_own_answer(Fixture::with(|b| b.default_max_attempts(1000)));
}

fn operations_get_their_own_answer(f: Fixture) {
    let ids = f.enqueue_n(400);
    let refused = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let store = (*f).clone();
            let refused = &refused;
            s.spawn(move || {
                let mut stale = Vec::new();
                let mut n = 0u64;
                while let Some(l) = store.claim(Q, &format!("w{t}"), LEASE).unwrap() {
                    n += 1;
                    if n.is_multiple_of(3) {
                        store.fail(&l, "transient").unwrap();
                        stale.push(l); // its attempt is over: a later complete is stale
                    } else {
                        store.complete(&l, b"ok").unwrap();
                    }
                    if let Some(old) = stale.pop().filter(|_| n.is_multiple_of(2)) {
                        assert!(store.complete(&old, b"late").unwrap_err().is_lease_lost());
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    for id in ids {
        let job = f.job(id).unwrap().unwrap();
        // failed attempts wait out a backoff; succeeded ones are done
        assert!(matches!(
            job.state(),
            JobState::Succeeded | JobState::RetryWait
        ));
        let history = f.history(id).unwrap();
        let succeeded = history
            .iter()
            .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
            .count();
        assert!(succeeded <= 1);
        assert_eq!(succeeded == 1, job.state() == JobState::Succeeded);
    }
    let stats = f.stats().unwrap();
    assert_eq!(
        stats.counters.fenced_writes_rejected,
        refused.load(Ordering::Relaxed)
    );
}
