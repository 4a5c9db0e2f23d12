//! Configuring and opening a [`Store`]: the settings, what each durability and sharing mode
//! promises, and the checks that refuse nonsense before the file is touched.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::ConcurrencyMode;

use crate::clock::{Clock, MonotonicClock};
use crate::config::Durability;
use crate::error::{ConfigError, Result};
use crate::ids::InstanceId;
use crate::redb_store::neighbours::Neighbours;
use crate::redb_store::open::{self, EngineOptions};
use crate::redb_store::started;
use crate::redb_store::store::Store;
use crate::redb_store::writing::Policy;

/// Configures and opens a [`Store`]. See [`Store::builder`].
#[derive(Debug)]
pub struct StoreBuilder {
    path: PathBuf,
    backend: Option<Box<dyn redb::StorageBackend>>,
    sharing: Sharing,
    clock: Arc<dyn Clock>,
    durability: Durability,
    policy: crate::protocol::Policy,
    recover_on_open: bool,
    simulated_instance: Option<InstanceId>,
    verify_on_open: bool,
    cache_size: usize,
}

impl StoreBuilder {
    crate::config::policy_setters!(
        StoreBuilder,
        policy,
        "so the file stops growing under a steady load (redb reuses the freed pages)."
    );

    /// The time source. Default: the host's [`MonotonicClock`]. Tests use a
    /// [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> StoreBuilder {
        self.clock = Arc::new(clock);
        self
    }

    /// What a commit promises. Default: [`Durability::Immediate`].
    pub fn durability(mut self, durability: Durability) -> StoreBuilder {
        self.durability = durability;
        self
    }

    /// Whether to take back every running lease at open. Default: on.
    ///
    /// The open holds redb's writer lock, which proves no other process writes the store, so
    /// every lease found running at open belongs to a process that is gone; waiting out its
    /// lease would only delay its job.
    pub fn recover_on_open(mut self, on: bool) -> StoreBuilder {
        self.recover_on_open = on;
        self
    }

    /// Whether to verify every page's checksum at open. Default: on. A damaged file then fails
    /// to open with [`OpenError::Corrupt`](crate::OpenError::Corrupt) instead of being
    /// trusted; the price is one read of the whole file per open, and the pages read stay in
    /// redb's cache, so a large store's process starts at about [`StoreBuilder::cache_size`]
    /// of resident memory (BENCHMARKS.md has the figures of `leasehold bench --only depth`).
    pub fn verify_on_open(mut self, on: bool) -> StoreBuilder {
        self.verify_on_open = on;
        self
    }

    /// How the file is shared with other processes. Default: [`Sharing::SingleWriter`].
    pub fn sharing(mut self, sharing: Sharing) -> StoreBuilder {
        self.sharing = sharing;
        self
    }

    /// For the model-based test: grants leases as held by process instance `id`, as a store
    /// shared by processes does, without any of the sharing (see
    /// [`Store::reclaim_dead_instance`]).
    #[cfg(feature = "__internal")]
    #[doc(hidden)]
    pub fn simulated_instance(mut self, id: InstanceId) -> StoreBuilder {
        self.simulated_instance = Some(id);
        self
    }

    /// redb's page cache size in bytes: the most a store's process keeps of the file in
    /// memory (see [`StoreBuilder::verify_on_open`] for what fills it at open). Default: 64 MiB.
    pub fn cache_size(mut self, bytes: usize) -> StoreBuilder {
        self.cache_size = bytes;
        self
    }

    /// Opens the store, creating the file if it does not exist.
    pub fn open(self) -> Result<Store> {
        self.policy.check()?;
        if self.sharing != Sharing::Exclusive
            && matches!(self.durability, Durability::Eventual { .. })
        {
            return Err(ConfigError::EventualDurabilityShared.into());
        }
        let shared = self.sharing == Sharing::MultiProcess;
        if shared && self.backend.is_some() {
            return Err(ConfigError::MultiProcessNeedsAFile.into());
        }
        if shared {
            crate::redb_store::instance::check_directory(&self.path)?;
        }
        // A store on a file keeps the table of how far its pools' leases got beside it (one
        // process alone on the file) or beside its instance's lock file (processes sharing it).
        let on_file = self.backend.is_none();
        let db = open::open_database(
            &self.path,
            self.backend,
            &EngineOptions {
                cache_size: self.cache_size,
                verify: self.verify_on_open,
                mode: self.sharing.mode(),
            },
        )?;
        open::prepare(&db, &self.path)?;
        // Only once the store opened: a refused open leaves no instance behind (and makes no
        // directory). Registered in the store before its first lease, so that from then on a
        // process that shares the store is known to its neighbours, alive or dead.
        let neighbours = match shared {
            true => Some(Neighbours::join(&self.path)?),
            false => None,
        };
        let registration = neighbours
            .as_ref()
            .map(|n| (n.instance(), n.registration()));
        let settled = open::settle(
            &db,
            &self.path,
            self.clock,
            registration.as_ref().map(|(id, r)| (*id, r)),
        );
        let open::Settled {
            clock,
            upgraded_from,
        } = match settled {
            Ok(settled) => settled,
            Err(e) => {
                if let Some(n) = &neighbours {
                    n.retire();
                }
                return Err(e);
            }
        };
        let policy = Policy {
            rules: self.policy,
            instance: neighbours
                .as_ref()
                .map(Neighbours::instance)
                .or(self.simulated_instance),
        };
        let store = Store::from_parts(db, clock, self.path, self.durability, policy, neighbours)?;
        if let Some(older) = upgraded_from {
            let _ = store.inner.upgraded_from.set(older);
        }
        let table = match (&store.inner.neighbours, on_file) {
            (_, false) => None,
            (None, true) => Some(started::beside(store.path())),
            (Some(n), true) => Some(started::of_instance(&n.registration().path())),
        };
        if self.recover_on_open {
            let report = store.recover(table.as_deref())?;
            if !report.reclaimed.is_empty() {
                tracing::warn!(
                    reclaimed = report.reclaimed.len(),
                    "took back leases of a process that ended without releasing them"
                );
            }
        }
        if let Some(table) = table {
            let _ = store
                .inner
                .started
                .set(started::StartedTable::create(table));
        }
        store.start_neighbours()?;
        Ok(store)
    }
}

