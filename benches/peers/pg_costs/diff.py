#!/usr/bin/env python3
# Part of the per-job cost table (run.sh).
import json, sys, os
a, b, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
A = json.load(open(f"/tmp/pg_costs_snap_{a}.json")); B = json.load(open(f"/tmp/pg_costs_snap_{b}.json"))
hz = os.sysconf("SC_CLK_TCK")
d = {k: B[k]-A[k] for k in A}
print(f"per job: commits {d['xact']/n:.3f}  rows ins {d['ins']/n:.2f} upd {d['upd']/n:.2f} del {d['del']/n:.2f}  WAL records {d['wal_records']/n:.2f} bytes {d['wal_bytes']/n:.0f}  WAL syncs {d['wal_sync']/n:.3f}  server CPU {d['ticks']/hz*1e6/n:.1f} us")
