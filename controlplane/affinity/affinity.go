// Package affinity is the control plane's map of Responses responses to the replicas
// that stored them, shared by every proxy: each filter learns the replica of the
// responses it forwards and names it in the outcome report (api.Report.Affinity, a hash
// of the id, never the id); Map keeps the newest entries, and each proxy's leader fetches
// those it has not seen (api.AffinityPath), so a follow-up that reaches another proxy
// still goes to the replica whose in-memory store holds its conversation.
//
// The map is bounded whatever the proxies send: at most MaxEntries entries (the oldest
// make way, counted as evicted), none older than MaxAge (counted as expired), and at
// most maxAddrs distinct replica addresses (an entry naming another is refused and
// counted). An entry is its key, the sender's api.ProxyKey, when it arrived and an
// interned address: hashes and addresses only.
package affinity

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults: an hour is how long the filter keeps a response's replica (filter/affinity.go
// responseMaxAge); 65,536 entries is 27 minutes of 40 Responses answers a second, 2.6 MB.
const (
	DefaultMaxEntries = 1 << 16
	DefaultMaxAge     = time.Hour
	// maxAddrs bounds the distinct replica addresses held: a fleet has far fewer.
	maxAddrs = 4096
)

// Counts are the map's counters by what happened to an entry; nil ones are skipped.
type Counts struct {
	Added, Evicted, Expired, Refused prometheus.Counter
}

// Map is the shared map. Its methods are safe for concurrent use.
type Map struct {
	maxEntries int
	maxAge     time.Duration
	epoch      uint64
	counts     Counts

	mu    sync.Mutex
	ring  []entry // entry s at ring[slot(s)], for first <= s < next
	first uint64  // the oldest entry held; entries are numbered from 1
	next  uint64
	addrs map[string]string
}

type entry struct {
	key, proxy uint64
	atMs       int64
	replica    string
}

// New makes a map whose cursors count in epoch (a number of this process's: api.AffinityPath
// says why); maxEntries and maxAge 0 take the defaults.
func New(epoch uint64, maxEntries int, maxAge time.Duration, c Counts) *Map {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	return &Map{maxEntries: maxEntries, maxAge: maxAge, epoch: epoch, counts: c,
		first: 1, next: 1, addrs: map[string]string{}}
}

// Add takes the affinity of every successful outcome in b (validated reports,
// api.ParseReportBatch) and returns how many it added.
func (m *Map) Add(b *api.ReportBatch, now time.Time) int {
	proxy := uint64(0)
	added := 0
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range b.Reports {
		r := &b.Reports[i]
		if r.Affinity == 0 || r.Kind != api.KindOutcome || r.Status < 200 || r.Status >= 300 {
			continue
		}
		if proxy == 0 {
			proxy = api.ProxyKey(b.Proxy)
		}
		addr, ok := m.intern(r.Replica)
		if !ok || len(addr) > 255 {
			inc(m.counts.Refused)
			continue
		}
		if int(m.next-m.first) == m.maxEntries {
			m.ring[m.slot(m.first)] = entry{}
			m.first++
			inc(m.counts.Evicted)
		}
		e := entry{key: r.Affinity, proxy: proxy, atMs: now.UnixMilli(), replica: addr}
		if at := int(m.slot(m.next)); at < len(m.ring) {
			m.ring[at] = e
		} else {
			m.ring = append(m.ring, e)
		}
		m.next++
		added++
		inc(m.counts.Added)
	}
	return added
}

// Answer appends the answer to a poll (api.AffinityPath): the entries after cursor
// since of epoch, or every entry held when the cursor is of another epoch or not one this
// map numbered, leaving out those proxy sent, at most api.MaxAffinityAnswer; n is how
// many it answered.
func (m *Map) Answer(dst []byte, since, epoch, proxy uint64, now time.Time) (_ []byte, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(now)
	from := since + 1
	if epoch != m.epoch || from > m.next || from < m.first {
		from = m.first
	}
	head := len(dst)
	dst = api.AppendAffinityHead(dst, m.epoch, 0)
	s := from
	for ; s < m.next && n < api.MaxAffinityAnswer; s++ {
		e := &m.ring[m.slot(s)]
		if e.proxy == proxy {
			continue
		}
		age := uint32(min(max(now.UnixMilli()-e.atMs, 0), 1<<32-1))
		dst = api.AppendAffinityEntry(dst, e.key, age, e.replica)
		n++
	}
	// The cursor is the last entry answered (or skipped): the next poll starts after it.
	api.PutAffinityNext(dst[head:], s-1)
	return dst, n
}

// expire drops the entries older than maxAge (they arrived in order).
func (m *Map) expire(now time.Time) {
	cut := now.Add(-m.maxAge).UnixMilli()
	for m.first < m.next {
		e := &m.ring[m.slot(m.first)]
		if e.atMs >= cut {
			return
		}
		*e = entry{}
		m.first++
		inc(m.counts.Expired)
	}
}

// intern returns the map's copy of addr, false when it holds maxAddrs others still named
// by an entry.
func (m *Map) intern(addr string) (string, bool) {
	if a, ok := m.addrs[addr]; ok {
		return a, true
	}
	if len(m.addrs) >= maxAddrs {
		// Keep only the addresses entries still name.
		clear(m.addrs)
		for s := m.first; s < m.next; s++ {
			a := m.ring[m.slot(s)].replica
			m.addrs[a] = a
		}
		if len(m.addrs) >= maxAddrs {
			return "", false
		}
	}
	m.addrs[addr] = addr
	return addr, true
}

// slot is where entry s is in the ring.
func (m *Map) slot(s uint64) int { return int((s - 1) % uint64(m.maxEntries)) }

// Len is the number of entries held.
func (m *Map) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(m.next - m.first)
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
