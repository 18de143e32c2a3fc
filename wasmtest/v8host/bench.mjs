// bench.mjs drives kvroute.wasm on host.mjs (a proxy-wasm host in Node's V8 modelled on
// proxy-wasm-cpp-host 3930b7b): it configures the plugin, answers the leader's table poll
// in-process, advances ticks, then runs N chat requests round robin over the VMs and prints
// one JSON line with latencies, traps and routing counts. `node bench.mjs --help` for flags.

import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import v8 from 'node:v8';

import { Host, LoadError, LogLevel, MAX_WASM_MEMORY_PAGES, VirtualClock, WallClock } from './host.mjs';

const HELP = `usage: node wasmtest/v8host/bench.mjs --wasm kvroute.wasm [flags]

Runs the proxy-wasm module on a host written for V8 from proxy-wasm-cpp-host 3930b7b
(Envoy 1.36-1.38's answers: WASI poll_oneoff is ENOSYS, host calls inside
proxy_on_memory_allocate other than proxy_log, fd_write and clock_time_get trap), and prints
one JSON line on stdout.

  --wasm PATH          the module (required)
  --table PATH         a full table frame (shared/table) served to the leader's poll of
                       /v1/table; without it the control plane answers 503
  --prompts PATH       JSON {"model": M, "system_prompts": [..]}: request i uses system
                       prompt i mod len, then a user message varied per request
  --model NAME         model in the request bodies (default: from --prompts, else bench-model)
  --requests N         requests to run (default 20000)
  --vms N              worker VMs, one per Envoy worker thread (default 2)
  --config JSON|@FILE  plugin configuration (default: a control plane cluster
                       "outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local")
  --env K=V            WASI environment of the VMs (repeatable), e.g. GOGC=100
  --clock virtual|wall virtual (default): the guest's clocks and ticks follow a clock the
                       driver advances by --step-us per request; wall: real time, as Envoy
  --step-us N          virtual time per request (default 1000)
  --body-bytes N       approximate request body size (default 32768)
  --chunk-bytes N      request body chunk size (default 16384)
  --table-age-ms N     X-Kvroute-Age-Ms the control plane answers (default 5)
  --warmup-ticks N     ticks per VM to wait for the table before the requests (default 50)
  --held N             first send N requests (round robin over the VMs, whole bodies)
                       before the leader has a table and keep their streams open; after
                       the warm-up, tick until each is forwarded (the filter holds them
                       for its first table) or --warmup-ticks more ticks per VM passed
  --no-canary          skip the canary VM Envoy starts and kills before the workers
  --log-level LEVEL    print guest log lines at or above LEVEL to stderr (default: none)
  --seed N             request generator seed (default 1)
  --latencies PATH     also write each request's guest time (µs), one per line
  --help               this text

Output fields: requests, vms, traps (VM failures after start), first_trap_request,
trap_messages, restricted_traps, fatal_errors (the Go runtime's), p50_us / p99_us / p999_us /
mean_us / max_us / first_us (wall-clock guest time per request: request headers, body,
response headers, body and stream end; first_us the first request's, which V8 compiles
for), cpu_p50_us / cpu_p99_us (the process's CPU time over the same calls: less sensitive
to a busy machine's preemption), endpoint_header (requests
whose upstream headers carry the endpoint header), after_table (requests sent after the
leader received the table), after_table_with_header, failed_open (requests passed
unfiltered by a failed VM), held (--held), held_forwarded and held_forwarded_with_header
(the held requests forwarded by the end of their wait, and with the endpoint header),
polls, reports, metrics, logs.
Exit status: 0 when the run completed (traps included), 2 when the plugin did not start,
3 on a host bug, 64 on bad flags.`;

function die(code, msg) {
  process.stderr.write(`bench.mjs: ${msg}\n`);
  process.exit(code);
}

