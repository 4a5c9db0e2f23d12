//! A pool's round, written once for every engine: the completions its workers handed over,
//! each its own unit, their attempts' last log lines, then the claim of the workers' next
//! jobs, deciding as if the completions had committed first.
//!
//! Each completion answers for itself: a refusal (its fence, its output's size, writes of
//! another engine's kind) or the failure of the application's writes fails it alone, and
//! the round goes on; a failure of the store fails the round. The store in memory and
//! PostgreSQL run a round in one transaction; redb queues each completion as a unit of one
//! group commit, a round of its own, and the claim ([`super::round_claim`]) after them, so
//! that the group can run a unit again alone where its writes failed having written. What differs between engines is
//! given as steps: the completions whose fence holds in one statement
//! ([`Records::complete_fenced`]), the rows the others lock first ([`Records::lock_ends`]),
//! a claim committing beside ([`Records::ending_alone`]), and how an engine runs the
//! application's writes (the `writes` of [`round`]). The types a round carries are here
//! too: the completions, the claim, and the application's writes of any engine's kind.

use crate::error::{ConfigError, Error, Result};
use crate::job_log::LogRecord;
use crate::lease::{Holding, Lease, LeaseTerms};

use super::Records;

/// Writes of any engine's kind, for a pool on a [`Backend`](crate::Backend) chosen at run time: the engine
/// that commits them takes its own kind and refuses another
/// ([`ConfigError::WritesForAnotherStore`](crate::ConfigError)). Made by `into_any` on an
/// [`Output`](crate::Output) of an engine's kind.
pub struct AnyWrites(pub(crate) Box<dyn std::any::Any + Send>);

impl AnyWrites {
    /// The writes, if they are of kind `W`, borrowed (a transaction that runs again runs
    /// them again).
    pub(crate) fn as_mut<W: 'static>(&mut self) -> Option<&mut W> {
        if self.0.is::<W>() {
            return self.0.downcast_mut::<W>();
        }
        self.0.downcast_mut::<AnyWrites>().and_then(|w| w.as_mut())
    }
}

/// What the application's writes return: its own error, whatever it is.
pub(crate) type WritesResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The application's writes panicked while a round committed them: the attempt fails as
/// a handler's panic does (the engine rolled back what they wrote).
#[derive(Debug)]
pub(crate) struct WritesPanicked(pub String);

impl std::fmt::Display for WritesPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "writes panicked: {}", self.0)
    }
}

impl std::error::Error for WritesPanicked {}

/// A completion a pool hands over to be committed with others.
pub struct Completion {
    /// The attempt it ends, under the fence.
    pub by: Holding,
    pub output: Vec<u8>,
    /// The attempt's last progress.
    pub progress: Option<u64>,
    /// The application's writes, committed in the round under the completion's own fence
    /// (a failure of theirs fails this completion alone).
    pub writes: Option<AnyWrites>,
    /// The attempt's log lines its heartbeats have not carried, written once it has
    /// completed, in the same transaction.
    pub(crate) log: Option<LogRecord>,
}

/// A claim a round makes: of each queue up to its share of `plan`, what one cannot fill
/// taken by the others ([`round_claim`](super::round_claim)), for `worker` under `terms`. A
/// pool of one queue asks one share.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// Each queue with its share, in the order that fills what another could not.
    pub plan: &'a [(String, usize)],
    /// The claimer.
    pub worker: &'a str,
    /// The leases' terms.
    pub terms: LeaseTerms,
}

impl Claim<'_> {
    /// How many jobs it asks for in all.
    pub fn wanted(&self) -> usize {
        self.plan.iter().map(|(_, n)| n).sum()
    }

    /// Its queues.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &str> {
        self.plan.iter().map(|(q, _)| q.as_str())
    }
}

/// How an engine completes an attempt with the application's writes (holding, output,
/// progress, writes): the completion first, the writes only if its fence held, as one
/// unit; a failure of the writes undoes them and answers [`Error::Application`].
pub(crate) type WritesStep<'w, R> =
    dyn FnMut(&mut R, Holding, &[u8], Option<u64>, &mut AnyWrites) -> Result<()> + 'w;

/// The writes step of an engine with no tables of the application's: refused.
pub(crate) fn no_writes<R: ?Sized>(
    _: &mut R,
    _: Holding,
    _: &[u8],
    _: Option<u64>,
    _: &mut AnyWrites,
) -> Result<()> {
    Err(ConfigError::WritesForAnotherStore {
        given: "an application's writes",
        store: "a store with no tables of the application's",
    }
    .into())
}

/// Completes each of `done`, writes the log lines of those that completed, then makes
/// `claim` (marking `marks` served, the queues whose served mark is due): one answer per
/// completion, in order, and the claim's leases. `Err` where the store failed, which fails
/// the whole round.
///
/// The completions that can go together (no writes, output within the limit, a job named
/// once) go in one step where the engine has one ([`super::complete_many`]); the rest go one
/// by one in their order, their rows locked first, and so does each the step passed over,
/// whose fence says why.
pub(crate) fn round<R: Records + ?Sized>(
    r: &mut R,
    done: &mut [Completion],
    claim: Option<Claim<'_>>,
    marks: &[String],
    writes: &mut WritesStep<'_, R>,
) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
    // (a round of one, as redb's units are, goes by the steps: nothing to count or batch)
    let many = done.len() > 1;
    let mut times = std::collections::HashMap::new();
    for c in done.iter().filter(|_| many) {
        *times.entry(c.by.job).or_insert(0) += 1;
    }
    let max = r.policy().max_payload;
    let once = |c: &Completion| times.get(&c.by.job).is_none_or(|n| *n == 1);
    let together = |c: &Completion| c.writes.is_none() && c.output.len() <= max && once(c);
    let batch: Vec<_> = (done.iter().filter(|c| many && together(c)))
        .map(|c| (c.by, c.output.as_slice(), c.progress))
        .collect();
    if many && batch.len() < done.len() {
        r.lock_ends(&mut done.iter().map(|c| c.by.job))?;
    }
    let batched = batch.len() > 1;
    let mut completed = match batched {
        true => super::complete_many(r, &batch)?,
        false => Default::default(),
    };
    let mut answers = Vec::with_capacity(done.len());
    for c in done.iter_mut() {
        let answer = if completed.remove(&c.by) {
            Ok(())
        } else {
            r.ending_alone();
            let passed_over = batched && together(c);
            let (by, progress) = (c.by, c.progress);
            match &mut c.writes {
                // (in the step and not completed by it: the fence says why)
                None if passed_over => super::complete_by_steps(r, by, &c.output, progress),
                None => super::complete(r, by, &c.output, progress),
                Some(w) => writes(r, by, &c.output, progress, w),
            }
        };
        match answer {
            Err(e) if !answers_alone(&e) => return Err(e),
            answer => answers.push(answer),
        }
    }
    let logs: Vec<_> = (done.iter().zip(&answers))
        .filter(|(_, answer)| answer.is_ok())
        .filter_map(|(c, _)| c.log.as_ref().map(|log| (c.by, log)))
        .collect();
    super::append_logs(r, &logs)?;
    let claimed = match claim {
        Some(c) => super::round_claim(r, c.plan, c.worker, c.terms, marks)?,
        None => Vec::new(),
    };
    Ok((answers, claimed))
}

/// Whether a completion's error is its own to answer (a refusal, the application's writes
/// failing) rather than the store's, which fails the round.
fn answers_alone(e: &Error) -> bool {
    e.is_refusal() || matches!(e, Error::Application(_))
}
