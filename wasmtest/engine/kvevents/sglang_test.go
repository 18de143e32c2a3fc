package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SGLang's layout (kv_events.py @612d5790, radix_cache.py @95769b28): a 3-element
// batch ending in attn_dp_rank, one 6-element BlockStored per page chained by
// parent_block_hash, one 2-element BlockRemoved per page, hashes as Python (signed)
// ints. Bytes written out by hand from the msgpack spec: negative int64 is d3, small
// non-negative ints a positive fixint, None c0.
func TestSGLangEncodingBytes(t *testing.T) {
	const h1 = 0xDA7A5EED00000001 // negative as int64
	b := Batch{TS: 1700000000.5, DataParallelRank: 1, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{h1, 5}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU,
			KVCacheSpecKind: SpecFullAttention},
		{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	}}
	got, err := NewEncoder(SGLang).Encode(b)
	require.NoError(t, err)
	want := strings.Join([]string{
		"93", "cb41d954fc40200000", "94",
		"96", "ab" + hex.EncodeToString([]byte("BlockStored")), "91d3da7a5eed00000001", "c0", "920102", "02", "c0",
		"96", "ab" + hex.EncodeToString([]byte("BlockStored")), "9105", "d3da7a5eed00000001", "920304", "02", "c0",
		"92", "ac" + hex.EncodeToString([]byte("BlockRemoved")), "9105",
		"91", "b0" + hex.EncodeToString([]byte("AllBlocksCleared")),
		"01",
	}, "")
	assert.Equal(t, want, hex.EncodeToString(got))
	enc, err := ParseEncoding("sglang")
	require.NoError(t, err)
	assert.Equal(t, SGLang, enc)
}
