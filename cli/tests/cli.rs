//! The `leasehold` tool, run as an operator would: the real binary against real store files,
//! every subcommand, `--json` parsed back, and every error exit code with its message.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../../tests/support/hostile_files.rs"]
mod hostile_files;

use leasehold::{JobStore, ReadJobs};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

struct Tool {
    _dir: tempfile::TempDir,
    db: PathBuf,
}

impl Tool {
    /// A new store, made as an operator makes one (`leasehold --create enqueue` would too).
    fn new() -> Tool {
        let t = Tool::without_store();
        drop(leasehold::Store::open(&t.db).unwrap());
        t
    }

    /// A path where no store is yet.
    fn without_store() -> Tool {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ops.redb");
        Tool { _dir: dir, db }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, None)
    }

    fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        cmd.arg("--db").arg(&self.db).args(args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input).unwrap();
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed and returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let text = self.ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
    }

    /// Runs a command that must fail with `code`; returns stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        stderr
    }
}

/// A child process that holds the store's writer seat until dropped.
struct Holder(Child);

impl Holder {
    fn hold(db: &Path, args: &[&str]) -> Holder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("__child")
            .arg("--db")
            .arg(db)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        while !line.starts_with("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child died");
        }
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn show_jobs_and_group_say_what_waits_for_what_and_how_far_a_group_got() {
    let t = Tool::new();
    let (group, clip, bundle) = {
        let store = leasehold::Store::open(&t.db).unwrap();
        let capture = store
            .enqueue(leasehold::NewJob::new("capture", "c"))
            .unwrap();
        let (group, clips) = store
            .enqueue_group(
                leasehold::NewGroup::new().on_success(leasehold::NewJob::new("upload", "u")),
                vec![
                    leasehold::NewJob::new("clips", "1").after(capture),
                    leasehold::NewJob::new("clips", "2").after(capture),
                ],
            )
            .unwrap();
        let bundle = store.group(group).unwrap().unwrap().waiters()[0];
        (group, clips[0], bundle)
    };
    let shown = t.ok(&["show", &clip.to_string()]);
    assert!(shown.contains("state blocked"), "{shown}");
    assert!(
        shown.contains("waits for job 1 to end in success (not ended yet)"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("member of group {group}")),
        "{shown}"
    );
    let capture = t.ok(&["show", "1"]);
    assert!(capture.contains("waited for by 3, 4"), "{capture}");
    let json = t.json(&["show", &bundle.to_string()]);
    assert_eq!(json["job"]["needs"][0]["kind"], "group");
    assert_eq!(json["job"]["needs"][0]["require"], "success");
    let waiting = t.json(&["jobs", "--waiting-on", "1"]);
    let ids: Vec<u64> = (waiting.as_array().unwrap().iter())
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![3, 4],
        "the callback (2) waits for the group, not the capture"
    );
    let g = t.json(&["group", &group.0.to_string()]);
    assert_eq!(
        (g["sealed"].as_bool(), g["members"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(g["waiters"][0][1], "blocked");
    let text = t.ok(&["group", &group.0.to_string()]);
    assert!(
        text.contains("2 members: 0 succeeded, 0 dead, 0 cancelled, 2 not ended"),
        "{text}"
    );
    assert!(
        text.contains(&format!("leasehold jobs --group {}", group.0)),
        "{text}"
    );
    let members = t.json(&["jobs", "--group", &group.0.to_string()]);
    let ids: Vec<u64> = (members.as_array().unwrap().iter())
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 4], "its members, not its callback (2)");
    let cancelled = t.ok(&["group", &group.0.to_string(), "--cancel"]);
    assert!(cancelled.contains("3 jobs cancelled"), "{cancelled}");
    assert!(cancelled.contains("ended cancelled"), "{cancelled}");
    let err = t.fails(&["group", "99"], 1);
    assert!(err.contains("group g99 does not exist"), "{err}");
}

#[test]
fn edit_and_promote_change_a_waiting_job_and_refuse_one_claimed_since() {
    let t = Tool::new();
    t.ok(&[
        "enqueue",
        "--queue",
        "q",
        "--delay",
        "1h",
        "--meta",
        "tenant=acme",
        "draft",
    ]);
    let out = t.ok(&[
        "edit",
        "1",
        "--priority",
        "-3",
        "--payload",
        "final",
        "--meta",
        "tier=paid",
        "--remove-meta",
        "tenant",
    ]);
    assert!(out.contains("job 1 edited: queued, priority -3"), "{out}");
    let shown = t.json(&["show", "1"]);
    assert_eq!(shown["payload"]["utf8"], "final");
    assert_eq!(shown["job"]["metadata"]["tier"], "paid");
    assert!(shown["job"]["metadata"].get("tenant").is_none());
    let before = shown["job"]["run_at_ms"].as_u64().unwrap();
    t.ok(&["promote", "1"]);
    let promoted = t.json(&["show", "1"])["job"]["run_at_ms"].as_u64().unwrap();
    assert!(promoted < before, "due now, not in an hour");
    // Claimed since the operator looked (attempt 0): refused, exit 1.
    {
        let store = leasehold::Store::open(&t.db).unwrap();
        let l = store
            .claim("q", "w", Duration::from_secs(60))
            .unwrap()
            .unwrap();
        store.fail(&l, "flaky").unwrap();
    }
    let err = t.fails(&["edit", "1", "--if-attempt", "0", "--priority", "5"], 1);
    assert!(err.contains("was claimed since"), "{err}");
    t.ok(&["edit", "1", "--if-attempt", "1", "--priority", "5"]);
    // Too large a payload is the request's fault: exit 2.
    let big = t.db.with_extension("big");
    std::fs::write(&big, vec![b'x'; 2 << 20]).unwrap();
    t.fails(&["edit", "1", "--file", big.to_str().unwrap()], 2);
}

#[test]
fn a_listing_cut_at_its_limit_says_so() {
    let t = Tool::new();
    for p in ["a", "b", "c"] {
        t.ok(&["enqueue", "--queue", "q", p]);
    }
    let cut = t.ok(&["jobs", "--limit", "2"]);
    assert!(cut.contains("the first 2 shown"), "{cut}");
    assert_eq!(
        cut.lines().filter(|l| l.contains(" q ")).count(),
        2,
        "{cut}"
    );
    let whole = t.ok(&["jobs", "--limit", "3"]);
    assert!(!whole.contains("shown"), "{whole}");
}

#[test]
#[allow(clippy::disallowed_methods)] // a wall-clock time is what --at takes
fn enqueue_at_a_wall_clock_time_waits_until_then_on_the_stores_clock() {
    let t = Tool::new();
    let hour = std::time::Duration::from_secs(3600);
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + hour).to_string();
    t.ok(&["--create", "enqueue", "--queue", "q", "--at", &at, "later"]);
    let past = humantime::format_rfc3339_seconds(std::time::SystemTime::now() - hour).to_string();
    t.ok(&["enqueue", "--queue", "q", "--at", &past, "now"]);
    let jobs = t.json(&["jobs"]);
    let run_at = |i: usize| jobs[i]["run_at_ms"].as_u64().unwrap();
    let created = |i: usize| jobs[i]["created_at_ms"].as_u64().unwrap();
    let waits = run_at(0) - created(0);
    assert!((3_500_000..=3_600_000).contains(&waits), "waits {waits} ms");
    assert_eq!(run_at(1), created(1), "a time past runs now");
    let err = t.fails(&["enqueue", "--queue", "q", "--at", "tomorrow", "x"], 2);
    assert!(err.contains("2026-12-24T18:00:00Z"), "{err}");
    t.fails(
        &["enqueue", "--queue", "q", "--at", &at, "--delay", "5s", "x"],
        2,
    );
}

