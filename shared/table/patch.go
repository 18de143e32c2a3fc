package table

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Replica patches (deltas of format 2 on): a delta's model section may list only the replicas
// whose state changed since the base version, and of each only the values that changed,
// instead of every replica's whole state. A fleet's replica list is most of a delta (about
// 27 bytes a replica, 5.4 KB at 200 replicas, every version) while few replicas change
// between two versions 50 ms apart.
//
// A replica the section does not list keeps its values, and its state age grows by the
// frame's generated time minus the base's: what the control plane's own age does when no
// newer scrape came (ageAfter). The control plane leaves a value out only when the
// filter's computation gives exactly the value it holds, so a filter's table stays the
// control plane's, value for value.

// Which values a patched replica carries (the replica flags byte of format 2 on
// patches: bit 1 is the health flag, carried always).
const (
	patchHealthy  = 1
	patchIdentity = 2 // id, addr, speed
	patchQueued   = 4
	patchKV       = 8
	patchAge      = 16
	patchLoad     = 32 // running, busy, mean_uncached: format 3
	patchAll      = patchIdentity | patchQueued | patchKV | patchAge | patchLoad
	patchKnown    = patchHealthy | patchAll
)

// ageAfter is a state age of a table generated at fromMs, seen from a table generated at
// toMs (a wall clock stepped back shrinks it, down to 0).
func ageAfter(age uint32, fromMs, toMs int64) uint32 {
	a := int64(age) + (toMs - fromMs)
	if a < 0 {
		return 0
	}
	if a > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(a)
}

// PatchReplicas turns mc's replica list (whole, for a frame generated at genMs) into a
// patch from base, the model's replicas in the frame's base version (generated at
// baseGenMs): the replicas that changed, with the values that changed, and the slots
// that left, as a format-3 frame carries them. Only deltas of format 2 on carry patches;
// a reset or removed section is left whole. mc.Replicas is replaced, not modified.
func (mc *ModelChange) PatchReplicas(base []Replica, baseGenMs, genMs int64) {
	mc.PatchReplicasFormat(base, baseGenMs, genMs, FormatLoad)
}

// PatchReplicasFormat is PatchReplicas for a frame of the given format: format 2 carries
// no load, so a replica whose load alone changed is not listed.
func (mc *ModelChange) PatchReplicasFormat(base []Replica, baseGenMs, genMs int64, format uint8) {
	if mc.Reset || mc.Removed || mc.Patched {
		return
	}
	cur := slices.SortedFunc(slices.Values(mc.Replicas), func(a, b Replica) int { return cmp.Compare(a.Slot, b.Slot) })
	old := slices.SortedFunc(slices.Values(base), func(a, b Replica) int { return cmp.Compare(a.Slot, b.Slot) })
	var listed []Replica
	var fields []uint8
	var dropped []uint32
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(old) && old[i].Slot < cur[j].Slot):
			dropped = append(dropped, old[i].Slot)
			i++
		case i == len(old) || cur[j].Slot < old[i].Slot:
			listed, fields = append(listed, cur[j]), append(fields, patchAll|healthBit(cur[j]))
			j++
		default:
			f := changed(&old[i], &cur[j], baseGenMs, genMs)
			if !hasLoad(format) {
				f &^= patchLoad
			}
			if f != 0 || old[i].Healthy != cur[j].Healthy {
				listed, fields = append(listed, cur[j]), append(fields, f|healthBit(cur[j]))
			}
			i++
			j++
		}
	}
	mc.Replicas, mc.ReplicaFields, mc.Dropped, mc.Patched = listed, fields, dropped, true
}

func healthBit(r Replica) uint8 {
	if r.Healthy {
		return patchHealthy
	}
	return 0
}

// changed is which of r's values a filter holding o (generated at fromMs) does not
// already have, as the wire carries them.
func changed(o, r *Replica, fromMs, toMs int64) uint8 {
	var f uint8
	if o.ID != r.ID || o.Addr != r.Addr || o.Speed != r.Speed {
		f |= patchIdentity
	}
	if o.Queued != r.Queued {
		f |= patchQueued
	}
	if quantize(o.KVUsage, 10000) != quantize(r.KVUsage, 10000) {
		f |= patchKV
	}
	if ageAfter(o.StateAgeMs, fromMs, toMs) != r.StateAgeMs {
		f |= patchAge
	}
	if quantize(o.Running, 100) != quantize(r.Running, 100) || quantize(o.Busy, 10000) != quantize(r.Busy, 10000) ||
		o.MeanUncached != r.MeanUncached {
		f |= patchLoad
	}
	return f
}

// patchedReplicas is the whole replica list a patched section gives model m (the base's)
// in a frame generated at genMs, the base at baseGenMs. The section's lists are sorted
// (Decode checks), and so is m's.
func (mc *ModelChange) patchedReplicas(m *Model, baseGenMs, genMs int64) ([]Replica, error) {
	out := make([]Replica, 0, len(m.Replicas)+len(mc.Replicas))
	base, ps, drop := m.Replicas, mc.Replicas, mc.Dropped
	for len(base) > 0 || len(ps) > 0 {
		switch {
		case len(ps) == 0 || (len(base) > 0 && base[0].Slot < ps[0].Slot):
			r := base[0]
			base = base[1:]
			if len(drop) > 0 && drop[0] == r.Slot {
				drop = drop[1:]
				continue
			}
			r.StateAgeMs = ageAfter(r.StateAgeMs, baseGenMs, genMs)
			out = append(out, r)
		default:
			p, f := ps[0], mc.ReplicaFields[len(mc.Replicas)-len(ps)]
			ps = ps[1:]
			if len(drop) > 0 && drop[0] <= p.Slot {
				return nil, fmt.Errorf("model %q: drops slot %d, which it lists or the base lacks", mc.Name, drop[0])
			}
			if len(base) == 0 || base[0].Slot != p.Slot { // a new replica
				if f&patchAll|patchLoad != patchAll {
					return nil, fmt.Errorf("model %q: new replica in slot %d without all its values", mc.Name, p.Slot)
				}
				out = append(out, p)
				continue
			}
			r := base[0]
			base = base[1:]
			r.StateAgeMs = ageAfter(r.StateAgeMs, baseGenMs, genMs)
			if f&patchIdentity != 0 {
				r.ID, r.Addr, r.Speed = p.ID, p.Addr, p.Speed
			}
			if f&patchQueued != 0 {
				r.Queued = p.Queued
			}
			if f&patchKV != 0 {
				r.KVUsage = p.KVUsage
			}
			if f&patchAge != 0 {
				r.StateAgeMs = p.StateAgeMs
			}
			if f&patchLoad != 0 {
				r.Running, r.Busy, r.MeanUncached = p.Running, p.Busy, p.MeanUncached
			}
			r.Healthy = f&patchHealthy != 0
			out = append(out, r)
		}
		if len(drop) > 0 && (len(base) == 0 || drop[0] < base[0].Slot) && (len(ps) == 0 || drop[0] < ps[0].Slot) {
			return nil, fmt.Errorf("model %q: drops slot %d, which the base lacks", mc.Name, drop[0])
		}
	}
	if len(drop) > 0 {
		return nil, fmt.Errorf("model %q: drops slot %d, which the base lacks", mc.Name, drop[0])
	}
	return out, nil
}
