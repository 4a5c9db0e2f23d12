//! The page's actions: cancel or retry a job, pause or resume a queue, retry every dead job
//! of a queue. Each is a POST that
//! carries the page's form secret, asks for confirmation first (the first POST answers
//! with a question; only the confirming one changes anything), runs one of the store's own
//! operations, and answers a refusal with the store's typed error.

use crate::{Inner, PageResult, WebError, pages, params, redirect};
use leasehold::JobId;
use leasehold::JobState;

/// What can be done to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobAction {
    Cancel,
    Retry,
    /// Due now ([`leasehold::Edit::now`]), only if the job is still at the attempt the page
    /// showed.
    Promote,
}

impl JobAction {
    pub(crate) fn parse(name: &str) -> Result<JobAction, WebError> {
        match name {
            "cancel" => Ok(JobAction::Cancel),
            "retry" => Ok(JobAction::Retry),
            "promote" => Ok(JobAction::Promote),
            _ => Err(WebError::NotFound(format!("no job action {name:?}"))),
        }
    }
}

/// What can be done to a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueAction {
    Pause,
    Resume,
    /// Every dead job of the queue queued again ([`leasehold::JobStore::retry_all`]).
    RetryDead,
}

impl QueueAction {
    pub(crate) fn parse(name: &str) -> Result<QueueAction, WebError> {
        match name {
            "pause" => Ok(QueueAction::Pause),
            "resume" => Ok(QueueAction::Resume),
            "retry-dead" => Ok(QueueAction::RetryDead),
            _ => Err(WebError::NotFound(format!("no queue action {name:?}"))),
        }
    }
}

/// Checks the form secret; `Ok(true)` when the form confirms the action.
fn checked(inner: &Inner, form: &[(String, String)]) -> Result<bool, WebError> {
    let secret = params::field(form, "csrf")
        .map_err(|_| WebError::Forbidden("the form secret is missing"))?;
    if !inner.access.is_form_secret(secret) {
        return Err(WebError::Forbidden(
            "the form secret does not match (the page is stale, or another site sent this): reload the page",
        ));
    }
    match form.iter().find(|(k, _)| k == "confirm") {
        None => Ok(false),
        Some((_, v)) if v == "yes" => Ok(true),
        Some((_, v)) => Err(WebError::BadRequest(format!("confirm {v:?} is not yes"))),
    }
}

pub(crate) fn on_job(
    inner: &Inner,
    id: JobId,
    action: JobAction,
    query: &[(String, String)],
    form: &[(String, String)],
) -> PageResult {
    // A promote names the attempt the page showed (in the address, which the question
    // keeps): a job claimed since is not the one the operator meant.
    let seen = match action {
        JobAction::Promote => Some(params::attempt(params::field(query, "attempt")?)?),
        _ => None,
    };
    let path = match (action, seen) {
        (JobAction::Cancel, _) => format!("/jobs/{}/cancel", id.0),
        (JobAction::Retry, _) => format!("/jobs/{}/retry", id.0),
        (JobAction::Promote, seen) => {
            format!(
                "/jobs/{}/promote?attempt={}",
                id.0,
                seen.unwrap_or_default().0
            )
        }
    };
    if !checked(inner, form)? {
        let (question, yes) = match action {
            JobAction::Cancel => (
                format!(
                    "Cancel job {}? A waiting job is cancelled at once; a running one when its \
                     holder next renews its lease.",
                    id.0
                ),
                format!("Yes, cancel job {}", id.0),
            ),
            JobAction::Retry => (
                format!("Queue job {} again, with a fresh retry budget?", id.0),
                format!("Yes, retry job {}", id.0),
            ),
            JobAction::Promote => (
                format!(
                    "Run job {} now? It becomes due at once (a blocked job still waits for \
                     what it waits for); refused if it was claimed since this page showed it.",
                    id.0
                ),
                format!("Yes, run job {} now", id.0),
            ),
        };
        return Ok(pages::confirm(
            inner,
            &path,
            &question,
            &yes,
            &format!("/jobs/{}", id.0),
        ));
    }
    let store = inner.writer()?;
    let did = match action {
        JobAction::Cancel => match store.cancel(id)? {
            JobState::Running => "cancel_requested",
            _ => "cancelled",
        },
        JobAction::Retry => {
            store.retry(id)?;
            "retried"
        }
        JobAction::Promote => {
            let edit = leasehold::Edit::new().now();
            store.edit(id, edit.if_attempt(seen.unwrap_or_default()))?;
            "promoted"
        }
    };
    redirect(&format!("{}/jobs/{}?did={did}", inner.base, id.0))
}

