//! The store's tables, gathered in one place, and the schema version.
//!
//! All leasehold tables are prefixed `leasehold.`; an application that commits its own writes
//! in a leasehold transaction (see [`crate::Transaction`]) must use other names.
//!
//! | table | key | value | holds |
//! |---|---|---|---|
//! | `meta` | name | bytes | schema version, id counter, clock anchor and high-water mark, counters, the last reaper pass |
//! | `jobs` | job id | [`JobRecord`](crate::job::JobRecord) record | every job |
//! | `payloads` | job id | bytes | each job's payload, apart so heartbeats do not rewrite it |
//! | `outputs` | job id | bytes | a succeeded job's output |
//! | `history` | (job, attempt) | [`RunRecord`](crate::job::RunRecord) record | one record per ended attempt |
//! | `ready` | (queue, priority, run_at, job) | () | waiting jobs, in claim order |
//! | `expiry` | (queue, expires_at, job) | () | running jobs, by lease expiry |
//! | `unique` | (queue, key) | job id | keys held by jobs that are not terminal |
//! | `counts` | (queue, state) | count | jobs per queue and state |
//! | `finished` | (finished_at, job) | () | terminal jobs, oldest first (for purging) |
//! | `holders` | job id | (process instance, attempt) | which process holds a running job's lease, when processes share the store |
//! | `instances` | process instance | [`Registration`](crate::redb_store::instance::Registration) record | where each process sharing the store keeps its lock file, and which file that is |
//! | `queues` | queue | [`QueueRecord`](crate::queue::QueueRecord) record | what the store knows of a queue beside its jobs: paused, its limits, its rate window, when a worker last served it |
//! | `schedules` | name | [`ScheduleRecord`](crate::schedule::ScheduleRecord) record | each periodic job's declaration and the cursor of its next tick |
//! | `waits` | (dependency, waiter) | () | which job waits for which (a job's dependencies never change once stored) |
//! | `members` | (group, member) | () | each group's members |
//! | `groups` | group id | [`GroupRecord`](crate::workflow::GroupRecord) record | each group: sealed, its members' counts, when it ended, what waits for it |
//! | `checkpoints` | job id | [`CheckpointRecord`](crate::checkpoint::CheckpointRecord) record | the last checkpoint an attempt of each job saved; added without a new version: a build that does not know it leaves a purged job's checkpoint behind, which is never read |
//! | `logs` | (job, attempt) | [`LogRecord`](crate::job_log::LogRecord) record | the log lines each attempt wrote; added without a new version, as `checkpoints` |
//! | `group_keys` | group key | group id | the key each keyed group was made with ([`NewGroup::key`](crate::NewGroup::key)); added without a new version: a build that does not know it leaves it alone and cannot make it wrong, since no build removes a group |
//! | `keyed` | (queue, limit key, run_at, job) | () | waiting jobs with a limit key, in their key's order, parked or not |
//! | `limit_keys` | (queue, limit key) | [`KeyRecord`](crate::queue::KeyRecord) record | each limit key's running jobs, head and rate window |
//! | `key_gates` | (queue, opens_at, limit key) | () | limit keys whose rate window is spent, by when it has room again (a pure function of `limit_keys`) |
//! | `expiring` | (expires_at, job) | () | waiting and blocked jobs with an expiry ([`NewJob::expires_in`](crate::NewJob::expires_in)), by it: how the reaper finds those nobody claimed |
//! | `endings` | number | [`EndRecord`](crate::endings::EndRecord) record | every end of a job or a group, numbered in the order they committed (`meta`'s `endings.next`), kept until retention purges them (`endings.trimmed`: the last purged) |
//! | `group_ends` | (ended at, or `u64::MAX` while open, group) | () | every group by when it ended, the open ones last (a pure function of `groups`): the stats count the open ones, retention purges the old ones, without reading every group ever made |
//!
//! Every index (`ready`, `expiry`, `unique`, `counts`, `finished`, `keyed`, `expiring`) is a pure function of the
//! job records, maintained only by [`crate::redb_store::index`] and verified by [`crate::ReadJobs::check`].

use redb::TableDefinition;

/// The schema version this build writes and the newest it reads. Version 2 added `holders`;
/// version 3 added `instances`, where processes sharing a store find each other's lock
/// files (an older build, which looked for them by path, must not share a store with this
/// one: it refuses the newer version); version 4 may record an attempt as
/// [`Outcome::FailedPermanently`](crate::Outcome::FailedPermanently) or
/// [`Outcome::TimedOut`](crate::Outcome::TimedOut), writes records in format version 2
/// (time limits, uniqueness windows, metadata; see the codec) and adds `queues`, none of
/// which older builds can read. An older store is upgraded by the first open that writes
/// (its records are read in either format and rewritten as they change); it also adds
/// `schedules`. Version 5 may record an attempt as
/// [`Outcome::NeverStarted`](crate::Outcome::NeverStarted) or
/// [`Outcome::ResultLost`](crate::Outcome::ResultLost). Version 6 writes job records in
/// format version 3 (what a job waits for, its group; the state `Blocked`) and adds
/// `waits`, `members` and `groups`. Version 7 writes records in format version 4 (a
/// retry policy of a job, a queue, a schedule's jobs). Version 8 writes records in format
/// version 5 (limit keys, a queue's per-key limits) and adds `keyed`, `limit_keys` and
/// `key_gates`. Version 9 writes job records in format version 6 (each lease's token, which
/// the fence compares: a build of version 8 would grant leases without one). Version 10
/// writes job records in format version 7 (each job's expiry; the state `Expired`) and adds
/// `expiring`: a build of version 9 would start an expired job. Version 11 writes records in
/// format version 8 (a group's key in its record) and adds `group_ends`, both filled by the
/// upgrade from `groups` and `group_keys`: a build of version 10 would leave an ended group
/// open in it. Version 12 adds `endings`: a build of version 11 would end jobs without them.
pub const SCHEMA_VERSION: u32 = 12;

