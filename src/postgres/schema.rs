//! The tables, created and checked by the store itself, with a schema version.
//!
//! Heartbeats are the hottest write, so a renewal must be able to be a HOT update (rewriting
//! the row in place, touching no index): it writes only `lease_expires_at`, `progress`,
//! `progress_at` and `updated_at`, none of them indexed, and the table leaves room in each
//! page for the new version (`fillfactor`). A claim and a completion cannot be HOT (each
//! moves the state the partial indexes name), but each writes a new version of the row,
//! and one written on its own page costs less than one sent to another (no free-space
//! search, a smaller WAL record): pages are filled to 40 % on insert, about 18 waiting rows
//! of some 180 bytes with room for 22 new versions (a fuller page leaves new versions
//! little room, an emptier one makes the table larger; BENCHMARKS.md compares them). Stores
//! made before keep the fill they were made with. The expiry index is on `lease_indexed_expiry`,
//! which a renewal does not move; it is at or before the real expiry, and the reaper or a
//! claimer that finds a renewed lease there moves it up (the redb store's rule, see
//! `LeaseRecord::indexed_expiry`).

use postgres::Client;

use super::PgError;
use super::names::Names;
use super::rows::Col;
use crate::error::Result;

/// The newest schema version this build knows. Version 2 may record an attempt's outcome
/// as `failed_permanently`, `timed_out` or `snoozed`, which version 1 builds cannot read
/// (they refuse the newer version instead), and adds the columns of time limits, uniqueness
/// windows and metadata and the tables of queues and schedules. Version 3 keeps the last
/// attempt of a job that succeeded in its row (`last_worker`, `last_claimed_at`) instead of
/// a history row, which version 2 builds would not show. An older schema is upgraded
/// by the first open that may create
/// ([`crate::postgres::PgStoreBuilder::create_if_missing`], on by default); a reader's open
/// is refused ([`PgError::OlderSchema`]) and leaves it as it is. Version 5 adds a retry
/// policy to jobs and queues (`since_5`) and writes schedules' records in codec format 4,
/// which version 4 builds cannot read. Version 6 adds limit keys (`since_6`), and writes
/// schedules' records in codec format 5. Version 7 adds each lease's token (`since_7`),
/// which the fence compares, and the server timeline the store last wrote on (the
/// `timeline` key of `leasehold_meta`: see `timeline.rs`); version 6 builds would grant
/// leases without a token, and are refused. Version 8 adds the keys of keyed groups, jobs'
/// checkpoints and attempts' logs (`since_8`, [`crate::NewGroup::key`]); a version 7 build would make a
/// second group of a key, and is refused. Version 9 adds jobs' expiry and the state
/// `expired` (`since_9`); a version 8 build would run an expired job, and is refused.
/// Version 10 keeps when each group ended in its row (`since_10`) and each group's key in
/// its record (codec format 8); a version 9 build would leave an ended group open there,
/// and is refused. Version 11 replaces `add_job` with one that also takes a limit key, a
/// time limit, a uniqueness window and an expiry (`since_11`), and adds `settle_key`.
/// Version 12 keeps every end (`since_12`, [`crate::ReadJobs::endings`]); a version 11 build would
/// end jobs without them, and is refused. Version 13 adds ends and edits asked for in SQL
/// (`complete_job`, `fail_job`, `reschedule_jobs`, `remove_job`: see `requests.rs`) and a
/// retry policy to `add_job` (`since_13`); a version 12 build would leave those requests
/// unapplied, and is refused. Version 14 keeps the endings of a statement that completed
/// many jobs in one row (`since_14`); a version 13 build would read such a row as an ending
/// of nothing, and is refused.
pub const VERSION: u32 = 14;

