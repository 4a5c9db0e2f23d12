//! The `leasehold` command-line tool.

mod demo;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasehold::{NewJob, Store};

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "An embedded job scheduler with fenced, time-limited leases"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tell the lease story on a real store file: claim, silence, reap, reclaim, fencing.
    Demo,
    /// Test helper: open a store, optionally enqueue and claim jobs, report them on stdout,
    /// then hold the store open until killed or until stdin closes.
    #[command(name = "__child", hide = true)]
    Child {
        /// The store file.
        #[arg(long)]
        db: PathBuf,
        /// The queue to use.
        #[arg(long, default_value = "default")]
        queue: String,
        /// How many jobs to enqueue first.
        #[arg(long, default_value_t = 0)]
        enqueue: usize,
        /// How many jobs to claim.
        #[arg(long, default_value_t = 0)]
        claim: usize,
        /// The lease length in milliseconds.
        #[arg(long, default_value_t = 60_000)]
        lease_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => demo::run(),
        Command::Child {
            db,
            queue,
            enqueue,
            claim,
            lease_ms,
        } => child(db, &queue, enqueue, claim, Duration::from_millis(lease_ms)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("leasehold: {e}");
            ExitCode::from(3)
        }
    }
}

fn child(
    db: PathBuf,
    queue: &str,
    enqueue: usize,
    claim: usize,
    lease: Duration,
) -> Result<ExitCode, leasehold::Error> {
    let store = Store::builder(db).open()?;
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
    // Hold the store open until the parent kills us or closes our stdin.
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    Ok(ExitCode::SUCCESS)
}
