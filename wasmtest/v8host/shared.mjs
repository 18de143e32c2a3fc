import { MetricType, WasmResult as R } from './enums.mjs';

// ---------------------------------------------------------------------------------------
// Shared state of one Envoy: shared data (cpp-host 3930b7b src/shared_data.cc), shared queues
// (src/shared_queue.cc) and stats (Envoy's stats scope, shared by name).

export class SharedData {
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

export class SharedQueues {
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

export class Stats {
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
