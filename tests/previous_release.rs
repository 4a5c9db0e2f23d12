//! What this build promises of the stores the previous release left: it opens them,
//! upgrades them in place, and runs every job they hold to its end. The previous release is
//! commit f669b93 (before the first tagged release, the code as it stood then); its stores
//! are committed in `tests/fixtures/f669b93/` with the program that wrote them (README.md
//! there): a redb file one process wrote and closed, a redb file shared by processes whose
//! writer died holding a lease, and a PostgreSQL schema (dumped). Each holds a job in every
//! state worth carrying over: waiting (plain, urgent, unique, delayed a day, waiting for
//! another), running under a lease, backing off, dead, cancelled, succeeded with its output
//! and history, a sealed group with one member ended and its callback waiting, jobs of two
//! limit keys under a per-key limit, a paused queue, a queue's retry policy, a schedule.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::Duration;

use leasehold::prelude::*;
use leasehold::{ManualClock, Outcome};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/f669b93");
const QUEUES: [&str; 5] = ["mail", "after", "tenants", "paused", "reports"];
const HOUR: Duration = Duration::from_secs(3600);

/// A copy of fixture `name` (the store file and what lies beside it) in a directory of
/// the test's own: a store is opened for writing, and the fixture must stay as written.
fn copy(name: &str, dir: &Path) -> std::path::PathBuf {
    for entry in std::fs::read_dir(FIXTURES).unwrap() {
        let entry = entry.unwrap();
        let file = entry.file_name().into_string().unwrap();
        if !file.starts_with(name) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(dir.join(&file)).unwrap();
            for inner in std::fs::read_dir(entry.path()).unwrap() {
                let inner = inner.unwrap();
                std::fs::copy(inner.path(), dir.join(&file).join(inner.file_name())).unwrap();
            }
        } else {
            std::fs::copy(entry.path(), dir.join(&file)).unwrap();
        }
    }
    dir.join(name)
}

