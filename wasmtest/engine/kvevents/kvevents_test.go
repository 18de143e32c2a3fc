package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// golden turns the reference doc's notation (hex bytes and "quoted" strings, spaces
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

// The reference doc's section 2.3 example: ts=1700000000.5, hash=0xDA7A5EED00000001,
// tokens=[1,2], block_size=2, first block of its request, no LoRA, medium GPU, group 0.
func goldenStored() Event {
	return Event{Kind: BlockStored, BlockHashes: []uint64{0xDA7A5EED00000001}, TokenIDs: []uint32{1, 2},
		BlockSize: 2, Medium: MediumGPU, KVCacheSpecKind: SpecFullAttention}
}

const (
	ts   = "cb41d954fc40200000"
	hash = "cfda7a5eed00000001"
)

func TestGoldenBytes(t *testing.T) {
	removed := Event{Kind: BlockRemoved, BlockHashes: []uint64{0xDA7A5EED00000001}, Medium: MediumGPU}
	cleared := Event{Kind: AllBlocksCleared}
	cases := []struct {
		name string
		enc  Encoding
		ev   Event
		want string // reference section 2.3, verbatim but for the elided bytes
	}{
		{"v0.9.0 batch", ArrayV09, goldenStored(),
			`92 ` + ts + ` 91 96 ab"BlockStored" 91 ` + hash + ` c0 92 01 02 02 c0`},
		{"v0.10.x batch", ArrayV010, goldenStored(),
			`93 ` + ts + ` 91 97 ab"BlockStored" 91 ` + hash + ` c0 920102 02 c0 a3"GPU" 00`},
		{"array + groups", Array, goldenStored(),
			`93 ` + ts + ` 91 9c ab"BlockStored" 91 ` + hash + ` c0 920102 02 c0 a3"GPU" c0 91c0 00 ae"full_attention" c0 00`},
		{"map", Map, goldenStored(),
			`93 ` + ts + ` 91 8b a4"type" ab"BlockStored" ac"block_hashes" 91 ` + hash + ` b1"parent_block_hash" c0 a9"token_ids" 920102
			 aa"block_size" 02 a7"lora_id" c0 a6"medium" a3"GPU" a9"lora_name" c0 aa"extra_keys" 91c0 a9"group_idx" 00
			 b2"kv_cache_spec_kind" ae"full_attention" 00`},
		{"BlockRemoved array", Array, removed, `93 ` + ts + ` 91 94 ac"BlockRemoved" 91 ` + hash + ` a3"GPU" 00 00`},
		{"BlockRemoved map", Map, removed,
			`93 ` + ts + ` 91 84 a4"type" ac"BlockRemoved" ac"block_hashes" 91 ` + hash + ` a6"medium" a3"GPU" a9"group_idx" 00 00`},
		{"BlockRemoved v0.10", ArrayV010, removed, `93 ` + ts + ` 91 93 ac"BlockRemoved" 91 ` + hash + ` a3"GPU" 00`},
		{"BlockRemoved v0.9", ArrayV09, removed, `92 ` + ts + ` 91 92 ac"BlockRemoved" 91 ` + hash},
		{"AllBlocksCleared array", Array, cleared, `93 ` + ts + ` 91 91 b0"AllBlocksCleared" 00`},
		{"AllBlocksCleared map", Map, cleared, `93 ` + ts + ` 91 81 a4"type" b0"AllBlocksCleared" 00`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := NewEncoder(c.enc).Encode(Batch{TS: 1700000000.5, Events: []Event{c.ev}})
			require.NoError(t, err)
			assert.Equal(t, hex.EncodeToString(golden(t, c.want)), hex.EncodeToString(got))

			back, skipped, err := Decode(got)
			require.NoError(t, err)
			assert.Zero(t, skipped)
			assert.Equal(t, 1700000000.5, back.TS)
			require.Len(t, back.Events, 1)
			assert.Equal(t, c.ev.Kind, back.Events[0].Kind)
			assert.Equal(t, c.ev.BlockHashes, back.Events[0].BlockHashes)
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

	back, _, err := Decode(got)
	require.NoError(t, err)
	assert.Equal(t, 3, back.DataParallelRank)
	assert.True(t, back.HasRank)
	assert.Equal(t, ev, back.Events[0])
}

type captured struct {
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent_block_hash"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      string   `json:"medium"`
	LoraName    *string  `json:"lora_name"`
}

func TestDecodeCapturedVLLMEvents(t *testing.T) {
	// The captures hold vLLM's BlockStored fields as JSON; encode them in every layout the
	// engine speaks and check that a consumer decodes exactly the captured values.
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "testdata", "vllm", "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 2)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		var c captured
		require.NoError(t, json.Unmarshal(raw, &c))
		ev := Event{Kind: BlockStored, BlockHashes: c.BlockHashes, TokenIDs: c.TokenIDs, BlockSize: c.BlockSize,
			Medium: c.Medium, KVCacheSpecKind: SpecFullAttention}
		if c.Parent != nil {
			ev.HasParent, ev.ParentBlockHash = true, *c.Parent
		}
		if c.LoraName != nil {
			ev.LoraName = *c.LoraName
			ev.ExtraKeys = make([][]string, len(c.BlockHashes))
			for i := range ev.ExtraKeys {
				ev.ExtraKeys[i] = []string{*c.LoraName}
			}
		}
		for _, enc := range Encodings {
			t.Run(filepath.Base(f)+"/"+string(enc), func(t *testing.T) {
				payload, err := NewEncoder(enc).Encode(Batch{TS: 1789095808.8378847, Events: []Event{ev}})
				require.NoError(t, err)
				back, _, err := Decode(payload)
				require.NoError(t, err)
				require.Len(t, back.Events, 1)
				got := back.Events[0]
				assert.Equal(t, c.BlockHashes, got.BlockHashes)
				assert.Len(t, got.TokenIDs, len(c.BlockHashes)*c.BlockSize)
				assert.Equal(t, c.TokenIDs, got.TokenIDs)
				assert.Equal(t, c.BlockSize, got.BlockSize)
				assert.False(t, got.HasParent)
				if enc == Map || enc == Array {
					assert.Equal(t, ev, got)
				}
			})
		}
	}
}

func TestDecodeForeignShapes(t *testing.T) {
	cases := []struct {
		name    string
		payload string
		check   func(t *testing.T, b Batch, skipped int)
	}{
		{"signed and bytes hashes, unknown tag skipped, 2-element batch",
			`92 cb41d954fc40200000 93 92 ac"BlockRemoved" 91 d3ffffffffffffffff 92 ac"BlockRemoved" 91 c40a 00010203040506070809 91 a7"Unknown"`,
			func(t *testing.T, b Batch, skipped int) {
				assert.Equal(t, 1, skipped)
				require.Len(t, b.Events, 2)
				assert.Equal(t, uint64(0xffffffffffffffff), b.Events[0].BlockHashes[0])
				assert.Equal(t, uint64(0x0203040506070809), b.Events[1].BlockHashes[0], "bytes: last 8, big-endian")
				assert.False(t, b.HasRank)
			}},
		{"map batch, map event with unknown keys",
			`83 a2"ts" cb41d954fc40200000 a6"events" 91 83 a4"type" ac"BlockRemoved" ac"block_hashes" 91 07 a8"locality" a5"LOCAL" b2"data_parallel_rank" 01`,
			func(t *testing.T, b Batch, skipped int) {
				require.Len(t, b.Events, 1)
				assert.Equal(t, []uint64{7}, b.Events[0].BlockHashes)
				assert.Equal(t, 1, b.DataParallelRank)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, skipped, err := Decode(golden(t, c.payload))
			require.NoError(t, err)
			c.check(t, b, skipped)
		})
	}
	for _, bad := range []string{``, `c0`, `91 cb41d954fc40200000`, `93 cb41d954fc40200000 91 91 01 00`, `dd ffffffff`, `93 cb41d954fc40200000 90 00 00`} {
		_, _, err := Decode(golden(t, bad))
		assert.Error(t, err, bad)
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

func FuzzDecode(f *testing.F) {
	for _, enc := range Encodings {
		p, _ := NewEncoder(enc).Encode(Batch{TS: 1, Events: []Event{goldenStored(), {Kind: BlockRemoved, BlockHashes: []uint64{1}}, {Kind: AllBlocksCleared}}})
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, _, err := Decode(payload)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same events.
		again, err := NewEncoder(Map).Encode(b)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		b2, _, err := Decode(again)
		if err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		if len(b2.Events) != len(b.Events) {
			t.Fatalf("events %d != %d", len(b2.Events), len(b.Events))
		}
	})
}
