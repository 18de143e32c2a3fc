// ---------------------------------------------------------------------------------------
// Module inspection. WebAssembly.Module.imports() has no signatures in Node 20, but
// cpp-host checks them (src/v8/v8.cc V8::link "import type mismatch", getModuleFunctionImpl
// "Bad function signature"), so the type, import, function and export sections are read here.

const VALTYPES = { 0x7f: 'i32', 0x7e: 'i64', 0x7d: 'f32', 0x7c: 'f64', 0x7b: 'v128', 0x70: 'funcref', 0x6f: 'externref' };

export function inspectModule(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  if (u8.length < 8 || u8[0] !== 0 || u8[1] !== 0x61 || u8[2] !== 0x73 || u8[3] !== 0x6d) {
    throw new Error('not a wasm binary');
  }
  let p = 8;
  const uleb = () => {
    let r = 0, mul = 1, b;
    do {
      b = u8[p++];
      r += (b & 0x7f) * mul;
      mul *= 128;
    } while (b & 0x80);
    return r;
  };
  const name = () => {
    const n = uleb();
    const s = Buffer.from(u8.buffer, u8.byteOffset + p, n).toString('utf8');
    p += n;
    return s;
  };
  const limits = () => {
    const flags = u8[p++];
    const min = uleb();
    const max = flags & 1 ? uleb() : null;
    return { min, max };
  };
  const types = [], imports = [], funcTypes = [], exports = [];
  while (p < u8.length) {
    const id = u8[p++];
    const size = uleb();
    const end = p + size;
    if (id === 1) {
      for (let n = uleb(); n > 0; n--) {
        p++; // 0x60 func
        const params = [], results = [];
        for (let k = uleb(); k > 0; k--) params.push(VALTYPES[u8[p++]] ?? '?');
        for (let k = uleb(); k > 0; k--) results.push(VALTYPES[u8[p++]] ?? '?');
        types.push({ params, results });
      }
    } else if (id === 2) {
      for (let n = uleb(); n > 0; n--) {
        const module = name(), field = name();
        const kind = u8[p++];
        const imp = { module, name: field };
        if (kind === 0) {
          imp.kind = 'function';
          imp.type = types[uleb()];
        } else if (kind === 1) {
          imp.kind = 'table';
          p++;
          imp.limits = limits();
        } else if (kind === 2) {
          imp.kind = 'memory';
          imp.limits = limits();
        } else if (kind === 3) {
          imp.kind = 'global';
          p += 2;
        } else {
          imp.kind = 'tag';
          p++;
          uleb();
        }
        imports.push(imp);
      }
    } else if (id === 3) {
      for (let n = uleb(); n > 0; n--) funcTypes.push(types[uleb()]);
    } else if (id === 7) {
      for (let n = uleb(); n > 0; n--) {
        const field = name();
        const kind = u8[p++];
        exports.push({ name: field, kind, index: uleb() });
      }
    }
    p = end;
  }
  const importedFuncs = imports.filter((i) => i.kind === 'function');
  const exportSigs = new Map();
  for (const e of exports) {
    if (e.kind !== 0) continue;
    exportSigs.set(e.name, e.index < importedFuncs.length ? importedFuncs[e.index].type : funcTypes[e.index - importedFuncs.length]);
  }
  return { imports, exports: exports.map((e) => e.name), exportSigs };
}

export const sigString = (s) => `(${s.params.join(',')}) -> (${s.results.join(',')})`;
export const sameSig = (a, b) => sigString(a) === sigString(b);

// Signatures of host functions and of the module's exports, as cpp-host has them
// (src/exports.cc; Word is i32, int64_t/uint64_t are i64).
export const I = 'i32', L = 'i64';
export const S = (params, results) => ({ params, results });

// Exports cpp-host looks up, with the signatures it wants (cpp-host 3930b7b
// include/proxy-wasm/wasm.h WasmCallWord<N> = N i32 -> i32, WasmCallVoid<N> = N i32 -> ()).
export const W = (n) => S(Array(n).fill(I), [I]);
export const V = (n) => S(Array(n).fill(I), []);
