//! Plain data: the log lines a job's handler wrote, per attempt ([`crate::JobContext::log`],
//! [`crate::ReadJobs::logs`]).
//!
//! An operator who finds a dead job on the status page should not have to find the worker's
//! own log on some machine to learn what it did. A handler's lines are kept with the job,
//! per attempt, bounded: the newest [`MAX_LOG_LINES`] of each attempt, each cut to
//! [`MAX_LOG_LINE`] bytes, with a count of the lines dropped. They reach the store with the
//! pool's next heartbeat (no write of their own while the attempt runs) and, for the last
//! ones, just before the attempt's end; they go with the job when it is purged.

use bincode::{Decode, Encode};

use crate::ids::{Attempt, StoreTime};

/// The most lines kept per attempt: the oldest beyond it are dropped, and counted.
pub const MAX_LOG_LINES: usize = 100;

/// The most bytes of one line kept (a longer one is cut at a character boundary).
pub const MAX_LOG_LINE: usize = 1024;

/// One line as written: when (store time, as the handler's pool read it) and what.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct LogLine {
    pub at: StoreTime,
    pub text: String,
}

/// One attempt's lines as stored: the newest [`MAX_LOG_LINES`], oldest first, and how many
/// older ones were dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub(crate) struct LogRecord {
    pub lines: Vec<LogLine>,
    pub dropped: u64,
}

impl LogRecord {
    /// Appends `more` (lines written since, and the count of those dropped before they were
    /// stored), dropping the oldest beyond the bound.
    pub(crate) fn merge(&mut self, more: &LogRecord) {
        self.dropped += more.dropped;
        self.append(&more.lines);
    }

    /// Appends `lines` (each already cut), dropping the oldest beyond the bound.
    pub(crate) fn append(&mut self, lines: &[LogLine]) {
        self.lines.extend_from_slice(lines);
        let over = self.lines.len().saturating_sub(MAX_LOG_LINES);
        if over > 0 {
            self.lines.drain(..over);
            self.dropped += over as u64;
        }
    }
}

/// A line as the handler gave it, cut to [`MAX_LOG_LINE`] bytes (at a character boundary)
/// with a NUL byte written as `\0`: a log line is evidence, never refused.
pub(crate) fn line(at: StoreTime, text: &str) -> LogLine {
    let mut end = text.len().min(MAX_LOG_LINE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    LogLine {
        at,
        text: text[..end].replace('\0', "\\0"),
    }
}

/// One attempt's log, as read ([`crate::ReadJobs::logs`]).
#[derive(Clone, PartialEq, Eq)]
pub struct AttemptLog {
    pub(crate) attempt: Attempt,
    pub(crate) record: LogRecord,
}

impl AttemptLog {
    /// The attempt that wrote it.
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// Its lines, oldest first: when each was written (store time) and its text.
    pub fn lines(&self) -> impl Iterator<Item = (StoreTime, &str)> {
        self.record.lines.iter().map(|l| (l.at, l.text.as_str()))
    }

    /// How many older lines were dropped to keep the newest [`MAX_LOG_LINES`].
    pub fn dropped(&self) -> u64 {
        self.record.dropped
    }
}

impl std::fmt::Debug for AttemptLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptLog")
            .field("attempt", &self.attempt)
            .field("lines", &self.record.lines.len())
            .field("dropped", &self.record.dropped)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_log_keeps_its_newest_lines_and_counts_the_dropped() {
        let mut log = LogRecord::default();
        let lines: Vec<_> = (0..MAX_LOG_LINES + 7)
            .map(|i| line(StoreTime(i as u64), &format!("line {i}")))
            .collect();
        log.append(&lines[..5]);
        log.append(&lines[5..]);
        assert_eq!(log.lines.len(), MAX_LOG_LINES);
        assert_eq!(log.dropped, 7);
        assert_eq!(log.lines[0].text, "line 7");
        let newest = format!("line {}", MAX_LOG_LINES + 6);
        assert_eq!(
            log.lines.last().map(|l| l.text.as_str()),
            Some(newest.as_str())
        );
    }

    #[test]
    fn a_long_line_is_cut_at_a_character_boundary_and_a_nul_is_written_out() {
        let long = "é".repeat(MAX_LOG_LINE);
        let cut = line(StoreTime(0), &long);
        assert!(cut.text.len() <= MAX_LOG_LINE && cut.text.len() >= MAX_LOG_LINE - 1);
        assert!(cut.text.chars().all(|c| c == 'é'));
        assert_eq!(line(StoreTime(0), "a\0b").text, "a\\0b");
    }
}
