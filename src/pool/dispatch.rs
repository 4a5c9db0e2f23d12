//! The dispatcher: claims a job whenever a worker is free; otherwise sleeps until work can
//! exist.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, select};

use super::give_way::{self, GiveWay};
use super::handover::Handed;
use super::queues::Planner;
use super::stats::bump;
use super::{Flight, Shared, run};
use crate::clock::Stopwatch;
use crate::protocol::{Claim, Completion};

/// How long an idle dispatcher sleeps at most: some changes wake no one (room freed in a
/// limited queue by another process, say), so it looks again at least this often: the
/// store's own poll where it has one, else a heartbeat less up to a tenth at random, so
/// that the pools of many processes do not look in step.
fn idle_cap(shared: &Shared) -> Duration {
    let beat = shared.settings.heartbeat();
    match shared.store.idle_poll() {
        Some(poll) => poll.min(beat),
        None => {
            let tenth = u64::try_from((beat / 10).as_micros()).unwrap_or(u64::MAX);
            let jitter = crate::random::random_u64() % tenth.saturating_add(1);
            beat.saturating_sub(Duration::from_micros(jitter))
        }
    }
}

pub(crate) fn dispatch_loop(
    shared: &Shared,
    slots: &Receiver<()>,
    jobs: Sender<Flight>,
    stop: &Receiver<()>,
) {
    if shared.store.rounds_wait_on_a_server() && shared.concurrency > 1 {
        // A round's answers (its completions acknowledged, its claims handed to workers)
        // are delivered by a thread of their own while the next round runs: handing
        // hundreds of claims to parked workers, each woken, would otherwise take part of
        // every round in which the server has nothing to do. A lone worker takes them
        // without waking, and there the thread would only cost a core.
        let closed = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let (to_deliver, deliveries) = crossbeam_channel::bounded::<Delivery>(1);
            let deliverer = std::thread::Builder::new()
                .name(format!("lh-{}-deliver", shared.label))
                .spawn_scoped(scope, || {
                    for d in deliveries {
                        if deliver(shared, d, &jobs).is_err() {
                            closed.store(true, Ordering::SeqCst);
                        }
                    }
                });
            let outlet = match deliverer {
                Ok(_) => Outlet::Thread(&to_deliver, &closed),
                Err(_) => Outlet::Inline(&jobs),
            };
            dispatch_until_stopped(shared, slots, &outlet, stop);
            // (the delivering thread ends once `to_deliver` is dropped here, and the scope
            // waits for it: everything claimed is handed over before the pool goes on)
        });
    } else {
        dispatch_until_stopped(shared, slots, &Outlet::Inline(&jobs), stop);
    }
    // From here on workers commit their own completions; commit what was handed over,
    // unless the pool was abandoned, which writes nothing more (as a killed process would not).
    let left = shared.handover.close();
    if !left.is_empty() && !shared.abandoned() {
        let _ = commit(shared, left, &[], &Outlet::Inline(&jobs));
    }
}

/// Where a round's answers go: to the delivering thread, or (if it could not be started)
/// delivered by the dispatcher itself.
enum Outlet<'a> {
    Thread(&'a Sender<Delivery>, &'a AtomicBool),
    Inline(&'a Sender<Flight>),
}

/// A committed round's answers.
struct Delivery {
    flights: Vec<Flight>,
    completed: Vec<crate::error::Result<()>>,
    leases: Vec<crate::lease::Lease>,
}

