//! The status page and `/metrics` (the `leasehold-web` crate), driven through `StatusPage::handle` as
//! any server would call it, on both engines: what the page shows matches what the store
//! says, its actions reach the store only when confirmed with the form secret, and hostile
//! requests get clear HTTP errors and change nothing. (The page in a real browser, served by
//! `leasehold serve`, is tested in the tool's `serve` tests.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../../../tests/support/backends.rs"]
mod backends;
#[path = "../../../tests/support/on_both.rs"]
mod on_both;
#[path = "../../../tests/support/status_page.rs"]
mod status_page;

mod actions;
mod hostile;
mod metrics;
mod pages;

use std::sync::Arc;

use http::{Method, StatusCode};
use leasehold::{JobStore, ReadJobs};
use leasehold_web::{Response, StatusPage, StatusPageBuilder};

use on_both::Backend;
pub use status_page::{form_secret, shown_count};

/// A page that reads and acts on the backend's store, counting its jobs for every request
/// (the tests move store time between requests faster than any cache would notice).
pub fn page_of(f: &Backend) -> StatusPageBuilder {
    let store: Arc<dyn JobStore> = f.handle();
    let reads: Arc<dyn ReadJobs> = f.handle();
    StatusPage::builder(reads)
        .writes(store)
        .counts_fresh_for(std::time::Duration::ZERO)
}

pub fn request(method: Method, uri: &str, body: &str) -> leasehold_web::Request {
    let mut r = http::Request::builder().method(method).uri(uri);
    if !body.is_empty() {
        r = r.header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        );
    }
    r.body(body.as_bytes().to_vec()).unwrap()
}

pub fn get(page: &StatusPage, uri: &str) -> Response {
    page.handle(&request(Method::GET, uri, ""))
}

pub fn post(page: &StatusPage, uri: &str, form: &str) -> Response {
    page.handle(&request(Method::POST, uri, form))
}

pub fn text(r: &Response) -> String {
    String::from_utf8(r.body().clone()).unwrap()
}

/// The page's body, after checking that it answered `status`.
pub fn expect(r: Response, status: StatusCode) -> String {
    let body = text(&r);
    assert_eq!(r.status(), status, "{body}");
    body
}

/// Waits for `done`, with a generous deadline (the machine may be loaded).
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
