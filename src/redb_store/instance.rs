//! Process instances: how a process that shares a store proves to the others that it is alive.
//!
//! Each process that opens a store in [`Sharing::MultiProcess`](crate::Sharing) registers an
//! *instance*: a file `<instance>.lock` in a directory `<store>.procs/` beside the store (the
//! store as its real path names it), on which it holds an exclusive `flock` for as long as its
//! handle lives. The kernel drops that lock the moment the process dies (killed, crashed, out
//! of memory), which is what lets a surviving process take the dead one's leases back in
//! milliseconds instead of waiting for them to expire. A process that is alive but stopped
//! (SIGSTOP, swapped out, hung) still holds its lock: for it the lease and the reaper remain
//! the answer.
//!
//! **Which file is whose is written in the store, not derived from a path.** The store
//! records each instance's [`Registration`]: where its lock file is, and which file that is
//! (device and inode). A neighbour looks there, so it finds the same file however it named
//! the store: through a symlink, a hard link or a bind mount, whose own `<name>.procs/` would
//! be empty (a path-derived directory once made every live holder look dead to a process that
//! opened the store by another name). And only a free lock on *that* file proves a death: a
//! lock file that is missing, replaced (another inode), not a regular file, or unreadable
//! proves nothing, so its instance is [`Liveness::Unknown`] and its leases are left to expire.
//! A live process whose file vanished makes a new one and registers it again
//! ([`Instance::renew`]).
//!
//! Why not a pid: pids are reused. Why not a lock on bytes of the store file: redb owns those
//! (it takes byte-range locks from 2^62 up), and POSIX record locks are dropped by *any* close
//! of the file in the process. `flock` locks belong to the open file description, so only the
//! handle's own descriptor holds this one. A child made by `fork()` without `exec` shares that
//! description and keeps the lock alive after its parent dies: such a parent's leases are then
//! taken back when they expire, as a hung process's are.
//!
//! An instance file appears only once locked (it is made under a temporary name, locked, then
//! renamed into place), and is registered only once the store opened. It is removed only once
//! its leases are taken back, by whoever found it dead; a crash in between leaves a file that
//! the next scan finds dead again.

use std::fs::{File, TryLockError};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};

use crate::error::OpenError;
use crate::ids::InstanceId;

/// Where an instance's lock file is and which file it is, as the store records it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Registration {
    /// The lock file's absolute path, as the registering process saw it (bytes: a path need
    /// not be UTF-8).
    pub lock_file: Vec<u8>,
    /// The lock file's device and inode: a file at that path that is another file proves
    /// nothing about this instance.
    pub dev: u64,
    pub ino: u64,
    /// The process id, for a kernel notification of its death (never to decide liveness by).
    pub pid: u32,
}

impl Registration {
    /// Where the lock file is.
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(std::ffi::OsStr::from_bytes(&self.lock_file))
    }
}

/// This process's registration, alive while this value is. A clean close retires it (see
/// [`Instance::retire`]); dropping it otherwise releases the lock and leaves the file, and
/// whoever finds it unlocked takes back any lease the instance still held, then removes it.
#[derive(Debug)]
pub(crate) struct Instance {
    id: InstanceId,
    path: PathBuf,
    /// Holds the lock; dropping it releases the lock.
    lock: File,
    registration: Registration,
}

/// What a look at another instance found.
pub(crate) enum Liveness {
    /// Its process holds its lock.
    Alive,
    /// Its lock was free: its process is gone. The lock is now held by the returned guard
    /// until its leases are taken back and [`Dead::bury`] removes the file.
    Dead(Dead),
    /// Nothing proves either (its file is gone, replaced or unreadable): its leases expire.
    Unknown(&'static str),
}

/// A dead instance whose lock the finder holds.
pub(crate) struct Dead {
    pub id: InstanceId,
    path: PathBuf,
    /// The instance's lock, held.
    lock: File,
}

impl Dead {
    /// Where its lock file is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the instance's file, its leases taken back: only if the path still names the
    /// file whose lock was found free (an operator's file put there since stays), and the
    /// table of the jobs it started.
    pub(crate) fn bury(self) {
        if !same_file(&self.path, &self.lock) {
            return;
        }
        let _ = std::fs::remove_file(crate::redb_store::started::of_instance(&self.path));
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "removing a dead instance's file failed");
        }
    }
}

/// The directory of instance files of the store at `store` (an existing file): beside its
/// real path, so that processes that open it by one name share one directory.
pub(crate) fn directory(store: &Path) -> std::io::Result<PathBuf> {
    let real = std::fs::canonicalize(store)?;
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".to_owned());
    Ok(real.with_file_name(format!("{name}.procs")))
}

