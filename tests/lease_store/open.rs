use std::io::Write;
use std::process::{Child, Stdio};
use std::time::Duration;

use leasehold::{
    ConfigError, Durability, Error, JobState, ManualClock, NewJob, OpenError, Outcome, ReclaimPath,
    RetryPolicy, Store, StoreTime,
};
use leasehold::{JobStore, ReadJobs};
use redb::{ReadableDatabase, TableDefinition};

use crate::common::{Fixture, Q};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("leasehold.meta");

fn open_err(builder: leasehold::StoreBuilder) -> OpenError {
    match builder.open() {
        Err(Error::Open(e)) => e,
        other => panic!("expected an open error, got {other:?}"),
    }
}

#[test]
fn a_missing_file_is_created_and_an_empty_file_becomes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("new.redb")).unwrap();
    assert!(store.check().unwrap().is_clean());
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    Store::open(&empty).unwrap();
}

#[test]
fn a_shared_open_whose_process_directory_is_a_plain_file_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pf.redb");
    let procs = dir.path().join("pf.redb.procs");
    std::fs::write(&procs, b"not a directory").unwrap();
    let shared = || Store::builder(&path).sharing(leasehold::Sharing::MultiProcess);
    match open_err(shared()) {
        OpenError::ProcessDirectoryTaken { path } => assert_eq!(path, procs),
        other => panic!("expected ProcessDirectoryTaken, got {other:?}"),
    }
    assert!(!path.exists(), "a refused open made a store");
    // and a store that exists is left as it was
    drop(Store::open(&path).unwrap());
    let before = std::fs::read(&path).unwrap();
    assert!(matches!(
        open_err(shared()),
        OpenError::ProcessDirectoryTaken { .. }
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read(&procs).unwrap(), b"not a directory");
}

#[test]
fn a_file_that_is_not_redb_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = b"these are my notes, not a job store\n".repeat(100);
    std::fs::write(&path, &text).unwrap();
    assert!(matches!(
        open_err(Store::builder(&path)),
        OpenError::NotAStore { .. }
    ));
    assert_eq!(std::fs::read(&path).unwrap(), text);
    let tiny = dir.path().join("tiny");
    std::fs::write(&tiny, b"re").unwrap();
    assert!(matches!(
        open_err(Store::builder(&tiny)),
        OpenError::NotAStore { .. }
    ));
}

#[test]
fn a_redb_database_of_another_application_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TableDefinition::<u64, u64>::new("users"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        txn.commit().unwrap();
    }
    let err = open_err(Store::builder(&path));
    assert!(matches!(err, OpenError::NotAStore { .. }), "{err}");
    // untouched: the other application's table is still the only one
    let db = redb::Database::open(&path).unwrap();
    let read = db.begin_read().unwrap();
    let names: Vec<String> = read
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    assert_eq!(names, vec!["users".to_owned()]);
}

