package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/table"
)

// The table lives in proxy-wasm shared data, written by the leader VM and read by all.
// Istio gives every WasmPlugin on a proxy the same vm_id, so keys carry a prefix.
//
//	kvroute/head               version, base version, base slot and chunk count,
//	                           and when the leader last confirmed the table current
//	kvroute/base/<slot>/<i>    a full frame in chunks, in one of two slots so a new
//	                           base never overwrites the one readers may be loading
//	kvroute/delta/<v % ring>   the delta frame that brings v-1 to v
//
// Shared data has no delete, so the key set is fixed: 2 slots of chunks and a ring.
// A VM reads only the head on each tick (a few dozen bytes) and the frames it is
// missing; every frame is checksummed, so a read torn by a concurrent write is
// detected and retried on the next tick.
const (
	headKey     = "kvroute/head"
	leaseKey    = "kvroute/lease"
	reportQueue = "kvroute/reports"
	chunkSize   = 256 << 10
	deltaRing   = 64
	headSize    = 4 + 8 + 8 + 1 + 4 + 8
	headMagic   = "KVH1"
)

func baseKey(slot byte, i int) string { return fmt.Sprintf("kvroute/base/%d/%d", slot, i) }
func deltaKey(v uint64) string        { return fmt.Sprintf("kvroute/delta/%d", v%deltaRing) }

type head struct {
	version     uint64 // newest version published
	base        uint64 // version of the full frame in baseSlot
	baseSlot    byte
	baseChunks  uint32
	confirmedMs int64 // when the leader last heard the table is current (this host's clock)
}

func (h head) encode() []byte {
	b := make([]byte, 0, headSize)
	b = append(b, headMagic...)
	b = binary.LittleEndian.AppendUint64(b, h.version)
	b = binary.LittleEndian.AppendUint64(b, h.base)
	b = append(b, h.baseSlot)
	b = binary.LittleEndian.AppendUint32(b, h.baseChunks)
	return binary.LittleEndian.AppendUint64(b, uint64(h.confirmedMs))
}

func decodeHead(b []byte) (head, error) {
	if len(b) != headSize || string(b[:4]) != headMagic {
		return head{}, errors.New("kvroute/head: unknown format")
	}
	h := head{
		version:     binary.LittleEndian.Uint64(b[4:]),
		base:        binary.LittleEndian.Uint64(b[12:]),
		baseSlot:    b[20],
		baseChunks:  binary.LittleEndian.Uint32(b[21:]),
		confirmedMs: int64(binary.LittleEndian.Uint64(b[25:])),
	}
	if h.baseSlot > 1 || h.version < h.base || h.version-h.base >= deltaRing {
		return head{}, errors.New("kvroute/head: inconsistent")
	}
	return h, nil
}

func readHead() (head, uint32, error) {
	b, cas, err := proxywasm.GetSharedData(headKey)
	if err != nil {
		return head{}, cas, err
	}
	h, err := decodeHead(b)
	return h, cas, err
}

// view is one VM's decoded copy of the table.
type view struct {
	t         *table.Table
	loaded    bool      // t holds a version read from shared data (or applied by the leader)
	confirmed time.Time // from the head: when the table was last known current
}

func newView() view { return view{t: table.New()} }

// age is how long ago the table was last confirmed current.
func (v *view) age(now time.Time) time.Duration {
	if v.confirmed.IsZero() {
		return time.Hour
	}
	return now.Sub(v.confirmed)
}

// sync catches the local copy up with shared data.
func (v *view) sync(m *metrics, now time.Time) {
	h, _, err := readHead()
	if err != nil {
		if err != types.ErrorStatusNotFound {
			m.tableErrors.Increment(1)
		}
		return
	}
	v.confirmed = time.UnixMilli(h.confirmedMs)
	set(m.tableAgeMs, int64(v.age(now)/time.Millisecond))
	if v.loaded && v.t.Version == h.version {
		return
	}
	if v.loaded && v.t.Version >= h.base && v.t.Version < h.version {
		if err := applyDeltas(v.t, h.version); err == nil {
			m.tableLoads.Increment(1)
			return
		}
		// A delta was overwritten or torn: load the base instead.
	}
	t, err := loadBase(h)
	if err == nil {
		err = applyDeltas(t, h.version)
	}
	if err != nil {
		m.tableErrors.Increment(1)
		proxywasm.LogWarnf("kvroute: table v%d not loaded from shared data, keeping v%d: %v", h.version, v.t.Version, err)
		return
	}
	v.t, v.loaded = t, true
	m.tableLoads.Increment(1)
}