#[test]
fn enqueue_then_list_show_and_stats_round_trip_through_json() {
    let t = Tool::new();
    assert_eq!(
        t.json(&["enqueue", "--queue", "thumbnails", "photo-1.jpg"])["id"],
        1
    );
    t.ok(&[
        "enqueue",
        "--queue",
        "thumbnails",
        "--priority",
        "-5",
        "--delay",
        "30s",
        "--max-attempts",
        "3",
        "--unique-key",
        "p2",
        "photo-2.jpg",
    ]);
    // the same unique key returns the same job
    assert_eq!(
        t.json(&[
            "enqueue",
            "--queue",
            "thumbnails",
            "--unique-key",
            "p2",
            "again"
        ])["id"],
        2
    );
    let payload_file = t._dir.path().join("payload.bin");
    std::fs::write(&payload_file, [0u8, 1, 255]).unwrap();
    t.ok(&[
        "enqueue",
        "--queue",
        "raw",
        "--file",
        payload_file.to_str().unwrap(),
    ]);
    let piped = t.run_with_stdin(&["enqueue", "--queue", "raw", "-"], Some(b"from stdin"));
    assert!(piped.status.success());

    let jobs = t.json(&["jobs"]);
    assert_eq!(jobs.as_array().unwrap().len(), 4);
    assert_eq!(jobs[1]["priority"], -5);
    assert_eq!(jobs[1]["max_attempts"], 3);
    assert_eq!(jobs[1]["unique_key"], "p2");
    assert!(jobs[1]["run_at_ms"].as_u64().unwrap() >= 30_000);
    let raw_only = t.json(&["jobs", "--queue", "raw", "--sort", "newest", "--limit", "1"]);
    assert_eq!(raw_only.as_array().unwrap().len(), 1);
    assert_eq!(raw_only[0]["id"], 4);
    assert_eq!(
        t.json(&["jobs", "--state", "running"])
            .as_array()
            .unwrap()
            .len(),
        0
    );

    let shown = t.json(&["show", "3"]);
    assert_eq!(shown["job"]["queue"], "raw");
    assert_eq!(shown["payload"]["hex"], "0001ff");
    assert_eq!(shown["payload"]["len"], 3);
    assert_eq!(t.json(&["show", "4"])["payload"]["utf8"], "from stdin");
    let raw = t.run(&["show", "3", "--raw"]);
    assert_eq!(raw.stdout, vec![0u8, 1, 255]);
    let human = t.ok(&["show", "1"]);
    assert!(human.contains("payload (11 bytes): photo-1.jpg"), "{human}");

    let stats = t.json(&["stats"]);
    let thumbs = stats["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "thumbnails")
        .unwrap();
    assert_eq!(thumbs["counts"]["queued"], 2);
    assert_eq!(thumbs["total"], 2);
    assert!(stats["counters"]["reclaimed_by_reaper"].is_u64());
    assert!(t.ok(&["stats"]).contains("thumbnails"));
    assert!(t.ok(&["jobs"]).contains("photo") || t.ok(&["jobs"]).contains("queued"));
}

#[test]
fn cancel_retry_purge_reap_check_and_compact() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "a"]);
    t.ok(&["enqueue", "--queue", "q", "b"]);
    assert_eq!(t.json(&["cancel", "1"])["state"], "cancelled");
    assert_eq!(t.json(&["retry", "1"])["state"], "queued");
    assert_eq!(t.json(&["show", "1"])["job"]["state"], "queued");
    t.ok(&["cancel", "2"]);
    // cancelled just now: not older than 1h
    assert_eq!(t.json(&["purge", "--older-than", "1h"])["purged"], 0);
    assert_eq!(
        t.json(&["purge", "--older-than", "0s", "--state", "cancelled"])["purged"],
        1
    );
    t.fails(&["show", "2"], 1);
    assert_eq!(t.json(&["stats"])["last_reaper_pass"], Value::Null);
    assert!(t.ok(&["stats"]).contains("no reaper pass recorded"));
    assert_eq!(t.json(&["reap"])["reclaimed"].as_array().unwrap().len(), 0);
    assert!(t.ok(&["reap"]).contains("no expired leases"));
    let pass = &t.json(&["stats"])["last_reaper_pass"];
    assert_eq!(
        (&pass["reclaimed"], &pass["every_ms"], &pass["late"]),
        (&0.into(), &Value::Null, &false.into()),
        "{pass}"
    );
    assert!(t.ok(&["stats"]).contains("last reaper pass "));
    let check = t.json(&["check"]);
    assert_eq!(check["clean"], true);
    assert_eq!(check["jobs_checked"], 1);
    assert!(t.ok(&["check"]).starts_with("ok:"));
    assert!(t.json(&["compact"])["bytes_after"].as_u64().unwrap() > 0);
}

#[test]
fn a_write_command_takes_back_the_leases_a_dead_process_left() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "a"]);
    // A process claims the job with a tiny lease and dies without releasing it.
    let holder = Holder::hold(&t.db, &["--queue", "q", "--claim", "1", "--lease-ms", "1"]);
    drop(holder);
    // Opening for writing takes back the dead process's lease at once.
    let reap = t.json(&["reap"]);
    assert_eq!(
        reap["reclaimed"].as_array().unwrap().len(),
        0,
        "recovered at open, not by the reaper"
    );
    assert_eq!(reap["recovered_at_open"][0]["job"], 1);
    let shown = t.json(&["show", "1"]);
    assert_eq!(shown["job"]["state"], "queued");
    let outcome = shown["history"][0]["outcome"].as_str().unwrap();
    assert!(outcome.contains("taken back at open"), "{outcome}");
}

#[test]
fn a_store_whose_writer_was_killed_is_readable_without_writing_the_file() {
    let t = Tool::new();
    for p in ["a", "b", "c"] {
        t.ok(&["enqueue", "--queue", "q", p]);
    }
    // The holder claims two jobs and is SIGKILLed: the file is left unclean.
    let holder = Holder::hold(&t.db, &["--queue", "q", "--claim", "2"]);
    drop(holder);
    let before = std::fs::read(&t.db).unwrap();

    let stats = t.json(&["stats"]);
    assert_eq!(stats["closed_cleanly"], false);
    assert_eq!(stats["queues"][0]["counts"]["running"], 2);
    assert_eq!(
        t.json(&["jobs", "--state", "running"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(t.json(&["show", "1"])["job"]["state"], "running");
    assert_eq!(t.json(&["check"])["clean"], true);
    let watched = t.ok(&["watch", "--iterations", "2", "--interval", "10ms"]);
    assert!(watched.contains("running leases:"), "{watched}");
    let note = String::from_utf8(t.run(&["stats"]).stderr).unwrap();
    assert!(
        note.contains("not closed cleanly") && note.contains("take back 2 leases"),
        "{note}"
    );
    assert!(
        std::fs::read(&t.db).unwrap() == before,
        "a read command wrote the file"
    );

    // The first write command takes the two leases back, and says so.
    let reap = t.json(&["reap"]);
    assert_eq!(reap["recovered_at_open"].as_array().unwrap().len(), 2);
    assert_eq!(t.json(&["stats"])["closed_cleanly"], true);
}

#[test]
fn reads_work_while_the_application_writes_and_writes_say_who_holds_the_seat() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "a"]);
    t.ok(&["enqueue", "--queue", "q", "b"]);
    let holder = Holder::hold(&t.db, &["--queue", "q", "--claim", "1"]);
    let pid = holder.0.id();

    // read commands, beside the live writer
    let stats = t.json(&["stats"]);
    assert_eq!(stats["writer_pid"], pid);
    let running = t.json(&["jobs", "--state", "running"]);
    assert_eq!(running.as_array().unwrap().len(), 1);
    assert!(running[0]["lease"]["expires_in_ms"].as_i64().unwrap() > 0);
    t.ok(&["show", "1"]);
    t.ok(&["check"]);
    let watched = t.ok(&["watch", "--iterations", "2", "--interval", "10ms"]);
    assert!(
        watched.contains("running leases:") && watched.contains(&format!("child-{pid}")),
        "{watched}"
    );

    // write commands need the seat
    for args in [
        vec!["enqueue", "--queue", "q", "c"],
        vec!["cancel", "2"],
        vec!["retry", "2"],
        vec!["reap"],
        vec!["purge", "--older-than", "1d"],
        vec!["compact"],
    ] {
        let err = t.fails(&args, 3);
        assert!(
            err.contains("being written by another process")
                && err.contains(&format!("pid {pid}"))
                && err.contains("Sharing::MultiProcess"),
            "{args:?}: {err}"
        );
    }
    drop(holder);
    t.ok(&["enqueue", "--queue", "q", "c"]);
}

