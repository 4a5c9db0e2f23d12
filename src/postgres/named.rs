//! The records a PostgreSQL store keeps by name beside its jobs ([`NamedRecords`]): a
//! queue's controls (a row of `leasehold_queues`), a limit key's count and head (a row of
//! `leasehold_limit_keys`), a schedule (a row of `leasehold_schedules`, its failure kept in
//! `leasehold_meta`). Each is locked for the rest of the transaction when loaded for writing.

use postgres::Transaction;
use postgres::types::ToSql;

use super::Prepared;
use super::rows::{Col, id, micros, time, us};
use super::transaction::PgRecords;
use crate::codec;
use crate::error::{Error, Result};
use crate::ids::StoreTime;
use crate::protocol::{HeldSchedule, NamedRecords};
use crate::queue::{KeyRecord, QueueLimits, QueueRecord, Rate};
use crate::rules;
use crate::schedule::ScheduleRecord;

/// The columns of a queue's record, in the order [`queue_from`] reads them.
macro_rules! queue_columns {
    () => {
        "{s}.us(q.served_at), q.paused, q.concurrency, q.rate_claims, q.rate_per_us,
         q.recent_claims, q.retry, q.per_key, q.per_key_rate_claims, q.per_key_rate_per_us"
    };
}
pub(crate) use queue_columns;

/// How many columns [`queue_columns`] names (a statement's next column comes after them).
pub(crate) const QUEUE_COLUMNS: usize = 10;

impl PgRecords<'_, '_, '_> {
    fn failure(&mut self, name: &str) -> Result<Option<String>> {
        let st = self.get("SELECT value FROM {s}.leasehold_meta WHERE key = $1")?;
        let key = rules::schedule_failure_key(name);
        match self.tx.query_opt(&st, &[&key])? {
            Some(row) => Ok(Some(row.col(0)?)),
            None => Ok(None),
        }
    }
}

