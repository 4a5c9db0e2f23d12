//! A failover that loses nothing: a primary and a synchronous streaming standby of the
//! machine's own PostgreSQL binaries (`initdb`, `pg_basebackup`), in a temporary directory on
//! free ports, so nothing touches the machine's main server. Worker processes drain with a
//! multi-host URL (`target_session_attrs=read-write`); the primary is stopped hard
//! (immediate mode) mid-drain and the standby promoted. Then: no completion a pool reported
//! committed is lost, no job's effect is committed twice, every lease held at the failover is
//! fenced or taken back, the pools carry on by themselves, and store time on the new
//! primary is not behind the old one's last commit.
//!
//! Runs where `LEASEHOLD_PG_URL` is set (the machines that run PostgreSQL, and `.ci/run`)
//! and the binaries are found; elsewhere one line says it did not run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use leasehold::postgres::PgStore;
use leasehold::postgres::client as postgres;
use leasehold::{JobState, ReadJobs};

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

    /// A primary with synchronous replication to `standby1`, and that standby streaming.
    fn start(bin: PathBuf) -> Pair {
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
        pair.configure(
            &pair.primary,
            "wal_level = replica\nmax_wal_senders = 4\n\
             synchronous_standby_names = 'standby1'\nsynchronous_commit = on\n",
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
        crate::db::wait_until("the standby to replicate synchronously", || {
            let rows = admin
                .query(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby1' \
                     AND sync_state = 'sync'",
                    &[],
                )
                .unwrap();
            !rows.is_empty()
        });
        pair
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

#[test]
fn a_failover_to_a_synchronous_standby_loses_no_acknowledged_completion() {
    if std::env::var("LEASEHOLD_PG_URL").is_err() {
        say("the failover test did not run: LEASEHOLD_PG_URL is not set");
        return;
    }
    let Some(bin) = Pair::binaries() else {
        say("the failover test did not run: no PostgreSQL binaries to run as user postgres");
        return;
    };
    let pair = Pair::start(bin);
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
