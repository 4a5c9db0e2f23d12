//! A status page and Prometheus metrics for a [leasehold](https://docs.rs/leasehold) store,
//! for a person at a browser and for a fleet's scraper: a crate of its own, so that an
//! application that does not serve the page compiles none of it.

#![warn(missing_docs)]
//!
//! [`StatusPage`] answers HTTP requests given as [`http`] types, so it serves from whatever
//! server the application already runs (and from `leasehold serve`, which runs it on a
//! small threaded server): route a path prefix to [`StatusPage::handle`]. It is blocking
//! (it reads the store): an async server calls it from its blocking pool.
//!
//! | path | what |
//! |---|---|
//! | `GET /` | queues with counts by state, throughput and failures over the last minutes, leases held (by which process, where processes share a file), the oldest waiting job, the most overdue lease |
//! | `GET /jobs?queue=&state=&meta=k=v&group=&order=&limit=&after=` | jobs, filtered, a page at a time |
//! | `GET /jobs/{id}` | one job: its record, lease, metadata, payload size, what it waits for and what waits for it, and run history |
//! | `GET /groups/{id}` | one group: sealed or open, its members' ends, how it ended, its callbacks |
//! | `POST /jobs/{id}/cancel`, `/jobs/{id}/retry`, `/jobs/{id}/promote?attempt=N` | actions: each asks for confirmation first (a promote, "run now", only if the job is still at the attempt the page showed) |
//! | `POST /queues/{name}/pause`, `/queues/{name}/resume` | |
//! | `GET /metrics` | the Prometheus text format |
//! | `GET /login`, `POST /login`, `POST /logout` | where a person signs in with the token, when there is one, and out |
//!
//! Safe by default: no action is a GET; every action needs the page's form secret (made at
//! start and known only to the page's own forms, so another site cannot post one) and, with
//! a token set ([`StatusPageBuilder::token`]), the token; every parameter is checked before
//! the store is read; a page only ever reads (reads never hold the writer, on either
//! engine), and an action is one of the store's own operations, refused with the store's
//! typed error.

/// The README's example is compiled and run as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod access;
mod actions;
mod chart;
mod clock;
mod counts;
mod error;
mod html;
mod metrics;
mod overview;
mod pages;
mod params;
mod timeline;

use std::sync::Arc;

use http::{Method, StatusCode, header};
use parking_lot::Mutex;

pub use access::MIN_TOKEN_OFF_LOOPBACK;
pub use error::WebError;
/// The `http` crate the page's [`Request`] and [`Response`] come from, for an application to
/// build them with the same version.
pub use http;

use leasehold::HolderState;
use leasehold::PoolStats;
use leasehold::Result;
use leasehold::WriteMetrics;
use leasehold::{InstanceId, JobId};
use leasehold::{JobStore, ReadJobs};

/// A request as the page reads it: its body already read (the page takes at most
/// [`MAX_BODY`] bytes of it).
pub type Request = http::Request<Vec<u8>>;
/// What the page answers.
pub type Response = http::Response<Vec<u8>>;

/// The longest path with its query string the page accepts.
pub const MAX_URI: usize = 2048;
/// The largest request body the page accepts (its forms send a few dozen bytes).
pub const MAX_BODY: usize = 4096;

type Holders = dyn Fn() -> Result<Vec<(JobId, InstanceId, HolderState)>> + Send + Sync;
type OpenWriter = dyn Fn() -> Result<Arc<dyn JobStore>> + Send + Sync;

/// How actions reach the store.
enum Writes {
    /// Through a handle the page holds (an application's own store).
    Held(Arc<dyn JobStore>),
    /// Through a handle opened for each action and closed after it (`leasehold serve` on a
    /// file that an application holds: the action waits its turn, or is refused with the
    /// store's error when the application holds the file alone).
    Opened(Box<OpenWriter>),
}

