// ---------------------------------------------------------------------------------------
// Contexts (cpp-host 3930b7b include/proxy-wasm/context.h ContextBase, plus the Envoy
// Context state the ABI reads: header maps, body buffers, the http-call response).

export class Context {
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