/// The jobs the previous release left, by state, as its stats counted them.
fn counted(store: &dyn ReadJobs) -> Vec<(JobState, u64)> {
    let stats = store.stats().unwrap();
    JobState::ALL
        .into_iter()
        .map(|s| (s, stats.total(s)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// What every fixture holds before its jobs run (the running one taken back at open on a
/// store one process wrote; still running elsewhere).
fn holds_what_was_written(store: &dyn ReadJobs, running_taken_back: bool) {
    let (running, queued) = match running_taken_back {
        true => (0, 13),
        false => (1, 12),
    };
    let mut want = vec![
        (JobState::Queued, queued),
        (JobState::RetryWait, 1),
        (JobState::Succeeded, 2),
        (JobState::Dead, 1),
        (JobState::Cancelled, 1),
        (JobState::Blocked, 2),
    ];
    if running > 0 {
        want.push((JobState::Running, running));
    }
    want.sort();
    let mut found = counted(store);
    found.sort();
    assert_eq!(found, want, "the previous release's jobs");
    // Its group, upgraded: still open, with its callback waiting (the redb upgrade and the
    // PostgreSQL one mark open groups from their records).
    let stats = store.stats().unwrap();
    assert_eq!((stats.open_groups, stats.waiting_for_groups), (1, 1));
    let done = store
        .jobs(&JobFilter {
            queue: Some("mail".into()),
            state: Some(JobState::Succeeded),
            metadata: vec![("tenant".into(), "acme".into())],
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(done.len(), 1);
    let id = done[0].id();
    assert_eq!(store.output(id).unwrap().as_deref(), Some(&b"sent"[..]));
    let history = store.history(id).unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].outcome(), Some(&Outcome::Succeeded));
    assert_eq!(history[0].progress(), 3);
    let settings = store.queue_settings("tenants").unwrap();
    assert_eq!(settings.limits.per_key, Some(1));
    assert!(store.queue_settings("paused").unwrap().paused);
    assert!(store.queue_settings("mail").unwrap().retry.is_some());
    assert_eq!(store.schedules().unwrap().len(), 1);
}

/// Runs every job the store holds to its end: the paused queue resumed, time moved past
/// the day's delay and the backoff, the schedule fired once; each round claims what is
/// claimable (never two of one tenant at once) and completes it. Returns the payloads run.
fn run_everything(store: &dyn JobStore, clock: &ManualClock) -> Vec<String> {
    store.resume_queue("paused").unwrap();
    clock.advance(2 * 86_400 * Duration::from_secs(1));
    store.reap().unwrap();
    store.fire_schedules().unwrap();
    let mut ran = Vec::new();
    for _ in 0..50 {
        let mut leases = Vec::new();
        for queue in QUEUES {
            leases.extend(
                store
                    .claim_batch(queue, "new-worker", HOUR.into(), 100)
                    .unwrap(),
            );
        }
        if leases.is_empty() {
            break;
        }
        let tenants: Vec<&str> = (leases.iter())
            .filter(|l| l.queue == "tenants")
            .map(|l| {
                std::str::from_utf8(&l.payload)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
            })
            .collect();
        let mut distinct = tenants.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            tenants.len(),
            "one job of a tenant at once: {tenants:?}"
        );
        for lease in leases {
            ran.push(String::from_utf8(lease.payload.clone()).unwrap());
            store.complete(&lease, b"").unwrap();
        }
    }
    ran.sort();
    ran
}

/// What running everything must have run, and where it must leave the store: with the
/// schedule's job where its tick had come (store time on a database is the database's
/// clock, which a test cannot move: the fixture's tick comes an hour after it was written).
fn ran_everything(store: &dyn ReadJobs, ran: &[String], ticked: bool) {
    let mut want = vec![
        "acme 0",
        "acme 1",
        "acme 2",
        "again",
        "first",
        "group done",
        "held",
        "member 2",
        "running",
        "second",
        "tomorrow",
        "unique",
        "urgent",
        "waiting",
        "zeta 0",
        "zeta 1",
    ];
    if ticked {
        want.push("report");
        want.sort_unstable();
    }
    assert_eq!(ran, want);
    let found = counted(store);
    let succeeded = 18 + u64::from(ticked);
    assert_eq!(
        found,
        [
            (JobState::Succeeded, succeeded),
            (JobState::Dead, 1),
            (JobState::Cancelled, 1)
        ]
    );
    let stats = store.stats().unwrap();
    assert_eq!((stats.open_groups, stats.waiting_for_groups), (0, 0));
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}

#[test]
fn a_store_file_of_the_previous_release_opens_upgraded_and_runs_every_job() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy("single.redb", dir.path());
    let clock = ManualClock::new();
    let store = Store::builder(&path).clock(clock.clone()).open().unwrap();
    assert_eq!(store.upgraded_from(), Some(8));
    // Opened with the writer's seat: the lease its dead writer held is back at once.
    assert_eq!(store.recovered_at_open().reclaimed.len(), 1);
    holds_what_was_written(&store, true);
    let ran = run_everything(&store, &clock);
    ran_everything(&store, &ran, true);
    // Opened again, it is this build's, as it was left.
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.upgraded_from(), None);
    ran_everything(&store, &ran, true);
}

#[test]
fn a_shared_store_of_the_previous_release_opens_upgraded_and_its_dead_writers_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy("shared.redb", dir.path());
    let clock = ManualClock::new();
    let store = Store::builder(&path)
        .sharing(Sharing::MultiProcess)
        .clock(clock.clone())
        .open()
        .unwrap();
    assert_eq!(store.upgraded_from(), Some(8));
    // Its writer's registration names a lock file at the path the fixture was written at,
    // which is not this one's: nothing proves that process dead, so its lease is left to
    // run out (README, "Several processes") rather than taken back at once.
    assert!(store.recovered_at_open().reclaimed.is_empty());
    holds_what_was_written(&store, false);
    let ran = run_everything(&store, &clock);
    ran_everything(&store, &ran, true);
}