/// A status page over one store. Cheap to clone; every clone serves the same page.
#[derive(Clone)]
pub struct StatusPage {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    reads: Arc<dyn ReadJobs>,
    writes: Option<Writes>,
    holders: Option<Box<Holders>>,
    closed_cleanly: Option<Box<dyn Fn() -> bool + Send + Sync>>,
    pools: Vec<(String, Box<dyn Fn() -> PoolStats + Send + Sync>)>,
    write_metrics: Option<Box<dyn Fn() -> WriteMetrics + Send + Sync>>,
    access: access::Access,
    base: String,
    name: String,
    samples: Mutex<chart::Samples>,
    counts: Arc<counts::Counts>,
}

/// Builds a [`StatusPage`]: what it reads, how it acts, who may use it.
pub struct StatusPageBuilder {
    inner: Inner,
}

impl StatusPage {
    /// A page reading `store`. Read-only until it is given a way to write
    /// ([`StatusPageBuilder::writes`]).
    pub fn builder(store: Arc<dyn ReadJobs>) -> StatusPageBuilder {
        StatusPageBuilder {
            inner: Inner {
                reads: store,
                writes: None,
                holders: None,
                closed_cleanly: None,
                pools: Vec::new(),
                write_metrics: None,
                access: access::Access::new(None),
                base: String::new(),
                name: String::new(),
                samples: Mutex::new(chart::Samples::default()),
                counts: counts::Counts::new(std::time::Duration::from_secs(1)),
            },
        }
    }

    /// A page over an application's own store that reads it and acts on it.
    pub fn for_store<S: JobStore + 'static>(store: S) -> StatusPageBuilder {
        let store = Arc::new(store);
        StatusPage::builder(store.clone()).writes(store)
    }

    /// Answers one request. Never panics on what a request holds; every refusal is an HTTP
    /// error with the [`WebError`] that says why.
    pub fn handle(&self, request: &Request) -> Response {
        let answer = self.route(request);
        let mut response = match answer {
            Ok(r) => r,
            Err(e) => {
                let mut r = pages::error_page(&self.inner, request, &e);
                if let WebError::MethodNotAllowed { allowed, .. } = e {
                    r.headers_mut()
                        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
                }
                r
            }
        };
        let h = response.headers_mut();
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            header::HeaderValue::from_static("nosniff"),
        );
        // Nothing of the page's addresses reaches another site, while the page's own forms
        // still say where they come from (a stricter policy makes a browser send
        // `Origin: null` with them, which the origin check refuses).
        h.insert(
            header::REFERRER_POLICY,
            header::HeaderValue::from_static("same-origin"),
        );
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            header::HeaderValue::from_static(
                "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; \
                 form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
        );
        h.insert(
            header::X_FRAME_OPTIONS,
            header::HeaderValue::from_static("DENY"),
        );
        response
    }

    fn route(&self, request: &Request) -> std::result::Result<Response, WebError> {
        let inner = &*self.inner;
        let uri = request.uri();
        let len = uri.path().len() + uri.query().map_or(0, |q| q.len() + 1);
        if len > MAX_URI {
            return Err(WebError::UriTooLong { len, max: MAX_URI });
        }
        if request.body().len() > MAX_BODY {
            return Err(WebError::BodyTooLarge {
                len: request.body().len(),
                max: MAX_BODY,
            });
        }
        let path = uri
            .path()
            .strip_prefix(inner.base.as_str())
            .filter(|p| p.is_empty() || p.starts_with('/'))
            .ok_or_else(|| WebError::NotFound(uri.path().to_owned()))?;
        let segments: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                percent_decode(s).ok_or_else(|| WebError::BadRequest(format!("bad path {s:?}")))
            })
            .collect::<std::result::Result<_, _>>()?;
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        let query = params::pairs(uri.query().unwrap_or("").as_bytes());
        let method = request.method();
        let headers = request.headers();
        if !inner.access.host_allowed(headers) {
            let host = headers
                .get(header::HOST)
                .map(|h| String::from_utf8_lossy(h.as_bytes()));
            return Err(WebError::HostNotAllowed(
                host.unwrap_or_default().into_owned(),
            ));
        }
        if *method == Method::POST && !access::Access::same_origin(headers) {
            return Err(WebError::Forbidden(
                "the request came from another site's page (its Origin or Referer names another host)",
            ));
        }

        if segments == ["login"] {
            return match *method {
                Method::GET => Ok(pages::login(inner, None)),
                Method::POST => actions::login(inner, &params::pairs(request.body())),
                _ => Err(not_allowed(method, "GET, POST")),
            };
        }
        if segments == ["logout"] {
            return match *method {
                Method::POST => actions::logout(inner, headers, &params::pairs(request.body())),
                _ => Err(not_allowed(method, "POST")),
            };
        }
        if !inner.access.admits(headers) {
            return Err(WebError::Unauthorized);
        }
        let get = |answer: fn(&Inner, &[(String, String)]) -> PageResult| match *method {
            Method::GET => answer(inner, &query),
            _ => Err(not_allowed(method, "GET")),
        };
        match segments.as_slice() {
            [] => get(overview::overview),
            ["metrics"] => get(pages::metrics),
            ["jobs"] => get(pages::jobs),
            ["jobs", id] => {
                let id = params::job_id(id)?;
                match *method {
                    Method::GET => pages::job(inner, id, &query),
                    _ => Err(not_allowed(method, "GET")),
                }
            }
            ["groups", id] => {
                let id = params::group_id(id)?;
                match *method {
                    Method::GET => pages::group(inner, id),
                    _ => Err(not_allowed(method, "GET")),
                }
            }
            ["jobs", id, action] => {
                let id = params::job_id(id)?;
                let action = actions::JobAction::parse(action)?;
                match *method {
                    Method::POST => {
                        let form = params::pairs(request.body());
                        actions::on_job(inner, id, action, &query, &form)
                    }
                    _ => Err(not_allowed(method, "POST")),
                }
            }
            ["queues", queue, action] => {
                let queue = params::queue(queue)?;
                let action = actions::QueueAction::parse(action)?;
                match *method {
                    Method::POST => {
                        actions::on_queue(inner, &queue, action, &params::pairs(request.body()))
                    }
                    _ => Err(not_allowed(method, "POST")),
                }
            }
            _ => Err(WebError::NotFound(path.to_owned())),
        }
    }
}

