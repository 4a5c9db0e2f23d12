//! The calls the redb `Store` and the PostgreSQL `PgStore` share, as one trait: what the
//! model-based test and the simulation drive, so that each runs against both backends.

use std::time::Duration;

use leasehold::{
    CheckReport, Job, JobId, JobState, Lease, LeaseTerms, NewJob, ReapReport, Reaper, Renewal, Run,
    Stats, Store, StoreTime,
};

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

    /// What the write ends with, after its own statements: an error or a panic if asked.
    fn end(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if self.then_panic {
            panic!("writes exploded");
        }
        match self.then_fail {
            true => Err(AppWrite::FAILURE.into()),
            false => Ok(()),
        }
    }
}

/// What the harness asks of a store: the calls the redb `Store` and the `PgStore` share.
#[allow(dead_code)] // each test binary uses its part
pub trait ModelStore: Send + Sync {
    fn now(&self) -> StoreTime;
    fn enqueue(&self, job: NewJob) -> leasehold::Result<JobId>;
    fn enqueue_batch(&self, jobs: Vec<NewJob>) -> leasehold::Result<Vec<JobId>>;
    fn claim(&self, q: &str, w: &str, terms: LeaseTerms) -> leasehold::Result<Option<Lease>>;
    fn claim_batch(
        &self,
        q: &str,
        w: &str,
        terms: LeaseTerms,
        n: usize,
    ) -> leasehold::Result<Vec<Lease>>;
    fn claim_job(&self, id: JobId, w: &str, terms: LeaseTerms) -> leasehold::Result<Option<Lease>>;
    fn heartbeat(&self, l: &Lease, progress: u64) -> leasehold::Result<Renewal>;
    fn complete(&self, l: &Lease, output: &[u8]) -> leasehold::Result<()>;
    fn complete_batch(&self, done: &[(&Lease, &[u8])]) -> Vec<leasehold::Result<()>>;
    fn fail(&self, l: &Lease, error: &str) -> leasehold::Result<JobState>;
    fn release(&self, l: &Lease) -> leasehold::Result<()>;
    fn cancel(&self, id: JobId) -> leasehold::Result<JobState>;
    fn retry(&self, id: JobId) -> leasehold::Result<()>;
    fn reap(&self) -> leasehold::Result<ReapReport>;
    fn check(&self) -> leasehold::Result<CheckReport>;
    fn stats(&self) -> leasehold::Result<Stats>;
    fn job(&self, id: JobId) -> leasehold::Result<Option<Job>>;
    fn history(&self, id: JobId) -> leasehold::Result<Vec<Run>>;
    fn output(&self, id: JobId) -> leasehold::Result<Option<Vec<u8>>>;
    fn payload(&self, id: JobId) -> leasehold::Result<Option<Vec<u8>>>;
    fn complete_and_claim(
        &self,
        l: &Lease,
        output: &[u8],
        terms: LeaseTerms,
    ) -> leasehold::Result<Option<Lease>>;
    fn heartbeat_batch(&self, beats: &[(&Lease, u64)]) -> Vec<leasehold::Result<Renewal>>;
    fn purge(&self, older_than: Duration, states: &[JobState]) -> leasehold::Result<usize>;
    fn start_reaper(&self, every: Duration) -> leasehold::Result<Reaper>;
    fn work_generation(&self, queue: &str) -> u64;
    fn wake_all(&self);
    #[cfg(feature = "tokio")]
    fn wait_for_work_async<'a>(
        &'a self,
        queue: &'a str,
        seen: u64,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = u64> + 'a>>;
    fn wait_for_work(&self, queue: &str, seen: u64, timeout: Duration) -> u64;
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
    fn pool(&self, queue: &str) -> leasehold::PoolBuilder;
    /// A handler's output whose application write commits with its completion.
    fn app_output(&self, output: Vec<u8>, app: AppWrite) -> leasehold::Output;
}

