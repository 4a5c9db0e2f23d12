//! What a process that waits for work costs while it waits: an application's pool, reaper,
//! scheduler and follower of the endings with nothing to do, counted in the wake-ups of the library's threads (a
//! device on a battery pays for each, and tokio's idle runtime makes none).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use leasehold::{Backend, EndCursor, Error, ReadJobs, Reaper, Scheduler, WorkerPool};

use super::measure::Row;

/// A pool of four, a reaper at its default interval, a scheduler at a second and a thread
/// that follows the endings ([`ReadJobs::wait_for_endings`], named as the library's threads
/// are, so that it is counted), on `store` with no job, no lease and no schedule, counted
/// over `window` once the pool has gone idle. `ops/s` is wake-ups per second of the library's threads together: each
/// thread's voluntary context switches, as the kernel counts them (Linux; elsewhere the
/// row says it was not measured).
pub(super) fn idle_wakeups<S>(engine: &str, store: Arc<S>, window: Duration) -> Result<Row, Error>
where
    S: ReadJobs + Clone + Into<Backend> + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let follower = std::thread::Builder::new()
        .name("leasehold-follow".into())
        .spawn({
            let (store, stop) = (store.clone(), stop.clone());
            move || {
                let mut at = EndCursor::START;
                while !stop.load(Ordering::SeqCst) {
                    match store.wait_for_endings(at, 100, Duration::from_secs(60)) {
                        Ok(page) => at = page.next,
                        Err(_) => return,
                    }
                }
            }
        })
        .map_err(Error::ThreadSpawn)?;
    let store: Backend = (*store).clone().into();
    let pool = WorkerPool::builder(store.clone(), "idle")
        .concurrency(4)
        .start(|_| Ok(()))?;
    let reaper = Reaper::start(store.clone(), leasehold::DEFAULT_REAPER_INTERVAL)?;
    let scheduler = Scheduler::start(store, Duration::from_secs(1))?;
    let settled = Instant::now() + Duration::from_secs(10);
    while pool.stats().idle_waits == 0 && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = library_threads();
    let started = Instant::now();
    std::thread::sleep(window);
    let after = library_threads();
    let elapsed = started.elapsed().as_secs_f64();
    drop((scheduler, reaper, pool));
    // (it stops at its next look, within FOLLOW_LOOK; not waited for)
    stop.store(true, Ordering::SeqCst);
    drop(follower);
    let (operation, per_sec) = match (before, after) {
        (Some(before), Some(after)) => {
            // Each thread's wake-ups in the window, summed by name (a thread that started
            // within it counts from zero).
            let mut by_name = BTreeMap::<String, u64>::new();
            for (tid, (name, n)) in &after {
                let was = before.get(tid).map_or(0, |b| b.1);
                *by_name.entry(name.clone()).or_default() += n.saturating_sub(was);
            }
            let total: u64 = by_name.values().sum();
            let mut most: Vec<_> = by_name.into_iter().filter(|(_, n)| *n > 0).collect();
            most.sort_by_key(|m| std::cmp::Reverse(m.1));
            let most: Vec<String> = (most.iter().take(4))
                .map(|(name, n)| format!("{name} {:.1}/s", *n as f64 / elapsed))
                .collect();
            let most = if most.is_empty() {
                "none".into()
            } else {
                most.join(", ")
            };
            (
                format!(
                    "idle: a pool of 4, a reaper (15 s), a scheduler (1 s), a follower of the endings, \
                     nothing to do \
                     ({engine}; {} threads; ops/s = their wake-ups per second; most: {most}; \
                     RSS of this bench process {} MiB)",
                    after.len(),
                    super::scale::resident_mib(&super::scale::Resident::This)
                ),
                total as f64 / elapsed,
            )
        }
        _ => (
            format!("idle: wake-ups not measured ({engine}; no /proc/self/task here)"),
            0.0,
        ),
    };
    Ok(Row {
        operation,
        durability: "durable",
        concurrency: 4,
        ops_per_sec: per_sec,
        p50_us: None,
        p99_us: None,
        max_us: None,
        ratio_to_raw: None,
    })
}

/// This process's threads that are the library's (named `lh-…` or `leasehold-…`), by
/// thread id: each one's name and voluntary context switches so far; `None` where the
/// kernel does not say.
fn library_threads() -> Option<BTreeMap<String, (String, u64)>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut threads = BTreeMap::new();
    for task in tasks.filter_map(|t| t.ok()).map(|t| t.path()) {
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !(comm.starts_with("lh-") || comm.starts_with("leasehold")) {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let voluntary = (status.lines())
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let tid = task.file_name().map(|t| t.to_string_lossy().into_owned());
        threads.insert(tid.unwrap_or_default(), (comm.trim().to_owned(), voluntary));
    }
    Some(threads)
}
