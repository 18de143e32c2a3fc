import { BufferType, HeaderMap, LogLevel, MetricType, StreamType, WasmResult as R } from './enums.mjs';
import { I, L, S } from './module.mjs';
import { marshalPairs, toPairs } from './pairs.mjs';

// ---------------------------------------------------------------------------------------
// env host functions, by name: [signature, implementation called with the VM as this]:
// emscripten's helpers and proxy-wasm's ABI (ENV for every ABI version, ENV_ABI per
// version). V8::link (src/v8/v8.cc) refuses an import that is missing or has another type.

export const ENV = new Map();
export const ENV_ABI = { '0_1_0': new Map(), '0_2_0': new Map(), '0_2_1': new Map() };

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
