//! Who may look and who may act.
//!
//! Three guards, for three different dangers:
//! - the **token** (optional, the operator's): when set, every request must carry it as
//!   `Authorization: Bearer <token>` (a scraper), or the session cookie a sign-in with it
//!   sets (a person): a random session id, `HttpOnly; SameSite=Strict` (and `Secure` when
//!   TLS is in front), never the token itself, ended by signing out. Each wrong token makes
//!   the next sign-in wait longer. `leasehold serve` refuses a non-loopback address without
//!   a token of at least [`MIN_TOKEN_OFF_LOOPBACK`] characters.
//! - the **form secret** (always, made at start): every state-changing request must carry it
//!   as the form field `csrf`. Only the page's own forms know it, so another site open in
//!   the same browser cannot make the browser cancel a job here; and a state-changing
//!   request a browser sends from another origin (its `Origin`, or else its `Referer`, names
//!   another host) is refused as well.
//! - the **host check**: a request's `Host` must be an IP address, `localhost`, or a name the
//!   operator allowed ([`crate::StatusPageBuilder::allow_host`]). A page on another
//!   site whose name an attacker points at this machine (DNS rebinding) names its own host,
//!   and is refused before it can read the form secret off a page.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use http::HeaderMap;
use parking_lot::Mutex;

use crate::clock::Stopwatch;

/// The cookie a sign-in sets: the session's id.
pub(crate) const COOKIE: &str = "leasehold_session";

/// The shortest token `leasehold serve` accepts on an address beyond loopback.
pub const MIN_TOKEN_OFF_LOOPBACK: usize = 16;

/// How long a session lasts after its sign-in.
const SESSION: Duration = Duration::from_secs(12 * 3600);

/// The most sessions kept at once: the oldest goes first.
const MAX_SESSIONS: usize = 1024;

/// The wait after the first wrong token; each wrong one after it doubles it, up to
/// [`MOST_WAIT`]. A right one starts over.
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MOST_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct Access {
    token: Option<String>,
    pub(crate) form_secret: String,
    /// Host names a request may name besides IP addresses and `localhost` (lower case).
    hosts: Vec<String>,
    /// Whether the session cookie is `Secure` (TLS in front of the page).
    pub(crate) secure: bool,
    sessions: Mutex<HashMap<String, Stopwatch>>,
    /// Wrong tokens given since the last right one.
    failures: Mutex<u32>,
}

impl Access {
    pub(crate) fn new(token: Option<String>) -> Access {
        Access {
            token,
            form_secret: random_hex(),
            hosts: Vec::new(),
            secure: false,
            sessions: Mutex::new(HashMap::new()),
            failures: Mutex::new(0),
        }
    }

    pub(crate) fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    pub(crate) fn set_token(&mut self, token: String) {
        self.token = Some(token);
    }

    pub(crate) fn allow_host(&mut self, host: &str) {
        self.hosts
            .push(host.trim_end_matches('.').to_ascii_lowercase());
    }

    /// Whether `headers` carry the token or a live session (always, when there is no token).
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let mut bearer = headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.strip_prefix("Bearer "));
        bearer.any(|given| same(given, token)) || self.session(headers).is_some()
    }

    /// The live session whose id `headers` carry in the session cookie.
    fn session(&self, headers: &HeaderMap) -> Option<String> {
        let mut sessions = self.sessions.lock();
        sessions.retain(|_, began| began.elapsed() < SESSION);
        cookies(headers)
            .find(|id| sessions.keys().any(|known| same(id, known)))
            .map(str::to_owned)
    }

    /// Checks a sign-in: the token gives a new session's id; a wrong one waits first, longer
    /// for each wrong one since the last right one, and gives `None`.
    pub(crate) fn sign_in(&self, given: &str) -> Option<String> {
        let right = self.token.as_deref().is_some_and(|t| same(given, t));
        if !right {
            let wait = {
                let mut failures = self.failures.lock();
                *failures = failures.saturating_add(1);
                FIRST_WAIT
                    .saturating_mul(1 << (*failures - 1).min(16))
                    .min(MOST_WAIT)
            };
            std::thread::sleep(wait);
            return None;
        }
        *self.failures.lock() = 0;
        let id = format!("{}{}", random_hex(), random_hex());
        let mut sessions = self.sessions.lock();
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .max_by_key(|(_, began)| began.elapsed())
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), Stopwatch::start());
        Some(id)
    }

    /// Ends the session `headers` carry, if any.
    pub(crate) fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = self.session(headers) {
            self.sessions.lock().remove(&id);
        }
    }

    /// Whether `given` is the form secret.
    pub(crate) fn is_form_secret(&self, given: &str) -> bool {
        same(given, &self.form_secret)
    }

    /// Whether the request's `Host` is one the page answers to: an IP address (a browser
    /// that names one is where it says), `localhost`, or a name the operator allowed. A
    /// request with no `Host` comes from no browser, and passes.
    pub(crate) fn host_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(http::header::HOST) else {
            return true;
        };
        let Some(name) = host.to_str().ok().and_then(host_name) else {
            return false;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || self.hosts.contains(&name)
    }

    /// Whether a state-changing request comes from the page's own origin, as far as a
    /// browser says: its `Origin` (else its `Referer`) must name the host the request was
    /// sent to. One that names neither comes from no browser, and passes (the form secret
    /// still guards it).
    pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let claimed = text(http::header::ORIGIN).or_else(|| text(http::header::REFERER));
        let Some(claimed) = claimed else {
            return true;
        };
        let authority = claimed
            .split_once("://")
            .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
        match (authority, text(http::header::HOST)) {
            (Some(from), Some(host)) => from.eq_ignore_ascii_case(host),
            // (`Origin: null`, or an origin with no host, is never the page's own)
            _ => false,
        }
    }
}

