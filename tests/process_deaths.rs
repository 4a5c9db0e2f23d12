//! Several processes sharing one store (`Sharing::MultiProcess`): real child processes hold
//! leases and are SIGKILLed while the others go on. A dead process's leases come back at once
//! (its kernel-held instance lock is free), never a live neighbour's; an enqueue in one
//! process wakes an idle pool in another.
//!
//! Store time here is the host's clock and every lease lasts an hour, so a job that comes
//! back can only have come back by the process-death path, never by expiry.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::{JobId, JobState, NewJob, Outcome, ReclaimPath, Sharing, Store, WorkerPool};

const Q: &str = "q";
const HOUR_MS: &str = "3600000";

fn shared(path: &Path) -> Store {
    Store::builder(path)
        .sharing(Sharing::MultiProcess)
        .open()
        .unwrap()
}

/// A child process sharing the store, holding the leases it claimed until killed.
struct Holder {
    child: Child,
    claimed: Vec<JobId>,
}

impl Holder {
    fn start(path: &Path, args: &[&str]) -> Holder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("__child")
            .arg("--db")
            .arg(path)
            .args(["--shared", "--queue", Q, "--lease-ms", HOUR_MS])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut claimed = Vec::new();
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["claimed", id, _] => claimed.push(JobId(id.parse().unwrap())),
                ["ready", _] => return Holder { child, claimed },
                _ => panic!("unexpected child output: {line}"),
            }
        }
        panic!("child exited before it was ready: {:?}", child.wait());
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn end(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        self.child.wait().unwrap();
    }
}

#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn store_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.redb");
    (dir, path)
}

fn died_path(store: &Store, id: JobId) -> Option<ReclaimPath> {
    store
        .history(id)
        .unwrap()
        .iter()
        .find_map(|r| match r.outcome {
            Some(Outcome::LeaseExpired { path, .. }) => Some(path),
            _ => None,
        })
}

#[test]
fn a_killed_processs_leases_are_taken_back_by_a_survivor_at_once() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store
        .enqueue_batch((0..5).map(|i| NewJob::new(Q, format!("job {i}"))))
        .unwrap();
    let victim = Holder::start(&path, &["--claim", "3"]);
    let taken = victim.claimed.clone();
    assert_eq!(taken.len(), 3);
    assert_eq!(store.stats().unwrap().total(JobState::Running), 3);
    victim.kill();
    // No reap, no claim, leases an hour long: only the survivor's watcher can bring them back.
    wait_until("the dead process's jobs to be queued again", || {
        store.stats().unwrap().total(JobState::Queued) == 5
    });
    for id in taken {
        assert_eq!(died_path(&store, id), Some(ReclaimPath::ProcessDied));
        assert_eq!(store.job(id).unwrap().unwrap().attempt.0, 1);
        // the next claim is a new attempt: the dead holder's fence is stale
    }
    let again = store.claim(Q, "survivor", Duration::from_secs(60)).unwrap();
    assert_eq!(again.unwrap().attempt.0, 2);
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn opening_takes_back_only_the_leases_of_processes_that_are_gone() {
    let (_dir, path) = store_path();
    {
        let store = shared(&path);
        store
            .enqueue_batch((0..4).map(|i| NewJob::new(Q, format!("job {i}"))))
            .unwrap();
    }
    let alive = Holder::start(&path, &["--claim", "2"]);
    let dead = Holder::start(&path, &["--claim", "1"]);
    let dead_job = dead.claimed[0];
    dead.kill();
    // Nobody was watching when it died: the next open finds it.
    let store = shared(&path);
    let recovered: Vec<JobId> = store
        .recovered_at_open()
        .reclaimed
        .iter()
        .map(|r| r.job)
        .collect();
    assert_eq!(recovered, vec![dead_job]);
    assert_eq!(died_path(&store, dead_job), Some(ReclaimPath::ProcessDied));
    for id in &alive.claimed {
        assert_eq!(store.job(*id).unwrap().unwrap().state, JobState::Running);
    }
    // and once the live one dies too, its leases come back
    let held = alive.claimed.clone();
    alive.kill();
    wait_until("the second process's jobs to come back", || {
        held.iter()
            .all(|id| store.job(*id).unwrap().unwrap().state == JobState::Queued)
    });
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn a_process_that_ends_cleanly_leaves_its_neighbours_leases_alone() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store.enqueue(NewJob::new(Q, "x")).unwrap();
    let neighbour = Holder::start(&path, &["--claim", "1"]);
    let job = neighbour.claimed[0];
    // a second process that opens and closes the store takes nothing
    Holder::start(&path, &[]).end();
    std::thread::sleep(Duration::from_millis(300)); // several of the watcher's rescans
    assert_eq!(store.job(job).unwrap().unwrap().state, JobState::Running);
    neighbour.kill();
    wait_until("the job to come back", || {
        store.job(job).unwrap().unwrap().state == JobState::Queued
    });
}

#[test]
fn an_enqueue_in_one_process_wakes_an_idle_pool_in_another() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    let (tx, rx) = crossbeam_channel::unbounded();
    // An idle pool sleeps until a commit wakes it or its heartbeat interval (10 minutes) ends.
    let pool = WorkerPool::builder(store.clone(), Q)
        .lease(Duration::from_secs(3600))
        .heartbeat_every(Duration::from_secs(600))
        .start(move |ctx| {
            let _ = tx.send(ctx.job());
            Ok(())
        })
        .unwrap();
    Holder::start(&path, &["--enqueue", "1"]).end();
    let ran = rx.recv_timeout(Duration::from_secs(30));
    assert!(
        ran.is_ok(),
        "the pool was not woken by the other process's enqueue"
    );
    drop(pool);
}

fn tool(path: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("--db")
        .arg(path)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_tool_writes_beside_running_processes_and_shows_who_holds_each_lease() {
    let (_dir, path) = store_path();
    let holder = Holder::start(&path, &["--enqueue", "2", "--claim", "1"]);
    let held = holder.claimed[0];
    // a write command joins the processes instead of being refused, and takes nothing
    for args in [
        vec!["enqueue", "--queue", Q, "x"],
        vec!["cancel", "2"],
        vec!["reap"],
    ] {
        let out = tool(&path, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let jobs: serde_json::Value =
        serde_json::from_slice(&tool(&path, &["jobs", "--json"]).stdout).unwrap();
    let running = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == held.0)
        .unwrap();
    assert_eq!(running["state"], "running");
    assert_eq!(running["lease"]["holder"]["alive"], true);
    holder.kill();
    let jobs: serde_json::Value =
        serde_json::from_slice(&tool(&path, &["jobs", "--json"]).stdout).unwrap();
    let shown = &jobs.as_array().unwrap()[0];
    assert_eq!(shown["lease"]["holder"]["alive"], false, "{shown}");
    // the next write command takes the dead holder's lease back
    let reap: serde_json::Value =
        serde_json::from_slice(&tool(&path, &["reap", "--json"]).stdout).unwrap();
    assert_eq!(reap["recovered_at_open"][0]["job"], held.0);
}
