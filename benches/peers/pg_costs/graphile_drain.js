// The peer's bench.js (../shared/peers/graphile-worker, graphile-worker 0.17.3) with the
// server's counters snapshotted around its drain (snap.py, as leasehold's side does): see
// run.sh. Usage: NODE_PATH=<the peer's node_modules> DATABASE_URL=... node graphile_drain.js N W MODE
// graphile-worker 0.17.3: enqueue N empty jobs (addJobs, batches of 256), then time the drain
// by one runner with concurrency W until no job is left in _private_jobs (graphile-worker
// deletes a job when it completes it: the drain ends when every completion is committed).
// Usage: DATABASE_URL=... node bench.js N W MODE
//   MODE=default : graphile-worker's defaults (each worker fetches its own job, completes it
//                  alone); maxPoolSize max(10, W+2) as its docs advise
//   MODE=tuned   : its documented performance settings (docs "Performance"): localQueue
//                  { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0,
//                  maxPoolSize W+1 (the docs' example: concurrentJobs 24, maxPoolSize 25)
const { run, runMigrations, makeWorkerUtils } = require("graphile-worker");
const { Client } = require("pg");

async function main() {
  const n = parseInt(process.argv[2] || "20000", 10);
  const w = parseInt(process.argv[3] || "16", 10);
  const mode = process.argv[4] || "default";
  const connectionString = process.env.DATABASE_URL;
  const admin = new Client({ connectionString });
  await admin.connect();
  await runMigrations({ connectionString, logger: quiet() });
  const pers = await admin.query(
    "select relname::text, relpersistence::text from pg_class c join pg_namespace s on s.oid = c.relnamespace where s.nspname = 'graphile_worker' and relname = '_private_jobs'"
  );
  const utils = await makeWorkerUtils({ connectionString, logger: quiet() });
  let t = process.hrtime.bigint();
  for (let i = 0; i < n; i += 256) {
    const specs = [];
    for (let j = i; j < Math.min(n, i + 256); j++) specs.push({ identifier: "bench", payload: { i: j } });
    await utils.addJobs(specs);
  }
  const enqueueS = Number(process.hrtime.bigint() - t) / 1e9;
  await utils.release();
  const queued = (await admin.query("select count(*)::int c from graphile_worker._private_jobs")).rows[0].c;
  if (queued !== n) throw new Error(`queued ${queued} != ${n}`);

  require("child_process").execSync("sleep 11; python3 " + __dirname + "/snap.py before peer_graphile");
  let handled = 0;
  const worker =
    mode === "tuned"
      ? { concurrentJobs: w, maxPoolSize: w + 1, localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
      : { concurrentJobs: w, maxPoolSize: Math.max(10, w + 2) };
  t = process.hrtime.bigint();
  const runner = await run({
    noHandleSignals: true,
    logger: quiet(),
    preset: { worker: { connectionString, pollInterval: 2000, ...worker } },
    taskList: { bench: async () => { handled++; } },
  });
  while (handled < n) await sleep(1);
  const handledS = Number(process.hrtime.bigint() - t) / 1e9;
  for (;;) {
    const left = (await admin.query("select count(*)::int c from graphile_worker._private_jobs")).rows[0].c;
    if (left === 0) break;
    await sleep(2);
  }
  const drainS = Number(process.hrtime.bigint() - t) / 1e9;
  await runner.stop();
  await admin.end();
  require("child_process").execSync("sleep 11; python3 " + __dirname + "/snap.py after peer_graphile");
  const version = require("graphile-worker/package.json").version;
  console.log(
    `RESULT system=graphile-worker-${version} mode=${mode} workers=${w} n=${n} enqueue_jobs_s=${(n / enqueueS).toFixed(0)} drain_jobs_s=${(n / drainS).toFixed(0)} handled_s=${handledS.toFixed(3)} drain_s=${drainS.toFixed(3)} persistence=${pers.rows.map((r) => r.relname + "=" + r.relpersistence).join(",")} settings=${JSON.stringify(worker)}`
  );
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
function quiet() {
  const { Logger } = require("graphile-worker");
  return new Logger(() => (level, message) => { if (level === "error") console.error(message); });
}

main().catch((e) => { console.error(e); process.exit(1); });
