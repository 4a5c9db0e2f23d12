//! What a lease's holder calls, written once over any engine ([`LeaseBackend`]): renewals
//! in batches with their log lines, an attempt's end with the holder's last progress, a
//! completion with the next claim, a completion with the application's writes, and a
//! round as a pool's dispatcher makes it. A pool, [`JobStore`](crate::JobStore)'s calls and
//! the testing harness use them; each is one write transaction ([`write`]) or one round
//! ([`LeaseBackend::complete_all_then_claim`]).

use crate::backend::{LeaseBackend, RoundResults, write};
use crate::error::Result;
use crate::job_log::LogRecord;
use crate::lease::{Holding, Lease, LeaseTerms, Renewal};
use crate::protocol::{self, AnyWrites, Claim, Completion, End};
use crate::state::JobState;

/// A round as a pool's dispatcher makes it, for the stores' `complete_batch_and_claim`:
/// the claim's input checked before anything is written (a refusal answers every part, as
/// on both engines a whole round would fail), then [`LeaseBackend::complete_all_then_claim`].
pub(crate) fn round(
    store: &(impl LeaseBackend + ?Sized),
    done: &[(&Lease, &[u8])],
    claim: Claim<'_>,
) -> RoundResults {
    for queue in claim.queues() {
        if let Err(e) = crate::input::check_claim(queue, claim.worker, &claim.terms) {
            let each = || match &e {
                crate::error::Error::Input(i) => crate::error::Error::Input(i.clone()),
                crate::error::Error::Config(c) => crate::error::Error::Config(c.clone()),
                _ => crate::error::Error::Internal("a claim's check failed otherwise"),
            };
            return (done.iter().map(|_| Err(each())).collect(), Err(each()));
        }
    }
    store.complete_all_then_claim(completions(done), Some(claim))
}

/// Completions as the application gives them to a store: no progress, no writes.
pub(crate) fn completions(done: &[(&Lease, &[u8])]) -> Vec<Completion> {
    done.iter()
        .map(|(lease, output)| Completion {
            by: lease.holding(),
            output: output.to_vec(),
            progress: None,
            writes: None,
            log: None,
        })
        .collect()
}

/// Renews each lease of `beats` (with its holder's progress) in one write transaction of
/// `store`: one answer per lease, or the error that failed the whole batch (nothing
/// renewed).
///
/// `logs` are the attempts' log lines written since the last renewal, appended in the same
/// transaction (see [`crate::JobContext::log`]).
pub(crate) fn renew(
    store: &(impl LeaseBackend + ?Sized),
    beats: &[(&Lease, u64)],
    logs: Vec<(Holding, LogRecord)>,
) -> Result<Vec<Result<Renewal>>> {
    let leases: Vec<_> = beats.iter().map(|(l, p)| (l.holding(), *p)).collect();
    let marks = store.marks_due(&mut beats.iter().map(|(l, _)| l.queue.as_str()));
    write(store, move |r| {
        let renewed = protocol::renew_batch(r, &leases)?;
        for (by, lines) in &logs {
            protocol::append_log(r, *by, lines)?;
        }
        r.mark_served(&marks)?;
        Ok(renewed)
    })
}

/// Ends the attempt of `lease` as its holder says, recording its last progress with it;
/// the job's state after.
pub(crate) fn end(
    store: &(impl LeaseBackend + ?Sized),
    lease: &Lease,
    end: End,
    progress: Option<u64>,
) -> Result<JobState> {
    let by = lease.holding();
    write(store, move |r| protocol::end(r, by, &end, progress))
}

/// Completes the attempt of `lease` and claims the same worker's next job of its queue, in
/// one write transaction of `store`.
pub(crate) fn complete_then_claim(
    store: &(impl LeaseBackend + ?Sized),
    lease: &Lease,
    output: &[u8],
    progress: Option<u64>,
    terms: LeaseTerms,
) -> Result<Option<Lease>> {
    // Checked before anything is written: a bad setting found by the claim after the
    // completion wrote would fail the commit of its neighbours too.
    crate::config::check_terms(&terms)?;
    let (by, output) = (lease.holding(), output.to_vec());
    let marks = store.marks_due(&mut std::iter::once(lease.queue.as_str()));
    let (queue, worker) = (lease.queue.clone(), lease.worker.clone());
    write(store, move |r| {
        protocol::complete(r, by, &output, progress)?;
        let claimed = protocol::claim_batch(r, &queue, &worker, terms, 1)?;
        r.mark_served(&marks)?;
        Ok(claimed.into_iter().next())
    })
}

/// Completes `lease` with the application's `writes`, under its fence, in a round of its own
/// ([`protocol::round`]): the engine runs them its own way, and one that has no tables of
/// the application's refuses them. A panic in them fails the completion
/// ([`WritesPanicked`](crate::protocol::WritesPanicked)), the lease still held.
pub(crate) fn complete_with_writes(
    store: &(impl LeaseBackend + ?Sized),
    lease: &Lease,
    output: &[u8],
    progress: Option<u64>,
    writes: AnyWrites,
) -> Result<()> {
    let done = vec![Completion {
        by: lease.holding(),
        output: output.to_vec(),
        progress,
        writes: Some(writes),
        log: None,
    }];
    let (mut answers, _) = store.complete_all_then_claim(done, None);
    (answers.pop()).unwrap_or(Err(crate::error::Error::Internal("a round lost an answer")))
}
