//! A leasehold write transaction as the protocol sees it: the open tables, the store time the
//! transaction acts at, the store's policy, and the tallies to persist when it commits.

use std::collections::BTreeSet;
use std::time::Duration;

use redb::{ReadableTable, Table, WriteTransaction};

use crate::codec;
use crate::error::{Error, Result};
use crate::ids::{InstanceId, JobId, StoreTime};
use crate::job::JobRecord;
use crate::redb_store::schema::{self, meta_key};
use crate::stats::Counters;

/// The store's policy, fixed at open: the rules' part, the same on every engine, and this
/// handle's process instance.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub rules: crate::protocol::Policy,
    /// This handle's process instance when processes share the store: every lease granted
    /// here is recorded as held by it.
    pub instance: Option<InstanceId>,
}

/// The `keyed` index: waiting jobs with a limit key, by (queue, key, run_at, job).
pub(crate) type KeyedTable<'t> = Table<'t, (&'static str, &'static str, u64, u64), ()>;

/// Every leasehold table, open for writing.
pub(crate) struct Tables<'t> {
    pub meta: Table<'t, &'static str, &'static [u8]>,
    pub jobs: Table<'t, u64, &'static [u8]>,
    pub payloads: Table<'t, u64, &'static [u8]>,
    pub outputs: Table<'t, u64, &'static [u8]>,
    pub history: Table<'t, (u64, u32), &'static [u8]>,
    pub ready: Table<'t, (&'static str, i32, u64, u64), ()>,
    pub expiry: Table<'t, (&'static str, u64, u64), ()>,
    pub unique: Table<'t, (&'static str, &'static str), u64>,
    pub counts: Table<'t, (&'static str, u8), u64>,
    pub finished: Table<'t, (u64, u64), ()>,
    /// Which process instance holds each running lease: open only where leases record one
    /// (processes share the store), so a store used by one process pays nothing for it.
    pub holders: Option<Table<'t, u64, (u64, u32)>>,
    /// The registered process instances, open with `holders`.
    pub instances: Option<Table<'t, u64, &'static [u8]>>,
    /// The queues' records, opened by the first operation that needs one ([`Tables::queues`]).
    queues: Option<Table<'t, &'static str, &'static [u8]>>,
    /// The schedules, opened likewise ([`Tables::schedules`]).
    schedules: Option<Table<'t, &'static str, &'static [u8]>>,
    /// Workflows' tables, opened likewise: (dependency, waiter), (group, member), groups.
    waits: Option<Table<'t, (u64, u64), ()>>,
    members: Option<Table<'t, (u64, u64), ()>>,
    groups: Option<Table<'t, u64, &'static [u8]>>,
    group_keys: Option<Table<'t, &'static str, u64>>,
    checkpoints: Option<Table<'t, u64, &'static [u8]>>,
    logs: Option<Table<'t, (u64, u32), &'static [u8]>>,
    /// Limit keys' index and records, opened likewise.
    keyed: Option<KeyedTable<'t>>,
    limit_keys: Option<Table<'t, (&'static str, &'static str), &'static [u8]>>,
    key_gates: Option<Table<'t, (&'static str, u64, &'static str), ()>>,
    /// Waiting jobs with an expiry, by (expires_at, job) (opened on first use).
    expiring: Option<Table<'t, (u64, u64), ()>>,
    /// Groups by when they ended (opened on first use).
    group_ends: Option<Table<'t, (u64, u64), ()>>,
    /// Every end, numbered (opened on first use), and the next number (read on first use,
    /// written once by [`Tx::persist`]).
    endings: Option<Table<'t, u64, &'static [u8]>>,
    next_ending: Option<u64>,
    txn: &'t WriteTransaction,
}

impl<'t> Tables<'t> {
    /// Opens the tables; `holders` only `with_holders`.
    pub(crate) fn open(txn: &'t WriteTransaction, with_holders: bool) -> Result<Tables<'t>> {
        Ok(Tables {
            meta: txn.open_table(schema::META)?,
            jobs: txn.open_table(schema::JOBS)?,
            payloads: txn.open_table(schema::PAYLOADS)?,
            outputs: txn.open_table(schema::OUTPUTS)?,
            history: txn.open_table(schema::HISTORY)?,
            ready: txn.open_table(schema::READY)?,
            expiry: txn.open_table(schema::EXPIRY)?,
            unique: txn.open_table(schema::UNIQUE)?,
            counts: txn.open_table(schema::COUNTS)?,
            finished: txn.open_table(schema::FINISHED)?,
            holders: match with_holders {
                true => Some(txn.open_table(schema::HOLDERS)?),
                false => None,
            },
            instances: match with_holders {
                true => Some(txn.open_table(schema::INSTANCES)?),
                false => None,
            },
            queues: None,
            schedules: None,
            waits: None,
            members: None,
            groups: None,
            group_keys: None,
            checkpoints: None,
            logs: None,
            keyed: None,
            limit_keys: None,
            key_gates: None,
            expiring: None,
            group_ends: None,
            endings: None,
            next_ending: None,
            txn,
        })
    }

    /// The write transaction the tables are open in: for the application's writes that a
    /// completion in a group carries ([`crate::redb_store::app_transaction::Transaction`]).
    pub(crate) fn txn(&self) -> &'t WriteTransaction {
        self.txn
    }

