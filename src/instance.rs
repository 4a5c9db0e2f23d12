//! Process instances: how a process that shares a store proves to the others that it is alive.
//!
//! Each process that opens a store in [`Sharing::MultiProcess`](crate::Sharing) registers an
//! *instance*: a file `<instance>.lock` in the directory `<store>.procs/` beside the store,
//! on which it holds an exclusive `flock` for as long as its handle lives. The kernel drops
//! that lock the moment the process dies (killed, crashed, out of memory), which is what lets
//! a surviving process take the dead one's leases back in milliseconds instead of waiting for
//! them to expire. A process that is alive but stopped (SIGSTOP, swapped out, hung) still
//! holds its lock: for it the lease and the reaper remain the answer.
//!
//! Why not a pid: pids are reused. Why not a lock on bytes of the store file: redb owns those
//! (it takes byte-range locks from 2^62 up), and POSIX record locks are dropped by *any* close
//! of the file in the process. `flock` locks belong to the open file description, so only the
//! handle's own descriptor holds this one. A child made by `fork()` without `exec` shares that
//! description and keeps the lock alive after its parent dies: such a parent's leases are then
//! taken back when they expire, as a hung process's are.
//!
//! An instance file appears only once locked (it is made under a temporary name, locked, then
//! renamed into place), and is removed only once its leases are taken back, by whoever found
//! it dead; a crash in between leaves a file that the next scan finds dead again.

use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::OpenError;
use crate::ids::InstanceId;

/// This process's registration, alive while this value is. A clean close retires it (see
/// [`Instance::retire`]); dropping it otherwise releases the lock and leaves the file, and
/// whoever finds it unlocked takes back any lease the instance still held, then removes it.
#[derive(Debug)]
pub(crate) struct Instance {
    id: InstanceId,
    path: PathBuf,
    /// Holds the lock; dropping it releases the lock.
    _lock: File,
}

/// What a look at another instance found.
pub(crate) enum Liveness {
    /// Its process holds its lock.
    Alive,
    /// Its lock was free: its process is gone. The lock is now held by the returned guard
    /// until its leases are taken back and [`Dead::bury`] removes the file.
    Dead(Dead),
}

/// A dead instance whose lock the finder holds.
pub(crate) struct Dead {
    pub id: InstanceId,
    path: PathBuf,
    /// The instance's lock, held; `None` when its file was already gone.
    _lock: Option<File>,
}

impl Dead {
    /// Removes the instance's file: its leases are taken back.
    pub(crate) fn bury(self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "removing a dead instance's file failed");
        }
    }
}

/// The directory of instance files beside `store`.
pub(crate) fn directory(store: &Path) -> PathBuf {
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".to_owned());
    store.with_file_name(format!("{name}.procs"))
}

impl Instance {
    /// Registers this process with the store at `store`: a new instance file, locked.
    pub(crate) fn register(store: &Path) -> Result<Instance, OpenError> {
        Instance::register_with(store, File::try_lock)
    }

