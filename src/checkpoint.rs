//! Plain data: the checkpoint an attempt of a job saved, for the next attempt to resume
//! from ([`crate::JobContext::save_checkpoint`], [`crate::JobContext::last_checkpoint`]).
//!
//! A job killed at 90 % would otherwise start again from 0 %: its lease tells the store the
//! attempt died, not how far it got. A checkpoint is the application's own bytes (a cursor,
//! an offset, the last item done), saved under the attempt's fence like every write of an
//! attempt: a holder whose lease was taken back cannot overwrite what the job's current
//! attempt saved. One per job, the last one saved; kept with the job until it is purged.

use bincode::{Decode, Encode};

use crate::ids::{Attempt, StoreTime};

/// A checkpoint as stored.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct CheckpointRecord {
    /// The attempt that saved it.
    pub attempt: Attempt,
    /// When, on the store clock.
    pub saved_at: StoreTime,
    /// The application's bytes.
    pub data: Vec<u8>,
}

/// The last checkpoint saved for a job ([`crate::ReadJobs::checkpoint`]): the bytes an
/// attempt saved, which attempt saved them and when.
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint(pub(crate) CheckpointRecord);

impl Checkpoint {
    /// The attempt that saved it: this attempt's own, or one before it.
    pub fn attempt(&self) -> Attempt {
        self.0.attempt
    }

    /// When it was saved, on the store clock.
    pub fn saved_at(&self) -> StoreTime {
        self.0.saved_at
    }

    /// The bytes saved.
    pub fn data(&self) -> &[u8] {
        &self.0.data
    }

    /// The bytes saved, taken.
    pub fn into_data(self) -> Vec<u8> {
        self.0.data
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("attempt", &self.0.attempt)
            .field("saved_at", &self.0.saved_at)
            .field("bytes", &self.0.data.len())
            .finish()
    }
}
