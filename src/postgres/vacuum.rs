//! The store's own vacuum, for a server whose autovacuum is off or behind.
//!
//! A job queue churns its table: a claim and a completion each write a new version of the
//! job's row (neither can be HOT: both move indexed columns), and a purge deletes rows, so
//! every job leaves dead versions behind. Only a vacuum takes them away. Autovacuum does it
//! where it runs (the tables are made with low thresholds), but it can be off (it is on this
//! project's own test server) or behind; then the dead versions grow without bound, every
//! claim's index scan walks past more of them, and throughput falls (BENCHMARKS.md, "Churn
//! over minutes": a pool's rate halved within a minute with autovacuum off).
//!
//! So each reaper pass looks at the statistics PostgreSQL keeps for the store's two tables
//! and, where the dead versions pass a threshold, vacuums that table in the background, as
//! Que did for the same reason. `SKIP_LOCKED` makes a vacuum already running there (an
//! autovacuum, or another machine's reaper) a reason to skip, not to wait. A handle waits
//! 2 s after its vacuum before the next, and a minute when a transaction older than the
//! vacuum was still open after it: a vacuum cannot remove versions such a transaction may
//! still see, and repeating it at once would only rescan the table.

use std::time::Duration;

use super::rows::Col;
use super::{PgError, PgStore};
use crate::error::Result;

/// The live and dead row versions of the store's two tables (`$1`: its schema), by
/// PostgreSQL's statistics; a reaper's look reads them in its own statement
/// (`read::reaper_looks`).
macro_rules! dead_rows {
    () => {
        "SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname IN ('leasehold_jobs', 'leasehold_runs')"
    };
}
pub(super) use dead_rows;

const DEAD_ROWS: &str = dead_rows!();

/// The least time from the end of a handle's vacuum to the start of its next: short while
/// vacuums work, long once one could not remove the dead versions it found.
const VACUUM_GAP: Duration = Duration::from_secs(2);
const VACUUM_GAP_HELD_BACK: Duration = Duration::from_secs(60);

/// Whether a transaction of this database that began before `$1` is still open: it holds
/// back what a vacuum that began at `$1` could remove.
const HELD_BACK: &str = "
SELECT EXISTS (SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_xmin IS NOT NULL AND xact_start < $1)";

/// Where a handle's vacuum stands.
pub(super) enum Vacuum {
    /// None has run.
    Never,
    /// One is running, in its own thread.
    Running,
    /// The last one ended `at`; the next may start `gap` after.
    Ended {
        at: crate::clock::Stopwatch,
        gap: Duration,
    },
}

/// The row versions of the store's tables, by PostgreSQL's statistics: each table's name,
/// live and dead versions.
pub(super) type DeadRows = Vec<(String, i64, i64)>;

/// The store's tables that need a vacuum: more dead row versions than `base` plus a fifth
/// of their live rows.
fn needing_vacuum(rows: &[(String, i64, i64)], base: u64) -> Vec<String> {
    let base = i64::try_from(base).unwrap_or(i64::MAX);
    rows.iter()
        .filter(|(_, live, dead)| *dead > base.saturating_add(live / 5))
        .map(|(table, _, _)| table.clone())
        .collect()
}