#[test]
fn every_error_has_its_exit_code_and_says_what_is_wrong() {
    let t = Tool::without_store();
    // missing store: read and write commands alike refuse, say how to make one on purpose,
    // and nothing is created (a mistyped --db once made a new, empty store)
    let err = t.fails(&["stats"], 1);
    assert!(
        err.contains("no store at") && err.contains("--create"),
        "{err}"
    );
    t.fails(&["cancel", "1"], 1);
    t.fails(&["enqueue", "--queue", "q", "x"], 1);
    t.fails(&["pause", "q"], 1);
    assert!(!t.db.exists());
    // --create in a directory that does not exist: the directory is named, and --create is
    // not suggested to one who gave it
    let nowhere = Tool {
        db: t.db.with_file_name("no-such-dir").join("s.redb"),
        ..Tool::without_store()
    };
    let err = nowhere.fails(&["--create", "enqueue", "--queue", "q", "x"], 1);
    assert!(
        err.contains("no directory") && err.contains("no-such-dir") && !err.contains("--create"),
        "{err}"
    );
    t.ok(&["--create", "enqueue", "--queue", "q", "x"]);
    assert!(t.db.exists());
    // usage errors
    let err = t.fails(&["purge", "--older-than", "7x"], 2);
    assert!(err.contains("7x"), "{err}");
    t.fails(&["enqueue", "--queue", "q", "--delay", "soon", "x"], 2);
    t.fails(&["frobnicate"], 2);
    t.fails(&["enqueue", "--queue", "", "x"], 2);
    // refused operations
    t.ok(&["enqueue", "--queue", "q", "a"]);
    let err = t.fails(&["show", "42"], 1);
    assert!(err.contains("job 42 does not exist"), "{err}");
    t.fails(&["cancel", "42"], 1);
    let err = t.fails(&["retry", "1"], 1);
    assert!(err.contains("cannot retry"), "{err}");
    let holder = Holder::hold(&t.db, &["--queue", "q", "--claim", "1"]);
    drop(holder); // its lease is recovered by the next writer
    t.ok(&["cancel", "1"]);
    t.fails(&["purge", "--older-than", "1s", "--state", "queued"], 1);
    // a store problem: not a store, and a damaged store
    std::fs::write(&t.db, b"not a database at all, just words").unwrap();
    let err = t.fails(&["stats"], 3);
    assert!(err.contains("not a leasehold store"), "{err}");
    t.fails(&["enqueue", "--queue", "q", "x"], 3);
}

#[test]
fn retry_is_refused_for_a_held_job_and_for_one_that_is_not_dead_or_cancelled() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "a"]);
    // While a live process holds the job, it also holds the writer's seat: refused (3).
    let holder = Holder::hold(&t.db, &["--queue", "q", "--claim", "1"]);
    t.fails(&["retry", "1"], 3);
    drop(holder);
    // Once it is gone its lease is taken back, and a queued job is not retried (1).
    let err = t.fails(&["retry", "1"], 1);
    assert!(err.contains("queued: cannot retry"), "{err}");
}

#[test]
fn retry_is_refused_while_a_live_job_holds_the_unique_key() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "--unique-key", "k", "a"]);
    t.ok(&["cancel", "1"]);
    t.ok(&["enqueue", "--queue", "q", "--unique-key", "k", "b"]);
    let err = t.fails(&["retry", "1"], 1);
    assert!(err.contains("job 2 now holds its unique key"), "{err}");
    assert_eq!(t.json(&["check"])["clean"], true);
}

#[test]
fn help_documents_every_subcommand() {
    let t = Tool::new();
    let help = t.ok(&["--help"]);
    for cmd in [
        "stats", "jobs", "show", "enqueue", "retry", "cancel", "purge", "reap", "check", "compact",
        "watch", "demo", "group", "edit", "promote",
    ] {
        assert!(help.contains(cmd), "--help lacks {cmd}");
        t.ok(&[cmd, "--help"]);
    }
    assert!(!help.contains("__child"), "test helpers stay hidden");
}

#[test]
fn bench_runs_at_a_tiny_scale_and_prints_a_well_formed_table() {
    let t = Tool::new();
    let rows = t.json(&["bench", "--scale", "0.01"]);
    let rows = rows.as_array().unwrap();
    assert!(rows.len() >= 10);
    for r in rows {
        assert!(r["operation"].is_string() && r["durability"].is_string());
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        rows.iter()
            .any(|r| r["operation"].as_str().unwrap().starts_with("raw redb"))
    );
    assert!(rows.iter().any(|r| r["ratio_to_raw"].is_number()));
}

/// Worker processes of the tool's own on one PostgreSQL database: each shape drains every
/// job, and the processes' counts add up (the bench checks both, and fails otherwise).
#[test]
fn the_postgres_processes_bench_drains_with_every_shape() {
    if std::env::var("LEASEHOLD_PG_URL").is_err() {
        println!("the postgres-processes bench test did not run: LEASEHOLD_PG_URL is not set");
        return;
    }
    let t = Tool::new();
    let rows = t.json(&["bench", "--only", "postgres-processes", "--scale", "0.01"]);
    let names: Vec<&str> = (rows.as_array().unwrap().iter())
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(
        names.iter().any(|n| n.contains("enqueue -> claim")),
        "{names:?}"
    );
    for shape in [
        "1 worker process x 16",
        "2 worker processes x 8",
        "4 worker processes x 4",
        "8 worker processes x 2",
    ] {
        assert!(
            names.iter().any(|n| n.contains(shape)),
            "{shape}: {names:?}"
        );
    }
}

