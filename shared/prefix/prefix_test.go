package prefix

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Test vectors: fixed inputs and the keys they must produce. If one of these changes,
// every table, report and index entry in a running fleet stops matching: bump the seed
// label ("kvroute/prefix/v1") and the table format instead of editing the numbers.
func TestVectors(t *testing.T) {
	// xxhash64 of eight zero bytes, from the xxHash reference implementation.
	assert.Equal(t, uint64(0x34c96acdcadb1bbb), Next(0, nil))

	assert.Equal(t, uint64(0x009cf9bd7e937ec6), Seed(Text, "llama", "", Salt{}))
	assert.Equal(t, uint64(0xb59cdc93de371c80), Seed(Token, "llama", "", Salt{}))
	assert.Equal(t, uint64(0xc475342d45ff0fd1), Seed(Text, "llama", "a", Salt{}))

	salt := TenantSalt([]byte("secret"), "acme")
	assert.Equal(t, "700f8a71077438948e68c52f90421d3f", hex.EncodeToString(salt[:]))
	assert.Equal(t, uint64(0x8c81cb04788ceacf), Seed(Text, "llama", "", salt))

	text := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" +
		"The quick brown fox jumps over the lazy dog, again and again ...." + "tail")
	assert.Equal(t, []uint64{0x3b9199d6f6493461, 0x89d410117264bea4},
		TextKeys(nil, Seed(Text, "llama", "", Salt{}), text, 64))

	var toks []uint32
	for i := 0; i < 40; i++ {
		toks = append(toks, uint32(i*1000+7))
	}
	assert.Equal(t, []uint64{0xeec91f89fbf7d6d6, 0xd6de6f8fdbd64beb},
		TokenKeys(nil, Seed(Token, "llama", "", Salt{}), toks, 16))
}

func TestTenantSaltIsTruncatedHMACSHA256(t *testing.T) {
	// RFC 4231 test case 2: HMAC-SHA256(key "Jefe", "what do ya want for nothing?").
	s := TenantSalt([]byte("Jefe"), "what do ya want for nothing?")
	assert.Equal(t, "5bdcc146bf60754e6a042426089575c7", hex.EncodeToString(s[:]))
}

func TestOnlyCompleteBlocksAreKeyed(t *testing.T) {
	seed := Seed(Text, "m", "", Salt{})
	cases := []struct {
		name  string
		bytes int
		want  int
	}{
		{"empty", 0, 0},
		{"one short of a block", 63, 0},
		{"exactly one block", 64, 1},
		{"one block and a bit", 100, 1},
		{"three blocks", 192, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Len(t, TextKeys(nil, seed, make([]byte, c.bytes), 64), c.want)
			assert.Len(t, TokenKeys(nil, seed, make([]uint32, c.bytes), 64), c.want)
		})
	}
	assert.Empty(t, TextKeys(nil, seed, make([]byte, 100), 0), "block size 0 keys nothing")
}

func TestSharedPrefixSharesKeysUntilFirstDifference(t *testing.T) {
	seed := Seed(Text, "m", "", Salt{})
	a := make([]byte, 64*6)
	b := make([]byte, 64*6)
	for i := range a {
		a[i] = byte(i)
		b[i] = byte(i)
	}
	b[64*3+10] ^= 1 // differ inside block 3
	ka := TextKeys(nil, seed, a, 64)
	kb := TextKeys(nil, seed, b, 64)
	require.Len(t, ka, 6)
	assert.Equal(t, ka[:3], kb[:3], "blocks 0-2 are the same prefix")
	for i := 3; i < 6; i++ {
		assert.NotEqual(t, ka[i], kb[i], "block %d follows a different block", i)
	}
	// Same block content at a different position is a different key (chaining).
	c := append(append([]byte{}, a[64:128]...), a[64:128]...)
	kc := TextKeys(nil, seed, c, 64)
	assert.NotEqual(t, kc[0], kc[1])
}

func TestSeedSeparatesModelsAdaptersTenantsAndDomains(t *testing.T) {
	acme := TenantSalt([]byte("k"), "acme")
	globex := TenantSalt([]byte("k"), "globex")
	seeds := map[string]uint64{
		"text m":           Seed(Text, "m", "", Salt{}),
		"token m":          Seed(Token, "m", "", Salt{}),
		"text m2":          Seed(Text, "m2", "", Salt{}),
		"text m lora a":    Seed(Text, "m", "a", Salt{}),
		"text ma":          Seed(Text, "ma", "", Salt{}), // length prefix: ("ma","") != ("m","a")
		"text m acme":      Seed(Text, "m", "", acme),
		"text m globex":    Seed(Text, "m", "", globex),
		"text m other key": Seed(Text, "m", "", TenantSalt([]byte("k2"), "acme")),
	}
	seen := map[uint64]string{}
	for name, s := range seeds {
		if other, dup := seen[s]; dup {
			t.Fatalf("%q and %q have the same seed %#x", name, other, s)
		}
		seen[s] = name
	}
}

