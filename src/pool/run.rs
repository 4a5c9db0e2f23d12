//! A worker: runs the handler for one job, catches its panic, validates its output, and
//! commits through the fence, or withholds the result when the lease is gone.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::panic_message;
use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, Sender};

use super::context::{Interruption, JobContext, JobError, Output, no_retry_mends};
use super::handover::Handed;
use super::stats::bump;
use super::{Flight, Shared};
use crate::clock::Stopwatch;
use crate::error::Error;
use crate::job::Outcome;
use crate::protocol::AnyWrites;
use crate::protocol::End;
use crate::rules::{self, Retry};
use crate::state::JobState;

pub(crate) fn worker_loop(shared: &Shared, jobs: &Receiver<Flight>, slots: &Sender<()>) {
    for flight in jobs.iter() {
        // A worker whose completion also claimed its next job goes straight on to it; only
        // when it found nothing does it hand its slot back to the dispatcher. (Only the job
        // from the channel was counted as waiting for a worker.)
        let mut next = Some(flight);
        let mut waited = true;
        while let Some(flight) = next.take() {
            let attempt = (flight.lease.job, flight.lease.attempt);
            if !shared.running() && !shared.abandoned() {
                // Not started when the pool began to shut down (claimed ahead, say): give it
                // back rather than make the shutdown wait for it (unless the shutdown's own
                // release got to it first).
                if flight.state.interruption().is_none() {
                    give_back(shared, &flight);
                }
                if std::mem::take(&mut waited) {
                    shared.queued.fetch_sub(1, Ordering::Relaxed);
                }
                shared.finish(attempt);
                continue;
            }
            match run_one(shared, flight, std::mem::take(&mut waited)) {
                After::Finished => shared.finish(attempt),
                // Still in flight (and renewed) until the dispatcher commits it.
                After::HandedOver => {}
                After::Next(flight) => {
                    shared.finish(attempt);
                    next = Some(flight);
                }
            }
        }
        let _ = slots.send(());
    }
    shared.worker_exited();
}

/// Releases the job: claimable again at once, no budget spent.
fn give_back(shared: &Shared, flight: &Flight) {
    match release(shared, flight) {
        Ok(()) => {}
        Err(e) if e.is_lease_lost() => bump(&shared.counters.rejected_writes),
        Err(e) => tracing::warn!(job = %flight.lease.job, error = %e, "release failed"),
    }
}

/// Releases the job and counts it (the caller judges a refusal: a lease lost meanwhile is a
/// refused write to a worker, and nothing at shutdown, where the job may have finished).
pub(crate) fn release(shared: &Shared, flight: &Flight) -> crate::error::Result<()> {
    let progress = Some(flight.state.progress());
    let state = crate::holder::end(&*shared.store, &flight.lease, End::Release, progress)?;
    bump(&shared.counters.released);
    shared.ended(&flight.lease, Outcome::Released, state);
    Ok(())
}

/// Ends the attempt as timed out in the store, with the holder's last progress if it ran:
/// the pool's timer saw its deadline (see `heartbeat::time_out_due`). A refusal means it
/// ended otherwise meanwhile (a renewal found the deadline, a completion landed before it);
/// a failure leaves it to end at its deadline, where its lease runs out. Returns whether it
/// ended it.
pub(super) fn time_out(shared: &Shared, flight: &Flight) -> bool {
    let lease = &flight.lease;
    let progress = flight.state.started().then(|| flight.state.progress());
    match crate::holder::end(&*shared.store, lease, End::TimeOut, progress) {
        Ok(state) => {
            let outcome = rules::time_out_outcome(lease.claimed_at, lease.deadline);
            shared.ended(lease, outcome, state);
            true
        }
        Err(e) if e.is_lease_lost() => false,
        Err(e) => {
            tracing::warn!(job = %lease.job, error = %e, "recording the time-out failed; the lease ends at its deadline");
            false
        }
    }
}

/// Where a worker stands once a job's verdict is dealt with.
enum After {
    /// Committed (or withheld): the job is no longer in flight.
    Finished,
    /// The completion was handed to the dispatcher, which ends the flight when it commits.
    HandedOver,
    /// Committed, and the same commit claimed this job for the worker.
    Next(Flight),
}

/// What the handler's run amounts to.
enum Verdict {
    Complete(Output<AnyWrites>),
    Snooze(std::time::Duration),
    Fail {
        message: String,
        retry: Retry,
        counter: FailKind,
    },
}

