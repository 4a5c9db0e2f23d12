//! A store shared by processes, as the [`Store`] handle sees it: taking back the leases of
//! processes that are gone (at open, and when the watcher sees one die), and giving back its
//! own at a clean close. The instances themselves are in [`crate::redb_store::instance`], the watcher
//! thread in [`crate::redb_store::neighbours`]; the reclaims themselves are the protocol's
//! ([`crate::protocol::expire`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::ReadableTable;

use crate::batches::Batch;
use crate::error::Result;
use crate::ids::InstanceId;
use crate::ids::{Attempt, JobId};
use crate::job::ReclaimPath;
use crate::protocol::{Stages, expire};
use crate::redb_store::instance::{self, Liveness, Registration};
use crate::redb_store::neighbours::{Neighbours, Survivor};
use crate::redb_store::reading;
use crate::redb_store::snapshots::Snapshots as _;
use crate::redb_store::started;
use crate::redb_store::store::{Inner, Store};
use crate::redb_store::writing::{Tx, load};
use crate::report::ReapReport;
use crate::report::Reclaim;
use crate::state::JobState;

impl Store {
    /// Starts watching the other processes, when several share the store: after recovery at
    /// open, so that what opening takes back is reported as such.
    pub(crate) fn start_neighbours(&self) -> Result<()> {
        if let Some(n) = &self.inner.neighbours {
            n.set_peers(&self.registrations()?);
            n.start(Arc::downgrade(&self.inner))?;
            n.announce();
        }
        Ok(())
    }

    /// The process instances the store registers.
    fn registrations(&self) -> Result<Vec<(InstanceId, Registration)>> {
        self.reading("the registered process instances", reading::registrations)
    }

    /// Takes back every running lease whose holder is provably gone, in batches: a
    /// registered instance whose lock file's lock is free (forgotten once its leases are
    /// back), and leases that no instance holds (granted while the store was not shared).
    /// A live neighbour's lease, and one whose holder cannot be looked at, is never touched.
    pub(crate) fn reclaim_orphans(&self, me: InstanceId) -> Result<ReapReport> {
        let mut dead = Vec::new();
        for (id, registration) in self.registrations()? {
            if id == me {
                continue;
            }
            match instance::probe(id, &registration) {
                Liveness::Dead(d) => dead.push(d),
                Liveness::Alive => {}
                Liveness::Unknown(why) => {
                    tracing::info!(instance = %id, why, "cannot tell whether a process sharing the store lives; its leases are left to expire")
                }
            }
        }
        let gone: Arc<BTreeSet<InstanceId>> = Arc::new(dead.iter().map(|d| d.id).collect());
        let started = started::read_all(dead.iter().map(|d| started::of_instance(d.path())));
        let report = self.in_batches(move |tx, batch| {
            reclaim_orphans(tx, batch, |id| !gone.contains(&id), &started)
        })?;
        for d in dead {
            // Its leases are back: forget it, then remove its file.
            self.reclaim_instance(d.id)?;
            d.bury();
        }
        Ok(report)
    }

    /// For the model-based test: what a surviving process does when instance `dead` dies
    /// (see [`crate::StoreBuilder::simulated_instance`]).
    #[doc(hidden)]
    pub fn reclaim_dead_instance(&self, dead: InstanceId) -> Result<usize> {
        self.reclaim_instance(dead)
    }

    /// For the process tests: how many times this handle's watcher of the other processes
    /// has woken and read the registry (`None` unless processes share the store).
    #[doc(hidden)]
    pub fn watcher_wakeups(&self) -> Option<u64> {
        self.inner.neighbours.as_ref().map(Neighbours::wakeups)
    }

    /// Takes back every lease a dead (or retiring) instance held, and forgets it once none
    /// is left; returns how many.
    pub(crate) fn reclaim_instance(&self, dead: InstanceId) -> Result<usize> {
        let registered = self
            .registrations()?
            .into_iter()
            .find(|(id, _)| *id == dead);
        let started = match registered {
            Some((_, registration)) => started::read(&started::of_instance(&registration.path())),
            None => Stages::default(),
        };
        let report = self.in_batches(move |tx, limit| {
            let batch = reclaim_holder(tx, dead, limit, &started)?;
            if batch.looked < limit {
                // The last of its leases are back.
                tx.tables.forget_instance(dead)?;
                tx.tally.writes += 1;
            }
            Ok(batch)
        })?;
        Ok(report.reclaimed.len())
    }

    /// Records this process's instance again, its lock file made anew.
    fn reregister(&self, me: InstanceId, registration: Registration) -> Result<()> {
        self.write(move |tx| {
            tx.tables.register_instance(me, &registration)?;
            tx.tally.writes += 1;
            Ok(())
        })
    }

    /// This handle's process instance, when processes share the store.
    pub fn instance(&self) -> Option<InstanceId> {
        self.inner.neighbours.as_ref().map(Neighbours::instance)
    }
}

impl Survivor for Inner {
    fn reclaim_instance(self: Arc<Self>, dead: InstanceId) -> Result<usize> {
        Store::borrowed(self).reclaim_instance(dead)
    }

    fn registrations(self: Arc<Self>) -> Result<Vec<(InstanceId, Registration)>> {
        Store::borrowed(self).registrations()
    }

    fn reregister(self: Arc<Self>, me: InstanceId, registration: &Registration) -> Result<()> {
        Store::borrowed(self).reregister(me, registration.clone())
    }

