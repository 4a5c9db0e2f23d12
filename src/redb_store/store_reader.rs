//! A read-only view of a store that another process is writing: what the `leasehold` tool's
//! `stats`, `jobs`, `show`, `check` and `watch` use while the application runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::clock::{MonotonicClock, StoreClock};
use crate::error::Result;
use crate::ids::{InstanceId, JobId, StoreTime};
use crate::redb_store::open::{self, ReadView};
use crate::redb_store::reading;
use crate::redb_store::snapshots::Snapshots as _;

/// A read-only handle on a store file, beside the process that writes it.
///
/// The writer must have opened the store with [`Sharing::SingleWriter`](crate::Sharing) (the
/// default); each read sees the writer's latest commit. Store time is read from the file's
/// clock anchor and the host's monotonic clock, so it agrees with the writer's on one host.
pub struct StoreReader {
    db: ReadView,
    clock: StoreClock,
    path: PathBuf,
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader")
            .field("path", &self.path)
            .finish()
    }
}

/// What is known of the process holding a lease, where processes share a store (see
/// [`StoreReader::holders`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderState {
    /// Its process holds its instance lock.
    Alive,
    /// The lock of the file it registered is free: its process is gone, and the next
    /// process that notices (or opens the store) takes its leases back.
    Gone,
    /// Nothing proves either: it registered no lock file, or its file is missing, was
    /// replaced or cannot be read. Its leases expire.
    Unknown,
}

impl HolderState {
    /// The name the tool prints: `alive`, `gone` or `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            HolderState::Alive => "alive",
            HolderState::Gone => "gone",
            HolderState::Unknown => "unknown",
        }
    }

    /// What a look at the registered instance `id` finds (a lock found free is let go at
    /// once: taking its leases back is a writer's job).
    fn of(id: InstanceId, registration: &crate::redb_store::instance::Registration) -> HolderState {
        match crate::redb_store::instance::probe(id, registration) {
            crate::redb_store::instance::Liveness::Alive => HolderState::Alive,
            crate::redb_store::instance::Liveness::Dead(_) => HolderState::Gone,
            crate::redb_store::instance::Liveness::Unknown(_) => HolderState::Unknown,
        }
    }
}

impl StoreReader {
    /// Opens an existing store read-only. A missing file is an error (nothing is created).
    pub fn open(path: impl AsRef<Path>) -> Result<StoreReader> {
        let path = path.as_ref().to_owned();
        let db = open::open_read_only(&path)?;
        let timeline = reading::contained("the store's meta table", || {
            open::inspect(&db.begin_read()?, &path)
        })?;
        let (clock, _) = StoreClock::resume(
            Arc::new(MonotonicClock::new()),
            timeline.anchor,
            timeline.high_water,
        );
        Ok(StoreReader { db, clock, path })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `false` when the store's last writer did not close it (it was killed, or lost power)
    /// and no writer has opened it since. The reader then shows the last committed state,
    /// repaired in memory only: the file is not written, and no lease is taken back (the next
    /// writer takes back every running one). That view is a snapshot; open a new reader to
    /// follow a writer that starts later.
    pub fn closed_cleanly(&self) -> bool {
        matches!(self.db, ReadView::Live(_))
    }

    /// The store's current time.
    pub fn now(&self) -> StoreTime {
        self.clock.now()
    }

    /// A read snapshot of the whole file, for the application's own tables (written with
    /// [`Transaction::open_table`](crate::Transaction::open_table)), from a process that
    /// does not write the store.
    pub fn begin_read(&self) -> Result<redb::ReadTransaction> {
        Ok(self.db.begin_read()?)
    }

    /// How the store is shared: [`Sharing::MultiProcess`](crate::Sharing::MultiProcess) if
    /// the last writing open shared it between processes, else
    /// [`Sharing::SingleWriter`](crate::Sharing::SingleWriter). A writer that opens it
    /// beside running processes must use the same.
    pub fn sharing(&self) -> Result<crate::redb_store::Sharing> {
        Ok(
            match self.reading("the store's meta table", reading::shared_by_processes)? {
                true => crate::redb_store::Sharing::MultiProcess,
                false => crate::redb_store::Sharing::SingleWriter,
            },
        )
    }

    /// Which process instance holds each running job's lease, and what is known of that
    /// process, when processes share the store: alive (its instance lock is held), gone
    /// (the lock of the file it registered is free: the next process that notices, or opens
    /// the store, takes its leases back), or unknown (its lock file is missing or was
    /// replaced: its leases expire).
    pub fn holders(&self) -> Result<Vec<(JobId, InstanceId, HolderState)>> {
        let (holders, registered) = self.reading("the lease holders", |read| {
            Ok((reading::holders(read)?, reading::registrations(read)?))
        })?;
        // Each instance looked at once, however many leases it holds.
        let mut seen = std::collections::BTreeMap::new();
        Ok(holders
            .into_iter()
            .map(|(job, id)| {
                let state = *seen.entry(id).or_insert_with(|| {
                    match registered.iter().find(|(r, _)| *r == id) {
                        None => HolderState::Unknown,
                        Some((_, registration)) => HolderState::of(id, registration),
                    }
                });
                (job, id, state)
            })
            .collect())
    }

    /// The process id of the process that last opened the store for writing.
    pub fn writer_pid(&self) -> Result<Option<u32>> {
        self.reading("the writer's pid", reading::writer_pid)
    }
}

impl crate::redb_store::snapshots::Snapshots for StoreReader {
    fn snapshot(&self) -> Result<redb::ReadTransaction> {
        Ok(self.db.begin_read()?)
    }
    fn store_time(&self) -> StoreTime {
        self.now()
    }
}
