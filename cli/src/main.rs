//! The `leasehold` tool: inspect, operate and watch a store (a redb file or a PostgreSQL
//! schema); `--help` says which commands read and which write, and what each exit code
//! means (a test holds that text to the commands there are).

mod bench;
/// A process holding leases, for the bench; the library's process tests start the same code
/// (it lives here so that the tool's package holds every file it builds from).
#[path = "holder.rs"]
mod child;
mod demo;
mod demo_processes;
mod demo_report;
mod demo_schedules;
mod demo_workflow;
mod format;
mod helper;
mod inspect;
mod operate;
mod pool_process;
mod serve;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::{Parser, Subcommand, ValueEnum};
use leasehold::postgres::PgError;
use leasehold::{Error, JobState, Store};

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Inspect, operate and watch a leasehold job store",
    long_about = "Inspect, operate and watch a leasehold job store: a redb file, or a \
        PostgreSQL database given as a URL.\n\n\
        Read commands (stats, jobs, show, group, wait, endings, schedules, check, watch, serve; backoff \
        without a policy) read the store beside the application that runs it. Write \
        commands (enqueue, edit, promote, retry, cancel, pause, resume, limit, backoff with \
        a policy, purge, reap, compact; group --seal or --cancel; schedules pause, resume or \
        remove) write beside it too: a redb file that processes share is joined as one \
        more of them, a file one process writes needs that process stopped. demo and bench \
        make stores of their own.\n\n\
        Exit codes: 0 ok; 1 refused (no store at --db, no such job, queue or schedule, a \
        job in the wrong state; nothing was changed); 2 usage error; 3 store problem \
        (locked by another writer, damaged, a newer schema, unreachable); wait exits 4 when \
        the job or group ended otherwise than succeeded, 5 when it had not ended by --timeout."
)]
struct Cli {
    /// The store file, or a PostgreSQL database as a URL
    /// (`postgres://user@host/database`, `?schema=name` for a schema other than `leasehold`).
    #[arg(
        long,
        global = true,
        env = "LEASEHOLD_DB",
        default_value = "./leasehold.redb"
    )]
    db: PathBuf,
    /// Print JSON instead of tables (read commands and results).
    #[arg(long, global = true)]
    json: bool,
    /// Make what a write names if it does not exist yet: the store (a file, or the URL's
    /// schema) for `enqueue`; a queue no job has used for `pause` and `limit`. Without it a
    /// mistyped path, schema or queue name is refused, not made anew.
    #[arg(long, global = true)]
    create: bool,
    #[command(subcommand)]
    command: Command,
}

/// A job state on the command line, by the name the tool prints (`queued`, `retry_wait`, ...).
fn parse_state(s: &str) -> Result<JobState, String> {
    JobState::ALL
        .into_iter()
        .find(|state| state.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = JobState::ALL.iter().map(|s| s.name()).collect();
            format!("unknown state (one of: {})", names.join(", "))
        })
}

/// What `leasehold schedules` does to one schedule.
#[derive(Subcommand)]
enum ScheduleAction {
    /// Pause it: none of its ticks fire until it resumes.
    Pause {
        /// The schedule.
        name: String,
    },
    /// Resume it (missed ticks as its catch-up policy says).
    Resume {
        /// The schedule.
        name: String,
    },
    /// Remove it (the jobs it enqueued stay).
    Remove {
        /// The schedule.
        name: String,
    },
}

/// The order of `jobs`.
#[derive(Copy, Clone, Debug, Default, ValueEnum)]
enum SortArg {
    /// Oldest first (by id).
    #[default]
    Oldest,
    /// Newest first.
    Newest,
    /// Claim order: priority, then run-at.
    Priority,
    /// Most recently changed first.
    Updated,
}

/// A metadata pair on the command line: `key=value`.
fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err("expected key=value".into()),
    }
}

