package main

import (
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/route"
)

// A proxy's worker VMs share their placements: the table learns a placement
// only after a report and a new version, some hundreds of milliseconds, and until then
// each VM also matches the placements its siblings made (route.Local), with their
// prefill tokens in its ledger until the sibling says the request started (its first
// response byte; the start is then kept, for snapshots measured before it), for a second
// (peerTTL) in all, so the cost rule sees the queue they make.
//
//	kvroute/placed/seq   the number of the newest record (8 bytes): the only read on
//	                     the request path when nothing is new
//	kvroute/placed/<i>   record number n in slot n % placedRing: its number, the VM that
//	                     wrote it and its kind. A placement: when, its prefill tokens,
//	                     model, replica, the chain's checkpoint keys the table does
//	                     not list on that replica yet (hashes only, at most
//	                     placedMaxKeys) and the VM's placements that started since
//	                     its last record. A start record: those numbers alone. After
//	                     the numbers, when each started (unix ms; 0: it ended without
//	                     a first byte): a reader that finds no times (an older
//	                     module's record) ends the entries.
//
// A writer claims the next number by CAS on the sequence key (with the CAS of the read
// the same request's catch-up just made), then writes the slot: two writes per
// placement and no read. Starts ride along with the VM's next placement, or go out on
// its tick, so they cost no write of their own. A reader reads the slots after the last
// number it saw; a slot holding an older number is not written yet (read again next
// time), a newer one was lapped (skipped). Shared data has no delete: the key set is
// fixed at placedRing + 1.
const (
	placedSeqKey  = "kvroute/placed/seq"
	placedRing    = 64
	placedMaxKeys = 1024
	placedMagic   = "KVP3"
	peerTTL       = time.Second
)

var placedKeys = func() (k [placedRing]string) {
	for i := range k {
		k[i] = "kvroute/placed/" + strconv.Itoa(i)
	}
	return k
}()

// placed is one VM's side of the exchange: it writes the VM's placements and starts,
// and adds its siblings' to the VM's router.
type placed struct {
	vmID   uint64
	value  *hostBuf // the VM's buffer for shared-data reads (hostmem.go)
	router *route.Router
	seen   uint64 // every placement up to this number is read (or its own)
	// The sequence key as the last catch-up read it: a claim right after tries its CAS.
	seqVal, seqCas uint64
	seqFresh       bool
	seqBuf         [8]byte
	buf            []byte   // the record being written (hosts copy what they are given)
	starts         []uint64 // this VM's placements that started, not yet told
	startedMs      []int64  // when each of starts started (unix ms)
	keys           []uint64 // scratch for a sibling's keys
	names          map[string]string
}

func newPlaced(vmID uint64, value *hostBuf, router *route.Router) placed {
	return placed{vmID: vmID, value: value, router: router}
}

// claim takes the next record number (0: the sequence key could not be updated).
func (s *placed) claim() uint64 {
	for try := 0; try < 4; try++ {
		v, cas := s.seqVal, s.seqCas
		if !s.seqFresh || try > 0 {
			b, c, err := s.value.sharedData(placedSeqKey)
			v, cas = 0, uint64(c)
			switch {
			case err == nil && len(b) == 8:
				v = binary.LittleEndian.Uint64(b)
			case err != nil && err != types.ErrorStatusNotFound:
				return 0
			}
		}
		s.seqFresh = false
		n := v + 1
		binary.LittleEndian.PutUint64(s.seqBuf[:], n)
		if proxywasm.SetSharedData(placedSeqKey, s.seqBuf[:], uint32(cas)) != nil {
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
// started takes (0 when it could not be published). keys are the checkpoint keys its own
// Local recorded: those the table does not list on the replica yet (route.Result.LocalKeys).
func (s *placed) share(r *api.Report, keys []uint64, tokens float64) uint64 {
	n := s.claim()
	if n == 0 {
		return 0
	}
	keys = keys[:min(len(keys), placedMaxKeys)]
	b := recordHead(s.buf[:0], n, s.vmID, kindPlaced)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.AtMs))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(tokens)))
	b = appendStr(b, r.Model)
	b = appendStr(b, r.Replica)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, k)
	}
	b = s.appendStarts(b)
	s.buf = b
	_ = put(placedKeys[n%placedRing], b)
	return n
}

// started notes that placement number placed has started at at (its first response
// byte; zero: it ended without one): its prefill is no longer queued, and the siblings
// learn it now, with the time, so that a snapshot measured before it, which still counts
// the prefill as queued, is corrected on every VM (route.Router.Started) while the entry
// is younger than peerTTL, as old as a fresh table's snapshots get. Ending the siblings'
// entries instead would leave them counting such a snapshot's queue in full, and a repeat
// sent right after the answer, on the other VM, could go to another replica
// (TestKvrouteSiblingCorrectsASnapshotTakenBeforeTheStart). Holding the notice for the
// VM's next record or tick (up to 100 ms) would leave the siblings counting a finished
// request's prefill on its replica, with the same effect (TestPrintedCurlRepeatedBackToBackHits
// and TestTwentyRepeatsAtZeroSpacingAllHit in wasmtest/mesh). The notice costs two
// shared-data writes on the response path.
func (s *placed) started(placed uint64, at time.Time) {
	s.starts = append(s.starts, placed)
	ms := int64(0)
	if !at.IsZero() {
		ms = at.UnixMilli()
	}
	s.startedMs = append(s.startedMs, ms)
	s.flushStarts()
}

