//! The integrity check: recomputes every index from the job records and compares.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable};

use crate::codec;
use crate::error::{Error, Result};
use crate::job::RunRecord;
use crate::queue::KeyRecord;
use crate::redb_store::index::entries;
use crate::redb_store::reading::optional;
use crate::redb_store::schema;
use crate::redb_store::writing::decode_job;
use crate::report::CheckReport;
use crate::state::JobState;
use crate::workflow::GroupRecord;

type Ready = BTreeMap<(String, i32, u64, u64), ()>;
type Expiry = BTreeMap<(String, u64, u64), ()>;

pub(crate) fn check(read: &ReadTransaction) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let mut ready: Ready = BTreeMap::new();
    let mut expiry: Expiry = BTreeMap::new();
    let mut unique: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut finished: BTreeMap<(u64, u64), ()> = BTreeMap::new();
    let mut counts: BTreeMap<(String, u8), u64> = BTreeMap::new();
    let mut attempts: BTreeMap<u64, (u32, JobState)> = BTreeMap::new();
    let mut keyed: BTreeMap<(String, String, u64, u64), ()> = BTreeMap::new();
    let mut expiring: BTreeMap<(u64, u64), ()> = BTreeMap::new();
    let mut keys: BTreeMap<(String, String), KeyRecord> = BTreeMap::new();
    let problems = &mut report.problems;
    let mut history = history(read, problems)?;

    let jobs = read.open_table(schema::JOBS)?;
    let payloads = read.open_table(schema::PAYLOADS)?;
    for entry in jobs.iter()? {
        let (k, v) = entry?;
        let id = k.value();
        report.jobs += 1;
        let job = match decode_job(v.value()) {
            Ok(j) => j,
            Err(e) => {
                problems.push(format!("job {id}: {e}"));
                continue;
            }
        };
        if job.id.0 != id {
            problems.push(format!("job stored under {id} says it is {}", job.id));
        }
        let runs = history.remove(&id).unwrap_or_default();
        crate::rules::check_job(&job, &runs, problems);
        if payloads.get(id)?.is_none() {
            problems.push(format!("job {id} has no payload"));
        }
        let e = entries(&job);
        if let Some((q, p, r, i)) = e.ready {
            ready.insert((q.to_owned(), p, r, i), ());
        }
        if let Some((q, x, i)) = e.expiry {
            expiry.insert((q.to_owned(), x, i), ());
        }
        if let Some((q, k)) = e.unique
            && let Some(other) = unique.insert((q.to_owned(), k.to_owned()), id)
        {
            problems.push(format!(
                "jobs {other} and {id} both hold unique key {k:?} in {q}"
            ));
        }
        if let Some(f) = e.finished {
            finished.insert(f, ());
        }
        *counts.entry((e.count.0.to_owned(), e.count.1)).or_default() += 1;
        if let Some((q, k, r, i)) = e.keyed {
            keyed.insert((q.to_owned(), k.to_owned(), r, i), ());
        }
        if let Some(key) = e.expiring {
            expiring.insert(key, ());
        }
        if let Some(limit) = &job.limit {
            let key = keys
                .entry((job.queue.clone(), limit.key.clone()))
                .or_default();
            key.running += u32::from(job.state == JobState::Running);
            if crate::rules::in_claim_order(&job)
                && let Some(other) = key.head.replace(job.id)
            {
                problems.push(format!(
                    "jobs {other} and {id} are both heads of limit key {:?}",
                    limit.key
                ));
            }
        }
        attempts.insert(id, (job.attempt.0, job.state));
    }

    check_holders(read, &attempts, problems)?;
    let found = stored(read, schema::READY, |(q, p, r, id), ()| {
        ((q.to_owned(), p, r, id), ())
    })?;
    compare(problems, "ready", &ready, &found);
    let found = stored(read, schema::EXPIRY, |(q, x, id), ()| {
        ((q.to_owned(), x, id), ())
    })?;
    compare(problems, "expiry", &expiry, &found);
    let found = stored(read, schema::FINISHED, |k, ()| (k, ()))?;
    compare(problems, "finished", &finished, &found);
    let found = stored(read, schema::UNIQUE, |(q, k), v| {
        ((q.to_owned(), k.to_owned()), v)
    })?;
    compare(problems, "unique", &unique, &found);
    let found = stored(read, schema::COUNTS, |(q, s), v| ((q.to_owned(), s), v))?;
    compare(problems, "counts", &counts, &found);
    let found = match optional(read, schema::KEYED)? {
        Some(_) => stored(read, schema::KEYED, |(q, k, r, id), ()| {
            ((q.to_owned(), k.to_owned(), r, id), ())
        })?,
        None => BTreeMap::new(),
    };
    compare(problems, "keyed", &keyed, &found);
    let found = match optional(read, schema::EXPIRING)? {
        Some(_) => stored(read, schema::EXPIRING, |k, ()| (k, ()))?,
        None => BTreeMap::new(),
    };
    compare(problems, "expiring", &expiring, &found);
    // A key's record is checked for its running count and its head (its rate window is
    // its own: no job record implies it), and `key_gates` against the records.
    keys.retain(|_, key| !key.is_empty());
    let gates = std::cell::RefCell::new(BTreeMap::new());
    let found = match optional(read, schema::LIMIT_KEYS)? {
        Some(_) => stored(read, schema::LIMIT_KEYS, |(q, k), v| {
            let record = codec::decode::<KeyRecord>(v).unwrap_or(KeyRecord {
                running: u32::MAX,
                ..KeyRecord::default()
            });
            if let Some(at) = record.opens_at {
                gates
                    .borrow_mut()
                    .insert((q.to_owned(), at.0, k.to_owned()), ());
            }
            let counted = KeyRecord {
                running: record.running,
                head: record.head,
                ..KeyRecord::default()
            };
            ((q.to_owned(), k.to_owned()), counted)
        })?,
        None => BTreeMap::new(),
    };
    let found = found.into_iter().filter(|(_, k)| !k.is_empty()).collect();
    compare(problems, "limit keys", &keys, &found);
    let found = match optional(read, schema::KEY_GATES)? {
        Some(_) => stored(read, schema::KEY_GATES, |(q, at, k), ()| {
            ((q.to_owned(), at, k.to_owned()), ())
        })?,
        None => BTreeMap::new(),
    };
    compare(problems, "key gates", &gates.into_inner(), &found);
    // `group_ends` against the groups' records (a file an older build wrote has none).
    if let Some(groups) = optional(read, schema::GROUPS)?
        && optional(read, schema::GROUP_ENDS)?.is_some()
    {
        let mut ends = BTreeMap::new();
        for entry in groups.iter()? {
            let (id, bytes) = entry?;
            match codec::decode_stored::<GroupRecord>(Some(bytes.value()), String::new) {
                Ok(g) => ends.extend(g.map(|g| (schema::group_end(&g), ()))),
                Err(e) => problems.push(format!("group {}: {e}", id.value())),
            }
        }
        let found = stored(read, schema::GROUP_ENDS, |k, ()| (k, ()))?;
        compare(problems, "group ends", &ends, &found);
    }

    for id in history.keys() {
        problems.push(format!("history for job {id}, which does not exist"));
    }
    for table in [schema::PAYLOADS, schema::OUTPUTS] {
        for entry in read.open_table(table)?.iter()? {
            let id = entry?.0.value();
            if !attempts.contains_key(&id) {
                problems.push(format!("bytes stored for job {id}, which does not exist"));
            }
        }
    }
    Ok(report)
}

