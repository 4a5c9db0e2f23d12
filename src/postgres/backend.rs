//! A [`PgStore`] as a worker pool's and a reaper's store (see [`crate::backend`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::transaction::{Beside, PgRecords};
use super::{PgStore, fast, read};
use crate::backend::{LeaseBackend, ReaperLooks, RoundResults, Step};
use crate::error::{ConfigError, Result};
use crate::ids::StoreTime;
use crate::lease::Lease;
use crate::protocol;
use crate::protocol::{AnyWrites, Claim, Completion};

/// How long a reading of the database's clock serves before the next is taken.
const CLOCK_READING_SERVES: Duration = Duration::from_millis(500);

crate::engine::engine!(PgStore, super::store::SqlWrites);

/// What one transaction of a round does besides its completions.
enum Side<'a> {
    /// Nothing more: a round without a claim.
    Alone,
    /// The claim (queue, worker, terms, how many), beside completions in another
    /// transaction if given.
    Claim(Claim<'a>, Option<&'a std::sync::Arc<Beside>>),
    /// Only completions, beside a claim in another transaction: one written one by one
    /// locks its job's row with the fence, and a job given back since, which waits, is one
    /// the claim could take; locked, the claim would pass over it (`SKIP LOCKED`) instead
    /// of taking it, as if the completions had not come first. So before the first, this
    /// waits until the claim has taken what it takes. (The batch statement locks only the
    /// running rows it completes, which no claim takes.)
    BesideClaim(crossbeam_channel::Receiver<()>),
}

/// The refusal of writes made for another engine's store.
fn foreign_writes() -> crate::error::Error {
    ConfigError::WritesForAnotherStore {
        given: "writes of another engine's kind",
        store: "PostgreSQL, whose writes are Output::with_sql",
    }
    .into()
}

