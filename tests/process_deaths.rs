//! Several processes sharing one store (`Sharing::MultiProcess`): real child processes hold
//! leases and are SIGKILLed while the others go on. A dead process's leases come back at once
//! (its kernel-held instance lock is free), never a live neighbour's; an enqueue in one
//! process wakes an idle pool in another.
//!
//! Store time here is the host's clock and every lease lasts an hour, so a job that comes
//! back can only have come back by the process-death path, never by expiry.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use leasehold::WorkerPool;
use leasehold::{EndCursor, EndOf, JobId, JobState, NewJob, Outcome, ReclaimPath, Sharing, Store};
use leasehold::{JobStore, ReadJobs};

#[path = "lease_store/common.rs"]
#[allow(dead_code)]
mod common;
#[path = "support/groups.rs"]
mod groups;
#[path = "support/helper_process.rs"]
mod helper_process;

#[test]
#[ignore = "the helper process the other tests start, not a test of its own"]
fn helper_process() {
    helper_process::run();
}

use common::wait_until;

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
    out: Box<dyn Iterator<Item = std::io::Result<String>> + Send>,
}

/// A test that fails must not leave its helper processes running.
impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Holder {
    /// Holds its leases for an hour, unless `args` says otherwise.
    fn start(path: &Path, args: &[&str]) -> Holder {
        let lease = match args.contains(&"--lease-ms") {
            true => vec![],
            false => vec!["--lease-ms", HOUR_MS],
        };
        let db = path.to_str().unwrap();
        let all = [&["--db", db, "--shared", "--queue", Q], &lease[..], args].concat();
        let mut child = helper_process::command("holder", all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut claimed = Vec::new();
        let mut out = helper_process::stdout_lines(&mut child);
        while let Some(line) = out.next() {
            let line = line.unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["claimed", id, _] => claimed.push(JobId(id.parse().unwrap())),
                ["ready", _] => {
                    return Holder {
                        child,
                        claimed,
                        out: Box::new(out),
                    };
                }
                _ => panic!("unexpected child output: {line}"),
            }
        }
        panic!("child exited before it was ready: {:?}", child.wait());
    }

    fn instance_files(path: &Path) -> usize {
        std::fs::read_dir(path.with_file_name("shared.redb.procs"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".lock")
            })
            .count()
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; it touches no memory of ours.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Asks the holder to complete what it holds; returns its verdict for each job.
    fn complete(&mut self) -> Vec<String> {
        self.send("complete");
        (0..self.claimed.len())
            .map(|_| self.out.next().unwrap().unwrap())
            .collect()
    }

    /// Sends `line` and waits for the holder to answer `reply`.
    fn tell(&mut self, line: &str, reply: &str) {
        self.send(line);
        let heard = self.out.next().unwrap().unwrap();
        assert_eq!(heard, reply, "the holder's answer to {line}");
    }

    /// Writes `line` to the holder's stdin.
    fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
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
        .find_map(|r| match r.outcome() {
            Some(Outcome::LeaseExpired { path, .. }) => Some(*path),
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
        assert_eq!(store.job(id).unwrap().unwrap().attempt().0, 1);
        // the next claim is a new attempt: the dead holder's fence is stale
    }
    // counted as what happened, not as "at open" (once both were one counter)
    let counters = store.stats().unwrap().counters;
    assert_eq!(
        (counters.reclaimed_process_died, counters.reclaimed_at_open),
        (3, 0)
    );
    let again = store.claim(Q, "survivor", Duration::from_secs(60)).unwrap();
    assert_eq!(again.unwrap().attempt.0, 2);
    assert!(store.check().unwrap().is_clean());
}

/// A pool process sharing the store aborts on a poison job: the survivor takes back what it
/// held by what its log says: the poison job, in its handler, charged; the jobs claimed
/// ahead, back uncharged as never started; and the dead process's log is removed with its
/// instance file.
#[test]
fn a_dead_pools_jobs_held_ahead_come_back_uncharged_and_its_poison_job_charged() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    // The poison job late enough that the pool has measured its jobs short and claims ahead.
    let mut jobs: Vec<NewJob> = (0..2_000).map(|i| NewJob::new(Q, format!("{i}"))).collect();
    jobs[300] = NewJob::new(Q, "poison");
    let ids = store.enqueue_batch(jobs).unwrap();
    let db = path.to_str().unwrap();
    let args = ["--db", db, "--queue", Q, "--workers", "1", "--shared"];
    let status = helper_process::command("poison", args)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(
        !status.success(),
        "the pool's process died on the poison job"
    );
    // The survivor's watcher takes its leases back.
    wait_until("the dead pool's leases to come back", || {
        store.stats().unwrap().total(JobState::Running) == 0
    });
    let outcome = |id: JobId| {
        store
            .history(id)
            .unwrap()
            .last()
            .and_then(|r| r.outcome().cloned())
    };
    let poison = store.job(ids[300]).unwrap().unwrap();
    assert_eq!(
        (poison.state(), poison.failures()),
        (JobState::RetryWait, 1),
        "in its handler when the process died: charged, after a backoff"
    );
    assert!(matches!(
        outcome(ids[300]),
        Some(Outcome::LeaseExpired {
            path: ReclaimPath::ProcessDied,
            ..
        })
    ));
    let spared: Vec<JobId> = (ids[301..].iter().copied())
        .filter(|&id| {
            outcome(id)
                == Some(Outcome::NeverStarted {
                    path: ReclaimPath::ProcessDied,
                })
        })
        .collect();
    assert!(!spared.is_empty(), "the pool held jobs ahead of its worker");
    for id in spared {
        let job = store.job(id).unwrap().unwrap();
        assert_eq!(
            (job.state(), job.failures()),
            (JobState::Queued, 0),
            "job {id}"
        );
    }
    let procs = std::fs::read_dir(path.with_file_name("shared.redb.procs")).unwrap();
    let logs = procs
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "started"));
    assert_eq!(logs.count(), 1, "the survivor's own log alone is left");
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
    // Alive but stopped, it holds its lock and its leases, and cannot watch its neighbours.
    alive.signal(libc::SIGSTOP);
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
        assert_eq!(store.job(*id).unwrap().unwrap().state(), JobState::Running);
    }
    // and once the live one dies too, its leases come back
    let held = alive.claimed.clone();
    alive.signal(libc::SIGCONT);
    alive.kill();
    wait_until("the second process's jobs to come back", || {
        held.iter()
            .all(|id| store.job(*id).unwrap().unwrap().state() == JobState::Queued)
    });
    assert!(store.check().unwrap().is_clean());
}

