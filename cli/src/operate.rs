//! Write commands: they need the writer's seat.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{Error, JobId, JobState, NewJob, OpenError, Sharing, Store, StoreReader};
use serde::Serialize;

use super::format::{self, dms, print_json};
use super::target::{Writer, open_postgres, postgres_url};

/// Opens the store for writing: a database by its URL (its tables made if missing), a file
/// joined as its sharing says; only `enqueue` may create a missing file.
pub fn open(db: &Path, create: bool) -> Result<Writer, Error> {
    if let Some(url) = postgres_url(db) {
        let opened = match open_postgres(url, create) {
            // A write upgrades a schema an older build made (it makes none without --create).
            Err(Error::Postgres(leasehold::postgres::PgError::OlderSchema { .. })) => {
                open_postgres(url, true)
            }
            opened => opened,
        };
        return Ok(Writer::database(opened?));
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

/// Whether the store knows `queue`: a job has used it, or it has settings. (Its name is
/// checked first: an empty one is a usage error, not an unknown queue.)
fn known_queue(store: &Writer, queue: &str) -> Result<bool, Error> {
    store.queue_settings(queue)?;
    Ok(store.stats()?.queues.iter().any(|(name, _)| name == queue))
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
    /// Not claimable before this wall-clock time, in UTC (e.g. 2026-12-24T18:00:00Z): turned
    /// into a wait on the store's clock when the job is enqueued; a time past runs now.
    #[arg(long, value_parser = super::parse_time, conflicts_with = "delay")]
    at: Option<std::time::SystemTime>,
    /// The retry budget.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Deduplicate: a live job with this key is returned instead of a new one.
    #[arg(long)]
    unique_key: Option<String>,
    /// Keep the unique key this long after the job succeeded (e.g. 24h).
    #[arg(long, value_parser = super::parse_duration, requires = "unique_key",
          conflicts_with = "unique_until_purged")]
    unique_for: Option<Duration>,
    /// Keep the unique key after the job succeeded, until it is purged.
    #[arg(long, requires = "unique_key")]
    unique_until_purged: bool,
    /// A hard limit on each attempt's running time (e.g. 10m).
    #[arg(long, value_parser = super::parse_duration)]
    time_limit: Option<Duration>,
    /// Expire the job if no attempt has started this long after the enqueue (e.g. 15m): it
    /// never runs late.
    #[arg(long, value_parser = super::parse_duration)]
    expires_in: Option<Duration>,
    /// Its own retry policy, over its queue's: `30s`, `1s..1h` or `1s,10s,1m` (see
    /// `leasehold backoff`).
    #[arg(long, value_parser = super::parse_backoff)]
    backoff: Option<leasehold::RetryPolicy>,
    /// The key its queue's per-key limit counts it under (see `leasehold limit --per-key`).
    #[arg(long)]
    limit_key: Option<String>,
    /// Metadata (`key=value`; repeat for several).
    #[arg(long = "meta", value_parser = super::parse_pair)]
    metadata: Vec<(String, String)>,
    /// Read the payload from this file.
    #[arg(long, conflicts_with = "payload")]
    file: Option<PathBuf>,
    /// The payload (`-` reads stdin).
    payload: Option<String>,
}

/// A payload from a file, stdin (`-`) or the argument itself; `None` if none was given.
fn payload_of(file: Option<&Path>, arg: Option<&str>) -> Result<Option<Vec<u8>>, Error> {
    let io = |e: std::io::Error| Error::Storage(redb::Error::Io(e));
    Ok(match (file, arg) {
        (Some(f), _) => Some(std::fs::read(f).map_err(io)?),
        (None, Some("-")) => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(io)?;
            Some(buf)
        }
        (None, Some(p)) => Some(p.as_bytes().to_vec()),
        (None, None) => None,
    })
}

