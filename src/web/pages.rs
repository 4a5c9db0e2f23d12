//! The pages: each reads what it shows through [`ReadJobs`](crate::ReadJobs) (never a write
//! transaction) and renders it as plain HTML, with no script: forms and links do the rest.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use http::StatusCode;

use crate::ids::{InstanceId, JobId, StoreTime};
use crate::job::JobState;
use crate::redb_store::HolderState;
use crate::web::html::{Frame, Table, duration, escape, relative, state_badge, url_component};
use crate::web::{
    Inner, PageResult, Request, Response, WebError, chart, metrics, params, timeline,
};

/// The overview reloads itself this often unless told otherwise (`?refresh=0` stops it).
const REFRESH_SECS: u32 = 5;
/// The most running leases the overview lists.
const LEASES_SHOWN: usize = 50;

impl Inner {
    fn frame<'a>(&'a self, title: &'a str, refresh: Option<u32>) -> Frame<'a> {
        Frame {
            base: &self.base,
            title,
            store: &self.name,
            refresh,
        }
    }

    /// The form fields every action carries: the form secret.
    fn secret_field(&self) -> String {
        format!(
            "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
            self.access.form_secret
        )
    }

    /// A button that posts `action` (a path under the page) after the confirmation page.
    pub(crate) fn action_button(&self, action: &str, label: &str) -> String {
        format!(
            "<form class=\"inline\" method=\"post\" action=\"{}{action}\">{}\
             <button type=\"submit\">{}</button></form>",
            self.base,
            self.secret_field(),
            escape(label)
        )
    }

    fn holders(&self) -> Result<BTreeMap<JobId, (InstanceId, HolderState)>, WebError> {
        Ok(match &self.holders {
            Some(read) => read()?
                .into_iter()
                .map(|(job, id, state)| (job, (id, state)))
                .collect(),
            None => BTreeMap::new(),
        })
    }
}

fn ok(body: String) -> PageResult {
    Ok(crate::web::html(StatusCode::OK, body))
}

