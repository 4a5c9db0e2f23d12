//! The ends a store keeps in the order they committed: every job that came to an end
//! (succeeded, dead, cancelled, expired) and every group that ended, by any process of a
//! shared file and any machine of a database, read from a cursor that outlives the reader
//! ([`crate::ReadJobs::endings`]).
//!
//! Events ([`crate::Event`]) are a handle's own commits, told at once and lost with the
//! process; an ending is written in the transaction of the end itself, so a reader that
//! keeps its cursor (a web process waiting for "batch 42", a service mirroring ends to its
//! own database) reads every end after it, from any process, after any crash of its own or
//! of the writer. What a reader cannot get back is what retention purged before it read:
//! endings go with the purge of the jobs that ended as long ago, and a page after a cursor
//! older than the last purged ending says so ([`Endings::gap`]).
//!
//! The order is the order of commit on redb (one writer at a time, each ending numbered in
//! its transaction) and in memory. On PostgreSQL, where transactions commit side by side,
//! it is the order of their transaction ids, and an ending is read only once every
//! transaction older than it has finished (the snapshot's horizon), so that none is passed
//! over: a transaction left open anywhere on the server holds every later ending back until
//! it ends.

use std::fmt;
use std::str::FromStr;

use bincode::{Decode, Encode};

use crate::ids::{GroupId, JobId, StoreTime};
use crate::state::JobState;

/// Where a reader of a store's endings stands: after the ending it names, or at the start
/// ([`EndCursor::START`]). Kept as text (`Display`, `FromStr`) by a reader that must carry
/// on where it stopped.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndCursor {
    /// The transaction (PostgreSQL: its id; 0 elsewhere).
    pub(crate) tx: u64,
    /// The ending's number.
    pub(crate) seq: u64,
}

impl EndCursor {
    /// Before the first ending the store keeps.
    pub const START: EndCursor = EndCursor { tx: 0, seq: 0 };

    /// From a database's columns (never negative: a transaction id and an identity).
    #[cfg(feature = "postgres")]
    pub(crate) fn from_parts(tx: i64, seq: i64) -> EndCursor {
        EndCursor {
            tx: u64::try_from(tx).unwrap_or(0),
            seq: u64::try_from(seq).unwrap_or(0),
        }
    }
}

impl fmt::Display for EndCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tx, self.seq)
    }
}

impl FromStr for EndCursor {
    type Err = crate::error::InputError;

    /// `TX.SEQ`, as [`EndCursor`]'s `Display` writes it.
    fn from_str(s: &str) -> Result<EndCursor, Self::Err> {
        let bad = || crate::error::InputError::BadEndCursor(s.to_owned());
        let (tx, seq) = s.split_once('.').ok_or_else(bad)?;
        Ok(EndCursor {
            tx: tx.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// What ended.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[non_exhaustive]
pub enum EndOf {
    /// A job, of this queue.
    Job {
        /// The job.
        id: JobId,
        /// Its queue.
        queue: String,
    },
    /// A group.
    Group(GroupId),
}

/// One ending, as kept.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ending {
    /// Where a reader stands after reading it.
    pub cursor: EndCursor,
    /// What ended.
    pub of: EndOf,
    /// How: a job's terminal state, or a group's outcome ([`crate::Group::outcome`]).
    pub state: JobState,
    /// When, on the store clock.
    pub at: StoreTime,
}

/// A page of endings ([`crate::ReadJobs::endings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Endings {
    /// The endings after the cursor asked for, oldest first.
    pub list: Vec<Ending>,
    /// Where to read on from: the last ending's cursor, or the one asked for if none.
    pub next: EndCursor,
    /// Some endings after the cursor asked for were purged before they were read (their
    /// jobs outlived the retention): what was missed is gone.
    pub gap: bool,
    /// Endings committed after the cursor were held back behind a transaction still open
    /// (PostgreSQL only: see docs/events.md): they are read once it ends, so read again
    /// soon.
    pub held_back: bool,
}

/// An ending as an engine writes it (its cursor is where it is written).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct EndRecord {
    pub of: EndOf,
    pub state: JobState,
    pub at: StoreTime,
}

impl EndRecord {
    /// The ending at `cursor`.
    pub(crate) fn ending_at(self, cursor: EndCursor) -> Ending {
        Ending {
            cursor,
            of: self.of,
            state: self.state,
            at: self.at,
        }
    }
}

/// A page of `list`, read after `after`, and whether a purge took endings after it.
pub(crate) fn page(after: EndCursor, list: Vec<Ending>, trimmed: EndCursor) -> Endings {
    Endings {
        next: list.last().map_or(after, |e| e.cursor),
        gap: after < trimmed,
        held_back: false,
        list,
    }
}
