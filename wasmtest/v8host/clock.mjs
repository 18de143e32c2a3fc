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