    /// The queues' records, open for writing (opened on first use: most transactions touch
    /// none).
    pub(crate) fn queues(&mut self) -> Result<&mut Table<'t, &'static str, &'static [u8]>> {
        opened(&mut self.queues, self.txn, schema::QUEUES)
    }

    /// The schedules, open for writing (opened on first use).
    pub(crate) fn schedules(&mut self) -> Result<&mut Table<'t, &'static str, &'static [u8]>> {
        opened(&mut self.schedules, self.txn, schema::SCHEDULES)
    }

    /// Which job waits for which, by (dependency, waiter) (opened on first use).
    pub(crate) fn waits(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        opened(&mut self.waits, self.txn, schema::WAITS)
    }

    /// Each group's members, by (group, member) (opened on first use).
    pub(crate) fn members(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        opened(&mut self.members, self.txn, schema::MEMBERS)
    }

    /// The groups' records (opened on first use).
    pub(crate) fn groups(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>> {
        opened(&mut self.groups, self.txn, schema::GROUPS)
    }

    /// Each job's last checkpoint (opened on first use).
    pub(crate) fn checkpoints(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>> {
        opened(&mut self.checkpoints, self.txn, schema::CHECKPOINTS)
    }

    /// Each attempt's log lines, by (job, attempt) (opened on first use).
    pub(crate) fn logs(&mut self) -> Result<&mut Table<'t, (u64, u32), &'static [u8]>> {
        opened(&mut self.logs, self.txn, schema::LOGS)
    }

    /// The keyed groups' ids, by key (opened on first use).
    pub(crate) fn group_keys(&mut self) -> Result<&mut Table<'t, &'static str, u64>> {
        opened(&mut self.group_keys, self.txn, schema::GROUP_KEYS)
    }

    /// Waiting jobs with a limit key, by (queue, key, run_at, job) (opened on first use).
    pub(crate) fn keyed(&mut self) -> Result<&mut KeyedTable<'t>> {
        opened(&mut self.keyed, self.txn, schema::KEYED)
    }

    /// Limit keys' records, by (queue, key) (opened on first use).
    pub(crate) fn limit_keys(
        &mut self,
    ) -> Result<&mut Table<'t, (&'static str, &'static str), &'static [u8]>> {
        opened(&mut self.limit_keys, self.txn, schema::LIMIT_KEYS)
    }

    /// Limit keys whose rate window is spent, by (queue, opens_at, key) (opened on first
    /// use).
    pub(crate) fn key_gates(
        &mut self,
    ) -> Result<&mut Table<'t, (&'static str, u64, &'static str), ()>> {
        opened(&mut self.key_gates, self.txn, schema::KEY_GATES)
    }

    /// Waiting and blocked jobs with an expiry, by (expires_at, job) (opened on first use).
    pub(crate) fn expiring(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        opened(&mut self.expiring, self.txn, schema::EXPIRING)
    }

    /// Every end, numbered in the order they commit (opened on first use).
    pub(crate) fn endings(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>> {
        opened(&mut self.endings, self.txn, schema::ENDINGS)
    }

    /// Keeps `ending` under the next number (one writer at a time: the order of commit).
    pub(crate) fn note_ending(&mut self, ending: &crate::endings::EndRecord) -> Result<()> {
        let seq = match self.next_ending {
            Some(seq) => seq,
            None => read_u64(&self.meta, meta_key::NEXT_ENDING)?.unwrap_or(1),
        };
        self.next_ending = Some(seq + 1);
        self.endings()?
            .insert(seq, codec::encode(ending).as_slice())?;
        Ok(())
    }

    /// Groups by (when they ended, or `u64::MAX` while open, id) (opened on first use).
    pub(crate) fn group_ends(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        opened(&mut self.group_ends, self.txn, schema::GROUP_ENDS)
    }

    /// Records where `instance` keeps its lock file (its first registration, or a new file).
    pub(crate) fn register_instance(
        &mut self,
        instance: InstanceId,
        registration: &crate::redb_store::instance::Registration,
    ) -> Result<()> {
        if let Some(instances) = &mut self.instances {
            instances.insert(instance.0, codec::encode(registration).as_slice())?;
        }
        Ok(())
    }

    /// Forgets `instance`: it retired, or it died and its leases are back.
    pub(crate) fn forget_instance(&mut self, instance: InstanceId) -> Result<()> {
        if let Some(instances) = &mut self.instances {
            instances.remove(instance.0)?;
        }
        Ok(())
    }

    /// Records that `instance` holds `job`'s lease at `attempt` (when holders are kept).
    pub(crate) fn hold(&mut self, job: JobId, instance: InstanceId, attempt: u32) -> Result<()> {
        if let Some(holders) = &mut self.holders {
            holders.insert(job.0, (instance.0, attempt))?;
        }
        Ok(())
    }

    /// Forgets who held `job`'s lease: its attempt ended.
    pub(crate) fn unhold(&mut self, job: JobId) -> Result<()> {
        if let Some(holders) = &mut self.holders {
            holders.remove(job.0)?;
        }
        Ok(())
    }

    /// Loads a job record; `None` if there is none.
    pub(crate) fn job(&self, id: JobId) -> Result<Option<JobRecord>> {
        match self.jobs.get(id.0)? {
            Some(bytes) => decode_job(bytes.value()).map(Some),
            None => Ok(None),
        }
    }
}

