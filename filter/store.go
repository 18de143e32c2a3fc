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
// Istio gives every WasmPlugin on a proxy the same vm_id, so keys carry a prefix. Each
// shard (api.Shard, shards.go) has its own set of these keys: the control_plane block's
// under "kvroute/" as below (the keys the filter always used), a named shard's under
// "kvroute/shard/<name>/" (kvroute/shard/<name>/head, ...).
//
//	kvroute/head               the base version, its slot and chunk count, the chain of
//	                           versions the deltas since then lead to, when the leader
//	                           last confirmed the table current, and the epoch (the
//	                           control-plane replica) the versions are counted in
//	kvroute/base/<slot>/<i>    a full frame in chunks, in one of two slots so a new
//	                           base never overwrites the one readers may be loading
//	kvroute/delta/<n>          the n-th delta after the base (n = 1..deltaRing-1)
//
// Deltas are numbered by their place in the chain, not by version: the control plane
// composes deltas across versions (base 947 -> 949), so versions skip. Shared data has
// no delete, so the key set is fixed. A VM reads only the head on each tick (a few dozen
// bytes) and the frames it is missing; every frame is checksummed and names its base, so
// a read torn by a concurrent write is detected and retried on the next tick.
const (
	leaseKey  = "kvroute/lease"
	chunkSize = 256 << 10
	deltaRing = 64
	headMagic = "KVH3"
	headFixed = 4 + 8 + 1 + 4 + 8 + 1 // then 8 bytes a chain link, then the 8-byte epoch
)

// keys are one shard's keys in shared data, and the name of its report queue. flushed
// and drained are the report buffers' counts (reports.go).
type keys struct {
	prefix, head, queue string
	flushed, drained    string
	// The head is read and written on every VM's tick: into these, reused, so that the
	// ticks make no garbage (each collection's marking lands in a tick or a request).
	buf   hostBuf
	chain []uint64
	enc   []byte
}

// rootKeys are the control_plane block's: the keys of a filter without shards.
var rootKeys = newKeys("")

func newKeys(shard string) keys {
	p := "kvroute/"
	if shard != "" {
		p += "shard/" + shard + "/"
	}
	return keys{prefix: p, head: p + "head", queue: p + reportQueue,
		flushed: p + "reports/flushed", drained: p + "reports/drained",
		buf: hostBuf{keep: headFixed + 8*deltaRing + 8}}
}

func (k *keys) base(slot byte, i int) string { return fmt.Sprintf("%sbase/%d/%d", k.prefix, slot, i) }
func (k *keys) delta(n int) string           { return fmt.Sprintf("%sdelta/%d", k.prefix, n) }

type head struct {
	base        uint64 // version of the full frame in baseSlot
	baseSlot    byte
	baseChunks  uint32
	confirmedMs int64    // when the leader last heard the table is current (this host's clock)
	chain       []uint64 // versions after each delta: delta n brings chain[n-2] (or base) to chain[n-1]
	// epoch is the control-plane process the versions are counted in: two replicas'
	// version numbers say nothing about each other.
	epoch uint64
}

// version is the newest version published.
func (h head) version() uint64 {
	if len(h.chain) == 0 {
		return h.base
	}
	return h.chain[len(h.chain)-1]
}

// after returns the chain position (0 = the base) of version v, or -1.
func (h head) after(v uint64) int {
	if v == h.base {
		return 0
	}
	for i, c := range h.chain {
		if c == v {
			return i + 1
		}
	}
	return -1
}

// encode appends h's bytes to b.
func (h head) encode(b []byte) []byte {
	b = append(b, headMagic...)
	b = binary.LittleEndian.AppendUint64(b, h.base)
	b = append(b, h.baseSlot)
	b = binary.LittleEndian.AppendUint32(b, h.baseChunks)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.confirmedMs))
	b = append(b, byte(len(h.chain)))
	for _, v := range h.chain {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return binary.LittleEndian.AppendUint64(b, h.epoch)
}

// decodeHead decodes b; the chain is appended to chain[:0].
func decodeHead(b []byte, chain []uint64) (head, error) {
	if len(b) < headFixed || string(b[:4]) != headMagic {
		return head{}, errors.New("kvroute/head: unknown format")
	}
	h := head{
		base:        binary.LittleEndian.Uint64(b[4:]),
		baseSlot:    b[12],
		baseChunks:  binary.LittleEndian.Uint32(b[13:]),
		confirmedMs: int64(binary.LittleEndian.Uint64(b[17:])),
		chain:       chain[:0],
	}
	n := int(b[25])
	if h.baseSlot > 1 || n >= deltaRing || len(b) != headFixed+8*n+8 {
		return head{}, errors.New("kvroute/head: inconsistent")
	}
	prev := h.base
	for i := 0; i < n; i++ {
		v := binary.LittleEndian.Uint64(b[headFixed+8*i:])
		if v <= prev {
			return head{}, errors.New("kvroute/head: versions not increasing")
		}
		h.chain, prev = append(h.chain, v), v
	}
	h.epoch = binary.LittleEndian.Uint64(b[len(b)-8:])
	return h, nil
}

// readHead reads the head; its chain is valid until the next readHead.
func (k *keys) readHead() (head, uint32, error) {
	b, cas, err := k.buf.sharedData(k.head)
	if err != nil {
		return head{}, cas, err
	}
	h, err := decodeHead(b, k.chain)
	k.chain = h.chain
	return h, cas, err
}

