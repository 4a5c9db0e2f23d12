//! What a scenario reports: one row of the table, built from timed samples.

use std::time::{Duration, Instant};

use leasehold::Error;
use serde::Serialize;

#[derive(Serialize)]
pub(super) struct Row {
    pub(super) operation: String,
    pub(super) durability: &'static str,
    pub(super) concurrency: usize,
    pub(super) ops_per_sec: f64,
    /// Per-operation latency percentiles, where operations were timed one by one.
    pub(super) p50_us: Option<f64>,
    pub(super) p99_us: Option<f64>,
    pub(super) max_us: Option<f64>,
    /// ops/s divided by raw redb's ops/s for the equivalent work (none for the baselines).
    pub(super) ratio_to_raw: Option<f64>,
}

pub(super) struct Samples(pub(super) Vec<Duration>);

impl Samples {
    pub(super) fn row(
        mut self,
        operation: &str,
        durability: &'static str,
        concurrency: usize,
        total: Duration,
        ops: u64,
    ) -> Row {
        self.0.sort();
        let pct = |p: f64| {
            if self.0.is_empty() {
                return None;
            }
            let i = ((self.0.len() as f64 * p) as usize).min(self.0.len() - 1);
            Some(self.0[i].as_secs_f64() * 1e6)
        };
        Row {
            operation: operation.into(),
            durability,
            concurrency,
            ops_per_sec: ops as f64 / total.as_secs_f64(),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: self.0.last().map(|d| d.as_secs_f64() * 1e6),
            ratio_to_raw: None,
        }
    }
}

/// Times `n` calls of `op`.
pub(super) fn timed(
    n: usize,
    mut op: impl FnMut(usize) -> Result<(), Error>,
) -> Result<(Samples, Duration), Error> {
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        op(i)?;
        samples.push(t.elapsed());
    }
    Ok((Samples(samples), start.elapsed()))
}
