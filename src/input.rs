//! Checks on arguments, applied before a transaction changes anything: one rule for both
//! engines, so an input refused on one is refused, with the same error, on the other.
//!
//! Every string that reaches a stored text (a queue name, a unique key, a worker id) is
//! refused if it holds a NUL byte: PostgreSQL's text cannot store one, and a name that
//! works on one engine and not on the other is a trap. An error message is not refused but
//! cleaned ([`error_message`]), since a failing job must always be able to say that it failed.

use crate::error::InputError;
use crate::new_job::NewJob;

/// Limits on inputs, which keep index keys short and records bounded (on both engines).
pub(crate) mod limits {
    pub const MAX_QUEUE_NAME: usize = 128;
    pub const MAX_UNIQUE_KEY: usize = 256;
    pub const MAX_WORKER_ID: usize = 256;
    /// Error messages longer than this are truncated (an error is evidence, not payload).
    pub const MAX_ERROR_MESSAGE: usize = 16 * 1024;
    pub const MAX_METADATA_KEY: usize = 64;
    pub const MAX_METADATA_VALUE: usize = 256;
    pub const MAX_METADATA_PAIRS: usize = 16;
}

/// The checks of a new job, before anything is written: its queue, payload size, retry
/// budget and unique key.
pub(crate) fn check_new_job(new: &NewJob, max_payload: usize) -> Result<(), InputError> {
    check_queue(&new.queue)?;
    check_size("payload", new.payload.len(), max_payload)?;
    if new.max_attempts == Some(0) {
        return Err(InputError::ZeroMaxAttempts);
    }
    match &new.unique_key {
        Some(key) => check_unique_key(key)?,
        None if new.uniqueness != crate::job::Uniqueness::WhileUnfinished => {
            return Err(InputError::WindowWithoutKey);
        }
        None => {}
    }
    if new.time_limit.is_some_and(|d| d.is_zero()) {
        return Err(InputError::ZeroTimeLimit);
    }
    if let Some(expires) = new.expiry() {
        let due = new.wait();
        if !due.is_zero() && expires <= due {
            return Err(InputError::ExpiresBeforeDue { due, expires });
        }
    }
    if let Some(policy) = &new.retry {
        policy.check().map_err(InputError::RetryPolicy)?;
    }
    if let Some(key) = &new.limit_key {
        let bad = |len, max| InputError::BadLimitKey { len, max };
        check_bounded("limit key", key, limits::MAX_UNIQUE_KEY, bad)?;
    }
    if new.needs.len() > crate::workflow::MAX_DEPENDENCIES {
        return Err(InputError::TooManyDependencies {
            given: new.needs.len(),
            max: crate::workflow::MAX_DEPENDENCIES,
        });
    }
    if new.group.is_some() && new.unique_key.is_some() {
        return Err(InputError::MemberWithUniqueKey);
    }
    check_metadata(&new.metadata)
}