/// The watcher of the other processes costs an idle process nothing while each neighbour
/// is watched by a pidfd: it sleeps until one dies, joins or leaves (it read the registry
/// ten times a second, once). Its wake-ups over two seconds of idleness: at most one, a
/// slow rescan falling in the window.
#[test]
fn the_watcher_of_neighbours_each_with_a_pidfd_sleeps_while_nothing_happens() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store.enqueue(NewJob::new(Q, "x")).unwrap();
    let before = store.watcher_wakeups().unwrap();
    let neighbour = Holder::start(&path, &["--claim", "1"]);
    // the neighbour's arrival wakes the watcher, which then holds its pidfd
    wait_until("the watcher to hear of the neighbour", || {
        store.watcher_wakeups().unwrap() > before
    });
    let seen = store.watcher_wakeups().unwrap();
    // A window to count in, not a timing: the count is of what happened within it.
    std::thread::sleep(Duration::from_secs(2));
    let woken = store.watcher_wakeups().unwrap() - seen;
    assert!(woken <= 1, "the watcher woke {woken} times in 2 s");
    // and a death still wakes it at once
    let job = neighbour.claimed[0];
    neighbour.kill();
    wait_until("the job to come back", || {
        store.job(job).unwrap().unwrap().state() == JobState::Queued
    });
}

/// A scheduler on a shared file sleeps until its next tick, and a schedule another
/// process declares wakes it (a datagram, as an enqueue's does): here its interval is an
/// hour, so a scheduler that only looked every interval would fire nothing. (Two handles of
/// one process stand for the two processes: each is an instance of its own.)
#[test]
fn a_schedule_declared_in_another_process_of_a_shared_file_wakes_the_scheduler() {
    let (_dir, path) = store_path();
    let here = shared(&path);
    let scheduler = leasehold::Scheduler::start(here.clone(), Duration::from_secs(3600)).unwrap();
    wait_until("the scheduler's first pass", || {
        scheduler.metrics().passes() >= 1
    });
    let there = shared(&path);
    let tick = Duration::from_secs(1); // (the shortest interval a schedule may have)
    there
        .declare_schedule(leasehold::Schedule::every(
            "often",
            tick,
            NewJob::new(Q, "tick"),
        ))
        .unwrap();
    wait_until("the other process's scheduler to fire the tick", || {
        scheduler.metrics().fired() >= 1
    });
    assert!(here.stats().unwrap().total(JobState::Queued) >= 1);
}

/// A follower of the endings in one process is told of an end another process of the
/// shared file committed: it comes back with it within 4 s, short of its own look with no
/// hint (`FOLLOW_LOOK`, 30 s), and it reads nothing at a deadline no hint came before. The
/// writer opens after the follower, which hears of it (the newcomer is told who follows)
/// and before it (told when the follower first waits): each in its turn.
#[test]
fn a_follower_in_one_process_is_told_of_an_end_committed_in_another() {
    let (_dir, path) = store_path();
    let heard = Duration::from_secs(4);
    let here = shared(&path);
    let mut cursor = EndCursor::START;
    for turn in ["the writer opens first", "the follower waits first"] {
        let seen = here.watcher_wakeups().unwrap();
        let there = match turn {
            "the writer opens first" => Some(shared(&path)),
            _ => None,
        };
        if there.is_some() {
            wait_until("the follower's process to read the newcomer", || {
                here.watcher_wakeups().unwrap() > seen
            });
        }
        let page = std::thread::scope(|s| {
            let follower = s.spawn(|| here.wait_for_endings(cursor, 10, heard));
            // (an order, not a timing: the follower has read once and waits)
            std::thread::sleep(Duration::from_millis(300));
            let there = there.unwrap_or_else(|| {
                let seen = here.watcher_wakeups().unwrap();
                let there = shared(&path);
                wait_until("the follower's process to read the newcomer", || {
                    here.watcher_wakeups().unwrap() > seen
                });
                // (and the newcomer to read what it was told, a moment after)
                std::thread::sleep(Duration::from_millis(100));
                there
            });
            let id = there.enqueue(NewJob::new(Q, turn)).unwrap();
            there.cancel(id).unwrap();
            (id, follower.join().unwrap().unwrap())
        });
        let (id, page) = page;
        let ended: Vec<_> = page.list.iter().map(|e| e.of.clone()).collect();
        assert_eq!(
            ended,
            [EndOf::Job {
                id,
                queue: Q.into()
            }],
            "{turn}: the follower was not told of the other process's end"
        );
        cursor = page.next;
    }
}

