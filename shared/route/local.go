package route

import (
	"math/bits"
	"time"

	"github.com/kvroute/kvroute/internal/keymap"
	"github.com/kvroute/kvroute/shared/table"
)

// Local is this proxy's own recent placements: which replica it sent which chain to,
// matched like the table's entries (shared/rule's package doc) from the moment of the
// decision until a table built Settle after it has had the chance to confirm or refute
// it. The table learns a placement only through a report and a new version, some
// hundreds of milliseconds; until then a repeat of a new prefix would look cold. When
// no table arrives (control plane unreachable) placements are kept up to MaxAge, and at
// most MaxKeys checkpoint keys are held (the oldest placements go first).
//
// Entries hold hashes and replica addresses only. Not safe for concurrent use; the
// filter shares placements between its worker VMs through shared data and adds the
// other VMs' here (filter/placed.go).
type Local struct {
	MaxKeys int
	MaxAge  time.Duration
	Settle  time.Duration
	// RenewAfter: keys a placement on the same model and address at most this far apart
	// in time already holds, from the same first key in the same order, are not renewed
	// (Add). 0 renews every key of every placement.
	RenewAfter time.Duration

	models map[string]*localModel
	byID   []*localModel // placements name their model by its place here (localModel.id)
	addrs  []string
	addrID map[string]uint16
	// The log and the arena are rings addressed by absolute numbers that only grow, so
	// nothing is ever moved down as placements expire: placement i is log[i&(len-1)],
	// the key at position p is arena[p&(len-1)], and ways name absolute positions. A
	// ring grows (doubles, copying what is live) only when what is live does not fit, so
	// no tick pays for compacting (BenchmarkKvrouteLeaderTick's p99).
	log   []localPlacement // in the order added (times non-decreasing in practice)
	arena []uint64         // the log's keys, in the log's order: log[i] holds positions off..off+n-1
	// held has bit p set (in ring order) while an entry's way names position p (its
	// placement holds the key): dropping a placement touches the map only for those,
	// and skips whole placements whose keys later ones all renewed.
	held []uint64
	// Expiry is in two steps so that no call walks everything: Prune only moves live
	// past the expired placements (a comparison each), which hides their holds from
	// match at once (ways before cut); the map work of dropping them is done oldest
	// first, at most localPruneBudget units a call, from head (key scan of log[head]).
	head, live, end int   // placement numbers: head <= live <= end
	scan            int64 // where dropping resumes (a position within log[head])
	lo, hi          int64 // the positions in use: from log[head]'s first to the next free
	cut             int64
	keys            int
	depths          []localDepth
}

// DefaultLocal bounds: 32,768 keys (about 260 prompts of 8,000 tokens at the default
// geometry), 10 minutes (rule.DefaultParams' MaxCacheAge), a table built 1 s after a
// placement knows it (reports every 100 ms, versions every 50 ms, with margin). A key
// is renewed at most every 100 ms by the placements of one prefix to one replica: a
// key may then leave Local up to a tenth of Settle early, when a table that had the
// chance to learn it does not list it.
const (
	DefaultLocalMaxKeys    = 32768
	DefaultLocalMaxAge     = 10 * time.Minute
	DefaultLocalSettle     = time.Second
	DefaultLocalRenewAfter = 100 * time.Millisecond
)

// localPruneBudget bounds one Prune's work, in units of one key dropped (a map lookup
// and a write or delete) or one 64-key word of held scanned. At ten ticks a second that
// drops about 20,000 keys/s; a busier proxy's expired keys past MaxKeys go in Add (the
// size bound, oldest first), in proportion to what each request adds.
const localPruneBudget = 2048

// NewLocal returns an empty Local with the default bounds.
func NewLocal() *Local {
	return &Local{MaxKeys: DefaultLocalMaxKeys, MaxAge: DefaultLocalMaxAge, Settle: DefaultLocalSettle,
		RenewAfter: DefaultLocalRenewAfter, models: map[string]*localModel{}, addrID: map[string]uint16{}}
}

const localWays = 4

// localModel is one model's entries. The map holds each key's place in slots, so that
// renewing a key (most keys of a placement: prompts share prefixes) is one map lookup and
// an update in place; with the entries in the map it would be a lookup and a store of
// the 48-byte entry, each copying it (BenchmarkLocalAdd).
type localModel struct {
	id      int32 // its place in Local.byID
	entries keymap.Map[int32]
	slots   []localEntry
	free    []int32 // slots of dropped keys
	// recent names, by first key and address (recentKey), the newest placement that
	// renewed every key it was given: Add compares a placement with it (covered).
	recent keymap.Map[int64]
}

