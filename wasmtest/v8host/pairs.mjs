import { PAIRS_MAX_BYTES, PAIRS_MAX_COUNT } from './enums.mjs';

// ---------------------------------------------------------------------------------------
// proxy-wasm pairs encoding: cpp-host 3930b7b src/pairs_util.cc (u32 count, then u32 name
// and value sizes per pair, then NUL-terminated names and values).

export function pairsSize(pairs) {
  let size = 4;
  for (const [k, v] of pairs) size += 8 + Buffer.byteLength(k, 'latin1') + 1 + Buffer.byteLength(v, 'latin1') + 1;
  return size;
}

export function marshalPairs(pairs) {
  const out = Buffer.alloc(pairsSize(pairs));
  out.writeUInt32LE(pairs.length, 0);
  let pos = 4;
  for (const [k, v] of pairs) {
    out.writeUInt32LE(Buffer.byteLength(k, 'latin1'), pos);
    out.writeUInt32LE(Buffer.byteLength(v, 'latin1'), pos + 4);
    pos += 8;
  }
  for (const [k, v] of pairs) {
    pos += out.write(k, pos, 'latin1');
    out[pos++] = 0;
    pos += out.write(v, pos, 'latin1');
    out[pos++] = 0;
  }
  return out;
}

// cpp-host 3930b7b src/pairs_util.cc PairsUtil::toPairs: any inconsistency gives no pairs.
export function toPairs(buf) {
  if (buf.length > PAIRS_MAX_BYTES || buf.length < 4) return [];
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.length);
  const n = b.readUInt32LE(0);
  if (n > PAIRS_MAX_COUNT || 4 + n * 8 > b.length) return [];
  const sizes = [];
  let pos = 4;
  for (let i = 0; i < n; i++, pos += 8) sizes.push([b.readUInt32LE(pos), b.readUInt32LE(pos + 4)]);
  const pairs = [];
  for (const [ks, vs] of sizes) {
    if (pos + ks + 1 > b.length) return [];
    const k = b.toString('latin1', pos, pos + ks);
    pos += ks;
    if (b[pos++] !== 0) return [];
    if (pos + vs + 1 > b.length) return [];
    const v = b.toString('latin1', pos, pos + vs);
    pos += vs;
    if (b[pos++] !== 0) return [];
    pairs.push([k, v]);
  }
  return pos === b.length ? pairs : [];
}
