//! Read commands: they open the store read-only, beside a running writer.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::{
    CatchUp, Error, GroupId, HolderState, Job, JobFilter, JobId, JobOrder, JobState, Run,
    StoreTime, Target, Uniqueness, When,
};

use super::target::Reader;
use serde::Serialize;

use super::SortArg;
use super::format::{self, Table, dms, ms, print_json};

/// A job as the JSON output shows it (store times in milliseconds on the store clock).
#[derive(Serialize)]
pub struct JobView {
    id: u64,
    queue: String,
    state: &'static str,
    priority: i32,
    attempt: u32,
    failures: u32,
    max_attempts: u32,
    unique_key: Option<String>,
    limit_key: Option<String>,
    created_at_ms: u64,
    run_at_ms: u64,
    updated_at_ms: u64,
    finished_at_ms: Option<u64>,
    lease: Option<LeaseView>,
    progress: u64,
    progress_at_ms: u64,
    cancel_requested: bool,
    last_error: Option<String>,
    /// `while_unfinished`, `after_success` (with `unique_for_ms`) or `until_purged`.
    uniqueness: &'static str,
    unique_for_ms: Option<u64>,
    time_limit_ms: Option<u64>,
    /// No attempt starts at or after it (store time).
    expires_at_ms: Option<u64>,
    /// Its own retry policy, if it has one (else its queue's applies, else the store's).
    retry_policy: Option<String>,
    metadata: BTreeMap<String, String>,
    /// What it waits for (or waited for).
    needs: Vec<NeedView>,
    /// The group it is a member of.
    group: Option<u64>,
}

#[derive(Serialize)]
struct NeedView {
    /// `job` or `group`.
    kind: &'static str,
    id: u64,
    /// `success`, `success or death`, `success or cancel` or `any end`.
    require: String,
    /// How it ended, once it has (as the waiter saw it).
    ended: Option<&'static str>,
    met: bool,
}

fn need_view(n: &leasehold::Need) -> NeedView {
    let (kind, id) = match n.on() {
        Target::Job(id) => ("job", id.0),
        Target::Group(id) => ("group", id.0),
        _ => ("target", 0),
    };
    NeedView {
        kind,
        id,
        require: n.require().to_string(),
        ended: n.ended().map(JobState::name),
        met: n.met(),
    }
}

#[derive(Serialize)]
struct LeaseView {
    owner: String,
    claimed_at_ms: u64,
    expires_at_ms: u64,
    /// Negative once the lease has expired.
    expires_in_ms: i64,
    /// When the attempt's hard time limit ends it.
    deadline_ms: Option<u64>,
    /// The process instance holding it, when processes share the store.
    holder: Option<HolderView>,
}

#[derive(Serialize, Clone)]
struct HolderView {
    instance: String,
    /// `alive`, `gone` or `unknown` (see `leasehold::HolderState`).
    state: &'static str,
    /// Whether its process is known to be alive.
    alive: bool,
}

/// The holder of each running job's lease, by job (empty unless processes share the store).
type Holders = BTreeMap<JobId, HolderView>;

fn holders(store: &Reader) -> Result<Holders, Error> {
    Ok(store
        .holders()?
        .into_iter()
        .map(|(job, id, state)| {
            let instance = id.to_string();
            let view = HolderView {
                instance,
                state: state.name(),
                alive: state == HolderState::Alive,
            };
            (job, view)
        })
        .collect())
}

impl JobView {
    fn of(j: &Job, now: StoreTime, holders: &Holders) -> JobView {
        JobView {
            id: j.id().0,
            queue: j.queue().to_owned(),
            state: j.state().name(),
            priority: j.priority(),
            attempt: j.attempt().0,
            failures: j.failures(),
            max_attempts: j.max_attempts(),
            unique_key: j.unique_key().map(str::to_owned),
            limit_key: j.limit_key().map(str::to_owned),
            created_at_ms: ms(j.created_at()),
            run_at_ms: ms(j.run_at()),
            updated_at_ms: ms(j.updated_at()),
            finished_at_ms: j.finished_at().map(ms),
            lease: j.lease().map(|l| LeaseView {
                owner: l.owner().to_owned(),
                claimed_at_ms: ms(l.claimed_at()),
                expires_at_ms: ms(l.expires_at()),
                expires_in_ms: ms(l.expires_at()) as i64 - ms(now) as i64,
                deadline_ms: l.deadline().map(ms),
                holder: holders.get(&j.id()).cloned(),
            }),
            progress: j.progress(),
            progress_at_ms: ms(j.progress_at()),
            cancel_requested: j.cancel_requested(),
            last_error: j.last_error().map(str::to_owned),
            uniqueness: match j.uniqueness() {
                Uniqueness::WhileUnfinished => "while_unfinished",
                Uniqueness::AfterSuccess(_) => "after_success",
                Uniqueness::UntilPurged => "until_purged",
                _ => "other",
            },
            unique_for_ms: match j.uniqueness() {
                Uniqueness::AfterSuccess(d) => Some(d.as_millis() as u64),
                _ => None,
            },
            time_limit_ms: j.time_limit().map(|d| d.as_millis() as u64),
            expires_at_ms: j.expires_at().map(ms),
            retry_policy: j.retry_policy().map(ToString::to_string),
            metadata: j.metadata().iter().cloned().collect(),
            needs: j.needs().iter().map(need_view).collect(),
            group: j.group().map(|g| g.0),
        }
    }
}

