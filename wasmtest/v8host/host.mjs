// A proxy-wasm host for Node's V8, modelled on proxy-wasm-cpp-host at commit 3930b7b
// (3930b7b9a098d4ffc854e1fcf5fa07c9875e58c4, the last one before 94091cd "add all wasi
// hostcalls used by Go SDK"), which is what Envoy 1.36-1.38 (Istio 1.28-1.30) ship.
//
// It is written from cpp-host's C++ source, not from wasmtest/host (wazero), so that the two
// hosts can disagree. Every modelled behaviour carries a comment naming the cpp-host file it
// follows; "cpp-host" below always means commit 3930b7b. A few behaviours live in Envoy, not
// in cpp-host (header maps, body buffers, properties, http calls, metrics, ticks): those
// comments name Envoy's source/extensions/common/wasm/context.cc or wasm.cc instead.
//
// One Host compiles one module and runs several VMs (WebAssembly.Instance objects of the
// same WebAssembly.Module), all sharing one shared-data store, one set of shared queues and
// one set of metrics, as one Envoy with one vm_id does. Nothing here is asynchronous: the
// caller (bench.mjs) advances a clock and calls runDue(), which delivers ticks, http-call
// responses and queue-ready callbacks one at a time, never inside another guest call.

import { randomFillSync } from 'node:crypto';

// ---------------------------------------------------------------------------------------
// Enumerations (proxy-wasm-cpp-sdk proxy_wasm_common.h / proxy_wasm_enums.h, which cpp-host
// 3930b7b includes through bazel/repositories.bzl).

export const WasmResult = Object.freeze({
  Ok: 0, NotFound: 1, BadArgument: 2, SerializationFailure: 3, ParseFailure: 4,
  BadExpression: 5, InvalidMemoryAccess: 6, Empty: 7, CasMismatch: 8, ResultMismatch: 9,
  InternalFailure: 10, BrokenConnection: 11, Unimplemented: 12,
});
const R = WasmResult;

const HeaderMap = Object.freeze({
  RequestHeaders: 0, RequestTrailers: 1, ResponseHeaders: 2, ResponseTrailers: 3,
  GrpcReceiveInitialMetadata: 4, GrpcReceiveTrailingMetadata: 5,
  HttpCallResponseHeaders: 6, HttpCallResponseTrailers: 7, MAX: 7,
});
const BufferType = Object.freeze({
  HttpRequestBody: 0, HttpResponseBody: 1, NetworkDownstreamData: 2, NetworkUpstreamData: 3,
  HttpCallResponseBody: 4, GrpcReceiveBuffer: 5, VmConfiguration: 6, PluginConfiguration: 7,
  CallData: 8, MAX: 8,
});
const StreamType = Object.freeze({ Request: 0, Response: 1, Downstream: 2, Upstream: 3, MAX: 3 });
const MetricType = Object.freeze({ Counter: 0, Gauge: 1, Histogram: 2, Max: 2 });
export const LogLevel = Object.freeze({ trace: 0, debug: 1, info: 2, warn: 3, error: 4, critical: 5 });
const LOG_NAMES = ['trace', 'debug', 'info', 'warn', 'error', 'critical'];

export const FilterHeadersStatus = Object.freeze({
  Continue: 0, StopIteration: 1, ContinueAndEndStream: 2, StopAllIterationAndBuffer: 3,
  StopAllIterationAndWatermark: 4,
});
export const FilterDataStatus = Object.freeze({
  Continue: 0, StopIterationAndBuffer: 1, StopIterationAndWatermark: 2, StopIterationNoBuffer: 3,
});

// cpp-host 3930b7b include/proxy-wasm/wasm_vm.h FailState.
export const FailState = Object.freeze({
  Ok: 'Ok', UnableToCreateVm: 'UnableToCreateVm', UnableToCloneVm: 'UnableToCloneVm',
  MissingFunction: 'MissingFunction', UnableToInitializeCode: 'UnableToInitializeCode',
  StartFailed: 'StartFailed', ConfigureFailed: 'ConfigureFailed', RuntimeError: 'RuntimeError',
});

// cpp-host 3930b7b include/proxy-wasm/limits.h
const PAIRS_MAX_BYTES = 1024 * 1024;
const PAIRS_MAX_COUNT = 1024;
const RANDOM_GET_MAX_BYTES = 64 * 1024;
// cpp-host 3930b7b src/v8/v8.cc engine(): --wasm_max_mem_pages=PROXY_WASM_HOST_MAX_WASM_MEMORY_SIZE_BYTES/64KiB
export const MAX_WASM_MEMORY_PAGES = (1024 * 1024 * 1024) / (64 * 1024);

// cpp-host 3930b7b include/proxy-wasm/wasm.h WasmBase::allocMemory: the only host calls a
// guest may make inside proxy_on_memory_allocate (malloc); anything else traps.
const ALLOC_ALLOWED = new Set([
  'env.proxy_log',
  'wasi_unstable.fd_write', 'wasi_snapshot_preview1.fd_write',
  'wasi_unstable.clock_time_get', 'wasi_snapshot_preview1.clock_time_get',
]);

// cpp-host 3930b7b src/wasm.cc WasmBase::startVm: the host calls allowed while _initialize
// (and main / __main_void) run.
const START_ALLOWED = new Set([
  'env.emscripten_notify_memory_growth',
  'env.proxy_log',
  'wasi_unstable.fd_write', 'wasi_snapshot_preview1.fd_write',
  'wasi_unstable.args_sizes_get', 'wasi_snapshot_preview1.args_sizes_get',
  'wasi_unstable.args_get', 'wasi_snapshot_preview1.args_get',
  'wasi_unstable.environ_sizes_get', 'wasi_snapshot_preview1.environ_sizes_get',
  'wasi_unstable.environ_get', 'wasi_snapshot_preview1.environ_get',
  'wasi_unstable.fd_prestat_get', 'wasi_snapshot_preview1.fd_prestat_get',
  'wasi_unstable.fd_prestat_dir_name', 'wasi_snapshot_preview1.fd_prestat_dir_name',
  'wasi_unstable.clock_time_get', 'wasi_snapshot_preview1.clock_time_get',
  'wasi_unstable.random_get', 'wasi_snapshot_preview1.random_get',
  'wasi_unstable.fd_fdstat_get', 'wasi_snapshot_preview1.fd_fdstat_get',
  'wasi_unstable.fd_fdstat_set_flags', 'wasi_snapshot_preview1.fd_fdstat_set_flags',
]);

// A trap raised by the host itself (V8's wasm C API returns a wasm::Trap from the callback;
// here the import throws, which unwinds the guest the same way).
export class HostTrap extends Error {}

// ---------------------------------------------------------------------------------------
// Module inspection. WebAssembly.Module.imports() has no signatures in Node 20, but
// cpp-host checks them (src/v8/v8.cc V8::link "import type mismatch", getModuleFunctionImpl
// "Bad function signature"), so the type, import, function and export sections are read here.

const VALTYPES = { 0x7f: 'i32', 0x7e: 'i64', 0x7d: 'f32', 0x7c: 'f64', 0x7b: 'v128', 0x70: 'funcref', 0x6f: 'externref' };

export function inspectModule(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (u8.length < 8 || u8[0] !== 0 || u8[1] !== 0x61 || u8[2] !== 0x73 || u8[3] !== 0x6d) {
    throw new Error('not a wasm binary');
  }
  let p = 8;
  const uleb = () => {
    let r = 0, mul = 1, b;
    do {
      b = u8[p++];
      r += (b & 0x7f) * mul;
      mul *= 128;
    } while (b & 0x80);
    return r;
  };
  const name = () => {
    const n = uleb();
    const s = Buffer.from(u8.buffer, u8.byteOffset + p, n).toString('utf8');
    p += n;
    return s;
  };
  const limits = () => {
    const flags = u8[p++];
    const min = uleb();
    const max = flags & 1 ? uleb() : null;
    return { min, max };
  };
  const types = [], imports = [], funcTypes = [], exports = [];
  while (p < u8.length) {
    const id = u8[p++];
    const size = uleb();
    const end = p + size;
    if (id === 1) {
      for (let n = uleb(); n > 0; n--) {
        p++; // 0x60 func
        const params = [], results = [];
        for (let k = uleb(); k > 0; k--) params.push(VALTYPES[u8[p++]] ?? '?');
        for (let k = uleb(); k > 0; k--) results.push(VALTYPES[u8[p++]] ?? '?');
        types.push({ params, results });
      }
    } else if (id === 2) {
      for (let n = uleb(); n > 0; n--) {
        const module = name(), field = name();
        const kind = u8[p++];
        const imp = { module, name: field };
        if (kind === 0) {
          imp.kind = 'function';
          imp.type = types[uleb()];
        } else if (kind === 1) {
          imp.kind = 'table';
          p++;
          imp.limits = limits();
        } else if (kind === 2) {
          imp.kind = 'memory';
          imp.limits = limits();
        } else if (kind === 3) {
          imp.kind = 'global';
          p += 2;
        } else {
          imp.kind = 'tag';
          p++;
          uleb();
        }
        imports.push(imp);
      }
    } else if (id === 3) {
      for (let n = uleb(); n > 0; n--) funcTypes.push(types[uleb()]);
    } else if (id === 7) {
      for (let n = uleb(); n > 0; n--) {
        const field = name();
        const kind = u8[p++];
        exports.push({ name: field, kind, index: uleb() });
      }
    }
    p = end;
  }
  const importedFuncs = imports.filter((i) => i.kind === 'function');
  const exportSigs = new Map();
  for (const e of exports) {
    if (e.kind !== 0) continue;
    exportSigs.set(e.name, e.index < importedFuncs.length ? importedFuncs[e.index].type : funcTypes[e.index - importedFuncs.length]);
  }
  return { imports, exports: exports.map((e) => e.name), exportSigs };
}

const sigString = (s) => `(${s.params.join(',')}) -> (${s.results.join(',')})`;
const sameSig = (a, b) => sigString(a) === sigString(b);

// ---------------------------------------------------------------------------------------
// Clocks. Envoy answers WASI clock_time_get and proxy_get_current_time_nanoseconds from
// its TimeSource (Envoy context.cc getCurrentTimeNanoseconds / getMonotonicTimeNanoseconds);
// ticks run on the worker's dispatcher. WallClock is that; VirtualClock lets a run advance
// time explicitly (the guest then sees virtual time too).

export class WallClock {
  constructor() { this.kind = 'wall'; }
  realtimeNs() { return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)); }
  monotonicNs() { return process.hrtime.bigint(); }
  nowMs() { return performance.now(); }
}

