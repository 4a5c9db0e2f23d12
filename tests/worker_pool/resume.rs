//! A long job killed mid-way resumes in its next attempt from the checkpoint its handler
//! saved, through the handler's context; and what the handler logged reaches the store.

use leasehold::{JobContext, JobError, JobState, NewJob};

use crate::common::wait_until;
use crate::on_both::{Kind, LEASE};
use crate::pool;

crate::on_both::on_both!(
    a_job_killed_mid_way_resumes_from_its_checkpoint_in_the_next_attempt,
    a_handlers_log_lines_reach_the_store_with_its_heartbeats_and_at_its_end,
);

/// Counts from its checkpoint (or 0) to 10, saving each step; the first attempt stops for
/// good after step 6 (its process dies: the pool is abandoned, nothing more is written).
fn count_to_ten(ctx: &JobContext) -> Result<String, JobError> {
    let failed = |e: leasehold::Error| JobError::new(e);
    let from = match ctx.last_checkpoint().map_err(failed)? {
        Some(c) => String::from_utf8_lossy(c.data())
            .parse::<u32>()
            .unwrap_or(0),
        None => 0,
    };
    for step in from + 1..=10 {
        ctx.save_checkpoint(step.to_string().as_bytes())
            .map_err(failed)?;
        if step == 6 && ctx.attempt().0 == 1 {
            loop {
                ctx.sleep(std::time::Duration::from_secs(3600))?;
            }
        }
    }
    Ok(format!("attempt {} counted from {from}", ctx.attempt().0))
}

fn a_job_killed_mid_way_resumes_from_its_checkpoint_in_the_next_attempt(kind: Kind) {
    let f = kind.open();
    let job = f.enqueue(NewJob::new(crate::Q, "count")).unwrap();
    let dying = pool(&f, "dying").start(count_to_ten).unwrap();
    let at_six = || {
        let c = f.checkpoint(job).unwrap();
        c.is_some_and(|c| c.data() == b"6")
    };
    wait_until("the first attempt to reach step 6", at_six);
    dying.abandon();
    f.advance(LEASE);
    let survivor = pool(&f, "survivor").start(count_to_ten).unwrap();
    wait_until("the job to succeed", || {
        f.job(job).unwrap().unwrap().state() == JobState::Succeeded
    });
    drop(survivor);
    let output = f.output(job).unwrap().unwrap();
    assert_eq!(
        String::from_utf8(output).unwrap(),
        "attempt 2 counted from 6"
    );
    let c = f.checkpoint(job).unwrap().unwrap();
    assert_eq!((c.attempt().0, c.data()), (2, b"10".as_slice()));
}

/// A line written while the handler still runs reaches the store with a heartbeat (the
/// handler waits to see it there); the lines after the last beat are written before the
/// attempt ends.
fn a_handlers_log_lines_reach_the_store_with_its_heartbeats_and_at_its_end(kind: Kind) {
    let f = kind.open();
    let job = f.enqueue(NewJob::new(crate::Q, "import")).unwrap();
    let (seen_tx, seen_rx) = crossbeam_channel::bounded::<()>(1);
    let p = pool(&f, "a")
        .start(move |ctx| {
            ctx.log("started");
            seen_rx
                .recv_timeout(std::time::Duration::from_secs(30))
                .map_err(|_| JobError::new("the test never saw the line"))?;
            ctx.log("finished");
            Ok(())
        })
        .unwrap();
    let texts = |f: &crate::on_both::Backend| -> Vec<String> {
        (f.logs(job).unwrap().iter())
            .flat_map(|l| l.lines().map(|(_, t)| t.to_owned()).collect::<Vec<_>>())
            .collect()
    };
    wait_until("the running handler's line to be stored", || {
        texts(&f) == ["started"]
    });
    seen_tx.send(()).unwrap();
    wait_until("the job to succeed", || {
        f.job(job).unwrap().unwrap().state() == JobState::Succeeded
    });
    drop(p);
    assert_eq!(texts(&f), ["started", "finished"]);
    assert_eq!(f.logs(job).unwrap()[0].attempt().0, 1);
}

/// Runs `jobs` one after another on a pool of one on a fresh redb file, each handler doing
/// `each`, and returns how many write transactions the file took.
fn commits_for(jobs: usize, each: fn(&JobContext)) -> u64 {
    let f = crate::Fixture::new();
    let ids = f.enqueue_n(jobs);
    let before = f.metrics().write_transactions;
    let p = crate::redb_pool(&f, "one")
        .concurrency(1)
        .lease(std::time::Duration::from_secs(7200))
        .heartbeat_every(std::time::Duration::from_secs(3600))
        .start(move |ctx| {
            each(ctx);
            Ok(())
        })
        .unwrap();
    wait_until("every job to succeed", || {
        ids.iter().all(|id| {
            leasehold::ReadJobs::job(&*f, *id).unwrap().unwrap().state() == JobState::Succeeded
        })
    });
    drop(p);
    f.metrics().write_transactions - before
}

/// A handler's last log lines commit with its completion: jobs that each log a line take no
/// more commits than jobs that log nothing (they took one more each when the lines were
/// written on their own before the completion).
#[test]
fn an_attempts_last_log_lines_commit_with_its_completion_not_on_their_own() {
    let silent = commits_for(20, |_| {});
    let logging = commits_for(20, |ctx| ctx.log("resized 3 images"));
    // (a little room: the pool's rounds need not fall the same way twice)
    assert!(
        logging <= silent + 3,
        "20 jobs took {silent} commits, and {logging} when each logged a line"
    );
}
