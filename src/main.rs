//! The `leasehold` command-line tool.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

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
    /// Run three worker pools on a real store file and show leases at work: a killed pool's
    /// jobs reclaimed, a paused worker fenced, a hung job caught, a graceful release.
    Demo {
        /// Print the final report as JSON on stdout instead of the narrated run.
        #[arg(long)]
        json: bool,
        /// How many jobs to enqueue.
        #[arg(long, default_value_t = 300)]
        jobs: usize,
    },
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
    /// Test helper for kill tests: work a queue with several threads, committing an effect
    /// with each completion and reporting each commit on stdout after it returned.
    #[command(name = "__worker", hide = true)]
    Worker {
        /// The store file.
        #[arg(long)]
        db: PathBuf,
        /// The queue to work.
        #[arg(long, default_value = "default")]
        queue: String,
        /// Worker threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// The lease length in milliseconds.
        #[arg(long, default_value_t = 2_000)]
        lease_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { json, jobs } => cli::demo::run(json, jobs),
        Command::Child {
            db,
            queue,
            enqueue,
            claim,
            lease_ms,
        } => cli::child::run(db, &queue, enqueue, claim, Duration::from_millis(lease_ms)),
        Command::Worker {
            db,
            queue,
            threads,
            lease_ms,
        } => cli::worker::run(db, queue, threads, Duration::from_millis(lease_ms)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("leasehold: {e}");
            ExitCode::from(3)
        }
    }
}
