package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Hash algorithm names accepted by [NewHasher] (the --prefix-caching-hash-algo flag).
const (
	// AlgoSimXXH64 is the simulator's own, fast chain: xxhash64 over
	// parent(8 B BE) | tokens(4 B LE each) | extra keys (length-prefixed strings).
	// It is private to the engine, as vLLM's algorithm is private to vLLM: consumers key
	// on token_ids, not on these hashes.
	AlgoSimXXH64 = "sim_xxh64"
	// AlgoSHA256CBOR is vLLM's sha256_cbor: sha256(canonical CBOR of
	// (parent digest, tokens, extra keys)), NONE_HASH = sha256(CBOR(seed string)), wire
	// hash = last 8 bytes big-endian. With the same seed as PYTHONHASHSEED it reproduces
	// a real vLLM's block hashes (tested against captured events). Much slower.
	AlgoSHA256CBOR = "sha256_cbor"
)

// Extra is what vLLM mixes into block hashes besides tokens: the LoRA adapter name in
// every block, the cache salt in block 0 only (vLLM generate_block_hash_extra_keys:
// [lora_name] + [cache_salt if start_token_idx == 0]).
type Extra struct {
	LoRA string
	Salt string
}

// Keys returns block i's extra keys as vLLM publishes them in BlockStored.extra_keys
// (nil = None).
func (x Extra) Keys(block int) []string {
	switch {
	case x.LoRA != "" && block == 0 && x.Salt != "":
		return []string{x.LoRA, x.Salt}
	case x.LoRA != "":
		return []string{x.LoRA}
	case block == 0 && x.Salt != "":
		return []string{x.Salt}
	}
	return nil
}

// IsZero reports whether no extra keys apply to any block.
func (x Extra) IsZero() bool { return x.LoRA == "" && x.Salt == "" }

// Hasher computes chained block hashes for one engine. It keeps scratch buffers, so
// one Hasher must not be used by two goroutines at once.
type Hasher struct {
	algo      string
	blockSize int
	none      [32]byte // NONE_HASH: the parent of block 0
	buf       []byte
}

// NewHasher returns a hasher for algo ([AlgoSimXXH64] or [AlgoSHA256CBOR]) seeded
// with seed (vLLM: the PYTHONHASHSEED string).
func NewHasher(algo, seed string, blockSize int) (*Hasher, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("block size %d: must be positive", blockSize)
	}
	h := &Hasher{algo: algo, blockSize: blockSize, buf: make([]byte, 0, 128+5*blockSize)}
	switch algo {
	case AlgoSimXXH64:
		binary.BigEndian.PutUint64(h.none[24:], xxhash.Sum64String("kvroute-enginesim:"+seed))
	case AlgoSHA256CBOR:
		h.none = sha256.Sum256(appendCBORText(nil, seed))
	default:
		return nil, fmt.Errorf("prefix caching hash algo %q: want %s or %s", algo, AlgoSimXXH64, AlgoSHA256CBOR)
	}
	return h, nil
}

// Algo returns the algorithm name.
func (h *Hasher) Algo() string { return h.algo }

// BlockSize returns the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Chain is the block-hash chain of one token sequence: the wire hash of every full
// block so far, and the digest of the last one (the parent of the next block).
// The zero Chain is empty; start one with [Hasher.Start].
type Chain struct {
	Hashes []uint64
	Extra  Extra
	last   [32]byte
}

// Start resets c to an empty chain with extra keys x, keeping c.Hashes' capacity.
func (h *Hasher) Start(c *Chain, x Extra) {
	c.Hashes = c.Hashes[:0]
	c.Extra = x
	c.last = h.none
}

// Clone returns a copy of c that shares nothing with it.
func (c *Chain) Clone(extraCap int) *Chain {
	d := &Chain{Extra: c.Extra, last: c.last}
	d.Hashes = append(make([]uint64, 0, len(c.Hashes)+extraCap), c.Hashes...)
	return d
}

// Extend hashes every full block of tokens (the whole sequence so far) that c has not
// hashed yet. tokens must extend the tokens c was built from.
func (h *Hasher) Extend(c *Chain, tokens []uint32) {
	bs := h.blockSize
	for i := len(c.Hashes); (i+1)*bs <= len(tokens); i++ {
		c.Hashes = append(c.Hashes, h.next(c, i, tokens[i*bs:(i+1)*bs]))
	}
}

// ExtendBlock hashes one more full block whose tokens are given (block index =
// len(c.Hashes)); used when a sequence's tokens are not contiguous in memory.
func (h *Hasher) ExtendBlock(c *Chain, block []uint32) uint64 {
	v := h.next(c, len(c.Hashes), block)
	c.Hashes = append(c.Hashes, v)
	return v
}

// NewChain returns the chain of tokens' full blocks.
func (h *Hasher) NewChain(tokens []uint32, x Extra) *Chain {
	c := &Chain{Hashes: make([]uint64, 0, len(tokens)/h.blockSize+1)}
	h.Start(c, x)
	h.Extend(c, tokens)
	return c
}

func (h *Hasher) next(c *Chain, index int, block []uint32) uint64 {
	if h.algo == AlgoSHA256CBOR {
		b := h.buf[:0]
		b = append(b, 0x83)
		b = appendCBORHead(b, 2, 32)
		b = append(b, c.last[:]...)
		b = appendCBORHead(b, 4, uint64(len(block)))
		for _, t := range block {
			b = appendCBORHead(b, 0, uint64(t))
		}
		if keys := c.Extra.Keys(index); keys == nil {
			b = append(b, 0xf6)
		} else {
			b = appendCBORHead(b, 4, uint64(len(keys)))
			for _, k := range keys {
				b = appendCBORText(b, k)
			}
		}
		h.buf = b
		c.last = sha256.Sum256(b)
		return binary.BigEndian.Uint64(c.last[24:])
	}
	b := append(h.buf[:0], c.last[24:]...)
	for _, t := range block {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	if c.Extra.LoRA != "" {
		b = append(b, 'L')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Extra.LoRA)))
		b = append(b, c.Extra.LoRA...)
	}
	if index == 0 && c.Extra.Salt != "" {
		b = append(b, 'S')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Extra.Salt)))
		b = append(b, c.Extra.Salt...)
	}
	h.buf = b
	v := xxhash.Sum64(b)
	binary.BigEndian.PutUint64(c.last[24:], v)
	return v
}

// appendCBORHead appends a CBOR item head (major type, argument) in canonical
// (shortest) form, as cbor2.dumps(canonical=True) writes it.
func appendCBORHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), n)
}

func appendCBORText(b []byte, s string) []byte {
	return append(appendCBORHead(b, 3, uint64(len(s))), s...)
}
