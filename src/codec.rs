//! The one place records become bytes and back.
//!
//! Every stored value starts with a format-version byte, followed by the bincode 2 encoding
//! of the record. Swapping the codec (or evolving a record) means a new version byte here and
//! a decoder for the old one; nothing outside this module knows how records are encoded.
//!
//! Decoding is defensive: bytes that are not a valid record (a damaged or foreign file, or a
//! fuzzer) give a [`CodecError`], never a panic, and a length prefix cannot make the decoder
//! allocate more than [`DECODE_LIMIT`].

use bincode::config::{self, Configuration, Limit};
use bincode::{Decode, Encode};

use crate::ids::{Attempt, JobId, StoreTime};
use crate::job::{JobRecord, LeaseRecord, Uniqueness};
use crate::state::JobState;

/// The current format version byte. Version 2 changed the job record (a lease's deadline,
/// the key's uniqueness window, a job's own time limit, its metadata); version 3 appended
/// its part in workflows ([`crate::workflow::Flow`]) and may name the state `Blocked`;
/// version 4 appended a retry policy to the records of jobs, queues and schedules; version
/// 5 appended a limit key to the records of jobs and schedules, and a per-key limit to a
/// queue's limits ([`decode_job`], [`decode_queue`], [`decode_schedule`]); version 6
/// appended its lease's token to a job's record; version 7 appended its expiry, and may
/// name the state `Expired`, appended a group's parent and subgroups to its record, and its
/// jobs' expiry to a schedule's; version 8 appended its key to a group's record. Every other
/// record is encoded as in version 1, so for them all versions decode alike.
pub const FORMAT_VERSION: u8 = 8;

/// The version before workflows, whose job records end where [`JobRecord::flow`] begins.
const BEFORE_FLOW: u8 = 2;

/// The version before retry policies, whose records of jobs, queues and schedules end where
/// their `retry` begins.
const BEFORE_RETRY: u8 = 3;

/// The version before limit keys, whose records of jobs and schedules end where their limit
/// key begins, and whose queue limits have no per-key limit.
const BEFORE_KEYS: u8 = 4;

/// The version before lease tokens, whose job records end where their token begins.
const BEFORE_TOKEN: u8 = 5;

/// The version before expiries, whose job records end where their expiry begins.
const BEFORE_EXPIRY: u8 = 6;

/// The version before groups' keys in their records, whose group records end where their
/// key begins.
const BEFORE_GROUP_KEY: u8 = 7;

/// The first format version, still read.
const FIRST_VERSION: u8 = 1;

/// The most a single decoded record may allocate.
pub const DECODE_LIMIT: usize = 64 << 20;

fn config() -> Configuration<config::LittleEndian, config::Varint, Limit<DECODE_LIMIT>> {
    config::standard().with_limit::<DECODE_LIMIT>()
}

/// Why bytes could not be decoded into a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// No bytes at all.
    #[error("empty record")]
    Empty,
    /// A version byte this build does not know.
    #[error("unknown record format version {0}")]
    UnknownVersion(u8),
    /// The body is not a valid record.
    #[error("malformed record: {0}")]
    Malformed(String),
    /// A valid record followed by extra bytes.
    #[error("{0} trailing bytes after record")]
    Trailing(usize),
}

/// Encodes `value` with the current format version.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    // Room for a typical record up front: growing from one byte reallocates several times,
    // and records are encoded on every write.
    let mut out = Vec::with_capacity(128);
    out.push(FORMAT_VERSION);
    // Encoding into a Vec fails only if the writer fails, which a Vec never does, or if a
    // value exceeds the limit, which the store's input checks keep far away.
    if let Err(e) = bincode::encode_into_std_write(value, &mut out, config()) {
        tracing::error!(error = %e, "record encoding failed");
    }
    out
}

/// Decodes a record written by [`encode`].
pub fn decode<T: Decode<()>>(bytes: &[u8]) -> Result<T, CodecError> {
    let (_, body) = split(bytes)?;
    decode_body(body)
}

/// The version byte, known to this build, and the body after it.
fn split(bytes: &[u8]) -> Result<(u8, &[u8]), CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if !(FIRST_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(CodecError::UnknownVersion(version));
    }
    Ok((version, body))
}

