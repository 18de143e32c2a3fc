package index

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/api"
)

// Each input that creates state is admitted up to the budget; the rest is counted.
func TestBudgetAdmission(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		capTok   int64 // replica a's scraped capacity, 0 = unknown
		reports  []api.Report
		events   []kvevents.Event
		wantKeys int // keys replica a holds after
		dropped  map[dropKey]uint64
		result   string // reports_total result of the last report
	}{
		{name: "within the replica's limit", capTok: 64_000, // 1000 keys x 4 slack, floor 1024
			reports: []api.Report{placement("10.0.0.1:8000", seqHashes(900, 1))}, wantKeys: 900, result: "accepted"},
		{name: "chain longer than the KV cache", capTok: 64_000,
			reports:  []api.Report{placement("10.0.0.1:8000", seqHashes(1001, 1))},
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonOversized}: 1001},
			result:   reasonOversized,
			wantKeys: 0},
		{name: "replica limit cuts the chain after its root", capTok: 16_000, // 1000 keys, floor 1024
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(250, 1)), placement("10.0.0.1:8000", seqHashes(250, 1000)),
				placement("10.0.0.1:8000", seqHashes(250, 2000)), placement("10.0.0.1:8000", seqHashes(250, 3000)),
				placement("10.0.0.1:8000", seqHashes(250, 4000)), placement("10.0.0.1:8000", seqHashes(250, 5000)),
			},
			wantKeys: 1024,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonReplica}: 6*250 - 1024},
			result:   "over_budget"},
		{name: "global limit", cfg: Config{Budget: Budget{MaxKeys: 1500}},
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(1000, 1)),
				placement("10.0.0.1:8000", seqHashes(1000, 5000)),
			},
			wantKeys: 1500,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonGlobal}: 500},
			result:   "accepted"},
		{name: "global limit, nothing left", cfg: Config{Budget: Budget{MaxKeys: 1000}},
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(1000, 1)),
				placement("10.0.0.1:8000", seqHashes(10, 5000)),
			},
			wantKeys: 1000,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonGlobal}: 10},
			result:   "over_budget"},
		{name: "kv blocks beyond the replica's blocks", capTok: 1600, // 100 blocks x 4 slack, floor 1024
			events:  []kvevents.Event{storedEv(seqHashes(1000, 1), nil, tokens(1000*16, 1), 16), storedEv(seqHashes(100, 9000), nil, tokens(100*16, 1), 16)},
			dropped: map[dropKey]uint64{{inputBlocks, reasonReplica}: 100}, wantKeys: 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := fixture(t, tc.cfg)
			if tc.capTok > 0 {
				ix.ApplyScrape("a", scrape.Sample{CapacityTokens: tc.capTok}, nil, t0)
			}
			var last string
			for i := range tc.reports {
				last = ix.report(&tc.reports[i], t0, nil, ix.reporterID("p"))
			}
			for i, ev := range tc.events {
				ix.Events().Batch(kvevents.StreamID{Replica: "a"}, uint64(i), batch(ev))
			}
			st := ix.DebugState(t0)[0]
			if st.Keys != tc.wantKeys {
				t.Errorf("replica a holds %d keys, want %d", st.Keys, tc.wantKeys)
			}
			if tc.result != "" && last != tc.result {
				t.Errorf("last report: %q, want %q", last, tc.result)
			}
			for k, n := range tc.dropped {
				if got := ix.budget.dropped[k]; got != n {
					t.Errorf("dropped %v: %d, want %d", k, got, n)
				}
			}
			if len(tc.dropped) == 0 && len(ix.budget.dropped) > 0 {
				t.Errorf("unexpected drops %v", ix.budget.dropped)
			}
		})
	}
}

func TestBudgetMaxReplicas(t *testing.T) {
	ix := New(Config{Budget: Budget{MaxReplicas: 2}})
	ix.SetReplicas([]Spec{{ID: "c", Model: "m", Addr: "c:1"}, {ID: "a", Model: "m", Addr: "a:1"}, {ID: "b", Model: "m", Addr: "b:1"}}, t0)
	var ids []string
	for _, st := range ix.DebugState(t0) {
		ids = append(ids, st.ID)
	}
	if !slices.Equal(ids, []string{"a", "b"}) || ix.BudgetState().Dropped[inputReplicas][reasonMaxReplicas] != 1 {
		t.Fatalf("replicas %v, budget %+v", ids, ix.BudgetState())
	}
}

