//! Reading the status page as its tests do: the counts the overview shows, and the form
//! secret its forms carry. Shared by the page's suite (`tests/web/`) and the tool's
//! (`cli/tests/serve.rs`), which read the same HTML, one through the handler and one over
//! HTTP and in a browser.

#![allow(dead_code)] // each test binary uses its part

/// The count the overview shows for `queue` in `state` (its `data-count` cell).
pub fn shown_count(html: &str, queue: &str, state: &str) -> u64 {
    let marker = format!("data-count=\"{queue}/{state}\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no cell {marker}"))
        + marker.len();
    let rest = &html[at..];
    let digits: String = rest[rest.find('>').expect("the cell's text") + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a count")
}

/// The form secret the page's forms carry.
pub fn form_secret(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with the secret")
        + 19;
    html[at..at + 32].to_owned()
}