impl PgStore {
    /// Completes each of `done` as its own unit, then claims (queue, worker, terms, how
    /// many) if asked: a refusal by the fence answers its own completion (writing only its
    /// counter) and the others go on; a failure of the database fails them all.
    ///
    /// One transaction, or, for a round with at least
    /// [`side_by_side_from`](super::PgStoreBuilder::side_by_side_from) jobs in each half, two
    /// at once on two connections: each half of a big round is milliseconds of one
    /// backend's work, and two backends use two cores. The claim then decides as if the
    /// completions had committed first: it waits for them before deciding what they could
    /// change (see [`protocol::claim_batch`]).
    pub(super) fn complete_each_then_claim(
        &self,
        done: &mut [Completion],
        claim: Option<Claim<'_>>,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let from = self.settings().side_by_side_from;
        let Some(claim) = claim.filter(|c| done.len() >= from && c.wanted() >= from) else {
            return match claim {
                Some(claim) => self.complete_each_and_claim(done, Side::Claim(claim, None)),
                None => self.complete_each_and_claim(done, Side::Alone),
            };
        };
        // Both connections now, or the round in one transaction (see `permits.rs`).
        let Some((_here, there)) = self.inner.permits.reserve_pair() else {
            return self.complete_each_and_claim(done, Side::Claim(claim, None));
        };
        let jobs = done.iter().map(|c| super::rows::key(c.by.job)).collect();
        std::thread::scope(|scope| {
            // Dropped when the completions' transaction has ended (or its thread unwound):
            // the claim's `settle` then returns.
            let (committed, settled) = crossbeam_channel::bounded::<()>(0);
            // Dropped when the claim has taken what it takes without waiting (or is about to
            // wait, or has ended or unwound): the completions' one-by-one writes, which lock
            // rows the claim could take, then go on (see [`Beside`]).
            let (taking, taken) = crossbeam_channel::bounded::<()>(0);
            let completing = scope.spawn(move || {
                there.enter();
                let _committed = committed;
                self.complete_each_and_claim(done, Side::BesideClaim(taken))
            });
            let beside = std::sync::Arc::new(Beside {
                jobs,
                taking: parking_lot::Mutex::new(Some(taking)),
                committed: settled,
            });
            let (_, claimed) =
                self.complete_each_and_claim(&mut [], Side::Claim(claim, Some(&beside)));
            beside.has_taken();
            match completing.join() {
                Ok((completed, _)) => (completed, claimed),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// [`PgStore::complete_each_then_claim`] in one transaction: [`protocol::round`] of
    /// `done`, then the claim `side` asks for, if any.
    fn complete_each_and_claim(
        &self,
        done: &mut [Completion],
        side: Side<'_>,
    ) -> (Vec<Result<()>>, Result<Vec<Lease>>) {
        let (claim, beside, claim_beside) = match side {
            Side::Claim(claim, beside) => (Some(claim), beside, None),
            Side::Alone => (None, None, None),
            Side::BesideClaim(taken) => (None, None, Some(taken)),
        };
        let marks = match claim {
            Some(c) => self.marks_due(&mut c.queues()),
            None => Vec::new(),
        };
        let outcome = self.records(|r| {
            r.beside = beside.cloned();
            r.claim_beside = claim_beside.clone();
            let writes = &mut |r: &mut PgRecords<'_, '_, '_>,
                               by,
                               output: &[u8],
                               progress,
                               w: &mut AnyWrites| {
                let counted = (&mut r.events, &mut r.counts);
                self.complete_with_writes_in(r.tx, r.p, counted, (by, output, progress), w)
            };
            protocol::round(r, done, claim, &marks, writes)
        });
        match outcome {
            Ok((results, claimed)) => (results, Ok(claimed)),
            Err(e) => crate::backend::round_failed(done.len(), e),
        }
    }

    /// One completion of a round with the application's writes (its holding, output,
    /// progress), under a savepoint: the fence first (a refusal keeps only its counter),
    /// then the writes; if they fail, panic, or swallowed an SQL error, the savepoint is
    /// rolled back and this completion alone answers the failure, the round going on. A
    /// conflict the database aborts for (deadlock, serialization) fails the whole round,
    /// which runs again from the start, the writes with it.
    fn complete_with_writes_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        p: &mut super::Prepared<'_>,
        (events, counts): (&mut crate::events::Pending, &mut crate::stats::Counters),
        (by, output, progress): (crate::lease::Holding, &[u8], Option<u64>),
        writes: &mut AnyWrites,
    ) -> Result<()> {
        let Some(writes) = writes.as_mut::<super::store::SqlWrites>() else {
            return Err(foreign_writes());
        };
        let mut sp = tx
            .savepoint("leasehold_completion")
            .map_err(super::PgError::from)?;
        let s = self.settings();
        let mut inner = PgRecords::new(&mut sp, p, s);
        inner.events = events.alike();
        let end = protocol::complete(&mut inner, by, output, progress);
        let told = std::mem::take(&mut inner.events);
        // (what it counted is the enclosing transaction's once the savepoint is kept)
        let counted = inner.take_counts();
        if let Err(e) = end {
            if e.is_refusal() {
                sp.commit().map_err(super::PgError::from)?;
                counts.add(&counted);
            }
            return Err(e);
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (writes.0)(&mut super::store::PgTransaction::new(
                &mut sp, p.cache, self,
            ))
        }));
        let written = match ran {
            Ok(written) => {
                let written = written.map_err(super::store::application_error);
                super::store::applied(&mut sp, written)
            }
            Err(panic) => {
                let message = crate::error::panic_message(&*panic);
                let panicked = crate::protocol::WritesPanicked(message);
                Err(crate::error::Error::Application(Box::new(panicked)))
            }
        };
        match written {
            Ok(()) => {
                sp.commit().map_err(super::PgError::from)?;
                events.append(told);
                counts.add(&counted);
                Ok(())
            }
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                sp.rollback().map_err(super::PgError::from)?;
                Err(e)
            }
        }
    }

    /// Store time for a pool's threads: the database's clock as last read plus the local
    /// time since (read again every half second). While the database cannot be reached the
    /// estimate goes on from the last reading, so a pool can still tell that its leases have
    /// run out; a local clock that runs slow against the database's makes it tell late by
    /// the drift over the outage.
    ///
    /// One thread at a time reads the database, and without holding the others: a reading
    /// may wait long on an unreachable database, and meanwhile a pool's other threads (its
    /// heartbeat judging whether its leases have run out) go on with the estimate.
    fn estimated_now(&self) -> StoreTime {
        // A simulated clock (the conformance tests') is the time itself: it moves only when
        // the test moves it, so no local time may be added to it.
        if let Some(clock) = &self.inner.simulated_clock {
            return super::simulated_time(clock);
        }
        let clock = &self.inner.clock;
        let (estimate, age) = clock.now();
        if age < CLOCK_READING_SERVES || !clock.begin_reading() {
            return estimate;
        }
        let read = crate::job_store::ReadJobs::now(self);
        clock.done_reading();
        match read {
            Ok(now) => {
                clock.read(now);
                clock.now().0
            }
            Err(_) => estimate,
        }
    }

