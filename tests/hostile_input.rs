//! A table of hostile inputs through the public API: each is refused with its own typed
//! error, and the store's contents are exactly as they were (stats and check compared before
//! and after; for bad files, the file's bytes).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "support/hostile_files.rs"]
mod hostile_files;

use std::time::Duration;

use leasehold::{
    Attempt, ConfigError, Error, InputError, JobId, JobState, Lease, LeaseTerms, ManualClock,
    NewJob, OpenError, Stats, Store, WorkerPool,
};
use leasehold::{JobStore, ReadJobs};

const Q: &str = "q";
const LEASE: Duration = Duration::from_secs(60);

type Case = (
    &'static str,
    Box<dyn Fn(&Store) -> Error>,
    fn(&Error) -> bool,
);
type Refusal = (&'static str, Error, fn(&Error) -> bool);
type BadFile = (&'static str, Vec<u8>, fn(&OpenError) -> bool);
type BadStore = (&'static str, std::path::PathBuf, fn(&OpenError) -> bool);

/// A lease no grant made: a real one's copy naming another job or attempt, with no token
/// (a lease is not built field by field outside the crate).
fn forged_lease(real: &Lease, job: u64, attempt: u32) -> Lease {
    let mut forged = real.clone();
    forged.job = JobId(job);
    forged.attempt = Attempt(attempt);
    forged.token = leasehold::LeaseToken::NONE;
    forged.worker = "forger".into();
    forged
}

fn snapshot(store: &Store) -> (Stats, Vec<Option<leasehold::Job>>) {
    let mut stats = store.stats().unwrap();
    stats.counters = Default::default(); // refusals are counted; contents are not touched
    let jobs = (1..=6).map(|i| store.job(JobId(i)).unwrap()).collect();
    (stats, jobs)
}

#[test]
fn hostile_api_inputs_are_refused_with_their_own_error_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder(dir.path().join("s.redb"))
        .clock(clock.clone())
        .max_payload(1024)
        .open()
        .unwrap();
    // A store with something in every state worth touching.
    store
        .enqueue_batch((0..4).map(|i| NewJob::new(Q, format!("{i}"))))
        .unwrap();
    let done = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.complete(&done, b"ok").unwrap();
    let running = store.claim(Q, "w", LEASE).unwrap().unwrap();
    let cancelled = store.claim(Q, "w", LEASE).unwrap().unwrap();
    store.cancel(cancelled.job).unwrap();
    assert_eq!(
        store.heartbeat(&cancelled, 1).unwrap(),
        leasehold::Renewal::Cancelled
    );

    let (unknown, forged) = (forged_lease(&done, 999, 1), forged_lease(&done, 2, 7));
    let cases: Vec<Case> = vec![
        (
            "zero lease",
            Box::new(|s| s.claim(Q, "w", Duration::ZERO).unwrap_err()),
            |e| matches!(e, Error::Config(ConfigError::ZeroLease)),
        ),
        (
            "absurd lease",
            Box::new(|s| s.claim(Q, "w", Duration::MAX).unwrap_err()),
            |e| matches!(e, Error::Config(ConfigError::LeaseTooLong { .. })),
        ),
        (
            "zero stall timeout",
            Box::new(|s| {
                s.claim(Q, "w", LeaseTerms::new(LEASE).stall_timeout(Duration::ZERO))
                    .unwrap_err()
            }),
            |e| matches!(e, Error::Config(ConfigError::ZeroStallTimeout)),
        ),
        (
            "empty queue name",
            Box::new(|s| s.enqueue(NewJob::new("", "x")).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::EmptyQueueName)),
        ),
        (
            "oversized queue name",
            Box::new(|s| s.enqueue(NewJob::new("q".repeat(10_000), "x")).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::QueueNameTooLong { .. })),
        ),
        (
            "empty queue name at claim",
            Box::new(|s| s.claim("", "w", LEASE).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::EmptyQueueName)),
        ),
        (
            "oversized payload",
            Box::new(|s| s.enqueue(NewJob::new(Q, vec![0u8; 1025])).unwrap_err()),
            |e| {
                matches!(
                    e,
                    Error::Input(InputError::TooLarge {
                        what: "payload",
                        ..
                    })
                )
            },
        ),
        (
            "oversized output",
            Box::new(move |s| s.complete(&running, &[0u8; 4096]).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::TooLarge { what: "output", .. })),
        ),
        (
            "zero max attempts",
            Box::new(|s| s.enqueue(NewJob::new(Q, "x").max_attempts(0)).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::ZeroMaxAttempts)),
        ),
        (
            "empty worker id",
            Box::new(|s| s.claim(Q, "", LEASE).unwrap_err()),
            |e| matches!(e, Error::Input(InputError::BadWorkerId { .. })),
        ),
        (
            "unknown job: cancel",
            Box::new(|s| s.cancel(JobId(999)).unwrap_err()),
            |e| matches!(e, Error::JobNotFound(JobId(999))),
        ),
        (
            "unknown job: claim_job",
            Box::new(|s| s.claim_job(JobId(999), "w", LEASE).unwrap_err()),
            |e| matches!(e, Error::JobNotFound(JobId(999))),
        ),
        (
            "unknown job: forged lease",
            Box::new(move |s| s.complete(&unknown, b"").unwrap_err()),
            |e| matches!(e, Error::LeaseLost(l) if l.found.is_none()),
        ),
        (
            "forged attempt on a running job",
            Box::new(move |s| s.heartbeat(&forged, 1).unwrap_err()),
            |e| matches!(e, Error::LeaseLost(l) if l.found == Some((Attempt(1), JobState::Running))),
        ),
        (
            "double complete",
            Box::new(move |s| s.complete(&done, b"again").unwrap_err()),
            |e| matches!(e, Error::LeaseLost(l) if l.found == Some((Attempt(1), JobState::Succeeded))),
        ),
        (
            "complete after cancel",
            Box::new(move |s| s.complete(&cancelled, b"late").unwrap_err()),
            |e| matches!(e, Error::LeaseLost(l) if l.found == Some((Attempt(1), JobState::Cancelled))),
        ),
        (
            "cancel a finished job",
            Box::new(|s| s.cancel(JobId(1)).unwrap_err()),
            |e| {
                matches!(
                    e,
                    Error::Refused {
                        state: JobState::Succeeded,
                        ..
                    }
                )
            },
        ),
    ];
    for (name, run, expected) in cases {
        let before = snapshot(&store);
        let err = run(&store);
        assert!(expected(&err), "{name}: unexpected error {err:?}");
        assert_eq!(snapshot(&store), before, "{name} changed the store");
        assert!(store.check().unwrap().is_clean(), "{name}");
    }
}

