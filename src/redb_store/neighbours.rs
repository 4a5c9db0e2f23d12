//! The other processes of a shared store: noticing the moment one dies, and waking idle
//! workers when another process gives a queue work.
//!
//! One thread per store handle in [`Sharing::MultiProcess`](crate::Sharing) waits, in one
//! `poll`, on three things:
//! * a **pidfd** for each live neighbour, which the kernel makes readable the moment that
//!   process exits: its instance lock is then free, and this process takes back every lease
//!   the dead one held, in one transaction ([`crate::ReclaimPath::ProcessDied`]). Whichever
//!   survivor locks the dead instance first does it; the others find it locked, then gone.
//! * its **wake-up socket** (an abstract Unix datagram socket named after its instance): a
//!   neighbour whose commit gave a queue work sends one datagram to each peer, and the waiting
//!   workers here are woken as for a commit of their own; likewise a commit that kept an
//!   ending, while a follower of the endings said it follows (its own datagram), wakes the
//!   followers ([`crate::ReadJobs::wait_for_endings`]);
//! * a stop signal from the handle's drop.
//!
//! It reads the instances the store registers (a read transaction) when a neighbour says it
//! joined or left (not for a wake-up, which a busy neighbour sends at every commit), and
//! every [`RESCAN`] while a live neighbour is watched by no pidfd, or
//! else every [`SLOW_RESCAN`]: new neighbours get a pidfd, and an instance whose process
//! ended without a pidfd event (a kernel without pidfds) is found dead there. A neighbour
//! whose pidfd says it exited while its lock is still held (a child it forked without
//! `exec` holds it) is watched by the rescan alone from then on: its pidfd stays readable,
//! and polling it again would spin. The scan also checks that this process's own lock file
//! is still in place, and makes it again if someone removed or replaced it. When every
//! neighbour has a pidfd, nothing the rescan finds is urgent (a death wakes the thread by
//! its pidfd, a join or a clean close by its datagram), so an idle process wakes for it
//! seldom.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::RealDeadline;
use crate::error::{Error, OpenError, Result};
use crate::ids::InstanceId;
use crate::redb_store::instance::{self, Instance, Liveness, Registration};

/// How often the registered instances are read again, when nothing else wakes the thread,
/// while a live neighbour is watched by no pidfd (its death is found by this reading alone).
pub(crate) const RESCAN: Duration = Duration::from_millis(100);

/// How often they are read again while every live neighbour has a pidfd: for a lock file of
/// this process's that someone removed, and for stray files.
pub(crate) const SLOW_RESCAN: Duration = Duration::from_secs(5);

/// What the watcher thread needs of the store (implemented by the store's shared state).
pub(crate) trait Survivor: Send + Sync + 'static {
    /// Takes back every lease `dead` held and forgets it; returns how many.
    fn reclaim_instance(self: Arc<Self>, dead: InstanceId) -> Result<usize>;
    /// The instances the store registers.
    fn registrations(self: Arc<Self>) -> Result<Vec<(InstanceId, Registration)>>;
    /// Records this process's instance again, its lock file made anew.
    fn reregister(self: Arc<Self>, me: InstanceId, registration: &Registration) -> Result<()>;
    /// Wakes every worker of this process that waits for work.
    fn wake_local(&self);
    /// Wakes this process's schedulers: another process changed the schedules.
    fn wake_schedules(&self);
    /// Wakes this process's followers of the endings: another process kept one.
    fn wake_endings(&self);
    /// Another process's follower of the endings asks for hints: this process's commits
    /// that keep an ending send them for a while ([`crate::notify::FOLLOWED_FOR`]).
    fn followed(&self);
    /// A process joined: a follower here that still follows says so again, to it too.
    fn welcome(&self);
}

