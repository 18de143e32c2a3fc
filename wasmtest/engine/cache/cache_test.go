package cache

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const bs = 16

func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func hasher(t testing.TB) *Hasher {
	h, err := NewHasher(AlgoSimXXH64, "0", bs)
	require.NoError(t, err)
	return h
}

// store allocates blocks for tokens, commits the full ones and returns the table.
func store(t testing.TB, p *Pool, c *Chain, tokens []uint32) []int32 {
	n := (len(tokens) + bs - 1) / bs
	tbl, ok := p.Allocate(n, nil)
	require.True(t, ok)
	for i, h := range c.Hashes {
		p.Commit(tbl[i], h)
	}
	return tbl
}

func TestVLLMSHA256CBORHashesReproduced(t *testing.T) {
	// Real vLLM BlockStored events (sha256_cbor, PYTHONHASHSEED=42): the engine's
	// sha256_cbor chain must give exactly vLLM's wire hashes, with and without LoRA.
	for _, name := range []string{"blockstored_qwen3_base.json", "blockstored_qwen3_lora.json"} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "vllm", name))
			require.NoError(t, err)
			var capt struct {
				BlockHashes []uint64 `json:"block_hashes"`
				TokenIDs    []uint32 `json:"token_ids"`
				BlockSize   int      `json:"block_size"`
				LoraName    *string  `json:"lora_name"`
				HashSeed    string   `json:"hash_seed"`
			}
			require.NoError(t, json.Unmarshal(raw, &capt))
			h, err := NewHasher(AlgoSHA256CBOR, capt.HashSeed, capt.BlockSize)
			require.NoError(t, err)
			var x Extra
			if capt.LoraName != nil {
				x.LoRA = *capt.LoraName
			}
			c := h.NewChain(capt.TokenIDs, x)
			require.Len(t, capt.BlockHashes, 25)
			assert.Equal(t, capt.BlockHashes, c.Hashes)
		})
	}
}

func TestChainHashing(t *testing.T) {
	h := hasher(t)
	a := h.NewChain(seq(0, 100), Extra{})
	assert.Len(t, a.Hashes, 6, "only full blocks are hashed")
	b := h.NewChain(seq(0, 48), Extra{})
	assert.Equal(t, a.Hashes[:3], b.Hashes, "a shared prefix has the same chain")

	diverge := append(seq(0, 40), seq(1000, 60)...)
	c := h.NewChain(diverge, Extra{})
	assert.Equal(t, a.Hashes[:2], c.Hashes[:2])
	for i := 2; i < 6; i++ {
		assert.NotEqual(t, a.Hashes[i], c.Hashes[i], "block %d: chained after the first difference", i)
	}

	// Incremental extension equals hashing at once.
	inc := &Chain{}
	h.Start(inc, Extra{})
	h.Extend(inc, seq(0, 20))
	h.ExtendBlock(inc, seq(16, 16)[:16])
	assert.Equal(t, a.Hashes[:2], inc.Hashes)

	seed1, err := NewHasher(AlgoSimXXH64, "1", bs)
	require.NoError(t, err)
	assert.NotEqual(t, a.Hashes[0], seed1.NewChain(seq(0, 16), Extra{}).Hashes[0], "the seed changes NONE_HASH")

	_, err = NewHasher("md5", "", bs)
	assert.Error(t, err)
}

func TestSaltAndLoRANeverShare(t *testing.T) {
	for _, algo := range []string{AlgoSimXXH64, AlgoSHA256CBOR} {
		h, err := NewHasher(algo, "42", bs)
		require.NoError(t, err)
		toks := seq(7, 64)
		variants := []Extra{{}, {Salt: "tenant-a"}, {Salt: "tenant-b"}, {LoRA: "alice"}, {LoRA: "alice", Salt: "tenant-a"}}
		seen := map[uint64]int{}
		for vi, x := range variants {
			for _, hv := range h.NewChain(toks, x).Hashes {
				prev, dup := seen[hv]
				assert.False(t, dup, "%s: variant %d shares a block hash with variant %d", algo, vi, prev)
				seen[hv] = vi
			}
		}
	}
	x := Extra{LoRA: "l", Salt: "s"}
	assert.Equal(t, []string{"l", "s"}, x.Keys(0))
	assert.Equal(t, []string{"l"}, x.Keys(1))
	assert.Equal(t, []string{"s"}, Extra{Salt: "s"}.Keys(0))
	assert.Nil(t, Extra{Salt: "s"}.Keys(1), "the salt is in block 0 only")
}