/// A store created by a process inside a time namespace whose monotonic clock runs 100,000 s
/// ahead, then used on the host: store time must run on, not stand still until the host's
/// clock catches up. Needs `unshare --time` (Linux 5.6+, privileges); says so and passes
/// where the namespace cannot be made.
#[test]
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn a_store_made_inside_a_time_namespace_keeps_time_on_the_host() {
    let t = Tool::new();
    let made = Command::new("unshare")
        .args(["--time", "--monotonic", "100000"])
        .arg(env!("CARGO_BIN_EXE_leasehold"))
        .arg("--db")
        .arg(&t.db)
        .args(["enqueue", "--queue", "q", "--delay", "200ms", "later"])
        .output();
    match made {
        Ok(out) if out.status.success() => {}
        other => {
            println!("time namespaces unavailable here ({other:?}); test not run");
            return;
        }
    }
    let start = t.json(&["stats"])["now_ms"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = t.json(&["stats"])["now_ms"].as_u64().unwrap();
        let job = t.json(&["show", "1"]);
        let due = job["job"]["run_at_ms"].as_u64().unwrap();
        if now >= start + 300 && now >= due {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "store time stands still on the host: {now} ms (started at {start}, job due at {due})"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_store_with_a_zeroed_page_is_reported_as_corrupt_never_a_panic() {
    let t = Tool::new();
    for i in 0..300 {
        t.ok(&[
            "enqueue",
            "--queue",
            "q",
            &format!("payload {i} {}", "x".repeat(300)),
        ]);
    }
    let mut bytes = std::fs::read(&t.db).unwrap();
    let pages = bytes.len() / 4096;
    let mut corrupt_seen = 0;
    // zero one page at a time, at several places; every command answers with an exit code
    for page in (2..pages).step_by((pages / 6).max(1)) {
        let original = bytes.clone();
        bytes[page * 4096..(page + 1) * 4096].fill(0);
        std::fs::write(&t.db, &bytes).unwrap();
        for args in [
            vec!["check"],
            vec!["show", "150"],
            vec!["jobs", "--limit", "1000"],
            vec!["stats"],
        ] {
            let out = t.run(&args);
            let code = out.status.code();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                matches!(code, Some(0 | 1 | 3)),
                "page {page}, {args:?}: exit {code:?}: {stderr}"
            );
            // the storage engine's panic is contained and not printed: one error, no crash
            // report beside it (once: redb's message and a backtrace came first)
            assert!(
                !stderr.contains("panicked") && !stderr.contains("backtrace"),
                "page {page}, {args:?}: {stderr}"
            );
            if code == Some(3) {
                assert!(stderr.contains("corrupt"), "{stderr}");
                assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
                corrupt_seen += 1;
            }
        }
        bytes = original;
    }
    assert!(corrupt_seen > 0, "no zeroed page was ever noticed");
}

#[test]
fn refused_files_get_exit_3_from_every_command_and_are_left_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign.redb");
    hostile_files::foreign_redb(&foreign);
    let fifo = dir.path().join("fifo");
    hostile_files::fifo(&fifo);
    for db in [&foreign, &fifo] {
        let before = std::fs::metadata(db)
            .unwrap()
            .is_file()
            .then(|| std::fs::read(db).unwrap());
        let t = Tool {
            _dir: tempfile::tempdir().unwrap(),
            db: db.clone(),
        };
        for args in [
            vec!["enqueue", "--queue", "q", "x"],
            vec!["reap"],
            vec!["cancel", "1"],
            vec!["compact"],
            vec!["stats"],
            vec!["check"],
        ] {
            let err = t.fails(&args, 3);
            assert!(err.contains("not a leasehold store"), "{args:?}: {err}");
        }
        if let Some(bytes) = before {
            assert!(
                std::fs::read(db).unwrap() == bytes,
                "{} was modified",
                db.display()
            );
        }
    }
}

#[test]
fn the_tool_writes_beside_running_processes_and_shows_who_holds_each_lease() {
    let t = Tool::new();
    let holder = Holder::hold(
        &t.db,
        &["--shared", "--queue", "q", "--enqueue", "2", "--claim", "1"],
    );
    let held = 1; // the holder enqueued jobs 1 and 2 and claimed the first
    // a write command joins the processes instead of being refused, and takes nothing
    for args in [
        vec!["enqueue", "--queue", "q", "x"],
        vec!["cancel", "2"],
        vec!["reap"],
    ] {
        t.ok(&args);
    }
    let jobs = t.json(&["jobs"]);
    let running = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == held)
        .unwrap();
    assert_eq!(running["state"], "running");
    assert_eq!(running["lease"]["holder"]["alive"], true);
    let stats = t.json(&["stats"]);
    assert_eq!(
        (
            &stats["processes"]["alive"],
            &stats["processes"]["leases_alive"]
        ),
        (&serde_json::json!(1), &serde_json::json!(1)),
        "{stats}"
    );
    // through another name of the store (once: every holder looked dead there, and `reap`
    // took their leases)
    let alias = Tool {
        _dir: tempfile::tempdir().unwrap(),
        db: t.db.with_file_name("alias.redb"),
    };
    std::os::unix::fs::symlink(&t.db, &alias.db).unwrap();
    let reap = alias.json(&["reap"]);
    assert_eq!(reap["recovered_at_open"], serde_json::json!([]), "{reap}");
    let jobs = alias.json(&["jobs"]);
    assert_eq!(jobs[0]["lease"]["holder"]["state"], "alive", "{jobs}");
    // compact needs the store to itself, and says why it does not have it
    let err = t.fails(&["compact"], 1);
    assert!(err.contains("other processes share it"), "{err}");
    drop(holder); // SIGKILL
    // `watch` shows the dead holder as such (once: "time left 8.5 s" as if it worked on)
    let watched = t.ok(&["watch", "--iterations", "1"]);
    assert!(
        watched.contains("(gone)") && watched.contains("holder gone"),
        "{watched}"
    );
    let jobs = t.json(&["jobs"]);
    let shown = &jobs.as_array().unwrap()[0];
    assert_eq!(shown["lease"]["holder"]["alive"], false, "{shown}");
    let stats = t.json(&["stats"]);
    assert_eq!(stats["processes"]["dead"], 1, "{stats}");
    assert_eq!(stats["processes"]["leases_dead"], 1, "{stats}");
    // the next write command takes the dead holder's lease back, and says so without
    // contradicting itself (once: "no expired leases" right after the list)
    let reap = t.ok(&["reap"]);
    assert!(
        reap.contains(&format!("job {held} attempt #1"))
            && reap.contains("its process had died")
            && !reap.contains("no expired leases"),
        "{reap}"
    );
    // counted as a death, not as "at open" (once: every process death was "at open")
    let stats = t.json(&["stats"]);
    assert_eq!(stats["counters"]["reclaimed_process_died"], 1, "{stats}");
    assert_eq!(stats["counters"]["reclaimed_at_open"], 0, "{stats}");
    assert!(t.ok(&["stats"]).contains("process died 1, at open 0"));
}

#[test]
fn the_first_write_to_a_store_an_older_build_made_upgrades_it_and_says_so() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "before"]);
    {
        const META: redb::TableDefinition<&str, &[u8]> =
            redb::TableDefinition::new("leasehold.meta");
        let db = redb::Database::open(&t.db).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("schema_version", 2u32.to_le_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    // a read leaves it as the older build made it
    let read = t.run(&["stats"]);
    assert!(read.status.success());
    assert!(!String::from_utf8_lossy(&read.stderr).contains("upgraded"));
    let write = t.run(&["enqueue", "--queue", "q", "after"]);
    assert!(write.status.success());
    let note = String::from_utf8_lossy(&write.stderr);
    assert!(
        note.contains(&format!(
            "upgraded the store from schema version 2 to {}",
            leasehold::SCHEMA_VERSION
        )),
        "{note}"
    );
    let again = t.run(&["enqueue", "--queue", "q", "once"]);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("upgraded"));
}

