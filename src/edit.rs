//! Plain data: an operator's change to a job that waits (BullMQ's `updateData`,
//! `changeDelay`, `promote`), made with [`crate::JobStore::edit`]. What it may touch is the
//! rule book's ([`crate::rules::edit`]): a job that waits (queued, backing off, or blocked on
//! its dependencies), never one that runs or has ended.

use std::time::{Duration, SystemTime};

use crate::ids::Attempt;

/// When an edited job becomes due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Now ("promote": a delayed or backing-off job runs as soon as a worker is free).
    Now,
    /// This long from the edit, on the store's clock.
    In(Duration),
    /// At this wall-clock time, converted to store time at the edit as
    /// [`crate::NewJob::run_at`] is.
    At(SystemTime),
}

/// Changes to a waiting job. Each part given replaces the job's; the rest stays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edit {
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) priority: Option<i32>,
    pub(crate) due: Option<Due>,
    /// Metadata pairs to set (`Some`) or remove (`None`), in order.
    pub(crate) metadata: Vec<(String, Option<String>)>,
    pub(crate) if_attempt: Option<Attempt>,
}

impl Edit {
    /// An edit that changes nothing yet.
    pub fn new() -> Edit {
        Edit::default()
    }

    /// A new payload (within the store's payload limit).
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Edit {
        self.payload = Some(payload.into());
        self
    }

    /// A new priority (lower runs first).
    pub fn priority(mut self, priority: i32) -> Edit {
        self.priority = Some(priority);
        self
    }

    /// Due now: a delayed or backing-off job is claimable at once ("promote"). A blocked job
    /// still waits for its dependencies.
    pub fn now(mut self) -> Edit {
        self.due = Some(Due::Now);
        self
    }

    /// Due `delay` from the edit, on the store's clock.
    pub fn delay(mut self, delay: Duration) -> Edit {
        self.due = Some(Due::In(delay));
        self
    }

    /// Due at `when`, a wall-clock time, converted to store time at the edit (see
    /// [`crate::NewJob::run_at`]); a time already past is now.
    pub fn run_at(mut self, when: SystemTime) -> Edit {
        self.due = Some(Due::At(when));
        self
    }

    /// Sets metadata `key` to `value` (checked as at enqueue).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Edit {
        self.metadata.push((key.into(), Some(value.into())));
        self
    }

    /// Removes metadata `key`, if the job has it.
    pub fn remove_metadata(mut self, key: impl Into<String>) -> Edit {
        self.metadata.push((key.into(), None));
        self
    }

    /// Only if the job is still at `attempt` (as the caller last saw it): a job claimed since,
    /// even one that failed and waits again, is left as it is and the edit refused
    /// ([`crate::Error::EditConflict`]).
    pub fn if_attempt(mut self, attempt: Attempt) -> Edit {
        self.if_attempt = Some(attempt);
        self
    }

    /// How long from now the job is due, if the edit moves it (a wall-clock time read now).
    pub(crate) fn wait(&self) -> Option<Duration> {
        Some(match self.due? {
            Due::Now => Duration::ZERO,
            Due::In(d) => d,
            Due::At(when) => when
                .duration_since(crate::clock::wall_now())
                .unwrap_or_default(),
        })
    }
}
