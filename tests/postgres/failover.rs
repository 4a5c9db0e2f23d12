//! Failovers, on a primary and a streaming standby of the machine's own PostgreSQL binaries
//! (`initdb`, `pg_basebackup`) in a temporary directory on free ports, so nothing touches the
//! machine's main server.
//!
//! - With a synchronous standby, nothing acknowledged is lost: worker processes drain with a
//!   multi-host URL (`target_session_attrs=read-write`); the primary is stopped hard
//!   (immediate mode) mid-drain and the standby promoted. No completion a pool reported
//!   committed is lost, no job's effect is committed twice, every lease held at the
//!   failover is fenced or taken back, the pools carry on by themselves, and store time on
//!   the new primary is not behind the old one's last commit. A commit whose wait for the
//!   standby is cancelled is not acknowledged.
//! - With an asynchronous standby, the last commits may be lost, but nothing acknowledged
//!   is handed out twice: a stale holder is fenced (its lease's token), no job id names two
//!   jobs, and a handle that wrote on the new primary refuses the old one when it returns.
//!
//! Runs where `LEASEHOLD_PG_URL` is set (the machines that run PostgreSQL, and `.ci/run`)
//! and the binaries are found; elsewhere one line says it did not run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use leasehold::postgres::client as postgres;
use leasehold::postgres::{PgError, PgStore};
use leasehold::{JobId, JobState, JobStore, NewGroup, NewJob, ReadJobs};

use crate::say;

/// One server of the pair: its data directory and port.
struct Node {
    data: PathBuf,
    port: u16,
}

/// The pair, in a directory of its own; stopped (hard) when dropped.
struct Pair {
    bin: PathBuf,
    dir: tempfile::TempDir,
    primary: Node,
    standby: Node,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for node in [&self.primary, &self.standby] {
            let _ = self.pg_ctl(node, &["stop", "-m", "immediate", "-w"]);
        }
    }
}

/// A port no one listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Whether the primary waits for its standby at each commit.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Replication {
    Synchronous,
    Asynchronous,
}

/// `tool` of the server's binaries run as the `postgres` user (the server refuses root).
fn as_postgres(bin: &Path, tool: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join(tool))
        .args(args)
        .output()
        .unwrap()
}

