//! How far each lease of a pool got: a log each process writes beside the store, so that
//! whoever takes back a dead process's leases can tell a job that was in its handler when
//! the process died (its attempt spends budget: it may be the job that killed the process)
//! from one it only held ahead ([`crate::Outcome::NeverStarted`]) and one whose handler had
//! returned, its result not yet committed ([`crate::Outcome::ResultLost`]): both go back to
//! their place with no budget spent.
//!
//! A pool appends a line (thirteen bytes: what, the job, the attempt) for each lease it
//! claims, in one `write(2)` per claim, and one before it calls a handler; that the handler
//! returned goes with the next write. No `fsync`: a process that aborts, is killed or runs
//! out of memory leaves what it wrote in the kernel's page cache, which is the death this
//! log is for. A start must be in the kernel before its handler runs; a line that did not
//! get there leaves its lease one stage back (a claim unwritten: in its handler, charged; a
//! return unwritten: in its handler). A machine that loses power may lose the last lines, and
//! a started job they name then counts as claimed ahead: no budget spent, the fence untouched
//! (its holder is dead either way).
//!
//! A lease the log does not name (claimed by the application's own loop, not a pool), and
//! every lease where there is no log or it cannot be read (an older build's process, a store
//! without a path), counts as in its handler: charged, as before the log existed.
//! The log keeps only what may still matter: past [`COMPACT_AT`] bytes it is rewritten with
//! the attempts still running (write to a temporary file, then rename over it).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ids::{Attempt, JobId};
use crate::protocol::{Stage, Started};

/// One line: what happened (`CLAIMED`, `STARTED` or `RETURNED`), the job id and the
/// attempt, little-endian.
const LINE: usize = 13;
const STARTED: u8 = 1;
const RETURNED: u8 = 2;
const CLAIMED: u8 = 3;

/// How large the log grows before it is rewritten with the attempts still running.
const COMPACT_AT: u64 = 1 << 20;

/// This process's log (see the module's documentation).
#[derive(Debug)]
pub(crate) struct StartedLog {
    path: PathBuf,
    state: Mutex<Log>,
}

#[derive(Debug)]
struct Log {
    file: Option<File>,
    /// The attempts started here and not ended, each with how far it got.
    running: HashMap<(JobId, Attempt), Stage>,
    /// Returns not written yet: they go with the next write.
    returned: Vec<u8>,
    written: u64,
}

impl StartedLog {
    /// A new, empty log at `path` (one left by a dead process there is replaced: read it
    /// first). A log that cannot be made is a warning, not a failure: the store runs as it
    /// did before the log existed.
    pub(crate) fn create(path: PathBuf) -> StartedLog {
        let file = File::create(&path)
            .inspect_err(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot keep the log of started jobs: a dead process's jobs will all count as started")
            })
            .ok();
        StartedLog {
            path,
            state: Mutex::new(Log {
                file,
                running: HashMap::new(),
                returned: Vec::new(),
                written: 0,
            }),
        }
    }

    /// Notes that a pool claimed these attempts to hand to its handlers.
    pub(crate) fn claimed(&self, attempts: impl Iterator<Item = (JobId, Attempt)>) {
        let mut log = self.state.lock();
        let mut lines = std::mem::take(&mut log.returned);
        for (job, attempt) in attempts {
            log.running.insert((job, attempt), Stage::NotStarted);
            lines.extend(encode(CLAIMED, job, attempt));
        }
        log.write(&self.path, lines);
    }

    /// Notes that a handler is about to start `job`'s `attempt`: written to the kernel before
    /// this returns.
    pub(crate) fn started(&self, job: JobId, attempt: Attempt) {
        let mut log = self.state.lock();
        log.running.insert((job, attempt), Stage::InHandler);
        let mut lines = std::mem::take(&mut log.returned);
        lines.extend(encode(STARTED, job, attempt));
        log.write(&self.path, lines);
    }

    /// Notes that the handler of `job`'s `attempt` returned, and no code of the
    /// application's runs for it any more: written with the next start.
    pub(crate) fn returned(&self, job: JobId, attempt: Attempt) {
        let mut log = self.state.lock();
        if let Some(stage) = log.running.get_mut(&(job, attempt)) {
            *stage = Stage::Returned;
            log.returned.extend(encode(RETURNED, job, attempt));
        }
    }

    /// Notes that `job`'s `attempt` ended: a compaction may forget it.
    pub(crate) fn ended(&self, job: JobId, attempt: Attempt) {
        self.state.lock().running.remove(&(job, attempt));
    }

    /// Removes the log: its process gave back every lease it held.
    pub(crate) fn remove(&self) {
        self.state.lock().file = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Log {
    /// Appends `lines`, or rewrites the log (which then holds them) once it is large.
    fn write(&mut self, path: &Path, lines: Vec<u8>) {
        if self.written >= COMPACT_AT {
            return self.compact(path);
        }
        let Some(file) = &mut self.file else { return };
        if let Err(e) = file.write_all(&lines) {
            tracing::warn!(error = %e, "writing the log of started jobs failed");
            self.file = None;
        }
        self.written += lines.len() as u64;
    }

    /// Rewrites the log with the attempts still running, in a new file renamed over it.
    fn compact(&mut self, path: &Path) {
        let fresh = path.with_extension("started-new");
        let lines: Vec<u8> = (self.running.iter())
            .flat_map(|(&(job, attempt), stage)| {
                let what = match stage {
                    Stage::NotStarted => CLAIMED,
                    Stage::Returned => RETURNED,
                    _ => STARTED,
                };
                encode(what, job, attempt)
            })
            .collect();
        self.returned.clear();
        let made = File::create(&fresh).and_then(|mut file| {
            file.write_all(&lines)?;
            std::fs::rename(&fresh, path)?;
            Ok(file)
        });
        match made {
            Ok(file) => {
                self.file = Some(file);
                self.written = lines.len() as u64;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compacting the log of started jobs failed");
                let _ = std::fs::remove_file(&fresh);
                self.file = None;
            }
        }
    }
}

fn encode(what: u8, job: JobId, attempt: Attempt) -> [u8; LINE] {
    let mut line = [what; LINE];
    line[1..9].copy_from_slice(&job.0.to_le_bytes());
    line[9..].copy_from_slice(&attempt.0.to_le_bytes());
    line
}

/// What the log at `path` says a dead process started; unknown if there is none or it
/// cannot be read. A torn last line (a process killed mid-write) is left out.
pub(crate) fn read(path: &Path) -> Started {
    let Ok(bytes) = std::fs::read(path) else {
        return Started::default();
    };
    let mut stages = HashMap::new();
    for line in bytes.chunks_exact(LINE) {
        let job = JobId(u64::from_le_bytes(
            line[1..9].try_into().unwrap_or_default(),
        ));
        let attempt = Attempt(u32::from_le_bytes(line[9..].try_into().unwrap_or_default()));
        let stage = match line[0] {
            CLAIMED => Stage::NotStarted,
            STARTED => Stage::InHandler,
            RETURNED => Stage::Returned,
            // Not a line this build writes: the log says nothing then.
            _ => return Started::default(),
        };
        stages.insert((job, attempt), stage);
    }
    Started(Some(Arc::new(stages)))
}

/// What the logs at `paths` say their dead processes started, together; unknown if any of
/// them is.
pub(crate) fn read_all(paths: impl Iterator<Item = PathBuf>) -> Started {
    let mut all = HashMap::new();
    for path in paths {
        match read(&path).0 {
            Some(started) => all.extend(started.iter().map(|(k, v)| (*k, *v))),
            None => return Started::default(),
        }
    }
    Started(Some(Arc::new(all)))
}

/// Where a store's log is when one process writes it: beside the store.
pub(crate) fn beside(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".started");
    PathBuf::from(name)
}

