// Package v8host runs kvroute.wasm on a second, independent proxy-wasm host: host.mjs and
// the ES modules it imports, a JavaScript host for Node's V8 (Envoy's default Wasm runtime), written from
// proxy-wasm-cpp-host's C++ source at commit 3930b7b, the cpp-host Envoy 1.36-1.38 (Istio
// 1.28-1.30) ship. It shares no code with wasmtest/host (wazero), so where the two hosts
// disagree, one of them is wrong about Envoy.
//
// What it keeps from cpp-host 3930b7b (each rule is cited where it is implemented):
//
//   - The WASI surface is exports.h FOR_ALL_WASI_FUNCTIONS, under both wasi_unstable and
//     wasi_snapshot_preview1, with cpp-host's answers: poll_oneoff is ENOSYS (52), fd_read
//     and fd_fdstat_set_flags ENOSYS, path_open ENOENT, fd_prestat_get EBADF, proc_exit
//     logs and returns, fd_write to stdout and stderr becomes log lines. Any other import,
//     or an import of another type, fails the load.
//   - _initialize runs with restricted callbacks (wasm.cc startVm); host calls made inside
//     proxy_on_memory_allocate other than proxy_log, fd_write and clock_time_get trap with
//     "restricted_callback" (wasm.h allocMemory, v8/v8.cc). Every copy into guest memory
//     goes through proxy_on_memory_allocate, as cpp-host's copyToPointerSize does.
//   - Start-up order (context.cc onStart/onConfigure): proxy_on_context_create(root, 0),
//     proxy_on_vm_start, proxy_on_configure; a base VM, then a canary VM that is started,
//     configured and killed, then the worker VMs (wasm.cc createWasm, canary,
//     getOrCreateThreadLocalPlugin).
//   - A trap fails the VM for good; its later streams pass unfiltered (fail open).
//
// Files, one idea each:
//
//   - host.mjs: the Host (load, the base/canary/worker start order, delivery of ticks,
//     http-call responses and queue callbacks, properties) and the API bench.mjs imports;
//   - vm.mjs: one VM (guest memory, calls into the guest and traps, linking, restricted
//     callbacks, start and configure, the maps and buffers the ABI reads);
//   - stream.mjs: an HTTP stream through a VM, as Envoy's wasm HTTP filter drives it;
//   - wasi.mjs, hostcalls.mjs: the WASI and the env (proxy-wasm ABI) host functions;
//   - shared.mjs: shared data, shared queues and stats; context.mjs: contexts;
//   - module.mjs: reading the module's imports, exports and signatures;
//   - enums.mjs: enumerations and limits; pairs.mjs: the pairs encoding; clock.mjs: wall
//     and virtual clocks.
//
// bench.mjs is the driver: `node wasmtest/v8host/bench.mjs --help`. The tests here build
// the filter, write a table with shared/table and run the driver:
//
//	go test ./wasmtest/v8host/                          # 20,000 requests
//	KVROUTE_V8_REQUESTS=100000 go test ./wasmtest/v8host/ -timeout 30m
//
// Without node the tests skip, unless KVROUTE_REQUIRE_NODE=1.
package v8host
