package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SGLang's layout (kv_events.py @612d5790, radix_cache.py @95769b28): a 3-element
// batch ending in attn_dp_rank, one 6-element BlockStored per page, chained by
// parent_block_hash, the first page's parent hash(()), each page's hash CPython's
// hash() of its token tuple, one 2-element BlockRemoved per page. Bytes written out by
// hand from the msgpack spec (negative int64 d3, non-negative above 2^32 cf, small
// ints a positive fixint, None c0); the hash values are CPython 3.11.7's:
// hash(()) = 5740354900026072187, hash((1, 2)) = -3550055125485641917,
// hash((3, 4)) = 1079245023883434373.
func TestSGLangEncodingBytes(t *testing.T) {
	const h1 = 0xDA7A5EED00000001
	b := Batch{TS: 1700000000.5, DataParallelRank: 1, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{h1, 5}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU,
			KVCacheSpecKind: SpecFullAttention},
		{Kind: BlockStored, BlockHashes: []uint64{5}, ParentBlockHash: h1, HasParent: true, TokenIDs: []uint32{3, 4},
			BlockSize: 2, Medium: MediumGPU}, // a second copy of a cached block: SGLang's tree has one
		{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: MediumGPU}, // one copy left: nothing
		{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	}}
	enc := NewEncoder(SGLang)
	require.NoError(t, enc.SetSGLangPageSize(2))
	got, err := enc.Encode(b)
	require.NoError(t, err)
	const (
		root = "cf4fa9d65e2cba1c7b"
		p12  = "d3cebbabac205f9f43"
		p34  = "cf0efa3fa1922e1985"
	)
	want := strings.Join([]string{
		"93", "cb41d954fc40200000", "94",
		"96", "ab" + hex.EncodeToString([]byte("BlockStored")), "91" + p12, root, "920102", "02", "c0",
		"96", "ab" + hex.EncodeToString([]byte("BlockStored")), "91" + p34, p12, "920304", "02", "c0",
		"92", "ac" + hex.EncodeToString([]byte("BlockRemoved")), "91" + p34,
		"91", "b0" + hex.EncodeToString([]byte("AllBlocksCleared")),
		"01",
	}, "")
	assert.Equal(t, want, hex.EncodeToString(got))
	enc2, err := ParseEncoding("sglang")
	require.NoError(t, err)
	assert.Equal(t, SGLang, enc2)

	// SGLang's default page size, 1: one event per token; a page size that does not
	// divide the block is refused.
	one := NewEncoder(SGLang)
	got, err = one.Encode(Batch{Events: b.Events[:1]})
	require.NoError(t, err)
	assert.Contains(t, hex.EncodeToString(got), "94"+"96"+"ab"+hex.EncodeToString([]byte("BlockStored")))
	bad := NewEncoder(SGLang)
	require.NoError(t, bad.SetSGLangPageSize(3))
	_, err = bad.Encode(Batch{Events: b.Events[:1]})
	assert.Error(t, err)
}

// PyTupleHash against CPython 3.11.7's hash() of tuples of ints.
func TestPyTupleHash(t *testing.T) {
	for _, c := range []struct {
		toks []uint32
		want int64
	}{
		{nil, 5740354900026072187},
		{[]uint32{1, 2, 3}, 529344067295497451},
		{[]uint32{5}, -7813438383599366905},
		{[]uint32{0}, -8753497827991233192},
		{[]uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 2828489712818767170},
		{[]uint32{4294967295, 4294967295, 4294967295}, -5918415710238688634},
	} {
		assert.Equal(t, c.want, PyTupleHash(c.toks), "%v", c.toks)
	}
	assert.Equal(t, PyEmptyTupleHash, PyTupleHash(nil))
}
