//! The calls the redb `Store` and the PostgreSQL `PgStore` share, as one trait: what the
//! model-based test and the simulation drive, so that each runs against both backends.

use leasehold::{
    CheckReport, Job, JobId, JobState, Lease, LeaseTerms, NewJob, ReapReport, Renewal, Run, Stats,
    Store, StoreTime,
};

/// What the harness asks of a store: the calls the redb `Store` and the `PgStore` share.
#[allow(dead_code)] // each test binary uses its part
pub trait ModelStore {
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
}

macro_rules! model_store {
    ($store:ty, $now:expr) => {
        impl ModelStore for $store {
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
        }
    };
}

model_store!(Store, Store::now);
#[cfg(feature = "postgres")]
model_store!(
    leasehold::postgres::PgStore,
    |s: &leasehold::postgres::PgStore| s.now().expect("the database's clock")
);
