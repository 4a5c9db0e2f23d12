//! `leasehold serve`: the status page and `/metrics` of a store file or a database
//! ([`leasehold_web::StatusPage`]) on a small threaded HTTP server (tiny_http: threads, no
//! async runtime), beside the application that runs the store.
//!
//! A file is read as the tool's read commands read it, while its application writes it;
//! an action opens the file for that one write and closes it after (where the application
//! holds the file alone, the action is refused with the store's "in use" error). A database
//! is read and written through one handle.
//!
//! It listens on loopback unless told otherwise; any other address needs a token.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use leasehold::{Error, ReadJobs, StoreReader};
use leasehold_web::{MAX_BODY, StatusPage};

use super::target::{describe, open_postgres, postgres_url};

pub struct Settings {
    pub listen: SocketAddr,
    pub token: Option<String>,
    pub threads: usize,
    pub allow_hosts: Vec<String>,
    pub tls_in_front: bool,
}

pub fn run(db: &Path, settings: Settings) -> Result<ExitCode, Error> {
    let min = leasehold_web::MIN_TOKEN_OFF_LOOPBACK;
    if !settings.listen.ip().is_loopback() && settings.token.as_ref().is_none_or(|t| t.len() < min)
    {
        eprintln!(
            "leasehold: {} is reachable from other machines: give a token of at least {min} \
             characters (--token or LEASEHOLD_TOKEN) that every request must carry, or listen \
             on 127.0.0.1",
            settings.listen
        );
        return Ok(ExitCode::from(2));
    }
    let mut page = page(db)?.name(describe(db));
    for host in &settings.allow_hosts {
        page = page.allow_host(host);
    }
    if settings.tls_in_front {
        page = page.tls_in_front();
    }
    let page = match settings.token {
        Some(t) => match page.token(t) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("leasehold: {e}");
                return Ok(ExitCode::from(2));
            }
        },
        None => page,
    }
    .build();
    let server = match tiny_http::Server::http(settings.listen) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("leasehold: cannot listen on {}: {e}", settings.listen);
            return Ok(ExitCode::from(1));
        }
    };
    match server.server_addr().to_ip() {
        // The first line on stdout says where (a test or script reads it for port 0).
        Some(addr) => println!("serving http://{addr}/"),
        None => println!("serving"),
    }
    let threads: Vec<_> = (0..settings.threads.max(1))
        .map(|_| {
            let (server, page) = (server.clone(), page.clone());
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    answer(&page, request);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(ExitCode::SUCCESS)
}

/// The page over `db`: a database read and written through one handle; a file read
/// beside its application and opened for each action.
fn page(db: &Path) -> Result<leasehold_web::StatusPageBuilder, Error> {
    if let Some(url) = postgres_url(db) {
        let store = Arc::new(open_postgres(url, false)?);
        let reads: Arc<dyn ReadJobs> = store.clone();
        return Ok(StatusPage::builder(reads).writes(store));
    }
    let reader = Arc::new(StoreReader::open(db)?);
    if !reader.closed_cleanly() {
        eprintln!(
            "note: {} was not closed cleanly: the page shows its last commit until a writer opens it",
            db.display()
        );
    }
    let reads: Arc<dyn ReadJobs> = reader.clone();
    let path = db.to_owned();
    let closed = reader.clone();
    Ok(StatusPage::builder(reads)
        .closed_cleanly(move || closed.closed_cleanly())
        .holders(move || match reader.sharing()? {
            leasehold::Sharing::MultiProcess => reader.holders(),
            _ => Ok(Vec::new()),
        })
        .writes_by(move || Ok(super::operate::open(&path, false)?.shared())))
}

/// One request through the page, and its answer back to the client.
fn answer(page: &StatusPage, mut request: tiny_http::Request) {
    let mut builder = http::Request::builder()
        .method(request.method().as_str())
        .uri(request.url());
    for h in request.headers() {
        builder = builder.header(h.field.as_str().as_str(), h.value.as_str());
    }
    // One byte over the limit is enough for the page to refuse it; more is never read.
    let mut body = Vec::new();
    let read = request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body);
    let response = match (read, builder.body(body)) {
        (Ok(_), Ok(r)) => page.handle(&r),
        _ => {
            let mut r = http::Response::new(b"malformed request\n".to_vec());
            *r.status_mut() = http::StatusCode::BAD_REQUEST;
            r
        }
    };
    let mut out = tiny_http::Response::from_data(response.body().clone())
        .with_status_code(response.status().as_u16());
    for (name, value) in response.headers() {
        if let Ok(h) = tiny_http::Header::from_bytes(name.as_str().as_bytes(), value.as_bytes()) {
            out.add_header(h);
        }
    }
    let _ = request.respond(out);
}
