//! How far each lease of a pool got: a table each process keeps beside the store, so that
//! whoever takes back a dead process's leases can tell a job that was in its handler when
//! the process died (its attempt spends budget: it may be the job that killed the process)
//! from one it only held ahead ([`crate::Outcome::NeverStarted`]) and one whose handler had
//! returned, its result not yet committed ([`crate::Outcome::ResultLost`]): both go back to
//! their place with no budget spent.
//!
//! The table is a file of sixteen-byte slots (the stage, the attempt, the job), mapped into
//! the process (`MAP_SHARED`): a pool's claim fills a slot per lease, the start of a handler
//! and its return each set one byte, the end of the attempt frees the slot. A store to a
//! shared mapping is in the kernel's page cache the moment it is made, with no system call,
//! so a process that aborts, is killed or runs out of memory leaves its table as it was,
//! which is the death this table is for. A machine that loses power may lose its last stores,
//! and a job they name then counts one stage back: a start lost makes a started job count as
//! held ahead (no budget spent; the fence is untouched, its holder being dead either way).
//!
//! A lease the table does not name (claimed by the application's own loop, not a pool), and
//! every lease where there is no table or it cannot be read (an older build's process, a
//! store without a path), counts as in its handler: charged, as before the table existed.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ids::{Attempt, JobId};
use crate::protocol::{Stage, Stages};

/// One slot: the stage (`FREE`, `CLAIMED`, `STARTED`, `RETURNED`), three bytes unused, the
/// attempt and the job, little-endian.
const SLOT: usize = 16;
const FREE: u8 = 0;
const STARTED: u8 = 1;
const RETURNED: u8 = 2;
const CLAIMED: u8 = 3;

/// The slots a new table has; it doubles when they are all taken.
const FIRST_SLOTS: usize = 1024;

/// This process's table (see the module's documentation).
#[derive(Debug)]
pub(crate) struct StartedTable {
    path: PathBuf,
    table: Mutex<Option<Table>>,
}

#[derive(Debug)]
struct Table {
    file: File,
    map: Mapping,
    /// Which slot each attempt this process holds is in.
    slots: HashMap<(JobId, Attempt), usize>,
    free: Vec<usize>,
}

/// A file mapped read-write and shared: stores to it are the file's.
#[derive(Debug)]
struct Mapping {
    at: std::ptr::NonNull<u8>,
    len: usize,
}

// The mapping is only touched under the table's mutex.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
        file.set_len(len as u64)?;
        // SAFETY: a fresh shared mapping of `len` bytes of a file this process opened
        // read-write and sized to `len`; it is unmapped once, on drop.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        match std::ptr::NonNull::new(at.cast::<u8>()).filter(|_| at != libc::MAP_FAILED) {
            Some(at) => Ok(Mapping { at, len }),
            None => Err(std::io::Error::last_os_error()),
        }
    }

    fn slot(&mut self, slot: usize) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes long and lives as long as `self`; callers pass
        // slots below `len / SLOT`, and `&mut self` makes the borrow unique.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.at.as_ptr(), self.len) };
        &mut bytes[slot * SLOT..(slot + 1) * SLOT]
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, once.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}