#[test]
fn bulk_retry_and_cancel_say_how_many_ask_first_and_act_on_exactly_the_selection() {
    let t = Tool::new();
    {
        let store = leasehold::Store::open(&t.db).unwrap();
        let dead = |queue: &str, tenant: Option<&str>| {
            let mut job = leasehold::NewJob::new(queue, "x").max_attempts(1);
            if let Some(tenant) = tenant {
                job = job.metadata("tenant", tenant);
            }
            let id = store.enqueue(job).unwrap();
            let lease = store
                .claim_job(id, "w", Duration::from_secs(60))
                .unwrap()
                .unwrap();
            store.fail(&lease, "boom").unwrap();
        };
        dead("up", Some("acme"));
        dead("up", Some("acme"));
        dead("up", Some("globex"));
        dead("other", None);
        store
            .enqueue(leasehold::NewJob::new("up", "waiting"))
            .unwrap();
        store
            .enqueue(leasehold::NewJob::new("up", "waiting"))
            .unwrap();
    }
    let count = |state: &str| -> usize {
        let out = t.ok(&["--json", "jobs", "--state", state]);
        serde_json::from_str::<Vec<serde_json::Value>>(&out)
            .unwrap()
            .len()
    };
    // Not a terminal and no --yes: says how many, does nothing.
    let asked = t.run(&["retry", "--queue", "up"]);
    let said = String::from_utf8_lossy(&asked.stderr);
    assert_eq!(asked.status.code(), Some(1), "{said}");
    assert!(
        said.contains("retry 3 jobs (queue up, state dead)?"),
        "{said}"
    );
    assert!(said.contains("--yes"), "{said}");
    assert_eq!(count("dead"), 4);
    // A selection by metadata takes exactly its jobs.
    let done = t.ok(&["retry", "--queue", "up", "--meta", "tenant=acme", "--yes"]);
    assert!(done.contains("2 of 2 jobs queued again"), "{done}");
    assert_eq!((count("dead"), count("queued")), (2, 4));
    // Without a state, a retry takes the dead ones: here of every queue.
    let rest: serde_json::Value =
        serde_json::from_str(&t.ok(&["--json", "retry", "--yes"])).unwrap();
    assert_eq!(
        (rest["matched"].as_u64(), rest["changed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(count("dead"), 0);
    // Nothing has been unchanged for an hour.
    assert!(
        t.ok(&["cancel", "--older-than", "1h", "--yes"])
            .contains("no jobs match")
    );
    // A cancel of a queue's waiting jobs.
    let cancelled = t.ok(&["cancel", "--queue", "other", "--state", "queued", "--yes"]);
    assert!(cancelled.contains("1 of 1 jobs cancelled"), "{cancelled}");
    assert_eq!((count("cancelled"), count("queued")), (1, 5));
    // A finished job in a selection is refused, listed, and left as it was.
    let refused = t.ok(&["cancel", "--queue", "other", "--yes"]);
    assert!(refused.contains("0 of 1 jobs"), "{refused}");
    // Usage: a job id and a selection at once, or a cancel naming nothing.
    assert_eq!(
        t.run(&["retry", "1", "--queue", "up"]).status.code(),
        Some(2)
    );
    assert_eq!(t.run(&["cancel"]).status.code(), Some(2));
    assert_eq!(count("cancelled"), 1);
}

#[test]
fn stats_warns_of_a_queue_whose_work_waits_with_nobody_asking_for_it() {
    let t = Tool::new();
    {
        // Store time moved on by a manual clock: the tool's clock resumes past it.
        let clock = leasehold::ManualClock::new();
        let store = leasehold::Store::builder(&t.db)
            .clock(clock.clone())
            .open()
            .unwrap();
        store
            .enqueue(leasehold::NewJob::new("uplaods", "a"))
            .unwrap();
        store
            .enqueue(leasehold::NewJob::new("uploads", "b"))
            .unwrap();
        clock.advance(Duration::from_secs(600));
        let l = store
            .claim("uploads", "w", Duration::from_secs(60))
            .unwrap()
            .unwrap();
        store.complete(&l, b"").unwrap();
    }
    let out = t.ok(&["stats"]);
    assert!(
        out.contains("warning: queue uplaods has had work waiting for")
            && out.contains("no worker has ever asked for it"),
        "{out}"
    );
    assert!(!out.contains("queue uploads has"), "{out}");
    let json = t.json(&["stats"]);
    let queues = json["queues"].as_array().unwrap();
    let unserved =
        |name: &str| queues.iter().find(|q| q["queue"] == name).unwrap()["unserved"].as_bool();
    assert_eq!(
        (unserved("uplaods"), unserved("uploads")),
        (Some(true), Some(false))
    );
}

#[test]
fn pause_resume_and_limits_are_set_from_the_tool_and_shown_by_stats() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "uploads", "a"]);
    // a queue no job has used is refused (a typo would make a new one), unless on purpose
    let typo = t.fails(&["pause", "uplods"], 1);
    assert!(
        typo.contains("uplods") && typo.contains("--create"),
        "{typo}"
    );
    t.fails(&["limit", "uplods", "--concurrency", "2"], 1);
    assert_eq!(t.json(&["stats"])["queues"].as_array().unwrap().len(), 1);
    t.ok(&["--create", "pause", "later"]);
    t.ok(&["resume", "later"]);
    let uploads = || {
        let stats = t.json(&["stats"]);
        let queues = stats["queues"].as_array().unwrap();
        queues
            .iter()
            .find(|q| q["queue"] == "uploads")
            .unwrap()
            .clone()
    };
    let paused = t.ok(&["pause", "uploads"]);
    assert!(paused.contains("queue uploads is paused"), "{paused}");
    assert!(t.ok(&["stats"]).contains("queue uploads is paused"));
    assert_eq!(uploads()["paused"], true);
    t.ok(&["resume", "uploads"]);
    assert!(!t.ok(&["stats"]).contains("is paused"));
    let limited = t.ok(&["limit", "uploads", "--concurrency", "2", "--rate", "10/1m"]);
    assert!(
        limited.contains("at most 2 at once, at most 10 claims per 1m"),
        "{limited}"
    );
    // a second limit keeps the first
    t.ok(&["limit", "uploads", "--concurrency", "3"]);
    let q = &uploads();
    assert_eq!(
        (
            q["concurrency_limit"].as_u64(),
            q["rate_limit_claims"].as_u64(),
            q["rate_limit_per_ms"].as_u64()
        ),
        (Some(3), Some(10), Some(60_000))
    );
    // one limit lifted, the other kept
    t.ok(&["limit", "uploads", "--no-concurrency"]);
    let q = &uploads();
    assert_eq!(
        (
            q["concurrency_limit"].as_u64(),
            q["rate_limit_claims"].as_u64()
        ),
        (None, Some(10))
    );
    t.ok(&["limit", "uploads", "--concurrency", "2", "--no-rate"]);
    let q = &uploads();
    assert_eq!(
        (
            q["concurrency_limit"].as_u64(),
            q["rate_limit_claims"].as_u64()
        ),
        (Some(2), None)
    );
    // a limit per key, and a job counted under its key
    let keyed = t.ok(&["limit", "uploads", "--per-key", "1"]);
    assert!(
        keyed.contains("at most 1 of one limit key at once"),
        "{keyed}"
    );
    assert_eq!(uploads()["per_key_limit"].as_u64(), Some(1));
    let id = t.ok(&[
        "enqueue",
        "--queue",
        "uploads",
        "--limit-key",
        "tenant-7",
        "x",
    ]);
    let id = id
        .split_whitespace()
        .find_map(|w| w.parse::<u64>().ok())
        .unwrap();
    assert!(
        t.ok(&["show", &id.to_string()])
            .contains("limit key tenant-7")
    );
    t.ok(&[
        "enqueue",
        "--queue",
        "uploads",
        "--limit-key",
        "tenant-7",
        "y",
    ]);
    assert_eq!(
        (
            uploads()["keys_at_limit"].as_u64(),
            uploads()["parked"].as_u64()
        ),
        (Some(0), Some(1)),
        "the second job of tenant-7 waits behind the first"
    );
    assert!(
        t.ok(&["stats"])
            .contains("0 limit keys at the limit, 1 job parked behind their keys")
    );
    let rated = t.ok(&["limit", "uploads", "--per-key-rate", "5/1m"]);
    assert!(
        rated.contains("at most 5 claims of one limit key per 1m"),
        "{rated}"
    );
    assert_eq!(uploads()["per_key_rate_claims"].as_u64(), Some(5));
    t.ok(&["limit", "uploads", "--no-per-key", "--no-per-key-rate"]);
    assert!(uploads()["per_key_limit"].is_null());
    assert!(uploads()["per_key_rate_claims"].is_null());
    assert!(t.ok(&["limit", "uploads", "--none"]).contains("no limits"));
    // refusals: exit 2, nothing changed
    let zero = t.run(&["limit", "uploads", "--concurrency", "0"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("pause the queue"));
    assert_eq!(
        t.run(&["limit", "uploads", "--rate", "ten"]).status.code(),
        Some(2)
    );
    assert_eq!(t.run(&["pause", ""]).status.code(), Some(2));
    assert!(uploads()["concurrency_limit"].is_null());
}

#[test]
fn backoff_is_set_per_queue_and_per_job_from_the_tool_and_shown() {
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "uploads", "a"]);
    t.fails(&["backoff", "uplods", "30s"], 1);
    let shown = t.ok(&["backoff", "uploads"]);
    assert!(shown.contains("the store's retry policy"), "{shown}");
    let set = t.ok(&["backoff", "uploads", "1s..1h", "--jitter", "0.2"]);
    assert!(set.contains("exponential 1s..3600s, jitter 20%"), "{set}");
    let stats = t.json(&["stats"]);
    assert_eq!(
        stats["queues"][0]["retry_policy"],
        "exponential 1s..3600s, jitter 20%"
    );
    assert!(
        t.ok(&["stats"])
            .contains("a failed job waits by exponential")
    );
    let listed = t.json(&["backoff", "uploads", "1s,10s,1m"]);
    assert_eq!(listed["retry_policy"], "delays 1s, 10s, 60s");
    assert!(t.json(&["backoff", "uploads", "--none"])["retry_policy"].is_null());
    // a job's own
    t.ok(&["enqueue", "--queue", "uploads", "--backoff", "30s", "b"]);
    assert_eq!(t.json(&["show", "2"])["job"]["retry_policy"], "fixed 30s");
    assert!(
        t.ok(&["show", "2"])
            .contains("retry policy fixed 30s (its own)")
    );
    assert!(t.json(&["show", "1"])["job"]["retry_policy"].is_null());
    // refusals: exit 2, nothing changed
    for bad in [
        &["backoff", "uploads", "1h..1s"][..],
        &["backoff", "uploads", "30s", "--jitter", "2"],
        &["backoff", "uploads", "soon"],
    ] {
        assert_eq!(t.run(bad).status.code(), Some(2), "{bad:?}");
    }
    assert!(t.json(&["backoff", "uploads"])["retry_policy"].is_null());
}

