#!/usr/bin/env python3
# Part of the per-job cost table (run.sh).
# snap.py LABEL DB: server-side counters now, to /tmp/pg_costs_snap_LABEL.json
import json, os, subprocess, sys
label, db = sys.argv[1], sys.argv[2]
def q(sql, d="test"):
    return subprocess.check_output(["psql","-h","127.0.0.1","-U","postgres","-d",d,"-Atc",sql]).decode().strip()
wal = q("select wal_records, pg_current_wal_lsn() - '0/0'::pg_lsn, wal_sync from pg_stat_wal").split("|")
dbs = q(f"select xact_commit, tup_inserted, tup_updated, tup_deleted, tup_returned, tup_fetched from pg_stat_database where datname='{db}'").split("|")
ticks = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit(): continue
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError: continue
    comm = stat[stat.index("(")+1:stat.rindex(")")]
    if not comm.startswith("postgres"): continue
    f = stat[stat.rindex(")")+2:].split()
    ticks += int(f[11]) + int(f[12])  # utime, stime
    if int(f[1]) == 1 or f[1] == "1":  # ppid 1: the postmaster, whose children's CPU it reaped
        ticks += int(f[13]) + int(f[14])
json.dump({"wal_records": int(wal[0]), "wal_bytes": int(float(wal[1])), "wal_sync": int(wal[2]),
           "xact": int(dbs[0]), "ins": int(dbs[1]), "upd": int(dbs[2]), "del": int(dbs[3]),
           "ticks": ticks}, open(f"/tmp/pg_costs_snap_{label}.json","w"))