/// Which jobs a command lists or acts on.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Selection {
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this state.
    #[arg(long, value_parser = parse_state)]
    pub state: Option<JobState>,
    /// Only jobs with this metadata (`key=value`; repeat for all of several).
    #[arg(long = "meta", value_parser = parse_pair)]
    metadata: Vec<(String, String)>,
    /// Only jobs unchanged for at least this long (a dead job: dead this long).
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Only the members of this group (not its callbacks: `group` names those).
    #[arg(long, value_name = "GROUP")]
    group: Option<u64>,
}

impl Selection {
    /// The library's filter of the same jobs.
    pub fn filter(&self) -> leasehold::JobFilter {
        leasehold::JobFilter {
            queue: self.queue.clone(),
            state: self.state,
            metadata: self.metadata.clone(),
            unchanged_for: self.older_than,
            group: self.group.map(leasehold::GroupId),
            ..leasehold::JobFilter::default()
        }
    }

    /// How it reads in a confirmation.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(q) = &self.queue {
            parts.push(format!("queue {q}"));
        }
        if let Some(s) = self.state {
            parts.push(format!("state {s}"));
        }
        for (k, v) in &self.metadata {
            parts.push(format!("{k}={v}"));
        }
        if let Some(g) = self.group {
            parts.push(format!("members of group {g}"));
        }
        if let Some(d) = self.older_than {
            parts.push(format!("unchanged for {}", humantime::format_duration(d)));
        }
        parts.join(", ")
    }
}

/// A rate limit on the command line: `N/PERIOD` (`10/1m`, `100/1h`).
fn parse_rate(s: &str) -> Result<(u32, Duration), String> {
    let (n, per) = s
        .split_once('/')
        .ok_or_else(|| "expected N/PERIOD (e.g. 10/1m)".to_owned())?;
    let n = n
        .trim()
        .parse()
        .map_err(|e| format!("{e} in the count {n:?}"))?;
    Ok((n, parse_duration(per.trim())?))
}

/// A retry policy on the command line: `30s` waits the same after every failure, `1s..1h`
/// doubles from the first up to the second, `1s,10s,1m` waits each in turn and then its last.
fn parse_backoff(s: &str) -> Result<leasehold::RetryPolicy, String> {
    use leasehold::RetryPolicy;
    let policy = if let Some((base, max)) = s.split_once("..") {
        RetryPolicy::exponential(parse_duration(base.trim())?, parse_duration(max.trim())?)
    } else if s.contains(',') {
        let delays = s.split(',').map(|d| parse_duration(d.trim()));
        RetryPolicy::delays(delays.collect::<Result<Vec<_>, _>>()?)
    } else {
        RetryPolicy::fixed(parse_duration(s.trim())?)
    };
    policy.validate().map_err(|e| e.to_string())?;
    Ok(policy)
}

fn parse_end_cursor(s: &str) -> Result<leasehold::EndCursor, String> {
    s.parse().map_err(|e: leasehold::InputError| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try 500ms, 30s, 5m, 2h or 7d)"))
}

fn parse_time(s: &str) -> Result<std::time::SystemTime, String> {
    humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("{e} (a UTC time, as 2026-12-24T18:00:00Z or 2026-12-24 18:00:00)"))
}

/// What `leasehold group` does before it shows the group.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GroupAction {
    Show,
    Seal,
    Cancel,
}

