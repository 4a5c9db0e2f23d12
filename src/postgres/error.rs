//! What can go wrong talking to PostgreSQL, as one typed enum ([`crate::Error::Postgres`]).

use postgres::error::SqlState;

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
    /// The role lacks a right the operation needs (creating the schema, writing a table).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The connection was lost while the transaction committed: it may or may not have been
    /// applied. Retrying is safe through the fence (a completion that did land is refused as
    /// already ended by its holder).
    #[error("the connection was lost while committing; the outcome is unknown: {0}")]
    OutcomeUnknown(String),
    /// Any other error the server or the connection reported.
    #[error("PostgreSQL: {message}")]
    Database {
        /// The SQLSTATE, if the server sent one.
        code: Option<String>,
        /// The message.
        message: String,
        /// Whether retrying the transaction may succeed (a serialization failure, a
        /// deadlock).
        transient: bool,
    },
}

impl PgError {
    pub(crate) fn connect(e: postgres::Error) -> PgError {
        // The client's own message is only "error connecting to server": the why is below.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        PgError::Connect(message)
    }

    /// An error from `COMMIT`: a closed connection there means the outcome is unknown.
    pub(crate) fn at_commit(e: postgres::Error) -> PgError {
        if e.is_closed() || e.code().is_none() {
            PgError::OutcomeUnknown(e.to_string())
        } else {
            PgError::from(e)
        }
    }

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
}

impl From<postgres::Error> for PgError {
    fn from(e: postgres::Error) -> PgError {
        let code = e.code().cloned();
        if code == Some(SqlState::INSUFFICIENT_PRIVILEGE) {
            return PgError::PermissionDenied(db_message(&e));
        }
        let transient = matches!(
            &code,
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        );
        PgError::Database {
            code: code.map(|c| c.code().to_owned()),
            message: db_message(&e),
            transient,
        }
    }
}

impl From<postgres::Error> for crate::Error {
    fn from(e: postgres::Error) -> crate::Error {
        crate::Error::Postgres(PgError::from(e))
    }
}

/// The server's own message where there is one (the `Display` of the client's error says
/// only "db error").
fn db_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => e.to_string(),
    }
}
