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
    /// The schema holds no leasehold store (it is missing, or has no leasehold tables), and
    /// the store was opened not to make one ([`super::PgStoreBuilder::create_if_missing`]).
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
        /// Whether running the transaction again may succeed, nothing of it having been
        /// committed: a serialization failure, a deadlock, or a connection found broken
        /// before the transaction began.
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

    /// An error from `COMMIT`. Only the server's word that it rolled the transaction back
    /// is a definite "not committed": a serialization failure or deadlock (class 40) or a
    /// deferred constraint (class 23). Anything else may have come after the commit record
    /// was written: a connection closed or cut, and also a backend ended by an operator or
    /// a shutdown (57P01, 57P02, ... with a code, and so once taken for a plain failure,
    /// which a caller retried into a duplicate).
    pub(crate) fn at_commit(e: postgres::Error) -> PgError {
        let definite = e
            .code()
            .is_some_and(|c| c.code().starts_with("40") || c.code().starts_with("23"));
        match definite {
            true => PgError::from(e),
            false => PgError::OutcomeUnknown(describe(&e)),
        }
    }

    /// An error from `BEGIN`: nothing of the transaction reached the server, so one that a
    /// broken connection caused (a backend ended, a server restarted while the connection
    /// was idle) is worth running again on a new connection.
    pub(crate) fn at_begin(e: postgres::Error) -> PgError {
        let broken = e.is_closed()
            || e.code()
                .is_none_or(|c| c.code().starts_with("08") || c.code().starts_with("57P"));
        match (PgError::from(&e), broken) {
            (PgError::Database { code, message, .. }, true) => PgError::Database {
                code,
                message,
                transient: true,
            },
            (other, _) => other,
        }
    }

    /// The server no longer accepts a statement prepared before one of its tables was
    /// altered ("cached plan must not change result type"): prepare it again.
    pub(crate) fn is_stale_statement(&self) -> bool {
        matches!(
            self,
            PgError::Database { code: Some(code), message, .. }
                if code == SqlState::FEATURE_NOT_SUPPORTED.code()
                    && message.starts_with("cached plan must not change result type")
        )
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
        PgError::from(&e)
    }
}

impl From<&postgres::Error> for PgError {
    fn from(e: &postgres::Error) -> PgError {
        let code = e.code().cloned();
        if code == Some(SqlState::INSUFFICIENT_PRIVILEGE) {
            return PgError::PermissionDenied(db_message(e));
        }
        let transient = matches!(
            &code,
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        );
        PgError::Database {
            code: code.map(|c| c.code().to_owned()),
            message: db_message(e),
            transient,
        }
    }
}

impl From<postgres::Error> for crate::Error {
    fn from(e: postgres::Error) -> crate::Error {
        crate::Error::Postgres(PgError::from(e))
    }
}

/// The error with its causes: the server's message and code where there is one, else what
/// the client says and why (the client's own `Display` may say only "db error").
fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// A serialization failure or deadlock anywhere in `e`'s chain of causes (the application's
/// SQL inside a completion returns its own error type, which may wrap the client's): the
/// transaction is worth running again, and the error is no failure of the job.
pub(crate) fn transient_cause(e: &(dyn std::error::Error + 'static)) -> Option<PgError> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(pg) = e.downcast_ref::<postgres::Error>() {
            let pg = PgError::from(pg);
            if pg.is_transient() {
                return Some(pg);
            }
        } else if let Some(pg) = e.downcast_ref::<PgError>()
            && pg.is_transient()
        {
            return Some(pg.clone());
        } else if let Some(crate::Error::Postgres(pg)) = e.downcast_ref::<crate::Error>()
            && pg.is_transient()
        {
            return Some(pg.clone());
        }
        next = e.source();
    }
    None
}

/// The server's own message where there is one (the `Display` of the client's error says
/// only "db error").
fn db_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => describe(e),
    }
}
