// Package prefix turns a prompt into the chain of block keys that kvroute routes on.
//
// A prefix is a chain of fixed-size blocks; only complete blocks are hashed. The key of
// block i depends on every block before it:
//
//	h0 = Seed(domain, model, lora, salt)
//	hi = xxhash64(le64(h(i-1)) || block_i)
//
// so two prompts share the key of block i exactly when they share blocks 0..i and the
// seed. Two domains exist: Text (blocks of BlockBytes bytes of the canonical prompt, used
// when the filter has no tokenizer) and Token (blocks of BlockTokens token ids, used for
// token-id prompts and for the engines' KV events). The domain is part of the seed, so a
// text key never equals a token key.
//
// Both the filter and the control plane compute keys with this package; a change here
// changes every key, which the test vectors in prefix_test.go make visible.
package prefix

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/cespare/xxhash/v2"
)

// Domain says what a block is made of.
type Domain uint8

const (
	// Text blocks are BlockBytes bytes of the canonical prompt serialization.
	Text Domain = 1
	// Token blocks are BlockTokens token ids, each hashed as 4 little-endian bytes.
	Token Domain = 2
)

func (d Domain) String() string {
	switch d {
	case Text:
		return "text"
	case Token:
		return "token"
	}
	return "unknown"
}

// Defaults. 16 tokens is vLLM's default block size; 64 bytes is about 16 tokens of
// English text at the usual ~4 bytes per token.
const (
	DefaultBlockTokens = 16
	DefaultBlockBytes  = 64
)

// SaltSize is the length of a tenant salt: 128 bits of HMAC-SHA256 is ample to keep
// tenants' chains apart and keeps cache_salt strings short.
const SaltSize = 16

// Salt separates the chains of isolated tenants. The zero Salt means "shared": no salt.
type Salt [SaltSize]byte

// IsZero reports whether s is the shared (unsalted) salt.
func (s Salt) IsZero() bool { return s == Salt{} }

// TenantSalt derives a tenant's salt from the operator's secret: HMAC-SHA256(secret,
// tenant) truncated to SaltSize bytes. Without the secret a tenant cannot compute another
// tenant's salt, so it cannot aim requests at that tenant's cached blocks.
func TenantSalt(secret []byte, tenant string) Salt {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(tenant))
	var s Salt
	copy(s[:], mac.Sum(nil))
	return s
}

// CacheSalt is the value the filter sends in vLLM's cache_salt request field for salt s,
// so the engine keeps the tenant's blocks apart too.
func (s Salt) CacheSalt() string { return hex.EncodeToString(s[:]) }

// SaltFromCacheSalt maps any cache_salt string to the chain salt both sides use: the
// filter for a request carrying cache_salt, the control plane for a BlockStored event
// whose first block carries it in extra_keys. kvroute's own values (CacheSalt) map back
// to their salt; any other non-empty value is hashed. Empty means no salt.
func SaltFromCacheSalt(v string) Salt {
	var s Salt
	if v == "" {
		return s
	}
	if len(v) == 2*SaltSize {
		if n, err := hex.Decode(s[:], []byte(v)); err == nil && n == SaltSize {
			return s
		}
	}
	sum := sha256.Sum256([]byte("kvroute cache_salt\x00" + v))
	copy(s[:], sum[:])
	return s
}

// Seed returns h0, the chain's starting value, from the domain, the model, the LoRA
// adapter ("" for none) and the tenant salt. Fields are length-prefixed so that no two
// different (model, lora) pairs produce the same input.
func Seed(d Domain, model, lora string, salt Salt) uint64 {
	var h xxhash.Digest
	h.Reset()
	var n [8]byte
	h.Write([]byte("kvroute/prefix/v1"))
	h.Write([]byte{byte(d)})
	binary.LittleEndian.PutUint64(n[:], uint64(len(model)))
	h.Write(n[:])
	h.WriteString(model)
	binary.LittleEndian.PutUint64(n[:], uint64(len(lora)))
	h.Write(n[:])
	h.WriteString(lora)
	h.Write(salt[:])
	return h.Sum64()
}

// Next returns the key of the block that follows the block whose key is parent.
func Next(parent uint64, block []byte) uint64 { return linked(parent, block) }

// NextTokens is Next(parent, block) for a token-domain block: each id as 4
// little-endian bytes, the bytes TokenKeys hashes (the control plane hashes every block
// of every KV event this way: BenchmarkNextTokens16).
func NextTokens(parent uint64, tokens []uint32) uint64 {
	if len(tokens) == 16 {
		return linkedTokens16(parent, (*[16]uint32)(tokens))
	}
	return linkedTokens(parent, tokens)
}

// TextKeys appends to dst the keys of the complete blocks of text, blockBytes bytes
// each, chained from seed. A trailing partial block has no key.
func TextKeys(dst []uint64, seed uint64, text []byte, blockBytes int) []uint64 {
	if blockBytes <= 0 {
		return dst
	}
	h := seed
	if blockBytes == 64 {
		for off := 0; off+64 <= len(text); off += 64 {
			h = linked64(h, (*[64]byte)(text[off:off+64]))
			dst = append(dst, h)
		}
		return dst
	}
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		h = linked(h, text[off:off+blockBytes])
		dst = append(dst, h)
	}
	return dst
}

// TokenKeys appends to dst the keys of the complete blocks of tokens, blockTokens ids
// each, chained from seed. Each id is hashed as 4 little-endian bytes.
func TokenKeys(dst []uint64, seed uint64, tokens []uint32, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return dst
	}
	h := seed
	if blockTokens == 16 {
		for off := 0; off+16 <= len(tokens); off += 16 {
			h = linkedTokens16(h, (*[16]uint32)(tokens[off:off+16]))
			dst = append(dst, h)
		}
		return dst
	}
	for off := 0; off+blockTokens <= len(tokens); off += blockTokens {
		h = linkedTokens(h, tokens[off:off+blockTokens])
		dst = append(dst, h)
	}
	return dst
}

// Checkpoints appends to dst the keys at checkpoint positions of a chain with the given
// stride: positions stride-1, 2*stride-1, ... A table built with stride k stores only
// these keys, which shrinks it k-fold; a match is then found to the nearest checkpoint.
// Stride 1 (or less) keeps every key.
func Checkpoints(dst, keys []uint64, stride int) []uint64 {
	if stride <= 1 {
		return append(dst, keys...)
	}
	for i := stride - 1; i < len(keys); i += stride {
		dst = append(dst, keys[i])
	}
	return dst
}

// IsCheckpoint reports whether the block at position i (0-based) of a chain is stored
// by a table with the given stride.
func IsCheckpoint(i, stride int) bool {
	if stride <= 1 {
		return true
	}
	return (i+1)%stride == 0
}
