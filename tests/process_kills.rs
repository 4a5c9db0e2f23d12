//! Real process kills: a child process works a store with several threads, committing an
//! effect with every completion, and is killed with SIGKILL at a random moment, often in the
//! middle of a commit. After every kill the store must reopen clean with nothing lost. Every
//! other child is a `WorkerPool` (jobs claimed ahead, completions committed in batches).
//!
//! `LEASEHOLD_KILLS=300 cargo test --release --test process_kills` for a soak.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use leasehold::ReadJobs;
use leasehold::redb::ReadableTable;
use leasehold::{JobId, JobState, NewJob, Outcome, Store, StoreTime};

#[path = "support/helper_process.rs"]
mod helper_process;

use helper_process::EFFECTS;

#[test]
#[ignore = "the helper process the other tests start, not a test of its own"]
fn helper_process() {
    helper_process::run();
}

const QUEUE: &str = "kills";
const LEASE_MS: u64 = 2_000;

fn kills() -> usize {
    std::env::var("LEASEHOLD_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

/// What the child said before it died.
struct Heard {
    committed: Vec<u64>,
    last_now: StoreTime,
}

fn run_and_kill(path: &std::path::Path, after_lines: usize, pooled: bool) -> Heard {
    let (lease_ms, db) = (LEASE_MS.to_string(), path.to_str().unwrap());
    let mut args = vec![
        "--queue",
        QUEUE,
        "--threads",
        "4",
        "--lease-ms",
        &lease_ms,
        "--db",
        db,
    ];
    if pooled {
        args.push("--pool");
    }
    let mut child = helper_process::command("worker", args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = helper_process::stdout_lines(&mut child);
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in stdout.map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut heard = Heard {
        committed: Vec::new(),
        last_now: StoreTime::ZERO,
    };
    let record = |line: String, heard: &mut Heard| {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["committed", id, now] => {
                heard.committed.push(id.parse().unwrap());
                heard.last_now = StoreTime(now.parse().unwrap());
            }
            ["now", now] => heard.last_now = StoreTime(now.parse().unwrap()),
            _ => panic!("child said: {line}"),
        }
    };
    // Kill after the child has reported `after_lines` lines (mid-stream of commits), or after
    // a generous deadline if it reports fewer (then it is killed while claiming or idle).
    let mut lines = 0;
    while lines < after_lines {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                record(line, &mut heard);
                lines += 1;
            }
            Err(_) => break,
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    // Lines written before death are still in the pipe: they count (the commit had returned).
    while let Ok(line) = rx.try_recv() {
        record(line, &mut heard);
    }
    heard
}

#[test]
fn a_store_killed_at_random_moments_reopens_clean_with_every_reported_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.redb");
    let mut enqueued = 0u64;
    let mut all_committed: BTreeSet<u64> = BTreeSet::new();
    let mut pooled_commits = 0;
    let mut last_now = StoreTime::ZERO;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let kills = kills();
    for kill in 0..kills {
        {
            let store = Store::open(&path).unwrap();
            let waiting = store.stats().unwrap().total(JobState::Queued);
            if waiting < 20 {
                let ids = store
                    .enqueue_batch((0..40).map(|i| NewJob::new(QUEUE, format!("{kill}-{i}"))))
                    .unwrap();
                enqueued += ids.len() as u64;
            }
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let pooled = kill % 2 == 1;
        let heard = run_and_kill(&path, 1 + (rng % 12) as usize, pooled);
        if pooled {
            pooled_commits += heard.committed.len();
        }

        // The file opens (taking back the dead child's leases), and nothing is lost.
        let store =
            Store::open(&path).unwrap_or_else(|e| panic!("kill {kill}: reopen failed: {e}"));
        let check = store.check().unwrap();
        assert!(check.is_clean(), "kill {kill}: {:?}", check.problems);
        let stats = store.stats().unwrap();
        let total: u64 = stats.queues.values().map(|q| q.total()).sum();
        assert_eq!(total, enqueued, "kill {kill}: a job disappeared");
        assert_eq!(
            stats.total(JobState::Running),
            0,
            "kill {kill}: an orphaned lease survived the reopen"
        );
        assert!(
            store.now() >= heard.last_now,
            "kill {kill}: the clock ran backwards"
        );
        assert!(
            store.now() >= last_now,
            "kill {kill}: the clock ran backwards across opens"
        );
        last_now = store.now();

        // Every commit the child reported is there, once, and no effect was committed twice.
        for id in &heard.committed {
            let job = store.job(JobId(*id)).unwrap().unwrap();
            assert_eq!(
                job.state(),
                JobState::Succeeded,
                "kill {kill}: reported commit of job {id} lost"
            );
            let successes = store
                .history(JobId(*id))
                .unwrap()
                .iter()
                .filter(|run| run.outcome() == Some(&leasehold::Outcome::Succeeded))
                .count();
            assert_eq!(
                successes, 1,
                "kill {kill}: job {id} succeeded {successes} times"
            );
        }
        all_committed.extend(&heard.committed);
        let read = store.begin_read().unwrap();
        if let Ok(effects) = read.open_table(EFFECTS) {
            for entry in effects.iter().unwrap() {
                let (id, n) = entry.unwrap();
                assert_eq!(
                    n.value(),
                    1,
                    "kill {kill}: job {} committed {} times",
                    id.value(),
                    n.value()
                );
                let job = store.job(JobId(id.value())).unwrap().unwrap();
                assert_eq!(
                    job.state(),
                    JobState::Succeeded,
                    "kill {kill}: effect without completion"
                );
            }
        }
    }
    eprintln!(
        "{kills} kills survived; {} commits reported before kills ({pooled_commits} by pools), \
         all present; {enqueued} jobs, none lost",
        all_committed.len()
    );
    assert!(!all_committed.is_empty());
    assert!(
        pooled_commits > 0,
        "no pool reported a commit before its kill"
    );
}

#[test]
fn without_recovery_an_orphaned_lease_is_due_within_one_lease_of_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orphans.redb");
    Store::open(&path)
        .unwrap()
        .enqueue_batch((0..20).map(|i| NewJob::new(QUEUE, format!("{i}"))))
        .unwrap();
    let heard = run_and_kill(&path, 3, false);
    let store = Store::builder(&path).recover_on_open(false).open().unwrap();
    assert!(store.now() >= heard.last_now);
    let lease = Duration::from_millis(LEASE_MS);
    let mut orphans = 0;
    for id in 1..=20 {
        let job = store.job(JobId(id)).unwrap().unwrap();
        if let Some(l) = job.lease() {
            orphans += 1;
            // reclaimed by the first reap at or after its expiry: within lease + reaper
            // interval of now at the latest
            assert!(
                l.expires_at() <= store.now().saturating_add(lease),
                "job {id}"
            );
        }
    }
    assert!(orphans > 0, "the child held leases when it died");
}

/// A process that crash-loops on one job (here it aborts; out of memory, say, in an
/// application) spends that job's budget alone: the jobs it held ahead of its worker go back
/// to their places with nothing spent ([`Outcome::NeverStarted`]), the poison job spends one
/// attempt per crash and ends dead, and every other job succeeds once, started at most twice
/// (a job whose completion the crash caught before its commit runs again).
#[test]
fn a_process_that_crash_loops_on_one_job_spends_that_jobs_budget_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("poison.redb");
    let store = Store::open(&path).unwrap();
    let jobs = (0..2_000).map(|i| match i {
        100 => NewJob::new(QUEUE, "poison"),
        _ => NewJob::new(QUEUE, format!("{i}")),
    });
    let ids = store.enqueue_batch(jobs).unwrap();
    let poison = ids[100];
    drop(store);
    let db = path.to_str().unwrap();
    let mut crashes = 0;
    let mut drained = false;
    for _ in 0..30 {
        let args = ["--db", db, "--queue", QUEUE, "--workers", "1"];
        let status = helper_process::command("poison", args)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        if status.success() {
            drained = true;
            break;
        }
        crashes += 1;
    }
    assert!(
        drained,
        "the queue drained within 30 starts ({crashes} crashes)"
    );
    let budget = leasehold::DEFAULT_MAX_ATTEMPTS;
    assert_eq!(
        crashes, budget,
        "the poison job crashed its process once per attempt"
    );

    let store = Store::open(&path).unwrap();
    assert_eq!(store.job(poison).unwrap().unwrap().state(), JobState::Dead);
    let never_started = |o: Option<&Outcome>| matches!(o, Some(Outcome::NeverStarted { .. }));
    let mut held_ahead = 0;
    for &id in &ids {
        let runs = store.history(id).unwrap();
        held_ahead += runs.iter().filter(|r| never_started(r.outcome())).count();
        if id == poison {
            continue;
        }
        assert_eq!(
            store.job(id).unwrap().unwrap().state(),
            JobState::Succeeded,
            "job {id}"
        );
        let started: Vec<_> = runs
            .iter()
            .filter(|r| !never_started(r.outcome()))
            .collect();
        let succeeded = started
            .iter()
            .filter(|r| r.outcome() == Some(&Outcome::Succeeded));
        assert_eq!(succeeded.count(), 1, "job {id} succeeded once: {runs:?}");
        assert!(
            started.len() <= 2,
            "job {id} started {} times: {runs:?}",
            started.len()
        );
    }
    assert!(
        held_ahead >= budget as usize,
        "every crash left jobs held ahead and never started ({held_ahead} in all)"
    );
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn a_process_killed_while_creating_a_store_leaves_no_half_made_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut existed = 0;
    for i in 0..30 {
        let path = dir.path().join(format!("new-{i}.redb"));
        let db = path.to_str().unwrap();
        let mut child = helper_process::command("holder", ["--enqueue", "1", "--db", db])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_micros(rng % 8000));
        child.kill().unwrap();
        child.wait().unwrap();
        if path.exists() {
            existed += 1;
        }
        // Whether or not the kill came mid-creation, the path opens as a store.
        let store = Store::open(&path).unwrap_or_else(|e| panic!("kill {i}: {e}"));
        assert!(store.check().unwrap().is_clean());
    }
    eprintln!(
        "30 kills during creation: the file existed after {existed} of them; every path opened"
    );
}
