//! A store of either kind on a manual clock, and `on_both!`, which makes each test of a
//! list a test on the redb store and a test on the PostgreSQL store (where
//! `LEASEHOLD_PG_URL` names a server; elsewhere that half says once that it did not run).
//!
//! A test written once against [`Backend`] holds for both stores, to the nanosecond of store
//! time: the PostgreSQL store is opened with a simulated clock that its statements read. On
//! drop a backend asserts that `check()` is clean, and drops its PostgreSQL schema.

#![allow(dead_code)] // each test binary uses its part

use std::sync::Arc;
use std::time::Duration;

use leasehold::postgres::client::{Client, NoTls};
use leasehold::{JobId, Lease, LeaseTerms, ManualClock, NewJob, RetryPolicy};

use crate::backends::ModelStore;

/// Which store a test runs on.
#[derive(Clone, Debug)]
pub enum Kind {
    Redb,
    /// The server's URL.
    Postgres(String),
    /// The server's URL, the store taking none of its one-statement shortcuts: every
    /// operation runs the protocol's own steps, which the shortcuts must agree with.
    PostgresProtocol(String),
    /// The store in memory: the protocol over plain maps.
    Memory,
}

impl Kind {
    /// The PostgreSQL store, if `LEASEHOLD_PG_URL` names a server; says once if not.
    pub fn postgres() -> Option<Kind> {
        match std::env::var("LEASEHOLD_PG_URL") {
            Ok(url) => Some(Kind::Postgres(url)),
            Err(_) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "the PostgreSQL half of these tests did not run: LEASEHOLD_PG_URL is not set"
                    );
                });
                None
            }
        }
    }

    /// A store of this kind with the default settings.
    pub fn open(self) -> Backend {
        Backend::open(self, Setup::default())
    }

    /// A store of this kind with `setup` applied.
    pub fn with(self, setup: Setup) -> Backend {
        Backend::open(self, setup)
    }
}

/// The settings both stores' builders take; `None` keeps the store's default.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub max_payload: Option<usize>,
    pub reap_batch: Option<usize>,
    pub default_max_attempts: Option<u32>,
    pub retry_policy: Option<RetryPolicy>,
    pub retention: Option<Duration>,
    /// PostgreSQL's: the round size from which a round's two halves run at once.
    pub side_by_side_from: Option<usize>,
}

impl Setup {
    pub fn max_payload(mut self, bytes: usize) -> Setup {
        self.max_payload = Some(bytes);
        self
    }
    pub fn reap_batch(mut self, n: usize) -> Setup {
        self.reap_batch = Some(n);
        self
    }
    pub fn default_max_attempts(mut self, n: u32) -> Setup {
        self.default_max_attempts = Some(n);
        self
    }
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Setup {
        self.retry_policy = Some(policy);
        self
    }
    pub fn retention(mut self, keep: Duration) -> Setup {
        self.retention = Some(keep);
        self
    }
    pub fn side_by_side_from(mut self, n: usize) -> Setup {
        self.side_by_side_from = Some(n);
        self
    }
}

/// A builder of either store with `setup` applied (their setters share names and types).
macro_rules! configured {
    ($builder:expr, $setup:expr) => {{
        let (mut b, s) = ($builder, &$setup);
        if let Some(n) = s.max_payload {
            b = b.max_payload(n);
        }
        if let Some(n) = s.reap_batch {
            b = b.reap_batch(n);
        }
        if let Some(n) = s.default_max_attempts {
            b = b.default_max_attempts(n);
        }
        if let Some(p) = s.retry_policy.clone() {
            b = b.retry_policy(p);
        }
        if let Some(d) = s.retention {
            b = b.retention(d);
        }
        b
    }};
}

/// Where a backend's data lives.
enum Place {
    Redb(tempfile::TempDir),
    Memory(leasehold::memory::MemoryStore),
    Postgres {
        url: String,
        schema: String,
        admin: Box<Client>,
        shortcuts: bool,
    },
}

/// A store of either kind on a manual clock. Derefs to the calls both share.
pub struct Backend {
    store: Option<Arc<dyn ModelStore>>,
    pub clock: ManualClock,
    setup: Setup,
    place: Place,
}

pub const Q: &str = "q";
pub const LEASE: Duration = Duration::from_secs(60);

/// The lease terms of [`LEASE`].
pub fn lease() -> LeaseTerms {
    LeaseTerms::new(LEASE)
}

/// The application's table the transactional tests write, one per backend: a redb table, or
/// a PostgreSQL table in the store's schema.
pub const APP_TABLE: &str = "app_values";

