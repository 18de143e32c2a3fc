package route

// The Ledger's lists: references to entries in time order, read around a cursor
// (Sums, ledger.go), from the newest end (PendingSince) and consumed from the oldest
// (expiry). An entry leaves the lists lazily: a
// reference whose entry is gone, or was replaced (another seq), or no longer has the
// state the list is for, is dead and skipped. A list is compacted when more than half of
// it is dead, so it holds at most about twice its live entries.

// ref names the entry in slot as it was when listed (seq), at time t (unix ns).
type ref struct {
	seq  uint64
	t    int64
	slot int32
}

// refList is a slice of refs ordered by t, with a consumed head.
type refList struct {
	r    []ref
	head int
}

// insert adds x in t order. Times arrive in order except another VM's entries (up to a
// tick late), so the walk from the tail is short.
func (q *refList) insert(x ref) {
	q.r = append(q.r, x)
	i := len(q.r) - 1
	for i > q.head && q.r[i-1].t > x.t {
		q.r[i] = q.r[i-1]
		i--
	}
	q.r[i] = x
}

// live is the part not consumed (dead references included).
func (q *refList) live() []ref { return q.r[q.head:] }

func (q *refList) front() (ref, bool) {
	if q.head < len(q.r) {
		return q.r[q.head], true
	}
	return ref{}, false
}

func (q *refList) pop() {
	q.head++
	if q.head == len(q.r) {
		q.reset()
	}
}

func (q *refList) reset() { q.r, q.head = q.r[:0], 0 }

// refState is what a list's references must still be to be live.
type refState uint8

const (
	isAny refState = iota
	isStarted
	isPeer
)

// lookup returns r's entry if it is still the one r was made for.
func (l *Ledger) lookup(r ref) (*sent, bool) {
	s := &l.slots[r.slot]
	return s, s.seq == r.seq
}

func (l *Ledger) is(r ref, want refState) bool {
	s, ok := l.lookup(r)
	switch {
	case !ok:
		return false
	case want == isStarted:
		return s.hasStart
	case want == isPeer:
		return s.peer
	}
	return true
}

// push inserts r into q, whose live entries number live, and compacts q when more than
// half of it is dead (or, consumed from the head, more than half of its array is).
func (l *Ledger) push(q *refList, r ref, want refState, live int) {
	q.insert(r)
	n := len(q.r) - q.head
	switch {
	case n > 2*live+64:
		w := 0
		for _, x := range q.r[q.head:] {
			if l.is(x, want) {
				q.r[w] = x
				w++
			}
		}
		clear(q.r[w:])
		q.r, q.head = q.r[:w], 0
	case q.head > 64 && q.head > n:
		q.r, q.head = q.r[:copy(q.r, q.r[q.head:])], 0
	}
}
