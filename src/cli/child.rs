//! `leasehold __child`: a test helper process that opens a store, optionally enqueues and
//! claims jobs, reports them on stdout, and holds the store until killed or its stdin closes.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

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
    for _ in 0..claim {
        match store.claim(queue, &worker, lease)? {
            Some(l) => {
                let _ = writeln!(out, "claimed {} {}", l.job.0, l.attempt.0);
            }
            None => break,
        }
    }
    let _ = writeln!(out, "ready {}", store.now().as_nanos());
    let _ = out.flush();
    drop(out);
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    Ok(ExitCode::SUCCESS)
}
