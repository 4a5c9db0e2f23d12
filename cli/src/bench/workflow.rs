//! Workflow rows: what waiting costs. A group of N members fanned in to one callback, and N
//! jobs of which half are released by the completions of the other half, each drained by a
//! pool of W workers, beside N plain jobs drained by the same pool on the same engine.
//!
//! A group's member ends through the protocol (its end counts in the group's record, in the
//! same transaction), never PostgreSQL's one-statement completion: the rows say what that
//! costs.

use std::time::Instant;

use leasehold::{Engine, Error, JobId, JobStore, NewGroup, NewJob, Target, WorkerPool};

use super::drain::{QUEUE, drained, enqueue};
use super::measure::{Row, Samples};

/// The rows of one engine: plain jobs, a fan-in, dependency releases. `open` makes a fresh
/// store under a name.
pub(super) fn rows<S>(
    label: &str,
    open: impl Fn(&str) -> Result<S, Error>,
    jobs: usize,
    workers: usize,
) -> Result<Vec<Row>, Error>
where
    S: Engine + JobStore + Clone,
{
    let pool = |store: &S| {
        let store = store.clone();
        move || {
            WorkerPool::builder(store, QUEUE)
                .concurrency(workers)
                .start(|_| Ok(Vec::new()))
        }
    };
    let mut rows = Vec::new();

    let plain = open("wfplain")?;
    enqueue(label, &plain, jobs)?;
    let name = format!("drain: {jobs} plain jobs, for comparison ({label})");
    rows.push(drained(&name, &plain, workers, jobs, pool(&plain))?);

    let fan = open("wffanin")?;
    let start = Instant::now();
    let members = (0..jobs).map(|_| NewJob::new(QUEUE, Vec::new())).collect();
    let callback = NewGroup::new().on_complete(NewJob::new(QUEUE, "callback"));
    let (group, _) = fan.enqueue_group(callback, members)?;
    rows.push(Samples(Vec::new()).row(
        &format!("workflow: a group of {jobs} members opened, filled and sealed in one transaction ({label})"),
        "durable",
        1,
        start.elapsed(),
        jobs as u64,
    ));
    let name = format!("drain: fan-in: {jobs} members of a group, then its callback ({label})");
    rows.push(drained(&name, &fan, workers, jobs + 1, pool(&fan))?);
    let record = fan.group(group)?.ok_or(Error::GroupNotFound(group))?;
    if record.outcome() != Some(leasehold::JobState::Succeeded) {
        return Err(Error::Internal(
            "the fan-in's group did not end with every member",
        ));
    }

    let chained = open("wfrelease")?;
    let start = Instant::now();
    let half = jobs / 2;
    let deps =
        chained.enqueue_batch((0..half).map(|_| NewJob::new(QUEUE, Vec::new())).collect())?;
    let waiters = deps
        .iter()
        .map(|&d| NewJob::new(QUEUE, Vec::new()).after(d));
    chained.enqueue_batch(waiters.collect())?;
    let enqueued = start.elapsed();
    rows.push(Samples(Vec::new()).row(
        &format!("workflow: {half} jobs each waiting for one of {half} others, enqueued ({label})"),
        "durable",
        1,
        enqueued,
        half as u64,
    ));
    let name = format!(
        "drain: dependency release: {half} jobs, each released by its dependency's completion, and their {half} dependencies ({label})"
    );
    rows.push(drained(&name, &chained, workers, 2 * half, pool(&chained))?);
    // Every waiter ran after its dependency ended: a check, not a figure.
    for &dep in deps.iter().take(50) {
        let waiter = chained.waiters(dep)?;
        let released = waiter.first().and_then(|w| chained.job(*w).ok().flatten());
        let ok = released.is_some_and(|w| {
            w.needs().first().map(|n| n.on()) == Some(Target::Job(JobId(dep.0)))
                && w.needs()[0].met()
        });
        if !ok {
            return Err(Error::Internal(
                "a waiter was not released by its dependency",
            ));
        }
    }
    Ok(rows)
}
