//! Ids a failover cannot hand out twice, and an old primary a handle refuses.
//!
//! A PostgreSQL server's timeline moves on at every promotion of a standby (and every
//! point-in-time recovery). A standby promoted before it received its primary's last commits
//! resumes the id sequences from where it had them, so ids the old primary acknowledged
//! after that point would be handed out again, naming other jobs and groups. A store
//! therefore records the timeline it last wrote on (the `timeline` key of `leasehold_meta`),
//! and the first connection of any handle, or the first `add_job`, that finds the server on
//! another timeline moves the jobs' and the groups' id sequences 2^40 ahead before anything
//! is written there (`{s}.on_timeline()`, in one transaction under the meta row's lock): past
//! every id the lost commits can have handed out, unless they were more than 2^40 (about
//! 10^12). The cost: one extra query per new connection, and 2^40 of the 2^63 ids spent at
//! each promotion, enough for eight million. A lease's fence needs none of this: its token
//! is drawn at random ([`crate::LeaseToken`]).
//!
//! A handle also remembers the newest timeline it has seen, and refuses a server on an
//! older one ([`PgError::StalePrimary`]): an old primary started again beside the promoted
//! one, which a URL naming both may reach first. A process that has never seen the newer
//! timeline cannot tell; README's failover section says to fence an old primary.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use postgres::Transaction;

use super::PgError;
use super::connection::{Connection, TIMELINE};
use super::names::Names;
use crate::error::Result;

/// What a handle knows of its servers' timelines.
#[derive(Default)]
pub(super) struct Timelines {
    /// The newest timeline any of its connections found (0: none yet).
    newest: AtomicU32,
    /// The timeline the store's ids were last made safe for by this handle (0: none yet).
    adopted: AtomicU32,
    /// The store's schema is there (opening prepared it): the ids can be made safe.
    ready: AtomicBool,
}

impl Timelines {
    /// The schema is there: from now on every connection's timeline is adopted.
    pub(super) fn ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Vets a connection before it is lent: refused if its server is on an older timeline
    /// than one this handle has seen; on a timeline not yet adopted, the store's ids are
    /// made safe for it first. A connection to a server in recovery is read again (it may
    /// have been promoted since).
    pub(super) fn vet(&self, conn: &mut Connection, names: &Names) -> Result<()> {
        if conn.timeline.is_none() {
            conn.read_timeline()?;
        }
        let Some(timeline) = conn.timeline else {
            return Ok(());
        };
        let newest = self
            .newest
            .fetch_max(timeline, Ordering::SeqCst)
            .max(timeline);
        if timeline < newest {
            return Err(PgError::StalePrimary {
                found: timeline,
                seen: newest,
            }
            .into());
        }
        if self.ready.load(Ordering::SeqCst) && self.adopted.load(Ordering::SeqCst) != timeline {
            let st = names.sql("SELECT {s}.on_timeline()");
            match conn.client.execute(&st, &[]) {
                Ok(_) => self.adopted.store(timeline, Ordering::SeqCst),
                // A reader's role that may not write: it enqueues nothing either. A writer
                // makes the ids safe before its first write.
                Err(e) if matches!(PgError::from(&e), PgError::PermissionDenied(_)) => {
                    tracing::debug!("a role that cannot write met a new timeline: {e}");
                }
                Err(e) => return Err(PgError::from(e).into()),
            }
        }
        Ok(())
    }
}

/// Records the server's timeline as the one the store writes on, with no jump of the ids: a
/// store made now, or upgraded from before timelines were recorded (whatever failed over
/// before is past knowing).
pub(super) fn record(tx: &mut Transaction<'_>, names: &Names) -> Result<()> {
    let insert =
        names.sql("INSERT INTO {s}.leasehold_meta (key, value) SELECT 'timeline', t::text FROM");
    let st = format!(
        "{insert} ({TIMELINE}) AS now(t) WHERE t IS NOT NULL
         ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    );
    tx.execute(&st, &[]).map_err(PgError::from)?;
    Ok(())
}

/// `{s}.on_timeline()`: the server's timeline (`NULL` in recovery); the first call on a
/// timeline other than the recorded one moves the id sequences ahead and records it (see
/// the module's docs). Made by a new store and by the upgrade to version 7.
macro_rules! on_timeline {
    () => {
        r#"
CREATE OR REPLACE FUNCTION {s}.on_timeline() RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    tl bigint;
    recorded text;
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN NULL;
    END IF;
    tl := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    SELECT value INTO recorded FROM {s}.leasehold_meta WHERE key = 'timeline';
    IF recorded = tl::text THEN
        RETURN tl;
    END IF;
    SELECT value INTO recorded FROM {s}.leasehold_meta WHERE key = 'timeline' FOR UPDATE;
    IF recorded IS NULL THEN
        INSERT INTO {s}.leasehold_meta (key, value) VALUES ('timeline', tl::text)
        ON CONFLICT (key) DO NOTHING;
    ELSIF recorded <> tl::text THEN
        PERFORM setval(pg_get_serial_sequence('{s}.leasehold_jobs', 'id'),
                       nextval(pg_get_serial_sequence('{s}.leasehold_jobs', 'id')) + 1099511627776);
        PERFORM setval(pg_get_serial_sequence('{s}.leasehold_groups', 'id'),
                       nextval(pg_get_serial_sequence('{s}.leasehold_groups', 'id')) + 1099511627776);
        UPDATE {s}.leasehold_meta SET value = tl::text WHERE key = 'timeline';
        RAISE LOG 'leasehold schema {s}: timeline % after %, ids moved 2^40 ahead', tl, recorded;
    END IF;
    RETURN tl;
END
$fn$;
"#
    };
}
pub(crate) use on_timeline;