// recentKey mixes a placement's first key with its address id.
func recentKey(first uint64, addr uint16) uint64 {
	return first ^ (uint64(addr)+1)*0x9E3779B97F4A7C15
}

// entry returns the entry of k, made if new (and whether it was).
func (m *localModel) entry(k uint64) (*localEntry, bool) {
	if i, ok := m.entries.Get(k); ok {
		return &m.slots[i], false
	}
	i := takeSlot(&m.slots, &m.free)
	m.entries.Set(k, i)
	return &m.slots[i], true
}

// localEntry is one checkpoint key: up to localWays replicas it was placed on, and by
// which placement (the absolute position of the key in the arena, so in the order
// added). A way whose position is before Local.cut is expired: match ignores it.
type localEntry struct {
	n    uint8
	addr [localWays]uint16
	pos  [localWays]int64
}

// localPlacement holds no pointer (its model is named by id), so the collector does not
// scan the log: a busy proxy's log holds thousands of placements.
type localPlacement struct {
	model int32 // Local.byID
	off   int64 // the position of its first key
	n     int
	addr  uint16
	atMs  int64
}

type localDepth struct {
	addr  uint16
	depth int
}

// Len is the number of checkpoint keys held, counting those of expired placements not
// dropped yet (Prune drops a bounded number a call).
func (l *Local) Len() int { return l.keys }

// Add records that the chain whose checkpoint keys are keys (at model's stride) was
// placed on addr at at. keys is copied (into storage reused as placements expire).
func (l *Local) Add(model string, keys []uint64, addr string, at time.Time) {
	if len(keys) == 0 || addr == "" {
		return
	}
	id, ok := l.addrID[addr]
	if !ok {
		if len(l.addrs) == 1<<16-1 {
			l.Clear() // replicas come and go; never more than 65,535 addresses
		}
		id = uint16(len(l.addrs))
		l.addrs = append(l.addrs, addr)
		l.addrID[addr] = id
	}
	m := l.models[model] // after a Clear, a new one
	if m == nil {
		m = &localModel{id: int32(len(l.byID))}
		l.models[model] = m
		l.byID = append(l.byID, m)
	}
	atMs := at.UnixMilli()
	skip := l.covered(m, id, keys, atMs)
	if skip == len(keys) {
		return
	}
	first := keys[0]
	keys = keys[skip:]
	l.reserve(len(keys))
	start := l.hi
	if skip == 0 && l.RenewAfter > 0 {
		m.recent.Set(recentKey(first, id), int64(l.end))
	}
	*l.placement(l.end) = localPlacement{m.id, start, len(keys), id, atMs}
	l.end++
	l.hi += int64(len(keys))
	amask := int64(len(l.arena) - 1)
	for i, k := range keys {
		j := start + int64(i)
		l.arena[j&amask] = k
		e, added := m.entry(k)
		if added {
			l.keys++
		}
		w := -1
		for i := 0; i < int(e.n); i++ {
			if e.addr[i] == id {
				w = i
				break
			}
		}
		switch {
		case w >= 0:
			l.unhold(e.pos[w]) // renewed: this placement holds it now
		case int(e.n) < localWays:
			w = int(e.n)
			e.n++
		default:
			w = 0 // the oldest way (expired ones first)
			for i := 1; i < localWays; i++ {
				if e.pos[i] < e.pos[w] {
					w = i
				}
			}
			l.unhold(e.pos[w])
		}
		e.addr[w], e.pos[w] = id, j
		l.setHeld(j)
	}
	for l.keys > l.MaxKeys && l.head < l.end {
		l.drop(l.head+1, int(^uint(0)>>1)) // the oldest placement, whole
		if l.live < l.head {
			l.live = l.head
			l.setCut()
		}
	}
}