    /// Whether this handle's `LISTEN` thread is connected and listening now.
    fn listens(&self) -> bool {
        (self.inner.listener.get())
            .is_some_and(|l| l.as_ref().is_some_and(super::listen::Listener::listening))
    }

    /// Starts the `LISTEN` thread if it is not running: a pool is about to wait for work.
    pub(super) fn start_listening(&self) {
        self.inner.listener.get_or_init(|| {
            if !self.inner.settings.listen {
                return None;
            }
            let started = super::listen::Listener::start(
                self.inner.config.clone(),
                self.inner.names.channel.clone(),
                self.inner.notifier.clone(),
                self.inner.requests.0.clone(),
            );
            match started {
                Ok(listener) => Some(listener),
                Err(e) => {
                    tracing::warn!(error = %e, "no wake-up listener; idle pools poll");
                    None
                }
            }
        });
    }

    /// Wakes this process's waiters of `queues`.
    pub(crate) fn readied<'a>(&self, queues: impl IntoIterator<Item = &'a String>) {
        self.inner.notifier.notify(queues);
    }

    /// A transaction kept an ending and committed: wakes this process's followers (other
    /// processes' and machines' were told by the statements that kept it, if one follows:
    /// see `listen.rs`).
    pub(super) fn ended(&self) {
        self.inner.notifier.notify_endings();
    }

    /// Says that a follower of this handle waits for endings (`listen.rs`), and listens,
    /// to hear them: `true` if it said so anew (`Notifier::announce_due`).
    pub(super) fn announce_following(&self) -> bool {
        self.start_listening();
        let Some(anew) = self.inner.notifier.announce_due() else {
            return false;
        };
        let said = self.alone(|c, p| {
            let st = p.get(c, super::listen::FOLLOWING)?;
            c.execute(&st, &[])
                .map_err(|e| super::PgError::from(e).into())
        });
        if let Err(e) = said {
            tracing::debug!(error = %e, "saying a follower waits for endings failed");
        }
        anew
    }
}

impl LeaseBackend for PgStore {
    fn write_step(&self, mut step: Step) -> Result<Box<dyn std::any::Any + Send>> {
        self.records(|r| step(r))
    }

    fn policy(&self) -> &crate::protocol::Policy {
        &self.settings().policy
    }

    fn clock(&self) -> StoreTime {
        self.estimated_now()
    }

    fn notifier(&self) -> &crate::notify::Notifier {
        &self.inner.notifier
    }

    fn hub(&self) -> &crate::events::Hub {
        &self.inner.hub
    }

    fn rounds_wait_on_a_server(&self) -> bool {
        true
    }

    fn hears_schedule_changes(&self) -> bool {
        // (through the listener, started here if no pool started it)
        self.start_listening();
        self.listens()
    }

    fn schedules_changed(&self) {
        self.inner.notifier.notify_schedules();
        // Every machine's schedulers, through their listeners; a hint (a scheduler whose
        // listener is down looks every interval), so a failure here is only logged.
        let channel = &self.inner.names.channel;
        let sent = self.with_connection(|conn| {
            super::listen::look_again(&mut conn.client, channel).map_err(crate::error::Error::from)
        });
        if let Err(e) = sent {
            tracing::warn!(error = %e, "telling other machines' schedulers of a change failed");
        }
    }

