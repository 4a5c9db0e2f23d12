use leasehold::{
    Error, JobFilter, JobOrder, JobState, NewJob, OpenError, Sharing, Store, StoreReader,
};
use leasehold::{JobStore, ReadJobs};

use crate::common::{Fixture, LEASE, Q};

#[test]
fn a_reader_follows_the_writers_commits_as_they_happen() {
    let f = Fixture::new();
    let reader = StoreReader::open(f.path()).unwrap();
    assert_eq!(reader.stats().unwrap().total(JobState::Queued), 0);
    let ids = f.enqueue_n(3);
    assert_eq!(reader.stats().unwrap().total(JobState::Queued), 3);
    let l = f.claim_one("w");
    f.complete(&l, b"thumbnail").unwrap();
    assert_eq!(
        reader.job(ids[0]).unwrap().unwrap().state(),
        JobState::Succeeded
    );
    assert_eq!(reader.history(ids[0]).unwrap().len(), 1);
    assert_eq!(reader.output(ids[0]).unwrap().unwrap(), b"thumbnail");
    assert!(reader.check().unwrap().is_clean());
    let newest = reader
        .jobs(&JobFilter {
            order: JobOrder::Newest,
            limit: Some(1),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(newest[0].id(), ids[2]);
    let queued = reader
        .jobs(&JobFilter {
            state: Some(JobState::Queued),
            queue: Some(Q.into()),
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(queued.len(), 2);
    assert_eq!(reader.writer_pid().unwrap(), Some(std::process::id()));
}

#[test]
fn a_reader_agrees_with_the_writer_on_store_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host-clock.redb");
    let writer = Store::open(&path).unwrap();
    writer.enqueue(NewJob::new(Q, "x")).unwrap();
    let reader = StoreReader::open(&path).unwrap();
    let (w1, r, w2) = (writer.now(), reader.now(), writer.now());
    assert!(w1 <= r && r <= w2, "{w1} {r} {w2}");
    let timing = reader.timing(Q).unwrap();
    assert!(timing.earliest_run_at.unwrap() <= reader.now());
    let _ = writer.claim(Q, "w", LEASE).unwrap().unwrap();
    let timing = reader.timing(Q).unwrap();
    assert!(timing.next_expiry.unwrap() > reader.now());
}

#[test]
fn a_reader_of_a_missing_file_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing.redb");
    match StoreReader::open(&path) {
        Err(Error::Open(OpenError::Io { source, .. })) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(!path.exists());
}

#[test]
fn a_second_writer_in_the_same_process_is_told_this_process_holds_the_seat() {
    let f = Fixture::new();
    match Store::open(f.path()) {
        Err(Error::Open(OpenError::Locked { pid, .. })) => {
            assert_eq!(pid, Some(std::process::id()))
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // our own pid is not "another process"
    let msg = Store::open(f.path()).unwrap_err().to_string();
    assert!(msg.contains("already open in this process"), "{msg}");
    assert!(!msg.contains("another process"), "{msg}");
}

#[test]
fn an_exclusive_writer_keeps_readers_out() {
    let f = Fixture::with(|b| b.sharing(Sharing::Exclusive));
    assert!(matches!(
        StoreReader::open(f.path()),
        Err(Error::Open(OpenError::Locked { .. }))
    ));
}

#[test]
fn eventual_durability_needs_an_exclusive_store() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::builder(dir.path().join("s.redb"))
        .durability(leasehold::Durability::Eventual {
            flush_every: std::time::Duration::from_secs(1),
        })
        .open()
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Config(leasehold::ConfigError::EventualDurabilityShared)
    ));
}

#[test]
fn a_reader_reads_the_applications_own_tables() {
    const APP: leasehold::redb::TableDefinition<&str, u64> =
        leasehold::redb::TableDefinition::new("app.thumbnails");
    let f = Fixture::new();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    f.complete_with(&l, b"ok", |t| -> Result<(), Error> {
        t.open_table(APP)?.insert("photo-1", 7)?;
        Ok(())
    })
    .unwrap();
    let reader = StoreReader::open(f.path()).unwrap();
    let read = reader.begin_read().unwrap();
    let table = read.open_table(APP).unwrap();
    assert_eq!(table.get("photo-1").unwrap().unwrap().value(), 7);
}