func applyDeltas(t *table.Table, to uint64) error {
	for ver := t.Version + 1; ver <= to; ver++ {
		b, _, err := proxywasm.GetSharedData(deltaKey(ver))
		if err != nil {
			return fmt.Errorf("delta v%d: %w", ver, err)
		}
		f, err := table.Decode(b)
		if err != nil {
			return err
		}
		if f.Kind != table.Delta || f.Version != ver {
			return fmt.Errorf("delta slot of v%d holds v%d", ver, f.Version)
		}
		if err := t.ApplyFrame(f); err != nil {
			return err
		}
	}
	return nil
}

func loadBase(h head) (*table.Table, error) {
	var buf []byte
	for i := 0; i < int(h.baseChunks); i++ {
		c, _, err := proxywasm.GetSharedData(baseKey(h.baseSlot, i))
		if err != nil {
			return nil, fmt.Errorf("base chunk %d: %w", i, err)
		}
		buf = append(buf, c...)
	}
	t := table.New()
	if _, err := t.Apply(buf); err != nil {
		return nil, err
	}
	if t.Version != h.base {
		return nil, fmt.Errorf("base slot holds v%d, head says v%d", t.Version, h.base)
	}
	return t, nil
}

// publishFull writes a full frame as the new base (into the slot readers are not using)
// and points the head at it.
func publishFull(frame []byte, version uint64, confirmed time.Time) error {
	old, cas, err := readHead()
	if err != nil && err != types.ErrorStatusNotFound {
		old = head{}
	}
	slot := byte(0)
	if err == nil {
		slot = 1 - old.baseSlot
	}
	n := 0
	for off := 0; off < len(frame); off += chunkSize {
		if err := put(baseKey(slot, n), frame[off:min(off+chunkSize, len(frame))]); err != nil {
			return err
		}
		n++
	}
	h := head{version: version, base: version, baseSlot: slot, baseChunks: uint32(n), confirmedMs: confirmed.UnixMilli()}
	return proxywasm.SetSharedData(headKey, h.encode(), cas)
}

// publishDelta writes a delta into the ring and advances the head.
func publishDelta(frame []byte, f *table.Frame, confirmed time.Time) error {
	h, cas, err := readHead()
	if err != nil {
		return fmt.Errorf("no head to extend: %w", err)
	}
	if h.version != f.Base {
		return fmt.Errorf("head at v%d, delta is %d->%d", h.version, f.Base, f.Version)
	}
	if f.Version-h.base >= deltaRing {
		return errRingFull
	}
	if err := put(deltaKey(f.Version), frame); err != nil {
		return err
	}
	h.version, h.confirmedMs = f.Version, confirmed.UnixMilli()
	return proxywasm.SetSharedData(headKey, h.encode(), cas)
}

var errRingFull = errors.New("delta ring full")

// confirm records that the control plane said the table is still current.
func confirm(now time.Time) {
	h, cas, err := readHead()
	if err != nil {
		return
	}
	h.confirmedMs = now.UnixMilli()
	_ = proxywasm.SetSharedData(headKey, h.encode(), cas)
}

// put overwrites a key. Envoy treats cas 0 as "unconditional"; hosts that insist on the
// current cas (the SDK's emulator) get it on a second try.
func put(key string, value []byte) error {
	err := proxywasm.SetSharedData(key, value, 0)
	if err == types.ErrorStatusCasMismatch {
		_, cas, gerr := proxywasm.GetSharedData(key)
		if gerr != nil {
			return gerr
		}
		err = proxywasm.SetSharedData(key, value, cas)
	}
	return err
}