#[derive(Serialize)]
struct RunView {
    attempt: u32,
    worker: String,
    claimed_at_ms: u64,
    ended_at_ms: Option<u64>,
    outcome: Option<String>,
    progress: u64,
}

fn run_view(r: &Run) -> RunView {
    RunView {
        attempt: r.attempt().0,
        worker: r.worker().to_owned(),
        claimed_at_ms: ms(r.claimed_at()),
        ended_at_ms: r.ended_at().map(ms),
        outcome: r.outcome().as_ref().map(|o| o.to_string()),
        progress: r.progress(),
    }
}

/// A table of queues with a column per state, then `extra` columns.
fn queue_table(extra: &[&'static str]) -> Table {
    let mut headers = vec!["queue"];
    headers.extend(JobState::ALL.iter().map(|s| s.name()));
    headers.extend_from_slice(extra);
    Table::new(&headers)
}

/// A queue's name and its count in each state, in the order of [`queue_table`].
fn count_cells(name: &str, counts: &leasehold::QueueCounts) -> Vec<String> {
    let mut row = vec![name.to_owned()];
    row.extend(JobState::ALL.iter().map(|s| counts.get(*s).to_string()));
    row
}

/// Opens the store read-only. A store its writer left unclean is still shown (its last
/// commit, the file untouched); the operator is told so on stderr, which keeps `--json`
/// output parseable.
fn open(db: &Path) -> Result<Reader, Error> {
    let store = Reader::open(db)?;
    if !store.closed_cleanly() {
        let running = store.stats()?.total(JobState::Running);
        eprintln!(
            "note: {} was not closed cleanly (its writer was killed or lost power); showing its \
             last commit without repairing the file; the next writer will take back {running} \
             lease{}",
            db.display(),
            if running == 1 { "" } else { "s" }
        );
    }
    Ok(store)
}

pub fn stats(db: &Path, json: bool) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let stats = store.stats()?;
    let now = stats.now;
    #[derive(Serialize)]
    struct QueueView {
        queue: String,
        counts: BTreeMap<&'static str, u64>,
        total: u64,
        oldest_waiting_ms: Option<u64>,
        most_overdue_lease_ms: Option<u64>,
        next_lease_expiry_in_ms: Option<u64>,
        /// How long ago a worker last asked the queue for work (or renewed one of its
        /// leases), as marked at most every half minute.
        served_ago_ms: Option<u64>,
        /// Work has waited and nobody asked for it for `UNSERVED_AFTER` or more.
        unserved: bool,
        /// No claim takes its jobs.
        paused: bool,
        /// At most this many held at once.
        concurrency_limit: Option<u32>,
        per_key_limit: Option<u32>,
        per_key_rate_claims: Option<u32>,
        per_key_rate_per_ms: Option<u64>,
        /// At most `rate_limit_claims` claims per `rate_limit_per_ms`.
        rate_limit_claims: Option<u32>,
        rate_limit_per_ms: Option<u64>,
        /// How its failed jobs without a policy of their own wait (else the store's).
        retry_policy: Option<String>,
        /// Its limit keys with no room now (by their count or their rate).
        keys_at_limit: u64,
        /// Its waiting jobs held out of the claim order behind their limit key.
        parked: u64,
    }
    let unserved = store.unserved_queues()?;
    let mut queues = Vec::new();
    for (name, counts) in &stats.queues {
        let timing = store.timing(name)?;
        queues.push(QueueView {
            queue: name.clone(),
            counts: counts
                .by_state
                .iter()
                .map(|(s, n)| (s.name(), *n))
                .collect(),
            total: counts.total(),
            oldest_waiting_ms: timing
                .earliest_run_at
                .filter(|t| *t <= now)
                .map(|t| dms(now.saturating_since(t))),
            most_overdue_lease_ms: timing
                .earliest_expiry
                .filter(|t| *t < now)
                .map(|t| dms(now.saturating_since(t))),
            next_lease_expiry_in_ms: timing.next_expiry.map(|t| dms(t.saturating_since(now))),
            served_ago_ms: counts.served_at.map(|t| dms(now.saturating_since(t))),
            unserved: unserved.iter().any(|u| u.queue == *name),
            paused: counts.paused,
            concurrency_limit: counts.limits.concurrency,
            per_key_limit: counts.limits.per_key,
            per_key_rate_claims: counts.limits.per_key_rate.map(|r| r.claims),
            per_key_rate_per_ms: counts.limits.per_key_rate.map(|r| dms(r.per)),
            rate_limit_claims: counts.limits.rate.map(|r| r.claims),
            rate_limit_per_ms: counts.limits.rate.map(|r| dms(r.per)),
            retry_policy: counts.retry.as_ref().map(ToString::to_string),
            keys_at_limit: counts.keys_at_limit,
            parked: counts.parked,
        });
    }
    let c = &stats.counters;
    let processes = processes(&store)?;
    let failing_schedules: BTreeMap<String, String> = store
        .schedules()?
        .iter()
        .filter_map(|s| Some((s.name().to_owned(), s.failure()?.to_owned())))
        .collect();
    if json {
        #[derive(Serialize)]
        struct StatsView {
            now_ms: u64,
            writer_pid: Option<u32>,
            closed_cleanly: bool,
            processes: Option<ProcessesView>,
            queues: Vec<QueueView>,
            counters: BTreeMap<&'static str, u64>,
            last_reaper_pass: Option<ReaperPassView>,
            /// Schedules the last scheduler pass could not fire, with why.
            failing_schedules: BTreeMap<String, String>,
            /// Groups that have not ended, and the jobs (callbacks) blocked until they do.
            open_groups: u64,
            waiting_for_groups: u64,
        }
        #[derive(Serialize)]
        struct ReaperPassView {
            ago_ms: u64,
            took_ms: u64,
            reclaimed: u64,
            purged: u64,
            every_ms: Option<u64>,
            late: bool,
        }
        let mut counters: BTreeMap<_, _> = c.named().into_iter().collect();
        counters.insert("worst_detection_delay_ms", dms(c.worst_detection_delay));
        print_json(&StatsView {
            now_ms: ms(now),
            writer_pid: store.writer_pid()?,
            closed_cleanly: store.closed_cleanly(),
            processes,
            queues,
            counters,
            last_reaper_pass: stats.last_reaper_pass.as_ref().map(|p| ReaperPassView {
                ago_ms: dms(p.age(now)),
                took_ms: dms(p.took),
                reclaimed: p.reclaimed,
                purged: p.purged,
                every_ms: p.every.map(dms),
                late: p.late(now),
            }),
            failing_schedules,
            open_groups: stats.open_groups,
            waiting_for_groups: stats.waiting_for_groups,
        });
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = queue_table(&["oldest waiting", "nearest lease", "most overdue"]);
    for (q, (name, counts)) in queues.iter().zip(&stats.queues) {
        let mut row = count_cells(name, counts);
        let opt = |v: Option<u64>, pre: &str| {
            v.map(|m| format!("{pre}{}", format::duration(Duration::from_millis(m))))
                .unwrap_or_else(|| "-".into())
        };
        row.push(opt(q.oldest_waiting_ms, ""));
        row.push(opt(q.next_lease_expiry_in_ms, "in "));
        row.push(opt(q.most_overdue_lease_ms, "by "));
        t.row(row);
    }
    if t.is_empty() {
        println!("no jobs");
    } else {
        println!("{}", t.render());
    }
    for (name, counts) in &stats.queues {
        if counts.paused {
            println!("queue {name} is paused (`leasehold resume {name}`)");
        }
        if counts.limits.is_limited() || counts.limits.is_limited_per_key() {
            println!("queue {name}: {}", format::limits(&counts.limits));
        }
        if counts.keys_at_limit > 0 || counts.parked > 0 {
            println!(
                "queue {name}: {} limit key{} at the limit, {} job{} parked behind their keys",
                counts.keys_at_limit,
                if counts.keys_at_limit == 1 { "" } else { "s" },
                counts.parked,
                if counts.parked == 1 { "" } else { "s" },
            );
        }
        if let Some(policy) = &counts.retry {
            println!("queue {name}: a failed job waits by {policy}");
        }
    }
    if stats.open_groups > 0 {
        println!(
            "{} group{} open, {} job{} waiting for {}",
            stats.open_groups,
            if stats.open_groups == 1 { "" } else { "s" },
            stats.waiting_for_groups,
            if stats.waiting_for_groups == 1 {
                ""
            } else {
                "s"
            },
            if stats.open_groups == 1 { "it" } else { "them" },
        );
    }
    for (name, failure) in &failing_schedules {
        println!(
            "warning: schedule {name:?} cannot fire (the others do): {failure} (`leasehold schedules`)"
        );
    }
    for u in &unserved {
        println!(
            "warning: queue {} has had work waiting for {} and {}: is its name right, and is a pool running?",
            u.queue,
            format::duration(now.saturating_since(u.waiting_since)),
            match u.served_at {
                Some(at) => format!(
                    "no worker has asked for it for {}",
                    format::duration(now.saturating_since(at))
                ),
                None => "no worker has ever asked for it".to_owned(),
            }
        );
    }
    println!(
        "\nreclaims: reaper {}, takeover {}, process died {}, at open {}, released {}",
        c.reclaimed_by_reaper,
        c.reclaimed_by_takeover,
        c.reclaimed_process_died,
        c.reclaimed_at_open,
        c.released
    );
    println!(
        "leases lost {}, fenced writes rejected {}, stalled {}, timed out {}, worst detection \
         delay {}",
        c.leases_lost,
        c.fenced_writes_rejected,
        c.stalled,
        c.timed_out,
        format::duration(c.worst_detection_delay)
    );
    match &stats.last_reaper_pass {
        Some(pass) => println!(
            "last reaper pass {} ago{}: took {}, reclaimed {}, purged {}{}",
            format::duration(pass.age(now)),
            pass.every
                .map(|e| format!(" (runs every {})", format::duration(e)))
                .unwrap_or_default(),
            format::duration(pass.took),
            pass.reclaimed,
            pass.purged,
            if pass.late(now) {
                "; LATE: it has missed passes, is its process running?"
            } else {
                ""
            }
        ),
        None => println!(
            "no reaper pass recorded: expired leases are taken back only by claims (is a \
             Reaper running beside the pools?)"
        ),
    }
    if let Some(p) = processes {
        println!(
            "processes sharing the store: {} holding leases ({} alive, {} dead, {} unknown); \
             {} leases held by live processes, {} by dead ones (taken back by the next that \
             notices), {} by processes whose lock file is missing (left to expire)",
            p.holding, p.alive, p.dead, p.unknown, p.leases_alive, p.leases_dead, p.leases_unknown
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Who holds the leases of a store that processes share.
#[derive(Serialize, Clone, Copy)]
struct ProcessesView {
    /// Process instances holding at least one lease.
    holding: usize,
    alive: usize,
    dead: usize,
    /// Holders whose liveness cannot be told (their lock file is missing or replaced).
    unknown: usize,
    leases_alive: usize,
    leases_dead: usize,
    leases_unknown: usize,
}

/// `None` unless processes share the store.
fn processes(store: &Reader) -> Result<Option<ProcessesView>, Error> {
    if !store.shared_by_processes()? {
        return Ok(None);
    }
    let mut instances = BTreeMap::new();
    for (_, id, state) in store.holders()? {
        instances.entry(id).or_insert((state, 0usize)).1 += 1;
    }
    let count = |want: HolderState| instances.values().filter(move |(s, _)| *s == want);
    Ok(Some(ProcessesView {
        holding: instances.len(),
        alive: count(HolderState::Alive).count(),
        dead: count(HolderState::Gone).count(),
        unknown: count(HolderState::Unknown).count(),
        leases_alive: count(HolderState::Alive).map(|(_, n)| n).sum(),
        leases_dead: count(HolderState::Gone).map(|(_, n)| n).sum(),
        leases_unknown: count(HolderState::Unknown).map(|(_, n)| n).sum(),
    }))
}

pub fn jobs(
    db: &Path,
    json: bool,
    selection: super::Selection,
    limit: usize,
    sort: SortArg,
    waiting_on: Option<u64>,
) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let now = store.now()?;
    let order = match sort {
        SortArg::Oldest => JobOrder::Oldest,
        SortArg::Newest => JobOrder::Newest,
        SortArg::Priority => JobOrder::Priority,
        SortArg::Updated => JobOrder::Updated,
    };
    // One more than shown, to tell whether the list was cut.
    let mut list = match waiting_on {
        // The jobs that wait for one, oldest first (the selection's other parts do not
        // apply: clap refuses them together).
        Some(id) => {
            let mut waiters = Vec::new();
            for w in store
                .waiters(JobId(id))?
                .into_iter()
                .take(limit.saturating_add(1))
            {
                waiters.extend(store.job(w)?);
            }
            waiters
        }
        None => store.jobs(&JobFilter {
            limit: Some(limit.saturating_add(1)),
            order,
            ..selection.filter()
        })?,
    };
    let cut = list.len() > limit;
    list.truncate(limit);
    let holders = holders(&store)?;
    if json {
        let views: Vec<_> = list.iter().map(|j| JobView::of(j, now, &holders)).collect();
        print_json(&views);
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(&[
        "id",
        "queue",
        "state",
        "pri",
        "attempt",
        "run at",
        "lease",
        "progress",
        "metadata",
        "last error",
    ]);
    for j in &list {
        let lease = match &j.lease() {
            Some(l) if l.expires_at() >= now => format!(
                "{} ({} left)",
                l.owner(),
                format::duration(l.expires_at().saturating_since(now))
            ),
            Some(l) => format!(
                "{} (expired {} ago)",
                l.owner(),
                format::duration(now.saturating_since(l.expires_at()))
            ),
            None => "-".into(),
        };
        let lease = match holders.get(&j.id()) {
            Some(h) => format!("{lease} in {} ({})", &h.instance[..8], h.state),
            None => lease,
        };
        t.row(vec![
            j.id().to_string(),
            j.queue().to_owned(),
            j.state().name().into(),
            j.priority().to_string(),
            j.attempt().0.to_string(),
            format::relative(j.run_at(), now),
            lease,
            j.progress().to_string(),
            format::metadata(j.metadata()),
            j.last_error()
                .unwrap_or_default()
                .chars()
                .take(60)
                .collect(),
        ]);
    }
    if t.is_empty() {
        println!("no jobs");
    } else {
        println!("{}", t.render());
    }
    if cut {
        println!("(the first {limit} shown; more match: --limit N shows more)");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn schedules(db: &Path, json: bool) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let now = store.now()?;
    // Shown to an operator: a cron schedule's next tick is a wall-clock time.
    #[allow(clippy::disallowed_methods)]
    let wall = std::time::SystemTime::now();
    let list = store.schedules()?;
    #[derive(Serialize)]
    struct ScheduleView {
        name: String,
        queue: String,
        /// `every 5m`, or `cron "0 3 * * *" in Europe/Berlin`.
        when: String,
        catch_up: &'static str,
        paused: bool,
        /// How long until its next tick (negative: it has come, and waits for a scheduler).
        next_in_ms: i64,
        fired: u64,
        skipped: u64,
        /// Why the last scheduler pass could not fire it (the others fired).
        failure: Option<String>,
        /// Its jobs' options, where they have them.
        priority: i32,
        max_attempts: Option<u32>,
        time_limit_ms: Option<u64>,
        retry_policy: Option<String>,
        limit_key: Option<String>,
        expires_in_ms: Option<u64>,
    }
    let views: Vec<ScheduleView> = list
        .iter()
        .map(|s| ScheduleView {
            name: s.name().to_owned(),
            queue: s.queue().to_owned(),
            when: match s.when() {
                When::Every(d) => format!("every {}", format::duration(*d)),
                When::Cron { expr, zone } => format!("cron {expr:?} in {zone}"),
                other => format!("{other:?}"),
            },
            catch_up: match s.catch_up() {
                CatchUp::Once => "once",
                CatchUp::All => "all",
                CatchUp::Skip => "skip",
                _ => "other",
            },
            paused: s.paused(),
            next_in_ms: s.next_in_ms(now, wall),
            fired: s.fired(),
            skipped: s.skipped(),
            failure: s.failure().map(str::to_owned),
            priority: s.priority(),
            max_attempts: s.max_attempts(),
            time_limit_ms: s.time_limit().map(dms),
            retry_policy: s.retry_policy().map(ToString::to_string),
            limit_key: s.limit_key().map(str::to_owned),
            expires_in_ms: s.expires_in().map(dms),
        })
        .collect();
    if json {
        print_json(&views);
        return Ok(ExitCode::SUCCESS);
    }
    if views.is_empty() {
        println!("no schedules");
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(&[
        "name",
        "queue",
        "when",
        "catch up",
        "next tick",
        "fired",
        "skipped",
    ]);
    for v in &views {
        let next = match (v.paused, v.next_in_ms) {
            (true, _) => "paused".to_owned(),
            (false, n) if n >= 0 => {
                format!("in {}", format::duration(Duration::from_millis(n as u64)))
            }
            (false, n) => format!(
                "due {} ago",
                format::duration(Duration::from_millis(n.unsigned_abs()))
            ),
        };
        t.row(vec![
            v.name.clone(),
            v.queue.clone(),
            v.when.clone(),
            v.catch_up.into(),
            next,
            v.fired.to_string(),
            v.skipped.to_string(),
        ]);
    }
    println!("{}", t.render());
    for v in &views {
        let mut options = Vec::new();
        if v.priority != 0 {
            options.push(format!("priority {}", v.priority));
        }
        if let Some(n) = v.max_attempts {
            options.push(format!("{n} attempts"));
        }
        let span = |ms: u64| format::duration(Duration::from_millis(ms));
        if let Some(ms) = v.time_limit_ms {
            options.push(format!("time limit {}", span(ms)));
        }
        if let Some(policy) = &v.retry_policy {
            options.push(format!("retried by {policy}"));
        }
        if let Some(key) = &v.limit_key {
            options.push(format!("limit key {key}"));
        }
        if let Some(ms) = v.expires_in_ms {
            options.push(format!("expires {} after its tick", span(ms)));
        }
        if !options.is_empty() {
            println!("schedule {:?}'s jobs: {}", v.name, options.join(", "));
        }
    }
    for v in views.iter().filter(|v| v.failure.is_some()) {
        let failure = v.failure.as_deref().unwrap_or_default();
        println!("schedule {:?} cannot fire: {failure}", v.name);
    }
    Ok(ExitCode::SUCCESS)
}

/// A group as the JSON output shows it.
#[derive(Serialize)]
struct GroupView {
    id: u64,
    created_at_ms: u64,
    sealed: bool,
    finished_at_ms: Option<u64>,
    /// `succeeded`, `dead` or `cancelled` once it ended.
    outcome: Option<&'static str>,
    members: u64,
    succeeded: u64,
    dead: u64,
    cancelled: u64,
    /// The jobs that wait for it (its callbacks first), with their states.
    waiters: Vec<(u64, &'static str)>,
    /// The group it is a member of.
    parent: Option<u64>,
    /// The groups that are its members.
    subgroups: Vec<u64>,
}

/// One group: whether it is sealed, its members' ends so far, how it ended, and what waits
/// for it; sealed or cancelled first, when asked.
pub fn group(db: &Path, json: bool, id: u64, act: super::GroupAction) -> Result<ExitCode, Error> {
    let group = GroupId(id);
    if act != super::GroupAction::Show {
        let store = super::operate::open(db, false)?;
        match act {
            super::GroupAction::Seal => store.seal_group(group)?,
            _ => {
                let n = store.cancel_group(group)?;
                if !json {
                    println!("group {group} cancelled: {n} jobs cancelled or told to stop");
                }
            }
        }
    }
    let store = open(db)?;
    let now = store.now()?;
    let g = store.group(group)?.ok_or(Error::GroupNotFound(group))?;
    let mut waiters = Vec::new();
    for &w in g.waiters() {
        let state = store.job(w)?.map_or("purged", |j| j.state().name());
        waiters.push((w.0, state));
    }
    let (succeeded, dead, cancelled) = g.ended();
    if json {
        print_json(&GroupView {
            id,
            created_at_ms: ms(g.created_at()),
            sealed: g.is_sealed(),
            finished_at_ms: g.finished_at().map(ms),
            outcome: g.outcome().map(JobState::name),
            members: g.members(),
            succeeded,
            dead,
            cancelled,
            waiters,
            parent: g.parent().map(|p| p.0),
            subgroups: g.subgroups().iter().map(|s| s.0).collect(),
        });
        return Ok(ExitCode::SUCCESS);
    }
    let standing = match (g.outcome(), g.is_sealed()) {
        (Some(outcome), _) => format!(
            "ended {outcome} {}",
            format::relative(g.finished_at().unwrap_or(now), now)
        ),
        (None, true) => "sealed, running".to_owned(),
        (None, false) => "open: members may still join".to_owned(),
    };
    println!("group {group}  {standing}");
    println!(
        "{} members: {succeeded} succeeded, {dead} dead, {cancelled} cancelled, {} not ended",
        g.members(),
        g.members() - (succeeded + dead + cancelled)
    );
    if g.members() > 0 {
        println!("(list them: leasehold jobs --group {})", group.0);
    }
    if let Some(parent) = g.parent() {
        println!("member of group {}", parent.0);
    }
    if !g.subgroups().is_empty() {
        let ids: Vec<String> = g.subgroups().iter().map(|s| s.0.to_string()).collect();
        println!("groups in it: {}", ids.join(", "));
    }
    for (w, state) in waiters {
        println!("waited for by job {w} ({state})");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn show(db: &Path, json: bool, id: u64, raw: bool) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let now = store.now()?;
    let job = store.job(JobId(id))?.ok_or(Error::JobNotFound(JobId(id)))?;
    let payload = store.payload(job.id())?.unwrap_or_default();
    if raw {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&payload);
        let _ = out.flush();
        return Ok(ExitCode::SUCCESS);
    }
    let history = store.history(job.id())?;
    let output = store.output(job.id())?;
    let checkpoint = store.checkpoint(job.id())?;
    let logs = store.logs(job.id())?;
    if json {
        #[derive(Serialize)]
        struct Bytes {
            len: usize,
            utf8: Option<String>,
            hex: String,
        }
        let bytes = |b: &[u8]| Bytes {
            len: b.len(),
            utf8: std::str::from_utf8(b).ok().map(str::to_owned),
            hex: format::hex(b),
        };
        #[derive(Serialize)]
        struct ShowView {
            now_ms: u64,
            job: JobView,
            /// The jobs that wait for it.
            waiters: Vec<u64>,
            history: Vec<RunView>,
            payload: Bytes,
            output: Option<Bytes>,
            /// The last checkpoint an attempt saved.
            checkpoint: Option<CheckpointView>,
            /// Each attempt's log lines.
            logs: Vec<LogView>,
        }
        #[derive(Serialize)]
        struct LogView {
            attempt: u32,
            dropped: u64,
            lines: Vec<LineView>,
        }
        #[derive(Serialize)]
        struct LineView {
            at_ms: u64,
            text: String,
        }
        #[derive(Serialize)]
        struct CheckpointView {
            attempt: u32,
            saved_at_ms: u64,
            data: Bytes,
        }
        print_json(&ShowView {
            now_ms: ms(now),
            job: JobView::of(&job, now, &holders(&store)?),
            waiters: store.waiters(job.id())?.iter().map(|w| w.0).collect(),
            history: history.iter().map(run_view).collect(),
            payload: bytes(&payload),
            output: output.as_deref().map(bytes),
            checkpoint: checkpoint.as_ref().map(|c| CheckpointView {
                attempt: c.attempt().0,
                saved_at_ms: ms(c.saved_at()),
                data: bytes(c.data()),
            }),
            logs: (logs.iter())
                .map(|l| LogView {
                    attempt: l.attempt().0,
                    dropped: l.dropped(),
                    lines: (l.lines())
                        .map(|(at, text)| LineView {
                            at_ms: ms(at),
                            text: text.to_owned(),
                        })
                        .collect(),
                })
                .collect(),
        });
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "job {}  queue {}  state {}",
        job.id(),
        job.queue(),
        job.state()
    );
    println!(
        "priority {}  attempt {}  failures {}/{}  progress {}",
        job.priority(),
        job.attempt().0,
        job.failures(),
        job.max_attempts(),
        job.progress()
    );
    println!(
        "created {}  run at {}  updated {}",
        format::relative(job.created_at(), now),
        format::relative(job.run_at(), now),
        format::relative(job.updated_at(), now)
    );
    if let Some(l) = &job.lease() {
        println!(
            "lease held by {}, expires {}",
            l.owner(),
            format::relative(l.expires_at(), now)
        );
        if let Some(deadline) = l.deadline() {
            println!(
                "time limit ends this attempt {}",
                format::relative(deadline, now)
            );
        }
    }
    if let Some(limit) = job.time_limit() {
        println!("time limit {} per attempt", format::duration(limit));
    }
    if let Some(at) = job.expires_at() {
        println!(
            "expires {}: no attempt starts after",
            format::relative(at, now)
        );
    }
    if let Some(policy) = job.retry_policy() {
        println!("retry policy {policy} (its own)");
    }
    if !job.metadata().is_empty() {
        println!("metadata {}", format::metadata(job.metadata()));
    }
    if job.cancel_requested() {
        println!("cancel requested: the holder is told at its next heartbeat");
    }
    for need in job.needs() {
        let how = need.standing();
        println!(
            "waits for {} to end in {} ({how})",
            need.on(),
            need.require()
        );
    }
    if let Some(g) = job.group() {
        println!("member of group {g}");
    }
    let waiters = store.waiters(job.id())?;
    if !waiters.is_empty() {
        let ids: Vec<String> = waiters.iter().map(|w| w.to_string()).collect();
        println!("waited for by {}", ids.join(", "));
    }
    if let Some(k) = &job.unique_key() {
        match job.uniqueness() {
            Uniqueness::WhileUnfinished => println!("unique key {k}"),
            Uniqueness::AfterSuccess(d) => println!(
                "unique key {k}, kept for {} after success",
                format::duration(d)
            ),
            Uniqueness::UntilPurged => println!("unique key {k}, kept until purged"),
            other => println!("unique key {k} ({other:?})"),
        }
    }
    if let Some(k) = job.limit_key() {
        println!("limit key {k}");
    }
    if let Some(e) = &job.last_error() {
        println!("last error: {e}");
    }
    println!(
        "payload ({} bytes): {}",
        payload.len(),
        format::bytes(&payload)
    );
    if let Some(o) = &output {
        println!("output ({} bytes): {}", o.len(), format::bytes(o));
    }
    if let Some(c) = &checkpoint {
        println!(
            "checkpoint of attempt {}, saved {} ({} bytes): {}",
            c.attempt().0,
            format::relative(c.saved_at(), now),
            c.data().len(),
            format::bytes(c.data())
        );
    }
    let mut t = Table::new(&[
        "attempt", "worker", "claimed", "ended", "outcome", "progress",
    ]);
    for r in &history {
        t.row(vec![
            r.attempt().0.to_string(),
            r.worker().to_owned(),
            format::relative(r.claimed_at(), now),
            r.ended_at()
                .map(|e| format::relative(e, now))
                .unwrap_or_else(|| "running".into()),
            r.outcome()
                .as_ref()
                .map(|o| o.to_string())
                .unwrap_or_default(),
            r.progress().to_string(),
        ]);
    }
    if !t.is_empty() {
        println!("\n{}", t.render());
    }
    for log in &logs {
        println!("\nlog of attempt {}:", log.attempt().0);
        if log.dropped() > 0 {
            println!("  ({} older lines dropped)", log.dropped());
        }
        for (at, text) in log.lines() {
            println!("  {:>10}  {text}", format::relative(at, now));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn check(db: &Path, json: bool) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let report = store.check()?;
    if json {
        #[derive(Serialize)]
        struct CheckView<'a> {
            jobs_checked: u64,
            clean: bool,
            problems: &'a [String],
        }
        print_json(&CheckView {
            jobs_checked: report.jobs,
            clean: report.is_clean(),
            problems: &report.problems,
        });
    } else if report.is_clean() {
        println!(
            "ok: {} jobs, every index entry matches a record",
            report.jobs
        );
    } else {
        println!(
            "{} problems in {} jobs:",
            report.problems.len(),
            report.jobs
        );
        for p in &report.problems {
            println!("  {p}");
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `wait`: until the job (or group) has ended, or `timeout` passes.
/// One end as `endings --json` shows it.
#[derive(Serialize)]
struct EndingView {
    cursor: String,
    kind: &'static str,
    id: u64,
    queue: Option<String>,
    state: &'static str,
    at_ms: u64,
}

impl EndingView {
    fn of(e: &leasehold::Ending) -> EndingView {
        let (kind, id, queue) = match &e.of {
            leasehold::EndOf::Job { id, queue } => ("job", id.0, Some(queue.clone())),
            leasehold::EndOf::Group(g) => ("group", g.0, None),
            _ => ("other", 0, None),
        };
        EndingView {
            cursor: e.cursor.to_string(),
            kind,
            id,
            queue,
            state: e.state.name(),
            at_ms: ms(e.at),
        }
    }

    /// The line `endings` prints for it.
    fn line(&self) -> String {
        let queue = (self.queue.as_ref())
            .map(|q| format!(" of {q}"))
            .unwrap_or_default();
        let (cursor, kind, id, state) = (&self.cursor, self.kind, self.id, self.state);
        format!("{cursor} {kind} {id}{queue} ended {state}")
    }
}

pub fn endings(
    db: &Path,
    json: bool,
    after: Option<leasehold::EndCursor>,
    limit: usize,
) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let after = after.unwrap_or(leasehold::EndCursor::START);
    let page = store.endings(after, limit)?;
    if json {
        #[derive(Serialize)]
        struct EndingsView {
            endings: Vec<EndingView>,
            next: String,
            /// Some ends after the cursor were purged before they were read.
            gap: bool,
        }
        print_json(&EndingsView {
            endings: page.list.iter().map(EndingView::of).collect(),
            next: page.next.to_string(),
            gap: page.gap,
        });
        return Ok(ExitCode::SUCCESS);
    }
    if page.gap {
        println!("note: some ends after {after} were purged before they were read");
    }
    for e in &page.list {
        println!("{}", EndingView::of(e).line());
    }
    println!("next: --after {}", page.next);
    Ok(ExitCode::SUCCESS)
}

/// `endings --follow`: each end as it commits, one line (or JSON object) each, until
/// `count` ends if given. Each line carries its cursor: a script that keeps the last one
/// it handled carries on from it with `--after`.
pub fn follow_endings(
    db: &Path,
    json: bool,
    after: Option<leasehold::EndCursor>,
    limit: usize,
    count: Option<usize>,
) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let mut at = after.unwrap_or(leasehold::EndCursor::START);
    let mut left = count.unwrap_or(usize::MAX);
    let mut out = std::io::stdout().lock();
    while left > 0 {
        let page = store.wait_for_endings(at, limit.min(left).max(1), Duration::from_secs(60))?;
        if page.gap && !page.list.is_empty() {
            eprintln!("note: some ends after {at} were purged before they were read");
        }
        for e in &page.list {
            let view = EndingView::of(e);
            let line = match json {
                true => serde_json::to_string(&view).unwrap_or_default(),
                false => view.line(),
            };
            // (a closed pipe ends the follow, as it ends `tail -f`)
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(ExitCode::SUCCESS);
            }
        }
        left -= page.list.len().min(left);
        at = page.next;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn wait(
    db: &Path,
    json: bool,
    id: u64,
    group: bool,
    timeout: Duration,
) -> Result<ExitCode, Error> {
    let store = open(db)?;
    let ended = match group {
        true => (store.wait_for_group(GroupId(id), timeout)?).map(|g| g.outcome()),
        false => (store.wait_for(JobId(id), timeout)?).map(|j| Some(j.state())),
    };
    let what = if group { "group" } else { "job" };
    let state = ended.flatten();
    if json {
        #[derive(Serialize)]
        struct WaitView {
            kind: &'static str,
            id: u64,
            /// How it ended; `null` if it had not by the timeout.
            ended: Option<&'static str>,
        }
        print_json(&WaitView {
            kind: what,
            id,
            ended: state.map(JobState::name),
        });
    } else {
        match state {
            Some(state) => println!("{what} {id} ended {state}"),
            None => println!(
                "{what} {id} had not ended after {}",
                format::duration(timeout)
            ),
        }
    }
    // (apart from the codes every command shares: 1 refused, 2 usage, 3 store problem)
    Ok(match state {
        Some(JobState::Succeeded) => ExitCode::SUCCESS,
        Some(_) => ExitCode::from(4),
        None => ExitCode::from(5),
    })
}

pub fn watch(db: &Path, interval: Duration, iterations: u64) -> Result<ExitCode, Error> {
    let mut store = open(db)?;
    let tty = std::io::stdout().is_terminal();
    let mut running_before: BTreeMap<JobId, (u32, String)> = BTreeMap::new();
    let mut events: Vec<String> = Vec::new();
    let mut n = 0u64;
    loop {
        n += 1;
        if n > 1 && !store.closed_cleanly() {
            // A snapshot of a dead writer's last commit: look again, so that a writer that
            // starts meanwhile is followed.
            store = Reader::open(db)?;
        }
        let now = store.now()?;
        let stats = store.stats()?;
        let running = store.jobs(&JobFilter {
            state: Some(JobState::Running),
            order: JobOrder::Priority,
            ..JobFilter::default()
        })?;
        let running_now: BTreeMap<JobId, (u32, String)> = running
            .iter()
            .map(|j| {
                let owner = j.lease().map(|l| l.owner().to_owned()).unwrap_or_default();
                (j.id(), (j.attempt().0, owner))
            })
            .collect();
        let gone: BTreeSet<JobId> = running_before
            .keys()
            .filter(|id| running_now.get(id).map(|r| r.0) != running_before.get(id).map(|r| r.0))
            .copied()
            .collect();
        for id in gone {
            let (attempt, owner) = &running_before[&id];
            let history = store.history(id)?;
            if let Some(run) = history.iter().find(|r| r.attempt().0 == *attempt)
                && let Some(leasehold::Outcome::LeaseExpired { path, overdue }) = run.outcome()
            {
                events.push(format!(
                    "{}  job {id} attempt #{attempt}: lease of {owner} taken back by {path}, {} after expiry",
                    store.describe_time(now),
                    format::duration(*overdue)
                ));
            }
        }
        running_before = running_now;
        if events.len() > 10 {
            events.drain(..events.len() - 10);
        }

        let mut screen = String::new();
        if tty {
            screen.push_str("\x1b[2J\x1b[H");
        } else if n > 1 {
            screen.push_str("\n---\n");
        }
        screen.push_str(&format!(
            "leasehold watch  {}  store time {}  (every {})\n\n",
            super::target::describe(db),
            store.describe_time(now),
            format::duration(interval)
        ));
        // Who holds each lease, where processes share the store: a dead process's lease is
        // not shown as if its holder were working on it.
        let holders = holders(&store)?;
        let mut t = queue_table(&[]);
        for (name, counts) in &stats.queues {
            t.row(count_cells(name, counts));
        }
        screen.push_str(&if t.is_empty() {
            "no jobs".into()
        } else {
            t.render()
        });
        screen.push_str("\n\nrunning leases:\n");
        let mut r = Table::new(&["job", "queue", "attempt", "holder", "time left", "progress"]);
        for j in running.iter().take(20) {
            let (owner, left) = match &j.lease() {
                Some(l) if l.expires_at() >= now => (
                    l.owner().to_owned(),
                    format::duration(l.expires_at().saturating_since(now)),
                ),
                Some(l) => (
                    l.owner().to_owned(),
                    format!(
                        "expired {} ago",
                        format::duration(now.saturating_since(l.expires_at()))
                    ),
                ),
                None => ("-".into(), "-".into()),
            };
            let (owner, left) = match holders.get(&j.id()) {
                Some(h) if h.alive => (format!("{owner} ({})", h.state), left),
                // Its time left means nothing: the holder is gone (its lease comes back at
                // the next process's look) or cannot be told alive (it expires).
                Some(h) => (
                    format!("{owner} ({})", h.state),
                    format!("{left}, holder {}", h.state),
                ),
                None => (owner, left),
            };
            r.row(vec![
                j.id().to_string(),
                j.queue().to_owned(),
                j.attempt().0.to_string(),
                owner,
                left,
                j.progress().to_string(),
            ]);
        }
        screen.push_str(&if r.is_empty() {
            "  none".into()
        } else {
            r.render()
        });
        if running.len() > 20 {
            screen.push_str(&format!("\n  ... and {} more", running.len() - 20));
        }
        screen.push_str("\n\nrecent reclaims:\n");
        if events.is_empty() {
            screen.push_str("  none seen yet\n");
        }
        for e in &events {
            screen.push_str(&format!("  {e}\n"));
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(screen.as_bytes());
        let _ = out.flush();
        drop(out);
        if iterations != 0 && n >= iterations {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(interval);
    }
}