#[test]
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn a_schedule_that_cannot_fire_is_named_with_its_failure_by_schedules_and_stats() {
    let t = Tool::new();
    {
        // declared by a process whose payloads may be large, fired by one whose may not
        let store = leasehold::Store::builder(&t.db)
            .max_payload(4096)
            .open()
            .unwrap();
        let big = leasehold::NewJob::new("reports", vec![7u8; 2048]);
        store
            .declare_schedule(leasehold::Schedule::every(
                "big",
                Duration::from_secs(1),
                big,
            ))
            .unwrap();
    }
    {
        let store = leasehold::Store::builder(&t.db)
            .max_payload(1024)
            .open()
            .unwrap();
        // fired until its tick has come on the store's own clock and been refused
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.schedules().unwrap()[0].failure().is_none() {
            assert!(std::time::Instant::now() < deadline, "the tick never came");
            assert!(store.fire_schedules().unwrap().is_empty());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let listed = t.ok(&["schedules"]);
    assert!(listed.contains("schedule \"big\" cannot fire"), "{listed}");
    assert!(listed.contains("payload"), "{listed}");
    let json = t.json(&["schedules"]);
    assert!(
        json[0]["failure"].as_str().unwrap().contains("payload"),
        "{json}"
    );
    assert!(t.ok(&["stats"]).contains("schedule \"big\" cannot fire"));
    let failing = &t.json(&["stats"])["failing_schedules"];
    assert!(
        failing["big"].as_str().unwrap().contains("payload"),
        "{failing}"
    );
}

#[test]
fn schedules_are_listed_paused_resumed_and_removed_from_the_tool() {
    let t = Tool::new();
    {
        let store = leasehold::Store::open(&t.db).unwrap();
        let job = leasehold::NewJob::new("reports", "daily");
        store
            .declare_schedule(leasehold::Schedule::every(
                "heartbeat",
                Duration::from_secs(300),
                job.clone(),
            ))
            .unwrap();
        let job = job.limit_key("acme").expires_in(Duration::from_secs(3600));
        store
            .declare_schedule(
                leasehold::Schedule::cron("nightly", "0 3 * * *", "Europe/Berlin", job)
                    .catch_up(leasehold::CatchUp::Skip),
            )
            .unwrap();
    }
    let listed = t.ok(&["schedules"]);
    assert!(
        listed.contains("schedule \"nightly\"'s jobs: limit key acme, expires 1h after its tick"),
        "{listed}"
    );
    assert!(!listed.contains("\"heartbeat\"'s jobs"), "{listed}");
    assert!(
        listed.contains("heartbeat") && listed.contains("every 5m"),
        "{listed}"
    );
    assert!(
        listed.contains("cron \"0 3 * * *\" in Europe/Berlin") && listed.contains("skip"),
        "{listed}"
    );
    let json = t.json(&["schedules"]);
    let nightly = json
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "nightly")
        .unwrap();
    assert_eq!(nightly["limit_key"], "acme");
    assert_eq!(nightly["expires_in_ms"], 3_600_000);
    let next = nightly["next_in_ms"].as_i64().unwrap();
    assert!(next > 0 && next <= 25 * 3600 * 1000, "{nightly}");
    assert!(
        t.ok(&["schedules", "pause", "nightly"])
            .contains("is paused")
    );
    assert!(t.ok(&["schedules"]).contains("paused"));
    t.ok(&["schedules", "resume", "nightly"]);
    assert_eq!(t.json(&["schedules"])[1]["paused"], false);
    assert!(
        t.ok(&["schedules", "remove", "heartbeat"])
            .contains("removed")
    );
    let gone = t.run(&["schedules", "remove", "heartbeat"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no schedule named"));
    assert_eq!(t.json(&["schedules"]).as_array().unwrap().len(), 1);
}

#[test]
fn enqueue_says_when_a_unique_key_returned_the_job_that_holds_it() {
    let t = Tool::new();
    let first = t.ok(&[
        "enqueue",
        "--queue",
        "q",
        "--unique-key",
        "k",
        "--unique-for",
        "1h",
        "a",
    ]);
    assert!(first.contains("enqueued job 1"), "{first}");
    let again = t.ok(&["enqueue", "--queue", "q", "--unique-key", "k", "b"]);
    assert!(
        again.contains("job 1 already holds unique key k"),
        "{again}"
    );
    let json: serde_json::Value = serde_json::from_str(&t.ok(&[
        "--json",
        "enqueue",
        "--queue",
        "q",
        "--unique-key",
        "k",
        "c",
    ]))
    .unwrap();
    assert_eq!(
        (json["id"].as_u64(), json["existing"].as_bool()),
        (Some(1), Some(true))
    );
    // metadata and a time limit are shown
    t.ok(&[
        "enqueue",
        "--queue",
        "q",
        "--meta",
        "tenant=acme",
        "--time-limit",
        "10m",
        "d",
    ]);
    let shown = t.ok(&["show", "2"]);
    assert!(
        shown.contains("metadata tenant=acme") && shown.contains("time limit 10m"),
        "{shown}"
    );
    let listed = t.ok(&["jobs", "--meta", "tenant=acme"]);
    assert!(
        listed.contains("tenant=acme") && !listed.contains(" 1  q"),
        "{listed}"
    );
}

#[test]
fn every_command_works_on_a_postgres_database_named_by_url() {
    let Ok(url) = std::env::var("LEASEHOLD_PG_URL") else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "the tool's PostgreSQL test did not run: LEASEHOLD_PG_URL is not set"
        );
        return;
    };
    let schema = format!("lh_tool_{}", std::process::id());
    let db = format!("{url}?schema={schema}");
    let mut admin =
        leasehold::postgres::client::Client::connect(&url, leasehold::postgres::client::NoTls)
            .unwrap();
    let drop_schema = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    admin.batch_execute(&drop_schema).unwrap();
    let tool = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("--db")
            .arg(&db)
            .args(args)
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| {
        let out = tool(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json = |args: &[&str]| -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&ok(&all)).unwrap()
    };
    let enqueued = json(&["--create", "enqueue", "--queue", "q", "hello"]);
    assert_eq!(enqueued["id"], 1, "{enqueued}");
    json(&["enqueue", "--queue", "q", "--priority", "-1", "world"]);
    let jobs = json(&["jobs", "--sort", "priority"]);
    assert_eq!(jobs[0]["id"], 2);
    assert_eq!(jobs[1]["state"], "queued");
    let stats = json(&["stats"]);
    assert_eq!(stats["queues"][0]["counts"]["queued"], 2, "{stats}");
    let shown = json(&["show", "1"]);
    assert_eq!(shown["payload"]["utf8"], "hello");
    assert!(ok(&["cancel", "1"]).contains("cancelled"));
    ok(&["retry", "1"]);
    assert_eq!(json(&["reap"])["reclaimed"].as_array().unwrap().len(), 0);
    ok(&["purge", "--older-than", "1h"]);
    assert_eq!(json(&["check"])["clean"], true);
    // `watch` shows the database's clock as a date (once: "store time t+1796171245s")
    let watched = ok(&["watch", "--iterations", "1"]);
    assert!(
        watched.contains("store time 20") && watched.contains('Z') && !watched.contains("t+"),
        "{watched}"
    );
    // what has no meaning on a database, and a URL that does not parse
    assert_eq!(tool(&["compact"]).status.code(), Some(2));
    let bad = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--db", "postgres://::no", "stats"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    // a system schema is a usage error; a table altered by hand a store problem, never 101
    let system = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--db", &format!("{url}?schema=information_schema"), "stats"])
        .output()
        .unwrap();
    assert_eq!(system.status.code(), Some(2));
    // a read of a schema that holds no store makes none (once: a typo made an empty store and
    // `stats` said "no jobs"); nor does a write, enqueue included, without --create: each is
    // refused (exit 1) and says how to make one on purpose
    let typo = format!("{schema}_typo");
    for args in [
        vec!["stats"],
        vec!["jobs"],
        vec!["check"],
        vec!["cancel", "1"],
        vec!["enqueue", "--queue", "q", "x"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["--db", &format!("{url}?schema={typo}")])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&typo) && stderr.contains("--create"),
            "{stderr}"
        );
    }
    let made: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[&typo],
        )
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(made, 0, "no schema was made");
    // a schema an older build made: a read is refused, saying how to upgrade, and leaves it;
    // the first write upgrades it, saying so
    admin
        .batch_execute(&format!(
            "UPDATE {schema}.leasehold_meta SET value = '1' WHERE key = 'schema_version'"
        ))
        .unwrap();
    let read = tool(&["stats"]);
    let said = String::from_utf8_lossy(&read.stderr);
    assert_eq!(read.status.code(), Some(3), "{said}");
    assert!(said.contains("open it once for writing"), "{said}");
    let upgraded = tool(&["enqueue", "--queue", "q", "after the upgrade"]);
    let note = String::from_utf8_lossy(&upgraded.stderr);
    assert!(
        note.contains("upgraded the store from schema version 1 to")
            && note.contains("older than this one refuse it"),
        "{note}"
    );
    let again = tool(&["enqueue", "--queue", "q", "once"]);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("upgraded"));
    for (column, ty) in [("attempt", "integer"), ("priority", "bigint")] {
        admin
            .batch_execute(&format!(
                "ALTER TABLE {schema}.leasehold_jobs ALTER COLUMN {column} TYPE {ty}"
            ))
            .unwrap();
        for args in [vec!["jobs"], vec!["stats"], vec!["show", "1"]] {
            let out = tool(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{column} {args:?}: {stderr}");
            assert!(
                stderr.contains(column) && !stderr.contains("panicked"),
                "{stderr}"
            );
        }
        admin
            .batch_execute(&format!(
                "ALTER TABLE {schema}.leasehold_jobs ALTER COLUMN {column} TYPE {}",
                if column == "attempt" {
                    "bigint"
                } else {
                    "integer"
                }
            ))
            .unwrap();
    }
    assert_eq!(json(&["check"])["clean"], true);
    admin.batch_execute(&drop_schema).unwrap();
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_tool_quietly() {
    // `leasehold stats | head -6`: the tool's output closes before it is all written.
    use std::os::unix::process::ExitStatusExt;
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "x"]);
    for _ in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("--db")
            .arg(&t.db)
            .arg("stats")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // closed before the tool has opened the store
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(13), // SIGPIPE
            "{:?}: {stderr}",
            out.status
        );
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn a_worker_process_stops_a_job_at_its_time_limit_not_at_its_next_heartbeat() {
    // A job limited to 300 ms whose handler would work two minutes, run by a pool in a
    // process of its own on a 60 s lease (a heartbeat every 20 s): the attempt ends timed
    // out at its deadline, long before the pool's next heartbeat.
    let t = Tool::new();
    t.ok(&["enqueue", "--queue", "q", "--time-limit", "300ms", "slow"]);
    let mut pool = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("--db")
        .arg(&t.db)
        .args([
            "__pool",
            "--queue",
            "q",
            "--workers",
            "1",
            "--work-ms",
            "120000",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let outcome = loop {
        let shown = t.json(&["show", "1"]);
        if shown["job"]["state"] != "running" && shown["job"]["state"] != "queued" {
            break shown["history"][0]["outcome"].as_str().unwrap().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {} after 15 s: the limit waited for a heartbeat",
            shown["job"]["state"]
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = pool.kill();
    let _ = pool.wait();
    assert!(outcome.contains("timed out"), "{outcome}");
}

#[test]
fn show_says_what_checkpoint_a_job_was_left_with_and_what_it_logged() {
    let t = Tool::new();
    let id = {
        let store = leasehold::Store::open(&t.db).unwrap();
        let id = store.enqueue(leasehold::NewJob::new("q", "p")).unwrap();
        let lease = store
            .claim("q", "w", std::time::Duration::from_secs(60))
            .unwrap()
            .unwrap();
        store.save_checkpoint(&lease, b"row 7").unwrap();
        store
            .log(&lease, &["opened rows.csv", "row 7 done"])
            .unwrap();
        store.release(&lease).unwrap();
        id
    };
    let shown = t.ok(&["show", &id.to_string()]);
    assert!(
        shown.contains("checkpoint of attempt 1, saved ") && shown.contains("(5 bytes): row 7"),
        "{shown}"
    );
    let json = t.json(&["show", &id.to_string()]);
    assert_eq!(json["checkpoint"]["attempt"], 1);
    assert_eq!(json["checkpoint"]["data"]["utf8"], "row 7");
    assert!(shown.contains("log of attempt 1:"), "{shown}");
    assert!(shown.contains("  row 7 done"), "{shown}");
    assert_eq!(json["logs"][0]["attempt"], 1);
    assert_eq!(json["logs"][0]["lines"][1]["text"], "row 7 done");
    assert_eq!(json["logs"][0]["dropped"], 0);
    let fresh = t.json(&[
        "show",
        &{
            let store = leasehold::Store::open(&t.db).unwrap();
            store.enqueue(leasehold::NewJob::new("q", "none")).unwrap()
        }
        .to_string(),
    ]);
    assert!(fresh["checkpoint"].is_null(), "{fresh}");
}

#[test]
fn wait_says_how_a_job_or_group_ended_and_exits_by_it_and_enqueue_sets_an_expiry() {
    let t = Tool::new();
    let (done, running, cancelled, group) = {
        let store = leasehold::Store::open(&t.db).unwrap();
        let (group, members) = store
            .enqueue_group(
                leasehold::NewGroup::new(),
                vec![leasehold::NewJob::new("q", "m")],
            )
            .unwrap();
        let running = store.enqueue(leasehold::NewJob::new("q", "r")).unwrap();
        let cancelled = store.enqueue(leasehold::NewJob::new("q", "c")).unwrap();
        let lease = store
            .claim("q", "w", std::time::Duration::from_secs(600))
            .unwrap()
            .unwrap();
        assert_eq!(lease.job, members[0]);
        store.complete(&lease, b"").unwrap();
        store
            .claim("q", "w", std::time::Duration::from_secs(600))
            .unwrap()
            .unwrap();
        store.cancel(cancelled).unwrap();
        (members[0], running, cancelled, group)
    };
    let said = t.ok(&["wait", &done.to_string()]);
    assert!(
        said.contains(&format!("job {done} ended succeeded")),
        "{said}"
    );
    let said = t.ok(&["wait", "--group", &group.0.to_string()]);
    assert!(
        said.contains(&format!("group {} ended succeeded", group.0)),
        "{said}"
    );
    t.fails(&["wait", &cancelled.to_string()], 4);
    t.fails(&["wait", &running.to_string(), "--timeout", "50ms"], 5);
    t.fails(&["wait", "999"], 1);
    let out = t.run(&["--json", "wait", &running.to_string(), "--timeout", "10ms"]);
    assert_eq!(out.status.code(), Some(5));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ended"], Value::Null, "{v}");
    let v = t.json(&["wait", &done.to_string()]);
    assert_eq!(v["ended"], "succeeded", "{v}");
    // An expiry set by the tool, shown by `show`.
    let made = t.json(&["enqueue", "--queue", "q", "late", "--expires-in", "15m"]);
    let id = made["id"].as_u64().unwrap().to_string();
    let shown = t.ok(&["show", &id]);
    assert!(shown.contains("expires in"), "{shown}");
    let v = t.json(&["show", &id]);
    assert!(v["job"]["expires_at_ms"].as_u64().is_some(), "{v}");
}

#[test]
fn group_names_the_group_it_is_in_and_the_groups_in_it() {
    let t = Tool::new();
    let (outer, inner) = {
        let store = leasehold::Store::open(&t.db).unwrap();
        let outer = store.open_group(leasehold::NewGroup::new()).unwrap();
        let inner = (store.open_group(leasehold::NewGroup::new().in_group(outer))).unwrap();
        (outer.0, inner.0)
    };
    let said = t.ok(&["group", &outer.to_string()]);
    assert!(said.contains(&format!("groups in it: {inner}")), "{said}");
    assert!(said.contains("1 members"), "the inner group is one: {said}");
    let said = t.ok(&["group", &inner.to_string()]);
    assert!(said.contains(&format!("member of group {outer}")), "{said}");
    let v = t.json(&["group", &outer.to_string()]);
    assert_eq!(v["subgroups"], serde_json::json!([inner]), "{v}");
    let v = t.json(&["group", &inner.to_string()]);
    assert_eq!(v["parent"], outer, "{v}");
    let said = t.ok(&["stats"]);
    assert!(
        said.contains("2 groups open, 0 jobs waiting for them"),
        "{said}"
    );
    assert_eq!(t.json(&["stats"])["open_groups"], 2);
}

/// `endings --follow` in another process prints each end the application commits while it
/// follows, one line each with its cursor, from where it was told to start, and stops
/// after `--count` of them.
#[test]
fn endings_follow_prints_each_end_as_the_application_commits_it() {
    let t = Tool::new();
    let store = leasehold::Store::open(&t.db).unwrap();
    let before = store.enqueue(leasehold::NewJob::new("q", "old")).unwrap();
    store.cancel(before).unwrap();
    let start = store.endings(leasehold::EndCursor::START, 10).unwrap().next;
    let follower = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("--db")
        .arg(&t.db)
        .args(["endings", "--follow", "--count", "2", "--json"])
        .args(["--after", &start.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // (a head start, so that it is most likely following when the ends commit)
    std::thread::sleep(std::time::Duration::from_millis(300));
    let done = store.enqueue(leasehold::NewJob::new("q", "a")).unwrap();
    let lease = store
        .claim_job(done, "w", std::time::Duration::from_secs(60))
        .unwrap()
        .unwrap();
    store.complete(&lease, b"").unwrap();
    let cancelled = store.enqueue(leasehold::NewJob::new("q", "b")).unwrap();
    store.cancel(cancelled).unwrap();
    let out = follower.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let said: Vec<_> = (lines.iter())
        .map(|v| (v["id"].as_u64().unwrap(), v["state"].as_str().unwrap()))
        .collect();
    assert_eq!(said, [(done.0, "succeeded"), (cancelled.0, "cancelled")]);
    let last: leasehold::EndCursor = lines[1]["cursor"].as_str().unwrap().parse().unwrap();
    assert!(store.endings(last, 10).unwrap().list.is_empty());
    t.fails(&["endings", "--count", "1"], 2);
}

/// `wait` in another process hears an end the application commits while it waits: it
/// reads the file the application writes, and comes back well before its timeout.
#[test]
fn wait_in_another_process_hears_the_end_the_application_commits() {
    let t = Tool::new();
    let store = leasehold::Store::open(&t.db).unwrap();
    let id = store.enqueue(leasehold::NewJob::new("q", "p")).unwrap();
    let lease = store
        .claim("q", "w", std::time::Duration::from_secs(600))
        .unwrap()
        .unwrap();
    let waiter = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("--db")
        .arg(&t.db)
        .args(["wait", &id.to_string(), "--timeout", "120s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A head start, so that the waiter is most likely reading when the end commits; the
    // test holds whichever comes first, and asserts no time.
    std::thread::sleep(std::time::Duration::from_millis(300));
    store.complete(&lease, b"done").unwrap();
    let out = waiter.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("job {id} ended succeeded")),
        "{said}"
    );
}

/// `endings` lists each end after a cursor, in the order they committed, and says where to
/// read on from; a script keeps that cursor and reads only what came after it.
#[test]
fn endings_lists_each_end_after_a_cursor_and_where_to_read_on() {
    let t = Tool::new();
    let (done, cancelled) = {
        let store = leasehold::Store::open(&t.db).unwrap();
        let done = store.enqueue(leasehold::NewJob::new("q", "a")).unwrap();
        let cancelled = store.enqueue(leasehold::NewJob::new("q", "b")).unwrap();
        let lease = store
            .claim_job(done, "w", std::time::Duration::from_secs(60))
            .unwrap()
            .unwrap();
        store.complete(&lease, b"").unwrap();
        store.cancel(cancelled).unwrap();
        (done.0, cancelled.0)
    };
    let listed = t.ok(&["endings"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines[0].ends_with(&format!("job {done} of q ended succeeded")),
        "{listed}"
    );
    assert!(
        lines[1].ends_with(&format!("job {cancelled} of q ended cancelled")),
        "{listed}"
    );
    let v = t.json(&["endings", "--limit", "1"]);
    assert_eq!(v["endings"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["gap"], false);
    let next = v["next"].as_str().unwrap().to_owned();
    let rest = t.json(&["endings", "--after", &next]);
    let rest = rest["endings"].as_array().unwrap();
    assert_eq!((rest.len(), rest[0]["id"].as_u64()), (1, Some(cancelled)));
    assert_eq!(rest[0]["state"], "cancelled");
    t.fails(&["endings", "--after", "nonsense"], 2);
}
