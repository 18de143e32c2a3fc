package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// The worker VMs share which replica answered each Responses response and served each
// session last (shared/route/affinity.go says what the router does with them), so a
// follow-up finds its replica whichever VM takes it:
//
//	kvroute/affinity/<i>  slot i of affinityRing: magic, the entry's key (a hash of its
//	                      kind, the tenant and the response or session id), when (unix
//	                      ms), the prompt tokens (sessions), the replica's address
//
// An entry lives in the slot its key picks; a newer entry whose key picks the same slot
// replaces it, and a reader takes an entry only when the key matches and it is younger
// than its kind's age limit. So the map is bounded in entries (affinityRing) and age,
// costs one shared-data write per learned id and one read per request that names one,
// and holds hashes and addresses, never an id or prompt text. Losing an entry loses only
// the preference: the rule then places the request alone.
const (
	affinityRing  = 4096
	affinityMagic = "KVA1"
	// responseMaxAge bounds how long a response's replica is remembered: vLLM's store
	// keeps responses until the process ends, agents' follow-ups come within minutes.
	responseMaxAge = time.Hour
	// sessionMaxAge is rule.MaxCacheAge's default: past it caches have turned over.
	sessionMaxAge = 10 * time.Minute
)

const (
	affinityResponse byte = 'R'
	affinitySession  byte = 'S'
)

var affinityKeys = func() (k [affinityRing]string) {
	for i := range k {
		k[i] = "kvroute/affinity/" + strconv.Itoa(i)
	}
	return k
}()

// affinity is one VM's access to the shared map.
type affinity struct {
	value *hostBuf // the VM's buffer for shared-data reads (hostmem.go)
	names *names
	buf   []byte
}

// affinityKey hashes an entry's identity (FNV-1a, 64 bits): the same on every VM.
func affinityKey(kind byte, tenant string, id []byte) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	h = (h ^ uint64(kind)) * prime
	for i := 0; i < len(tenant); i++ {
		h = (h ^ uint64(tenant[i])) * prime
	}
	h = (h ^ 0xff) * prime // tenant and id apart
	for _, c := range id {
		h = (h ^ uint64(c)) * prime
	}
	return max(h, 1)
}

// remember records that key's replica is addr (tokens: its prompt, sessions only).
func (a *affinity) remember(key uint64, addr string, tokens float64, now time.Time) {
	b := append(a.buf[:0], affinityMagic...)
	b = binary.LittleEndian.AppendUint64(b, key)
	b = binary.LittleEndian.AppendUint64(b, uint64(now.UnixMilli()))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(tokens)))
	b = append(b, addr...)
	a.buf = b
	// Unconditional: the newest entry for a slot wins.
	_ = proxywasm.SetSharedData(affinityKeys[key%affinityRing], b, 0)
}

// lookup returns key's replica and prompt tokens when its entry is younger than maxAge.
func (a *affinity) lookup(key uint64, maxAge time.Duration, now time.Time) (string, float64, bool) {
	b, _, err := a.value.sharedData(affinityKeys[key%affinityRing])
	const head = 4 + 8 + 8 + 4
	if err != nil || len(b) <= head || string(b[:4]) != affinityMagic || binary.LittleEndian.Uint64(b[4:]) != key {
		return "", 0, false
	}
	at := time.UnixMilli(int64(binary.LittleEndian.Uint64(b[12:])))
	if now.Sub(at) > maxAge {
		return "", 0, false
	}
	tokens := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[20:])))
	return a.names.keep(string(b[head:])), tokens, true
}

// responseID finds a Responses response's id in the first bytes of its body: the first
// "id" member, the response's own in both forms vLLM sends ({"id":"resp_..." in a JSON
// body; {"response":{"id":"resp_..." in the stream's first event, response.created).
// Ids longer than maxResponseID or with escapes are not taken.
func responseID(b []byte) []byte {
	const key = `"id":"`
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return nil
	}
	b = b[i+len(key):]
	for j, c := range b {
		switch {
		case c == '"':
			if j == 0 {
				return nil
			}
			return b[:j]
		case c == '\\' || j >= maxResponseID:
			return nil
		}
	}
	return nil
}

const maxResponseID = 256