fn ok(what: &str, out: Output) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pair {
    /// The machine's PostgreSQL binaries, if they are there and can run as `postgres`.
    fn binaries() -> Option<PathBuf> {
        let out = Command::new("pg_config").arg("--bindir").output().ok()?;
        let bin = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        let usable = bin.join("initdb").exists()
            && bin.join("pg_basebackup").exists()
            && Command::new("runuser")
                .args(["-u", "postgres", "--", "true"])
                .status()
                .is_ok_and(|s| s.success());
        usable.then_some(bin)
    }

    /// A primary replicating to `standby1` as `replication` says, and that standby
    /// streaming.
    fn start(bin: PathBuf, replication: Replication) -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = (id("-u"), id("-g"));
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        let node = |name: &str| Node {
            data: dir.path().join(name),
            port: free_port(),
        };
        let (primary, standby) = (node("primary"), node("standby"));
        let pair = Pair {
            bin,
            dir,
            primary,
            standby,
        };
        let p = pair.primary.data.to_str().unwrap();
        ok(
            "initdb",
            as_postgres(
                &pair.bin,
                "initdb",
                &["-D", p, "-U", "postgres", "--auth=trust"],
            ),
        );
        let waits_for = match replication {
            Replication::Synchronous => "standby1",
            Replication::Asynchronous => "",
        };
        pair.configure(
            &pair.primary,
            &format!(
                "wal_level = replica\nmax_wal_senders = 4\n\
                 synchronous_standby_names = '{waits_for}'\nsynchronous_commit = on\n"
            ),
        );
        ok(
            "start the primary",
            pair.pg_ctl(&pair.primary, &["start", "-w"]),
        );
        let s = pair.standby.data.to_str().unwrap();
        let port = pair.primary.port.to_string();
        ok(
            "pg_basebackup",
            as_postgres(
                &pair.bin,
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    "postgres",
                    "-D",
                    s,
                    "-R",
                    "-X",
                    "stream",
                ],
            ),
        );
        // Promoted, it is a primary alone: it must not wait for a standby of its own.
        pair.configure(&pair.standby, "synchronous_standby_names = ''\n");
        // After the one `-R` wrote (the last setting of a name wins), naming the standby as
        // the primary's `synchronous_standby_names` does.
        append(
            &pair.standby.data.join("postgresql.auto.conf"),
            &format!(
                "\nprimary_conninfo = 'host=127.0.0.1 port={port} user=postgres \
                 application_name=standby1'\n"
            ),
        );
        ok(
            "start the standby",
            pair.pg_ctl(&pair.standby, &["start", "-w"]),
        );
        let mut admin = pair.client(&pair.primary);
        let state = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        crate::db::wait_until("the standby to stream", || {
            let rows = admin
                .query(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby1' \
                     AND sync_state = $1",
                    &[&state],
                )
                .unwrap();
            !rows.is_empty()
        });
        pair
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    fn caught_up(&self) {
        let mut primary = self.client(&self.primary);
        let lsn: String = primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .unwrap()
            .try_get(0)
            .unwrap();
        let mut standby = self.client(&self.standby);
        crate::db::wait_until("the standby to replay the primary's commits", || {
            let sql = "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn";
            standby
                .query_one(sql, &[&lsn])
                .unwrap()
                .try_get::<_, bool>(0)
                .unwrap()
        });
    }

    /// Stops the primary hard and promotes the standby, which then holds what it had
    /// received: a standby stopped before is started again first (it has only what it had
    /// received when it stopped).
    fn fail_over(&self) {
        ok(
            "stop the primary",
            self.pg_ctl(&self.primary, &["stop", "-m", "immediate", "-w"]),
        );
        let running = self.pg_ctl(&self.standby, &["status"]).status.success();
        if !running {
            ok(
                "start the standby again",
                self.pg_ctl(&self.standby, &["start", "-w"]),
            );
        }
        ok(
            "promote the standby",
            self.pg_ctl(&self.standby, &["promote", "-w"]),
        );
    }

    /// Appends `settings` to the node's configuration, with its port, its socket in the
    /// pair's directory, and no `fsync` (the host does not crash here: a server stopped hard
    /// loses no write the kernel has).
    fn configure(&self, node: &Node, settings: &str) {
        append(
            &node.data.join("postgresql.conf"),
            &format!(
                "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 fsync = off\nmax_connections = 100\n{settings}",
                node.port,
                self.dir.path().display()
            ),
        );
    }

    fn pg_ctl(&self, node: &Node, args: &[&str]) -> Output {
        let log = self.dir.path().join(format!("{}.log", node.port));
        let mut all = vec![
            "-D",
            node.data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
        ];
        all.extend(args);
        as_postgres(&self.bin, "pg_ctl", &all)
    }

    fn url(&self, node: &Node) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", node.port)
    }

    fn client(&self, node: &Node) -> postgres::Client {
        postgres::Client::connect(&self.url(node), postgres::NoTls).unwrap()
    }

    /// Both servers, the one that accepts writes first.
    fn multi_host_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(file).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// The server's clock, the store's time, in microseconds.
fn clock_us(c: &mut postgres::Client) -> i64 {
    let sql = "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint";
    c.query_one(sql, &[]).unwrap().try_get(0).unwrap()
}

