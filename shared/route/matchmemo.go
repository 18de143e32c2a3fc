package route

import (
	"unsafe"

	"github.com/kvroute/kvroute/internal/byteprefix"
	"github.com/kvroute/kvroute/shared/table"
)

// matchMemo is the last chain the router matched against the table (GPU holders only)
// and its hits, for as long as the model is in the same state (table.Model.Gen): a chain
// that shares its first blocks with it takes their hits from here and reads the table
// only past them. Versions come every 50 ms or so and requests many times more often,
// and those that share a system prompt share most of their chain, whose lookups are
// much of a decision in the wasm guest (BenchmarkKvrouteRequestPath's -guestprofile).
// The answer is Match's (TestMatchMemoAnswersAsMatch).
type matchMemo struct {
	model *table.Model
	gen   uint64
	keys  []uint64
	hits  []table.Hit
}

// maxMemoHits bounds what the memo keeps: a chain whose checkpoints many replicas hold
// is matched in full each time instead.
const maxMemoHits = 4096

// match sets r.matched to m.Match(c.Keys) through the memo.
func (r *Router) match(m *table.Model, keys []uint64) {
	mm := &r.mm
	shared := 0
	if mm.model == m && mm.gen == m.Gen() {
		shared = commonKeys(mm.keys, keys)
	}
	n := 0
	for n < len(mm.hits) && int(mm.hits[n].Block) < shared {
		n++
	}
	mm.hits = m.MatchHits(keys, shared, mm.hits[:n])
	r.matched = m.MatchOfHits(mm.hits, r.matched)
	if len(mm.hits) > maxMemoHits {
		mm.model, mm.keys, mm.hits = nil, mm.keys[:0], mm.hits[:0]
		return
	}
	mm.model, mm.gen = m, m.Gen()
	mm.keys = append(mm.keys[:shared], keys[shared:]...)
}

// commonKeys is how many leading keys a and b share.
func commonKeys(a, b []uint64) int {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	as := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 8*n)
	bs := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 8*n)
	return byteprefix.Len(as, bs) / 8
}
