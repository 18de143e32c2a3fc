package route

import (
	"time"

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

	models map[string]*localModel
	addrs  []string
	addrID map[string]uint16
	log    []localPlacement // in the order added (times non-decreasing in practice)
	head   int
	arena  []uint64 // the log's keys, in the log's order: log[i].keys is arena[off:off+n]
	keys   int
	depths []localDepth
}

// DefaultLocal bounds: 32,768 keys (about 260 prompts of 8,000 tokens at the default
// geometry), 10 minutes (rule.DefaultParams' MaxCacheAge), a table built 1 s after a
// placement knows it (reports every 100 ms, versions every 50 ms, with margin).
const (
	DefaultLocalMaxKeys = 32768
	DefaultLocalMaxAge  = 10 * time.Minute
	DefaultLocalSettle  = time.Second
)

// NewLocal returns an empty Local with the default bounds.
func NewLocal() *Local {
	return &Local{MaxKeys: DefaultLocalMaxKeys, MaxAge: DefaultLocalMaxAge, Settle: DefaultLocalSettle,
		models: map[string]*localModel{}, addrID: map[string]uint16{}}
}

const localWays = 4

type localModel struct{ entries map[uint64]localEntry }

// localEntry is one checkpoint key: up to localWays replicas it was placed on, and when.
type localEntry struct {
	n    uint8
	addr [localWays]uint16
	atMs [localWays]int64
}

type localPlacement struct {
	m      *localModel
	off, n int // the keys, in arena
	addr   uint16
	atMs   int64
}

type localDepth struct {
	addr  uint16
	depth int
}

// Len is the number of checkpoint keys held.
func (l *Local) Len() int { return l.keys }

// Add records that the chain whose checkpoint keys are keys (at model's stride) was
// placed on addr at at. keys is copied (into storage reused as placements expire).
func (l *Local) Add(model string, keys []uint64, addr string, at time.Time) {
	if len(keys) == 0 || addr == "" {
		return
	}
	m := l.models[model]
	if m == nil {
		m = &localModel{entries: map[uint64]localEntry{}}
		l.models[model] = m
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
	ms := at.UnixMilli()
	for _, k := range keys {
		e, ok := m.entries[k]
		if !ok {
			l.keys++
		}
		w := -1
		for i := 0; i < int(e.n); i++ {
			if e.addr[i] == id {
				w = i
				break
			}
		}
		if w < 0 {
			if int(e.n) < localWays {
				w = int(e.n)
				e.n++
			} else {
				w = 0 // the oldest way
				for i := 1; i < localWays; i++ {
					if e.atMs[i] < e.atMs[w] {
						w = i
					}
				}
			}
		}
		e.addr[w], e.atMs[w] = id, ms
		m.entries[k] = e
	}
	l.log = append(l.log, localPlacement{m, len(l.arena), len(keys), id, ms})
	l.arena = append(l.arena, keys...)
	for l.keys > l.MaxKeys && l.head < len(l.log) {
		l.pop()
	}
}

// Prune drops the placements a table confirmed current at confirmed has had the chance
// to learn (made more than Settle before it), and those older than MaxAge at now.
func (l *Local) Prune(confirmed, now time.Time) {
	cutoff := now.Add(-l.MaxAge).UnixMilli()
	if !confirmed.IsZero() {
		cutoff = max(cutoff, confirmed.Add(-l.Settle).UnixMilli())
	}
	for l.head < len(l.log) && l.log[l.head].atMs < cutoff {
		l.pop()
	}
}

// Clear forgets every placement.
func (l *Local) Clear() {
	clear(l.models)
	clear(l.addrID)
	l.addrs, l.log, l.head, l.keys, l.arena = l.addrs[:0], l.log[:0], 0, 0, l.arena[:0]
}

// pop removes the oldest placement's holds (those no later placement renewed).
func (l *Local) pop() {
	p := l.log[l.head]
	l.log[l.head] = localPlacement{}
	l.head++
	for _, k := range l.arena[p.off : p.off+p.n] {
		e, ok := p.m.entries[k]
		if !ok {
			continue
		}
		for i := 0; i < int(e.n); i++ {
			if e.addr[i] == p.addr && e.atMs[i] == p.atMs {
				e.n--
				e.addr[i], e.atMs[i] = e.addr[e.n], e.atMs[e.n]
				break
			}
		}
		if e.n == 0 {
			delete(p.m.entries, k)
			l.keys--
		} else {
			p.m.entries[k] = e
		}
	}
	if l.head == len(l.log) {
		l.log, l.head, l.arena = l.log[:0], 0, l.arena[:0]
	} else if l.head > 1024 && l.head*2 > len(l.log) {
		n := copy(l.log, l.log[l.head:])
		clear(l.log[n:])
		l.log, l.head = l.log[:n], 0
		base := l.log[0].off
		l.arena = l.arena[:copy(l.arena, l.arena[base:])]
		for i := range l.log {
			l.log[i].off -= base
		}
	}
}

// match raises matched[i] (blocks of c held by m's replica i) to what this proxy placed.
// Chain keys are chained hashes, so a chain that misses a checkpoint misses every later
// one: the walk stops at the first miss.
func (l *Local) match(m *table.Model, c *Chain, matched []int) {
	lm := l.models[m.Name]
	if lm == nil || len(lm.entries) == 0 {
		return
	}
	stride := max(int(m.Config.Stride), 1)
	l.depths = l.depths[:0]
	for i := stride - 1; i < len(c.Keys); i += stride {
		e, ok := lm.entries[c.Keys[i]]
		if !ok {
			break
		}
	ways:
		for w := 0; w < int(e.n); w++ {
			for j := range l.depths {
				if l.depths[j].addr == e.addr[w] {
					l.depths[j].depth = i + 1
					continue ways
				}
			}
			l.depths = append(l.depths, localDepth{e.addr[w], i + 1})
		}
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