pub(crate) fn on_queue(
    inner: &Inner,
    queue: &str,
    action: QueueAction,
    form: &[(String, String)],
) -> PageResult {
    let name = crate::html::url_component(queue);
    if !checked(inner, form)? {
        let (path, question, yes) = match action {
            QueueAction::Pause => (
                format!("/queues/{name}/pause"),
                format!(
                    "Pause queue {queue}? No claim takes its jobs until it is resumed; running \
                     jobs finish."
                ),
                format!("Yes, pause {queue}"),
            ),
            QueueAction::Resume => (
                format!("/queues/{name}/resume"),
                format!("Resume queue {queue}?"),
                format!("Yes, resume {queue}"),
            ),
            QueueAction::RetryDead => (
                format!("/queues/{name}/retry-dead"),
                format!(
                    "Queue every dead job of queue {queue} again, each with a fresh retry \
                     budget? They run again: their handlers must be safe to repeat."
                ),
                format!("Yes, retry the dead jobs of {queue}"),
            ),
        };
        return Ok(pages::confirm(inner, &path, &question, &yes, "/"));
    }
    let store = inner.writer()?;
    let did = match action {
        QueueAction::Pause => {
            store.pause_queue(queue)?;
            "paused"
        }
        QueueAction::Resume => {
            store.resume_queue(queue)?;
            "resumed"
        }
        QueueAction::RetryDead => {
            let report = store.retry_all(&leasehold::JobFilter {
                queue: Some(queue.to_owned()),
                state: Some(JobState::Dead),
                ..leasehold::JobFilter::default()
            })?;
            return redirect(&format!(
                "{}/?did=retried_dead&n={}&refused={}&refresh=0",
                inner.base,
                report.changed,
                report.refused.len()
            ));
        }
    };
    redirect(&format!("{}/?did={did}&refresh=0", inner.base))
}

/// A login: the token given in the form, answered with the cookie that carries it.
pub(crate) fn login(inner: &Inner, form: &[(String, String)]) -> PageResult {
    if !inner.access.needs_token() {
        return redirect(&format!("{}/", inner.base));
    }
    let given = params::field(form, "token").unwrap_or("");
    let Some(session) = inner.access.sign_in(given) else {
        return Ok(pages::login(inner, Some("That is not the token.")));
    };
    let mut r = redirect(&format!("{}/", inner.base))?;
    set_cookie(inner, &mut r, &session, "")?;
    Ok(r)
}

/// Signs out: the session ends here, and the browser forgets its cookie.
pub(crate) fn logout(
    inner: &Inner,
    headers: &http::HeaderMap,
    form: &[(String, String)],
) -> PageResult {
    // (the form secret is checked; signing out asks no confirmation)
    checked(inner, form)?;
    inner.access.sign_out(headers);
    let mut r = redirect(&format!("{}/login", inner.base))?;
    set_cookie(inner, &mut r, "", "; Max-Age=0")?;
    Ok(r)
}

/// Sets the session cookie to `value` on `r`, scoped to the page's path.
fn set_cookie(
    inner: &Inner,
    r: &mut crate::Response,
    value: &str,
    extra: &str,
) -> Result<(), WebError> {
    let path = if inner.base.is_empty() {
        "/"
    } else {
        inner.base.as_str()
    };
    let secure = if inner.access.secure { "; Secure" } else { "" };
    let cookie = format!(
        "{}={value}; HttpOnly; SameSite=Strict; Path={path}{secure}{extra}",
        crate::access::COOKIE
    );
    let value = http::HeaderValue::from_str(&cookie)
        .map_err(|_| WebError::BadRequest("the session cannot be set as a cookie".into()))?;
    r.headers_mut().insert(http::header::SET_COOKIE, value);
    Ok(())
}
