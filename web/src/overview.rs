//! The overview: the store at a glance (cards, the reaper's last pass, the throughput
//! chart), then one section per kind of thing the store holds: queues, schedules, leases,
//! lifetime counters and the pools of this process. Each section is a function of what the
//! page read once at the top, so the page costs one count of the store (see
//! [`super::counts`]) however many sections show it.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::chart::Rate;
use crate::counts::Reading;
use crate::html::{Table, duration, escape, relative, store_time, url_component};
use crate::pages::{done_banner, job_link, ok};
use crate::{Inner, PageResult, WebError, chart, params};
use leasehold::JobState;
use leasehold::Stats;
use leasehold::StoreTime;

/// The overview reloads itself this often unless told otherwise (`?refresh=0` stops it).
const REFRESH_SECS: u32 = 5;
/// The most running leases the overview lists.
const LEASES_SHOWN: usize = 50;

pub(crate) fn overview(inner: &Inner, query: &[(String, String)]) -> PageResult {
    let q = params::known(query, &["refresh", "did", "n", "refused"])?;
    for k in ["n", "refused"] {
        if let Some(v) = q.get(k) {
            params::count(k, v)?;
        }
    }
    let refresh = match q.get("refresh") {
        None => Some(REFRESH_SECS),
        Some(s) => params::refresh(s)?,
    };
    let counted = inner.counts()?;
    let reading = &counted.reading;
    let stats = &reading.stats;
    // What the counts show is aged by their own time (they may have been taken a while
    // ago, in the background); what is read now (leases, schedules, the chart) by now.
    let counted_at = stats.now;
    let now = inner.reads.now()?;
    let (rates, recent, by_queue) = {
        let samples = inner.samples.lock();
        let minute = Duration::from_secs(60);
        (
            samples.rates(),
            samples.recent(minute),
            samples.recent_by_queue(minute),
        )
    };

    let mut body = done_banner(&q);
    body.push_str(&cards(stats, recent, counted_at));
    body.push_str(&reaper_line(stats.last_reaper_pass.as_ref(), counted_at));
    body.push_str("<h2>Jobs finished per second, last 15 minutes</h2>");
    body.push_str(&chart::svg(&rates, now));
    body.push_str(
        "<p class=\"note\">Green: succeeded; red: died. Sampled while this page or /metrics \
         is read (at most once a second).</p>",
    );
    body.push_str(&queues(inner, reading, &by_queue, counted_at));
    body.push_str(&schedules(inner.reads.as_ref(), now)?);
    body.push_str(&leases(inner, stats, now)?);
    body.push_str(&counters(stats));
    body.push_str(&pools(inner));
    let counted_when = match counted.age.is_zero() {
        true => "taken now".to_owned(),
        false => format!(
            "as of {} ago (counting this store takes a while, so it runs apart; the \
             queues, the cards and the reaper's line are as of then)",
            duration(now.saturating_since(counted_at))
        ),
    };
    let now_shown = store_time(now, inner.reads.time_is_wall_clock());
    let reloads = match refresh {
        Some(_) => "; the page reloads itself every few seconds",
        None => "",
    };
    let _ = write!(
        body,
        "<p class=\"note\" id=\"as-of\">Store time {now_shown}; counts {counted_when}{reloads}.</p>"
    );
    ok(inner.frame("Overview", refresh).render(&body))
}

