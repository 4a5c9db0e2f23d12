//! Where the tool works: a store file, or a PostgreSQL database named by a `postgres://` URL
//! in `--db` (or `LEASEHOLD_DB`). Each command is written once, against the contract both
//! engines keep ([`ReadJobs`], [`JobStore`]) through [`Reader`] or [`Writer`]; what only a
//! file has (a writer's pid, a clean close, processes sharing it) answers as "none" on
//! PostgreSQL.

use std::path::Path;
use std::sync::Arc;

use leasehold::postgres::PgStore;
use leasehold::{
    Error, HolderState, InstanceId, JobId, JobStore, ReadJobs, ReapReport, Store, StoreReader,
    StoreTime,
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
    let store = match schema {
        Some(schema) => builder.schema(schema).open(),
        None => builder.open(),
    }?;
    if let Some(older) = store.upgraded_from() {
        eprintln!(
            "note: upgraded the store from schema version {older} to {}; builds older than \
             this one refuse it now",
            leasehold::postgres::SCHEMA_VERSION
        );
    }
    Ok(store)
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

/// The read side of a store file or a database: every read through the contract both
/// engines keep ([`ReadJobs`]); what only a file has (a writer's pid, a clean close,
/// processes sharing it) from the file's reader, and answered as "none" on a database.
pub struct Reader {
    store: Arc<dyn ReadJobs>,
    /// The file's reader (`None` for a database).
    file: Option<Arc<StoreReader>>,
}

impl std::ops::Deref for Reader {
    type Target = dyn ReadJobs;
    fn deref(&self) -> &Self::Target {
        &*self.store
    }
}

impl Reader {
    /// Opens for reading: a file read-only (see [`StoreReader::open`]), a database as is.
    pub fn open(db: &Path) -> Result<Reader, Error> {
        match postgres_url(db) {
            // A read never makes a store: a mistyped schema is refused, not created empty.
            Some(url) => Ok(Reader {
                store: Arc::new(open_postgres(url, false)?),
                file: None,
            }),
            None => {
                let file = Arc::new(StoreReader::open(db)?);
                Ok(Reader {
                    store: file.clone(),
                    file: Some(file),
                })
            }
        }
    }

    /// A store time as an operator reads it: a file's store time counts from the store's
    /// own start (`t+12.5s`); a database's is its clock, shown as a UTC date (counted from
    /// the Unix epoch, it read `t+1796171245s`).
    pub fn describe_time(&self, t: StoreTime) -> String {
        match &self.file {
            Some(_) => t.to_string(),
            None => {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(t.as_nanos());
                humantime::format_rfc3339_millis(at).to_string()
            }
        }
    }

    /// Whether the last writer closed the file cleanly (a database is always consistent).
    pub fn closed_cleanly(&self) -> bool {
        self.file.as_ref().is_none_or(|r| r.closed_cleanly())
    }

    pub fn writer_pid(&self) -> Result<Option<u32>, Error> {
        match &self.file {
            Some(r) => r.writer_pid(),
            None => Ok(None),
        }
    }

    /// Who holds each running lease, where processes share a store file.
    pub fn holders(&self) -> Result<Vec<(JobId, InstanceId, HolderState)>, Error> {
        match &self.file {
            Some(r) if r.sharing()? == leasehold::Sharing::MultiProcess => r.holders(),
            _ => Ok(Vec::new()),
        }
    }

    pub fn shared_by_processes(&self) -> Result<bool, Error> {
        match &self.file {
            Some(r) => Ok(r.sharing()? == leasehold::Sharing::MultiProcess),
            None => Ok(false),
        }
    }
}

/// The write side of a store file or a database: every write through [`JobStore`]; what a
/// file or a database does apart (recovery at open, compaction, a vacuum to wait for) from
/// its own type.
pub struct Writer {
    store: Arc<dyn JobStore>,
    file: Option<Store>,
    database: Option<PgStore>,
}

impl std::ops::Deref for Writer {
    type Target = dyn JobStore;
    fn deref(&self) -> &Self::Target {
        &*self.store
    }
}

impl Writer {
    pub fn file(store: Store) -> Writer {
        Writer {
            store: Arc::new(store.clone()),
            file: Some(store),
            database: None,
        }
    }

    pub fn database(store: PgStore) -> Writer {
        Writer {
            store: Arc::new(store.clone()),
            file: None,
            database: Some(store),
        }
    }

    /// The store as the contract both engines keep, to hand to what takes one (the status
    /// page's actions); the store stays open while any handle on it lives.
    pub fn shared(&self) -> Arc<dyn JobStore> {
        self.store.clone()
    }

    /// One reaper pass. On a database, a vacuum the pass started is waited for: the server
    /// would cancel it when this process's connection closes.
    pub fn reap_pass(&self) -> Result<ReapReport, Error> {
        let report = self.store.reap()?;
        if let Some(p) = &self.database {
            while p.vacuum_running() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        Ok(report)
    }

    /// What opening took back (a database is never opened by taking leases back).
    pub fn recovered_at_open(&self) -> ReapReport {
        match &self.file {
            Some(s) => s.recovered_at_open().clone(),
            None => ReapReport::default(),
        }
    }

    /// Compacts a store file; `None` for a database, whose space PostgreSQL's `VACUUM`
    /// reclaims. Needs the only handle on the file, so it takes the writer.
    pub fn compact(self) -> Option<Result<bool, Error>> {
        let Writer { store, file, .. } = self;
        drop(store);
        file.map(|mut s| s.compact())
    }
}
