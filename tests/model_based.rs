//! Model-based property test: random operation sequences against the store and an
//! independent reference model (`tests/support/model.rs`), compared after every step; on the
//! redb store, and on the PostgreSQL store where `LEASEHOLD_PG_URL` names a server (the same
//! model, the same checks: the conformance of the two backends).
//!
//! `LEASEHOLD_PROPTEST_CASES=100000 cargo test --release --test model_based` for a soak;
//! `LEASEHOLD_PG_PROPTEST_CASES` for the PostgreSQL one (default 100).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/backends.rs"]
mod backends;
#[path = "support/harness.rs"]
mod harness;
#[path = "support/model.rs"]
mod model;

use harness::{Harness, Op};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<i8>(), any::<u8>(), proptest::option::of(any::<u8>()), proptest::option::weighted(0.3, any::<u8>()), proptest::option::weighted(0.3, any::<u8>()), proptest::option::weighted(0.4, any::<u8>()), proptest::option::weighted(0.3, any::<u8>()))
            .prop_map(|(queue, priority, delay_s, max_attempts, unique, backoff, limit, expires)| Op::Enqueue { queue, priority, delay_s, max_attempts, unique, after: Vec::new(), group: None, backoff, limit, expires }),
        // jobs that wait for jobs and groups, and groups' members
        3 => (any::<u8>(), any::<u8>(), proptest::option::of(any::<u8>()), proptest::collection::vec((any::<u16>(), any::<u8>()), 0..3), proptest::option::weighted(0.5, any::<u8>()), proptest::option::weighted(0.2, any::<u8>()))
            .prop_map(|(queue, delay_s, max_attempts, after, group, expires)| Op::Enqueue { queue, priority: 0, delay_s, max_attempts, unique: None, after, group, backoff: None, limit: None, expires }),
        // queues' own retry policies
        1 => (any::<u8>(), proptest::option::weighted(0.7, any::<u8>()))
            .prop_map(|(queue, policy)| Op::Backoff { queue, policy }),
        1 => (any::<u8>(), proptest::option::weighted(0.3, any::<u8>())).prop_map(|(callbacks, parent)| Op::OpenGroup { callbacks, parent }),
        // an operator's edits racing the claims
        2 => (any::<u16>(), proptest::option::of(any::<i8>()), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(job, priority, promote, fenced, stale)| Op::Edit { job, priority, promote, fenced, stale }),
        1 => any::<u8>().prop_map(|group| Op::SealGroup { group }),
        1 => any::<u8>().prop_map(|group| Op::CancelGroup { group }),
        4 => (any::<u8>(), any::<u8>(), any::<u8>(), proptest::option::weighted(0.2, any::<u8>()))
            .prop_map(|(queue, worker, lease_s, stall_s)| Op::Claim { queue, worker, lease_s, stall_s }),
        1 => (any::<u16>(), any::<u8>(), any::<u8>()).prop_map(|(job, worker, lease_s)| Op::ClaimJob { job, worker, lease_s }),
        // a pool's claim over several queues, what one cannot give taken by the others
        2 => (proptest::collection::vec((any::<u8>(), any::<u8>()), 1..4), any::<u8>(), any::<u8>())
            .prop_map(|(plan, worker, lease_s)| Op::ClaimQueues { plan, worker, lease_s }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(queue, worker, lease_s, n)| Op::ClaimBatch { queue, worker, lease_s, n }),
        3 => (any::<u16>(), any::<bool>()).prop_map(|(lease, progress)| Op::Heartbeat { lease, progress }),
        2 => any::<u16>().prop_map(|lease| Op::Complete { lease }),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(lease, data)| Op::SaveCheckpoint { lease, data }),
        1 => (any::<u16>(), any::<u16>()).prop_map(|leases| Op::CompleteBatch { leases }),
        2 => ((any::<u16>(), any::<u16>()), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(leases, queue, worker, lease_s, n)| Op::Round { leases, queue, worker, lease_s, n }),
        2 => (any::<u16>(), proptest::bool::weighted(0.2))
            .prop_map(|(lease, permanent)| Op::Fail { lease, permanent }),
        1 => any::<u16>().prop_map(|lease| Op::Release { lease }),
        1 => any::<u16>().prop_map(|job| Op::Cancel { job }),
        1 => any::<u16>().prop_map(|job| Op::Retry { job }),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(lease, secs)| Op::Snooze { lease, secs }),
        1 => (any::<u8>(), proptest::bool::weighted(0.6))
            .prop_map(|(queue, pause)| Op::Pause { queue, pause }),
        1 => (any::<u8>(), proptest::option::weighted(0.7, any::<u8>()), proptest::option::weighted(0.4, any::<u8>()), proptest::option::weighted(0.5, any::<u8>()), proptest::option::weighted(0.3, any::<u8>()))
            .prop_map(|(queue, concurrency, rate, per_key, key_rate)| Op::Limit { queue, concurrency, rate, per_key, key_rate }),
        // limits per key alone, so that keyed jobs meet them often
        2 => (any::<u8>(), proptest::option::weighted(0.8, any::<u8>()), proptest::option::weighted(0.5, any::<u8>()))
            .prop_map(|(queue, per_key, key_rate)| Op::Limit { queue, concurrency: None, rate: None, per_key, key_rate }),
        3 => prop_oneof![1u16..30, 55u16..130].prop_map(|secs| Op::Advance { secs }),
        2 => Just(Op::Reap),
        1 => (any::<u16>(), any::<u8>())
            .prop_map(|(older_than_s, states)| Op::Purge { older_than_s, states }),
        1 => Just(Op::Reopen),
        1 => Just(Op::ProcessDies),
    ]
}

