// Decoding a frame: a bounded reader that refuses a malformed frame before anything
// is applied.

package table

import (
	"encoding/binary"
	"fmt"
	"math"
)

// reader decodes the payload with a sticky error: after the first problem every read
// returns zero values, so the decoding code reads straight through and checks once.
type reader struct {
	b      []byte
	err    error
	format uint8
	kind   Kind
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (r *reader) uv() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// uvMax reads a varint that must not exceed max.
func (r *reader) uvMax(max uint64, what string) uint64 {
	v := r.uv()
	if v > max {
		r.fail("%s %d above %d", what, v, max)
		return 0
	}
	return v
}

// count reads an element count and checks it against the bytes left, given that each
// element takes at least minSize bytes: a corrupt count cannot make us allocate much.
func (r *reader) count(minSize int) int {
	v := r.uv()
	if r.err == nil && v > uint64(len(r.b)/minSize) {
		r.fail("count %d does not fit in %d bytes", v, len(r.b))
		return 0
	}
	return int(v)
}

func (r *reader) byte1() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) str(what string) string {
	n := r.uvMax(MaxStringLen, what+" length")
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.fail("truncated %s", what)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) model() ModelChange {
	var mc ModelChange
	mc.Name = r.str("model name")
	flags := r.byte1()
	known := byte(flagRemoved | flagReset)
	if hasTiers(r.format) && r.kind == Delta {
		known |= flagPatched
	}
	if flags&^known != 0 || flags&flagPatched != 0 && flags&^flagPatched != 0 {
		r.fail("model %q: unknown flags %#x", mc.Name, flags)
	}
	if flags&flagRemoved != 0 {
		mc.Removed = true
		return mc
	}
	mc.Reset = flags&flagReset != 0
	mc.Config = ModelConfig{
		BlockBytes:    uint32(r.uvMax(math.MaxUint32, "block_bytes")),
		BlockTokens:   uint32(r.uvMax(math.MaxUint32, "block_tokens")),
		Stride:        uint32(r.uvMax(math.MaxUint32, "stride")),
		BytesPerToken: float64(r.uvMax(math.MaxUint32, "bytes_per_token")) / 1000,
	}
	if hasTiers(r.format) {
		nt := r.count(2)
		if nt > MaxTiers {
			r.fail("model %q: %d tiers, at most %d", mc.Name, nt, MaxTiers)
		}
		for i := 0; i < nt && r.err == nil; i++ {
			mc.Tiers = append(mc.Tiers, r.str("tier name"))
		}
		if r.err == nil {
			if err := checkTiers(mc.Tiers); err != nil {
				r.fail("model %q: %v", mc.Name, err)
			}
		}
	}
	maxHolder := uint64(MaxSlot)
	if hasTiers(r.format) {
		maxHolder = uint64(Holder(MaxSlot, len(mc.Tiers)))
	}
	nr := 0
	if flags&flagPatched != 0 {
		r.patch(&mc)
	} else {
		nr = r.count(10) // slot, two strings, four varints, flags
	}
	if nr > MaxSlot+1 {
		r.fail("model %q: %d replicas", mc.Name, nr)
	}
	for i := 0; i < nr && r.err == nil; i++ {
		mc.Replicas = append(mc.Replicas, Replica{
			Slot:       uint32(r.uvMax(MaxSlot, "slot")),
			ID:         r.str("replica id"),
			Addr:       r.str("replica addr"),
			Speed:      uint32(r.uvMax(math.MaxUint32, "speed")),
			Queued:     r.uv(),
			KVUsage:    float64(r.uvMax(10000, "kv_usage")) / 10000,
			StateAgeMs: uint32(r.uvMax(math.MaxUint32, "state_age_ms")),
			Healthy:    r.flag(),
		})
		if hasLoad(r.format) {
			r.load(&mc.Replicas[len(mc.Replicas)-1])
		}
	}
	nu := r.count(10) // key and at least one slot count and slot
	var prev uint64
	for i := 0; i < nu && r.err == nil; i++ {
		k := r.u64()
		if i > 0 && k <= prev {
			r.fail("model %q: upsert keys not increasing at %d", mc.Name, i)
		}
		prev = k
		ns := r.count(1)
		if ns == 0 && r.err == nil {
			r.fail("model %q: key %#x with no slots", mc.Name, k)
		}
		if len(mc.Upserts.off) == 0 {
			mc.Upserts.off = append(mc.Upserts.off, 0)
		}
		mc.Upserts.Keys = append(mc.Upserts.Keys, k)
		var ps uint64
		for j := 0; j < ns && r.err == nil; j++ {
			s := r.uvMax(maxHolder, "slot")
			if j > 0 && s <= ps {
				r.fail("model %q: key %#x slots not increasing", mc.Name, k)
			}
			ps = s
			mc.Upserts.slots = append(mc.Upserts.slots, uint32(s))
		}
		mc.Upserts.off = append(mc.Upserts.off, uint32(len(mc.Upserts.slots)))
	}
	nd := r.count(8)
	if mc.Reset && nd != 0 {
		r.fail("model %q: reset section removes keys", mc.Name)
	}
	mc.Removes = r.increasing(nd, mc.Removes, "model %q: removed keys not increasing", mc.Name)
	// A key both upserted and removed in one section has no single meaning.
	if k, ok := common(mc.Upserts.Keys, mc.Removes); ok {
		r.fail("model %q: key %#x both upserted and removed", mc.Name, k)
	}
	if hasHomes(r.format) {
		r.homes(&mc)
	}
	return mc
}

