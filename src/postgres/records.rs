//! The protocol's records in SQL ([`Records`] over one PostgreSQL transaction): a job is a
//! row, locked for the rest of the transaction when it is loaded for writing (a search
//! passes over rows another transaction holds, `SKIP LOCKED`); an ended attempt is a row of
//! `leasehold_runs` (a success's is kept in the job's own row, as the batch completion of
//! `fast.rs` keeps it); queues, limit keys and schedules are `named.rs`'s. Nothing here
//! decides what becomes of a job.

use std::time::Duration;

use postgres::types::ToSql;

use super::listen::tell_followers;
use super::rows::{
    Col, clamp, flow_column, id, job_by, job_columns, key, metadata_column, micros,
    outcome_columns, unique_for_us, us,
};
use super::schema::key_held;
use super::transaction::{PgRecords, notify, now};
use super::{PgError, fast};
use crate::checkpoint::CheckpointRecord;
use crate::codec;
use crate::endings::{EndCursor, EndOf, EndRecord};
use crate::error::Result;
use crate::ids::{Attempt, GroupId, JobId, StoreTime};
use crate::job::{JobRecord, Outcome, RunRecord};
use crate::job_log::LogRecord;
use crate::lease::{Holding, LeaseTerms};
use crate::new_job::NewJob;
use crate::protocol::{
    ClaimLook, Completed, Inserted, NamedRecords, Policy, Position, Records, Taken,
};
use crate::queue::QueueLimits;
use crate::rules::{self, claim_order_sql, key_order_sql};
use crate::stats::Counters;
use crate::workflow::{GroupRecord, Target};

const JOB_LOCKED: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {s}.leasehold_jobs WHERE id = $1 FOR UPDATE"
);

const JOBS_LOCKED: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {s}.leasehold_jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE"
);

/// A new job's row, every column the record gives; a unique key another transaction's job
/// took meanwhile makes no row.
const INSERT: &str = concat!(
    "
INSERT INTO {s}.leasehold_jobs
    (queue, state, priority, max_attempts, unique_key, created_at, run_at, progress_at,
     updated_at, payload, time_limit_us, unique_for_us, metadata, flow, awaited, grp,
     last_error, finished_at, retry, limit_key, parked, expires_at)
VALUES ($1, $2, $3, $4, $5, {s}.at($6), {s}.at($7), {s}.at($6), {s}.at($6), $8, $9, $10, $11,
        $12, $13, $14, $15, {s}.at($16), $17, $18, $19, {s}.at($20))
ON CONFLICT (queue, unique_key) WHERE ",
    key_held!(),
    "
    DO NOTHING
RETURNING id"
);

/// The job the unique index names for a key (it may keep it only by its window).
pub(crate) const KEY_HOLDER: &str = concat!(
    "SELECT id FROM {s}.leasehold_jobs WHERE queue = $1 AND unique_key = $2 AND ",
    key_held!()
);

/// The columns a rule may change, set from a record (the rest are a job's for life).
const SAVE: &str = "
UPDATE {s}.leasehold_jobs
SET state = $2, attempt = $3, failures = $4, run_at = {s}.at($5), lease_owner = $6,
    lease_claimed_at = {s}.at($7), lease_expires_at = {s}.at($8),
    lease_indexed_expiry = {s}.at($9), lease_length_us = $10, stall_timeout_us = $11,
    progress = $12, progress_at = {s}.at($13), cancel_requested = $14, last_error = $15,
    finished_at = {s}.at($16), updated_at = {s}.at($17), lease_deadline = {s}.at($18),
    key_released = $19, flow = $20, awaited = $21,
    parked = $22, lease_token = $23, expires_at = {s}.at($24)
WHERE id = $1";

/// Whether `new` gives its queue a waiting job `old` did not: its idle workers are to be
/// woken.
/// Keeps `endings` in the transaction that wrote them, in one statement (their `xid` the
/// transaction's own: see `since_12`).
pub(super) fn note_endings(r: &mut PgRecords<'_, '_, '_>, endings: &[EndRecord]) -> Result<()> {
    if endings.is_empty() {
        return Ok(());
    }
    r.p.ended = true;
    // (and the followers told, if one follows: `listen.rs`)
    let st = r.get(concat!(
        "WITH ",
        tell_followers!(),
        "
         INSERT INTO {s}.leasehold_endings (job, grp, queue, state, at)
         SELECT e.job, e.grp, e.queue, e.state, {s}.at(e.at)
         FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::bigint[])
             WITH ORDINALITY AS e(job, grp, queue, state, at, n)
         WHERE (SELECT count(*) FROM told) >= 0
         ORDER BY e.n"
    ))?;
    let (mut jobs, mut groups, mut queues) = (Vec::new(), Vec::new(), Vec::new());
    for e in endings {
        let (job, group, queue) = match &e.of {
            EndOf::Job { id, queue } => (Some(key(*id)), None, Some(queue.as_str())),
            EndOf::Group(g) => (None, Some(clamp(g.0)), None),
        };
        jobs.push(job);
        groups.push(group);
        queues.push(queue);
    }
    let states: Vec<&str> = endings.iter().map(|e| e.state.name()).collect();
    let at: Vec<i64> = endings.iter().map(|e| us(e.at)).collect();
    r.tx.execute(&st, &[&jobs, &groups, &queues, &states, &at])?;
    Ok(())
}

