package prefix

import (
	"unsafe"

	"github.com/kvroute/kvroute/internal/byteprefix"
)

// Memo remembers the last few prompts a router hashed and their keys, so that a prompt
// sharing a prefix with one of them hashes only what follows the shared blocks: block
// i's key depends only on the seed and blocks 0..i, so where the bytes are equal (the
// memo compares the bytes themselves, never hashes of them) the keys are too. Shared
// system prompts and growing conversations, the traffic a prefix-cache router exists
// for, make the shared part most of a prompt; comparing it (internal/byteprefix) costs a
// fraction of hashing it in Go's wasm code as natively (BenchmarkMemoTextKeys32KB).
//
// The keys are exactly TextKeys' and TokenKeys' (TestMemoKeysAreTheChain, FuzzMemo). A
// memo holds at most memoEntries prompts of at most MemoMaxBytes each (the first
// MemoMaxBytes of a longer one), in buffers it reuses, and only keys of the same seed
// are ever reused, so one tenant's prompts never lend keys to another's. Not safe for
// concurrent use: each router has its own.
type Memo struct {
	entries [memoEntries]memoEntry
	tick    uint64
}

// memoEntries: a few distinct prefixes (system prompts, conversations) in flight at
// once per router; each costs a full compare of its first block on a miss.
const memoEntries = 4

// MemoMaxBytes bounds what one entry keeps: 128 KB of text (about 32,000 tokens) or
// 32,768 token ids. A longer prompt's later blocks are hashed every time.
const MemoMaxBytes = 128 << 10

type memoEntry struct {
	domain    Domain
	seed      uint64
	blockSize int    // in bytes or ids
	data      []byte // the prompt's complete blocks (token ids as their bytes in memory)
	keys      []uint64
	used      uint64 // Memo.tick when last used: the least recent entry is replaced
}

// TextKeys is TextKeys(dst, seed, text, blockBytes), reusing the keys of the longest
// prefix of complete blocks text shares with a remembered prompt, and remembering text.
func (m *Memo) TextKeys(dst []uint64, seed uint64, text []byte, blockBytes int) []uint64 {
	if blockBytes <= 0 {
		return dst
	}
	return m.keys(dst, Text, seed, text, blockBytes, func(dst []uint64, h uint64, from int) []uint64 {
		return TextKeys(dst, h, text[from*blockBytes:], blockBytes)
	})
}

// TokenKeys is TokenKeys(dst, seed, tokens, blockTokens), as TextKeys is for text.
func (m *Memo) TokenKeys(dst []uint64, seed uint64, tokens []uint32, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return dst
	}
	return m.keys(dst, Token, seed, tokenBytes(tokens), 4*blockTokens, func(dst []uint64, h uint64, from int) []uint64 {
		return TokenKeys(dst, h, tokens[from*blockTokens:], blockTokens)
	})
}

// keys appends the keys of data's blocks (bs bytes each): those of the blocks it shares
// with a remembered prompt copied, rest's for the others (from the block given, chained
// from h); then data is remembered.
func (m *Memo) keys(dst []uint64, d Domain, seed uint64, data []byte, bs int, rest func(dst []uint64, h uint64, from int) []uint64) []uint64 {
	e, n := m.best(d, seed, data, bs)
	base := len(dst)
	dst = append(dst, e.keys[:n]...)
	h := seed
	if n > 0 {
		h = dst[len(dst)-1]
	}
	dst = rest(dst, h, n)
	m.keep(e, n, d, seed, data, bs, dst[base:])
	return dst
}

// tokenBytes is the memory of tokens as bytes: only ever compared with other token
// ids' bytes, so the machine's byte order does not matter.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
}

// best returns the entry to reuse and how many leading blocks of data (bs bytes each)
// it holds; with none shared, the least recently used entry and 0.
func (m *Memo) best(d Domain, seed uint64, data []byte, bs int) (*memoEntry, int) {
	m.tick++
	var best, oldest *memoEntry
	n := 0
	for i := range m.entries {
		e := &m.entries[i]
		if oldest == nil || e.used < oldest.used {
			oldest = e
		}
		if e.domain != d || e.seed != seed || e.blockSize != bs {
			continue
		}
		if k := commonBlocks(e.data, data, bs); k > n {
			best, n = e, k
		}
	}
	if best == nil {
		return oldest, 0
	}
	return best, n
}

// keep makes e remember data and its keys, of which the first n blocks are e's already.
func (m *Memo) keep(e *memoEntry, n int, d Domain, seed uint64, data []byte, bs int, keys []uint64) {
	blocks := min(len(data)/bs, MemoMaxBytes/bs, len(keys))
	if n == 0 {
		e.domain, e.seed, e.blockSize = d, seed, bs
	}
	e.data = append(e.data[:n*bs], data[n*bs:blocks*bs]...)
	e.keys = append(e.keys[:n], keys[n:blocks]...)
	e.used = m.tick
}

// commonBlocks is how many leading blocks of bs bytes a and b share, whole.
func commonBlocks(a, b []byte, bs int) int {
	end := min(len(a), len(b)) / bs * bs
	return byteprefix.Len(a[:end], b[:end]) / bs
}