/// This handle's place among the processes of a shared store.
#[derive(Debug)]
pub(crate) struct Neighbours {
    /// Shared with the watcher thread, which makes its file again when it must.
    instance: Arc<Mutex<Instance>>,
    id: InstanceId,
    /// The other registered instances as last read: whom a wake-up goes to.
    peers: Arc<Mutex<Vec<InstanceId>>>,
    /// How many times the watcher thread has woken and read the registry (a relaxed count,
    /// for tests that show it does not spin, or that a scan ran).
    wakeups: Arc<std::sync::atomic::AtomicU64>,
    /// Sends wake-ups (and, cloned into the thread, receives them).
    socket: UnixDatagram,
    /// Sending on it stops the watcher thread, which holds the other end.
    stop: UnixDatagram,
    stop_rx: Mutex<Option<UnixDatagram>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn address(id: InstanceId) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("leasehold-{id}").as_bytes())
}

impl Neighbours {
    /// Makes this process's instance for the store at `path` (open, so the file exists) and
    /// binds its wake-up socket; the store registers it ([`Neighbours::registration`]) before
    /// any lease. The watcher thread starts with [`Neighbours::start`]. A failure leaves no
    /// instance file behind.
    pub(crate) fn join(path: &std::path::Path) -> std::result::Result<Neighbours, OpenError> {
        let instance = Instance::register(path)?;
        let io = |source| OpenError::Io {
            path: instance.directory().to_owned(),
            source,
        };
        let sockets = (|| {
            let socket = UnixDatagram::bind_addr(&address(instance.id())?)?;
            socket.set_nonblocking(true)?;
            let (stop, stop_rx) = UnixDatagram::pair()?;
            Ok((socket, stop, stop_rx))
        })();
        let (socket, stop, stop_rx) = match sockets {
            Ok(s) => s,
            Err(e) => {
                instance.retire();
                return Err(io(e));
            }
        };
        Ok(Neighbours {
            id: instance.id(),
            instance: Arc::new(Mutex::new(instance)),
            peers: Arc::default(),
            wakeups: Arc::default(),
            socket,
            stop,
            stop_rx: Mutex::new(Some(stop_rx)),
            thread: Mutex::new(None),
        })
    }

    pub(crate) fn instance(&self) -> InstanceId {
        self.id
    }

    /// What the store records of this instance.
    pub(crate) fn registration(&self) -> Registration {
        self.instance.lock().registration().clone()
    }

    /// How many times the watcher thread has woken so far.
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The other instances the store registers, whom wake-ups go to.
    pub(crate) fn set_peers(&self, registered: &[(InstanceId, Registration)]) {
        *self.peers.lock() = others(self.id, registered);
    }

    /// Starts the watcher thread; it holds the store weakly.
    pub(crate) fn start<S: Survivor>(&self, store: Weak<S>) -> Result<()> {
        let Some(stop) = self.stop_rx.lock().take() else {
            return Ok(());
        };
        let receive = self.socket.try_clone().map_err(Error::ThreadSpawn)?;
        let watcher = Watcher {
            me: self.instance.clone(),
            id: self.id,
            peers: self.peers.clone(),
            wakeups: self.wakeups.clone(),
            store,
            receive,
            stop,
            pidfds: BTreeMap::new(),
            exited: std::collections::BTreeSet::new(),
            unwatched: true,
        };
        let handle = std::thread::Builder::new()
            .name("lh-neighbours".into())
            .spawn(move || watcher.run())
            .map_err(Error::ThreadSpawn)?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// Tells every other registered process that a queue has work: one datagram each, to
    /// the instances registered at the last scan (a process that joined since announced
    /// itself, and every watcher read the registry again then). A neighbour that is gone or
    /// whose socket is full misses it and finds the work by its own timers.
    pub(crate) fn wake_peers(&self) {
        self.send_to_others(b"w");
    }

    /// Tells every other registered process that the schedules changed: their schedulers
    /// look at them again.
    pub(crate) fn schedules_changed(&self) {
        self.send_to_others(b"s");
    }

    /// Tells every other registered process that a commit kept an ending (sent only while
    /// one of them follows the endings).
    pub(crate) fn endings_kept(&self) {
        self.send_to_others(b"e");
    }

    /// Tells every other registered process that a follower here waits for endings: their
    /// commits that keep one tell this process, for a while.
    pub(crate) fn following(&self) {
        self.send_to_others(b"f");
    }

    /// Announces this instance to the others, so that their watchers look at it now (and
    /// hold a pidfd for it) rather than at their next rescan.
    pub(crate) fn announce(&self) {
        self.send_to_others(b"j");
    }

    fn send_to_others(&self, message: &[u8]) {
        let peers = self.peers.lock().clone();
        for peer in peers {
            if let Ok(addr) = address(peer) {
                let _ = self.socket.send_to_addr(message, &addr);
            }
        }
    }

    /// Removes this process's instance file at a clean close, its leases given back, and
    /// tells the others, whose watchers then read the registry again.
    pub(crate) fn retire(&self) {
        self.instance.lock().retire();
        self.send_to_others(b"l");
    }

    /// Stops the watcher thread and waits for it (unless this is that thread, which ends
    /// right after).
    pub(crate) fn stop(&self) {
        let _ = self.stop.send(b"s");
        let handle = self.thread.lock().take();
        if let Some(handle) = handle
            && handle.thread().id() != std::thread::current().id()
        {
            let _ = handle.join();
        }
    }
}

/// The other instances of `registered`.
fn others(me: InstanceId, registered: &[(InstanceId, Registration)]) -> Vec<InstanceId> {
    registered
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != me)
        .collect()
}