/// The session cookie's values in `headers`.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// The name in a `Host` value: without its port, an IPv6 address without its brackets.
fn host_name(host: &str) -> Option<&str> {
    if let Some(v6) = host.strip_prefix('[') {
        return v6.split_once(']').map(|(addr, _)| addr);
    }
    Some(host.rsplit_once(':').map_or(host, |(name, _)| name)).filter(|n| !n.is_empty())
}

/// Compares two secrets in time that does not depend on where they first differ.
fn same(given: &str, secret: &str) -> bool {
    let (a, b) = (given.as_bytes(), secret.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, s) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ s;
    }
    diff == 0
}

/// 128 random bits as hex, from the standard library's randomly keyed hasher (its keys come
/// from the operating system), so no random-number crate is needed for one secret per page.
fn random_hex() -> String {
    // Each `RandomState` is keyed afresh (random keys per thread, stepped per instance), so
    // hashing the same input under two of them gives two unrelated 64-bit values.
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(http::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn with_a_token_only_a_request_that_carries_it_or_a_live_session_is_admitted() {
        let a = Access::new(Some("s3cret-s3cret-s3cret".into()));
        assert!(!a.admits(&headers(&[])));
        let bearer = |t: &str| headers(&[(http::header::AUTHORIZATION, &format!("Bearer {t}"))]);
        assert!(!a.admits(&bearer("s3cret-s3cret-s3cre")));
        assert!(!a.admits(&bearer("s3cret-s3cret-s3cret2")));
        assert!(a.admits(&bearer("s3cret-s3cret-s3cret")));
        // the cookie is a session's id, never the token itself
        let cookie = |v: &str| headers(&[(http::header::COOKIE, &format!("theme=dark; {v}"))]);
        assert!(!a.admits(&cookie("leasehold_session=s3cret-s3cret-s3cret")));
        assert!(!a.admits(&cookie("leasehold_token=s3cret-s3cret-s3cret")));
        assert_eq!(a.sign_in("wrong"), None);
        let id = a.sign_in("s3cret-s3cret-s3cret").unwrap();
        assert_eq!(id.len(), 64);
        let signed_in = cookie(&format!("leasehold_session={id}"));
        assert!(a.admits(&signed_in));
        a.sign_out(&signed_in);
        assert!(!a.admits(&signed_in), "signed out");
        assert!(Access::new(None).admits(&headers(&[])));
    }

    #[test]
    fn only_an_ip_address_localhost_or_an_allowed_name_may_be_the_host() {
        let mut a = Access::new(None);
        a.allow_host("Jobs.Example.");
        let host = |h: &str| a.host_allowed(&headers(&[(http::header::HOST, h)]));
        for ok in [
            "127.0.0.1:8470",
            "10.0.0.5",
            "[::1]:8470",
            "localhost:8470",
            "LOCALHOST",
            "jobs.example:443",
            "jobs.example.",
        ] {
            assert!(host(ok), "{ok}");
        }
        for refused in [
            "evil.example:8470",
            "localhost.evil.example",
            "[::1",
            ":8470",
            "127.0.0.1.evil",
        ] {
            assert!(!host(refused), "{refused}");
        }
        assert!(a.host_allowed(&headers(&[])), "no Host: not a browser");
    }

    #[test]
    fn a_state_changing_request_from_another_origin_is_told_apart() {
        let at = |pairs: &[(http::HeaderName, &str)]| Access::same_origin(&headers(pairs));
        let host = (http::header::HOST, "127.0.0.1:8470");
        assert!(
            at(std::slice::from_ref(&host)),
            "no Origin nor Referer: not a browser"
        );
        assert!(at(&[
            host.clone(),
            (http::header::ORIGIN, "http://127.0.0.1:8470")
        ]));
        assert!(at(&[
            host.clone(),
            (http::header::REFERER, "http://127.0.0.1:8470/jobs/1")
        ]));
        assert!(!at(&[
            host.clone(),
            (http::header::ORIGIN, "http://evil.example")
        ]));
        assert!(!at(&[host.clone(), (http::header::ORIGIN, "null")]));
        assert!(!at(&[
            host.clone(),
            (http::header::REFERER, "http://evil.example/x")
        ]));
        assert!(
            !at(&[(http::header::ORIGIN, "http://127.0.0.1:8470")]),
            "an Origin and no Host"
        );
    }

    #[test]
    fn every_page_gets_its_own_form_secret() {
        let (a, b) = (Access::new(None), Access::new(None));
        assert_ne!(a.form_secret, b.form_secret);
        assert_eq!(a.form_secret.len(), 32);
        assert!(a.is_form_secret(&a.form_secret.clone()));
        assert!(!a.is_form_secret(&b.form_secret));
        assert!(!a.is_form_secret(""));
    }
}