/// At a glance: waiting, running, the last minute's rates, the dead, the reaper's age.
fn cards(stats: &Stats, recent: Option<Rate>, now: StoreTime) -> String {
    let card = |label: &str, value: String, id: &str| {
        format!("<div class=\"card\" id=\"{id}\"><b>{value}</b>{label}</div>")
    };
    let rate = |v: Option<f64>| v.map_or("–".to_owned(), |r| format!("{r:.1}/s"));
    let failure = recent.and_then(|r| {
        let all = r.succeeded + r.dead;
        (all > 0.0).then(|| format!("{:.1} %", r.dead / all * 100.0))
    });
    let waiting = stats.total(JobState::Queued) + stats.total(JobState::RetryWait);
    [
        card("waiting", waiting.to_string(), "card-waiting"),
        card(
            "running",
            stats.total(JobState::Running).to_string(),
            "card-running",
        ),
        card(
            "succeeded, last minute",
            rate(recent.map(|r| r.succeeded)),
            "card-succeeded-rate",
        ),
        card(
            "died, last minute",
            rate(recent.map(|r| r.dead)),
            "card-dead-rate",
        ),
        card(
            "failure rate, last minute",
            failure.unwrap_or_else(|| "–".into()),
            "card-failure-rate",
        ),
        card("dead", stats.total(JobState::Dead).to_string(), "card-dead"),
        card(
            "since the reaper's last pass",
            stats
                .last_reaper_pass
                .as_ref()
                .map_or("never".to_owned(), |p| duration(p.age(now))),
            "card-reaper",
        ),
    ]
    .into_iter()
    .fold("<div class=\"cards\">".to_owned(), |all, c| all + &c)
        + "</div>"
}

/// Each queue: its jobs by state (each count a link to them), when things fall due, its
/// rate over the last minute, when a worker last asked, and its buttons.
fn queues(
    inner: &Inner,
    reading: &Reading,
    by_queue: &BTreeMap<String, Rate>,
    now: StoreTime,
) -> String {
    let mut headings = vec!["queue"];
    headings.extend(JobState::ALL.map(|s| s.name()));
    headings.extend([
        "oldest waiting",
        "nearest lease",
        "most overdue lease",
        "finished, last minute",
        "last served",
        "",
    ]);
    let mut t = Table::new("queues", &headings);
    for (name, counts) in &reading.stats.queues {
        let timing = reading.timing(name);
        let qn = url_component(name);
        let mut cells = vec![format!(
            "<a href=\"{}/jobs?queue={qn}\">{}</a>{}{}{}",
            inner.base,
            escape(name),
            if counts.paused {
                " <span class=\"state dead\">paused</span>"
            } else {
                ""
            },
            if reading.unserved.iter().any(|u| u.queue == *name) {
                " <span class=\"state retry_wait\" title=\"work waits and no worker has asked for it\">unserved</span>"
            } else {
                ""
            },
            settings(counts),
        )];
        for state in JobState::ALL {
            let n = counts.get(state);
            // `data-count` names the cell for a reader that checks the page (the tests).
            let id = escape(&format!("{name}/{}", state.name()));
            cells.push(match n {
                0 => format!("<span data-count=\"{id}\">0</span>"),
                n => format!(
                    "<a data-count=\"{id}\" href=\"{}/jobs?queue={qn}&amp;state={s}\">{n}</a>",
                    inner.base,
                    s = state.name()
                ),
            });
        }
        let opt = |t: Option<StoreTime>| t.map_or("–".to_owned(), |t| relative(t, now));
        cells.push(opt(timing.earliest_run_at.filter(|t| *t <= now)));
        cells.push(opt(timing.next_expiry));
        cells.push(
            timing
                .earliest_expiry
                .filter(|t| *t < now)
                .map_or("–".to_owned(), |t| {
                    format!("by {}", duration(now.saturating_since(t)))
                }),
        );
        cells.push(by_queue.get(name).map_or("–".to_owned(), |r| {
            let died = match r.dead > 0.0 {
                true => format!(", {:.1}/s died", r.dead),
                false => String::new(),
            };
            format!(
                "<span data-rate=\"{}\">{:.1}/s{died}</span>",
                escape(name),
                r.succeeded
            )
        }));
        cells.push(opt(counts.served_at));
        let (action, label) = match counts.paused {
            true => ("resume", "Resume"),
            false => ("pause", "Pause"),
        };
        let mut buttons = inner.action_button(&format!("/queues/{qn}/{action}"), label);
        match counts.get(JobState::Dead) {
            0 => {}
            dead => buttons.push_str(&inner.action_button(
                &format!("/queues/{qn}/retry-dead"),
                &format!("Retry {dead} dead"),
            )),
        }
        cells.push(buttons);
        t.row(cells);
    }
    let mut out = "<h2>Queues</h2>".to_owned();
    out.push_str(&t.finish("No jobs yet."));
    out
}