fn readied_by(old: &JobRecord, new: &JobRecord) -> bool {
    rules::readies(Some(old), new)
}

/// [`SAVE`] for many rows in one statement.
const SAVE_MANY: &str = "
UPDATE {s}.leasehold_jobs j
SET state = r.state, attempt = r.attempt, failures = r.failures, run_at = {s}.at(r.run_at),
    lease_owner = r.owner, lease_claimed_at = {s}.at(r.claimed),
    lease_expires_at = {s}.at(r.expires), lease_indexed_expiry = {s}.at(r.indexed),
    lease_length_us = r.length, stall_timeout_us = r.stall, progress = r.progress,
    progress_at = {s}.at(r.progress_at), cancel_requested = r.cancel, last_error = r.error,
    finished_at = {s}.at(r.finished), updated_at = {s}.at(r.updated),
    lease_deadline = {s}.at(r.deadline), key_released = r.released, flow = r.flow,
    awaited = r.awaited, parked = r.parked, lease_token = r.token,
    expires_at = {s}.at(r.expiry)
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[],
            $12::bigint[], $13::bigint[], $14::boolean[], $15::text[], $16::bigint[],
            $17::bigint[], $18::bigint[], $19::boolean[], $20::bytea[], $21::boolean[],
            $22::boolean[], $23::bigint[], $24::bigint[])
    AS r(id, state, attempt, failures, run_at, owner, claimed, expires, indexed, length, stall,
         progress, progress_at, cancel, error, finished, updated, deadline, released, flow,
         awaited, parked, token, expiry)
WHERE j.id = r.id";

/// The most urgent due waiting job of the queue.
const FIRST_READY: &str = concat!(
    "
SELECT id, priority FROM {s}.leasehold_jobs
WHERE queue = $1 AND state IN ('queued', 'retry_wait') AND NOT parked AND run_at <= {s}.at($2)
ORDER BY ",
    claim_order_sql!(),
    "
LIMIT 1
FOR UPDATE SKIP LOCKED"
);

/// The earliest indexed expiry of the queue up to a bound.
const FIRST_EXPIRED: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE queue = $1 AND state = 'running' AND lease_indexed_expiry <= {s}.at($2)
ORDER BY lease_indexed_expiry, id
LIMIT 1
FOR UPDATE SKIP LOCKED";

/// Waiting jobs past their expiry, first to expire first (`leasehold_jobs_expiring`).
const PAST_EXPIRY: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE expires_at <= {s}.at($1) AND expires_at IS NOT NULL
    AND state IN ('queued', 'retry_wait', 'blocked')
ORDER BY expires_at, id
LIMIT $2
FOR UPDATE SKIP LOCKED";

const EXPIRED_ANY: &str = "
SELECT id FROM {s}.leasehold_jobs
WHERE state = 'running' AND lease_indexed_expiry <= {s}.at($1)
ORDER BY lease_indexed_expiry
LIMIT $2
FOR UPDATE SKIP LOCKED";

