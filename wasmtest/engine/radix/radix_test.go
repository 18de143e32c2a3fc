package radix

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// sglangMainHashes recomputes SGLang main's page hashes the way its Python does, from
// the hex digest: get_hash_str (sha256 of the prior digest's bytes, then each token
// as 4 little-endian bytes, hexdigest) and hash_str_to_int64 (int(hex[:16], 16), minus
// 2^64 at or above 2^63).
func sglangMainHashes(toks []uint32, pageSize int) []int64 {
	var out []int64
	prior := ""
	for i := 0; i+pageSize <= len(toks); i += pageSize {
		h := sha256.New()
		if prior != "" {
			b, _ := hex.DecodeString(prior)
			h.Write(b)
		}
		for _, t := range toks[i : i+pageSize] {
			h.Write(binary.LittleEndian.AppendUint32(nil, t))
		}
		prior = hex.EncodeToString(h.Sum(nil))
		u, _ := strconv.ParseUint(prior[:16], 16, 64)
		out = append(out, int64(u)) // the fold into [-2^63, 2^63) is Go's conversion
	}
	return out
}

func seq(lo, n uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = lo + uint32(i)
	}
	return out
}

func sims(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

func mainTree(t *testing.T, ps int) *Tree {
	tr, err := New(Options{PageSize: ps, Scheme: SchemeSHA256, Medium: kvevents.MediumGPU, RemovePerNode: true})
	require.NoError(t, err)
	return tr
}

func oldTree(t *testing.T, ps int) *Tree {
	tr, err := New(Options{PageSize: ps, Scheme: SchemeTuple, SplitEvents: true})
	require.NoError(t, err)
	return tr
}

func storedHashes(evs []kvevents.Event) []int64 {
	var out []int64
	for _, e := range evs {
		if e.Kind == kvevents.BlockStored {
			for _, h := range e.BlockHashes {
				out = append(out, int64(h))
			}
		}
	}
	return out
}

// At page size 1 every token of an inserted prompt is a page: 40 BlockStored, chained
// by parent_block_hash, the first naming no parent, hashes SGLang main's SHA-256 chain.
func TestMainPageSizeOnePublishesEveryToken(t *testing.T) {
	tr := mainTree(t, 1)
	toks := seq(1000, 40)
	require.NoError(t, tr.Insert(toks, sims(1, 40), ""))
	evs := tr.Take()
	require.Len(t, evs, 40)
	want := sglangMainHashes(toks, 1)
	assert.Equal(t, want, storedHashes(evs))
	assert.False(t, evs[0].HasParent, "the root's child names no parent (None)")
	for i, e := range evs {
		assert.Equal(t, kvevents.MediumGPU, e.Medium)
		assert.Equal(t, 1, e.BlockSize)
		assert.Equal(t, toks[i:i+1], e.TokenIDs)
		if i > 0 {
			assert.True(t, e.HasParent)
			assert.Equal(t, want[i-1], int64(e.ParentBlockHash))
		}
	}
}

// A prompt sharing a cached prefix publishes only its new pages, chained to the shared
// page's position-dependent hash; the split it causes publishes nothing at main.
func TestMainSharedPrefixPublishesOnlyNewPages(t *testing.T) {
	for _, ps := range []int{1, 16} {
		tr := mainTree(t, ps)
		a := seq(1, 64)
		require.NoError(t, tr.Insert(a, sims(100, 64/ps), ""))
		tr.Take()
		b := append(append([]uint32{}, a[:32]...), seq(5000, 32)...)
		require.NoError(t, tr.Insert(b, append(sims(100, 32/ps), sims(900, 32/ps)...), ""))
		evs := tr.Take()
		want := sglangMainHashes(b, ps)
		require.Len(t, evs, 32/ps, "page size %d", ps)
		assert.Equal(t, want[32/ps:], storedHashes(evs))
		assert.Equal(t, want[32/ps-1], int64(evs[0].ParentBlockHash))
		assert.Equal(t, 64/ps+32/ps, tr.Pages())
	}
}

// Eviction removes a whole node in one BlockRemoved listing its pages in order, and
// hands back the other pages' simulator hashes for the pool to drop.
func TestMainEvictionIsOneEventPerNode(t *testing.T) {
	tr := mainTree(t, 16)
	a := seq(1, 64)
	require.NoError(t, tr.Insert(a[:32], sims(100, 2), ""))
	require.NoError(t, tr.Insert(a, sims(100, 4), ""))
	tr.Take()
	drop := tr.Evicted(103) // the pool evicted the leaf's last page
	assert.ElementsMatch(t, []uint64{102}, drop)
	evs := tr.Take()
	want := sglangMainHashes(a, 16)
	require.Len(t, evs, 1)
	assert.Equal(t, kvevents.BlockRemoved, evs[0].Kind)
	assert.Equal(t, []uint64{uint64(want[2]), uint64(want[3])}, evs[0].BlockHashes)
	assert.Equal(t, kvevents.MediumGPU, evs[0].Medium)
	assert.Nil(t, tr.Evicted(103), "a page no longer held")

	// Evicting an inner node takes its subtree: leaves first, one event per node.
	require.NoError(t, tr.Insert(a, sims(100, 4), ""))
	tr.Take()
	drop = tr.Evicted(100)
	assert.ElementsMatch(t, []uint64{101, 102, 103}, drop)
	evs = tr.Take()
	require.Len(t, evs, 2)
	assert.Len(t, evs[0].BlockHashes, 2)
	assert.Equal(t, []uint64{uint64(want[0]), uint64(want[1])}, evs[1].BlockHashes)
	assert.Zero(t, tr.Pages())
}

// v0.4.7-v0.5.0rc0: hash(tuple(page)) per page, hash(()) under the root, no medium; a
// match ending inside a node splits it with BlockRemoved of the node and BlockStored of
// both halves; eviction removes a node's pages one event each, first to last.
func TestOldSchemeSplitsAndPerPageRemoval(t *testing.T) {
	tr := oldTree(t, 1)
	p := []uint32{7, 8, 9, 10}
	require.NoError(t, tr.Insert(p, sims(1, 4), ""))
	evs := tr.Take()
	require.Len(t, evs, 4)
	assert.Equal(t, kvevents.PyEmptyTupleHash, int64(evs[0].ParentBlockHash))
	assert.True(t, evs[0].HasParent)
	for i, e := range evs {
		assert.Equal(t, kvevents.PyTupleHash(p[i:i+1]), int64(e.BlockHashes[0]))
		assert.Empty(t, e.Medium)
	}

	// A repeat of p matches p[:-1]: the node splits after 3 pages.
	assert.Equal(t, 3, tr.Match(p[:3], ""))
	evs = tr.Take()
	var kinds []kvevents.Kind
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []kvevents.Kind{kvevents.BlockRemoved, kvevents.BlockRemoved, kvevents.BlockRemoved, kvevents.BlockRemoved,
		kvevents.BlockStored, kvevents.BlockStored, kvevents.BlockStored, kvevents.BlockStored}, kinds)
	assert.Equal(t, kvevents.PyEmptyTupleHash, int64(evs[4].ParentBlockHash), "the prefix hangs under the root")
	assert.Equal(t, kvevents.PyTupleHash(p[2:3]), int64(evs[7].ParentBlockHash), "the rest under the prefix's last page")

	// Evicting the prefix node removes its pages first to last, after its child's.
	tr.Evicted(1)
	evs = tr.Take()
	var removed []int64
	for _, e := range evs {
		require.Equal(t, kvevents.BlockRemoved, e.Kind)
		require.Len(t, e.BlockHashes, 1)
		removed = append(removed, int64(e.BlockHashes[0]))
	}
	assert.Equal(t, []int64{kvevents.PyTupleHash(p[3:4]), kvevents.PyTupleHash(p[0:1]), kvevents.PyTupleHash(p[1:2]), kvevents.PyTupleHash(p[2:3])}, removed)
}