macro_rules! model_store {
    ($store:ty, $now:expr, { $($own:tt)* }) => {
        impl ModelStore for $store {
            $($own)*
            fn now(&self) -> StoreTime {
                $now(self)
            }
            fn enqueue(&self, job: NewJob) -> leasehold::Result<JobId> {
                <$store>::enqueue(self, job)
            }
            fn enqueue_batch(&self, jobs: Vec<NewJob>) -> leasehold::Result<Vec<JobId>> {
                <$store>::enqueue_batch(self, jobs)
            }
            fn claim(&self, q: &str, w: &str, t: LeaseTerms) -> leasehold::Result<Option<Lease>> {
                <$store>::claim(self, q, w, t)
            }
            fn claim_batch(
                &self,
                q: &str,
                w: &str,
                t: LeaseTerms,
                n: usize,
            ) -> leasehold::Result<Vec<Lease>> {
                <$store>::claim_batch(self, q, w, t, n)
            }
            fn claim_job(
                &self,
                id: JobId,
                w: &str,
                t: LeaseTerms,
            ) -> leasehold::Result<Option<Lease>> {
                <$store>::claim_job(self, id, w, t)
            }
            fn heartbeat(&self, l: &Lease, p: u64) -> leasehold::Result<Renewal> {
                <$store>::heartbeat(self, l, p)
            }
            fn complete(&self, l: &Lease, o: &[u8]) -> leasehold::Result<()> {
                <$store>::complete(self, l, o)
            }
            fn complete_batch(&self, done: &[(&Lease, &[u8])]) -> Vec<leasehold::Result<()>> {
                <$store>::complete_batch(self, done)
            }
            fn fail(&self, l: &Lease, e: &str) -> leasehold::Result<JobState> {
                <$store>::fail(self, l, e)
            }
            fn release(&self, l: &Lease) -> leasehold::Result<()> {
                <$store>::release(self, l)
            }
            fn cancel(&self, id: JobId) -> leasehold::Result<JobState> {
                <$store>::cancel(self, id)
            }
            fn retry(&self, id: JobId) -> leasehold::Result<()> {
                <$store>::retry(self, id)
            }
            fn reap(&self) -> leasehold::Result<ReapReport> {
                <$store>::reap(self)
            }
            fn check(&self) -> leasehold::Result<CheckReport> {
                <$store>::check(self)
            }
            fn stats(&self) -> leasehold::Result<Stats> {
                <$store>::stats(self)
            }
            fn job(&self, id: JobId) -> leasehold::Result<Option<Job>> {
                <$store>::job(self, id)
            }
            fn history(&self, id: JobId) -> leasehold::Result<Vec<Run>> {
                <$store>::history(self, id)
            }
            fn output(&self, id: JobId) -> leasehold::Result<Option<Vec<u8>>> {
                <$store>::output(self, id)
            }
            fn payload(&self, id: JobId) -> leasehold::Result<Option<Vec<u8>>> {
                <$store>::payload(self, id)
            }
            fn complete_and_claim(
                &self,
                l: &Lease,
                o: &[u8],
                t: LeaseTerms,
            ) -> leasehold::Result<Option<Lease>> {
                <$store>::complete_and_claim(self, l, o, t)
            }
            fn heartbeat_batch(&self, beats: &[(&Lease, u64)]) -> Vec<leasehold::Result<Renewal>> {
                <$store>::heartbeat_batch(self, beats)
            }
            fn purge(&self, older: Duration, states: &[JobState]) -> leasehold::Result<usize> {
                <$store>::purge(self, older, states)
            }
            fn start_reaper(&self, every: Duration) -> leasehold::Result<Reaper> {
                Reaper::start(self.clone(), every)
            }
            fn pool(&self, queue: &str) -> leasehold::PoolBuilder {
                leasehold::WorkerPool::builder(self.clone(), queue)
            }
            fn work_generation(&self, queue: &str) -> u64 {
                <$store>::work_generation(self, queue)
            }
            fn wake_all(&self) {
                <$store>::wake_all(self)
            }
            #[cfg(feature = "tokio")]
            fn wait_for_work_async<'a>(
                &'a self,
                queue: &'a str,
                seen: u64,
                timeout: Duration,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = u64> + 'a>> {
                Box::pin(<$store>::wait_for_work_async(self, queue, seen, timeout))
            }
            fn wait_for_work(&self, queue: &str, seen: u64, timeout: Duration) -> u64 {
                <$store>::wait_for_work(self, queue, seen, timeout)
            }
        }
    };
}

