//! A worker: runs the handler for one job, catches its panic, validates its output, and
//! commits through the fence, or withholds the result when the lease is gone.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crossbeam_channel::{Receiver, Sender};

use super::context::{Interruption, JobContext, Output};
use super::stats::bump;
use super::{Flight, Shared};
use crate::error::Error;

pub(crate) fn worker_loop(shared: &Shared, jobs: &Receiver<Flight>, slots: &Sender<()>) {
    for flight in jobs.iter() {
        let job = flight.lease.job;
        run_one(shared, flight);
        shared.finish(job);
        let _ = slots.send(());
    }
    shared.worker_exited();
}

/// What the handler's run amounts to.
enum Verdict {
    Complete(Output),
    Fail { message: String, counter: FailKind },
}

#[derive(Copy, Clone)]
enum FailKind {
    Failed,
    Panicked,
    Invalid,
}

fn run_one(shared: &Shared, flight: Flight) {
    let ctx = JobContext::new(flight.lease.clone(), flight.state.clone());
    let verdict = match catch_unwind(AssertUnwindSafe(|| (shared.handler)(&ctx))) {
        Ok(Ok(output)) => match &shared.validator {
            Some(validate) => match validate(&ctx, &output.bytes) {
                Ok(()) => Verdict::Complete(output),
                Err(why) => Verdict::Fail {
                    message: format!("output refused by validator: {why}"),
                    counter: FailKind::Invalid,
                },
            },
            None => Verdict::Complete(output),
        },
        Ok(Err(e)) => Verdict::Fail {
            message: e.message().to_owned(),
            counter: FailKind::Failed,
        },
        Err(panic) => Verdict::Fail {
            message: format!("handler panicked: {}", panic_message(&*panic)),
            counter: FailKind::Panicked,
        },
    };
    let lease = &flight.lease;
    match (flight.state.interruption(), verdict) {
        (Some(Interruption::Abandoned), _) => {}
        // Shutting down: a finished result is still worth committing if the lease holds; a
        // failure is not recorded (the job was or will be released, no budget spent).
        (None | Some(Interruption::Shutdown), Verdict::Complete(output)) => {
            commit_success(shared, lease, output)
        }
        (None, Verdict::Fail { message, counter }) => {
            commit_failure(shared, lease, &message, counter)
        }
        (Some(Interruption::Shutdown), Verdict::Fail { .. }) => {}
        (Some(Interruption::LeaseExpired), _) => match shared.store.release(lease) {
            Ok(()) => bump(&shared.counters.released),
            Err(e) if e.is_lease_lost() => bump(&shared.counters.rejected_writes),
            Err(e) => tracing::warn!(job = %lease.job, error = %e, "release failed"),
        },
        (Some(why), _) => {
            // LeaseLost, Cancelled, Stalled: the store would refuse it anyway.
            bump(&shared.counters.rejected_writes);
            tracing::info!(job = %lease.job, attempt = %lease.attempt, reason = %why, "result withheld: lease is gone");
        }
    }
}

fn commit_success(shared: &Shared, lease: &crate::Lease, output: Output) {
    let result = match output.writes {
        Some(writes) => shared.store.complete_with(lease, &output.bytes, writes),
        None => shared.store.complete(lease, &output.bytes),
    };
    match result {
        Ok(()) => bump(&shared.counters.succeeded),
        Err(e) if e.is_lease_lost() => fenced(shared, lease, &e),
        Err(Error::Application(e)) => {
            // The completion rolled back with the application's writes; the lease holds.
            let message = format!("application write failed: {e}");
            commit_failure(shared, lease, &message, FailKind::Failed);
        }
        Err(e) => {
            tracing::error!(job = %lease.job, error = %e, "completion failed; the lease will lapse and the job run again");
        }
    }
}

fn commit_failure(shared: &Shared, lease: &crate::Lease, message: &str, kind: FailKind) {
    match shared.store.fail(lease, message) {
        Ok(_) => bump(match kind {
            FailKind::Failed => &shared.counters.failed,
            FailKind::Panicked => &shared.counters.panicked,
            FailKind::Invalid => &shared.counters.invalid,
        }),
        Err(e) if e.is_lease_lost() => fenced(shared, lease, &e),
        Err(e) => tracing::error!(job = %lease.job, error = %e, "recording the failure failed"),
    }
}

fn fenced(shared: &Shared, lease: &crate::Lease, e: &Error) {
    bump(&shared.counters.rejected_writes);
    tracing::warn!(job = %lease.job, attempt = %lease.attempt, error = %e, "the fence refused a late result");
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