// Namespaces (LoRA, cache salt) are separate branches, but their pages hash alike.
func TestExtraKeySeparatesBranchesNotHashes(t *testing.T) {
	tr := mainTree(t, 1)
	p := seq(1, 3)
	require.NoError(t, tr.Insert(p, sims(1, 3), ""))
	require.NoError(t, tr.Insert(p, sims(10, 3), "lora\x00"))
	evs := tr.Take()
	require.Len(t, evs, 6)
	assert.Equal(t, storedHashes(evs[:3]), storedHashes(evs[3:]))
	assert.Equal(t, 0, tr.Match(p, "other\x00"))
}

func TestResetAndOptions(t *testing.T) {
	tr := mainTree(t, 1)
	require.NoError(t, tr.Insert(seq(1, 2), sims(1, 2), ""))
	tr.Reset()
	evs := tr.Take()
	assert.Equal(t, kvevents.AllBlocksCleared, evs[len(evs)-1].Kind)
	assert.Zero(t, tr.Pages())
	assert.Error(t, tr.Insert(seq(1, 3), sims(1, 2), ""), "tokens and pages disagree")
	_, err := New(Options{PageSize: 0, Scheme: SchemeSHA256})
	assert.Error(t, err)
	_, err = New(Options{PageSize: 1})
	assert.Error(t, err)
}
