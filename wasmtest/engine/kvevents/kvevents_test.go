package kvevents

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
)

// The encoder's bytes are read back with the control plane's decoder
// (controlplane/kvevents), the one production uses, so these tests check that
// production reads what the simulator writes; there is no second decoder here.

// golden turns docs/kv-events.md's notation (hex bytes and "quoted" strings, spaces
// ignored) into bytes: `ab"BlockStored"` = 0xab then the string's bytes.
func golden(t *testing.T, spec string) []byte {
	t.Helper()
	var out []byte
	var hexDigits strings.Builder
	for i := 0; i < len(spec); i++ {
		switch c := spec[i]; {
		case c == '"':
			j := strings.IndexByte(spec[i+1:], '"')
			require.GreaterOrEqual(t, j, 0)
			out = flushHex(t, out, &hexDigits)
			out = append(out, spec[i+1:i+1+j]...)
			i += j + 1
		case c == ' ' || c == '\n' || c == '\t':
		default:
			hexDigits.WriteByte(c)
			if hexDigits.Len() == 2 {
				out = flushHex(t, out, &hexDigits)
			}
		}
	}
	return flushHex(t, out, &hexDigits)
}

func flushHex(t *testing.T, out []byte, s *strings.Builder) []byte {
	if s.Len() == 0 {
		return out
	}
	b, err := hex.DecodeString(s.String())
	require.NoError(t, err, s.String())
	s.Reset()
	return append(out, b...)
}

// The example of docs/kv-events.md, "The msgpack encoding": ts=1700000000.5,
// hash=0xDA7A5EED00000001, tokens=[1,2], block_size=2, first block of its request, no
// LoRA, medium GPU, group 0.
func goldenStored() Event {
	return Event{Kind: BlockStored, BlockHashes: []uint64{0xDA7A5EED00000001}, TokenIDs: []uint32{1, 2},
		BlockSize: 2, Medium: MediumGPU, KVCacheSpecKind: SpecFullAttention}
}

const (
	ts   = "cb41d954fc40200000"
	hash = "cfda7a5eed00000001"
)

// decode reads payload with the production decoder.
func decode(t *testing.T, payload []byte) *cpkv.Batch {
	t.Helper()
	b, err := cpkv.Decode(payload)
	require.NoError(t, err)
	return b
}

