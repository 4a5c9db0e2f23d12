//! How the tool prints: durations as `1m30s`, store times relative to now, aligned tables,
//! payloads as text or hex, and values as JSON.

use std::time::Duration;

use leasehold::StoreTime;

/// `1m30s`, `2h5m`, `3d4h`, `1.5s`, `250ms`: the two largest units, no spaces.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 10 && !ms.is_multiple_of(1000) {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let units = [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)];
    let mut out = String::new();
    let mut rest = secs;
    let mut parts = 0;
    for (name, size) in units {
        if rest >= size && parts < 2 {
            out.push_str(&format!("{}{name}", rest / size));
            rest %= size;
            parts += 1;
        } else if parts > 0 {
            parts = 2; // only adjacent units: "1h" not "1h5s"
        }
    }
    out
}

/// `12s ago`, `in 3m`, `now`.
pub fn relative(t: StoreTime, now: StoreTime) -> String {
    if t == now {
        "now".into()
    } else if t < now {
        format!("{} ago", duration(now.saturating_since(t)))
    } else {
        format!("in {}", duration(t.saturating_since(now)))
    }
}

/// Store time in whole milliseconds since the store's origin (the JSON unit).
pub fn ms(t: StoreTime) -> u64 {
    t.as_nanos() / 1_000_000
}

/// Milliseconds of a duration (the JSON unit).
pub fn dms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A table with left-aligned text columns and right-aligned number columns.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let numeric: Vec<bool> = (0..cols)
            .map(|i| {
                !self.rows.is_empty()
                    && self.rows.iter().all(|r| {
                        r.get(i)
                            .is_some_and(|c| c.is_empty() || c.parse::<f64>().is_ok())
                    })
            })
            .collect();
        let line = |cells: Vec<&str>| {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    if i + 1 < cells.len() {
                        out.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.trim_end().to_owned()
        };
        let mut out = line(self.headers.clone());
        for row in &self.rows {
            out.push('\n');
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// A payload for people: the text if it is UTF-8 (and printable), else hex.
pub fn bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => s.to_owned(),
        _ => hex(b),
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A queue's limits as the tool shows them.
pub fn limits(l: &leasehold::QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.concurrency {
        parts.push(format!("at most {n} at once"));
    }
    let rate = |r: leasehold::Rate, of: &str| {
        format!("at most {} claims{of} per {}", r.claims, duration(r.per))
    };
    parts.extend(l.rate.map(|r| rate(r, "")));
    if let Some(n) = l.per_key {
        parts.push(format!("at most {n} of one limit key at once"));
    }
    parts.extend(l.per_key_rate.map(|r| rate(r, " of one limit key")));
    match parts.is_empty() {
        true => "no limits".into(),
        false => parts.join(", "),
    }
}

/// Metadata as the tool shows it: `key=value` pairs, comma-separated; `-` for none.
pub fn metadata(pairs: &[(String, String)]) -> String {
    if pairs.is_empty() {
        return "-".into();
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `value` as pretty JSON on standard output (a failure to encode said on standard error).
pub fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("leasehold: cannot print JSON: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(duration(Duration::from_secs(3600)), "1h");
        assert_eq!(duration(Duration::from_secs(3605)), "1h");
        assert_eq!(duration(Duration::from_secs(86_400 * 3 + 3600 * 4)), "3d4h");
    }

    #[test]
    fn payloads_are_text_when_they_can_be() {
        assert_eq!(bytes(b"photo-1.jpg"), "photo-1.jpg");
        assert_eq!(bytes(&[0, 255]), "00ff");
    }
}
