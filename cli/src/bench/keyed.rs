//! Limits per key: what a claim costs when 999 of a queue's 1,000 tenants are at their
//! limit (their waiting jobs parked, out of the claim order) against one where none is.
//! (Fewer tenants below scale 1, so that a tiny run stays tiny; the rows name how many.)
//! Each claim is timed alone; its job is completed after, untimed, so every claim meets the
//! same queue. The three stores of an engine take their claims in turn.

use std::time::Instant;

use leasehold::{Error, JobStore, NewJob, QueueLimits};

use super::LEASE;
use super::measure::{Row, Samples};

const QUEUE: &str = "tenants";
/// Waiting jobs per tenant.
const EACH: usize = 5;

/// The rows of one engine: claims with no tenant of `tenants` at its limit, then with all
/// but one at it, beside the same claims of jobs without a key. `open` makes a fresh store
/// under a name. The three stores take their claims in turn (one of each, and again), so
/// that what slows the machine for a while (the disk, another process) falls on all three
/// rows alike and their ratio holds.
pub(super) fn rows<S: JobStore>(
    label: &str,
    durability: &'static str,
    open: impl Fn(&str) -> Result<S, Error>,
    claims: usize,
    tenants: usize,
) -> Result<Vec<Row>, Error> {
    // For scale: the same claims of jobs without a key.
    let plain = open("keyed_plain")?;
    for _ in 0..(tenants * (EACH + 2) + claims).div_ceil(1000) {
        plain.enqueue_batch((0..1000).map(|_| NewJob::new(QUEUE, Vec::new())).collect())?;
    }
    let free = open("keyed_free")?;
    prepare(&free, tenants, 0, claims)?;
    let full = open("keyed_full")?;
    prepare(&full, tenants, tenants - 1, claims)?;
    let stores = [&plain, &free, &full];
    let mut samples = [(); 3].map(|_| Vec::with_capacity(claims));
    for _ in 0..claims {
        for (store, samples) in stores.iter().zip(samples.iter_mut()) {
            samples.push(claimed(*store)?);
        }
    }
    let names = [
        format!("keyed: claim of one job without a key, for scale ({label})"),
        format!(
            "keyed: claim of one job, {tenants} tenants at 2 each, none at its limit ({label})"
        ),
        format!(
            "keyed: claim of one job, {tenants} tenants at 2 each, {} at their limit ({label})",
            tenants - 1
        ),
    ];
    Ok(names
        .iter()
        .zip(samples)
        .map(|(name, samples)| {
            let total = samples.iter().sum();
            Samples(samples).row(name, durability, 1, total, claims as u64)
        })
        .collect())
}

/// A queue of `tenants` tenants limited to two running jobs each, `EACH` jobs of each
/// waiting; the first `at_limit` tenants hold two running. The last tenant has enough jobs
/// for `claims` more.
fn prepare<S: JobStore>(
    store: &S,
    tenants: usize,
    at_limit: usize,
    claims: usize,
) -> Result<(), Error> {
    store.declare_queue(QUEUE)?;
    store.set_queue_limits(QUEUE, QueueLimits::none().per_key(2))?;
    let job = |t: usize| NewJob::new(QUEUE, Vec::new()).limit_key(format!("tenant-{t}"));
    for _ in 0..EACH + 2 {
        store.enqueue_batch((0..tenants - 1).map(job).collect())?;
    }
    let mut held = 0;
    while held < 2 * at_limit {
        let n = (2 * at_limit - held).min(500);
        let got = store.claim_batch(QUEUE, "holder", LEASE.into(), n)?;
        if got.is_empty() {
            return Err(Error::Internal("the bench's tenants would not fill"));
        }
        held += got.len();
    }
    for _ in 0..(claims + EACH).div_ceil(1000) {
        store.enqueue_batch((0..1000).map(|_| job(tenants - 1)).collect())?;
    }
    Ok(())
}

/// Times one claim; its job is completed after, untimed.
fn claimed<S: JobStore>(store: &S) -> Result<std::time::Duration, Error> {
    let t = Instant::now();
    let lease = store.claim(QUEUE, "bench", LEASE.into())?;
    let took = t.elapsed();
    let lease = lease.ok_or(Error::Internal("a bench claim found nothing"))?;
    store.complete(&lease, b"")?;
    Ok(took)
}
