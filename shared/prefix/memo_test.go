package prefix

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// memoCase is one prompt of a memo's sequence: a seed, a block size and the bytes.
type memoCase struct {
	domain Domain
	seed   uint64
	bs     int
	data   []byte
}

// check runs c through m and through the plain chain functions, and fails on any
// difference (what a reused key that is not the chain's would be).
func (c memoCase) check(t testing.TB, m *Memo, dst []uint64) []uint64 {
	t.Helper()
	var want []uint64
	switch c.domain {
	case Text:
		want = TextKeys(nil, c.seed, c.data, c.bs)
		dst = m.TextKeys(dst[:0], c.seed, c.data, c.bs)
	default:
		toks := make([]uint32, len(c.data)/4)
		for i := range toks {
			toks[i] = uint32(c.data[4*i]) | uint32(c.data[4*i+1])<<8 | uint32(c.data[4*i+2])<<16 | uint32(c.data[4*i+3])<<24
		}
		want = TokenKeys(nil, c.seed, toks, c.bs)
		dst = m.TokenKeys(dst[:0], c.seed, toks, c.bs)
	}
	if !slices.Equal(dst, want) {
		t.Fatalf("memo keys differ from the chain's for %d bytes, seed %#x, block %d (%v)", len(c.data), c.seed, c.bs, c.domain)
	}
	return dst
}

// The memo's keys are the chain's, whatever the prompts share: prompts drawn from a few
// prefixes (a system prompt, a conversation growing) with random tails, edits inside a
// remembered prefix, truncations, other seeds, block sizes and domains, prompts longer
// than an entry keeps, and more distinct prefixes than it has entries.
func TestMemoKeysAreTheChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + rng.IntN(4)) // few letters: near misses inside blocks
		}
		return b
	}
	prefixes := [][]byte{randBytes(20 << 10), randBytes(3000), randBytes(64), randBytes(MemoMaxBytes + 5000), randBytes(9 << 10), randBytes(700)}
	var m Memo
	var dst []uint64
	for i := range 3000 {
		p := prefixes[rng.IntN(len(prefixes))]
		data := append([]byte(nil), p[:rng.IntN(len(p)+1)]...)
		switch rng.IntN(4) {
		case 0: // a new tail
			data = append(data, randBytes(rng.IntN(4000))...)
		case 1: // one byte changed somewhere
			if len(data) > 0 {
				data[rng.IntN(len(data))] ^= 1
			}
		}
		c := memoCase{domain: Text, seed: uint64(rng.IntN(2)), bs: []int{64, 64, 7, 16}[rng.IntN(4)], data: data}
		if rng.IntN(4) == 0 {
			c.domain = Token
		}
		dst = c.check(t, &m, dst)
		if i%500 == 0 {
			requireMemoBounded(t, &m)
		}
	}
	requireMemoBounded(t, &m)
}

func requireMemoBounded(t *testing.T, m *Memo) {
	t.Helper()
	for _, e := range m.entries {
		require.LessOrEqual(t, len(e.data), MemoMaxBytes)
		require.LessOrEqual(t, cap(e.data), 2*MemoMaxBytes)
		if e.blockSize > 0 {
			require.Equal(t, len(e.data)/e.blockSize, len(e.keys), "an entry's keys are its blocks'")
		}
	}
}

// A prompt that repeats a remembered one, or extends it, reuses its keys: the memo
// hashes only what follows (checked by the blocks it hashes, through an entry whose keys
// are poisoned: a reused key shows as the poison).
func TestMemoReusesTheSharedBlocks(t *testing.T) {
	var m Memo
	seed := Seed(Text, "m", "", Salt{})
	system := bytes.Repeat([]byte("policy text, "), 500) // 6,500 bytes: 101 blocks
	first := m.TextKeys(nil, seed, append(slices.Clip(system), "question one"...), 64)
	e := &m.entries[0]
	require.Len(t, e.keys, len(first))
	for i := range e.keys {
		e.keys[i] = ^uint64(i)
	}
	got := m.TextKeys(nil, seed, append(slices.Clip(system), "question two, longer"...), 64)
	shared := len(system) / 64 // the block holding the system prompt's end differs
	for i := range shared {
		require.Equal(t, ^uint64(i), got[i], "block %d inside the shared prefix", i)
	}
	require.Equal(t, TextKeys(nil, seed, append(slices.Clip(system), "question two, longer"...), 64)[shared:], got[shared:])
	// Another seed (a tenant's salt) never reuses them.
	other := Seed(Text, "m", "", TenantSalt([]byte("k"), "t"))
	require.Equal(t, TextKeys(nil, other, system, 64), m.TextKeys(nil, other, system, 64))
}

func FuzzMemo(f *testing.F) {
	f.Add([]byte("abcdefgh"), []byte("abcdefgX"), []byte("abcd"), uint8(4))
	f.Add(bytes.Repeat([]byte("x"), 300), bytes.Repeat([]byte("x"), 301), []byte{}, uint8(64))
	f.Fuzz(func(t *testing.T, a, b, c []byte, bs uint8) {
		var m Memo
		var dst []uint64
		for i, data := range [][]byte{a, b, c, a, append(slices.Clip(b), c...), a[:len(a)/2], b} {
			d := Text
			if i%3 == 2 {
				d = Token
			}
			dst = memoCase{domain: d, seed: uint64(i % 2), bs: int(bs%70) + 1, data: data}.check(t, &m, dst)
		}
	})
}

// BenchmarkMemoTextKeys32KB: a 32 KB prompt's keys through the memo beside plain
// TextKeys (the same as BenchmarkTextKeys32KB), when the prompt repeats a remembered one,
// shares its first 75% with one, and shares nothing (more distinct prompts in turn than
// the memo has entries: every entry's first block compared, then the prompt copied in).
func BenchmarkMemoTextKeys32KB(b *testing.B) {
	seed := Seed(Text, "m", "", Salt{})
	text := make([]byte, 32<<10)
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	dst := make([]uint64, 0, len(text)/64)
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			dst = TextKeys(dst[:0], seed, text, 64)
		}
	})
	for _, shared := range []int{100, 75, 0} {
		b.Run(fmt.Sprintf("shared=%d%%", shared), func(b *testing.B) {
			var m Memo
			prompts := make([][]byte, 2)
			if shared == 0 {
				prompts = make([][]byte, memoEntries+1)
			}
			for i := range prompts {
				prompts[i] = slices.Clone(text)
				for j := len(text) * shared / 100; j < len(text); j += 64 {
					prompts[i][j] = byte('0' + i) // differs from the others in every block
				}
			}
			for i := range memoEntries { // others, unlike all
				m.TextKeys(nil, seed, bytes.Repeat([]byte{byte('A' + i)}, len(text)), 64)
			}
			for _, p := range prompts {
				m.TextKeys(nil, seed, p, 64)
			}
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = m.TextKeys(dst[:0], seed, prompts[i%len(prompts)], 64)
				i++
			}
		})
	}
}
