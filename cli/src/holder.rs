//! A process holding leases: the tool's hidden `__child`, which its bench kills, and the
//! `holder` role of the library's test helper process (`tests/support/helper_process.rs`). It opens a
//! store, optionally enqueues and claims jobs, reports them on stdout, and holds the store until
//! killed or its stdin closes (a line `complete` on stdin makes it try to complete what it
//! holds, and report the verdict; a line `write` makes it hold the store's writer seat, in a
//! transaction, until the next line; a line `fork` makes a child with `fork()` and no `exec`,
//! which shares the store's instance lock and sleeps until killed, and reports its pid).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::{NewJob, StoreBuilder};

pub fn run(
    builder: StoreBuilder,
    queue: &str,
    enqueue: usize,
    claim: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let store = builder.open()?;
    let jobs = (0..enqueue).map(|i| NewJob::new(queue, format!("job {i}").into_bytes()));
    store.enqueue_batch(jobs)?;
    let mut out = std::io::stdout().lock();
    let worker = format!("child-{}", std::process::id());
    let mut held = Vec::new();
    for _ in 0..claim {
        match store.claim(queue, &worker, lease)? {
            Some(l) => {
                let _ = writeln!(out, "claimed {} {}", l.job.0, l.attempt.0);
                held.push(l);
            }
            None => break,
        }
    }
    let _ = writeln!(out, "ready {}", store.now().as_nanos());
    let _ = out.flush();
    // Holds the leases until stdin closes; a line "complete" tries to complete them first
    // (a late holder's commit, for fencing tests).
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).unwrap_or(0) > 0 {
        if line.trim() == "fork" {
            // SAFETY: fork(2); the child calls only pause(2), which is async-signal-safe, so
            // the other threads it did not inherit are never missed.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                loop {
                    // SAFETY: pause(2) takes no arguments and touches no memory.
                    unsafe { libc::pause() };
                }
            }
            let _ = writeln!(out, "forked {pid}");
            let _ = out.flush();
        }
        if line.trim() == "write" {
            // Holds the store's writer seat (the file's writer lock) until the next line.
            store.transaction(|_| {
                let _ = writeln!(out, "writing");
                let _ = out.flush();
                let mut next = String::new();
                let _ = std::io::stdin().read_line(&mut next);
                Ok(())
            })?;
            let _ = writeln!(out, "wrote");
            let _ = out.flush();
        }
        if line.trim() == "complete" {
            for l in &held {
                let verdict = match store.complete(l, b"late") {
                    Ok(()) => "ok",
                    Err(e) if e.is_lease_lost() => "lost",
                    Err(_) => "error",
                };
                let _ = writeln!(out, "completed {} {verdict}", l.job.0);
            }
            let _ = out.flush();
        }
        line.clear();
    }
    Ok(ExitCode::SUCCESS)
}