/// `id -u postgres` or `id -g postgres`.
fn id(flag: &str) -> u32 {
    let out = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A pair of servers started for `test`, or `None` (and a line saying why) where they
/// cannot be.
fn pair(test: &str, replication: Replication) -> Option<Pair> {
    if std::env::var("LEASEHOLD_PG_URL").is_err() {
        say(&format!(
            "the failover test {test} did not run: LEASEHOLD_PG_URL is not set"
        ));
        return None;
    }
    let Some(bin) = Pair::binaries() else {
        say(&format!(
            "the failover test {test} did not run: no PostgreSQL binaries to run as user postgres"
        ));
        return None;
    };
    Some(Pair::start(bin, replication))
}

#[test]
fn a_failover_to_a_synchronous_standby_loses_no_acknowledged_completion() {
    let Some(pair) = pair("of a drain", Replication::Synchronous) else {
        return;
    };
    let url = pair.multi_host_url();
    let schema = "lh_failover";
    let store = PgStore::builder(&url).schema(schema).open().unwrap();
    pair.client(&pair.primary)
        .batch_execute(&format!(
            "CREATE TABLE {schema}.effects (job bigint NOT NULL)"
        ))
        .unwrap();
    let jobs = 3000u64;
    super::suite::enqueue_kills(&store, jobs);
    let mut workers: Vec<super::suite::PgWorker> = (0..3)
        .map(|_| super::suite::PgWorker::start_at(&url, schema, 1000, true))
        .collect();
    let mut committed = Vec::new();
    // A third of the way, the primary stops hard and the standby takes over.
    while (committed.len() as u64) < jobs / 3 {
        for w in &mut workers {
            w.take_reported(&mut committed, Duration::from_millis(20));
        }
    }
    let before = clock_us(&mut pair.client(&pair.primary));
    let acknowledged_before = committed.len();
    ok(
        "stop the primary",
        pair.pg_ctl(&pair.primary, &["stop", "-m", "immediate", "-w"]),
    );
    #[allow(clippy::disallowed_methods)] // the test's own stopwatch, not store time
    let stopped = std::time::Instant::now();
    ok(
        "promote the standby",
        pair.pg_ctl(&pair.standby, &["promote", "-w"]),
    );
    // The pools find the new primary by themselves and finish.
    let mut resumed = None;
    let mut new = pair.client(&pair.standby);
    let succeeded = |c: &mut postgres::Client| -> u64 {
        let n: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM {schema}.leasehold_jobs WHERE state = 'succeeded'"),
                &[],
            )
            .unwrap()
            .try_get(0)
            .unwrap();
        n as u64
    };
    crate::db::wait_until("every job to succeed on the new primary", || {
        let seen = committed.len();
        for w in &mut workers {
            w.take_reported(&mut committed, Duration::from_millis(5));
        }
        if resumed.is_none() && committed.len() > seen {
            resumed = Some(stopped.elapsed());
        }
        succeeded(&mut new) == jobs
    });
    drop(workers);
    let after = clock_us(&mut new);
    assert!(
        after >= before,
        "store time ran backwards across the failover"
    );
    // Every completion a pool reported committed is there, with its effect.
    let store = PgStore::builder(&url).schema(schema).open().unwrap();
    for id in &committed {
        let job = store.job(leasehold::JobId(*id as u64)).unwrap().unwrap();
        assert_eq!(
            job.state(),
            JobState::Succeeded,
            "job {id} was acknowledged"
        );
    }
    let (rows, distinct): (i64, i64) = {
        let row = new
            .query_one(
                &format!("SELECT count(*), count(DISTINCT job) FROM {schema}.effects"),
                &[],
            )
            .unwrap();
        (row.try_get(0).unwrap(), row.try_get(1).unwrap())
    };
    assert_eq!(
        (rows, distinct),
        (jobs as i64, jobs as i64),
        "each job's effect committed exactly once"
    );
    let counters = store.stats().unwrap().counters;
    let check = store.check().unwrap();
    assert!(check.is_clean(), "{:?}", check.problems);
    say(&format!(
        "failover: {jobs} jobs, {acknowledged_before} completions acknowledged before the primary \
         stopped and {} in all, every one found on the new primary; {} leases taken back \
         (takeover {}, reaper {}), {} writes fenced; pools committed again {:?} after the stop",
        committed.len(),
        counters.reclaimed_by_takeover + counters.reclaimed_by_reaper,
        counters.reclaimed_by_takeover,
        counters.reclaimed_by_reaper,
        counters.fenced_writes_rejected,
        resumed.unwrap_or_default(),
    ));
}