#[test]
fn a_store_with_a_newer_schema_version_is_refused() {
    let mut f = Fixture::new();
    f.enqueue_n(1);
    f.close();
    {
        let db = redb::Database::open(f.path()).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("schema_version", 99u32.to_le_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    match open_err(Store::builder(f.path())) {
        OpenError::NewerSchema {
            found, supported, ..
        } => {
            assert_eq!((found, supported), (99, leasehold::SCHEMA_VERSION));
        }
        other => panic!("expected NewerSchema, got {other}"),
    }
    std::mem::forget(f); // the fixture cannot reopen it for its final check
}

#[test]
fn opening_an_older_store_upgrades_it_and_says_so_once() {
    let mut f = Fixture::new();
    let ids = f.enqueue_n(2);
    f.close();
    {
        let db = redb::Database::open(f.path()).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("schema_version", 2u32.to_le_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(f.path()).unwrap();
    assert_eq!(store.upgraded_from(), Some(2));
    assert_eq!(
        store.job(ids[1]).unwrap().unwrap().state(),
        JobState::Queued
    );
    drop(store);
    assert_eq!(Store::open(f.path()).unwrap().upgraded_from(), None);
    f.reopen();
}

#[test]
fn a_damaged_store_is_refused_as_corrupt() {
    let mut f = Fixture::new();
    f.enqueue_batch((0..200).map(|i| NewJob::new(Q, vec![i as u8; 300])))
        .unwrap();
    f.close();
    let path = f.path();
    let original = std::fs::read(&path).unwrap();

    // flip bytes in every page after the header: checksums no longer match
    let mut damaged = original.clone();
    for i in (8192..damaged.len()).step_by(4096) {
        for b in &mut damaged[i..(i + 64).min(original.len())] {
            *b ^= 0x5A;
        }
    }
    std::fs::write(&path, &damaged).unwrap();
    let err = open_err(Store::builder(&path));
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");

    // a truncated copy
    std::fs::write(&path, &original[..original.len() / 3]).unwrap();
    let err = open_err(Store::builder(&path));
    assert!(
        matches!(err, OpenError::Corrupt { .. } | OpenError::Io { .. }),
        "{err}"
    );
    std::mem::forget(f);
}

#[test]
fn a_store_held_by_another_process_is_refused_as_locked() {
    let f = Fixture::new();
    let mut f = f;
    f.close();
    let (mut child, _) = spawn_child(&f.path(), &[]);
    let err = open_err(Store::builder(f.path()));
    assert!(matches!(err, OpenError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("another process"));
    end_child(&mut child);
    f.reopen();
}

#[test]
fn a_second_handle_in_the_same_process_is_refused_as_locked() {
    let f = Fixture::new();
    let err = open_err(Store::builder(f.path()));
    assert!(matches!(err, OpenError::Locked { .. }), "{err}");
}

#[test]
fn leases_left_by_a_killed_process_are_taken_back_at_open() {
    let mut f = Fixture::new();
    f.close();
    let (mut child, claimed) = spawn_child(
        &f.path(),
        &["--enqueue", "5", "--claim", "3", "--lease-ms", "3600000"],
    );
    assert_eq!(claimed.len(), 3);
    child.kill().unwrap(); // SIGKILL: no release, no clean close
    child.wait().unwrap();

    let store = Store::open(f.path()).unwrap();
    let stats = store.stats().unwrap();
    assert_eq!(stats.counters.reclaimed_at_open, 3);
    assert_eq!(stats.total(JobState::Queued), 5);
    assert_eq!(stats.total(JobState::Running), 0);
    for id in claimed {
        let history = store.history(id).unwrap();
        assert_eq!(history.len(), 1);
        assert!(matches!(
            history[0].outcome(),
            Some(&Outcome::LeaseExpired {
                path: ReclaimPath::Recovery,
                ..
            })
        ));
    }
    assert!(store.check().unwrap().is_clean());
}

#[test]
fn recovery_at_open_can_be_turned_off() {
    let mut f = Fixture::with(|b| b.recover_on_open(false));
    f.enqueue_n(1);
    f.claim_one("w");
    f.reopen();
    assert_eq!(f.stats().unwrap().total(JobState::Running), 1);
}

#[test]
fn the_clock_continues_across_reopen_with_the_same_source() {
    let mut f = Fixture::new();
    f.advance(Duration::from_secs(100));
    let before = f.now();
    f.reopen();
    assert_eq!(f.now(), before);
    f.advance(Duration::from_secs(1));
    assert_eq!(f.now(), before.saturating_add(Duration::from_secs(1)));
}

#[test]
fn after_a_reboot_the_clock_resumes_past_every_lease_it_wrote() {
    // A fresh manual clock is a new epoch, as a reboot is for the host clock.
    let mut f = Fixture::with(|b| b.recover_on_open(false));
    f.advance(Duration::from_secs(10));
    f.enqueue_n(1);
    let l = f.claim_one("w");
    assert_eq!(l.expires_at, StoreTime(70_000_000_000));
    let rebooted = ManualClock::new();
    f.reopen_with(
        Store::builder(f.path())
            .clock(rebooted.clone())
            .recover_on_open(false),
    )
    .unwrap();
    // The high-water mark is written up to 10 s ahead, so resumption may be that much later.
    let resumed = f.now();
    assert!(resumed >= l.expires_at, "{resumed} < {}", l.expires_at);
    assert!(resumed <= l.expires_at.saturating_add(Duration::from_secs(10)));
    assert_eq!(
        f.reap().unwrap().reclaimed.len(),
        1,
        "the old lease is expired at once"
    );
    rebooted.advance(Duration::from_secs(5));
    assert_eq!(f.now(), resumed.saturating_add(Duration::from_secs(5)));
}

#[test]
fn the_host_clock_never_runs_backwards_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.redb");
    let mut last = StoreTime::ZERO;
    for _ in 0..3 {
        let store = Store::open(&path).unwrap();
        let now = store.now();
        assert!(now >= last, "{now} < {last}");
        store.enqueue(NewJob::new(Q, "x")).unwrap();
        last = store.now();
    }
}

#[test]
fn a_manual_clock_set_backwards_does_not_move_store_time_back() {
    let f = Fixture::new();
    f.advance(Duration::from_secs(50));
    let t = f.now();
    f.clock.set(Duration::from_secs(1));
    assert!(f.now() >= t);
}

#[test]
fn bad_settings_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.redb");
    let cfg = |b: leasehold::StoreBuilder| match b.open() {
        Err(Error::Config(e)) => e,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(
        cfg(Store::builder(&p).reap_batch(0)),
        ConfigError::ZeroBatch
    );
    assert_eq!(
        cfg(Store::builder(&p).default_max_attempts(0)),
        ConfigError::ZeroMaxAttempts
    );
    let inverted =
        RetryPolicy::exponential(Duration::from_secs(9), Duration::from_secs(1)).jitter(0.1);
    assert!(matches!(
        cfg(Store::builder(&p).retry_policy(inverted)),
        ConfigError::RetryPolicy(_)
    ));
    assert!(!p.exists(), "a refused configuration creates no file");
}

#[test]
fn eventual_durability_keeps_commits_across_a_clean_close() {
    let mut f = Fixture::with(|b| {
        b.sharing(leasehold::Sharing::Exclusive)
            .durability(Durability::Eventual {
                flush_every: Duration::from_secs(3600),
            })
    });
    let ids = f.enqueue_n(10);
    let l = f.claim_one("w");
    f.complete(&l, b"done").unwrap();
    f.flush().unwrap();
    f.enqueue_n(1);
    f.reopen();
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 10);
    assert_eq!(f.job(ids[0]).unwrap().unwrap().state(), JobState::Succeeded);
}

// ----- a real child process holding the store -----

fn spawn_child(path: &std::path::Path, args: &[&str]) -> (Child, Vec<leasehold::JobId>) {
    let args = [&["--db", path.to_str().unwrap()], args].concat();
    let mut child = crate::helper_process::command("holder", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut claimed = Vec::new();
    for line in crate::helper_process::stdout_lines(&mut child) {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["claimed", id, _attempt] => claimed.push(leasehold::JobId(id.parse().unwrap())),
            ["ready", _] => return (child, claimed),
            _ => panic!("unexpected child output: {line}"),
        }
    }
    panic!("child exited before it was ready: {:?}", child.wait());
}

fn end_child(child: &mut Child) {
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    child.wait().unwrap();
}