/// The watcher thread's state.
struct Watcher<S> {
    me: Arc<Mutex<Instance>>,
    id: InstanceId,
    peers: Arc<Mutex<Vec<InstanceId>>>,
    wakeups: Arc<std::sync::atomic::AtomicU64>,
    store: Weak<S>,
    receive: UnixDatagram,
    stop: UnixDatagram,
    /// A pidfd per live neighbour that has one.
    pidfds: BTreeMap<InstanceId, OwnedFd>,
    /// Neighbours whose pidfd said their process exited while their lock stayed held (by a
    /// child forked without `exec`): watched by the rescan alone, never by a pidfd again.
    exited: std::collections::BTreeSet<InstanceId>,
    /// Whether the last scan left a live neighbour without a pidfd (or did not finish):
    /// rescans every [`RESCAN`] then, every [`SLOW_RESCAN`] otherwise.
    unwatched: bool,
}

impl<S: Survivor> Watcher<S> {
    fn run(mut self) {
        self.scan();
        let mut next_scan = self.next_scan();
        loop {
            let watched: Vec<InstanceId> = self.pidfds.keys().copied().collect();
            let mut fds: Vec<libc::pollfd> = [self.stop.as_raw_fd(), self.receive.as_raw_fd()]
                .into_iter()
                .chain(self.pidfds.values().map(AsRawFd::as_raw_fd))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // (rounded up: a poll that returned a moment early would spin until the scan)
            let timeout = (next_scan.remaining().as_millis() + 1).min(i32::MAX as u128);
            let timeout = timeout as libc::c_int;
            // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfd structs, and
            // every descriptor in it stays open for the call (owned by `self`).
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            if fds[0].revents != 0 {
                return;
            }
            let (mut scan_now, mut joined) = (next_scan.passed(), false);
            if fds[1].revents != 0 {
                let mut buf = [0u8; 16];
                let (mut woken, mut schedules, mut ended, mut followed) =
                    (false, false, false, false);
                while let Ok(n) = self.receive.recv(&mut buf) {
                    // "w": a neighbour's commit gave a queue work; "s": it changed the
                    // schedules; "e": it kept an ending; "f": a follower there waits for
                    // endings; "j" and "l": a neighbour joined or left (the scan below
                    // picks it up).
                    match &buf[..n] {
                        b"w" => woken = true,
                        b"s" => schedules = true,
                        b"e" => ended = true,
                        b"f" => followed = true,
                        b"j" => (scan_now, joined) = (true, true),
                        _ => scan_now = true,
                    }
                }
                if woken || schedules || ended || followed {
                    let Some(store) = self.store.upgrade() else {
                        return;
                    };
                    if woken {
                        store.wake_local();
                    }
                    if schedules {
                        store.wake_schedules();
                    }
                    if ended {
                        store.wake_endings();
                    }
                    if followed {
                        store.followed();
                    }
                }
            }
            // A neighbour whose pidfd fired has exited: from now on it is the rescan's to
            // watch, whether its lock is found free below or (held by a forked child) not.
            for (fd, id) in fds[2..].iter().zip(&watched) {
                if fd.revents != 0 {
                    self.pidfds.remove(id);
                    self.exited.insert(*id);
                    scan_now = true;
                }
            }
            if self.store.strong_count() == 0 {
                return;
            }
            // A pidfd fired (a neighbour died), one joined or left, or the rescan is due.
            if !scan_now {
                continue;
            }
            self.scan();
            next_scan = self.next_scan();
            // (after the scan, which made the newcomer a peer)
            if joined && let Some(store) = self.store.upgrade() {
                store.welcome();
            }
            // (counted once the scan is done: a test that sees the count move knows a whole
            // scan ran since)
            self.wakeups
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// When to read the registry again, nothing else prompting it: soon while a live
    /// neighbour is watched by no pidfd, seldom otherwise.
    fn next_scan(&self) -> RealDeadline {
        RealDeadline::after(if self.unwatched { RESCAN } else { SLOW_RESCAN })
    }

    /// Reads the registered instances: takes back the leases of dead ones, watches the live
    /// ones, clears stray files, and keeps this process's own file in place.
    fn scan(&mut self) {
        let Some(store) = self.store.upgrade() else {
            return;
        };
        // (until this scan finishes, as if a neighbour were watched by the rescan alone)
        self.unwatched = true;
        self.keep_in_place(&store);
        let registered = match store.clone().registrations() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the registered process instances failed");
                return;
            }
        };
        *self.peers.lock() = others(self.id, &registered);
        let mut alive = Vec::new();
        for (id, registration) in &registered {
            if *id == self.id {
                continue;
            }
            match instance::probe(*id, registration) {
                Liveness::Alive => {
                    alive.push(*id);
                    if !self.pidfds.contains_key(id)
                        && !self.exited.contains(id)
                        && let Some(fd) = pidfd_open(registration.pid)
                    {
                        self.pidfds.insert(*id, fd);
                    }
                }
                Liveness::Dead(dead) => match store.clone().reclaim_instance(dead.id) {
                    Ok(n) => {
                        if n > 0 {
                            tracing::warn!(instance = %dead.id, reclaimed = n, "a process sharing the store died; took back its leases");
                        }
                        dead.bury();
                    }
                    // Its file and registration stay, so the next scan (here or in another
                    // process) tries again.
                    Err(e) => {
                        tracing::error!(instance = %dead.id, error = %e, "taking back a dead process's leases failed")
                    }
                },
                // Its leases expire; it may yet be found alive (its file made again).
                Liveness::Unknown(_) => alive.push(*id),
            }
        }
        self.pidfds.retain(|id, _| alive.contains(id));
        self.exited.retain(|id| alive.contains(id));
        self.unwatched = alive.iter().any(|id| !self.pidfds.contains_key(id));
        let dir = self.me.lock().directory().to_owned();
        let names: Vec<InstanceId> = registered.iter().map(|(id, _)| *id).collect();
        clear_strays(&store, self.id, &dir, &names);
    }

