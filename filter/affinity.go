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
//	kvroute/affinity/<b>  bucket b of affinityBuckets: magic, then up to affinityWays
//	                      entries, newest first, each the entry's key (a hash of its
//	                      kind, the tenant and the response or session id), when (unix
//	                      ms), the prompt's complete blocks (sessions) and the replica's
//	                      address
//
// An entry lives in the bucket its key picks; writing it puts it first and drops the
// same key's older entry, and the oldest when the bucket is full. A reader takes an
// entry only when the key matches and it is younger than its kind's age limit. So the
// map is bounded in entries (affinityBuckets x affinityWays) and age, costs a read and a
// write per learned id and one read per request that names one, and holds hashes and
// addresses, never an id or prompt text. A bucket of several entries keeps a live entry
// until that many newer ones land on its bucket: with one entry per slot, 400 live
// follow-ups in 4,096 slots lost 1% of them to collisions. Losing an entry loses only
// the preference: the rule then places the request alone. A response's entry also
// reaches the other proxies, through the control plane (affinitypoll.go).
const (
	affinityBuckets = 1024
	affinityWays    = 8
	affinityMagic   = "KVA3"
	// responseMaxAge bounds how long a response's replica is remembered: vLLM's store
	// keeps responses until the process ends, agents' follow-ups come within minutes.
	responseMaxAge = time.Hour
	// sessionMaxAge is rule.MaxCacheAge's default: past it caches have turned over.
	sessionMaxAge = 10 * time.Minute
	// entryHead is an entry's fixed part: key, time, blocks, address length.
	entryHead = 8 + 8 + 4 + 1
)

var affinityKeys = func() (k [affinityBuckets]string) {
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

// remember records that key's replica is addr (blocks: its prompt's complete blocks,
// sessions only).
func (a *affinity) remember(key uint64, addr string, blocks int, now time.Time) {
	a.write(key, addr, blocks, now, false)
}

// learn records an entry another proxy learned (affinitypoll.go), unless the map
// holds the key already with the same replica or a newer entry; it reports whether it
// wrote.
func (a *affinity) learn(key uint64, addr string, at time.Time) bool {
	return a.write(key, addr, 0, at, true)
}

func (a *affinity) write(key uint64, addr string, blocks int, now time.Time, onlyNewer bool) bool {
	if len(addr) > 255 {
		return false
	}
	bucket := affinityKeys[key%affinityBuckets]
	for try := 0; try < 2; try++ {
		old, cas, err := a.value.sharedData(bucket)
		if err != nil {
			old = nil
		}
		if onlyNewer && holds(old, key, addr, now) {
			return false
		}
		b := append(a.buf[:0], affinityMagic...)
		b = binary.LittleEndian.AppendUint64(b, key)
		b = binary.LittleEndian.AppendUint64(b, uint64(now.UnixMilli()))
		b = binary.LittleEndian.AppendUint32(b, uint32(min(max(blocks, 0), math.MaxUint32)))
		b = append(b, byte(len(addr)))
		b = append(b, addr...)
		n := 1
		forEachEntry(old, func(e []byte, k uint64) bool {
			if k != key && n < affinityWays {
				b = append(b, e...)
				n++
			}
			return n < affinityWays
		})
		a.buf = b
		// With the read's CAS: a sibling's write in between is kept, and this one tried again.
		if proxywasm.SetSharedData(bucket, b, uint32(cas)) == nil {
			return true
		}
	}
	return false
}

// holds reports whether bucket b has key's entry with replica addr or dated at or after at.
func holds(b []byte, key uint64, addr string, at time.Time) bool {
	found := false
	forEachEntry(b, func(e []byte, k uint64) bool {
		if k == key {
			found = string(e[entryHead:]) == addr || int64(binary.LittleEndian.Uint64(e[8:])) >= at.UnixMilli()
			return false
		}
		return true
	})
	return found
}

// lookup returns key's replica and prompt blocks when its entry is younger than maxAge.
func (a *affinity) lookup(key uint64, maxAge time.Duration, now time.Time) (string, int, bool) {
	b, _, err := a.value.sharedData(affinityKeys[key%affinityBuckets])
	if err != nil {
		return "", 0, false
	}
	var found []byte
	forEachEntry(b, func(e []byte, k uint64) bool {
		if k == key {
			found = e
		}
		return found == nil
	})
	if found == nil {
		return "", 0, false
	}
	at := time.UnixMilli(int64(binary.LittleEndian.Uint64(found[8:])))
	if now.Sub(at) > maxAge {
		return "", 0, false
	}
	blocks := int(binary.LittleEndian.Uint32(found[16:]))
	return a.names.keep(string(found[entryHead:])), blocks, true
}

// forEachEntry calls f with each whole entry of bucket b and its key, newest first,
// until f returns false; a bucket without the magic, or a torn entry, ends it.
func forEachEntry(b []byte, f func(entry []byte, key uint64) bool) {
	if len(b) < len(affinityMagic) || string(b[:len(affinityMagic)]) != affinityMagic {
		return
	}
	for b = b[len(affinityMagic):]; len(b) >= entryHead; {
		n := entryHead + int(b[entryHead-1])
		if len(b) < n || !f(b[:n], binary.LittleEndian.Uint64(b)) {
			return
		}
		b = b[n:]
	}
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