/// What `leasehold edit` changes of a job that waits.
#[derive(clap::Args)]
pub struct EditArgs {
    /// The job id.
    job: u64,
    /// A new priority (lower runs first).
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// Due this long from now (e.g. 30s, 5m).
    #[arg(long, value_parser = super::parse_duration, conflicts_with_all = ["at", "now"])]
    delay: Option<Duration>,
    /// Due at this wall-clock time, in UTC (as `enqueue --at`).
    #[arg(long, value_parser = super::parse_time, conflicts_with = "now")]
    at: Option<std::time::SystemTime>,
    /// Due now (what `promote` does).
    #[arg(long)]
    now: bool,
    /// Set metadata (`key=value`; repeat for several).
    #[arg(long = "meta", value_parser = super::parse_pair)]
    metadata: Vec<(String, String)>,
    /// Remove a metadata key (repeat for several).
    #[arg(long = "remove-meta")]
    remove: Vec<String>,
    /// Only if the job is still at this attempt (as `show` printed it): refused if it was
    /// claimed since.
    #[arg(long)]
    if_attempt: Option<u32>,
    /// Read the new payload from this file.
    #[arg(long, conflicts_with = "payload")]
    file: Option<PathBuf>,
    /// The new payload (`-` reads stdin).
    #[arg(long)]
    payload: Option<String>,
}

impl EditArgs {
    /// What `leasehold promote JOB` asks: due now, nothing else changed.
    pub fn promote(job: u64) -> EditArgs {
        EditArgs {
            job,
            priority: None,
            delay: None,
            at: None,
            now: true,
            metadata: Vec::new(),
            remove: Vec::new(),
            if_attempt: None,
            file: None,
            payload: None,
        }
    }
}

