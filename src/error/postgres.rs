//! What can go wrong talking to PostgreSQL, as one typed enum ([`crate::Error::Postgres`]):
//! plain data, so that the crate's [`crate::Error`] can wrap it without depending on the
//! engine. How the client's errors become these is the engine's (`src/postgres/error.rs`).

/// The SQLSTATE of a serialization failure and of a deadlock: the transaction is worth
/// running again.
const SERIALIZATION_FAILURE: &str = "40001";
const DEADLOCK_DETECTED: &str = "40P01";
/// "cached plan must not change result type" comes with this code.
const FEATURE_NOT_SUPPORTED: &str = "0A000";

/// A PostgreSQL store's failure.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The connection URL does not parse.
    #[error("not a PostgreSQL connection URL: {0}")]
    BadUrl(String),
    /// The schema name is not a plain identifier (lowercase letters, digits, `_`).
    #[error("schema name {0:?} must be 1 to 63 of a-z, 0-9 and _, not starting with a digit")]
    BadSchemaName(String),
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(String),
    /// No connection to run the operation on: the server refused a new one because it
    /// holds as many as it may (SQLSTATE 53300: `max_connections`, or the role's or
    /// database's `CONNECTION LIMIT`), or every one the handle may hold
    /// ([`crate::postgres::PgStoreBuilder::connections`]) stayed in use for as long as a
    /// statement may run. Nothing was done; the operation can be tried again once a
    /// connection is free (a pool does, at its next round or heartbeat). docs/postgres.md,
    /// "Connections", says what one pool holds.
    #[error("PostgreSQL has no connection to spare: {0}")]
    TooManyConnections(String),
    /// The schema holds tables that are not a leasehold store's: nothing was changed.
    #[error("schema {schema} is not a leasehold store ({detail}); nothing was changed")]
    NotALeaseholdSchema {
        /// The schema.
        schema: String,
        /// What was found.
        detail: String,
    },
    /// The schema was made by a newer leasehold: this build does not know its format.
    #[error(
        "schema {schema} has leasehold schema version {found}; this build knows up to {supported}"
    )]
    NewerSchema {
        /// The schema.
        schema: String,
        /// Its version.
        found: u32,
        /// The newest this build knows.
        supported: u32,
    },
    /// An older build made the store, and this open may not upgrade it (a reader's:
    /// [`crate::postgres::PgStoreBuilder::create_if_missing`] off). Nothing was changed; the
    /// first open that may write upgrades it.
    #[error(
        "schema {schema} has leasehold schema version {found}, made by an older build; this \
         build reads version {supported}: open it once for writing (the application, or a \
         write command of the tool such as `leasehold reap`) to upgrade it"
    )]
    OlderSchema {
        /// The schema.
        schema: String,
        /// Its version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The schema holds no leasehold store (it is missing, or has no leasehold tables), and
    /// the store was opened not to make one ([`crate::postgres::PgStoreBuilder::create_if_missing`]).
    /// Nothing was made.
    #[error("schema {0} holds no leasehold store (is its name right?); nothing was made")]
    NoStore(String),
    /// The schema is one of PostgreSQL's own (`pg_catalog`, `pg_toast`, any `pg_*`,
    /// `information_schema`): leasehold's tables never go there. Nothing was changed.
    #[error("schema {0:?} is PostgreSQL's own; name a schema for leasehold's tables")]
    SystemSchema(String),
    /// leasehold's tables were altered by hand (a column's type, a missing column or
    /// index): this build cannot read or write them safely, and refuses rather than guess.
    /// Nothing was changed.
    #[error("{}leasehold's tables were altered: {detail}; nothing was changed", match .schema { Some(s) => format!("schema {s}: "), None => String::new() })]
    SchemaAltered {
        /// The schema, where known.
        schema: Option<String>,
        /// Which column or index, and what was found.
        detail: String,
    },
    /// The role lacks a right the operation needs (creating the schema, writing a table).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The transaction may or may not have been applied, or may be lost by a failover: the
    /// connection was lost while it committed, or the server committed it locally but
    /// its wait for the synchronous standby was cancelled (by an operator, a watchdog, a
    /// shutdown), so the standby may not have it. Retrying is safe through the fence (a
    /// completion that did land is refused as already ended by its holder); an enqueue
    /// retried without a unique key may make a second job.
    #[error("the commit's outcome is unknown: {0}")]
    OutcomeUnknown(String),
    /// The server is on an older timeline than one this handle has already written on: an
    /// old primary, started again after a standby was promoted in its place (a URL that
    /// names both may reach it first). Its commits since the promotion exist only there,
    /// and writing on it would fork the store's history; nothing was done. Fence or rewind
    /// the old primary (`pg_rewind`, or make it a standby) before it takes connections.
    #[error(
        "the server is on timeline {found}, behind timeline {seen} this handle already wrote          on: an old primary after a failover? Nothing was done; fence or rewind it"
    )]
    StalePrimary {
        /// The server's timeline.
        found: u32,
        /// The newest timeline this handle has seen.
        seen: u32,
    },
    /// Any other error the server or the connection reported.
    #[error("PostgreSQL: {message}")]
    Database {
        /// The SQLSTATE, if the server sent one.
        code: Option<String>,
        /// The message.
        message: String,
        /// Whether running the transaction again may succeed, nothing of it having been
        /// committed: a serialization failure, a deadlock, or a connection found broken
        /// before the transaction began.
        transient: bool,
    },
}

impl PgError {
    /// Worth running the whole transaction again.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            PgError::Database {
                transient: true,
                ..
            }
        )
    }

    /// The server no longer accepts a statement prepared before one of its tables was
    /// altered ("cached plan must not change result type"): prepare it again.
    pub(crate) fn is_stale_statement(&self) -> bool {
        matches!(
            self,
            PgError::Database { code: Some(code), message, .. }
                if code == FEATURE_NOT_SUPPORTED
                    && message.starts_with("cached plan must not change result type")
        )
    }
}

/// Whether `code` is a serialization failure or a deadlock.
pub(crate) fn transient_code(code: &str) -> bool {
    code == SERIALIZATION_FAILURE || code == DEADLOCK_DETECTED
}
