import { Context } from './context.mjs';
import { BufferType, FailState, HeaderMap, LogLevel, MetricType, WasmResult as R } from './enums.mjs';
import { sameSig, sigString, V, W } from './module.mjs';

// ---------------------------------------------------------------------------------------
// One VM: cpp-host's WasmBase + V8 WasmVm for one module instance.

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

// Exports cpp-host looks up, with the signatures it wants (cpp-host 3930b7b
// include/proxy-wasm/wasm.h WasmCallWord<N> = N i32 -> i32, WasmCallVoid<N> = N i32 -> ()).
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

let vmSerial = 0;

export class VM {
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