/// Where a process instance of a shared store keeps its log: beside its lock file.
pub(crate) fn of_instance(lock_file: &Path) -> PathBuf {
    lock_file.with_extension("started")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, attempt: u32) -> crate::job::JobRecord {
        let mut record = crate::rules::new_job(
            &crate::NewJob::new("q", ""),
            JobId(id),
            3,
            1024,
            crate::StoreTime::ZERO,
        )
        .unwrap();
        record.attempt = Attempt(attempt);
        record
    }

    #[test]
    fn a_dead_processs_log_says_how_far_each_attempt_got_and_a_missing_one_knows_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.started");
        assert_eq!(read(&path).stage(&job(1, 1)), Stage::Unknown, "no log");
        let log = StartedLog::create(path.clone());
        let claim = [(1, 1), (2, 3), (3, 1), (4, 1)].map(|(j, a)| (JobId(j), Attempt(a)));
        log.claimed(claim.into_iter());
        log.started(JobId(1), Attempt(1));
        log.returned(JobId(1), Attempt(1));
        log.started(JobId(2), Attempt(3));
        log.started(JobId(4), Attempt(1));
        log.returned(JobId(4), Attempt(1)); // not written: no line came after it
        // A torn last line, as a kill in the middle of a write leaves.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(&[STARTED, 9, 9]).unwrap();
        let started = read(&path);
        assert_eq!(started.stage(&job(1, 1)), Stage::Returned);
        assert_eq!(started.stage(&job(2, 3)), Stage::InHandler);
        assert_eq!(
            started.stage(&job(4, 1)),
            Stage::InHandler,
            "its return unwritten"
        );
        assert_eq!(
            started.stage(&job(2, 2)),
            Stage::Unknown,
            "an attempt no pool claimed"
        );
        assert_eq!(
            started.stage(&job(3, 1)),
            Stage::NotStarted,
            "a job held ahead"
        );
    }

    #[test]
    fn a_compacted_log_keeps_the_attempts_still_running_and_forgets_the_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.started");
        let log = StartedLog::create(path.clone());
        let lines = COMPACT_AT / (2 * LINE as u64) + 1;
        for id in 1..=lines {
            log.claimed(std::iter::once((JobId(id), Attempt(1))));
            log.started(JobId(id), Attempt(1));
            match id {
                7 => {}
                8 => log.returned(JobId(id), Attempt(1)),
                _ => log.ended(JobId(id), Attempt(1)),
            }
        }
        log.claimed([(JobId(0), Attempt(2)), (JobId(5), Attempt(2))].into_iter());
        log.started(JobId(0), Attempt(2));
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 100, "compacted to what runs: {size} bytes");
        let started = read(&path);
        assert_eq!(
            started.stage(&job(7, 1)),
            Stage::InHandler,
            "still running: kept"
        );
        assert_eq!(
            started.stage(&job(8, 1)),
            Stage::Returned,
            "returned: kept as such"
        );
        assert_eq!(
            started.stage(&job(0, 2)),
            Stage::InHandler,
            "started after it"
        );
        assert_eq!(
            started.stage(&job(5, 2)),
            Stage::NotStarted,
            "claimed after it"
        );
        assert_eq!(
            started.stage(&job(9, 1)),
            Stage::Unknown,
            "ended: forgotten"
        );
        log.remove();
        assert!(!path.exists());
    }
}
