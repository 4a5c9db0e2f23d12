//! A prototype of design (b) for several processes (docs/design.md), measured beside the
//! design that was built: one process holds the store (single-writer, as today) and serves
//! the others over a Unix socket, so group commit spans every process's workers. Only the
//! steady state is prototyped (no failover when the seat holder dies): enough to measure what
//! the design would move, not a way to run it.
//!
//! The protocol is one line each way: a worker sends `next JOB ATTEMPT` (its last job to
//! complete, `0 0` for none) and gets back `job JOB ATTEMPT` (claimed for it, in the same
//! transaction as the completion) or `none`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::ReadJobs;
use leasehold::{Error, JobState, Lease, NewJob, Store};

use super::super::helper::{Helper, io};
use super::measure::{Row, Samples};
use super::{LEASE, store};

/// Serves one worker's connection: completes what it reports done and claims its next job.
fn serve(store: Store, stream: UnixStream) {
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    let mut out = stream;
    let worker = format!("seat-{}", std::process::id());
    let mut held: HashMap<u64, Lease> = HashMap::new();
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        let done: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        let next = match done.as_slice() {
            [job, _] if *job != 0 => match held.remove(job) {
                Some(lease) => store.complete_and_claim(&lease, b"", LEASE),
                None => Ok(None),
            },
            _ => store.claim("seat", &worker, LEASE),
        };
        let reply = match next {
            Ok(Some(lease)) => {
                let reply = format!("job {} {}\n", lease.job.0, lease.attempt.0);
                held.insert(lease.job.0, lease);
                reply
            }
            _ => "none\n".to_owned(),
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// `leasehold __seat_client`: `threads` workers, each on its own connection to the seat,
/// running empty jobs until the seat has none.
pub fn client(socket: &Path, threads: usize) -> Result<std::process::ExitCode, Error> {
    println!("ready");
    let _ = std::io::stdout().flush();
    let workers: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let socket = socket.to_owned();
            std::thread::spawn(move || -> std::io::Result<()> {
                let stream = UnixStream::connect(socket)?;
                let mut lines = BufReader::new(stream.try_clone()?).lines();
                let mut out = stream;
                let mut last = (0u64, 0u64);
                loop {
                    out.write_all(format!("next {} {}\n", last.0, last.1).as_bytes())?;
                    let Some(reply) = lines.next().transpose()? else {
                        return Ok(());
                    };
                    let words: Vec<u64> = reply
                        .split_whitespace()
                        .skip(1)
                        .filter_map(|w| w.parse().ok())
                        .collect();
                    match words.as_slice() {
                        [job, attempt] => last = (*job, *attempt), // the work: nothing
                        _ => return Ok(()),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Durable end to end through the seat: `processes` client processes of `threads` workers.
pub(super) fn seat_end_to_end(
    dir: &Path,
    processes: usize,
    threads: usize,
    jobs: usize,
) -> Result<Row, Error> {
    let store = store(dir, "seat.redb", true)?;
    store.enqueue_batch((0..jobs).map(|i| NewJob::new("seat", format!("{i}"))))?;
    let socket = dir.join("seat.sock");
    let listener = UnixListener::bind(&socket).map_err(io)?;
    let s = store.clone();
    let accept = std::thread::spawn(move || {
        for stream in listener.incoming().take(processes * threads).flatten() {
            let s = s.clone();
            std::thread::spawn(move || serve(s, stream));
        }
    });
    let start = Instant::now();
    let threads_arg = threads.to_string();
    let socket_arg = socket.to_string_lossy().into_owned();
    let clients = (0..processes)
        .map(|_| {
            Helper::start(
                dir,
                &[
                    "__seat_client",
                    "--socket",
                    &socket_arg,
                    "--threads",
                    &threads_arg,
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    while store.stats()?.total(JobState::Succeeded) < jobs as u64 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let total = start.elapsed();
    for c in clients {
        c.end();
    }
    let _ = accept.join();
    Ok(Samples(Vec::new()).row(
        &format!(
            "end to end: {processes} processes x {threads} workers through one seat holder's socket (prototype of design b)"
        ),
        "durable",
        processes * threads,
        total,
        jobs as u64,
    ))
}
