//! The redb engine: the lease protocol on one redb file (or a storage backend of the
//! application's), shared by the processes of one host if need be.
//!
//! What leaves this folder is named here and nowhere else: the store and its builder, the
//! read-only view, the application's transaction, and the few helpers the seam, the pool
//! and the tests use. Everything else is the engine's own.
//!
//! | file | one idea |
//! |---|---|
//! | `store.rs`, `builder.rs` | the handle and its settings |
//! | `commit.rs` | write transactions: the group, the store's time, durability, what a commit wakes |
//! | `open.rs`, `create.rs` | opening and refusing files; creating one so that a crash leaves nothing half-made |
//! | `crashed_file.rs` | reading a store whose writer died, its repair kept in memory |
//! | `records.rs` | the protocol's records (`src/protocol/`) over a write transaction |
//! | `writing.rs` | a write transaction as the protocol sees it: the tables, the time, the tallies |
//! | `app_transaction.rs` | the application's side of a leasehold transaction |
//! | `index.rs`, `search.rs` | index maintenance, and finding work in the indexes |
//! | `reading.rs`, `snapshots.rs`, `store_reader.rs`, `check.rs` | the read side (functions over a snapshot, and `ReadJobs` once over them for a store and a reader), the read-only view, the integrity check |
//! | `schema.rs` | the tables (records become bytes in the crate's one codec, `src/codec.rs`) |
//! | `group.rs` | group commit |
//! | `instance.rs`, `neighbours.rs`, `shared.rs` | processes sharing a store |
//! | `started.rs` | how far each of a pool's leases got, for whoever takes back a dead process's |
//! | `contain.rs` | the engine's panics on a damaged page, kept quiet |
//! | `backend.rs` | the store as a pool's and a reaper's |

mod app_transaction;
mod backend;
mod builder;
mod check;
mod commit;

mod contain;
mod crashed_file;
mod create;
mod group;
mod index;
mod instance;
mod neighbours;
mod open;
mod reading;
mod records;
mod schema;
mod search;
mod shared;
mod snapshots;
mod started;
mod store;
mod store_reader;
mod writing;

pub use app_transaction::{RESERVED_TABLE_PREFIX, RedbWrites, Transaction};
pub use builder::{Sharing, StoreBuilder};
pub use schema::SCHEMA_VERSION;
pub use store::Store;
pub use store_reader::{HolderState, StoreReader};

#[cfg(feature = "__internal")]
pub(crate) use crate::codec::decode_counters;