    fn wake_local(&self) {
        self.notifier.notify_all();
    }

    fn wake_schedules(&self) {
        self.notifier.notify_schedules();
    }

    fn wake_endings(&self) {
        self.notifier.notify_endings();
    }

    fn followed(&self) {
        self.notifier.note_followed();
    }

    fn welcome(&self) {
        if let Some(n) = &self.neighbours
            && self.notifier.follows_here()
        {
            n.following();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The application's last handle, in a process that shares the store, gives back what
        // it still holds and retires its instance, so that no neighbour has to find it dead:
        // that costs the neighbour a write transaction, and a neighbour stopped in one stalls
        // every writer. It does so here, on the application's thread, even while the writer
        // or the watcher holds the store for a moment (their borrowed handles are not counted):
        // the watcher is stopped first, so that it cannot make the retired file again.
        if self.counted
            && self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(n) = &self.inner.neighbours
        {
            n.stop();
            match self.reclaim_instance(n.instance()) {
                Ok(_) => {
                    n.retire();
                    if let Some(table) = self.inner.started.get() {
                        table.remove();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "giving back this process's leases at close failed")
                }
            }
        }
    }
}

/// Takes back up to `limit` leases held by `instance`, a process that is known to be dead
/// (its instance lock was free): all of them in one transaction when they fit, recorded as
/// [`ReclaimPath::ProcessDied`].
fn reclaim_holder(
    tx: &mut Tx<'_>,
    instance: InstanceId,
    limit: usize,
    started: &Stages,
) -> Result<Batch<Reclaim>> {
    let Some(holders) = &tx.tables.holders else {
        return Ok(Batch {
            items: Vec::new(),
            looked: 0,
        });
    };
    let mut held = Vec::new();
    for entry in holders.iter()? {
        let (job, holder) = entry?;
        let (holder, attempt) = holder.value();
        if holder != instance.0 {
            continue;
        }
        if held.len() == limit {
            break;
        }
        held.push((JobId(job.value()), Attempt(attempt)));
    }
    let looked = held.len();
    let mut reclaimed = Vec::with_capacity(held.len());
    for (id, attempt) in held {
        let job = load(tx, id)?;
        if job.state == JobState::Running && job.attempt == attempt {
            reclaimed.push(expire(tx, &job, ReclaimPath::ProcessDied, started)?.1);
        } else {
            // An entry its attempt's end did not remove cannot exist; tolerate one anyway.
            tx.tables.unhold(id)?;
        }
    }
    Ok(Batch {
        items: reclaimed,
        looked,
    })
}

/// At open in a store shared by processes: takes back up to `limit` running leases whose
/// holder is not `alive` ([`ReclaimPath::ProcessDied`]), and those no process instance holds
/// (granted while the store was not shared, by a process that is gone: [`ReclaimPath::Recovery`]).
/// A live neighbour's lease is never touched.
fn reclaim_orphans(
    tx: &mut Tx<'_>,
    limit: usize,
    mut alive: impl FnMut(InstanceId) -> bool,
    started: &Stages,
) -> Result<Batch<Reclaim>> {
    let mut orphans = Vec::new();
    for entry in tx.tables.expiry.iter()? {
        let (_, _, id) = entry?.0.value();
        let holder = match &tx.tables.holders {
            Some(holders) => holders.get(id)?.map(|h| InstanceId(h.value().0)),
            None => None,
        };
        let path = match holder {
            Some(holder) if alive(holder) => continue,
            Some(_) => ReclaimPath::ProcessDied,
            None => ReclaimPath::Recovery,
        };
        if orphans.len() == limit {
            break;
        }
        orphans.push((JobId(id), path));
    }
    let looked = orphans.len();
    let mut reclaimed = Vec::with_capacity(orphans.len());
    for (id, path) in orphans {
        // What the dead kept says nothing of a lease no instance held.
        let started = match path {
            ReclaimPath::ProcessDied => started,
            _ => &Stages::default(),
        };
        reclaimed.push(expire(tx, &load(tx, id)?, path, started)?.1);
    }
    Ok(Batch {
        items: reclaimed,
        looked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{job_store::JobStore, job_store::ReadJobs, new_job::NewJob, redb_store::Sharing};

    fn lock_files(store_path: &std::path::Path) -> usize {
        std::fs::read_dir(store_path.with_file_name("jobs.redb.procs"))
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
                    .count()
            })
            .unwrap_or(0)
    }

    #[test]
    fn the_last_handle_retires_its_instance_while_a_store_thread_borrows_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.redb");
        let store = Store::builder(&path)
            .sharing(Sharing::MultiProcess)
            .open()
            .unwrap();
        let id = store.enqueue(NewJob::new("q", "x")).unwrap();
        store
            .claim("q", "w", std::time::Duration::from_secs(3600))
            .unwrap();
        let copy = store.clone();
        assert_eq!(lock_files(&path), 1);
        // As the watcher or the writer thread does, for one task at a time.
        let borrowed = Store::borrowed(store.inner.clone());
        drop(store);
        assert_eq!(lock_files(&path), 1, "a clone is still the application's");
        drop(copy);
        assert_eq!(lock_files(&path), 0, "the last handle retired the instance");
        let job = borrowed.job(id).unwrap().unwrap();
        assert_eq!(
            job.state(),
            crate::state::JobState::Queued,
            "and gave back its lease"
        );
        drop(borrowed);
        assert_eq!(lock_files(&path), 0);
    }
}