fn dispatch_until_stopped(
    shared: &Shared,
    slots: &Receiver<()>,
    jobs: &Outlet<'_>,
    stop: &Receiver<()>,
) {
    // Free workers the dispatcher knows of (each a token from the slots channel).
    let mut free = 0usize;
    // The last claim found the queue empty (and none has found work since): a claim is not
    // worth committing a completion for at once, which may then wait for company.
    let mut found_none = false;
    // Since when rounds have given way to another process writing the store.
    let mut way = GiveWay::default();
    // Claims that failed in a row, for the wait before the next (see `after_failed_claim`).
    let mut failed_claims = 0u32;
    // How each round's claim is shared among the pool's queues, and which are quiet.
    let mut planner = Planner::new(&shared.queues);
    loop {
        if free == 0 && !shared.handover.pending() {
            // Wait for a free worker.
            if !next_slot(slots, stop) {
                return;
            }
            free = 1;
        }
        // Every other worker that is free too: one claim transaction serves them all.
        while slots.try_recv().is_ok() {
            free += 1;
        }
        // Find them work, committing handed-over completions in the same transaction.
        loop {
            if let Outlet::Thread(_, closed) = jobs
                && closed.load(Ordering::SeqCst)
            {
                return;
            }
            // Read the generations before looking, so work that arrives after the look wakes
            // the wait below instead of being slept through.
            let seen: Vec<(&str, u64)> = (shared.queues.names())
                .map(|q| (q, shared.store.work_generation(q)))
                .collect();
            let generation =
                |queue: &str| (seen.iter().find(|(q, _)| *q == queue)).map_or(0, |(_, g)| *g);
            if !shared.running() {
                return;
            }
            let now = shared.store.clock();
            planner.wake(now, generation);
            let intake = intake(shared, now, free);
            let want = match intake {
                Intake::Claim(n) => n.min(shared.batch.max),
                _ => 0,
            };
            // Completions with no claim to ride on may wait for others to share their
            // commit (the batch delay); a free worker's claim never waits, unless the last
            // one found nothing: jobs finishing one by one on a drained queue then share
            // commits too, and new work waits at most the delay for its claim.
            let claim_due = want > 0 && !found_none;
            if !claim_due && let Some(wait) = shared.handover.may_wait(shared.batch) {
                if !wait_a_while(slots, stop, wait, &mut free) {
                    return;
                }
                continue;
            }
            // Another process writing the file: gather more for a round that begins once
            // it is done, rather than queue behind it with what there is now.
            if (want > 0 || shared.handover.pending())
                && way.now(|| shared.store.another_process_writes())
            {
                bump(&shared.counters.gave_way);
                if !wait_a_while(slots, stop, give_way::RECHECK, &mut free) {
                    return;
                }
                continue;
            }
            let done = shared.handover.take(shared.batch.max);
            if done.is_empty() && want == 0 {
                if free == 0 {
                    break;
                }
                match intake {
                    Intake::Paused => {
                        if stop.recv_timeout(recheck(shared)).is_ok() {
                            return;
                        }
                    }
                    Intake::Shedding => {
                        // Look again once renewals may have caught up.
                        shared.store.wait_for_any_work(&seen, recheck(shared));
                    }
                    Intake::Claim(_) => {
                        // Every worker is busy and enough is claimed ahead: wait for one to
                        // finish (a finished worker's hand-over comes with its slot).
                        if !next_slot(slots, stop) {
                            return;
                        }
                        free += 1;
                    }
                }
                continue;
            }
            let plan = match want {
                0 => Vec::new(),
                n => planner.plan(n),
            };
            if want > 0 && plan.is_empty() && done.is_empty() {
                // Every queue is quiet: wait for one to have work (or for its next job or
                // lease expiry to fall due).
                found_none = true;
                bump(&shared.counters.idle_waits);
                let timeout = idle_timeout(shared, now, planner.next_wake());
                shared.handover.set_idle(true);
                if !shared.handover.pending() {
                    shared
                        .store
                        .wait_for_any_work(&planner.waits(&seen), timeout);
                }
                shared.handover.set_idle(false);
                // Some changes wake no one (a slot freed in another process, time moved on
                // a clock of a test's): once the wait has run out with no wake-up, each
                // queue's next due time is read first (one statement on PostgreSQL, where a
                // claim takes a transaction) and a queue with nothing due stays quiet. Any
                // other end of the wait asks every queue again.
                let woken = (planner.waits(&seen).iter())
                    .any(|(queue, seen)| shared.store.work_generation(queue) != *seen);
                let quiet = !woken
                    && !shared.handover.pending()
                    && planner.stay_quiet(|queue| still_quiet(shared, queue));
                if !quiet {
                    planner.rouse();
                }
                continue;
            }
            let want = if plan.is_empty() { 0 } else { want };
            let watch = Stopwatch::start();
            let wrote = !done.is_empty();
            let result = commit(shared, done, &plan, jobs);
            if wrote || matches!(&result, Ok(Some(got)) if !got.is_empty()) {
                shared.pace.committed(watch.elapsed());
            }
            if let Ok(Some(got)) = &result {
                let of = |queue: &str| got.iter().filter(|q| *q == queue).count();
                let until = |queue: &str| quiet_until(shared, queue);
                planner.claimed(&plan, of, want, generation, until);
            }
            if !matches!(result, Err(ClaimFailed)) {
                failed_claims = 0;
            }
            match result.map(|got| got.map(|g| g.len())) {
                Ok(Some(claimed)) if claimed > 0 => {
                    found_none = false;
                    free -= claimed;
                    break;
                }
                // Nothing anywhere: every queue asked is quiet now, and the next look waits.
                Ok(Some(_)) => found_none = true,
                // Completions only: the round is done. (A claim the pool may not make now,
                // paused or shedding, is the next look's to see.)
                Ok(None) if want == 0 => break,
                Ok(None) => found_none = true,
                Err(Closed) => return,
                Err(ClaimFailed) => {
                    failed_claims = failed_claims.saturating_add(1);
                    if stop
                        .recv_timeout(after_failed_claim(shared, failed_claims))
                        .is_ok()
                    {
                        return;
                    }
                }
            }
        }
    }
}

