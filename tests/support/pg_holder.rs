//! The `pg-holder` role of the test helper process (`helper_process.rs`): claims one job of
//! queue `p` on the PostgreSQL store at `--url` in `--schema` under a `--lease-ms` lease,
//! prints `claimed <job> <attempt>`, then on each stdin line tries to write as the holder and
//! prints the verdict: `beat` renews (`beat ok|lost|error`), `complete` completes
//! (`complete ok|lost|error`). A connection broken meanwhile is an error, retried by the test.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use leasehold::JobStore;
use leasehold::postgres::PgStore;

pub fn run(url: &str, schema: &str, lease: Duration) -> Result<ExitCode, leasehold::Error> {
    let store = PgStore::builder(url)
        .schema(schema)
        .statement_timeout(Duration::from_secs(5))
        .open()?;
    let mut out = std::io::stdout();
    let Some(lease) = store.claim("p", "partitioned", lease)? else {
        let _ = writeln!(out, "nothing");
        return Ok(ExitCode::FAILURE);
    };
    let _ = writeln!(out, "claimed {} {}", lease.job.0, lease.attempt.0);
    let _ = out.flush();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let verdict = |r: leasehold::Result<()>| match r {
            Ok(()) => "ok".to_owned(),
            Err(e) if e.is_lease_lost() => "lost".to_owned(),
            Err(e) => format!("error {e}"),
        };
        let said = match line.trim() {
            "beat" => format!("beat {}", verdict(store.heartbeat(&lease, 1).map(|_| ()))),
            "complete" => format!("complete {}", verdict(store.complete(&lease, b"late"))),
            other => format!("unknown {other}"),
        };
        let _ = writeln!(out, "{said}");
        let _ = out.flush();
    }
    Ok(ExitCode::SUCCESS)
}