let args;
try {
  args = parseArgs({
    options: {
      wasm: { type: 'string' }, table: { type: 'string' }, prompts: { type: 'string' },
      model: { type: 'string' }, requests: { type: 'string', default: '20000' },
      vms: { type: 'string', default: '2' }, config: { type: 'string' },
      env: { type: 'string', multiple: true, default: [] }, clock: { type: 'string', default: 'virtual' },
      'step-us': { type: 'string', default: '1000' }, 'body-bytes': { type: 'string', default: '32768' },
      'chunk-bytes': { type: 'string', default: '16384' }, 'table-age-ms': { type: 'string', default: '5' },
      'warmup-ticks': { type: 'string', default: '50' }, 'no-canary': { type: 'boolean', default: false },
      held: { type: 'string', default: '0' },
      'log-level': { type: 'string' }, latencies: { type: 'string' }, seed: { type: 'string', default: '1' }, help: { type: 'boolean', default: false },
    },
    strict: true,
  }).values;
} catch (e) {
  die(64, `${e.message}\n${HELP}`);
}
if (args.help) {
  process.stdout.write(`${HELP}\n`);
  process.exit(0);
}
const int = (name, min) => {
  const v = Number(args[name]);
  if (!Number.isInteger(v) || v < min) die(64, `--${name}: want an integer >= ${min}, got ${args[name]}`);
  return v;
};
if (!args.wasm) die(64, '--wasm is required (--help for flags)');
const REQUESTS = int('requests', 0), VMS = int('vms', 1), STEP_US = int('step-us', 0);
const BODY_BYTES = int('body-bytes', 256), CHUNK_BYTES = int('chunk-bytes', 1), AGE_MS = int('table-age-ms', 0);
const WARMUP_TICKS = int('warmup-ticks', 1), SEED = int('seed', 0), HELD = int('held', 0);
if (args.clock !== 'virtual' && args.clock !== 'wall') die(64, `--clock: virtual or wall, got ${args.clock}`);
let printLevel = Infinity;
if (args['log-level'] !== undefined) {
  printLevel = LogLevel[args['log-level']];
  if (printLevel === undefined) die(64, `--log-level: one of ${Object.keys(LogLevel).join(', ')}`);
}

// cpp-host 3930b7b src/v8/v8.cc engine(): V8 runs with --no-liftoff (TurboFan only),
// --wasm_max_mem_pages for a 1 GiB memory limit and --stack-trace-limit=20. Set before
// anything is compiled.
v8.setFlagsFromString('--no-liftoff');
v8.setFlagsFromString(`--wasm-max-mem-pages=${MAX_WASM_MEMORY_PAGES}`);
v8.setFlagsFromString('--stack-trace-limit=20');

const pluginConfig = (() => {
  if (args.config === undefined) {
    return JSON.stringify({
      control_plane: {
        cluster: 'outbound|8080||kvroute-controlplane.kvroute-system.svc.cluster.local',
        authority: 'kvroute-controlplane.kvroute-system.svc.cluster.local',
        poll_ms: 100, report_ms: 100,
      },
    });
  }
  return args.config.startsWith('@') ? readFileSync(args.config.slice(1), 'utf8') : args.config;
})();
let cfg;
try {
  cfg = JSON.parse(pluginConfig);
} catch (e) {
  die(64, `--config is not JSON: ${e.message}`);
}
const cluster = cfg?.control_plane?.cluster;
const endpointHeader = (cfg.endpoint_header ?? 'x-gateway-destination-endpoint').toLowerCase();

const env = {};
for (const kv of args.env) {
  const at = kv.indexOf('=');
  if (at <= 0) die(64, `--env ${kv}: want K=V`);
  env[kv.slice(0, at)] = kv.slice(at + 1);
}

// ---- the control plane, in process (controlplane/server: GET /v1/table?version=V answers
// 304 when V is current, else 200 with the full frame; both carry X-Kvroute-Age-Ms; 503
// before any table; POST /v1/reports answers 200 with counts).
const table = args.table ? readFileSync(args.table) : null;
if (table && (table.length < 36 || table.toString('latin1', 0, 4) !== 'KVRT')) die(64, `--table ${args.table}: not a table frame`);
const tableVersion = table ? table.readBigUInt64LE(8).toString() : null;
// countReports counts the reports of a batch in either form the control plane takes
// (shared/api: the binary "KVRB" batch of length-prefixed records, or the older JSON).
function countReports(body) {
  const b = Buffer.from(body);
  if (b.length >= 5 && b.toString('latin1', 0, 4) === 'KVRB') {
    let off = 5, len = 0, shift = 0;
    for (;;) { // the proxy name's uvarint length
      const c = b[off++];
      len += (c & 0x7f) * 2 ** shift;
      shift += 7;
      if (!(c & 0x80)) break;
    }
    off += len;
    let n = 0;
    while (off + 4 <= b.length) {
      off += 4 + b.readUInt32LE(off);
      n++;
    }
    return off === b.length ? n : 0;
  }
  try {
    return JSON.parse(b.toString('utf8')).reports?.length ?? 0;
  } catch {
    return 0;
  }
}