func TestGoldenBytes(t *testing.T) {
	removed := Event{Kind: BlockRemoved, BlockHashes: []uint64{0xDA7A5EED00000001}, Medium: MediumGPU}
	cleared := Event{Kind: AllBlocksCleared}
	cases := []struct {
		name   string
		enc    Encoding
		ev     Event
		want   string // docs/kv-events.md's example bytes, verbatim, elisions filled in
		kind   cpkv.Kind
		medium string // what production reads: v0.9 has no medium
	}{
		{"v0.9.0 batch", ArrayV09, goldenStored(),
			`92 ` + ts + ` 91 96 ab"BlockStored" 91 ` + hash + ` c0 92 01 02 02 c0`, cpkv.BlockStored, ""},
		{"v0.10.x batch", ArrayV010, goldenStored(),
			`93 ` + ts + ` 91 97 ab"BlockStored" 91 ` + hash + ` c0 920102 02 c0 a3"GPU" 00`, cpkv.BlockStored, "GPU"},
		{"array + groups", Array, goldenStored(),
			`93 ` + ts + ` 91 9c ab"BlockStored" 91 ` + hash + ` c0 920102 02 c0 a3"GPU" c0 91c0 00 ae"full_attention" c0 00`, cpkv.BlockStored, "GPU"},
		{"map", Map, goldenStored(),
			`93 ` + ts + ` 91 8b a4"type" ab"BlockStored" ac"block_hashes" 91 ` + hash + ` b1"parent_block_hash" c0 a9"token_ids" 920102
			 aa"block_size" 02 a7"lora_id" c0 a6"medium" a3"GPU" a9"lora_name" c0 aa"extra_keys" 91c0 a9"group_idx" 00
			 b2"kv_cache_spec_kind" ae"full_attention" 00`, cpkv.BlockStored, "GPU"},
		{"BlockRemoved array", Array, removed, `93 ` + ts + ` 91 94 ac"BlockRemoved" 91 ` + hash + ` a3"GPU" 00 00`, cpkv.BlockRemoved, "GPU"},
		{"BlockRemoved map", Map, removed,
			`93 ` + ts + ` 91 84 a4"type" ac"BlockRemoved" ac"block_hashes" 91 ` + hash + ` a6"medium" a3"GPU" a9"group_idx" 00 00`, cpkv.BlockRemoved, "GPU"},
		{"BlockRemoved v0.10", ArrayV010, removed, `93 ` + ts + ` 91 93 ac"BlockRemoved" 91 ` + hash + ` a3"GPU" 00`, cpkv.BlockRemoved, "GPU"},
		{"BlockRemoved v0.9", ArrayV09, removed, `92 ` + ts + ` 91 92 ac"BlockRemoved" 91 ` + hash, cpkv.BlockRemoved, ""},
		{"AllBlocksCleared array", Array, cleared, `93 ` + ts + ` 91 91 b0"AllBlocksCleared" 00`, cpkv.AllBlocksCleared, ""},
		{"AllBlocksCleared map", Map, cleared, `93 ` + ts + ` 91 81 a4"type" b0"AllBlocksCleared" 00`, cpkv.AllBlocksCleared, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := NewEncoder(c.enc).Encode(Batch{TS: 1700000000.5, Events: []Event{c.ev}})
			require.NoError(t, err)
			assert.Equal(t, hex.EncodeToString(golden(t, c.want)), hex.EncodeToString(got))

			back := decode(t, got)
			assert.Equal(t, 1700000000.5, back.TS)
			assert.Equal(t, c.enc != ArrayV09, back.HasDPRank, "v0.9 batches have no data_parallel_rank")
			require.Len(t, back.Events, 1)
			e := back.Events[0]
			assert.Equal(t, c.kind, e.Kind)
			assert.Equal(t, c.ev.Kind.String(), e.Tag)
			if len(c.ev.BlockHashes) > 0 {
				assert.Equal(t, c.ev.BlockHashes, e.Hashes)
			} else {
				assert.Empty(t, e.Hashes)
			}
			assert.Equal(t, c.medium, e.Medium)
		})
	}
}

func TestEncodeOptionalFields(t *testing.T) {
	ev := goldenStored()
	ev.HasParent, ev.ParentBlockHash = true, 5
	ev.LoraID, ev.LoraName = 1, "alice"
	ev.ExtraKeys = [][]string{{"alice", "salt"}}
	ev.SlidingWindow = 4096
	got, err := NewEncoder(Map).Encode(Batch{TS: 1700000000.5, Events: []Event{ev}, DataParallelRank: 3})
	require.NoError(t, err)
	want := golden(t, `93 `+ts+` 91 8c a4"type" ab"BlockStored" ac"block_hashes" 91 `+hash+` b1"parent_block_hash" 05 a9"token_ids" 920102
		aa"block_size" 02 a7"lora_id" 01 a6"medium" a3"GPU" a9"lora_name" a5"alice" aa"extra_keys" 91 92 a5"alice" a4"salt"
		a9"group_idx" 00 b2"kv_cache_spec_kind" ae"full_attention" bc"kv_cache_spec_sliding_window" cd1000 03`)
	assert.Equal(t, hex.EncodeToString(want), hex.EncodeToString(got))

	back := decode(t, got)
	assert.Equal(t, 3, back.DPRank)
	assert.True(t, back.HasDPRank)
	require.Len(t, back.Events, 1)
	e := back.Events[0]
	assert.Equal(t, cpkv.BlockStored, e.Kind)
	assert.Equal(t, []uint64{0xDA7A5EED00000001}, e.Hashes)
	assert.Equal(t, uint64(5), e.Parent)
	assert.True(t, e.HasParent)
	assert.Equal(t, []uint32{1, 2}, e.Tokens)
	assert.Equal(t, 2, e.BlockSize)
	assert.Equal(t, int64(1), e.LoraID)
	assert.True(t, e.HasLoraID)
	assert.Equal(t, "alice", e.LoraName)
	assert.Equal(t, []string{"alice", "salt"}, e.FirstExtra)
	assert.Equal(t, "salt", e.CacheSalt())
	assert.Equal(t, MediumGPU, e.Medium)
	assert.Zero(t, e.GroupIdx)
	assert.Equal(t, SpecFullAttention, e.SpecKind)
	// kv_cache_spec_sliding_window is on the wire (bytes above) but production does
	// not read it: nothing routes on it.
}

