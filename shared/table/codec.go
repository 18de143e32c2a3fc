package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
)

// Wire format (all integers little-endian; "uv" is an unsigned varint):
//
//	header   "KVRT" | u8 format (1 or 2) | u8 kind (1 full, 2 delta) | u16 reserved (0)
//	         u64 version | u64 base version (delta only, else 0) | i64 generated Unix ms
//	         u32 payload length
//	payload  uv model count, then per model:
//	           str name | u8 flags (1 removed, 2 reset: entries start empty,
//	                                4 replicas patched: format 2 deltas, not with reset)
//	           unless removed:
//	             uv block_bytes | uv block_tokens | uv stride | uv bytes_per_token x1000
//	             format 2 only: uv tier count (<= 8), then per tier: str medium name
//	             uv replica count, then per replica:
//	               uv slot | str id | str addr | uv speed | uv queued | uv kv_usage x10000
//	               uv state_age_ms | u8 flags (1 healthy)
//	             or, patched: the replicas that changed since the base (slots strictly
//	             increasing), then the slots that left (see patch.go):
//	               uv slot | u8 fields (1 healthy, 2 identity, 4 queued, 8 kv, 16 age)
//	               [str id | str addr | uv speed] [uv queued] [uv kv_usage x10000]
//	               [uv state_age_ms], each when its field bit is set
//	               uv dropped count, then slots (uv, strictly increasing)
//	             uv upsert count, then per upsert (keys strictly increasing):
//	               u64 key | uv slot count (>= 1) | slots (uv, strictly increasing)
//	               (format 2: each is a holder, tier << 16 | slot, tier <= tier count)
//	             uv remove count, then u64 keys strictly increasing (0 when reset)
//	trailer  u32 CRC-32C of header and payload
//	str = uv length | bytes
//
// A full frame resets every model; a delta names only the models that changed and carries
// their replica list: in format 1 whole, so queue terms are fresh on every version; in
// format 2 whole or patched (what changed since the base, the state ages of the others
// advanced by the time between the two versions).
//
// Format 2 adds the slower KV tiers (offloaded blocks, see Holder): a filter says in its
// poll which formats it reads (api.TableFormatsHeader) and gets format 2 only if it
// listed it. A format-1 frame of a table with tiers carries its GPU holders only, and is
// byte for byte the frame a control plane without tiers sends for the same GPU holdings.

const (
	magic = "KVRT"
	// FormatVersion is the original format, which every filter reads.
	FormatVersion = 1
	// FormatTiers is format 2: format 1 plus slower tiers.
	FormatTiers = 2
	headerSize  = 36
	trailerSize = 4

	flagRemoved = 1
	flagReset   = 2
	flagPatched = 4 // format 2
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
	Config   Config
	Replicas []Replica
	// Tiers are the model's slower tiers (format 2; see Model.Tiers).
	Tiers   []string
	Upserts Entries
	Removes []uint64
	// Patched (format-2 deltas only, see PatchReplicas): Replicas lists only the
	// replicas that changed since the base, ReplicaFields[i] which of Replicas[i]'s
	// values the frame carries (the others stay the base's), and Dropped the slots that
	// left; every other replica of the base stays, its state age advanced.
	Patched       bool
	ReplicaFields []uint8
	Dropped       []uint32
}

// Frame is a decoded frame: a full snapshot (every model Reset) or a delta.
type Frame struct {
	// Format is the wire format (FormatVersion or FormatTiers; 0 means FormatVersion).
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
		if format == FormatTiers {
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
	}
	return w.finish()
}

