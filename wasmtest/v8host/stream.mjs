import { Context } from './context.mjs';
import { FilterDataStatus, FilterHeadersStatus, StreamType } from './enums.mjs';

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
