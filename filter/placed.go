package main

import (
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
)

// A proxy's worker VMs share their placements (issue 13): the table learns a placement
// only after a report and a new version, some hundreds of milliseconds, and until then
// each VM also matches the placements its siblings made (route.Local), with their
// prefill tokens in its ledger until the sibling says the request started (its first
// response byte), at most a second (peerTTL), so the cost rule sees the queue they make.
//
//	kvroute/placed/seq   the number of the newest record (8 bytes): the only read on
//	                     the request path when nothing is new
//	kvroute/placed/<i>   record number n in slot n % placedRing: its number, the VM that
//	                     wrote it and its kind. A placement: when, its prefill tokens,
//	                     model, replica and the chain's checkpoint keys (hashes only, at
//	                     most placedMaxKeys). A start: the placement's number.
//
// A writer claims the next number by CAS on the sequence key, then writes the slot. A
// reader reads the slots after the last number it saw; a slot holding an older number
// is not written yet (read again next time), a newer one was lapped (skipped). Shared
// data has no delete: the key set is fixed at placedRing + 1.
const (
	placedSeqKey  = "kvroute/placed/seq"
	placedRing    = 64
	placedMaxKeys = 1024
	placedMagic   = "KVP2"
	peerTTL       = time.Second
)

var placedKeys = func() (k [placedRing]string) {
	for i := range k {
		k[i] = "kvroute/placed/" + strconv.Itoa(i)
	}
	return k
}()

// placed is one VM's side of the exchange.
type placed struct {
	seen uint64 // every placement up to this number is read (or its own)
	buf  []byte
}

// claim takes the next record number (0: the sequence key could not be updated).
func (s *placed) claim() uint64 {
	for range 4 {
		b, cas, err := proxywasm.GetSharedData(placedSeqKey)
		var v uint64
		switch {
		case err == nil && len(b) == 8:
			v = binary.LittleEndian.Uint64(b)
		case err != nil && err != types.ErrorStatusNotFound:
			return 0
		}
		n := v + 1
		if proxywasm.SetSharedData(placedSeqKey, binary.LittleEndian.AppendUint64(nil, n), cas) != nil {
			continue // another VM took n: try n+1
		}
		if s.seen+1 == n {
			s.seen = n // ours: nothing to read
		}
		return n
	}
	return 0
}

func recordHead(b []byte, n, vm uint64, kind byte) []byte {
	b = append(b, placedMagic...)
	b = binary.LittleEndian.AppendUint64(b, n)
	b = binary.LittleEndian.AppendUint64(b, vm)
	return append(b, kind)
}

const (
	kindPlaced  = 'P'
	kindStarted = 'S'
	headLen     = 4 + 8 + 8 + 1
)

// share publishes a placement the VM made to its siblings and returns its number, which
// started takes (0 when it could not be published).
func (s *placed) share(p *plugin, r *api.Report, tokens float64) uint64 {
	n := s.claim()
	if n == 0 {
		return 0
	}
	keys := r.Keys[:min(len(r.Keys), placedMaxKeys)]
	b := make([]byte, 0, headLen+18+len(r.Model)+len(r.Replica)+8*len(keys)) // a host may keep it
	b = recordHead(b, n, p.vmID, kindPlaced)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.AtMs))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(tokens)))
	b = appendStr(b, r.Model)
	b = appendStr(b, r.Replica)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, k)
	}
	_ = put(placedKeys[n%placedRing], b)
	return n
}

// started tells the siblings that placement number placed has started (its first
// response byte): its prefill is no longer queued.
func (s *placed) started(p *plugin, placed uint64) {
	n := s.claim()
	if n == 0 {
		return
	}
	b := recordHead(make([]byte, 0, headLen+8), n, p.vmID, kindStarted)
	b = binary.LittleEndian.AppendUint64(b, placed)
	_ = put(placedKeys[n%placedRing], b)
}

func appendStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// catchUp adds the siblings' records written since the last call: one 8-byte read when
// there are none.
func (s *placed) catchUp(p *plugin, now time.Time) {
	b, _, err := proxywasm.GetSharedData(placedSeqKey)
	if err != nil || len(b) != 8 {
		return
	}
	v := binary.LittleEndian.Uint64(b)
	if v <= s.seen {
		return
	}
	n := max(s.seen+1, v-min(v, placedRing-1))
	for ; n <= v; n++ {
		b, _, err := proxywasm.GetSharedData(placedKeys[n%placedRing])
		if err != nil {
			break
		}
		if got := s.apply(p, b, n, now); got < n {
			break // claimed, not written yet: read it next time
		}
	}
	s.seen = n - 1
}

// apply applies record b if it is number n; it returns the record's number (0 if b is
// not a record).
func (s *placed) apply(p *plugin, b []byte, n uint64, now time.Time) uint64 {
	if len(b) < headLen || string(b[:4]) != placedMagic {
		return 0
	}
	seq := binary.LittleEndian.Uint64(b[4:])
	vm := binary.LittleEndian.Uint64(b[12:])
	if seq != n || vm == p.vmID {
		return seq
	}
	rest := b[headLen:]
	switch b[20] {
	case kindStarted:
		if len(rest) == 8 {
			p.router.Ledger.Done(1<<63 | binary.LittleEndian.Uint64(rest))
		}
	case kindPlaced:
		if len(rest) < 12 {
			return seq
		}
		at := time.UnixMilli(int64(binary.LittleEndian.Uint64(rest)))
		tokens := float64(math.Float32frombits(binary.LittleEndian.Uint32(rest[8:])))
		rest = rest[12:]
		model, rest, ok1 := readStr(rest)
		addr, rest, ok2 := readStr(rest)
		if !ok1 || !ok2 || len(rest) < 2 {
			return seq
		}
		k := int(binary.LittleEndian.Uint16(rest))
		rest = rest[2:]
		if len(rest) != 8*k || now.Sub(at) > p.router.Local.MaxAge {
			return seq
		}
		keys := make([]uint64, k)
		for i := range keys {
			keys[i] = binary.LittleEndian.Uint64(rest[8*i:])
		}
		p.router.Local.Add(model, keys, addr, at)
		if now.Sub(at) < peerTTL {
			p.router.Ledger.AddPeer(1<<63|seq, addr, tokens, at)
		}
	}
	return seq
}

func readStr(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", nil, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
}
