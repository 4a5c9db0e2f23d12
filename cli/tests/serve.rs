//! `leasehold serve`: the status page over real HTTP beside running worker processes, and
//! the same page in a real headless browser (Debian's chromium driven through chromedriver
//! by the WebDriver protocol), which also writes a screenshot of each page.
//!
//! The browser test needs `chromium` and `chromedriver` on the PATH (`.ci/run` installs
//! them); where they are missing it says so and passes, unless `LEASEHOLD_BROWSER=require`
//! (set by `.ci/run`) makes their absence a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../../tests/support/status_page.rs"]
mod status_page;
use status_page::{form_secret, shown_count};

const TOOL: &str = env!("CARGO_BIN_EXE_leasehold");

fn tool(db: &Path, args: &[&str]) -> String {
    let out = Command::new(TOOL)
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A child process of the tool, killed on drop, whose first line said it was ready.
struct Running(Child);

impl Running {
    fn start(db: &Path, args: &[&str], ready: &str) -> (Running, String) {
        let mut child = Command::new(TOOL)
            .arg("--db")
            .arg(db)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with(ready) {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "{args:?} ended early"
            );
        }
        // Keep reading its stdout so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        (Running(child), line.trim().to_owned())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A store with `jobs` jobs in queue `q` and a worker process holding two of them (each
/// handler works for ten minutes, so the counts stand still while the test reads them),
/// served by `leasehold serve`.
struct Served {
    _dir: tempfile::TempDir,
    db: PathBuf,
    addr: SocketAddr,
    _workers: Running,
    _server: Running,
}

impl Served {
    fn start(jobs: usize) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.redb");
        for i in 0..jobs {
            tool(
                &db,
                &[
                    "--create",
                    "enqueue",
                    "--queue",
                    "q",
                    "--meta",
                    &format!("n={i}"),
                    "x",
                ],
            );
        }
        tool(&db, &["--create", "enqueue", "--queue", "mail", "m"]);
        let (workers, _) = Running::start(
            &db,
            &[
                "__pool",
                "--queue",
                "q",
                "--workers",
                "2",
                "--work-ms",
                "600000",
                "--prefetch",
                "0",
                "--reap-every-ms",
                "1000",
            ],
            "ready",
        );
        let (server, line) = Running::start(&db, &["serve", "--listen", "127.0.0.1:0"], "serving");
        let addr = line
            .trim_start_matches("serving http://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let served = Served {
            _dir: dir,
            db,
            addr,
            _workers: workers,
            _server: server,
        };
        served.wait_until("two jobs running", || {
            served.stats()["queues"][1]["counts"]["running"] == 2
        });
        served
    }

    fn stats(&self) -> Value {
        serde_json::from_str(&tool(&self.db, &["stats", "--json"])).unwrap()
    }

    fn wait_until(&self, what: &str, done: impl FnMut() -> bool) {
        wait_until(what, done);
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Waits for `done`, with a generous deadline (CI's machine is shared).
#[allow(clippy::disallowed_methods)] // a test deadline, not store time
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request of `content_type` (none without a body); the answer's status,
/// head and body. The body is read to its `Content-Length` (a server may keep the
/// connection open whatever the request says), or to the end.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let content = match body.is_empty() {
        true => String::new(),
        false => format!("Content-Type: {content_type}\r\n"),
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{content}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the connection closed before the answer's head");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8(raw[..head_end].to_vec()).unwrap();
    let mut body = raw[head_end + 4..].to_vec();
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    match length {
        Some(n) => {
            while body.len() < n {
                let got = s.read(&mut buf).unwrap();
                assert!(got > 0, "the connection closed inside the body");
                body.extend_from_slice(&buf[..got]);
            }
        }
        None => {
            s.read_to_end(&mut body).unwrap();
        }
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

/// One request to the page (a form post where there is a body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, String) {
    exchange(
        addr,
        method,
        path,
        "application/x-www-form-urlencoded",
        body,
    )
}

/// Every count of `stats --json` against the page (while the two agree with themselves:
/// read before and after the page, and looked at again if a count moved between).
fn assert_counts_match(s: &Served, page: impl Fn() -> String) {
    s.wait_until("the page and stats to agree", || {
        let before = s.stats();
        let html = page();
        let after = s.stats();
        let counts = |v: &Value| -> Vec<Value> {
            v["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q["counts"].clone())
                .collect()
        };
        if counts(&before) != counts(&after) {
            return false;
        }
        for q in after["queues"].as_array().unwrap() {
            let name = q["queue"].as_str().unwrap();
            for state in [
                "queued",
                "running",
                "retry_wait",
                "succeeded",
                "dead",
                "cancelled",
            ] {
                let want = q["counts"][state].as_u64().unwrap_or(0);
                let shown = shown_count(&html, name, state);
                if shown != want {
                    // The page counts at most once a second: it may lag a change just made.
                    eprintln!("{name}/{state}: the page shows {shown}, stats {want}");
                    return false;
                }
            }
        }
        true
    });
}

#[test]
fn the_page_of_a_store_whose_writer_was_killed_says_its_leases_are_held_by_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("killed.redb");
    for p in ["a", "b"] {
        tool(&db, &["--create", "enqueue", "--queue", "q", p]);
    }
    // A writer claims both and is SIGKILLed: the file is left unclean.
    drop(Running::start(
        &db,
        &["__child", "--queue", "q", "--claim", "2"],
        "ready",
    ));
    let (_server, line) = Running::start(&db, &["serve", "--listen", "127.0.0.1:0"], "serving");
    let addr: SocketAddr = line
        .trim_start_matches("serving http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let (status, _, page) = http(addr, "GET", "/?refresh=0", "");
    assert_eq!(status, 200);
    let leases = &page[page.find("id=\"leases\"").unwrap()..];
    assert!(leases.contains("id=\"not-closed-cleanly\""), "{leases}");
    assert!(leases.contains("no process holds them now"), "{leases}");
}

#[test]
fn serve_refuses_to_listen_beyond_loopback_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    tool(&db, &["--create", "enqueue", "--queue", "q", "x"]);
    let serve = |extra: &[&str]| {
        Command::new(TOOL)
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", "0.0.0.0:0"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = serve(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs") || err.contains("token"), "{err}");
    let out = serve(&["--token", "bad token"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // a token anyone could guess is no guard beyond loopback
    let out = serve(&["--token", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16 characters"), "{err}");
}

#[test]
fn serve_shows_a_store_beside_its_workers_and_its_actions_reach_the_store() {
    let s = Served::start(6);
    let (status, head, _) = http(s.addr, "GET", "/", "");
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_lowercase().contains("content-security-policy"),
        "{head}"
    );
    assert_counts_match(&s, || http(s.addr, "GET", "/?refresh=0", "").2);
    let html = http(s.addr, "GET", "/", "").2;
    assert!(
        html.contains("(alive)"),
        "the workers' process is shown alive: {html}"
    );

    let (status, _, metrics) = http(s.addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("leasehold_jobs{queue=\"q\",state=\"running\"} 2"),
        "{metrics}"
    );

    // A queued job cancelled from the page, while the worker process holds the file.
    let queued = s.stats();
    assert!(queued["queues"][1]["counts"]["queued"].as_u64().unwrap() >= 1);
    let secret = form_secret(&html);
    let jobs: Value =
        serde_json::from_str(&tool(&s.db, &["jobs", "--state", "queued", "--json"])).unwrap();
    let id = jobs[0]["id"].as_u64().unwrap();
    let (status, head, body) = http(
        s.addr,
        "POST",
        &format!("/jobs/{id}/cancel"),
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(status, 303, "{head}{body}");
    let shown: Value =
        serde_json::from_str(&tool(&s.db, &["show", &id.to_string(), "--json"])).unwrap();
    assert_eq!(shown["job"]["state"], "cancelled", "{shown}");
    let (status, _, _) = http(s.addr, "GET", "/jobs/999999", "");
    assert_eq!(status, 404);
}

// ---- the browser ----

/// A WebDriver session on headless chromium.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// `None` (and a line saying why) where chromium or chromedriver is not installed.
    fn start() -> Option<Browser> {
        let found = |name: &str| {
            std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        };
        let chromium = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|b| found(b));
        let (Some(chromium), true) = (chromium, found("chromedriver")) else {
            let why = "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)";
            assert!(
                std::env::var("LEASEHOLD_BROWSER").as_deref() != Ok("require"),
                "LEASEHOLD_BROWSER=require: {why}"
            );
            eprintln!("the browser test did not run: {why}");
            return None;
        };
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_until("chromedriver to listen", || {
            TcpStream::connect(addr).is_ok()
        });
        let profile = tempfile::tempdir().unwrap();
        let binary = which(chromium);
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--window-size=1280,1000".to_owned(),
            format!("--user-data-dir={}", b._profile.path().display()),
        ];
        let created = b.call(
            "POST",
            "/session",
            json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": binary, "args": args}
            }}}),
        );
        b.session = created["sessionId"].as_str().expect("a session").to_owned();
        Some(b)
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_call(method, path, body)
            .unwrap_or_else(|v| panic!("{method} {path}: {v}"))
    }

    /// The answer's value, or the whole answer where it is an error.
    fn try_call(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let body = match method {
            "GET" | "DELETE" => String::new(),
            _ => body.to_string(),
        };
        let (_, _, body) = exchange(self.addr, method, path, "application/json", &body);
        let body = body.as_str();
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        match v["value"]["error"].is_null() {
            true => Ok(v["value"].clone()),
            false => Err(v),
        }
    }

    fn go(&self, url: &str) {
        self.call(
            "POST",
            &format!("/session/{}/url", self.session),
            json!({"url": url}),
        );
    }

    /// The element `css` names, waited for (the page may still be loading after a click).
    fn find(&self, css: &str) -> String {
        let path = format!("/session/{}/element", self.session);
        let mut found = None;
        wait_until(&format!("an element {css}"), || {
            match self.try_call(
                "POST",
                &path,
                json!({"using": "css selector", "value": css}),
            ) {
                Ok(v) => {
                    found = v["element-6066-11e4-a52e-4f735466cecf"]
                        .as_str()
                        .map(str::to_owned)
                }
                Err(v) if v["value"]["error"] == "no such element" => {}
                Err(v) => panic!("POST {path}: {v}"),
            }
            found.is_some()
        });
        found.unwrap_or_default()
    }

    /// The text of the element `css` names. A click that submits a form returns before the
    /// next page has loaded, so the element found may belong to the page going away (a
    /// stale reference): then it is looked for again.
    fn text(&self, css: &str) -> String {
        let mut text = None;
        wait_until(&format!("the text of {css}"), || {
            let e = self.find(css);
            let path = format!("/session/{}/element/{e}/text", self.session);
            match self.try_call("GET", &path, json!({})) {
                Ok(v) => text = v.as_str().map(str::to_owned),
                Err(v) if v["value"]["error"] == "stale element reference" => {}
                Err(v) => panic!("GET {path}: {v}"),
            }
            text.is_some()
        });
        text.unwrap_or_default()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call(
            "POST",
            &format!("/session/{}/element/{e}/click", self.session),
            json!({}),
        );
    }

    fn source(&self) -> String {
        let v = self.call(
            "GET",
            &format!("/session/{}/source", self.session),
            json!({}),
        );
        v.as_str().unwrap().to_owned()
    }

    fn current_url(&self) -> String {
        let v = self.call("GET", &format!("/session/{}/url", self.session), json!({}));
        v.as_str().unwrap().to_owned()
    }

    /// A screenshot of the page, written to `target/screenshots/NAME.png`.
    fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.call(
            "GET",
            &format!("/session/{}/screenshot", self.session),
            json!({}),
        );
        let png = base64_decode(v.as_str().unwrap());
        assert_eq!(&png[1..4], b"PNG", "a PNG");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call("DELETE", &format!("/session/{}", self.session), json!({}))
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn which(name: &str) -> String {
    let path = std::env::var_os("PATH").unwrap();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap()
        .display()
        .to_string()
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn the_page_in_a_real_browser_matches_the_store_and_its_cancel_reaches_it() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let s = Served::start(8);
    // The overview: every count as `stats --json` has it.
    browser.go(&s.url("/?refresh=0"));
    assert_counts_match(&s, || {
        browser.go(&s.url("/?refresh=0"));
        browser.source()
    });
    assert_eq!(browser.text("#card-running b"), "2");
    // (The page counts at most once a second: it may show the store before the first pass.)
    s.wait_until(
        "the page to show the worker process's reaper's pass",
        || {
            browser.go(&s.url("/?refresh=0"));
            browser.text("#reaper").contains("(it runs every 1.0 s)")
        },
    );
    browser.screenshot("overview");

    // A running job's page: its attempt on the timeline, the lease dashed to its expiry.
    let running: Value =
        serde_json::from_str(&tool(&s.db, &["jobs", "--state", "running", "--json"])).unwrap();
    let held = running[0]["id"].as_u64().unwrap();
    browser.go(&s.url(&format!("/jobs/{held}")));
    assert!(browser.source().contains("<rect class=\"run running\""));
    browser.screenshot("job-running");

    // The job list, filtered by metadata, and a job's page.
    browser.go(&s.url("/jobs?queue=q&state=queued&meta=n%3D5"));
    let listed = browser.text("#jobs tbody");
    let jobs: Value =
        serde_json::from_str(&tool(&s.db, &["jobs", "--state", "queued", "--json"])).unwrap();
    let five = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["metadata"]["n"] == "5")
        .expect("job n=5 waits (two of eight run)");
    let id = five["id"].as_u64().unwrap();
    assert!(listed.starts_with(&id.to_string()), "{listed}");
    browser.screenshot("jobs");
    browser.click("#jobs tbody a");
    s.wait_until("the job's page", || {
        browser.current_url().ends_with(&format!("/jobs/{id}"))
    });
    assert!(browser.text("#job").contains("queued"));
    browser.screenshot("job");

    // Cancel: the page asks, the browser confirms, the store has it.
    browser.click("form[action$='/cancel'] button");
    s.wait_until("the confirmation page", || {
        browser.text("main").contains(&format!("Cancel job {id}?"))
    });
    browser.screenshot("confirm");
    let before: Value =
        serde_json::from_str(&tool(&s.db, &["show", &id.to_string(), "--json"])).unwrap();
    assert_eq!(before["job"]["state"], "queued", "asking changed nothing");
    browser.click("#confirm");
    assert!(browser.text("#done").contains("Cancelled"));
    let after: Value =
        serde_json::from_str(&tool(&s.db, &["show", &id.to_string(), "--json"])).unwrap();
    assert_eq!(after["job"]["state"], "cancelled", "{after}");
    browser.go(&s.url("/?refresh=0"));
    assert_counts_match(&s, || {
        browser.go(&s.url("/?refresh=0"));
        browser.source()
    });
    assert_eq!(shown_count(&browser.source(), "q", "cancelled"), 1);
}
