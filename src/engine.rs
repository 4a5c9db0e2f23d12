//! What a worker pool, a reaper and a scheduler run on: a [`Backend`] made from any store,
//! and the [`Engine`] a typed pool names, with the kind of application writes its
//! completions carry.

use std::sync::Arc;

use crate::job_store::JobStore;
use crate::protocol::AnyWrites;

/// A store a worker pool runs on, and the kind of application writes its completions carry
/// ([`Output`](crate::Output)'s type parameter): redb tables ([`RedbWrites`](crate::RedbWrites))
/// on a [`Store`](crate::Store), SQL (`SqlWrites`) on a `PgStore`, either ([`AnyWrites`],
/// checked when committed) on a [`Backend`]. Implemented by those three alone.
pub trait Engine: Into<Backend> + Send + Sync + 'static + sealed::Sealed {
    /// The application's writes a completion on this engine carries.
    type Writes: Send + 'static;
    /// Writes of this engine's kind as writes of any kind.
    #[doc(hidden)]
    fn any(writes: Self::Writes) -> AnyWrites {
        AnyWrites(Box::new(writes))
    }
}

pub(crate) mod sealed {
    /// Only leasehold's stores are engines.
    pub trait Sealed {}
}

/// Makes `$store` an engine whose completions carry `$writes`, a [`Backend`] by `.into()`
/// (of the store or a reference to it).
macro_rules! engine {
    ($store:ty, $writes:ty) => {
        impl $crate::engine::sealed::Sealed for $store {}
        impl $crate::engine::Engine for $store {
            type Writes = $writes;
        }
        impl From<$store> for $crate::engine::Backend {
            fn from(store: $store) -> $crate::engine::Backend {
                $crate::engine::Backend(std::sync::Arc::new(store))
            }
        }
        impl From<&$store> for $crate::engine::Backend {
            fn from(store: &$store) -> $crate::engine::Backend {
                $crate::engine::Backend(std::sync::Arc::new(store.clone()))
            }
        }
    };
}
pub(crate) use engine;

impl sealed::Sealed for Backend {}

impl Engine for Backend {
    type Writes = AnyWrites;
    fn any(writes: AnyWrites) -> AnyWrites {
        writes
    }
}

/// A store a [`WorkerPool`](crate::WorkerPool) or a [`Reaper`](crate::Reaper) runs on: made
/// from a [`Store`](crate::Store) or, with the `postgres` feature, a
/// `PgStore` (`leasehold::postgres`), by `.into()` (the pool's and the reaper's
/// constructors take either).
#[derive(Clone)]
pub struct Backend(pub(crate) Arc<dyn JobStore>);

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Backend")
    }
}