const cp = { polls: 0, notModified: 0, full: 0, unavailable: 0, reportPosts: 0, reports: 0, other: 0 };
function controlPlane(req) {
  const h = new Map(req.headers.map(([k, v]) => [k.toLowerCase(), v]));
  const [path, query = ''] = h.get(':path').split('?');
  if (path === '/v1/table' && h.get(':method') === 'GET') {
    cp.polls++;
    if (!table) {
      cp.unavailable++;
      return { headers: [[':status', '503'], ['retry-after', '1'], ['content-type', 'application/json']], body: '{"error":"no table yet"}' };
    }
    const age = String(AGE_MS);
    if (new URLSearchParams(query).get('version') === tableVersion) {
      cp.notModified++;
      return { headers: [[':status', '304'], ['x-kvroute-age-ms', age], ['x-kvroute-version', tableVersion]] };
    }
    cp.full++;
    return {
      headers: [[':status', '200'], ['content-type', 'application/vnd.kvroute.table'], ['content-length', String(table.length)],
        ['x-kvroute-version', tableVersion], ['x-kvroute-frame', 'full'], ['x-kvroute-age-ms', age]],
      body: table,
    };
  }
  if (path === '/v1/reports' && h.get(':method') === 'POST') {
    cp.reportPosts++;
    const n = countReports(req.body);
    cp.reports += n;
    return { headers: [[':status', '200'], ['content-type', 'application/json']], body: JSON.stringify({ received: n, applied: n, rejected: 0 }) };
  }
  cp.other++;
  return { headers: [[':status', '404']], body: '' };
}

// ---- requests: deterministic bodies of about BODY_BYTES, a shared system prompt and a
// user message that differs per request (so the guest allocates and its GC runs).
let rng = (SEED >>> 0) || 1;
const rand = () => {
  rng ^= rng << 13;
  rng >>>= 0;
  rng ^= rng >>> 17;
  rng ^= rng << 5;
  rng >>>= 0;
  return rng;
};
const WORDS = 'route cache prefix block token replica queue prefill decode table leader shared tick vector matrix kernel batch stream window layer'.split(' ');
const text = (bytes) => {
  const parts = [];
  let n = 0;
  while (n < bytes) {
    const w = WORDS[rand() % WORDS.length] + (rand() % 1000);
    parts.push(w);
    n += w.length + 1;
  }
  return parts.join(' ');
};
let model = args.model ?? 'bench-model';
let systemPrompts;
if (args.prompts) {
  const p = JSON.parse(readFileSync(args.prompts, 'utf8'));
  if (!Array.isArray(p.system_prompts) || p.system_prompts.length === 0) die(64, `--prompts ${args.prompts}: want {"model":..,"system_prompts":[..]}`);
  systemPrompts = p.system_prompts;
  model = args.model ?? p.model ?? model;
} else {
  systemPrompts = Array.from({ length: 8 }, () => text(Math.floor(BODY_BYTES * 0.75)));
}
function requestBody(i) {
  const system = systemPrompts[i % systemPrompts.length];
  const user = `request ${i}: ${text(Math.max(64, BODY_BYTES - Buffer.byteLength(system) - 200))}`;
  return Buffer.from(JSON.stringify({ model, messages: [{ role: 'system', content: system }, { role: 'user', content: user }], max_tokens: 16 }));
}
function responseBody(i, promptBytes) {
  const prompt = Math.round(promptBytes / 4);
  return Buffer.from(JSON.stringify({
    id: `chatcmpl-${i}`, object: 'chat.completion', model,
    choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: prompt, completion_tokens: 8, total_tokens: prompt + 8, prompt_tokens_details: { cached_tokens: Math.floor(prompt / 2) } },
  }));
}

