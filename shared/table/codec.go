package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// Wire format (all integers little-endian; "uv" is an unsigned varint):
//
//	header   "KVRT" | u8 format (1 to 4) | u8 kind (1 full, 2 delta) | u16 reserved (0)
//	         u64 version | u64 base version (delta only, else 0) | i64 generated Unix ms
//	         u32 payload length
//	payload  uv model count, then per model:
//	           str name | u8 flags (1 removed, 2 reset: entries start empty,
//	                                4 replicas patched: format 2 on, deltas, not with reset)
//	           unless removed:
//	             uv block_bytes | uv block_tokens | uv stride | uv bytes_per_token x1000
//	             format 2 on: uv tier count (<= 8), then per tier: str medium name
//	             uv replica count, then per replica:
//	               uv slot | str id | str addr | uv speed | uv queued | uv kv_usage x10000
//	               uv state_age_ms | u8 flags (1 healthy)
//	               format 3: uv running | uv busy x10000 | uv mean_uncached
//	             or, patched: the replicas that changed since the base (slots strictly
//	             increasing), then the slots that left (see patch.go):
//	               uv slot | u8 fields (1 healthy, 2 identity, 4 queued, 8 kv, 16 age,
//	               32 load: format 3)
//	               [str id | str addr | uv speed] [uv queued] [uv kv_usage x10000]
//	               [uv state_age_ms] [uv running | uv busy x10000 | uv mean_uncached],
//	               each when its field bit is set
//	               uv dropped count, then slots (uv, strictly increasing)
//	             uv upsert count, then per upsert (keys strictly increasing):
//	               u64 key | uv slot count (>= 1) | slots (uv, strictly increasing)
//	               (format 2 on: each is a holder, tier << 16 | slot, tier <= tier count)
//	             uv remove count, then u64 keys strictly increasing (0 when reset)
//	             format 4: uv home count, then per home (keys strictly increasing):
//	               u64 key | uv slot
//	             format 4: uv home remove count, then u64 keys strictly increasing
//	               (0 when reset)
//	trailer  u32 CRC-32C of header and payload
//	str = uv length | bytes
//
// A full frame resets every model; a delta names only the models that changed and carries
// their replica list: in format 1 whole, so queue terms are fresh on every version; in
// format 2 whole or patched (what changed since the base, the state ages of the others
// advanced by the time between the two versions).
//
// Format 2 adds the slower KV tiers (offloaded blocks, see Holder), format 3 each
// replica's load (Replica.Running, Busy, MeanUncached), format 4 the homes (homes.go):
// a filter says in its poll which formats it reads (api.TableFormatsHeader) and gets the
// newest it listed. A format-1 frame of a table with tiers carries its GPU holders only,
// and is byte for byte the frame a control plane without tiers sends for the same GPU
// holdings; a format-2 frame is the format-3 frame without the load values, and a
// format-3 frame the format-4 frame without the homes.

const (
	magic = "KVRT"
	// FormatVersion is the original format, which every filter reads.
	FormatVersion = 1
	// FormatTiers is format 2: format 1 plus slower tiers.
	FormatTiers = 2
	// FormatLoad is format 3: format 2 plus each replica's load.
	FormatLoad = 3
	// FormatHomes is format 4: format 3 plus each model's homes.
	FormatHomes = 4
	headerSize  = 36
	trailerSize = 4

	flagRemoved = 1
	flagReset   = 2
	flagPatched = 4 // format 2 on
)

// Kind says whether a frame is a full snapshot or a delta.
type Kind uint8

