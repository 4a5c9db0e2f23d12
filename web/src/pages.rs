//! The pages but the overview ([`super::overview`]): the job list, a job, `/metrics`, the
//! sign-in, the confirmations and the errors, and what every page shares (its frame, the
//! action buttons, the banner an action leaves). Each reads what it shows through
//! [`ReadJobs`](leasehold::ReadJobs) (never a write transaction) and renders it as plain HTML,
//! with no script: forms and links do the rest.

use std::collections::BTreeMap;
use std::fmt::Write;

use http::StatusCode;

use crate::html::{Frame, Table, duration, escape, relative, state_badge, url_component};
use crate::{Inner, PageResult, Request, Response, WebError, metrics, params, timeline};
use leasehold::HolderState;
use leasehold::JobState;
use leasehold::{InstanceId, JobId};

impl Inner {
    pub(super) fn frame<'a>(&'a self, title: &'a str, refresh: Option<u32>) -> Frame<'a> {
        let sign_out = self.access.needs_token().then(|| {
            format!(
                "<form class=\"inline\" method=\"post\" action=\"{}/logout\">{}\
                 <button type=\"submit\" id=\"sign-out\">Sign out</button></form>",
                self.base,
                self.secret_field()
            )
        });
        Frame {
            base: &self.base,
            title,
            store: &self.name,
            refresh,
            sign_out,
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

    pub(super) fn holders(&self) -> Result<BTreeMap<JobId, (InstanceId, HolderState)>, WebError> {
        Ok(match &self.holders {
            Some(read) => read()?
                .into_iter()
                .map(|(job, id, state)| (job, (id, state)))
                .collect(),
            None => BTreeMap::new(),
        })
    }
}

pub(super) fn ok(body: String) -> PageResult {
    Ok(crate::html(StatusCode::OK, body))
}

/// What an action that went through says on the page it returns to.
pub(super) fn done_banner(q: &BTreeMap<&str, &str>) -> String {
    let text = match q.get("did").copied() {
        Some("cancelled") => "Cancelled.",
        Some("cancel_requested") => {
            "Cancel requested: the job is running, and its holder is told at its next heartbeat."
        }
        Some("retried") => "Queued again with a fresh retry budget.",
        Some("promoted") => "Due now: a worker takes it as soon as one is free.",
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

pub(super) fn job_link(inner: &Inner, id: JobId) -> String {
    format!("<a href=\"{}/jobs/{}\">{}</a>", inner.base, id.0, id.0)
}

pub(crate) fn jobs(inner: &Inner, query: &[(String, String)]) -> PageResult {
    let listing = params::Listing::parse(query)?;
    if let Some(id) = listing.id {
        return crate::redirect(&format!("{}/jobs/{}", inner.base, id.0));
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
         {}<button type=\"submit\">Filter</button></form>",
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
        // (a group's listing stays one when the form filters it further)
        listing.group.map_or(String::new(), |g| format!(
            "<input type=\"hidden\" name=\"group\" value=\"{}\"> ",
            g.0
        )),
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

/// A link to a job's or a group's page.
fn target_link(inner: &Inner, target: leasehold::Target) -> String {
    match target {
        leasehold::Target::Job(id) => format!("<a href=\"{}/jobs/{id}\">job {id}</a>", inner.base),
        leasehold::Target::Group(g) => {
            format!("<a href=\"{}/groups/{}\">group {g}</a>", inner.base, g.0)
        }
        other => escape(&format!("{other:?}")),
    }
}

/// One group: sealed or open, its members' ends so far, how it ended, what waits for it.
pub(crate) fn group(inner: &Inner, id: leasehold::GroupId) -> PageResult {
    let store = &inner.reads;
    let Some(group) = store.group(id)? else {
        return Err(WebError::NotFound(format!("group {id}")));
    };
    let now = store.now()?;
    let (succeeded, dead, cancelled) = group.ended();
    let mut t = Table::new("group", &["", ""]);
    let mut row = |k: &str, v: String| t.row([escape(k), v]);
    row(
        "standing",
        match (group.outcome(), group.is_sealed()) {
            (Some(outcome), _) => format!("ended {}", state_badge(outcome)),
            (None, true) => "sealed: runs until every member has ended".into(),
            (None, false) => "open: members may still join".into(),
        },
    );
    row("opened", relative(group.created_at(), now));
    if let Some(at) = group.finished_at() {
        row("ended", relative(at, now));
    }
    row(
        "members",
        format!(
            "<a href=\"{}/jobs?group={}\">{}</a>",
            inner.base,
            id.0,
            group.members()
        ),
    );
    if let Some(parent) = group.parent() {
        row(
            "member of",
            target_link(inner, leasehold::Target::Group(parent)),
        );
    }
    for &sub in group.subgroups() {
        row(
            "group in it",
            target_link(inner, leasehold::Target::Group(sub)),
        );
    }
    row("succeeded", succeeded.to_string());
    row("dead", dead.to_string());
    row("cancelled", cancelled.to_string());
    row(
        "not ended",
        (group.members() - (succeeded + dead + cancelled)).to_string(),
    );
    for &w in group.waiters() {
        let state = store
            .job(w)?
            .map_or("purged".into(), |j| state_badge(j.state()));
        row(
            "waited for by",
            format!("{} {state}", target_link(inner, leasehold::Target::Job(w))),
        );
    }
    let body = t.finish("");
    ok(inner.frame(&format!("Group {id}"), None).render(&body))
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
    let checkpoint = store.checkpoint(id)?;
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
    if let Some(key) = job.limit_key() {
        row("limit key", escape(key));
    }
    if let Some(limit) = job.time_limit() {
        row("time limit", duration(limit));
    }
    if let Some(at) = job.expires_at() {
        row("expires", relative(at, now));
    }
    if let Some(policy) = job.retry_policy() {
        row("retry policy", escape(&policy.to_string()));
    }
    row("payload", format!("{payload} bytes"));
    if let Some(n) = output {
        row("output", format!("{n} bytes"));
    }
    if let Some(c) = checkpoint {
        row(
            "checkpoint",
            format!(
                "{} bytes, saved by attempt {} {}",
                c.data().len(),
                c.attempt().0,
                relative(c.saved_at(), now)
            ),
        );
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
    for need in job.needs() {
        let how = need.standing();
        let what = target_link(inner, need.on());
        row(
            "waits for",
            format!("{what} to end in {} ({how})", need.require()),
        );
    }
    if let Some(g) = job.group() {
        row("group", target_link(inner, leasehold::Target::Group(g)));
    }
    let waiters = store.waiters(id)?;
    if !waiters.is_empty() {
        let links: Vec<String> = (waiters.iter())
            .map(|w| target_link(inner, leasehold::Target::Job(*w)))
            .collect();
        row("waited for by", links.join(", "));
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
    if matches!(
        job.state(),
        JobState::Dead | JobState::Cancelled | JobState::Expired
    ) {
        body.push_str(&inner.action_button(&format!("/jobs/{}/retry", id.0), "Retry"));
    }
    if (job.state().is_waiting() || job.state() == JobState::Blocked) && job.run_at() > now {
        let path = format!("/jobs/{}/promote?attempt={}", id.0, job.attempt().0);
        body.push_str(&inner.action_button(&path, "Run now"));
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
    for log in store.logs(id)? {
        let _ = write!(body, "<h2>Log of attempt {}</h2>", log.attempt().0);
        if log.dropped() > 0 {
            let _ = write!(
                body,
                "<p class=\"note\">{} older lines dropped.</p>",
                log.dropped()
            );
        }
        let mut t = Table::new("log", &["written", "line"]);
        for (at, text) in log.lines() {
            t.row([relative(at, now), escape(text)]);
        }
        body.push_str(&t.finish("No line."));
    }
    ok(inner.frame(&format!("Job {}", id.0), None).render(&body))
}

pub(crate) fn metrics(inner: &Inner, query: &[(String, String)]) -> PageResult {
    params::known(query, &[])?;
    let counted = inner.counts()?;
    let pools: Vec<_> = inner.pools.iter().map(|(n, s)| (n.clone(), s())).collect();
    let schedules = inner.reads.schedules()?;
    let text = metrics::render(&metrics::Scrape {
        stats: &counted.reading.stats,
        timings: &counted.reading.timings,
        schedules: &schedules,
        pools: &pools,
        writes: inner.write_metrics.as_ref().map(|m| m()),
        counts_age: counted.age,
        wall: crate::clock::wall_now(),
        holders: inner.holders()?.into_values().collect(),
        unserved: &counted.reading.unserved,
    })
    .map_err(|_| WebError::Store(leasehold::Error::Internal("encoding the metrics")))?;
    Ok(crate::respond(
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
    crate::html(status, inner.frame("Sign in", None).render(&body))
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
    crate::html(
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
        return crate::respond(
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
    crate::html(status, inner.frame(title, None).render(&body))
}
