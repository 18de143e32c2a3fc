package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SGLang's layout, byte for byte: a 3-element batch ending in attn_dp_rank; without a
// medium (0.4.7-0.5.0rc0) a 6-element BlockStored and a 2-element BlockRemoved, with
// one (main, #18205) 7 and 3 elements, medium last. Bytes written out by hand from the
// msgpack spec (negative int64 d3, non-negative above 2^32 cf, small ints a positive
// fixint, None c0); the hashes are CPython 3.11.7's hash(()) = 5740354900026072187,
// hash((1, 2)) = -3550055125485641917, hash((3, 4)) = 1079245023883434373.
func TestSGLangEncodingBytes(t *testing.T) {
	const (
		root = "cf4fa9d65e2cba1c7b"
		p12  = "d3cebbabac205f9f43"
		p34  = "cf0efa3fa1922e1985"
	)
	stored := hex.EncodeToString([]byte("BlockStored"))
	removed := hex.EncodeToString([]byte("BlockRemoved"))
	for _, c := range []struct {
		name, medium, mediumHex string
	}{{"no medium", "", ""}, {"medium", MediumGPU, "a3" + hex.EncodeToString([]byte("GPU"))}} {
		b := Batch{TS: 1700000000.5, DataParallelRank: 1, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{uint64(PyTupleHash([]uint32{1, 2}))}, ParentBlockHash: uint64(PyEmptyTupleHash),
				HasParent: true, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: c.medium},
			{Kind: BlockStored, BlockHashes: []uint64{uint64(PyTupleHash([]uint32{3, 4}))}, ParentBlockHash: uint64(PyTupleHash([]uint32{1, 2})),
				HasParent: true, TokenIDs: []uint32{3, 4}, BlockSize: 2, Medium: c.medium},
			{Kind: BlockRemoved, BlockHashes: []uint64{uint64(PyTupleHash([]uint32{1, 2})), uint64(PyTupleHash([]uint32{3, 4}))}, Medium: c.medium},
			{Kind: AllBlocksCleared},
		}}
		got, err := NewEncoder(SGLang).Encode(b)
		require.NoError(t, err)
		n := "96"
		r := "92"
		if c.medium != "" {
			n, r = "97", "93"
		}
		want := strings.Join([]string{
			"93", "cb41d954fc40200000", "94",
			n, "ab" + stored, "91" + p12, root, "920102", "02", "c0", c.mediumHex,
			n, "ab" + stored, "91" + p34, p12, "920304", "02", "c0", c.mediumHex,
			r, "ac" + removed, "92" + p12 + p34, c.mediumHex,
			"91", "b0" + hex.EncodeToString([]byte("AllBlocksCleared")),
			"01",
		}, "")
		assert.Equal(t, want, hex.EncodeToString(got), c.name)
	}
	enc2, err := ParseEncoding("sglang")
	require.NoError(t, err)
	assert.Equal(t, SGLang, enc2)

	// A root child at main names no parent: nil.
	got, err := NewEncoder(SGLang).Encode(Batch{Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{9}, BlockSize: 1, Medium: MediumGPU}}})
	require.NoError(t, err)
	assert.Contains(t, hex.EncodeToString(got), "97"+"ab"+stored+"9105"+"c0"+"9109"+"01"+"c0")
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
