//! Write commands: they need the writer's seat.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{Error, JobId, JobState, NewJob, OpenError, Sharing, Store, StoreReader};
use serde::Serialize;

use super::format::{self, dms};
use super::inspect::print_json;
use super::target::{Writer, open_postgres, postgres_url};

/// Opens the store for writing: a database by its URL (its tables made if missing), a file
/// joined as its sharing says; only `enqueue` may create a missing file.
fn open(db: &Path, create: bool) -> Result<Writer, Error> {
    if let Some(url) = postgres_url(db) {
        return Ok(Writer::database(open_postgres(url, create)?));
    }
    if !create && !db.exists() {
        return Err(OpenError::Io {
            path: db.to_owned(),
            source: std::io::ErrorKind::NotFound.into(),
        }
        .into());
    }
    // A store that processes share is joined as one more of them: its live neighbours'
    // leases are left alone, and their writes go on beside this command's.
    let sharing = match db.exists() {
        true => StoreReader::open(db)
            .and_then(|r| r.sharing())
            .unwrap_or(Sharing::SingleWriter),
        false => Sharing::SingleWriter,
    };
    let opened = Store::builder(db).sharing(sharing).open()?;
    if let Some(older) = opened.upgraded_from() {
        eprintln!(
            "note: upgraded the store from schema version {older} to {}; builds older than \
             this one refuse it now",
            leasehold::SCHEMA_VERSION
        );
    }
    let store = Writer::file(opened);
    let took = store.recovered_at_open().reclaimed.len();
    if took > 0 {
        eprintln!(
            "note: opening took back {took} lease{} left running by a process that had ended",
            if took == 1 { "" } else { "s" }
        );
    }
    Ok(store)
}

/// The arguments of `leasehold enqueue`.
#[derive(clap::Args)]
pub struct NewJobArgs {
    /// The queue.
    #[arg(long)]
    queue: String,
    /// Lower runs first.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i32,
    /// Not claimable before this much time has passed (e.g. 30s, 5m).
    #[arg(long, value_parser = super::parse_duration)]
    delay: Option<Duration>,
    /// The retry budget.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Deduplicate: a live job with this key is returned instead of a new one.
    #[arg(long)]
    unique_key: Option<String>,
    /// Read the payload from this file.
    #[arg(long, conflicts_with = "payload")]
    file: Option<PathBuf>,
    /// The payload (`-` reads stdin).
    payload: Option<String>,
}

