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
//!   workers here are woken as for a commit of their own;
//! * a stop signal from the handle's drop.
//!
//! Every [`RESCAN`] it also lists the instance directory: new neighbours get a pidfd, and an
//! instance whose process ended without a pidfd event (a handle dropped in a live process, a
//! kernel without pidfds) is found dead there.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, OpenError, Result};
use crate::ids::InstanceId;
use crate::instance::{self, Instance, Liveness};

/// How often the instance directory is listed again when nothing else wakes the thread.
pub(crate) const RESCAN: Duration = Duration::from_millis(100);

/// What the watcher thread needs of the store (implemented by the store's shared state).
pub(crate) trait Survivor: Send + Sync + 'static {
    /// Takes back every lease `dead` held; returns how many.
    fn reclaim_instance(self: Arc<Self>, dead: InstanceId) -> Result<usize>;
    /// Wakes every worker of this process that waits for work.
    fn wake_local(&self);
}

/// This handle's place among the processes of a shared store.
#[derive(Debug)]
pub(crate) struct Neighbours {
    instance: Instance,
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
    /// Registers this process's instance for the store at `path` and binds its wake-up socket.
    /// The watcher thread starts with [`Neighbours::start`], once the store exists.
    pub(crate) fn join(path: &std::path::Path) -> std::result::Result<Neighbours, OpenError> {
        let instance = Instance::register(path)?;
        let io = |source| OpenError::Io {
            path: instance.directory().to_owned(),
            source,
        };
        let socket = UnixDatagram::bind_addr(&address(instance.id()).map_err(io)?).map_err(io)?;
        socket.set_nonblocking(true).map_err(io)?;
        let (stop, stop_rx) = UnixDatagram::pair().map_err(io)?;
        Ok(Neighbours {
            instance,
            socket,
            stop,
            stop_rx: Mutex::new(Some(stop_rx)),
            thread: Mutex::new(None),
        })
    }

    pub(crate) fn instance(&self) -> InstanceId {
        self.instance.id()
    }

    pub(crate) fn directory(&self) -> PathBuf {
        self.instance.directory().to_owned()
    }

    /// Starts the watcher thread; it holds the store weakly.
    pub(crate) fn start<S: Survivor>(&self, store: Weak<S>) -> Result<()> {
        let Some(stop) = self.stop_rx.lock().take() else {
            return Ok(());
        };
        let receive = self.socket.try_clone().map_err(Error::ThreadSpawn)?;
        let watcher = Watcher {
            dir: self.directory(),
            me: self.instance(),
            store,
            receive,
            stop,
            pidfds: BTreeMap::new(),
        };
        let handle = std::thread::Builder::new()
            .name("lh-neighbours".into())
            .spawn(move || watcher.run())
            .map_err(Error::ThreadSpawn)?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// Tells every other registered process that a queue has work: one datagram each, to
    /// the instances listed now (a directory of a few entries), so a process that joined an
    /// instant ago is not missed. A neighbour that is gone or whose socket is full misses it
    /// and finds the work by its own timers.
    pub(crate) fn wake_peers(&self) {
        self.send_to_others(b"w");
    }

    /// Announces this instance to the others, so that their watchers look at it now (and
    /// hold a pidfd for it) rather than at their next rescan.
    pub(crate) fn announce(&self) {
        self.send_to_others(b"j");
    }

    fn send_to_others(&self, message: &[u8]) {
        let me = self.instance();
        for peer in instance::list(self.instance.directory()) {
            if peer != me
                && let Ok(addr) = address(peer)
            {
                let _ = self.socket.send_to_addr(message, &addr);
            }
        }
    }

    /// Removes this process's instance file at a clean close, its leases given back.
    pub(crate) fn retire(&self) {
        self.instance.retire();
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

/// The watcher thread's state.
struct Watcher<S> {
    dir: PathBuf,
    me: InstanceId,
    store: Weak<S>,
    receive: UnixDatagram,
    stop: UnixDatagram,
    /// A pidfd per live neighbour that has one.
    pidfds: BTreeMap<InstanceId, OwnedFd>,
}

impl<S: Survivor> Watcher<S> {
    fn run(mut self) {
        self.scan();
        loop {
            let mut fds: Vec<libc::pollfd> = [self.stop.as_raw_fd(), self.receive.as_raw_fd()]
                .into_iter()
                .chain(self.pidfds.values().map(AsRawFd::as_raw_fd))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let timeout = RESCAN.as_millis() as libc::c_int;
            // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfd structs, and
            // every descriptor in it stays open for the call (owned by `self`).
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            if fds[0].revents != 0 {
                return;
            }
            if fds[1].revents != 0 {
                let mut buf = [0u8; 16];
                let mut woken = false;
                while let Ok(n) = self.receive.recv(&mut buf) {
                    // "w": a neighbour's commit gave a queue work; "j": a neighbour joined
                    // (the scan below picks it up).
                    woken |= buf[..n] == *b"w";
                }
                if woken {
                    match self.store.upgrade() {
                        Some(store) => store.wake_local(),
                        None => return,
                    }
                }
            }
            // A pidfd fired (a neighbour died), or the rescan is due.
            if self.store.strong_count() == 0 {
                return;
            }
            self.scan();
        }
    }

    /// Lists the instances: takes back the leases of dead ones, watches the live ones.
    fn scan(&mut self) {
        let mut alive = Vec::new();
        for id in instance::list(&self.dir) {
            if id == self.me {
                continue;
            }
            match instance::probe(&self.dir, id) {
                Liveness::Alive => {
                    alive.push(id);
                    if !self.pidfds.contains_key(&id)
                        && let Some(fd) = instance::pid_of(&self.dir, id).and_then(pidfd_open)
                    {
                        self.pidfds.insert(id, fd);
                    }
                }
                Liveness::Dead(dead) => {
                    let Some(store) = self.store.upgrade() else {
                        return;
                    };
                    match store.reclaim_instance(dead.id) {
                        Ok(n) => {
                            if n > 0 {
                                tracing::warn!(instance = %dead.id, reclaimed = n, "a process sharing the store died; took back its leases");
                            }
                            dead.bury();
                        }
                        // Its file stays, so the next scan (here or in another process)
                        // tries again.
                        Err(e) => {
                            tracing::error!(instance = %dead.id, error = %e, "taking back a dead process's leases failed")
                        }
                    }
                }
            }
        }
        self.pidfds.retain(|id, _| alive.contains(id));
    }
}

/// A descriptor that becomes readable when process `pid` exits (Linux 5.3+); `None` where
/// the kernel has none, which leaves that neighbour to the rescan.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it touches
    // no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}