    /// Makes this process's lock file again if someone removed or replaced it: without it,
    /// no neighbour could tell this process alive or dead, and its leases would wait out
    /// their expiry if it died.
    fn keep_in_place(&self, store: &Arc<S>) {
        let mut me = self.me.lock();
        if me.in_place() {
            return;
        }
        match me.renew() {
            Ok(registration) => match store.clone().reregister(self.id, &registration) {
                Ok(()) => tracing::warn!(
                    instance = %self.id,
                    "this process's instance file was removed or replaced; made it again"
                ),
                Err(e) => {
                    tracing::error!(instance = %self.id, error = %e, "registering this process's new instance file failed")
                }
            },
            Err(e) => tracing::error!(
                instance = %self.id,
                error = %e,
                "this process's instance file was removed or replaced and cannot be made again; \
                 its leases are left to expire if it dies"
            ),
        }
    }
}

/// Clears the instance files of `dir` whose lock is free and that `registered` (the
/// registrations as read at the start of a scan) does not name. A process may have
/// registered since, and died: its file then looks like a stray's, and burying it would
/// leave its leases to nobody (its registration naming a file that is gone) until they
/// expired. So the registrations are read again once the free locks are held: a lock found
/// free belongs to a process that is gone and can no longer register, so this second
/// reading tells a stray from a registered instance that died. The latter's leases are
/// taken back before its file goes.
fn clear_strays<S: Survivor>(
    store: &Arc<S>,
    me: InstanceId,
    dir: &std::path::Path,
    registered: &[InstanceId],
) {
    let strays: Vec<_> = instance::strays(dir, registered)
        .into_iter()
        .filter(|stray| stray.id != me)
        .collect();
    if strays.is_empty() {
        return;
    }
    let now = match store.clone().registrations() {
        Ok(now) => now,
        // Nothing is buried on a guess: the next scan looks again.
        Err(e) => {
            tracing::warn!(error = %e, "reading the registered process instances failed");
            return;
        }
    };
    for stray in strays {
        if now.iter().any(|(id, _)| *id == stray.id) {
            match store.clone().reclaim_instance(stray.id) {
                Ok(n) => {
                    tracing::warn!(instance = %stray.id, reclaimed = n, "a process sharing the store died as it joined; took back its leases");
                }
                Err(e) => {
                    tracing::error!(instance = %stray.id, error = %e, "taking back a dead process's leases failed");
                    continue;
                }
            }
        }
        stray.bury();
    }
}

