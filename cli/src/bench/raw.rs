//! Raw redb doing the minimal work leasehold's operations stand on, in the same run, on a
//! file shared the same way: the baselines every ratio in the table is taken against.

use std::path::Path;

use leasehold::{Error, Sharing};
use redb::{ReadableTable, TableDefinition};

use super::io;
use super::measure::{Row, timed};

const RAW: TableDefinition<u64, &[u8]> = TableDefinition::new("raw");

const RAW_INDEX: TableDefinition<(u64, u64), ()> = TableDefinition::new("raw.index");

/// Raw redb's rates (ops/s) for each way of sharing the file: `[exclusive, single-writer]`.
#[derive(Default)]
pub(super) struct RawRates {
    insert: [f64; 2],
    rmw: [f64; 2],
}

impl RawRates {
    fn at(sharing: Sharing) -> usize {
        match sharing {
            Sharing::Exclusive => 0,
            _ => 1,
        }
    }

    pub(super) fn set(&mut self, sharing: Sharing, insert: f64, rmw: f64) {
        self.insert[Self::at(sharing)] = insert;
        self.rmw[Self::at(sharing)] = rmw;
    }

    pub(super) fn insert(&self, sharing: Sharing) -> f64 {
        self.insert[Self::at(sharing)]
    }

    pub(super) fn rmw(&self, sharing: Sharing) -> f64 {
        self.rmw[Self::at(sharing)]
    }
}

/// Raw redb on a file shared as `sharing`: one small insert per durable commit (the engine's
/// floor for any write), and a read-modify-write of a record plus an index update per commit
/// (what a claim or a completion minimally is).
pub(super) fn raw_baselines(
    dir: &Path,
    sharing: Sharing,
    n: usize,
    payload: &[u8],
) -> Result<(Row, Row), Error> {
    let (file, mode) = match sharing {
        Sharing::Exclusive => ("exclusive", redb::ConcurrencyMode::ExclusiveWriter),
        _ => ("single-writer", redb::ConcurrencyMode::SingleWriter),
    };
    let db = redb::Builder::new()
        .set_concurrency_mode(mode)
        .create(dir.join(format!("raw-{file}.redb")))
        .map_err(io)?;
    let (s, total) = timed(n, |i| {
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(RAW)
            .map_err(io)?
            .insert(i as u64, payload)
            .map_err(io)?;
        txn.commit().map_err(io)
    })?;
    let insert = s.row(
        &format!("raw redb: insert, one per commit ({file} file)"),
        "durable",
        1,
        total,
        n as u64,
    );
    let (s, total) = timed(n, |i| {
        let txn = db.begin_write().map_err(io)?;
        {
            let mut t = txn.open_table(RAW).map_err(io)?;
            let v = t
                .get(i as u64)
                .map_err(io)?
                .map(|g| g.value().to_vec())
                .unwrap_or_default();
            t.insert(i as u64, v.as_slice()).map_err(io)?;
            let mut idx = txn.open_table(RAW_INDEX).map_err(io)?;
            idx.remove((i as u64, 0)).map_err(io)?;
            idx.insert((i as u64, 1), ()).map_err(io)?;
        }
        txn.commit().map_err(io)
    })?;
    let rmw = s.row(
        &format!("raw redb: read-modify-write + index, one per commit ({file} file)"),
        "durable",
        1,
        total,
        n as u64,
    );
    Ok((insert, rmw))
}
