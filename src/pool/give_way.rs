//! A round gives way to another process writing the same file.
//!
//! Processes that share a redb file take turns at its one writer lock, each commit a
//! two-phase fsync, and a writer that follows another process's commit reloads its page
//! cache first: every commit of the file costs every process, so what a file moves is about
//! its commits times the jobs each carries. A round that queued behind another process's
//! commit carried what it had when it began to wait; pools of several processes, woken
//! together by one enqueue, queued behind one another, and all but the first found nothing
//! or a few jobs once their turn came: many empty claims, and far fewer jobs per commit
//! than one process of as many workers carries (`leasehold bench --only processes`).
//!
//! So where another process is writing, the dispatcher does not queue behind it: it looks
//! again about a millisecond later ([`RECHECK`]), its workers' completions gathering
//! meanwhile, and begins its round once the writer is free, carrying everything gathered.
//! Claims lose nothing by it (the commit given way to may be the one that takes the jobs);
//! completions wait longer to be acknowledged, at most [`MOST_DEFERRED`] more: once rounds
//! have given way that long, the next waits its turn as every write does, so a pool is
//! never starved by a process that writes without pause. Measured in BENCHMARKS.md.

use std::time::Duration;

use crate::clock::Stopwatch;

/// The longest a pool's rounds give way before one waits its turn at the writer lock: the
/// most a completion's acknowledgment (or a claim) is put off on a file other processes
/// keep busy. A longer bound lets a commit carry more jobs and makes completions wait
/// longer; 20 ms keeps the wait within a handful of commits (`leasehold bench --only
/// processes` compares bounds; BENCHMARKS.md).
pub(crate) const MOST_DEFERRED: Duration = Duration::from_millis(20);

/// How soon a round that gave way looks again.
pub(crate) const RECHECK: Duration = Duration::from_millis(1);

/// Since when the dispatcher's rounds have given way, none having begun (one per pool: the
/// dispatcher's own).
#[derive(Debug, Default)]
pub(crate) struct GiveWay {
    since: Option<Stopwatch>,
}

impl GiveWay {
    /// Whether the round about to begin gives way now: `another_writes` says whether another
    /// process is writing the file (asked only while rounds have not given way too long).
    pub(crate) fn now(&mut self, another_writes: impl FnOnce() -> bool) -> bool {
        if self.since.is_some_and(|s| s.elapsed() >= MOST_DEFERRED) || !another_writes() {
            self.since = None;
            return false;
        }
        self.since.get_or_insert_with(Stopwatch::start);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_gives_way_only_while_another_process_writes() {
        let mut way = GiveWay::default();
        assert!(!way.now(|| false), "nobody writing: begin now");
        assert!(way.now(|| true), "another writing: look again later");
        assert!(!way.now(|| false), "the writer is free again: begin");
        assert!(way.now(|| true), "and another writes: give way again");
    }

    #[test]
    fn rounds_that_gave_way_long_enough_wait_their_turn() {
        let mut way = GiveWay::default();
        assert!(way.now(|| true));
        // Real time passes here (a stopwatch, never the store clock). What follows holds
        // however late this thread runs: it waits at least the bound, never at most.
        let start = Stopwatch::start();
        while start.elapsed() < MOST_DEFERRED {
            std::thread::sleep(RECHECK);
        }
        let mut asked = false;
        let gives_way = way.now(|| {
            asked = true;
            true
        });
        assert!(
            !gives_way,
            "given way long enough: this round waits its turn"
        );
        assert!(!asked, "without asking whether another process writes");
        assert!(way.now(|| true), "and the next gives way afresh");
    }
}
