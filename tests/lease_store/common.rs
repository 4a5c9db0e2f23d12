//! Fixtures shared by the lease store tests.

use std::ops::Deref;
use std::path::PathBuf;
use std::time::Duration;

use leasehold::ReadJobs;
use leasehold::{JobId, Lease, ManualClock, NewJob, Store, StoreBuilder};
use tempfile::TempDir;

pub const Q: &str = "q";
pub const LEASE: Duration = Duration::from_secs(60);

/// A store in a temporary directory on a manual clock. Derefs to the [`Store`]. On drop it
/// asserts that `check()` is clean, so every test proves the indexes stayed consistent.
pub struct Fixture {
    pub dir: TempDir,
    pub clock: ManualClock,
    store: Option<Store>,
    configure: fn(StoreBuilder) -> StoreBuilder,
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with(|b| b)
    }

    pub fn with(configure: fn(StoreBuilder) -> StoreBuilder) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = ManualClock::new();
        let mut f = Fixture {
            dir,
            clock,
            store: None,
            configure,
        };
        f.store = Some(f.open().expect("open store"));
        f
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("store.redb")
    }

    fn open(&self) -> leasehold::Result<Store> {
        (self.configure)(Store::builder(self.path()).clock(self.clock.clone())).open()
    }

    /// Closes the store and opens it again with the same clock.
    pub fn reopen(&mut self) {
        self.close();
        self.store = Some(self.open().expect("reopen store"));
    }

    /// Closes the store (dropping the handle releases the file).
    pub fn close(&mut self) {
        self.assert_clean();
        self.store = None;
    }

    /// Opens the store again from a builder the test configures (a new clock, say).
    pub fn reopen_with(&mut self, builder: StoreBuilder) -> leasehold::Result<()> {
        self.close();
        self.store = Some(builder.open()?);
        Ok(())
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn enqueue_n(&self, n: usize) -> Vec<JobId> {
        self.enqueue_batch((0..n).map(|i| NewJob::new(Q, format!("job {i}"))))
            .expect("enqueue")
    }

    pub fn claim_one(&self, worker: &str) -> Lease {
        self.claim(Q, worker, LEASE)
            .expect("claim")
            .expect("a claimable job")
    }

    fn assert_clean(&self) {
        if let Some(store) = &self.store {
            let report = store.check().expect("check runs");
            assert!(
                report.is_clean(),
                "integrity check failed: {:#?}",
                report.problems
            );
        }
    }
}

impl Deref for Fixture {
    type Target = Store;
    fn deref(&self) -> &Store {
        self.store.as_ref().expect("store is open")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_clean();
        }
    }
}

/// Waits for `cond` with a generous deadline (real threads are involved); panics on timeout.
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