// floodPlacements places 200,000 distinct keys on replica addr at now, in 40 batches.
func floodPlacements(ix *Index, addr string, now time.Time) {
	for i := range 40 {
		b := &api.ReportBatch{}
		for j := range 5 {
			b.Reports = append(b.Reports, placement(addr, seqHashes(1000, uint64(i*100000+j*1000+1))))
		}
		ix.ApplyReports(b, now, nil)
	}
}

// After a flood of speculative entries expires, Reclaim gives the memory back (Go maps
// never shrink by themselves), and the LRU survives the slab's renumbering. (The keys
// let go would become homes, bounded apart: TestHomesAreBounded.)
func TestReclaimAfterExpiry(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: time.Second, MaxHomes: -1})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	// A confirmed chain in the LRU, then the flood.
	confirmed := seqHashes(8, 1<<40)
	ix.ApplyReports(reports(outcome("10.0.0.2:8000", confirmed, 200, 0, 0)), t0, nil)
	heap := func() uint64 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()
	floodPlacements(ix, "10.0.0.2:8000", t0)
	w.apply(t, ix.Flush(t0, false), t0)
	ix.Reclaim(t0)
	keys := ix.BudgetState().Keys
	peak := heap()
	later := t0.Add(2 * time.Second)
	w.apply(t, ix.Flush(later, false), later)
	ix.Reclaim(later)
	after := heap()
	t.Logf("heap before %d KB, with %d keys %d KB, after expiry %d KB", before>>10, keys, peak>>10, after>>10)
	if st := ix.DebugState(later)[1]; st.Keys != 8 || st.SpeculativeKeys != 0 {
		t.Fatalf("b after expiry %+v", st)
	}
	if after > before+(peak-before)/4 {
		t.Errorf("heap after expiry %d KB: not back near %d KB (peak %d KB)", after>>10, before>>10, peak>>10)
	}
	// The LRU still works after compaction: room for 4 keys (the outcome taught 3 bytes
	// per token: 85.3 tokens a key) keeps the chain's root.
	ix.ApplyScrape("b", scrape.Sample{CapacityTokens: 342}, nil, later)
	w.apply(t, ix.Flush(later, false), later)
	if got := w.held("m", 1, confirmed); fmt.Sprint(got) != "[true true true true false false false false]" {
		t.Fatalf("LRU after compaction %v", got)
	}
}

// churnEngine is a replica's engine for the budget's attack tests: it keeps the last
// `keep` chains of 64 blocks (16 checkpoint keys each) cached, and each step stores a new
// chain and removes the oldest, over its KV-event stream.
type churnEngine struct {
	ix     *Index
	id     string
	model  string
	keep   int
	seq    uint64
	next   int
	chains [][]uint64 // engine block hashes of the cached chains, oldest first
	keys   [][]uint64 // their checkpoint keys
}

func (e *churnEngine) step() {
	c := e.next
	e.next++
	toks := tokens(64*16, uint32(c)*100_000+uint32(len(e.id))*7_000_000)
	hs := seqHashes(64, uint64(c)*1000+1)
	ev := []kvevents.Event{storedEv(hs, nil, toks, 16)}
	e.chains = append(e.chains, hs)
	e.keys = append(e.keys, expectedKeys(e.model, "", "", toks, 4))
	if len(e.chains) > e.keep {
		ev = append(ev, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: e.chains[0], Medium: "GPU"})
		e.chains, e.keys = e.chains[1:], e.keys[1:]
	}
	e.ix.Events().Batch(kvevents.StreamID{Replica: e.id}, e.seq, batch(ev...))
	e.seq++
}