// covered returns how many leading keys of a placement on model m, address id at atMs
// need no renewal: the newest placement that renewed every key it was given from the same
// first key to the same address, if it is live and at most RenewAfter apart, still holds
// them, in the same order. Every request of a busy prefix places the same keys on the
// same replica until a table lists them, and each sibling VM applies its copy of the
// placement (filter/placed.go), so a renewal's map operations are paid per key, per
// sibling, per request, more where the table lists none of a prompt (-coldtable: a
// control plane restarted or behind; BenchmarkLocalAdd). Comparing costs a few loads a key.
func (l *Local) covered(m *localModel, id uint16, keys []uint64, atMs int64) int {
	if l.RenewAfter <= 0 {
		return 0
	}
	q, ok := m.recent.Get(recentKey(keys[0], id))
	if !ok || q < int64(l.live) || q >= int64(l.end) {
		return 0
	}
	p := l.placement(int(q))
	if p.model != m.id || p.addr != id || max(p.atMs-atMs, atMs-p.atMs) > l.RenewAfter.Milliseconds() {
		return 0
	}
	amask := int64(len(l.arena) - 1)
	n := min(len(keys), p.n)
	i := 0
	for ; i < n; i++ {
		pos := p.off + int64(i)
		if l.arena[pos&amask] != keys[i] || *l.heldWord(pos)&(1<<(pos&63)) == 0 {
			break // renewed since by another placement, or its way was taken
		}
	}
	return i
}

// Prune expires the placements a table confirmed current at confirmed has had the
// chance to learn (made more than Settle before it), and those older than MaxAge at now:
// match ignores them from now on. Their keys are dropped oldest first, a bounded amount
// a call (localPruneBudget), so that a tick never walks everything.
func (l *Local) Prune(confirmed, now time.Time) {
	cutoff := now.Add(-l.MaxAge).UnixMilli()
	if !confirmed.IsZero() {
		cutoff = max(cutoff, confirmed.Add(-l.Settle).UnixMilli())
	}
	live := l.live
	for l.live < l.end && l.placement(l.live).atMs < cutoff {
		l.live++
	}
	if l.live != live {
		l.setCut()
	}
	l.drop(l.live, localPruneBudget)
}

// Clear forgets every placement.
func (l *Local) Clear() {
	clear(l.models)
	clear(l.byID)
	l.byID = l.byID[:0]
	clear(l.addrID)
	l.addrs, l.keys = l.addrs[:0], 0
	l.reset()
}

// reset empties the log and the arena (no key is held).
func (l *Local) reset() {
	clear(l.log)
	clear(l.held)
	l.head, l.live, l.end = 0, 0, 0
	l.lo, l.scan = l.hi, l.hi
	l.cut = l.hi
}

// placement returns placement number i's slot in the log ring.
func (l *Local) placement(i int) *localPlacement { return &l.log[i&(len(l.log)-1)] }

// reserve makes room in the rings for one more placement of n keys.
func (l *Local) reserve(n int) {
	if l.end-l.head == len(l.log) {
		old := l.log
		l.log = make([]localPlacement, max(2*len(old), 256))
		for i := l.head; i < l.end; i++ {
			l.log[i&(len(l.log)-1)] = old[i&(len(old)-1)]
		}
	}
	need := l.hi + int64(n) - l.lo
	if need <= int64(len(l.arena)) {
		return
	}
	size := max(len(l.arena), 1024)
	for int64(size) < need {
		size *= 2
	}
	arena, held := make([]uint64, size), make([]uint64, size/64)
	copyRing(arena, l.arena, l.lo, l.hi)
	if l.lo < l.hi {
		copyRing(held, l.held, l.lo>>6, (l.hi-1)>>6+1) // bits outside lo..hi are 0
	}
	l.arena, l.held = arena, held
}

// copyRing copies the elements from..to-1 (absolute numbers) of ring src into ring dst,
// in runs that wrap neither.
func copyRing(dst, src []uint64, from, to int64) {
	for i := from; i < to; {
		s, d := i&int64(len(src)-1), i&int64(len(dst)-1)
		n := min(to-i, int64(len(src))-s, int64(len(dst))-d)
		copy(dst[d:d+n], src[s:s+n])
		i += n
	}
}

// The held bit of position p (in use: lo <= p < hi).
func (l *Local) heldWord(p int64) *uint64 { return &l.held[(p>>6)&int64(len(l.held)-1)] }
func (l *Local) setHeld(p int64)          { *l.heldWord(p) |= 1 << (p & 63) }

// setCut moves cut to the first key of log[live]: ways before it are expired.
func (l *Local) setCut() {
	if l.live < l.end {
		l.cut = l.placement(l.live).off
	} else {
		l.cut = l.hi
	}
}

// unhold clears the held bit of the key at position pos. Ways name positions of
// placements not dropped yet; the range check keeps a broken invariant from clearing the
// bit of another position in the same ring slot.
func (l *Local) unhold(pos int64) {
	if pos >= l.lo && pos < l.hi {
		*l.heldWord(pos) &^= 1 << (pos & 63)
	}
}

