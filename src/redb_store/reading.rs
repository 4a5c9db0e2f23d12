//! The read side, as functions over a redb read transaction: shared by [`Store`] and
//! [`StoreReader`], so a live store and a read-only view of it answer alike.
//!
//! [`Store`]: crate::Store
//! [`StoreReader`]: crate::StoreReader

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable, TableDefinition};

use crate::codec;
use crate::endings::{EndCursor, EndRecord, Endings};
use crate::error::{Error, Result};
use crate::ids::{JobId, StoreTime};
use crate::job::{Job, JobRecord, Run, RunRecord};
use crate::query::{JobFilter, JobOrder, QueueTiming};
use crate::queue::QueueRecord;
use crate::redb_store::schema::{self, meta_key};
use crate::redb_store::writing::decode_job;
use crate::rules;
use crate::state::JobState;
use crate::stats::Stats;
use crate::workflow::GroupRecord;

/// Runs a read, turning a panic of the storage engine into [`Error::Corrupt`] naming `what`
/// was being read: redb panics on some damaged pages, and a damaged file must be an error the
/// application (and the tool's exit code) can act on, never a crash.
pub(crate) fn contained<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::redb_store::contain::quietly(f).unwrap_or_else(|_| {
        Err(Error::Corrupt(format!(
            "reading {what}: the storage engine met a damaged page"
        )))
    })
}