// ---- the run
const clock = args.clock === 'virtual' ? new VirtualClock() : new WallClock();
const phase = { name: 'start', request: -1 };
const failures = [];
const fatalErrors = [], fatalNext = new Set(), startLogs = [];
const host = new Host({
  clock, pluginConfig, env, canary: !args['no-canary'],
  vmId: '', rootId: '', pluginName: 'kvroute',
  clusters: cluster ? { [cluster]: controlPlane } : {},
  onLog: (l) => {
    if (l.level >= printLevel) process.stderr.write(`[vm ${l.vm} ${l.role}] ${l.name}: ${l.message}\n`);
    if (phase.name === 'start' && l.level >= LogLevel.warn && startLogs.length < 5) startLogs.push(`${l.role} ${l.name}: ${l.message.slice(0, 300)}`);
    // Go's runtime writes "fatal error: " and the reason in separate fd_write calls, which
    // cpp-host logs as separate lines (src/exports.cc writevImpl): keep the reasons.
    if (l.level !== LogLevel.error || l.fromHost) return;
    if (fatalNext.has(l.vm)) {
      fatalNext.delete(l.vm);
      if (fatalErrors.length < 8 && !fatalErrors.includes(l.message)) fatalErrors.push(l.message);
    } else if (l.message.startsWith('fatal error')) {
      fatalNext.add(l.vm);
    }
  },
  onFail: (f) => failures.push({ ...f, phase: phase.name, request: phase.request }),
});