func normFormat(f uint8) uint8 {
	if f == FormatTiers {
		return FormatTiers
	}
	return FormatVersion
}

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
			if format != FormatTiers || mc.Reset || f.Kind != Delta {
				panic(fmt.Sprintf("table: model %q: replica patches exist only in format-2 delta sections", mc.Name))
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

// Diff returns the delta that takes old to next: changed models with their full replica
// lists and config, key upserts and removals; models whose block geometry changed are
// reset (their keys mean something else now).
func Diff(old, next *Table) *Frame {
	f := &Frame{Format: next.Format, Kind: Delta, Version: next.Version, Base: old.Version, GeneratedMs: next.GeneratedMs}
	for _, name := range next.ModelNames() {
		nm := next.Models[name]
		om, ok := old.Models[name]
		mc := ModelChange{Name: name, Config: nm.Config, Replicas: nm.Replicas, Tiers: nm.Tiers}
		if !ok || !om.Config.SameGeometry(nm.Config) {
			mc.Reset = true
			nm.Each(func(k uint64, s []uint32) bool { mc.Upserts.Add(k, s...); return true })
		} else {
			diffEntries(om, nm, &mc)
		}
		f.Models = append(f.Models, mc)
	}
	for _, name := range old.ModelNames() {
		if _, ok := next.Models[name]; !ok {
			f.Models = append(f.Models, ModelChange{Name: name, Removed: true})
		}
	}
	return f
}

func diffEntries(om, nm *Model, mc *ModelChange) {
	type entry struct {
		k uint64
		s []uint32
	}
	flat := func(m *Model) []entry {
		out := make([]entry, 0, m.Len())
		m.Each(func(k uint64, s []uint32) bool { out = append(out, entry{k, s}); return true })
		return out
	}
	o, n := flat(om), flat(nm)
	i, j := 0, 0
	for i < len(o) || j < len(n) {
		switch {
		case j == len(n) || (i < len(o) && o[i].k < n[j].k):
			mc.Removes = append(mc.Removes, o[i].k)
			i++
		case i == len(o) || n[j].k < o[i].k:
			mc.Upserts.Add(n[j].k, n[j].s...)
			j++
		default:
			if !slices.Equal(o[i].s, n[j].s) {
				mc.Upserts.Add(n[j].k, n[j].s...)
			}
			i++
			j++
		}
	}
}

// Decode parses and verifies a frame without applying it.
func Decode(b []byte) (*Frame, error) {
	if len(b) < headerSize+trailerSize {
		return nil, fmt.Errorf("%w: %d bytes is shorter than header and checksum", ErrCorrupt, len(b))
	}
	if string(b[:4]) != magic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrCorrupt, b[:4])
	}
	if b[4] != FormatVersion && b[4] != FormatTiers {
		return nil, fmt.Errorf("%w: format %d, this build reads %d and %d", ErrCorrupt, b[4], FormatVersion, FormatTiers)
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

// Apply decodes b and applies it to t: a full frame replaces t, a delta must have t's
// version as its base. On any error t is unchanged.
func (t *Table) Apply(b []byte) (*Frame, error) {
	f, err := Decode(b)
	if err != nil {
		return nil, err
	}
	return f, t.ApplyFrame(f)
}

// ApplyFrame applies a decoded frame (see Apply).
func (t *Table) ApplyFrame(f *Frame) error {
	if f.Kind == Delta && f.Base != t.Version {
		return fmt.Errorf("%w: delta %d->%d, table at %d", ErrBaseMismatch, f.Base, f.Version, t.Version)
	}
	format := normFormat(f.Format)
	if f.Kind == Delta && t.Format != 0 && t.Format != format {
		// The same version holds GPU holders only in format 1 and every tier in format
		// 2: a delta of the other format would leave a mix.
		return fmt.Errorf("%w: format %d delta, table in format %d", ErrBaseMismatch, format, t.Format)
	}
	// Stage every change first so a bad section leaves t as it was.
	staged := make([]*Model, len(f.Models))
	for i := range f.Models {
		mc := &f.Models[i]
		if mc.Removed {
			continue
		}
		if !mc.Reset {
			if _, ok := t.Models[mc.Name]; !ok {
				return fmt.Errorf("%w: delta v%d changes unknown model %q", ErrBaseMismatch, f.Version, mc.Name)
			}
		}
		rs := mc.Replicas
		if mc.Patched {
			var err error
			if rs, err = mc.patchedReplicas(t.Models[mc.Name], t.GeneratedMs, f.GeneratedMs); err != nil {
				return fmt.Errorf("%w: %v", ErrCorrupt, err)
			}
		}
		m, err := NewModel(mc.Name, mc.Config, rs)
		if err == nil {
			err = m.SetTiers(mc.Tiers)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		for j := 0; j < mc.Upserts.Len(); j++ {
			k, slots := mc.Upserts.At(j)
			for _, h := range slots {
				s, tier := SplitHolder(h)
				if m.ReplicaIndex(s) < 0 || tier > len(m.Tiers) {
					return fmt.Errorf("%w: model %q key %#x names slot %d tier %d, which has no replica or tier", ErrCorrupt, mc.Name, k, s, tier)
				}
			}
		}
		staged[i] = m
	}
	models := t.Models
	if f.Kind == Full {
		models = map[string]*Model{}
	}
	for i := range f.Models {
		mc := &f.Models[i]
		switch {
		case mc.Removed:
			delete(models, mc.Name)
		case mc.Reset:
			m := staged[i]
			m.entries.loadSorted(&mc.Upserts)
			models[mc.Name] = m
		default:
			m := models[mc.Name]
			m.Config = mc.Config
			m.Replicas, m.slotIdx = staged[i].Replicas, staged[i].slotIdx
			m.Tiers = staged[i].Tiers
			for j := 0; j < mc.Upserts.Len(); j++ {
				k, slots := mc.Upserts.At(j)
				m.entries.upsert(k, slots)
			}
			for _, k := range mc.Removes {
				m.entries.remove(k)
			}
		}
	}
	t.Models, t.Version, t.GeneratedMs, t.Format = models, f.Version, f.GeneratedMs, format
	return nil
}

// loadSorted fills empty entries from a sorted, unique list, straight into the base.
func (e *entries) loadSorted(u *Entries) {
	e.reset()
	e.keys = slices.Clone(u.Keys)
	e.sets = make([]uint32, len(u.Keys))
	for i := range u.Keys {
		_, s := u.At(i)
		e.sets[i] = e.pool.intern(s)
	}
	e.live = len(e.keys)
}

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

func (w *writer) uv(v uint64)  { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) str(s string) { w.uv(uint64(len(s))); w.b = append(w.b, s...) }

func (w *writer) modelHead(name string, flags byte, c Config, rs []Replica, tiers []string) {
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
	}
}

func (w *writer) config(name string, flags byte, c Config, tiers []string) {
	w.str(name)
	w.b = append(w.b, flags)
	w.uv(uint64(c.BlockBytes))
	w.uv(uint64(c.BlockTokens))
	w.uv(uint64(c.Stride))
	w.uv(quantize(c.BytesPerToken, 1000))
	if w.format == FormatTiers {
		w.uv(uint64(len(tiers)))
		for _, t := range tiers {
			w.str(t)
		}
	}
}

// patchedHead is modelHead for a patched section (format 2).
func (w *writer) patchedHead(mc *ModelChange) {
	w.config(mc.Name, flagPatched, mc.Config, mc.Tiers)
	w.uv(uint64(len(mc.Replicas)))
	for i, r := range mc.Replicas {
		f := mc.ReplicaFields[i]
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
	if r.format == FormatTiers && r.kind == Delta {
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
	mc.Config = Config{
		BlockBytes:    uint32(r.uvMax(math.MaxUint32, "block_bytes")),
		BlockTokens:   uint32(r.uvMax(math.MaxUint32, "block_tokens")),
		Stride:        uint32(r.uvMax(math.MaxUint32, "stride")),
		BytesPerToken: float64(r.uvMax(math.MaxUint32, "bytes_per_token")) / 1000,
	}
	if r.format == FormatTiers {
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
	if r.format == FormatTiers {
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
	for i := 0; i < nd && r.err == nil; i++ {
		k := r.u64()
		if i > 0 && k <= mc.Removes[i-1] {
			r.fail("model %q: removed keys not increasing", mc.Name)
		}
		mc.Removes = append(mc.Removes, k)
	}
	// A key both upserted and removed in one section has no single meaning.
	for i, j := 0, 0; i < len(mc.Upserts.Keys) && j < len(mc.Removes) && r.err == nil; {
		switch a, b := mc.Upserts.Keys[i], mc.Removes[j]; {
		case a < b:
			i++
		case b < a:
			j++
		default:
			r.fail("model %q: key %#x both upserted and removed", mc.Name, a)
		}
	}
	return mc
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
		if f&^patchKnown != 0 {
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

func (r *reader) flag() bool {
	f := r.byte1()
	if f&^1 != 0 {
		r.fail("unknown replica flags %#x", f)
	}
	return f&1 != 0
}