#[test]
fn hostile_settings_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.redb")).unwrap();
    let pool_err = |b: leasehold::PoolBuilder<leasehold::Store>| b.start(|_| Ok(())).err().unwrap();
    let cases: Vec<Refusal> = vec![
        (
            "heartbeat equal to lease",
            pool_err(
                WorkerPool::builder(store.clone(), Q)
                    .lease(LEASE)
                    .heartbeat_every(LEASE),
            ),
            |e| {
                matches!(
                    e,
                    Error::Config(ConfigError::HeartbeatNotShorterThanLease { .. })
                )
            },
        ),
        (
            "heartbeat longer than lease",
            pool_err(WorkerPool::builder(store.clone(), Q).heartbeat_every(LEASE * 2)),
            |e| {
                matches!(
                    e,
                    Error::Config(ConfigError::HeartbeatNotShorterThanLease { .. })
                )
            },
        ),
        (
            "zero heartbeat",
            pool_err(WorkerPool::builder(store.clone(), Q).heartbeat_every(Duration::ZERO)),
            |e| matches!(e, Error::Config(ConfigError::ZeroHeartbeat)),
        ),
        (
            "zero lease pool",
            pool_err(WorkerPool::builder(store.clone(), Q).lease(Duration::ZERO)),
            |e| matches!(e, Error::Config(ConfigError::ZeroLease)),
        ),
        (
            "zero concurrency",
            pool_err(WorkerPool::builder(store.clone(), Q).concurrency(0)),
            |e| matches!(e, Error::Config(ConfigError::ZeroConcurrency)),
        ),
        (
            "empty queue pool",
            pool_err(WorkerPool::builder(store.clone(), "")),
            |e| matches!(e, Error::Input(InputError::EmptyQueueName)),
        ),
        (
            "zero reaper interval",
            leasehold::Reaper::start(store.clone(), Duration::ZERO).unwrap_err(),
            |e| matches!(e, Error::Config(ConfigError::ZeroReaperInterval)),
        ),
    ];
    for (name, err, expected) in cases {
        assert!(expected(&err), "{name}: unexpected error {err:?}");
    }
    assert_eq!(store.stats().unwrap().total(JobState::Queued), 0);
}