const t0 = performance.now();
let tStart;
try {
  host.load(readFileSync(args.wasm));
  host.start(VMS);
  tStart = performance.now();
} catch (e) {
  const out = {
    error: e instanceof LoadError ? e.message : String(e?.stack ?? e), state: e.state ?? null,
    guest_logs: startLogs, logs: host.logCounts, restricted_traps: host.restrictedTraps.slice(0, 5),
    fatal_errors: fatalErrors,
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.exit(e instanceof LoadError ? 2 : 3);
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
// Waits (virtual: jumps) to the next scheduled tick or response and runs what is due.
function advanceToNext() {
  const due = host.nextDue();
  if (due === Infinity) return false;
  if (clock.kind === 'virtual') {
    const d = due - clock.nowMs();
    if (d > 0) clock.advanceMs(d);
  } else {
    const d = due - clock.nowMs();
    if (d > 0) Atomics.wait(sleepCell, 0, 0, d);
  }
  host.runDue();
  return true;
}

// Requests before the table (--held): sent whole, their streams left open.
phase.name = 'held';
const held = [];
for (let i = 0; i < HELD; i++) {
  const body = requestBody(REQUESTS + i);
  const s = host.newStream(i % VMS, { requestId: `held-${i}` });
  s.requestHeaders([[':method', 'POST'], [':path', '/v1/chat/completions'], [':authority', 'llm.bench.svc.cluster.local'],
    [':scheme', 'http'], ['content-type', 'application/json'], ['content-length', String(body.length)]], false);
  s.requestBody(body, true);
  held.push(s);
}
const heldForwarded = () => held.filter((s) => s.forwardedRequestHeaders).length;

// Warm-up: ticks until the leader has the table (its poll answered 200 and delivered),
// then, with held requests, until every VM has released them.
phase.name = 'warmup';
for (let k = 0; table && cp.full === 0 && k < WARMUP_TICKS * VMS; k++) {
  if (!advanceToNext()) break;
}
host.runDue();
for (let k = 0; heldForwarded() < held.length && k < WARMUP_TICKS * VMS; k++) {
  if (!advanceToNext()) break;
}
let heldWithHeader = 0;
for (const s of held) {
  if (s.forwardedRequestHeaders?.some(([k]) => k.toLowerCase() === endpointHeader)) heldWithHeader++;
}
const heldOut = heldForwarded();
for (const s of held) s.end();
host.runDue();
let tableAt = table && cp.full > 0 ? 0 : -1;

const lat = new Float64Array(REQUESTS);
const cpu = new Float64Array(REQUESTS);
let withHeader = 0, afterTable = 0, afterTableWithHeader = 0, failedOpen = 0, spoofKept = 0;
const fullBefore = cp.full;
phase.name = 'requests';
for (let i = 0; i < REQUESTS; i++) {
  phase.request = i;
  if (tableAt < 0 && cp.full > fullBefore) tableAt = i;
  const vm = i % VMS;
  const body = requestBody(i);
  const spoof = i % 10 === 9;
  const hdrs = [[':method', 'POST'], [':path', '/v1/chat/completions'], [':authority', 'llm.bench.svc.cluster.local'],
    [':scheme', 'http'], ['content-type', 'application/json'], ['content-length', String(body.length)], ['x-request-id', `req-${i}`]];
  if (spoof) hdrs.push([endpointHeader, '192.0.2.1:9']);
  const resp = responseBody(i, body.length);
  const c0 = process.cpuUsage();
  const s = host.newStream(vm, { requestId: `req-${i}` });
  s.requestHeaders(hdrs, false);
  for (let off = 0; off < body.length; off += CHUNK_BYTES) {
    s.requestBody(body.subarray(off, Math.min(off + CHUNK_BYTES, body.length)), off + CHUNK_BYTES >= body.length);
  }
  const fwd = s.forwardedRequestHeaders ?? [];
  const ep = fwd.find(([k]) => k.toLowerCase() === endpointHeader)?.[1];
  if (ep !== undefined) {
    withHeader++;
    if (ep === '192.0.2.1:9') spoofKept++;
  }
  if (tableAt >= 0) {
    afterTable++;
    if (ep !== undefined && ep !== '192.0.2.1:9') afterTableWithHeader++;
  }
  s.setUpstream(ep && ep !== '192.0.2.1:9' ? ep.split(',')[0] : '10.0.0.1:8000');
  s.responseHeaders([[':status', '200'], ['content-type', 'application/json'], ['content-length', String(resp.length)]], false);
  s.responseBody(resp, true);
  s.end();
  const c1 = process.cpuUsage(c0);
  cpu[i] = c1.user + c1.system;
  if (s.failedOpen) failedOpen++;
  lat[i] = Number(s.guestNs) / 1000;
  phase.name = 'between requests';
  if (clock.kind === 'virtual') clock.advanceMs(STEP_US / 1000);
  host.runDue();
  phase.name = 'requests';
}
const tEnd = performance.now();
if (args.latencies) writeFileSync(args.latencies, `${Array.from(lat, (v) => v.toFixed(1)).join('\n')}\n`);

const sorted = Float64Array.from(lat).sort();
const cpuSorted = Float64Array.from(cpu).sort();
const pctOf = (a, q) => (a.length ? Math.round(a[Math.min(a.length - 1, Math.floor(q * (a.length - 1)))] * 10) / 10 : 0);
const pct = (q) => pctOf(sorted, q);
const mean = sorted.length ? sorted.reduce((a, b) => a + b, 0) / sorted.length : 0;
const workerFailures = failures.filter((f) => f.role === 'worker');
const out = {
  requests: REQUESTS,
  vms: VMS,
  clock: clock.kind,
  traps: workerFailures.length,
  first_trap_request: workerFailures.length ? workerFailures[0].request : null,
  trap_messages: workerFailures.slice(0, 4).map((f) => ({ vm: f.vm, phase: f.phase, request: f.request, message: f.message.slice(0, 1500) })),
  restricted_traps: host.restrictedTraps.slice(0, 8),
  fatal_errors: fatalErrors,
  p50_us: pct(0.5),
  p99_us: pct(0.99),
  p999_us: pct(0.999),
  mean_us: Math.round(mean * 10) / 10,
  cpu_p50_us: pctOf(cpuSorted, 0.5),
  cpu_p99_us: pctOf(cpuSorted, 0.99),
  max_us: sorted.length ? Math.round(sorted[sorted.length - 1] * 10) / 10 : 0,
  first_us: REQUESTS ? Math.round(lat[0] * 10) / 10 : 0,
  endpoint_header: withHeader,
  after_table: afterTable,
  after_table_with_header: afterTableWithHeader,
  table_loaded_at_request: tableAt,
  spoofed_header_kept: spoofKept,
  failed_open: failedOpen,
  held: HELD,
  held_forwarded: heldOut,
  held_forwarded_with_header: heldWithHeader,
  polls: cp.polls,
  table_full_answers: cp.full,
  table_not_modified: cp.notModified,
  report_posts: cp.reportPosts,
  reports: cp.reports,
  http_calls: host.counters.httpCalls,
  proc_exit_calls: host.counters.procExit,
  metrics: host.stats.snapshot(),
  logs: host.logCounts,
  start_ms: Math.round(tStart - t0),
  run_ms: Math.round(tEnd - tStart),
  host_bugs: host.hostBugs.slice(0, 3),
};
process.stdout.write(`${JSON.stringify(out)}\n`);
process.exit(host.hostBugs.length ? 3 : 0);
