// A proxy-wasm host for Node's V8, modelled on proxy-wasm-cpp-host at commit 3930b7b
// (3930b7b9a098d4ffc854e1fcf5fa07c9875e58c4, the last one before 94091cd "add all wasi
// hostcalls used by Go SDK"), which is what Envoy 1.36-1.38 (Istio 1.28-1.30) ship.
//
// It is written from cpp-host's C++ source, not from wasmtest/host (wazero), so that the two
// hosts can disagree. Every modelled behaviour carries a comment naming the cpp-host file it
// follows; "cpp-host" in these modules always means commit 3930b7b. A few behaviours live
// in Envoy, not in cpp-host (header maps, body buffers, properties, http calls, metrics,
// ticks): those comments name Envoy's source/extensions/common/wasm/context.cc or wasm.cc
// instead.
//
// One Host compiles one module and runs several VMs (WebAssembly.Instance objects of the
// same WebAssembly.Module), all sharing one shared-data store, one set of shared queues and
// one set of metrics, as one Envoy with one vm_id does. Nothing here is asynchronous: the
// caller (bench.mjs) advances a clock and calls runDue(), which delivers ticks, http-call
// responses and queue-ready callbacks one at a time, never inside another guest call.
//
// The host is split into ES modules, one idea each (doc.go lists them); this one holds the
// Host and exports the API bench.mjs uses.

import { WallClock } from './clock.mjs';
import { FailState, LOG_NAMES, LogLevel, WasmResult as R } from './enums.mjs';
import { ENV, ENV_ABI } from './hostcalls.mjs';
import { inspectModule } from './module.mjs';
import { SharedData, SharedQueues, Stats } from './shared.mjs';
import { Stream } from './stream.mjs';
import { LoadError, VM } from './vm.mjs';
import { WASI } from './wasi.mjs';

export { VirtualClock, WallClock } from './clock.mjs';
export { FailState, FilterDataStatus, FilterHeadersStatus, LogLevel, MAX_WASM_MEMORY_PAGES, WasmResult } from './enums.mjs';
export { inspectModule } from './module.mjs';
export { Stream } from './stream.mjs';
export { HostTrap, LoadError } from './vm.mjs';

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