/// The table `table`, or `None` in a store written before it existed.
pub(crate) fn optional<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>> {
    match read.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn job(read: &ReadTransaction, id: JobId) -> Result<Option<Job>> {
    record(read, id).map(|record| record.map(Job))
}

pub(crate) fn record(read: &ReadTransaction, id: JobId) -> Result<Option<JobRecord>> {
    let jobs = read.open_table(schema::JOBS)?;
    match jobs.get(id.0)? {
        Some(b) => decode_job(b.value()).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn bytes(
    read: &ReadTransaction,
    table: TableDefinition<u64, &[u8]>,
    id: JobId,
) -> Result<Option<Vec<u8>>> {
    let t = read.open_table(table)?;
    Ok(t.get(id.0)?.map(|b| b.value().to_vec()))
}

/// Every attempt of the job, oldest first: the ended ones from the `history` table, and a
/// running one (which has no record until it ends) from the job's lease.
pub(crate) fn history(read: &ReadTransaction, id: JobId) -> Result<Vec<Run>> {
    let history = read.open_table(schema::HISTORY)?;
    let mut runs: Vec<RunRecord> = Vec::new();
    for entry in history.range((id.0, 0u32)..=(id.0, u32::MAX))? {
        let (_, v) = entry?;
        runs.push(
            codec::decode(v.value())
                .map_err(|e| Error::Corrupt(format!("history of job {id}: {e}")))?,
        );
    }
    if let Some(running) = record(read, id)?.and_then(|j| j.current_run()) {
        // A store written by an earlier build may hold an open record for it already.
        if runs.last().is_none_or(|r| r.attempt != running.attempt) {
            runs.push(running);
        }
    }
    Ok(runs.into_iter().map(Run).collect())
}

/// Counts per queue and state (from the counts index) and the lifetime counters.
pub(crate) fn stats(read: &ReadTransaction, now: StoreTime) -> Result<Stats> {
    let counts = read.open_table(schema::COUNTS)?;
    let mut stats = Stats {
        now,
        ..Stats::default()
    };
    for entry in counts.iter()? {
        let (k, v) = entry?;
        let (queue, code) = k.value();
        let state = JobState::from_code(code)
            .ok_or_else(|| Error::Corrupt(format!("unknown state code {code}")))?;
        stats
            .queues
            .entry(queue.to_owned())
            .or_default()
            .by_state
            .insert(state, v.value());
    }
    for (queue, record) in queue_records(read)? {
        stats.note_queue(queue, &record);
    }
    let (mut keys, mut keyed) = (Vec::new(), BTreeMap::<String, u64>::new());
    if let Some(table) = optional(read, schema::LIMIT_KEYS)? {
        for entry in table.iter()? {
            let (k, v) = entry?;
            let (queue, key) = k.value();
            keys.push((
                queue.to_owned(),
                super::records::key_record(queue, key, v.value())?,
            ));
        }
    }
    if let Some(table) = optional(read, schema::KEYED)? {
        for entry in table.iter()? {
            *keyed.entry(entry?.0.value().0.to_owned()).or_default() += 1;
        }
    }
    rules::count_keys(&mut stats, keys, keyed);
    for group in open_groups(read)? {
        stats.note_group(&group);
    }
    let meta = read.open_table(schema::META)?;
    if let Some(b) = meta.get(meta_key::COUNTERS)? {
        stats.counters = codec::decode_counters(b.value())
            .map_err(|e| Error::Corrupt(format!("counters: {e}")))?;
    }
    if let Some(b) = meta.get(meta_key::REAPER_PASS)? {
        stats.last_reaper_pass = Some(
            codec::decode(b.value())
                .map_err(|e| Error::Corrupt(format!("the last reaper pass: {e}")))?,
        );
    }
    Ok(stats)
}

/// The record of `queue`, if it has one.
pub(crate) fn queue_record(read: &ReadTransaction, queue: &str) -> Result<Option<QueueRecord>> {
    let Some(queues) = optional(read, schema::QUEUES)? else {
        return Ok(None);
    };
    match queues.get(queue)? {
        Some(b) => codec::decode_queue(b.value())
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("the record of queue {queue:?}: {e}"))),
        None => Ok(None),
    }
}

/// `queue`'s settings (the defaults for a queue without a record).
pub(crate) fn queue_settings(
    read: &ReadTransaction,
    queue: &str,
) -> Result<crate::queue::QueueSettings> {
    Ok(crate::queue::QueueSettings::of(queue_record(read, queue)?))
}

/// When a waiting worker of `queue` should look again at `now`: its next due job or lease
/// expiry, unless the queue has no room for a claim (paused, full, its rate spent).
pub(crate) fn next_look(
    read: &ReadTransaction,
    queue: &str,
    now: StoreTime,
) -> Result<Option<StoreTime>> {
    let (waiting, expiry) = (
        earliest_run_at(read, queue)?,
        earliest_indexed_expiry(read, queue)?,
    );
    let record = queue_record(read, queue)?;
    let running = match record {
        Some(_) => read
            .open_table(schema::COUNTS)?
            .get((queue, JobState::Running.code()))?,
        None => None,
    };
    let running = running.map_or(0, |v| v.value());
    // (only a queue with a per-key rate has keys with gates)
    let gate = match record
        .as_ref()
        .is_some_and(|q| q.limits.per_key_rate.is_some())
    {
        true => match optional(read, schema::KEY_GATES)? {
            Some(gates) => {
                let range = (queue, 0u64, "")..=(queue, u64::MAX, "\u{10FFFF}");
                let first = gates.range(range)?.next().transpose()?;
                first.map(|(at, _)| StoreTime(at.value().1))
            }
            None => None,
        },
        false => None,
    };
    let look = crate::rules::next_look(record.as_ref(), running, now, waiting, expiry, gate);
    Ok(look)
}

/// Every schedule, by name.
pub(crate) fn schedules(read: &ReadTransaction) -> Result<Vec<crate::schedule::ScheduleInfo>> {
    let Some(table) = optional(read, schema::SCHEDULES)? else {
        return Ok(Vec::new());
    };
    let meta = read.open_table(schema::META)?;
    table
        .iter()?
        .map(|e| {
            let (name, bytes) = e?;
            let key = crate::rules::schedule_failure_key(name.value());
            let failure = meta
                .get(key.as_str())?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            let record = crate::redb_store::records::decode_schedule(name.value(), bytes.value())?;
            Ok(crate::schedule::ScheduleInfo(record, failure))
        })
        .collect()
}

/// Every queue's record (none in a store no worker has served yet).
fn queue_records(read: &ReadTransaction) -> Result<Vec<(String, QueueRecord)>> {
    decoded(
        read,
        schema::QUEUES,
        |queue| queue.to_owned(),
        |queue| format!("the record of queue {queue:?}"),
        codec::decode_queue,
    )
}

/// Every entry of the table `table` (none where a store lacks it), its key made owned by
/// `key` and its value decoded; `what` names an entry whose value cannot be.
fn decoded<K: redb::Key + 'static, O, T: bincode::Decode<()>>(
    read: &ReadTransaction,
    table: TableDefinition<K, &'static [u8]>,
    key: impl Fn(K::SelfType<'_>) -> O,
    what: impl Fn(&O) -> String,
    decode: fn(&[u8]) -> Result<T, codec::CodecError>,
) -> Result<Vec<(O, T)>> {
    let Some(entries) = optional(read, table)? else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for entry in entries.iter()? {
        let (k, bytes) = entry?;
        let k = key(k.value());
        let value =
            decode(bytes.value()).map_err(|e| Error::Corrupt(format!("{}: {e}", what(&k))))?;
        found.push((k, value));
    }
    Ok(found)
}

/// When things fall due in `queue` at `now`.
pub(crate) fn timing(read: &ReadTransaction, queue: &str, now: StoreTime) -> Result<QueueTiming> {
    let (earliest_expiry, next_expiry) = lease_expiries(read, queue, now)?;
    Ok(QueueTiming {
        earliest_run_at: earliest_run_at(read, queue)?,
        earliest_expiry,
        next_expiry,
    })
}

/// The earliest `run_at` of a waiting job of `queue` (due or not): one seek per priority.
pub(crate) fn earliest_run_at(read: &ReadTransaction, queue: &str) -> Result<Option<StoreTime>> {
    let ready = read.open_table(schema::READY)?;
    let mut earliest: Option<u64> = None;
    crate::redb_store::search::first_of_each_priority(&ready, queue, |_, run_at, _| {
        earliest = Some(earliest.map_or(run_at, |e| e.min(run_at)));
        true
    })?;
    Ok(earliest.map(StoreTime))
}

/// The earliest lease expiry the index holds for `queue`: at or before the earliest real one
/// (renewals catch the index up lazily), so a waiter woken by it may find nothing due yet.
pub(crate) fn earliest_indexed_expiry(
    read: &ReadTransaction,
    queue: &str,
) -> Result<Option<StoreTime>> {
    let expiry = read.open_table(schema::EXPIRY)?;
    Ok(crate::redb_store::search::first_expiry_entry(&expiry, queue, u64::MAX)?.map(|(at, _)| at))
}

/// Whether some lease of any queue expired by `at` as the index holds it (at or before its
/// real expiry): whether a reaper's pass has anything to look at.
pub(crate) fn any_indexed_expiry_by(read: &ReadTransaction, at: StoreTime) -> Result<bool> {
    let counts = read.open_table(schema::COUNTS)?;
    let expiry = read.open_table(schema::EXPIRY)?;
    for queue in crate::redb_store::search::running_queues(&counts)? {
        if crate::redb_store::search::first_expiry_entry(&expiry, &queue, at.0)?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether a waiting job's expiry is at or before `at` (`expiring`, if the store has it).
pub(crate) fn any_expiring_by(read: &ReadTransaction, at: StoreTime) -> Result<bool> {
    let Some(expiring) = optional(read, schema::EXPIRING)? else {
        return Ok(false);
    };
    Ok(expiring.range(..=(at.0, u64::MAX))?.next().is_some())
}

/// The real earliest lease expiry of `queue`, and the earliest one at or after `now`, from the
/// running jobs' records (the index may lag renewals). Reads every running job of the queue:
/// for operators' views.
pub(crate) fn lease_expiries(
    read: &ReadTransaction,
    queue: &str,
    now: StoreTime,
) -> Result<(Option<StoreTime>, Option<StoreTime>)> {
    let expiry = read.open_table(schema::EXPIRY)?;
    let jobs = read.open_table(schema::JOBS)?;
    let (mut earliest, mut next): (Option<StoreTime>, Option<StoreTime>) = (None, None);
    for entry in expiry.range((queue, 0u64, 0u64)..=(queue, u64::MAX, u64::MAX))? {
        let id = entry?.0.value().2;
        let Some(bytes) = jobs.get(id)? else { continue };
        let Some(lease) = decode_job(bytes.value())?.lease else {
            continue;
        };
        let t = lease.expires_at;
        earliest = Some(earliest.map_or(t, |e| e.min(t)));
        if t >= now {
            next = Some(next.map_or(t, |e| e.min(t)));
        }
    }
    Ok((earliest, next))
}

/// Jobs matching `filter` at `now`: for operators and tools, not hot paths.
///
/// Running and waiting jobs are found through their index (`expiry`, `ready` and `keyed`), so listing
/// them reads only them, however many finished jobs the store keeps; other listings read
/// the records in id order from the cursor on (newest first from the end, for
/// [`JobOrder::Newest`]), and stop at the limit where the order allows it.
pub(crate) fn list(read: &ReadTransaction, filter: &JobFilter, now: StoreTime) -> Result<Vec<Job>> {
    if !filter.can_match() {
        return Ok(Vec::new());
    }
    let jobs = read.open_table(schema::JOBS)?;
    let from = filter.after.map_or(0, |after| after.0.saturating_add(1));
    let stops_early = matches!(filter.order, JobOrder::Oldest | JobOrder::Newest);
    let mut out = Vec::new();
    let mut take = |job: JobRecord| {
        if filter.admits(&job, now) {
            out.push(job);
        }
        !(stops_early && filter.limit.is_some_and(|n| out.len() >= n))
    };
    match indexed_candidates(read, filter)? {
        Some(mut ids) => {
            ids.retain(|id| *id >= from);
            ids.sort_unstable();
            ids.dedup();
            if filter.order == JobOrder::Newest {
                ids.reverse();
            }
            for id in ids {
                let Some(bytes) = jobs.get(id)? else { continue };
                let job = match decode_job(bytes.value()) {
                    Ok(job) => job,
                    Err(e) => {
                        crate::query::unreadable(id, e)?;
                        continue;
                    }
                };
                if !take(job) {
                    break;
                }
            }
        }
        None => {
            let range = jobs.range(from..)?;
            let records: Box<dyn Iterator<Item = _>> = match filter.order {
                JobOrder::Newest => Box::new(range.rev()),
                _ => Box::new(range),
            };
            for entry in records {
                let (id, bytes) = entry?;
                let job = match decode_job(bytes.value()) {
                    Ok(job) => job,
                    Err(e) => {
                        crate::query::unreadable(id.value(), e)?;
                        continue;
                    }
                };
                if !take(job) {
                    break;
                }
            }
        }
    }
    Ok(filter.arrange(out))
}

/// The ids of every job that can pass `filter`, from an index, where its state has one that
/// holds only jobs in that state: `expiry` for running jobs, `ready` and `keyed` for waiting
/// ones (`ready` holds only those in the claim order: a keyed job parked behind its key's
/// head is in `keyed` alone; all keyed by queue first), or, first, `members` for a group's
/// (a group is smaller than a state). `None`: no index narrows it; read the records.
fn indexed_candidates(read: &ReadTransaction, filter: &JobFilter) -> Result<Option<Vec<u64>>> {
    if let Some(group) = filter.group {
        let Some(members) = optional(read, schema::MEMBERS)? else {
            return Ok(Some(Vec::new()));
        };
        let entries = members.range((group.0, 0u64)..=(group.0, u64::MAX))?;
        return entries
            .map(|e| Ok(e?.0.value().1))
            .collect::<Result<_>>()
            .map(Some);
    }
    let queue = filter.queue.as_deref();
    let ids = match filter.state {
        Some(JobState::Running) => {
            let expiry = read.open_table(schema::EXPIRY)?;
            let entries = match queue {
                Some(q) => expiry.range((q, 0u64, 0u64)..=(q, u64::MAX, u64::MAX))?,
                None => expiry.range::<(&str, u64, u64)>(..)?,
            };
            entries
                .map(|e| Ok(e?.0.value().2))
                .collect::<Result<Vec<_>>>()?
        }
        Some(JobState::Queued | JobState::RetryWait) => {
            let ready = read.open_table(schema::READY)?;
            let entries = match queue {
                Some(q) => {
                    ready.range((q, i32::MIN, 0u64, 0u64)..=(q, i32::MAX, u64::MAX, u64::MAX))?
                }
                None => ready.range::<(&str, i32, u64, u64)>(..)?,
            };
            let mut ids = entries
                .map(|e| Ok(e?.0.value().3))
                .collect::<Result<Vec<_>>>()?;
            if let Some(keyed) = optional(read, schema::KEYED)? {
                let entries = match queue {
                    Some(q) => keyed.range((q, "", 0u64, 0u64)..)?,
                    None => keyed.range::<(&str, &str, u64, u64)>(..)?,
                };
                for entry in entries {
                    let entry = entry?.0;
                    let (q, _, _, id) = entry.value();
                    if queue.is_some_and(|queue| queue != q) {
                        break;
                    }
                    ids.push(id);
                }
            }
            ids
        }
        _ => return Ok(None),
    };
    Ok(Some(ids))
}

/// The process id of the process that last opened the store for writing.
pub(crate) fn writer_pid(read: &ReadTransaction) -> Result<Option<u32>> {
    let meta = read.open_table(schema::META)?;
    Ok(
        crate::redb_store::writing::read_u64(&meta, meta_key::WRITER_PID)?
            .and_then(|p| u32::try_from(p).ok()),
    )
}

/// Whether the last writing open shared the store between processes.
pub(crate) fn shared_by_processes(read: &ReadTransaction) -> Result<bool> {
    let meta = read.open_table(schema::META)?;
    Ok(meta
        .get(meta_key::SHARING)?
        .is_some_and(|v| v.value() == schema::MULTI_PROCESS))
}

/// The process instance holding each running job's lease, when processes share the store.
pub(crate) fn holders(read: &ReadTransaction) -> Result<Vec<(JobId, crate::ids::InstanceId)>> {
    let Some(holders) = optional(read, schema::HOLDERS)? else {
        return Ok(Vec::new());
    };
    holders
        .iter()?
        .map(|e| {
            let (job, holder) = e?;
            Ok((JobId(job.value()), crate::ids::InstanceId(holder.value().0)))
        })
        .collect()
}

/// Every process instance registered in a store that processes share, with where its lock
/// file is (see [`crate::redb_store::instance`]).
pub(crate) fn registrations(
    read: &ReadTransaction,
) -> Result<
    Vec<(
        crate::ids::InstanceId,
        crate::redb_store::instance::Registration,
    )>,
> {
    let id = |id: u64| crate::ids::InstanceId(id);
    let what = |id: &crate::ids::InstanceId| format!("process instance {:016x}", id.0);
    decoded(read, schema::INSTANCES, id, what, codec::decode)
}

/// The records of the groups that have not ended, through `group_ends` (a file of a schema
/// before it, which a reader does not upgrade, has none: its groups are read whole).
pub(crate) fn open_groups(read: &ReadTransaction) -> Result<Vec<GroupRecord>> {
    let Some(groups) = optional(read, schema::GROUPS)? else {
        return Ok(Vec::new());
    };
    let decode = |id: u64, bytes: &[u8]| -> Result<Option<GroupRecord>> {
        codec::decode_stored(Some(bytes), || format!("the record of group {id}"))
    };
    let meta = read.open_table(schema::META)?;
    let version = schema::version_in(&meta)?.unwrap_or(0);
    let index = match version >= 11 {
        true => optional(read, schema::GROUP_ENDS)?,
        false => None,
    };
    let mut open = Vec::new();
    match (version >= 11, index) {
        (true, None) => {}
        (true, Some(index)) => {
            for entry in index.range((u64::MAX, 0)..)? {
                let id = entry?.0.value().1;
                if let Some(bytes) = groups.get(id)? {
                    open.extend(decode(id, bytes.value())?);
                }
            }
        }
        (false, _) => {
            for entry in groups.iter()? {
                let (id, bytes) = entry?;
                let group = decode(id.value(), bytes.value())?;
                open.extend(group.filter(|g| g.finished_at.is_none()));
            }
        }
    }
    Ok(open)
}

/// The endings kept after `after`, at most `limit` ([`crate::ReadJobs::endings`]).
pub(crate) fn endings(read: &ReadTransaction, after: EndCursor, limit: usize) -> Result<Endings> {
    let meta = read.open_table(schema::META)?;
    let trimmed = EndCursor {
        tx: 0,
        seq: super::writing::read_u64(&meta, meta_key::ENDINGS_TRIMMED)?.unwrap_or(0),
    };
    let mut list = Vec::new();
    if let Some(kept) = optional(read, schema::ENDINGS)? {
        for entry in kept.range(after.seq.saturating_add(1)..)?.take(limit) {
            let (seq, bytes) = entry?;
            let seq = seq.value();
            let what = || format!("ending {seq}");
            if let Some(record) = codec::decode_stored::<EndRecord>(Some(bytes.value()), what)? {
                list.push(record.ending_at(EndCursor { tx: 0, seq }));
            }
        }
    }
    Ok(crate::endings::page(after, list, trimmed))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::job::Outcome;
    use crate::{
        codec, job_store::JobStore, job_store::ReadJobs, new_job::NewJob, redb_store::Store,
        redb_store::schema,
    };

    /// Builds before this one wrote a running attempt's record at claim time; such a store
    /// must read, check and finish exactly as one written now.
    #[test]
    fn an_open_run_record_written_by_an_earlier_build_is_read_once_and_closed_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("old.redb")).unwrap();
        let id = store.enqueue(NewJob::new("q", "x")).unwrap();
        let lease = store
            .claim("q", "w", Duration::from_secs(30))
            .unwrap()
            .unwrap();
        let stored = |store: &Store| {
            let read = store.begin_read().unwrap();
            let table = read.open_table(schema::HISTORY).unwrap();
            table.get((id.0, 1)).unwrap().is_some()
        };
        assert!(!stored(&store), "a claim writes no history record");
        let open = super::history(&store.begin_read().unwrap(), id).unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!((open[0].worker(), open[0].outcome()), ("w", None));

        // What an earlier build left: the same record, stored.
        let txn = store.db().begin_write().unwrap();
        txn.open_table(schema::HISTORY)
            .unwrap()
            .insert((id.0, 1), codec::encode(&open[0].0).as_slice())
            .unwrap();
        txn.commit().unwrap();
        assert!(stored(&store));
        assert_eq!(store.history(id).unwrap(), open, "shown once, not twice");
        assert!(store.check().unwrap().is_clean());

        store.complete(&lease, b"").unwrap();
        let ended = store.history(id).unwrap();
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].outcome(), Some(&Outcome::Succeeded));
        assert!(store.check().unwrap().is_clean());
    }
}
