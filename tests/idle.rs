//! What an idle process costs: a test of its own, in a process of its own, since it counts
//! the wake-ups of every library thread of the process (another test's pool or PostgreSQL
//! listener beside it would be counted too).
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

/// The tests of this file count every library thread of the process: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The library's threads (`lh-…`, `leasehold-…`): each one's name and voluntary switches so
/// far, by thread id.
fn switches() -> std::collections::BTreeMap<String, (String, u64)> {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    let mut threads = std::collections::BTreeMap::new();
    for task in tasks.map(|t| t.unwrap().path()) {
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !(comm.starts_with("lh-") || comm.starts_with("leasehold")) {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let count = (status.lines())
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap());
        let tid = task.file_name().unwrap().to_string_lossy().into_owned();
        threads.insert(tid, (comm.trim().to_owned(), count));
    }
    threads
}

/// Each library thread's wake-ups over two seconds from now (those that woke at all).
fn woken_in_two_seconds() -> Vec<(String, u64)> {
    let before = switches();
    // A window to count in, not a timing: the count is of what happened within it.
    std::thread::sleep(Duration::from_secs(2));
    (switches().into_iter())
        .map(|(tid, (comm, n))| (comm, n - before.get(&tid).map_or(0, |b| b.1)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Waits (a generous deadline) until `pool`'s dispatcher has gone idle.
fn until_idle(pool: &leasehold::WorkerPool) {
    #[allow(clippy::disallowed_methods)] // a test deadline, not store time
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pool.stats().idle_waits == 0 {
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        assert!(!late, "the dispatcher did not go idle");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A pool with nothing to do, a reaper and a scheduler beside it, on a store file: what they
/// cost their process while they wait is wake-ups, and a device that waits for work on a
/// battery pays for each. Their threads together wake about once a heartbeat interval and
/// once a reaper interval, never ten times a second (the pool's watch over its heartbeat
/// did, when it looked every 100 ms whether the heartbeat had stopped; the scheduler did,
/// at an interval of 100 ms, when it passed every interval rather than sleep until its
/// schedule's next tick, an hour away here). Counted by the kernel: each thread's
/// voluntary context switches (a thread that sleeps and wakes switches once), over two
/// seconds of idleness.
#[test]
fn an_idle_pool_its_reaper_and_its_scheduler_wake_their_threads_seldom() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let store = leasehold::Store::open(dir.path().join("idle.redb")).unwrap();
    use leasehold::JobStore;
    let hourly = leasehold::NewJob::new("q", "hourly");
    store
        .declare_schedule(leasehold::Schedule::every(
            "hourly",
            Duration::from_secs(3600),
            hourly,
        ))
        .unwrap();
    let scheduler = leasehold::Scheduler::start(store.clone(), Duration::from_millis(100)).unwrap();
    let pool = leasehold::WorkerPool::builder(store.clone(), "q")
        .concurrency(4)
        .start(|_| Ok(()))
        .unwrap();
    let reaper = leasehold::Reaper::start(store.clone(), Duration::from_secs(15)).unwrap();
    until_idle(&pool);
    let woke = woken_in_two_seconds();
    let total: u64 = woke.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 2,
        "the idle pool, reaper and scheduler woke their threads {total} times in 2 s: {woke:?}"
    );
    assert_eq!(scheduler.metrics().fired(), 0);
    drop(scheduler);
    drop(reaper);
    drop(pool);
}

/// An idle pool looks for work on its own once a heartbeat (a change made elsewhere may wake
/// no one), and a look that finds nothing due reads the queue's next due time rather than
/// claim: it takes no write transaction (each look was a claim once; on PostgreSQL a
/// transaction of four round trips where one statement now serves). So an idle pool goes on
/// looking while the store answers no write; and work that comes is still found.
#[test]
fn an_idle_pools_looks_that_find_nothing_due_take_no_write_transaction() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (store, _clock) = leasehold::memory::MemoryStore::manual();
    let pool = leasehold::WorkerPool::builder(store.clone(), "q")
        .concurrency(2)
        .lease(Duration::from_millis(600))
        .heartbeat_every(Duration::from_millis(20))
        .start(|_| Ok(()))
        .unwrap();
    until_idle(&pool);
    #[allow(clippy::disallowed_methods)] // a test deadline, not store time
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let late = || {
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        late
    };
    store.hold_writes(|| {
        let looks = pool.stats().idle_waits;
        while pool.stats().idle_waits < looks + 10 {
            assert!(
                !late(),
                "the idle pool's looks waited for the writer's seat"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    use leasehold::{JobStore, ReadJobs};
    let id = store.enqueue(leasehold::NewJob::new("q", "x")).unwrap();
    while store.job(id).unwrap().unwrap().state() != leasehold::JobState::Succeeded {
        assert!(!late(), "the idle pool did not run the job that came");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// On PostgreSQL, the `LISTEN` thread of an idle pool sleeps until a notification comes (it
/// looked at its stop flag five times a second once), the pool looks for work on its own
/// only once a heartbeat while it listens (every 250-500 ms once: 57 wake-ups in 2 s), and the
/// store's close wakes the listener to stop: once the last handle is dropped, the thread is
/// gone, not left to end later.
#[test]
fn the_listen_thread_of_an_idle_pool_on_postgres_sleeps_and_ends_with_its_store() {
    let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
        println!("the LISTEN thread's idle test did not run: LEASEHOLD_PG_URL is not set");
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let schema = format!("lh_idle_{}", std::process::id());
    let store = leasehold::postgres::PgStore::builder(&url)
        .schema(&schema)
        .open()
        .unwrap();
    let pool = leasehold::WorkerPool::builder(store.clone(), "q")
        .concurrency(1)
        .start(|_| Ok(()))
        .unwrap();
    until_idle(&pool);
    let listening = || {
        (switches().into_values())
            .filter(|(comm, _)| comm.starts_with("leasehold-list"))
            .count()
    };
    assert_eq!(listening(), 1, "an idle pool on PostgreSQL listens");
    let woke = woken_in_two_seconds();
    let listen: u64 = (woke.iter())
        .filter(|(comm, _)| comm.starts_with("leasehold-list"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        listen <= 1,
        "the LISTEN thread woke {listen} times in 2 s: {woke:?}"
    );
    // and, while it listens, the pool's own look for work (for what no notification
    // announces) comes once a heartbeat (20 s): in two seconds, at most one look's switches
    let total: u64 = woke.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 15,
        "the idle pool woke {total} times in 2 s: {woke:?}"
    );
    drop(pool);
    drop(store);
    assert_eq!(listening(), 0, "the LISTEN thread outlived its store");
    let mut admin =
        leasehold::postgres::client::Client::connect(&url, leasehold::postgres::client::NoTls)
            .unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .unwrap();
}