// kept is the share of the keys the engine caches that the index lists on its slot.
func (e *churnEngine) kept(held map[uint64][]uint16, slot uint16) (float64, int) {
	n, in := 0, 0
	for _, ks := range e.keys {
		for _, k := range ks {
			n++
			if slices.Contains(held[k], slot) {
				in++
			}
		}
	}
	return float64(in) / float64(n), n
}

// One model's reports cannot starve another model's index (the "Hostile peers" attack
// on --max-keys, and the same on --max-index-bytes): model a's proxy floods confirmed keys of fresh random prefixes while
// model b's engines turn their whole caches over, storing new chains and evicting old
// ones. b stays within its share of the global limit, so its new blocks are admitted
// and it keeps listing what its engines hold; a is cut to its share, the drops counted
// under model_share. Without per-model shares the flood filled the global budget, every
// new block of b was dropped, and once b's caches had turned over it listed none of
// their keys (kept 0.0%).
func TestModelFloodLeavesOtherModelsShare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget Budget
	}{
		{"max-keys", Budget{MaxKeys: 20_000}},
		{"max-index-bytes", Budget{MaxBytes: 4 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) { modelFlood(t, tc.budget) })
	}
}

// twoModels: model a on replicas a0 and a1 (reports only), model b on b0 and b1 (KV
// events).
func twoModels(budget Budget) *Index {
	ix := New(Config{Budget: budget})
	ix.SetReplicas([]Spec{
		{ID: "a0", Model: "a", Addr: "10.1.0.1:8000"}, {ID: "a1", Model: "a", Addr: "10.1.0.2:8000"},
		{ID: "b0", Model: "b", Addr: "10.2.0.1:8000", Events: true}, {ID: "b1", Model: "b", Addr: "10.2.0.2:8000", Events: true},
	}, t0)
	return ix
}

// modelAFlood is a proxy posting outcomes of 1,000 fresh random keys on model a's
// replicas (twoModels).
type modelAFlood struct {
	ix  *Index
	rng uint64
}

func (f *modelAFlood) post(outcomes int, now time.Time) {
	b := &api.ReportBatch{Proxy: "flood"}
	for i := range outcomes {
		keys := make([]uint64, 1000)
		for j := range keys {
			f.rng = mix64(f.rng + 1)
			keys[j] = f.rng
		}
		rep := outcome(fmt.Sprintf("10.1.0.%d:8000", 1+i%2), keys, 200, 0, 0)
		rep.Model, rep.PromptBytes = "a", 0
		b.Reports = append(b.Reports, rep)
	}
	f.ix.ApplyReports(b, now, nil)
}

func modelFlood(t *testing.T, budget Budget) {
	ix := twoModels(budget)
	engines := []*churnEngine{{ix: ix, id: "b0", model: "b", keep: 20}, {ix: ix, id: "b1", model: "b", keep: 20}}
	for range 20 { // b's caches filled: 2 x 20 chains, 3,200 entries
		for _, e := range engines {
			e.step()
		}
	}
	now := t0
	flood := &modelAFlood{ix: ix}
	flood.post(30, now) // 30,000 fresh confirmed keys for a's two replicas
	for range 40 {      // b's engines turn over twice; the flood goes on between their batches
		now = now.Add(50 * time.Millisecond)
		ix.Flush(now, false)
		ix.Reclaim(now) // the control plane's recount after each build
		for _, e := range engines {
			e.step()
		}
		flood.post(2, now)
	}
	ix.Flush(now, false)
	held := heldKeys(ix, "b")
	for slot, e := range engines {
		frac, n := e.kept(held, uint16(slot))
		t.Logf("%s lists %.1f%% of the %d keys its engine holds", e.id, 100*frac, n)
		if frac < 0.9 {
			t.Errorf("%s lists %.1f%% of the %d keys its engine holds, want 90%% or more", e.id, 100*frac, n)
		}
	}
	st := ix.BudgetState()
	t.Logf("budget: %d of %d keys, %d of %d bytes, dropped %v", st.Keys, st.MaxKeys, st.Bytes, st.MaxBytes, st.Dropped)
	if st.Dropped[inputReportKeys]["model_share"] == 0 {
		t.Errorf("no report keys of model a counted as dropped past its share: %v", st.Dropped)
	}
}