#[test]
fn hostile_files_are_refused_with_their_own_error_and_left_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    // a real store to damage
    let good = dir.path().join("good.redb");
    {
        let s = Store::open(&good).unwrap();
        s.enqueue_batch((0..50).map(|i| NewJob::new(Q, vec![i as u8; 200])))
            .unwrap();
    }
    let image = std::fs::read(&good).unwrap();
    let mut random = vec![0u8; 64 * 1024];
    let mut x = 0x1234_5678_9ABC_DEF0u64;
    for b in &mut random {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let cases: Vec<BadFile> = vec![
        ("random bytes", random, |e| {
            matches!(e, OpenError::NotAStore { .. })
        }),
        (
            "a text file",
            b"hello, I am not a database\n".repeat(50),
            |e| matches!(e, OpenError::NotAStore { .. }),
        ),
        (
            "a truncated store",
            image[..image.len() / 2].to_vec(),
            |e| matches!(e, OpenError::Corrupt { .. } | OpenError::Io { .. }),
        ),
        ("a store cut to its header", image[..600].to_vec(), |e| {
            matches!(e, OpenError::Corrupt { .. } | OpenError::Io { .. })
        }),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(format!("{}.redb", name.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        match Store::open(&path) {
            Err(Error::Open(e)) => assert!(expected(&e), "{name}: unexpected error {e}"),
            other => panic!("{name}: expected an open error, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{name}: the file was modified"
        );
    }
    // the same file opened twice
    let held = Store::open(&good).unwrap();
    let before = std::fs::metadata(&good).unwrap().len();
    assert!(matches!(
        Store::open(&good),
        Err(Error::Open(OpenError::Locked { .. }))
    ));
    assert_eq!(std::fs::metadata(&good).unwrap().len(), before);
    assert_eq!(held.stats().unwrap().total(JobState::Queued), 50);
}

const META: leasehold::redb::TableDefinition<&str, &[u8]> =
    leasehold::redb::TableDefinition::new("leasehold.meta");

/// A store whose meta table was edited by hand: the edit made through redb directly.
fn edited_store(
    dir: &std::path::Path,
    name: &str,
    edit: impl FnOnce(&mut EditMeta),
) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.redb"));
    Store::open(&path)
        .unwrap()
        .enqueue(NewJob::new(Q, "x"))
        .unwrap();
    let db = leasehold::redb::Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        edit(&mut meta);
    }
    txn.commit().unwrap();
    path
}

type EditMeta<'t> = leasehold::redb::Table<'t, &'static str, &'static [u8]>;

#[test]
fn refused_stores_are_left_byte_for_byte_by_every_open() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign.redb");
    hostile_files::foreign_redb(&foreign);
    let cases: Vec<BadStore> = vec![
        ("another application's redb database", foreign, |e| {
            matches!(e, OpenError::NotAStore { .. })
        }),
        (
            "a newer schema",
            edited_store(dir.path(), "newer", |m| {
                m.insert("schema_version", 99u32.to_le_bytes().as_slice())
                    .unwrap();
            }),
            |e| matches!(e, OpenError::NewerSchema { .. }),
        ),
        (
            "a garbage clock anchor",
            edited_store(dir.path(), "anchor", |m| {
                m.insert("clock.anchor", b"garbage".as_slice()).unwrap();
            }),
            |e| matches!(e, OpenError::Corrupt { .. }),
        ),
        (
            "no marker",
            edited_store(dir.path(), "marker", |m| {
                m.remove("marker").unwrap();
            }),
            |e| matches!(e, OpenError::NotAStore { .. }),
        ),
        (
            "a high-water mark at the end of time",
            edited_store(dir.path(), "high-water", |m| {
                m.insert("clock.high_water", u64::MAX.to_le_bytes().as_slice())
                    .unwrap();
            }),
            |e| matches!(e, OpenError::Corrupt { .. }),
        ),
    ];
    for (name, path, expected) in cases {
        let bytes = std::fs::read(&path).unwrap();
        for (how, result) in [
            ("Store::open", Store::open(&path).map(|_| ())),
            (
                "StoreReader::open",
                leasehold::StoreReader::open(&path).map(|_| ()),
            ),
        ] {
            match result {
                Err(Error::Open(e)) => assert!(expected(&e), "{name}, {how}: unexpected {e}"),
                other => panic!("{name}, {how}: expected an open error, got {other:?}"),
            }
        }
        assert!(
            std::fs::read(&path).unwrap() == bytes,
            "{name}: the file was modified"
        );
    }
}

