//! How the PostgreSQL client's errors become [`PgError`]s: at `COMMIT` (where a lost
//! connection leaves the outcome unknown), at `BEGIN` (where a broken connection is worth
//! another try), and anywhere else.

use postgres::error::SqlState;

pub use crate::error::PgError;

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
        match e.code().map(|c| c.code()) {
            Some("53300") => PgError::TooManyConnections(message),
            _ => PgError::Connect(message),
        }
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
        let transient = code
            .as_ref()
            .is_some_and(|c| crate::error::postgres::transient_code(c.code()));
        PgError::Database {
            code: code.map(|c| c.code().to_owned()),
            message: db_message(e),
            transient,
        }
    }
}

impl From<postgres::Error> for crate::error::Error {
    fn from(e: postgres::Error) -> crate::error::Error {
        crate::error::Error::Postgres(PgError::from(e))
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
        } else if let Some(crate::error::Error::Postgres(pg)) =
            e.downcast_ref::<crate::error::Error>()
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
