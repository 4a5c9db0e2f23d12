//! A schema of one test's own on the server, and the waits the tests share.

use std::time::Duration;

use leasehold::RetryPolicy;
use leasehold::postgres::PgStore;
use leasehold::postgres::client as postgres;

pub const Q: &str = "q";
pub const LEASE: Duration = Duration::from_secs(60);

/// A schema of one test's own on the server, dropped when the test ends.
pub struct Db {
    pub url: String,
    pub schema: String,
    pub admin: postgres::Client,
}

impl Db {
    /// `None` (and one line on stderr) where no server is configured.
    pub fn new(test: &str) -> Option<Db> {
        let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                crate::say(&format!(
                    "the PostgreSQL suite did not run: LEASEHOLD_PG_URL is not set ({test} and the rest skipped)"
                ))
            });
            return None;
        };
        let admin = postgres::Client::connect(&url, postgres::NoTls).expect("connect as admin");
        // Random per test (the hasher's keys are): tests run in parallel, and a schema
        // left by a killed run must not collide with the next.
        let random =
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), test);
        let schema = format!("lh_test_{}_{random:016x}", std::process::id());
        Some(Db { url, schema, admin })
    }

    pub fn builder(&self) -> leasehold::postgres::PgStoreBuilder {
        PgStore::builder(&self.url).schema(&self.schema)
    }

    pub fn store(&self) -> PgStore {
        self.builder()
            .retry_policy(RetryPolicy {
                base: Duration::ZERO,
                max: Duration::ZERO,
                jitter: 0.0,
            })
            .open()
            .unwrap()
    }

    /// Moves job `id`'s lease expiry (and its index entry) a second into the past.
    pub fn lapse(&mut self, id: leasehold::JobId) {
        let sql = format!(
        "UPDATE {}.leasehold_jobs SET lease_expires_at = clock_timestamp() - interval '1 second',
         lease_indexed_expiry = clock_timestamp() - interval '1 second' WHERE id = $1",
        self.schema
    );
        assert_eq!(self.admin.execute(&sql, &[&(id.0 as i64)]).unwrap(), 1);
    }

    pub fn sql(&mut self, sql: &str) {
        self.admin
            .batch_execute(&sql.replace("{s}", &self.schema))
            .unwrap();
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
    }
}

/// The test's [`Db`], or a return where no server is configured.
macro_rules! db {
    ($name:literal) => {
        match $crate::db::Db::new($name) {
            Some(db) => db,
            None => return,
        }
    };
}

/// Waits for `cond` with a generous deadline (real threads run); panics on timeout.
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A helper process killed when the test ends, however it ends: one left running in a
/// namespace would hold the test's pipes (and the harness) open.
pub struct Helper(pub std::process::Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Helper {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Helper {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}
