//! Group commit: threads that each enqueue one job a call share commits (leader/follower:
//! the first caller to find no commit under way commits for everyone queued behind it). A
//! dedicated writer thread, the other shape once weighed, was slower and is gone;
//! BENCHMARKS.md keeps its figures.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::JobStore;
use leasehold::{Error, NewJob, Sharing};

use super::measure::{Row, Samples};
use super::store_with;

/// `threads` threads each enqueueing `calls` jobs one call at a time: every call's
/// latency, and the total rate.
pub(super) fn group_commit(
    dir: &Path,
    durable: bool,
    threads: usize,
    calls: usize,
) -> Result<Row, Error> {
    let name = format!("group-{durable}-{threads}.redb");
    let store = store_with(dir, &name, durable, |b| b.sharing(Sharing::Exclusive))?;
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<Duration>, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let store = &store;
                s.spawn(move || {
                    (0..calls)
                        .map(|i| {
                            let t = Instant::now();
                            store.enqueue(NewJob::new("q", format!("{i}")))?;
                            Ok(t.elapsed())
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(Error::InUse("a bench thread panicked")))
            })
            .collect()
    });
    let total = start.elapsed();
    let mut samples = Vec::new();
    for t in per_thread {
        samples.extend(t?);
    }
    let commits = store.metrics().write_transactions.max(1);
    let label = format!(
        "enqueue, one job per call, group commit ({:.1} calls/commit)",
        (threads * calls) as f64 / commits as f64
    );
    Ok(Samples(samples).row(
        &label,
        if durable { "durable" } else { "non-durable" },
        threads,
        total,
        (threads * calls) as u64,
    ))
}
