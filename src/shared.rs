//! A store shared by processes, as the [`Store`] handle sees it: taking back the leases of
//! processes that are gone (at open, and when the watcher sees one die), and giving back its
//! own at a clean close. The instances themselves are in [`crate::instance`], the watcher
//! thread in [`crate::neighbours`], the transactions in [`crate::protocol`].

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::ids::InstanceId;
use crate::instance::{self, Liveness};
use crate::neighbours::{Neighbours, Survivor};
use crate::protocol;
use crate::report::ReapReport;
use crate::store::{Inner, Store};

impl Store {
    /// Starts watching the other processes, when several share the store: after recovery at
    /// open, so that what opening takes back is reported as such.
    pub(crate) fn start_neighbours(&self) -> Result<()> {
        if let Some(n) = &self.inner.neighbours {
            n.start(Arc::downgrade(&self.inner))?;
            n.announce();
        }
        Ok(())
    }

    /// Takes back every running lease whose holder is not a live neighbour, in batches; the
    /// dead instances found on the way are removed once their leases are back.
    pub(crate) fn reclaim_orphans(&self, me: InstanceId, dir: &Path) -> Result<ReapReport> {
        let probed: Arc<Mutex<Probed>> = Arc::default();
        let (dir, seen) = (dir.to_owned(), probed.clone());
        let report = self.in_batches(move |tx, batch| {
            let mut seen = seen.lock();
            protocol::reclaim_orphans(tx, batch, |id| id == me || seen.alive(&dir, id))
        })?;
        for dead in std::mem::take(&mut probed.lock().dead) {
            dead.bury();
        }
        Ok(report)
    }

    /// For the model-based test: what a surviving process does when instance `dead` dies
    /// (see [`crate::StoreBuilder::simulated_instance`]).
    #[doc(hidden)]
    pub fn reclaim_dead_instance(&self, dead: InstanceId) -> Result<usize> {
        self.reclaim_instance(dead)
    }

    /// Takes back every lease a dead neighbour held (its instance lock was free); returns how
    /// many.
    pub(crate) fn reclaim_instance(&self, dead: InstanceId) -> Result<usize> {
        let report = self.in_batches(move |tx, batch| protocol::reclaim_holder(tx, dead, batch))?;
        Ok(report.reclaimed.len())
    }

    /// This handle's process instance, when processes share the store.
    pub fn instance(&self) -> Option<InstanceId> {
        self.inner.neighbours.as_ref().map(Neighbours::instance)
    }
}

impl Survivor for Inner {
    fn reclaim_instance(self: Arc<Self>, dead: InstanceId) -> Result<usize> {
        Store { inner: self }.reclaim_instance(dead)
    }

    fn wake_local(&self) {
        self.notifier.notify_all();
    }
}

/// The neighbours [`Store::reclaim_orphans`] looked at: each probed once, the dead ones held
/// locked until their leases are back.
#[derive(Default)]
struct Probed {
    alive: std::collections::BTreeSet<InstanceId>,
    dead: Vec<instance::Dead>,
}

impl Probed {
    fn alive(&mut self, dir: &Path, id: InstanceId) -> bool {
        if self.alive.contains(&id) {
            return true;
        }
        if self.dead.iter().any(|d| d.id == id) {
            return false;
        }
        match instance::probe(dir, id) {
            Liveness::Alive => {
                self.alive.insert(id);
                true
            }
            Liveness::Dead(dead) => {
                self.dead.push(dead);
                false
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The last handle of a process that shares the store gives back what it still holds
        // and retires its instance, so that no neighbour has to find it dead: that costs the
        // neighbour a write transaction, and a neighbour stopped in one stalls every writer.
        // (A handle dropped while its watcher briefly holds another reference skips this; its
        // instance is then found dead as if its process had ended.)
        if Arc::strong_count(&self.inner) == 1
            && let Some(n) = &self.inner.neighbours
        {
            match self.reclaim_instance(n.instance()) {
                Ok(_) => n.retire(),
                Err(e) => {
                    tracing::warn!(error = %e, "giving back this process's leases at close failed")
                }
            }
        }
    }
}