// writeHead writes h with cas.
func (k *keys) writeHead(h head, cas uint32) error {
	k.enc = h.encode(k.enc[:0])
	return proxywasm.SetSharedData(k.head, k.enc, cas)
}

// view is one VM's decoded copy of the table.
type view struct {
	t         *table.Table
	loaded    bool      // t holds a version read from shared data (or applied by the leader)
	epoch     uint64    // the epoch t's version is counted in
	confirmed time.Time // from the head: when the table was last known current
	lastErr   string    // the last load failure, logged once per change and then every 100th
	errCount  int
}

func newView() view { return view{t: table.New()} }

// age is how long ago the table was last confirmed current.
func (v *view) age(now time.Time) time.Duration {
	if v.confirmed.IsZero() {
		return time.Hour
	}
	return now.Sub(v.confirmed)
}

// sync catches the local copy up with the shard's keys in shared data. It reports
// whether there was a head to read (the table's age is then known).
func (v *view) sync(k *keys, m *metrics, now time.Time) bool {
	h, _, err := k.readHead()
	if err != nil {
		if err != types.ErrorStatusNotFound {
			v.failed(m, 0, err)
		}
		return false
	}
	v.confirmed = time.UnixMilli(h.confirmedMs)
	if v.loaded && v.epoch == h.epoch && v.t.Version == h.version() {
		return true
	}
	if v.loaded && v.epoch == h.epoch {
		if at := h.after(v.t.Version); at >= 0 {
			if err := k.applyDeltas(v.t, h, at+1); err == nil {
				m.tableLoads.Increment(1)
				return true
			}
			// A delta was overwritten or torn: load the base instead.
		}
	}
	t, err := k.loadBase(h)
	if err == nil {
		err = k.applyDeltas(t, h, 1)
	}
	if err != nil {
		v.failed(m, h.version(), err)
		return true
	}
	v.t, v.loaded, v.epoch, v.lastErr, v.errCount = t, true, h.epoch, "", 0
	m.tableLoads.Increment(1)
	return true
}

func (v *view) failed(m *metrics, version uint64, err error) {
	m.tableErrors.Increment(1)
	if msg := err.Error(); msg != v.lastErr || v.errCount%100 == 0 {
		proxywasm.LogWarnf("kvroute: table v%d not loaded from shared data, keeping v%d: %v", version, v.t.Version, err)
		v.lastErr = msg
	}
	v.errCount++
}

// applyDeltas applies the chain's deltas from position from (1-based) to its end.
func (k *keys) applyDeltas(t *table.Table, h head, from int) error {
	for n := from; n <= len(h.chain); n++ {
		b, _, err := proxywasm.GetSharedData(k.delta(n))
		if err != nil {
			return fmt.Errorf("delta %d: %w", n, err)
		}
		f, err := table.Decode(b)
		if err != nil {
			return err
		}
		if f.Kind != table.Delta || f.Version != h.chain[n-1] {
			return fmt.Errorf("delta slot %d holds v%d, head says v%d", n, f.Version, h.chain[n-1])
		}
		if err := t.ApplyFrame(f); err != nil {
			return err
		}
	}
	return nil
}

func (k *keys) loadBase(h head) (*table.Table, error) {
	var buf []byte
	for i := 0; i < int(h.baseChunks); i++ {
		c, _, err := proxywasm.GetSharedData(k.base(h.baseSlot, i))
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
func (k *keys) publishFull(frame []byte, version, epoch uint64, confirmed time.Time) error {
	old, cas, err := k.readHead()
	if err != nil && err != types.ErrorStatusNotFound {
		old = head{}
	}
	slot := byte(0)
	if err == nil {
		slot = 1 - old.baseSlot
	}
	n := 0
	for off := 0; off < len(frame); off += chunkSize {
		if err := put(k.base(slot, n), frame[off:min(off+chunkSize, len(frame))]); err != nil {
			return err
		}
		n++
	}
	h := head{base: version, baseSlot: slot, baseChunks: uint32(n), confirmedMs: confirmed.UnixMilli(), epoch: epoch}
	return k.writeHead(h, cas)
}

// publishDelta writes a delta as the next link of the chain and advances the head.
func (k *keys) publishDelta(frame []byte, f *table.Frame, confirmed time.Time) error {
	h, cas, err := k.readHead()
	if err != nil {
		return fmt.Errorf("no head to extend: %w", err)
	}
	if h.version() != f.Base {
		return fmt.Errorf("head at v%d, delta is %d->%d", h.version(), f.Base, f.Version)
	}
	n := len(h.chain) + 1
	if n >= deltaRing {
		return errRingFull
	}
	if err := put(k.delta(n), frame); err != nil {
		return err
	}
	h.chain = append(h.chain, f.Version)
	h.confirmedMs = confirmed.UnixMilli()
	return k.writeHead(h, cas)
}

var errRingFull = errors.New("delta ring full")

// confirm records that the control plane said the table is still current.
func (k *keys) confirm(now time.Time) {
	h, cas, err := k.readHead()
	if err != nil {
		return
	}
	h.confirmedMs = now.UnixMilli()
	_ = k.writeHead(h, cas)
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
