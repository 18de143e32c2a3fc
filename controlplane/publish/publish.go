// Package publish turns the index's changes into table versions and serves them: the
// published table (what every filter converges to), the recent versions' changed keys
// (to compose a delta from any recent version), cached frames, and long-poll wake-ups.
package publish

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/table"
)

// Publisher is safe for concurrent use: one goroutine publishes, many serve frames.
type Publisher struct {
	// pubMu serializes Publish. mu guards t and hist: readers (composing a delta, encoding
	// a full frame) hold it shared; Publish builds the next table aside and holds it
	// exclusively only to swap it in, so polls never wait for a version to be applied.
	pubMu   sync.Mutex
	mu      sync.RWMutex
	t       *table.Table
	hist    []version // oldest first
	histN   int       // keys in hist
	maxHist int
	maxKeys int
	first   uint64
	epoch   uint64

	// frames holds the current version's encoded frames, one per (base, model,
	// format), shared by every poll that asks for it: the first poll encodes it, the
	// others wait for its bytes. cacheV changes with the version, under mu.
	cacheMu sync.Mutex
	cacheV  uint64
	frames  map[frameKey]*frame
	encodes int // frames encoded (tests)

	waitMu sync.Mutex
	wake   chan struct{}

	beforeSwap func() // tests: runs after the next table is built, before it is swapped in
	// tests: beforeEncode runs before a poll encodes a frame for the others, waiting
	// when a poll is about to wait for another's encoding.
	beforeEncode, waiting func()
}

type version struct {
	v, base uint64
	gen     int64 // GeneratedMs
	models  map[string]*change
	// replicas are every model's replicas in this version, kept for the newest
	// replicaHistory versions: a format-2 delta from one of them carries only the
	// replicas that changed since (table.ModelChange.PatchReplicas).
	replicas map[string][]table.Replica
}

// replicaHistory is how many recent versions keep their replica lists: a filter more
// than 64 versions (at least 3.2 s at the default 50 ms publish interval) behind gets
// whole lists in its delta.
const replicaHistory = 64

// frame is one encoded answer, ready when done is closed.
type frame struct {
	done chan struct{}
	res  Result
}

func (v version) keys() int {
	n := 0
	for _, ch := range v.models {
		n += len(ch.keys) + len(ch.gpuKeys) + len(ch.homes)
	}
	return n
}

type change struct {
	reset, removed bool
	keys           []uint64 // sorted: every key whose holder set changed
	// gpuKeys are the keys whose GPU holders changed (format 1's view), nil when they
	// are keys (no slower tier touched this version): a slower tier's churn costs an
	// older filter nothing.
	gpuKeys []uint64
	// homes are the keys whose home changed (format 4), sorted.
	homes []uint64
}

// view is keys as format seen: format 1 sees only changes of GPU holders.
func (ch *change) view(format uint8) []uint64 {
	if format >= table.FormatTiers || ch.gpuKeys == nil {
		return ch.keys
	}
	return ch.gpuKeys
}

type frameKey struct {
	base   uint64 // 0 = full
	model  string // "" = all models
	format uint8
}

// Options: MaxHistory versions are kept for deltas (at a 50 ms publish interval, 600
// covers 30 s of a filter's absence); a composed delta with more than MaxDeltaKeys keys
// is served as a full frame instead.
//
// FirstVersion is the number of the first version (default: the Unix time in ms). A
// restarted control plane thus never reuses a version number a filter may still hold
// from the previous process, as long as versions advance at most once a millisecond.
//
// Epoch names this publisher's version space to filters (api.TableEpochHeader); default
// a random non-zero number, so two replicas, or a process and its restart, never share
// one.
type Options struct {
	MaxHistory   int
	MaxDeltaKeys int
	FirstVersion uint64
	Epoch        uint64
}

// New returns a publisher at version 0 (no table yet).
func New(o Options) *Publisher {
	if o.MaxHistory <= 0 {
		o.MaxHistory = 600
	}
	if o.MaxDeltaKeys <= 0 {
		o.MaxDeltaKeys = 1 << 20
	}
	if o.FirstVersion == 0 {
		o.FirstVersion = uint64(time.Now().UnixMilli())
	}
	for o.Epoch == 0 {
		o.Epoch = rand.Uint64()
	}
	return &Publisher{t: table.New(), first: o.FirstVersion, epoch: o.Epoch, maxHist: o.MaxHistory, maxKeys: o.MaxDeltaKeys, frames: map[frameKey]*frame{}, wake: make(chan struct{})}
}

// Epoch names the version space of this publisher (Options.Epoch).
func (p *Publisher) Epoch() uint64 { return p.epoch }

// Version is the current version (0 before the first publish).
func (p *Publisher) Version() uint64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.t.Version
}

