// Package tokenizer is the engine simulator's deterministic stand-in for a real
// tokenizer. There is no model vocabulary here, only a stable text -> token-id map
// that has the one property prefix caching depends on.
//
// Encoding: the UTF-8 bytes of the text are cut into 4-byte chunks (the last chunk
// may be shorter); each chunk's id is FNV-1a-64 of the chunk's bytes mod [ChunkVocab]
// (128,000, the size of Llama 3's regular vocabulary). So:
//   - the same text always yields the same ids, in every process;
//   - two texts sharing their first 4k bytes share their first k tokens;
//   - about 4 bytes per token, close to real BPE tokenizers on English text.
//
// Special ids sit above the chunk range, as in Llama 3: [BOS] = 128000 is prepended
// when add_special_tokens is set (completions default), and chat prompts start
// with it (see [RenderChat]). The full vocabulary is [VocabSize] = 128,256 ids.
//
// Decoding is not possible (ids are hashes); generated text is made of words from a
// fixed list, one per generated token ([OutputText]).
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package tokenizer

const (
	// ChunkBytes is how many UTF-8 bytes make one token.
	ChunkBytes = 4
	// ChunkVocab is the number of ids chunks hash into: [0, ChunkVocab).
	ChunkVocab = 128000
	// BOS is the begin-of-text id (Llama 3's <|begin_of_text|>).
	BOS = 128000
	// VocabSize is the full vocabulary size (Llama 3's), the bound for token-id prompts.
	VocabSize = 128256
)

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Count returns how many tokens Encode(text, false) yields, without allocating.
func Count(text string) int {
	return (len(text) + ChunkBytes - 1) / ChunkBytes
}

// Encode returns the token ids of text, with [BOS] first when addSpecial is set.
func Encode(text string, addSpecial bool) []uint32 {
	n := Count(text)
	if addSpecial {
		n++
	}
	return AppendEncode(make([]uint32, 0, n), text, addSpecial)
}

// AppendEncode appends the ids of text to dst (see [Encode]).
func AppendEncode(dst []uint32, text string, addSpecial bool) []uint32 {
	if addSpecial {
		dst = append(dst, BOS)
	}
	for i := 0; i < len(text); i += ChunkBytes {
		end := min(i+ChunkBytes, len(text))
		h := uint64(fnvOffset64)
		for j := i; j < end; j++ {
			h ^= uint64(text[j])
			h *= fnvPrime64
		}
		dst = append(dst, uint32(h%ChunkVocab))
	}
	return dst
}

// outputWords are the "model's" generated words; each is one token of output.
var outputWords = [...]string{" the", " kv", " and", " of", " to", " a", " in", " is", " cache", " route", " it", " on", " we", " as", " by", " at"}

// OutputToken returns the id the simulated model generates at output position pos
// for a sequence with the given seed. It is deterministic and spread over the chunk
// vocabulary (splitmix64).
func OutputToken(seed uint64, pos int) uint32 {
	z := seed + uint64(pos+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return uint32(z % ChunkVocab)
}

// OutputText is the text the simulator returns for a generated token id.
func OutputText(id uint32) string {
	return outputWords[id%uint32(len(outputWords))]
}
