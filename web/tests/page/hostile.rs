//! Requests a browser of good faith never sends: each gets a clear HTTP error, and the
//! store is exactly as it was.

use http::{Method, StatusCode};
use leasehold::{JobState, NewJob};

use crate::on_both::{Backend, Kind, Q};
use crate::{expect, form_secret, get, page_of, post, request, text};

crate::on_both::on_both!(
    hostile_requests_get_clear_errors_and_change_nothing,
    with_a_token_every_request_needs_it_and_the_login_sets_it,
    a_rebound_host_and_another_sites_post_are_refused_and_change_nothing,
    wrong_tokens_make_each_next_sign_in_wait_longer,
);

/// Everything a page could change, to compare before and after.
fn snapshot(f: &Backend) -> (Vec<(u64, JobState, bool, u32)>, bool) {
    let jobs = f
        .jobs(&leasehold::JobFilter::default())
        .unwrap()
        .iter()
        .map(|j| (j.id().0, j.state(), j.cancel_requested(), j.failures()))
        .collect();
    (jobs, f.queue_settings(Q).unwrap().paused)
}

fn hostile_requests_get_clear_errors_and_change_nothing(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    f.enqueue_n(2);
    let page = page_of(&f).build();
    let secret = form_secret(&expect(get(&page, "/"), StatusCode::OK));
    let before = snapshot(&f);
    let cancel = format!("/jobs/{}/cancel", id.0);
    let cases: Vec<(Method, String, String, StatusCode)> = vec![
        (
            Method::GET,
            "/jobs/424242".into(),
            "".into(),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            "/jobs/0".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs/abc".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs/-1".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs/99999999999999999999999".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs?state=sleeping".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs?limit=100000".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs?meta=noequals".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs?queue=%00".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/jobs?drop=table".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        // a repeated parameter once took its last value silently (only meta may repeat)
        (
            Method::GET,
            "/jobs?state=queued&state=dead".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/?refresh=0&refresh=5".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/?refresh=-5".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/%ff".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/etc/passwd".into(),
            "".into(),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            "/../../etc/passwd".into(),
            "".into(),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/jobs?queue={}", "x".repeat(10_000)),
            "".into(),
            StatusCode::URI_TOO_LONG,
        ),
        // Actions are never a GET, and need the secret and a confirmation.
        (
            Method::GET,
            cancel.clone(),
            "".into(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::DELETE,
            format!("/jobs/{}", id.0),
            "".into(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::POST,
            cancel.clone(),
            "confirm=yes".into(),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            cancel.clone(),
            "csrf=0123456789abcdef0123456789abcdef&confirm=yes".into(),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            cancel.clone(),
            format!("csrf={secret}&csrf={secret}&confirm=yes"),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            cancel.clone(),
            format!("csrf={secret}&confirm=maybe"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            cancel.clone(),
            format!("csrf={secret}&confirm=yes&pad={}", "y".repeat(10_000)),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            Method::POST,
            format!("/jobs/{}/delete", id.0),
            format!("csrf={secret}&confirm=yes"),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            "/queues/q/drop".into(),
            format!("csrf={secret}&confirm=yes"),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/queues/{}/pause", "q".repeat(300)),
            format!("csrf={secret}&confirm=yes"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            "/metrics".into(),
            "".into(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::GET,
            "/metrics?x=1".into(),
            "".into(),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (method, uri, body, status) in cases {
        let r = page.handle(&request(method.clone(), &uri, &body));
        let shown: String = uri.chars().take(60).collect();
        assert_eq!(r.status(), status, "{method} {shown}: {}", text(&r));
        assert!(!text(&r).is_empty(), "{method} {shown}: an error says why");
        if status == StatusCode::METHOD_NOT_ALLOWED {
            assert!(r.headers().contains_key("allow"), "{method} {shown}");
        }
    }
    assert_eq!(snapshot(&f), before, "nothing changed");
}

fn with_a_token_every_request_needs_it_and_the_login_sets_it(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    assert!(page_of(&f).token("").is_err(), "an empty token is refused");
    assert!(page_of(&f).token("has space").is_err());
    let page = page_of(&f).token("t0ken-xyz").unwrap().build();
    let before = snapshot(&f);
    let login = expect(get(&page, "/"), StatusCode::UNAUTHORIZED);
    assert!(login.contains("name=\"token\""), "a person is asked for it");
    expect(get(&page, "/metrics"), StatusCode::UNAUTHORIZED);
    expect(
        get(&page, &format!("/jobs/{}", id.0)),
        StatusCode::UNAUTHORIZED,
    );
    expect(
        post(&page, &format!("/jobs/{}/cancel", id.0), "confirm=yes"),
        StatusCode::UNAUTHORIZED,
    );
    expect(post(&page, "/login", "token=wrong"), StatusCode::FORBIDDEN);
    assert_eq!(snapshot(&f), before);

    let scraper = http::Request::builder()
        .uri("/metrics")
        .header("authorization", "Bearer t0ken-xyz")
        .body(Vec::new())
        .unwrap();
    assert_eq!(page.handle(&scraper).status(), StatusCode::OK);

    let signed_in = post(&page, "/login", "token=t0ken-xyz");
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("t0ken-xyz"),
        "the cookie is a session, not the token: {cookie}"
    );
    assert!(!cookie.contains("Secure"), "no TLS in front: {cookie}");
    let with_cookie = |method: Method, uri: &str, body: &str| {
        let mut r = request(method, uri, body);
        let value = cookie.split(';').next().unwrap().parse().unwrap();
        r.headers_mut().insert("cookie", value);
        page.handle(&r)
    };
    let html = text(&with_cookie(Method::GET, "/", ""));
    let secret = form_secret(&html);
    let done = with_cookie(
        Method::POST,
        &format!("/jobs/{}/cancel", id.0),
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
    // the token itself as a cookie is nothing
    let mut raw = request(Method::GET, "/", "");
    raw.headers_mut()
        .insert("cookie", "leasehold_token=t0ken-xyz".parse().unwrap());
    assert_eq!(page.handle(&raw).status(), StatusCode::UNAUTHORIZED);
    // signing out ends the session, and tells the browser to forget it
    assert!(html.contains("id=\"sign-out\""), "a sign-out button");
    let out = with_cookie(Method::POST, "/logout", &format!("csrf={secret}"));
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    let forget = out.headers()["set-cookie"].to_str().unwrap();
    assert!(forget.contains("Max-Age=0"), "{forget}");
    assert_eq!(
        with_cookie(Method::GET, "/", "").status(),
        StatusCode::UNAUTHORIZED
    );
    // behind TLS the cookie is Secure
    let tls = page_of(&f)
        .token("t0ken-xyz")
        .unwrap()
        .tls_in_front()
        .build();
    let signed_in = tls.handle(&request(Method::POST, "/login", "token=t0ken-xyz"));
    assert!(
        signed_in.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("; Secure")
    );
}

/// A page of another site whose name an attacker points at this machine (DNS rebinding)
/// names its own host: it is refused before it can read the form secret off a page, let
/// alone post with it. A request another site's page makes the browser send is refused by
/// its origin, even when the form secret rides along.
fn a_rebound_host_and_another_sites_post_are_refused_and_change_nothing(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).allow_host("jobs.example").build();
    let before = snapshot(&f);
    let with = |method: Method, uri: &str, body: &str, headers: &[(&str, &str)]| {
        let mut r = request(method, uri, body);
        for (k, v) in headers {
            r.headers_mut().insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        page.handle(&r)
    };
    let rebound = with(Method::GET, "/", "", &[("host", "evil.example:8470")]);
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
    let shown = text(&rebound);
    assert!(!shown.contains("name=\"csrf\""), "no form secret on it");
    for host in [
        "127.0.0.1:8470",
        "localhost:8470",
        "[::1]:8470",
        "jobs.example",
    ] {
        let ok = with(Method::GET, "/", "", &[("host", host)]);
        assert_eq!(ok.status(), StatusCode::OK, "{host}");
    }
    let secret = form_secret(&text(&with(
        Method::GET,
        "/",
        "",
        &[("host", "127.0.0.1:8470")],
    )));
    let cancel = format!("/jobs/{}/cancel", id.0);
    let body = format!("csrf={secret}&confirm=yes");
    for headers in [
        vec![
            ("host", "evil.example:8470"),
            ("origin", "http://evil.example:8470"),
        ],
        vec![
            ("host", "127.0.0.1:8470"),
            ("origin", "http://evil.example"),
        ],
        vec![("host", "127.0.0.1:8470"), ("origin", "null")],
        vec![
            ("host", "127.0.0.1:8470"),
            ("referer", "http://evil.example/page"),
        ],
    ] {
        let r = with(Method::POST, &cancel, &body, &headers);
        assert!(
            matches!(
                r.status(),
                StatusCode::FORBIDDEN | StatusCode::MISDIRECTED_REQUEST
            ),
            "{headers:?}: {}",
            r.status()
        );
    }
    assert_eq!(snapshot(&f), before, "nothing changed");
    // the page's own form, from its own origin, acts
    let own = [
        ("host", "127.0.0.1:8470"),
        ("origin", "http://127.0.0.1:8470"),
    ];
    assert_eq!(
        with(Method::POST, &cancel, &body, &own).status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
}

/// Each wrong token makes the next sign-in wait longer (50 wrong tries once took 0.38 s).
#[allow(clippy::disallowed_methods)] // measuring a wait the page imposes, not store time
fn wrong_tokens_make_each_next_sign_in_wait_longer(kind: Kind) {
    let f = kind.open();
    let page = page_of(&f).token("t0ken-t0ken-t0ken").unwrap().build();
    let took = || {
        let began = std::time::Instant::now();
        let r = page.handle(&request(Method::POST, "/login", "token=wrong"));
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        began.elapsed()
    };
    let waits: Vec<_> = (0..4).map(|_| took()).collect();
    // 100, 200, 400, 800 ms at least: a machine under load only makes them longer
    for (i, wait) in waits.iter().enumerate() {
        let least = std::time::Duration::from_millis(100 << i);
        assert!(*wait >= least, "try {i}: {wait:?} < {least:?}");
    }
    // the right one starts over
    let right = page.handle(&request(Method::POST, "/login", "token=t0ken-t0ken-t0ken"));
    assert_eq!(right.status(), StatusCode::SEE_OTHER);
    assert!(took() >= std::time::Duration::from_millis(100));
}