// richBatch has every field the encoder writes set to something other than its
// default: a stored event continuing a chain, with a LoRA adapter, the cache salt in
// the first block's extra keys, on CPU in KV cache group 1; a removed one in group 1;
// and a clear.
func richBatch() Batch {
	return Batch{TS: 1789095808.8378847, DataParallelRank: 2, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0xfedcba9876543210, 7}, ParentBlockHash: 0x8000000000000001, HasParent: true,
			TokenIDs: []uint32{1, 2, 70000, 4294967295}, BlockSize: 2, LoraID: 3, LoraName: "alice",
			ExtraKeys: [][]string{{"alice", "tenant-salt"}, {"alice"}}, Medium: MediumCPU, GroupIdx: 1,
			KVCacheSpecKind: "sliding_window", SlidingWindow: 128},
		{Kind: BlockRemoved, BlockHashes: []uint64{7}, Medium: MediumCPU, GroupIdx: 1},
		{Kind: AllBlocksCleared},
	}}
}

// Every encoding, read by production, gives back every field its vLLM release carries
// and the zero value of every field it does not.
func TestEveryEncodingReadsBack(t *testing.T) {
	in := richBatch()
	for _, enc := range Encodings {
		t.Run(string(enc), func(t *testing.T) {
			p, err := NewEncoder(enc).Encode(in)
			require.NoError(t, err)
			back := decode(t, p)
			assert.Equal(t, in.TS, back.TS)
			assertRank(t, enc, in.DataParallelRank, back)
			require.Len(t, back.Events, len(in.Events))
			for i := range in.Events {
				assertReadBack(t, enc, &in.Events[i], &back.Events[i])
			}
		})
	}
}

func assertRank(t *testing.T, enc Encoding, rank int, b *cpkv.Batch) {
	t.Helper()
	if enc == ArrayV09 {
		assert.False(t, b.HasDPRank, "v0.9 batches have no data_parallel_rank")
		return
	}
	assert.True(t, b.HasDPRank)
	assert.Equal(t, rank, b.DPRank)
}

// assertReadBack checks what production decoded (got) against the event the simulator
// encoded (in), field by field, knowing which fields enc's layout has.
func assertReadBack(t *testing.T, enc Encoding, in *Event, got *cpkv.Event) {
	t.Helper()
	assert.Equal(t, in.Kind.String(), got.Tag)
	full := enc == Map || enc == Array // lora_name, extra_keys, group_idx, spec kind
	switch in.Kind {
	case BlockStored:
		assert.Equal(t, cpkv.BlockStored, got.Kind)
		assert.Equal(t, in.BlockHashes, got.Hashes)
		assert.Equal(t, in.HasParent, got.HasParent)
		assert.Equal(t, in.ParentBlockHash, got.Parent)
		assert.Equal(t, in.TokenIDs, got.Tokens)
		assert.Equal(t, in.BlockSize, got.BlockSize)
		assert.Equal(t, in.LoraID != 0, got.HasLoraID)
		assert.Equal(t, int64(in.LoraID), got.LoraID)
		if full {
			assert.Equal(t, in.LoraName, got.LoraName)
			assert.Equal(t, in.KVCacheSpecKind, got.SpecKind)
			if len(in.ExtraKeys) > 0 && len(in.ExtraKeys[0]) > 0 {
				assert.Equal(t, in.ExtraKeys[0], got.FirstExtra)
			} else {
				assert.Empty(t, got.FirstExtra)
			}
		} else {
			assert.Empty(t, got.LoraName)
			assert.Empty(t, got.SpecKind)
			assert.Empty(t, got.FirstExtra)
		}
	case BlockRemoved:
		assert.Equal(t, cpkv.BlockRemoved, got.Kind)
		assert.Equal(t, in.BlockHashes, got.Hashes)
	default:
		assert.Equal(t, cpkv.AllBlocksCleared, got.Kind)
		assert.Empty(t, got.Hashes)
		return
	}
	if enc == ArrayV09 {
		assert.Empty(t, got.Medium, "v0.9 has no medium")
	} else {
		assert.Equal(t, in.Medium, got.Medium)
	}
	if full {
		assert.Equal(t, in.GroupIdx, got.GroupIdx)
	} else {
		assert.Zero(t, got.GroupIdx, "before KV cache groups")
	}
}