impl Table {
    fn create(path: &Path) -> std::io::Result<Table> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        let map = Mapping::new(&file, FIRST_SLOTS * SLOT)?;
        Ok(Table {
            file,
            map,
            slots: HashMap::new(),
            free: (0..FIRST_SLOTS).rev().collect(),
        })
    }

    /// A free slot, the table doubled if none is left.
    fn take(&mut self) -> std::io::Result<usize> {
        if let Some(slot) = self.free.pop() {
            return Ok(slot);
        }
        let (old, new) = (self.map.len / SLOT, 2 * self.map.len / SLOT);
        self.map = Mapping::new(&self.file, new * SLOT)?;
        self.free.extend((old + 1..new).rev());
        Ok(old)
    }

    fn fill(&mut self, job: JobId, attempt: Attempt) -> std::io::Result<()> {
        let slot = match self.slots.get(&(job, attempt)) {
            Some(&slot) => slot,
            None => self.take()?,
        };
        self.slots.insert((job, attempt), slot);
        let bytes = self.map.slot(slot);
        bytes[4..8].copy_from_slice(&attempt.0.to_le_bytes());
        bytes[8..].copy_from_slice(&job.0.to_le_bytes());
        // The stage last: a slot is read only once its stage says it is taken.
        bytes[0] = CLAIMED;
        Ok(())
    }

    fn mark(&mut self, job: JobId, attempt: Attempt, stage: u8) {
        if let Some(&slot) = self.slots.get(&(job, attempt)) {
            self.map.slot(slot)[0] = stage;
        }
    }

    fn clear(&mut self, job: JobId, attempt: Attempt) {
        if let Some(slot) = self.slots.remove(&(job, attempt)) {
            self.map.slot(slot)[0] = FREE;
            self.free.push(slot);
        }
    }
}

impl StartedTable {
    /// A new, empty table at `path` (one left by a dead process there is replaced: read it
    /// first). A table that cannot be made is a warning, not a failure: the store runs as it
    /// did before the table existed.
    pub(crate) fn create(path: PathBuf) -> StartedTable {
        let table = Table::create(&path)
            .inspect_err(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot keep the table of started jobs: a dead process's jobs will all count as started")
            })
            .ok();
        StartedTable {
            path,
            table: Mutex::new(table),
        }
    }

    /// Notes that a pool claimed these attempts to hand to its handlers.
    pub(crate) fn claimed(&self, attempts: impl Iterator<Item = (JobId, Attempt)>) {
        let mut guard = self.table.lock();
        let Some(table) = guard.as_mut() else { return };
        for (job, attempt) in attempts {
            if let Err(e) = table.fill(job, attempt) {
                tracing::warn!(error = %e, "growing the table of started jobs failed");
                *guard = None;
                return;
            }
        }
    }

    /// Notes that a handler is about to start `job`'s `attempt`: in the kernel when this
    /// returns.
    pub(crate) fn started(&self, job: JobId, attempt: Attempt) {
        if let Some(table) = self.table.lock().as_mut() {
            table.mark(job, attempt, STARTED);
        }
    }

    /// Notes that the handler of `job`'s `attempt` returned, and no code of the
    /// application's runs for it any more.
    pub(crate) fn returned(&self, job: JobId, attempt: Attempt) {
        if let Some(table) = self.table.lock().as_mut() {
            table.mark(job, attempt, RETURNED);
        }
    }

    /// Notes that `job`'s `attempt` ended: its slot is free again.
    pub(crate) fn ended(&self, job: JobId, attempt: Attempt) {
        if let Some(table) = self.table.lock().as_mut() {
            table.clear(job, attempt);
        }
    }

    /// Removes the table: its process gave back every lease it held.
    pub(crate) fn remove(&self) {
        *self.table.lock() = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the table at `path` says a dead process's attempts got to; unknown if there is none
/// or it cannot be read.
pub(crate) fn read(path: &Path) -> Stages {
    let Ok(bytes) = std::fs::read(path) else {
        return Stages::default();
    };
    let mut stages = HashMap::new();
    for slot in bytes.chunks_exact(SLOT) {
        let stage = match slot[0] {
            FREE => continue,
            CLAIMED => Stage::NotStarted,
            STARTED => Stage::InHandler,
            RETURNED => Stage::Returned,
            // Not a slot this build writes: the table says nothing then.
            _ => return Stages::default(),
        };
        let attempt = Attempt(u32::from_le_bytes(
            slot[4..8].try_into().unwrap_or_default(),
        ));
        let job = JobId(u64::from_le_bytes(slot[8..].try_into().unwrap_or_default()));
        stages.insert((job, attempt), stage);
    }
    Stages(Some(Arc::new(stages)))
}

/// What the tables at `paths` say of their dead processes' attempts, together; unknown if any
/// them is.
pub(crate) fn read_all(paths: impl Iterator<Item = PathBuf>) -> Stages {
    let mut all = HashMap::new();
    for path in paths {
        match read(&path).0 {
            Some(started) => all.extend(started.iter().map(|(k, v)| (*k, *v))),
            None => return Stages::default(),
        }
    }
    Stages(Some(Arc::new(all)))
}

/// Where a store's table is when one process writes it: beside the store.
pub(crate) fn beside(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".started");
    PathBuf::from(name)
}