#[test]
fn a_fifo_a_directory_and_a_device_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    hostile_files::fifo(&fifo);
    for path in [
        fifo.as_path(),
        dir.path(),
        std::path::Path::new("/dev/null"),
    ] {
        for result in [
            Store::open(path).map(|_| ()),
            leasehold::StoreReader::open(path).map(|_| ()),
        ] {
            match result {
                Err(Error::Open(OpenError::NotAStore { detail, .. })) => {
                    assert!(detail.contains("not a regular file"), "{detail}")
                }
                other => panic!("{}: expected NotAStore, got {other:?}", path.display()),
            }
        }
    }
}

/// A job record damaged in the file (written through redb directly) is left out of a
/// listing, by state or not, and the other jobs are listed; `check` names the damage.
#[test]
fn a_listing_leaves_out_a_damaged_job_record_and_lists_the_rest() {
    const JOBS: leasehold::redb::TableDefinition<u64, &[u8]> =
        leasehold::redb::TableDefinition::new("leasehold.jobs");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let ids: Vec<JobId> = {
        let store = Store::open(&path).unwrap();
        (0..3)
            .map(|i| store.enqueue(NewJob::new(Q, format!("{i}"))).unwrap())
            .collect()
    };
    {
        let db = leasehold::redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(JOBS)
            .unwrap()
            .insert(ids[1].0, &[0xFF, 1, 2][..])
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    for state in [None, Some(JobState::Queued)] {
        let filter = leasehold::JobFilter {
            state,
            ..leasehold::JobFilter::default()
        };
        let listed: Vec<JobId> = store
            .jobs(&filter)
            .unwrap()
            .iter()
            .map(|j| j.id())
            .collect();
        assert_eq!(listed, [ids[0], ids[2]], "{state:?}");
    }
    assert!(!store.check().unwrap().is_clean());
}

/// A checkpoint or a log record damaged in the file is a typed `Corrupt` error naming it,
/// on the store and on a reader, and never the job's: the job is still read, a new save
/// replaces the damaged checkpoint, and a damaged log starts again rather than fail the
/// write that carries new lines (a pool's renewal).
#[test]
fn a_damaged_checkpoint_or_log_is_named_and_replaced_by_the_next_write() {
    const CHECKPOINTS: leasehold::redb::TableDefinition<u64, &[u8]> =
        leasehold::redb::TableDefinition::new("leasehold.checkpoints");
    const LOGS: leasehold::redb::TableDefinition<(u64, u32), &[u8]> =
        leasehold::redb::TableDefinition::new("leasehold.logs");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let (job, lease) = {
        let store = Store::open(&path).unwrap();
        let job = store.enqueue(NewJob::new(Q, "p")).unwrap();
        let lease = store
            .claim(Q, "w", std::time::Duration::from_secs(3600))
            .unwrap()
            .unwrap();
        store.save_checkpoint(&lease, b"row 1").unwrap();
        store.log(&lease, &["one"]).unwrap();
        (job, lease)
    };
    {
        let db = leasehold::redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        (txn.open_table(CHECKPOINTS).unwrap())
            .insert(job.0, &[0xFF, 1][..])
            .unwrap();
        (txn.open_table(LOGS).unwrap())
            .insert((job.0, lease.attempt.0), &[0xFF, 2][..])
            .unwrap();
        txn.commit().unwrap();
    }
    let named = |e: Error, what: &str| match e {
        Error::Corrupt(why) => assert!(why.contains(what), "{why}"),
        other => panic!("expected Corrupt naming {what}, got {other:?}"),
    };
    {
        let reader = leasehold::StoreReader::open(&path).unwrap();
        named(reader.checkpoint(job).unwrap_err(), "the checkpoint of job");
        named(reader.logs(job).unwrap_err(), "the log of job");
        assert!(reader.job(job).unwrap().is_some());
    }
    let store = Store::open(&path).unwrap();
    named(store.checkpoint(job).unwrap_err(), "the checkpoint of job");
    named(store.logs(job).unwrap_err(), "the log of job");
    // (the first handle's close gave its lease back: this is the job's second attempt)
    let second = store
        .claim(Q, "w", std::time::Duration::from_secs(3600))
        .unwrap()
        .unwrap();
    store.save_checkpoint(&second, b"row 2").unwrap();
    assert_eq!(store.checkpoint(job).unwrap().unwrap().data(), b"row 2");
    // the first attempt's damaged log takes its holder's next line, afresh
    store.log(&lease, &["two"]).unwrap();
    let logs = store.logs(job).unwrap();
    let lines: Vec<_> = logs[0].lines().map(|(_, t)| t.to_owned()).collect();
    assert_eq!(
        (logs.len(), logs[0].attempt(), lines),
        (1, lease.attempt, vec!["two".to_owned()])
    );
}