func TestParseEncoding(t *testing.T) {
	for _, e := range Encodings {
		got, err := ParseEncoding(string(e))
		require.NoError(t, err)
		assert.Equal(t, e, got)
	}
	_, err := ParseEncoding("json")
	assert.Error(t, err)
}

// FuzzEncodeProductionDecode: whatever stored event the simulator may write, in any
// encoding, production reads back its hashes, parent, tokens, block size, LoRA, salt,
// medium and group. (Production's decoder of arbitrary bytes is fuzzed in
// controlplane/kvevents, FuzzDecode and FuzzDecoderMatchesReference.)
func FuzzEncodeProductionDecode(f *testing.F) {
	f.Add(uint64(0xDA7A5EED00000001), uint64(0), false, []byte{1, 2}, uint8(2), uint16(0), "", "", "GPU", uint8(0))
	f.Add(^uint64(0), uint64(1)<<63, true, []byte{0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0}, uint8(1), uint16(7), "alice", "salt", "CPU", uint8(3))
	f.Fuzz(func(t *testing.T, h, parent uint64, hasParent bool, raw []byte, bs uint8, lora uint16, loraName, salt, medium string, group uint8) {
		if bs == 0 {
			return
		}
		// Tokens: 4 bytes each; as many whole blocks as raw holds, at least one.
		toks := make([]uint32, len(raw)/4)
		for i := range toks {
			toks[i] = uint32(raw[4*i])<<24 | uint32(raw[4*i+1])<<16 | uint32(raw[4*i+2])<<8 | uint32(raw[4*i+3])
		}
		n := len(toks) / int(bs)
		if n == 0 {
			return
		}
		toks = toks[:n*int(bs)]
		ev := Event{Kind: BlockStored, TokenIDs: toks, BlockSize: int(bs), HasParent: hasParent, LoraID: int(lora),
			LoraName: loraName, Medium: medium, GroupIdx: int(group), KVCacheSpecKind: SpecFullAttention}
		if hasParent {
			ev.ParentBlockHash = parent
		}
		for i := range n {
			ev.BlockHashes = append(ev.BlockHashes, h+uint64(i))
		}
		var first []string
		if loraName != "" {
			first = append(first, loraName)
		}
		if salt != "" {
			first = append(first, salt)
		}
		if first != nil {
			ev.ExtraKeys = make([][]string, n)
			ev.ExtraKeys[0] = first
		}
		in := Batch{TS: 1, Events: []Event{ev}, DataParallelRank: int(group)}
		for _, enc := range Encodings {
			p, err := NewEncoder(enc).Encode(in)
			require.NoError(t, err)
			back := decode(t, p)
			assertRank(t, enc, in.DataParallelRank, back)
			require.Len(t, back.Events, 1)
			assertReadBack(t, enc, &ev, &back.Events[0])
			if (enc == Map || enc == Array) && salt != "" {
				assert.Equal(t, salt, back.Events[0].CacheSalt())
			}
		}
	})
}