    fn idle_poll(&self) -> Option<Duration> {
        // While the listener listens, every machine's enqueue wakes this process's pools
        // (and a listener that listens again wakes them all, for what it missed): they look
        // on their own only as seldom as on any engine, once a heartbeat, for what no
        // notification announces (room freed by another machine in a limited queue). While
        // it does not, or where `PgStoreBuilder::listen(false)` turned it off, every
        // 250–500 ms, jittered so that many pools do not look in step.
        if self.listens() {
            return None;
        }
        let jitter = crate::random::random_u64() % 250;
        Some(Duration::from_millis(250 + jitter))
    }

    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        if super::store::no_queue_has(queue) {
            return Ok(None);
        }
        // (the server's time comes with the answer: an idle pool reads the clock next)
        let (next, now) = self.alone(|c, p| read::next_due(c, p, queue))?;
        self.inner.clock.read(now);
        Ok(next)
    }

    fn marks_due(&self, queues: &mut dyn Iterator<Item = &str>) -> Vec<String> {
        self.inner.served.due(queues, self.estimated_now())
    }

    fn complete_all_then_claim(
        &self,
        mut done: Vec<Completion>,
        claim: Option<Claim<'_>>,
    ) -> RoundResults {
        self.complete_each_then_claim(&mut done, claim.filter(|c| c.wanted() > 0))
    }

    fn reaper_looks(&self) -> Result<ReaperLooks> {
        // (the server's time comes with the answer: the reading serves the pass's clock; the
        // tables' dead rows serve the pass's vacuum, at its end)
        let (looks, tables) = self.alone(read::reaper_looks)?;
        self.inner.clock.read(looks.now);
        *self.inner.dead_rows.lock() = Some(tables);
        Ok(looks)
    }

    fn note_reaper_pass(&self, pass: &crate::report::ReaperPass) -> Result<()> {
        // (one statement: atomic on its own, one round trip where a transaction takes three)
        self.alone(|c, p| fast::note_reaper_pass(c, p, pass))
    }

    /// A vacuum of the jobs' table, when its dead rows ask for one.
    fn after_reap(&self, report: &mut crate::report::ReapReport) -> Result<()> {
        // (where a reaper of this handle is woken for each request, and the listener that
        // wakes it listens, its passes need not look: a listener that listens anew wakes it
        // for what was sent meanwhile)
        let heard = self.inner.requests_heard.load(Ordering::Relaxed) && self.listens();
        if !heard {
            PgStore::apply_requests(self)?;
        }
        if report.changed_jobs() {
            // (the pass left dead rows of its own: the vacuum reads the counts anew)
            self.inner.dead_rows.lock().take();
        }
        report.vacuum_started = self.vacuum_if_needed()?;
        Ok(())
    }

    fn requests_heard(&self) -> Option<crossbeam_channel::Receiver<()>> {
        if !self.inner.settings.listen {
            return None;
        }
        self.start_listening();
        self.inner.requests_heard.store(true, Ordering::Relaxed);
        Some(self.inner.requests.1.clone())
    }

    fn apply_requests(&self) -> Result<usize> {
        // (the reaper asks when a request's NOTIFY woke it: one waits)
        self.apply_waiting_requests()
    }
}

