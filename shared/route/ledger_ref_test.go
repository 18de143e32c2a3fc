package route

import "time"

// refLedger is the Ledger without Sums' cursors: every call walks every entry. TestLedgerMatchesReference holds the Ledger to
// its answers; BenchmarkLedgerSums runs the two side by side.
type refLedger struct {
	entries map[uint64]refSent
	starts  int // entries with a start
}

type refSent struct {
	addr    string
	tokens  float64
	at      time.Time
	started time.Time // zero until Started
	peer    bool
}

// NewrefLedger returns an empty ledger.
func newRefLedger() *refLedger { return &refLedger{entries: map[uint64]refSent{}} }

// Add records that request id sent tokens of prefill work to addr at time at.
func (l *refLedger) Add(id uint64, addr string, tokens float64, at time.Time) {
	l.put(id, refSent{addr: addr, tokens: tokens, at: at})
}

func (l *refLedger) put(id uint64, s refSent) {
	if old, ok := l.entries[id]; ok && !old.started.IsZero() {
		l.starts--
	}
	l.entries[id] = s
}

// AddPeer records work another VM of the same proxy sent (filter/placed.go).
func (l *refLedger) AddPeer(id uint64, addr string, tokens float64, at time.Time) {
	l.put(id, refSent{addr: addr, tokens: tokens, at: at, peer: true})
}

// ExpirePeers drops the other VMs' entries sent before cutoff, started or not, and says
// how many.
func (l *refLedger) ExpirePeers(cutoff time.Time) int {
	n := 0
	for id, s := range l.entries {
		if s.peer && s.at.Before(cutoff) {
			l.remove(id, s)
			n++
		}
	}
	return n
}

// Started records that request id's prefill was done at at (its first response byte
// arrived): its tokens are no longer queued. Only the first call counts. The entry stays
// as a start until DropStarts drops it, so that a snapshot measured between the send and
// at, which still counts the tokens, is corrected (Sums).
func (l *refLedger) Started(id uint64, at time.Time) {
	if s, ok := l.entries[id]; ok && s.started.IsZero() {
		s.started = at
		l.entries[id] = s
		l.starts++
	}
}

// Done ends request id's entry: its prefill started (without a time: nothing to correct)
// or the request ended. A start recorded by Started stays until DropStarts.
func (l *refLedger) Done(id uint64) {
	if s, ok := l.entries[id]; ok && s.started.IsZero() {
		delete(l.entries, id)
	}
}

// DropStarts drops the starts recorded before cutoff: no snapshot measured that early is
// used any more.
func (l *refLedger) DropStarts(cutoff time.Time) {
	if l.starts == 0 {
		return
	}
	for id, s := range l.entries {
		if !s.started.IsZero() && s.started.Before(cutoff) {
			l.remove(id, s)
		}
	}
}

func (l *refLedger) remove(id uint64, s refSent) {
	delete(l.entries, id)
	if !s.started.IsZero() {
		l.starts--
	}
}

// Len is the number of requests in flight before their first response byte.
func (l *refLedger) Len() int { return len(l.entries) - l.starts }

// Expire drops entries sent before cutoff and says how many of them had not started
// (streams whose end was never seen).
func (l *refLedger) Expire(cutoff time.Time) int {
	n := 0
	for id, s := range l.entries {
		if s.at.Before(cutoff) {
			if s.started.IsZero() {
				n++
			}
			l.remove(id, s)
		}
	}
	return n
}

// PendingSince sums the tokens sent to addr after since and not yet started.
func (l *refLedger) PendingSince(addr string, since time.Time) float64 {
	if len(l.entries) == 0 {
		return 0 // the common case between bursts; skips a map iteration per replica
	}
	var sum float64
	for _, s := range l.entries {
		if s.addr == addr && s.started.IsZero() && s.at.After(since) {
			sum += s.tokens
		}
	}
	return sum
}

// Sums returns, in one pass, the correction to a snapshot of addr's queue measured at
// since, and all the tokens sent to addr and not yet started (the load term of the stale
// regime, shared/rule). The correction adds what was sent after since and has not
// started, and takes off what was sent by since and started after it; it can be
// negative.
func (l *refLedger) Sums(addr string, since time.Time) (correction, pending float64) {
	if len(l.entries) == 0 {
		return 0, 0
	}
	for _, s := range l.entries {
		if s.addr != addr {
			continue
		}
		switch {
		case s.started.IsZero():
			pending += s.tokens
			if s.at.After(since) {
				correction += s.tokens
			}
		case !s.at.After(since) && s.started.After(since):
			correction -= s.tokens
		}
	}
	return correction, pending
}
