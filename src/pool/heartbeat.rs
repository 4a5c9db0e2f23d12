//! The heartbeat: renews every in-flight lease of the pool in one write per tick.

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::context::Interruption;
use super::stats::bump;
use super::{Flight, Shared};
use crate::lease::{Lease, Renewal};

pub(crate) fn heartbeat_loop(shared: &Shared, stop: &Receiver<()>) {
    loop {
        match stop.recv_timeout(shared.settings.heartbeat()) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if shared.abandoned() {
            return;
        }
        let _tick = shared.beating.lock();
        // A paused pool's timer still runs: its heartbeat is not late when it resumes.
        shared.ticking();
        if shared.paused() {
            continue;
        }
        beat(shared);
    }
}

/// One tick: a single `heartbeat_batch` for all live flights, then the health check.
pub(crate) fn beat(shared: &Shared) {
    let flights: Vec<Flight> = shared
        .flights
        .lock()
        .values()
        .filter(|f| f.state.interruption().is_none())
        .cloned()
        .collect();
    if flights.is_empty() {
        shared.renewed_at(shared.store.clock());
        return;
    }
    let beats: Vec<(&Lease, u64)> = flights
        .iter()
        .map(|f| (&f.lease, f.state.progress()))
        .collect();
    match shared.store.renew_batch(&beats) {
        Err(e) => {
            bump(&shared.counters.heartbeat_failures);
            tracing::warn!(queue = %shared.queue, error = %e, leases = flights.len(), "renewal batch failed");
        }
        Ok(results) => {
            bump(&shared.counters.heartbeat_batches);
            shared.renewed_at(shared.store.clock());
            for (flight, result) in flights.iter().zip(results) {
                apply(shared, flight, result);
            }
        }
    }
    let now = shared.store.clock();
    if !shared.renewals_healthy(now) {
        shared.shed_expired(now);
    }
}

fn apply(shared: &Shared, flight: &Flight, result: crate::Result<Renewal>) {
    let job = flight.lease.job;
    let (why, counter) = match result {
        Ok(Renewal::Renewed { expires_at }) => {
            flight.state.renewed(expires_at);
            return;
        }
        Ok(Renewal::Cancelled) => (Interruption::Cancelled, &shared.counters.cancelled),
        Ok(Renewal::Stalled) => (Interruption::Stalled, &shared.counters.stalled),
        // The tick took its list before this job's own completion (or failure) committed:
        // the job is done, not lost, and its worker is finishing it.
        Err(e) if e.lease_lost().is_some_and(|l| l.ended_by_holder) => return,
        Err(e) if e.is_lease_lost() => (Interruption::LeaseLost, &shared.counters.leases_lost),
        Err(e) => {
            tracing::warn!(job = %job, error = %e, "renewal failed");
            return;
        }
    };
    if flight.state.interrupt(why, Some(counter)) {
        tracing::warn!(job = %job, attempt = %flight.lease.attempt, reason = %why, "interrupting handler");
    }
}