/// Refuses a store whose instance directory's place holds something that is not a
/// directory, before the open creates or writes anything (registering comes after the
/// store opened, and a refusal then would leave a new store behind).
pub(crate) fn check_directory(store: &Path) -> Result<(), OpenError> {
    let place = match std::fs::canonicalize(store) {
        Ok(_) => directory(store),
        // A store still to be made: its directory goes beside the name given.
        Err(_) => Ok(store.with_file_name(format!(
            "{}.procs",
            store
                .file_name()
                .map_or("store".into(), |n| n.to_string_lossy())
        ))),
    };
    match place.map(|dir| (std::fs::metadata(&dir), dir)) {
        Ok((Ok(meta), dir)) if !meta.is_dir() => {
            Err(OpenError::ProcessDirectoryTaken { path: dir })
        }
        _ => Ok(()),
    }
}

impl Instance {
    /// Registers this process with the store at `store` (which exists): a new instance
    /// file, locked. The store records it ([`Instance::registration`]) before any lease.
    pub(crate) fn register(store: &Path) -> Result<Instance, OpenError> {
        Instance::register_with(store, File::try_lock)
    }

    /// [`Instance::register`] with the filesystem's `flock` as `try_lock`: tests stand in
    /// filesystems whose locks do not work.
    fn register_with(store: &Path, try_lock: TryLock) -> Result<Instance, OpenError> {
        let dir = directory(store).map_err(|source| OpenError::Io {
            path: store.to_owned(),
            source,
        })?;
        let io = |source| OpenError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let id = InstanceId(crate::random::random_u64());
        let (path, lock) = make_lock_file(&dir, id, try_lock)?;
        let registration = registration_of(&path, &lock).map_err(io)?;
        Ok(Instance {
            id,
            path,
            lock,
            registration,
        })
    }

    pub(crate) fn id(&self) -> InstanceId {
        self.id
    }

    /// What the store records of this instance.
    pub(crate) fn registration(&self) -> &Registration {
        &self.registration
    }