/// The tables version 2 added, made by a new store and by the upgrade from version 1 alike:
/// each queue's record (pause, limits, the rate window, the served mark) and each periodic
/// job's declaration with the cursor of its next tick, as the crate's codec encodes it (a
/// format-version byte, then bincode: the rule book reads and writes it whole).
macro_rules! tables_since_2 {
    () => {
        "
CREATE TABLE IF NOT EXISTS {s}.leasehold_queues (
    queue text PRIMARY KEY,
    served_at timestamptz,
    paused boolean NOT NULL DEFAULT false,
    concurrency integer,
    rate_claims integer,
    rate_per_us bigint,
    recent_claims bigint[] NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS {s}.leasehold_schedules (name text PRIMARY KEY, record bytea NOT NULL);
"
    };
}

/// What version 4 added, made by a new store and by the upgrade alike: jobs that wait for
/// jobs. A job's part (`flow`: what it waits for, its group, as the crate's codec encodes
/// [`crate::workflow::Flow`]; `NULL` for none), whether its end moves others (`awaited`, so
/// the one-statement completion can leave those to the protocol), its group (`grp`, indexed
/// for a group's members), which job waits for which (`leasehold_waits`, by dependency) and
/// the groups' records.
macro_rules! since_4 {
    () => {
        concat!(
            "
ALTER TABLE {s}.leasehold_jobs
    ADD COLUMN IF NOT EXISTS flow bytea,
    ADD COLUMN IF NOT EXISTS awaited boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS grp bigint;
CREATE INDEX IF NOT EXISTS leasehold_jobs_group ON {s}.leasehold_jobs (grp) WHERE grp IS NOT NULL;
CREATE TABLE IF NOT EXISTS {s}.leasehold_waits (
    job bigint NOT NULL,
    waiter bigint NOT NULL,
    PRIMARY KEY (job, waiter)
);
CREATE TABLE IF NOT EXISTS {s}.leasehold_groups (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record bytea NOT NULL
);
",
            add_job!()
        )
    };
}

/// What version 5 added, made by a new store and by the upgrade alike: a job's own retry
/// policy and a queue's (`retry`, as the crate's codec encodes [`crate::RetryPolicy`];
/// `NULL` for none).
macro_rules! since_5 {
    () => {
        "
ALTER TABLE {s}.leasehold_jobs ADD COLUMN IF NOT EXISTS retry bytea;
ALTER TABLE {s}.leasehold_queues ADD COLUMN IF NOT EXISTS retry bytea;
"
    };
}

/// What version 6 added, made by a new store and by the upgrade alike: a job's limit key
/// and whether it is parked (out of the claim order: the ready index holds only jobs that
/// are not, so a claim never meets a key at its limit), a queue's per-key limit, each limit
/// key's record (its running jobs, its head: see `rules::keys`), and the index of each key's
/// waiting jobs in their key's order.
macro_rules! since_6 {
    () => {
        "
ALTER TABLE {s}.leasehold_jobs
    ADD COLUMN IF NOT EXISTS limit_key text,
    ADD COLUMN IF NOT EXISTS parked boolean NOT NULL DEFAULT false;
ALTER TABLE {s}.leasehold_queues
    ADD COLUMN IF NOT EXISTS per_key integer,
    ADD COLUMN IF NOT EXISTS per_key_rate_claims integer,
    ADD COLUMN IF NOT EXISTS per_key_rate_per_us bigint;
CREATE TABLE IF NOT EXISTS {s}.leasehold_limit_keys (
    queue text NOT NULL,
    key text NOT NULL,
    running integer NOT NULL,
    head bigint,
    recent bigint[] NOT NULL DEFAULT '{}',
    opens_at timestamptz,
    PRIMARY KEY (queue, key)
);
CREATE INDEX IF NOT EXISTS leasehold_limit_keys_gate ON {s}.leasehold_limit_keys (queue, opens_at)
    WHERE opens_at IS NOT NULL;
DROP INDEX IF EXISTS {s}.leasehold_jobs_ready;
CREATE INDEX leasehold_jobs_ready ON {s}.leasehold_jobs (queue, priority, run_at, id)
    WHERE state IN ('queued', 'retry_wait') AND NOT parked;
CREATE INDEX IF NOT EXISTS leasehold_jobs_keyed ON {s}.leasehold_jobs (queue, limit_key, run_at, id)
    WHERE state IN ('queued', 'retry_wait') AND limit_key IS NOT NULL;
"
    };
}

/// What version 7 added, made by a new store and by the upgrade alike: the token of each
/// job's current or last lease (see [`crate::LeaseToken`]; 0 for a lease granted before),
/// the timeline the store writes on, and time conversions that take every value a column
/// may hold.
macro_rules! since_7 {
    () => {
        concat!(
            "
ALTER TABLE {s}.leasehold_jobs ADD COLUMN IF NOT EXISTS lease_token bigint NOT NULL DEFAULT 0;
",
            super::timeline::on_timeline!(),
            time_functions!(),
            add_job!()
        )
    };
}

/// What version 8 added, made by a new store and by the upgrade alike: the key each keyed
/// group was made with, each job's last checkpoint and each attempt's log lines (as the
/// crate's codec encodes [`crate::checkpoint::CheckpointRecord`] and
/// [`crate::job_log::LogRecord`]).
macro_rules! since_8 {
    () => {
        "
CREATE TABLE IF NOT EXISTS {s}.leasehold_group_keys (
    key text PRIMARY KEY,
    grp bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.leasehold_checkpoints (
    job bigint PRIMARY KEY,
    record bytea NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.leasehold_logs (
    job bigint NOT NULL,
    attempt bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (job, attempt)
);
"
    };
}

/// What version 9 added, made by a new store and by the upgrade alike: each job's expiry
/// ([`crate::NewJob::expires_in`]), the state `expired`, and the index the reaper finds
/// waiting jobs past their expiry by.
macro_rules! since_9 {
    () => {
        "
ALTER TABLE {s}.leasehold_jobs ADD COLUMN IF NOT EXISTS expires_at timestamptz;
ALTER TABLE {s}.leasehold_jobs DROP CONSTRAINT IF EXISTS leasehold_jobs_state_check;
ALTER TABLE {s}.leasehold_jobs ADD CONSTRAINT leasehold_jobs_state_check
    CHECK (state IN ('queued', 'running', 'retry_wait', 'succeeded', 'dead', 'cancelled',
                     'blocked', 'expired')) NOT VALID;
ALTER TABLE {s}.leasehold_jobs VALIDATE CONSTRAINT leasehold_jobs_state_check;
CREATE INDEX IF NOT EXISTS leasehold_jobs_expiring ON {s}.leasehold_jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('queued', 'retry_wait', 'blocked');
"
    };
}

/// What version 10 added, made by a new store and by the upgrade alike: when each group
/// ended (`NULL` while it is open), indexed, so that the stats count the open groups and
/// retention finds the old ones without reading every group a store ever made. The upgrade
/// sets it, and each keyed group's key in its record, from the records (`index_groups`).
macro_rules! since_10 {
    () => {
        "
ALTER TABLE {s}.leasehold_groups ADD COLUMN IF NOT EXISTS ended_at timestamptz;
CREATE INDEX IF NOT EXISTS leasehold_groups_ended ON {s}.leasehold_groups (ended_at);
"
    };
}

/// What version 11 changed, made by a new store and by the upgrade alike: `add_job` of
/// eleven arguments in place of the seven of versions 4 to 10 (dropped, so that a call
/// naming only the first ones is not ambiguous), and `settle_key`.
macro_rules! since_11 {
    () => {
        concat!(
            "
DROP FUNCTION IF EXISTS {s}.add_job(text, bytea, integer, timestamptz, integer, text, text[]);
",
            add_job!()
        )
    };
}

/// What version 12 added, made by a new store and by the upgrade alike: every end of a job
/// or a group, by the transaction that committed it (`xid`, the order a reader reads them
/// in, behind the snapshot's horizon: see [`crate::endings`]) and its number in it.
macro_rules! since_12 {
    () => {
        "
CREATE TABLE IF NOT EXISTS {s}.leasehold_endings (
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq bigint GENERATED ALWAYS AS IDENTITY,
    job bigint,
    grp bigint,
    queue text,
    state text NOT NULL,
    at timestamptz NOT NULL,
    PRIMARY KEY (xid, seq)
);
"
    };
}

/// What version 14 added, made by a new store and by the upgrade alike: a row of endings
/// that holds many (`n` of them: `jobs` in the order of their ids, of `queue`, or of
/// `queues` where they differ), the jobs one statement completed together (`COMPLETE_MANY`).
/// A row and an index entry per job cost a drain a tenth of its throughput; a row per
/// round of up to 500 costs less than a microsecond per job. A reader's cursor may stand
/// inside such a row, so each ending of a row written since has its own number within its
/// transaction, `{s}.ending_seq`: the row's `seq` times a million plus its place in the
/// row (a row kept before version 14, `n` empty, numbers its one ending `seq`);
/// `{s}.ending_last` is the number of a row's last ending (what a page stops inside, or a
/// trim passed). Rows stay on their page (`toast_tuple_target`), which a row of 500 ids
/// fits, rather than being compressed and moved out of line.
macro_rules! since_14 {
    () => {
        "
ALTER TABLE {s}.leasehold_endings
    ADD COLUMN IF NOT EXISTS n integer,
    ADD COLUMN IF NOT EXISTS jobs bigint[],
    ADD COLUMN IF NOT EXISTS queues text[];
ALTER TABLE {s}.leasehold_endings ALTER COLUMN n SET DEFAULT 1;
ALTER TABLE {s}.leasehold_endings SET (toast_tuple_target = 8160);
CREATE OR REPLACE FUNCTION {s}.ending_seq(seq bigint, n integer, i integer) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN n IS NULL THEN seq ELSE seq * 1000000 + i END $$;
CREATE OR REPLACE FUNCTION {s}.ending_last(seq bigint, n integer) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT {s}.ending_seq(seq, n, coalesce(n, 1) - 1) $$;
"
    };
}

/// What version 13 changed, made by a new store and by the upgrade alike: `add_job` of
/// fifteen arguments in place of the eleven of versions 11 and 12 (dropped, as `since_11`
/// dropped the seven), with the encoding of the retry policy it writes (`{s}.varint`,
/// `{s}.duration`: bincode's standard varint form of the crate's codec, held to
/// `codec::encode` by the PostgreSQL suite), and the requests made in SQL
/// (`requests.rs`).
macro_rules! since_13 {
    () => {
        concat!(
            r#"
DROP FUNCTION IF EXISTS {s}.add_job(text, bytea, integer, timestamptz, integer, text, text[],
    text, interval, interval, timestamptz);

-- bincode's standard (varint) form of an unsigned integer
CREATE OR REPLACE FUNCTION {s}.varint(v bigint) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    n integer;
    out bytea;
BEGIN
    IF v < 251 THEN
        RETURN set_byte('\x00'::bytea, 0, v::integer);
    ELSIF v < 65536 THEN
        n := 2; out := '\xfb';
    ELSIF v < 4294967296 THEN
        n := 4; out := '\xfc';
    ELSE
        n := 8; out := '\xfd';
    END IF;
    FOR i IN 0 .. n - 1 LOOP
        out := out || set_byte('\x00'::bytea, 0, ((v >> (8 * i)) & 255)::integer);
    END LOOP;
    RETURN out;
END
$fn$;

-- a Duration as bincode encodes it: whole seconds, then nanoseconds
CREATE OR REPLACE FUNCTION {s}.duration(d interval) RETURNS bytea LANGUAGE sql IMMUTABLE AS $fn$
    SELECT {s}.varint(floor(extract(epoch FROM d))::bigint)
        || {s}.varint(((extract(epoch FROM d) - floor(extract(epoch FROM d))) * 1000000000)::bigint)
$fn$;
"#,
            super::requests::since_13!(),
            add_job!()
        )
    };
}

/// `{s}.us(t)`, a time as the microseconds since the Unix epoch that store time keeps, and
/// `{s}.at(us)`, back. Total: `infinity` (which an older `add_job` let in) reads as the end
/// of store time (`u64::MAX` nanoseconds, in microseconds: 18446744073709551), and that
/// value is written back as `infinity`; `-infinity` reads as the epoch. So a row with such a
/// time is read, listed, cancelled and purged like any other.
macro_rules! time_functions {
    () => {
        "
CREATE OR REPLACE FUNCTION {s}.us(t timestamptz) RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN isfinite(t) OR t IS NULL
                      THEN floor(extract(epoch FROM t) * 1000000)::bigint
                      WHEN t > 'epoch' THEN 18446744073709551 ELSE 0 END $$;
CREATE OR REPLACE FUNCTION {s}.at(us bigint) RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN us >= 18446744073709551 THEN timestamptz 'infinity'
                      ELSE timestamptz 'epoch' + us * interval '1 microsecond' END $$;
"
    };
}

/// `{s}.add_job(queue, payload, priority, run_at, max_attempts, unique_key, metadata,
/// limit_key, time_limit, unique_for, expires_at, retry_base, retry_max, retry_delays,
/// retry_jitter)`: an enqueue from SQL (graphile-worker's
/// `add_job`), for triggers, other languages and the application's own transactions, with
/// `protocol::enqueue`'s checks and answers: the same refusals (SQLSTATE 22023, the message
/// the crate's `InputError` gives), a unique key a live job holds answered with that job's
/// id (a finished holder whose window ran out gives the key up), and the store's `NOTIFY`
/// with the commit. A job with a limit key arrives parked, and its key is settled as
/// `protocol::keys::settle` settles it (the key's row locked; its rate window's claims
/// counted; its first waiting job, in run time then id, made its head while the key has
/// room; a job another transaction holds left to that transaction), the one place outside
/// the rules that decides it, held to the same answers by the PostgreSQL suite. It knows
/// only the defaults a store handle may change: the payload limit of 1 MiB and 25 attempts.
/// A retry policy (exponential from `retry_base` to `retry_max`, or `retry_delays`, with
/// `retry_jitter`) is checked as [`crate::RetryPolicy::validate`] checks it and written as
/// the crate's codec writes one. (Version 13: `since_13` drops the eleven-argument function
/// of versions 11 and 12, as `since_11` dropped the seven of versions 4 to 10.)
macro_rules! add_job {
    () => {
        concat!(
            r#"
CREATE OR REPLACE FUNCTION {s}.add_job(
    queue text,
    payload bytea DEFAULT '\x',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 25,
    unique_key text DEFAULT NULL,
    metadata text[] DEFAULT '{}',
    limit_key text DEFAULT NULL,
    time_limit interval DEFAULT NULL,
    unique_for interval DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    retry_base interval DEFAULT NULL,
    retry_max interval DEFAULT NULL,
    retry_delays interval[] DEFAULT NULL,
    retry_jitter double precision DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    t timestamptz := {s}.clock();
    made bigint;
    holder record;
    pair text;
    keys text[] := '{}';
    retry bytea;
    delay interval;
BEGIN
    IF add_job.queue IS NULL OR octet_length(add_job.queue) = 0 THEN
        RAISE EXCEPTION 'queue name is empty' USING ERRCODE = '22023';
    ELSIF octet_length(add_job.queue) > 128 THEN
        RAISE EXCEPTION 'queue name is % bytes; the limit is 128', octet_length(add_job.queue)
            USING ERRCODE = '22023';
    ELSIF octet_length(coalesce(add_job.payload, '\x')) > 1048576 THEN
        RAISE EXCEPTION 'payload is % bytes; the limit is 1048576', octet_length(add_job.payload)
            USING ERRCODE = '22023';
    ELSIF add_job.run_at IS NOT NULL AND NOT isfinite(add_job.run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite time, got %', add_job.run_at
            USING ERRCODE = '22023';
    ELSIF add_job.max_attempts IS NULL OR add_job.max_attempts < 1 THEN
        RAISE EXCEPTION 'max attempts must be at least 1' USING ERRCODE = '22023';
    ELSIF add_job.unique_key IS NOT NULL
        AND octet_length(add_job.unique_key) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'unique key must be 1 to 256 bytes, got %', octet_length(add_job.unique_key)
            USING ERRCODE = '22023';
    ELSIF add_job.unique_for IS NOT NULL AND add_job.unique_key IS NULL THEN
        RAISE EXCEPTION 'a uniqueness window needs a unique key' USING ERRCODE = '22023';
    ELSIF add_job.unique_for < interval '0' THEN
        RAISE EXCEPTION 'a uniqueness window must not be negative, got %', add_job.unique_for
            USING ERRCODE = '22023';
    ELSIF add_job.time_limit <= interval '0' THEN
        RAISE EXCEPTION 'a job''s time limit must be greater than zero' USING ERRCODE = '22023';
    ELSIF add_job.limit_key IS NOT NULL
        AND octet_length(add_job.limit_key) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'limit key must be 1 to 256 bytes, got %', octet_length(add_job.limit_key)
            USING ERRCODE = '22023';
    ELSIF add_job.expires_at IS NOT NULL AND NOT isfinite(add_job.expires_at) THEN
        RAISE EXCEPTION 'expires_at must be a finite time, got %', add_job.expires_at
            USING ERRCODE = '22023';
    ELSIF add_job.expires_at <= add_job.run_at AND add_job.run_at > t THEN
        RAISE EXCEPTION 'the job would expire % after its enqueue, not after it is due (%): it could never run',
            add_job.expires_at - t, add_job.run_at - t USING ERRCODE = '22023';
    ELSIF cardinality(coalesce(add_job.metadata, '{}')) > 16 THEN
        RAISE EXCEPTION 'at most 16 metadata pairs, got %', cardinality(add_job.metadata)
            USING ERRCODE = '22023';
    END IF;
    FOREACH pair IN ARRAY coalesce(add_job.metadata, '{}') LOOP
        IF position('=' IN pair) < 2 OR position('=' IN pair) > 65
            OR octet_length(split_part(pair, '=', 1)) > 64 THEN
            RAISE EXCEPTION 'metadata %: a key of 1 to 64 bytes, without =, then =value', pair
                USING ERRCODE = '22023';
        ELSIF octet_length(substr(pair, position('=' IN pair) + 1)) > 256 THEN
            RAISE EXCEPTION 'metadata %: a value of at most 256 bytes', pair USING ERRCODE = '22023';
        ELSIF split_part(pair, '=', 1) = ANY(keys) THEN
            RAISE EXCEPTION 'metadata key % given twice', split_part(pair, '=', 1)
                USING ERRCODE = '22023';
        END IF;
        keys := keys || split_part(pair, '=', 1);
    END LOOP;
    -- The retry policy, as the crate's codec encodes a RetryPolicy (format 8): its shape
    -- (exponential, or a list of delays), then its jitter in millionths.
    IF add_job.retry_base IS NOT NULL OR add_job.retry_max IS NOT NULL THEN
        IF add_job.retry_base IS NULL OR add_job.retry_max IS NULL THEN
            RAISE EXCEPTION 'an exponential retry policy needs retry_base and retry_max'
                USING ERRCODE = '22023';
        ELSIF add_job.retry_delays IS NOT NULL THEN
            RAISE EXCEPTION 'a retry policy is retry_base and retry_max, or retry_delays, not both'
                USING ERRCODE = '22023';
        ELSIF add_job.retry_base < interval '0' THEN
            RAISE EXCEPTION 'a retry delay must not be negative, got %', add_job.retry_base
                USING ERRCODE = '22023';
        ELSIF add_job.retry_max < add_job.retry_base THEN
            RAISE EXCEPTION 'retry policy is invalid: max backoff is shorter than base'
                USING ERRCODE = '22023';
        END IF;
        retry := '\x0800'::bytea || {s}.duration(add_job.retry_base)
            || {s}.duration(add_job.retry_max);
    ELSIF add_job.retry_delays IS NOT NULL THEN
        IF cardinality(add_job.retry_delays) = 0 THEN
            RAISE EXCEPTION 'retry policy is invalid: a list of delays needs at least one'
                USING ERRCODE = '22023';
        ELSIF cardinality(add_job.retry_delays) > 32 THEN
            RAISE EXCEPTION 'retry policy is invalid: a list of delays may hold at most 32'
                USING ERRCODE = '22023';
        END IF;
        retry := '\x0802'::bytea || {s}.varint(cardinality(add_job.retry_delays));
        FOREACH delay IN ARRAY add_job.retry_delays LOOP
            IF delay IS NULL OR delay < interval '0' THEN
                RAISE EXCEPTION 'a retry delay must not be negative, got %', delay
                    USING ERRCODE = '22023';
            END IF;
            retry := retry || {s}.duration(delay);
        END LOOP;
    ELSIF add_job.retry_jitter IS NOT NULL THEN
        RAISE EXCEPTION 'retry_jitter needs a retry policy (retry_base and retry_max, or retry_delays)'
            USING ERRCODE = '22023';
    END IF;
    IF retry IS NOT NULL THEN
        IF NOT coalesce(add_job.retry_jitter, 0) BETWEEN 0 AND 1 THEN
            RAISE EXCEPTION 'retry policy is invalid: jitter must be within 0.0..=1.0'
                USING ERRCODE = '22023';
        END IF;
        retry := retry || {s}.varint(floor(coalesce(add_job.retry_jitter, 0) * 1000000 + 0.5)::bigint);
    END IF;
    -- A server on a timeline the store has not written on: its ids first (timeline.rs).
    PERFORM {s}.on_timeline();
    LOOP
        INSERT INTO {s}.leasehold_jobs
            (queue, state, priority, max_attempts, unique_key, created_at, run_at, progress_at,
             updated_at, payload, metadata, limit_key, parked, time_limit_us, unique_for_us,
             expires_at, retry)
        VALUES (add_job.queue, 'queued', coalesce(add_job.priority, 0), add_job.max_attempts,
                add_job.unique_key, t, greatest(coalesce(add_job.run_at, t), t), t, t,
                coalesce(add_job.payload, '\x'), coalesce(add_job.metadata, '{}'),
                add_job.limit_key, add_job.limit_key IS NOT NULL,
                floor(extract(epoch FROM add_job.time_limit) * 1000000)::bigint,
                floor(extract(epoch FROM add_job.unique_for) * 1000000)::bigint,
                add_job.expires_at, retry)
        ON CONFLICT (queue, unique_key) WHERE "#,
            key_held!(),
            r#"
            DO NOTHING
        RETURNING id INTO made;
        IF made IS NOT NULL THEN
            IF add_job.limit_key IS NOT NULL THEN
                PERFORM {s}.settle_key(add_job.queue, add_job.limit_key, t);
            END IF;
            PERFORM pg_notify('leasehold_{s}', add_job.queue);
            RETURN made;
        END IF;
        -- The key's holder: the answer while it holds the key (rules::holds_key), else it
        -- gives the key up (rules::release_key) and the insert is tried again.
        SELECT id, state, finished_at, unique_for_us INTO holder FROM {s}.leasehold_jobs j
        WHERE j.queue = add_job.queue AND j.unique_key = add_job.unique_key AND "#,
            key_held!(),
            r#"
        FOR UPDATE;
        IF FOUND THEN
            IF holder.state <> 'succeeded' OR holder.unique_for_us = -1
                OR t < holder.finished_at + holder.unique_for_us * interval '1 microsecond' THEN
                RETURN holder.id;
            END IF;
            UPDATE {s}.leasehold_jobs SET key_released = true, updated_at = t
            WHERE id = holder.id;
        END IF;
    END LOOP;
END
$fn$;

-- protocol::keys::settle for a job that arrived (no change in the key's running count).
CREATE OR REPLACE FUNCTION {s}.settle_key(q text, k text, t timestamptz) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    rec record;
    lim record;
    now_us bigint := {s}.us(t);
    kept bigint[];
    opens bigint;
    room boolean;
    first_job bigint;
BEGIN
    INSERT INTO {s}.leasehold_limit_keys (queue, key, running) VALUES (q, k, 0)
        ON CONFLICT DO NOTHING;
    SELECT running, lk.head, lk.recent INTO rec FROM {s}.leasehold_limit_keys lk
        WHERE lk.queue = q AND lk.key = k FOR UPDATE;
    SELECT per_key, per_key_rate_claims, per_key_rate_per_us INTO lim
        FROM {s}.leasehold_queues WHERE queue = q;
    -- rules::counted: the claims still in the rate's window, and when it has room again
    IF lim.per_key_rate_claims IS NOT NULL THEN
        kept := ARRAY(SELECT r FROM unnest(rec.recent) WITH ORDINALITY AS u(r, n)
                      WHERE r + lim.per_key_rate_per_us > now_us ORDER BY n);
        IF cardinality(kept) >= lim.per_key_rate_claims THEN
            opens := kept[1] + lim.per_key_rate_per_us;
        END IF;
    ELSE
        kept := '{}';
    END IF;
    -- rules::key_has_room, rules::key_head
    room := (lim.per_key IS NULL OR rec.running < lim.per_key)
        AND (lim.per_key_rate_claims IS NULL OR cardinality(kept) < lim.per_key_rate_claims);
    IF room THEN
        SELECT id INTO first_job FROM {s}.leasehold_jobs
            WHERE queue = q AND limit_key = k AND state IN ('queued', 'retry_wait')
            ORDER BY run_at, id LIMIT 1;
    END IF;
    IF first_job IS DISTINCT FROM rec.head THEN
        -- (a job another transaction holds is left to it, which settles the key after)
        UPDATE {s}.leasehold_jobs SET parked = true, updated_at = t
            WHERE id = (SELECT id FROM {s}.leasehold_jobs WHERE id = rec.head
                        AND state IN ('queued', 'retry_wait') AND NOT parked
                        FOR UPDATE SKIP LOCKED);
        IF first_job IS NOT NULL THEN
            PERFORM 1 FROM {s}.leasehold_jobs WHERE id = first_job FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE {s}.leasehold_jobs SET parked = false, updated_at = t
                    WHERE id = first_job AND parked;
            ELSE
                first_job := NULL;
            END IF;
        END IF;
    END IF;
    IF rec.running = 0 AND first_job IS NULL AND cardinality(kept) = 0 THEN
        DELETE FROM {s}.leasehold_limit_keys WHERE queue = q AND key = k;
    ELSE
        UPDATE {s}.leasehold_limit_keys SET head = first_job, recent = kept, opens_at = {s}.at(opens)
            WHERE queue = q AND key = k;
    END IF;
END
$fn$;
"#
        )
    };
}

/// The unique index's predicate: a key is held while its job waits or runs, and after
/// success for a window (`unique_for_us`), until a newer job takes it (`key_released`).
/// Every `ON CONFLICT` on the key names the same predicate.
macro_rules! key_held {
    () => {
        "unique_key IS NOT NULL AND NOT key_released
        AND (state IN ('queued', 'running', 'retry_wait', 'blocked')
             OR (state = 'succeeded' AND unique_for_us IS NOT NULL))"
    };
}
pub(crate) use key_held;

const CREATE: &str = concat!(
    r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE {s}.leasehold_meta (key text PRIMARY KEY, value text NOT NULL);
"#,
    time_functions!(),
    r#"
-- A transaction's simulated time, for the conformance tests (statements of a store opened
-- for them read it; every other store reads clock_timestamp() directly).
CREATE FUNCTION {s}.clock() RETURNS timestamptz LANGUAGE sql STABLE
    AS $$ SELECT coalesce({s}.at(nullif(current_setting('leasehold.now_us', true), '')::bigint),
                          clock_timestamp()) $$;
CREATE TABLE {s}.leasehold_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    state text NOT NULL
        CHECK (state IN ('queued', 'running', 'retry_wait', 'succeeded', 'dead', 'cancelled',
                         'blocked')),
    priority integer NOT NULL,
    attempt bigint NOT NULL DEFAULT 0,
    failures bigint NOT NULL DEFAULT 0,
    max_attempts bigint NOT NULL,
    unique_key text,
    created_at timestamptz NOT NULL,
    run_at timestamptz NOT NULL,
    lease_owner text,
    lease_claimed_at timestamptz,
    lease_expires_at timestamptz,
    lease_indexed_expiry timestamptz,
    lease_length_us bigint,
    stall_timeout_us bigint,
    progress bigint NOT NULL DEFAULT 0,
    progress_at timestamptz NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    last_error text,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL,
    payload bytea NOT NULL,
    output bytea,
    lease_deadline timestamptz,
    time_limit_us bigint,
    unique_for_us bigint,
    key_released boolean NOT NULL DEFAULT false,
    metadata text[] NOT NULL DEFAULT '{}',
    last_worker text,
    last_claimed_at timestamptz
) WITH (fillfactor = 40, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05);
CREATE INDEX leasehold_jobs_ready ON {s}.leasehold_jobs (queue, priority, run_at, id)
    WHERE state IN ('queued', 'retry_wait');
CREATE INDEX leasehold_jobs_expiry ON {s}.leasehold_jobs (lease_indexed_expiry)
    WHERE state = 'running';
CREATE UNIQUE INDEX leasehold_jobs_unique ON {s}.leasehold_jobs (queue, unique_key)
    WHERE "#,
    key_held!(),
    r#";
CREATE INDEX leasehold_jobs_finished ON {s}.leasehold_jobs (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE TABLE {s}.leasehold_runs (
    job bigint NOT NULL,
    attempt bigint NOT NULL,
    worker text NOT NULL,
    claimed_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL,
    outcome text NOT NULL,
    error text,
    reclaim_path text,
    overdue_us bigint,
    progress bigint NOT NULL,
    time_limit_us bigint,
    snoozed_for_us bigint,
    PRIMARY KEY (job, attempt)
);
CREATE TABLE {s}.leasehold_counters (name text PRIMARY KEY, value bigint NOT NULL);
"#,
    tables_since_2!(),
    since_4!(),
    since_5!(),
    since_6!(),
    since_7!(),
    since_8!(),
    since_9!(),
    since_10!(),
    since_11!(),
    since_12!(),
    since_13!(),
    since_14!(),
    r#"
INSERT INTO {s}.leasehold_counters (name, value) VALUES
    ('reclaimed_by_reaper', 0), ('reclaimed_by_takeover', 0), ('reclaimed_at_open', 0),
    ('reclaimed_process_died', 0),
    ('released', 0), ('leases_lost', 0), ('fenced_writes_rejected', 0), ('stalled', 0),
    ('worst_detection_delay_us', 0);
"#
);

/// From version 1 to 2: the columns of time limits, uniqueness windows and metadata, and
/// the unique index over the keys that outlive their job's success.
const MIGRATE_FROM_1: &str = concat!(
    r#"
ALTER TABLE {s}.leasehold_jobs
    ADD COLUMN IF NOT EXISTS lease_deadline timestamptz,
    ADD COLUMN IF NOT EXISTS time_limit_us bigint,
    ADD COLUMN IF NOT EXISTS unique_for_us bigint,
    ADD COLUMN IF NOT EXISTS key_released boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS metadata text[] NOT NULL DEFAULT '{}';
ALTER TABLE {s}.leasehold_runs ADD COLUMN IF NOT EXISTS time_limit_us bigint,
    ADD COLUMN IF NOT EXISTS snoozed_for_us bigint;
"#,
    tables_since_2!(),
    r#"
DROP INDEX IF EXISTS {s}.leasehold_jobs_unique;
CREATE UNIQUE INDEX leasehold_jobs_unique ON {s}.leasehold_jobs (queue, unique_key)
    WHERE "#,
    key_held!(),
    ";"
);

/// From version 2 to 3: the columns of a succeeded job's last attempt, which a completion
/// moves there from the lease instead of writing a history row (that attempt ended when the
/// job finished, with the job's progress). A history row is a fourth heap tuple and a
/// seventh index entry per job, on the path of every job that succeeds. A job that
/// succeeded before the upgrade has
/// its history row instead and these empty: the history reads both
/// ([`super::read::history`]).
const MIGRATE_FROM_2: &str = "
ALTER TABLE {s}.leasehold_jobs ADD COLUMN IF NOT EXISTS last_worker text,
    ADD COLUMN IF NOT EXISTS last_claimed_at timestamptz;
";

/// From version 3 to 4: [`since_4`], and the state `blocked` (a blocked job holds its
/// unique key, as a queued one does).
const MIGRATE_FROM_3: &str = concat!(
    since_4!(),
    "
ALTER TABLE {s}.leasehold_jobs DROP CONSTRAINT IF EXISTS leasehold_jobs_state_check;
ALTER TABLE {s}.leasehold_jobs ADD CONSTRAINT leasehold_jobs_state_check
    CHECK (state IN ('queued', 'running', 'retry_wait', 'succeeded', 'dead', 'cancelled',
                     'blocked'));
DROP INDEX IF EXISTS {s}.leasehold_jobs_unique;
CREATE UNIQUE INDEX leasehold_jobs_unique ON {s}.leasehold_jobs (queue, unique_key)
    WHERE ",
    key_held!(),
    ";"
);

/// Creates the schema's tables if there are none (when `create`), or checks the ones there: a leasehold
/// store of a version this build knows, upgraded to this build's version (when `create`;
/// returns the version it was). Two processes creating at once are serialized by an
/// advisory lock, so one creates and the other checks.
pub(crate) fn prepare(client: &mut Client, names: &Names, create: bool) -> Result<Option<u32>> {
    let mut tx = client.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('leasehold schema ' || $1))",
        &[&names.schema],
    )?;
    // The tables `information_schema.tables` lists (those of the kinds it lists that this
    // role may use), found through the index on name and namespace (`SCHEMA_OID`).
    let found: Vec<String> = tx
        .query(
            &format!(
                "SELECT relname::text FROM pg_class c
                 WHERE relnamespace = {} AND relname LIKE 'leasehold\\_%'
                     AND relkind IN ('r', 'v', 'f', 'p')
                     AND (pg_has_role(relowner, 'USAGE')
                         OR has_table_privilege(c.oid,
                             'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                         OR has_any_column_privilege(c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))",
                super::schema_check::SCHEMA_OID
            ),
            &[&names.schema],
        )?
        .iter()
        .map(|row| row.col(0))
        .collect::<Result<_>>()?;
    if found.is_empty() && !create {
        return Err(PgError::NoStore(names.schema.clone()).into());
    }
    if found.is_empty() {
        tx.batch_execute(&names.sql(CREATE))?;
        tx.execute(
            &names.sql(
                "INSERT INTO {s}.leasehold_meta (key, value)
                 VALUES ('format', 'leasehold'), ('schema_version', $1)",
            ),
            &[&VERSION.to_string()],
        )?;
        super::timeline::record(&mut tx, names)?;
        tx.commit()?;
        return Ok(None);
    }
    let foreign = |detail: String| PgError::NotALeaseholdSchema {
        schema: names.schema.clone(),
        detail,
    };
    if !found.iter().any(|t| t == "leasehold_meta") {
        return Err(foreign(format!("tables {found:?} but no leasehold_meta")).into());
    }
    let meta: Vec<(String, String)> = tx
        .query(&names.sql("SELECT key, value FROM {s}.leasehold_meta"), &[])
        .map_err(|e| foreign(format!("its leasehold_meta cannot be read: {e}")))?
        .iter()
        .map(|row| Ok((row.col(0)?, row.col(1)?)))
        .collect::<Result<_>>()?;
    let get = |key: &str| meta.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    if get("format") != Some("leasehold") {
        return Err(foreign("its leasehold_meta does not name the leasehold format".into()).into());
    }
    let version: u32 = get("schema_version")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| foreign("its schema version is missing or not a number".into()))?;
    if version > VERSION {
        return Err(PgError::NewerSchema {
            schema: names.schema.clone(),
            found: version,
            supported: VERSION,
        }
        .into());
    }
    if version < VERSION && !create {
        // A reader of a store an older build made reads columns it lacks: refused, and left
        // as it is; the first open that may write upgrades it.
        return Err(PgError::OlderSchema {
            schema: names.schema.clone(),
            found: version,
            supported: VERSION,
        }
        .into());
    }
    let upgraded = (version < VERSION).then_some(version);
    if upgraded == Some(1) {
        tx.batch_execute(&names.sql(MIGRATE_FROM_1))?;
    }
    if upgraded.is_some_and(|v| v <= 2) {
        tx.batch_execute(&names.sql(MIGRATE_FROM_2))?;
    }
    if upgraded.is_some_and(|v| v <= 3) {
        tx.batch_execute(&names.sql(MIGRATE_FROM_3))?;
    }
    if upgraded.is_some_and(|v| v <= 4) {
        tx.batch_execute(&names.sql(since_5!()))?;
    }
    if upgraded.is_some_and(|v| v <= 5) {
        tx.batch_execute(&names.sql(since_6!()))?;
    }
    if upgraded.is_some_and(|v| v <= 6) {
        tx.batch_execute(&names.sql(since_7!()))?;
        super::timeline::record(&mut tx, names)?;
    }
    if upgraded.is_some_and(|v| v <= 7) {
        tx.batch_execute(&names.sql(since_8!()))?;
    }
    if upgraded.is_some_and(|v| v <= 8) {
        tx.batch_execute(&names.sql(since_9!()))?;
    }
    if upgraded.is_some_and(|v| v <= 9) {
        tx.batch_execute(&names.sql(since_10!()))?;
        index_groups(&mut tx, names)?;
    }
    if upgraded.is_some_and(|v| v <= 10) {
        tx.batch_execute(&names.sql(since_11!()))?;
    }
    if upgraded.is_some_and(|v| v <= 11) {
        tx.batch_execute(&names.sql(since_12!()))?;
    }
    if upgraded.is_some_and(|v| v <= 12) {
        tx.batch_execute(&names.sql(since_13!()))?;
    }
    if upgraded.is_some_and(|v| v <= 13) {
        tx.batch_execute(&names.sql(since_14!()))?;
    }
    super::schema_check::check_tables(&mut tx, &names.schema)?;
    if let Some(older) = upgraded {
        tx.execute(
            &names.sql("UPDATE {s}.leasehold_meta SET value = $1 WHERE key = 'schema_version'"),
            &[&VERSION.to_string()],
        )?;
        tracing::info!(
            schema = %names.schema,
            from = older,
            to = VERSION,
            "upgrading the store's schema; builds older than this one will refuse it"
        );
    }
    tx.commit()?;
    Ok(upgraded)
}

/// Sets each group's end from its record, and keeps each keyed group's key in its record:
/// the upgrade to version 10, in its transaction. (Groups are few beside jobs; each record is
/// read once.)
fn index_groups(tx: &mut postgres::Transaction<'_>, names: &Names) -> Result<()> {
    let rows = tx.query(
        &names.sql(
            "SELECT g.id, g.record, k.key FROM {s}.leasehold_groups g
             LEFT JOIN {s}.leasehold_group_keys k ON k.grp = g.id",
        ),
        &[],
    )?;
    let save = names
        .sql("UPDATE {s}.leasehold_groups SET record = $2, ended_at = {s}.at($3) WHERE id = $1");
    for row in &rows {
        let id: i64 = row.col(0)?;
        let record: Option<crate::workflow::GroupRecord> =
            crate::codec::decode_stored(Some(row.col::<&[u8]>(1)?), || {
                format!("the record of group {id}")
            })?;
        let Some(mut group) = record else { continue };
        group.key = row.col(2)?;
        let ended = group.finished_at.map(super::rows::us);
        tx.execute(&save, &[&id, &crate::codec::encode(&group), &ended])?;
    }
    Ok(())
}