/// Where a process instance of a shared store keeps its table: beside its lock file.
pub(crate) fn of_instance(lock_file: &Path) -> PathBuf {
    lock_file.with_extension("started")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, attempt: u32) -> crate::job::JobRecord {
        let mut record = crate::rules::new_job(
            &crate::new_job::NewJob::new("q", ""),
            JobId(id),
            std::time::Duration::ZERO,
            3,
            1024,
            crate::ids::StoreTime::ZERO,
        )
        .unwrap();
        record.attempt = Attempt(attempt);
        record
    }

    #[test]
    fn a_dead_processs_table_says_how_far_each_attempt_got_and_a_missing_one_knows_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.started");
        assert_eq!(read(&path).stage(&job(1, 1)), Stage::Unknown, "no table");
        let table = StartedTable::create(path.clone());
        let claim = [(1, 1), (2, 3), (3, 1), (4, 1), (5, 1)].map(|(j, a)| (JobId(j), Attempt(a)));
        table.claimed(claim.into_iter());
        table.started(JobId(1), Attempt(1));
        table.returned(JobId(1), Attempt(1));
        table.started(JobId(2), Attempt(3));
        table.started(JobId(5), Attempt(1));
        table.ended(JobId(5), Attempt(1));
        // Read as a survivor reads it, while this process still holds the mapping.
        let started = read(&path);
        assert_eq!(started.stage(&job(1, 1)), Stage::Returned);
        assert_eq!(started.stage(&job(2, 3)), Stage::InHandler);
        assert_eq!(started.stage(&job(3, 1)), Stage::NotStarted, "held ahead");
        assert_eq!(
            started.stage(&job(5, 1)),
            Stage::Unknown,
            "ended: its slot is free"
        );
        assert_eq!(
            started.stage(&job(2, 2)),
            Stage::Unknown,
            "no pool claimed it"
        );
        table.remove();
        assert!(!path.exists());
        assert_eq!(read(&path).stage(&job(2, 3)), Stage::Unknown);
    }

    #[test]
    fn the_table_grows_for_what_runs_at_once_and_reuses_the_slots_of_what_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.started");
        let table = StartedTable::create(path.clone());
        let held = 3 * FIRST_SLOTS as u64;
        table.claimed((1..=held).map(|id| (JobId(id), Attempt(1))));
        for id in 1..=held {
            table.started(JobId(id), Attempt(1));
            if id % 3 != 0 {
                table.ended(JobId(id), Attempt(1));
            }
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(size, (4 * FIRST_SLOTS * SLOT) as u64, "doubled twice");
        // Many more attempts than slots, one at a time: the ended ones' slots serve again.
        for id in held + 1..held + 100_000 {
            table.claimed(std::iter::once((JobId(id), Attempt(2))));
            table.ended(JobId(id), Attempt(2));
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        let started = read(&path);
        assert_eq!(started.stage(&job(3, 1)), Stage::InHandler, "still running");
        assert_eq!(started.stage(&job(3_000, 1)), Stage::InHandler);
        assert_eq!(started.stage(&job(2, 1)), Stage::Unknown, "ended");
        assert_eq!(started.0.unwrap().len(), FIRST_SLOTS, "a third still run");
    }
}
