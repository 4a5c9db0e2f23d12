//! Where the tool works: a store file, or a PostgreSQL database named by a `postgres://` URL
//! in `--db` (or `LEASEHOLD_DB`). Each command is written once, against [`Reader`] or
//! [`Writer`]; what only a file has (a writer's pid, a clean close, processes sharing it)
//! answers as "none" on PostgreSQL.

use std::path::Path;
use std::time::Duration;

use leasehold::postgres::PgStore;
use leasehold::{
    CheckReport, Error, HolderState, InstanceId, Job, JobFilter, JobId, JobState, NewJob,
    QueueTiming, ReapReport, Run, Stats, Store, StoreReader, StoreTime,
};

/// The PostgreSQL URL in `db`, if it is one.
pub fn postgres_url(db: &Path) -> Option<&str> {
    let s = db.to_str()?;
    (s.starts_with("postgres://") || s.starts_with("postgresql://")).then_some(s)
}

/// Opens the PostgreSQL store at `url`. A `schema=` parameter of the URL's query names the
/// schema holding leasehold's tables (default `leasehold`); the rest of the URL is
/// PostgreSQL's.
pub fn open_postgres(url: &str, create: bool) -> Result<PgStore, Error> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| match p.strip_prefix("schema=") {
            Some(s) => {
                schema = Some(s.to_owned());
                false
            }
            None => true,
        })
        .collect();
    let url = match rest.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", rest.join("&")),
    };
    let builder = PgStore::builder(url).create_if_missing(create);
    match schema {
        Some(schema) => builder.schema(schema).open(),
        None => builder.open(),
    }
}

/// `db` as the tool shows it: a URL without its password.
pub fn describe(db: &Path) -> String {
    let Some(url) = postgres_url(db) else {
        return db.display().to_string();
    };
    match url.split_once("://").and_then(|(scheme, rest)| {
        let (userinfo, host) = rest.split_once('@')?;
        let (user, _password) = userinfo.split_once(':')?;
        Some(format!("{scheme}://{user}:***@{host}"))
    }) {
        Some(redacted) => redacted,
        None => url.to_owned(),
    }
}

/// The read side of a store file or a database.
pub enum Reader {
    File(StoreReader),
    Postgres(PgStore),
}

impl Reader {
    /// Opens for reading: a file read-only (see [`StoreReader::open`]), a database as is.
    pub fn open(db: &Path) -> Result<Reader, Error> {
        match postgres_url(db) {
            // A read never makes a store: a mistyped schema is refused, not created empty.
            Some(url) => Ok(Reader::Postgres(open_postgres(url, false)?)),
            None => Ok(Reader::File(StoreReader::open(db)?)),
        }
    }

    /// A store time as an operator reads it: a file's store time counts from the store's
    /// own start (`t+12.5s`); a database's is its clock, shown as a UTC date (counted from
    /// the Unix epoch, it read `t+1796171245s`).
    pub fn describe_time(&self, t: StoreTime) -> String {
        match self {
            Reader::File(_) => t.to_string(),
            Reader::Postgres(_) => {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(t.as_nanos());
                humantime::format_rfc3339_millis(at).to_string()
            }
        }
    }

    pub fn now(&self) -> StoreTime {
        match self {
            Reader::File(r) => r.now(),
            Reader::Postgres(p) => p.now().unwrap_or(StoreTime::ZERO),
        }
    }

    pub fn stats(&self) -> Result<Stats, Error> {
        match self {
            Reader::File(r) => r.stats(),
            Reader::Postgres(p) => p.stats(),
        }
    }

    pub fn timing(&self, queue: &str) -> Result<QueueTiming, Error> {
        match self {
            Reader::File(r) => r.timing(queue),
            Reader::Postgres(p) => p.timing(queue),
        }
    }

    pub fn jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, Error> {
        match self {
            Reader::File(r) => r.jobs(filter),
            Reader::Postgres(p) => p.jobs(filter),
        }
    }

