//! An application written as the README read in late November, before the stores' calls
//! moved into the `JobStore` and `ReadJobs` traits: the calls made on `Store` and `PgStore`
//! themselves, `claim` and `claim_job` with a plain `Duration`, `enqueue_batch` with any
//! iterator. With one `use leasehold::prelude::*;` it compiles as it was written, and runs
//! (CHANGELOG.md's upgrade section says what else changed since).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use leasehold::prelude::*;

fn make_thumbnail(photo: &[u8]) -> Result<Vec<u8>, String> {
    Ok(photo.to_vec()) // the application's work
}

/// The quick start of then, with the rest of what the README showed of a store's calls.
fn thumbnails(store: &Store) -> Result<usize, leasehold::Error> {
    store.enqueue(NewJob::new("thumbnails", b"photo-1.jpg".to_vec()).priority(-1))?;
    store.enqueue_batch((2..5).map(|i| NewJob::new("thumbnails", format!("photo-{i}.jpg"))))?;
    let _reaper = Reaper::start(store.clone(), Duration::from_secs(15))?;
    let mut done = 0;
    while let Some(lease) = store.claim("thumbnails", "edge-7", Duration::from_secs(60))? {
        store.heartbeat(&lease, 1)?;
        match make_thumbnail(&lease.payload) {
            Ok(thumbnail) => store.complete(&lease, &thumbnail)?,
            Err(e) => drop(store.fail(&lease, &e)?),
        }
        done += 1;
    }
    let key = String::from("nightly-report");
    let id = store.enqueue(NewJob::new("reports", "r").unique_key(&key))?;
    let lease = store.claim_job(id, "w", Duration::from_secs(60))?;
    store.complete(&lease.expect("claimable"), b"")?;
    assert_eq!(store.job(id)?.map(|j| j.state()), Some(JobState::Succeeded));
    assert_eq!(store.stats()?.total(JobState::Succeeded), 5);
    Ok(done)
}

#[test]
fn an_application_of_late_november_compiles_with_the_prelude_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.redb")).unwrap();
    assert_eq!(thumbnails(&store).unwrap(), 4);
}

/// The same calls on PostgreSQL, as its section showed them.
fn on_postgres(store: &PgStore) -> Result<(), leasehold::Error> {
    store.enqueue(NewJob::new("thumbnails", "photo-1.jpg"))?;
    store.enqueue_batch(vec![NewJob::new("thumbnails", "photo-2.jpg")])?;
    while let Some(lease) = store.claim("thumbnails", "edge-7", Duration::from_secs(60))? {
        store.complete(&lease, b"done")?;
    }
    Ok(())
}

#[test]
fn the_same_application_on_postgres_compiles_with_the_prelude_and_runs() {
    let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
        eprintln!("the PostgreSQL half did not run: LEASEHOLD_PG_URL is not set");
        return;
    };
    let schema = format!("lh_november_{}", std::process::id());
    let store = PgStore::builder(&url).schema(&schema).open().unwrap();
    on_postgres(&store).unwrap();
    assert_eq!(store.stats().unwrap().total(JobState::Succeeded), 2);
    let mut admin =
        leasehold::postgres::client::Client::connect(&url, leasehold::postgres::client::NoTls)
            .unwrap();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
}