/// The marker that says "this redb file is a leasehold store".
pub(crate) const MARKER: &[u8] = b"leasehold store";

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("leasehold.meta");
pub(crate) const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.jobs");
pub(crate) const PAYLOADS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.payloads");
pub(crate) const OUTPUTS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.outputs");
pub(crate) const HISTORY: TableDefinition<(u64, u32), &[u8]> =
    TableDefinition::new("leasehold.history");
pub(crate) const READY: TableDefinition<(&str, i32, u64, u64), ()> =
    TableDefinition::new("leasehold.ready");
pub(crate) const EXPIRY: TableDefinition<(&str, u64, u64), ()> =
    TableDefinition::new("leasehold.expiry");
pub(crate) const UNIQUE: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("leasehold.unique");
pub(crate) const COUNTS: TableDefinition<(&str, u8), u64> =
    TableDefinition::new("leasehold.counts");
pub(crate) const FINISHED: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("leasehold.finished");
pub(crate) const HOLDERS: TableDefinition<u64, (u64, u32)> =
    TableDefinition::new("leasehold.holders");
pub(crate) const INSTANCES: TableDefinition<u64, &[u8]> =
    TableDefinition::new("leasehold.instances");
pub(crate) const QUEUES: TableDefinition<&str, &[u8]> = TableDefinition::new("leasehold.queues");
pub(crate) const SCHEDULES: TableDefinition<&str, &[u8]> =
    TableDefinition::new("leasehold.schedules");
pub(crate) const WAITS: TableDefinition<(u64, u64), ()> = TableDefinition::new("leasehold.waits");
pub(crate) const MEMBERS: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("leasehold.members");
pub(crate) const GROUPS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.groups");
pub(crate) const GROUP_KEYS: TableDefinition<&str, u64> =
    TableDefinition::new("leasehold.group_keys");
pub(crate) const CHECKPOINTS: TableDefinition<u64, &[u8]> =
    TableDefinition::new("leasehold.checkpoints");
pub(crate) const LOGS: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("leasehold.logs");
pub(crate) const KEYED: TableDefinition<(&str, &str, u64, u64), ()> =
    TableDefinition::new("leasehold.keyed");
pub(crate) const LIMIT_KEYS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("leasehold.limit_keys");
pub(crate) const KEY_GATES: TableDefinition<(&str, u64, &str), ()> =
    TableDefinition::new("leasehold.key_gates");
pub(crate) const EXPIRING: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("leasehold.expiring");
pub(crate) const GROUP_ENDS: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("leasehold.group_ends");
pub(crate) const ENDINGS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.endings");

/// The schema version `meta` records, if it records a readable one.
pub(crate) fn version_in(
    meta: &impl redb::ReadableTable<&'static str, &'static [u8]>,
) -> Result<Option<u32>, redb::StorageError> {
    let found = meta.get(meta_key::SCHEMA_VERSION)?;
    Ok(found
        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
        .map(u32::from_le_bytes))
}

/// A group's entry in `group_ends`: (when it ended, or `u64::MAX` while it is open, its id).
pub(crate) fn group_end(group: &crate::workflow::GroupRecord) -> (u64, u64) {
    (group.finished_at.map_or(u64::MAX, |t| t.0), group.id.0)
}

/// Keys of the `meta` table.
pub(crate) mod meta_key {
    pub const MARKER: &str = "marker";
    pub const SCHEMA_VERSION: &str = "schema_version";
    pub const NEXT_JOB_ID: &str = "next_job_id";
    pub const NEXT_GROUP_ID: &str = "next_group_id";
    /// The number the next ending is written under.
    pub const NEXT_ENDING: &str = "endings.next";
    /// The number of the last ending retention purged.
    pub const ENDINGS_TRIMMED: &str = "endings.trimmed";
    pub const HIGH_WATER: &str = "clock.high_water";
    pub const ANCHOR: &str = "clock.anchor";
    pub const COUNTERS: &str = "counters";
    /// The last reaper pass ([`crate::ReaperPass`]), rewritten by each.
    pub const REAPER_PASS: &str = "reaper.last_pass";
    /// The process id of the last process that opened the store for writing.
    pub const WRITER_PID: &str = "writer.pid";
    /// How the last writing open shared the file: absent for one writer, `multi-process`
    /// when processes share it (so the tool opens it the same way).
    pub const SHARING: &str = "sharing";
}

/// The `sharing` meta value of a store that processes share.
pub(crate) const MULTI_PROCESS: &[u8] = b"multi-process";