/// The leases held (the first [`LEASES_SHOWN`]): worker, attempt, times, progress, and the
/// holding process where processes share a file.
fn leases(inner: &Inner, stats: &Stats, now: StoreTime) -> Result<String, WebError> {
    let mut out = "<h2>Leases held</h2>".to_owned();
    let running = inner.reads.jobs(&leasehold::JobFilter {
        state: Some(JobState::Running),
        limit: Some(LEASES_SHOWN),
        ..leasehold::JobFilter::default()
    })?;
    let holders = inner.holders()?;
    let mut t = Table::new(
        "leases",
        &[
            "job", "queue", "worker", "attempt", "claimed", "expires", "progress", "process",
        ],
    );
    for job in &running {
        let Some(lease) = job.lease() else { continue };
        let process = match holders.get(&job.id()) {
            Some((id, state)) => format!("{} ({})", escape(&id.to_string()), state.name()),
            None => "–".to_owned(),
        };
        t.row([
            job_link(inner, job.id()),
            escape(job.queue()),
            escape(lease.owner()),
            job.attempt().0.to_string(),
            relative(lease.claimed_at(), now),
            relative(lease.expires_at(), now),
            job.progress().to_string(),
            process,
        ]);
    }
    out.push_str(&t.finish("No job is running."));
    if !running.is_empty()
        && inner
            .closed_cleanly
            .as_ref()
            .is_some_and(|closed| !closed())
    {
        out.push_str(
            "<p class=\"error\" id=\"not-closed-cleanly\">This store was not closed cleanly \
             (its writer was killed or lost power): these leases are its last commit's, no \
             process holds them now, and the next writer to open it takes them back.</p>",
        );
    }
    let shown = running.len() as u64;
    if shown < stats.total(JobState::Running) {
        let _ = write!(
            out,
            "<p class=\"note\">The first {shown} of {} running jobs; <a href=\"{}/jobs?state=running\">all of them</a>.</p>",
            stats.total(JobState::Running),
            inner.base
        );
    }

    Ok(out)
}

/// The lifetime counters: the reclaim paths, the fence, the worst detection delay.
fn counters(stats: &Stats) -> String {
    let mut out = "<h2>Lifetime counters</h2>".to_owned();
    let mut t = Table::new("counters", &["counter", "count"]);
    for (name, n) in stats.counters.named() {
        t.row([name.replace('_', " "), n.to_string()]);
    }
    t.row([
        "worst detection delay".to_owned(),
        duration(stats.counters.worst_detection_delay),
    ]);
    out.push_str(&t.finish(""));

    out
}

/// The pools of this process (where the page is embedded): their counters and commit
/// latency.
fn pools(inner: &Inner) -> String {
    if inner.pools.is_empty() {
        return String::new();
    }
    let mut out = "<h2>Pools in this process</h2>".to_owned();
    let mut t = Table::new(
        "pools",
        &[
            "pool",
            "in flight",
            "claimed",
            "succeeded",
            "failed",
            "released",
            "leases lost",
            "commits ending attempts",
            "commit p50 / p99 (at most)",
        ],
    );
    for (name, stats) in &inner.pools {
        let s = stats();
        let latency = &s.commit_latency;
        let at_most = |q: f64| match latency.quantile(q) {
            None => "–".to_owned(),
            Some(Duration::MAX) => "over 10 s".to_owned(),
            Some(d) => duration(d),
        };
        t.row([
            escape(name),
            s.in_flight.to_string(),
            s.claimed.to_string(),
            s.succeeded.to_string(),
            s.failed.to_string(),
            s.released.to_string(),
            s.leases_lost.to_string(),
            latency.count().to_string(),
            format!("{} / {}", at_most(0.5), at_most(0.99)),
        ]);
    }
    out.push_str(&t.finish(""));
    out
}

