//! The seam between an engine and the calls written once over it: what an engine gives
//! ([`LeaseBackend`]: its write transactions as the protocol's records, a clock that never
//! fails, wake-ups, a pool's round, the hooks a pool calls), and the one way a call reaches
//! a write transaction ([`write`]). The calls themselves are `crate::holder`'s and
//! [`JobStore`]'s. Each engine keeps its own way where it has one (redb's group commit,
//! PostgreSQL's statements); the rules they apply are the protocol's, and the suites check
//! it.

use std::time::Duration;

use crate::error::Result;
use crate::ids::{Attempt, JobId, StoreTime};
use crate::lease::Lease;
use crate::protocol::{self, Records};
use crate::protocol::{Claim, Completion};

/// What a reaper's pass found to do when it began ([`LeaseBackend::reaper_looks`]), read
/// in one look where the engine can (one statement on PostgreSQL: each statement wakes an
/// idle process's reaper thread).
#[derive(Debug, Clone, Copy)]
pub struct ReaperLooks {
    /// The store's time of the look: the pass's start.
    pub(crate) now: StoreTime,
    /// Whether some lease may have expired by `now`, as the expiry index holds it (at or
    /// before the real expiry).
    pub(crate) leases_expired: bool,
    /// Whether a job may wait past its expiry at `now`.
    pub(crate) past_expiry: bool,
}

/// The answers of a round: one per completion, in order, then the claim's.
pub type RoundResults = (Vec<Result<()>>, Result<Vec<Lease>>);

/// The answers of a round that failed whole: `e` for each of its `n` completions and for
/// its claim.
pub(crate) fn round_failed(n: usize, e: crate::error::Error) -> RoundResults {
    let each = crate::error::shared_by_all(e);
    ((0..n).map(|_| Err(each())).collect(), Err(each()))
}

/// One step of the protocol in a write transaction of an engine (see [`write`]).
pub type Step = Box<dyn FnMut(&mut dyn Records) -> Result<Box<dyn std::any::Any + Send>> + Send>;

/// Runs `f` in one write transaction of `store`, over its records, and commits it if `f`
/// returns `Ok`: the one way the engine-agnostic calls reach an engine.
pub(crate) fn write<T: Send + 'static>(
    store: &(impl LeaseBackend + ?Sized),
    mut f: impl FnMut(&mut dyn Records) -> Result<T> + Send + 'static,
) -> Result<T> {
    let answer = store.write_step(Box::new(move |r| {
        f(r).map(|t| Box::new(t) as Box<dyn std::any::Any + Send>)
    }))?;
    answer
        .downcast::<T>()
        .map(|t| *t)
        .map_err(|_| crate::error::Error::Internal("a write step answered with another type"))
}