// Publish makes the next version from the index's updates and returns its number.
func (p *Publisher) Publish(ups []index.ModelUpdate, now time.Time) (uint64, error) {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.mu.RLock()
	cur := p.t // only Publish replaces p.t, and pubMu serializes it
	p.mu.RUnlock()
	next := cur.Version + 1
	if cur.Version == 0 {
		next = p.first
	}
	f := &table.Frame{Format: table.FormatHomes, Kind: table.Delta, Version: next, Base: cur.Version, GeneratedMs: now.UnixMilli()}
	// f1 is the same version as a format-1 filter sees it (GPU holders only).
	f1 := &table.Frame{Kind: table.Delta, Version: next, Base: cur.Version, GeneratedMs: f.GeneratedMs}
	rec := version{v: f.Version, base: f.Base, gen: f.GeneratedMs, models: make(map[string]*change, len(ups))}
	for i := range ups {
		u := &ups[i]
		mc := table.ModelChange{
			Name: u.Name, Removed: u.Removed, Reset: u.Reset, Config: u.Config,
			Replicas: u.Replicas, Tiers: u.Tiers, Upserts: u.Upserts, Removes: u.Removes,
			Homes: u.Homes,
		}
		f.Models = append(f.Models, mc)
		keys := make([]uint64, 0, u.Upserts.Len()+len(u.Removes))
		keys = append(keys, u.Upserts.Keys...)
		keys = append(keys, u.Removes...)
		slices.Sort(keys)
		ch := &change{reset: u.Reset, removed: u.Removed, keys: keys}
		if !u.Homes.Empty() {
			ch.homes = slices.Concat(u.Homes.Keys, u.Homes.Removes)
			slices.Sort(ch.homes)
		}
		mc1 := gpuChange(cur.Models[u.Name], &mc, ch)
		f1.Models = append(f1.Models, mc1)
		rec.models[u.Name] = ch
	}
	// Apply to a copy outside mu: a large delta (TestReportFlood's) can take hundreds of
	// milliseconds to apply, and no poll should wait for it.
	nt := cur.CloneFor(f)
	if err := nt.ApplyFrame(f); err != nil {
		return 0, fmt.Errorf("publish v%d: %w", f.Version, err)
	}
	rec.replicas = make(map[string][]table.Replica, len(nt.Models))
	for name, m := range nt.Models {
		rec.replicas[name] = m.Replicas // replaced by later versions, never changed
	}
	// The frame just applied is the delta from the previous version for all models,
	// the one most pollers want, in every format; formats 2 on carry only the
	// replicas that changed, and format 3 and older no homes. Encoded before the swap, so
	// polls never wait for it and the first ones after the swap find it.
	enc4 := table.Encode(patched(f, cur, table.FormatHomes))
	enc3 := table.Encode(patched(f, cur, table.FormatLoad))
	enc2 := table.Encode(patched(f, cur, table.FormatTiers))
	enc1 := table.Encode(f1)
	if p.beforeSwap != nil {
		p.beforeSwap()
	}
	p.mu.Lock()
	p.t = nt
	p.hist = append(p.hist, rec)
	p.histN += rec.keys()
	if n := len(p.hist) - 1 - replicaHistory; n >= 0 {
		p.hist[n].replicas = nil
	}
	// Versions beyond MaxHistory, or whose keys a delta could not carry anyway (more
	// than MaxDeltaKeys in all: compose answers a full frame), are forgotten, so the
	// history's memory is bounded by keys as well as by versions.
	drop := 0
	for n := len(p.hist); drop < n-1 && (n-drop > p.maxHist || p.histN > p.maxKeys); drop++ {
		p.histN -= p.hist[drop].keys()
	}
	if drop > 0 {
		clear(p.hist[:drop])
		p.hist = append(p.hist[:0:0], p.hist[drop:]...)
	}
	p.cacheMu.Lock()
	p.cacheV = f.Version
	clear(p.frames)
	for _, e := range []struct {
		format uint8
		body   []byte
	}{{table.FormatHomes, enc4}, {table.FormatLoad, enc3}, {table.FormatTiers, enc2}, {table.FormatVersion, enc1}} {
		if f.Base == 0 {
			break // the first version: no filter has a version to take a delta from
		}
		done := make(chan struct{})
		close(done)
		p.frames[frameKey{base: f.Base, format: e.format}] = &frame{done: done,
			res: Result{Version: f.Version, GeneratedMs: f.GeneratedMs, Kind: table.Delta, Body: e.body}}
	}
	p.encodes += 4
	p.cacheMu.Unlock()
	p.mu.Unlock()

	p.waitMu.Lock()
	close(p.wake)
	p.wake = make(chan struct{})
	p.waitMu.Unlock()
	return f.Version, nil
}