    pub fn job(&self, id: JobId) -> Result<Option<Job>, Error> {
        match self {
            Reader::File(r) => r.job(id),
            Reader::Postgres(p) => p.job(id),
        }
    }

    pub fn history(&self, id: JobId) -> Result<Vec<Run>, Error> {
        match self {
            Reader::File(r) => r.history(id),
            Reader::Postgres(p) => p.history(id),
        }
    }

    pub fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>, Error> {
        match self {
            Reader::File(r) => r.payload(id),
            Reader::Postgres(p) => p.payload(id),
        }
    }

    pub fn output(&self, id: JobId) -> Result<Option<Vec<u8>>, Error> {
        match self {
            Reader::File(r) => r.output(id),
            Reader::Postgres(p) => p.output(id),
        }
    }

    pub fn check(&self) -> Result<CheckReport, Error> {
        match self {
            Reader::File(r) => r.check(),
            Reader::Postgres(p) => p.check(),
        }
    }

    /// Whether the last writer closed the file cleanly (a database is always consistent).
    pub fn closed_cleanly(&self) -> bool {
        match self {
            Reader::File(r) => r.closed_cleanly(),
            Reader::Postgres(_) => true,
        }
    }

    pub fn writer_pid(&self) -> Result<Option<u32>, Error> {
        match self {
            Reader::File(r) => r.writer_pid(),
            Reader::Postgres(_) => Ok(None),
        }
    }

    /// Who holds each running lease, where processes share a store file.
    pub fn holders(&self) -> Result<Vec<(JobId, InstanceId, HolderState)>, Error> {
        match self {
            Reader::File(r) if r.sharing()? == leasehold::Sharing::MultiProcess => r.holders(),
            _ => Ok(Vec::new()),
        }
    }

    pub fn shared_by_processes(&self) -> Result<bool, Error> {
        match self {
            Reader::File(r) => Ok(r.sharing()? == leasehold::Sharing::MultiProcess),
            Reader::Postgres(_) => Ok(false),
        }
    }
}

/// The write side of a store file or a database.
pub enum Writer {
    File(Store),
    Postgres(PgStore),
}

impl Writer {
    pub fn enqueue(&self, job: NewJob) -> Result<JobId, Error> {
        match self {
            Writer::File(s) => s.enqueue(job),
            Writer::Postgres(p) => p.enqueue(job),
        }
    }

    pub fn retry(&self, id: JobId) -> Result<(), Error> {
        match self {
            Writer::File(s) => s.retry(id),
            Writer::Postgres(p) => p.retry(id),
        }
    }

    pub fn cancel(&self, id: JobId) -> Result<JobState, Error> {
        match self {
            Writer::File(s) => s.cancel(id),
            Writer::Postgres(p) => p.cancel(id),
        }
    }

    pub fn purge(&self, older_than: Duration, states: &[JobState]) -> Result<usize, Error> {
        match self {
            Writer::File(s) => s.purge(older_than, states),
            Writer::Postgres(p) => p.purge(older_than, states),
        }
    }

    /// One reaper pass. On a database, a vacuum the pass started is waited for: the server
    /// would cancel it when this process's connection closes.
    pub fn reap(&self) -> Result<ReapReport, Error> {
        match self {
            Writer::File(s) => s.reap(),
            Writer::Postgres(p) => {
                let report = p.reap()?;
                while p.vacuum_running() {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(report)
            }
        }
    }

    /// What opening took back (a database is never opened by taking leases back).
    pub fn recovered_at_open(&self) -> ReapReport {
        match self {
            Writer::File(s) => s.recovered_at_open().clone(),
            Writer::Postgres(_) => ReapReport::default(),
        }
    }

    /// Compacts a store file; `None` for a database, whose space PostgreSQL's `VACUUM`
    /// reclaims.
    pub fn compact(&mut self) -> Option<Result<bool, Error>> {
        match self {
            Writer::File(s) => Some(s.compact()),
            Writer::Postgres(_) => None,
        }
    }
}
