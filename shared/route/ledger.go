package route

import "time"

// Ledger is a router's own record of prefill work it sent and has not yet seen start:
// the control plane's queue numbers are a snapshot, up to a few hundred milliseconds
// old, and queue depth is the term that goes wrong fastest (docs/rule.md). An entry counts
// on top of the snapshot only if it was sent after the snapshot was measured.
type Ledger struct {
	entries map[uint64]sent
}

type sent struct {
	addr   string
	tokens float64
	at     time.Time
	peer   bool
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{entries: map[uint64]sent{}} }

// Add records that request id sent tokens of prefill work to addr at time at.
func (l *Ledger) Add(id uint64, addr string, tokens float64, at time.Time) {
	l.entries[id] = sent{addr, tokens, at, false}
}

// AddPeer records work another VM of the same proxy sent (filter/placed.go). Its end is
// not seen here: ExpirePeers drops it.
func (l *Ledger) AddPeer(id uint64, addr string, tokens float64, at time.Time) {
	l.entries[id] = sent{addr, tokens, at, true}
}

// ExpirePeers drops the other VMs' entries sent before cutoff and says how many.
func (l *Ledger) ExpirePeers(cutoff time.Time) int {
	n := 0
	for id, s := range l.entries {
		if s.peer && s.at.Before(cutoff) {
			delete(l.entries, id)
			n++
		}
	}
	return n
}

// Done removes request id: its prefill started (response headers arrived) or it ended.
func (l *Ledger) Done(id uint64) { delete(l.entries, id) }

// Len is the number of requests in flight before their first response byte.
func (l *Ledger) Len() int { return len(l.entries) }

// Expire drops entries sent before cutoff (streams whose end was never seen) and says
// how many it dropped.
func (l *Ledger) Expire(cutoff time.Time) int {
	n := 0
	for id, s := range l.entries {
		if s.at.Before(cutoff) {
			delete(l.entries, id)
			n++
		}
	}
	return n
}

// PendingSince sums the tokens sent to addr after since.
func (l *Ledger) PendingSince(addr string, since time.Time) float64 {
	if len(l.entries) == 0 {
		return 0 // the common case between bursts; skips a map iteration per replica
	}
	var sum float64
	for _, s := range l.entries {
		if s.addr == addr && s.at.After(since) {
			sum += s.tokens
		}
	}
	return sum
}

// Sums returns the tokens sent to addr after since (on top of a snapshot measured at
// since) and all the tokens sent to addr and not yet started (the load term of the
// stale regime, shared/rule), in one pass.
func (l *Ledger) Sums(addr string, since time.Time) (recent, all float64) {
	if len(l.entries) == 0 {
		return 0, 0
	}
	for _, s := range l.entries {
		if s.addr == addr {
			all += s.tokens
			if s.at.After(since) {
				recent += s.tokens
			}
		}
	}
	return recent, all
}
