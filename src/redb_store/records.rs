//! The protocol's records on redb ([`Records`] for a write transaction, [`Tx`]): job records
//! and their indexes through [`index::save`], the time the transaction acts at, the tallies
//! it persists when it commits. Nothing here decides what becomes of a job.

use redb::ReadableTable;

use crate::checkpoint::CheckpointRecord;
use crate::codec;
use crate::error::{Error, Result};
use crate::ids::{Attempt, GroupId, JobId, StoreTime};
use crate::job::{JobRecord, Outcome, RunRecord};
use crate::job_log::LogRecord;
use crate::protocol::{HeldSchedule, Inserted, NamedRecords, Policy, Position, Records};
use crate::queue::{KeyRecord, QueueRecord};
use crate::redb_store::schema::meta_key;
use crate::redb_store::writing::{Tx, load, read_u64, write_u64};
use crate::redb_store::{index, search};
use crate::rules;
use crate::schedule::ScheduleRecord;
use crate::state::JobState;
use crate::stats::Counters;
use crate::workflow::{GroupRecord, Target};

impl Records for Tx<'_> {
    fn policy(&self) -> &Policy {
        &self.policy.rules
    }

    /// A redb transaction acts at one instant (one writer at a time: nothing can happen
    /// between its statements).
    fn now(&mut self) -> Result<StoreTime> {
        Ok(self.now)
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobRecord>> {
        self.tables.job(id)
    }

    fn insert(&mut self, job: JobRecord, payload: &[u8]) -> Result<Inserted> {
        let id = self.next_job_id()?;
        let job = JobRecord { id, ..job };
        self.tables.payloads.insert(id.0, payload)?;
        index::save(self, None, &job)?;
        for need in &job.flow.needs {
            if let Target::Job(dep) = need.on {
                self.tables.waits()?.insert((dep.0, id.0), ())?;
            }
        }
        if let Some(group) = job.flow.group {
            self.tables.members()?.insert((group.0, id.0), ())?;
        }
        Ok(Inserted::Made(id))
    }

    /// Also keeps the file's processes' ledger: a lease granted here is recorded as held by
    /// this handle's instance, and forgotten when its attempt ends.
    fn save(&mut self, old: &JobRecord, new: &JobRecord) -> Result<()> {
        index::save(self, Some(old), new)?;
        let was_running = old.state == JobState::Running;
        let running = new.state == JobState::Running;
        if running && let Some(lease) = &new.lease {
            self.tally.wrote_time(lease.expires_at);
            if (!was_running || old.attempt != new.attempt)
                && let Some(instance) = self.policy.instance
            {
                self.tables.hold(new.id, instance, new.attempt.0)?;
            }
        }
        if was_running && !running {
            self.tables.unhold(old.id)?;
        }
        Ok(())
    }

    /// A redb record is stored whole: an edit is a save, and the payload beside it.
    fn edit(&mut self, old: &JobRecord, new: &JobRecord, payload: Option<&[u8]>) -> Result<()> {
        if let Some(payload) = payload {
            self.tables.payloads.insert(new.id.0, payload)?;
        }
        self.save(old, new)
    }

    fn renew(&mut self, renewed: &JobRecord) -> Result<()> {
        if let Some(lease) = &renewed.lease {
            self.tally.wrote_time(lease.expires_at);
        }
        // A renewal moves no index entry (the expiry entry catches up later), so the record
        // is rewritten in place.
        index::rewrite(self, renewed)
    }

    fn payload(&mut self, id: JobId) -> Result<Vec<u8>> {
        self.tables
            .payloads
            .get(id.0)?
            .map(|p| p.value().to_vec())
            .ok_or_else(|| Error::Corrupt(format!("job {id} has no payload")))
    }

    fn keep_output(&mut self, id: JobId, output: &[u8]) -> Result<()> {
        self.tables.outputs.insert(id.0, output)?;
        Ok(())
    }

    fn record_run(&mut self, old: &JobRecord, run: &RunRecord) -> Result<()> {
        self.tables
            .history
            .insert((old.id.0, old.attempt.0), codec::encode(run).as_slice())?;
        Ok(())
    }

    fn run_outcome(&mut self, id: JobId, attempt: Attempt) -> Result<Option<Outcome>> {
        let Some(bytes) = self.tables.history.get((id.0, attempt.0))? else {
            return Ok(None);
        };
        let run: RunRecord = codec::decode(bytes.value())
            .map_err(|e| Error::Corrupt(format!("history of job {id} attempt {attempt}: {e}")))?;
        Ok(run.outcome)
    }

    fn count(&mut self, counts: &Counters) -> Result<()> {
        self.tally.add(counts);
        Ok(())
    }

    fn readied(&mut self, queue: &str) -> Result<()> {
        if !self.tally.readied.contains(queue) {
            self.tally.readied.insert(queue.to_owned());
        }
        Ok(())
    }

    fn events(&mut self) -> &mut crate::events::Pending {
        &mut self.events
    }

    fn key_holder(&mut self, queue: &str, key: &str) -> Result<Option<JobRecord>> {
        match self.tables.unique.get((queue, key))? {
            Some(id) => Ok(Some(load(self, JobId(id.value()))?)),
            None => Ok(None),
        }
    }

    fn next_ready(&mut self, queue: &str, now: StoreTime) -> Result<Option<(i32, JobId)>> {
        search::next_ready(&self.tables.ready, queue, now)
    }

    fn first_indexed_expiry(&mut self, queue: &str, bound: StoreTime) -> Result<Option<JobId>> {
        Ok(search::first_expiry_entry(&self.tables.expiry, queue, bound.0)?.map(|(_, id)| id))
    }

    fn indexed_expiries(&mut self, bound: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        let mut ids = Vec::new();
        for queue in search::running_queues(&self.tables.counts)? {
            let range = (queue.as_str(), 0u64, 0u64)..=(queue.as_str(), bound.0, u64::MAX);
            for entry in self.tables.expiry.range(range)? {
                if ids.len() == limit {
                    return Ok(ids);
                }
                ids.push(JobId(entry?.0.value().2));
            }
        }
        Ok(ids)
    }

    fn past_expiry(&mut self, now: StoreTime, limit: usize) -> Result<Vec<JobId>> {
        let mut ids = Vec::new();
        for entry in self
            .tables
            .expiring()?
            .range(..=(now.0, u64::MAX))?
            .take(limit)
        {
            ids.push(JobId(entry?.0.value().1));
        }
        Ok(ids)
    }

    fn running(&mut self, queue: &str) -> Result<u64> {
        Tx::count(self, queue, JobState::Running)
    }

    fn has_jobs(&mut self, queue: &str) -> Result<bool> {
        for state in JobState::ALL {
            if Tx::count(self, queue, state)? > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn finished(&mut self, from: Position, until: StoreTime, n: usize) -> Result<Vec<JobRecord>> {
        let mut ids = Vec::new();
        for entry in self
            .tables
            .finished
            .range((from.0.0, from.1.0)..=(until.0, u64::MAX))?
            .take(n)
        {
            ids.push(JobId(entry?.0.value().1));
        }
        ids.into_iter().map(|id| load(self, id)).collect()
    }

    /// Also forgets the job's links: what it waited for, what waited for it, its group.
    fn delete(&mut self, job: &JobRecord) -> Result<()> {
        index::delete(self, job)?;
        let id = job.id.0;
        for need in &job.flow.needs {
            if let Target::Job(dep) = need.on {
                self.tables.waits()?.remove((dep.0, id))?;
            }
        }
        if job.flow.awaited {
            let waiters = (id, 0)..=(id, u64::MAX);
            self.tables.waits()?.retain_in(waiters, |_, ()| false)?;
        }
        if let Some(group) = job.flow.group {
            self.tables.members()?.remove((group.0, id))?;
        }
        self.tables.checkpoints()?.remove(id)?;
        let attempts = (id, 0)..=(id, u32::MAX);
        self.tables.logs()?.retain_in(attempts, |_, _| false)?;
        Ok(())
    }

    fn attempt_log(&mut self, id: JobId, attempt: Attempt) -> Result<Option<LogRecord>> {
        let found = self.tables.logs()?.get((id.0, attempt.0))?;
        codec::decode_stored(found.as_ref().map(|b| b.value()), || {
            format!("the log of job {id} attempt {attempt}")
        })
    }

    fn save_attempt_log(&mut self, id: JobId, attempt: Attempt, log: &LogRecord) -> Result<()> {
        let bytes = codec::encode(log);
        self.tables
            .logs()?
            .insert((id.0, attempt.0), bytes.as_slice())?;
        self.tally.writes += 1;
        Ok(())
    }

    fn checkpoint(&mut self, id: JobId) -> Result<Option<CheckpointRecord>> {
        let found = self.tables.checkpoints()?.get(id.0)?;
        codec::decode_stored(found.as_ref().map(|b| b.value()), || {
            format!("the checkpoint of job {id}")
        })
    }

    fn save_checkpoint(&mut self, id: JobId, checkpoint: &CheckpointRecord) -> Result<()> {
        let bytes = codec::encode(checkpoint);
        self.tables.checkpoints()?.insert(id.0, bytes.as_slice())?;
        self.tally.writes += 1;
        Ok(())
    }

    fn waiters(&mut self, ids: &[JobId]) -> Result<Vec<(JobId, JobId)>> {
        let waits = self.tables.waits()?;
        let mut found = Vec::new();
        for id in ids {
            for entry in waits.range((id.0, 0)..=(id.0, u64::MAX))? {
                found.push((*id, JobId(entry?.0.value().1)));
            }
        }
        Ok(found)
    }

    fn members(&mut self, group: GroupId) -> Result<Vec<JobId>> {
        let members = self.tables.members()?;
        (members.range((group.0, 0)..=(group.0, u64::MAX))?)
            .map(|e| Ok(JobId(e?.0.value().1)))
            .collect()
    }

    fn group(&mut self, id: GroupId) -> Result<Option<GroupRecord>> {
        let found = self.tables.groups()?.get(id.0)?;
        codec::decode_stored(found.as_ref().map(|b| b.value()), || {
            format!("the record of group {id}")
        })
    }

    fn insert_group(&mut self, group: GroupRecord) -> Result<GroupId> {
        let meta = &mut self.tables.meta;
        let id = read_u64(meta, meta_key::NEXT_GROUP_ID)?.unwrap_or(1);
        write_u64(meta, meta_key::NEXT_GROUP_ID, id + 1)?;
        let group = GroupRecord {
            id: GroupId(id),
            ..group
        };
        self.save_group(&group)?;
        Ok(group.id)
    }

    /// The record, and its entry in `group_ends` kept in step (a group ends once, and its
    /// entry moves from the open ones to its end).
    fn save_group(&mut self, group: &GroupRecord) -> Result<()> {
        self.tables
            .groups()?
            .insert(group.id.0, codec::encode(group).as_slice())?;
        let ends = self.tables.group_ends()?;
        let was_open = match group.finished_at {
            Some(_) => ends.remove((u64::MAX, group.id.0))?.is_some(),
            None => true,
        };
        ends.insert(crate::redb_store::schema::group_end(group), ())?;
        if let Some(ending) = rules::group_ending(was_open, group) {
            self.tables.note_ending(&ending)?;
        }
        self.tally.writes += 1;
        Ok(())
    }

    fn group_of_key(&mut self, key: &str) -> Result<Option<GroupId>> {
        Ok(self
            .tables
            .group_keys()?
            .get(key)?
            .map(|id| GroupId(id.value())))
    }

    fn save_group_key(&mut self, key: &str, group: GroupId) -> Result<()> {
        self.tables.group_keys()?.insert(key, group.0)?;
        self.tally.writes += 1;
        Ok(())
    }

    fn ended_groups(
        &mut self,
        from: (StoreTime, GroupId),
        until: StoreTime,
        n: usize,
    ) -> Result<Vec<GroupRecord>> {
        let range = (from.0.0, from.1.0)..=(until.0, u64::MAX);
        let ids: Vec<GroupId> = (self.tables.group_ends()?.range(range)?.take(n))
            .map(|e| Ok(GroupId(e?.0.value().1)))
            .collect::<Result<_>>()?;
        let mut ended = Vec::with_capacity(ids.len());
        for id in ids {
            let group = self.group(id)?;
            ended.push(group.ok_or_else(|| {
                Error::Corrupt(format!("group_ends names group {id}, which has no record"))
            })?);
        }
        Ok(ended)
    }

    fn trim_endings(&mut self, cutoff: StoreTime, n: usize) -> Result<usize> {
        let mut doomed = Vec::new();
        for entry in self.tables.endings()?.iter()?.take(n) {
            let (seq, bytes) = entry?;
            let seq = seq.value();
            let what = || format!("ending {seq}");
            let record =
                codec::decode_stored::<crate::endings::EndRecord>(Some(bytes.value()), what)?;
            if record.is_none_or(|e| e.at > cutoff) {
                break;
            }
            doomed.push(seq);
        }
        let Some(&last) = doomed.last() else {
            return Ok(0);
        };
        let (first, endings) = (doomed[0], self.tables.endings()?);
        endings.retain_in(first..=last, |_, _| false)?;
        write_u64(&mut self.tables.meta, meta_key::ENDINGS_TRIMMED, last)?;
        self.tally.writes += 1;
        Ok(doomed.len())
    }

    /// Also forgets its members' entries (none are left of a group retention purges).
    fn delete_group(&mut self, group: &GroupRecord) -> Result<()> {
        let id = group.id.0;
        self.tables.groups()?.remove(id)?;
        let end = crate::redb_store::schema::group_end(group);
        self.tables.group_ends()?.remove(end)?;
        let members = (id, 0)..=(id, u64::MAX);
        self.tables.members()?.retain_in(members, |_, ()| false)?;
        if let Some(key) = &group.key {
            let keys = self.tables.group_keys()?;
            if keys.get(key.as_str())?.is_some_and(|g| g.value() == id) {
                keys.remove(key.as_str())?;
            }
        }
        self.tally.writes += 1;
        Ok(())
    }

    fn first_of_key(&mut self, queue: &str, key: &str) -> Result<Option<JobId>> {
        let range = (queue, key, 0u64, 0u64)..=(queue, key, u64::MAX, u64::MAX);
        let first = self.tables.keyed()?.range(range)?.next().transpose()?;
        Ok(first.map(|(entry, _)| JobId(entry.value().3)))
    }
}

impl NamedRecords for Tx<'_> {
    fn queue(&mut self, queue: &str, _lock: bool) -> Result<Option<QueueRecord>> {
        match self.tables.queues()?.get(queue)? {
            Some(b) => codec::decode_queue(b.value())
                .map(Some)
                .map_err(|e| Error::Corrupt(format!("the record of queue {queue:?}: {e}"))),
            None => Ok(None),
        }
    }

    fn save_queue(&mut self, queue: &str, record: &QueueRecord) -> Result<()> {
        self.tables
            .queues()?
            .insert(queue, codec::encode(record).as_slice())?;
        self.tally.writes += 1;
        Ok(())
    }

    fn limit_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRecord>> {
        let found = self.tables.limit_keys()?.get((queue, key))?;
        found.map(|b| key_record(queue, key, b.value())).transpose()
    }

    /// The record, and its entry in `key_gates` kept in step (the old record's gate is the
    /// one the write replaces, read from what the write returns).
    fn save_limit_key(&mut self, queue: &str, key: &str, record: Option<&KeyRecord>) -> Result<()> {
        let new = record.and_then(|k| k.opens_at);
        let table = self.tables.limit_keys()?;
        let old = match record {
            Some(record) => table.insert((queue, key), codec::encode(record).as_slice())?,
            None => table.remove((queue, key))?,
        };
        let old = old.map(|b| key_record(queue, key, b.value())).transpose()?;
        let old = old.and_then(|k| k.opens_at);
        if old != new {
            let gates = self.tables.key_gates()?;
            if let Some(at) = old {
                gates.remove((queue, at.0, key))?;
            }
            if let Some(at) = new {
                gates.insert((queue, at.0, key), ())?;
            }
        }
        self.tally.writes += 1;
        Ok(())
    }

    fn gated_keys(&mut self, queue: &str, now: StoreTime) -> Result<Vec<String>> {
        let range = (queue, 0u64, "")..=(queue, now.0, "\u{10FFFF}");
        let mut keys = Vec::new();
        for entry in self.tables.key_gates()?.range(range)? {
            let (at, _) = entry?;
            keys.push(at.value().2.to_owned());
        }
        Ok(keys)
    }

    fn limit_keys(&mut self, queue: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        for entry in self.tables.limit_keys()?.range((queue, "")..)? {
            let (at, _) = entry?;
            let (q, key) = at.value();
            if q != queue {
                break;
            }
            keys.push(key.to_owned());
        }
        Ok(keys)
    }

    fn schedules(&mut self) -> Result<Vec<HeldSchedule>> {
        let mut held = Vec::new();
        for entry in self.tables.schedules()?.iter()? {
            let (name, bytes) = entry?;
            let name = name.value().to_owned();
            let record = decode_schedule(&name, bytes.value());
            held.push((name, record, None));
        }
        for (name, _, kept) in &mut held {
            *kept = self.failure(name)?;
        }
        Ok(held)
    }

    fn schedule(&mut self, name: &str) -> Result<Option<ScheduleRecord>> {
        match self.tables.schedules()?.get(name)? {
            Some(b) => decode_schedule(name, b.value()).map(Some),
            None => Ok(None),
        }
    }

    fn save_schedule(&mut self, record: &ScheduleRecord) -> Result<()> {
        self.tables
            .schedules()?
            .insert(record.name.as_str(), codec::encode(record).as_slice())?;
        self.tally.writes += 1;
        Ok(())
    }

    fn remove_schedule(&mut self, name: &str) -> Result<bool> {
        let removed = self.tables.schedules()?.remove(name)?.is_some();
        if removed {
            self.tally.writes += 1;
        }
        Ok(removed)
    }

    fn note_schedule_failure(&mut self, name: &str, failure: Option<&str>) -> Result<()> {
        if self.failure(name)?.as_deref() == failure {
            return Ok(());
        }
        let key = rules::schedule_failure_key(name);
        match failure {
            Some(failure) => self.tables.meta.insert(key.as_str(), failure.as_bytes())?,
            None => self.tables.meta.remove(key.as_str())?,
        };
        self.tally.writes += 1;
        Ok(())
    }
}

impl Tx<'_> {
    /// The failure kept beside schedule `name`, if any.
    fn failure(&self, name: &str) -> Result<Option<String>> {
        let key = rules::schedule_failure_key(name);
        Ok(self
            .tables
            .meta
            .get(key.as_str())?
            .map(|v| String::from_utf8_lossy(v.value()).into_owned()))
    }
}

/// A limit key's record as stored.
pub(crate) fn key_record(queue: &str, key: &str, bytes: &[u8]) -> Result<KeyRecord> {
    codec::decode(bytes)
        .map_err(|e| Error::Corrupt(format!("the record of limit key {key:?} of {queue:?}: {e}")))
}

pub(crate) fn decode_schedule(name: &str, bytes: &[u8]) -> Result<ScheduleRecord> {
    codec::decode_schedule(bytes).map_err(|e| Error::Corrupt(format!("schedule {name:?}: {e}")))
}