/// The application's table on redb.
const APP: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("app_values");

type AppResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

model_store!(Store, Store::now, {
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
        self.complete_with(l, output, |t| -> AppResult {
            app.ran.set(true);
            t.open_table(APP)?.insert(app.key.as_str(), app.value)?;
            if let Some(job) = &app.follow_up {
                next = Some(t.enqueue(job.clone())?);
            }
            app.end()
        })?;
        Ok(next)
    }
    fn app_output(&self, output: Vec<u8>, app: AppWrite) -> leasehold::Output {
        leasehold::Output::with_writes(output, move |t| -> AppResult {
            t.open_table(APP)?.insert(app.key.as_str(), app.value)?;
            if let Some(job) = &app.follow_up {
                t.enqueue(job.clone())?;
            }
            app.end()
        })
    }
    fn transaction_app(&self, app: &AppWrite) -> leasehold::Result<Option<JobId>> {
        self.transaction(|t| {
            app.ran.set(true);
            let mut next = None;
            if let Some(job) = &app.follow_up {
                next = Some(t.enqueue(job.clone())?);
            }
            t.open_table(APP)?
                .insert(app.key.as_str(), app.value)
                .map_err(redb::Error::from)?;
            match app.then_fail {
                true => Err(leasehold::Error::Application(AppWrite::FAILURE.into())),
                false => Ok(next),
            }
        })
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
model_store!(
    leasehold::postgres::PgStore,
    |s: &leasehold::postgres::PgStore| s.now().expect("the database's clock"),
    {
        fn write_transactions(&self) -> Option<u64> {
            None
        }
        fn complete_with_app(
            &self,
            l: &Lease,
            output: &[u8],
            app: &AppWrite,
        ) -> leasehold::Result<Option<JobId>> {
            let mut next = None;
            let upsert = pg_upsert(self);
            self.complete_with(l, output, |t| -> AppResult {
                app.ran.set(true);
                t.sql()
                    .execute(&upsert, &[&app.key, &pg_value(app.value)])?;
                if let Some(job) = &app.follow_up {
                    next = Some(t.enqueue(job.clone())?);
                }
                app.end()
            })?;
            Ok(next)
        }
        fn app_output(&self, output: Vec<u8>, app: AppWrite) -> leasehold::Output {
            let upsert = pg_upsert(self);
            leasehold::Output::with_sql(output, move |t| -> AppResult {
                t.sql()
                    .execute(&upsert, &[&app.key, &pg_value(app.value)])?;
                if let Some(job) = &app.follow_up {
                    t.enqueue(job.clone())?;
                }
                app.end()
            })
        }
        fn transaction_app(&self, app: &AppWrite) -> leasehold::Result<Option<JobId>> {
            let upsert = pg_upsert(self);
            self.transaction_with(|t| {
                app.ran.set(true);
                let mut next = None;
                if let Some(job) = &app.follow_up {
                    next = Some(t.enqueue(job.clone())?);
                }
                t.sql()
                    .execute(&upsert, &[&app.key, &pg_value(app.value)])?;
                match app.then_fail {
                    true => Err(leasehold::Error::Application(AppWrite::FAILURE.into())),
                    false => Ok(next),
                }
            })
        }
        fn app_value(&self, key: &str) -> Option<u64> {
            let select = format!(
                "SELECT value FROM {}.app_values WHERE key = $1",
                self.schema()
            );
            self.transaction_with(|t| Ok(t.sql().query_opt(&select, &[&key])?))
                .expect("read")
                .map(|row| u64::try_from(row.get::<_, i64>(0)).expect("a stored u64"))
        }
    }
);

#[cfg(feature = "postgres")]
fn pg_upsert(store: &leasehold::postgres::PgStore) -> String {
    format!(
        "INSERT INTO {}.app_values (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        store.schema()
    )
}

#[cfg(feature = "postgres")]
fn pg_value(v: u64) -> i64 {
    i64::try_from(v).expect("a value PostgreSQL's bigint holds")
}