impl NamedRecords for PgRecords<'_, '_, '_> {
    fn queue(&mut self, queue: &str, lock: bool) -> Result<Option<QueueRecord>> {
        if lock {
            self.waited();
        }
        queue_record(self.tx, self.p, queue, lock)
    }

    fn save_queue(&mut self, queue: &str, r: &QueueRecord) -> Result<()> {
        let st = self.get(
            "INSERT INTO {s}.leasehold_queues AS q
                 (queue, served_at, paused, concurrency, rate_claims, rate_per_us, recent_claims,
                  retry, per_key, per_key_rate_claims, per_key_rate_per_us)
             VALUES ($1, {s}.at($2), $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (queue) DO UPDATE
             SET served_at = greatest(q.served_at, excluded.served_at),
                 paused = excluded.paused, concurrency = excluded.concurrency,
                 rate_claims = excluded.rate_claims, rate_per_us = excluded.rate_per_us,
                 recent_claims = excluded.recent_claims, retry = excluded.retry,
                 per_key = excluded.per_key, per_key_rate_claims = excluded.per_key_rate_claims,
                 per_key_rate_per_us = excluded.per_key_rate_per_us",
        )?;
        let concurrency = r
            .limits
            .concurrency
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let rate_claims = r
            .limits
            .rate
            .map(|x| i32::try_from(x.claims).unwrap_or(i32::MAX));
        let rate_per = r.limits.rate.map(|x| micros(x.per));
        let recent: Vec<i64> = r.recent_claims.iter().map(|t| us(*t)).collect();
        let served = r.served_at.map(us);
        let retry = r.retry.as_ref().map(codec::encode);
        let per_key = r
            .limits
            .per_key
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let key_rate = r.limits.per_key_rate;
        let key_claims = key_rate.map(|x| i32::try_from(x.claims).unwrap_or(i32::MAX));
        let key_per = key_rate.map(|x| micros(x.per));
        let params: [&(dyn ToSql + Sync); 11] = [
            &queue,
            &served,
            &r.paused,
            &concurrency,
            &rate_claims,
            &rate_per,
            &recent,
            &retry,
            &per_key,
            &key_claims,
            &key_per,
        ];
        self.tx.execute(&st, &params)?;
        Ok(())
    }

    /// The key's row, locked: one key's claims and ends count its running jobs one at a
    /// time across every process and machine. A key's first record is made by an insert
    /// that waits for another transaction making the same.
    fn limit_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRecord>> {
        let st = self.get(
            "SELECT running, head, recent, {s}.us(opens_at) FROM {s}.leasehold_limit_keys
             WHERE queue = $1 AND key = $2 FOR UPDATE",
        )?;
        self.waited();
        if self.tx.query_opt(&st, &[&queue, &key])?.is_none() {
            // Made (empty) and locked, so that two transactions that find none are one
            // after the other; an empty record is removed again by the save.
            let make = self.get(
                "INSERT INTO {s}.leasehold_limit_keys (queue, key, running) VALUES ($1, $2, 0)
                 ON CONFLICT DO NOTHING",
            )?;
            self.tx.execute(&make, &[&queue, &key])?;
        }
        let row = self.tx.query_one(&st, &[&queue, &key])?;
        let record = key_record(&row, 0)?;
        Ok((!record.is_empty()).then_some(record))
    }

    fn save_limit_key(&mut self, queue: &str, key: &str, record: Option<&KeyRecord>) -> Result<()> {
        let Some(record) = record else {
            let st =
                self.get("DELETE FROM {s}.leasehold_limit_keys WHERE queue = $1 AND key = $2")?;
            self.tx.execute(&st, &[&queue, &key])?;
            return Ok(());
        };
        let st = self.get(
            "INSERT INTO {s}.leasehold_limit_keys (queue, key, running, head, recent, opens_at)
             VALUES ($1, $2, $3, $4, $5, {s}.at($6))
             ON CONFLICT (queue, key) DO UPDATE SET running = excluded.running,
                 head = excluded.head, recent = excluded.recent, opens_at = excluded.opens_at",
        )?;
        let running = i32::try_from(record.running).unwrap_or(i32::MAX);
        let head = record.head.map(super::rows::key);
        let recent: Vec<i64> = record.recent.iter().map(|t| us(*t)).collect();
        let opens_at = record.opens_at.map(us);
        let params: [&(dyn ToSql + Sync); 6] = [&queue, &key, &running, &head, &recent, &opens_at];
        self.tx.execute(&st, &params)?;
        Ok(())
    }

    fn gated_keys(&mut self, queue: &str, now: StoreTime) -> Result<Vec<String>> {
        let st = self.get(
            "SELECT key FROM {s}.leasehold_limit_keys
             WHERE queue = $1 AND opens_at <= {s}.at($2) ORDER BY opens_at",
        )?;
        let rows = self.tx.query(&st, &[&queue, &us(now)])?;
        rows.iter().map(|r| r.col(0)).collect()
    }

    fn limit_keys(&mut self, queue: &str) -> Result<Vec<String>> {
        let st =
            self.get("SELECT key FROM {s}.leasehold_limit_keys WHERE queue = $1 ORDER BY key")?;
        self.tx
            .query(&st, &[&queue])?
            .iter()
            .map(|r| r.col(0))
            .collect()
    }

    fn schedules(&mut self) -> Result<Vec<HeldSchedule>> {
        let st = self.get(
            "SELECT s.name, s.record, m.value FROM {s}.leasehold_schedules s
             LEFT JOIN {s}.leasehold_meta m ON m.key = $1 || s.name
             WHERE octet_length(s.record) > 0 ORDER BY s.name FOR UPDATE OF s SKIP LOCKED",
        )?;
        let prefix = rules::schedule_failure_key("");
        self.tx
            .query(&st, &[&prefix])?
            .iter()
            .map(|row| {
                let name: String = row.col(0)?;
                let record = decode_schedule(&name, row.col(1)?);
                Ok((name, record, row.col::<Option<String>>(2)?))
            })
            .collect()
    }

    /// Its row made (empty) if it has none, so that two transactions declaring it at once
    /// are one after the other; an empty row is no schedule, and a transaction that finds
    /// none and writes none is rolled back by its error or leaves only that row.
    fn schedule(&mut self, name: &str) -> Result<Option<ScheduleRecord>> {
        self.waited();
        let st = self.get(
            "INSERT INTO {s}.leasehold_schedules (name, record) VALUES ($1, '') ON CONFLICT DO NOTHING",
        )?;
        self.tx.execute(&st, &[&name])?;
        let st = self.get(
            "SELECT record FROM {s}.leasehold_schedules
             WHERE name = $1 AND octet_length(record) > 0 FOR UPDATE",
        )?;
        match self.tx.query_opt(&st, &[&name])? {
            Some(row) => decode_schedule(name, row.col(0)?).map(Some),
            None => Ok(None),
        }
    }

    fn save_schedule(&mut self, record: &ScheduleRecord) -> Result<()> {
        let st = self.get("UPDATE {s}.leasehold_schedules SET record = $2 WHERE name = $1")?;
        let bytes = crate::codec::encode(record);
        self.tx.execute(&st, &[&record.name, &bytes])?;
        Ok(())
    }

    fn remove_schedule(&mut self, name: &str) -> Result<bool> {
        let st = self.get(
            "DELETE FROM {s}.leasehold_schedules WHERE name = $1 RETURNING octet_length(record)",
        )?;
        let removed = self.tx.query_opt(&st, &[&name])?;
        Ok(match removed {
            Some(row) => row.col::<i32>(0)? > 0,
            None => false,
        })
    }

    fn note_schedule_failure(&mut self, name: &str, failure: Option<&str>) -> Result<()> {
        if self.failure(name)?.as_deref() == failure {
            return Ok(());
        }
        let key = rules::schedule_failure_key(name);
        match failure {
            Some(failure) => {
                let st = self.get(
                    "INSERT INTO {s}.leasehold_meta (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )?;
                self.tx.execute(&st, &[&key, &failure])?
            }
            None => {
                let st = self.get("DELETE FROM {s}.leasehold_meta WHERE key = $1")?;
                self.tx.execute(&st, &[&key])?
            }
        };
        Ok(())
    }
}

/// The record of `queue`, if it has one; its row locked with `lock`.
pub(crate) fn queue_record(
    tx: &mut Transaction<'_>,
    p: &mut Prepared<'_>,
    queue: &str,
    lock: bool,
) -> Result<Option<QueueRecord>> {
    let st = p.get(
        tx,
        match lock {
            true => concat!(
                "SELECT ",
                queue_columns!(),
                " FROM {s}.leasehold_queues q WHERE q.queue = $1 FOR UPDATE"
            ),
            false => concat!(
                "SELECT ",
                queue_columns!(),
                " FROM {s}.leasehold_queues q WHERE q.queue = $1"
            ),
        },
    )?;
    match tx.query_opt(&st, &[&queue])? {
        Some(row) => queue_from(&row, 0),
        None => Ok(None),
    }
}

/// The queue's record in `row`'s [`queue_columns`] from column `at` on; `None` where they
/// are null (a queue without a record, left-joined).
pub(crate) fn queue_from(row: &postgres::Row, at: usize) -> Result<Option<QueueRecord>> {
    let Some(paused) = row.col::<Option<bool>>(at + 1)? else {
        return Ok(None);
    };
    // A rate's two columns (claims, period in µs), from `at` on; null for none.
    let rate = |at: usize| -> Result<Option<Rate>> {
        let claims = row.col::<Option<i32>>(at)?;
        Ok(match (claims, row.col::<Option<i64>>(at + 1)?) {
            (Some(claims), Some(per)) => Some(Rate {
                claims: u32::try_from(claims).unwrap_or(0),
                per: super::rows::duration(per),
            }),
            _ => None,
        })
    };
    Ok(Some(QueueRecord {
        served_at: row.col::<Option<i64>>(at)?.map(time),
        paused,
        limits: QueueLimits {
            concurrency: row
                .col::<Option<i32>>(at + 2)?
                .map(|n| u32::try_from(n).unwrap_or(0)),
            rate: rate(at + 3)?,
            per_key: row
                .col::<Option<i32>>(at + 7)?
                .map(|n| u32::try_from(n).unwrap_or(0)),
            per_key_rate: rate(at + 8)?,
        },
        recent_claims: row
            .col::<Option<Vec<i64>>>(at + 5)?
            .unwrap_or_default()
            .into_iter()
            .map(time)
            .collect(),
        retry: super::rows::retry_column(row, at + 6, || "a queue".into())?,
    }))
}

pub(crate) fn decode_schedule(name: &str, bytes: &[u8]) -> Result<ScheduleRecord> {
    crate::codec::decode_schedule(bytes)
        .map_err(|e| Error::Corrupt(format!("schedule {name:?}: {e}")))
}

/// A limit key's record from its row's `running, head, recent, us(opens_at)`, the first of
/// them at column `at`.
pub(super) fn key_record(row: &postgres::Row, at: usize) -> Result<KeyRecord> {
    Ok(KeyRecord {
        running: u32::try_from(row.col::<i32>(at)?).unwrap_or(0),
        head: row.col::<Option<i64>>(at + 1)?.map(id),
        recent: row.col::<Vec<i64>>(at + 2)?.into_iter().map(time).collect(),
        opens_at: row.col::<Option<i64>>(at + 3)?.map(time),
    })
}
