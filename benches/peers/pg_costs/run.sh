#!/bin/bash
# Where a drained job's cost goes on the server, leasehold beside graphile-worker tuned, in
# interleaved rounds: per job, the commits and rows written (pg_stat_database, read after the
# server's statistics are flushed), the WAL written (pg_current_wal_lsn), and the CPU of every
# PostgreSQL process (/proc, with the backends the postmaster reaped). Only the drain is counted.
# Needs: PostgreSQL on 127.0.0.1:5432 (trust), database `test`, node and the peer's
# node_modules (cd ../shared/peers/graphile-worker && npm ci). Usage: run.sh [N] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
N=${1:-20000}; ROUNDS=${2:-3}
PEER=${PEER:-$here/../../../../shared/peers/graphile-worker}
export LEASEHOLD_PG_URL=postgres://postgres@127.0.0.1:5432/test
cargo build --release -q --manifest-path "$here/Cargo.toml"
psql_() { psql -h 127.0.0.1 -U postgres -d test -qc "$1" >/dev/null 2>&1; }
for round in $(seq "$ROUNDS"); do
  for w in 1 16; do
    psql_ "DROP SCHEMA IF EXISTS lh_costs CASCADE"
    "$here/target/release/pg_costs" "$N" "$w" lh_costs | sed "s/^/r$round /"
    echo "r$round leasehold w=$w $(python3 "$here/diff.py" before after "$N")"
    psql_ "DROP SCHEMA IF EXISTS lh_costs CASCADE"
    dropdb -h 127.0.0.1 -U postgres --if-exists peer_graphile
    createdb -h 127.0.0.1 -U postgres peer_graphile
    NODE_PATH="$PEER/node_modules" DATABASE_URL=postgres://postgres@127.0.0.1:5432/peer_graphile \
      node "$here/graphile_drain.js" "$N" "$w" tuned | sed "s/^/r$round /" | cut -c1-120
    echo "r$round graphile w=$w $(python3 "$here/diff.py" before after "$N")"
  done
done
