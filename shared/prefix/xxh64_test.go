package prefix

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestLinkedIsXXH64: linked, linked64, linkedTokens and linkedTokens16 are xxhash.Sum64 of the parent's
// 8 bytes followed by the block, for every block length across the 32-byte stripes and the 8-,
// 4- and 1-byte tails, so keys stay what they were (prefix_test.go's vectors also pin them).
func TestLinkedIsXXH64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 300; n++ {
		for range 20 {
			parent := rng.Uint64()
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			want := xxhash.Sum64(append(binary.LittleEndian.AppendUint64(nil, parent), b...))
			if got := linked(parent, b); got != want {
				t.Fatalf("linked(%#x, %d bytes) = %#x, xxhash64 %#x", parent, n, got, want)
			}
			if n == 64 {
				if got := linked64(parent, (*[64]byte)(b)); got != want {
					t.Fatalf("linked64(%#x) = %#x, xxhash64 %#x", parent, got, want)
				}
			}
			if n%4 != 0 {
				continue
			}
			toks := make([]uint32, n/4)
			for i := range toks {
				toks[i] = binary.LittleEndian.Uint32(b[4*i:])
			}
			if got := linkedTokens(parent, toks); got != want {
				t.Fatalf("linkedTokens(%#x, %d ids) = %#x, xxhash64 %#x", parent, len(toks), got, want)
			}
			if len(toks) == 16 {
				if got := linkedTokens16(parent, (*[16]uint32)(toks)); got != want {
					t.Fatalf("linkedTokens16(%#x) = %#x, xxhash64 %#x", parent, got, want)
				}
			}
		}
	}
}

// BenchmarkBlockHash: one block's key through xxhash.Sum64 of a buffer holding the
// parent and a copy of the block (how keys were hashed before linked), and through
// linked / linkedTokens, side by side; run it compiled for wasip1 too (docs/performance.md, "In the guest").
func BenchmarkBlockHash(b *testing.B) {
	text := make([]byte, 64)
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(i * 7919)
	}
	var h uint64
	b.Run("text64/via=copy", func(b *testing.B) {
		var buf [8 + 256]byte
		for b.Loop() {
			h = xxhash.Sum64(append(binary.LittleEndian.AppendUint64(buf[:0], h), text...))
		}
	})
	b.Run("text64/via=linked", func(b *testing.B) {
		for b.Loop() {
			h = linked(h, text)
		}
	})
	b.Run("text64/via=linked64", func(b *testing.B) {
		for b.Loop() {
			h = linked64(h, (*[64]byte)(text))
		}
	})
	b.Run("tokens16/via=copy", func(b *testing.B) {
		var buf [8 + 64]byte
		for b.Loop() {
			s := binary.LittleEndian.AppendUint64(buf[:0], h)
			for _, t := range toks {
				s = binary.LittleEndian.AppendUint32(s, t)
			}
			h = xxhash.Sum64(s)
		}
	})
	b.Run("tokens16/via=linked", func(b *testing.B) {
		for b.Loop() {
			h = linkedTokens(h, toks)
		}
	})
	b.Run("tokens16/via=linkedTokens16", func(b *testing.B) {
		for b.Loop() {
			h = linkedTokens16(h, (*[16]uint32)(toks))
		}
	})
}