/// How long the dispatcher waits before it claims again after `failures` claims in a row
/// failed: 10 ms doubled at each, with jitter, at most a heartbeat. A deadlock, a lock wait
/// past the statement timeout or a lost connection is over soon; waiting a whole heartbeat
/// (20 s at the default lease) after each kept a pool of a contended queue idle for tens of
/// seconds while its work waited. The jitter keeps pools that failed together from
/// meeting again.
fn after_failed_claim(shared: &Shared, failures: u32) -> Duration {
    let base =
        Duration::from_millis(10).saturating_mul(1 << failures.clamp(1, 12).saturating_sub(1));
    let base = base.min(shared.settings.heartbeat());
    let jitter = crate::random::random_u64() % (u64::try_from(base.as_micros()).unwrap_or(1) + 1);
    (base / 2).saturating_add(Duration::from_micros(jitter / 2))
}

/// Waits for a worker to free its slot: `false` if the pool is stopping (or its workers are
/// gone) instead.
fn next_slot(slots: &Receiver<()>, stop: &Receiver<()>) -> bool {
    select! {
        recv(slots) -> slot => slot.is_ok(),
        recv(stop) -> _ => false,
    }
}

/// Waits up to `wait`, or until a worker frees its slot (counted in `free`): `false` if the
/// pool is stopping (or its workers are gone) instead.
fn wait_a_while(
    slots: &Receiver<()>,
    stop: &Receiver<()>,
    wait: Duration,
    free: &mut usize,
) -> bool {
    select! {
        recv(slots) -> slot => match slot {
            Ok(()) => {
                *free += 1;
                true
            }
            Err(_) => false,
        },
        recv(stop) -> _ => false,
        default(wait) => true,
    }
}

/// Whether the dispatcher takes work now.
enum Intake {
    /// The pool is paused.
    Paused,
    /// Renewals are behind: claiming more would pile up false reclaims.
    Shedding,
    /// Claim this many (possibly 0: the free slots are held back, see [`super::pace`]).
    Claim(usize),
}

fn intake(shared: &Shared, now: crate::ids::StoreTime, free: usize) -> Intake {
    if shared.paused() {
        return Intake::Paused;
    }
    if !shared.renewals_healthy(now) {
        bump(&shared.counters.intake_paused);
        tracing::warn!(queue = %shared.label, "renewals are behind; not claiming");
        shared.shed_expired(now);
        return Intake::Shedding;
    }
    // The slots of jobs not to be claimed ahead just now are held back. This never starves a
    // worker: holding back leaves at least `concurrency` jobs held.
    let held_back = shared.pace.most_ahead() - shared.pace.ahead();
    Intake::Claim(free.saturating_sub(held_back))
}

/// Why a commit round stops the dispatcher's loop.
enum Stop {
    /// The workers are gone.
    Closed,
    /// The claim failed; look again later.
    ClaimFailed,
}
use Stop::{ClaimFailed, Closed};

/// Commits handed-over completions and claims as `plan` says in one group commit, then
/// hands the claimed jobs to workers. Returns the queue of each job claimed, or `None` if
/// it made no claim (none planned, or the pool may not claim now).
fn commit(
    shared: &Shared,
    done: Vec<Handed>,
    plan: &[(String, usize)],
    jobs: &Outlet<'_>,
) -> Result<Option<Vec<String>>, Stop> {
    let (flights, items): (Vec<Flight>, Vec<_>) = done
        .into_iter()
        .map(|h| {
            let lease = &h.flight.lease;
            let item = Completion {
                by: lease.holding(),
                output: h.output,
                progress: Some(h.flight.state.progress()),
                writes: h.writes,
                // (given back to the attempt if its completion fails: `give_back_logs`)
                log: h.flight.state.take_log(),
            };
            (h.flight, item)
        })
        .unzip();
    let logs: Vec<_> = items.iter().map(|c| c.log.clone()).collect();
    // Claims only with the permit, held to the end of the transaction (a pause waits it
    // out); the completions commit either way.
    let claiming = match plan.is_empty() {
        true => None,
        false => shared.claim_permit(),
    };
    let round = || {
        let claim = claiming.as_ref().map(|_| Claim {
            plan,
            worker: &shared.worker_id,
            terms: shared.terms,
        });
        shared.store.complete_all_then_claim(items, claim)
    };
    // A round that only claims is not a commit that ends attempts: not timed.
    let (completed, claimed) = match flights.is_empty() {
        true => round(),
        false => shared.counters.commit_latency.time(round),
    };
    let asked = claiming.is_some();
    drop(claiming);
    give_back_logs(&flights, logs, &completed);
    if !flights.is_empty() {
        bump(&shared.counters.completion_commits);
    }
    let (leases, answer) = match claimed {
        Ok(leases) => {
            shared.store.claimed(&leases);
            let queues = leases.iter().map(|l| l.queue.clone()).collect();
            (leases, Ok(asked.then_some(queues)))
        }
        Err(e) => {
            bump(&shared.counters.claim_errors);
            tracing::warn!(queue = %shared.label, error = %e, "claim failed");
            (Vec::new(), Err(ClaimFailed))
        }
    };
    let d = Delivery {
        flights,
        completed,
        leases,
    };
    match jobs {
        Outlet::Thread(to, _) => to.send(d).map_err(|_| Closed)?,
        Outlet::Inline(jobs) => deliver(shared, d, jobs)?,
    }
    answer
}