impl Backend {
    pub fn open(kind: Kind, setup: Setup) -> Backend {
        let clock = ManualClock::new();
        let place = match kind.clone() {
            Kind::Redb => Place::Redb(tempfile::tempdir().expect("tempdir")),
            Kind::Memory => Place::Memory(memory_store(&clock, &setup)),
            Kind::Postgres(url) | Kind::PostgresProtocol(url) => {
                let shortcuts = matches!(kind, Kind::Postgres(_));
                let mut admin = Client::connect(&url, NoTls).expect("connect as admin");
                // Random per backend (the hasher's keys are): tests run in parallel, and a
                // schema left by a killed run must not collide with the next.
                let random = std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    std::thread::current().id(),
                );
                let schema = format!("lh_both_{}_{random:016x}", std::process::id());
                admin
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .expect("drop a stale schema");
                Place::Postgres {
                    url,
                    schema,
                    admin: Box::new(admin),
                    shortcuts,
                }
            }
        };
        let mut backend = Backend {
            store: None,
            clock,
            setup,
            place,
        };
        backend.store = Some(backend.connect());
        if let Place::Postgres { schema, admin, .. } = &mut backend.place {
            admin
                .batch_execute(&format!(
                    "CREATE TABLE {schema}.{APP_TABLE} (key text PRIMARY KEY, value bigint NOT NULL)"
                ))
                .expect("the application's table");
        }
        backend
    }

    /// Opens a new handle on the backend's data with its clock and settings.
    fn connect(&self) -> Arc<dyn ModelStore> {
        match &self.place {
            Place::Memory(store) => Arc::new(store.clone()),
            Place::Redb(dir) => {
                let b = leasehold::Store::builder(dir.path().join("store.redb"))
                    .clock(self.clock.clone());
                Arc::new(
                    configured!(b, self.setup)
                        .open()
                        .expect("open the redb store"),
                )
            }
            Place::Postgres {
                url,
                schema,
                shortcuts,
                ..
            } => {
                let mut b = leasehold::postgres::PgStore::builder(url)
                    .schema(schema)
                    .simulated_clock(self.clock.clone())
                    .shortcuts(*shortcuts);
                if let Some(n) = self.setup.side_by_side_from {
                    b = b.side_by_side_from(n);
                }
                Arc::new(
                    configured!(b, self.setup)
                        .open()
                        .expect("open the PostgreSQL store"),
                )
            }
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self.place, Place::Postgres { .. })
    }

    /// Another handle on the same store, for a thread of the test's.
    pub fn handle(&self) -> Arc<dyn ModelStore> {
        self.store.clone().expect("store is open")
    }

    /// A handle of its own on the same data, as another machine would open it: a new
    /// PostgreSQL handle (its own connections); `None` on redb, whose file one writer (this
    /// process) holds.
    pub fn another_machine(&self) -> Option<Arc<dyn ModelStore>> {
        match self.place {
            Place::Postgres { .. } => Some(self.connect()),
            Place::Redb(_) | Place::Memory(_) => None,
        }
    }

    /// Closes the store and opens it again with the same clock and `setup` (a process that
    /// opens it with other settings).
    pub fn reopen_with(&mut self, setup: Setup) {
        if let Place::Memory(store) = &mut self.place {
            *store = store
                .with_policy(memory_policy(&setup))
                .expect("a valid policy");
        }
        self.setup = setup;
        self.reopen();
    }

    /// Whether the store has tables of the application's (redb's, PostgreSQL's; not the
    /// store in memory), for the tests of writes that commit with a completion.
    pub fn has_application_tables(&self) -> bool {
        !matches!(self.place, Place::Memory(_))
    }

    /// Closes the store (after its integrity check) and opens it again with the same clock.
    pub fn reopen(&mut self) {
        self.assert_clean();
        self.store = None;
        self.store = Some(self.connect());
    }

    /// Store time (the manual clock's, through the store).
    pub fn now(&self) -> leasehold::StoreTime {
        leasehold::ReadJobs::now(&**self.store.as_ref().expect("store is open"))
            .expect("store time")
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn enqueue_n(&self, n: usize) -> Vec<JobId> {
        self.enqueue_batch((0..n).map(|i| NewJob::new(Q, format!("job {i}"))).collect())
            .expect("enqueue")
    }

    pub fn claim_one(&self, worker: &str) -> Lease {
        self.claim(Q, worker, lease())
            .expect("claim")
            .expect("a claimable job")
    }

    /// Rewrites job `id`'s attempt counter, as a store that ran that many claims would hold.
    /// (The history then lacks those attempts: the test must not expect a clean check.)
    pub fn forge_attempt(&mut self, id: JobId, attempt: u32) {
        match &mut self.place {
            Place::Redb(dir) => {
                const JOBS: redb::TableDefinition<u64, &[u8]> =
                    redb::TableDefinition::new("leasehold.jobs");
                self.store = None;
                let db = redb::Database::open(dir.path().join("store.redb")).unwrap();
                let txn = db.begin_write().unwrap();
                {
                    use redb::ReadableTable;
                    let mut jobs = txn.open_table(JOBS).unwrap();
                    let record = jobs.get(id.0).unwrap().unwrap().value().to_vec();
                    let record = leasehold::__private::with_attempt(&record, attempt).unwrap();
                    jobs.insert(id.0, record.as_slice()).unwrap();
                }
                txn.commit().unwrap();
                drop(db);
                self.store = Some(self.connect());
            }
            Place::Memory(store) => leasehold::__private::forge_attempt(store, id, attempt),
            Place::Postgres { schema, admin, .. } => {
                let id = i64::try_from(id.0).unwrap();
                admin
                    .execute(
                        &format!("UPDATE {schema}.leasehold_jobs SET attempt = $1 WHERE id = $2"),
                        &[&i64::from(attempt), &id],
                    )
                    .unwrap();
            }
        }
    }

    /// Drops the store without its integrity check (a test that forged records knows it
    /// would fail).
    pub fn close_unchecked(&mut self) {
        self.store = None;
    }

    fn assert_clean(&self) {
        if let Some(store) = &self.store {
            assert_clean(store.check());
        }
    }
}