type PageResult = std::result::Result<Response, WebError>;

fn not_allowed(method: &Method, allowed: &'static str) -> WebError {
    WebError::MethodNotAllowed {
        method: method.as_str().chars().take(16).collect(),
        allowed,
    }
}

/// A path segment with its `%xx` escapes decoded; `None` if they do not make UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl StatusPageBuilder {
    /// Lets the page's actions (cancel, retry, pause, resume) write through `store`.
    pub fn writes(mut self, store: Arc<dyn JobStore>) -> Self {
        self.inner.writes = Some(Writes::Held(store));
        self
    }

    /// Lets the page's actions write through a handle `open` makes for each action, closed
    /// after it: for a tool beside an application that holds the store.
    pub fn writes_by(
        mut self,
        open: impl Fn() -> Result<Arc<dyn JobStore>> + Send + Sync + 'static,
    ) -> Self {
        self.inner.writes = Some(Writes::Opened(Box::new(open)));
        self
    }

    /// Where the page finds which process holds each running lease (a file that
    /// processes share: [`leasehold::StoreReader::holders`]).
    pub fn holders(
        mut self,
        holders: impl Fn() -> Result<Vec<(JobId, InstanceId, HolderState)>> + Send + Sync + 'static,
    ) -> Self {
        self.inner.holders = Some(Box::new(holders));
        self
    }

    /// Where the page learns whether the file's last writer closed it (a file read beside
    /// its application: [`leasehold::StoreReader::closed_cleanly`]). When it did not, the page
    /// says that the leases it shows are the last commit's, held by no process now.
    pub fn closed_cleanly(mut self, closed: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.inner.closed_cleanly = Some(Box::new(closed));
        self
    }

    /// Adds a pool's counters to `/metrics` (labelled `pool="name"`) and the overview:
    /// `stats` is usually `move || pool.stats()` on a shared [`leasehold::WorkerPool`].
    pub fn pool(
        mut self,
        name: impl Into<String>,
        stats: impl Fn() -> PoolStats + Send + Sync + 'static,
    ) -> Self {
        self.inner.pools.push((name.into(), Box::new(stats)));
        self
    }

    /// Adds this process's write transactions on the store to `/metrics`
    /// (e.g. `move || store.metrics()` on a [`leasehold::Store`]).
    pub fn write_metrics(
        mut self,
        metrics: impl Fn() -> WriteMetrics + Send + Sync + 'static,
    ) -> Self {
        self.inner.write_metrics = Some(Box::new(metrics));
        self
    }

    /// Requires `token` on every request (as `Authorization: Bearer`, or the session cookie
    /// a sign-in with it sets). Needed wherever anyone but the device's own user can reach
    /// the page; an empty token is refused, and off loopback use one of at least
    /// [`MIN_TOKEN_OFF_LOOPBACK`] characters (`leasehold serve` insists).
    pub fn token(mut self, token: impl Into<String>) -> std::result::Result<Self, WebError> {
        let token = token.into();
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._~+/=-".contains(c);
        if token.is_empty() || token.len() > 256 || !token.chars().all(allowed) {
            return Err(WebError::BadRequest(
                "the token must be 1 to 256 characters of A-Z a-z 0-9 . _ ~ + / = -".into(),
            ));
        }
        self.inner.access.set_token(token);
        Ok(self)
    }

    /// Lets requests name `host` (a DNS name, as in the browser's address bar) in their
    /// `Host` header. Without it the page answers only to an IP address and `localhost`,
    /// which keeps a page of another site whose name an attacker points at this machine
    /// (DNS rebinding) from reading or acting on it. Call once per name the page is
    /// reached by (a reverse proxy's public name, say).
    pub fn allow_host(mut self, host: &str) -> Self {
        self.inner.access.allow_host(host);
        self
    }

    /// Marks the session cookie `Secure`: the page is reached through TLS (a reverse proxy
    /// in front of it), so the browser never sends the cookie in the clear.
    pub fn tls_in_front(mut self) -> Self {
        self.inner.access.secure = true;
        self
    }

    /// Serves the page under `prefix` (like `/leasehold`) in an application's own router:
    /// every link the page makes starts with it, and requests outside it are not found.
    pub fn base_path(mut self, prefix: &str) -> Self {
        self.inner.base = prefix.trim_end_matches('/').to_owned();
        self
    }

    /// What the page's header calls the store (a path, a database without its password).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.inner.name = name.into();
        self
    }

    /// How long the page shows the same counts before it counts again (default 1 s). A
    /// count that takes long (a database of many jobs counts its rows) is also repeated no
    /// more often than ten times its own length, in the background, and the page says how
    /// old the counts it shows are. Zero counts on every request, however long it takes.
    pub fn counts_fresh_for(mut self, fresh_for: std::time::Duration) -> Self {
        self.inner.counts = counts::Counts::new(fresh_for);
        self
    }

    /// The page.
    pub fn build(self) -> StatusPage {
        StatusPage {
            inner: Arc::new(self.inner),
        }
    }
}