/// Whether `e` is the commit's outcome unknown.
fn outcome_unknown(e: &leasehold::Error) -> bool {
    matches!(e, leasehold::Error::Postgres(PgError::OutcomeUnknown(_)))
}

/// A standby stalled (stopped: the primary's commits wait for it at `COMMIT`), then the
/// waits cancelled as an operator or a watchdog would (`pg_cancel_backend`): PostgreSQL
/// answers such a `COMMIT` with success and a warning, and the commit is on the primary
/// alone. The store answers that its outcome is unknown, never `Ok`: after the primary
/// dies and the standby is promoted, the job is running at its attempt again and the
/// enqueued job does not exist, as the caller was told they might.
#[test]
fn a_commit_whose_wait_for_the_synchronous_standby_was_cancelled_is_not_acknowledged() {
    let Some(pair) = pair("of a cancelled wait", Replication::Synchronous) else {
        return;
    };
    let url = pair.multi_host_url();
    let schema = "lh_cancelled_wait";
    let store = PgStore::builder(&url).schema(schema).open().unwrap();
    let job = store.enqueue(NewJob::new("q", "x")).unwrap();
    let lease = store
        .claim("q", "w", Duration::from_secs(600))
        .unwrap()
        .unwrap();
    ok(
        "stop the standby",
        pair.pg_ctl(&pair.standby, &["stop", "-m", "fast", "-w"]),
    );
    let completing = {
        let (store, lease) = (store.clone(), lease.clone());
        std::thread::spawn(move || store.complete(&lease, b"done"))
    };
    let enqueuing = {
        let store = store.clone();
        std::thread::spawn(move || store.enqueue(NewJob::new("q", "y")))
    };
    let mut admin = pair.client(&pair.primary);
    crate::db::wait_until("both commits to wait for the standby", || {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
        admin
            .query_one(sql, &[])
            .unwrap()
            .try_get::<_, i64>(0)
            .unwrap()
            == 2
    });
    admin
        .batch_execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .unwrap();
    let completed = completing.join().unwrap();
    let enqueued = enqueuing.join().unwrap();
    assert!(
        completed.as_ref().is_err_and(outcome_unknown),
        "a completion only the primary has: {completed:?}"
    );
    assert!(
        enqueued.as_ref().is_err_and(outcome_unknown),
        "an enqueue only the primary has: {enqueued:?}"
    );
    // What the caller was not told it had: gone with the primary.
    pair.fail_over();
    let store = PgStore::builder(pair.url(&pair.standby))
        .schema(schema)
        .open()
        .unwrap();
    let found = store.job(job).unwrap().unwrap();
    assert_eq!(
        (found.state(), found.attempt()),
        (JobState::Running, lease.attempt)
    );
    assert_eq!(store.stats().unwrap().total(JobState::Queued), 0);
    // The retry the unknown outcome calls for lands on the new primary.
    store.complete(&lease, b"done").unwrap();
    assert_eq!(
        store.job(job).unwrap().unwrap().state(),
        JobState::Succeeded
    );
}