/// A store in memory on `clock` with `setup` applied.
fn memory_store(clock: &ManualClock, setup: &Setup) -> leasehold::memory::MemoryStore {
    leasehold::memory::MemoryStore::new(clock.clone())
        .with_policy(memory_policy(setup))
        .expect("a store in memory")
}

/// `setup`'s policy, for a store in memory.
fn memory_policy(setup: &Setup) -> leasehold::memory::Policy {
    let default = leasehold::memory::Policy::default();
    leasehold::memory::Policy {
        retry: setup.retry_policy.clone().unwrap_or_default(),
        default_max_attempts: setup
            .default_max_attempts
            .unwrap_or(default.default_max_attempts),
        max_payload: setup.max_payload.unwrap_or(default.max_payload),
        reap_batch: setup.reap_batch.unwrap_or(default.reap_batch),
        retention: setup.retention,
    }
}

/// Fails the test unless the integrity check ran and found nothing.
pub fn assert_clean(check: leasehold::Result<leasehold::CheckReport>) {
    let report = check.expect("check runs");
    assert!(
        report.is_clean(),
        "integrity check failed: {:#?}",
        report.problems
    );
}

impl std::ops::Deref for Backend {
    type Target = dyn ModelStore;
    fn deref(&self) -> &Self::Target {
        &**self.store.as_ref().expect("store is open")
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_clean();
        }
        self.store = None;
        if let Place::Postgres { schema, admin, .. } = &mut self.place {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

/// Each test of the list, a function taking a [`Kind`], as a test on redb (in a module
/// `redb`), on the store in memory (`memory`) and on PostgreSQL (`postgres`). With `with f;` first, each test
/// takes `f(kind)` instead. With `and protocol;` after it, each also runs on PostgreSQL
/// with none of its shortcuts (in a module `postgres_protocol`): the protocol's own steps.
macro_rules! on_both {
    (with $open:path; and protocol; $($rule:ident),* $(,)?) => {
        $crate::on_both::on_both!(with $open; $($rule),*);

        mod postgres_protocol {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $rule() {
                    if let Some($crate::on_both::Kind::Postgres(url)) = $crate::on_both::Kind::postgres() {
                        super::$rule($open($crate::on_both::Kind::PostgresProtocol(url)))
                    }
                }
            )*
        }
    };
    (with $open:path; $($rule:ident),* $(,)?) => {
        mod redb {
            #[allow(unused_imports)]
            use super::*;
            $( #[test] fn $rule() { super::$rule($open($crate::on_both::Kind::Redb)) } )*
        }
        mod memory {
            #[allow(unused_imports)]
            use super::*;
            $( #[test] fn $rule() { super::$rule($open($crate::on_both::Kind::Memory)) } )*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $rule() {
                    if let Some(kind) = $crate::on_both::Kind::postgres() {
                        super::$rule($open(kind))
                    }
                }
            )*
        }
    };
    (and protocol; $($rule:ident),* $(,)?) => {
        $crate::on_both::on_both!(with std::convert::identity; and protocol; $($rule),*);
    };
    ($($rule:ident),* $(,)?) => {
        $crate::on_both::on_both!(with std::convert::identity; $($rule),*);
    };
}
#[allow(unused_imports)]
pub(crate) use on_both;
