//! The few pieces every page is made of: escaping, the page frame, tables, and times told
//! relative to the store's clock (the only clock the page trusts: a file's store time counts
//! from the store's start, a database's from the epoch, and "3 s ago" reads the same on both).

use std::fmt::Write;
use std::time::Duration;

use leasehold::StoreTime;

/// `text` made safe inside HTML text and double-quoted attributes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one component of a URL's path or query.
pub(crate) fn url_component(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A duration as a person reads it: `850 ms`, `12.4 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        _ if ms < 1000 => format!("{ms} ms"),
        0..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86400, (s % 86400) / 3600),
    }
}

/// `t` relative to `now`: `3.2 s ago`, `in 12.0 s`, `now`.
pub(crate) fn relative(t: StoreTime, now: StoreTime) -> String {
    if t == now {
        "now".to_owned()
    } else if t < now {
        format!("{} ago", duration(now.saturating_since(t)))
    } else {
        format!("in {}", duration(t.saturating_since(now)))
    }
}

/// Store time `t` as a person reads it: a date in UTC where store time is the Unix
/// epoch's (a database's clock: `2026-12-05 08:45:39 UTC`), else time since the store's
/// own start (`t+12.500s`).
pub(crate) fn store_time(t: StoreTime, wall_clock: bool) -> String {
    if !wall_clock {
        return t.to_string();
    }
    let secs = t.as_nanos() / 1_000_000_000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm, for days >= 0).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A page: its title, the navigation, the body, and (for the overview) a refresh.
pub(crate) struct Frame<'a> {
    pub base: &'a str,
    pub title: &'a str,
    pub store: &'a str,
    pub refresh: Option<u32>,
    /// The sign-out form, where the page has a token.
    pub sign_out: Option<String>,
}

impl Frame<'_> {
    pub(crate) fn render(&self, body: &str) -> String {
        let mut page = String::with_capacity(body.len() + 2048);
        let refresh = self
            .refresh
            .map(|s| format!("<meta http-equiv=\"refresh\" content=\"{s}\">"))
            .unwrap_or_default();
        let _ = write!(
            page,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{refresh}\
             <title>{title} · leasehold</title><style>{STYLE}</style></head><body>\
             <header><a class=\"brand\" href=\"{base}/\">leasehold</a>\
             <span class=\"store\">{store}</span>\
             <nav><a href=\"{base}/\">Overview</a><a href=\"{base}/jobs\">Jobs</a>\
             <a href=\"{base}/metrics\">Metrics</a></nav>\
             <form class=\"find\" method=\"get\" action=\"{base}/jobs\"><input name=\"id\" \
             placeholder=\"job id\" size=\"8\" inputmode=\"numeric\" aria-label=\"go to job\">\
             </form>{sign_out}</header><main>\
             <h1>{title}</h1>{body}</main></body></html>",
            title = escape(self.title),
            store = escape(self.store),
            base = self.base,
            sign_out = self.sign_out.as_deref().unwrap_or(""),
        );
        page
    }
}

/// A table built row by row; every cell is HTML the caller made safe.
#[derive(Default)]
pub(crate) struct Table {
    html: String,
    rows: usize,
}

impl Table {
    /// A table with these headings (none if every one is empty: a table of fields).
    pub(crate) fn new(id: &str, headings: &[&str]) -> Table {
        let mut html = format!("<table id=\"{id}\">");
        if headings.iter().any(|h| !h.is_empty()) {
            html.push_str("<thead><tr>");
            for h in headings {
                let _ = write!(html, "<th>{}</th>", escape(h));
            }
            html.push_str("</tr></thead>");
        }
        html.push_str("<tbody>");
        Table { html, rows: 0 }
    }

    pub(crate) fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        self.html.push_str("<tr>");
        for c in cells {
            let _ = write!(self.html, "<td>{c}</td>");
        }
        self.html.push_str("</tr>");
        self.rows += 1;
    }

    pub(crate) fn finish(mut self, empty: &str) -> String {
        if self.rows == 0 {
            return format!("<p class=\"empty\">{}</p>", escape(empty));
        }
        self.html.push_str("</tbody></table>");
        self.html
    }
}

/// A state name in its colour.
pub(crate) fn state_badge(state: leasehold::JobState) -> String {
    format!("<span class=\"state {0}\">{0}</span>", state.name())
}

const STYLE: &str = "\
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1.5em;background:#1d2330;color:#fff}\
header a{color:#fff;text-decoration:none}header nav a{margin-right:1em}\
header form.find{margin-left:auto}\
.brand{font-weight:700}.store{opacity:.7;font-family:monospace}\
main{padding:1em 1.5em;max-width:80em}h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse;background:#fff;margin:.4em 0}\
th,td{padding:.3em .7em;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}\
th{font-weight:600;background:#eef0f3}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
.state{padding:0 .4em;border-radius:3px;background:#e3e6ea}\
.running{background:#cfe3ff}.succeeded{background:#d3f2d9}.dead{background:#ffd6d6}\
.retry_wait{background:#fff0c2}.cancelled{background:#e6e0f5}.blocked{background:#f1e4d3}\
.empty{color:#6b7280}.note{color:#6b7280}.error{background:#ffe8e8;padding:.6em;border-left:4px solid #c22}\
.done{background:#e8f8ec;padding:.6em;border-left:4px solid #2a7}\
form.inline{display:inline}button{cursor:pointer}\
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{background:#fff;padding:.6em 1em;border:1px solid #e3e6ea}\
.card b{display:block;font-size:1.3em}svg{background:#fff;border:1px solid #e3e6ea}\
rect.run{fill:#9ca3af}rect.running{fill:#3b82f6}rect.succeeded{fill:#2a7}rect.failed{fill:#c22}\
rect.lost{fill:#f59e0b}\
pre{white-space:pre-wrap;background:#fff;padding:.6em;border:1px solid #e3e6ea;max-height:20em;overflow:auto}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_store_time_reads_as_a_utc_date_and_a_files_as_time_since_its_start() {
        let at = |secs: u64| StoreTime(secs * 1_000_000_000 + 250_000_000);
        assert_eq!(store_time(at(0), true), "1970-01-01 00:00:00 UTC");
        assert_eq!(store_time(at(951_782_400), true), "2000-02-29 00:00:00 UTC");
        assert_eq!(
            store_time(at(1_796_455_015), true),
            "2026-12-05 07:16:55 UTC"
        );
        assert_eq!(store_time(at(12), false), "t+12.250s");
    }

    #[test]
    fn escaping_leaves_no_markup_and_no_attribute_breakout() {
        let hostile = "<script>alert('x')</script>\"onload=\"&";
        let safe = escape(hostile);
        assert!(!safe.contains('<') && !safe.contains('>') && !safe.contains('"'));
        assert!(!safe.contains('\''));
        assert_eq!(escape("a&b"), "a&amp;b");
    }

    #[test]
    fn durations_read_in_the_unit_a_person_would_use() {
        assert_eq!(duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration(Duration::from_millis(12_400)), "12.4 s");
        assert_eq!(duration(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(duration(Duration::from_secs(7800)), "2 h 10 min");
        assert_eq!(
            duration(Duration::from_secs(3 * 86400 + 4 * 3600)),
            "3 d 4 h"
        );
        let now = StoreTime(10_000_000_000);
        assert_eq!(relative(StoreTime(7_000_000_000), now), "3.0 s ago");
        assert_eq!(relative(StoreTime(12_000_000_000), now), "in 2.0 s");
    }
}