#[derive(Copy, Clone)]
enum FailKind {
    Failed,
    Panicked,
    Invalid,
}

/// Runs one job and commits its verdict (or hands it over to be committed). `waited`: the
/// job was counted as claimed ahead, waiting for a worker, until now.
fn run_one(shared: &Shared, flight: Flight, waited: bool) -> After {
    flight.state.start();
    // A job claimed ahead may have waited past its lease (renewals behind, a stopped
    // process): another pool may hold it now, so it is not run.
    if flight.state.expires_at() <= shared.store.clock() {
        let shed = &shared.counters.shed;
        flight
            .state
            .interrupt(Interruption::LeaseExpired, Some(shed));
    }
    // From here on it is started (or given back): no longer claimed ahead.
    if waited {
        shared.queued.fetch_sub(1, Ordering::Relaxed);
    }
    if let Some(why) = flight.state.interruption() {
        unstarted(shared, &flight, why);
        return After::Finished;
    }
    let ctx = JobContext::new(
        flight.lease.clone(),
        flight.state.clone(),
        shared.store.clone(),
    );
    shared.store.started(&flight.lease);
    // (store time: how long it waited since it was due, however long it was claimed ahead)
    let waited = shared.store.clock().saturating_since(flight.lease.due_at);
    let watch = Stopwatch::start();
    let ran = catch_unwind(AssertUnwindSafe(|| (shared.handler)(&ctx)));
    shared.pace.job_ran(watch.elapsed());
    (shared.counters).ran_of(&flight.lease.queue, waited, watch.elapsed());
    let verdict = match ran {
        Ok(Ok(output)) => match &shared.validator {
            // The validator is the application's code too: its panic fails the attempt like
            // the handler's, rather than take the worker (and the job's lease) with it.
            Some(validate) => {
                match catch_unwind(AssertUnwindSafe(|| validate(&ctx, &output.bytes))) {
                    Ok(Ok(())) => Verdict::Complete(output),
                    Ok(Err(why)) => Verdict::Fail {
                        message: format!("output refused by validator: {why}"),
                        retry: Retry::WhileBudgetLasts,
                        counter: FailKind::Invalid,
                    },
                    Err(panic) => Verdict::Fail {
                        message: format!("validator panicked: {}", panic_message(&*panic)),
                        retry: Retry::WhileBudgetLasts,
                        counter: FailKind::Panicked,
                    },
                }
            }
            None => Verdict::Complete(output),
        },
        Ok(Err(e)) => match e.snoozed_for() {
            Some(delay) => Verdict::Snooze(delay),
            None => Verdict::Fail {
                message: e.message().to_owned(),
                retry: e.retry(),
                counter: FailKind::Failed,
            },
        },
        Err(panic) => Verdict::Fail {
            message: format!("handler panicked: {}", panic_message(&*panic)),
            retry: Retry::WhileBudgetLasts,
            counter: FailKind::Panicked,
        },
    };
    let lease = &flight.lease;
    // (a completion handed to the dispatcher carries its lines into its round's commit)
    let completes = matches!(&verdict, Verdict::Complete(_))
        && matches!(
            flight.state.interruption(),
            None | Some(Interruption::Shutdown)
        );
    if !completes && !matches!(flight.state.interruption(), Some(Interruption::Abandoned)) {
        flush_log(&*shared.store, &flight);
    }
    // The application's code is done with the job, unless writes of its commit with it.
    if !matches!(&verdict, Verdict::Complete(output) if output.writes.is_some()) {
        shared.store.returned(lease);
    }
    match (flight.state.interruption(), verdict) {
        (Some(Interruption::Abandoned), _) => {}
        // Shutting down: a finished result is still worth committing if the lease holds; a
        // failure is not recorded (the job was or will be released, no budget spent).
        (None | Some(Interruption::Shutdown), Verdict::Complete(output)) => {
            return commit_success(shared, flight, output);
        }
        (
            None,
            Verdict::Fail {
                message,
                retry,
                counter,
            },
        ) => commit_failure(shared, &flight, &message, retry, counter),
        (None, Verdict::Snooze(delay)) => {
            let progress = Some(flight.state.progress());
            match crate::holder::end(&*shared.store, lease, End::Snooze(delay), progress) {
                Ok(state) => {
                    bump(&shared.counters.snoozed);
                    shared.ended(lease, Outcome::Snoozed { delay }, state);
                }
                Err(e) if e.is_lease_lost() => bump(&shared.counters.rejected_writes),
                Err(e) => {
                    tracing::warn!(job = %lease.job, error = %e, "snooze failed; the lease will lapse and the job run again");
                }
            }
        }
        (Some(Interruption::Shutdown), Verdict::Fail { .. } | Verdict::Snooze(_)) => {}
        (Some(Interruption::LeaseExpired), _) => give_back(shared, &flight),
        (Some(Interruption::TimedOut), _) if !flight.state.ended_in_store() => {
            // The pool's timer saw the deadline first and ended the attempt in the store.
            tracing::info!(job = %lease.job, attempt = %lease.attempt, "result withheld: the attempt ran into its time limit");
        }
        (Some(why), _) => {
            // LeaseLost, Cancelled, Stalled, a time-out the store ended: the store would
            // refuse it anyway.
            bump(&shared.counters.rejected_writes);
            tracing::info!(job = %lease.job, attempt = %lease.attempt, reason = %why, "result withheld: lease is gone");
        }
    }
    After::Finished
}