impl Inner {
    /// The store's counts (see [`counts`]), sampled for the chart.
    fn counts(&self) -> std::result::Result<counts::Snapshot, WebError> {
        let snapshot = self.counts.get(&self.reads)?;
        self.samples.lock().record(&snapshot.reading.stats);
        Ok(snapshot)
    }

    /// A handle to write through for one action.
    fn writer(&self) -> std::result::Result<Arc<dyn JobStore>, WebError> {
        match &self.writes {
            None => Err(WebError::ReadOnly),
            Some(Writes::Held(store)) => Ok(store.clone()),
            Some(Writes::Opened(open)) => Ok(open()?),
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

fn html(status: StatusCode, body: String) -> Response {
    respond(status, "text/html; charset=utf-8", body.into_bytes())
}

fn redirect(to: &str) -> std::result::Result<Response, WebError> {
    let mut r = Response::new(Vec::new());
    *r.status_mut() = StatusCode::SEE_OTHER;
    let location = header::HeaderValue::from_str(to)
        .map_err(|_| WebError::BadRequest("cannot redirect there".into()))?;
    r.headers_mut().insert(header::LOCATION, location);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_decode_percent_escapes_and_refuse_broken_ones() {
        assert_eq!(percent_decode("mail%20out").as_deref(), Some("mail out"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("%ff%fe"), None, "not UTF-8");
    }
}