impl Records for PgRecords<'_, '_, '_> {
    // The shortcuts of `fast.rs`, each the protocol's function in fewer statements.

    fn insert_plain(&mut self, jobs: &[NewJob]) -> Result<Option<Vec<JobId>>> {
        match self.shortcuts() {
            true => fast::insert_plain(self, jobs).map(Some),
            false => Ok(None),
        }
    }

    fn claim_look(&mut self, queue: &str) -> Result<ClaimLook> {
        match self.shortcuts() {
            true => fast::claim_look(self, queue),
            false => Ok(ClaimLook::maybe(self.queue(queue, false)?)),
        }
    }

    /// [`fast::CLAIM`] where no job with a limit key waits, else [`fast::KEYED_CLAIM`].
    ///
    /// Beside completions of the same round committing in another transaction
    /// ([`PgRecords::beside`]; the protocol has waited for them before deciding anything
    /// they could change), the claim decides as if they had committed first. Taking waiting
    /// jobs does not depend on them, with one exception: a job being completed that waits
    /// in the queue (given back or taken back since), whose completion is to be refused.
    /// Asking first which of them wait would put a lookup per completion on the claim's
    /// critical path; so the claim takes what it would anyway, under a savepoint, and only
    /// if it took one of them rolls back, waits, and claims again. Short, it waits for them
    /// too: they may have readied jobs of this queue (the waiters they release), and a new
    /// statement sees what committed before it began. A claim that fills its batch, as a
    /// busy pool's does, never waits.
    fn take_waiting(
        &mut self,
        queue: &str,
        worker: &str,
        terms: LeaseTerms,
        n: usize,
        limits: &QueueLimits,
        keyed: bool,
    ) -> Result<Option<Taken>> {
        if !self.shortcuts() {
            return Ok(None);
        }
        if keyed {
            return fast::claim_keyed(self, queue, worker, terms, n, limits.per_key);
        }
        let claim = |r: &mut Self| fast::claim_waiting(r.tx, r.p, queue, worker, terms, n);
        let Some(beside) = self.beside.clone().filter(|b| !b.jobs.is_empty()) else {
            return claim(self).map(|(taken, _)| Some(taken));
        };
        self.tx.batch_execute("SAVEPOINT leasehold_claim")?;
        let (mut taken, touched) = claim(self)?;
        if touched.iter().any(|job| beside.jobs.contains(job)) {
            // It took (or found exhausted) a job whose completion beside it is to be
            // refused: as if that completion came first, it is refused before the job is
            // taken again. Rolling back releases the row, which that completion may be
            // waiting to lock.
            self.tx
                .batch_execute("ROLLBACK TO SAVEPOINT leasehold_claim")?;
            self.completions_committed();
            taken = claim(self)?.0;
        } else if !taken.more {
            // (with more to take, the next step takes it before the completions go on)
            beside.has_taken();
            if taken.leases.len() < n {
                self.completions_committed();
                taken.more = true;
            }
        }
        Ok(Some(taken))
    }

    fn completions_committed(&mut self) {
        if let Some(beside) = self.beside.take() {
            beside.settle();
        }
    }

    fn lock_ends(&mut self, jobs: &mut dyn Iterator<Item = JobId>) -> Result<()> {
        fast::lock_running(self, jobs)
    }

    fn ending_alone(&mut self) {
        if let Some(claim) = self.claim_beside.take() {
            // (disconnected once the claim has taken what it takes, or ended)
            let _ = claim.recv();
        }
    }

    fn complete_fenced(
        &mut self,
        done: &[(Holding, &[u8], Option<u64>)],
    ) -> Result<Vec<Completed>> {
        fast::complete_fenced(self, done)
    }

    fn renew_fenced(
        &mut self,
        leases: &[(Holding, u64)],
    ) -> Result<std::collections::HashMap<Holding, StoreTime>> {
        fast::renew_fenced(self, leases)
    }

    fn mark_served(&mut self, queues: &[String]) -> Result<()> {
        fast::mark_served(self, queues)
    }

    fn policy(&self) -> &Policy {
        &self.settings.policy
    }

    /// The database's clock at this statement (a transaction may wait for a row lock: a time
    /// read before it would be stale).
    fn now(&mut self) -> Result<StoreTime> {
        match self.now {
            Some(now) => Ok(now),
            None => Ok(*self.now.insert(now(self.tx, self.p)?)),
        }
    }

    fn job(&mut self, job: JobId) -> Result<Option<JobRecord>> {
        let st = self.get(JOB_LOCKED)?;
        self.waited();
        job_by(self.tx, &st, job)
    }

    /// One statement, the rows locked in id order (as every batch here locks them).
    fn jobs(&mut self, ids: &[JobId]) -> Result<Vec<JobRecord>> {
        if ids.len() < 2 {
            return ids
                .iter()
                .filter_map(|&id| self.job(id).transpose())
                .collect();
        }
        let st = self.get(JOBS_LOCKED)?;
        self.waited();
        let mut keys: Vec<i64> = ids.iter().map(|&id| key(id)).collect();
        keys.sort_unstable();
        (self.tx.query(&st, &[&keys])?.iter())
            .map(super::rows::record)
            .collect()
    }

    fn insert(&mut self, job: JobRecord, payload: &[u8]) -> Result<Inserted> {
        let st = self.get(INSERT)?;
        self.waited();
        let max_attempts = i64::from(job.max_attempts);
        let time_limit = job.time_limit.map(micros);
        let unique_for = unique_for_us(job.uniqueness);
        let metadata = metadata_column(&job.metadata);
        let flow = flow_column(&job.flow);
        let group = job.flow.group.map(|g| clamp(g.0));
        let retry = job.retry.as_ref().map(codec::encode);
        let limit_key = job.limit.as_ref().map(|l| l.key.as_str());
        let parked = job.limit.as_ref().is_some_and(|l| l.parked);
        let params: [&(dyn ToSql + Sync); 20] = [
            &job.queue,
            &job.state.name(),
            &job.priority,
            &max_attempts,
            &job.unique_key,
            &us(job.created_at),
            &us(job.run_at),
            &payload,
            &time_limit,
            &unique_for,
            &metadata,
            &flow,
            &job.flow.awaited,
            &group,
            &job.last_error,
            &job.finished_at.map(us),
            &retry,
            &limit_key,
            &parked,
            &job.expires_at.map(us),
        ];
        if let Some(row) = self.tx.query_opt(&st, &params)? {
            let made = id(row.col(0)?);
            if rules::readies(None, &job) {
                self.readied(&job.queue)?;
            }
            let deps: Vec<i64> = (job.flow.needs.iter())
                .filter_map(|n| match n.on {
                    Target::Job(dep) => Some(key(dep)),
                    Target::Group(_) => None,
                })
                .collect();
            if !deps.is_empty() {
                let st = self.get(
                    "INSERT INTO {s}.leasehold_waits (job, waiter)
                     SELECT unnest($1::bigint[]), $2 ON CONFLICT DO NOTHING",
                )?;
                self.tx.execute(&st, &[&deps, &key(made)])?;
            }
            let stored = JobRecord { id: made, ..job };
            let ending = rules::job_ending(None, &stored);
            note_endings(self, ending.as_slice())?;
            return Ok(Inserted::Made(made));
        }
        // Another transaction's job took the key meanwhile: that one is the answer.
        let holder = self.get(KEY_HOLDER)?;
        match self.tx.query_opt(&holder, &[&job.queue, &job.unique_key])? {
            Some(row) => Ok(Inserted::KeyTaken(id(row.col(0)?))),
            None => Err(PgError::Database {
                code: None,
                message: "a unique key conflicted with a job that then could not be found".into(),
                transient: true,
            }
            .into()),
        }
    }

    fn save(&mut self, old: &JobRecord, job: &JobRecord) -> Result<()> {
        let st = self.get(SAVE)?;
        let lease = job.lease.as_ref();
        let token = super::rows::token_column(job.token);
        let params: [&(dyn ToSql + Sync); 24] = [
            &key(job.id),
            &job.state.name(),
            &i64::from(job.attempt.0),
            &i64::from(job.failures),
            &us(job.run_at),
            &lease.map(|l| l.owner.as_str()),
            &lease.map(|l| us(l.claimed_at)),
            &lease.map(|l| us(l.expires_at)),
            &lease.map(|l| us(l.indexed_expiry)),
            &lease.map(|l| micros(l.length)),
            &lease.and_then(|l| l.stall_timeout).map(micros),
            &clamp(job.progress),
            &us(job.progress_at),
            &job.cancel_requested,
            &job.last_error,
            &job.finished_at.map(us),
            &us(job.updated_at),
            &lease.and_then(|l| l.deadline).map(us),
            &job.key_released,
            &flow_column(&job.flow),
            &job.flow.awaited,
            &job.limit.as_ref().is_some_and(|l| l.parked),
            &token,
            &job.expires_at.map(us),
        ];
        self.tx.execute(&st, &params)?;
        if readied_by(old, job) {
            self.readied(&job.queue)?;
        }
        note_endings(self, rules::job_ending(Some(old), job).as_slice())
    }

    /// One statement ([`SAVE_MANY`]) for two or more.
    fn save_all(&mut self, changes: &[(JobRecord, JobRecord)]) -> Result<()> {
        if changes.len() < 2 {
            return changes
                .iter()
                .try_for_each(|(old, new)| self.save(old, new));
        }
        let jobs: Vec<&JobRecord> = changes.iter().map(|(_, new)| new).collect();
        let lease = |j: &&JobRecord| j.lease.clone();
        let leases: Vec<_> = jobs.iter().map(lease).collect();
        let col = |f: fn(&crate::job::LeaseRecord) -> Option<i64>| -> Vec<Option<i64>> {
            leases.iter().map(|l| l.as_ref().and_then(f)).collect()
        };
        let ids: Vec<i64> = jobs.iter().map(|j| key(j.id)).collect();
        let states: Vec<&str> = jobs.iter().map(|j| j.state.name()).collect();
        let attempts: Vec<i64> = jobs.iter().map(|j| i64::from(j.attempt.0)).collect();
        let failures: Vec<i64> = jobs.iter().map(|j| i64::from(j.failures)).collect();
        let run_at: Vec<i64> = jobs.iter().map(|j| us(j.run_at)).collect();
        let owners: Vec<Option<&str>> = (jobs.iter())
            .map(|j| j.lease.as_ref().map(|l| l.owner.as_str()))
            .collect();
        let claimed = col(|l| Some(us(l.claimed_at)));
        let expires = col(|l| Some(us(l.expires_at)));
        let indexed = col(|l| Some(us(l.indexed_expiry)));
        let length = col(|l| Some(micros(l.length)));
        let stall = col(|l| l.stall_timeout.map(micros));
        let deadline = col(|l| l.deadline.map(us));
        let progress: Vec<i64> = jobs.iter().map(|j| clamp(j.progress)).collect();
        let progress_at: Vec<i64> = jobs.iter().map(|j| us(j.progress_at)).collect();
        let cancel: Vec<bool> = jobs.iter().map(|j| j.cancel_requested).collect();
        let errors: Vec<Option<&str>> = jobs.iter().map(|j| j.last_error.as_deref()).collect();
        let finished: Vec<Option<i64>> = jobs.iter().map(|j| j.finished_at.map(us)).collect();
        let updated: Vec<i64> = jobs.iter().map(|j| us(j.updated_at)).collect();
        let released: Vec<bool> = jobs.iter().map(|j| j.key_released).collect();
        let flows: Vec<Option<Vec<u8>>> = jobs.iter().map(|j| flow_column(&j.flow)).collect();
        let awaited: Vec<bool> = jobs.iter().map(|j| j.flow.awaited).collect();
        let parked: Vec<bool> = (jobs.iter())
            .map(|j| j.limit.as_ref().is_some_and(|l| l.parked))
            .collect();
        let tokens: Vec<i64> = (jobs.iter())
            .map(|j| super::rows::token_column(j.token))
            .collect();
        let expiries: Vec<Option<i64>> = jobs.iter().map(|j| j.expires_at.map(us)).collect();
        let st = self.get(SAVE_MANY)?;
        let params: [&(dyn ToSql + Sync); 24] = [
            &ids,
            &states,
            &attempts,
            &failures,
            &run_at,
            &owners,
            &claimed,
            &expires,
            &indexed,
            &length,
            &stall,
            &progress,
            &progress_at,
            &cancel,
            &errors,
            &finished,
            &updated,
            &deadline,
            &released,
            &flows,
            &awaited,
            &parked,
            &tokens,
            &expiries,
        ];
        self.tx.execute(&st, &params)?;
        for (old, new) in changes {
            if readied_by(old, new) {
                self.readied(&new.queue)?;
            }
        }
        let endings: Vec<EndRecord> = (changes.iter())
            .filter_map(|(old, new)| rules::job_ending(Some(old), new))
            .collect();
        note_endings(self, &endings)
    }

    /// The columns a rule never writes (priority, metadata, the payload), then the save.
    fn edit(&mut self, old: &JobRecord, new: &JobRecord, payload: Option<&[u8]>) -> Result<()> {
        let st = self.get(
            "UPDATE {s}.leasehold_jobs SET priority = $2, metadata = $3,
                 payload = coalesce($4, payload)
             WHERE id = $1",
        )?;
        let metadata = metadata_column(&new.metadata);
        (self.tx).execute(&st, &[&key(new.id), &new.priority, &metadata, &payload])?;
        // (the save wakes the queue for a new priority or due time: `readied_by`)
        self.save(old, new)
    }

    fn renew(&mut self, renewed: &JobRecord) -> Result<()> {
        self.save(renewed, renewed)
    }

    fn payload(&mut self, job: JobId) -> Result<Vec<u8>> {
        let st = self.get("SELECT payload FROM {s}.leasehold_jobs WHERE id = $1")?;
        self.tx.query_one(&st, &[&key(job)])?.col(0)
    }

    fn keep_output(&mut self, job: JobId, output: &[u8]) -> Result<()> {
        let st = self.get("UPDATE {s}.leasehold_jobs SET output = $2 WHERE id = $1")?;
        self.tx.execute(&st, &[&key(job), &output])?;
        Ok(())
    }

    /// A success is kept in the job's row, as the batch completion keeps it: it ended when
    /// the job finished, with the job's progress. Any other end is a row of its own.
    fn record_run(&mut self, old: &JobRecord, run: &RunRecord) -> Result<()> {
        let Some(outcome) = &run.outcome else {
            return Err(rules::corrupt_running(old));
        };
        if *outcome == Outcome::Succeeded {
            let keep = self.get(
                "UPDATE {s}.leasehold_jobs SET last_worker = $2, last_claimed_at = {s}.at($3)
                 WHERE id = $1",
            )?;
            self.tx
                .execute(&keep, &[&key(old.id), &run.worker, &us(run.claimed_at)])?;
            return Ok(());
        }
        let (kind, error, path, overdue) = outcome_columns(outcome);
        let (limit, snoozed_for) = match outcome {
            Outcome::TimedOut { limit } => (Some(micros(*limit)), None),
            Outcome::Snoozed { delay } => (None, Some(micros(*delay))),
            _ => (None, None),
        };
        let insert = self.get(
            "INSERT INTO {s}.leasehold_runs
                 (job, attempt, worker, claimed_at, ended_at, outcome, error, reclaim_path,
                  overdue_us, progress, time_limit_us, snoozed_for_us)
             VALUES ($1, $2, $3, {s}.at($4), {s}.at($5), $6, $7, $8, $9, $10, $11, $12)",
        )?;
        let ended_at = run.ended_at.unwrap_or(run.claimed_at);
        self.tx.execute(
            &insert,
            &[
                &key(old.id),
                &i64::from(run.attempt.0),
                &run.worker,
                &us(run.claimed_at),
                &us(ended_at),
                &kind,
                &error,
                &path,
                &overdue,
                &clamp(run.progress),
                &limit,
                &snoozed_for,
            ],
        )?;
        Ok(())
    }

    /// How the attempt ended, by its kind alone (what the fence asks needs no more).
    fn run_outcome(&mut self, job: JobId, at: Attempt) -> Result<Option<Outcome>> {
        let st =
            self.get("SELECT outcome FROM {s}.leasehold_runs WHERE job = $1 AND attempt = $2")?;
        let Some(row) = self.tx.query_opt(&st, &[&key(job), &i64::from(at.0)])? else {
            return Ok(None);
        };
        Ok(match row.col::<&str>(0)? {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed(String::new())),
            "failed_permanently" => Some(Outcome::FailedPermanently(String::new())),
            "released" => Some(Outcome::Released),
            "snoozed" => Some(Outcome::Snoozed {
                delay: Duration::ZERO,
            }),
            _ => None,
        })
    }

    fn count(&mut self, c: &Counters) -> Result<()> {
        // Written just before the commit (`PgRecords::write_counts`).
        self.counts.add(c);
        Ok(())
    }

    /// A `NOTIFY` once per queue and transaction, delivered when it commits.
    fn readied(&mut self, queue: &str) -> Result<()> {
        if self.notified.insert(queue.to_owned()) {
            notify(self.tx, self.p, queue)?;
        }
        Ok(())
    }

    fn events(&mut self) -> &mut crate::events::Pending {
        &mut self.events
    }

    fn key_holder(&mut self, queue: &str, key: &str) -> Result<Option<JobRecord>> {
        let st = self.get(KEY_HOLDER)?;
        match self.tx.query_opt(&st, &[&queue, &key])? {
            Some(row) => self.job(id(row.col(0)?)),
            None => Ok(None),
        }
    }

    fn next_ready(&mut self, queue: &str, now: StoreTime) -> Result<Option<(i32, JobId)>> {
        let st = self.get(FIRST_READY)?;
        match self.tx.query_opt(&st, &[&queue, &us(now)])? {
            Some(r) => Ok(Some((r.col(1)?, id(r.col(0)?)))),
            None => Ok(None),
        }
    }

    fn first_indexed_expiry(&mut self, queue: &str, bound: StoreTime) -> Result<Option<JobId>> {
        let st = self.get(FIRST_EXPIRED)?;
        match self.tx.query_opt(&st, &[&queue, &us(bound)])? {
            Some(r) => Ok(Some(id(r.col(0)?))),
            None => Ok(None),
        }
    }

    fn indexed_expiries(&mut self, bound: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        self.ids_by(EXPIRED_ANY, bound, limit)
    }

    fn past_expiry(&mut self, now: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        self.ids_by(PAST_EXPIRY, now, limit)
    }

    fn has_jobs(&mut self, queue: &str) -> Result<bool> {
        let st = self.get("SELECT EXISTS (SELECT 1 FROM {s}.leasehold_jobs WHERE queue = $1)")?;
        self.tx.query_one(&st, &[&queue])?.col(0)
    }

    fn running(&mut self, queue: &str) -> Result<u64> {
        let st = self.get(
            "SELECT count(*) FROM {s}.leasehold_jobs WHERE queue = $1 AND state = 'running'",
        )?;
        Ok(u64::try_from(self.tx.query_one(&st, &[&queue])?.col::<i64>(0)?).unwrap_or(0))
    }

    fn finished(&mut self, from: Position, until: StoreTime, n: usize) -> Result<Vec<JobRecord>> {
        let st = self.get(concat!(
            "SELECT ",
            job_columns!(),
            " FROM {s}.leasehold_jobs
             WHERE finished_at IS NOT NULL AND (finished_at, id) >= ({s}.at($1), $2)
                 AND finished_at <= {s}.at($3)
             ORDER BY finished_at, id
             LIMIT $4
             FOR UPDATE SKIP LOCKED"
        ))?;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.tx
            .query(&st, &[&us(from.0), &key(from.1), &us(until), &n])?
            .iter()
            .map(super::rows::record)
            .collect()
    }

    /// Also forgets which jobs it waited for and which waited for it.
    fn delete(&mut self, job: &JobRecord) -> Result<()> {
        let st = self.get("DELETE FROM {s}.leasehold_runs WHERE job = $1")?;
        self.tx.execute(&st, &[&key(job.id)])?;
        let st = self.get("DELETE FROM {s}.leasehold_jobs WHERE id = $1")?;
        self.tx.execute(&st, &[&key(job.id)])?;
        let st = self.get("DELETE FROM {s}.leasehold_checkpoints WHERE job = $1")?;
        self.tx.execute(&st, &[&key(job.id)])?;
        let st = self.get("DELETE FROM {s}.leasehold_logs WHERE job = $1")?;
        self.tx.execute(&st, &[&key(job.id)])?;
        if job.flow.awaited || !job.flow.needs.is_empty() {
            let deps: Vec<i64> = (job.flow.needs.iter())
                .filter_map(|n| match n.on {
                    Target::Job(dep) => Some(key(dep)),
                    Target::Group(_) => None,
                })
                .collect();
            let st = self.get(
                "DELETE FROM {s}.leasehold_waits
                 WHERE job = $1 OR (job = ANY($2) AND waiter = $1)",
            )?;
            self.tx.execute(&st, &[&key(job.id), &deps])?;
        }
        Ok(())
    }

    fn waiters(&mut self, jobs: &[JobId]) -> Result<Vec<(JobId, JobId)>> {
        let st = self.get(
            "SELECT job, waiter FROM {s}.leasehold_waits WHERE job = ANY($1) ORDER BY job, waiter",
        )?;
        let jobs: Vec<i64> = jobs.iter().map(|&j| key(j)).collect();
        (self.tx.query(&st, &[&jobs])?.iter())
            .map(|row| Ok((id(row.col(0)?), id(row.col(1)?))))
            .collect()
    }

    fn members(&mut self, group: GroupId) -> Result<Vec<JobId>> {
        let st = self.get("SELECT id FROM {s}.leasehold_jobs WHERE grp = $1 ORDER BY id")?;
        (self.tx.query(&st, &[&clamp(group.0)])?.iter())
            .map(|row| Ok(id(row.col(0)?)))
            .collect()
    }

    fn group(&mut self, group: GroupId) -> Result<Option<GroupRecord>> {
        let st = self.get("SELECT record FROM {s}.leasehold_groups WHERE id = $1 FOR UPDATE")?;
        self.waited();
        let found = self.tx.query_opt(&st, &[&clamp(group.0)])?;
        let bytes = found.as_ref().map(|row| row.col::<&[u8]>(0)).transpose()?;
        codec::decode_stored(bytes, || format!("the record of group {group}"))
    }

    fn insert_group(&mut self, group: GroupRecord) -> Result<GroupId> {
        let st = self.get("INSERT INTO {s}.leasehold_groups (record) VALUES ('') RETURNING id")?;
        let made = GroupId(u64::try_from(self.tx.query_one(&st, &[])?.col::<i64>(0)?).unwrap_or(0));
        self.save_group(&GroupRecord { id: made, ..group })?;
        Ok(made)
    }

    fn ended_groups(
        &mut self,
        from: (StoreTime, GroupId),
        until: StoreTime,
        n: usize,
    ) -> Result<Vec<GroupRecord>> {
        let st = self.get(
            "SELECT id, record FROM {s}.leasehold_groups
             WHERE (ended_at, id) >= ({s}.at($1), $2) AND ended_at <= {s}.at($3)
             ORDER BY ended_at, id
             LIMIT $4
             FOR UPDATE SKIP LOCKED",
        )?;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 4] = [&us(from.0), &clamp(from.1.0), &us(until), &n];
        let rows = self.tx.query(&st, &params)?;
        let mut ended = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.col(0)?;
            let bytes = Some(row.col::<&[u8]>(1)?);
            ended.extend(codec::decode_stored(bytes, || {
                format!("the record of group {id}")
            })?);
        }
        Ok(ended)
    }

    fn trim_endings(&mut self, cutoff: StoreTime, n: usize) -> Result<usize> {
        let st = self.get(
            "WITH doomed AS (
                 SELECT xid, seq FROM {s}.leasehold_endings WHERE at <= {s}.at($1)
                 ORDER BY xid, seq LIMIT $2 FOR UPDATE SKIP LOCKED
             ),
             gone AS (
                 DELETE FROM {s}.leasehold_endings e USING doomed d
                 WHERE e.xid = d.xid AND e.seq = d.seq
                 RETURNING e.xid, {s}.ending_last(e.seq, e.n) AS seq
             )
             SELECT count(*) OVER (), xid::text::bigint, seq FROM gone
             ORDER BY xid DESC, seq DESC LIMIT 1",
        )?;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let Some(row) = self.tx.query_opt(&st, &[&us(cutoff), &n])? else {
            return Ok(0);
        };
        let count = usize::try_from(row.col::<i64>(0)?).unwrap_or(0);
        let last = EndCursor::from_parts(row.col::<i64>(1)?, row.col::<i64>(2)?);
        let kept = super::read::endings_trimmed(self.tx, self.p)?;
        let st = self.get(
            "INSERT INTO {s}.leasehold_meta (key, value) VALUES ('endings.trimmed', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?;
        self.tx.execute(&st, &[&kept.max(last).to_string()])?;
        Ok(count)
    }

    fn delete_group(&mut self, group: &GroupRecord) -> Result<()> {
        let st = self.get("DELETE FROM {s}.leasehold_groups WHERE id = $1")?;
        self.tx.execute(&st, &[&clamp(group.id.0)])?;
        if let Some(key) = &group.key {
            let st =
                self.get("DELETE FROM {s}.leasehold_group_keys WHERE key = $1 AND grp = $2")?;
            self.tx.execute(&st, &[key, &clamp(group.id.0)])?;
        }
        Ok(())
    }

    fn save_group(&mut self, group: &GroupRecord) -> Result<()> {
        // (`old` reads the row as it was before the update: one snapshot for the statement)
        let st = self.get(
            "WITH old AS (SELECT ended_at FROM {s}.leasehold_groups WHERE id = $1)
             UPDATE {s}.leasehold_groups SET record = $2, ended_at = {s}.at($3) WHERE id = $1
             RETURNING (SELECT ended_at IS NULL FROM old)",
        )?;
        let ended = group.finished_at.map(us);
        let was_open = (self
            .tx
            .query_opt(&st, &[&clamp(group.id.0), &codec::encode(group), &ended])?)
        .map(|row| row.col::<Option<bool>>(0))
        .transpose()?
        .flatten()
        .unwrap_or(false);
        note_endings(self, rules::group_ending(was_open, group).as_slice())
    }

    fn checkpoint(&mut self, job: JobId) -> Result<Option<CheckpointRecord>> {
        let st = self.get("SELECT record FROM {s}.leasehold_checkpoints WHERE job = $1")?;
        let found = self.tx.query_opt(&st, &[&key(job)])?;
        let bytes = found.as_ref().map(|row| row.col::<&[u8]>(0)).transpose()?;
        codec::decode_stored(bytes, || format!("the checkpoint of job {job}"))
    }

    fn save_checkpoint(&mut self, job: JobId, checkpoint: &CheckpointRecord) -> Result<()> {
        let st = self.get(
            "INSERT INTO {s}.leasehold_checkpoints (job, record) VALUES ($1, $2)
             ON CONFLICT (job) DO UPDATE SET record = excluded.record",
        )?;
        self.tx
            .execute(&st, &[&key(job), &codec::encode(checkpoint)])?;
        Ok(())
    }

    fn attempt_log(&mut self, job: JobId, attempt: Attempt) -> Result<Option<LogRecord>> {
        let st =
            self.get("SELECT record FROM {s}.leasehold_logs WHERE job = $1 AND attempt = $2")?;
        let found = (self.tx).query_opt(&st, &[&key(job), &i64::from(attempt.0)])?;
        let bytes = found.as_ref().map(|row| row.col::<&[u8]>(0)).transpose()?;
        codec::decode_stored(bytes, || format!("the log of job {job} attempt {attempt}"))
    }

    fn save_attempt_log(&mut self, job: JobId, attempt: Attempt, log: &LogRecord) -> Result<()> {
        let st = self.get(
            "INSERT INTO {s}.leasehold_logs (job, attempt, record) VALUES ($1, $2, $3)
             ON CONFLICT (job, attempt) DO UPDATE SET record = excluded.record",
        )?;
        self.tx.execute(
            &st,
            &[&key(job), &i64::from(attempt.0), &codec::encode(log)],
        )?;
        Ok(())
    }

    fn attempt_logs(&mut self, of: &[(JobId, Attempt)]) -> Result<Vec<Option<LogRecord>>> {
        let st = self.get(
            "SELECT l.job, l.attempt, l.record FROM {s}.leasehold_logs l
             JOIN unnest($1::bigint[], $2::bigint[]) AS o(job, attempt)
                 ON l.job = o.job AND l.attempt = o.attempt",
        )?;
        let jobs: Vec<i64> = of.iter().map(|(id, _)| key(*id)).collect();
        let attempts: Vec<i64> = of.iter().map(|(_, a)| i64::from(a.0)).collect();
        let mut kept = std::collections::HashMap::new();
        for row in self.tx.query(&st, &[&jobs, &attempts])? {
            kept.insert((row.col::<i64>(0)?, row.col::<i64>(1)?), row);
        }
        (jobs.iter().zip(&attempts).zip(of))
            .map(|((job, attempt), (id, a))| {
                let bytes = kept.get(&(*job, *attempt)).map(|row| row.col::<&[u8]>(2));
                let what = || format!("the log of job {id} attempt {a}");
                codec::decode_stored(bytes.transpose()?, what)
            })
            .collect()
    }

    fn save_attempt_logs(&mut self, logs: &[(JobId, Attempt, LogRecord)]) -> Result<()> {
        let st = self.get(
            "INSERT INTO {s}.leasehold_logs (job, attempt, record)
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[])
             ON CONFLICT (job, attempt) DO UPDATE SET record = excluded.record",
        )?;
        let jobs: Vec<i64> = logs.iter().map(|(id, _, _)| key(*id)).collect();
        let attempts: Vec<i64> = logs.iter().map(|(_, a, _)| i64::from(a.0)).collect();
        let records: Vec<Vec<u8>> = logs.iter().map(|(_, _, log)| codec::encode(log)).collect();
        self.tx.execute(&st, &[&jobs, &attempts, &records])?;
        Ok(())
    }

    fn group_of_key(&mut self, key: &str) -> Result<Option<GroupId>> {
        // Two openings of one key, at once on two connections, are one after the other: the
        // second reads the key once the first has committed (read committed).
        let lock = self.get(
            "SELECT pg_advisory_xact_lock(hashtextextended('leasehold group {s} ' || $1, 0))",
        )?;
        self.tx.execute(&lock, &[&key])?;
        let st = self.get("SELECT grp FROM {s}.leasehold_group_keys WHERE key = $1")?;
        let found = self.tx.query_opt(&st, &[&key])?;
        found
            .map(|row| Ok(GroupId(u64::try_from(row.col::<i64>(0)?).unwrap_or(0))))
            .transpose()
    }

    fn save_group_key(&mut self, key: &str, group: GroupId) -> Result<()> {
        let st = self.get("INSERT INTO {s}.leasehold_group_keys (key, grp) VALUES ($1, $2)")?;
        self.tx.execute(&st, &[&key, &clamp(group.0)])?;
        Ok(())
    }

    fn try_job(&mut self, job: JobId) -> Result<Option<JobRecord>> {
        let st = self.get(concat!(
            "SELECT ",
            job_columns!(),
            " FROM {s}.leasehold_jobs WHERE id = $1 FOR UPDATE SKIP LOCKED"
        ))?;
        job_by(self.tx, &st, job)
    }

    /// The key's index in its key's order; read without locking (the key's record is held).
    fn first_of_key(&mut self, queue: &str, key: &str) -> Result<Option<JobId>> {
        let st = self.get(concat!(
            "SELECT id FROM {s}.leasehold_jobs
             WHERE queue = $1 AND limit_key = $2 AND state IN ('queued', 'retry_wait')
             ORDER BY ",
            key_order_sql!(),
            " LIMIT 1",
        ))?;
        let row = self.tx.query_opt(&st, &[&queue, &key])?;
        row.map(|r| r.col(0).map(id)).transpose()
    }
}