/// A job claimed ahead that was interrupted while it waited for a worker is not run: one
/// whose lease ran out, or that renewals falling behind took from the queue, is given back
/// (a refusal if another pool took it meanwhile); a shutdown has released it, the pool's
/// timer has ended one whose deadline passed, and a lost lease, a cancel or a stall the
/// store has ended already.
fn unstarted(shared: &Shared, flight: &Flight, why: Interruption) {
    let lease = &flight.lease;
    tracing::info!(job = %lease.job, attempt = %lease.attempt, reason = %why, "claimed ahead and interrupted before it started: not run");
    if why == Interruption::LeaseExpired {
        give_back(shared, flight);
    }
}

/// Commits a success. The completion is handed to the dispatcher, which commits it together
/// with the others that finished meanwhile and the claims that refill their workers, while
/// the worker goes on to a job claimed ahead (a lone worker too: see [`super::pace`]). The
/// application's writes go too, each under its own fence: writes that fail fail their own
/// completion alone (PostgreSQL rolls back to a savepoint; redb, which takes none once a
/// table is open, runs the round's operations again one by one). Any completion commits
/// here once the dispatcher has stopped (then claiming its worker's next job in the same
/// transaction while the pool may take more work).
fn commit_success(shared: &Shared, flight: Flight, output: Output<AnyWrites>) -> After {
    let Output { bytes, writes } = output;
    let mut handed = Handed {
        flight,
        output: bytes,
        writes,
    };
    if shared.running() {
        match shared.handover.hand_over(shared, handed) {
            None => return After::HandedOver,
            // The dispatcher has stopped: commit it here.
            Some(back) => handed = back,
        }
    }
    flush_log(&*shared.store, &handed.flight);
    let Handed {
        flight,
        output: bytes,
        writes,
    } = handed;
    let lease = &flight.lease;
    let progress = Some(flight.state.progress());
    let result = match writes {
        // (a panic in the writes is caught where they run, and fails the attempt as a
        // handler's panic does: `completed`)
        Some(writes) => shared.counters.commit_latency.time(|| {
            crate::holder::complete_with_writes(&*shared.store, lease, &bytes, progress, writes)
        }),
        None => match shared.claim_permit() {
            Some(_claiming) => {
                let commit = || {
                    let store = &*shared.store;
                    crate::holder::complete_then_claim(store, lease, &bytes, progress, shared.terms)
                };
                match shared.counters.commit_latency.time(commit) {
                    Ok(Some(next)) => {
                        shared.counters.succeeded_of(&lease.queue);
                        shared.ended(lease, Outcome::Succeeded, JobState::Succeeded);
                        return After::Next(shared.claimed(next));
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            None => {
                let complete = End::Complete(bytes);
                let commit =
                    || crate::holder::end(&*shared.store, lease, complete, progress).map(|_| ());
                shared.counters.commit_latency.time(commit)
            }
        },
    };
    completed(shared, &flight, result);
    After::Finished
}

/// Counts a completion's result; a rolled-back application write fails the attempt instead.
pub(crate) fn completed(shared: &Shared, flight: &Flight, result: crate::error::Result<()>) {
    let lease = &flight.lease;
    if result.is_err() {
        // (lines the round did not commit with it, given back: `dispatch::give_back_logs`)
        flush_log(&*shared.store, flight);
    }
    match result {
        Ok(()) => {
            shared.counters.succeeded_of(&lease.queue);
            shared.ended(lease, Outcome::Succeeded, JobState::Succeeded);
        }
        Err(e) if e.is_lease_lost() => fenced(shared, flight, &e),
        // The database aborted the transaction (deadlocks) more often than the store runs it
        // again: no fault of the job's, so it goes back to the queue with no budget spent.
        Err(e) if e.is_transient() => {
            tracing::warn!(job = %lease.job, error = %e, "completion aborted by the database; giving the job back");
            give_back(shared, flight);
        }
        Err(e) => match failure_of_rolled_back_completion(&e) {
            Some(f) => {
                // The application's writes panicked in the dispatcher's round: counted as a
                // handler's panic is.
                let panicked = matches!(&e, Error::Application(source)
                    if source.is::<crate::protocol::WritesPanicked>());
                let kind = if panicked {
                    FailKind::Panicked
                } else {
                    FailKind::Failed
                };
                commit_failure(shared, flight, f.message(), f.retry(), kind)
            }
            None => {
                tracing::error!(job = %lease.job, error = %e, "completion failed; the lease will lapse and the job run again");
            }
        },
    }
}

/// A completion that rolled back while its lease still holds fails the attempt, with this
/// failure: the application's writes failed (retried), or something was refused before
/// anything was written (an oversized output, a follow-up job with a bad queue name, a store
/// call from inside the writes), which running the job again would meet again (permanent,
/// where [`no_retry_mends`] says so). `None` for a failure of the store itself (and for a
/// lost lease, which the caller has handled): the lease lapses.
pub(crate) fn failure_of_rolled_back_completion(e: &Error) -> Option<JobError> {
    let failure = match e {
        Error::Application(_) => e.to_string(),
        e if e.is_refusal() && !e.is_lease_lost() => format!("completion refused: {e}"),
        _ => return None,
    };
    Some(match no_retry_mends(e) {
        true => JobError::permanent(failure),
        false => JobError::new(failure),
    })
}

fn commit_failure(shared: &Shared, flight: &Flight, message: &str, retry: Retry, kind: FailKind) {
    let lease = &flight.lease;
    let progress = Some(flight.state.progress());
    let commit = || {
        let fail = End::Fail(message.to_owned(), retry);
        crate::holder::end(&*shared.store, lease, fail, progress)
    };
    match shared.counters.commit_latency.time(commit) {
        Ok(state) => {
            bump(match kind {
                FailKind::Failed => &shared.counters.failed,
                FailKind::Panicked => &shared.counters.panicked,
                FailKind::Invalid => &shared.counters.invalid,
            });
            shared.ended(lease, rules::failure_outcome(message, retry), state);
        }
        Err(e) if e.is_lease_lost() => fenced(shared, flight, &e),
        Err(e) => tracing::error!(job = %lease.job, error = %e, "recording the failure failed"),
    }
}

fn fenced(shared: &Shared, flight: &Flight, e: &Error) {
    let lease = &flight.lease;
    bump(&shared.counters.rejected_writes);
    tracing::warn!(job = %lease.job, attempt = %lease.attempt, error = %e, "the fence refused a late result");
    // Refused with the attempt still running: it came at or after the attempt's deadline
    // (`rules::before_deadline`), so the attempt ran into its limit and ends here as timed
    // out, rather than when the reaper finds it.
    let running = Some((lease.attempt, JobState::Running));
    if e.lease_lost().is_some_and(|l| l.found == running) && time_out(shared, flight) {
        bump(&shared.counters.timed_out);
    }
}

/// The handler's log lines its pool's heartbeats have not carried yet, written before its
/// attempt ends (in a write of their own: an attempt's end takes many paths). A failure is
/// only said: the lines are evidence, and the end must not wait on them.
pub(crate) fn flush_log(store: &dyn crate::job_store::JobStore, flight: &Flight) {
    let Some(lines) = flight.state.take_log() else {
        return;
    };
    let by = flight.lease.holding();
    let written = crate::backend::write(store, move |r| crate::protocol::append_log(r, by, &lines));
    if let Err(e) = written {
        tracing::warn!(job = %by.job, error = %e, "writing the attempt's last log lines failed");
    }
}