/// A schedule as declared: its name, its job, its timing.
pub(crate) fn check_schedule(
    s: &crate::schedule::Schedule,
    max_payload: usize,
) -> Result<(), InputError> {
    check_no_nul("schedule name", &s.name)?;
    if s.name.is_empty() || s.name.len() > limits::MAX_QUEUE_NAME {
        return Err(InputError::BadScheduleName {
            len: s.name.len(),
            max: limits::MAX_QUEUE_NAME,
        });
    }
    check_new_job(&s.job, max_payload)?;
    if s.job.unique_key.is_some() || s.job.uniqueness != crate::job::Uniqueness::WhileUnfinished {
        return Err(InputError::ScheduleJobOption(
            "a unique key of its own (each tick's job is kept unique by its tick)",
        ));
    }
    if !s.job.delay.is_zero() || s.job.at.is_some() {
        return Err(InputError::ScheduleJobOption(
            "a delay or a run time (each tick's job is due at its tick)",
        ));
    }
    if let Some(crate::new_job::Expiry::At(_)) = s.job.expires {
        return Err(InputError::ScheduleJobOption(
            "an expiry at a wall-clock time (each tick's job expires `expires_in` after its tick)",
        ));
    }
    if s.job
        .metadata
        .iter()
        .any(|(k, _)| k == crate::schedule::SCHEDULE_KEY)
    {
        return Err(InputError::ScheduleJobOption(
            "the metadata key \"schedule\" (each tick's job carries its schedule's name there)",
        ));
    }
    // Checked as its ticks' jobs will be (the schedule's pair added, the tick's unique key
    // at its longest), so that no tick can be refused at firing.
    let mut tick =
        crate::schedule::JobTemplate::of(&s.job).job(&s.name, crate::schedule::Tick::LONGEST);
    tick.retry = s.job.retry.clone();
    tick.expires = s.job.expires;
    check_new_job(&tick, max_payload)?;
    match &s.when {
        crate::schedule::When::Every(d) if d.is_zero() => Err(InputError::ZeroInterval),
        crate::schedule::When::Every(d) if *d < crate::schedule::MIN_INTERVAL => {
            Err(InputError::IntervalTooShort {
                every: *d,
                min: crate::schedule::MIN_INTERVAL,
            })
        }
        crate::schedule::When::Every(_) => Ok(()),
        crate::schedule::When::Cron { expr, zone } => {
            check_no_nul("cron expression", expr)?;
            check_no_nul("time zone", zone)?;
            crate::schedule::cron::check(expr, zone)
        }
    }
}

/// A queue's limits: a concurrency of at least one (none at all is a pause), a rate of 1 to
/// [`crate::queue::MAX_RATE_CLAIMS`] claims in a period longer than zero.
pub(crate) fn check_limits(limits: &crate::queue::QueueLimits) -> Result<(), InputError> {
    if limits.concurrency == Some(0) || limits.per_key == Some(0) {
        return Err(InputError::ZeroConcurrency);
    }
    for rate in [limits.rate, limits.per_key_rate].into_iter().flatten() {
        if rate.claims == 0 || rate.claims > crate::queue::MAX_RATE_CLAIMS || rate.per.is_zero() {
            return Err(InputError::BadRate {
                claims: rate.claims,
                per: rate.per,
                max: crate::queue::MAX_RATE_CLAIMS,
            });
        }
    }
    Ok(())
}

/// Metadata: a few short tags, each key a name a filter can say (`key=value`).
pub(crate) fn check_metadata(pairs: &[(String, String)]) -> Result<(), InputError> {
    if pairs.len() > limits::MAX_METADATA_PAIRS {
        return Err(InputError::TooMuchMetadata {
            count: pairs.len(),
            max: limits::MAX_METADATA_PAIRS,
        });
    }
    pairs
        .iter()
        .try_for_each(|(key, value)| check_metadata_pair(key, value))
}

/// One metadata pair: a key of 1 to [`limits::MAX_METADATA_KEY`] bytes without `=` (so that
/// `key=value` names one pair), a value of at most [`limits::MAX_METADATA_VALUE`], no NUL.
pub(crate) fn check_metadata_pair(key: &str, value: &str) -> Result<(), InputError> {
    check_no_nul("metadata key", key)?;
    check_no_nul("metadata value", value)?;
    if key.is_empty() || key.len() > limits::MAX_METADATA_KEY || key.contains('=') {
        return Err(InputError::BadMetadataKey {
            key: key.to_owned(),
            max: limits::MAX_METADATA_KEY,
        });
    }
    if value.len() > limits::MAX_METADATA_VALUE {
        return Err(InputError::MetadataValueTooLong {
            key: key.to_owned(),
            len: value.len(),
            max: limits::MAX_METADATA_VALUE,
        });
    }
    Ok(())
}

/// The checks of a claim: the queue's name, the worker's id, the lease's terms.
pub(crate) fn check_claim(
    queue: &str,
    worker: &str,
    terms: &crate::lease::LeaseTerms,
) -> Result<(), crate::error::Error> {
    check_queue(queue)?;
    check_worker(worker)?;
    crate::config::check_terms(terms)?;
    Ok(())
}

