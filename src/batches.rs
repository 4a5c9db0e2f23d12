//! Maintenance in bounded batches: one shape for every pass over an unbounded number of
//! records, on both engines: the reaper's reclaims, the reclaims of a dead process, the
//! purge of finished jobs.
//!
//! A pass runs one transaction per batch. Each batch looks at most `limit` entries from
//! where the last one stopped (its cursor is the batch's own: an index position, or simply
//! "the first still due" when each batch removes what it takes) and says how many it looked
//! at; a batch that looked at fewer than `limit` found the end, and the pass stops. Between
//! batches the pass pauses a moment, jittered, so that the application's writes (and other
//! processes' and machines' maintenance) interleave with a long pass instead of queueing
//! behind it: a pool's mass death is taken back in many short transactions, not one long
//! one. Both engines count a pass alike: the batches that looked at anything, and the
//! largest number of items one of them produced.

use std::time::Duration;

/// The longest pause between two batches of a pass.
const PAUSE: Duration = Duration::from_micros(500);

/// What one batch did.
pub(crate) struct Batch<T> {
    /// What it produced (reclaims, say).
    pub items: Vec<T>,
    /// How many entries it looked at: fewer than its limit means it found the end.
    pub looked: usize,
}

/// What a pass did.
pub(crate) struct Pass<T> {
    /// Everything its batches produced, in order.
    pub items: Vec<T>,
    /// How many batches looked at anything.
    pub batches: usize,
    /// The most items one batch produced.
    pub largest: usize,
}

impl From<Pass<crate::report::Reclaim>> for crate::report::ReapReport {
    fn from(pass: Pass<crate::report::Reclaim>) -> crate::report::ReapReport {
        crate::report::ReapReport {
            reclaimed: pass.items,
            batches: pass.batches,
            largest_batch: pass.largest,
            ..crate::report::ReapReport::default()
        }
    }
}

/// Runs `step(limit)` until a batch comes back short, pausing briefly between batches.
pub(crate) fn run<T, E>(
    limit: usize,
    mut step: impl FnMut(usize) -> Result<Batch<T>, E>,
) -> Result<Pass<T>, E> {
    let mut pass = Pass {
        items: Vec::new(),
        batches: 0,
        largest: 0,
    };
    loop {
        let batch = step(limit)?;
        if batch.looked > 0 {
            pass.batches += 1;
            pass.largest = pass.largest.max(batch.items.len());
        }
        pass.items.extend(batch.items);
        if batch.looked < limit {
            return Ok(pass);
        }
        let jitter = crate::random::random_u64() % (PAUSE.as_micros() as u64 + 1);
        std::thread::sleep(Duration::from_micros(jitter));
    }
}

/// An operator's action on every job `filter` names, page by page: each page of at most
/// `page` ids (listed after the last page's end) is handed to `apply`, which acts on them
/// in one transaction and answers each (`Ok(true)`: changed; a refusal: refused; an error
/// of the store fails the pass). The filter's limit, if any, bounds the whole pass.
pub(crate) fn bulk(
    filter: &crate::query::JobFilter,
    page: usize,
    list: impl Fn(&crate::query::JobFilter) -> crate::error::Result<Vec<crate::job::Job>>,
    mut apply: impl FnMut(
        Vec<crate::ids::JobId>,
    ) -> crate::error::Result<Vec<crate::error::Result<bool>>>,
) -> crate::error::Result<crate::report::BulkReport> {
    let mut report = crate::report::BulkReport::default();
    let mut cursor = filter.after;
    loop {
        let left = filter.limit.map_or(usize::MAX, |n| n - report.matched);
        let want = page.clamp(1, usize::MAX).min(left);
        if want == 0 {
            return Ok(report);
        }
        let ids: Vec<crate::ids::JobId> = list(&crate::query::JobFilter {
            order: crate::query::JobOrder::Oldest,
            limit: Some(want),
            after: cursor,
            ..filter.clone()
        })?
        .iter()
        .map(crate::job::Job::id)
        .collect();
        let Some(&last) = ids.last() else {
            return Ok(report);
        };
        cursor = Some(last);
        report.matched += ids.len();
        let short = ids.len() < want;
        for (id, answer) in ids.clone().into_iter().zip(apply(ids)?) {
            match answer {
                Ok(true) => report.changed += 1,
                Ok(false) => {}
                Err(e) if e.is_refusal() => report.refused.push((id, e)),
                Err(e) => return Err(e),
            }
        }
        if short {
            return Ok(report);
        }
    }
}

/// Each answer of a bulk action's transaction, or the first error of the store among them
/// (which must roll the transaction back): a refusal wrote nothing and shares it safely.
pub(crate) fn answers<T>(
    results: impl IntoIterator<Item = crate::error::Result<T>>,
) -> crate::error::Result<Vec<crate::error::Result<T>>> {
    let mut out = Vec::new();
    for r in results {
        match r {
            Err(e) if !e.is_refusal() => return Err(e),
            r => out.push(r),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_stops_at_the_first_short_batch_and_counts_the_batches_that_looked() {
        let mut left = 25usize;
        let pass = run::<usize, ()>(10, |limit| {
            let n = left.min(limit);
            left -= n;
            Ok(Batch {
                items: (0..n).collect(),
                looked: n,
            })
        })
        .unwrap();
        assert_eq!((pass.items.len(), pass.batches, pass.largest), (25, 3, 10));
        // an exact fit takes one more, empty, look, which is not counted
        let mut left = 20usize;
        let pass = run::<usize, ()>(10, |limit| {
            let n = left.min(limit);
            left -= n;
            Ok(Batch {
                items: vec![0; n],
                looked: n,
            })
        })
        .unwrap();
        assert_eq!((pass.items.len(), pass.batches), (20, 2));
    }
}