export class VirtualClock {
  constructor(startRealtimeMs = Date.now()) {
    this.kind = 'virtual';
    this.baseNs = BigInt(Math.round(startRealtimeMs)) * 1000000n;
    this.elapsedNs = 0n;
  }
  advanceMs(ms) { this.elapsedNs += BigInt(Math.round(ms * 1e6)); }
  realtimeNs() { return this.baseNs + this.elapsedNs; }
  monotonicNs() { return 1000000000n + this.elapsedNs; }
  nowMs() { return Number(this.elapsedNs) / 1e6; }
}

// ---------------------------------------------------------------------------------------
// proxy-wasm pairs encoding: cpp-host 3930b7b src/pairs_util.cc (u32 count, then u32 name
// and value sizes per pair, then NUL-terminated names and values).

function pairsSize(pairs) {
  let size = 4;
  for (const [k, v] of pairs) size += 8 + Buffer.byteLength(k, 'latin1') + 1 + Buffer.byteLength(v, 'latin1') + 1;
  return size;
}

function marshalPairs(pairs) {
  const out = Buffer.alloc(pairsSize(pairs));
  out.writeUInt32LE(pairs.length, 0);
  let pos = 4;
  for (const [k, v] of pairs) {
    out.writeUInt32LE(Buffer.byteLength(k, 'latin1'), pos);
    out.writeUInt32LE(Buffer.byteLength(v, 'latin1'), pos + 4);
    pos += 8;
  }
  for (const [k, v] of pairs) {
    pos += out.write(k, pos, 'latin1');
    out[pos++] = 0;
    pos += out.write(v, pos, 'latin1');
    out[pos++] = 0;
  }
  return out;
}

// cpp-host 3930b7b src/pairs_util.cc PairsUtil::toPairs: any inconsistency gives no pairs.
function toPairs(buf) {
  if (buf.length > PAIRS_MAX_BYTES || buf.length < 4) return [];
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.length);
  const n = b.readUInt32LE(0);
  if (n > PAIRS_MAX_COUNT || 4 + n * 8 > b.length) return [];
  const sizes = [];
  let pos = 4;
  for (let i = 0; i < n; i++, pos += 8) sizes.push([b.readUInt32LE(pos), b.readUInt32LE(pos + 4)]);
  const pairs = [];
  for (const [ks, vs] of sizes) {
    if (pos + ks + 1 > b.length) return [];
    const k = b.toString('latin1', pos, pos + ks);
    pos += ks;
    if (b[pos++] !== 0) return [];
    if (pos + vs + 1 > b.length) return [];
    const v = b.toString('latin1', pos, pos + vs);
    pos += vs;
    if (b[pos++] !== 0) return [];
    pairs.push([k, v]);
  }
  return pos === b.length ? pairs : [];
}

// ---------------------------------------------------------------------------------------
// Shared state of one Envoy: shared data (cpp-host 3930b7b src/shared_data.cc), shared queues
// (src/shared_queue.cc) and stats (Envoy's stats scope, shared by name).

class SharedData {
  constructor() {
    this.data = new Map(); // key -> { value: Buffer, cas }
    this.cas = 1; // cpp-host 3930b7b src/shared_data.h: cas_ = 1
  }
  // cpp-host 3930b7b src/shared_data.h nextCas: skips 0 on wrap-around.
  nextCas() {
    const r = this.cas;
    this.cas = (this.cas + 1) >>> 0;
    if (this.cas === 0) this.cas = 1;
    return r;
  }
  // cpp-host 3930b7b src/shared_data.cc SharedData::get: NotFound for a missing key.
  get(key) { return this.data.get(key) ?? null; }
  // cpp-host 3930b7b src/shared_data.cc SharedData::set: an existing key needs cas 0 or the
  // current cas (else CasMismatch); a missing key is written whatever the cas.
  set(key, value, cas) {
    const cur = this.data.get(key);
    if (cur && cas !== 0 && cas !== cur.cas) return R.CasMismatch;
    this.data.set(key, { value: Buffer.from(value), cas: this.nextCas() });
    return R.Ok;
  }
}

class SharedQueues {
  constructor() {
    this.tokens = new Map(); // queue name -> token
    this.queues = new Map(); // token -> { items: Buffer[], vm, contextId }
    this.nextToken = 1;
  }
  // cpp-host 3930b7b src/shared_queue.cc registerQueue: the same name keeps its token; the
  // latest registration decides which VM and context get onQueueReady; data is preserved.
  register(name, vm, contextId) {
    let token = this.tokens.get(name);
    if (token === undefined) {
      do {
        token = this.nextToken++ >>> 0;
      } while (token === 0 || this.queues.has(token));
      this.tokens.set(name, token);
    }
    const q = this.queues.get(token) ?? { items: [] };
    q.vm = vm;
    q.contextId = contextId;
    this.queues.set(token, q);
    return token;
  }
  resolve(name) { return this.tokens.get(name) ?? 0; }
  // cpp-host 3930b7b src/shared_queue.cc dequeue: NotFound for an unknown token, Empty when empty.
  dequeue(token) {
    const q = this.queues.get(token);
    if (!q) return { result: R.NotFound };
    if (q.items.length === 0) return { result: R.Empty };
    return { result: R.Ok, data: q.items.shift() };
  }
  // cpp-host 3930b7b src/shared_queue.cc enqueue: onQueueReady is posted to the registering
  // thread (call_on_thread), so it runs after the enqueuing callback returns.
  enqueue(token, data) {
    const q = this.queues.get(token);
    if (!q) return R.NotFound;
    q.items.push(Buffer.from(data));
    const { vm, contextId } = q;
    vm.post(() => {
      const ctx = vm.contexts.get(contextId);
      if (ctx) vm.onQueueReady(ctx, token);
    });
    return R.Ok;
  }
}