impl PgStore {
    /// Starts a vacuum of the store's tables that need one, in a thread of its own, unless
    /// one of this handle's is running or the store was built without
    /// ([`super::PgStoreBuilder::vacuum_when_dead`]). Returns the tables it started on.
    pub(super) fn vacuum_if_needed(&self) -> Result<Vec<String>> {
        let Some(base) = self.settings().vacuum_when_dead else {
            return Ok(Vec::new());
        };
        // One at a time, and not again right after the last one; not for a minute after
        // one that an older open transaction held back (every pass would otherwise rescan
        // the table for nothing).
        {
            let mut state = self.inner.vacuum.lock();
            match &*state {
                Vacuum::Running => return Ok(Vec::new()),
                Vacuum::Ended { at, gap } if at.elapsed() < *gap => return Ok(Vec::new()),
                _ => {}
            }
            *state = Vacuum::Running;
        }
        // (the counts the pass's look read, where it read them: one statement fewer for an
        // idle reaper)
        let seen = self.inner.dead_rows.lock().take();
        let counts = match seen {
            Some(rows) => Ok(rows),
            None => self.alone(|c, p| {
                let st = p.get(c, DEAD_ROWS)?;
                c.query(&st, &[&self.inner.names.schema])
                    .map_err(PgError::from)?
                    .iter()
                    .map(|row| Ok((row.col(0)?, row.col(1)?, row.col(2)?)))
                    .collect::<Result<Vec<_>>>()
            }),
        };
        let tables = counts.map(|rows| needing_vacuum(&rows, base));
        let tables = match tables {
            Ok(tables) if !tables.is_empty() => tables,
            other => {
                self.vacuum_ended(Duration::ZERO);
                return other.map(|_| Vec::new());
            }
        };
        // The last vacuum's thread has ended (or is past its end): joined before the next.
        if let Some(last) = self.inner.vacuum_thread.lock().take() {
            let _ = last.join();
        }
        // The thread holds the store weakly, so that the handle closes when the application
        // drops it (joining the thread, which stops at its next table); it holds a handle
        // only while it vacuums a table.
        let weak = std::sync::Arc::downgrade(&self.inner);
        let names = tables.clone();
        let spawned = std::thread::Builder::new()
            .name("leasehold-vacuum".into())
            .spawn(move || {
                let mut gap = VACUUM_GAP;
                for table in &tables {
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    match (PgStore { inner }).vacuum_table(table) {
                        Ok(true) => gap = VACUUM_GAP_HELD_BACK,
                        Ok(false) => {}
                        Err(e) => tracing::warn!(table, error = %e, "the store's vacuum failed"),
                    }
                }
                if let Some(inner) = weak.upgrade() {
                    PgStore { inner }.vacuum_ended(gap);
                }
            });
        match spawned {
            Ok(thread) => *self.inner.vacuum_thread.lock() = Some(thread),
            Err(e) => {
                self.vacuum_ended(Duration::ZERO);
                return Err(crate::error::Error::ThreadSpawn(e));
            }
        }
        Ok(names)
    }

    /// This handle's vacuum is over; the next may start `gap` from now.
    fn vacuum_ended(&self, gap: Duration) {
        *self.inner.vacuum.lock() = Vacuum::Ended {
            at: crate::clock::Stopwatch::start(),
            gap,
        };
    }

    /// `VACUUM (ANALYZE, SKIP_LOCKED)` of one of the store's tables, on a connection of its
    /// own (a vacuum cannot run in a transaction) without the statement timeout (a vacuum
    /// of a large table may rightly take longer; cancelling one loses nothing). Returns
    /// whether a transaction older than the vacuum was still open after it (so that it may
    /// have removed little).
    fn vacuum_table(&self, table: &str) -> Result<bool> {
        let mut client = self.connect(0)?.client;
        tracing::info!(table, "vacuuming the store's table");
        client
            .batch_execute("SET statement_timeout = 0")
            .map_err(PgError::from)?;
        let began: std::time::SystemTime = client
            .query_one("SELECT clock_timestamp()", &[])
            .map_err(PgError::from)?
            .col(0)?;
        client
            .batch_execute(&format!(
                "VACUUM (ANALYZE, SKIP_LOCKED) {}.{table}",
                self.inner.names.schema
            ))
            .map_err(PgError::from)?;
        let held_back = client
            .query_one(HELD_BACK, &[&began])
            .map_err(PgError::from)?
            .col(0)?;
        if held_back {
            tracing::info!(
                table,
                "an older transaction is open: the next vacuum waits a minute"
            );
        }
        Ok(held_back)
    }

    /// Whether a vacuum this handle's reaper pass started is still running. A short-lived
    /// process (a command-line tool) waits for it before it exits: the server cancels a
    /// vacuum whose connection closes.
    pub fn vacuum_running(&self) -> bool {
        matches!(*self.inner.vacuum.lock(), Vacuum::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::needing_vacuum;

    #[test]
    fn a_table_needs_a_vacuum_past_the_base_plus_a_fifth_of_its_live_rows() {
        let rows = [
            ("leasehold_jobs".to_owned(), 10_000, 22_001),
            ("leasehold_runs".to_owned(), 10_000, 22_000),
        ];
        assert_eq!(needing_vacuum(&rows, 20_000), vec!["leasehold_jobs"]);
        assert!(needing_vacuum(&rows, 30_000).is_empty());
        assert_eq!(needing_vacuum(&rows, 0).len(), 2);
    }
}