/// A descriptor that becomes readable when process `pid` exits (Linux 5.3+); `None` where
/// the kernel has none, which leaves that neighbour to the rescan.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it touches
    // no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A store that registers what the test says and records whose leases were taken back.
    #[derive(Default)]
    struct FakeStore {
        registered: Mutex<Vec<(InstanceId, Registration)>>,
        reclaimed: Mutex<Vec<InstanceId>>,
    }

    impl Survivor for FakeStore {
        fn reclaim_instance(self: Arc<Self>, dead: InstanceId) -> Result<usize> {
            self.reclaimed.lock().push(dead);
            self.registered.lock().retain(|(id, _)| *id != dead);
            Ok(1)
        }
        fn registrations(self: Arc<Self>) -> Result<Vec<(InstanceId, Registration)>> {
            Ok(self.registered.lock().clone())
        }
        fn reregister(self: Arc<Self>, _: InstanceId, _: &Registration) -> Result<()> {
            Ok(())
        }
        fn wake_local(&self) {}
        fn wake_schedules(&self) {}
        fn wake_endings(&self) {}
        fn followed(&self) {}
        fn welcome(&self) {}
    }

    /// A process that registered after a scan read the registrations, and died at once, is
    /// not buried as a stray: the scan reads the registrations again and takes its leases
    /// back first. A file no registration names is buried as before.
    #[test]
    fn an_instance_that_registered_after_the_scan_began_and_died_has_its_leases_taken_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        std::fs::write(&path, b"").unwrap();
        let joined = Instance::register(&path).unwrap();
        let stray = Instance::register(&path).unwrap();
        let me = Instance::register(&path).unwrap();
        let store = Arc::new(FakeStore::default());
        store
            .registered
            .lock()
            .push((joined.id(), joined.registration().clone()));
        let (joined_id, stray_id) = (joined.id(), stray.id());
        let files = me.directory().to_owned();
        // Both die: their locks are free, their files stay.
        drop((joined, stray));
        // The scan had read the registrations before `joined` registered: it names neither.
        clear_strays(&store, me.id(), &files, &[me.id()]);
        assert_eq!(*store.reclaimed.lock(), vec![joined_id]);
        let left: Vec<_> = std::fs::read_dir(&files)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            left,
            vec![format!("{}.lock", me.id())],
            "both dead files are gone"
        );
        assert_ne!(joined_id, stray_id);
    }
}
