//! What this build reads in a schema, checked at every open: a store whose tables were
//! altered by hand (a column's type changed, an index or a function dropped) is refused,
//! naming what changed, rather than read wrongly.

use super::PgError;
use super::rows::Col;
use crate::error::Result;

/// Every column leasehold reads or writes, with the type it made it with (PostgreSQL's
/// `udt_name`): the schema module's `CREATE` in another form, checked against a fresh schema
/// by the tests.
const COLUMNS: &[(&str, &[(&str, &str)])] = &[
    ("leasehold_meta", &[("key", "text"), ("value", "text")]),
    (
        "leasehold_jobs",
        &[
            ("id", "int8"),
            ("queue", "text"),
            ("state", "text"),
            ("priority", "int4"),
            ("attempt", "int8"),
            ("failures", "int8"),
            ("max_attempts", "int8"),
            ("unique_key", "text"),
            ("created_at", "timestamptz"),
            ("run_at", "timestamptz"),
            ("lease_owner", "text"),
            ("lease_claimed_at", "timestamptz"),
            ("lease_expires_at", "timestamptz"),
            ("lease_indexed_expiry", "timestamptz"),
            ("lease_length_us", "int8"),
            ("stall_timeout_us", "int8"),
            ("progress", "int8"),
            ("progress_at", "timestamptz"),
            ("cancel_requested", "bool"),
            ("last_error", "text"),
            ("finished_at", "timestamptz"),
            ("updated_at", "timestamptz"),
            ("payload", "bytea"),
            ("output", "bytea"),
            ("lease_deadline", "timestamptz"),
            ("time_limit_us", "int8"),
            ("unique_for_us", "int8"),
            ("key_released", "bool"),
            ("metadata", "_text"),
            ("last_worker", "text"),
            ("last_claimed_at", "timestamptz"),
            ("flow", "bytea"),
            ("awaited", "bool"),
            ("grp", "int8"),
            ("retry", "bytea"),
            ("limit_key", "text"),
            ("parked", "bool"),
            ("lease_token", "int8"),
            ("expires_at", "timestamptz"),
        ],
    ),
    (
        "leasehold_runs",
        &[
            ("job", "int8"),
            ("attempt", "int8"),
            ("worker", "text"),
            ("claimed_at", "timestamptz"),
            ("ended_at", "timestamptz"),
            ("outcome", "text"),
            ("error", "text"),
            ("reclaim_path", "text"),
            ("overdue_us", "int8"),
            ("progress", "int8"),
            ("time_limit_us", "int8"),
            ("snoozed_for_us", "int8"),
        ],
    ),
    ("leasehold_counters", &[("name", "text"), ("value", "int8")]),
    (
        "leasehold_queues",
        &[
            ("queue", "text"),
            ("served_at", "timestamptz"),
            ("paused", "bool"),
            ("concurrency", "int4"),
            ("rate_claims", "int4"),
            ("rate_per_us", "int8"),
            ("recent_claims", "_int8"),
            ("retry", "bytea"),
            ("per_key", "int4"),
            ("per_key_rate_claims", "int4"),
            ("per_key_rate_per_us", "int8"),
        ],
    ),
    (
        "leasehold_limit_keys",
        &[
            ("queue", "text"),
            ("key", "text"),
            ("running", "int4"),
            ("head", "int8"),
            ("recent", "_int8"),
            ("opens_at", "timestamptz"),
        ],
    ),
    (
        "leasehold_schedules",
        &[("name", "text"), ("record", "bytea")],
    ),
    ("leasehold_waits", &[("job", "int8"), ("waiter", "int8")]),
    (
        "leasehold_groups",
        &[
            ("id", "int8"),
            ("record", "bytea"),
            ("ended_at", "timestamptz"),
        ],
    ),
    ("leasehold_group_keys", &[("key", "text"), ("grp", "int8")]),
    (
        "leasehold_checkpoints",
        &[("job", "int8"), ("record", "bytea")],
    ),
    (
        "leasehold_logs",
        &[("job", "int8"), ("attempt", "int8"), ("record", "bytea")],
    ),
    (
        "leasehold_endings",
        &[
            ("xid", "xid8"),
            ("seq", "int8"),
            ("job", "int8"),
            ("grp", "int8"),
            ("queue", "text"),
            ("state", "text"),
            ("at", "timestamptz"),
            ("n", "int4"),
            ("jobs", "_int8"),
            ("queues", "_text"),
        ],
    ),
    (
        "leasehold_requests",
        &[
            ("id", "int8"),
            ("job", "int8"),
            ("attempt", "int8"),
            ("token", "int8"),
            ("what", "text"),
            ("output", "bytea"),
            ("error", "text"),
            ("retry_in_us", "int8"),
            ("permanently", "bool"),
            ("run_at", "timestamptz"),
            ("priority", "int4"),
            ("at", "timestamptz"),
            ("refused", "text"),
        ],
    ),
];