// flushStarts writes the starts no placement has carried yet as a record of their own
// (on the tick, or when many are waiting).
func (s *placed) flushStarts() {
	if len(s.starts) == 0 {
		return
	}
	n := s.claim()
	if n == 0 {
		return
	}
	b := recordHead(s.buf[:0], n, s.vmID, kindStarted)
	b = s.appendStarts(b)
	s.buf = b
	_ = put(placedKeys[n%placedRing], b)
}

func (s *placed) appendStarts(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s.starts)))
	for _, n := range s.starts {
		b = binary.LittleEndian.AppendUint64(b, n)
	}
	for _, ms := range s.startedMs {
		b = binary.LittleEndian.AppendUint64(b, uint64(ms))
	}
	s.starts, s.startedMs = s.starts[:0], s.startedMs[:0]
	return b
}

func appendStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// catchUp adds the siblings' records written since the last call: one 8-byte read when
// there are none.
func (s *placed) catchUp(now time.Time) {
	// Siblings' entries go a second after their send, started or not: a few each request
	// rather than a tick's worth at once, which would lengthen that tick
	// (BenchmarkKvrouteLeaderTick).
	s.router.ExpirePeers(now.Add(-peerTTL))
	s.seqFresh = false
	b, cas, err := s.value.sharedData(placedSeqKey)
	if err == types.ErrorStatusNotFound {
		s.seqVal, s.seqCas, s.seqFresh = 0, uint64(cas), true
		return
	}
	if err != nil || len(b) != 8 {
		return
	}
	v := binary.LittleEndian.Uint64(b)
	s.seqVal, s.seqCas, s.seqFresh = v, uint64(cas), true
	if v <= s.seen {
		return
	}
	n := max(s.seen+1, v-min(v, placedRing-1))
	for ; n <= v; n++ {
		b, _, err := s.value.sharedData(placedKeys[n%placedRing])
		if err != nil {
			break
		}
		if got := s.apply(b, n, now); got < n {
			break // claimed, not written yet: read it next time
		}
	}
	s.seen = n - 1
}

// apply applies record b if it is number n; it returns the record's number (0 if b is
// not a record).
func (s *placed) apply(b []byte, n uint64, now time.Time) uint64 {
	if len(b) < headLen || string(b[:4]) != placedMagic {
		return 0
	}
	seq := binary.LittleEndian.Uint64(b[4:])
	vm := binary.LittleEndian.Uint64(b[12:])
	if seq != n || vm == s.vmID {
		return seq
	}
	rest := b[headLen:]
	switch b[20] {
	case kindStarted:
		s.applyStarts(rest, now)
	case kindPlaced:
		if len(rest) < 12 {
			return seq
		}
		at := time.UnixMilli(int64(binary.LittleEndian.Uint64(rest)))
		tokens := float64(math.Float32frombits(binary.LittleEndian.Uint32(rest[8:])))
		rest = rest[12:]
		model, rest, ok1 := s.readStr(rest)
		addr, rest, ok2 := s.readStr(rest)
		if !ok1 || !ok2 || len(rest) < 2 {
			return seq
		}
		k := int(binary.LittleEndian.Uint16(rest))
		rest = rest[2:]
		if len(rest) < 8*k {
			return seq
		}
		s.keys = s.keys[:0]
		for i := range k {
			s.keys = append(s.keys, binary.LittleEndian.Uint64(rest[8*i:]))
		}
		s.router.AddPeer(1<<63|seq, model, s.keys, addr, tokens, at, now, peerTTL)
		s.applyStarts(rest[8*k:], now)
	}
	return seq
}

// applyStarts records the starts of a sibling's placements in the ledger at the times
// the record gives (a torn record's time after now counts as now), and ends those that
// ended without one (time 0) or come without times.
func (s *placed) applyStarts(b []byte, now time.Time) {
	if len(b) < 2 {
		return
	}
	k := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	timed := len(b) >= 16*k
	for i := 0; i < k && len(b) >= 8*(i+1); i++ {
		id := 1<<63 | binary.LittleEndian.Uint64(b[8*i:])
		ms := int64(0)
		if timed {
			ms = int64(binary.LittleEndian.Uint64(b[8*(k+i):]))
		}
		if ms > 0 {
			s.router.Started(id, time.UnixMilli(min(ms, now.UnixMilli())))
		} else {
			s.router.Done(id)
		}
	}
}

// readStr reads a length-prefixed string; the few distinct models and replicas are
// kept, so a sibling's record allocates none.
func (s *placed) readStr(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", nil, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, false
	}
	raw := b[2 : 2+n]
	if v, ok := s.names[string(raw)]; ok {
		return v, b[2+n:], true
	}
	if s.names == nil || len(s.names) >= 4096 {
		s.names = map[string]string{}
	}
	v := string(raw)
	s.names[v] = v
	return v, b[2+n:], true
}