/// What an engine gives everything that runs on it, under the calls of [`JobStore`] (of
/// which this is the hidden part): its write transactions ([`LeaseBackend::write_step`]),
/// its plumbing (a clock that never fails, wake-ups, a round's commit, the application's
/// writes), and the hooks a pool calls as its attempts go (claimed, started, returned,
/// ended). The calls over it are written once, over the protocol, in [`JobStore`] and in
/// `crate::holder`; an engine takes its shortcuts as steps of its transaction
/// ([`Records`]).
pub trait LeaseBackend: Send + Sync + 'static {
    /// Runs `step` in one write transaction and commits it if it returns `Ok`; use
    /// [`write`].
    fn write_step(&self, step: Step) -> Result<Box<dyn std::any::Any + Send>>;
    /// The store's policy.
    fn policy(&self) -> &crate::protocol::Policy;
    /// Store time. Never fails: a backend that cannot read its clock now estimates it from
    /// its last reading (a pool must judge its leases while the store is unreachable).
    fn clock(&self) -> StoreTime;
    /// Who waits for work on this handle, and what wakes them.
    fn notifier(&self) -> &crate::notify::Notifier;
    /// The subscribers to this handle's events ([`crate::Event`]).
    fn hub(&self) -> &crate::events::Hub;
    /// A pool claimed `leases` to hand to its handlers: an engine that can tell, when its
    /// process dies, how far each lease got notes them (a redb file's log; see
    /// [`crate::Outcome::NeverStarted`]). A lease never noted counts as in its handler.
    fn claimed(&self, _leases: &[Lease]) {}
    /// A handler is about to start `lease`'s attempt: before this returns, a death must
    /// leave it known.
    fn started(&self, _lease: &Lease) {}
    /// The handler of `lease`'s attempt returned, and no code of the application's runs for
    /// it any more (none commits with its result).
    fn returned(&self, _lease: &Lease) {}
    /// `lease`'s attempt ended here, however it ended: its start need not be kept.
    fn ended(&self, _job: JobId, _attempt: Attempt) {}
    /// Wakes the waiters of one queue (a pool's dispatcher that has completions to commit).
    fn wake_queue(&self, queue: &str) {
        self.notifier().notify([&queue.to_owned()]);
    }
    /// How often an idle pool looks for work no wake-up announced (another machine's
    /// enqueue, say): `None` where every commit that readies work wakes the waiters.
    fn idle_poll(&self) -> Option<Duration> {
        None
    }
    /// Whether another process is writing the store now, so that a write begun now would
    /// queue behind its transaction (a redb file processes share): a pool's round then gives
    /// way ([`crate::pool`]'s `give_way`). `false` where writers do not take turns.
    fn another_process_writes(&self) -> bool {
        false
    }
    /// Whether a change of the schedules made anywhere (this process, another process of a
    /// shared file, another machine) wakes this handle's scheduler
    /// ([`LeaseBackend::schedules_changed`] there): a [`crate::Scheduler`] then sleeps until
    /// its next tick. An engine whose wake-ups need a listener starts it here. `false` where
    /// a change may go unheard, for now or for good.
    fn hears_schedule_changes(&self) -> bool {
        false
    }
    /// A schedule was declared, paused, resumed or removed through this handle: wakes its
    /// scheduler, and those of every other process or machine that can be told.
    fn schedules_changed(&self) {
        self.notifier().notify_schedules();
    }
    /// Whether a round's time is mostly spent waiting for a database server, so that a pool
    /// delivers one round's answers while the next runs (see [`crate::pool`]'s `dispatch`).
    /// `false` where a round's work is the pool's own process's: a thread delivering beside
    /// it only takes cores from it.
    fn rounds_wait_on_a_server(&self) -> bool {
        false
    }
    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>>;
    /// The queues of `queues` whose served mark is due now (see [`crate::queue`]).
    fn marks_due(&self, queues: &mut dyn Iterator<Item = &str>) -> Vec<String>;
    /// A pool's round ([`protocol::round`]): completes each of `done` as its own unit, then
    /// makes `claim` (queue, worker, terms, how many) if given, deciding as if the
    /// completions had committed first. The default runs it in one transaction, refusing
    /// the application's writes; redb queues each part into its group commit, PostgreSQL
    /// runs a big round's two halves at once.
    fn complete_all_then_claim(
        &self,
        mut done: Vec<Completion>,
        claim: Option<Claim<'_>>,
    ) -> RoundResults {
        let count = done.len();
        let marks = claim.map_or_else(Vec::new, |c| self.marks_due(&mut c.queues()));
        let claim = claim.map(|c| (c.plan.to_vec(), c.worker.to_owned(), c.terms));
        let round = write(self, move |r| {
            let claim = (claim.as_ref()).map(|(plan, worker, terms)| Claim {
                plan,
                worker,
                terms: *terms,
            });
            protocol::round(r, &mut done, claim, &marks, &mut protocol::no_writes)
        });
        match round {
            Ok((completed, claimed)) => (completed, Ok(claimed)),
            Err(e) => round_failed(count, e),
        }
    }
    /// Makes what was committed durable (redb's eventual durability); a no-op elsewhere.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// What a reaper's pass has to do now, as the store can tell for less than the pass
    /// costs ([`ReaperLooks`]): an idle store's reaper then reads where it would commit.
    /// The default says "maybe" to each.
    fn reaper_looks(&self) -> Result<ReaperLooks> {
        Ok(ReaperLooks {
            now: self.clock(),
            leases_expired: true,
            past_expiry: true,
        })
    }
    /// Keeps `pass` as the store's last reaper pass ([`crate::Stats::last_reaper_pass`]).
    fn note_reaper_pass(&self, pass: &crate::report::ReaperPass) -> Result<()>;
    /// What an engine does at the end of a reaper's pass besides (PostgreSQL: a vacuum,
    /// when dead rows ask for one).
    fn after_reap(&self, _report: &mut crate::report::ReapReport) -> Result<()> {
        Ok(())
    }
    /// Where a [`crate::Reaper`] is woken to apply what was asked of the store from outside
    /// the crate (PostgreSQL: the requests made in SQL, heard by the listener, started here);
    /// `None` where nothing is asked that way.
    fn requests_heard(&self) -> Option<crossbeam_channel::Receiver<()>> {
        None
    }
    /// Applies what was asked of the store from outside the crate (PostgreSQL: the requests
    /// made in SQL); how many. A reaper calls it when [`LeaseBackend::requests_heard`] woke
    /// it (so an engine may take it that something was asked); its passes look by
    /// themselves ([`LeaseBackend::after_reap`]).
    fn apply_requests(&self) -> Result<usize> {
        Ok(0)
    }
}
