package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Tenant shares across proxies. Each proxy's leader posts the prefill tokens its
// admission (shared/admit) admitted per tenant since its last post, and the answer is the
// fleet's decayed per-tenant totals (controlplane/shares), so every proxy holds a tenant
// to its weight's share of the fleet's tokens, not only of its own:
//
//	POST SharesPath, body and answer in SharesContentType
//
// Both are the magic "KVSH" and a version byte (1), then entries to the end of the body:
//
//	key     8 bytes, little endian (TenantKey: a hash, never the tenant's name)
//	tokens  4 bytes, little endian float32: tokens since the last post (a post), or the
//	        fleet's decayed total (an answer)
//
// A post holds at most MaxSharePost entries, an answer at most MaxSharesAnswer. A control
// plane that predates the path answers 404: the proxy keeps its local shares.
const (
	SharesPath        = "/v1/shares"
	SharesContentType = "application/vnd.kvroute.shares"
	MaxSharePost      = 256
	MaxSharesAnswer   = 1024
	// SharesHeadLen is a body's fixed head: magic and version.
	SharesHeadLen        = len(sharesMagic) + 1
	ShareEntryLen        = 8 + 4
	MaxSharesAnswerBytes = SharesHeadLen + MaxSharesAnswer*ShareEntryLen
	MaxSharePostBytes    = SharesHeadLen + MaxSharePost*ShareEntryLen
)

const (
	sharesMagic   = "KVSH"
	sharesVersion = 1
)

// TenantKey is the key of tenant's shares: the same in every proxy, and not the name.
func TenantKey(tenant string) uint64 { return AffinityKey('T', tenant, nil) }

// ShareEntry is one tenant's tokens.
type ShareEntry struct {
	Key    uint64
	Tokens float32
}

// AppendShares appends a post or an answer holding es.
func AppendShares(dst []byte, es []ShareEntry) []byte {
	dst = append(dst, sharesMagic...)
	dst = append(dst, sharesVersion)
	for _, e := range es {
		dst = binary.LittleEndian.AppendUint64(dst, e.Key)
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(e.Tokens))
	}
	return dst
}

// ParseShares decodes a post or an answer of at most max entries into dst[:0]. Tokens must
// be finite and not negative, keys not 0.
func ParseShares(dst []ShareEntry, b []byte, max int) ([]ShareEntry, error) {
	dst = dst[:0]
	if len(b) < SharesHeadLen || string(b[:len(sharesMagic)]) != sharesMagic {
		return dst, errors.New("shares: not a shares body")
	}
	if v := b[len(sharesMagic)]; v != sharesVersion {
		return dst, fmt.Errorf("shares: version %d, want %d", v, sharesVersion)
	}
	b = b[SharesHeadLen:]
	if len(b)%ShareEntryLen != 0 {
		return dst, fmt.Errorf("shares: %d bytes of entries, not a multiple of %d", len(b), ShareEntryLen)
	}
	if n := len(b) / ShareEntryLen; n > max {
		return dst, fmt.Errorf("shares: %d entries, at most %d", n, max)
	}
	for ; len(b) > 0; b = b[ShareEntryLen:] {
		e := ShareEntry{Key: binary.LittleEndian.Uint64(b), Tokens: math.Float32frombits(binary.LittleEndian.Uint32(b[8:]))}
		if e.Key == 0 || !(e.Tokens >= 0) || math.IsInf(float64(e.Tokens), 0) {
			return dst[:0], fmt.Errorf("shares: entry %x: key 0 or tokens %v", e.Key, e.Tokens)
		}
		dst = append(dst, e)
	}
	return dst, nil
}