/// The schema the previous release made on PostgreSQL (version 6), loaded from its dump
/// into a schema of the test's own, opened, upgraded to this build's version, and run.
#[test]
fn a_postgres_schema_of_the_previous_release_is_upgraded_and_runs_every_job() {
    let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
        eprintln!("the PostgreSQL fixture test did not run: LEASEHOLD_PG_URL is not set");
        return;
    };
    use leasehold::postgres::client::{Client, NoTls};
    let schema = format!("lh_previous_{}", std::process::id());
    let dump = std::fs::read_to_string(Path::new(FIXTURES).join("postgres.sql")).unwrap();
    let mut admin = Client::connect(&url, NoTls).unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .unwrap();
    admin
        .batch_execute(&dump.replace("lh_fixture_previous", &schema))
        .unwrap();
    // A builder that may not create (a reader's) is refused the older schema, and it stays.
    let reader = leasehold::postgres::PgStore::builder(&url)
        .schema(&schema)
        .create_if_missing(false)
        .open();
    assert!(
        matches!(
            reader,
            Err(leasehold::Error::Postgres(
                leasehold::postgres::PgError::OlderSchema { found: 6, .. }
            ))
        ),
        "{reader:?}"
    );
    let clock = ManualClock::new();
    let store = leasehold::postgres::PgStore::builder(&url)
        .schema(&schema)
        .open()
        .unwrap();
    assert_eq!(store.upgraded_from(), Some(6));
    holds_what_was_written(&store, false);
    // Time on a database is its clock: what a day of it does to the fixture's times (and to
    // the lease its writer held) is done by hand.
    admin
        .batch_execute(&format!(
            "UPDATE {schema}.leasehold_jobs SET run_at = run_at - interval '3 days',
                 lease_expires_at = lease_expires_at - interval '3 days',
                 lease_indexed_expiry = lease_indexed_expiry - interval '3 days'"
        ))
        .unwrap();
    let now = store.now().unwrap();
    // (an interval's tick is a store time: the wall clock given is not read)
    let schedule = &store.schedules().unwrap()[0];
    let ticked = schedule.next_in_ms(now, std::time::UNIX_EPOCH) <= 0;
    let ran = run_everything(&store, &clock);
    ran_everything(&store, &ran, ticked);
    drop(store);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
}

/// A store of schema version 10 (groups kept without their keys in their records, no index
/// of their ends), made from one of this build by undoing both: the upgrade indexes the
/// groups and keeps each key in its group's record, so the stats count the open one and
/// retention purges the ended one with its key.
#[test]
fn a_store_of_schema_10_has_its_groups_indexed_and_their_keys_kept_by_the_upgrade() {
    use leasehold::redb::{ReadableTable, TableDefinition};
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("leasehold.meta");
    const GROUPS: TableDefinition<u64, &[u8]> = TableDefinition::new("leasehold.groups");
    const GROUP_ENDS: TableDefinition<(u64, u64), ()> =
        TableDefinition::new("leasehold.group_ends");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v10.redb");
    let clock = ManualClock::new();
    let (open, ended) = {
        let store = Store::builder(&path).clock(clock.clone()).open().unwrap();
        let open = store.open_group(NewGroup::new().key("k1")).unwrap();
        let ended = store.open_group(NewGroup::new().key("k2")).unwrap();
        store.seal_group(ended).unwrap();
        (open, ended)
    };
    {
        let db = leasehold::redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut groups = txn.open_table(GROUPS).unwrap();
            let records: Vec<(u64, Vec<u8>)> = (groups.iter().unwrap())
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value(), v.value().to_vec())
                })
                .collect();
            for (id, mut bytes) in records {
                // Format 7 ends before the key: `Some("kN")` is four bytes.
                bytes.truncate(bytes.len() - 4);
                bytes[0] = 7;
                groups.insert(id, bytes.as_slice()).unwrap();
            }
            let mut meta = txn.open_table(META).unwrap();
            meta.insert("schema_version", 10u32.to_le_bytes().as_slice())
                .unwrap();
        }
        txn.delete_table(GROUP_ENDS).unwrap();
        txn.commit().unwrap();
    }
    let store = Store::builder(&path).clock(clock.clone()).open().unwrap();
    assert_eq!(store.upgraded_from(), Some(10));
    let stats = store.stats().unwrap();
    assert_eq!((stats.open_groups, stats.waiting_for_groups), (1, 0));
    clock.advance(HOUR);
    store.purge(Duration::from_secs(60), &[]).unwrap();
    assert!(store.group(ended).unwrap().is_none(), "purged");
    let again = store.open_group(NewGroup::new().key("k2")).unwrap();
    assert_ne!(again, ended, "its key was given up with it");
    assert_eq!(store.open_group(NewGroup::new().key("k1")).unwrap(), open);
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
}