/// Every readable history record, by job and attempt.
fn history(
    read: &ReadTransaction,
    problems: &mut Vec<String>,
) -> Result<BTreeMap<u64, Vec<(u32, RunRecord)>>> {
    let mut seen: BTreeMap<u64, Vec<(u32, RunRecord)>> = BTreeMap::new();
    for entry in read.open_table(schema::HISTORY)?.iter()? {
        let (k, v) = entry?;
        let (id, attempt) = k.value();
        match codec::decode::<RunRecord>(v.value()) {
            Ok(run) => seen.entry(id).or_default().push((attempt, run)),
            Err(e) => problems.push(format!("history of job {id} attempt {attempt}: {e}")),
        }
    }
    Ok(seen)
}

/// Every entry of `table`, made owned by `own`.
fn stored<K: redb::Key + 'static, V: redb::Value + 'static, T: Ord, U>(
    read: &ReadTransaction,
    table: redb::TableDefinition<K, V>,
    own: impl Fn(K::SelfType<'_>, V::SelfType<'_>) -> (T, U),
) -> Result<BTreeMap<T, U>> {
    let mut entries = BTreeMap::new();
    for entry in read.open_table(table)?.iter()? {
        let (k, v) = entry?;
        let (key, value) = own(k.value(), v.value());
        entries.insert(key, value);
    }
    Ok(entries)
}

fn compare<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    problems: &mut Vec<String>,
    name: &str,
    expected: &BTreeMap<K, V>,
    stored: &BTreeMap<K, V>,
) {
    for (k, v) in expected {
        match stored.get(k) {
            Some(s) if s == v => {}
            other => problems.push(format!("{name} index: {k:?} should be {v:?}, is {other:?}")),
        }
    }
    for k in stored.keys() {
        if !expected.contains_key(k) {
            problems.push(format!("{name} index has {k:?}, which no record implies"));
        }
    }
}

/// Every `holders` entry names a running job at the attempt it records (a store written
/// before the table existed has none).
fn check_holders(
    read: &ReadTransaction,
    attempts: &BTreeMap<u64, (u32, JobState)>,
    problems: &mut Vec<String>,
) -> Result<()> {
    let Some(holders) = crate::redb_store::reading::optional(read, schema::HOLDERS)? else {
        return Ok(());
    };
    if let Err(Error::Corrupt(e)) = crate::redb_store::reading::registrations(read) {
        problems.push(format!("a registered process instance is unreadable: {e}"));
    }
    for entry in holders.iter()? {
        let (job, holder) = entry?;
        let (job, (instance, attempt)) = (job.value(), holder.value());
        if attempts.get(&job) != Some(&(attempt, JobState::Running)) {
            problems.push(format!(
                "holders says process instance {instance:016x} holds job {job} attempt {attempt}, \
                 which is not running at that attempt"
            ));
        }
    }
    Ok(())
}