/// A record kept under its own key (a group, a checkpoint, a log): how its bytes of any
/// version decode. One whose shape never changed decodes as [`decode`] does.
pub(crate) trait Stored: Decode<()> {
    fn from_stored(bytes: &[u8]) -> Result<Self, CodecError> {
        decode(bytes)
    }
}

impl Stored for crate::checkpoint::CheckpointRecord {}
impl Stored for crate::job_log::LogRecord {}
impl Stored for crate::endings::EndRecord {}

/// A group's record: one of a version before 7 reads as one in no group, with none in it;
/// one before 8 as one without a key.
impl Stored for crate::workflow::GroupRecord {
    fn from_stored(bytes: &[u8]) -> Result<Self, CodecError> {
        let (version, body) = split(bytes)?;
        let parent = || encode(&None::<crate::ids::GroupId>);
        let subgroups = || encode(&Vec::<crate::ids::GroupId>::new());
        let key = || encode(&None::<String>);
        decode_appended(
            version,
            body,
            &[
                (BEFORE_EXPIRY, &parent),
                (BEFORE_EXPIRY, &subgroups),
                (BEFORE_GROUP_KEY, &key),
            ],
        )
    }
}

/// Decodes the stored record of `what` (as an error names it: "the checkpoint of job 7"),
/// if there is one: bytes that are not such a record are [`crate::Error::Corrupt`].
pub(crate) fn decode_stored<T: Stored>(
    bytes: Option<&[u8]>,
    what: impl FnOnce() -> String,
) -> crate::error::Result<Option<T>> {
    bytes
        .map(|b| {
            T::from_stored(b).map_err(|e| crate::error::Error::Corrupt(format!("{}: {e}", what())))
        })
        .transpose()
}

