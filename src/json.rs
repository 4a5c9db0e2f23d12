//! Typed payloads and outputs, encoded as JSON (the `serde` feature), so that applications
//! stop hand-encoding them. Bytes stay the core: these are conveniences over
//! [`NewJob::new`], [`Lease::payload`], [`JobContext::payload`] and [`Output::new`], and a job
//! enqueued as JSON is an ordinary job to every other part of leasehold (the tool shows its
//! payload as text).
//!
//! JSON rather than a binary format because a payload outlives the build that wrote it: a job
//! enqueued by one release is often run by the next, and JSON lets a field be added with
//! `#[serde(default)]` without a migration, and lets an operator read a payload in
//! `leasehold show`.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{InputError, Result};
use crate::lease::Lease;
use crate::new_job::NewJob;
use crate::pool::{JobContext, JobError, Output};

impl NewJob {
    /// A job for `queue` whose payload is `value` as JSON; otherwise as [`NewJob::new`].
    pub fn json<T: Serialize + ?Sized>(queue: impl Into<String>, value: &T) -> Result<NewJob> {
        Ok(NewJob::new(queue, to_json(value)?))
    }
}

impl Lease {
    /// The payload decoded from JSON (for claim loops; a pool's handler has
    /// [`JobContext::json`]).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.payload).map_err(|e| InputError::Json(e.to_string()).into())
    }
}

impl JobContext {
    /// The payload decoded from JSON. A payload that is not the JSON of a `T` fails the
    /// attempt with `?`, naming `T`, and permanently ([`JobError::permanent`]): this build
    /// would read it the same way every time, so the job is dead at once rather than spend
    /// its budget. Once a build that reads it runs, an operator's `retry` brings it back.
    pub fn json<T: DeserializeOwned>(&self) -> std::result::Result<T, JobError> {
        serde_json::from_slice(self.payload()).map_err(|e| {
            JobError::permanent(format!(
                "payload is not the JSON of {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }
}

impl<W> Output<W> {
    /// Output bytes that are `value` as JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> std::result::Result<Output<W>, JobError> {
        Ok(Output::new(to_json(value)?))
    }
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> std::result::Result<Vec<u8>, InputError> {
    serde_json::to_vec(value).map_err(|e| InputError::Json(e.to_string()))
}