    pub(crate) fn directory(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Whether this instance's file is still in place (the path names the file it locked).
    pub(crate) fn in_place(&self) -> bool {
        same_file(&self.path, &self.lock)
    }

    /// Makes this instance's file again, locked, after it was removed or replaced by someone
    /// else: the new registration, for the store to record. The old lock is held until the
    /// new one is.
    pub(crate) fn renew(&mut self) -> Result<Registration, OpenError> {
        let dir = self.directory().to_owned();
        let (path, lock) = make_lock_file(&dir, self.id, File::try_lock)?;
        let registration = registration_of(&path, &lock).map_err(|source| OpenError::Io {
            path: path.clone(),
            source,
        })?;
        self.path = path;
        self.lock = lock;
        self.registration = registration.clone();
        Ok(registration)
    }

    /// Removes the instance's file while its lock is still held: a clean close, with no lease
    /// left for anyone to take back.
    pub(crate) fn retire(&self) {
        if !self.in_place() {
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing this process's instance file failed");
        }
    }
}

/// Makes `<id>.lock` in `dir`: under a temporary name, locked (and the lock shown to work),
/// the pid written, then renamed into place, so that the file is never seen unlocked.
fn make_lock_file(
    dir: &Path,
    id: InstanceId,
    try_lock: TryLock,
) -> Result<(PathBuf, File), OpenError> {
    let io = |source| OpenError::Io {
        path: dir.to_owned(),
        source,
    };
    let tmp = dir.join(format!(".{id}.{:x}.new", crate::random::random_u64()));
    let mut file = File::create(&tmp).map_err(io)?;
    let made = lock_file(&file, dir, try_lock).and_then(|()| {
        check_locks_work(&tmp, dir, try_lock)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        let path = dir.join(format!("{id}.lock"));
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(path)
    });
    match made {
        Ok(path) => Ok((path, file)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn registration_of(path: &Path, lock: &File) -> std::io::Result<Registration> {
    let meta = lock.metadata()?;
    let absolute = std::path::absolute(path)?;
    Ok(Registration {
        lock_file: absolute.as_os_str().as_bytes().to_vec(),
        dev: meta.dev(),
        ino: meta.ino(),
        pid: std::process::id(),
    })
}

/// Whether `path` names the file open as `file` (same device and inode).
fn same_file(path: &Path, file: &File) -> bool {
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
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

/// Opens a file to look at it, never blocking (a FIFO put where a lock file should be would
/// block a plain open until a writer came) and never following a symlink.
fn open_to_probe(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
}

/// Looks at the registered instance `id`: alive if its lock is held, dead if the lock of the
/// very file it registered is free; unknown otherwise.
pub(crate) fn probe(id: InstanceId, registration: &Registration) -> Liveness {
    let path = registration.path();
    let file = match open_to_probe(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Liveness::Unknown("its lock file is gone");
        }
        Err(_) => return Liveness::Unknown("its lock file cannot be opened"),
    };
    let Ok(meta) = file.metadata() else {
        return Liveness::Unknown("its lock file cannot be read");
    };
    if !meta.file_type().is_file() {
        return Liveness::Unknown("its lock file is not a regular file");
    }
    if (meta.dev(), meta.ino()) != (registration.dev, registration.ino) {
        return Liveness::Unknown("its lock file was replaced");
    }
    match file.try_lock() {
        Ok(()) => Liveness::Dead(Dead {
            id,
            path,
            lock: file,
        }),
        Err(TryLockError::WouldBlock) => Liveness::Alive,
        Err(TryLockError::Error(_)) => Liveness::Unknown("its lock cannot be tried"),
    }
}

/// The instance files in `dir` that no registration names and whose lock is free: left by a
/// process that died between making its file and registering it, or by hand. Entries that
/// are not regular files are skipped (and never opened).
pub(crate) fn strays(dir: &Path, registered: &[InstanceId]) -> Vec<Dead> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
            continue;
        };
        let Ok(id) = u64::from_str_radix(hex, 16).map(InstanceId) else {
            continue;
        };
        if registered.contains(&id) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = open_to_probe(&path) else {
            continue;
        };
        if file.metadata().is_ok_and(|m| m.is_file()) && file.try_lock().is_ok() {
            found.push(Dead {
                id,
                path,
                lock: file,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s.redb");
        std::fs::write(&store, b"").unwrap();
        (dir, store)
    }

    fn refused(try_lock: TryLock) -> (String, Vec<std::ffi::OsString>) {
        let (_dir, store) = store();
        let detail = match Instance::register_with(&store, try_lock) {
            Err(OpenError::NoWorkingLocks { path, detail }) => {
                assert_eq!(path, directory(&store).unwrap());
                detail
            }
            other => panic!("expected NoWorkingLocks, got {other:?}"),
        };
        let left = std::fs::read_dir(directory(&store).unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
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
    fn a_registered_instance_is_alive_while_it_lives_and_dead_once_dropped() {
        let (_dir, store) = store();
        let me = Instance::register(&store).unwrap();
        let registration = me.registration().clone();
        assert!(matches!(probe(me.id(), &registration), Liveness::Alive));
        let id = me.id();
        drop(me);
        match probe(id, &registration) {
            Liveness::Dead(dead) => {
                let path = dead.path.clone();
                dead.bury();
                assert!(!path.exists());
            }
            _ => panic!("a dropped instance's free lock proves it dead"),
        }
    }

    #[test]
    fn a_lock_file_removed_or_replaced_or_made_a_fifo_proves_nothing() {
        let (_dir, store) = store();
        let mut me = Instance::register(&store).unwrap();
        let registration = me.registration().clone();
        let path = registration.path();
        // replaced by an operator: another file, free, at the same path
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"123\n").unwrap();
        assert!(matches!(
            probe(me.id(), &registration),
            Liveness::Unknown("its lock file was replaced")
        ));
        // removed
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            probe(me.id(), &registration),
            Liveness::Unknown("its lock file is gone")
        ));
        // a FIFO in its place: looked at without blocking
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path; touches no other memory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            probe(me.id(), &registration),
            Liveness::Unknown("its lock file is not a regular file")
        ));
        assert!(strays(me.directory(), &[]).is_empty(), "a FIFO is no stray");
        // the live process notices and makes its file again, with a new registration
        assert!(!me.in_place());
        std::fs::remove_file(&path).unwrap();
        let renewed = me.renew().unwrap();
        assert_ne!(renewed, registration);
        assert!(me.in_place());
        assert!(matches!(probe(me.id(), &renewed), Liveness::Alive));
    }

    #[test]
    fn the_directory_is_the_same_whatever_name_the_store_is_opened_by() {
        let (dir, store) = store();
        let link = dir.path().join("alias.redb");
        std::os::unix::fs::symlink(&store, &link).unwrap();
        assert_eq!(directory(&link).unwrap(), directory(&store).unwrap());
    }
}