// A proxy's outcomes cannot evict the confirmed keys another proxy holds on a replica
// within its fair share of the replica's LRU: two outcomes of 8,000 fresh keys on a
// replica whose capacity fits 10,000 evict the flooding proxy's own older keys, not the
// 16 keys a second proxy confirmed there. Before, the LRU was one list for everyone and
// the flood's second chain evicted all 16.
func TestReporterCannotEvictAnothersConfirmedKeys(t *testing.T) {
	ix := fixture(t, Config{})
	ix.SetReplicas([]Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000"}}, t0) // no KV events: the LRU is all there is
	ix.ApplyScrape("a", scrape.Sample{CapacityTokens: 640_000}, nil, t0)     // 10,000 text keys of 64 tokens
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	honest := seqHashes(16, 1<<40)
	rep := outcome("10.0.0.1:8000", honest, 200, 0, 0)
	rep.PromptBytes = 0 // no lesson in bytes per token: keys stay 64 tokens each
	ix.ApplyReports(&api.ReportBatch{Proxy: "honest", Reports: []api.Report{rep}}, t0, nil)
	var last []uint64
	for c := range 2 {
		last = seqHashes(8000, uint64(c+1)<<32)
		rep := outcome("10.0.0.1:8000", last, 200, 0, 0)
		rep.PromptBytes = 0
		ix.ApplyReports(&api.ReportBatch{Proxy: "flood", Reports: []api.Report{rep}}, t0, nil)
	}
	w.apply(t, ix.Flush(t0, false), t0)
	got := w.held("m", 0, honest)
	kept := 0
	for _, h := range got {
		if h {
			kept++
		}
	}
	st := ix.DebugState(t0)[0]
	t.Logf("the honest proxy keeps %d of its 16 keys; the replica holds %d text keys", kept, st.TextKeys)
	if kept != 16 {
		t.Errorf("the flood evicted %d of the honest proxy's 16 confirmed keys", 16-kept)
	}
	if !all(w.held("m", 0, last)) {
		t.Errorf("the flood's newest chain is not listed whole")
	}
	if st.TextKeys > 10_000 {
		t.Errorf("%d text keys on a replica whose capacity fits 10,000", st.TextKeys)
	}
}

// Confirmed keys age out like speculative ones: a key no outcome confirmed again within
// the TTL (ten minutes by default) leaves the table and gives its budget back, whether or
// not engine evictions or capacity aged it. Before, confirmed keys of a replica without
// KV events stayed until capacity pushed them out: a flood's keys held the budget for good.
func TestConfirmedKeysAgeOut(t *testing.T) {
	ix := fixture(t, Config{})
	ix.SetReplicas([]Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000"}, {ID: "b", Model: "m", Addr: "10.0.0.2:8000"}}, t0)
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	old, fresh := seqHashes(500, 1<<40), seqHashes(500, 2<<40)
	ix.ApplyReports(reports(outcome("10.0.0.1:8000", old, 200, 0, 0)), t0, nil)
	t1 := t0.Add(5 * time.Minute)
	ix.ApplyReports(reports(outcome("10.0.0.1:8000", fresh, 200, 0, 0)), t1, nil)
	w.apply(t, ix.Flush(t1, false), t1)
	if !all(w.held("m", 0, old)) || !all(w.held("m", 0, fresh)) {
		t.Fatal("confirmed keys not listed")
	}
	t2 := t0.Add(12 * time.Minute)
	w.apply(t, ix.Flush(t2, false), t2)
	if got := w.held("m", 0, old); !none(got) {
		t.Errorf("keys confirmed 12 minutes ago are still listed (%d of 500)", count(got))
	}
	if !all(w.held("m", 0, fresh)) {
		t.Errorf("keys confirmed 7 minutes ago expired")
	}
	if st := ix.BudgetState(); st.Keys != 500 {
		t.Errorf("the budget counts %d keys after the expiry, want 500", st.Keys)
	}
	// A build reads its clock before it takes the index's lock: a report applied
	// meanwhile is stamped after it, which is not an old stamp.
	late := seqHashes(10, 3<<40)
	t3 := t2.Add(2 * time.Second)
	ix.ApplyReports(reports(outcome("10.0.0.2:8000", late, 200, 0, 0)), t3.Add(time.Second), nil)
	w.apply(t, ix.Flush(t3, false), t3)
	if got := w.held("m", 1, late); !all(got) {
		t.Errorf("keys confirmed a second after the build's clock expired: %v", got)
	}
}

func count(b []bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

// A model's share is lent while it is idle and taken back when it needs it: model b
// asked for no room for two minutes, so a's flood borrows b's unused share; when b's
// engine stores again, its blocks are dropped (the room is a's) until the next Reclaim
// takes a's least recently confirmed keys back down to its share; then b's blocks are
// admitted.
func TestIdleModelsShareIsLentThenTakenBack(t *testing.T) {
	ix := twoModels(Budget{MaxKeys: 20_000})
	b := &churnEngine{ix: ix, id: "b0", model: "b", keep: 20}
	b.step()
	ix.models["b"].wanted.Store(time.Now().Add(-2 * time.Minute).UnixNano()) // idle since
	(&modelAFlood{ix: ix}).post(20, t0)                                      // 20,000 keys: all the room there is
	if st := ix.BudgetState(); st.Models["a"].Keys <= 10_000 {
		t.Fatalf("a holds %d keys: it did not borrow idle b's share (%+v)", st.Models["a"].Keys, st.Models)
	}
	b.step() // b wakes: the room is a's
	held := func() float64 { f, _ := b.kept(heldKeys(ix, "b"), 0); return f }
	if got := held(); got == 1 {
		t.Fatal("b's second chain was admitted into room a borrowed")
	}
	ix.Reclaim(t0)
	st := ix.BudgetState()
	if st.Models["a"].Keys > int(st.Models["a"].ShareKeys) || st.ShareReclaimed == 0 {
		t.Fatalf("after Reclaim a holds %d keys, share %d; %d taken back", st.Models["a"].Keys, st.Models["a"].ShareKeys, st.ShareReclaimed)
	}
	for range 3 {
		b.step()
	}
	if f, n := b.kept(heldKeys(ix, "b"), 0); f < 0.75 { // 3 of its 4 chains: the one dropped is gone
		t.Fatalf("after Reclaim b lists %.0f%% of its engine's %d keys", 100*f, n)
	}
}

// The default budget holds what a fleet's replicas can cache: it grows with the fleet.
// 64 replicas whose GPU memory each holds 558,124 tokens (docs/rule.md's replica) keep
// 6,000 reported keys apiece (512,000 tokens of checkpoints at the 3 bytes a token the
// outcomes teach), 384,000 keys in all: a fixed entry count (262,144) dropped a third.
func TestDefaultBudgetHoldsAFleet(t *testing.T) {
	const replicas, keysEach = 64, 6000
	ix := New(Config{})
	var specs []Spec
	for i := range replicas {
		specs = append(specs, Spec{ID: fmt.Sprint("r", i), Model: "m", Addr: fmt.Sprintf("10.0.%d.%d:8000", i/200, i%200)})
	}
	ix.SetReplicas(specs, t0)
	for i, s := range specs {
		ix.ApplyScrape(s.ID, scrape.Sample{CapacityTokens: 558_124}, nil, t0)
		for c := range keysEach / 500 {
			rep := outcome(s.Addr, seqHashes(500, uint64(i*keysEach+c*500+1)), 200, 0, 0)
			ix.report(&rep, t0, nil, ix.reporterID("p"))
		}
	}
	st := ix.BudgetState()
	if n := st.Dropped[inputReportKeys][reasonGlobal]; n > 0 {
		t.Errorf("%d report keys dropped for the global budget (%d held, max keys %d, max bytes %d)", n, st.Keys, st.MaxKeys, st.MaxBytes)
	}
	for _, r := range ix.DebugState(t0) {
		if r.Keys != keysEach {
			t.Fatalf("replica %s holds %d keys, want %d", r.ID, r.Keys, keysEach)
		}
	}
}
