//! Weighted-queue rows: a pool over four weighted queues against a pool over one, draining
//! the same number of empty jobs with the same workers, and a pool over four queues of which
//! three are empty (what an empty queue costs its rounds: nothing, once found quiet).

use leasehold::{Engine, Error, JobStore, NewJob, Queues, WorkerPool};

use super::drain::drained;
use super::measure::Row;

/// The weighted pool's queues and their weights.
const LANES: [(&str, u32); 4] = [("w4", 4), ("w3", 3), ("w2", 2), ("w1", 1)];

/// The rows of one engine. `open` makes a fresh store under a name.
pub(super) fn rows<S>(
    label: &str,
    open: impl Fn(&str) -> Result<S, Error>,
    jobs: usize,
    workers: usize,
) -> Result<Vec<Row>, Error>
where
    S: Engine + JobStore + Clone,
{
    let mut rows = Vec::new();
    let one = open("wqone")?;
    fill(&one, &[("w4", jobs)])?;
    let name = format!("{jobs} empty jobs, a pool over one queue ({label})");
    rows.push(drained_by(&name, &one, workers, jobs, "w4".into())?);

    let four = open("wqfour")?;
    let each: Vec<(&str, usize)> = LANES.iter().map(|(q, _)| (*q, jobs / 4)).collect();
    fill(&four, &each)?;
    let name = format!("{jobs} empty jobs, a pool over four queues weighted 4:3:2:1 ({label})");
    rows.push(drained_by(
        &name,
        &four,
        workers,
        jobs / 4 * 4,
        Queues::weighted(LANES),
    )?);

    let sparse = open("wqsparse")?;
    fill(&sparse, &[("w1", jobs)])?;
    let name =
        format!("{jobs} empty jobs in one of a pool's four weighted queues, three empty ({label})");
    rows.push(drained_by(
        &name,
        &sparse,
        workers,
        jobs,
        Queues::weighted(LANES),
    )?);
    Ok(rows)
}

/// Enqueues so many empty jobs in each queue, a thousand per call.
fn fill<S: JobStore>(store: &S, queues: &[(&str, usize)]) -> Result<(), Error> {
    for &(queue, jobs) in queues {
        let mut left = jobs;
        while left > 0 {
            let k = left.min(1000);
            store.enqueue_batch((0..k).map(|_| NewJob::new(queue, Vec::new())).collect())?;
            left -= k;
        }
    }
    Ok(())
}

/// [`drained`] by a pool of `workers` over `queues`, as a `weighted:` row.
fn drained_by<S: Engine + JobStore + Clone>(
    name: &str,
    store: &S,
    workers: usize,
    jobs: usize,
    queues: Queues,
) -> Result<Row, Error> {
    drained(&format!("weighted: {name}"), store, workers, jobs, || {
        WorkerPool::builder(store.clone(), queues)
            .concurrency(workers)
            .start(|_| Ok(Vec::new()))
    })
}
