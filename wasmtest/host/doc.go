// Package host runs a proxy-wasm plugin the way Envoy (proxy-wasm-cpp-host) does, on
// wazero, so kvroute's real .wasm can be tested and simulated without Envoy.
//
// A Host compiles the module once and starts N worker VMs, each a module instance with its
// root context: _initialize, proxy_on_context_create (root), proxy_on_vm_start and
// proxy_on_configure run at load, in that order (proxy-wasm-cpp-host src/wasm.cc startVm,
// src/context.cc onStart and onConfigure, at 3930b7b), and a false return or a trap fails
// New. A VM runs one callback at a time; VMs run in parallel. All VMs of a host share one
// shared-data store and one set of shared queues (one Envoy, one vm_id).
//
// # Host profiles
//
// Envoy embeds proxy-wasm-cpp-host, and what a plugin may call depends on the cpp-host
// commit each Envoy release pins. A Profile (profile.go) reproduces one range of commits;
// Config.Profile picks it and the default is the strictest, CppHostC4d7bb0 (Envoy 1.35 to
// 1.38). A profile fixes:
//
//   - the WASI surface (wasi.go): cpp-host's function list and signatures
//     (include/proxy-wasm/exports.h, FOR_ALL_WASI_FUNCTIONS) under both wasi_snapshot_preview1
//     and wasi_unstable, and cpp-host's answers (src/exports.cc): fd_write to stdout and
//     stderr is one info or error log entry per call, other descriptors EBADF; environ from
//     Config.Env; no arguments; realtime and monotonic clocks, others ENOTSUP; random_get
//     up to 64 KiB; proc_exit logs and returns; poll_oneoff ENOSYS until 94091cd, no
//     events and success from 94091cd on; files and sockets are stubs;
//   - restricted callbacks: while _initialize runs and while proxy_on_memory_allocate runs
//     only the host calls on the profile's lists are allowed (src/wasm.cc startVm,
//     include/proxy-wasm/wasm.h allocMemory); any other traps with "restricted_callback"
//     (src/v8/v8.cc), and a trap in proxy_on_memory_allocate fails the VM;
//   - imports: a function outside the surface fails New (V8's link fails the same way).
//
// # Envoy semantics kept
//
// Sources: proxy-wasm-cpp-host at 3930b7b (src/shared_data.cc, src/shared_queue.cc,
// src/context.cc, src/exports.cc) and Envoy's embedding of it
// (source/extensions/common/wasm/context.cc and wasm.cc, envoyproxy/envoy at b40935a).
//
//   - Shared data: cas 0 writes unconditionally, a stale cas is CasMismatch, a missing key
//     is NotFound on get and is written whatever the cas on set (cpp-host SharedData::set).
//   - Shared queues: registering a name again returns the same id and makes the caller's
//     root context the one that gets proxy_on_queue_ready (the last registration wins).
//     Enqueue schedules that callback through the clock, never inside the enqueuing call.
//   - Ticks: per root context per VM, first one a period after
//     proxy_set_tick_period_milliseconds, re-armed after each proxy_on_tick.
//   - proxy_http_call: the upstream is a cluster name (Config.Clusters, SetCluster) mapped to
//     a base URL or an in-process http.Handler; :method, :path and :authority are required
//     (BadArgument otherwise, as is an unknown cluster). The response goes to the calling
//     VM's root context after the calling callback returned. As Envoy's async client does,
//     a timeout arrives as a local 504 "upstream request timeout" and a refused connection
//     as a local 503 "upstream connect error ..."; only a stream broken after the response
//     headers arrives with zero headers (proxy_get_status: BrokenConnection).
//   - HTTP streams: headers, body and trailers maps per direction, released the way Envoy
//     releases them (a headers callback that continues nulls the header map;
//     proxy_continue_stream nulls them all; a body callback that continues keeps it).
//     ActionPause from a headers callback holds the headers and still delivers the body
//     (Envoy >= 1.35 with allow_on_headers_stop_iteration; set
//     Config.DisallowHeadersStopIteration for the older StopAllIteration behaviour).
//     ActionPause from a body callback buffers: the next callback gets the cumulative size
//     and proxy_get_buffer_bytes the whole buffer; set_buffer_bytes follows Envoy's
//     prepend/replace/append rules. Above StreamInfo.BufferLimit the request gets a local
//     413 (a response: 500, or a reset once its headers went out); once a body callback
//     has paused, the next chunk is added to the buffer before the filter sees it, so a
//     chunk that crosses the limit is answered 413 without a callback (Envoy's
//     Context::decodeData, FilterManager requestDataTooLarge).
//   - proxy_send_local_response and proxy_continue_stream act after the callback returns;
//     a local reply then goes through the filter's own response callbacks, as Envoy's
//     encoder chain does. A stream ends with proxy_on_log (maps readable), proxy_on_done,
//     proxy_on_delete.
//   - Metrics are shared by name across VMs; counters only take positive increments,
//     gauges add or subtract, a histogram cannot be read back (BadArgument), as in Envoy.
//   - A trap fails the VM for good (FAIL_OPEN): streams it holds continue unfiltered and so
//     do later streams on it; Stats counts both.
//   - An import the host does not provide, or no proxy_abi_version_* export, fails New.
//   - A VM's linear memory grows in place, as V8 grows it (memory_linux.go): a guest's
//     memory.grow costs a page-permission change, never a copy of the whole memory.
//
// # Time
//
// Config.Clock drives ticks, HTTP-call timeouts and latencies, queue-ready delivery and the
// guest's own clock (WASI clock_time_get, so time.Now in the plugin). With clock.Wall these
// run on their own goroutines. With a clock.Virtual nothing asynchronous happens until the
// caller advances the clock: Advance(d) runs due ticks, HTTP calls (an in-process handler
// at now+Cluster.Latency, a URL synchronously) and queue-ready callbacks one at a time in
// time order, so a run with host.SeededRand is repeatable.
//
// # Properties
//
// proxy_get_property answers: request.path, request.url_path, request.host,
// request.scheme, request.method, request.headers (map), request.headers.<name>,
// request.referer, request.useragent, request.id, request.protocol, request.query,
// request.time, request.size; response.code, response.headers (map),
// response.headers.<name>, response.trailers; source.address, source.port,
// destination.address, destination.port, connection.id,
// connection.uri_san_peer_certificate (StreamInfo.PeerURISAN; NotFound without one, as
// Envoy's ConnectionWrapper in source/extensions/filters/common/expr/context.cc);
// upstream.address, upstream.port (Stream.SetUpstreamAddress); plugin_name,
// plugin_root_id, plugin_vm_id; node.id, node.cluster, node.metadata, node.metadata.<key>
// (Envoy's Node proto navigated field by field, metadata a Struct: Context::findValue and
// getProperty in source/extensions/common/wasm/context.cc at 031fa2b); any key of
// Config.Properties (dotted path); and, per stream, whatever proxy_set_property stored. Strings are raw bytes,
// numbers 8-byte little-endian, maps proxy-wasm pairs. Header-derived values come from the
// latest headers of the stream, even after Envoy would have released the map.
//
// # Use from tests
//
// Host.Do runs one request through a VM without sockets and returns what left the filter
// both ways. Stream (with a Recorder's hooks) gives step-by-step control: send headers, body
// chunks and trailers, check what passed, advance a virtual clock, continue. SharedData,
// Metric and Logs read the host's state by name.
//
// An API on purpose: meant for reuse outside kvroute and kept compatible within a minor
// version (README, "What is an API").
package host
