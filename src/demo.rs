//! `leasehold demo`: the lease story, told on a real store file with a manual clock so that
//! every step happens at a known store time. Exits non-zero if an invariant fails.

use std::process::ExitCode;
use std::time::Duration;

use leasehold::{
    DEFAULT_LEASE, DEFAULT_REAPER_INTERVAL, Error, JobState, ManualClock, NewJob, Store,
};

const QUEUE: &str = "thumbnails";

pub fn run() -> Result<ExitCode, Error> {
    let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Storage(redb::Error::Io(e)))?;
    let path = dir.join("demo.redb");
    let result = story(&path);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn story(path: &std::path::Path) -> Result<ExitCode, Error> {
    let clock = ManualClock::new();
    let store = Store::builder(path).clock(clock.clone()).open()?;
    let lease = DEFAULT_LEASE;
    let reaper_every = DEFAULT_REAPER_INTERVAL;
    let say = |msg: &str| println!("{:>10}  {msg}", store.now().to_string());
    let mut failures: Vec<String> = Vec::new();

    println!("leasehold demo: the lease story on a real store file, on a manual clock");
    println!("store: {}", path.display());
    println!(
        "lease {lease:?}, heartbeat every {:?}, reaper every {reaper_every:?}\n",
        lease / 3
    );

    let ids = store.enqueue_batch((1..=3).map(|i| NewJob::new(QUEUE, format!("photo-{i}.jpg"))))?;
    say(&format!("enqueued {} jobs on {QUEUE:?}", ids.len()));

    let Some(a) = store.claim(QUEUE, "worker-a", lease)? else {
        failures.push("worker-a found nothing to claim".into());
        return finish(&store, failures);
    };
    say(&format!(
        "worker-a claimed job {} (attempt {}); lease expires at {}",
        a.job, a.attempt, a.expires_at
    ));
    clock.advance(lease / 3);
    if let leasehold::Renewal::Renewed { expires_at } = store.heartbeat(&a, 1)? {
        say(&format!(
            "worker-a heartbeat (progress 1): lease now expires at {expires_at}"
        ));
    }
    say("worker-a is killed: no more heartbeats, no release");

    // The reaper ticks every 15 s on the store clock; time moves tick by tick.
    let mut reclaimed = None;
    while reclaimed.is_none() {
        let next_tick = Duration::from_nanos(
            (clock.elapsed().as_nanos() as u64 / reaper_every.as_nanos() as u64 + 1)
                * reaper_every.as_nanos() as u64,
        );
        clock.set(next_tick);
        let report = store.reap()?;
        match report.reclaimed.first() {
            None => say("reaper pass: no expired lease"),
            Some(r) => {
                say(&format!(
                    "reaper pass: took back job {} attempt {} from {}: expired at {}, {:?} overdue",
                    r.job, r.attempt, r.worker, r.expired_at, r.overdue
                ));
                let bound = lease + reaper_every;
                say(&format!(
                    "detection delay {:?} since the last heartbeat; bound lease + reaper = {bound:?}",
                    r.detection_delay
                ));
                if r.detection_delay > bound {
                    failures.push(format!(
                        "detection delay {:?} over bound",
                        r.detection_delay
                    ));
                }
                reclaimed = Some(r.clone());
            }
        }
    }

    let Some(b) = store.claim(QUEUE, "worker-b", lease)? else {
        failures.push("the reclaimed job was not claimable".into());
        return finish(&store, failures);
    };
    say(&format!(
        "worker-b claimed job {} (attempt {})",
        b.job, b.attempt
    ));
    if b.job != a.job {
        failures.push("worker-b did not get the reclaimed job first".into());
    }

    match store.complete(&a, b"thumbnail by worker-a") {
        Err(Error::LeaseLost(lost)) => say(&format!(
            "worker-a wakes up and tries to complete: refused by the fence ({lost})"
        )),
        Ok(()) => failures.push("a stale completion was accepted".into()),
        Err(e) => return Err(e),
    }
    store.complete(&b, b"thumbnail by worker-b")?;
    say(&format!("worker-b completed job {}", b.job));

    while let Some(l) = store.claim(QUEUE, "worker-b", lease)? {
        clock.advance(Duration::from_secs(2));
        store.complete(&l, b"ok")?;
        say(&format!("worker-b completed job {}", l.job));
    }

    println!("\nhistory of job {}:", a.job);
    for run in store.history(a.job)? {
        println!(
            "  attempt {} by {:<9} claimed {:>10}  ended {:>10}  {}",
            run.attempt,
            run.worker,
            run.claimed_at.to_string(),
            run.ended_at.map(|t| t.to_string()).unwrap_or_default(),
            run.outcome.map(|o| o.to_string()).unwrap_or_default()
        );
    }
    let output = store.output(a.job)?.unwrap_or_default();
    println!("  committed output: {:?}", String::from_utf8_lossy(&output));
    if output != b"thumbnail by worker-b" {
        failures.push("the committed output is not the live holder's".into());
    }
    finish(&store, failures)
}

fn finish(store: &Store, mut failures: Vec<String>) -> Result<ExitCode, Error> {
    let stats = store.stats()?;
    let c = &stats.counters;
    println!(
        "\nsucceeded {} of {}",
        stats.total(JobState::Succeeded),
        stats.queues.values().map(|q| q.total()).sum::<u64>()
    );
    println!(
        "reclaims: reaper {}, takeover {}, release {}; fenced writes rejected {}; worst detection delay {:?}",
        c.reclaimed_by_reaper,
        c.reclaimed_by_takeover,
        c.released,
        c.fenced_writes_rejected,
        c.worst_detection_delay
    );
    let check = store.check()?;
    println!(
        "integrity check: {}",
        if check.is_clean() {
            "clean".to_owned()
        } else {
            format!("{:?}", check.problems)
        }
    );
    if !check.is_clean() {
        failures.push("integrity check failed".into());
    }
    if stats.total(JobState::Succeeded) != 3 {
        failures.push("not every job succeeded".into());
    }
    if failures.is_empty() {
        println!("all invariants held");
        Ok(ExitCode::SUCCESS)
    } else {
        for f in &failures {
            eprintln!("INVARIANT FAILED: {f}");
        }
        Ok(ExitCode::FAILURE)
    }
}
