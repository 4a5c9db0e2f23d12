//! The helper processes of the process tests: the test binary itself, started again to play one
//! role instead of running tests. This keeps the helpers out of the shipped `leasehold` tool and
//! needs no binary of its own: each test binary that starts helpers has an ignored test named
//! `helper_process` calling [`run`], and [`command`] starts the running binary with only that
//! test selected and the role in an environment variable.
//!
//! Roles (arguments as `--flag value`, `--shared` and `--no-verify` alone):
//! - `holder`: opens the store, enqueues `--enqueue` jobs, claims up to `--claim` with a
//!   `--lease-ms` lease, prints `claimed <job> <attempt>` for each and `ready <now>`, then holds
//!   them until killed or stdin closes (`holder.rs`).
//! - `worker`: `--threads` threads claim, renew and complete with an effect row in the same
//!   transaction, printing each commit after it returned (`worker.rs`); with `--pool`, a
//!   `WorkerPool` of that many workers does, claiming ahead and committing in batches, and
//!   its `on_ended` hook prints each commit.
//! - `poison`: a worker pool of `--workers` whose handler aborts the process on the job with
//!   the payload `poison` (`poison.rs`); exits once the queue is drained.
//! - `tenants`: a worker pool on a shared store whose handler logs each job's start and end
//!   (with its tenant, the payload) to the file `--log` (`tenants.rs`).
//! - `pg-holder`: claims one job on a PostgreSQL store and writes as its holder when told
//!   (`pg_holder.rs`), for partition tests.
//! - `pg-worker`: the same on the PostgreSQL store at `--url` in `--schema`, the effect a row
//!   of that schema's `effects` table (`pg_worker.rs`), also with `--pool`, on a handle of
//!   `--connections` (16).
//! - `pg-pool`: a worker pool on a PostgreSQL store, some of whose handlers obey their
//!   interruption and some do not (`pg_pool.rs`), for the partition test of a whole machine.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::time::Duration;

use leasehold::{Sharing, Store};

#[path = "../../cli/src/holder.rs"]
mod holder;
#[path = "pg_holder.rs"]
mod pg_holder;
#[path = "pg_pool.rs"]
mod pg_pool;
#[path = "pg_worker.rs"]
mod pg_worker;
#[path = "poison.rs"]
mod poison;
#[path = "resumer.rs"]
mod resumer;
#[path = "tenants.rs"]
mod tenants;
#[path = "worker.rs"]
mod worker;

#[allow(unused_imports)]
pub use resumer::STEPS;
#[allow(unused_imports)]
pub use worker::EFFECTS;

const ROLE: &str = "LEASEHOLD_TEST_HELPER";
/// libtest prints this line (after an empty one) before the selected test runs.
const PREAMBLE: &str = "running 1 test";

/// A command that runs `role` with `args` in a new process of the running test binary.
pub fn command<S: AsRef<OsStr>>(role: &str, args: impl IntoIterator<Item = S>) -> Command {
    command_under(&[], role, args)
}

/// [`command`] run through `prefix` (`ip netns exec <name>`, say).
pub fn command_under<S: AsRef<OsStr>>(
    prefix: &[&str],
    role: &str,
    args: impl IntoIterator<Item = S>,
) -> Command {
    let mut spec = role.to_owned();
    for arg in args {
        let arg = arg.as_ref().to_str().expect("helper arguments are UTF-8");
        assert!(
            !arg.contains('\n'),
            "a helper argument holds a newline: {arg:?}"
        );
        spec.push('\n');
        spec.push_str(arg);
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match prefix.split_first() {
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest).arg(exe);
            cmd
        }
        None => Command::new(exe),
    };
    cmd.args([
        "--ignored",
        "--exact",
        "helper_process",
        "--nocapture",
        "--quiet",
    ])
    .env(ROLE, spec);
    cmd
}

/// The helper's stdout as lines, past what libtest printed before the role began.
pub fn stdout_lines(
    child: &mut Child,
) -> impl Iterator<Item = std::io::Result<String>> + Send + use<> {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    for line in lines.by_ref() {
        if line.expect("helper stdout") == PREAMBLE {
            break;
        }
    }
    // libtest's note about a test that has run for a minute goes to the helper's stdout on
    // a loaded machine: no line of a helper's own.
    lines.filter(|line| {
        !line
            .as_ref()
            .is_ok_and(|l| l.contains("has been running for over"))
    })
}

/// The helper's stdout lines as they come, read by a thread of their own, so that a test can
/// wait for the next with a deadline.
pub fn stdout_channel(child: &mut Child) -> crossbeam_channel::Receiver<String> {
    let lines = stdout_lines(child);
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Plays the role this process was started for, then exits; returns at once when it was not
/// started as a helper (the ordinary `--ignored` run of the suite).
pub fn run() {
    let Ok(spec) = std::env::var(ROLE) else {
        return;
    };
    let mut words = spec.split('\n');
    let role = words.next().unwrap_or_default().to_owned();
    let mut flags = HashMap::new();
    while let Some(flag) = words.next() {
        let flag = flag.trim_start_matches("--");
        let value = match flag {
            "shared" | "no-verify" | "pool" => "",
            _ => words.next().unwrap_or_default(),
        };
        flags.insert(flag.to_owned(), value.to_owned());
    }
    let number = |name: &str, default: u64| flags.get(name).map_or(default, |v| v.parse().unwrap());
    let db: std::path::PathBuf = flags.get("db").map(Into::into).unwrap_or_default();
    let queue = flags
        .get("queue")
        .cloned()
        .unwrap_or_else(|| "default".into());
    let lease = Duration::from_millis(number("lease-ms", 60_000));
    let sharing = match flags.contains_key("shared") {
        true => Sharing::MultiProcess,
        false => Sharing::SingleWriter,
    };
    let result = match role.as_str() {
        "holder" => holder::run(
            Store::builder(db)
                .verify_on_open(!flags.contains_key("no-verify"))
                .sharing(sharing),
            &queue,
            number("enqueue", 0) as usize,
            number("claim", 0) as usize,
            lease,
        ),
        "worker" => worker::run(
            db,
            queue,
            number("threads", 4) as usize,
            lease,
            sharing,
            flags.contains_key("pool"),
        ),
        "pg-holder" => pg_holder::run(
            flags.get("url").expect("--url"),
            flags.get("schema").expect("--schema"),
            lease,
        ),
        "pg-worker" => pg_worker::run(
            flags.get("url").expect("--url"),
            flags.get("schema").expect("--schema"),
            number("threads", 2) as usize,
            lease,
            flags.contains_key("pool"),
            number("connections", 16) as usize,
        ),
        "pg-pool" => pg_pool::run(
            flags.get("url").expect("--url"),
            flags.get("schema").expect("--schema"),
            number("workers", 4) as usize,
            lease,
            flags.get("go").expect("--go"),
        ),
        "poison" => poison::run(db, queue, number("workers", 1) as usize, sharing),
        "resumer" => resumer::run(db, queue, number("workers", 2) as usize, lease),
        "tenants" => tenants::run(
            db,
            queue,
            number("workers", 6) as usize,
            lease,
            flags.get("log").expect("--log").into(),
        ),
        other => panic!("no helper role {other:?}"),
    };
    // Exit here, before libtest reports a test result on stdout.
    match result {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            eprintln!("helper {role}: {e}");
            std::process::exit(1)
        }
    }
}
