package prefix

import (
	"encoding/binary"
	"math/bits"
)

// The chain's hash input is a block's parent key followed by the block. Hashing that
// input through xxhash.Sum64 means copying every block behind its parent first (in the
// wasm guest a runtime.memmove call per block, 500 a 32 KB prompt) and, for token
// blocks, writing each id out as bytes. linked and linkedTokens compute the same XXH64
// (seed 0) reading the parent and the block where they are. TestLinkedIsXXH64 checks
// them against github.com/cespare/xxhash on every length up to 300 bytes.
//
// XXH64 itself is Yann Collet's published algorithm (xxhash.com, doc/xxhash_spec.md):
// four accumulators over 32-byte stripes, then 8-, 4- and 1-byte tails, then an
// avalanche.

const (
	prime1 = 11400714785074694791
	prime2 = 14029467366897019727
	prime3 = 1609587929392839161
	prime4 = 9650029242287828579
	prime5 = 2870177450012600261
)

// The first and fourth accumulators' starting values for seed 0: prime1+prime2 and
// -prime1, modulo 2^64 (Go rejects constant expressions that wrap).
const (
	acc1 = (prime1 + prime2) - 1<<64
	acc4 = 1<<64 - prime1
)

func xxRound(acc, in uint64) uint64 {
	return bits.RotateLeft64(acc+in*prime2, 31) * prime1
}

func xxMerge(h, v uint64) uint64 {
	return (h^xxRound(0, v))*prime1 + prime4
}

// xxWord folds one 8-byte word of the tail into h.
func xxWord(h, w uint64) uint64 {
	return bits.RotateLeft64(h^xxRound(0, w), 27)*prime1 + prime4
}

// xxHalf folds one 4-byte word of the tail into h.
func xxHalf(h uint64, w uint32) uint64 {
	return bits.RotateLeft64(h^uint64(w)*prime1, 23)*prime2 + prime3
}

func xxAvalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// xxStart is the digest of the input's 32-byte stripes folded into one value, for an
// input of at least 32 bytes whose accumulators are v1..v4.
func xxStart(v1, v2, v3, v4 uint64) uint64 {
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = xxMerge(h, v1)
	h = xxMerge(h, v2)
	h = xxMerge(h, v3)
	return xxMerge(h, v4)
}

// linked is xxhash64(le64(parent) || b).
func linked(parent uint64, b []byte) uint64 {
	le := binary.LittleEndian
	var h uint64
	o := 0 // the next byte of b not yet hashed
	if len(b) >= 24 {
		// The first stripe is the parent and b[0:24].
		v1 := xxRound(acc1, parent)
		v2 := xxRound(prime2, le.Uint64(b))
		v3 := xxRound(0, le.Uint64(b[8:]))
		v4 := xxRound(acc4, le.Uint64(b[16:]))
		for o = 24; len(b)-o >= 32; o += 32 {
			s := b[o : o+32]
			v1 = xxRound(v1, le.Uint64(s))
			v2 = xxRound(v2, le.Uint64(s[8:]))
			v3 = xxRound(v3, le.Uint64(s[16:]))
			v4 = xxRound(v4, le.Uint64(s[24:]))
		}
		h = xxStart(v1, v2, v3, v4) + uint64(8+len(b))
	} else {
		h = xxWord(prime5+uint64(8+len(b)), parent)
	}
	for ; len(b)-o >= 8; o += 8 {
		h = xxWord(h, le.Uint64(b[o:]))
	}
	if len(b)-o >= 4 {
		h = xxHalf(h, le.Uint32(b[o:]))
		o += 4
	}
	for _, c := range b[o:] {
		h = bits.RotateLeft64(h^uint64(c)*prime5, 11) * prime1
	}
	return xxAvalanche(h)
}

// linked64 is linked for a 64-byte block (DefaultBlockBytes), as an array: its reads
// have constant offsets, so they carry no bounds checks, which in the wasm guest are a
// compare and a branch each.
func linked64(parent uint64, b *[64]byte) uint64 {
	le := binary.LittleEndian
	v1 := xxRound(acc1, parent)
	v2 := xxRound(prime2, le.Uint64(b[0:8]))
	v3 := xxRound(0, le.Uint64(b[8:16]))
	v4 := xxRound(acc4, le.Uint64(b[16:24]))
	v1 = xxRound(v1, le.Uint64(b[24:32]))
	v2 = xxRound(v2, le.Uint64(b[32:40]))
	v3 = xxRound(v3, le.Uint64(b[40:48]))
	v4 = xxRound(v4, le.Uint64(b[48:56]))
	h := xxStart(v1, v2, v3, v4) + 8 + 64
	return xxAvalanche(xxWord(h, le.Uint64(b[56:64])))
}

// linkedTokens16 is linkedTokens for 16 ids (DefaultBlockTokens), as linked64 is linked.
func linkedTokens16(parent uint64, t *[16]uint32) uint64 {
	pair := func(i int) uint64 { return uint64(t[i]) | uint64(t[i+1])<<32 }
	v1 := xxRound(acc1, parent)
	v2 := xxRound(prime2, pair(0))
	v3 := xxRound(0, pair(2))
	v4 := xxRound(acc4, pair(4))
	v1 = xxRound(v1, pair(6))
	v2 = xxRound(v2, pair(8))
	v3 = xxRound(v3, pair(10))
	v4 = xxRound(v4, pair(12))
	h := xxStart(v1, v2, v3, v4) + 8 + 4*16
	return xxAvalanche(xxWord(h, pair(14)))
}

// linkedTokens is xxhash64(le64(parent) || le32(t[0]) || le32(t[1]) || ...): two ids
// make one 8-byte word.
func linkedTokens(parent uint64, t []uint32) uint64 {
	pair := func(i int) uint64 { return uint64(t[i]) | uint64(t[i+1])<<32 }
	var h uint64
	i := 0 // the next id not yet hashed
	if len(t) >= 6 {
		v1 := xxRound(acc1, parent)
		v2 := xxRound(prime2, pair(0))
		v3 := xxRound(0, pair(2))
		v4 := xxRound(acc4, pair(4))
		for i = 6; len(t)-i >= 8; i += 8 {
			v1 = xxRound(v1, pair(i))
			v2 = xxRound(v2, pair(i+2))
			v3 = xxRound(v3, pair(i+4))
			v4 = xxRound(v4, pair(i+6))
		}
		h = xxStart(v1, v2, v3, v4) + uint64(8+4*len(t))
	} else {
		h = xxWord(prime5+uint64(8+4*len(t)), parent)
	}
	for ; len(t)-i >= 2; i += 2 {
		h = xxWord(h, pair(i))
	}
	if i < len(t) {
		h = xxHalf(h, t[i])
	}
	return xxAvalanche(h)
}