/// `leasehold edit` (and `promote`, an edit that makes the job due now).
pub fn edit(db: &Path, json: bool, a: EditArgs) -> Result<ExitCode, Error> {
    let mut edit = leasehold::Edit::new();
    if let Some(payload) = payload_of(a.file.as_deref(), a.payload.as_deref())? {
        edit = edit.payload(payload);
    }
    if let Some(p) = a.priority {
        edit = edit.priority(p);
    }
    if let Some(d) = a.delay {
        edit = edit.delay(d);
    }
    if let Some(when) = a.at {
        edit = edit.run_at(when);
    }
    if a.now {
        edit = edit.now();
    }
    for (k, v) in a.metadata {
        edit = edit.metadata(k, v);
    }
    for k in a.remove {
        edit = edit.remove_metadata(k);
    }
    if let Some(at) = a.if_attempt {
        edit = edit.if_attempt(leasehold::Attempt(at));
    }
    let store = open(db, false)?;
    let id = JobId(a.job);
    store.edit(id, edit)?;
    let job = store.job(id)?.ok_or(Error::JobNotFound(id))?;
    if json {
        print_json(&StateView {
            id: a.job,
            state: job.state().name(),
        });
    } else {
        let now = store.now()?;
        println!(
            "job {id} edited: {}, priority {}, due {}",
            job.state(),
            job.priority(),
            super::format::relative(job.run_at(), now)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn enqueue(db: &Path, json: bool, create: bool, a: NewJobArgs) -> Result<ExitCode, Error> {
    let payload = payload_of(a.file.as_deref(), a.payload.as_deref())?.unwrap_or_default();
    let mut job = NewJob::new(a.queue, payload).priority(a.priority);
    if let Some(d) = a.delay {
        job = job.delay(d);
    }
    if let Some(when) = a.at {
        job = job.run_at(when);
    }
    if let Some(m) = a.max_attempts {
        job = job.max_attempts(m);
    }
    if let Some(k) = &a.unique_key {
        job = job.unique_key(k);
    }
    if let Some(window) = a.unique_for {
        job = job.unique_for(window);
    }
    if a.unique_until_purged {
        job = job.unique_until_purged();
    }
    if let Some(limit) = a.time_limit {
        job = job.time_limit(limit);
    }
    if let Some(span) = a.expires_in {
        job = job.expires_in(span);
    }
    if let Some(policy) = a.backoff {
        job = job.retry_policy(policy);
    }
    if let Some(key) = a.limit_key {
        job = job.limit_key(key);
    }
    for (k, v) in a.metadata {
        job = job.metadata(k, v);
    }
    let store = open(db, create)?;
    let before = store.now()?;
    let id = store.enqueue(job)?;
    // A job made before this enqueue is the one that holds the unique key.
    let existing = match &a.unique_key {
        Some(_) => store.job(id)?.is_some_and(|j| j.created_at() < before),
        None => false,
    };
    if json {
        #[derive(Serialize)]
        struct Enqueued {
            id: u64,
            /// A job that held the unique key was returned; nothing was made.
            existing: bool,
        }
        print_json(&Enqueued { id: id.0, existing });
    } else if existing {
        println!(
            "job {id} already holds unique key {}: nothing new was enqueued",
            a.unique_key.as_deref().unwrap_or_default()
        );
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

/// How a command that takes a job id acts on many jobs instead.
#[derive(clap::Args)]
pub struct Bulk {
    #[command(flatten)]
    selection: super::Selection,
    /// Act on the jobs the selection names without asking (otherwise the tool says how many
    /// and asks, and refuses where it cannot ask).
    #[arg(long)]
    yes: bool,
}

/// The two actions on many jobs.
#[derive(Copy, Clone)]
enum Action {
    Retry,
    Cancel,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
        }
    }
}

pub fn retry(db: &Path, json: bool, job: Option<u64>, bulk: Bulk) -> Result<ExitCode, Error> {
    let Some(id) = job else {
        return on_many(db, json, bulk, Action::Retry);
    };
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

pub fn cancel(db: &Path, json: bool, job: Option<u64>, bulk: Bulk) -> Result<ExitCode, Error> {
    let Some(id) = job else {
        return on_many(db, json, bulk, Action::Cancel);
    };
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

/// A retry or cancel of every job the selection names: how many first, then (asked, or with
/// `--yes`) the action in bounded batches, and what it did.
fn on_many(db: &Path, json: bool, bulk: Bulk, action: Action) -> Result<ExitCode, Error> {
    let mut selection = bulk.selection;
    // what is retried is dead (or cancelled, when asked for); what is cancelled, the
    // command line names (clap requires it)
    if let Action::Retry = action
        && selection.state.is_none()
    {
        selection.state = Some(JobState::Dead);
    }
    let store = open(db, false)?;
    let filter = selection.filter();
    let matched = store.jobs(&filter)?.len();
    let what = selection.describe();
    if matched == 0 {
        if json {
            print_json(&BulkView::default());
        } else {
            println!("no jobs match ({what})");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !bulk.yes {
        let question = format!(
            "{} {matched} job{} ({what})?",
            action.verb(),
            if matched == 1 { "" } else { "s" }
        );
        if !std::io::stdin().is_terminal() {
            eprintln!("leasehold: {question} Not without asking: pass --yes to go ahead");
            return Ok(ExitCode::from(1));
        }
        eprint!("{question} [y/N] ");
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing done");
            return Ok(ExitCode::from(1));
        }
    }
    let report = match action {
        Action::Retry => store.retry_all(&filter)?,
        Action::Cancel => store.cancel_all(&filter)?,
    };
    if json {
        print_json(&BulkView {
            matched: report.matched,
            changed: report.changed,
            refused: report
                .refused
                .iter()
                .map(|(id, e)| RefusedView {
                    id: id.0,
                    error: e.to_string(),
                })
                .collect(),
        });
    } else {
        let done = match action {
            Action::Retry => "queued again",
            Action::Cancel => "cancelled (running ones at their next heartbeat)",
        };
        println!("{} of {} jobs {done}", report.changed, report.matched);
        if !report.refused.is_empty() {
            println!("{} refused:", report.refused.len());
            for (id, e) in report.refused.iter().take(20) {
                println!("  job {id}: {e}");
            }
            if report.refused.len() > 20 {
                println!("  ... and {} more", report.refused.len() - 20);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize, Default)]
struct BulkView {
    matched: usize,
    changed: usize,
    refused: Vec<RefusedView>,
}

#[derive(Serialize)]
struct RefusedView {
    id: u64,
    error: String,
}

pub fn schedule(db: &Path, json: bool, name: &str, action: &str) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    let said = match action {
        "pause" => {
            store.pause_schedule(name)?;
            format!("schedule {name} is paused: none of its ticks fire until it resumes")
        }
        "resume" => {
            store.resume_schedule(name)?;
            format!("schedule {name} is resumed")
        }
        _ => match store.remove_schedule(name)? {
            true => format!(
                "schedule {name} is removed (the jobs it enqueued stay); an application that \
                 declares it when it starts will declare it again then: remove it from the \
                 application's declarations too, or `schedules pause {name}` to keep it from \
                 firing"
            ),
            false => return Err(Error::ScheduleNotFound(name.to_owned())),
        },
    };
    if json {
        #[derive(Serialize)]
        struct Done<'a> {
            schedule: &'a str,
            action: &'a str,
        }
        print_json(&Done {
            schedule: name,
            action,
        });
    } else {
        println!("{said}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn pause(
    db: &Path,
    json: bool,
    create: bool,
    queue: &str,
    pause: bool,
) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    if create {
        store.declare_queue(queue)?;
    }
    match pause {
        true => store.pause_queue(queue)?,
        false => store.resume_queue(queue)?,
    }
    if json {
        #[derive(Serialize)]
        struct Paused<'a> {
            queue: &'a str,
            paused: bool,
        }
        print_json(&Paused {
            queue,
            paused: pause,
        });
    } else if pause {
        println!(
            "queue {queue} is paused: no claim takes its jobs until `leasehold resume {queue}` \
             (running jobs finish)"
        );
    } else {
        println!("queue {queue} is resumed");
    }
    Ok(ExitCode::SUCCESS)
}

/// What `leasehold limit` changes: each limit set (`Some(Some(_))`), lifted (`Some(None)`)
/// or kept as it is (`None`).
pub struct LimitChange {
    pub concurrency: Option<Option<u32>>,
    pub per_key: Option<Option<u32>>,
    pub per_key_rate: Option<Option<(u32, Duration)>>,
    pub rate: Option<Option<(u32, Duration)>>,
}

pub fn limit(
    db: &Path,
    json: bool,
    create: bool,
    queue: &str,
    change: LimitChange,
) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    if create {
        store.declare_queue(queue)?;
    }
    let mut limits = store.queue_settings(queue)?.limits;
    if let Some(concurrency) = change.concurrency {
        limits.concurrency = concurrency;
    }
    if let Some(per_key) = change.per_key {
        limits.per_key = per_key;
    }
    if let Some(rate) = change.per_key_rate {
        limits.per_key_rate = rate.map(|(claims, per)| leasehold::Rate { claims, per });
    }
    if let Some(rate) = change.rate {
        limits.rate = rate.map(|(claims, per)| leasehold::Rate { claims, per });
    }
    store.set_queue_limits(queue, limits)?;
    if json {
        #[derive(Serialize)]
        struct Limits<'a> {
            queue: &'a str,
            concurrency: Option<u32>,
            rate_claims: Option<u32>,
            rate_per_ms: Option<u64>,
            per_key: Option<u32>,
            per_key_rate_claims: Option<u32>,
            per_key_rate_per_ms: Option<u64>,
        }
        print_json(&Limits {
            queue,
            per_key: limits.per_key,
            per_key_rate_claims: limits.per_key_rate.map(|r| r.claims),
            per_key_rate_per_ms: limits.per_key_rate.map(|r| r.per.as_millis() as u64),
            concurrency: limits.concurrency,
            rate_claims: limits.rate.map(|r| r.claims),
            rate_per_ms: limits.rate.map(|r| r.per.as_millis() as u64),
        });
    } else {
        println!("queue {queue}: {}", format::limits(&limits));
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows `queue`'s retry policy, after setting it (`Some(Some(_))`) or lifting it
/// (`Some(None)`).
pub fn backoff(
    db: &Path,
    json: bool,
    create: bool,
    queue: &str,
    change: Option<Option<leasehold::RetryPolicy>>,
) -> Result<ExitCode, Error> {
    let store = open(db, false)?;
    if create {
        store.declare_queue(queue)?;
    }
    match change {
        Some(policy) => store.set_queue_retry_policy(queue, policy)?,
        None if !known_queue(&store, queue)? => {
            return Err(Error::QueueNotFound(queue.to_owned()));
        }
        None => {}
    }
    let policy = store.queue_settings(queue)?.retry;
    if json {
        #[derive(Serialize)]
        struct Backoff<'a> {
            queue: &'a str,
            /// `None`: the store's applies.
            retry_policy: Option<String>,
        }
        print_json(&Backoff {
            queue,
            retry_policy: policy.as_ref().map(ToString::to_string),
        });
    } else {
        match policy {
            Some(p) => println!("queue {queue}: a failed job waits by {p}"),
            None => println!("queue {queue}: a failed job waits by the store's retry policy"),
        }
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
                action: "purge (only succeeded, dead, cancelled or expired jobs are purged)",
            });
        }
        Some(s) => vec![s],
        None => vec![
            JobState::Succeeded,
            JobState::Dead,
            JobState::Cancelled,
            JobState::Expired,
        ],
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