fn pg_cases() -> u32 {
    std::env::var("LEASEHOLD_PG_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// Runs `ops` on `h` and the model, comparing after every step.
fn run(mut h: Harness, ops: &[Op]) -> Result<(), TestCaseError> {
    h.run(ops).map_err(TestCaseError::fail)
}

fn cases() -> u32 {
    std::env::var("LEASEHOLD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_store_behaves_like_the_model_under_any_sequence(ops in proptest::collection::vec(op(), 1..40)) {
        run(Harness::new(), &ops)?;
    }

    /// The same on the store in memory: the protocol over plain maps.
    #[test]
    fn the_store_in_memory_behaves_like_the_model_under_any_sequence(ops in proptest::collection::vec(op(), 1..40)) {
        run(Harness::memory(), &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: pg_cases(),
        max_shrink_iters: 500,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_postgres_store_behaves_like_the_model_under_any_sequence(ops in proptest::collection::vec(op(), 1..40)) {
        let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
            return Ok(()); // said once by the PostgreSQL suite; nothing to run against
        };
        let schema = format!("lh_model_{}_{}", std::process::id(), next_schema());
        run(Harness::postgres(&url, &schema, true), &ops)?;
    }

    /// The same on the protocol's own steps alone: the store takes none of its
    /// one-statement shortcuts, which must agree with those steps (and the model).
    #[test]
    fn the_postgres_store_without_its_shortcuts_behaves_like_the_model_under_any_sequence(ops in proptest::collection::vec(op(), 1..40)) {
        let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
            return Ok(());
        };
        let schema = format!("lh_model_{}_{}", std::process::id(), next_schema());
        run(Harness::postgres(&url, &schema, false), &ops)?;
    }
}

/// A fresh schema name per case (cases of one process run one after another).
fn next_schema() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs a fixed sequence on redb, in memory and (where `LEASEHOLD_PG_URL` names a server)
/// on PostgreSQL with its shortcuts and without.
fn on_every_store(ops: &[Op]) {
    Harness::new().run(ops).unwrap();
    Harness::memory().run(ops).unwrap();
    if let Ok(url) = std::env::var("LEASEHOLD_PG_URL") {
        for shortcuts in [true, false] {
            let schema = format!("lh_model_{}_{}", std::process::id(), next_schema());
            Harness::postgres(&url, &schema, shortcuts)
                .run(ops)
                .unwrap();
        }
    }
}

/// A plain enqueue for the sequences below: priority 0, the default budget, what it waits
/// for, the group it joins and when it expires.
fn enqueue(
    queue: u8,
    delay_s: u8,
    after: Vec<(u16, u8)>,
    group: Option<u8>,
    expires: Option<u8>,
) -> Op {
    Op::Enqueue {
        queue,
        priority: 0,
        delay_s,
        max_attempts: None,
        unique: None,
        after,
        group,
        backoff: None,
        limit: None,
        expires,
    }
}

/// A sequence the PostgreSQL case once failed: a pool's round completes a job and claims
/// beside it, and the completion releases a job waiting for it in the claimed queue. The
/// round decides as if its completions came first, so the claim takes the released job too
/// (it took only the job that waited before, the claim running beside the completion's
/// transaction without waiting for it).
#[test]
fn a_round_claims_the_waiter_its_own_completion_released() {
    let enqueue = |queue, delay_s, after| enqueue(queue, delay_s, after, None, None);
    let ops = vec![
        enqueue(32, 0, vec![]),
        Op::Limit {
            queue: 0,
            concurrency: None,
            rate: None,
            per_key: None,
            key_rate: None,
        },
        Op::ClaimBatch {
            queue: 6,
            worker: 0,
            lease_s: 0,
            n: 0,
        },
        enqueue(0, 0, vec![]),
        enqueue(103, 0, vec![]),
        enqueue(104, 220, vec![(48946, 24)]),
        Op::Round {
            leases: (0, 0),
            queue: 50,
            worker: 0,
            lease_s: 0,
            n: 53,
        },
    ];
    on_every_store(&ops);
}

/// Expiry, as the model has it: a job blocked on one still waiting is expired by the
/// reaper past its expiry, and so is the waiting job a claim would otherwise have started.
#[test]
fn the_reaper_expires_blocked_and_waiting_jobs_as_the_model_does() {
    let ops = vec![
        enqueue(0, 3, vec![], None, Some(7)),
        enqueue(1, 0, vec![(1, 0)], None, Some(1)),
        Op::Advance { secs: 15 },
        Op::Reap,
        Op::Advance { secs: 60 },
        Op::Claim {
            queue: 0,
            worker: 0,
            lease_s: 30,
            stall_s: None,
        },
    ];
    on_every_store(&ops);
}

/// Groups in groups, as the model has them: a nested group's end is counted in its parent
/// once, and cancelling the parent cancels the nested group's members.
#[test]
fn nested_groups_end_and_cancel_as_the_model_does() {
    let claim = Op::Claim {
        queue: 0,
        worker: 0,
        lease_s: 30,
        stall_s: None,
    };
    // group 1 (a callback on completion), group 2 in it, a member of 2; both sealed
    let opened = [
        Op::OpenGroup {
            callbacks: 1,
            parent: None,
        },
        Op::OpenGroup {
            callbacks: 0,
            parent: Some(1),
        },
        enqueue(0, 0, Vec::new(), Some(2), None),
        Op::SealGroup { group: 2 },
        Op::SealGroup { group: 1 },
    ];
    let mut ends = opened.to_vec();
    ends.extend([claim.clone(), Op::Complete { lease: 0 }, claim]);
    on_every_store(&ends);
    let mut cancels = opened.to_vec();
    cancels.push(Op::CancelGroup { group: 1 });
    on_every_store(&cancels);
}

/// A sequence the in-memory case once failed: a waiter made against a dependency already
/// cancelled is cancelled at once; retrying the dependency re-arms the waiter, and the
/// dependency's next end (cancelled again) must reach it: it did not, and the waiter stayed
/// blocked for ever.
#[test]
fn a_waiter_rearmed_by_a_retry_hears_its_dependencys_next_end() {
    let ops = vec![
        enqueue(0, 0, Vec::new(), None, None),
        Op::Cancel { job: 1 },
        enqueue(0, 0, vec![(1, 24)], None, None),
        Op::Retry { job: 1 },
        Op::Cancel { job: 1 },
    ];
    on_every_store(&ops);
}

/// A sequence the in-memory case once failed (in the model, not the store): a group's
/// callback job is cancelled, ends, and is purged; cancelling the group then met a waiter
/// no longer there, and the model stopped where the store goes on.
#[test]
fn cancelling_a_group_whose_callback_was_purged_cancels_the_rest() {
    let ops = vec![
        Op::OpenGroup {
            callbacks: 1,
            parent: None,
        },
        Op::Cancel { job: 39682 },
        Op::Advance { secs: 12 },
        Op::Advance { secs: 111 },
        Op::Purge {
            older_than_s: 7200,
            states: 116,
        },
        Op::CancelGroup { group: 151 },
    ];
    on_every_store(&ops);
}