/// How a store file is shared between processes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// One process writes; any number of others may open the file read-only at the same time
    /// ([`StoreReader`](crate::StoreReader), the `leasehold` tool's `stats`, `jobs`, `show`,
    /// `check` and `watch`) and follow its commits. Every commit is two-phase (redb's rule
    /// for shared files), and [`Durability::Eventual`] is not available. The default, so an
    /// operator can look into a running application's store.
    #[default]
    SingleWriter,
    /// No other process may open the file at all, not even to read. Allows
    /// [`Durability::Eventual`] and one-phase commits.
    Exclusive,
    /// Any number of processes of one host open the store and write it, one write transaction
    /// at a time across them (redb's multi-writer mode). Each process registers an instance
    /// held alive by a kernel lock beside the store; when a process dies, a surviving one
    /// takes back every lease it held at once, and an enqueue in one process wakes idle
    /// workers in the others. Opening takes back only the leases of processes that are gone.
    /// Needs a local filesystem with working file locks; [`Durability::Eventual`] is not
    /// available.
    MultiProcess,
}

impl Sharing {
    pub(crate) fn mode(self) -> ConcurrencyMode {
        match self {
            Sharing::SingleWriter => ConcurrencyMode::SingleWriter,
            Sharing::Exclusive => ConcurrencyMode::ExclusiveWriter,
            Sharing::MultiProcess => ConcurrencyMode::MultiWriter,
        }
    }
}

impl Store {
    /// A builder for the store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> StoreBuilder {
        StoreBuilder {
            path: path.as_ref().to_owned(),
            backend: None,
            sharing: Sharing::default(),
            clock: Arc::new(MonotonicClock::new()),
            durability: Durability::Immediate,
            policy: crate::protocol::Policy::default(),
            recover_on_open: true,
            simulated_instance: None,
            verify_on_open: true,
            cache_size: 64 << 20,
        }
    }

    /// A builder for a store kept in `backend` instead of a file: redb's
    /// [`InMemoryBackend`](redb::backends::InMemoryBackend) for a store that lives only as
    /// long as the process, or a backend of the application's own (tests use one that
    /// freezes what is durable at each sync, and one that injects I/O errors). Such a store
    /// cannot be shared with another process (its sharing is [`Sharing::Exclusive`]).
    pub fn with_backend(backend: impl redb::StorageBackend) -> StoreBuilder {
        let mut builder = Store::builder("<backend>");
        builder.backend = Some(Box::new(backend));
        // Sharing needs the backend's byte-range locks, which most backends do not have.
        builder.sharing = Sharing::Exclusive;
        builder
    }

    /// Opens (or creates) the store at `path` with the defaults.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::builder(path).open()
    }
}
