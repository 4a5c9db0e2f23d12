//! The heartbeat: renews every in-flight lease of the pool in one write per tick; and the
//! watch over it, which notices when it stops.

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::context::Interruption;
use super::stats::bump;
use super::{Flight, Shared};
use crate::clock::Stopwatch;
use crate::lease::{Lease, Renewal};

/// The pool's one timer: a renewal of every lease each heartbeat interval, and between two,
/// the moment an attempt runs into its time limit.
pub(crate) fn heartbeat_loop(shared: &Shared, stop: &Receiver<()>) {
    let mut since_beat = Stopwatch::start();
    loop {
        let beat_in = shared
            .settings
            .heartbeat()
            .saturating_sub(since_beat.elapsed());
        let wait = next_deadline(shared).map_or(beat_in, |d| d.min(beat_in));
        crossbeam_channel::select! {
            recv(stop) -> _ => return,
            // An attempt with a deadline started: the wait is measured again.
            recv(shared.deadline_added.1) -> _ => {}
            default(wait) => {}
        }
        if shared.abandoned() {
            return;
        }
        if !shared.paused() {
            time_out_due(shared);
        }
        if since_beat.elapsed() < shared.settings.heartbeat() {
            continue;
        }
        since_beat = Stopwatch::start();
        let _tick = shared.beating.lock();
        // A paused pool's timer still runs: its heartbeat is not late when it resumes.
        shared.ticking();
        if shared.paused() {
            continue;
        }
        beat(shared);
    }
}

/// How long until the nearest deadline of an attempt still running (store time from now,
/// taken as real time), if any has one.
fn next_deadline(shared: &Shared) -> Option<std::time::Duration> {
    let nearest = (shared.flights.lock().values())
        .filter(|f| f.state.interruption().is_none())
        .filter_map(|f| f.lease.deadline)
        .min()?;
    // (the clock only when some attempt has a deadline: on PostgreSQL an old reading of it
    // is a statement, and an idle pool's timer reads nothing)
    Some(nearest.saturating_since(shared.store.clock()))
}

/// Interrupts every attempt whose deadline has come and ends it in the store as timed out,
/// at once, whether or not its handler returns: a handler that never looks at its
/// interruption does not keep its job `Running` past the limit, and whatever it returns
/// later is refused by the fence. (Interrupted, it is left out of renewals.)
fn time_out_due(shared: &Shared) {
    if !(shared.flights.lock().values()).any(|f| f.lease.deadline.is_some()) {
        return;
    }
    let now = shared.store.clock();
    let due: Vec<Flight> = (shared.flights.lock().values())
        .filter(|f| f.lease.deadline.is_some_and(|d| d <= now))
        .filter(|f| (f.state).interrupt(Interruption::TimedOut, Some(&shared.counters.timed_out)))
        .cloned()
        .collect();
    for flight in &due {
        let lease = &flight.lease;
        tracing::warn!(job = %lease.job, attempt = %lease.attempt, "attempt ran into its time limit; interrupting and ending it");
        let _ = super::run::time_out(shared, flight);
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
        // Nothing to renew: the renewals are healthy. A pool with no attempt at all skips
        // the clock (on PostgreSQL an old reading of it is a statement, and an idle pool's
        // timer reads nothing): its next claim starts the health clock.
        if !shared.flights.lock().is_empty() {
            shared.renewed_at(shared.store.clock());
        }
        return;
    }
    let beats: Vec<(&Lease, u64)> = flights
        .iter()
        .map(|f| (&f.lease, f.state.progress()))
        .collect();
    // The renewals are dated from before they were made: a clock read after their commit
    // could be past the leases they renewed (a thread descheduled between the two), and the
    // pool would count itself healthy while its leases ran out.
    let began = shared.store.clock();
    // The handlers' log lines since the last beat ride with it.
    let logs: Vec<_> = (flights.iter())
        .filter_map(|f| Some((f.lease.holding(), f.state.take_log()?)))
        .collect();
    // (kept to give back if the renewal fails: nothing, on most beats)
    let kept = logs.clone();
    match crate::holder::renew(&*shared.store, &beats, logs) {
        Err(e) => {
            // (the lines wait for the next beat, before any written since)
            for (by, lines) in kept {
                if let Some(f) = flights.iter().find(|f| f.lease.holding() == by) {
                    f.state.give_back_log(lines);
                }
            }
            bump(&shared.counters.heartbeat_failures);
            tracing::warn!(queue = %shared.label, error = %e, leases = flights.len(), "renewal batch failed");
        }
        Ok(results) => {
            bump(&shared.counters.heartbeat_batches);
            shared.renewed_at(began);
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

fn apply(shared: &Shared, flight: &Flight, result: crate::error::Result<Renewal>) {
    let job = flight.lease.job;
    let (why, counter) = match result {
        Ok(Renewal::Renewed { expires_at }) => {
            flight.state.renewed(expires_at);
            return;
        }
        Ok(Renewal::Cancelled) => (Interruption::Cancelled, &shared.counters.cancelled),
        Ok(Renewal::Stalled) => (Interruption::Stalled, &shared.counters.stalled),
        Ok(Renewal::TimedOut) => {
            // The store ended the attempt itself: the worker has nothing left to write.
            if flight
                .state
                .interrupt_timed_out_in_store(Some(&shared.counters.timed_out))
            {
                tracing::warn!(job = %job, attempt = %flight.lease.attempt, "renewal found the attempt past its time limit; interrupting");
            }
            return;
        }
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

/// The watch over the heartbeat: nothing else notices a heartbeat that stopped, stuck in a
/// renewal that does not return (a database gone silent: a machine cut off; a redb writer
/// held by another process) or starved of its thread, since the dispatcher may be stuck in a
/// claim on the same store. If renewals are behind and the heartbeat is overdue, it sheds
/// the leases that ran out on the store clock (and the jobs claimed ahead), whose handlers
/// would otherwise go on with jobs other workers may now hold. It never writes to the store.
/// A heartbeat that still ticks judges its own renewals; a paused pool is frozen, as a
/// stopped process would be, and sheds nothing.
///
/// It sleeps until the heartbeat would first be overdue, and only once it is, looks again
/// every [`super::dispatch::recheck`]: a pool whose heartbeat ticks (an idle one's ticks
/// once an interval) wakes this thread about once a heartbeat interval, not ten times a
/// second, which on a device that waits for work on a battery is most of its wake-ups.
pub(crate) fn watch_loop(shared: &Shared, stop: &Receiver<()>) {
    loop {
        let wait = shared
            .until_heartbeat_overdue()
            .max(super::dispatch::recheck(shared));
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if shared.paused() || !shared.heartbeat_overdue() {
            continue;
        }
        let now = shared.store.clock();
        if !shared.renewals_healthy(now) {
            shared.shed_expired(now);
        }
    }
}