#[derive(Subcommand)]
enum Command {
    /// Jobs per queue and state, the oldest waiting job, the nearest and the most overdue
    /// lease, and the lifetime counters (reclaims by path, lost leases, fenced writes,
    /// stalls, worst detection delay).
    Stats,
    /// List jobs.
    Jobs {
        #[command(flatten)]
        selection: Selection,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The order.
        #[arg(long, value_enum, default_value_t = SortArg::Oldest)]
        sort: SortArg,
        /// Only the jobs that wait for this job (`NewJob::after`), oldest first.
        #[arg(long, value_name = "JOB", conflicts_with_all = ["queue", "state", "metadata", "older_than", "group"])]
        waiting_on: Option<u64>,
    },
    /// A group of jobs: sealed or open, its members' ends so far, how it ended, and the jobs
    /// that wait for it (its callbacks). With --seal or --cancel, that first.
    Group {
        /// The group id.
        group: u64,
        /// Seal it: no job joins it any more (it ends once every member has).
        #[arg(long, conflicts_with = "cancel")]
        seal: bool,
        /// Cancel it: its callbacks never run, and every member not ended is cancelled.
        #[arg(long)]
        cancel: bool,
    },
    /// One job: its record and full run history, and its payload (text if UTF-8, else hex).
    Show {
        /// The job id.
        job: u64,
        /// Write the raw payload bytes to stdout and nothing else.
        #[arg(long)]
        raw: bool,
    },
    /// Enqueue a job. The payload comes from the argument, --file, or stdin (`-`).
    Enqueue(operate::NewJobArgs),
    /// Edit a job that waits (queued, backing off, or blocked): its payload, priority, due
    /// time or metadata. A job that runs or has ended is refused; with --if-attempt, so is
    /// one claimed since.
    Edit(operate::EditArgs),
    /// Make a delayed or backing-off job due now.
    Promote {
        /// The job id.
        job: u64,
    },
    /// Put a dead, cancelled or expired job back in the queue with a fresh retry budget (its history
    /// is kept). Without a job id, every job the selection names (by default the dead
    /// ones), after saying how many and asking (or with --yes).
    Retry {
        /// The job id.
        #[arg(conflicts_with_all = ["queue", "state", "metadata", "older_than", "group", "yes"])]
        job: Option<u64>,
        #[command(flatten)]
        bulk: operate::Bulk,
    },
    /// Cancel a job: a waiting one at once, a running one at its next heartbeat. Without a
    /// job id, every job the selection names, after saying how many and asking (or with
    /// --yes).
    #[command(group(clap::ArgGroup::new("which").required(true).multiple(true)
        .args(["job", "queue", "state", "metadata", "older_than", "group"])))]
    Cancel {
        /// The job id.
        #[arg(conflicts_with_all = ["queue", "state", "metadata", "older_than", "group", "yes"])]
        job: Option<u64>,
        #[command(flatten)]
        bulk: operate::Bulk,
    },
    /// The store's periodic jobs: each schedule, when it ticks, its next tick, how many jobs
    /// it enqueued; or pause, resume or remove one.
    Schedules {
        #[command(subcommand)]
        action: Option<ScheduleAction>,
    },
    /// Pause a queue: no claim of any process or machine takes its jobs until it resumes
    /// (running jobs finish).
    Pause {
        /// The queue.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        queue: String,
    },
    /// Resume a paused queue.
    Resume {
        /// The queue.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        queue: String,
    },
    /// Set a queue's limits across every process and machine: at most N of its jobs held at
    /// once, at most N claims per period, at most N of one limit key's jobs held at once. A
    /// limit not named is kept; each change is one
    /// write, so no claim ever sees a moment between two limits. `--none` lifts them all.
    Limit {
        /// The queue.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        queue: String,
        /// At most this many of its jobs held at once.
        #[arg(long, conflicts_with = "no_concurrency")]
        concurrency: Option<u32>,
        /// At most this many claims per period, as N/PERIOD (e.g. 10/1m).
        #[arg(long, value_parser = parse_rate, conflicts_with = "no_rate")]
        rate: Option<(u32, Duration)>,
        /// At most this many jobs of one limit key (a job's `--limit-key`: a tenant, a
        /// device) held at once, each key apart.
        #[arg(long, conflicts_with = "no_per_key")]
        per_key: Option<u32>,
        /// At most this many claims of one limit key's jobs per period, as N/PERIOD (e.g.
        /// 5/1m), each key apart.
        #[arg(long, value_parser = parse_rate, conflicts_with = "no_per_key_rate")]
        per_key_rate: Option<(u32, Duration)>,
        /// Lift the concurrency limit (a rate limit stays).
        #[arg(long)]
        no_concurrency: bool,
        /// Lift the per-key limit.
        #[arg(long)]
        no_per_key: bool,
        /// Lift the per-key rate limit.
        #[arg(long)]
        no_per_key_rate: bool,
        /// Lift the rate limit (a concurrency limit stays).
        #[arg(long)]
        no_rate: bool,
        /// Lift every limit.
        #[arg(long, conflicts_with_all = ["concurrency", "rate", "per_key", "per_key_rate", "no_concurrency", "no_rate", "no_per_key", "no_per_key_rate"])]
        none: bool,
    },
    /// Show or set how long a queue's failed jobs wait before their next attempt (those with
    /// no policy of their own), in every process and machine: `30s` waits the same after
    /// every failure, `1s..1h` doubles from 1 s up to 1 h, `1s,10s,1m` waits each in turn and
    /// then its last. Without a policy, shows the queue's; `--none` lifts it (the store's
    /// applies).
    Backoff {
        /// The queue.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        queue: String,
        /// The policy: `30s`, `1s..1h` or `1s,10s,1m`.
        #[arg(value_parser = parse_backoff, conflicts_with = "none")]
        policy: Option<leasehold::RetryPolicy>,
        /// Shorten each wait by up to this fraction of itself (0 to 1), so that jobs that
        /// failed together do not all come back at once.
        #[arg(long, requires = "policy")]
        jitter: Option<f64>,
        /// Lift the queue's policy: its jobs wait by the store's.
        #[arg(long)]
        none: bool,
    },
    /// Delete finished jobs (and their history) older than a retention period, then the
    /// groups that ended as long ago and that no stored job or group refers to any more.
    Purge {
        /// How long ago they must have finished (e.g. 7d).
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Only this state (default: succeeded, dead and cancelled).
        #[arg(long, value_parser = parse_state)]
        state: Option<JobState>,
    },
    /// Run one reaper pass now and print what was reclaimed.
    Reap,
    /// Check integrity: every index entry matches a record and every record is indexed.
    /// Exits 1 and lists the problems if any are found.
    Check,
    /// Compact the file, returning free space to the filesystem.
    Compact,
    /// Wait until a job (or, with --group, a group) has ended, whichever process or machine
    /// ends it; print how. Exits 0 if it succeeded, 4 if it ended otherwise, 5 if it had
    /// not ended by the timeout.
    Wait {
        /// The job id (the group id with --group).
        id: u64,
        /// Wait for a group: sealed, and every member ended.
        #[arg(long)]
        group: bool,
        /// How long to wait at most.
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        timeout: Duration,
    },
    /// Every end of a job or group after a cursor, in the order they committed, from every
    /// process or machine; ends with the cursor to read on from.
    Endings {
        /// The cursor to read after (as a previous `endings` printed it; the start if none).
        #[arg(long, value_parser = parse_end_cursor)]
        after: Option<leasehold::EndCursor>,
        /// How many at most (with --follow, read at a time).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Go on printing each end as it commits (one line each, one JSON object a line
        /// with --json, each with its cursor), until Ctrl-C or --count ends.
        #[arg(long)]
        follow: bool,
        /// With --follow: stop after this many ends.
        #[arg(long, requires = "follow")]
        count: Option<usize>,
    },
    /// A live view of queue depths, running leases with time left, and reclaims as they
    /// happen. Ctrl-C to stop.
    Watch {
        /// How often to refresh.
        #[arg(long, value_parser = parse_duration, default_value = "1s")]
        interval: Duration,
        /// Stop after this many refreshes (0: never).
        #[arg(long, default_value_t = 0)]
        iterations: u64,
    },
    /// Serve the status page and Prometheus /metrics of the store over HTTP, beside the
    /// application that runs it. Prints `serving http://ADDR/` first.
    Serve {
        /// Where to listen. Anything but a loopback address needs --token.
        #[arg(long, default_value = "127.0.0.1:8470")]
        listen: std::net::SocketAddr,
        /// A token every request must carry (`Authorization: Bearer`, or the page's sign-in);
        /// at least 16 characters beyond loopback.
        #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Threads answering requests.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// A host name the page may be reached by (repeat for several). Without one it
        /// answers only to an IP address and localhost, against DNS rebinding.
        #[arg(long = "allow-host")]
        allow_hosts: Vec<String>,
        /// TLS terminates in front of the page (a reverse proxy): the session cookie is
        /// marked Secure.
        #[arg(long)]
        tls_in_front: bool,
    },
    /// Run three worker pools on a real store file and show leases at work: a killed pool's
    /// jobs reclaimed, a paused worker fenced, a hung job caught, a graceful release.
    Demo {
        /// How many jobs to enqueue.
        #[arg(long, default_value_t = 300)]
        jobs: usize,
    },
    /// Measure the headline operations, each beside raw redb doing the equivalent minimal
    /// work in the same run (about a minute; --scale shortens or lengthens it).
    Bench {
        /// Multiplies every scenario's operation count.
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Runs only the scenario groups whose name contains this: raw, enqueue,
        /// claim-complete, heartbeat, end-to-end-durable, end-to-end-non-durable
        /// (both: end-to-end), group-commit, wake, processes, depth, reap, drain-redb,
        /// drain-writes-redb (every completion writes a row of the application's) and
        /// drain-postgres (all three: drain; enqueue, then drain with 1 and 16 workers, as the
        /// peer harness does, and on PostgreSQL 16 workers again on three times the jobs;
        /// PostgreSQL where LEASEHOLD_PG_URL is set), window (what the window
        /// and the batch delay trade, on both), trickle (jobs enqueued one by one: latency and
        /// completions per commit by batch delay), weighted (a pool over four weighted queues
        /// against a pool over one), keyed (a claim with 999 of 1,000 tenants at their per-key
        /// limit against one with none), workflow, sql-ends (an end asked for in SQL,
        /// accepted and applied, beside one from Rust), postgres (needs LEASEHOLD_PG_URL).
        /// Three more run
        /// only when named in full: churn (dead rows of a PostgreSQL job table over minutes of
        /// sustained work), page (the status page on a million jobs, and its cost to a pool)
        /// and postgres-processes (1 x 16, 2 x 8, 4 x 4 and 8 x 2 worker processes draining one
        /// PostgreSQL queue).
        #[arg(long)]
        only: Option<String>,
    },
    /// Test helper: open a store, optionally enqueue and claim jobs, report them on stdout,
    /// then hold the store open until killed or until stdin closes.
    #[command(name = "__child", hide = true)]
    Child {
        #[arg(long, default_value = "default")]
        queue: String,
        #[arg(long, default_value_t = 0)]
        enqueue: usize,
        #[arg(long, default_value_t = 0)]
        claim: usize,
        #[arg(long, default_value_t = 60_000)]
        lease_ms: u64,
        /// Skip the checksum pass over every page at open.
        #[arg(long)]
        no_verify: bool,
        /// Open the store shared by several processes (Sharing::MultiProcess).
        #[arg(long)]
        shared: bool,
    },
    /// Bench helper: worker threads of a client process of the seat-holder prototype.
    #[command(name = "__seat_client", hide = true)]
    SeatClient {
        #[arg(long)]
        socket: PathBuf,
        #[arg(long, default_value_t = 4)]
        threads: usize,
    },
    /// Bench and demo helper: a worker pool in its own process on a shared store.
    #[command(name = "__pool", hide = true)]
    Pool {
        #[arg(long, default_value = "default")]
        queue: String,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// How long each job takes, in milliseconds.
        #[arg(long, default_value_t = 0)]
        work_ms: u64,
        /// Report each handler's start on stdout.
        #[arg(long)]
        report: bool,
        /// Jobs to claim ahead of free workers (default: the pool's own pacing).
        #[arg(long)]
        prefetch: Option<usize>,
        /// Declare a schedule of the queue ticking this often, and run a scheduler.
        #[arg(long)]
        schedule_every_ms: Option<u64>,
        /// Run a reaper this often.
        #[arg(long)]
        reap_every_ms: Option<u64>,
    },
}