pub(crate) fn decode_job(bytes: &[u8]) -> Result<JobRecord> {
    codec::decode_job(bytes).map_err(|e| Error::Corrupt(format!("job record: {e}")))
}

/// What a transaction adds to the persisted counters and clock high-water mark.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    pub counters: Counters,
    pub high_water: StoreTime,
    /// Queues that gained a waiting job: their idle workers are woken after the commit.
    pub readied: BTreeSet<String>,
    /// Changes to the per-(queue, state) counts, applied once at the end of the transaction.
    pub counts: Vec<(String, u8, i64)>,
    /// How many job records were written or deleted (an operation that fails after writing
    /// poisons a shared transaction; see group commit).
    pub writes: u64,
    /// Whether the transaction kept an ending: its followers are told after the commit.
    pub ended: bool,
}

impl Tally {
    /// Whether the counters changed (a refused write still has to record that it was refused).
    pub(crate) fn counts_anything(&self) -> bool {
        self.counters != Counters::default()
    }

    /// Whether the transaction changed anything worth a commit (a claim that found nothing
    /// did not, and is rolled back instead of paying for an fsync).
    pub(crate) fn changed(&self) -> bool {
        self.writes > 0 || self.counts_anything()
    }

    /// Notes a change of one job to a (queue, state) count.
    pub(crate) fn count(&mut self, (queue, state): (&str, u8), delta: i64) {
        match self
            .counts
            .iter_mut()
            .find(|(q, s, _)| *s == state && q == queue)
        {
            Some(entry) => entry.2 += delta,
            None => self.counts.push((queue.to_owned(), state, delta)),
        }
    }

    /// What this transaction has changed so far of the count of (queue, state) (applied to
    /// the `counts` table only when it commits).
    pub(crate) fn pending(&self, queue: &str, state: u8) -> i64 {
        self.counts
            .iter()
            .filter(|(q, s, _)| *s == state && q == queue)
            .map(|(_, _, delta)| *delta)
            .sum()
    }

    /// Notes a time the store wrote, so the clock never resumes below it.
    pub(crate) fn wrote_time(&mut self, t: StoreTime) {
        self.high_water = self.high_water.max(t);
    }

    /// Adds what a rule counted.
    pub(crate) fn add(&mut self, counts: &Counters) {
        self.counters.add(counts);
    }
}

/// A write transaction at one instant of store time.
pub(crate) struct Tx<'t> {
    pub now: StoreTime,
    pub tables: Tables<'t>,
    pub policy: &'t Policy,
    pub tally: Tally,
    /// Its events, for the subscribers once it commits.
    pub events: crate::events::Pending,
    /// The next job id, once this transaction has read the counter: written back once, at
    /// [`Tx::persist`], not once per enqueued job.
    next_id: Option<u64>,
}

impl<'t> Tx<'t> {
    pub(crate) fn open(
        txn: &'t WriteTransaction,
        now: StoreTime,
        policy: &'t Policy,
    ) -> Result<Tx<'t>> {
        let mut tally = Tally::default();
        tally.wrote_time(now);
        Ok(Tx {
            now,
            tables: Tables::open(txn, policy.instance.is_some())?,
            policy,
            tally,
            events: Default::default(),
            next_id: None,
        })
    }

    /// Writes what the transaction accumulated: counts, counters, the clock's high-water mark.
    pub(crate) fn persist(&mut self) -> Result<()> {
        if let Some(next) = self.next_id {
            write_u64(&mut self.tables.meta, meta_key::NEXT_JOB_ID, next)?;
        }
        if let Some(next) = self.tables.next_ending {
            write_u64(&mut self.tables.meta, meta_key::NEXT_ENDING, next)?;
            // (the number is read at the first ending only)
            self.tally.ended = true;
        }
        apply_counts(&mut self.tables, &self.tally.counts)?;
        persist_tally(&mut self.tables.meta, &self.tally)
    }

    /// How many jobs of `queue` are in `state` as of this transaction (the table, and what
    /// the transaction changed so far).
    pub(crate) fn count(&self, queue: &str, state: crate::state::JobState) -> Result<u64> {
        let stored = self
            .tables
            .counts
            .get((queue, state.code()))?
            .map_or(0, |v| v.value());
        Ok(stored.saturating_add_signed(self.tally.pending(queue, state.code())))
    }

    /// Allocates the next job id from the persisted counter (read once per transaction).
    pub(crate) fn next_job_id(&mut self) -> Result<JobId> {
        let next = match self.next_id {
            Some(next) => next,
            None => read_u64(&self.tables.meta, meta_key::NEXT_JOB_ID)?.unwrap_or(1),
        };
        self.next_id = Some(next + 1);
        Ok(JobId(next))
    }
}

