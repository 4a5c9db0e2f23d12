//! The names a store's SQL is made with: its schema's, checked, the channel its wake-ups
//! go on, and what stands for its clock. A room of its own, below the schema's creation and
//! the timeline check that both use it.

use super::PgError;

/// The schema's name, checked, and the SQL made for it.
#[derive(Debug)]
pub(crate) struct Names {
    pub(crate) schema: String,
    /// The `NOTIFY` channel of this store's wake-ups.
    pub(crate) channel: String,
    /// What `{now}` stands for: `clock_timestamp()`, or the schema's `clock()` (which reads
    /// a transaction's simulated time) for the conformance tests. Not the function always:
    /// calling it costs a third of a pool's throughput.
    now: String,
}

impl Names {
    pub(crate) fn new(schema: &str, simulated: bool) -> std::result::Result<Names, PgError> {
        let mut chars = schema.chars();
        let plain = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && schema.len() <= 63;
        // PostgreSQL's own schemas: its catalogs, TOAST, temporary schemas and the SQL
        // standard's views. `CREATE TABLE` into some of them succeeds.
        if schema.starts_with("pg_") || schema == "information_schema" {
            return Err(PgError::SystemSchema(schema.to_owned()));
        }
        match plain {
            true => Ok(Names {
                schema: schema.to_owned(),
                channel: super::listen::channel(schema),
                now: match simulated {
                    true => format!("{schema}.clock()"),
                    false => "clock_timestamp()".to_owned(),
                },
            }),
            false => Err(PgError::BadSchemaName(schema.to_owned())),
        }
    }

    /// `template` with `{s}` replaced by the schema (a plain identifier, so no quoting) and
    /// `{now}` by the store's clock.
    pub(crate) fn sql(&self, template: &str) -> String {
        template
            .replace("{now}", &self.now)
            .replace("{s}", &self.schema)
    }
}
