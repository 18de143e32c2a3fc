// The proxy-wasm enumerations and limits the host uses, as cpp-host 3930b7b has them.

// ---------------------------------------------------------------------------------------
// Enumerations (proxy-wasm-cpp-sdk proxy_wasm_common.h / proxy_wasm_enums.h, which cpp-host
// 3930b7b includes through bazel/repositories.bzl).

export const WasmResult = Object.freeze({
  Ok: 0, NotFound: 1, BadArgument: 2, SerializationFailure: 3, ParseFailure: 4,
  BadExpression: 5, InvalidMemoryAccess: 6, Empty: 7, CasMismatch: 8, ResultMismatch: 9,
  InternalFailure: 10, BrokenConnection: 11, Unimplemented: 12,
});

export const HeaderMap = Object.freeze({
  RequestHeaders: 0, RequestTrailers: 1, ResponseHeaders: 2, ResponseTrailers: 3,
  GrpcReceiveInitialMetadata: 4, GrpcReceiveTrailingMetadata: 5,
  HttpCallResponseHeaders: 6, HttpCallResponseTrailers: 7, MAX: 7,
});
export const BufferType = Object.freeze({
  HttpRequestBody: 0, HttpResponseBody: 1, NetworkDownstreamData: 2, NetworkUpstreamData: 3,
  HttpCallResponseBody: 4, GrpcReceiveBuffer: 5, VmConfiguration: 6, PluginConfiguration: 7,
  CallData: 8, MAX: 8,
});
export const StreamType = Object.freeze({ Request: 0, Response: 1, Downstream: 2, Upstream: 3, MAX: 3 });
export const MetricType = Object.freeze({ Counter: 0, Gauge: 1, Histogram: 2, Max: 2 });
export const LogLevel = Object.freeze({ trace: 0, debug: 1, info: 2, warn: 3, error: 4, critical: 5 });
export const LOG_NAMES = ['trace', 'debug', 'info', 'warn', 'error', 'critical'];

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
export const PAIRS_MAX_BYTES = 1024 * 1024;
export const PAIRS_MAX_COUNT = 1024;
export const RANDOM_GET_MAX_BYTES = 64 * 1024;
// cpp-host 3930b7b src/v8/v8.cc engine(): --wasm_max_mem_pages=PROXY_WASM_HOST_MAX_WASM_MEMORY_SIZE_BYTES/64KiB
export const MAX_WASM_MEMORY_PAGES = (1024 * 1024 * 1024) / (64 * 1024);