const (
	Full  Kind = 1
	Delta Kind = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is wrapped by every error about a frame's bytes.
var ErrCorrupt = errors.New("corrupt table frame")

// ErrBaseMismatch is returned when a delta does not apply to the table's version; the
// caller should fetch a full snapshot.
var ErrBaseMismatch = errors.New("delta base is not the table's version")

// Entries is a sorted list of (key, slots) pairs stored flat.
type Entries struct {
	Keys  []uint64
	off   []uint32 // slots of entry i are slots[off[i]:off[i+1]]
	slots []uint32
}

// Add appends an entry; keys must be added in increasing order, slots sorted.
func (e *Entries) Add(key uint64, slots ...uint32) {
	if len(e.off) == 0 {
		e.off = append(e.off, 0)
	}
	e.Keys = append(e.Keys, key)
	e.slots = append(e.slots, slots...)
	e.off = append(e.off, uint32(len(e.slots)))
}

// Len is the number of entries.
func (e *Entries) Len() int { return len(e.Keys) }

// At returns entry i.
func (e *Entries) At(i int) (uint64, []uint32) {
	return e.Keys[i], e.slots[e.off[i]:e.off[i+1]]
}

// ModelChange is one model's section of a frame.
type ModelChange struct {
	Name     string
	Removed  bool
	Reset    bool
	Config   ModelConfig
	Replicas []Replica
	// Tiers are the model's slower tiers (format 2; see Model.Tiers).
	Tiers   []string
	Upserts Entries
	Removes []uint64
	// Homes (format 4): keys listed nowhere, with the slot that held each last (homes.go).
	Homes HomeChanges
	// Patched (deltas of format 2 on only, see PatchReplicas): Replicas lists only the
	// replicas that changed since the base, ReplicaFields[i] which of Replicas[i]'s
	// values the frame carries (the others stay the base's), and Dropped the slots that
	// left; every other replica of the base stays, its state age advanced.
	Patched       bool
	ReplicaFields []uint8
	Dropped       []uint32
}

// Frame is a decoded frame: a full snapshot (every model Reset) or a delta.
type Frame struct {
	// Format is the wire format (FormatVersion to FormatHomes; 0 means FormatVersion).
	Format      uint8
	Kind        Kind
	Version     uint64
	Base        uint64
	GeneratedMs int64
	Models      []ModelChange
}

// EncodeFull writes the whole table as a full frame in format 1 (GPU holders only).
func EncodeFull(t *Table) []byte { return EncodeFullFormat(t, FormatVersion) }

// EncodeFullFormat writes the whole table as a full frame in the given format.
func EncodeFullFormat(t *Table, format uint8) []byte {
	format = normFormat(format)
	w := newWriter(format, Full, t.Version, 0, t.GeneratedMs)
	names := t.ModelNames()
	w.uv(uint64(len(names)))
	for _, n := range names {
		m := t.Models[n]
		w.modelHead(m.Name, flagReset, m.Config, m.Replicas, m.Tiers)
		if hasTiers(format) {
			w.uv(uint64(m.Len()))
			m.Each(func(k uint64, slots []uint32) bool {
				w.entry(k, slots)
				return true
			})
		} else {
			// Keys held only in slower tiers are not in a format-1 table; count first.
			nk := 0
			m.Each(func(k uint64, slots []uint32) bool {
				if len(GPUPart(slots)) > 0 {
					nk++
				}
				return true
			})
			w.uv(uint64(nk))
			m.Each(func(k uint64, slots []uint32) bool {
				if g := GPUPart(slots); len(g) > 0 {
					w.entry(k, g)
				}
				return true
			})
		}
		w.uv(0)
		if hasHomes(format) {
			w.uv(uint64(m.HomesLen()))
			m.EachHome(func(k uint64, slot uint32) bool {
				w.home(k, slot)
				return true
			})
			w.uv(0)
		}
	}
	return w.finish()
}

func normFormat(f uint8) uint8 {
	if f >= FormatTiers && f <= FormatHomes {
		return f
	}
	return FormatVersion
}

// hasHomes reports whether format carries homes (4).
func hasHomes(format uint8) bool { return format >= FormatHomes }

// hasTiers reports whether format carries slower tiers (2 and later).
func hasTiers(format uint8) bool { return format >= FormatTiers }

// hasLoad reports whether format carries the replicas' load (3 and later).
func hasLoad(format uint8) bool { return format >= FormatLoad }

// Encode writes f in f.Format. In format 1 an upserted set keeps its GPU holders only,
// and a key left with none is removed (or, in a reset section, left out).
func Encode(f *Frame) []byte {
	format := normFormat(f.Format)
	w := newWriter(format, f.Kind, f.Version, f.Base, f.GeneratedMs)
	w.uv(uint64(len(f.Models)))
	for i := range f.Models {
		mc := &f.Models[i]
		if mc.Removed {
			w.str(mc.Name)
			w.b = append(w.b, flagRemoved)
			continue
		}
		var flags byte
		if mc.Reset {
			flags = flagReset
		}
		if mc.Patched {
			if !hasTiers(format) || mc.Reset || f.Kind != Delta {
				panic(fmt.Sprintf("table: model %q: replica patches exist only in delta sections of format 2 on", mc.Name))
			}
			w.patchedHead(mc)
		} else {
			w.modelHead(mc.Name, flags, mc.Config, mc.Replicas, mc.Tiers)
		}
		ups, rems := &mc.Upserts, mc.Removes
		if format == FormatVersion {
			ups, rems = gpuView(mc)
		}
		w.uv(uint64(ups.Len()))
		for j := 0; j < ups.Len(); j++ {
			w.entry(ups.At(j))
		}
		w.uv(uint64(len(rems)))
		for _, k := range rems {
			w.b = binary.LittleEndian.AppendUint64(w.b, k)
		}
		if hasHomes(format) {
			h := &mc.Homes
			w.uv(uint64(len(h.Keys)))
			for j, k := range h.Keys {
				w.home(k, h.Slots[j])
			}
			w.uv(uint64(len(h.Removes)))
			for _, k := range h.Removes {
				w.b = binary.LittleEndian.AppendUint64(w.b, k)
			}
		}
	}
	return w.finish()
}

// gpuView is a section's upserts and removes as format 1 sees them: GPU holders only.
// It returns the section's own slices when nothing is held in a slower tier.
func gpuView(mc *ModelChange) (*Entries, []uint64) {
	if !slices.ContainsFunc(mc.Upserts.slots, func(h uint32) bool { return h > MaxSlot }) {
		return &mc.Upserts, mc.Removes
	}
	var ups Entries
	var gone []uint64
	for j := 0; j < mc.Upserts.Len(); j++ {
		k, s := mc.Upserts.At(j)
		if g := GPUPart(s); len(g) > 0 {
			ups.Add(k, g...)
		} else if !mc.Reset {
			gone = append(gone, k)
		}
	}
	if len(gone) == 0 {
		return &ups, mc.Removes
	}
	rems := append(slices.Clone(mc.Removes), gone...)
	slices.Sort(rems)
	return &ups, slices.Compact(rems)
}

// Decode parses and verifies a frame without applying it.
func Decode(b []byte) (*Frame, error) {
	if len(b) < headerSize+trailerSize {
		return nil, fmt.Errorf("%w: %d bytes is shorter than header and checksum", ErrCorrupt, len(b))
	}
	if string(b[:4]) != magic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrCorrupt, b[:4])
	}
	if b[4] < FormatVersion || b[4] > FormatHomes {
		return nil, fmt.Errorf("%w: format %d, this build reads %d to %d", ErrCorrupt, b[4], FormatVersion, FormatHomes)
	}
	kind := Kind(b[5])
	if kind != Full && kind != Delta {
		return nil, fmt.Errorf("%w: unknown kind %d", ErrCorrupt, b[5])
	}
	if binary.LittleEndian.Uint16(b[6:]) != 0 {
		return nil, fmt.Errorf("%w: reserved bits set", ErrCorrupt)
	}
	plen := binary.LittleEndian.Uint32(b[32:])
	if uint64(plen) != uint64(len(b)-headerSize-trailerSize) {
		return nil, fmt.Errorf("%w: payload length %d, frame holds %d", ErrCorrupt, plen, len(b)-headerSize-trailerSize)
	}
	body := b[:len(b)-trailerSize]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(b)-trailerSize:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, expected %08x", ErrCorrupt, got, want)
	}
	f := &Frame{
		Format:      b[4],
		Kind:        kind,
		Version:     binary.LittleEndian.Uint64(b[8:]),
		Base:        binary.LittleEndian.Uint64(b[16:]),
		GeneratedMs: int64(binary.LittleEndian.Uint64(b[24:])),
	}
	if kind == Full && f.Base != 0 {
		return nil, fmt.Errorf("%w: full frame with base version %d", ErrCorrupt, f.Base)
	}
	r := reader{b: body[headerSize:], format: f.Format, kind: kind}
	n := r.count(2) // a model section is at least a name length and flags
	seen := map[string]bool{}
	for i := 0; i < n && r.err == nil; i++ {
		mc := r.model()
		if r.err != nil {
			break
		}
		if seen[mc.Name] {
			r.fail("model %q appears twice", mc.Name)
			break
		}
		seen[mc.Name] = true
		if kind == Full && !mc.Reset {
			r.fail("full frame: model %q is not reset", mc.Name)
		}
		f.Models = append(f.Models, mc)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("decode table v%d: %w", f.Version, r.err)
	}
	return f, nil
}