/// Records the reaper pass `pass` as the store's last.
pub(crate) fn note_reaper_pass(tx: &mut Tx<'_>, pass: &crate::report::ReaperPass) -> Result<()> {
    tx.tables
        .meta
        .insert(meta_key::REAPER_PASS, codec::encode(pass).as_slice())?;
    tx.tally.writes += 1;
    Ok(())
}

/// How far ahead of what it must cover the high-water mark is written.
pub(crate) const HIGH_WATER_MARGIN: Duration = Duration::from_secs(10);

/// Adds `tally` to the persisted counters and raises the persisted high-water mark.
pub(crate) fn persist_tally(
    meta: &mut Table<'_, &'static str, &'static [u8]>,
    tally: &Tally,
) -> Result<()> {
    let hw = read_u64(meta, meta_key::HIGH_WATER)?.unwrap_or(0);
    if tally.high_water.0 > hw {
        // Written ahead by a margin, so that most commits (whose lease expiries creep forward
        // with the clock) find the mark already high enough and write nothing here. The mark
        // only matters after a reboot, where resuming up to the margin later than needed
        // merely runs delayed jobs that much sooner.
        let ahead = tally.high_water.saturating_add(HIGH_WATER_MARGIN);
        write_u64(meta, meta_key::HIGH_WATER, ahead.0)?;
    }
    if tally.counts_anything() {
        let mut c: Counters = match meta.get(meta_key::COUNTERS)? {
            Some(b) => codec::decode_counters(b.value())
                .map_err(|e| Error::Corrupt(format!("counters: {e}")))?,
            None => Counters::default(),
        };
        c.add(&tally.counters);
        meta.insert(meta_key::COUNTERS, codec::encode_counters(&c).as_slice())?;
    }
    Ok(())
}

pub(crate) fn read_u64(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<u64>> {
    match meta.get(key)? {
        Some(b) => {
            let arr: [u8; 8] = b
                .value()
                .try_into()
                .map_err(|_| Error::Corrupt(format!("meta value {key} is not 8 bytes")))?;
            Ok(Some(u64::from_le_bytes(arr)))
        }
        None => Ok(None),
    }
}

pub(crate) fn write_u64(
    meta: &mut Table<'_, &'static str, &'static [u8]>,
    key: &str,
    v: u64,
) -> Result<()> {
    meta.insert(key, v.to_le_bytes().as_slice())?;
    Ok(())
}

/// Applies the transaction's count changes to the `counts` index, once per (queue, state)
/// rather than once per job: a batch that claims a thousand jobs writes two counts, not two
/// thousand.
fn apply_counts(t: &mut Tables<'_>, deltas: &[(String, u8, i64)]) -> Result<()> {
    for (q, s, delta) in deltas {
        if *delta == 0 {
            continue;
        }
        let key = (q.as_str(), *s);
        let current = t.counts.get(key)?.map(|v| v.value()).unwrap_or(0);
        let next = current.saturating_add_signed(*delta);
        if next == 0 {
            t.counts.remove(key)?;
        } else {
            t.counts.insert(key, next)?;
        }
    }
    Ok(())
}

/// The record of job `id`, which an index named: its absence is corruption.
pub(crate) fn load(tx: &Tx<'_>, id: JobId) -> Result<JobRecord> {
    tx.tables
        .job(id)?
        .ok_or_else(|| Error::Corrupt(format!("an index names job {id}, which has no record")))
}

/// The table in `slot`, opened in `txn` on first use.
fn opened<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'s mut Option<Table<'t, K, V>>,
    txn: &'t WriteTransaction,
    table: redb::TableDefinition<'static, K, V>,
) -> Result<&'s mut Table<'t, K, V>> {
    if slot.is_none() {
        *slot = Some(txn.open_table(table)?);
    }
    slot.as_mut()
        .ok_or(Error::Internal("a table opened on first use did not open"))
}