/// An asynchronous standby behind its primary (stopped, then started again only after the
/// primary died) is promoted: the claim of job 1 and the last enqueues are lost. The job is
/// granted again at the same attempt number, to another holder; the first holder's lease
/// (another token) is refused, its heartbeat and its completion alike, and the second's
/// completion is its own. No job id or group id acknowledged before the failover is handed
/// out again. Then the old primary is started again beside the promoted one: a handle that
/// wrote on the promoted server and must connect anew refuses it rather than write there.
#[test]
fn after_an_asynchronous_failover_a_stale_holder_is_fenced_no_id_is_handed_out_twice_and_the_old_primary_is_refused()
 {
    let Some(pair) = pair("of an asynchronous standby", Replication::Asynchronous) else {
        return;
    };
    let url = pair.multi_host_url();
    let schema = "lh_async_failover";
    let a = PgStore::builder(&url).schema(schema).open().unwrap();
    let job = a.enqueue(NewJob::new("q", "x")).unwrap();
    pair.caught_up();
    ok(
        "stop the standby",
        pair.pg_ctl(&pair.standby, &["stop", "-m", "fast", "-w"]),
    );
    // What only the primary will ever have.
    let first = a
        .claim("q", "a", Duration::from_secs(600))
        .unwrap()
        .unwrap();
    let acknowledged: Vec<JobId> = (0..41)
        .map(|i| a.enqueue(NewJob::new("other", format!("{i}"))).unwrap())
        .collect();
    let group = a.open_group(NewGroup::new()).unwrap();
    pair.fail_over();

    let b = PgStore::builder(&url).schema(schema).open().unwrap();
    let second = b
        .claim("q", "b", Duration::from_secs(600))
        .unwrap()
        .unwrap();
    assert_eq!(
        (second.job, second.attempt),
        (first.job, first.attempt),
        "the standby never saw the first claim: the same attempt number is granted again"
    );
    assert_ne!(second.token, first.token);
    let renewal = a.heartbeat(&first, 1);
    assert!(
        renewal.as_ref().is_err_and(|e| e.is_lease_lost()),
        "{renewal:?}"
    );
    let late = a.complete(&first, b"from a");
    let Err(leasehold::Error::LeaseLost(lost)) = &late else {
        panic!("the stale holder's completion: {late:?}");
    };
    assert!(!lost.ended_by_holder);
    b.complete(&second, b"from b").unwrap();
    assert_eq!(b.output(job).unwrap().as_deref(), Some(&b"from b"[..]));
    let again = a.complete(&first, b"from a");
    assert!(
        again
            .as_ref()
            .is_err_and(|e| matches!(e, leasehold::Error::LeaseLost(l) if !l.ended_by_holder)),
        "the end was the other holder's: {again:?}"
    );
    // No acknowledged id names another job or group.
    let newest = *acknowledged.last().unwrap();
    for store in [&a, &b] {
        let made = store.enqueue(NewJob::new("other", "after")).unwrap();
        assert!(
            made > newest,
            "job id {made} after {newest} was acknowledged"
        );
        let made = store.open_group(NewGroup::new()).unwrap();
        assert!(
            made > group,
            "group id {made} after {group} was acknowledged"
        );
    }
    for id in &acknowledged {
        assert!(
            b.job(*id).unwrap().is_none(),
            "job {id} was lost, not reused"
        );
    }

    // The old primary comes back as a primary of its own, first in the URL.
    ok(
        "start the old primary again",
        pair.pg_ctl(&pair.primary, &["start", "-w"]),
    );
    let mut new = pair.client(&pair.standby);
    new.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .unwrap();
    // (the first operation may meet a connection the termination closed, and retries)
    let refused = (0..3)
        .map(|_| b.enqueue(NewJob::new("other", "on the old primary?")))
        .find(|r| {
            !r.as_ref()
                .is_err_and(|e| e.to_string().contains("terminat"))
        })
        .unwrap();
    assert!(
        matches!(
            &refused,
            Err(leasehold::Error::Postgres(PgError::StalePrimary {
                found: 1,
                seen: 2
            }))
        ),
        "{refused:?}"
    );
    let on_old: i64 = pair
        .client(&pair.primary)
        .query_one(
            &format!(
                "SELECT count(*) FROM {schema}.leasehold_jobs WHERE payload = 'on the old primary?'"
            ),
            &[],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(on_old, 0, "nothing was written on the old primary");
}
