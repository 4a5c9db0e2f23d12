//! A job's lease timeline: each attempt drawn as a bar from its claim to its end, on one
//! time axis from the job's creation to now (or to the current lease's expiry, if later).
//!
//! The gaps between the bars are the job waiting (for a retry, for a worker); a bar's colour
//! is its outcome; the running attempt's bar reaches to now, and its lease runs on, dashed,
//! to where it expires unless renewed, with the hard deadline marked if it has one. So an
//! attempt that ran past its last renewal and was taken back, or a job that waited long
//! between attempts, is seen at a glance rather than read off the times in the table.

use std::fmt::Write;

use crate::html::{duration, escape};
use leasehold::StoreTime;
use leasehold::{Job, Outcome, Run};

const W: f64 = 600.0;
const ROW: f64 = 16.0;
const TOP: f64 = 14.0;

/// The colour class of an attempt: how it ended, or `running`.
fn class(outcome: Option<&Outcome>) -> &'static str {
    match outcome {
        None => "running",
        Some(Outcome::Succeeded) => "succeeded",
        Some(Outcome::Failed(_) | Outcome::FailedPermanently(_) | Outcome::TimedOut { .. }) => {
            "failed"
        }
        Some(Outcome::LeaseExpired { .. } | Outcome::Stalled) => "lost",
        Some(
            Outcome::Released
            | Outcome::Snoozed { .. }
            | Outcome::Cancelled
            | Outcome::NeverStarted { .. }
            | Outcome::ResultLost { .. },
        ) => "ended",
        Some(_) => "ended",
    }
}

/// The timeline of `job` with its `runs`, as of `now`; empty for a job never claimed.
pub(crate) fn svg(job: &Job, runs: &[Run], now: StoreTime) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let lease = job.lease();
    let start = job.created_at();
    let end = lease
        .map(|l| l.expires_at().max(l.deadline().unwrap_or(l.expires_at())))
        .unwrap_or(now)
        .max(now)
        .max(
            runs.iter()
                .filter_map(|r| r.ended_at())
                .max()
                .unwrap_or(now),
        );
    let span = end.saturating_since(start).as_secs_f64().max(1e-9);
    let x = |t: StoreTime| t.saturating_since(start).as_secs_f64() / span * W;
    let h = TOP + ROW * runs.len() as f64 + 4.0;
    let mut out = format!(
        "<svg id=\"timeline\" viewBox=\"0 0 {W} {h}\" width=\"{W}\" height=\"{h}\" role=\"img\" \
         aria-label=\"each attempt from its claim to its end, from the job's creation to now\">\
         <text x=\"2\" y=\"10\" font-size=\"10\" fill=\"#6b7280\">created</text>\
         <text x=\"{W}\" y=\"10\" font-size=\"10\" fill=\"#6b7280\" text-anchor=\"end\">{}</text>\
         <line x1=\"{now_x:.1}\" y1=\"{TOP}\" x2=\"{now_x:.1}\" y2=\"{h}\" stroke=\"#9ca3af\"/>",
        match end > now {
            true => format!("lease expires in {}", duration(end.saturating_since(now))),
            false => "now".to_owned(),
        },
        now_x = x(now),
    );
    for (i, run) in runs.iter().enumerate() {
        let y = TOP + ROW * i as f64 + 2.0;
        let from = x(run.claimed_at());
        let until = x(run.ended_at().unwrap_or(now));
        let title = format!(
            "attempt {} by {}: {}, {}",
            run.attempt().0,
            run.worker(),
            duration(
                run.ended_at()
                    .unwrap_or(now)
                    .saturating_since(run.claimed_at())
            ),
            run.outcome()
                .map_or("running".to_owned(), |o| o.to_string())
        );
        let _ = write!(
            out,
            "<rect class=\"run {class}\" x=\"{from:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" \
             height=\"{bar:.1}\"><title>{title}</title></rect>",
            class = class(run.outcome()),
            w = (until - from).max(1.5),
            bar = ROW - 4.0,
            title = escape(&title),
        );
        if let (None, Some(l)) = (run.ended_at(), lease) {
            let mid = y + (ROW - 4.0) / 2.0;
            let _ = write!(
                out,
                "<line class=\"lease\" x1=\"{until:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" \
                 y2=\"{mid:.1}\" stroke=\"#2563eb\" stroke-dasharray=\"3 2\"/>",
                x(l.expires_at())
            );
            if let Some(d) = l.deadline() {
                let dx = x(d);
                let _ = write!(
                    out,
                    "<line class=\"deadline\" x1=\"{dx:.1}\" y1=\"{y:.1}\" x2=\"{dx:.1}\" \
                     y2=\"{:.1}\" stroke=\"#c22\"/>",
                    y + ROW - 4.0
                );
            }
        }
    }
    out.push_str("</svg>");
    out
}
