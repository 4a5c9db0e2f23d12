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
            .retry_policy(RetryPolicy::fixed(Duration::ZERO))
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
    // Generous: a loaded CI machine runs the kill tests' worker processes slowly, and the
    // deadline only stops a test that would otherwise hang.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
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

/// A `pg-pool` helper process (`tests/support/pg_pool.rs`): a worker pool on queue `pp` of
/// the test's schema, whose odd jobs never look at their interruption and finish (with an
/// `effects` row in their SQL) once the file `go` exists; its stdout read line by line.
pub struct PgPool {
    pub process: Helper,
    said: crossbeam_channel::Receiver<String>,
}

impl PgPool {
    /// Starts one through `prefix` (`ip netns exec <name>`, say; empty for none).
    pub fn start(
        prefix: &[&str],
        url: &str,
        db: &Db,
        lease_ms: u64,
        workers: usize,
        go: &std::path::Path,
    ) -> PgPool {
        let (lease_ms, workers) = (lease_ms.to_string(), workers.to_string());
        let args = [
            "--url",
            url,
            "--schema",
            &db.schema,
            "--lease-ms",
            &lease_ms,
            "--workers",
            &workers,
            "--go",
            go.to_str().unwrap(),
        ];
        let mut process = Helper(
            crate::helper_process::command_under(prefix, "pg-pool", args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let said = crate::helper_process::stdout_channel(&mut process);
        PgPool { process, said }
    }

    /// The pool's next line starting with `prefix`; a minute without one fails the test.
    pub fn next_line(&self, prefix: &str) -> String {
        loop {
            let line = self
                .said
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the pool said no \"{prefix}\" line in a minute"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }
}

/// Claims every job of queue `pp` it can as `survivor` and completes each with its
/// `effects` row; adds their ids to `taken`.
pub fn survive(store: &PgStore, schema: &str, taken: &mut std::collections::BTreeSet<u64>) {
    let sql = format!("INSERT INTO {schema}.effects (job, who) VALUES ($1, 'survivor')");
    while let Some(lease) = store.claim("pp", "survivor", LEASE).unwrap() {
        let job = lease.job.0 as i64;
        store
            .complete_with(&lease, b"survivor", |t| {
                t.sql().execute(&sql, &[&job])?;
                Ok::<(), postgres::Error>(())
            })
            .unwrap();
        taken.insert(lease.job.0);
    }
}

/// The `effects` table's rows, (job, who), by job.
/// How many effect rows each job has, of a soak's `effects (job)` table.
pub fn effects_per_job(db: &mut Db) -> std::collections::BTreeMap<i64, i64> {
    let sql = format!(
        "SELECT job, count(*) FROM {}.effects GROUP BY job",
        db.schema
    );
    (db.admin.query(&sql, &[]).unwrap().iter())
        .map(|r| (r.try_get(0).unwrap(), r.try_get(1).unwrap()))
        .collect()
}

pub fn effects(db: &mut Db) -> Vec<(i64, String)> {
    db.admin
        .query(
            &format!("SELECT job, who FROM {}.effects ORDER BY job", db.schema),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.try_get(0).unwrap(), row.try_get(1).unwrap()))
        .collect()
}
