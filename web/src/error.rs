//! What the status page answers when it cannot do what a request asks: one typed error per
//! refusal, each with its HTTP status. Nothing a request can send reaches a panic or
//! changes the store on the way to one of these.

use http::StatusCode;

/// Why the status page refused a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// A parameter, filter or form field the page does not accept.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No such page, job or queue.
    #[error("not found: {0}")]
    NotFound(String),
    /// The page needs its token, and the request did not carry it.
    #[error("this page needs its access token")]
    Unauthorized,
    /// A state-changing request without the page's form secret (a request made by another
    /// site, or a stale page), or a token that does not match.
    #[error("refused: {0}")]
    Forbidden(&'static str),
    /// The path exists but not for this method (every action is a POST).
    #[error("method {method} not allowed here (allowed: {allowed})")]
    MethodNotAllowed {
        /// The method the request used.
        method: String,
        /// The methods the path answers.
        allowed: &'static str,
    },
    /// The path or query string is longer than any the page makes.
    #[error("the address is {len} bytes long; the page accepts at most {max}")]
    UriTooLong {
        /// Its length.
        len: usize,
        /// The most the page accepts.
        max: usize,
    },
    /// The request body is larger than any form the page sends.
    #[error("the request body is {len} bytes; the page accepts at most {max}")]
    BodyTooLarge {
        /// Its length.
        len: usize,
        /// The most the page accepts.
        max: usize,
    },
    /// The request names a host the page does not answer to (see
    /// [`StatusPageBuilder::allow_host`](crate::StatusPageBuilder::allow_host)): a page
    /// of another site whose name was pointed at this machine (DNS rebinding), or a name the
    /// operator has not allowed.
    #[error(
        "this page does not answer to host {0:?}: add it with --allow-host (StatusPageBuilder::allow_host)"
    )]
    HostNotAllowed(String),
    /// The page was built without a way to write, so actions are off.
    #[error("this page is read-only: it was started without a way to change the store")]
    ReadOnly,
    /// The store refused or failed: its own typed error, shown as it is.
    #[error(transparent)]
    Store(#[from] leasehold::Error),
}

impl WebError {
    /// The HTTP status the page answers this error with.
    pub fn status(&self) -> StatusCode {
        match self {
            WebError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WebError::NotFound(_) => StatusCode::NOT_FOUND,
            WebError::Unauthorized => StatusCode::UNAUTHORIZED,
            WebError::Forbidden(_) => StatusCode::FORBIDDEN,
            WebError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            WebError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            WebError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            WebError::ReadOnly => StatusCode::CONFLICT,
            WebError::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            WebError::Store(e) => store_status(e),
        }
    }
}

/// A store error as an HTTP status: a refusal of the request (a job that is not there, an
/// input the store refuses, a state the action does not apply to) is the client's; a store
/// held by another process is a conflict to retry; the rest is the server's.
fn store_status(e: &leasehold::Error) -> StatusCode {
    use leasehold::Error as E;
    match e {
        E::JobNotFound(_) | E::ScheduleNotFound(_) | E::GroupNotFound(_) => StatusCode::NOT_FOUND,
        E::Input(_) => StatusCode::BAD_REQUEST,
        E::Refused { .. }
        | E::UniqueKeyHeld { .. }
        | E::EditConflict { .. }
        | E::Open(leasehold::OpenError::Locked { .. }) => StatusCode::CONFLICT,
        E::Open(leasehold::OpenError::IncompatibleSharing { .. }) => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