// Changed returns a channel closed when the version moves past v, or nil when it already
// has.
func (p *Publisher) Changed(v uint64) <-chan struct{} {
	p.waitMu.Lock()
	ch := p.wake
	p.waitMu.Unlock()
	if p.Version() != v {
		return nil
	}
	return ch
}

// Wait blocks until the version moves past v or ctx ends.
func (p *Publisher) Wait(ctx context.Context, v uint64) {
	if ch := p.Changed(v); ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// Result of Frame.
type Result struct {
	Version uint64
	// GeneratedMs is when Version was built (this process's clock, Unix ms).
	GeneratedMs int64
	NotReady    bool // no version published yet
	Current     bool // the caller's version is current: 304
	Kind        table.Kind
	Body        []byte
}

// Frame answers a filter at version have (hasHave false: none): Current when it is up
// to date, a delta when have is in the recent history, else a full frame. model ""
// means every model. The frame is in format 1 (GPU holders only), which every filter
// reads; FrameFormat answers in another.
func (p *Publisher) Frame(have uint64, hasHave bool, model string) Result {
	return p.FrameFormat(have, hasHave, model, table.FormatVersion)
}

// FrameFormat is Frame in the given table format (table.FormatVersion, FormatTiers or
// FormatLoad or FormatHomes). Polls asking for the same frame of the same version share
// one encoding of it.
func (p *Publisher) FrameFormat(have uint64, hasHave bool, model string, format uint8) Result {
	if format < table.FormatTiers || format > table.FormatHomes {
		format = table.FormatVersion
	}
	p.mu.RLock()
	t := p.t
	cur := t.Version
	if cur == 0 {
		p.mu.RUnlock()
		return Result{NotReady: true}
	}
	gen := t.GeneratedMs
	if hasHave && have == cur {
		p.mu.RUnlock()
		return Result{Version: cur, GeneratedMs: gen, Current: true}
	}
	// Only versions this process published and still remembers get a delta.
	delta := hasHave && have >= p.first && have < cur && len(p.hist) > 0 && have >= p.hist[0].base
	k := frameKey{model: model, format: format}
	if delta {
		k.base = have
	}
	e, mine := p.frame(cur, k)
	if !mine {
		p.mu.RUnlock()
		if p.waiting != nil {
			p.waiting()
		}
		<-e.done
		return e.res
	}
	if p.beforeEncode != nil {
		p.beforeEncode()
	}
	var f *table.Frame
	if delta {
		f = p.compose(have, model, format)
	}
	p.mu.RUnlock()
	// The frame is encoded outside the lock a Publish waits for, so polls queued behind
	// that Publish do not wait for this encoding too: f holds copies (Entries copy the
	// slots; replica lists are replaced, never changed in place), and t, a published
	// table, is never changed again (Publish applies the next version to a copy).
	if f != nil {
		e.res = Result{Version: cur, GeneratedMs: gen, Kind: table.Delta, Body: table.Encode(f)}
		p.encoded()
	} else if k.base == 0 {
		e.res = p.full(t, model, format)
	} else {
		// A delta larger than a full frame: the full frame, shared with its own polls.
		e.res = p.FrameFormat(0, false, model, format)
	}
	close(e.done)
	return e.res
}

// frame returns the current version's entry for k and whether the caller is to encode
// it (then it must fill in res and close done). Caller holds mu (read).
func (p *Publisher) frame(cur uint64, k frameKey) (*frame, bool) {
	p.cacheMu.Lock()
	defer p.cacheMu.Unlock()
	if e := p.frames[k]; e != nil && p.cacheV == cur {
		return e, false
	}
	e := &frame{done: make(chan struct{})}
	if p.cacheV == cur && len(p.frames) < 1024 {
		p.frames[k] = e
	}
	return e, true
}

func (p *Publisher) encoded() {
	p.cacheMu.Lock()
	p.encodes++
	p.cacheMu.Unlock()
}

// full encodes the published table t (or one model of it) as a full frame.
func (p *Publisher) full(t *table.Table, model string, format uint8) Result {
	res := Result{Version: t.Version, GeneratedMs: t.GeneratedMs, Kind: table.Full}
	if model != "" {
		one := &table.Table{Version: t.Version, GeneratedMs: t.GeneratedMs, Models: map[string]*table.Model{}}
		if m := t.Models[model]; m != nil {
			one.Models[model] = m
		}
		t = one
	}
	res.Body = table.EncodeFullFormat(t, format)
	p.encoded()
	return res
}

// Table returns the published table for read-only inspection under fn (tests, debug).
func (p *Publisher) Table(fn func(t *table.Table)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p.t)
}
