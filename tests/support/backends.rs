//! The calls the redb `Store` and the PostgreSQL `PgStore` share, as one trait: what the
//! model-based test and the simulation drive, so that each runs against both backends.

use std::time::Duration;

use leasehold::{JobId, JobStore, Lease, NewJob, Reaper, Store};

/// What the application writes in a store's transaction, for the transactional tests:
/// `key = value` in its own table (`app_values`), a follow-up job if any, then an error of
/// its own if `then_fail`. `ran` tells whether the store let it run.
#[allow(dead_code)] // each test binary uses its part
#[derive(Default)]
pub struct AppWrite {
    pub key: String,
    pub value: u64,
    pub follow_up: Option<NewJob>,
    pub then_fail: bool,
    pub then_panic: bool,
    pub ran: std::cell::Cell<bool>,
}

#[allow(dead_code)]
impl AppWrite {
    pub fn new(key: impl Into<String>, value: u64) -> AppWrite {
        AppWrite {
            key: key.into(),
            value,
            ..AppWrite::default()
        }
    }

    /// The error the application's write ends with when `then_fail`.
    pub const FAILURE: &'static str = "the application's write did not validate";

    /// The write in the store's transaction `t`: `key = value`, the follow-up job if any,
    /// then the error or panic asked for. Returns the follow-up's id.
    fn apply(&self, t: &mut dyn AppTx) -> Result<Option<JobId>, BoxError> {
        self.ran.set(true);
        t.put(&self.key, self.value)?;
        let next = match &self.follow_up {
            Some(job) => Some(t.enqueue(job.clone())?),
            None => None,
        };
        if self.then_panic {
            panic!("writes exploded");
        }
        match self.then_fail {
            true => Err(AppWrite::FAILURE.into()),
            false => Ok(next),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A transaction held open on a thread of its own, and what ends it; see
/// [`ModelStore::stall_writes_to`].
pub struct Stall {
    release: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stall {
    /// Runs `hold` (which calls `entered` once it holds what stalls the writes, then waits
    /// on `released`) on a thread, and returns once it holds.
    fn start(
        hold: impl FnOnce(crossbeam_channel::Sender<()>, crossbeam_channel::Receiver<()>)
        + Send
        + 'static,
    ) -> Stall {
        let (entered_tx, entered_rx) = crossbeam_channel::bounded(1);
        let (release_tx, release_rx) = crossbeam_channel::bounded(0);
        let thread = std::thread::spawn(move || hold(entered_tx, release_rx));
        entered_rx.recv().expect("the stalling transaction began");
        Stall {
            release: Some(release_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The application's error as the store returns it from a transaction of its own.
fn store_error(e: BoxError) -> leasehold::Error {
    match e.downcast::<leasehold::Error>() {
        Ok(ours) => *ours,
        Err(theirs) => leasehold::Error::Application(theirs),
    }
}

/// A store's transaction as the application's write sees it: its own table, and enqueues.
trait AppTx {
    fn put(&mut self, key: &str, value: u64) -> Result<(), BoxError>;
    fn enqueue(&mut self, job: NewJob) -> leasehold::Result<JobId>;
}

/// The application's table on redb.
const APP: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("app_values");

impl AppTx for leasehold::Transaction<'_, '_> {
    fn put(&mut self, key: &str, value: u64) -> Result<(), BoxError> {
        self.open_table(APP)?.insert(key, value)?;
        Ok(())
    }
    fn enqueue(&mut self, job: NewJob) -> leasehold::Result<JobId> {
        leasehold::Transaction::enqueue(self, job)
    }
}

/// A PostgreSQL transaction and the statement that writes the application's table.
#[cfg(feature = "postgres")]
struct PgApp<'a, 't, 'c> {
    t: &'a mut leasehold::postgres::PgTransaction<'t, 'c>,
    upsert: &'a str,
}

#[cfg(feature = "postgres")]
impl AppTx for PgApp<'_, '_, '_> {
    fn put(&mut self, key: &str, value: u64) -> Result<(), BoxError> {
        let value = i64::try_from(value)?;
        self.t.sql().execute(self.upsert, &[&key, &value])?;
        Ok(())
    }
    fn enqueue(&mut self, job: NewJob) -> leasehold::Result<JobId> {
        self.t.enqueue(job)
    }
}

/// What the harness asks of a store: the contract both engines keep ([`JobStore`]), and
/// what only tests need (the application's writes of each engine's kind, a pool, a stall).
#[allow(dead_code)] // each test binary uses its part
pub trait ModelStore: JobStore {
    fn start_reaper(&self, every: Duration) -> leasehold::Result<Reaper>;
    fn start_scheduler(&self, interval: Duration) -> leasehold::Result<leasehold::Scheduler>;
    /// Completes `l` and, in the same transaction, makes the application's write; returns
    /// the follow-up job's id if it enqueued one.
    fn complete_with_app(
        &self,
        l: &Lease,
        output: &[u8],
        app: &AppWrite,
    ) -> leasehold::Result<Option<JobId>>;
    /// The application's write alone, in one store transaction.
    fn transaction_app(&self, app: &AppWrite) -> leasehold::Result<Option<JobId>>;
    /// The application's value under `key`, as committed.
    fn app_value(&self, key: &str) -> Option<u64>;
    /// The write transactions committed so far, where the store counts them (redb).
    fn write_transactions(&self) -> Option<u64>;
    /// A pool on this store.
    fn pool(&self, queues: leasehold::Queues) -> leasehold::PoolBuilder;
    /// Makes writes to job `id` wait (redb: the writer's seat held; PostgreSQL: the job's
    /// row locked) until the returned guard drops: a store that stopped answering.
    fn stall_writes_to(&self, id: JobId) -> Stall;
    /// A handler's output whose application write commits with its completion.
    fn app_output(&self, output: Vec<u8>, app: AppWrite)
    -> leasehold::Output<leasehold::AnyWrites>;
}

macro_rules! model_store {
    ($store:ty, { $($own:tt)* }) => {
        impl ModelStore for $store {
            $($own)*
            fn start_reaper(&self, every: Duration) -> leasehold::Result<Reaper> {
                Reaper::start(self.clone(), every)
            }
            fn start_scheduler(
                &self,
                interval: Duration,
            ) -> leasehold::Result<leasehold::Scheduler> {
                leasehold::Scheduler::start(self.clone(), interval)
            }
            fn pool(&self, queues: leasehold::Queues) -> leasehold::PoolBuilder {
                leasehold::WorkerPool::builder(leasehold::Backend::from(self.clone()), queues)
            }
        }
    };
}

model_store!(Store, {
    fn stall_writes_to(&self, _id: JobId) -> Stall {
        let store = self.clone();
        Stall::start(move |entered, released| {
            let _ = store.transaction(|_t| {
                let _ = entered.send(());
                let _ = released.recv();
                Ok(())
            });
        })
    }
    fn write_transactions(&self) -> Option<u64> {
        Some(self.metrics().write_transactions)
    }
    fn complete_with_app(
        &self,
        l: &Lease,
        output: &[u8],
        app: &AppWrite,
    ) -> leasehold::Result<Option<JobId>> {
        let mut next = None;
        self.complete_with(l, output, |t| {
            next = app.apply(t)?;
            Ok::<(), BoxError>(())
        })?;
        Ok(next)
    }
    fn app_output(
        &self,
        output: Vec<u8>,
        app: AppWrite,
    ) -> leasehold::Output<leasehold::AnyWrites> {
        leasehold::Output::with_writes(output, move |t| app.apply(t).map(|_| ())).into_any()
    }
    fn transaction_app(&self, app: &AppWrite) -> leasehold::Result<Option<JobId>> {
        self.transaction(|t| app.apply(t).map_err(store_error))
    }
    fn app_value(&self, key: &str) -> Option<u64> {
        let read = self.begin_read().expect("read");
        match read.open_table(APP) {
            Ok(table) => table.get(key).expect("read").map(|g| g.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => panic!("{e}"),
        }
    }
});

#[cfg(feature = "postgres")]
model_store!(leasehold::postgres::PgStore, {
    fn write_transactions(&self) -> Option<u64> {
        None
    }
    fn stall_writes_to(&self, id: JobId) -> Stall {
        let store = self.clone();
        let lock = format!(
            "SELECT 1 FROM {}.leasehold_jobs WHERE id = $1 FOR UPDATE",
            self.schema()
        );
        let id = i64::try_from(id.0).expect("a job id PostgreSQL holds");
        Stall::start(move |entered, released| {
            let _ = store.transaction(|t| {
                t.sql().execute(&lock, &[&id])?;
                let _ = entered.send(());
                let _ = released.recv();
                Ok(())
            });
        })
    }
    fn complete_with_app(
        &self,
        l: &Lease,
        output: &[u8],
        app: &AppWrite,
    ) -> leasehold::Result<Option<JobId>> {
        let (mut next, upsert) = (None, pg_upsert(self));
        self.complete_with(l, output, |t| {
            next = app.apply(&mut PgApp { t, upsert: &upsert })?;
            Ok::<(), BoxError>(())
        })?;
        Ok(next)
    }
    fn app_output(
        &self,
        output: Vec<u8>,
        app: AppWrite,
    ) -> leasehold::Output<leasehold::AnyWrites> {
        let upsert = pg_upsert(self);
        leasehold::Output::with_sql(output, move |t| {
            app.apply(&mut PgApp { t, upsert: &upsert }).map(|_| ())
        })
        .into_any()
    }
    fn transaction_app(&self, app: &AppWrite) -> leasehold::Result<Option<JobId>> {
        let upsert = pg_upsert(self);
        self.transaction(|t| {
            app.apply(&mut PgApp { t, upsert: &upsert })
                .map_err(store_error)
        })
    }
    fn app_value(&self, key: &str) -> Option<u64> {
        let select = format!(
            "SELECT value FROM {}.app_values WHERE key = $1",
            self.schema()
        );
        self.transaction(|t| Ok(t.sql().query_opt(&select, &[&key])?))
            .expect("read")
            .map(|row| u64::try_from(row.try_get::<_, i64>(0).unwrap()).expect("a stored u64"))
    }
});

#[cfg(feature = "postgres")]
fn pg_upsert(store: &leasehold::postgres::PgStore) -> String {
    format!(
        "INSERT INTO {}.app_values (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        store.schema()
    )
}

/// The store in memory has no tables of the application's: what needs them is refused.
fn no_application_tables() -> leasehold::Error {
    leasehold::Error::Application("a store in memory has no tables of the application's".into())
}

model_store!(leasehold::memory::MemoryStore, {
    fn write_transactions(&self) -> Option<u64> {
        None
    }
    fn stall_writes_to(&self, _id: JobId) -> Stall {
        let store = self.clone();
        Stall::start(move |entered, released| {
            store.hold_writes(|| {
                let _ = entered.send(());
                let _ = released.recv();
            })
        })
    }
    fn complete_with_app(
        &self,
        _l: &Lease,
        _output: &[u8],
        _app: &AppWrite,
    ) -> leasehold::Result<Option<JobId>> {
        Err(no_application_tables())
    }
    fn app_output(
        &self,
        output: Vec<u8>,
        _app: AppWrite,
    ) -> leasehold::Output<leasehold::AnyWrites> {
        leasehold::Output::new(output)
    }
    fn transaction_app(&self, _app: &AppWrite) -> leasehold::Result<Option<JobId>> {
        Err(no_application_tables())
    }
    fn app_value(&self, _key: &str) -> Option<u64> {
        None
    }
});