    /// [`Instance::register`] with the filesystem's `flock` as `try_lock`: tests stand in
    /// filesystems whose locks do not work.
    fn register_with(store: &Path, try_lock: TryLock) -> Result<Instance, OpenError> {
        let dir = directory(store);
        let io = |source| OpenError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let id = InstanceId(crate::clock::random_u64());
        let tmp = dir.join(format!(".{id}.new"));
        let mut file = File::create(&tmp).map_err(io)?;
        let locked = lock_file(&file, &dir, try_lock).and_then(|()| {
            check_locks_work(&tmp, &dir, try_lock)?;
            writeln!(file, "{}", std::process::id()).map_err(io)?;
            let path = dir.join(format!("{id}.lock"));
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(path)
        });
        match locked {
            Ok(path) => Ok(Instance {
                id,
                path,
                _lock: file,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    pub(crate) fn id(&self) -> InstanceId {
        self.id
    }

    pub(crate) fn directory(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Removes the instance's file while its lock is still held: a clean close, with no lease
    /// left for anyone to take back.
    pub(crate) fn retire(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing this process's instance file failed");
        }
    }
}

/// How a file's exclusive `flock` is tried.
type TryLock = fn(&File) -> Result<(), TryLockError>;

fn lock_file(file: &File, dir: &Path, try_lock: TryLock) -> Result<(), OpenError> {
    match try_lock(file) {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(no_locks(dir, "a new file was locked already")),
        Err(TryLockError::Error(e)) => Err(no_locks(dir, &e.to_string())),
    }
}

/// A second descriptor of the same file must be refused the lock; a filesystem where it is
/// not (some network filesystems) cannot tell the living from the dead.
fn check_locks_work(path: &Path, dir: &Path, try_lock: TryLock) -> Result<(), OpenError> {
    let other = File::open(path).map_err(|source| OpenError::Io {
        path: path.to_owned(),
        source,
    })?;
    match try_lock(&other) {
        Err(TryLockError::WouldBlock) => Ok(()),
        Ok(()) => Err(no_locks(dir, "a second lock on a locked file was granted")),
        Err(TryLockError::Error(e)) => Err(no_locks(dir, &e.to_string())),
    }
}

fn no_locks(dir: &Path, detail: &str) -> OpenError {
    OpenError::NoWorkingLocks {
        path: dir.to_owned(),
        detail: detail.to_owned(),
    }
}

/// The registered instances in `dir`, ours included.
pub(crate) fn list(dir: &Path) -> Vec<InstanceId> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            let hex = name.to_str()?.strip_suffix(".lock")?;
            u64::from_str_radix(hex, 16).ok().map(InstanceId)
        })
        .collect()
}

/// Looks at instance `id` in `dir`: alive if its lock is held, dead if it is free or its file
/// is gone (no process that holds leases is without one).
pub(crate) fn probe(dir: &Path, id: InstanceId) -> Liveness {
    let path = dir.join(format!("{id}.lock"));
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Liveness::Dead(Dead {
                id,
                path,
                _lock: None,
            });
        }
        // Unreadable: assume alive; its leases still expire.
        Err(_) => return Liveness::Alive,
    };
    match file.try_lock() {
        Ok(()) => Liveness::Dead(Dead {
            id,
            path,
            _lock: Some(file),
        }),
        Err(_) => Liveness::Alive,
    }
}

/// Whether instance `id`'s process is alive, for display (the lock is let go at once).
pub(crate) fn is_alive(dir: &Path, id: InstanceId) -> bool {
    matches!(probe(dir, id), Liveness::Alive)
}

/// The pid an instance file records (for a kernel notification of its death; never to decide
/// liveness by).
pub(crate) fn pid_of(dir: &Path, id: InstanceId) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("{id}.lock")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(try_lock: TryLock) -> (String, Vec<std::ffi::OsString>) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s.redb");
        let detail = match Instance::register_with(&store, try_lock) {
            Err(OpenError::NoWorkingLocks { path, detail }) => {
                assert_eq!(path, directory(&store));
                detail
            }
            other => panic!("expected NoWorkingLocks, got {other:?}"),
        };
        let left = std::fs::read_dir(directory(&store))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(!store.exists(), "the store file is not touched");
        (detail, left)
    }

    #[test]
    fn a_filesystem_that_grants_every_lock_is_refused_and_leaves_no_instance_file() {
        // what some network filesystems do: every descriptor gets the "exclusive" lock
        let (detail, left) = refused(|_| Ok(()));
        assert_eq!(detail, "a second lock on a locked file was granted");
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_filesystem_without_flock_is_refused_with_the_systems_reason() {
        let (detail, left) = refused(|_| {
            Err(TryLockError::Error(std::io::Error::from_raw_os_error(
                libc::ENOLCK,
            )))
        });
        assert!(detail.contains("No locks available"), "{detail}");
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_filesystem_with_working_locks_registers_an_instance_that_a_probe_finds_alive() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s.redb");
        let me = Instance::register(&store).unwrap();
        assert_eq!(list(&directory(&store)), vec![me.id()]);
        assert!(matches!(
            probe(&directory(&store), me.id()),
            Liveness::Alive
        ));
    }
}