class Stats {
  constructor() { this.byName = new Map(); }
  get(type, name) {
    let m = this.byName.get(name);
    if (!m) {
      m = { type, name, value: 0n, samples: 0 };
      this.byName.set(name, m);
    }
    return m;
  }
  snapshot() {
    const out = {};
    for (const [name, m] of [...this.byName].sort(([a], [b]) => (a < b ? -1 : 1))) {
      if (m.type !== MetricType.Histogram) out[name] = Number(BigInt.asIntN(64, m.value));
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------
// Contexts (cpp-host 3930b7b include/proxy-wasm/context.h ContextBase, plus the Envoy
// Context state the ABI reads: header maps, body buffers, the http-call response).

class Context {
  constructor(vm, id, parentId) {
    this.vm = vm;
    this.id = id;
    this.parentId = parentId; // 0 for root contexts and for the VM context (id 0)
    this.inVmContextCreated = false;
    this.tempPlugin = null; // set while proxy_on_configure (and the root's on_context_create) run
    this.stream = null; // Stream for HTTP contexts
    // Root context state.
    this.httpCallResponse = null;
    this.nextHttpCallToken = 1;
    this.httpCalls = new Map();
  }
  isRoot() { return this.parentId === 0; }
  // cpp-host 3930b7b include/proxy-wasm/context.h root_context(): follow parents; a root
  // context (and the VM context) is its own root.
  root() {
    if (this.id === 0 || this.parentId === 0) return this;
    return this.vm.contexts.get(this.parentId) ?? this;
  }
}

// ---------------------------------------------------------------------------------------
// Host functions. Signatures are cpp-host's (src/exports.cc; Word is i32, int64_t/uint64_t
// are i64); V8::link (src/v8/v8.cc) refuses an import that is missing or has another type.

const I = 'i32', L = 'i64';
const S = (params, results) => ({ params, results });

const WASI = new Map();
const ENV = new Map();
const ENV_ABI = { '0_1_0': new Map(), '0_2_0': new Map(), '0_2_1': new Map() };

// --- WASI (cpp-host 3930b7b src/exports.cc; include/proxy-wasm/exports.h FOR_ALL_WASI_FUNCTIONS
// is the whole surface: anything else is a missing import).

// cpp-host 3930b7b src/exports.cc writevImpl / wasi_unstable_fd_write: stdout goes to the
// log at info, stderr at error (trailing newline dropped), any other fd is EBADF (8).
WASI.set('fd_write', [S([I, I, I, I], [I]), function (fd, iovs, iovsLen, nwrittenPtr) {
  let level;
  if (fd === 1) level = LogLevel.info;
  else if (fd === 2) level = LogLevel.error;
  else return 8; // __WASI_EBADF
  iovs >>>= 0;
  iovsLen >>>= 0;
  const parts = [];
  for (let i = 0; i < iovsLen; i++) {
    const iov = this.getMemory(iovs + i * 8, 8);
    if (!iov) return 21; // __WASI_EFAULT
    const buf = this.readU32(iovs + i * 8), len = this.readU32(iovs + i * 8 + 4);
    if (len !== 0) {
      const m = this.getMemory(buf, len);
      if (!m) return 21; // __WASI_EFAULT
      parts.push(Buffer.from(m));
    }
  }
  const s = Buffer.concat(parts);
  const written = s.length;
  if (written !== 0) {
    const text = s[written - 1] === 0x0a ? s.subarray(0, written - 1) : s;
    if (this.log(level, text.toString('latin1')) !== R.Ok) return 8; // __WASI_EBADF
  }
  if (!this.setWord(nwrittenPtr, written)) return 21; // __WASI_EFAULT
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_read: ENOSYS (52).
WASI.set('fd_read', [S([I, I, I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_seek: logs an error, returns success
// without writing the new offset.
WASI.set('fd_seek', [S([I, L, I, I], [I]), function () {
  this.error('wasi_unstable fd_seek');
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_close: logs an error, returns success.
WASI.set('fd_close', [S([I], [I]), function () {
  this.error('wasi_unstable fd_close');
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_fdstat_get: only fds 1 and 2; 24 bytes,
// fs_rights_base = FD_WRITE (64); the write is not checked.
WASI.set('fd_fdstat_get', [S([I, I], [I]), function (fd, statOut) {
  if (fd !== 1 && fd !== 2) return 8; // __WASI_EBADF
  const st = Buffer.alloc(24);
  st.writeBigUInt64LE(64n, 8);
  this.setMemory(statOut, st);
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_fdstat_set_flags: ENOSYS (52).
WASI.set('fd_fdstat_set_flags', [S([I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_environ_get / environ_sizes_get: the VM's
// environment (Envoy vm_config.environment_variables; Istio vmConfig.env).
WASI.set('environ_get', [S([I, I], [I]), function (arrayPtr, bufPtr) {
  arrayPtr >>>= 0;
  bufPtr >>>= 0;
  for (const [k, v] of this.host.env) {
    if (!this.setWord(arrayPtr, bufPtr)) return 21;
    const data = Buffer.from(`${k}=${v}\0`, 'latin1');
    if (!this.setMemory(bufPtr, data)) return 21;
    bufPtr += data.length;
    arrayPtr += 4;
  }
  return 0;
}]);
WASI.set('environ_sizes_get', [S([I, I], [I]), function (countPtr, sizePtr) {
  if (!this.setWord(countPtr, this.host.env.length)) return 21;
  let size = 0;
  for (const [k, v] of this.host.env) size += Buffer.byteLength(k, 'latin1') + Buffer.byteLength(v, 'latin1') + 2;
  if (!this.setWord(sizePtr, size)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_args_get: success, writes nothing.
WASI.set('args_get', [S([I, I], [I]), () => 0]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_args_sizes_get: no arguments.
WASI.set('args_sizes_get', [S([I, I], [I]), function (argcPtr, bufSizePtr) {
  if (!this.setWord(argcPtr, 0)) return 21;
  if (!this.setWord(bufSizePtr, 0)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_clock_time_get: realtime (0) and monotonic
// (1) only, else ENOTSUP (58); the precision is ignored.
WASI.set('clock_time_get', [S([I, L, I], [I]), function (id, _precision, resultPtr) {
  let t;
  if (id === 0) t = this.host.clock.realtimeNs();
  else if (id === 1) t = this.host.clock.monotonicNs();
  else return 58; // __WASI_ENOTSUP
  if (!this.setU64(resultPtr, t)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_random_get: at most 64 KiB (else EINVAL 28).
WASI.set('random_get', [S([I, I], [I]), function (ptr, len) {
  len >>>= 0;
  if (len > RANDOM_GET_MAX_BYTES) return 28; // __WASI_EINVAL
  if (len === 0) return 0;
  const b = Buffer.alloc(len);
  randomFillSync(b);
  if (!this.setMemory(ptr, b)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_sched_yield: success.
WASI.set('sched_yield', [S([], [I]), () => 0]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_poll_oneoff: ENOSYS (52), always. Go's
// wasip1 runtime (netpoll_wasip1.go) throws "poll_oneoff failed" on it; this host does not
// paper over that.
WASI.set('poll_oneoff', [S([I, I, I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_proc_exit: logs an error and returns.
WASI.set('proc_exit', [S([I], []), function () {
  this.error('wasi_unstable proc_exit');
  this.host.counters.procExit++;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_path_open: ENOENT (44).
WASI.set('path_open', [S([I, I, I, I, I, L, L, I, I], [I]), () => 44]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_prestat_get: EBADF (8), no preopens.
WASI.set('fd_prestat_get', [S([I, I], [I]), () => 8]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_prestat_dir_name: ENOSYS (52).
WASI.set('fd_prestat_dir_name', [S([I, I, I], [I]), () => 52]);

// --- env: emscripten helpers (cpp-host 3930b7b src/wasm.cc registerCallbacks, exports.cc).
ENV.set('pthread_equal', [S([I, I], [I]), (a, b) => (a === b ? 1 : 0)]);
ENV.set('emscripten_notify_memory_growth', [S([I], []), () => {}]);

// --- env: proxy-wasm (cpp-host 3930b7b include/proxy-wasm/exports.h FOR_ALL_HOST_FUNCTIONS).

// cpp-host 3930b7b src/exports.cc log: level above critical is BadArgument.
ENV.set('proxy_log', [S([I, I, I], [I]), function (level, addr, size) {
  level >>>= 0;
  if (level > LogLevel.critical) return R.BadArgument;
  const m = this.getMemory(addr, size);
  if (!m) return R.InvalidMemoryAccess;
  return this.log(level, Buffer.from(m).toString('latin1'));
}]);
// cpp-host 3930b7b src/exports.cc get_status: of the root context (Envoy: the http call's
// status, set in onHttpCallFailure).
ENV.set('proxy_get_status', [S([I, I, I], [I]), function (codePtr, valuePtrPtr, valueSizePtr) {
  const root = this.effectiveContext().root();
  if (!this.setU32(codePtr, root.statusCode ?? 0)) return R.InvalidMemoryAccess;
  if (!this.copyToPointerSize(Buffer.from(root.statusMessage ?? ''), valuePtrPtr, valueSizePtr)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// Envoy context.cc setProperty: filter state of the stream; NotFound without a stream.
ENV.set('proxy_set_property', [S([I, I, I, I], [I]), function (kp, ks, vp, vs) {
  const key = this.getMemory(kp, ks), value = this.getMemory(vp, vs);
  if (!key || !value) return R.InvalidMemoryAccess;
  const ctx = this.effectiveContext();
  if (!ctx.stream) return R.NotFound;
  ctx.stream.properties.set(Buffer.from(key).toString('latin1').split('\0').join('.'), Buffer.from(value));
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_property; Envoy context.cc getProperty (path segments
// separated by NUL).
ENV.set('proxy_get_property', [S([I, I, I, I], [I]), function (pathPtr, pathSize, valuePtrPtr, valueSizePtr) {
  const path = this.getMemory(pathPtr, pathSize);
  if (!path) return R.InvalidMemoryAccess;
  const v = this.host.property(this.effectiveContext(), Buffer.from(path).toString('latin1').split('\0').join('.'));
  if (v === null) return R.NotFound;
  if (!this.copyToPointerSize(v, valuePtrPtr, valueSizePtr)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc send_local_response: sets stop-next-iteration.
ENV.set('proxy_send_local_response', [S([I, I, I, I, I, I, I, I], [I]), function (code, dp, ds, bp, bs, hp, hs, grpc) {
  const details = this.getMemory(dp, ds), body = this.getMemory(bp, bs), hdrs = this.getMemory(hp, hs);
  if (!details || !body || !hdrs) return R.InvalidMemoryAccess;
  const ctx = this.effectiveContext();
  if (ctx.stream) ctx.stream.localReply = { code: code >>> 0, body: Buffer.from(body), headers: toPairs(hdrs), grpc };
  this.stopIteration = true;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_shared_data; src/shared_data.cc.
ENV.set('proxy_get_shared_data', [S([I, I, I, I, I], [I]), function (kp, ks, valuePtrPtr, valueSizePtr, casPtr) {
  const key = this.getMemory(kp, ks);
  if (!key) return R.InvalidMemoryAccess;
  const e = this.host.sharedData.get(Buffer.from(key).toString('latin1'));
  if (!e) return R.NotFound;
  if (!this.copyToPointerSize(e.value, valuePtrPtr, valueSizePtr)) return R.InvalidMemoryAccess;
  if (!this.setU32(casPtr, e.cas)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc set_shared_data; src/shared_data.cc SharedData::set.
ENV.set('proxy_set_shared_data', [S([I, I, I, I, I], [I]), function (kp, ks, vp, vs, cas) {
  const key = this.getMemory(kp, ks), value = this.getMemory(vp, vs);
  if (!key || !value) return R.InvalidMemoryAccess;
  return this.host.sharedData.set(Buffer.from(key).toString('latin1'), value, cas >>> 0);
}]);
// cpp-host 3930b7b src/context.cc registerSharedQueue: a stream context registers for its
// root context (onQueueReady is on the root).
ENV.set('proxy_register_shared_queue', [S([I, I, I], [I]), function (np, ns, tokenPtr) {
  const name = this.getMemory(np, ns);
  if (!name) return R.InvalidMemoryAccess;
  const ctx = this.effectiveContext();
  const token = this.host.queues.register(Buffer.from(name).toString('latin1'), this, ctx.isRoot() ? ctx.id : ctx.parentId);
  if (!this.setU32(tokenPtr, token)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/context.cc lookupSharedQueue: NotFound for an unknown name or a failed VM.
ENV.set('proxy_resolve_shared_queue', [S([I, I, I, I, I], [I]), function (vp, vs, np, ns, tokenPtr) {
  const vmId = this.getMemory(vp, vs), name = this.getMemory(np, ns);
  if (!vmId || !name) return R.InvalidMemoryAccess;
  const id = Buffer.from(vmId).toString('latin1');
  const token = id === '' || id === this.host.vmId ? this.host.queues.resolve(Buffer.from(name).toString('latin1')) : 0;
  if (this.failed || token === 0) return R.NotFound;
  if (!this.setU32(tokenPtr, token)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
ENV.set('proxy_dequeue_shared_queue', [S([I, I, I], [I]), function (token, dataPtrPtr, dataSizePtr) {
  const r = this.host.queues.dequeue(token >>> 0);
  if (r.result !== R.Ok) return r.result;
  if (!this.copyToPointerSize(r.data, dataPtrPtr, dataSizePtr)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
ENV.set('proxy_enqueue_shared_queue', [S([I, I, I], [I]), function (token, dp, ds) {
  const data = this.getMemory(dp, ds);
  if (!data) return R.InvalidMemoryAccess;
  return this.host.queues.enqueue(token >>> 0, data);
}]);
// Header maps: cpp-host 3930b7b src/exports.cc checks the type (BadArgument above MAX);
// Envoy context.cc getMap/getConstMap give null (BadArgument) for a map not available now.
ENV.set('proxy_add_header_map_value', [S([I, I, I, I, I], [I]), function (type, kp, ks, vp, vs) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const key = this.getMemory(kp, ks), value = this.getMemory(vp, vs);
  if (!key || !value) return R.InvalidMemoryAccess;
  const map = this.mutableMap(type);
  if (!map) return R.BadArgument;
  map.push([Buffer.from(key).toString('latin1').toLowerCase(), Buffer.from(value).toString('latin1')]);
  return R.Ok;
}]);
// Envoy context.cc getHeaderMapValue: the first value; NotFound for a missing header (ABI 0.2.x).
ENV.set('proxy_get_header_map_value', [S([I, I, I, I, I], [I]), function (type, kp, ks, valuePtrPtr, valueSizePtr) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const key = this.getMemory(kp, ks);
  if (!key) return R.InvalidMemoryAccess;
  const map = this.constMap(type);
  if (!map) return R.BadArgument;
  const k = Buffer.from(key).toString('latin1').toLowerCase();
  const e = map.find(([name]) => name === k);
  if (!e) return this.abi === '0_1_0' ? (this.copyToPointerSize(Buffer.alloc(0), valuePtrPtr, valueSizePtr) ? R.Ok : R.InvalidMemoryAccess) : R.NotFound;
  if (!this.copyToPointerSize(Buffer.from(e[1], 'latin1'), valuePtrPtr, valueSizePtr)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// Envoy context.cc replaceHeaderMapValue (HeaderMap::setCopy): one value under the key.
ENV.set('proxy_replace_header_map_value', [S([I, I, I, I, I], [I]), function (type, kp, ks, vp, vs) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const key = this.getMemory(kp, ks), value = this.getMemory(vp, vs);
  if (!key || !value) return R.InvalidMemoryAccess;
  const map = this.mutableMap(type);
  if (!map) return R.BadArgument;
  const k = Buffer.from(key).toString('latin1').toLowerCase(), v = Buffer.from(value).toString('latin1');
  const at = map.findIndex(([name]) => name === k);
  if (at < 0) {
    map.push([k, v]);
  } else {
    map[at] = [k, v];
    for (let i = map.length - 1; i > at; i--) if (map[i][0] === k) map.splice(i, 1);
  }
  return R.Ok;
}]);
// Envoy context.cc removeHeaderMapValue: Ok whether or not the header was there.
ENV.set('proxy_remove_header_map_value', [S([I, I, I], [I]), function (type, kp, ks) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const key = this.getMemory(kp, ks);
  if (!key) return R.InvalidMemoryAccess;
  const map = this.mutableMap(type);
  if (!map) return R.BadArgument;
  const k = Buffer.from(key).toString('latin1').toLowerCase();
  for (let i = map.length - 1; i >= 0; i--) if (map[i][0] === k) map.splice(i, 1);
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_header_map_pairs: an empty (or absent: Envoy
// headerMapToPairs(nullptr) is {}) map is Ok with pointer 0 and size 0; otherwise the pairs
// go into memory from allocMemory.
ENV.set('proxy_get_header_map_pairs', [S([I, I, I], [I]), function (type, ptrPtr, sizePtr) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const pairs = this.constMap(type) ?? [];
  if (pairs.length === 0) {
    return this.copyToPointerSize(Buffer.alloc(0), ptrPtr, sizePtr) ? R.Ok : R.InvalidMemoryAccess;
  }
  const data = marshalPairs(pairs);
  const addr = this.allocMemory(data.length);
  if (!addr) return R.InvalidMemoryAccess;
  if (!this.setMemory(addr, data)) return R.InvalidMemoryAccess;
  if (!this.setWord(ptrPtr, addr)) return R.InvalidMemoryAccess;
  if (!this.setWord(sizePtr, data.length)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// Envoy context.cc setHeaderMapPairs: replaces the whole map.
ENV.set('proxy_set_header_map_pairs', [S([I, I, I], [I]), function (type, ptr, size) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const data = this.getMemory(ptr, size);
  if (!data) return R.InvalidMemoryAccess;
  const map = this.mutableMap(type);
  if (!map) return R.BadArgument;
  map.splice(0, map.length, ...toPairs(data).map(([k, v]) => [k.toLowerCase(), v]));
  return R.Ok;
}]);
// Envoy context.cc getHeaderMapSize: the map's byte size.
ENV.set('proxy_get_header_map_size', [S([I, I], [I]), function (type, resultPtr) {
  if (type >>> 0 > HeaderMap.MAX) return R.BadArgument;
  const map = this.mutableMap(type);
  if (!map) return R.BadArgument;
  let n = 0;
  for (const [k, v] of map) n += k.length + v.length;
  if (!this.setWord(resultPtr, n)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_buffer_status: NotFound without the buffer; flags 0.
ENV.set('proxy_get_buffer_status', [S([I, I, I], [I]), function (type, lengthPtr, flagsPtr) {
  if (type >>> 0 > BufferType.MAX) return R.BadArgument;
  const b = this.getBuffer(type >>> 0);
  if (!b) return R.NotFound;
  if (!this.setWord(lengthPtr, b.data.length)) return R.InvalidMemoryAccess;
  if (!this.setU32(flagsPtr, 0)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_buffer_bytes: the range is clipped to the buffer; an
// empty result is pointer 0, size 0 without allocating; otherwise BufferBase::copyTo
// (src/context.cc) goes through copyToPointerSize and so through allocMemory.
ENV.set('proxy_get_buffer_bytes', [S([I, I, I, I, I], [I]), function (type, start, length, ptrPtr, sizePtr) {
  if (type >>> 0 > BufferType.MAX) return R.BadArgument;
  const b = this.getBuffer(type >>> 0);
  if (!b) return R.NotFound;
  start >>>= 0;
  length >>>= 0;
  // cpp-host compares 64-bit Words: start + length cannot overflow for 32-bit inputs.
  const size = b.data.length;
  if (start > size) length = 0;
  else if (start + length > size) length = size - start;
  if (length === 0) {
    if (!this.setWord(ptrPtr, 0)) return R.InvalidMemoryAccess;
    if (!this.setWord(sizePtr, 0)) return R.InvalidMemoryAccess;
    return R.Ok;
  }
  return this.copyToPointerSize(b.data.subarray(start, start + length), ptrPtr, sizePtr) ? R.Ok : R.InvalidMemoryAccess;
}]);
// Envoy context.cc Buffer::copyFrom: start 0 and length 0 prepends, start 0 and length >=
// size replaces, start >= size appends, anything else is BadArgument; immutable buffers
// (configuration, http-call response) are BadArgument.
ENV.set('proxy_set_buffer_bytes', [S([I, I, I, I, I], [I]), function (type, start, length, dp, ds) {
  if (type >>> 0 > BufferType.MAX) return R.BadArgument;
  const b = this.getBuffer(type >>> 0);
  if (!b) return R.NotFound;
  const data = this.getMemory(dp, ds);
  if (!data) return R.InvalidMemoryAccess;
  if (!b.set) return R.BadArgument;
  start >>>= 0;
  length >>>= 0;
  const cur = b.data, d = Buffer.from(data);
  if (start === 0) {
    if (length === 0) b.set(Buffer.concat([d, cur]));
    else if (length >= cur.length) b.set(d);
    else return R.BadArgument;
  } else if (start >= cur.length) {
    b.set(Buffer.concat([cur, d]));
  } else {
    return R.BadArgument;
  }
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc http_call: on the root context; the token pointer is
// written (0) before the call to check it. Envoy context.cc httpCall: an unknown cluster or
// a missing :path, :method or :authority is BadArgument; the response arrives later.
ENV.set('proxy_http_call', [S([I, I, I, I, I, I, I, I, I, I], [I]), function (up, us, hp, hs, bp, bs, tp, ts, timeoutMs, tokenPtr) {
  const root = this.effectiveContext().root();
  const uri = this.getMemory(up, us), body = this.getMemory(bp, bs), hdrs = this.getMemory(hp, hs), trl = this.getMemory(tp, ts);
  if (!uri || !body || !hdrs || !trl) return R.InvalidMemoryAccess;
  if (!this.setU32(tokenPtr, 0)) return R.InvalidMemoryAccess;
  const r = this.host.httpCall(this, root, Buffer.from(uri).toString('latin1'), toPairs(hdrs), Buffer.from(body), toPairs(trl), timeoutMs >>> 0);
  this.setU32(tokenPtr, r.token ?? 0);
  return r.result;
}]);
// gRPC is not modelled (kvroute does not import it): present so a module that imports it
// links, as in Envoy, but every call is Unimplemented.
ENV.set('proxy_grpc_call', [S([I, I, I, I, I, I, I, I, I, I, I, I], [I]), () => R.Unimplemented]);
ENV.set('proxy_grpc_stream', [S([I, I, I, I, I, I, I, I, I], [I]), () => R.Unimplemented]);
ENV.set('proxy_grpc_close', [S([I], [I]), () => R.Unimplemented]);
ENV.set('proxy_grpc_cancel', [S([I], [I]), () => R.Unimplemented]);
ENV.set('proxy_grpc_send', [S([I, I, I, I], [I]), () => R.Unimplemented]);
// cpp-host 3930b7b src/exports.cc set_tick_period_milliseconds -> context.cc setTimerPeriod:
// the period belongs to the root context; Envoy wasm.cc setTickPeriod arms a timer.
ENV.set('proxy_set_tick_period_milliseconds', [S([I], [I]), function (period) {
  this.setTickPeriod(this.effectiveContext().root().id, period >>> 0);
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc get_current_time_nanoseconds: realtime.
ENV.set('proxy_get_current_time_nanoseconds', [S([I], [I]), function (resultPtr) {
  if (!this.setU64(resultPtr, this.host.clock.realtimeNs())) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// Envoy context.cc defineMetric: type above Max is BadArgument; ids per VM (cpp-host
// include/proxy-wasm/wasm.h nextCounterMetricId: type in the low 2 bits, step 4); the
// stat is shared by name across VMs.
ENV.set('proxy_define_metric', [S([I, I, I, I], [I]), function (type, np, ns, idPtr) {
  const name = this.getMemory(np, ns);
  if (!name) return R.InvalidMemoryAccess;
  type >>>= 0;
  if (type > MetricType.Max) return R.BadArgument;
  this.nextMetricId[type] += 4;
  const id = this.nextMetricId[type];
  this.metrics.set(id, this.host.stats.get(type, Buffer.from(name).toString('latin1')));
  if (!this.setU32(idPtr, id)) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// Envoy context.cc incrementMetric: counters take positive offsets only (else BadArgument),
// gauges add or subtract, histograms are BadArgument; an unknown id is NotFound.
ENV.set('proxy_increment_metric', [S([I, L], [I]), function (id, offset) {
  id >>>= 0;
  const type = id & 3;
  const m = this.metrics.get(id);
  if (type === MetricType.Counter) {
    if (!m) return R.NotFound;
    if (offset <= 0n) return R.BadArgument;
    m.value += offset;
    return R.Ok;
  }
  if (type === MetricType.Gauge) {
    if (!m) return R.NotFound;
    m.value += offset;
    return R.Ok;
  }
  return R.BadArgument;
}]);
// Envoy context.cc recordMetric: counter add, gauge set, histogram record.
ENV.set('proxy_record_metric', [S([I, L], [I]), function (id, value) {
  const m = this.metrics.get(id >>> 0);
  if (!m) return R.NotFound;
  if (m.type === MetricType.Counter) m.value += BigInt.asUintN(64, value);
  else if (m.type === MetricType.Gauge) m.value = BigInt.asUintN(64, value);
  else m.samples++;
  return R.Ok;
}]);
// Envoy context.cc getMetric: counters and gauges only.
ENV.set('proxy_get_metric', [S([I, I], [I]), function (id, resultPtr) {
  id >>>= 0;
  const type = id & 3;
  if (type === MetricType.Histogram || type === 3) return R.BadArgument;
  const m = this.metrics.get(id);
  if (!m) return R.NotFound;
  if (!this.setU64(resultPtr, BigInt.asUintN(64, m.value))) return R.InvalidMemoryAccess;
  return R.Ok;
}]);
// cpp-host 3930b7b src/exports.cc set_effective_context: BadArgument for an unknown context;
// the effective context lasts until the current guest call returns (wasm_vm.h SaveRestoreContext).
ENV.set('proxy_set_effective_context', [S([I], [I]), function (cid) {
  cid >>>= 0;
  if (!this.contexts.has(cid)) return R.BadArgument;
  this.effectiveId = cid;
  return R.Ok;
}]);
// cpp-host 3930b7b src/wasm.cc WasmBase::done: NotFound unless the root context is pending done.
ENV.set('proxy_done', [S([], [I]), () => R.NotFound]);
// cpp-host 3930b7b src/exports.cc call_foreign_function: no foreign functions are registered.
ENV.set('proxy_call_foreign_function', [S([I, I, I, I, I, I], [I]), function (np, ns, ap, as) {
  if (!this.getMemory(np, ns) || !this.getMemory(ap, as)) return R.InvalidMemoryAccess;
  return R.NotFound;
}]);

// ABI-specific (cpp-host 3930b7b src/wasm.cc registerCallbacks).
ENV_ABI['0_1_0'].set('proxy_get_configuration', [S([I, I], [I]), function (ptrPtr, sizePtr) {
  const ctx = this.effectiveContext();
  const v = ctx.tempPlugin ? this.host.pluginConfig : this.host.vmConfig;
  return this.copyToPointerSize(v, ptrPtr, sizePtr) ? R.Ok : R.InvalidMemoryAccess;
}]);
ENV_ABI['0_1_0'].set('proxy_continue_request', [S([], [I]), function () { return this.continueStream(StreamType.Request); }]);
ENV_ABI['0_1_0'].set('proxy_continue_response', [S([], [I]), function () { return this.continueStream(StreamType.Response); }]);
ENV_ABI['0_1_0'].set('proxy_clear_route_cache', [S([], [I]), () => R.Ok]);
for (const abi of ['0_2_0', '0_2_1']) {
  // cpp-host 3930b7b src/exports.cc continue_stream / close_stream: type above MAX is BadArgument.
  ENV_ABI[abi].set('proxy_continue_stream', [S([I], [I]), function (type) {
    if (type >>> 0 > StreamType.MAX) return R.BadArgument;
    return this.continueStream(type >>> 0);
  }]);
  ENV_ABI[abi].set('proxy_close_stream', [S([I], [I]), function (type) {
    if (type >>> 0 > StreamType.MAX) return R.BadArgument;
    const ctx = this.effectiveContext();
    if (ctx.stream) ctx.stream.closed = true;
    return R.Ok;
  }]);
}
// cpp-host 3930b7b src/exports.cc get_log_level (ABI 0.2.1 only): Envoy's level, info.
ENV_ABI['0_2_1'].set('proxy_get_log_level', [S([I], [I]), function (ptr) {
  return this.setU32(ptr, this.host.logLevel) ? R.Ok : R.InvalidMemoryAccess;
}]);

// Exports cpp-host looks up, with the signatures it wants (cpp-host 3930b7b
// include/proxy-wasm/wasm.h WasmCallWord<N> = N i32 -> i32, WasmCallVoid<N> = N i32 -> ()).
const W = (n) => S(Array(n).fill(I), [I]);
const V = (n) => S(Array(n).fill(I), []);
const MODULE_FUNCTIONS = {
  proxy_validate_configuration: W(2), proxy_on_vm_start: W(2), proxy_on_configure: W(2),
  proxy_on_tick: V(1), proxy_on_context_create: V(2), proxy_on_new_connection: W(1),
  proxy_on_downstream_data: W(3), proxy_on_upstream_data: W(3),
  proxy_on_downstream_connection_close: V(2), proxy_on_upstream_connection_close: V(2),
  proxy_on_request_body: W(3), proxy_on_request_trailers: W(2), proxy_on_request_metadata: W(2),
  proxy_on_response_body: W(3), proxy_on_response_trailers: W(2), proxy_on_response_metadata: W(2),
  proxy_on_http_call_response: V(5), proxy_on_grpc_receive: V(3), proxy_on_grpc_close: V(3),
  proxy_on_grpc_receive_initial_metadata: V(3), proxy_on_grpc_receive_trailing_metadata: V(3),
  proxy_on_queue_ready: V(2), proxy_on_done: W(1), proxy_on_log: V(1), proxy_on_delete: V(1),
};

// ---------------------------------------------------------------------------------------
// One VM: cpp-host's WasmBase + V8 WasmVm for one module instance.

let vmSerial = 0;

class VM {
  constructor(host, role) {
    this.host = host;
    this.role = role; // 'base' | 'canary' | 'worker'
    this.index = -1;
    this.serial = vmSerial++;
    this.abi = host.abi;
    this.failed = null; // { state, message }
    this.restricted = null; // Set of allowed "module.name", or null
    this.current = null; // current_context_
    this.effectiveId = 0; // effective_context_id_
    this.stopIteration = false;
    this.contexts = new Map();
    this.vmContext = new Context(this, 0, 0);
    this.contexts.set(0, this.vmContext);
    this.nextContextId = 1; // cpp-host 3930b7b include/proxy-wasm/wasm.h: 0 is the VM context
    this.root = null;
    this.timers = new Map(); // root context id -> { period, due }
    this.pending = [];
    this.metrics = new Map();
    this.nextMetricId = [MetricType.Counter, MetricType.Gauge, MetricType.Histogram]; // wasm.h next_*_metric_id_
    this.fn = {};
    this.buf = null;
  }

  // --- failure (cpp-host 3930b7b include/proxy-wasm/wasm.h WasmBase::fail)
  fail(state, message) {
    if (!this.failed) {
      this.failed = { state, message };
      this.host.onFail(this, state, message);
    }
    this.log(LogLevel.critical, message, true);
  }
  // Envoy context.cc Context::error: a trace-level log line.
  error(message) { this.log(LogLevel.trace, message, true); }
  log(level, message, fromHost = false) { return this.host.log(this, level, message, fromHost); }

  // --- memory (cpp-host 3930b7b src/v8/v8.cc getMemory/setMemory/getWord/setWord: bounds
  // checked against the current memory size; the views follow memory growth).
  view() {
    const b = this.memory.buffer;
    if (b !== this.buf) {
      this.buf = b;
      this.u8 = new Uint8Array(b);
      this.dv = new DataView(b);
    }
    return this.u8;
  }
  getMemory(ptr, size) {
    ptr >>>= 0;
    size >>>= 0;
    const u8 = this.view();
    if (ptr + size > u8.length) return null;
    return u8.subarray(ptr, ptr + size);
  }
  setMemory(ptr, data) {
    ptr >>>= 0;
    const u8 = this.view();
    if (ptr + data.length > u8.length) return false;
    u8.set(data, ptr);
    return true;
  }
  readU32(ptr) {
    this.view();
    return this.dv.getUint32(ptr >>> 0, true);
  }
  setWord(ptr, v) { return this.setU32(ptr, v); }
  setU32(ptr, v) {
    ptr >>>= 0;
    const u8 = this.view();
    if (ptr + 4 > u8.length) return false;
    this.dv.setUint32(ptr, v >>> 0, true);
    return true;
  }
  setU64(ptr, v) {
    ptr >>>= 0;
    const u8 = this.view();
    if (ptr + 8 > u8.length) return false;
    this.dv.setBigUint64(ptr, BigInt.asUintN(64, v), true);
    return true;
  }

  // cpp-host 3930b7b include/proxy-wasm/wasm.h WasmBase::allocMemory: malloc runs under
  // restricted callbacks (only proxy_log, fd_write, clock_time_get), then the restriction is
  // cleared (not restored); a failed or trapping malloc is a null pointer.
  allocMemory(size) {
    if (!this.fn.malloc) return 0;
    this.restricted = ALLOC_ALLOWED;
    const a = this.callWord(this.fn.malloc, this.fn.mallocName, this.vmContext, size);
    this.restricted = null;
    if (!a) return 0;
    if (!this.getMemory(a, size)) return 0;
    return a >>> 0;
  }
  // cpp-host 3930b7b include/proxy-wasm/wasm.h WasmBase::copyToPointerSize: nothing is
  // allocated for empty data (pointer 0).
  copyToPointerSize(data, ptrPtr, sizePtr) {
    let addr = 0;
    if (data.length > 0) {
      addr = this.allocMemory(data.length);
      if (!addr) return false;
      this.setMemory(addr, data);
    }
    if (!this.setWord(ptrPtr, addr)) return false;
    if (!this.setWord(sizePtr, data.length)) return false;
    return true;
  }

  // cpp-host 3930b7b src/exports.cc contextOrEffectiveContext.
  effectiveContext() {
    if (this.effectiveId === 0) return this.current ?? this.vmContext;
    return this.contexts.get(this.effectiveId) ?? this.current ?? this.vmContext;
  }

  // --- calls into the guest (cpp-host 3930b7b src/v8/v8.cc getModuleFunctionImpl): the
  // context is saved and restored around the call (wasm_vm.h SaveRestoreContext), a trap
  // fails the VM with FailState::RuntimeError and the call returns 0.
  callWord(f, name, ctx, ...args) {
    const savedCur = this.current, savedEff = this.effectiveId;
    this.current = ctx;
    this.effectiveId = 0;
    try {
      return f(...args) >>> 0;
    } catch (e) {
      this.trapped(name, e);
      return 0;
    } finally {
      this.current = savedCur;
      this.effectiveId = savedEff;
    }
  }
  callVoid(f, name, ctx, ...args) {
    const savedCur = this.current, savedEff = this.effectiveId;
    this.current = ctx;
    this.effectiveId = 0;
    try {
      f(...args);
    } catch (e) {
      this.trapped(name, e);
    } finally {
      this.current = savedCur;
      this.effectiveId = savedEff;
    }
  }
  trapped(name, e) {
    const hostBug = !(e instanceof WebAssembly.RuntimeError || e instanceof HostTrap || e instanceof RangeError);
    // cpp-host 3930b7b src/v8/v8.cc getFailMessage: "Function: <name> failed: <trap message>"
    // and the in-VM backtrace (at most 20 frames: --stack-trace-limit=20).
    const frames = String(e?.stack ?? '').split('\n').filter((l) => l.includes('wasm')).slice(0, 20).map((l) => l.trim());
    let msg = `Function: ${name} failed: ${e?.message ?? e}`;
    if (frames.length) msg += `\nProxy-Wasm plugin in-VM backtrace:\n${frames.join('\n')}`;
    if (hostBug) {
      this.host.hostBugs.push(String(e?.stack ?? e));
      msg = `host bug: ${msg}`;
    }
    this.fail(FailState.RuntimeError, msg);
  }

  // --- linking (cpp-host 3930b7b src/v8/v8.cc V8::link, src/wasm.cc registerCallbacks).
  link() {
    const imports = {};
    const registry = this.host.registry;
    for (const imp of this.host.info.imports) {
      const key = `${imp.module}.${imp.name}`;
      if (imp.kind !== 'function') {
        // cpp-host 3930b7b src/v8/v8.cc V8::link: globals are a missing import; an imported
        // memory or table is created by the host.
        if (imp.kind === 'memory') {
          (imports[imp.module] ??= {})[imp.name] = new WebAssembly.Memory({ initial: imp.limits.min, maximum: imp.limits.max ?? undefined });
          continue;
        }
        if (imp.kind === 'table') {
          (imports[imp.module] ??= {})[imp.name] = new WebAssembly.Table({ element: 'anyfunc', initial: imp.limits.min, maximum: imp.limits.max ?? undefined });
          continue;
        }
        throw new LoadError(`Failed to load Wasm module due to a missing import: ${key}`);
      }
      const spec = registry.get(key);
      if (!spec) throw new LoadError(`Failed to load Wasm module due to a missing import: ${key}`);
      if (!sameSig(imp.type, spec[0])) {
        throw new LoadError(`Failed to load Wasm module due to an import type mismatch: ${key}, want: ${sigString(imp.type)}, but host exports: ${sigString(spec[0])}`);
      }
      (imports[imp.module] ??= {})[imp.name] = this.wrap(key, spec[1]);
    }
    try {
      this.instance = new WebAssembly.Instance(this.host.module, imports);
    } catch (e) {
      throw new LoadError(`Failed to create new Wasm instance: ${e.message}`);
    }
    this.memory = this.instance.exports.memory ?? Object.values(imports).flatMap((m) => Object.values(m)).find((v) => v instanceof WebAssembly.Memory);
    if (!this.memory) throw new LoadError('Wasm module has no memory');
  }

  // The callback wrapper: cpp-host 3930b7b src/v8/v8.cc registerHostFunctionImpl traps with
  // "restricted_callback" when the call is not allowed right now.
  wrap(key, impl) {
    const vm = this;
    return function (a, b, c, d, e, f, g, h, i, j, k, l) {
      if (vm.restricted !== null && !vm.restricted.has(key)) {
        if (vm.host.restrictedTraps.length < 100) vm.host.restrictedTraps.push({ vm: vm.index, role: vm.role, call: key, inside: vm.restricted === ALLOC_ALLOWED ? 'proxy_on_memory_allocate' : '_initialize' });
        throw new HostTrap('restricted_callback');
      }
      return impl.call(vm, a, b, c, d, e, f, g, h, i, j, k, l);
    };
  }

  // cpp-host 3930b7b src/wasm.cc WasmBase::getFunctions and src/v8/v8.cc
  // getModuleFunctionImpl (a signature mismatch fails the load).
  getFunctions() {
    const ex = this.instance.exports;
    const sigs = this.host.info.exportSigs;
    const get = (name, want) => {
      const f = ex[name];
      if (typeof f !== 'function') return null;
      if (!sameSig(sigs.get(name), want)) {
        throw new LoadError(`Bad function signature for: ${name}, want: ${sigString(want)} , but the module exports: ${sigString(sigs.get(name))}`);
      }
      return f;
    };
    this.fn._initialize = get('_initialize', V(0));
    if (this.fn._initialize) {
      this.fn.main = get('main', W(2));
      this.fn.__main_void = get('__main_void', W(0));
    } else {
      this.fn._start = get('_start', V(0));
    }
    this.fn.malloc = get('malloc', W(1));
    this.fn.mallocName = 'malloc';
    if (!this.fn.malloc) {
      this.fn.malloc = get('proxy_on_memory_allocate', W(1));
      this.fn.mallocName = 'proxy_on_memory_allocate';
    }
    if (!this.fn.malloc) throw new LoadError('Wasm module is missing malloc function.', FailState.MissingFunction);
    for (const [name, sig] of Object.entries(MODULE_FUNCTIONS)) this.fn[name] = get(name, sig);
    if (this.abi === '0_1_0') {
      this.fn.proxy_on_request_headers = get('proxy_on_request_headers', W(2));
      this.fn.proxy_on_response_headers = get('proxy_on_response_headers', W(2));
    } else {
      this.fn.proxy_on_request_headers = get('proxy_on_request_headers', W(3));
      this.fn.proxy_on_response_headers = get('proxy_on_response_headers', W(3));
      this.fn.proxy_on_foreign_function = get('proxy_on_foreign_function', V(3));
    }
  }

  // cpp-host 3930b7b src/wasm.cc WasmBase::startVm: _initialize (and main or __main_void)
  // with restricted callbacks, against the VM context.
  startVm() {
    this.restricted = START_ALLOWED;
    if (this.fn._initialize) {
      this.callVoid(this.fn._initialize, '_initialize', this.vmContext);
      if (this.fn.main) this.callWord(this.fn.main, 'main', this.vmContext, 0, 0);
      else if (this.fn.__main_void) this.callWord(this.fn.__main_void, '__main_void', this.vmContext);
    } else if (this.fn._start) {
      this.callVoid(this.fn._start, '_start', this.vmContext);
    }
    this.restricted = null;
  }

  // cpp-host 3930b7b src/wasm.cc allocContextId: ids are never reused.
  allocContextId() {
    for (;;) {
      const id = this.nextContextId;
      this.nextContextId = (this.nextContextId + 1) >>> 0;
      if (!this.contexts.has(id)) return id;
    }
  }

  // cpp-host 3930b7b src/context.cc DeferAfterCallActions: stop-next-iteration is reset
  // after every callback.
  afterCall() { this.stopIteration = false; }

  // cpp-host 3930b7b src/wasm.cc WasmBase::start + src/context.cc ContextBase::onStart:
  // proxy_on_context_create(root, 0) first, then proxy_on_vm_start(root, vm config size).
  startPlugin() {
    const ctx = new Context(this, this.allocContextId(), 0);
    this.contexts.set(ctx.id, ctx);
    this.root = ctx;
    let ok = true;
    if (this.fn.proxy_on_context_create) {
      ctx.tempPlugin = true;
      this.callVoid(this.fn.proxy_on_context_create, 'proxy_on_context_create', ctx, ctx.id, 0);
      ctx.inVmContextCreated = true;
      ctx.tempPlugin = null;
    }
    if (this.fn.proxy_on_vm_start) {
      ok = this.callWord(this.fn.proxy_on_vm_start, 'proxy_on_vm_start', ctx, ctx.id, this.host.vmConfig.length) !== 0;
    }
    this.afterCall();
    return ok;
  }

  // cpp-host 3930b7b src/context.cc ContextBase::onConfigure: true when the VM already
  // failed; proxy_on_configure(root, plugin config size) with the configuration readable.
  configurePlugin() {
    const ctx = this.root;
    if (this.failed) return true;
    if (!ctx.inVmContextCreated && this.fn.proxy_on_context_create) {
      this.callVoid(this.fn.proxy_on_context_create, 'proxy_on_context_create', ctx, ctx.id, 0);
      this.afterCall();
    }
    ctx.inVmContextCreated = true;
    if (!this.fn.proxy_on_configure) return true;
    ctx.tempPlugin = true;
    const ok = this.callWord(this.fn.proxy_on_configure, 'proxy_on_configure', ctx, ctx.id, this.host.pluginConfig.length) !== 0;
    ctx.tempPlugin = null;
    this.afterCall();
    return ok;
  }

  // Envoy wasm.cc Wasm::setTickPeriod: the first tick a period after the call; 0 stops it.
  setTickPeriod(rootId, period) {
    if (this.role === 'canary') {
      // The canary is killed after configure (cpp-host src/wasm.cc WasmHandleBase::canary).
      return;
    }
    if (period > 0) this.timers.set(rootId, { period, due: this.host.clock.nowMs() + period });
    else this.timers.delete(rootId);
  }

  // cpp-host 3930b7b src/context.cc ContextBase::onTick.
  onTick(ctx) {
    if (!this.failed && this.fn.proxy_on_tick) {
      this.callVoid(this.fn.proxy_on_tick, 'proxy_on_tick', ctx, ctx.id);
      this.afterCall();
    }
  }
  // cpp-host 3930b7b src/context.cc ContextBase::onQueueReady.
  onQueueReady(ctx, token) {
    if (!this.failed && this.fn.proxy_on_queue_ready) {
      this.callVoid(this.fn.proxy_on_queue_ready, 'proxy_on_queue_ready', ctx, ctx.id, token);
      this.afterCall();
    }
  }
  // cpp-host 3930b7b src/context.cc ContextBase::onHttpCallResponse, with Envoy context.cc
  // onHttpCallSuccess making the response readable only during the callback.
  onHttpCallResponse(root, token, resp) {
    root.httpCalls.delete(token);
    if (this.failed || !this.fn.proxy_on_http_call_response) return;
    root.httpCallResponse = resp;
    this.callVoid(this.fn.proxy_on_http_call_response, 'proxy_on_http_call_response', root, root.id, token, resp.headers.length, resp.body.length, resp.trailers.length);
    root.httpCallResponse = null;
    this.afterCall();
  }

  post(fn) { this.pending.push(fn); }

  continueStream(type) {
    const ctx = this.effectiveContext();
    if (!ctx.stream) return R.NotFound;
    ctx.stream.continueRequested(type);
    return R.Ok;
  }

  // Envoy context.cc getMap / getConstMap.
  mutableMap(type) {
    const ctx = this.effectiveContext();
    const s = ctx.stream;
    switch (type >>> 0) {
      case HeaderMap.RequestHeaders: return s?.reqHeaders ?? null;
      case HeaderMap.RequestTrailers: return s?.reqTrailers ?? null;
      case HeaderMap.ResponseHeaders: return s?.respHeaders ?? null;
      case HeaderMap.ResponseTrailers: return s?.respTrailers ?? null;
      default: return null;
    }
  }
  constMap(type) {
    const ctx = this.effectiveContext();
    const s = ctx.stream;
    switch (type >>> 0) {
      case HeaderMap.RequestHeaders: return s?.logPhase ? s.reqHeadersLog : s?.reqHeaders ?? null;
      case HeaderMap.RequestTrailers: return s?.reqTrailers ?? null;
      case HeaderMap.ResponseHeaders: return s?.logPhase ? s.respHeadersLog : s?.respHeaders ?? null;
      case HeaderMap.ResponseTrailers: return s?.respTrailers ?? null;
      case HeaderMap.HttpCallResponseHeaders: return ctx.root().httpCallResponse?.headers ?? null;
      case HeaderMap.HttpCallResponseTrailers: return ctx.root().httpCallResponse?.trailers ?? null;
      default: return null;
    }
  }
  // Envoy context.cc getBuffer. Returns { data, set? } or null.
  getBuffer(type) {
    const ctx = this.effectiveContext();
    const s = ctx.stream;
    switch (type) {
      case BufferType.HttpRequestBody:
        if (!s) return { data: Buffer.alloc(0) };
        return { data: s.reqBody ?? Buffer.alloc(0), set: s.reqBody ? (b) => { s.reqBody = b; } : null };
      case BufferType.HttpResponseBody:
        if (!s) return { data: Buffer.alloc(0) };
        return { data: s.respBody ?? Buffer.alloc(0), set: s.respBody ? (b) => { s.respBody = b; } : null };
      case BufferType.VmConfiguration:
        return { data: this.host.vmConfig };
      case BufferType.PluginConfiguration:
        // Envoy context.cc getBuffer: only while temp_plugin_ is set (proxy_on_configure,
        // and the root's on_context_create in cpp-host src/context.cc onStart).
        return ctx.tempPlugin ? { data: this.host.pluginConfig } : null;
      case BufferType.HttpCallResponseBody: {
        const resp = ctx.root().httpCallResponse;
        return resp ? { data: resp.body } : null;
      }
      case BufferType.CallData:
        return { data: Buffer.alloc(0) };
      default:
        return { data: Buffer.alloc(0) };
    }
  }
}

export class LoadError extends Error {
  constructor(message, state = FailState.UnableToInitializeCode) {
    super(message);
    this.state = state;
  }
}

// ---------------------------------------------------------------------------------------
// An HTTP stream through one VM: Envoy's wasm HTTP filter (Envoy context.cc decodeHeaders,
// decodeData, encodeHeaders, encodeData, onDestroy, log) over cpp-host's ContextBase
// callbacks (src/context.cc onRequestHeaders etc., with CHECK_FAIL_HTTP: on a failed VM the
// stream continues unfiltered when fail_open is set).

export class Stream {
  constructor(vm, props = {}) {
    this.vm = vm;
    this.host = vm.host;
    this.props = props; // request id, source address, ...
    this.properties = new Map();
    this.ctx = null;
    if (vm.root) {
      // cpp-host 3930b7b src/context.cc: a stream context's id comes from allocContextId
      // and its parent is the root context.
      this.ctx = new Context(vm, vm.allocContextId(), vm.root.id);
      this.ctx.stream = this;
      vm.contexts.set(this.ctx.id, this.ctx);
    }
    this.reqHeaders = null;
    this.reqTrailers = null;
    this.respHeaders = null;
    this.respTrailers = null;
    this.reqBody = null;
    this.respBody = null;
    this.bufferingRequest = false;
    this.bufferingResponse = false;
    this.forwardedRequestHeaders = null; // what went upstream
    this.requestHeld = false;
    this.failedOpen = false;
    this.upstreamAddress = null;
    this.logPhase = false;
    this.guestNs = 0n;
  }

  // cpp-host 3930b7b src/context.cc ContextBase::onCreate.
  onCreate() {
    const vm = this.vm, ctx = this.ctx;
    if (!vm.failed && !ctx.inVmContextCreated && vm.fn.proxy_on_context_create) {
      vm.callVoid(vm.fn.proxy_on_context_create, 'proxy_on_context_create', ctx, ctx.id, ctx.parentId);
      vm.afterCall();
    }
    ctx.inVmContextCreated = true;
  }

  timed(fn) {
    const t0 = process.hrtime.bigint();
    try {
      return fn();
    } finally {
      this.guestNs += process.hrtime.bigint() - t0;
    }
  }

  // cpp-host 3930b7b src/context.cc CHECK_FAIL with plugin fail_open: Continue.
  failOpen() {
    this.failedOpen = true;
    return 0;
  }

  // cpp-host 3930b7b src/context.cc convertVmCallResultToFilterHeadersStatus: stop-next-
  // iteration or an out-of-range value is StopAllIterationAndWatermark; StopIteration stays
  // StopIteration only with allow_on_headers_stop_iteration (Envoy >= 1.35, which kvroute needs).
  headersStatus(r) {
    if (this.vm.stopIteration || r > FilterHeadersStatus.StopAllIterationAndWatermark) return FilterHeadersStatus.StopAllIterationAndWatermark;
    if (r === FilterHeadersStatus.StopIteration && !this.host.allowHeadersStopIteration) return FilterHeadersStatus.StopAllIterationAndWatermark;
    return r;
  }
  // cpp-host 3930b7b src/context.cc convertVmCallResultToFilterDataStatus.
  dataStatus(r) {
    if (this.vm.stopIteration || r > FilterDataStatus.StopIterationNoBuffer) return FilterDataStatus.StopIterationNoBuffer;
    return r;
  }

  // Envoy context.cc decodeHeaders: onCreate, then onRequestHeaders with the map readable;
  // Continue sends the headers on and releases the map (request_headers_ = nullptr); a stop
  // holds them, still writable, until a body callback continues.
  requestHeaders(pairs, endStream) {
    return this.timed(() => {
      const vm = this.vm;
      if (!this.ctx || vm.failed) return this.forwardHeaders(pairs, this.failOpen());
      this.onCreate();
      this.reqHeaders = pairs.map(([k, v]) => [k.toLowerCase(), v]);
      if (vm.failed) return this.forwardHeaders(this.reqHeaders, this.failOpen());
      let status = FilterHeadersStatus.Continue;
      if (vm.fn.proxy_on_request_headers) {
        const args = vm.abi === '0_1_0' ? [this.ctx.id, this.reqHeaders.length] : [this.ctx.id, this.reqHeaders.length, endStream ? 1 : 0];
        const r = vm.callWord(vm.fn.proxy_on_request_headers, 'proxy_on_request_headers', this.ctx, ...args);
        const failed = vm.failed;
        status = failed ? this.failOpen() : this.headersStatus(r);
        vm.afterCall();
      }
      if (status === FilterHeadersStatus.Continue) return this.forwardHeaders(this.reqHeaders, status);
      this.requestHeld = true;
      return status;
    });
  }

  forwardHeaders(map, status) {
    this.forwardedRequestHeaders = map.map((p) => [...p]);
    this.reqHeadersLog = this.reqHeaders ?? this.forwardedRequestHeaders;
    this.reqHeaders = null;
    this.requestHeld = false;
    return status;
  }

  continueRequested(type) {
    if (type === StreamType.Request && this.requestHeld) {
      this.forwardedRequestHeaders = this.reqHeaders.map((p) => [...p]);
      this.requestHeld = false;
    }
  }

  // Envoy context.cc decodeData: while buffering, the new chunk joins the buffered body
  // before the callback, which sees the cumulative size; StopIterationAndBuffer keeps
  // buffering; Continue lets the request go on, with headers a headers callback held.
  requestBody(chunk, endStream) {
    return this.timed(() => {
      const vm = this.vm;
      if (!this.ctx || !this.ctx.inVmContextCreated) return FilterDataStatus.Continue;
      this.reqBody = this.bufferingRequest && this.reqBody ? Buffer.concat([this.reqBody, chunk]) : Buffer.from(chunk);
      let status = FilterDataStatus.Continue;
      if (vm.failed) {
        status = this.failOpen();
      } else if (vm.fn.proxy_on_request_body) {
        const r = vm.callWord(vm.fn.proxy_on_request_body, 'proxy_on_request_body', this.ctx, this.ctx.id, this.reqBody.length, endStream ? 1 : 0);
        const failed = vm.failed;
        status = failed ? this.failOpen() : this.dataStatus(r);
        vm.afterCall();
      }
      this.bufferingRequest = status === FilterDataStatus.StopIterationAndBuffer;
      if (status === FilterDataStatus.Continue) {
        this.reqBody = null;
        if (this.requestHeld) {
          this.forwardedRequestHeaders = this.reqHeaders.map((p) => [...p]);
          this.requestHeld = false;
        }
      }
      return status;
    });
  }

  // The upstream's address, as Envoy's upstream.address property gives it once a host
  // was picked (kvroute's override_host: the first address of the endpoint header).
  setUpstream(addr) { this.upstreamAddress = addr; }

  // Envoy context.cc encodeHeaders: no onCreate on the response path.
  responseHeaders(pairs, endStream) {
    return this.timed(() => {
      const vm = this.vm;
      this.respHeaders = pairs.map(([k, v]) => [k.toLowerCase(), v]);
      this.respHeadersLog = this.respHeaders;
      if (!this.ctx || !this.ctx.inVmContextCreated) return FilterHeadersStatus.Continue;
      if (vm.failed) return this.failOpen();
      let status = FilterHeadersStatus.Continue;
      if (vm.fn.proxy_on_response_headers) {
        const args = vm.abi === '0_1_0' ? [this.ctx.id, this.respHeaders.length] : [this.ctx.id, this.respHeaders.length, endStream ? 1 : 0];
        const r = vm.callWord(vm.fn.proxy_on_response_headers, 'proxy_on_response_headers', this.ctx, ...args);
        if (vm.failed) {
          vm.afterCall();
          this.respHeaders = null;
          return this.failOpen();
        }
        status = this.headersStatus(r);
        vm.afterCall();
      }
      if (status === FilterHeadersStatus.Continue) this.respHeaders = null;
      return status;
    });
  }

  // Envoy context.cc encodeData.
  responseBody(chunk, endStream) {
    return this.timed(() => {
      const vm = this.vm;
      if (!this.ctx || !this.ctx.inVmContextCreated) return FilterDataStatus.Continue;
      this.respBody = this.bufferingResponse && this.respBody ? Buffer.concat([this.respBody, chunk]) : Buffer.from(chunk);
      if (vm.failed) return this.failOpen();
      let status = FilterDataStatus.Continue;
      if (vm.fn.proxy_on_response_body) {
        const r = vm.callWord(vm.fn.proxy_on_response_body, 'proxy_on_response_body', this.ctx, this.ctx.id, this.respBody.length, endStream ? 1 : 0);
        if (vm.failed) {
          vm.afterCall();
          return this.failOpen();
        }
        status = this.dataStatus(r);
        vm.afterCall();
      }
      this.bufferingResponse = status === FilterDataStatus.StopIterationAndBuffer;
      if (status === FilterDataStatus.Continue) this.respBody = null;
      return status;
    });
  }

  // End of stream: proxy_on_done, proxy_on_log (maps readable again, as Envoy's access-log
  // phase makes them), proxy_on_delete. The order is cpp-host's ContextBase as Envoy
  // context.cc onCloseTCP drives it (onDone, onLog, onDelete); each is skipped on a failed VM
  // (cpp-host src/context.cc onDone / onLog / onDelete).
  end() {
    return this.timed(() => {
      const vm = this.vm, ctx = this.ctx;
      if (!ctx) return;
      if (ctx.inVmContextCreated) {
        if (!vm.failed && vm.fn.proxy_on_done) {
          vm.callWord(vm.fn.proxy_on_done, 'proxy_on_done', ctx, ctx.id);
          vm.afterCall();
        }
        this.logPhase = true;
        if (!vm.failed && vm.fn.proxy_on_log) {
          vm.callVoid(vm.fn.proxy_on_log, 'proxy_on_log', ctx, ctx.id);
          vm.afterCall();
        }
        this.logPhase = false;
        if (!vm.failed && vm.fn.proxy_on_delete) {
          vm.callVoid(vm.fn.proxy_on_delete, 'proxy_on_delete', ctx, ctx.id);
          vm.afterCall();
        }
      }
      vm.contexts.delete(ctx.id);
    });
  }
}

// ---------------------------------------------------------------------------------------
// The host: one compiled module, its VMs and the shared state of one Envoy.

export class Host {
  constructor(opts = {}) {
    this.clock = opts.clock ?? new WallClock();
    this.vmId = opts.vmId ?? '';
    this.rootId = opts.rootId ?? '';
    this.pluginName = opts.pluginName ?? 'kvroute';
    this.vmConfig = Buffer.from(opts.vmConfig ?? '');
    this.pluginConfig = Buffer.from(opts.pluginConfig ?? '');
    this.env = Object.entries(opts.env ?? {});
    this.node = opts.node ?? { id: 'sidecar~127.0.0.1~v8host.bench~bench.svc.cluster.local', cluster: 'v8host' };
    this.clusters = opts.clusters ?? {}; // name -> (request) => response
    this.allowHeadersStopIteration = opts.allowHeadersStopIteration ?? true;
    this.logLevel = LogLevel.info; // Envoy's default level (proxy_get_log_level)
    this.onLogLine = opts.onLog ?? null;
    this.sharedData = new SharedData();
    this.queues = new SharedQueues();
    this.stats = new Stats();
    this.vms = [];
    this.canary = opts.canary ?? true;
    this.failures = [];
    this.hostBugs = [];
    this.restrictedTraps = [];
    this.logCounts = { trace: 0, debug: 0, info: 0, warn: 0, error: 0, critical: 0 };
    this.counters = { procExit: 0, httpCalls: 0 };
    this.onFailHook = opts.onFail ?? null;
  }

  // cpp-host 3930b7b src/wasm.cc WasmBase::load: the ABI version comes from the
  // proxy_abi_version_* export (src/bytecode_util.cc), and a module without one fails.
  load(bytes) {
    this.info = inspectModule(bytes);
    const abis = ['0_1_0', '0_2_0', '0_2_1'].filter((v) => this.info.exports.includes(`proxy_abi_version_${v}`));
    if (abis.length === 0) throw new LoadError('Missing or unknown Proxy-Wasm ABI version');
    this.abi = abis[abis.length - 1];
    // cpp-host 3930b7b src/wasm.cc registerCallbacks: WASI under both wasi_unstable and
    // wasi_snapshot_preview1, the proxy-wasm functions and this ABI's extras under env.
    this.registry = new Map();
    for (const [name, spec] of WASI) {
      this.registry.set(`wasi_unstable.${name}`, spec);
      this.registry.set(`wasi_snapshot_preview1.${name}`, spec);
    }
    for (const [name, spec] of ENV) this.registry.set(`env.${name}`, spec);
    for (const [name, spec] of ENV_ABI[this.abi]) this.registry.set(`env.${name}`, spec);
    this.module = new WebAssembly.Module(bytes);
  }

  // What Envoy does when a plugin is configured (cpp-host 3930b7b src/wasm.cc createWasm,
  // WasmHandleBase::canary, getOrCreateThreadLocalPlugin): a base VM is initialized (no
  // plugin); a canary clone is initialized, started and configured and then killed; then
  // each worker gets its own clone, initialized, started and configured. Any failure there
  // fails the plugin (Envoy refuses the configuration).
  start(workers = 2) {
    const newVM = (role) => {
      const vm = new VM(this, role);
      vm.link();
      vm.getFunctions();
      vm.startVm();
      if (vm.failed) throw new LoadError(`${role} VM: Failed to initialize Wasm code: ${vm.failed.message}`);
      return vm;
    };
    newVM('base');
    if (this.canary) {
      const c = newVM('canary');
      if (!c.startPlugin()) throw new LoadError(`canary VM: Failed to start base Wasm${c.failed ? `: ${c.failed.message}` : ''}`, FailState.StartFailed);
      if (!c.configurePlugin()) throw new LoadError(`canary VM: Failed to configure base Wasm plugin${c.failed ? `: ${c.failed.message}` : ''}`, FailState.ConfigureFailed);
      // Killed: no ticks, queue callbacks go nowhere (its registration is overwritten by
      // the workers', cpp-host src/shared_queue.cc registerQueue).
      c.dead = true;
      c.failed ??= { state: 'Killed', message: 'canary killed after configure' };
    }
    for (let i = 0; i < workers; i++) {
      const vm = newVM('worker');
      vm.index = i;
      if (!vm.startPlugin()) throw new LoadError(`worker VM ${i}: Failed to start thread-local Wasm${vm.failed ? `: ${vm.failed.message}` : ''}`, FailState.StartFailed);
      if (!vm.configurePlugin()) throw new LoadError(`worker VM ${i}: Failed to configure thread-local Wasm plugin${vm.failed ? `: ${vm.failed.message}` : ''}`, FailState.ConfigureFailed);
      if (vm.failed) throw new LoadError(`worker VM ${i}: ${vm.failed.message}`, vm.failed.state);
      this.vms.push(vm);
    }
    return this.vms;
  }

  onFail(vm, state, message) {
    if (vm.role === 'canary' && state === 'Killed') return;
    const f = { vm: vm.index, role: vm.role, state, message };
    this.failures.push(f);
    this.onFailHook?.(f);
  }

  log(vm, level, message, fromHost) {
    const name = LOG_NAMES[level] ?? 'critical';
    this.logCounts[name]++;
    this.onLogLine?.({ vm: vm.index, role: vm.role, level, name, message, fromHost });
    return R.Ok;
  }

  newStream(vmIndex, props) { return new Stream(this.vms[vmIndex], props); }

  // Envoy context.cc httpCall: the cluster must exist and :path, :method and :authority
  // must be set (BadArgument otherwise); a negative timeout is BadArgument (the ABI word is
  // unsigned here). The token is per root context; the response is posted to the VM and
  // delivered by runDue after the calling callback returned (never inside it).
  httpCall(vm, root, cluster, headers, body, trailers, timeoutMs) {
    const handler = this.clusters[cluster];
    if (!handler) return { result: R.BadArgument };
    const h = new Map(headers.map(([k, v]) => [k.toLowerCase(), v]));
    if (!h.has(':path') || !h.has(':method') || !h.has(':authority')) return { result: R.BadArgument };
    let token = root.nextHttpCallToken++ >>> 0;
    while (token === 0 || root.httpCalls.has(token)) token = root.nextHttpCallToken++ >>> 0;
    this.counters.httpCalls++;
    const req = { cluster, headers, body, trailers, timeoutMs, vm: vm.index };
    root.httpCalls.set(token, req);
    const resp = handler(req);
    const latency = resp.latencyMs ?? 0;
    vm.pendingAt ??= [];
    vm.pendingAt.push({ due: this.clock.nowMs() + latency, run: () => vm.onHttpCallResponse(root, token, {
      headers: resp.headers, body: Buffer.from(resp.body ?? ''), trailers: resp.trailers ?? [],
    }) });
    return { result: R.Ok, token };
  }

  // Runs everything due at the clock's now, one callback at a time, in time order per VM:
  // posted work (queue-ready), http-call responses whose latency passed, and ticks (Envoy
  // wasm.cc tickHandler: onTick, then the timer is re-armed a period later).
  runDue() {
    let ran = 0;
    for (let progress = true; progress;) {
      progress = false;
      for (const vm of this.vms) {
        while (vm.pending.length) {
          vm.pending.shift()();
          ran++;
          progress = true;
        }
        const now = this.clock.nowMs();
        if (vm.pendingAt?.length) {
          const due = vm.pendingAt.filter((p) => p.due <= now);
          if (due.length) {
            vm.pendingAt = vm.pendingAt.filter((p) => p.due > now);
            for (const p of due) {
              p.run();
              ran++;
            }
            progress = true;
          }
        }
        for (const [rootId, t] of vm.timers) {
          if (t.due <= now) {
            const ctx = vm.contexts.get(rootId);
            if (ctx) vm.onTick(ctx);
            t.due = this.clock.nowMs() + t.period;
            ran++;
            progress = true;
          }
        }
      }
    }
    return ran;
  }

  // The earliest time anything is scheduled (for a virtual clock to jump to).
  nextDue() {
    let due = Infinity;
    for (const vm of this.vms) {
      if (vm.pending.length) return this.clock.nowMs();
      for (const p of vm.pendingAt ?? []) due = Math.min(due, p.due);
      for (const t of vm.timers.values()) due = Math.min(due, t.due);
    }
    return due;
  }

  // Envoy context.cc getProperty, for the properties a proxy like the benchmark's has.
  property(ctx, path) {
    const str = (s) => Buffer.from(String(s), 'latin1');
    const i64 = (n) => {
      const b = Buffer.alloc(8);
      b.writeBigInt64LE(BigInt(n));
      return b;
    };
    const s = ctx.stream;
    if (s?.properties.has(path)) return s.properties.get(path);
    switch (path) {
      case 'node.id': return str(this.node.id);
      case 'node.cluster': return str(this.node.cluster);
      case 'plugin_name': return str(this.pluginName);
      case 'plugin_root_id': return str(this.rootId);
      case 'plugin_vm_id': return str(this.vmId);
      default: break;
    }
    if (!s) return null;
    const hdr = (name) => {
      const m = s.reqHeaders ?? s.reqHeadersLog ?? s.forwardedRequestHeaders ?? [];
      const e = m.find(([k]) => k === name);
      return e ? e[1] : null;
    };
    switch (path) {
      case 'request.path': return hdr(':path') === null ? null : str(hdr(':path'));
      case 'request.url_path': return hdr(':path') === null ? null : str(hdr(':path').split('?')[0]);
      case 'request.host': return hdr(':authority') === null ? null : str(hdr(':authority'));
      case 'request.method': return hdr(':method') === null ? null : str(hdr(':method'));
      case 'request.scheme': return str('http');
      case 'request.protocol': return str('HTTP/1.1');
      case 'request.id': return s.props.requestId ? str(s.props.requestId) : null;
      case 'response.code': {
        const m = s.respHeadersLog ?? [];
        const e = m.find(([k]) => k === ':status');
        return e ? i64(Number(e[1])) : null;
      }
      case 'upstream.address': return s.upstreamAddress ? str(s.upstreamAddress) : null;
      case 'source.address': return str(s.props.sourceAddress ?? '127.0.0.1:40000');
      case 'destination.address': return str(s.props.destinationAddress ?? '127.0.0.1:10000');
      default: return null;
    }
  }
}