fn decode_body<T: Decode<()>>(body: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::decode_from_slice(body, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    Ok(value)
}

/// A job record, in this build's shape or in version 1's (read, and written back in this
/// shape the next time the job changes).
pub(crate) fn decode_job(bytes: &[u8]) -> Result<JobRecord, CodecError> {
    match split(bytes)? {
        (FIRST_VERSION, body) => decode_body::<JobRecordV1>(body).map(JobRecord::from),
        (version, body) => {
            let flow = || encode(&crate::workflow::Flow::default());
            let retry = || encode(&None::<crate::retry::RetryPolicy>);
            let key = || encode(&None::<crate::job::LimitKey>);
            let token = || encode(&crate::ids::LeaseToken::NONE);
            let expiry = || encode(&None::<StoreTime>);
            decode_appended(
                version,
                body,
                &[
                    (BEFORE_FLOW, &flow),
                    (BEFORE_RETRY, &retry),
                    (BEFORE_KEYS, &key),
                    (BEFORE_TOKEN, &token),
                    (BEFORE_EXPIRY, &expiry),
                ],
            )
        }
    }
}

/// A schedule's record: one of an older version reads as one without the fields appended
/// since (a retry policy, a limit key for its jobs).
pub(crate) fn decode_schedule(bytes: &[u8]) -> Result<crate::schedule::ScheduleRecord, CodecError> {
    let (version, body) = split(bytes)?;
    let retry = || encode(&None::<crate::retry::RetryPolicy>);
    let key = || encode(&None::<String>);
    let expires = || encode(&None::<std::time::Duration>);
    decode_appended(
        version,
        body,
        &[
            (BEFORE_RETRY, &retry),
            (BEFORE_KEYS, &key),
            (BEFORE_EXPIRY, &expires),
        ],
    )
}

/// A queue's record: one of an older version reads as one without a retry policy (before
/// version 4) and with no per-key limit (before version 5).
pub(crate) fn decode_queue(bytes: &[u8]) -> Result<crate::queue::QueueRecord, CodecError> {
    use crate::queue::{QueueLimits, QueueRecord};
    match split(bytes)? {
        (version, body) if version <= BEFORE_KEYS => {
            let retry = || encode(&None::<crate::retry::RetryPolicy>);
            let old: QueueRecordV4 = decode_appended(version, body, &[(BEFORE_RETRY, &retry)])?;
            Ok(QueueRecord {
                served_at: old.served_at,
                paused: old.paused,
                limits: QueueLimits {
                    concurrency: old.concurrency,
                    rate: old.rate,
                    per_key: None,
                    per_key_rate: None,
                },
                recent_claims: old.recent_claims,
                retry: old.retry,
            })
        }
        (_, body) => decode_body(body),
    }
}

/// A queue's record as versions 1 to 4 stored it: limits without a per-key one.
#[derive(Decode)]
#[cfg_attr(test, derive(Encode))]
struct QueueRecordV4 {
    served_at: Option<StoreTime>,
    paused: bool,
    concurrency: Option<u32>,
    rate: Option<crate::queue::Rate>,
    recent_claims: Vec<StoreTime>,
    retry: Option<crate::retry::RetryPolicy>,
}

/// The encoding of a field's default, as [`encode`] gives it (its version byte first).
type Field<'a> = &'a dyn Fn() -> Vec<u8>;

/// A record of `version` whose body ends before the fields appended since: each field of
/// `appended` (the last version without it, its default) that `version` lacks reads as its
/// default. (A record's fields are encoded one after the other, so an older record followed
/// by the encodings of the newer fields' defaults is this version's record with them.)
fn decode_appended<T: Decode<()>>(
    version: u8,
    body: &[u8],
    appended: &[(u8, Field<'_>)],
) -> Result<T, CodecError> {
    if appended.iter().all(|(before, _)| version > *before) {
        return decode_body(body);
    }
    let mut whole = body.to_vec();
    for (before, default) in appended {
        if version <= *before {
            whole.extend_from_slice(&default()[1..]);
        }
    }
    decode_body(&whole)
}

/// A lease as version 1 stored it: no deadline.
#[derive(Decode)]
#[cfg_attr(test, derive(Encode))]
struct LeaseRecordV1 {
    owner: String,
    claimed_at: StoreTime,
    expires_at: StoreTime,
    indexed_expiry: StoreTime,
    length: std::time::Duration,
    stall_timeout: Option<std::time::Duration>,
}

/// A job as version 1 stored it: no uniqueness window, time limit or metadata.
#[derive(Decode)]
#[cfg_attr(test, derive(Encode))]
struct JobRecordV1 {
    id: JobId,
    queue: String,
    state: JobState,
    priority: i32,
    attempt: Attempt,
    failures: u32,
    max_attempts: u32,
    unique_key: Option<String>,
    created_at: StoreTime,
    run_at: StoreTime,
    lease: Option<LeaseRecordV1>,
    progress: u64,
    progress_at: StoreTime,
    cancel_requested: bool,
    last_error: Option<String>,
    finished_at: Option<StoreTime>,
    updated_at: StoreTime,
}

impl From<JobRecordV1> for JobRecord {
    fn from(v1: JobRecordV1) -> JobRecord {
        JobRecord {
            id: v1.id,
            queue: v1.queue,
            state: v1.state,
            priority: v1.priority,
            attempt: v1.attempt,
            failures: v1.failures,
            max_attempts: v1.max_attempts,
            unique_key: v1.unique_key,
            created_at: v1.created_at,
            run_at: v1.run_at,
            lease: v1.lease.map(|l| LeaseRecord {
                owner: l.owner,
                claimed_at: l.claimed_at,
                expires_at: l.expires_at,
                indexed_expiry: l.indexed_expiry,
                length: l.length,
                stall_timeout: l.stall_timeout,
                deadline: None,
            }),
            progress: v1.progress,
            progress_at: v1.progress_at,
            cancel_requested: v1.cancel_requested,
            last_error: v1.last_error,
            finished_at: v1.finished_at,
            updated_at: v1.updated_at,
            uniqueness: Uniqueness::WhileUnfinished,
            key_released: false,
            time_limit: None,
            metadata: Vec::new(),
            flow: Default::default(),
            retry: None,
            limit: None,
            token: crate::ids::LeaseToken::NONE,
            expires_at: None,
        }
    }
}

/// The counters as stored since format version 2: by name, so that a counter added later
/// reads as zero from an older store and a newer build's counters survive this one.
#[derive(Encode, Decode)]
struct StoredCounters {
    named: Vec<(String, u64)>,
    worst_detection_delay: std::time::Duration,
}

/// The counters, encoded as stored.
pub(crate) fn encode_counters(c: &crate::stats::Counters) -> Vec<u8> {
    encode(&StoredCounters {
        named: c
            .named()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        worst_detection_delay: c.worst_detection_delay,
    })
}

/// The counters as format version 1 stored them: a fixed shape, whose last field came
/// later (before it, a process's death counted as `reclaimed_at_open`).
#[derive(Decode)]
#[cfg_attr(test, derive(Encode))]
struct CountersV1 {
    before: CountersBefore,
    reclaimed_process_died: u64,
}

/// Version 1's counters before `reclaimed_process_died`.
#[derive(Decode)]
#[cfg_attr(test, derive(Encode))]
struct CountersBefore {
    reclaimed_by_reaper: u64,
    reclaimed_by_takeover: u64,
    reclaimed_at_open: u64,
    released: u64,
    leases_lost: u64,
    fenced_writes_rejected: u64,
    stalled: u64,
    worst_detection_delay: std::time::Duration,
}

pub(crate) fn decode_counters(bytes: &[u8]) -> Result<crate::stats::Counters, CodecError> {
    let mut c = crate::stats::Counters::default();
    match split(bytes)? {
        (FIRST_VERSION, body) => {
            let v1 = match decode_body::<CountersV1>(body) {
                Ok(v1) => v1,
                Err(e) => CountersV1 {
                    before: decode_body::<CountersBefore>(body).map_err(|_| e)?,
                    reclaimed_process_died: 0,
                },
            };
            let b = v1.before;
            c.reclaimed_by_reaper = b.reclaimed_by_reaper;
            c.reclaimed_by_takeover = b.reclaimed_by_takeover;
            c.reclaimed_at_open = b.reclaimed_at_open;
            c.reclaimed_process_died = v1.reclaimed_process_died;
            c.released = b.released;
            c.leases_lost = b.leases_lost;
            c.fenced_writes_rejected = b.fenced_writes_rejected;
            c.stalled = b.stalled;
            c.worst_detection_delay = b.worst_detection_delay;
        }
        (_, body) => {
            let stored = decode_body::<StoredCounters>(body)?;
            for (name, value) in &stored.named {
                c.set(name, *value);
            }
            c.worst_detection_delay = stored.worst_detection_delay;
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Outcome, ReclaimPath, RunRecord};
    use crate::{ids::Attempt, ids::StoreTime};
    use std::time::Duration;

    fn run() -> RunRecord {
        RunRecord {
            attempt: Attempt(3),
            worker: "w".into(),
            claimed_at: StoreTime(5),
            ended_at: Some(StoreTime(9)),
            outcome: Some(Outcome::LeaseExpired {
                path: ReclaimPath::Reaper,
                overdue: Duration::from_millis(7),
            }),
            progress: 11,
        }
    }

    #[test]
    fn round_trips_a_record() {
        let bytes = encode(&run());
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<RunRecord>(&bytes), Ok(run()));
    }

    #[test]
    fn a_job_record_of_format_version_1_reads_with_the_new_fields_at_their_defaults() {
        let v1 = JobRecordV1 {
            id: JobId(7),
            queue: "q".into(),
            state: JobState::Running,
            priority: -2,
            attempt: Attempt(3),
            failures: 1,
            max_attempts: 5,
            unique_key: Some("k".into()),
            created_at: StoreTime(1),
            run_at: StoreTime(2),
            lease: Some(LeaseRecordV1 {
                owner: "w".into(),
                claimed_at: StoreTime(3),
                expires_at: StoreTime(9),
                indexed_expiry: StoreTime(8),
                length: Duration::from_secs(6),
                stall_timeout: Some(Duration::from_secs(4)),
            }),
            progress: 11,
            progress_at: StoreTime(4),
            cancel_requested: true,
            last_error: Some("e".into()),
            finished_at: None,
            updated_at: StoreTime(5),
        };
        let mut bytes = vec![FIRST_VERSION];
        bincode::encode_into_std_write(&v1, &mut bytes, config()).unwrap();
        let job = decode_job(&bytes).unwrap();
        assert_eq!((job.id, job.priority, job.failures), (JobId(7), -2, 1));
        let lease = job.lease.as_ref().unwrap();
        assert_eq!(
            (lease.indexed_expiry, lease.stall_timeout, lease.deadline),
            (StoreTime(8), Some(Duration::from_secs(4)), None)
        );
        assert_eq!(
            (job.uniqueness, job.key_released, job.time_limit),
            (Uniqueness::WhileUnfinished, false, None)
        );
        assert!(job.metadata.is_empty());
        // written back in this build's shape, it reads the same
        assert_eq!(decode_job(&encode(&job)), Ok(job));
        // a version 1 record of any other kind reads as before
        let mut run_v1 = encode(&run());
        run_v1[0] = FIRST_VERSION;
        assert_eq!(decode::<RunRecord>(&run_v1), Ok(run()));
    }

    /// A dead job, as this build reads one of version 1.
    fn a_dead_job() -> JobRecord {
        decode_job(&encode(&JobRecord::from(JobRecordV1 {
            id: JobId(9),
            queue: "q".into(),
            state: JobState::Dead,
            priority: 0,
            attempt: Attempt(2),
            failures: 2,
            max_attempts: 2,
            unique_key: None,
            created_at: StoreTime(1),
            run_at: StoreTime(1),
            lease: None,
            progress: 0,
            progress_at: StoreTime(1),
            cancel_requested: false,
            last_error: Some("e".into()),
            finished_at: Some(StoreTime(3)),
            updated_at: StoreTime(3),
        })))
        .unwrap()
    }

    #[test]
    fn a_job_record_of_format_version_2_reads_as_one_that_waits_for_nothing() {
        let mut job = a_dead_job();
        job.metadata = vec![("k".into(), "v".into())];
        // Version 2 wrote the same fields up to the flow, and nothing after them (the flow,
        // then a retry policy's and a limit key's `None`, no token and no expiry, one byte
        // each).
        let current = encode(&job);
        let flow_len = encode(&crate::workflow::Flow::default()).len() - 1;
        let mut v2 = current[..current.len() - flow_len - 4].to_vec();
        v2[0] = BEFORE_FLOW;
        assert_eq!(decode_job(&v2), Ok(job.clone()));
        // A record that does wait for something is no version 2 record.
        job.flow.awaited = true;
        let mut waits = encode(&job);
        waits[0] = BEFORE_FLOW;
        assert!(decode_job(&waits).is_err(), "its flow is trailing bytes");
    }

    #[test]
    fn records_of_format_version_3_read_as_ones_with_no_retry_policy() {
        use crate::queue::QueueRecord;
        let policy = crate::retry::RetryPolicy::fixed(Duration::from_secs(5));
        let mut job = a_dead_job();
        job.flow.awaited = true;
        // Version 3 wrote every field but the last four, the policy, the limit key, the
        // token and the expiry (`None` and no token: one byte each).
        let mut v3 = encode(&job);
        v3.truncate(v3.len() - 4);
        v3[0] = BEFORE_RETRY;
        assert_eq!(decode_job(&v3), Ok(job.clone()));
        let queue = QueueRecord {
            paused: true,
            limits: crate::queue::QueueLimits::none().concurrency(3),
            ..QueueRecord::default()
        };
        let old = |retry: Option<crate::retry::RetryPolicy>| QueueRecordV4 {
            served_at: None,
            paused: true,
            concurrency: Some(3),
            rate: None,
            recent_claims: Vec::new(),
            retry,
        };
        let mut v3 = encode(&old(None));
        v3.pop();
        v3[0] = BEFORE_RETRY;
        assert_eq!(decode_queue(&v3), Ok(queue.clone()));
        // This version keeps a policy, and a version 3 record cannot hold one.
        job.retry = Some(policy.clone());
        assert_eq!(decode_job(&encode(&job)), Ok(job.clone()));
        let with = QueueRecord {
            retry: Some(policy.clone()),
            ..queue
        };
        let mut v4 = encode(&old(Some(policy)));
        v4[0] = BEFORE_KEYS;
        assert_eq!(decode_queue(&v4), Ok(with.clone()));
        v4[0] = BEFORE_RETRY;
        assert!(decode_queue(&v4).is_err());
        assert_eq!(decode_queue(&encode(&with)), Ok(with));
    }

    #[test]
    fn records_of_format_version_4_read_as_ones_with_no_limit_key() {
        let mut job = a_dead_job();
        job.retry = Some(crate::retry::RetryPolicy::fixed(Duration::from_secs(5)));
        // Version 4 wrote every field but the last three, the limit key, the token and the
        // expiry (`None` and no token: one byte each).
        let mut v4 = encode(&job);
        v4.truncate(v4.len() - 3);
        v4[0] = BEFORE_KEYS;
        assert_eq!(decode_job(&v4), Ok(job.clone()));
        job.limit = Some(crate::job::LimitKey {
            key: "tenant-7".into(),
            parked: true,
        });
        assert_eq!(decode_job(&encode(&job)), Ok(job.clone()));
        let mut older = encode(&job);
        older.truncate(older.len() - 2);
        older[0] = BEFORE_KEYS;
        assert!(decode_job(&older).is_err(), "its key is trailing bytes");
    }

    #[test]
    fn a_job_record_of_format_version_5_reads_as_one_whose_lease_has_no_token() {
        let mut job = a_dead_job();
        job.limit = Some(crate::job::LimitKey {
            key: "tenant-7".into(),
            parked: false,
        });
        // Version 5 wrote every field but the last two, the token and the expiry (none: one
        // byte each).
        let mut v5 = encode(&job);
        v5.truncate(v5.len() - 2);
        v5[0] = BEFORE_TOKEN;
        assert_eq!(decode_job(&v5), Ok(job.clone()));
        job.token = crate::ids::LeaseToken(0xfeed_f00d_dead_beef);
        assert_eq!(decode_job(&encode(&job)), Ok(job.clone()));
        let mut older = encode(&job);
        older[0] = BEFORE_TOKEN;
        assert!(decode_job(&older).is_err(), "its token is trailing bytes");
    }

    #[test]
    fn a_group_record_of_format_version_6_reads_as_one_in_no_group_with_none_in_it() {
        use crate::ids::GroupId;
        use crate::workflow::GroupRecord;
        let mut group = crate::rules::new_group(GroupId(3), StoreTime(5));
        group.members = 2;
        group.waiters = vec![JobId(9)];
        // Version 6 wrote every field but the last three (`None`, an empty list and `None`:
        // one byte each), version 7 every field but the key.
        let mut v6 = encode(&group);
        v6.truncate(v6.len() - 3);
        v6[0] = BEFORE_EXPIRY;
        let read = |bytes: &[u8]| decode_stored::<GroupRecord>(Some(bytes), || "g".into());
        assert_eq!(read(&v6).unwrap(), Some(group.clone()));
        group.parent = Some(GroupId(1));
        group.subgroups = vec![GroupId(4)];
        let mut v7 = encode(&group);
        v7.pop();
        v7[0] = BEFORE_GROUP_KEY;
        assert_eq!(read(&v7).unwrap(), Some(group.clone()), "no key");
        group.key = Some("batch 42".into());
        assert_eq!(read(&encode(&group)).unwrap(), Some(group.clone()));
        let mut older = encode(&group);
        older[0] = BEFORE_GROUP_KEY;
        assert!(read(&older).is_err(), "its key is trailing bytes");
    }

    #[test]
    fn a_schedule_of_format_version_6_reads_as_one_whose_jobs_never_expire() {
        let every = Duration::from_secs(60);
        let new = crate::schedule::Schedule::every("s", every, crate::NewJob::new("q", "p"));
        let mut record = crate::rules::declare(None, &new, 1024, StoreTime(0), 0).unwrap();
        // Version 6 wrote every field but the last, the expiry (`None`: one byte).
        let mut v6 = encode(&record);
        v6.pop();
        v6[0] = BEFORE_EXPIRY;
        assert_eq!(decode_schedule(&v6), Ok(record.clone()));
        record.expires = Some(Duration::from_secs(5));
        assert_eq!(decode_schedule(&encode(&record)), Ok(record.clone()));
        let mut older = encode(&record);
        older[0] = BEFORE_EXPIRY;
        assert!(
            decode_schedule(&older).is_err(),
            "its expiry is trailing bytes"
        );
    }

    #[test]
    fn a_job_record_of_format_version_6_reads_as_one_that_never_expires() {
        let mut job = a_dead_job();
        job.token = crate::ids::LeaseToken(7);
        // Version 6 wrote every field but the last, the expiry (none: one byte).
        let mut v6 = encode(&job);
        v6.pop();
        v6[0] = BEFORE_EXPIRY;
        assert_eq!(decode_job(&v6), Ok(job.clone()));
        job.expires_at = Some(StoreTime(123_456_789));
        job.state = JobState::Expired;
        assert_eq!(decode_job(&encode(&job)), Ok(job.clone()));
        let mut older = encode(&job);
        older[0] = BEFORE_EXPIRY;
        assert!(decode_job(&older).is_err(), "its expiry is trailing bytes");
    }

    #[test]
    fn rejects_unknown_version_truncation_and_trailing_bytes() {
        let mut bytes = encode(&run());
        assert_eq!(decode::<RunRecord>(&[]), Err(CodecError::Empty));
        bytes[0] = 99;
        assert_eq!(
            decode::<RunRecord>(&bytes),
            Err(CodecError::UnknownVersion(99))
        );
        bytes[0] = FORMAT_VERSION;
        assert!(matches!(
            decode::<RunRecord>(&bytes[..bytes.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
        bytes.push(0);
        assert_eq!(decode::<RunRecord>(&bytes), Err(CodecError::Trailing(1)));
    }

    #[test]
    fn huge_length_prefix_is_refused_without_allocating() {
        // version, attempt 0, then a string length of u64::MAX in varint form
        let bytes = [
            FORMAT_VERSION,
            0,
            0xFD,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
        ];
        assert!(decode::<RunRecord>(&bytes).is_err());
    }

    /// What builds before `reclaimed_process_died` wrote.
    #[derive(Encode)]
    struct Earlier(u64, u64, u64, u64, u64, u64, u64, Duration);

    fn with_version(version: u8, value: &impl Encode) -> Vec<u8> {
        let mut bytes = vec![version];
        bincode::encode_into_std_write(value, &mut bytes, config()).unwrap();
        bytes
    }

    #[test]
    fn counters_stored_by_earlier_builds_are_read_with_the_new_counters_at_zero() {
        let before = with_version(
            FIRST_VERSION,
            &Earlier(1, 2, 3, 4, 5, 6, 7, Duration::from_secs(8)),
        );
        let c = decode_counters(&before).unwrap();
        assert_eq!(
            (c.reclaimed_at_open, c.stalled, c.reclaimed_process_died),
            (3, 7, 0)
        );
        assert_eq!(c.worst_detection_delay, Duration::from_secs(8));
        let v1 = with_version(
            FIRST_VERSION,
            &CountersV1 {
                before: CountersBefore {
                    reclaimed_by_reaper: 1,
                    reclaimed_by_takeover: 2,
                    reclaimed_at_open: 3,
                    released: 4,
                    leases_lost: 5,
                    fenced_writes_rejected: 6,
                    stalled: 7,
                    worst_detection_delay: Duration::from_secs(8),
                },
                reclaimed_process_died: 9,
            },
        );
        let c = decode_counters(&v1).unwrap();
        assert_eq!((c.reclaimed_process_died, c.timed_out), (9, 0));
        let now = crate::stats::Counters {
            timed_out: 10,
            ..c.clone()
        };
        assert_eq!(decode_counters(&encode_counters(&now)).unwrap(), now);
        // a counter this build does not know (a newer build's) is passed over
        let newer = encode(&StoredCounters {
            named: vec![("stalled".into(), 3), ("from_the_future".into(), 4)],
            worst_detection_delay: Duration::ZERO,
        });
        assert_eq!(decode_counters(&newer).unwrap().stalled, 3);
        assert!(decode_counters(b"\x01garbage").is_err());
        assert!(decode_counters(b"\x02garbage").is_err());
    }
}
