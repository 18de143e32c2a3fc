package route

import (
	"math"
	"sort"
	"time"

	"github.com/kvroute/kvroute/internal/keymap"
)

// Ledger is a router's own record of prefill work it sent and has not yet seen start:
// the control plane's queue numbers are a snapshot, up to a few hundred milliseconds
// old, and queue depth is the term that goes wrong fastest (docs/rule.md). An entry counts
// on top of the snapshot only if it was sent after the snapshot was measured.
//
// The ledger also corrects the snapshot the other way. A request sent before the
// snapshot was measured and seen to start after it (Started: its first response byte)
// is counted in the snapshot's queue but is no longer queued, so its tokens are taken
// off. Its start is kept for that while a snapshot measured before it may still be used
// (DropStarts).
//
// Every decision asks Sums of every replica, and at a few thousand requests a second a
// proxy's ledger holds thousands of starts, so Sums reads only what can change its
// answer. The correction is T - S: T the tokens of the address's entries sent after the
// snapshot (started or not), S those of its entries started after it (what was sent
// after the snapshot and started after it is in both, and cancels). Each is kept as a
// running sum up to a cursor in a list in time order (ledgerlists.go), which Sums moves
// to the snapshot's time: a snapshot advances by the entries of one table period, so a
// decision reads a few entries, not all those newer than its snapshot: its cost does not
// grow with the snapshot's age (BenchmarkLedgerSums). Expiry pops the oldest end of
// lists kept the same way.
type Ledger struct {
	entries keymap.Map[int32] // request id -> its slot (keymap: a Go map's lookup costs more in the guest)
	slots   []sent            // lists name entries by slot: no map lookup on a walk
	free    []int32
	seq     uint64 // numbers entries: a list's reference to a slot reused since is dead
	starts  int    // entries with a start
	peers   int    // entries of other VMs
	addrs   map[string]*addrLedger
	byID    []*addrLedger // entries name their address by its place here (addrLedger.id)
	freeIDs []int32
	spare   []*addrLedger // emptied ones, reused: an address's first entry allocates nothing
	byAt    refList       // every entry, by send time: Expire
	byPeer  refList       // other VMs' entries, by send time: ExpirePeers
	byStart refList       // started entries, by start time: DropStarts
	visits  int           // references Sums and PendingSince have read (tests)
}

// sent holds no pointer (an address is named by its ledger's id, times are unix ns), so
// the collector does not scan the slots: with an address string and two time.Times an
// entry had three pointers, and the thousands of slots a busy proxy's ledger holds were
// most of what each of the guest's collections marked.
type sent struct {
	id      uint64
	tokens  float64
	at      int64  // sent, unix ns
	started int64  // started, unix ns (when hasStart)
	seq     uint64 // 0 while the slot is free
	addr    int32  // Ledger.byID
	// hasStart: Started was called (only the first call counts).
	hasStart bool
	peer     bool
}

// addrLedger is one address's share: the sum and count of its entries not started, and
// the lists Sums walks.
type addrLedger struct {
	name          string
	id            int32 // its place in Ledger.byID
	pending       float64
	startedTokens float64 // the started entries' tokens
	queued        int     // entries not started
	started       int     // entries started
	sent          refList // every entry, by send time
	starts        refList // started entries, by start time (never before the send)
	sentTo        cursor  // the entries sent by its time
	startedTo     cursor  // the entries started by its time
}

// cursor is a running sum of the tokens of a list's live entries whose times are at
// most t: Sums moves it, and each change of the list's entries keeps it (count).
type cursor struct {
	t   int64
	sum float64
}

// count adds tokens to c if an entry at time t is within it (-tokens: the entry left).
func (c *cursor) count(t int64, tokens float64) {
	if t <= c.t {
		c.sum += tokens
	}
}

func newCursors(a *addrLedger) {
	a.sentTo, a.startedTo = cursor{t: math.MinInt64}, cursor{t: math.MinInt64}
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{addrs: map[string]*addrLedger{}}
}

// Add records that request id sent tokens of prefill work to addr at time at.
func (l *Ledger) Add(id uint64, addr string, tokens float64, at time.Time) {
	l.put(id, addr, sent{tokens: tokens, at: at.UnixNano()})
}

// AddPeer records work another VM of the same proxy sent (filter/placed.go). The other
// VM tells its start (Started) or its end (Done); ExpirePeers drops it either way.
func (l *Ledger) AddPeer(id uint64, addr string, tokens float64, at time.Time) {
	l.put(id, addr, sent{tokens: tokens, at: at.UnixNano(), peer: true})
}