/// The periodic jobs: when each ticks, its next tick, what it has fired; nothing where the
/// store has none.
fn schedules(store: &dyn leasehold::ReadJobs, now: StoreTime) -> Result<String, WebError> {
    let list = store.schedules()?;
    if list.is_empty() {
        return Ok(String::new());
    }
    // A cron schedule's next tick is a wall-clock time: shown to a person, read off the host.
    let wall = crate::clock::wall_now();
    let mut out = "<h2>Schedules</h2>".to_owned();
    let mut t = Table::new(
        "schedules",
        &["name", "queue", "when", "next tick", "fired", "skipped"],
    );
    for s in &list {
        let next = s.next_in_ms(now, wall);
        let magnitude = Duration::from_millis(next.unsigned_abs());
        t.row([
            escape(s.name()),
            escape(s.queue()),
            match s.when() {
                leasehold::When::Every(d) => format!("every {}", duration(*d)),
                leasehold::When::Cron { expr, zone } => {
                    format!("cron <code>{}</code> in {}", escape(expr), escape(zone))
                }
                other => escape(&format!("{other:?}")),
            },
            match (s.paused(), next >= 0) {
                (true, _) => "<span class=\"state dead\">paused</span>".to_owned(),
                (false, true) => format!("in {}", duration(magnitude)),
                (false, false) => format!("due {} ago", duration(magnitude)),
            },
            s.fired().to_string(),
            s.skipped().to_string(),
        ]);
    }
    out.push_str(&t.finish(""));
    for s in list.iter().filter(|s| s.failure().is_some()) {
        out.push_str(&format!(
            "<p class=\"error\" id=\"schedule-failure\">Schedule {} cannot fire: {} (the \
             others fire; declare it again once mended).</p>",
            escape(s.name()),
            escape(s.failure().unwrap_or_default())
        ));
    }
    Ok(out)
}

/// What the last reaper pass did, and a warning when none has run for a while: without a
/// reaper, an expired lease is taken back only when a claim passes by.
fn reaper_line(pass: Option<&leasehold::ReaperPass>, now: StoreTime) -> String {
    match pass {
        None => "<p class=\"error\" id=\"reaper\">No reaper pass is recorded in this store: \
                 expired leases are taken back only by claims. Is a Reaper running beside \
                 the pools?</p>"
            .to_owned(),
        Some(p) => {
            let every = p.every.map_or(String::new(), |e| {
                format!(" (it runs every {})", duration(e))
            });
            let line = format!(
                "The reaper's last pass ended {}{every}: it took {}; leases taken back: {}; \
                 finished jobs purged: {}.",
                relative(p.at, now),
                duration(p.took),
                p.reclaimed,
                p.purged
            );
            match p.late(now) {
                true => format!(
                    "<p class=\"error\" id=\"reaper\">{line} It has missed passes since: is \
                     its process running?</p>"
                ),
                false => format!("<p class=\"note\" id=\"reaper\">{line}</p>"),
            }
        }
    }
}

/// A queue's settings under its name, where it has any: its limits and its retry policy.
fn settings(counts: &leasehold::QueueCounts) -> String {
    let mut parts = Vec::new();
    if let Some(n) = counts.limits.concurrency {
        parts.push(format!("at most {n} held"));
    }
    if let Some(rate) = counts.limits.rate {
        parts.push(format!("{} claims per {}", rate.claims, duration(rate.per)));
    }
    if let Some(n) = counts.limits.per_key {
        parts.push(format!("at most {n} per limit key"));
    }
    if let Some(rate) = counts.limits.per_key_rate {
        let per = duration(rate.per);
        parts.push(format!("{} claims per limit key per {per}", rate.claims));
    }
    if let Some(policy) = &counts.retry {
        parts.push(format!("backoff {policy}"));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(
            "<br><small data-settings>{}</small>",
            escape(&parts.join(" · "))
        ),
    }
}