/// What an action that went through says on the page it returns to.
fn done_banner(q: &BTreeMap<&str, &str>) -> String {
    let text = match q.get("did").copied() {
        Some("cancelled") => "Cancelled.",
        Some("cancel_requested") => {
            "Cancel requested: the job is running, and its holder is told at its next heartbeat."
        }
        Some("retried") => "Queued again with a fresh retry budget.",
        Some("paused") => "Paused: no claim takes the queue's jobs until it is resumed.",
        Some("resumed") => "Resumed.",
        Some("retried_dead") => {
            let n = |k: &str| q.get(k).copied().unwrap_or("0");
            let refused = match n("refused") {
                "0" => String::new(),
                r => format!(
                    " {r} could not be (another job holds its unique key, or it changed \
                     meanwhile)."
                ),
            };
            return format!(
                "<p class=\"done\" id=\"done\">Queued {} dead jobs again with a fresh retry \
                 budget.{refused}</p>",
                n("n")
            );
        }
        _ => return String::new(),
    };
    format!("<p class=\"done\" id=\"done\">{text}</p>")
}

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
    let store = &inner.reads;
    let counted = inner.counts()?;
    let reading = &counted.reading;
    let stats = &reading.stats;
    let now = store.now()?;
    let (rates, recent, by_queue) = {
        let samples = inner.samples.lock();
        let minute = Duration::from_secs(60);
        (
            samples.rates(),
            samples.recent(minute),
            samples.recent_by_queue(minute),
        )
    };
    let unserved = &reading.unserved;
    let mut body = done_banner(&q);

    // At a glance.
    let waiting = stats.total(JobState::Queued) + stats.total(JobState::RetryWait);
    let card = |label: &str, value: String, id: &str| {
        format!("<div class=\"card\" id=\"{id}\"><b>{value}</b>{label}</div>")
    };
    let rate = |v: Option<f64>| v.map_or("–".to_owned(), |r| format!("{r:.1}/s"));
    let failure = recent.and_then(|r| {
        let all = r.succeeded + r.dead;
        (all > 0.0).then(|| format!("{:.1} %", r.dead / all * 100.0))
    });
    body.push_str("<div class=\"cards\">");
    body.push_str(&card("waiting", waiting.to_string(), "card-waiting"));
    body.push_str(&card(
        "running",
        stats.total(JobState::Running).to_string(),
        "card-running",
    ));
    body.push_str(&card(
        "succeeded, last minute",
        rate(recent.map(|r| r.succeeded)),
        "card-succeeded-rate",
    ));
    body.push_str(&card(
        "died, last minute",
        rate(recent.map(|r| r.dead)),
        "card-dead-rate",
    ));
    body.push_str(&card(
        "failure rate, last minute",
        failure.unwrap_or_else(|| "–".into()),
        "card-failure-rate",
    ));
    body.push_str(&card(
        "dead",
        stats.total(JobState::Dead).to_string(),
        "card-dead",
    ));
    body.push_str(&card(
        "since the reaper's last pass",
        stats
            .last_reaper_pass
            .as_ref()
            .map_or("never".to_owned(), |p| duration(p.age(now))),
        "card-reaper",
    ));
    body.push_str("</div>");
    body.push_str(&reaper_line(stats.last_reaper_pass.as_ref(), now));

    body.push_str("<h2>Jobs finished per second, last 15 minutes</h2>");
    body.push_str(&chart::svg(&rates, now));
    body.push_str(
        "<p class=\"note\">Green: succeeded; red: died. Sampled while this page or /metrics \
         is read (at most once a second).</p>",
    );

    // Queues.
    body.push_str("<h2>Queues</h2>");
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
    for (name, counts) in &stats.queues {
        let timing = reading.timing(name);
        let qn = url_component(name);
        let mut cells = vec![format!(
            "<a href=\"{}/jobs?queue={qn}\">{}</a>{}{}",
            inner.base,
            escape(name),
            if counts.paused {
                " <span class=\"state dead\">paused</span>"
            } else {
                ""
            },
            if unserved.iter().any(|u| u.queue == *name) {
                " <span class=\"state retry_wait\" title=\"work waits and no worker has asked for it\">unserved</span>"
            } else {
                ""
            }
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
    body.push_str(&t.finish("No jobs yet."));

    body.push_str(&schedules(store.as_ref(), now)?);

    // Leases.
    body.push_str("<h2>Leases held</h2>");
    let running = store.jobs(&crate::JobFilter {
        state: Some(JobState::Running),
        limit: Some(LEASES_SHOWN),
        ..crate::JobFilter::default()
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
    body.push_str(&t.finish("No job is running."));
    let shown = running.len() as u64;
    if shown < stats.total(JobState::Running) {
        let _ = write!(
            body,
            "<p class=\"note\">The first {shown} of {} running jobs; <a href=\"{}/jobs?state=running\">all of them</a>.</p>",
            stats.total(JobState::Running),
            inner.base
        );
    }

    // The reclaim paths and the fence.
    body.push_str("<h2>Lifetime counters</h2>");
    let mut t = Table::new("counters", &["counter", "count"]);
    for (name, n) in stats.counters.named() {
        t.row([name.replace('_', " "), n.to_string()]);
    }
    t.row([
        "worst detection delay".to_owned(),
        duration(stats.counters.worst_detection_delay),
    ]);
    body.push_str(&t.finish(""));

    if !inner.pools.is_empty() {
        body.push_str("<h2>Pools in this process</h2>");
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
        body.push_str(&t.finish(""));
    }
    let counted_when = match counted.age.is_zero() {
        true => "taken now".to_owned(),
        false => format!(
            "as of {} ago (counting this store takes a while, so it runs apart)",
            duration(counted.age)
        ),
    };
    let reloads = match refresh {
        Some(_) => "; the page reloads itself every few seconds",
        None => "",
    };
    let _ = write!(
        body,
        "<p class=\"note\" id=\"as-of\">Store time {now}; counts {counted_when}{reloads}.</p>"
    );
    ok(inner.frame("Overview", refresh).render(&body))
}

/// The periodic jobs: when each ticks, its next tick, what it has fired; nothing where the
/// store has none.
fn schedules(store: &dyn crate::ReadJobs, now: StoreTime) -> Result<String, WebError> {
    let list = store.schedules()?;
    if list.is_empty() {
        return Ok(String::new());
    }
    // A cron schedule's next tick is a wall-clock time: shown to a person, read off the host.
    #[allow(clippy::disallowed_methods)]
    let wall = std::time::SystemTime::now();
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
                crate::When::Every(d) => format!("every {}", duration(*d)),
                crate::When::Cron { expr, zone } => {
                    format!("cron <code>{}</code> in {}", escape(expr), escape(zone))
                }
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
    Ok(out)
}

/// What the last reaper pass did, and a warning when none has run for a while: without a
/// reaper, an expired lease is taken back only when a claim passes by.
fn reaper_line(pass: Option<&crate::ReaperPass>, now: StoreTime) -> String {
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

fn job_link(inner: &Inner, id: JobId) -> String {
    format!("<a href=\"{}/jobs/{}\">{}</a>", inner.base, id.0, id.0)
}

pub(crate) fn jobs(inner: &Inner, query: &[(String, String)]) -> PageResult {
    let listing = params::Listing::parse(query)?;
    if let Some(id) = listing.id {
        return crate::web::redirect(&format!("{}/jobs/{}", inner.base, id.0));
    }
    let store = &inner.reads;
    let now = store.now()?;
    let found = store.jobs(&listing.filter())?;
    let mut body = String::new();

    // The filter form: a GET, so a filtered listing is a link to share.
    let states: String = std::iter::once(("", "any state"))
        .chain(JobState::ALL.map(|s| (s.name(), s.name())))
        .map(|(v, label)| {
            let selected = listing.state.is_some_and(|s| s.name() == v);
            format!(
                "<option value=\"{v}\"{}>{label}</option>",
                if selected { " selected" } else { "" }
            )
        })
        .collect();
    let _ = write!(
        body,
        "<form id=\"filter\" method=\"get\" action=\"{}/jobs\">\
         <input name=\"queue\" placeholder=\"queue\" value=\"{}\"> \
         <select name=\"state\">{states}</select> \
         <input name=\"meta\" placeholder=\"key=value\" value=\"{}\"> \
         <select name=\"order\"><option value=\"oldest\">oldest first</option>\
         <option value=\"newest\"{}>newest first</option></select> \
         <button type=\"submit\">Filter</button></form>",
        inner.base,
        escape(listing.queue.as_deref().unwrap_or("")),
        escape(
            &listing
                .meta
                .first()
                .map(|(k, v)| format!("{k}={v}"))
                .unwrap_or_default()
        ),
        if listing.newest_first {
            " selected"
        } else {
            ""
        },
    );

    let mut t = Table::new(
        "jobs",
        &[
            "job", "queue", "state", "attempt", "failures", "runs", "updated", "metadata",
        ],
    );
    for job in &found {
        t.row([
            job_link(inner, job.id()),
            escape(job.queue()),
            state_badge(job.state()),
            job.attempt().0.to_string(),
            format!("{} of {}", job.failures(), job.max_attempts()),
            relative(job.run_at(), now),
            relative(job.updated_at(), now),
            escape(
                &job.metadata()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ]);
    }
    body.push_str(&t.finish("No job matches."));
    if !listing.newest_first
        && found.len() == listing.limit
        && let Some(last) = found.last()
    {
        let q = listing.query();
        let _ = write!(
            body,
            "<p><a id=\"next\" href=\"{}/jobs?{}{}after={}\">Next {} →</a></p>",
            inner.base,
            escape(&q),
            if q.is_empty() { "" } else { "&amp;" },
            last.id().0,
            listing.limit
        );
    }
    ok(inner.frame("Jobs", None).render(&body))
}

pub(crate) fn job(inner: &Inner, id: JobId, query: &[(String, String)]) -> PageResult {
    let q = params::known(query, &["did"])?;
    let store = &inner.reads;
    let Some(job) = store.job(id)? else {
        return Err(WebError::NotFound(format!("job {id}")));
    };
    let now = store.now()?;
    let history = store.history(id)?;
    let payload = store.payload(id)?.map_or(0, |p| p.len());
    let output = store.output(id)?.map(|o| o.len());
    let mut body = done_banner(&q);

    let mut t = Table::new("job", &["", ""]);
    let mut row = |k: &str, v: String| t.row([escape(k), v]);
    row("state", state_badge(job.state()));
    row(
        "queue",
        format!(
            "<a href=\"{}/jobs?queue={}\">{}</a>",
            inner.base,
            url_component(job.queue()),
            escape(job.queue())
        ),
    );
    row("priority", job.priority().to_string());
    row("attempt", job.attempt().0.to_string());
    row(
        "retry budget",
        format!("{} of {} spent", job.failures(), job.max_attempts()),
    );
    row("created", relative(job.created_at(), now));
    row("runs at", relative(job.run_at(), now));
    row("updated", relative(job.updated_at(), now));
    if let Some(at) = job.finished_at() {
        row("finished", relative(at, now));
    }
    if let Some(key) = job.unique_key() {
        row("unique key", escape(key));
    }
    if let Some(limit) = job.time_limit() {
        row("time limit", duration(limit));
    }
    row("payload", format!("{payload} bytes"));
    if let Some(n) = output {
        row("output", format!("{n} bytes"));
    }
    if let Some(lease) = job.lease() {
        row(
            "lease",
            format!(
                "held by {} since {}, expires {}{}",
                escape(lease.owner()),
                relative(lease.claimed_at(), now),
                relative(lease.expires_at(), now),
                lease
                    .deadline()
                    .map(|d| format!(", hard deadline {}", relative(d, now)))
                    .unwrap_or_default()
            ),
        );
        row(
            "progress",
            format!(
                "{} (last moved {})",
                job.progress(),
                relative(job.progress_at(), now)
            ),
        );
    }
    if job.cancel_requested() {
        row(
            "cancel",
            "requested; the holder is told at its next heartbeat".into(),
        );
    }
    if let Some(e) = job.last_error() {
        row("last error", format!("<pre>{}</pre>", escape(e)));
    }
    for (k, v) in job.metadata() {
        row(
            &format!("metadata {k}"),
            format!(
                "<a href=\"{}/jobs?meta={}\">{}</a>",
                inner.base,
                url_component(&format!("{k}={v}")),
                escape(v)
            ),
        );
    }
    body.push_str(&t.finish(""));

    body.push_str("<p>");
    if !job.state().is_terminal() && !job.cancel_requested() {
        body.push_str(&inner.action_button(&format!("/jobs/{}/cancel", id.0), "Cancel"));
    }
    if matches!(job.state(), JobState::Dead | JobState::Cancelled) {
        body.push_str(&inner.action_button(&format!("/jobs/{}/retry", id.0), "Retry"));
    }
    body.push_str("</p>");

    body.push_str("<h2>Runs</h2>");
    body.push_str(&timeline::svg(&job, &history, now));
    if !history.is_empty() {
        body.push_str(
            "<p class=\"note\">Each attempt from its claim to its end (blue: running, its \
             lease dashed to its expiry; green: succeeded; red: failed or timed out; amber: \
             its lease was lost or it stalled; grey: given back, put off or cancelled). Gaps \
             are the job waiting.</p>",
        );
    }
    let mut t = Table::new(
        "runs",
        &[
            "attempt", "worker", "claimed", "ended", "ran for", "outcome", "progress",
        ],
    );
    for run in &history {
        t.row([
            run.attempt().0.to_string(),
            escape(run.worker()),
            relative(run.claimed_at(), now),
            run.ended_at()
                .map_or("running".into(), |e| relative(e, now)),
            duration(
                run.ended_at()
                    .unwrap_or(now)
                    .saturating_since(run.claimed_at()),
            ),
            run.outcome().map_or("–".into(), |o| {
                format!("<span class=\"outcome\">{}</span>", escape(&o.to_string()))
            }),
            run.progress().to_string(),
        ]);
    }
    body.push_str(&t.finish("Never claimed."));
    ok(inner.frame(&format!("Job {}", id.0), None).render(&body))
}

pub(crate) fn metrics(inner: &Inner, query: &[(String, String)]) -> PageResult {
    params::known(query, &[])?;
    let counted = inner.counts()?;
    let pools: Vec<_> = inner.pools.iter().map(|(n, s)| (n.clone(), s())).collect();
    let text = metrics::render(&metrics::Scrape {
        stats: &counted.reading.stats,
        timings: &counted.reading.timings,
        pools: &pools,
        writes: inner.write_metrics.as_ref().map(|m| m()),
        counts_age: counted.age,
    })
    .map_err(|_| WebError::Store(crate::Error::Internal("encoding the metrics")))?;
    Ok(crate::web::respond(
        StatusCode::OK,
        metrics::CONTENT_TYPE,
        text.into_bytes(),
    ))
}

pub(crate) fn login(inner: &Inner, refused: Option<&str>) -> Response {
    let mut body = String::new();
    if let Some(why) = refused {
        let _ = write!(body, "<p class=\"error\">{}</p>", escape(why));
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"{}/login\"><label>Token \
         <input type=\"password\" name=\"token\" autocomplete=\"current-password\"></label> \
         <button type=\"submit\">Sign in</button></form>",
        inner.base
    );
    let status = match refused {
        Some(_) => StatusCode::FORBIDDEN,
        None => StatusCode::OK,
    };
    crate::web::html(status, inner.frame("Sign in", None).render(&body))
}

/// The confirmation an action asks for before it changes anything.
pub(crate) fn confirm(
    inner: &Inner,
    action: &str,
    question: &str,
    yes: &str,
    back: &str,
) -> Response {
    let body = format!(
        "<p>{}</p><form method=\"post\" action=\"{}{action}\">{}\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <button type=\"submit\" id=\"confirm\">{}</button> <a href=\"{}{back}\">No, go back</a></form>",
        escape(question),
        inner.base,
        inner.secret_field(),
        escape(yes),
        inner.base
    );
    crate::web::html(
        StatusCode::OK,
        inner.frame("Are you sure?", None).render(&body),
    )
}

/// A refusal, as a page (or as text for a scraper).
pub(crate) fn error_page(inner: &Inner, request: &Request, e: &WebError) -> Response {
    let status = e.status();
    let scraper = request.uri().path().ends_with("/metrics");
    if matches!(e, WebError::Unauthorized) && !scraper {
        let mut r = login(inner, None);
        *r.status_mut() = status;
        return r;
    }
    if scraper {
        return crate::web::respond(
            status,
            "text/plain; charset=utf-8",
            format!("{e}\n").into_bytes(),
        );
    }
    let body = format!(
        "<p class=\"error\" id=\"error\">{}</p><p><a href=\"{}/\">Back to the overview</a></p>",
        escape(&e.to_string()),
        inner.base
    );
    let title = status.canonical_reason().unwrap_or("Error");
    crate::web::html(status, inner.frame(title, None).render(&body))
}