func TestPoolSharedPrefixHits(t *testing.T) {
	h := hasher(t)
	p, err := NewPool(64)
	require.NoError(t, err)
	a := h.NewChain(seq(0, 80), Extra{})
	store(t, p, a, seq(0, 80))

	b := h.NewChain(append(seq(0, 48), seq(500, 40)...), Extra{})
	ids, _ := p.Match(b.Hashes, 100, nil)
	assert.Len(t, ids, 3, "three shared full blocks hit")
	assert.Equal(t, 3, p.CountHits(b.Hashes, 100))
	assert.Equal(t, 2, p.CountHits(b.Hashes, 2), "capped by max")

	salted := h.NewChain(seq(0, 80), Extra{Salt: "x"})
	assert.Zero(t, p.CountHits(salted.Hashes, 100), "a salted request never hits unsalted blocks")
}

func TestPoolLRUEvictsOldestUnreferenced(t *testing.T) {
	h := hasher(t)
	p, err := NewPool(9) // 8 usable blocks
	require.NoError(t, err)
	var removed []uint64
	p.OnRemove = func(hv uint64) { removed = append(removed, hv) }

	a := h.NewChain(seq(0, 64), Extra{})
	b := h.NewChain(seq(1000, 64), Extra{})
	ta := store(t, p, a, seq(0, 64))
	tb := store(t, p, b, seq(1000, 64))
	assert.Equal(t, 0, p.NumFree())
	assert.InDelta(t, 1.0, p.Usage(), 1e-9)
	p.Release(ta) // a freed first: least recently used
	p.Release(tb)
	assert.Equal(t, 8, p.NumFree())
	assert.Zero(t, p.Usage())
	assert.Equal(t, 8, p.NumCached(), "freed blocks stay cached")

	_, ok := p.Allocate(2, nil)
	require.True(t, ok)
	// a's tail goes first: a request frees its blocks last to first.
	assert.Equal(t, []uint64{a.Hashes[3], a.Hashes[2]}, removed)
	assert.Equal(t, 2, p.CountHits(a.Hashes, 4), "a's head survives")
	assert.Equal(t, 4, p.CountHits(b.Hashes, 4), "b, more recent, untouched")

	// A hit refreshes: b is touched and released again, so a's head is evicted next.
	ids, free := p.Match(b.Hashes, 4, nil)
	assert.Equal(t, 4, free)
	p.Pin(ids)
	p.Release(ids)
	removed = nil
	_, ok = p.Allocate(2, nil)
	require.True(t, ok)
	assert.Equal(t, []uint64{a.Hashes[1], a.Hashes[0]}, removed)
	assert.Equal(t, 4, p.CountHits(b.Hashes, 4))
}

func TestPoolPinnedBlocksSurvive(t *testing.T) {
	h := hasher(t)
	p, err := NewPool(9)
	require.NoError(t, err)
	a := h.NewChain(seq(0, 64), Extra{})
	ta := store(t, p, a, seq(0, 64)) // 4 blocks, pinned by a running request
	_, ok := p.Allocate(5, nil)
	assert.False(t, ok, "only 4 blocks are free")
	other, ok := p.Allocate(4, nil)
	require.True(t, ok)
	assert.Equal(t, 4, p.CountHits(a.Hashes, 4), "pinned blocks are never evicted")
	assert.False(t, p.Reset(), "reset_prefix_cache refuses while blocks are in use")
	p.Release(other)
	p.Release(ta)
	assert.True(t, p.Reset())
	assert.Zero(t, p.NumCached())
	assert.Equal(t, 8, p.NumFree())
}