/// Refuses a NUL byte in `value`, the `what` of an input.
fn check_no_nul(what: &'static str, value: &str) -> Result<(), InputError> {
    match value.find('\0') {
        Some(at) => Err(InputError::NulByte { what, at }),
        None => Ok(()),
    }
}

pub(crate) fn check_queue(queue: &str) -> Result<(), InputError> {
    check_no_nul("queue name", queue)?;
    if queue.is_empty() {
        return Err(InputError::EmptyQueueName);
    }
    if queue.len() > limits::MAX_QUEUE_NAME {
        return Err(InputError::QueueNameTooLong {
            len: queue.len(),
            max: limits::MAX_QUEUE_NAME,
        });
    }
    Ok(())
}

pub(crate) fn check_worker(worker: &str) -> Result<(), InputError> {
    let bad = |len, max| InputError::BadWorkerId { len, max };
    check_bounded("worker id", worker, limits::MAX_WORKER_ID, bad)
}

pub(crate) fn check_group_key(key: &str) -> Result<(), InputError> {
    let bad = |len, max| InputError::BadGroupKey { len, max };
    check_bounded("group key", key, limits::MAX_UNIQUE_KEY, bad)
}

pub(crate) fn check_unique_key(key: &str) -> Result<(), InputError> {
    let bad = |len, max| InputError::BadUniqueKey { len, max };
    check_bounded("unique key", key, limits::MAX_UNIQUE_KEY, bad)
}

/// `text` has no NUL byte and between 1 and `max` bytes; else `bad(len, max)`.
fn check_bounded(
    what: &'static str,
    text: &str,
    max: usize,
    bad: fn(usize, usize) -> InputError,
) -> Result<(), InputError> {
    check_no_nul(what, text)?;
    if text.is_empty() || text.len() > max {
        return Err(bad(text.len(), max));
    }
    Ok(())
}

pub(crate) fn check_size(what: &'static str, len: usize, max: usize) -> Result<(), InputError> {
    if len > max {
        return Err(InputError::TooLarge { what, len, max });
    }
    Ok(())
}

/// A failure's message as it is stored. Error messages are evidence, not payload: a long
/// one is cut (at a character boundary) and a NUL byte is written as the two characters
/// `\0`, rather than refused, so that a failing job can always record that it failed, on
/// either engine.
pub(crate) fn error_message(message: &str) -> String {
    let message = match message.contains('\0') {
        true => std::borrow::Cow::Owned(message.replace('\0', "\\0")),
        false => std::borrow::Cow::Borrowed(message),
    };
    if message.len() <= limits::MAX_ERROR_MESSAGE {
        return message.into_owned();
    }
    let mut end = limits::MAX_ERROR_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &message[..end], message.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_byte_in_any_stored_name_is_refused_with_where_it_is() {
        assert_eq!(
            check_queue("a\0b"),
            Err(InputError::NulByte {
                what: "queue name",
                at: 1
            })
        );
        assert!(matches!(
            check_worker("\0"),
            Err(InputError::NulByte {
                what: "worker id",
                at: 0
            })
        ));
        assert!(matches!(
            check_unique_key("k\0"),
            Err(InputError::NulByte {
                what: "unique key",
                at: 1
            })
        ));
        assert_eq!(check_queue("plain"), Ok(()));
    }

    #[test]
    fn an_error_message_keeps_its_nul_bytes_visible_and_is_cut_when_long() {
        assert_eq!(
            error_message("bad byte \0 in input"),
            "bad byte \\0 in input"
        );
        let long = "\0".repeat(limits::MAX_ERROR_MESSAGE);
        let stored = error_message(&long);
        assert!(!stored.contains('\0'));
        assert!(
            stored.len() < limits::MAX_ERROR_MESSAGE + 64,
            "{}",
            stored.len()
        );
        assert!(stored.ends_with("bytes cut)"), "{stored}");
    }
}
