import { randomFillSync } from 'node:crypto';

import { LogLevel, RANDOM_GET_MAX_BYTES, WasmResult as R } from './enums.mjs';
import { I, L, S } from './module.mjs';

// ---------------------------------------------------------------------------------------
// WASI host functions, by name: [signature, implementation called with the VM as this].
// V8::link (src/v8/v8.cc) refuses an import that is missing or has another type.

export const WASI = new Map();

// --- WASI (cpp-host 3930b7b src/exports.cc; include/proxy-wasm/exports.h FOR_ALL_WASI_FUNCTIONS
// is the whole surface: anything else is a missing import).

// cpp-host 3930b7b src/exports.cc writevImpl / wasi_unstable_fd_write: stdout goes to the
// log at info, stderr at error (trailing newline dropped), any other fd is EBADF (8).
WASI.set('fd_write', [S([I, I, I, I], [I]), function (fd, iovs, iovsLen, nwrittenPtr) {
  let level;
  if (fd === 1) level = LogLevel.info;
  else if (fd === 2) level = LogLevel.error;
  else return 8; // __WASI_EBADF
  iovs >>>= 0;
  iovsLen >>>= 0;
  const parts = [];
  for (let i = 0; i < iovsLen; i++) {
    const iov = this.getMemory(iovs + i * 8, 8);
    if (!iov) return 21; // __WASI_EFAULT
    const buf = this.readU32(iovs + i * 8), len = this.readU32(iovs + i * 8 + 4);
    if (len !== 0) {
      const m = this.getMemory(buf, len);
      if (!m) return 21; // __WASI_EFAULT
      parts.push(Buffer.from(m));
    }
  }
  const s = Buffer.concat(parts);
  const written = s.length;
  if (written !== 0) {
    const text = s[written - 1] === 0x0a ? s.subarray(0, written - 1) : s;
    if (this.log(level, text.toString('latin1')) !== R.Ok) return 8; // __WASI_EBADF
  }
  if (!this.setWord(nwrittenPtr, written)) return 21; // __WASI_EFAULT
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_read: ENOSYS (52).
WASI.set('fd_read', [S([I, I, I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_seek: logs an error, returns success
// without writing the new offset.
WASI.set('fd_seek', [S([I, L, I, I], [I]), function () {
  this.error('wasi_unstable fd_seek');
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_close: logs an error, returns success.
WASI.set('fd_close', [S([I], [I]), function () {
  this.error('wasi_unstable fd_close');
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_fdstat_get: only fds 1 and 2; 24 bytes,
// fs_rights_base = FD_WRITE (64); the write is not checked.
WASI.set('fd_fdstat_get', [S([I, I], [I]), function (fd, statOut) {
  if (fd !== 1 && fd !== 2) return 8; // __WASI_EBADF
  const st = Buffer.alloc(24);
  st.writeBigUInt64LE(64n, 8);
  this.setMemory(statOut, st);
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_fdstat_set_flags: ENOSYS (52).
WASI.set('fd_fdstat_set_flags', [S([I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_environ_get / environ_sizes_get: the VM's
// environment (Envoy vm_config.environment_variables; Istio vmConfig.env).
WASI.set('environ_get', [S([I, I], [I]), function (arrayPtr, bufPtr) {
  arrayPtr >>>= 0;
  bufPtr >>>= 0;
  for (const [k, v] of this.host.env) {
    if (!this.setWord(arrayPtr, bufPtr)) return 21;
    const data = Buffer.from(`${k}=${v}\0`, 'latin1');
    if (!this.setMemory(bufPtr, data)) return 21;
    bufPtr += data.length;
    arrayPtr += 4;
  }
  return 0;
}]);
WASI.set('environ_sizes_get', [S([I, I], [I]), function (countPtr, sizePtr) {
  if (!this.setWord(countPtr, this.host.env.length)) return 21;
  let size = 0;
  for (const [k, v] of this.host.env) size += Buffer.byteLength(k, 'latin1') + Buffer.byteLength(v, 'latin1') + 2;
  if (!this.setWord(sizePtr, size)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_args_get: success, writes nothing.
WASI.set('args_get', [S([I, I], [I]), () => 0]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_args_sizes_get: no arguments.
WASI.set('args_sizes_get', [S([I, I], [I]), function (argcPtr, bufSizePtr) {
  if (!this.setWord(argcPtr, 0)) return 21;
  if (!this.setWord(bufSizePtr, 0)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_clock_time_get: realtime (0) and monotonic
// (1) only, else ENOTSUP (58); the precision is ignored.
WASI.set('clock_time_get', [S([I, L, I], [I]), function (id, _precision, resultPtr) {
  let t;
  if (id === 0) t = this.host.clock.realtimeNs();
  else if (id === 1) t = this.host.clock.monotonicNs();
  else return 58; // __WASI_ENOTSUP
  if (!this.setU64(resultPtr, t)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_random_get: at most 64 KiB (else EINVAL 28).
WASI.set('random_get', [S([I, I], [I]), function (ptr, len) {
  len >>>= 0;
  if (len > RANDOM_GET_MAX_BYTES) return 28; // __WASI_EINVAL
  if (len === 0) return 0;
  const b = Buffer.alloc(len);
  randomFillSync(b);
  if (!this.setMemory(ptr, b)) return 21;
  return 0;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_sched_yield: success.
WASI.set('sched_yield', [S([], [I]), () => 0]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_poll_oneoff: ENOSYS (52), always. Go's
// wasip1 runtime (netpoll_wasip1.go) throws "poll_oneoff failed" on it; this host does not
// paper over that.
WASI.set('poll_oneoff', [S([I, I, I, I], [I]), () => 52]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_proc_exit: logs an error and returns.
WASI.set('proc_exit', [S([I], []), function () {
  this.error('wasi_unstable proc_exit');
  this.host.counters.procExit++;
}]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_path_open: ENOENT (44).
WASI.set('path_open', [S([I, I, I, I, I, L, L, I, I], [I]), () => 44]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_prestat_get: EBADF (8), no preopens.
WASI.set('fd_prestat_get', [S([I, I], [I]), () => 8]);
// cpp-host 3930b7b src/exports.cc wasi_unstable_fd_prestat_dir_name: ENOSYS (52).
WASI.set('fd_prestat_dir_name', [S([I, I, I], [I]), () => 52]);