/// The indexes the protocol relies on: the unique one for correctness (`ON CONFLICT`
/// names it), the others so that claims and the reaper do not scan the table.
const INDEXES: &[&str] = &[
    "leasehold_jobs_pkey",
    "leasehold_jobs_ready",
    "leasehold_jobs_expiry",
    "leasehold_jobs_unique",
    "leasehold_jobs_finished",
    "leasehold_jobs_expiring",
    "leasehold_runs_pkey",
    "leasehold_queues_pkey",
    "leasehold_schedules_pkey",
    "leasehold_jobs_group",
    "leasehold_waits_pkey",
    "leasehold_groups_pkey",
    "leasehold_groups_ended",
    "leasehold_group_keys_pkey",
    "leasehold_checkpoints_pkey",
    "leasehold_logs_pkey",
    "leasehold_endings_pkey",
    "leasehold_jobs_keyed",
    "leasehold_limit_keys_pkey",
    "leasehold_limit_keys_gate",
    "leasehold_requests_pkey",
    "leasehold_requests_waiting",
];

/// The functions every statement calls.
const FUNCTIONS: &[&str] = &[
    "us",
    "at",
    "clock",
    "add_job",
    "settle_key",
    "on_timeline",
    "varint",
    "ending_seq",
    "ending_last",
    "duration",
    "request_end",
    "complete_job",
    "fail_job",
    "reschedule_jobs",
    "remove_job",
];

/// The oid of the schema named `$1`, for a catalog query's namespace. Every open reads
/// the catalogs, so each query names what it looks for and finds it through the catalogs'
/// indexes (`pg_class` by name and namespace, `pg_attribute` by relation, `pg_proc` by name):
/// a database where schemas come and go (a test suite's; the catalogs keep their dead rows
/// until vacuumed) made a read of `information_schema` or of a namespace's every row take
/// 10–30 ms each, and an open about 80 ms.
pub(super) const SCHEMA_OID: &str = "(SELECT oid FROM pg_namespace WHERE nspname = $1)";

/// Refuses a store whose tables were altered by hand, naming what changed: a column's type
/// that a read would fail on (or worse, read wrongly), a missing column, index or function.
pub(super) fn check_tables(tx: &mut postgres::Transaction<'_>, schema: &str) -> Result<()> {
    let altered = |detail: String| PgError::SchemaAltered {
        schema: Some(schema.to_owned()),
        detail,
    };
    // Each query looks its rows up by name in the catalogs' indexes (see `SCHEMA_OID`).
    let tables: Vec<&str> = COLUMNS.iter().map(|(table, _)| *table).collect();
    let found: Vec<(String, String, String)> = tx
        .query(
            &format!(
                "SELECT c.relname::text, a.attname::text, t.typname::text
                 FROM pg_class c
                 JOIN pg_attribute a ON a.attrelid = c.oid
                 JOIN pg_type t ON t.oid = a.atttypid
                 WHERE c.relnamespace = {SCHEMA_OID} AND c.relname = ANY($2::name[])
                     AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
            ),
            &[&schema, &tables],
        )?
        .iter()
        .map(|row| Ok((row.col(0)?, row.col(1)?, row.col(2)?)))
        .collect::<Result<_>>()?;
    for (table, columns) in COLUMNS {
        for (column, want) in *columns {
            match found.iter().find(|(t, c, _)| t == table && c == column) {
                None => return Err(altered(format!("column {table}.{column} is missing")).into()),
                Some((_, _, ty)) if ty != want => {
                    return Err(altered(format!(
                        "column {table}.{column} is {ty}; leasehold made it {want}"
                    ))
                    .into());
                }
                Some(_) => {}
            }
        }
    }
    let indexes: Vec<String> = tx
        .query(
            &format!(
                "SELECT relname::text FROM pg_class
                 WHERE relnamespace = {SCHEMA_OID} AND relname = ANY($2::name[])
                     AND relkind IN ('i', 'I')"
            ),
            &[&schema, &INDEXES],
        )?
        .iter()
        .map(|row| row.col(0))
        .collect::<Result<_>>()?;
    if let Some(missing) = INDEXES.iter().find(|i| !indexes.iter().any(|f| f == *i)) {
        return Err(altered(format!("index {missing} is missing")).into());
    }
    let functions: Vec<String> = tx
        .query(
            &format!(
                "SELECT proname::text FROM pg_proc
                 WHERE pronamespace = {SCHEMA_OID} AND proname = ANY($2::name[])"
            ),
            &[&schema, &FUNCTIONS],
        )?
        .iter()
        .map(|row| row.col(0))
        .collect::<Result<_>>()?;
    if let Some(missing) = FUNCTIONS
        .iter()
        .find(|f| !functions.iter().any(|g| g == *f))
    {
        return Err(altered(format!("function {missing}() is missing")).into());
    }
    Ok(())
}