// Two physical copies of one hash, as vLLM keeps them (block_pool.py @c59cb794):
// each is stored and each eviction is reported, the hash stays cached while a copy
// does, and lookups find the first copy. Before, the second Commit moved the hash
// and reported it as not new, and evicting the first copy reported nothing.
func TestPoolCommitDuplicateKeepsBothCopies(t *testing.T) {
	h := hasher(t)
	p, err := NewPool(9)
	require.NoError(t, err)
	var removed []uint64
	p.OnRemove = func(hv uint64) { removed = append(removed, hv) }
	c := h.NewChain(seq(0, 16), Extra{})
	t1, _ := p.Allocate(1, nil)
	t2, _ := p.Allocate(1, nil)
	assert.True(t, p.Commit(t1[0], c.Hashes[0]))
	assert.True(t, p.Commit(t2[0], c.Hashes[0]), "second physical copy: cached (and stored) too")
	assert.False(t, p.Commit(t2[0], c.Hashes[0]), "same block again: nothing new")
	assert.Equal(t, 2, p.Copies(c.Hashes[0]))
	assert.Equal(t, 1, p.NumCached(), "one hash")
	hit, _ := p.Match(c.Hashes, 1, nil)
	assert.Equal(t, t1, hit, "lookups find the copy cached first")
	p.Release(t1)
	p.Release(t2)
	// The free queue holds 6 empty blocks, then t1's copy, then t2's.
	_, ok := p.Allocate(7, nil)
	require.True(t, ok)
	assert.Equal(t, []uint64{c.Hashes[0]}, removed, "first copy evicted: BlockRemoved")
	assert.True(t, p.Cached(c.Hashes[0]), "the second copy is still cached")
	hit, _ = p.Match(c.Hashes, 1, nil)
	assert.Equal(t, t2, hit)
	_, ok = p.Allocate(1, nil)
	require.True(t, ok)
	assert.Equal(t, []uint64{c.Hashes[0], c.Hashes[0]}, removed, "a second BlockRemoved for the same hash")
	assert.False(t, p.Cached(c.Hashes[0]))
}

func TestNewPoolRejectsTinyPools(t *testing.T) {
	_, err := NewPool(1)
	assert.Error(t, err)
}

func BenchmarkPoolLookupPerBlock(b *testing.B) {
	h := hasher(b)
	p, _ := NewPool(34882)
	c := h.NewChain(seq(0, 8000), Extra{})
	tbl := store(b, p, c, seq(0, 8000))
	p.Release(tbl)
	ids := make([]int32, 0, 500)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / len(c.Hashes) {
		ids, _ = p.Match(c.Hashes, len(c.Hashes), ids[:0])
	}
}

func BenchmarkPoolInsertPerBlock(b *testing.B) {
	// Allocate (evicting an old hash), commit a new hash, release: a block's full cycle.
	h := hasher(b)
	p, _ := NewPool(34882)
	chains := make([]*Chain, 200)
	for i := range chains {
		chains[i] = h.NewChain(seq(i*8000, 8000), Extra{})
	}
	tbl := make([]int32, 0, 500)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += 500 {
		c := chains[(i/500)%len(chains)]
		tbl, _ = p.Allocate(500, tbl[:0])
		for j, id := range tbl {
			p.Commit(id, c.Hashes[j])
		}
		p.Release(tbl)
	}
}

func BenchmarkHashPerBlock(b *testing.B) {
	for _, algo := range []string{AlgoSimXXH64, AlgoSHA256CBOR} {
		b.Run(algo, func(b *testing.B) {
			h, _ := NewHasher(algo, "0", bs)
			toks := seq(0, 8000)
			c := &Chain{Hashes: make([]uint64, 0, 500)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 500 {
				h.Start(c, Extra{})
				h.Extend(c, toks)
			}
		})
	}
}
