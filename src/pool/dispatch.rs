//! The dispatcher: claims a job whenever a worker is free; otherwise sleeps until work can
//! exist.

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, select};

use super::stats::bump;
use super::{Flight, Shared};

/// How long an idle dispatcher sleeps at most: commits by *other processes* do not wake it,
/// so it looks again at least this often.
fn idle_cap(shared: &Shared) -> Duration {
    shared.settings.heartbeat()
}

pub(crate) fn dispatch_loop(
    shared: &Shared,
    slots: &Receiver<()>,
    jobs: Sender<Flight>,
    stop: &Receiver<()>,
) {
    // Free workers the dispatcher knows of (each a token from the slots channel).
    let mut free = 0usize;
    loop {
        if free == 0 {
            // Wait for a free worker.
            select! {
                recv(slots) -> slot => if slot.is_err() { return },
                recv(stop) -> _ => return,
            }
            free = 1;
        }
        // Every other worker that is free too: one claim transaction serves them all.
        while slots.try_recv().is_ok() {
            free += 1;
        }
        // Find them work.
        loop {
            // Read the generation before looking, so work that arrives after the look wakes
            // the wait below instead of being slept through.
            let seen = shared.store.work_generation(&shared.queue);
            if !shared.running() {
                return;
            }
            if shared.paused() {
                if stop.recv_timeout(recheck(shared)).is_ok() {
                    return;
                }
                continue;
            }
            let now = shared.store.now();
            if !shared.renewals_healthy(now) {
                // Shed load: an overloaded pool that keeps claiming piles up false reclaims.
                bump(&shared.counters.intake_paused);
                tracing::warn!(queue = %shared.queue, "renewals are behind; not claiming");
                shared.shed_expired(now);
                let _ = shared
                    .store
                    .wait_for_work(&shared.queue, seen, recheck(shared));
                if !shared.running() {
                    return;
                }
                continue;
            }
            match shared
                .store
                .claim_batch(&shared.queue, &shared.worker_id, shared.terms, free)
            {
                Ok(leases) if !leases.is_empty() => {
                    for lease in leases {
                        bump(&shared.counters.claimed);
                        tracing::debug!(job = %lease.job, attempt = %lease.attempt, "claimed");
                        let flight = shared.register(lease);
                        if jobs.send(flight.clone()).is_err() {
                            shared.finish(flight.lease.job);
                            return;
                        }
                        free -= 1;
                    }
                    break;
                }
                Ok(_) => {
                    bump(&shared.counters.idle_waits);
                    let timeout = idle_timeout(shared, now);
                    shared.store.wait_for_work(&shared.queue, seen, timeout);
                }
                Err(e) => {
                    bump(&shared.counters.claim_errors);
                    tracing::warn!(queue = %shared.queue, error = %e, "claim failed");
                    if stop.recv_timeout(shared.settings.heartbeat()).is_ok() {
                        return;
                    }
                }
            }
        }
    }
}

/// How soon a paused or shedding dispatcher looks again: often enough to resume promptly once
/// renewals recover, rarely enough not to spin.
fn recheck(shared: &Shared) -> Duration {
    (shared.settings.heartbeat() / 4).min(Duration::from_millis(100))
}

/// Until the next delayed job or lease expiry of the queue comes due, capped.
fn idle_timeout(shared: &Shared, now: crate::StoreTime) -> Duration {
    let cap = idle_cap(shared);
    match shared.store.next_due(&shared.queue) {
        Ok(Some(due)) if due > now => due.saturating_since(now).min(cap),
        // Due already but not claimable (lost a race, or our own lease is about to be
        // renewed): look again soon, without spinning.
        Ok(Some(_)) => Duration::from_millis(1).min(cap),
        Ok(None) => cap,
        Err(e) => {
            tracing::warn!(error = %e, "reading the next due time failed");
            cap
        }
    }
}