// drop removes the holds of the placements before log[upto] (those no later placement
// renewed), oldest first, spending at most budget units (a key dropped, a held word
// scanned); it resumes where the last call stopped.
func (l *Local) drop(upto, budget int) {
	for l.head < upto {
		p := l.placement(l.head)
		m := l.byID[p.model]
		i, end := max(l.scan, p.off), p.off+int64(p.n)
		for i < end {
			if budget <= 0 {
				l.scan = i
				return
			}
			budget--
			lim := min(end, (i|63)+1) // the end of i's word
			hw := *l.heldWord(i) >> (i & 63)
			if lim-i < 64 {
				hw &= 1<<(lim-i) - 1
			}
			for hw != 0 {
				if budget <= 0 {
					l.scan = i + int64(bits.TrailingZeros64(hw))
					return
				}
				budget--
				t := int64(bits.TrailingZeros64(hw))
				l.release(m, i+t)
				hw &= hw - 1
			}
			i = lim
		}
		if p.n > 0 { // Add compares with it no more
			rk := recentKey(l.arena[p.off&int64(len(l.arena)-1)], p.addr)
			if q, ok := m.recent.Get(rk); ok && q == int64(l.head) {
				m.recent.Delete(rk)
			}
		}
		*p = localPlacement{}
		l.head++
		if l.head == l.end {
			l.reset()
			return
		}
		l.lo = l.placement(l.head).off
		l.scan = l.lo
	}
}

// release drops the way of the entry for the key at position j that names j.
func (l *Local) release(m *localModel, j int64) {
	*l.heldWord(j) &^= 1 << (j & 63)
	k := l.arena[j&int64(len(l.arena)-1)]
	idx, ok := m.entries.Get(k)
	if !ok {
		return
	}
	e := &m.slots[idx]
	for i := 0; i < int(e.n); i++ {
		if e.pos[i] == j {
			e.n--
			e.addr[i], e.pos[i] = e.addr[e.n], e.pos[e.n]
			e.addr[e.n], e.pos[e.n] = 0, 0
			break
		}
	}
	if e.n == 0 {
		m.entries.Delete(k)
		m.free = append(m.free, idx)
		l.keys--
	}
}

// match raises matched[i] (blocks of c held by m's replica i) to what this proxy placed.
// Chain keys are chained hashes, so a chain that misses a checkpoint misses every later
// one: a walk stops at the first miss. A placement records only the keys past what the
// table listed on its replica (Result.LocalKeys), so there are two walks: from the
// chain's start (placements the table knew nothing of: a new prefix, a spill), and from
// the first checkpoint past inTable, the table's longest match of c on any replica (the
// tails of placements to replicas the table lists with c's prefix).
func (l *Local) match(m *table.Model, c *Chain, matched []int, inTable int) {
	lm := l.models[m.Name]
	if lm == nil || lm.entries.Len() == 0 {
		return
	}
	stride := max(int(m.Config.Stride), 1)
	l.depths = l.depths[:0]
	if end := l.walk(lm, c, stride-1, stride); end < inTable+stride-1 {
		l.walk(lm, c, inTable+stride-1, stride)
	}
	for _, d := range l.depths {
		addr := l.addrs[d.addr]
		for i := range m.Replicas {
			if m.Replicas[i].Addr == addr {
				matched[i] = max(matched[i], d.depth)
				break
			}
		}
	}
}

// walk records in depths how deep each address holds c's checkpoints from position
// from on, up to the first checkpoint none holds, and returns that position.
func (l *Local) walk(lm *localModel, c *Chain, from, stride int) int {
	i := from
	for ; i < len(c.Keys); i += stride {
		idx, ok := lm.entries.Get(c.Keys[i])
		if !ok {
			break
		}
		e := &lm.slots[idx]
		if !l.holds(e) {
			break
		}
	ways:
		for w := 0; w < int(e.n); w++ {
			if e.pos[w] < l.cut {
				continue // expired, not dropped yet
			}
			for j := range l.depths {
				if l.depths[j].addr == e.addr[w] {
					l.depths[j].depth = max(l.depths[j].depth, i+1)
					continue ways
				}
			}
			l.depths = append(l.depths, localDepth{e.addr[w], i + 1})
		}
	}
	return i
}

// holds says whether e has a way not expired.
func (l *Local) holds(e *localEntry) bool {
	for w := 0; w < int(e.n); w++ {
		if e.pos[w] >= l.cut {
			return true
		}
	}
	return false
}
