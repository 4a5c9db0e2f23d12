//! Who may look and who may act.
//!
//! Two secrets, for two different dangers:
//! - the **token** (optional, the operator's): when set, every request must carry it, as
//!   `Authorization: Bearer <token>` (a scraper) or the cookie the login form sets (a
//!   person). `leasehold serve` refuses a non-loopback address without one.
//! - the **form secret** (always, made at start): every state-changing request must carry it
//!   as the form field `csrf`. Only the page's own forms know it, so another site open in
//!   the same browser cannot make the browser cancel a job here (the token's cookie would
//!   ride along with such a request; the form secret cannot).

use std::hash::{BuildHasher, Hasher};

use http::HeaderMap;

/// The cookie a login sets.
pub(crate) const COOKIE: &str = "leasehold_token";

pub(crate) struct Access {
    token: Option<String>,
    pub(crate) form_secret: String,
}

impl Access {
    pub(crate) fn new(token: Option<String>) -> Access {
        Access {
            token,
            form_secret: random_hex(),
        }
    }

    pub(crate) fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `headers` carry the token (always, when there is none).
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.strip_prefix("Bearer "));
        let cookies = headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='));
        bearer.chain(cookies).any(|given| same(given, token))
    }

    /// Whether `given` is the token.
    pub(crate) fn is_token(&self, given: &str) -> bool {
        self.token.as_deref().is_some_and(|t| same(given, t))
    }

    /// Whether `given` is the form secret.
    pub(crate) fn is_form_secret(&self, given: &str) -> bool {
        same(given, &self.form_secret)
    }
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
    fn with_a_token_only_a_request_that_carries_it_is_admitted() {
        let a = Access::new(Some("s3cret".into()));
        assert!(!a.admits(&headers(&[])));
        assert!(!a.admits(&headers(&[(http::header::AUTHORIZATION, "Bearer s3cre")])));
        assert!(!a.admits(&headers(&[(http::header::AUTHORIZATION, "Bearer s3cret2")])));
        assert!(!a.admits(&headers(&[(http::header::COOKIE, "other=s3cret")])));
        assert!(a.admits(&headers(&[(http::header::AUTHORIZATION, "Bearer s3cret")])));
        assert!(a.admits(&headers(&[(
            http::header::COOKIE,
            "theme=dark; leasehold_token=s3cret"
        )])));
        assert!(Access::new(None).admits(&headers(&[])));
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