/// A reader that stops early (`leasehold stats | head -6`) closes the tool's output: the tool
/// then ends quietly, as Unix tools do, instead of panicking in `println!` (Rust ignores
/// SIGPIPE, so a write to a closed pipe is an error, and `println!` panics on it). Only for
/// the commands that read or write the store and print what they did: the others keep
/// Rust's default, since they talk to sockets and child processes whose ends may close (a
/// browser that hangs up, a helper that exits), which must be an error on that one pipe,
/// not the end of the tool.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restores one signal's default disposition, before the tool starts a thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

impl Command {
    /// Whether the command only acts on the store and prints (see
    /// [`end_quietly_on_a_closed_pipe`]).
    fn only_prints(&self) -> bool {
        !matches!(
            self,
            Command::Serve { .. }
                | Command::Demo { .. }
                | Command::Bench { .. }
                | Command::Child { .. }
                | Command::SeatClient { .. }
                | Command::Pool { .. }
        )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command.only_prints() {
        end_quietly_on_a_closed_pipe();
    }
    let db = cli.db;
    let json = cli.json;
    let create = cli.create;
    let result = match cli.command {
        Command::Stats => inspect::stats(&db, json),
        Command::Jobs {
            selection,
            limit,
            sort,
            waiting_on,
        } => inspect::jobs(&db, json, selection, limit, sort, waiting_on),
        Command::Group {
            group,
            seal,
            cancel,
        } => {
            let act = match (seal, cancel) {
                (true, _) => GroupAction::Seal,
                (_, true) => GroupAction::Cancel,
                _ => GroupAction::Show,
            };
            inspect::group(&db, json, group, act)
        }
        Command::Show { job, raw } => inspect::show(&db, json, job, raw),
        Command::Check => inspect::check(&db, json),
        Command::Wait { id, group, timeout } => inspect::wait(&db, json, id, group, timeout),
        Command::Endings {
            after,
            limit,
            follow: false,
            ..
        } => inspect::endings(&db, json, after, limit),
        Command::Endings {
            after,
            limit,
            follow: true,
            count,
        } => inspect::follow_endings(&db, json, after, limit, count),
        Command::Watch {
            interval,
            iterations,
        } => inspect::watch(&db, interval, iterations),
        Command::Enqueue(args) => operate::enqueue(&db, json, create, args),
        Command::Edit(args) => operate::edit(&db, json, args),
        Command::Promote { job } => operate::edit(&db, json, operate::EditArgs::promote(job)),
        Command::Retry { job, bulk } => operate::retry(&db, json, job, bulk),
        Command::Cancel { job, bulk } => operate::cancel(&db, json, job, bulk),
        Command::Purge { older_than, state } => operate::purge(&db, json, older_than, state),
        Command::Reap => operate::reap(&db, json),
        Command::Schedules { action: None } => inspect::schedules(&db, json),
        Command::Schedules {
            action: Some(action),
        } => match action {
            ScheduleAction::Pause { name } => operate::schedule(&db, json, &name, "pause"),
            ScheduleAction::Resume { name } => operate::schedule(&db, json, &name, "resume"),
            ScheduleAction::Remove { name } => operate::schedule(&db, json, &name, "remove"),
        },
        Command::Pause { queue } => operate::pause(&db, json, create, &queue, true),
        Command::Resume { queue } => operate::pause(&db, json, create, &queue, false),
        Command::Limit {
            queue,
            concurrency,
            rate,
            per_key,
            per_key_rate,
            no_concurrency,
            no_rate,
            no_per_key,
            no_per_key_rate,
            none,
        } => {
            let change = operate::LimitChange {
                concurrency: match no_concurrency || none {
                    true => Some(None),
                    false => concurrency.map(Some),
                },
                per_key: match no_per_key || none {
                    true => Some(None),
                    false => per_key.map(Some),
                },
                per_key_rate: match no_per_key_rate || none {
                    true => Some(None),
                    false => per_key_rate.map(Some),
                },
                rate: match no_rate || none {
                    true => Some(None),
                    false => rate.map(Some),
                },
            };
            operate::limit(&db, json, create, &queue, change)
        }
        Command::Backoff {
            queue,
            policy,
            jitter,
            none,
        } => {
            let change = match (policy, none) {
                (_, true) => Some(None),
                (Some(p), false) => Some(Some(match jitter {
                    Some(j) => p.jitter(j),
                    None => p,
                })),
                (None, false) => None,
            };
            operate::backoff(&db, json, create, &queue, change)
        }
        Command::Compact => operate::compact(&db, json),
        Command::Serve {
            listen,
            token,
            threads,
            allow_hosts,
            tls_in_front,
        } => serve::run(
            &db,
            serve::Settings {
                allow_hosts,
                tls_in_front,
                listen,
                token,
                threads,
            },
        ),
        Command::Demo { jobs } => demo::run(json, jobs),
        Command::Bench { scale, only } => bench::run(json, scale, only.as_deref()),
        Command::Child {
            queue,
            enqueue,
            claim,
            lease_ms,
            no_verify,
            shared,
        } => child::run(
            Store::builder(db)
                .verify_on_open(!no_verify)
                .sharing(if shared {
                    leasehold::Sharing::MultiProcess
                } else {
                    leasehold::Sharing::SingleWriter
                }),
            &queue,
            enqueue,
            claim,
            Duration::from_millis(lease_ms),
        ),
        Command::SeatClient { socket, threads } => bench::seat_client(&socket, threads),
        Command::Pool {
            queue,
            workers,
            work_ms,
            report,
            prefetch,
            schedule_every_ms,
            reap_every_ms,
        } => pool_process::run(
            db,
            pool_process::Settings {
                queue,
                workers,
                work: Duration::from_millis(work_ms),
                report,
                prefetch,
                schedule_every: schedule_every_ms.map(Duration::from_millis),
                reap_every: reap_every_ms.map(Duration::from_millis),
            },
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("leasehold: {}", explain(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// 1: the operation was refused; 2: the request itself is wrong; 3: the store has a problem.
fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Input(_) | Error::Config(_) => 2,
        Error::Postgres(
            PgError::BadUrl(_) | PgError::BadSchemaName(_) | PgError::SystemSchema(_),
        ) => 2,
        // What the store refused, each refusal as the library names them.
        e if e.is_refusal() => 1,
        Error::Open(leasehold::OpenError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            1
        }
        Error::Postgres(PgError::NoStore(_)) => 1,
        _ => 3,
    }
}

fn explain(e: &Error) -> String {
    use leasehold::OpenError;
    match e {
        Error::Open(OpenError::Io { path, source })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                // `--create` makes a store, never the directories it would sit in.
                Some(dir) if !dir.is_dir() => format!(
                    "no directory {} to hold the store {} ({source}); make it first",
                    dir.display(),
                    path.display()
                ),
                _ => format!(
                    "no store at {} (set --db or LEASEHOLD_DB; `leasehold --create enqueue \
                     ...` makes one)",
                    path.display()
                ),
            }
        }
        Error::QueueNotFound(queue) => format!(
            "no job has used queue {queue:?} and it has no settings: is the name right? \
             (`--create` sets it anyway)"
        ),
        Error::Postgres(PgError::NoStore(schema)) => format!(
            "no leasehold store in schema {schema} of that database (is `?schema=` right? \
             `leasehold --create enqueue ...` makes one)"
        ),
        Error::Open(OpenError::Locked { pid, .. }) if *pid != Some(std::process::id()) => {
            format!(
                "the store is being written by another process{}; stop it, or use a read \
                 command (processes that all open it with Sharing::MultiProcess write it together)",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            )
        }
        Error::Postgres(PgError::Connect(why)) => {
            format!("cannot reach the database ({why}); check the URL in --db or LEASEHOLD_DB")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` names every command as a read or a write, so that a command added later
    /// cannot be left out of it again.
    #[test]
    fn the_help_names_every_command() {
        let cli = super::Cli::command();
        let about = cli
            .get_long_about()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let words: Vec<&str> = about
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
            .collect();
        for command in cli.get_subcommands() {
            let name = command.get_name();
            assert!(
                name == "help" || command.is_hide_set() || words.contains(&name),
                "`leasehold --help` does not name {name}"
            );
        }
    }
}
