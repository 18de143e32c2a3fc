// Encoding a frame: the byte writer and the layout of a model's head, its config and
// its entries.

package table

import (
	"encoding/binary"
	"hash/crc32"
	"math"
)

type writer struct {
	b      []byte
	format uint8
}

func newWriter(format uint8, k Kind, version, base uint64, generatedMs int64) *writer {
	w := &writer{b: make([]byte, headerSize, 4096), format: format}
	copy(w.b, magic)
	w.b[4] = format
	w.b[5] = byte(k)
	binary.LittleEndian.PutUint64(w.b[8:], version)
	binary.LittleEndian.PutUint64(w.b[16:], base)
	binary.LittleEndian.PutUint64(w.b[24:], uint64(generatedMs))
	return w
}

func (w *writer) uv(v uint64) { w.b = binary.AppendUvarint(w.b, v) }

func (w *writer) str(s string) { w.uv(uint64(len(s))); w.b = append(w.b, s...) }

func (w *writer) modelHead(name string, flags byte, c ModelConfig, rs []Replica, tiers []string) {
	w.config(name, flags, c, tiers)
	w.uv(uint64(len(rs)))
	for _, r := range rs {
		w.uv(uint64(r.Slot))
		w.str(r.ID)
		w.str(r.Addr)
		w.uv(uint64(r.Speed))
		w.uv(r.Queued)
		w.uv(quantize(r.KVUsage, 10000))
		w.uv(uint64(r.StateAgeMs))
		var fl byte
		if r.Healthy {
			fl = 1
		}
		w.b = append(w.b, fl)
		if hasLoad(w.format) {
			w.load(&r)
		}
	}
}

// load writes a replica's load values (format 3).
func (w *writer) load(r *Replica) {
	w.uv(quantize(r.Running, 100))
	w.uv(quantize(r.Busy, 10000))
	w.uv(uint64(r.MeanUncached))
}

func (w *writer) config(name string, flags byte, c ModelConfig, tiers []string) {
	w.str(name)
	w.b = append(w.b, flags)
	w.uv(uint64(c.BlockBytes))
	w.uv(uint64(c.BlockTokens))
	w.uv(uint64(c.Stride))
	w.uv(quantize(c.BytesPerToken, 1000))
	if hasTiers(w.format) {
		w.uv(uint64(len(tiers)))
		for _, t := range tiers {
			w.str(t)
		}
	}
}

// patchedHead is modelHead for a patched section (formats 2 on; format 2 leaves the
// load out).
func (w *writer) patchedHead(mc *ModelChange) {
	w.config(mc.Name, flagPatched, mc.Config, mc.Tiers)
	w.uv(uint64(len(mc.Replicas)))
	for i, r := range mc.Replicas {
		f := mc.ReplicaFields[i]
		if !hasLoad(w.format) {
			f &^= patchLoad
		}
		w.uv(uint64(r.Slot))
		w.b = append(w.b, f)
		if f&patchIdentity != 0 {
			w.str(r.ID)
			w.str(r.Addr)
			w.uv(uint64(r.Speed))
		}
		if f&patchQueued != 0 {
			w.uv(r.Queued)
		}
		if f&patchKV != 0 {
			w.uv(quantize(r.KVUsage, 10000))
		}
		if f&patchAge != 0 {
			w.uv(uint64(r.StateAgeMs))
		}
		if f&patchLoad != 0 {
			w.load(&r)
		}
	}
	w.uv(uint64(len(mc.Dropped)))
	for _, s := range mc.Dropped {
		w.uv(uint64(s))
	}
}

func (w *writer) entry(k uint64, slots []uint32) {
	w.b = binary.LittleEndian.AppendUint64(w.b, k)
	w.uv(uint64(len(slots)))
	for _, s := range slots {
		w.uv(uint64(s))
	}
}

// home writes one home: its key and slot.
func (w *writer) home(k uint64, slot uint32) {
	w.b = binary.LittleEndian.AppendUint64(w.b, k)
	w.uv(uint64(slot))
}

func (w *writer) finish() []byte {
	binary.LittleEndian.PutUint32(w.b[32:], uint32(len(w.b)-headerSize))
	return binary.LittleEndian.AppendUint32(w.b, crc32.Checksum(w.b, castagnoli))
}

func quantize(v, scale float64) uint64 {
	if !(v > 0) { // also NaN
		return 0
	}
	q := math.Round(v * scale)
	if q > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint64(q)
}
