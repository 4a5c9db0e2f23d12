// graphile-worker (tuned) in several worker processes on one database, beside leasehold's
// `bench --only postgres-processes`: P processes of W workers each are started and idle,
// N empty jobs arrive in one addJobs call, and the time from that call until no job is left
// in _private_jobs is the drain (graphile-worker deletes a job when it completes it; its
// one call commits in parts that the workers drain meanwhile, so the call is timed too, as
// leasehold's row times its one enqueue commit).
// Usage: NODE_PATH=<the peer's node_modules> DATABASE_URL=... node graphile_processes.js N P W
// (the peer: ../shared/peers/graphile-worker, `npm ci` there; settings as its bench.js
// `tuned`: localQueue of 500, completions batched, maxPoolSize W+1).
const { fork } = require("child_process");
const connectionString = process.env.DATABASE_URL;

async function child(w) {
  const { run } = require("graphile-worker");
  const worker = { concurrentJobs: w, maxPoolSize: w + 1, localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 };
  let handled = 0;
  const runner = await run({
    noHandleSignals: true,
    logger: quiet(),
    preset: { worker: { connectionString, pollInterval: 2000, ...worker } },
    taskList: { bench: async () => { handled++; } },
  });
  process.send({ ready: true });
  process.on("message", async () => {
    await runner.stop();
    process.send({ handled });
    process.exit(0);
  });
}

async function parent() {
  const { runMigrations, makeWorkerUtils } = require("graphile-worker");
  const { Client } = require("pg");
  const n = parseInt(process.argv[2] || "20000", 10);
  const p = parseInt(process.argv[3] || "4", 10);
  const w = parseInt(process.argv[4] || "4", 10);
  const admin = new Client({ connectionString });
  await admin.connect();
  await runMigrations({ connectionString, logger: quiet() });
  await admin.query("delete from graphile_worker._private_jobs");
  const children = [];
  for (let i = 0; i < p; i++) {
    const c = fork(__filename, ["--child", String(w)]);
    await new Promise((resolve) => c.once("message", resolve));
    children.push(c);
  }
  const utils = await makeWorkerUtils({ connectionString, logger: quiet() });
  const specs = [];
  for (let j = 0; j < n; j++) specs.push({ identifier: "bench", payload: { i: j } });
  const t = process.hrtime.bigint();
  await utils.addJobs(specs);
  const added = Number(process.hrtime.bigint() - t) / 1e9;
  const leftAtOnce = (await admin.query("select count(*)::int c from graphile_worker._private_jobs")).rows[0].c;
  for (;;) {
    const left = (await admin.query("select count(*)::int c from graphile_worker._private_jobs")).rows[0].c;
    if (left === 0) break;
    await sleep(5);
  }
  const drainS = Number(process.hrtime.bigint() - t) / 1e9;
  const shares = [];
  for (const c of children) {
    const said = new Promise((resolve) => c.once("message", resolve));
    c.send({ stop: true });
    shares.push((await said).handled);
  }
  await utils.release();
  await admin.end();
  const mean = n / p;
  console.log(
    `RESULT system=graphile-worker-${require("graphile-worker/package.json").version} mode=tuned processes=${p} workers=${w} n=${n} drain_jobs_s=${(n / drainS).toFixed(0)} share=${(Math.min(...shares) / mean).toFixed(2)}-${(Math.max(...shares) / mean).toFixed(2)} handled=${shares.reduce((a, b) => a + b, 0)} add_s=${added.toFixed(3)} left_after_add=${leftAtOnce}`
  );
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
function quiet() {
  const { Logger } = require("graphile-worker");
  return new Logger(() => (level, message) => { if (level === "error") console.error(message); });
}

if (process.argv[2] === "--child") child(parseInt(process.argv[3], 10)).catch((e) => { console.error(e); process.exit(1); });
else parent().catch((e) => { console.error(e); process.exit(1); });