/// A round's completions with the application's writes, against the server named by
/// `LEASEHOLD_PG_URL` (skipped without one; `.ci/run` sets it). A crate test, since the
/// round with writes is the pool's own call (the suites drive it through pools).
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{
        job_store::JobStore, job_store::ReadJobs, lease::LeaseTerms, new_job::NewJob, pool::Output,
        state::JobState,
    };

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// Writes a row naming `job` and the transaction they ran in (`txid_current()`), then
    /// answers `then`.
    fn effect(schema: &str, job: &str, then: Result<(), &'static str>) -> Completion {
        let sql = format!("INSERT INTO {schema}.effects (job, xid) VALUES ($1, txid_current())");
        let job = job.to_owned();
        let output = Output::with_sql(Vec::new(), move |t| -> Result<(), BoxError> {
            t.sql().execute(&sql, &[&job])?;
            then.map_err(Into::into)
        });
        Completion {
            by: crate::lease::Holding {
                job: crate::ids::JobId(0),
                attempt: crate::ids::Attempt(0),
                token: crate::ids::LeaseToken::NONE,
            },
            output: output.bytes,
            progress: None,
            writes: output.writes.map(|w| AnyWrites(Box::new(w))),
            log: None,
        }
    }

    /// A store in a schema of its own on the server named by `LEASEHOLD_PG_URL`, with an
    /// admin connection to look behind it; `None` (and a line saying so) without a server.
    fn scratch(test: &str) -> Option<(String, postgres::Client, PgStore)> {
        let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
            eprintln!("the PostgreSQL {test} test did not run: LEASEHOLD_PG_URL is not set");
            return None;
        };
        let schema = format!("lh_unit_{test}_{}", std::process::id());
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        let store = PgStore::builder(&url).schema(&schema).open().unwrap();
        Some((schema, admin, store))
    }

    fn of(lease: &Lease, c: Completion) -> Completion {
        Completion {
            by: lease.holding(),
            ..c
        }
    }

    #[test]
    fn a_rounds_writes_commit_together_each_under_its_own_fence_and_a_failure_undoes_its_own_alone()
    {
        let Some((schema, mut admin, store)) = scratch("round") else {
            return;
        };
        admin
            .batch_execute(&format!(
                "CREATE TABLE {schema}.effects (job text, xid bigint)"
            ))
            .unwrap();
        let ids = store
            .enqueue_batch((0..6).map(|i| NewJob::new("q", format!("{i}"))))
            .unwrap();
        let terms = LeaseTerms::new(Duration::from_secs(60));
        let leases = store.claim_batch("q", "w", terms, 5).unwrap();
        // The fourth is taken by another holder: its completion is stale.
        store.release(&leases[3]).unwrap();
        let other = store.claim_job(ids[3], "other", terms).unwrap().unwrap();
        let mut panicking = effect(&schema, "panicking", Ok(()));
        let boom = Output::with_sql(Vec::new(), |_| -> Result<(), BoxError> {
            panic!("writes exploded")
        });
        panicking.writes = boom.writes.map(|w| AnyWrites(Box::new(w)));
        let done = vec![
            of(&leases[0], effect(&schema, "a", Ok(()))),
            of(
                &leases[1],
                effect(&schema, "failing", Err("the application refused")),
            ),
            of(&leases[2], effect(&schema, "c", Ok(()))),
            of(&leases[3], effect(&schema, "stale", Ok(()))),
            of(&leases[4], panicking),
        ];
        let plan = [("q".to_owned(), 1)];
        let claim = Claim {
            plan: &plan,
            worker: "w",
            terms,
        };
        let (results, claimed) = store.complete_all_then_claim(done, Some(claim));
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        match &results[1] {
            Err(crate::error::Error::Application(e)) => {
                assert_eq!(e.to_string(), "the application refused")
            }
            other => panic!("{other:?}"),
        }
        assert!(results[3].as_ref().unwrap_err().is_lease_lost());
        match &results[4] {
            Err(crate::error::Error::Application(e)) => {
                assert_eq!(e.to_string(), "writes panicked: writes exploded");
            }
            other => panic!("{other:?}"),
        }
        // The round's claim took the one waiting job.
        assert_eq!(claimed.unwrap()[0].job, ids[5]);
        // Only the live, successful writes committed, and in one transaction.
        let rows = admin
            .query(
                &format!("SELECT job, xid FROM {schema}.effects ORDER BY job"),
                &[],
            )
            .unwrap();
        let jobs: Vec<String> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        assert_eq!(jobs, ["a", "c"]);
        assert_eq!(
            rows[0].try_get::<_, i64>(1).unwrap(),
            rows[1].try_get::<_, i64>(1).unwrap()
        );
        let state = |i: usize| store.job(ids[i]).unwrap().unwrap().state();
        assert_eq!(
            (state(0), state(2)),
            (JobState::Succeeded, JobState::Succeeded)
        );
        // The failing and the panicking ones still run under their leases (the pool then
        // fails their attempts); the stale one is the other holder's.
        assert_eq!((state(1), state(4)), (JobState::Running, JobState::Running));
        assert_eq!(store.job(ids[3]).unwrap().unwrap().attempt(), other.attempt);
        assert_eq!(store.stats().unwrap().counters.fenced_writes_rejected, 1);
        drop(store);
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }

    /// The slow path's completion (where the fence holds after the batch statement did not
    /// complete the job) keeps the attempt in the job's row, as the batch statement does.
    #[test]
    fn a_success_on_the_slow_path_is_kept_in_the_jobs_row_as_the_batchs_is() {
        let Some((schema, mut admin, store)) = scratch("slow") else {
            return;
        };
        let id = store.enqueue(NewJob::new("q", "x")).unwrap();
        let terms = LeaseTerms::new(Duration::from_secs(60));
        let lease = store.claim("q", "w", terms).unwrap().unwrap();
        store
            .records(|r| crate::protocol::complete(r, lease.holding(), b"out", Some(3)))
            .unwrap();
        let history = store.history(id).unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        let job = store.job(id).unwrap().unwrap();
        assert_eq!(
            (
                history[0].worker(),
                history[0].outcome(),
                history[0].progress(),
                history[0].ended_at()
            ),
            (
                "w",
                Some(&crate::job::Outcome::Succeeded),
                3,
                job.finished_at()
            )
        );
        let rows: i64 = admin
            .query_one(
                &format!("SELECT count(*) FROM {schema}.leasehold_runs"),
                &[],
            )
            .unwrap()
            .try_get(0)
            .unwrap();
        assert_eq!(rows, 0, "no history row: the attempt is in the job's row");
        assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"out"[..]));
        assert!(store.check().unwrap().is_clean());
        drop(store);
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }
}
