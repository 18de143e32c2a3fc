package policy

import (
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// CHWBL is consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
// SODA 2018) on the request's prefix key: the key's point on a ring of virtual nodes,
// then clockwise to the first replica whose load (this router's in-flight requests)
// stays within ceil(c x (in flight + 1) / replicas). A proxy has no tokenizer, so the key
// is the first KeyBytes bytes of the messages JSON (Request.PrefixInput) (1,024 bytes, about SMG prefix_hash's
// 256 tokens).
type CHWBL struct {
	Base
	f        Fleet
	c        float64
	keyBytes int
	ring     []point
	load     []int
	total    int
	order    []int
	seen     []bool
}

type point struct {
	h       uint64
	replica int
}

// CHWBL defaults: c = 1.25 (the issue; HAProxy's hash-balance-factor 125), 128 virtual
// nodes per replica.
const (
	DefaultCHWBLFactor = 1.25
	chwblVNodes        = 128
	chwblKeyBytes      = 1024
)

// NewCHWBL returns a CHWBL router with load factor c.
func NewCHWBL(f Fleet, c float64) *CHWBL {
	p := &CHWBL{f: f, c: c, keyBytes: chwblKeyBytes, load: make([]int, f.Len()), seen: make([]bool, f.Len())}
	for i := range f.Len() {
		for v := range chwblVNodes {
			p.ring = append(p.ring, point{xxhash.Sum64String(f.Addr(i) + "#" + strconv.Itoa(v)), i})
		}
	}
	slices.SortFunc(p.ring, func(a, b point) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return a.replica - b.replica
	})
	return p
}

func (p *CHWBL) Name() string { return "chwbl" }

// Key is the ring key of r.
func (p *CHWBL) Key(r *workload.Request) uint64 {
	b := r.PrefixInput
	if len(b) > p.keyBytes {
		b = b[:p.keyBytes]
	}
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], xxhash.Sum64String(r.Model))
	return xxhash.Sum64(append(seed[:], b...))
}

func (p *CHWBL) Route(r *workload.Request, _ time.Duration) Choice {
	n := 0
	for i := range p.f.Len() {
		if p.f.Up(i) {
			n++
		}
	}
	if n == 0 {
		return Choice{}
	}
	limit := int(ceilDiv(p.c*float64(p.total+1), float64(n)))
	k := p.Key(r)
	start, _ := slices.BinarySearchFunc(p.ring, k, func(pt point, k uint64) int {
		if pt.h < k {
			return -1
		}
		if pt.h > k {
			return 1
		}
		return 0
	})
	p.order = p.order[:0]
	clear(p.seen)
	var fallback []int
	for j := range len(p.ring) {
		pt := p.ring[(start+j)%len(p.ring)]
		i := pt.replica
		if p.seen[i] || !p.f.Up(i) {
			continue
		}
		p.seen[i] = true
		if p.load[i]+1 <= limit {
			p.order = append(p.order, i)
			if len(p.order) == 3 {
				break
			}
		} else {
			fallback = append(fallback, i)
		}
	}
	p.order = append(p.order, fallback...) // only when every replica is at its bound
	return Choice{Order: p.order[:min(3, len(p.order))]}
}

func ceilDiv(a, b float64) float64 {
	q := a / b
	if q != float64(int(q)) {
		return float64(int(q) + 1)
	}
	return q
}

func (p *CHWBL) Sent(_ *workload.Request, i int, _ time.Duration) {
	p.load[i]++
	p.total++
}

func (p *CHWBL) Finished(_ *workload.Request, i int, _ time.Duration, _ Outcome) {
	p.load[i]--
	p.total--
}