func (l *Ledger) put(id uint64, addr string, s sent) {
	if !(s.tokens >= 0) || math.IsInf(s.tokens, 1) {
		s.tokens = 0 // a running sum keeps a NaN (a torn record from another VM) for good
	}
	if i, ok := l.entries.Get(id); ok {
		l.remove(i)
	}
	i := takeSlot(&l.slots, &l.free)
	l.seq++
	a := l.addr(addr)
	s.id, s.seq, s.addr = id, l.seq, a.id
	l.slots[i] = s
	l.entries.Set(id, i)
	a.pending += s.tokens
	a.queued++
	r := ref{slot: i, seq: s.seq, t: s.at}
	l.push(&a.sent, r, isAny, a.queued+a.started)
	a.sentTo.count(r.t, s.tokens)
	l.push(&l.byAt, r, isAny, l.entries.Len())
	if s.peer {
		l.peers++
		l.push(&l.byPeer, r, isPeer, l.peers)
	}
	for l.entries.Len() > MaxLedgerEntries { // the earliest sent go first
		f, ok := l.byAt.front()
		if !ok {
			break // every entry is listed in byAt; never reached
		}
		l.byAt.pop()
		if _, live := l.lookup(f); live {
			l.remove(f.slot)
		}
	}
}

// MaxLedgerEntries bounds a ledger: 25 s of a proxy's sends at 2,560 requests/s, where
// about 6,000 are held (starts kept 2 s, sends until their first byte). Expiry is by
// time, so without it a host clock stepped back would keep every later entry, dated in
// what is then the future, until the clock caught up.
const MaxLedgerEntries = 1 << 16

func (l *Ledger) addr(addr string) *addrLedger {
	a := l.addrs[addr]
	if a == nil {
		if n := len(l.spare); n > 0 {
			a, l.spare = l.spare[n-1], l.spare[:n-1]
		} else {
			a = &addrLedger{}
		}
		newCursors(a)
		a.name = addr
		if n := len(l.freeIDs); n > 0 {
			a.id, l.freeIDs = l.freeIDs[n-1], l.freeIDs[:n-1]
			l.byID[a.id] = a
		} else {
			a.id = int32(len(l.byID))
			l.byID = append(l.byID, a)
		}
		l.addrs[addr] = a
	}
	return a
}

// ExpirePeers drops the other VMs' entries sent before cutoff, started or not, and says
// how many: one whose start never reached this VM, and a start kept for the snapshots a
// fresh table carries (filter/placed.go keeps them a second, peerTTL; this VM's own
// starts stay until DropStarts).
func (l *Ledger) ExpirePeers(cutoff time.Time) int {
	n := 0
	c := cutoff.UnixNano()
	for r, ok := l.byPeer.front(); ok && r.t < c; r, ok = l.byPeer.front() {
		l.byPeer.pop()
		if _, live := l.lookup(r); live {
			l.remove(r.slot)
			n++
		}
	}
	return n
}

// Started records that request id's prefill was done at at (its first response byte
// arrived): its tokens are no longer queued. Only the first call counts. The entry stays
// as a start until DropStarts drops it, so that a snapshot measured between the send and
// at, which still counts the tokens, is corrected (Sums).
func (l *Ledger) Started(id uint64, at time.Time) {
	i, ok := l.entries.Get(id)
	if !ok || l.slots[i].hasStart {
		return
	}
	s := &l.slots[i]
	a := l.byID[s.addr]
	a.unqueue(s.tokens)
	a.started++
	a.startedTokens += s.tokens
	l.starts++
	s.started, s.hasStart = at.UnixNano(), true
	r := ref{slot: i, seq: s.seq, t: s.started}
	l.push(&l.byStart, r, isStarted, l.starts)
	r.t = startedAt(s)
	l.push(&a.starts, r, isStarted, a.started)
	a.startedTo.count(r.t, s.tokens)
}

// Done ends request id's entry: its prefill started (without a time: nothing to correct)
// or the request ended. A start recorded by Started stays until DropStarts.
func (l *Ledger) Done(id uint64) {
	if i, ok := l.entries.Get(id); ok && !l.slots[i].hasStart {
		l.remove(i)
	}
}

// DropStarts drops the starts recorded before cutoff: no snapshot measured that early is
// used any more.
func (l *Ledger) DropStarts(cutoff time.Time) {
	c := cutoff.UnixNano()
	for r, ok := l.byStart.front(); ok && r.t < c; r, ok = l.byStart.front() {
		l.byStart.pop()
		if s, live := l.lookup(r); live && s.hasStart {
			l.remove(r.slot)
		}
	}
}