#[test]
fn a_process_that_ends_cleanly_leaves_its_neighbours_leases_alone() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store.enqueue(NewJob::new(Q, "x")).unwrap();
    let neighbour = Holder::start(&path, &["--claim", "1"]);
    let job = neighbour.claimed[0];
    // a second process that opens and closes the store takes nothing, and retires its
    // instance (no neighbour has to find it dead)
    assert_eq!(Holder::instance_files(&path), 2);
    let seen = store.watcher_wakeups().unwrap();
    Holder::start(&path, &[]).end();
    assert_eq!(Holder::instance_files(&path), 2);
    // once the watcher has read the registry after the arrival and after the clean close
    // (each announced; or both in one reading and a rescan), the neighbour's lease is
    // still its own
    wait_until("the watcher's readings after the close", || {
        store.watcher_wakeups().unwrap() >= seen + 2
    });
    assert_eq!(store.job(job).unwrap().unwrap().state(), JobState::Running);
    neighbour.kill();
    wait_until("the job to come back", || {
        store.job(job).unwrap().unwrap().state() == JobState::Queued
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

#[test]
fn a_pool_gives_way_to_another_process_writing_and_commits_everything_once_it_is_done() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store
        .enqueue_batch((0..20).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    // Declared first so that it is dropped last: if an assertion fails while the other
    // process writes, the holder (dropped, so killed) lets the pool's round end first.
    let pool: WorkerPool;
    let mut writer = Holder::start(&path, &[]);
    writer.tell("write", "writing");
    pool = WorkerPool::builder(store.clone(), Q)
        .concurrency(4)
        .lease(Duration::from_secs(3600))
        .start(|_| Ok(()))
        .unwrap();
    // Its first claim finds the writer's lock taken: the round gives way, then (after the
    // bound) waits its turn, and nothing can commit while the other process writes.
    wait_until("the pool to give way", || pool.stats().gave_way >= 1);
    assert_eq!(pool.stats().claimed, 0, "nothing claimed past the writer");
    writer.tell("", "wrote");
    wait_until("every job to be done", || pool.stats().succeeded == 20);
    assert_eq!(
        store.stats().unwrap().total(JobState::Succeeded),
        20,
        "each committed once, by the pool that gave way"
    );
    drop(pool);
    writer.end();
}

// ----- the soak: worker processes SIGKILLed at random moments beside each other -----

use helper_process::EFFECTS;
const SOAK_QUEUE: &str = "kills";

fn kills() -> usize {
    std::env::var("LEASEHOLD_PROCESS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

/// A `worker --shared` helper process: claims, renews and completes with an effect row in the same
/// transaction, reporting each commit after it returned.
struct Worker {
    child: Child,
    lines: crossbeam_channel::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    /// `pooled`: a `WorkerPool` (claims ahead, batched completions) rather than claim loops.
    fn start(path: &Path, lease_ms: u64, pooled: bool) -> Worker {
        let lease_ms = lease_ms.to_string();
        let db = path.to_str().unwrap();
        let args = ["--shared", "--queue", SOAK_QUEUE, "--threads", "2"];
        let mut args = [&args[..], &["--lease-ms", &lease_ms, "--db", db]].concat();
        if pooled {
            args.push("--pool");
        }
        let mut child = helper_process::command("worker", args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = helper_process::stdout_lines(&mut child);
        let (tx, lines) = crossbeam_channel::unbounded();
        let reader = std::thread::spawn(move || {
            for line in stdout.map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for up to `n` more lines (or a few seconds), returning the commits they report.
    fn hear(&self, n: usize, committed: &mut Vec<u64>) {
        for _ in 0..n {
            match self.lines.recv_timeout(Duration::from_secs(5)) {
                Ok(line) => record(&line, committed),
                Err(_) => return,
            }
        }
    }

    /// SIGKILL; the lines written before death still count (those commits had returned).
    fn kill(mut self, committed: &mut Vec<u64>) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        for line in self.lines.try_iter() {
            record(&line, committed);
        }
    }
}

fn record(line: &str, committed: &mut Vec<u64>) {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["committed", id, _] => committed.push(id.parse().unwrap()),
        ["now", _] => {}
        _ => panic!("worker said: {line}"),
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn worker_processes_killed_at_random_lose_nothing_and_commit_each_job_once() {
    let (dir, path) = store_path();
    // Half of the processes open the store through a symlink, and the observer now and then
    // through a hard link in another directory: however a process names the store, it sees
    // the others (a live process's lease taken is a failure below).
    let symlink = dir.path().join("alias.redb");
    std::os::unix::fs::symlink(&path, &symlink).unwrap();
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    let hard_link = dir.path().join("elsewhere/hard.redb");
    // Half of the processes are worker pools (claims ahead, completions committed in
    // batches), half claim loops, crossed with the two names.
    let mut started = 0usize;
    let mut next = || {
        started += 1;
        let name = match started % 2 {
            0 => path.clone(),
            _ => symlink.clone(),
        };
        (name, started % 4 >= 2)
    };
    // An hour-long lease: every reclaim in this test is a process death seen by a survivor
    // (or by an opening process), never an expiry.
    let lease_ms = 3_600_000;
    let mut observer = shared(&path);
    std::fs::hard_link(&path, &hard_link).unwrap();
    let kills = kills();
    let mut jobs = 0u64;
    // Keeps the workers busy through every kill: a few hundred jobs waiting at all times.
    let top_up = |store: &Store, jobs: &mut u64| {
        if store.stats().unwrap().total(JobState::Queued) < 200 {
            store
                .enqueue_batch((0..400).map(|i| NewJob::new(SOAK_QUEUE, format!("{i}"))))
                .unwrap();
            *jobs += 400;
        }
    };
    top_up(&observer, &mut jobs);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut committed = Vec::new();
    let mut killed = std::collections::BTreeSet::new();
    let mut start = || {
        let (name, pooled) = next();
        Worker::start(&name, lease_ms, pooled)
    };
    let mut workers: Vec<Worker> = (0..4).map(|_| start()).collect();
    for kill in 0..kills {
        top_up(&observer, &mut jobs);
        let victim = (xorshift(&mut rng) % workers.len() as u64) as usize;
        workers[victim].hear(1 + (xorshift(&mut rng) % 8) as usize, &mut committed);
        let worker = workers.swap_remove(victim);
        killed.insert(worker.pid());
        worker.kill(&mut committed);
        if kill % 10 == 9 {
            // Now and then every process at once, with no survivor watching (the observer is
            // closed meanwhile): the next open takes their leases back.
            drop(observer);
            for w in workers.drain(..) {
                killed.insert(w.pid());
                w.kill(&mut committed);
            }
            observer = shared(match kill % 20 {
                9 => &hard_link,
                _ => &path,
            });
        }
        while workers.len() < 4 {
            workers.push(start());
        }
    }
    wait_until("every job to succeed", || {
        observer.stats().unwrap().total(JobState::Succeeded) == jobs
    });
    for w in workers.drain(..) {
        w.kill(&mut committed);
    }
    let check = observer.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    // Every job's end is kept once, through every kill of the process that committed it,
    // and read back by another process in the order the ends committed.
    let mut ended = BTreeMap::<u64, usize>::new();
    let mut at = leasehold::EndCursor::START;
    loop {
        let page = observer.endings(at, 1000).unwrap();
        assert!(!page.gap);
        if page.list.is_empty() {
            break;
        }
        for e in &page.list {
            assert!(e.cursor > at, "endings read in their order");
            at = e.cursor;
            match &e.of {
                leasehold::EndOf::Job { id, .. } => {
                    assert_eq!(e.state, JobState::Succeeded, "job {id}");
                    *ended.entry(id.0).or_default() += 1;
                }
                other => panic!("an ending of {other:?}"),
            }
        }
    }
    assert_eq!(ended.len() as u64, jobs, "every job's end is kept");
    assert!(ended.values().all(|n| *n == 1), "each end is kept once");
    let read = observer.begin_read().unwrap();
    let effects = read.open_table(EFFECTS).unwrap();
    let (mut taken_back, mut by_pools) = (0, 0);
    for id in 1..=jobs {
        let history = observer.history(JobId(id)).unwrap();
        let successes: Vec<_> = history
            .iter()
            .filter(|run| run.outcome() == Some(&Outcome::Succeeded))
            .collect();
        assert_eq!(
            successes.len(),
            1,
            "job {id}: succeeded {} times",
            successes.len()
        );
        // A pool's even jobs commit their output alone, in its batches (worker.rs).
        let pooled = successes[0].worker().starts_with("pooled-");
        by_pools += usize::from(pooled);
        let with_effect = !(pooled && id % 2 == 0);
        let effect = effects.get(id).unwrap().map(|v| v.value());
        assert_eq!(
            effect,
            with_effect.then_some(1),
            "job {id}: its effect was committed {effect:?} times"
        );
        for run in history {
            if let Some(Outcome::LeaseExpired { path, .. }) = run.outcome() {
                assert!(
                    matches!(path, ReclaimPath::ProcessDied | ReclaimPath::Recovery),
                    "job {id}: taken back by {path:?}"
                );
                // only a killed process's lease was ever taken back
                let pid: u32 = run.worker().split('-').nth(1).unwrap().parse().unwrap();
                assert!(
                    killed.contains(&pid),
                    "job {id}: a live process's lease was taken"
                );
                taken_back += 1;
            }
        }
    }
    for id in &committed {
        assert_eq!(
            observer.job(JobId(*id)).unwrap().unwrap().state(),
            JobState::Succeeded
        );
    }
    eprintln!(
        "{kills} kills of worker processes (and every 10th, all of them at once): \
         {taken_back} leases taken back, {} commits reported, all {jobs} jobs committed \
         exactly once ({by_pools} by worker pools)",
        committed.len()
    );
    assert!(taken_back > 0);
    assert!(by_pools > 0, "no worker pool committed a job");
}

#[test]
fn a_stopped_process_keeps_its_lock_so_the_lease_decides_and_its_late_commit_is_fenced() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    let id = store.enqueue(NewJob::new(Q, "x")).unwrap();
    let mut stopped = Holder::start(&path, &["--claim", "1", "--lease-ms", "300"]);
    assert_eq!(stopped.claimed, vec![id]);
    stopped.signal(libc::SIGSTOP);
    // Alive but stopped: it still holds its instance lock, so no process-death reclaim comes;
    // the lease runs out and the reaper takes the job back.
    wait_until("the lease to expire and be reaped", || {
        !store.reap().unwrap().reclaimed.is_empty()
    });
    assert_eq!(died_path(&store, id), Some(ReclaimPath::Reaper));
    let live = store
        .claim(Q, "survivor", Duration::from_secs(60))
        .unwrap()
        .unwrap();
    store.complete(&live, b"done").unwrap();
    stopped.signal(libc::SIGCONT);
    assert_eq!(stopped.complete(), vec![format!("completed {} lost", id.0)]);
    let job = store.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.attempt().0), (JobState::Succeeded, 2));
    assert_eq!(store.output(id).unwrap().unwrap(), b"done");
    stopped.end();
}

#[test]
fn a_store_shared_by_processes_is_refused_to_a_writer_in_another_mode_and_kept_intact() {
    let (_dir, path) = store_path();
    let holder = Holder::start(&path, &["--enqueue", "2", "--claim", "1"]);
    for sharing in [Sharing::SingleWriter, Sharing::Exclusive] {
        match Store::builder(&path).sharing(sharing).open() {
            Err(leasehold::Error::Open(e @ leasehold::OpenError::IncompatibleSharing { .. })) => {
                assert!(e.to_string().contains("Sharing::MultiProcess"), "{e}")
            }
            other => panic!("{sharing:?}: expected a refusal, got {other:?}"),
        }
    }
    // a reader is welcome, and sees the holder's lease untouched
    let reader = leasehold::StoreReader::open(&path).unwrap();
    assert_eq!(reader.stats().unwrap().total(JobState::Running), 1);
    holder.kill();
}

#[test]
fn an_instance_file_nobody_holds_is_treated_as_dead_and_cleared_without_loss() {
    let (_dir, path) = store_path();
    {
        let store = shared(&path);
        store.enqueue(NewJob::new(Q, "x")).unwrap();
    }
    let procs = path.with_file_name("shared.redb.procs");
    std::fs::create_dir_all(&procs).unwrap();
    let stray = procs.join("00000000deadbeef.lock");
    std::fs::write(&stray, b"not a pid, and no lock held").unwrap();
    std::fs::write(procs.join("not-an-instance.txt"), b"ignored").unwrap();
    let store = shared(&path);
    assert!(store.recovered_at_open().reclaimed.is_empty());
    wait_until("the stray instance file to be cleared", || !stray.exists());
    assert_eq!(store.stats().unwrap().total(JobState::Queued), 1);
    assert!(store.check().unwrap().is_clean());
}

/// The instance file of the one process other than `store`'s that the store registers.
fn other_instance_file(path: &Path, store: &Store) -> PathBuf {
    let me = store.instance().unwrap().to_string();
    let procs = path.with_file_name("shared.redb.procs");
    let files: Vec<PathBuf> = std::fs::read_dir(&procs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".lock") && !name.starts_with(&me)
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn a_live_holders_leases_are_never_taken_through_another_name_of_the_store() {
    // Once: the instance directory was derived from the path as given, so a process that
    // opened the store through a symlink or a hard link saw none of its neighbours and took
    // every live holder's leases "because its process had ended".
    let (dir, path) = store_path();
    {
        let store = shared(&path);
        store
            .enqueue_batch((0..3).map(|i| NewJob::new(Q, format!("job {i}"))))
            .unwrap();
    }
    let holder = Holder::start(&path, &["--claim", "3"]);
    let symlink = dir.path().join("alias.redb");
    std::os::unix::fs::symlink(&path, &symlink).unwrap();
    let other_dir = dir.path().join("elsewhere");
    std::fs::create_dir(&other_dir).unwrap();
    let hard_link = other_dir.join("hard.redb");
    std::fs::hard_link(&path, &hard_link).unwrap();
    for alias in [&symlink, &hard_link] {
        let store = shared(alias);
        assert!(
            store.recovered_at_open().reclaimed.is_empty(),
            "{alias:?}: {:?}",
            store.recovered_at_open()
        );
        assert!(store.reap().unwrap().reclaimed.is_empty());
        std::thread::sleep(Duration::from_millis(300)); // several of the watcher's rescans
        for id in &holder.claimed {
            assert_eq!(store.job(*id).unwrap().unwrap().state(), JobState::Running);
        }
        let reader = leasehold::StoreReader::open(alias).unwrap();
        let holders = reader.holders().unwrap();
        assert_eq!(holders.len(), 3);
        assert!(
            holders
                .iter()
                .all(|(_, _, state)| *state == leasehold::HolderState::Alive),
            "{alias:?}: {holders:?}"
        );
    }
    // a process that opened the store by its hard link still sees the holder die at once
    let survivor = shared(&hard_link);
    let held = holder.claimed.clone();
    holder.kill();
    wait_until("the dead holder's jobs to come back", || {
        held.iter()
            .all(|id| survivor.job(*id).unwrap().unwrap().state() == JobState::Queued)
    });
    for id in held {
        assert_eq!(died_path(&survivor, id), Some(ReclaimPath::ProcessDied));
    }
    assert!(survivor.check().unwrap().is_clean());
}

#[test]
fn an_instance_file_removed_or_replaced_by_hand_proves_nothing_and_is_made_again() {
    let (_dir, path) = store_path();
    let store = shared(&path);
    store
        .enqueue_batch((0..2).map(|i| NewJob::new(Q, format!("job {i}"))))
        .unwrap();
    let holder = Holder::start(&path, &["--claim", "2"]);
    let file = other_instance_file(&path, &store);
    use std::os::unix::fs::MetadataExt;
    for replace in [false, true] {
        let mut not_its = vec![std::fs::metadata(&file).unwrap().ino()];
        std::fs::remove_file(&file).unwrap();
        if replace {
            std::fs::write(&file, b"12345\n").unwrap(); // nobody's lock
            not_its.push(std::fs::metadata(&file).unwrap().ino());
        }
        // a new process opens meanwhile: a missing or foreign file is no proof of death
        let opened = shared(&path);
        assert!(opened.recovered_at_open().reclaimed.is_empty());
        drop(opened);
        // the live holder makes its file again, locked, and registers it
        wait_until("the holder to make its instance file again", || {
            std::fs::metadata(&file).is_ok_and(|m| !not_its.contains(&m.ino()))
        });
        // ... and registers it: then it is known alive again
        wait_until("the holder to be known alive again", || {
            let reader = leasehold::StoreReader::open(&path).unwrap();
            reader
                .holders()
                .unwrap()
                .iter()
                .all(|(_, _, state)| *state == leasehold::HolderState::Alive)
        });
        for id in &holder.claimed {
            assert_eq!(store.job(*id).unwrap().unwrap().state(), JobState::Running);
        }
    }
    // and its death is seen at once through the new file
    let held = holder.claimed.clone();
    holder.kill();
    wait_until("the dead holder's jobs to come back", || {
        held.iter()
            .all(|id| store.job(*id).unwrap().unwrap().state() == JobState::Queued)
    });
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn a_fifo_or_a_directory_among_the_instance_files_stalls_nobody() {
    // Once: a FIFO named like an instance file blocked every watcher's scan in open(2), so a
    // killed holder's leases never came back and clean closes hung.
    let (_dir, path) = store_path();
    let store = shared(&path);
    store
        .enqueue_batch((0..2).map(|i| NewJob::new(Q, format!("job {i}"))))
        .unwrap();
    let procs = path.with_file_name("shared.redb.procs");
    let fifo = procs.join("00000000feedface.lock");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path; touches no other memory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(procs.join("00000000cafef00d.lock")).unwrap();
    let holder = Holder::start(&path, &["--claim", "2"]);
    let held = holder.claimed.clone();
    holder.kill();
    wait_until("the dead holder's jobs to come back", || {
        held.iter()
            .all(|id| store.job(*id).unwrap().unwrap().state() == JobState::Queued)
    });
    // a process that opens and closes cleanly beside them does not hang
    Holder::start(&path, &[]).end();
    drop(store);
    assert!(fifo.exists(), "what is not ours to remove stays");
}

#[test]
fn a_forked_child_keeping_a_dead_parents_lock_makes_no_neighbour_spin() {
    // Once: the dead parent's pidfd stayed readable and was polled again at once, so every
    // neighbour's watcher spun a core for as long as the child lived.
    let (_dir, path) = store_path();
    let store = shared(&path);
    store.enqueue(NewJob::new(Q, "x")).unwrap();
    let mut parent = Holder::start(&path, &["--claim", "1"]);
    let job = parent.claimed[0];
    let stdin = parent.child.stdin.as_mut().unwrap();
    stdin.write_all(b"fork\n").unwrap();
    stdin.flush().unwrap();
    let line = parent.out.next().unwrap().unwrap();
    let child: libc::pid_t = line.strip_prefix("forked ").unwrap().parse().unwrap();
    struct Kill(libc::pid_t);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the child the helper forked for this test.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _child = Kill(child);
    parent.kill();
    // the parent is gone, its lock held by the child: its lease stays until it expires
    std::thread::sleep(Duration::from_millis(500));
    let before = store.watcher_wakeups().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let woken = store.watcher_wakeups().unwrap() - before;
    // a rescan every 100 ms is 20; a spinning watcher wakes millions of times
    assert!(woken < 200, "the watcher woke {woken} times in 2 s");
    assert_eq!(store.job(job).unwrap().unwrap().state(), JobState::Running);
    drop(_child);
    wait_until("the lease to come back once the child died too", || {
        store.job(job).unwrap().unwrap().state() == JobState::Queued
    });
}

#[test]
fn a_refused_open_leaves_no_instance_file_and_makes_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    // a foreign file
    let foreign = dir.path().join("foreign.redb");
    std::fs::write(&foreign, b"not a store at all").unwrap();
    for _ in 0..3 {
        assert!(
            Store::builder(&foreign)
                .sharing(Sharing::MultiProcess)
                .open()
                .is_err()
        );
    }
    assert!(!dir.path().join("foreign.redb.procs").exists());
    // a store held by a single writer
    let single = dir.path().join("single.redb");
    let _writer = Store::open(&single).unwrap();
    for _ in 0..3 {
        assert!(
            Store::builder(&single)
                .sharing(Sharing::MultiProcess)
                .open()
                .is_err()
        );
    }
    assert!(!dir.path().join("single.redb.procs").exists());
    // a directory that does not exist: refused as a single writer's open is, nothing made
    let missing = dir.path().join("no/such/dir/s.redb");
    let single_error = Store::open(&missing).unwrap_err().to_string();
    let shared_error = Store::builder(&missing)
        .sharing(Sharing::MultiProcess)
        .open()
        .unwrap_err()
        .to_string();
    assert_eq!(single_error, shared_error);
    assert!(!dir.path().join("no").exists());
}

/// How many groups, of how many members, the groups' soak runs through kills.
const GROUPS: u64 = 20;
const MEMBERS: usize = 50;

#[test]
fn groups_through_worker_kills_run_every_member_once_and_each_callback_once() {
    let (_dir, path) = store_path();
    let observer = shared(&path);
    let lease_ms = 3_600_000;
    let mut started = 0usize;
    let mut start = || {
        started += 1;
        Worker::start(&path, lease_ms, started.is_multiple_of(2))
    };
    let mut workers: Vec<Worker> = (0..4).map(|_| start()).collect();
    let (mut committed, mut groups) = (Vec::new(), Vec::new());
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let kills = kills().clamp(30, 40);
    let mut plain = 0u64;
    for kill in 0..kills {
        // A group enqueued before each of the first kills, so that kills land while members,
        // group ends and callbacks are all in flight; then plain jobs, so that the last
        // kills too find work under way.
        if (groups.len() as u64) >= GROUPS {
            let more = (0..40).map(|i| NewJob::new(SOAK_QUEUE, format!("plain {i}")));
            observer.enqueue_batch(more).unwrap();
            plain += 40;
        } else {
            let callbacks = leasehold::NewGroup::new()
                .on_complete(NewJob::new(SOAK_QUEUE, format!("group {kill} complete")))
                .on_success(NewJob::new(SOAK_QUEUE, format!("group {kill} succeeded")));
            let members = (0..MEMBERS)
                .map(|i| NewJob::new(SOAK_QUEUE, format!("group {kill} member {i}")))
                .collect();
            groups.push(observer.enqueue_group(callbacks, members).unwrap().0);
        }
        let victim = (xorshift(&mut rng) % workers.len() as u64) as usize;
        workers[victim].hear(1 + (xorshift(&mut rng) % 8) as usize, &mut committed);
        workers.swap_remove(victim).kill(&mut committed);
        workers.push(start());
    }
    let jobs = GROUPS * (MEMBERS as u64 + 2) + plain;
    wait_until("every member and callback to succeed", || {
        observer.stats().unwrap().total(JobState::Succeeded) == jobs
    });
    for w in workers.drain(..) {
        w.kill(&mut committed);
    }
    let check = observer.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    for id in 1..=jobs {
        let successes = (observer.history(JobId(id)).unwrap().iter())
            .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
            .count();
        assert_eq!(successes, 1, "job {id} succeeded {successes} times");
    }
    groups::each_callback_ran_once_after_its_group(&observer, &groups, MEMBERS as u64);
    let taken_back = (1..=jobs)
        .flat_map(|id| observer.history(JobId(id)).unwrap())
        .filter(|r| matches!(r.outcome(), Some(Outcome::LeaseExpired { .. })))
        .count();
    eprintln!(
        "{kills} SIGKILLs of worker processes through {GROUPS} groups of {MEMBERS}: {jobs} jobs \
         (callbacks included) each succeeded once, {taken_back} leases taken back, {} commits \
         reported",
        committed.len()
    );
}

// ----- limits per key through kills: ten tenants, two at a time each -----

const TENANTS: &str = "tenants";

/// A `tenants` helper: a worker pool whose handler logs each job's start and end.
fn tenant_pool(path: &Path, log: &Path) -> Child {
    let args = ["--queue", TENANTS, "--workers", "6", "--lease-ms", HOUR_MS];
    let (db, log) = (path.to_str().unwrap(), log.to_str().unwrap());
    helper_process::command("tenants", [&args[..], &["--db", db, "--log", log]].concat())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Appends `line` to the handlers' log, as one write.
fn append(log: &Path, line: &str) {
    let file = std::fs::OpenOptions::new().append(true).open(log).unwrap();
    (&file).write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// Stops `child` (SIGSTOP) and waits until the kernel says every thread of it is stopped: it
/// writes nothing more, and holds what it held (its lock too, so nobody takes its leases
/// back yet). Every thread, not the process's first: a group stop reaches each thread on its
/// own way back to user space, so a handler's thread still inside its `write` when the first
/// thread stopped can log a start after the test's `killed` line, and the verdict would
/// count that killed handler as running for good (a run on a loaded machine once found a
/// tenant at three, which this explains; 22 runs since, alone and beside others, did not).
fn stop(child: &Child) {
    let pid = child.id();
    // SAFETY: kill(2) with a pid of our own child and a valid signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let stopped = |stat: &str| {
        // the state is the field after the command's closing parenthesis
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        state.is_some_and(|s| s.starts_with('T') || s.starts_with('t'))
    };
    wait_until("every thread of the process to stop", || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|task| {
            // (a thread that ended meanwhile has no stat to read: it writes nothing)
            std::fs::read_to_string(task.path().join("stat")).map_or(true, |s| stopped(&s))
        })
    });
}

/// The log's verdict: the most of each tenant's jobs in a handler at once (a killed
/// process's handlers end at its `killed` line, written while it was stopped, before any
/// survivor could take its leases back), and each job's starts by pid.
fn replay(log: &str) -> (BTreeMap<String, usize>, BTreeMap<u64, Vec<u32>>) {
    let mut in_handler: BTreeMap<String, usize> = BTreeMap::new();
    let mut most: BTreeMap<String, usize> = BTreeMap::new();
    let mut open: BTreeMap<u32, Vec<(u64, String)>> = BTreeMap::new();
    let mut starts: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for line in log.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["start", job, _, tenant, pid] => {
                let (job, pid) = (job.parse().unwrap(), pid.parse().unwrap());
                let n = in_handler.entry(tenant.to_string()).or_default();
                *n += 1;
                let m = most.entry(tenant.to_string()).or_default();
                *m = (*m).max(*n);
                open.entry(pid).or_default().push((job, tenant.to_string()));
                starts.entry(job).or_default().push(pid);
            }
            ["end", job, _, tenant, pid] => {
                let (job, pid): (u64, u32) = (job.parse().unwrap(), pid.parse().unwrap());
                let held = open.entry(pid).or_default();
                let at = held.iter().position(|(j, _)| *j == job).unwrap();
                held.swap_remove(at);
                *in_handler.get_mut(*tenant).unwrap() -= 1;
            }
            ["killed", pid] => {
                for (_, tenant) in open.remove(&pid.parse().unwrap()).unwrap_or_default() {
                    *in_handler.get_mut(&tenant).unwrap() -= 1;
                }
            }
            _ => panic!("the log says {line:?}"),
        }
    }
    (most, starts)
}

/// Three worker processes share a store whose queue allows two jobs of each tenant at once;
/// ten tenants' jobs wait. Processes are killed (SIGKILL) at random moments, ≥ 30 times,
/// and replaced. The handlers' own log, written outside the library, shows no tenant with
/// more than two jobs in a handler at any moment, and every job committed once: run again
/// only after the process that ran it died.
#[test]
fn ten_tenants_stay_at_two_jobs_each_through_kills_of_three_worker_processes() {
    let (dir, path) = store_path();
    let log = dir.path().join("handlers.log");
    std::fs::write(&log, "").unwrap();
    let observer = shared(&path);
    observer.declare_queue(TENANTS).unwrap();
    observer
        .set_queue_limits(TENANTS, leasehold::QueueLimits::none().per_key(2))
        .unwrap();
    let tenants: Vec<String> = (0..10).map(|t| format!("tenant-{t}")).collect();
    let mut jobs = 0u64;
    let top_up = |jobs: &mut u64| {
        if observer.stats().unwrap().total(JobState::Queued) < 100 {
            let batch = (0..200).map(|i| {
                let tenant = &tenants[i % tenants.len()];
                NewJob::new(TENANTS, tenant.as_str()).limit_key(tenant)
            });
            observer.enqueue_batch(batch).unwrap();
            *jobs += 200;
        }
    };
    top_up(&mut jobs);
    let mut procs: Vec<Child> = (0..3).map(|_| tenant_pool(&path, &log)).collect();
    let mut killed = std::collections::BTreeSet::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let kills = kills().max(30);
    for _ in 0..kills {
        top_up(&mut jobs);
        // Let the processes run for a moment of random length.
        let grown = std::fs::metadata(&log).unwrap().len() + 200 + xorshift(&mut rng) % 2_000;
        wait_until("the handlers to log more", || {
            std::fs::metadata(&log).unwrap().len() >= grown
        });
        let mut victim = procs.swap_remove((xorshift(&mut rng) % 3) as usize);
        stop(&victim);
        append(&log, &format!("killed {}", victim.id()));
        killed.insert(victim.id());
        victim.kill().unwrap();
        victim.wait().unwrap();
        procs.push(tenant_pool(&path, &log));
    }
    wait_until("every job to succeed", || {
        observer.stats().unwrap().total(JobState::Succeeded) == jobs
    });
    for mut p in procs {
        stop(&p);
        append(&log, &format!("killed {}", p.id()));
        p.kill().unwrap();
        p.wait().unwrap();
    }
    let (most, starts) = replay(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(most.len(), 10, "every tenant's jobs ran");
    for (tenant, most) in &most {
        assert!(*most <= 2, "{tenant} had {most} jobs in a handler at once");
    }
    let at_two = most.values().filter(|m| **m == 2).count();
    assert!(
        at_two > 0,
        "no tenant ever reached its limit: the test proves nothing"
    );
    let mut again = 0;
    for id in 1..=jobs {
        let history = observer.history(JobId(id)).unwrap();
        let successes = (history.iter())
            .filter(|run| run.outcome() == Some(&Outcome::Succeeded))
            .count();
        assert_eq!(successes, 1, "job {id} succeeded {successes} times");
        let pids = starts.get(&id).cloned().unwrap_or_default();
        assert!(!pids.is_empty(), "job {id} never started in a handler");
        for pid in &pids[..pids.len() - 1] {
            assert!(
                killed.contains(pid),
                "job {id} ran again though {pid} lived"
            );
        }
        again += pids.len() - 1;
    }
    let check = observer.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    eprintln!(
        "{kills} kills of three worker processes: {jobs} jobs of 10 tenants each committed \
         once ({again} run again after their process died); most in a handler at once per \
         tenant: {most:?}"
    );
}

/// A `resumer` helper process (`support/resumer.rs`) and the lines it has said.
struct Resumer {
    child: Child,
    lines: crossbeam_channel::Receiver<String>,
}

impl Drop for Resumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Resumer {
    fn start(path: &Path) -> Resumer {
        let db = path.to_str().unwrap();
        let args = ["--db", db, "--queue", "resume", "--workers", "2"];
        let mut child = helper_process::command("resumer", args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = helper_process::stdout_channel(&mut child);
        Resumer { child, lines }
    }

    /// SIGKILL once it has said up to `n` more lines (or a few seconds passed); every line
    /// it said before it died, into `said`.
    fn kill_after(mut self, n: usize, said: &mut Vec<String>) {
        for _ in 0..n {
            match self.lines.recv_timeout(Duration::from_secs(5)) {
                Ok(line) => said.push(line),
                Err(_) => break,
            }
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        // (the pipe's last lines, until its reader sees it closed)
        said.extend(self.lines.iter());
    }
}

/// Jobs of twelve steps, each step's checkpoint committed as it is done, through 30 SIGKILLs
/// of the worker processes (two at a time, on one shared file), each while jobs wait: every
/// attempt begins where the last committed checkpoint of the attempts before it left off
/// (never before it, which would do work again, and never past it), the first from
/// nothing, and every job completes once. A checkpoint committed whose line the kill cut
/// is the one step an attempt may begin past what was said.
#[test]
fn resumable_jobs_resume_from_their_last_committed_checkpoint_through_kills() {
    use helper_process::STEPS;
    let (_dir, path) = store_path();
    let observer = shared(&path);
    let more = |n: usize| (0..n).map(|i| NewJob::new("resume", format!("{i}")));
    let mut ids = observer.enqueue_batch(more(60)).unwrap();
    let mut said = Vec::new();
    let mut workers = vec![Resumer::start(&path), Resumer::start(&path)];
    let kills = kills().min(30);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..kills {
        let r = xorshift(&mut rng);
        let victim = workers.swap_remove((r % 2) as usize);
        victim.kill_after(3 + (r >> 8) as usize % 20, &mut said);
        workers.push(Resumer::start(&path));
        // (jobs must wait for the next kill to land mid-work: a slow start of the new
        // process leaves the survivor to run many)
        let succeeded = observer.stats().unwrap().total(JobState::Succeeded);
        if succeeded + 10 >= ids.len() as u64 {
            ids.extend(observer.enqueue_batch(more(30)).unwrap());
        }
    }
    let jobs = ids.len() as u64;
    wait_until("every job to complete", || {
        observer.stats().unwrap().total(JobState::Succeeded) == jobs
    });
    for w in workers.drain(..) {
        w.kill_after(0, &mut said);
    }
    // Per job and attempt: the step it began at, and the checkpoints it said it committed.
    let mut attempts: BTreeMap<(u64, u64), (u64, Vec<u64>)> = BTreeMap::new();
    let mut completions: BTreeMap<u64, usize> = BTreeMap::new();
    for line in &said {
        let words: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| words[i].parse::<u64>().unwrap();
        match words[..] {
            ["start", ..] => assert!(attempts.insert((n(1), n(2)), (n(3), vec![])).is_none()),
            ["saved", ..] => (attempts.get_mut(&(n(1), n(2))).unwrap().1).push(n(3)),
            ["committed", _] => *completions.entry(n(1)).or_default() += 1,
            _ => panic!("the resumer said {line:?}"),
        }
    }
    let mut resumed = 0;
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for ((job, attempt), (from, steps)) in &attempts {
        let before = last.get(job).copied().unwrap_or(0);
        assert!(
            *from == before || *from == before + 1,
            "job {job}'s attempt {attempt} began at step {from}; the attempts before it said \
             they committed {before}"
        );
        resumed += usize::from(*from > 0);
        let mut at = *from;
        for step in steps {
            assert_eq!(
                *step,
                at + 1,
                "job {job}'s attempt {attempt} skipped a step"
            );
            at = *step;
        }
        last.insert(*job, at);
    }
    assert!(completions.values().all(|n| *n == 1), "{completions:?}");
    for id in &ids {
        let history = observer.history(*id).unwrap();
        let successes = (history.iter()).filter(|r| r.outcome() == Some(&Outcome::Succeeded));
        assert_eq!(successes.count(), 1, "job {id}: {history:?}");
        let checkpoint = observer.checkpoint(*id).unwrap().unwrap();
        let at = u64::from_le_bytes(checkpoint.data().try_into().unwrap());
        assert_eq!(
            at, STEPS,
            "job {id} completed with its last checkpoint at {at}"
        );
    }
    assert!(
        resumed > 0,
        "no attempt resumed from a checkpoint: the kills missed every job mid-way"
    );
    eprintln!(
        "{kills} SIGKILLs of resuming worker processes: {jobs} jobs of {STEPS} steps each \
         completed, {resumed} attempts resumed from a checkpoint, each from the last one \
         committed"
    );
}