pub fn enqueue(db: &Path, json: bool, a: NewJobArgs) -> Result<ExitCode, Error> {
    let io = |e: std::io::Error| Error::Storage(redb::Error::Io(e));
    let payload: Vec<u8> = match (&a.file, a.payload.as_deref()) {
        (Some(f), _) => std::fs::read(f).map_err(io)?,
        (None, Some("-")) => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(io)?;
            buf
        }
        (None, Some(p)) => p.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    };
    let mut job = NewJob::new(a.queue, payload).priority(a.priority);
    if let Some(d) = a.delay {
        job = job.delay(d);
    }
    if let Some(m) = a.max_attempts {
        job = job.max_attempts(m);
    }
    if let Some(k) = &a.unique_key {
        job = job.unique_key(k);
    }
    let store = open(db, true)?;
    let id = store.enqueue(job)?;
    if json {
        #[derive(Serialize)]
        struct Enqueued {
            id: u64,
        }
        print_json(&Enqueued { id: id.0 });
    } else {
        println!("enqueued job {id}");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct StateView {
    id: u64,
    state: &'static str,
}

pub fn retry(db: &Path, json: bool, id: u64) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    store.retry(JobId(id))?;
    if json {
        print_json(&StateView {
            id,
            state: JobState::Queued.name(),
        });
    } else {
        println!("job {id} is queued again (its history is kept)");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn cancel(db: &Path, json: bool, id: u64) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    let state = store.cancel(JobId(id))?;
    if json {
        print_json(&StateView {
            id,
            state: state.name(),
        });
    } else if state == JobState::Running {
        println!("job {id} is running: its holder is told at its next heartbeat");
    } else {
        println!("job {id} is cancelled");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn purge(
    db: &Path,
    json: bool,
    older_than: Duration,
    state: Option<JobState>,
) -> Result<ExitCode, Error> {
    let states = match state {
        Some(s) if !s.is_terminal() => {
            return Err(Error::Refused {
                job: JobId(0),
                state: s,
                action: "purge (only succeeded, dead or cancelled jobs are purged)",
            });
        }
        Some(s) => vec![s],
        None => vec![JobState::Succeeded, JobState::Dead, JobState::Cancelled],
    };
    let store = open(db, false)?;
    let n = store.purge(older_than, &states)?;
    if json {
        #[derive(Serialize)]
        struct Purged {
            purged: usize,
        }
        print_json(&Purged { purged: n });
    } else {
        println!(
            "purged {n} jobs that finished more than {} ago",
            format::duration(older_than)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn reap(db: &Path, json: bool) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    let report = store.reap_pass()?;
    let at_open = &store.recovered_at_open().reclaimed;
    if json {
        #[derive(Serialize)]
        struct ReclaimView {
            job: u64,
            attempt: u32,
            worker: String,
            overdue_ms: u64,
            detection_delay_ms: u64,
            state: &'static str,
        }
        #[derive(Serialize)]
        struct ReapView {
            batches: usize,
            reclaimed: Vec<ReclaimView>,
            recovered_at_open: Vec<ReclaimView>,
            vacuumed: Vec<String>,
        }
        let view = |list: &[leasehold::Reclaim]| -> Vec<ReclaimView> {
            list.iter()
                .map(|r| ReclaimView {
                    job: r.job.0,
                    attempt: r.attempt.0,
                    worker: r.worker.clone(),
                    overdue_ms: dms(r.overdue),
                    detection_delay_ms: dms(r.detection_delay),
                    state: r.job_state.name(),
                })
                .collect()
        };
        print_json(&ReapView {
            batches: report.batches,
            reclaimed: view(&report.reclaimed),
            recovered_at_open: view(at_open),
            vacuumed: report.vacuum_started.clone(),
        });
        return Ok(ExitCode::SUCCESS);
    }
    for r in at_open {
        println!(
            "job {} attempt {}: took the lease back from {} at open ({}); now {}",
            r.job,
            r.attempt,
            r.worker,
            match r.path {
                leasehold::ReclaimPath::ProcessDied => "its process had died",
                _ => "it was left running by a process that had ended",
            },
            r.job_state
        );
    }
    if report.reclaimed.is_empty() {
        // After leases taken back at open, "nothing" would read as a contradiction.
        match at_open.is_empty() {
            true => println!("no expired leases"),
            false => println!("no other lease had expired"),
        }
    }
    for r in &report.reclaimed {
        println!(
            "job {} attempt {}: took the lease back from {} ({} after it expired); now {}",
            r.job,
            r.attempt,
            r.worker,
            format::duration(r.overdue),
            r.job_state
        );
    }
    for table in &report.vacuum_started {
        println!("vacuumed {table}: its dead row versions had passed the threshold");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn compact(db: &Path, json: bool) -> Result<ExitCode, Error> {
    // A store that processes share is compacted alone: opened as its single writer, which
    // redb refuses while any other process has it open.
    let store = match postgres_url(db) {
        Some(_) => open(db, false)?,
        None if !db.exists() => open(db, false)?,
        None => match Store::builder(db).open() {
            Ok(store) => Writer::file(store),
            Err(Error::Open(OpenError::IncompatibleSharing { .. })) => {
                eprintln!(
                    "leasehold: compact needs the store to itself, and other processes share it \
                     now (Sharing::MultiProcess): stop them first"
                );
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(e),
        },
    };
    let before = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    let Some(compacted) = store.compact() else {
        eprintln!(
            "leasehold: compact applies to a store file; PostgreSQL reclaims a table's space with VACUUM"
        );
        return Ok(ExitCode::from(2));
    };
    let compacted = compacted?;
    let after = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    if json {
        #[derive(Serialize)]
        struct Compacted {
            compacted: bool,
            bytes_before: u64,
            bytes_after: u64,
        }
        print_json(&Compacted {
            compacted,
            bytes_before: before,
            bytes_after: after,
        });
    } else {
        println!("compacted: {before} bytes -> {after} bytes");
    }
    Ok(ExitCode::SUCCESS)
}
