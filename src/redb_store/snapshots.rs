//! A redb handle read through snapshots, the [`crate::Store`] and the read-only
//! [`crate::StoreReader`] alike: [`crate::ReadJobs`] written once over the read side's
//! functions (`reading.rs`) and the integrity check (`check.rs`).

use redb::ReadTransaction;

use super::reading::{
    bytes, contained, history, job, list, optional, queue_settings, record, schedules, stats,
    timing,
};

use crate::codec;
use crate::error::Result;
use crate::ids::{JobId, StoreTime};
use crate::job::{Job, Run};
use crate::query::{JobFilter, QueueTiming};
use crate::redb_store::schema;
use crate::stats::Stats;

/// A handle the read side reads a redb file through: the [`crate::Store`] and the read-only
/// [`crate::StoreReader`] alike. What they read, and how, is written once below.
pub(crate) trait Snapshots: Send + Sync {
    /// A read snapshot of the file.
    fn snapshot(&self) -> Result<ReadTransaction>;
    /// Store time now.
    fn store_time(&self) -> StoreTime;
    /// Runs `f` on a read snapshot, a damaged page reported as corruption (see
    /// [`contained`]).
    fn reading<T>(&self, what: &str, f: impl FnOnce(&ReadTransaction) -> Result<T>) -> Result<T> {
        contained(what, || f(&self.snapshot()?))
    }
    /// [`crate::ReadJobs::wait_for_endings`] on this handle: a read-only reader hears no
    /// hint and reads at pauses.
    fn follow_endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::endings::Endings>
    where
        Self: Sized,
    {
        let read = |a, n| crate::job_store::ReadJobs::endings(self, a, n);
        crate::wait_end::follow(read, None, after, limit, timeout)
    }
}

impl<S: Snapshots> crate::job_store::ReadJobs for S {
    fn now(&self) -> Result<StoreTime> {
        Ok(self.store_time())
    }

    fn job(&self, id: JobId) -> Result<Option<Job>> {
        self.reading("a job record", |read| job(read, id))
    }

    fn history(&self, id: JobId) -> Result<Vec<Run>> {
        self.reading("a job's history", |read| history(read, id))
    }

    fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.reading("a payload", |read| bytes(read, schema::PAYLOADS, id))
    }

    fn output(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.reading("an output", |read| bytes(read, schema::OUTPUTS, id))
    }

    fn checkpoint(&self, id: JobId) -> Result<Option<crate::checkpoint::Checkpoint>> {
        self.reading("a checkpoint", |read| {
            let Some(checkpoints) = optional(read, schema::CHECKPOINTS)? else {
                return Ok(None);
            };
            let found = checkpoints.get(id.0)?;
            let what = || format!("the checkpoint of job {id}");
            let record = codec::decode_stored(found.as_ref().map(|b| b.value()), what)?;
            Ok(record.map(crate::checkpoint::Checkpoint))
        })
    }

    fn endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
    ) -> Result<crate::endings::Endings> {
        self.reading("the endings", |read| {
            crate::redb_store::reading::endings(read, after, limit)
        })
    }

    fn wait_for_endings(
        &self,
        after: crate::endings::EndCursor,
        limit: usize,
        timeout: std::time::Duration,
    ) -> Result<crate::endings::Endings> {
        self.follow_endings(after, limit, timeout)
    }

    fn logs(&self, id: JobId) -> Result<Vec<crate::job_log::AttemptLog>> {
        self.reading("a job's logs", |read| {
            let Some(logs) = optional(read, schema::LOGS)? else {
                return Ok(Vec::new());
            };
            let mut found = Vec::new();
            for entry in logs.range((id.0, 0)..=(id.0, u32::MAX))? {
                let (key, bytes) = entry?;
                let attempt = crate::ids::Attempt(key.value().1);
                let what = || format!("the log of job {id} attempt {attempt}");
                if let Some(record) = codec::decode_stored(Some(bytes.value()), what)? {
                    found.push(crate::job_log::AttemptLog { attempt, record });
                }
            }
            Ok(found)
        })
    }

    fn group(&self, id: crate::ids::GroupId) -> Result<Option<crate::workflow::Group>> {
        self.reading("a group's record", |read| {
            let Some(groups) = optional(read, schema::GROUPS)? else {
                return Ok(None);
            };
            let found = groups.get(id.0)?;
            let what = || format!("the record of group {id}");
            let record = codec::decode_stored(found.as_ref().map(|b| b.value()), what)?;
            Ok(record.map(crate::workflow::Group))
        })
    }

    fn waiters(&self, id: JobId) -> Result<Vec<JobId>> {
        self.reading("what waits for a job", |read| {
            let Some(waits) = optional(read, schema::WAITS)? else {
                return Ok(Vec::new());
            };
            let mut found = Vec::new();
            for entry in waits.range((id.0, 0)..=(id.0, u64::MAX))? {
                let waiter = JobId(entry?.0.value().1);
                if record(read, waiter)?.is_some() {
                    found.push(waiter);
                }
            }
            Ok(found)
        })
    }

    /// Reads the records (for operators and tools), running and waiting ones through their
    /// index.
    fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let now = self.store_time();
        self.reading("the job records", |read| list(read, filter, now))
    }

    fn timing(&self, queue: &str) -> Result<QueueTiming> {
        let now = self.store_time();
        self.reading("the queue's schedule", |read| timing(read, queue, now))
    }

    /// Reads the `counts` index, not the jobs.
    fn stats(&self) -> Result<Stats> {
        let now = self.store_time();
        self.reading("the counts", |read| stats(read, now))
    }

    fn queue_settings(&self, queue: &str) -> Result<crate::queue::QueueSettings> {
        self.reading("the queue's record", |read| queue_settings(read, queue))
    }

    fn schedules(&self) -> Result<Vec<crate::schedule::ScheduleInfo>> {
        self.reading("the schedules", schedules)
    }

    /// Proves the indexes match the records (like SQLite's `PRAGMA integrity_check`): every
    /// index entry is implied by a record, every record has all of its entries, the counts
    /// are right, and history has one record per attempt.
    fn check(&self) -> Result<crate::report::CheckReport> {
        self.reading("the whole store", crate::redb_store::check::check)
    }
}