func TestCacheSaltRoundTrip(t *testing.T) {
	s := TenantSalt([]byte("secret"), "acme")
	assert.Equal(t, s, SaltFromCacheSalt(s.CacheSalt()), "kvroute's own cache_salt maps back to its salt")
	assert.True(t, SaltFromCacheSalt("").IsZero())
	other := SaltFromCacheSalt("client-chosen")
	assert.False(t, other.IsZero())
	assert.Equal(t, other, SaltFromCacheSalt("client-chosen"), "deterministic")
	assert.NotEqual(t, other, SaltFromCacheSalt("client-chosen2"))
	// 32 characters that are not hex are hashed, not decoded.
	assert.False(t, SaltFromCacheSalt("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz").IsZero())
}

func TestCheckpoints(t *testing.T) {
	keys := []uint64{10, 11, 12, 13, 14, 15, 16}
	assert.Equal(t, keys, Checkpoints(nil, keys, 1))
	assert.Equal(t, keys, Checkpoints(nil, keys, 0))
	assert.Equal(t, []uint64{12, 15}, Checkpoints(nil, keys, 3))
	assert.Empty(t, Checkpoints(nil, keys, 8))
	for i := range keys {
		assert.Equal(t, (i+1)%3 == 0, IsCheckpoint(i, 3), "position %d", i)
	}
}

func TestTokenKeysLargeBlocksDoNotAllocateWrongly(t *testing.T) {
	// Block sizes beyond the stack buffer (64 tokens) take the heap path and agree with
	// hashing the same bytes by hand.
	toks := make([]uint32, 256)
	for i := range toks {
		toks[i] = uint32(i)
	}
	seed := Seed(Token, "m", "", Salt{})
	got := TokenKeys(nil, seed, toks, 128)
	require.Len(t, got, 2)
	buf := make([]byte, 0, 512)
	for _, tk := range toks[:128] {
		buf = append(buf, byte(tk), byte(tk>>8), byte(tk>>16), byte(tk>>24))
	}
	assert.Equal(t, Next(seed, buf), got[0])
}

// NextTokens gives exactly Next over the ids' little-endian bytes, and TokenKeys' chain,
// for every block size.
func TestNextTokensIsNextOfLE32(t *testing.T) {
	seed := Seed(Token, "llama", "", Salt{})
	var toks []uint32
	for i := range 200 {
		toks = append(toks, uint32(i)*2654435761)
	}
	for n := 0; n <= len(toks); n++ {
		buf := make([]byte, 0, 4*n)
		for _, tk := range toks[:n] {
			buf = append(buf, byte(tk), byte(tk>>8), byte(tk>>16), byte(tk>>24))
		}
		require.Equal(t, Next(seed, buf), NextTokens(seed, toks[:n]), "%d ids", n)
	}
	for _, bt := range []int{1, 16, 64, 65, 100} {
		keys := TokenKeys(nil, seed, toks, bt)
		h := seed
		for i, k := range keys {
			h = NextTokens(h, toks[i*bt:(i+1)*bt])
			require.Equal(t, k, h, "block size %d, block %d", bt, i)
		}
	}
	// The test vector's chain, through NextTokens.
	var vec []uint32
	for i := 0; i < 40; i++ {
		vec = append(vec, uint32(i*1000+7))
	}
	h0 := NextTokens(Seed(Token, "llama", "", Salt{}), vec[:16])
	assert.Equal(t, uint64(0xeec91f89fbf7d6d6), h0)
	assert.Equal(t, uint64(0xd6de6f8fdbd64beb), NextTokens(h0, vec[16:32]))
}

func BenchmarkNextTokens16(b *testing.B) {
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(i * 7919)
	}
	var h uint64
	for b.Loop() {
		h = NextTokens(h, toks)
	}
}

func BenchmarkTextKeys32KB(b *testing.B) {
	text := make([]byte, 32<<10)
	for i := range text {
		text[i] = byte('a' + i%26)
	}
	seed := Seed(Text, "m", "", Salt{})
	dst := make([]uint64, 0, len(text)/64)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = TextKeys(dst[:0], seed, text, 64)
	}
}