// remove frees slot i and takes its entry off its address's sums.
func (l *Ledger) remove(i int32) {
	s := l.slots[i]
	l.slots[i] = sent{}
	l.free = append(l.free, i)
	l.entries.Delete(s.id)
	if s.peer {
		l.peers--
	}
	a := l.byID[s.addr]
	a.sentTo.count(s.at, -s.tokens)
	if !s.hasStart {
		a.unqueue(s.tokens)
	} else {
		a.started--
		a.startedTokens -= s.tokens
		a.startedTo.count(startedAt(&s), -s.tokens)
		l.starts--
	}
	if a.queued == 0 && a.started == 0 { // its lists name no live entry
		delete(l.addrs, a.name)
		l.byID[a.id] = nil
		l.freeIDs = append(l.freeIDs, a.id)
		a.name = ""
		a.sent.reset()
		a.starts.reset()
		a.startedTokens = 0 // no rounding error left over
		if len(l.spare) < maxSpareAddrs {
			l.spare = append(l.spare, a)
		}
	}
}

// maxSpareAddrs bounds the emptied addrLedgers kept for reuse.
const maxSpareAddrs = 64

func (a *addrLedger) unqueue(tokens float64) {
	a.queued--
	a.pending -= tokens
	if a.queued == 0 {
		a.pending = 0 // no rounding error left over
	}
}

// Len is the number of requests in flight before their first response byte.
func (l *Ledger) Len() int { return l.entries.Len() - l.starts }

// Expire drops entries sent before cutoff and says how many of them had not started
// (streams whose end was never seen).
func (l *Ledger) Expire(cutoff time.Time) int {
	n := 0
	c := cutoff.UnixNano()
	for r, ok := l.byAt.front(); ok && r.t < c; r, ok = l.byAt.front() {
		l.byAt.pop()
		if s, live := l.lookup(r); live {
			if !s.hasStart {
				n++
			}
			l.remove(r.slot)
		}
	}
	return n
}

// PendingSince sums the tokens sent to addr after since and not yet started.
func (l *Ledger) PendingSince(addr string, since time.Time) float64 {
	a := l.addrs[addr]
	if a == nil {
		return 0 // the common case between bursts
	}
	return l.sentAfter(a, since.UnixNano())
}

// Sums returns the correction to a snapshot of addr's queue measured at since, and all
// the tokens sent to addr and not yet started (the load term of the stale regime,
// shared/rule). The correction adds what was sent after since and has not started, and
// takes off what was sent by since and started after it; it can be negative.
func (l *Ledger) Sums(addr string, since time.Time) (correction, pending float64) {
	a := l.addrs[addr]
	if a == nil {
		return 0, 0
	}
	c := since.UnixNano()
	sent := a.pending + a.startedTokens - l.through(&a.sent, &a.sentTo, c, isAny, a.pending+a.startedTokens)
	started := a.startedTokens - l.through(&a.starts, &a.startedTo, c, isStarted, a.startedTokens)
	return sent - started, a.pending
}

// startedAt is when s started as its address's starts list has it: never before its
// send (a host clock stepped back), so that what was sent after a snapshot is in the
// list's part after it too, and cancels in Sums as the walk over every entry has it.
func startedAt(s *sent) int64 {
	return max(s.started, s.at)
}

// through moves cur to time c in q (whose live entries, by want, have total tokens)
// and returns its sum: the live entries' tokens at times up to c. It reads the
// entries between the cursor's old time and c, or, when fewer, those after c.
func (l *Ledger) through(q *refList, cur *cursor, c int64, want refState, total float64) float64 {
	if c == cur.t {
		return cur.sum
	}
	rs := q.live()
	to := sort.Search(len(rs), func(i int) bool { return rs[i].t > c })
	from := sort.Search(len(rs), func(i int) bool { return rs[i].t > cur.t })
	tokens := func(i int) float64 {
		l.visits++
		if l.is(rs[i], want) {
			return l.slots[rs[i].slot].tokens
		}
		return 0
	}
	switch {
	case len(rs)-to <= max(to-from, from-to):
		cur.sum = total
		for i := to; i < len(rs); i++ {
			cur.sum -= tokens(i)
		}
	case to > from:
		for i := from; i < to; i++ {
			cur.sum += tokens(i)
		}
	default:
		for i := to; i < from; i++ {
			cur.sum -= tokens(i)
		}
	}
	cur.t = c
	return cur.sum
}

// sentAfter sums a's entries sent after c (unix ns) and not started, newest first.
func (l *Ledger) sentAfter(a *addrLedger, c int64) float64 {
	var sum float64
	rs := a.sent.live()
	for i := len(rs) - 1; i >= 0 && rs[i].t > c; i-- {
		l.visits++
		if s, ok := l.lookup(rs[i]); ok && !s.hasStart {
			sum += s.tokens
		}
	}
	return sum
}

// takeSlot returns the index of a slot of slots to use: the last freed one, or a new
// zero one appended. The ledger and route.Local keep their entries in such slabs.
func takeSlot[T any](slots *[]T, free *[]int32) int32 {
	if n := len(*free); n > 0 {
		i := (*free)[n-1]
		*free = (*free)[:n-1]
		return i
	}
	*slots = append(*slots, *new(T))
	return int32(len(*slots) - 1)
}