// homes reads a section's homes (format 4): keys set with their slots, keys removed.
func (r *reader) homes(mc *ModelChange) {
	h := &mc.Homes
	n := r.count(9) // key and slot
	for i := 0; i < n && r.err == nil; i++ {
		k := r.u64()
		if i > 0 && k <= h.Keys[i-1] {
			r.fail("model %q: home keys not increasing", mc.Name)
		}
		h.Add(k, uint32(r.uvMax(MaxSlot, "home slot")))
	}
	nd := r.count(8)
	if mc.Reset && nd != 0 {
		r.fail("model %q: reset section removes homes", mc.Name)
	}
	h.Removes = r.increasing(nd, h.Removes, "model %q: removed homes not increasing", mc.Name)
	if k, ok := common(h.Keys, h.Removes); ok {
		r.fail("model %q: home %#x both set and removed", mc.Name, k)
	}
}

// increasing appends n u64 keys to keys, failing with the message format and args
// unless each is above the one before.
func (r *reader) increasing(n int, keys []uint64, format string, args ...any) []uint64 {
	for i := 0; i < n && r.err == nil; i++ {
		k := r.u64()
		if i > 0 && k <= keys[len(keys)-1] {
			r.fail(format, args...)
		}
		keys = append(keys, k)
	}
	return keys
}

// common is the first key two increasing lists share, if any.
func common(a, b []uint64) (uint64, bool) {
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] < b[j]:
			i++
		case b[j] < a[i]:
			j++
		default:
			return a[i], true
		}
	}
	return 0, false
}

// patch reads a patched section's replicas and dropped slots (format 2 deltas).
func (r *reader) patch(mc *ModelChange) {
	mc.Patched = true
	n := r.count(2) // slot and fields
	if n > MaxSlot+1 {
		r.fail("model %q: %d replicas", mc.Name, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		var p Replica
		p.Slot = uint32(r.uvMax(MaxSlot, "slot"))
		if i > 0 && p.Slot <= mc.Replicas[i-1].Slot {
			r.fail("model %q: patched slots not increasing", mc.Name)
		}
		f := r.byte1()
		if f&^patchKnown != 0 || f&patchLoad != 0 && !hasLoad(r.format) {
			r.fail("model %q: unknown replica fields %#x", mc.Name, f)
		}
		if f&patchIdentity != 0 {
			p.ID, p.Addr = r.str("replica id"), r.str("replica addr")
			p.Speed = uint32(r.uvMax(math.MaxUint32, "speed"))
		}
		if f&patchQueued != 0 {
			p.Queued = r.uv()
		}
		if f&patchKV != 0 {
			p.KVUsage = float64(r.uvMax(10000, "kv_usage")) / 10000
		}
		if f&patchAge != 0 {
			p.StateAgeMs = uint32(r.uvMax(math.MaxUint32, "state_age_ms"))
		}
		if f&patchLoad != 0 {
			r.load(&p)
		}
		p.Healthy = f&patchHealthy != 0
		mc.Replicas = append(mc.Replicas, p)
		mc.ReplicaFields = append(mc.ReplicaFields, f)
	}
	nd := r.count(1)
	for i := 0; i < nd && r.err == nil; i++ {
		s := uint32(r.uvMax(MaxSlot, "dropped slot"))
		if i > 0 && s <= mc.Dropped[i-1] {
			r.fail("model %q: dropped slots not increasing", mc.Name)
		}
		mc.Dropped = append(mc.Dropped, s)
	}
}

// load reads a replica's load values (format 3).
func (r *reader) load(p *Replica) {
	p.Running = float64(r.uvMax(math.MaxUint32, "running")) / 100
	p.Busy = float64(r.uvMax(10000, "busy")) / 10000
	p.MeanUncached = uint32(r.uvMax(math.MaxUint32, "mean_uncached"))
}

func (r *reader) flag() bool {
	f := r.byte1()
	if f&^1 != 0 {
		r.fail("unknown replica flags %#x", f)
	}
	return f&1 != 0
}