/// The log lines of each completion the round did not commit, back with their attempt:
/// the paths that end it otherwise write them ([`run::completed`]).
fn give_back_logs(
    flights: &[Flight],
    logs: Vec<Option<crate::job_log::LogRecord>>,
    completed: &[crate::error::Result<()>],
) {
    for ((flight, log), result) in flights.iter().zip(logs).zip(completed) {
        if let (Some(log), Err(_)) = (log, result) {
            flight.state.give_back_log(log);
        }
    }
}

/// Acknowledges a round's completions and hands its claims to the workers.
fn deliver(shared: &Shared, d: Delivery, jobs: &Sender<Flight>) -> Result<(), Stop> {
    let Delivery {
        flights,
        completed,
        leases,
    } = d;
    for (flight, result) in flights.iter().zip(completed) {
        run::completed(shared, flight, result);
        shared.finish((flight.lease.job, flight.lease.attempt));
    }
    for lease in leases {
        let flight = shared.claimed(lease);
        shared.queued.fetch_add(1, Ordering::Relaxed);
        if jobs.send(flight.clone()).is_err() {
            shared.queued.fetch_sub(1, Ordering::Relaxed);
            shared.finish((flight.lease.job, flight.lease.attempt));
            return Err(Closed);
        }
    }
    Ok(())
}

/// How soon a paused or shedding dispatcher (and the heartbeat's watch) looks again: often
/// enough to resume promptly once renewals recover, rarely enough not to spin.
pub(crate) fn recheck(shared: &Shared) -> Duration {
    (shared.settings.heartbeat() / 4).min(Duration::from_millis(100))
}

/// How long an idle dispatcher waits: until the first quiet queue's wait ends (`wake`).
fn idle_timeout(
    shared: &Shared,
    now: crate::ids::StoreTime,
    wake: Option<crate::ids::StoreTime>,
) -> Duration {
    let cap = idle_cap(shared);
    wake.map_or(cap, |at| at.saturating_since(now).min(cap))
}

/// The store's time, and how long `queue`, with nothing to claim then, may stay quiet:
/// until its next due time (capped by [`idle_cap`]) while that is still to come; `None` if
/// something is due already. The one reading of it for both ends of a quiet spell below.
/// The time is read after the due time: on PostgreSQL the due time's statement reads the
/// server's clock too, so an idle pool's look is that one statement.
fn quiet_for(
    shared: &Shared,
    queue: &str,
) -> crate::error::Result<(crate::ids::StoreTime, Option<Duration>)> {
    let cap = idle_cap(shared);
    let due = shared.store.next_due(queue)?;
    let now = shared.store.clock();
    Ok((
        now,
        match due {
            Some(due) if due > now => Some(due.saturating_since(now).min(cap)),
            Some(_) => None,
            None => Some(cap),
        },
    ))
}

/// Until when `queue`, quiet, stays so without a claim to ask it; `None` if something is
/// due, or its reading failed (the round then asks it).
fn still_quiet(shared: &Shared, queue: &str) -> Option<crate::ids::StoreTime> {
    let (now, wait) = quiet_for(shared, queue).ok()?;
    Some(now.saturating_add(wait?))
}

/// Until when a queue a claim found short is quiet: its next delayed job or lease expiry,
/// capped.
fn quiet_until(shared: &Shared, queue: &str) -> crate::ids::StoreTime {
    match quiet_for(shared, queue) {
        Ok((now, Some(wait))) => now.saturating_add(wait),
        // Due already but not claimable (lost a race, or our own lease is about to be
        // renewed): look again soon, without spinning.
        Ok((now, None)) => now.saturating_add(Duration::from_millis(1).min(idle_cap(shared))),
        Err(e) => {
            tracing::warn!(error = %e, "reading the next due time failed");
            shared.store.clock().saturating_add(idle_cap(shared))
        }
    }
}
